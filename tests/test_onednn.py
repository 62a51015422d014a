"""The CPU libraries' kernels of linear and conv2d (oneDNN's inner product and convolution,
MKL's packed product): each kernel is torch's op wherever it does not run (gradients,
other dtypes and devices) and equal to it where it does, before and after its weight is
packed; the cost model chooses one only by a measured curve; programs that choose it run,
differentiate and read back, through every entry point."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph import EGraph
from egraph.rules import load_rules
from extractors import Roofline
from extractors.hardware import HARDWARE
from frontends.fx import kernels
from frontends.fx.kernels import MKL, ONEDNN, mkl_linear, onednn_conv2d, onednn_linear

needs_onednn = pytest.mark.skipif(not ONEDNN, reason="torch built without oneDNN")

# A profile where oneDNN's inner product is 3x slower than torch's linear on small products
# and 2.5x faster on large ones, as measured on an AVX-512 CPU; and one that never measured it.
MATMUL = ((1e5, 2.4e10), (1e7, 1.5e11), (1e9, 1.7e11))
CONV = ((1e6, 4.5e10), (1e8, 3e11))
MEASURED = dataclasses.replace(HARDWARE["cpu"], name="cpu (measured oneDNN)", rates=(
    ("matmul", MATMUL), ("onednn_linear", ((1e5, 8e9), (1e7, 2.2e11), (1e9, 4e11))),
    ("conv", CONV), ("onednn_conv", ((1e6, 2.8e10), (1e8, 4.4e11)))))
UNMEASURED = dataclasses.replace(HARDWARE["cpu"], name="cpu (no oneDNN curve)",
                                 rates=(("matmul", MATMUL),))


@st.composite
def _operands(draw):
    rows = draw(st.lists(st.integers(0, 5), min_size=0, max_size=2))
    k, n = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    x = torch.randn(*rows, k, dtype=torch.float64).float()
    if draw(st.booleans()) and x.dim() >= 2:  # a transposed view, as attention's are
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    w = torch.randn(k, n).t() if draw(st.booleans()) else torch.randn(n, k)
    bias = draw(st.sampled_from(["none", "rows", "one"]))
    b = {"none": None, "rows": torch.randn(n), "one": torch.randn(1)}[bias]
    return x * draw(st.sampled_from([1e-3, 1.0, 1e3])), w, b


@settings(max_examples=60, deadline=None)
@given(_operands(), st.sampled_from([torch.float32, torch.float64, torch.float16]),
       st.sampled_from([onednn_linear, mkl_linear]), st.booleans())
def test_the_kernels_are_torchs_linear_for_any_shape_layout_bias_and_dtype(
        operands, dtype, kernel, parameter):
    x, w, b = (None if t is None else t.to(dtype) for t in operands)
    if parameter:  # (as a model holds it: packed on its second call)
        w = torch.nn.Parameter(w, requires_grad=False)
    expected = F.linear(x, w, b)
    for _ in range(3):  # unpacked, then packed, then the packed copy
        got = kernel(x, w, b)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(
            x.abs().max() if x.numel() else 1) * x.shape[-1])


def test_gradients_go_through_torchs_linear_and_match_it():
    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((3, 4, 8), (6, 8), (6,)))
    onednn_linear(x, w, b).square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).square().sum().backward()
    for got, expected in zip(grads, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got, expected)
    with torch.no_grad():  # nothing recorded: the oneDNN kernel, the same values
        torch.testing.assert_close(onednn_linear(x, w, b), F.linear(x, w, b))


@pytest.mark.skipif(not MKL, reason="torch built without MKL")
def test_mkls_product_packs_a_models_weight_once_per_row_count_and_again_when_written():
    w = torch.nn.Parameter(torch.randn(48, 32))
    x, more = torch.randn(2, 8, 32), torch.randn(5, 32)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(mkl_linear(x, w), F.linear(x, w))
        assert kernels._MKL_PACKED.get(w, (16,))[1] is not None  # 16 rows: packed
        torch.testing.assert_close(mkl_linear(more, w), F.linear(more, w))  # other rows
        w.mul_(-2)  # written in place: packed anew
        for _ in range(3):
            torch.testing.assert_close(mkl_linear(x, w), F.linear(x, w))
    # a gradient needed, or a tracer: torch's linear, which autograd and tracers know
    assert mkl_linear(x, w).grad_fn.name() == F.linear(x, w).grad_fn.name()
    traced = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, w: mkl_linear(x, w))(x, w.detach())
    assert "mkl" not in traced.code, traced.code


@needs_onednn
def test_a_parameters_convolution_weight_is_packed_in_direct_calls():
    """A model's weight is an ``nn.Parameter``, not a tracer's tensor: packed, not handed to
    the operator that packs nothing (which had left ConvNeXt's convolutions unpacked)."""
    w = torch.nn.Parameter(torch.randn(8, 4, 3, 3), requires_grad=False)
    x = torch.randn(1, 4, 9, 9)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(onednn_conv2d(x, w, padding=1), F.conv2d(x, w, padding=1),
                                       rtol=1e-4, atol=1e-4)
    assert kernels._PACKED.get(w, ((1, 1), (1, 1), (1, 1), 1))[1] is not None


def _projection(rows: int, width: int, activation=F.gelu):
    """``activation(x @ w + b)`` with x (rows, width), as GPT-2's Conv1D writes its
    products."""
    def mlp(x, w, b):
        return activation(torch.addmm(b, x, w))
    inputs = (torch.randn(rows, width), torch.randn(width, width) / width ** 0.5,
              torch.randn(width))
    return mlp, inputs


@pytest.mark.parametrize("profile, rows, width, chosen", [
    (MEASURED, 128, 256, True),     # 17 MFLOP: 2.2e11 against 1.5e11 FLOP/s
    (MEASURED, 2, 16, False),       # 1 kFLOP: 8e9 against 2.4e10
    (UNMEASURED, 128, 256, False),  # no curve: never
])
def test_the_measured_curves_choose_the_kernel_by_size(profile, rows, width, chosen):
    mlp, inputs = _projection(rows, width)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(mlp), inputs).saturate(load_rules("all"))
    program = eg.extract(Roofline(profile, fused=False), validate="raise")
    assert ("onednn_linear" in program.code) is chosen, program.code
    torch.testing.assert_close(program(*inputs), mlp(*inputs), rtol=1e-5, atol=1e-5)
    # a program that calls the kernel reads back as linear, and comes out the same again
    again = EGraph.from_fx(program, inputs).saturate(load_rules("all"))
    assert ("onednn_linear" in again.extract(Roofline(profile, fused=False)).code) is chosen


def test_mkls_product_is_chosen_by_its_curve_and_only_in_our_own_emission():
    """Where MKL's packed product measured fastest it is chosen for our emission; never
    where Inductor generates the code (under a tracer it packs nothing)."""
    faster = dataclasses.replace(MEASURED, rates=(
        *MEASURED.rates, ("mkl_linear", ((1e5, 1e10), (1e7, 3e11), (1e9, 5e11)))))
    # (a GELU would be oneDNN's post-op, the cheaper program under these curves)
    mlp, inputs = _projection(128, 256, torch.tanh)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(mlp), inputs).saturate(load_rules("all"))
    own = eg.extract(Roofline(faster, fused=False), validate="raise")
    assert "mkl_linear" in own.code, own.code
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(own(*inputs), mlp(*inputs), rtol=1e-5, atol=1e-5)
    assert "mkl_linear" not in eg.extract(Roofline(faster, fused=True)).code


@pytest.fixture
def measured_profile(tmp_path, monkeypatch):
    """The backend's default cost prices with :data:`MEASURED`, as if calibrated here."""
    from extractors import calibration

    path = tmp_path / "profile.json"
    calibration.save_profile(MEASURED, path)
    monkeypatch.setenv(calibration.ENV, str(path))
    monkeypatch.setattr(calibration, "_profiles", {})


class _Block(torch.nn.Module):
    """A transformer MLP block as BERT writes it: Linear, GELU, Linear, residual."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


@needs_onednn
@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_the_backend_chooses_it_in_inference_and_trains_with_torchs_gradients(
        measured_profile, codegen):
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(2, 64, 256)
    from compiler.compile import make_backend

    backend = make_backend(codegen=codegen, validate="raise")
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    used = [r.extraction.used for r in backend.reports]
    # (our own emission makes the up projection's GELU its post-op; Inductor fuses it)
    assert [sum(u.get(rule, 0) for u in used) for rule in (
        "linear-onednn", "linear-gelu-onednn")] == ([1, 1] if codegen == "eager" else [2, 0]), used

    torch._dynamo.reset()
    trained = torch.compile(model, backend=make_backend(codegen=codegen, validate="raise"))
    trained(x).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    for got, expected in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_the_operator_tracers_see_passes_torchs_operator_checks(bias):
    """``torch.ops.egraph.onednn_linear``: its fake kernel, schema and gradient agree
    with what it computes (torch.library.opcheck)."""
    x, w = torch.randn(3, 5, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)
    b = torch.randn(6, requires_grad=True) if bias else None
    torch.library.opcheck(torch.ops.egraph.onednn_linear.default, (x, w, b))
    torch.testing.assert_close(torch.ops.egraph.onednn_linear(x, w, b), F.linear(x, w, b))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 3, 4]), st.sampled_from([1, 2]),
       st.sampled_from([0, 1, (1, 2), "same", "valid"]), st.sampled_from([1, 2]),
       st.sampled_from([1, 2]), st.booleans(), st.booleans())
def test_the_convolution_is_torchs_for_any_setting_and_again_after_packing(
        batch, kernel, stride, padding, dilation, groups, bias, channels_last):
    if padding == "same" and stride != 1:
        return  # (torch refuses it too)
    x = torch.randn(batch, 4, 9, 9)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, 4 // groups, kernel, kernel), torch.randn(6) if bias else None
    setting = (stride, padding, dilation, groups)
    expected = F.conv2d(x, w, b, *setting)
    with torch.no_grad():
        for _ in range(3):  # unpacked, then packed, then the packed copy
            got = onednn_conv2d(x, w, b, *setting)
            uneven = padding == "same" and dilation * (kernel - 1) % 2  # (torch's runs)
            assert uneven or got.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        bigger = torch.randn(batch + 2, 4, 11, 9)  # another size through the packed copy
        torch.testing.assert_close(onednn_conv2d(bigger, w, b, *setting),
                                   F.conv2d(bigger, w, b, *setting), rtol=1e-4, atol=1e-4)
        w.mul_(-2)  # written in place: packed anew
        torch.testing.assert_close(onednn_conv2d(x, w, b, *setting),
                                   F.conv2d(x, w, b, *setting), rtol=1e-4, atol=1e-4)


def test_the_convolutions_operator_passes_torchs_operator_checks_and_differentiates():
    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((2, 3, 6, 6), (4, 3, 3, 3), (4,)))
    torch.library.opcheck(torch.ops.egraph.onednn_conv2d.default,
                          (x, w, b, [1, 1], [1, 1], [1, 1], 1))
    onednn_conv2d(x, w, b, padding=1).sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_batch_norms_fold_into_the_measured_convolution():
    """conv, eval batch norm, relu, as ResNet writes them: the convolution is oneDNN's with
    the norm folded in, under a profile that measured it; torch's conv2d otherwise."""
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(64), torch.nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2)
        model[1].running_mean.normal_()
    x = torch.randn(1, 32, 28, 28)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(model), (x,)).saturate(load_rules("all"))
    for profile, kernel in ((MEASURED, "onednn_conv2d"), (UNMEASURED, "conv2d")):
        program = eg.extract(Roofline(profile, fused=False), validate="raise")
        assert kernel in program.code and "batch_norm" not in program.code, program.code
        with torch.no_grad():
            for _ in range(2):
                out = program(x)
                torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
                assert out.is_contiguous()  # (as the source's: the caller may view it)


class _MobileBlock(torch.nn.Module):
    """An inverted-residual block as transformers' EfficientNet writes it: a 1 x 1
    expansion with ``padding="valid"``, a depthwise convolution with ``padding="same"``,
    each followed by a batch norm and SiLU, and a 1 x 1 projection with its norm."""

    def __init__(self, kernel: int, width: int = 16, expanded: int = 48):
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(
            nn.Conv2d(width, expanded, 1, padding="valid", bias=False),
            nn.BatchNorm2d(expanded), nn.SiLU(),
            nn.Conv2d(expanded, expanded, kernel, padding="same", groups=expanded,
                      bias=False),
            nn.BatchNorm2d(expanded), nn.SiLU(),
            nn.Conv2d(expanded, width, 1, padding="valid", bias=False),
            nn.BatchNorm2d(width)).eval()
        with torch.no_grad():
            for m in self.body:
                if isinstance(m, nn.BatchNorm2d):
                    m.running_var.uniform_(0.5, 2)
                    m.running_mean.normal_()

    def forward(self, x):
        return x + self.body(x)


@pytest.mark.parametrize("kernel", [3, 4])
@pytest.mark.parametrize("entry", ["export", "symbolic_trace"])
def test_convolutions_padded_by_name_fold_their_norms_and_take_the_measured_kernel(kernel,
                                                                                   entry):
    """``padding="same"`` and ``"valid"`` are the numbers they stand for (an even kernel's
    odd row and column as a pad of the input), so the block's convolutions fold their
    norms, and the ungrouped ones run as oneDNN's where it is faster, through either
    capture."""
    torch.manual_seed(0)
    model, x = _MobileBlock(kernel), torch.randn(1, 16, 15, 15)
    graph = (torch.export.export(model, (x,)) if entry == "export"
             else torch.fx.symbolic_trace(model))
    eg = EGraph.from_fx(graph, (x,)).saturate(load_rules("all"))
    assert len(eg.classes_with_op("pad")) == (kernel % 2 == 0)
    faster = dataclasses.replace(MEASURED, rates=(*MEASURED.rates, ("onednn_conv", (
        (1e4, 4e10), (1e8, 4.4e11)))))  # (at every size: this block's are small)
    program = eg.extract(Roofline(faster, fused=False), validate="raise")
    assert "batch_norm" not in program.code, program.code
    # (the two 1 x 1 convolutions: conv2d-onednn takes ungrouped ones only)
    assert program.code.count("onednn_conv2d(") == 2, program.code
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-4)


class _Bottleneck(torch.nn.Module):
    """ResNet's bottleneck block in eval mode: three conv + batch norm pairs and a residual."""

    def __init__(self, width: int = 64):
        super().__init__()
        layers = []
        for i, kernel in enumerate((1, 3, 1)):
            layers += [torch.nn.Conv2d(width, width, kernel, padding=kernel // 2, bias=False),
                       torch.nn.BatchNorm2d(width)] + ([torch.nn.ReLU()] if i < 2 else [])
        self.body = torch.nn.Sequential(*layers).eval()
        with torch.no_grad():
            for m in self.body:
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_var.uniform_(0.5, 2)
                    m.running_mean.normal_()

    def forward(self, x):
        return torch.relu(x + self.body(x))


@needs_onednn
@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_convolutions_with_folded_weights_stay_right_call_after_call(measured_profile,
                                                                     codegen):
    """Our own emission packs the folded weights once, right call after call; where
    Inductor generates the code the cost model keeps torch's convolution."""
    from compiler.compile import make_backend

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Bottleneck(), _Bottleneck()).eval()
    backend = make_backend(codegen=codegen, validate="raise")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, 28, 28)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    chosen = sum(r.extraction.used.get(rule, 0) for r in backend.reports
                 for rule in ("conv-bn-onednn", "conv2d-onednn", "conv-relu-onednn",
                              "conv-add-relu-onednn"))
    # (the operator Inductor's code calls packs nothing: there it is not chosen)
    assert chosen >= 1 if codegen == "eager" else chosen == 0


def test_the_operator_packs_nothing_so_a_buffer_rewritten_without_a_version_is_read():
    """What generated code hands the operator may be a buffer it reuses for another value
    with no new version (here: written through ``.data``); the operator reads it anew."""
    x, w = torch.randn(1, 8, 10, 10), torch.randn(8, 8, 3, 3)
    conv = torch.ops.egraph.onednn_conv2d
    with torch.no_grad():
        for _ in range(3):
            conv(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        version = w._version
        w.data.copy_(torch.randn_like(w))
        assert w._version == version
        torch.testing.assert_close(conv(x, w, None, [1, 1], [1, 1], [1, 1], 1),
                                   F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)


@needs_onednn
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 3]), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from(["none", "same", "broadcast"]), st.booleans())
def test_the_sum_and_relu_as_post_ops_are_torchs_for_any_setting(batch, kernel, stride, bias,
                                                                   other, channels_last):
    """``onednn_conv2d_relu`` is ``relu(conv2d(...) + other)`` before and after its weight
    is packed, with ``other`` in either layout; an ``other`` that broadcasts goes through
    the calls one by one."""
    x = torch.randn(batch, 4, 9, 9)
    w, b = torch.randn(6, 4, kernel, kernel), torch.randn(6) if bias else None
    conv = F.conv2d(x, w, b, stride, kernel // 2)
    y = {"none": None, "same": torch.randn_like(conv), "broadcast": torch.randn(6, 1, 1)}[other]
    if y is not None and channels_last and y.dim() == 4:
        y = y.contiguous(memory_format=torch.channels_last)
    expected = torch.relu(conv if y is None else conv + y)
    with torch.no_grad():
        for _ in range(3):
            got = kernels.onednn_conv2d_relu(x, w, b, stride, kernel // 2, other=y)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert y is None or y.shape != conv.shape or not torch.equal(y, expected)  # (unwritten)


def test_the_post_ops_differentiate_as_torchs_calls():
    x, w, y = (torch.randn(*s, requires_grad=True) for s in ((2, 3, 6, 6), (4, 3, 3, 3),
                                                              (2, 4, 6, 6)))
    kernels.onednn_conv2d_relu(x, w, None, 1, 1, other=y).sum().backward()
    grads = [t.grad for t in (x, w, y)]
    for t in (x, w, y):
        t.grad = None
    torch.relu(F.conv2d(x, w, None, 1, 1) + y).sum().backward()
    for got, t in zip(grads, (x, w, y)):
        torch.testing.assert_close(got, t.grad)


@needs_onednn
def test_residual_sums_and_relus_run_as_the_convolutions_post_ops(measured_profile):
    """ResNet's bottlenecks in our own emission: the ReLU after a convolution and the
    residual sum and ReLU after the last one are one oneDNN call each, right call after
    call."""
    from compiler.compile import make_backend

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Bottleneck(), _Bottleneck()).eval()
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, 28, 28)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    code = "\n".join(entry.module.code for entry in backend.cache.values())
    assert "onednn_conv2d_relu(" in code, code


@needs_onednn
@pytest.mark.parametrize("order", ["conv first", "residual first"])
def test_extraction_takes_the_residual_post_op_only_where_it_pays(order):
    """``relu(y + conv2d(x))`` is one oneDNN call with ``y`` as the post-op sum's operand
    (either side of the sum), giving the same values; where the sum is read again (its
    convolution would run twice) or ``y`` broadcasts (no post-op takes it), the calls stay
    apart."""
    def spelled(y_shape, read_twice):
        def block(x, w, y):
            conv = F.conv2d(x, w, padding=1)
            total = conv + y if order == "conv first" else y + conv
            return (torch.relu(total), total) if read_twice else torch.relu(total)
        # (58 MFLOP: oneDNN's convolution is the faster kernel under MEASURED's curves)
        return block, (torch.randn(2, 32, 28, 28), torch.randn(64, 32, 3, 3) / 30,
                       torch.randn(*y_shape))

    for y_shape, read_twice, fused in (((2, 64, 28, 28), False, True),
                                       ((2, 64, 28, 28), True, False),
                                       ((64, 1, 1), False, False)):
        block, args = spelled(y_shape, read_twice)
        eg = EGraph.from_fx(torch.fx.symbolic_trace(block), args).saturate(load_rules("all"))
        program = eg.extract(Roofline(MEASURED, fused=False), validate="raise")
        assert ("onednn_conv2d_relu" in program.code) is fused, program.code
        with torch.no_grad():
            torch.testing.assert_close(program(*args), block(*args), rtol=1e-4, atol=1e-4)


@needs_onednn
@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 9),
       st.integers(1, 9), st.booleans(), st.sampled_from(["none", "tanh"]))
def test_the_gelu_as_a_post_op_is_torchs_for_any_shape(rows, k, n, bias, approximate):
    x, w, b = torch.randn(*rows, k), torch.randn(n, k), torch.randn(n) if bias else None
    expected = F.gelu(F.linear(x, w, b), approximate=approximate)
    with torch.no_grad():
        got = kernels.onednn_linear_gelu(x, w, b, approximate)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_gelu_post_op_differentiates_as_torchs_calls():
    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((3, 5, 8), (6, 8), (6,)))
    kernels.onednn_linear_gelu(x, w, b, "tanh").sum().backward()
    grads = [t.grad for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.gelu(F.linear(x, w, b), approximate="tanh").sum().backward()
    for got, t in zip(grads, (x, w, b)):
        torch.testing.assert_close(got, t.grad)


@needs_onednn
def test_a_gelu_after_onednns_inner_product_runs_as_its_post_op(measured_profile):
    """BERT's MLP in our own emission: the GELU is the inner product's post-op, right call
    after call; a product read twice keeps its GELU a call of its own."""
    from compiler.compile import make_backend

    torch.manual_seed(0)
    model, x = _Block(), torch.randn(2, 64, 256)
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    code = "\n".join(entry.module.code for entry in backend.cache.values())
    assert "onednn_linear_gelu(" in code, code

    def read_twice(a, w):
        product = F.linear(a, w)
        return F.gelu(product), product
    args = torch.randn(64, 256), torch.randn(256, 256)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(read_twice), args).saturate(load_rules("all"))
    program = eg.extract(Roofline(MEASURED, fused=False), validate="raise")
    assert "onednn_linear(" in program.code and "onednn_linear_gelu" not in program.code, (
        program.code)


@pytest.mark.parametrize("activation", [torch.tanh, F.gelu], ids=["inner product", "gelu post-op"])
def test_a_program_of_onednns_kernels_is_saved_and_loaded(activation, saved_and_loaded):
    """Loading a saved module traces its code again: each kernel is one call there, not
    its tests of its operands (which a tracer's proxies cannot answer)."""
    mlp, inputs = _projection(128, 256, activation)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(mlp), inputs).saturate(load_rules("all"))
    program = eg.extract(Roofline(MEASURED, fused=False), validate="raise")
    assert "onednn_linear" in program.code, program.code
    with torch.no_grad():
        torch.testing.assert_close(saved_and_loaded(program)(*inputs), mlp(*inputs),
                                   rtol=1e-5, atol=1e-5)


def test_the_operators_in_a_traced_graph_read_back_as_torchs_ops():
    """A graph traced from an emitted program (dynamo's of a compiled one, aot_autograd's)
    calls the operators; they read back as linear and conv2d, which the rules see."""
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    a, m = torch.randn(5, 8), torch.randn(6, 8)

    def traced(x, w, a, m):
        conv = torch.ops.egraph.onednn_conv2d.default(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        return conv, torch.ops.egraph.onednn_linear.default(a, m, None)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(traced), (x, w, a, m))
    assert {"conv2d", "linear"} <= set(eg.ops()) and "opaque" not in eg.ops(), eg.ops()
