"""Triton kernels for fusion regions, run in Triton's interpreter on CPU tensors.

TRITON_INTERPRET=1 is set before triton is imported, so every generated kernel executes
(in numpy) on the CPU: each template, on hypothesis-generated shapes (non-powers of two,
size-1 and broadcast dims, rows longer than one block, non-contiguous inputs), in fp32 and
fp16, against torch; then whole programs (the naive transformer block, the naive suite,
training through torch.compile) against eager. bf16 needs a GPU (the interpreter's bf16 is
not faithful) and is covered by benchmarks/triton_gpu.py.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]')")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from backends.fx import build_module  # noqa: E402
from backends.triton import Blocks, FusedKernel, kernels, plan  # noqa: E402
from backends.triton import launch as triton_launch  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.examples.zoo import build  # noqa: E402
from egraph.extract import source_program  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors import Roofline  # noqa: E402

SMALL_BLOCKS = Blocks(row=16, loop=8, tile=32, pointwise=32)
"""Block limits that make rows of more than 16 elements loop and pointwise kernels span
several programs, on data small enough for the interpreter."""

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(triton_launch, "BLOCKS", SMALL_BLOCKS)


@pytest.fixture
def kernels_only(monkeypatch):
    """Fail if a fused kernel falls back to its eager ops instead of launching."""
    def refuse(self, *args):
        raise AssertionError(f"{self.__name__} ran its eager ops instead of the kernel")

    monkeypatch.setattr(FusedKernel, "eager", refuse)


def fused(fn, *inputs):
    """``fn`` traced and emitted with every region that lowers as a kernel."""
    if fn.__module__ != __name__:  # torch.exp, F.silu: trace a call, not their insides
        fn = {1: lambda f: lambda x: f(x), 2: lambda f: lambda x, y: f(x, y)}[len(inputs)](fn)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), inputs)
    return build_module(eg, source_program(eg), target="cuda")


def tensor(shape, dtype, layout="contiguous", low=-2.0, high=2.0, seed=0):
    """Random values in [low, high) of ``shape``: contiguous, transposed (reversed strides)
    or strided (every other element of a wider tensor)."""
    gen = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        base = torch.rand(tuple(reversed(shape)), generator=gen)
        x = base.permute(*reversed(range(len(shape))))
    elif layout == "strided":
        x = torch.rand((*shape[:-1], 2 * shape[-1]), generator=gen)[..., ::2]
    else:
        x = torch.rand(shape, generator=gen)
    return (x * (high - low) + low).to(dtype)


def close(got, want, dtype):
    if isinstance(want, torch.Tensor) and not want.is_floating_point():
        assert torch.equal(got, want)
        return
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)
layouts = st.sampled_from(["contiguous", "transposed", "strided"])
DTYPES = [torch.float32, torch.float16]


def _broadcast_of(shape, drop):
    """``shape`` with the dims flagged in ``drop`` set to 1 and the first dim removed when
    the first flag is set (a lower-rank operand)."""
    out = tuple(1 if d else s for s, d in zip(shape, drop))
    return out[1:] if drop and drop[0] and len(out) > 1 else out


# -- pointwise templates ---------------------------------------------------------------

POSITIVE = (0.1, 3.0)
UNARY = {
    "neg": (torch.neg, None), "exp": (torch.exp, None), "log": (torch.log, POSITIVE),
    "sqrt": (torch.sqrt, POSITIVE), "rsqrt": (torch.rsqrt, POSITIVE), "abs": (torch.abs, None),
    "sin": (torch.sin, None), "cos": (torch.cos, None), "tanh": (torch.tanh, None),
    "sigmoid": (torch.sigmoid, None), "relu": (torch.relu, None), "silu": (F.silu, None),
    "gelu": (F.gelu, None), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), None),
    "erf": (torch.erf, None), "log1p": (torch.log1p, (-0.9, 3.0)),
    "expm1": (torch.expm1, None), "reciprocal": (torch.reciprocal, POSITIVE),
    "sign": (torch.sign, None), "logsigmoid": (F.logsigmoid, None),
    "softplus": (lambda x: F.softplus(x, beta=2.0, threshold=3.0), None),
    "floor": (torch.floor, None), "ceil": (torch.ceil, None),
    "square": (lambda x: x ** 2, None), "cube": (lambda x: x ** 3, None),
    "pow_half": (lambda x: x ** 0.5, POSITIVE), "pow_fraction": (lambda x: x ** 1.7, POSITIVE),
    "pow_negative": (lambda x: x ** -2, POSITIVE), "exp2": (lambda x: 2.0 ** x, None),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), None), "clamp_min": (lambda x: x.clamp(min=0.1), None),
    "to_half": (lambda x: x.to(torch.float16) * 3, None),
    "to_int": (lambda x: (x * 3).to(torch.int32), None),
    "logical_not": (lambda x: torch.logical_not(x > 0), None),
    "bitwise_not": (lambda x: ~(x > 0), None),
    "ones_like": (lambda x: torch.ones_like(x) + x, None),
    "zeros_like": (lambda x: torch.zeros_like(x) - x, None),
    "full_like": (lambda x: torch.full_like(x, 3.0) * x, None),
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "logaddexp": torch.logaddexp,
    "hypot": torch.hypot, "eq": lambda x, y: x.round() == y.round(), "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "where": lambda x, y: torch.where(x > 0, x, y),
    "masked_fill": lambda x, y: x.masked_fill(y > 0, -1.5),
    "add_scalar": lambda x, y: x + 2.5 * y - 1,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
@SETTINGS
@given(shape=shapes, layout=layouts)
def test_unary_template(name, dtype, shape, layout, small_blocks, kernels_only):
    fn, domain = UNARY[name]
    low, high = domain or (-2.0, 2.0)
    x = tensor(shape, dtype, layout, low, high)
    gm = fused(fn, x)
    assert kernels(gm), gm.code
    close(gm(x), fn(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
@SETTINGS
@given(shape=shapes, layout=layouts, drop=st.lists(st.booleans(), min_size=3, max_size=3))
def test_binary_template_with_broadcasting(name, dtype, shape, layout, drop, small_blocks,
                                           kernels_only):
    fn = BINARY[name]
    x = tensor(shape, dtype, layout)
    y = tensor(_broadcast_of(shape, drop), dtype, "contiguous", seed=1)
    gm = fused(fn, x, y)
    assert kernels(gm), gm.code
    close(gm(x, y), fn(x, y), dtype)


# -- row templates ---------------------------------------------------------------------

ROWS = {
    "sum": lambda x, dims, keep: x.sum(dims, keepdim=keep),
    "mean": lambda x, dims, keep: x.mean(dims, keepdim=keep),
    "amax": lambda x, dims, keep: x.amax(dims, keepdim=keep),
    "amin": lambda x, dims, keep: x.amin(dims, keepdim=keep),
    "var": lambda x, dims, keep: x.var(dims, keepdim=keep),
    "var_biased": lambda x, dims, keep: x.var(dims, correction=0, keepdim=keep),
    "logsumexp": lambda x, dims, keep: x.logsumexp(dims, keepdim=keep),
    "softmax": lambda x, dims, keep: x.softmax(dims[0]),
    "log_softmax": lambda x, dims, keep: x.log_softmax(dims[0]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(ROWS))
@SETTINGS
@given(rows=st.integers(1, 6), cols=st.integers(1, 40), layout=layouts,
       keep=st.booleans(), last=st.booleans())
def test_row_template(name, dtype, rows, cols, layout, keep, last, small_blocks, kernels_only):
    """A row op between a broadcast prologue and an epilogue, over the last dim or (for a
    transposed view) a leading one; rows longer than 16 loop over blocks of 8."""
    op = ROWS[name]
    dims = (-1,) if last else (0,)
    shape = (rows, cols) if last else (cols, rows)

    def fn(x, b):
        return op(x * 1.5 + b, dims, keep) * 2 + 1

    x = tensor(shape, dtype, layout)
    b = tensor((cols,) if last else (cols, 1), dtype, seed=1)
    if name == "var" and cols == 1:
        return  # one element: the unbiased variance is NaN either way
    gm = fused(fn, x, b)
    assert kernels(gm), gm.code
    close(gm(x, b), fn(x, b), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["layer_norm", "layer_norm_plain", "rms_norm", "rms_norm_eps"])
@SETTINGS
@given(rows=st.integers(1, 5), cols=st.integers(1, 30), layout=layouts)
def test_norm_templates(norm, dtype, rows, cols, layout, small_blocks, kernels_only):
    def fn(x, r, w, b):
        h = x + r
        if norm == "layer_norm":
            y = F.layer_norm(h, (cols,), w, b, 1e-5)
        elif norm == "layer_norm_plain":
            y = F.layer_norm(h, (cols,))
        elif norm == "rms_norm":
            y = F.rms_norm(h, (cols,), w)
        else:
            y = F.rms_norm(h, (cols,), w, 1e-3)
        return torch.relu(y)

    x = tensor((rows, cols), dtype, layout)
    r = tensor((rows, 1), dtype, seed=1)
    w, b = tensor((cols,), dtype, seed=2), tensor((cols,), dtype, seed=3)
    gm = fused(fn, x, r, w, b)
    assert kernels(gm), gm.code
    close(gm(x, r, w, b), fn(x, r, w, b), dtype)


def test_reductions_over_several_trailing_dims_and_all_dims(small_blocks, kernels_only):
    x = tensor((3, 4, 5), torch.float32, "transposed")

    def fn(x):
        centred = x - x.mean((1, 2), keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean((1, 2), keepdim=True) + 1e-5)

    gm = fused(fn, x)
    close(gm(x), fn(x), torch.float32)
    everything = fused(lambda x: torch.exp(x).sum(), x)
    close(everything(x), torch.exp(x).sum(), torch.float32)


def test_softmax_over_a_vocabulary_wider_than_one_block(kernels_only):
    """50257 columns with the default blocks: two passes of 2048-wide steps per row."""
    x = tensor((2, 50257), torch.float32, low=-8, high=8)
    fn = lambda x: torch.softmax(x * 0.5, -1)  # noqa: E731
    gm = fused(fn, x)
    (kernel,) = kernels(gm)
    assert "for start in range(0, cols, BLOCK_N):" in kernel.source
    close(gm(x), fn(x), torch.float32)


def test_softmax_edge_rows(small_blocks, kernels_only):
    """Rows of -inf (masked attention) give NaN like torch; large values do not overflow."""
    fn = lambda x: torch.softmax(x + 0.0, -1)  # noqa: E731
    for cols in (5, 40):
        x = tensor((3, cols), torch.float32) * 50
        x[1] = float("-inf")
        x[2, 1:] = float("-inf")
        gm = fused(fn, x)
        close(gm(x), fn(x), torch.float32)


# -- generated code ----------------------------------------------------------------------

def test_generated_code_reads_like_a_kernel_and_is_cached():
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    x = torch.randn(4, 10)
    gm = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,)).extract(Roofline(), target="cuda")
    (kernel,) = kernels(gm)
    assert f"softmax = {kernel.__name__}(x)" in gm.code
    assert kernel.__name__.startswith("fused_mul_softmax_")
    assert gm.meta["triton_kernels"] == {kernel.__name__: kernel}
    assert gm.meta["egraph_report"].kernels == [kernel.__name__]
    source = kernel.source
    assert f"@triton.jit\ndef {kernel.__name__}(" in source
    assert "tl.max(" in source and "keep_dims=True" in source
    # the same structure, shapes and dtype: the same kernel; another dtype: another one
    again = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 10),)).extract(
        Roofline(), target="cuda")
    assert kernels(again) == [kernel]
    half = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x.half(),)).extract(
        Roofline(), target="cuda")
    assert kernels(half)[0] is not kernel
    assert "tl.float16" in kernels(half)[0].source


def test_each_layout_gets_its_own_source(kernels_only):
    fn = lambda x, y: torch.exp(x) * y  # noqa: E731
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    gm = fused(fn, x, y)
    (kernel,) = kernels(gm)
    close(gm(x, y), fn(x, y), torch.float32)
    xt = torch.randn(7, 6).t()
    close(kernel(xt, y), fn(xt, y), torch.float32)
    assert len(kernel.sources) == 2
    contiguous, transposed = kernel.sources.values()
    assert "index_0" not in contiguous and "index_1" in transposed


def test_a_region_that_does_not_pay_stays_a_torch_call():
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    gm = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 8),)).extract(
        Roofline(), target="cuda")
    assert not kernels(gm)
    assert "torch.softmax" in gm.code
    assert fused(fn, torch.randn(4, 8)).code.count("fused_softmax_") == 1


def test_regions_the_backend_cannot_follow_stay_eager():
    def merged_dims(x):
        return (torch.exp(x).reshape(6, 4) + 1).sum(0)

    x = torch.randn(2, 3, 4)
    assert not plan(EGraph.from_fx(torch.fx.symbolic_trace(merged_dims), (x,)))
    gm = fused(merged_dims, x)
    close(gm(x), merged_dims(x), torch.float32)


def test_a_region_that_would_read_its_own_output_stays_eager():
    """exp and add form one fusion region, but the add needs a matmul of the exp's
    transpose: one kernel call cannot do both."""
    def f(x, w):
        p = torch.exp(x)
        return p + p.transpose(0, 1) @ w

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = fused(f, x, w)
    assert not kernels(gm)
    close(gm(x, w), f(x, w), torch.float32)


def test_cpu_without_interpreter_runs_the_eager_ops(monkeypatch):
    fn = lambda x: torch.exp(x) * 2 + 1  # noqa: E731
    x = torch.randn(5, 3)
    gm = fused(fn, x)
    (kernel,) = kernels(gm)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    launched = dict(kernel.sources)
    close(gm(x), fn(x), torch.float32)
    assert kernel.sources == launched


def test_inputs_that_require_grad_keep_their_gradients():
    fn = lambda x, w: torch.softmax(x * w, -1).pow(2)  # noqa: E731
    x, w = torch.randn(4, 9), torch.randn(9)
    gm = fused(fn, x, w)
    assert kernels(gm)
    a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
    gm(a, b).sum().backward()
    a2, b2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    fn(a2, b2).sum().backward()
    close(a.grad, a2.grad, torch.float32)
    close(b.grad, b2.grad, torch.float32)


# -- whole programs ----------------------------------------------------------------------

def _naive_suite():
    from benchmarks.triton_gpu import CASES

    return CASES


@pytest.mark.parametrize("saturate", [False, True], ids=["source", "saturated"])
def test_naive_transformer_block_with_triton_regions(saturate, kernels_only):
    model, inputs = build("naive_transformer")
    eg = EGraph.from_fx(model, inputs)
    if saturate:
        eg.saturate(load_rules("all"), iter_limit=10, node_limit=50_000, time_limit=60)
    gm = eg.extract(Roofline("H100"), target="cuda", validate="raise")
    report = gm.meta["egraph_report"]
    assert report.validation.ok
    if saturate:
        # the rules leave the block to library kernels (layer norm, merged projections,
        # attention, tanh GELU); what pointwise work is left runs as Triton kernels
        called = {getattr(n.target, "__name__", "") for n in gm.graph.nodes}
        assert report.kernels or {"layer_norm", "scaled_dot_product_attention"} <= called
    else:
        assert report.kernels
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        close(gm(x), model(x), torch.float32)


@pytest.mark.parametrize("name", ["attention", "softmax", "layer_norm", "cross_entropy",
                                  "gelu_mlp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_naive_suite_with_triton_regions(name, dtype, kernels_only):
    from benchmarks.triton_gpu import build_case, optimise

    fn, inputs = build_case(name, dtype, "cpu", small=True)
    written = optimise(fn, inputs, saturate=False)  # the program as written: its regions
    assert kernels(written), written.code
    rewritten = optimise(fn, inputs)  # after the rules: what pays of what is left
    with torch.no_grad():
        close(written(*inputs), fn(*inputs), dtype)
        close(rewritten(*inputs), fn(*inputs), dtype)


def test_benchmark_correctness_part_runs_on_the_cpu(capsys, tmp_path):
    from benchmarks.triton_gpu import main

    out = tmp_path / "triton_gpu.md"
    assert main(["--check", "--out", str(out)]) == 0
    *lines, written = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and all(" ok " in line for line in lines)  # 6 cases x 2 dtypes
    assert written == f"written to {out}" and "\n".join(lines) in out.read_text()


def test_training_through_torch_compile_emits_kernels_for_both_graphs(kernels_only):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from compiler.pipeline import compile_graph

    graphs = []

    def compiler(gm, example_inputs):
        out = compile_graph(gm, example_inputs, load_rules("all"), Roofline(), iter_limit=4,
                            node_limit=5_000, target="cuda")
        graphs.append(out)
        return make_boxed_func(out)

    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler)

    def naive_layer_norm(x, w, b):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return torch.tanh((x - mean) / torch.sqrt(var + 1e-5) * w + b)

    torch._dynamo.reset()
    x, w, b = torch.randn(3, 5, 12), torch.randn(12), torch.randn(12)
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    out = torch.compile(naive_layer_norm, backend=backend)(*args)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    ref_args = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = naive_layer_norm(*ref_args)
    (ref * grad).sum().backward()
    close(out.detach(), ref.detach(), torch.float32)
    for a, r in zip(args, ref_args):
        close(a.grad, r.grad, torch.float32)
    assert len(graphs) == 2 and all(kernels(g) for g in graphs)


def test_cuda_example_inputs_select_the_cuda_target():
    """Fake CUDA tensors (what torch.compile hands over) need no GPU to emit for."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
    assert kernels(eg.extract(Roofline(), validate="off"))
    cpu = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 8),))
    assert not kernels(cpu.extract(Roofline()))
    with pytest.raises(ValueError, match="target='tpu'"):
        cpu.extract(Roofline(), target="tpu")
