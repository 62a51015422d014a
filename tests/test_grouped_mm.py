"""The grouped product of mixture-of-experts layers (``grouped_mm``): the kernel equals one
matrix product per group on every path (torch's grouped kernel, the loop), forward and
backward; tracers see one operator; transformers' fallback operator lowers to it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph import EGraph
from egraph.rules import load_rules
from extractors import Flops
from frontends.fx.kernels import grouped_mm


def _reference(x: torch.Tensor, w: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """One product per group in float64, rows past the last offset zero (differentiable)."""
    pieces, start = [], 0
    for group, end in enumerate(bounds):
        pieces.append(x[start:end].double() @ w[group].double())
        start = end
    pieces.append(x.new_zeros(x.size(0) - start, w.size(2), dtype=torch.float64))
    return torch.cat(pieces)


def _operands(sizes, tail, k, n, dtype, transposed, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = sum(sizes) + tail
    x = torch.randn(rows, k, generator=g, dtype=dtype).requires_grad_()
    stored = torch.randn(len(sizes), n, k, generator=g, dtype=dtype) if transposed else (
        torch.randn(len(sizes), k, n, generator=g, dtype=dtype))
    stored.requires_grad_()
    w = stored.transpose(-2, -1) if transposed else stored
    bounds = torch.tensor(sizes).cumsum(0).tolist()
    return x, stored, w, bounds, torch.tensor(bounds, dtype=torch.int32)


def _gradients(fn, x, stored, grad):
    x.grad = stored.grad = None
    out = fn()
    out.backward(grad.to(out.dtype))
    return out.detach(), x.grad, stored.grad


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5), tail=st.integers(0, 3),
       k=st.sampled_from([4, 6, 8]), n=st.sampled_from([4, 5, 8]),
       dtype=st.sampled_from([torch.float32, torch.float64]), transposed=st.booleans())
def test_grouped_mm_is_one_product_per_group_forward_and_backward(sizes, tail, k, n, dtype,
                                                                   transposed):
    x, stored, w, bounds, offs = _operands(sizes, tail, k, n, dtype, transposed)
    grad = torch.randn(x.size(0), n, dtype=torch.float64)
    got = _gradients(lambda: grouped_mm(x, w, offs), x, stored, grad)
    expected = _gradients(lambda: _reference(x, w, bounds), x, stored, grad)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    for a, b in zip(got, expected):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b.double(), **tol)
    # an empty group's matrix gets a zero gradient, not whatever memory held
    for group, size in enumerate(sizes):
        if size == 0:
            assert not stored.grad[group].any()


def test_torchs_kernel_and_the_loop_agree():
    """Aligned float32 operands run torch's grouped kernel; the same values with rows
    padded to an unaligned stride run the loop."""
    x, stored, w, bounds, offs = _operands([3, 0, 5, 4], 0, 8, 16, torch.float32, True)
    padded = torch.zeros(x.size(0), 9)
    padded[:, :8] = x.detach()
    unaligned = padded[:, :8].requires_grad_()
    grad = torch.randn(x.size(0), 16)
    native = _gradients(lambda: grouped_mm(x, w, offs), x, stored, grad)
    looped = _gradients(lambda: grouped_mm(unaligned, w, offs), unaligned, stored, grad)
    for a, b in zip(native, looped):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_offsets_that_do_not_rise_give_transformers_result():
    """transformers' own loop is the definition where offsets fall (rows rewritten)."""
    moe = pytest.importorskip("transformers.integrations.moe")
    x = torch.randn(12, 8)
    w = torch.randn(3, 8, 4)
    for bounds in ([4, 2, 12], [4, 8, 10], [4, 8, 15]):
        offs = torch.tensor(bounds, dtype=torch.int32)
        torch.testing.assert_close(grouped_mm(x, w, offs), moe._grouped_mm_fallback(x, w, offs))


def test_an_expanded_gradient_and_the_weights_layout():
    """torch's own grouped kernel rejects the expanded gradient of a sum; an expert
    weight stored transposed gets its gradient in its own layout (no strided copy)."""
    x, stored, w, bounds, offs = _operands([4, 4], 0, 8, 8, torch.float32, True)
    grouped_mm(x, w, offs).sum().backward()
    expected = torch.autograd.grad(_reference(x, w, bounds).sum(), stored)[0]
    torch.testing.assert_close(stored.grad, expected.float())
    _, grad_w = torch.ops.egraph.grouped_mm_backward(x, w, offs, torch.ones(8, 8))
    assert grad_w.stride() == w.stride()


def test_tracers_see_one_operator():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, stored, w, bounds, offs = _operands([2, 3], 1, 8, 8, torch.float32, False)
    traced = make_fx(lambda x, w, offs: grouped_mm(x, w, offs) * 2)(x, w, offs)
    targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert torch.ops.egraph.grouped_mm.default in targets
    assert grouped_mm(x.to("meta"), w.to("meta"), offs.to("meta")).shape == (6, 8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, offs: grouped_mm(x, w, offs).square().sum(),
                             backend="aot_eager", fullgraph=True)
    grad = torch.autograd.grad(compiled(x, w, offs), (x, stored))
    expected = torch.autograd.grad(_reference(x, w, bounds).square().sum(), (x, stored))
    for a, b in zip(grad, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class _Experts(torch.nn.Module):
    """Tokens sorted by expert, then one grouped product: transformers' operator (what
    its experts run under a tracer in float32) or torch's own kernel (bf16 only there)."""

    def __init__(self, spelling: str, experts: int = 3, k: int = 16, n: int = 8):
        super().__init__()
        dtype = torch.bfloat16 if spelling == "torch" else torch.float32
        self.w = torch.nn.Parameter(torch.randn(experts, k, n, dtype=dtype))
        self.experts, self.spelling = experts, spelling

    def forward(self, x, expert):
        order = expert.argsort(stable=True)
        counts = torch.histc(expert.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        if self.spelling == "torch":
            y = torch._grouped_mm(x[order].to(self.w.dtype), self.w, offs=offs)
        else:
            y = torch.ops.transformers.grouped_mm_fallback(x[order], self.w, offs=offs)
        return torch.nn.functional.silu(y)


@pytest.mark.parametrize("spelling", ["transformers", "torch"])
def test_transformers_operator_lowers_and_torchs_own_kernel_stays(spelling):
    """torch's ``_grouped_mm`` leaves rows past the last offset undefined and Inductor
    has kernels of its own for it: it stays as it is."""
    if spelling == "transformers":
        pytest.importorskip("transformers.integrations.moe")
    module = _Experts(spelling)
    inputs = (torch.randn(10, 16), torch.tensor([2, 0, 1, 2, 2, 0, 1, 1, 2, 0]))
    program = torch.export.export(module, inputs)
    eg = EGraph.from_fx(program, inputs)
    assert bool(eg.classes_with_op("grouped_mm")) == (spelling == "transformers")
    opt = eg.saturate(load_rules("all")).extract(Flops(), validate="raise")
    assert ("kernels_grouped_mm" in opt.code) == (spelling == "transformers")
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), module(*inputs))


def test_transformers_experts_under_torch_compile_train_with_our_kernel():
    """Mixtral's experts run transformers' fallback operator under torch.compile in
    float32 (a Python loop behind a custom operator); the emitted module runs ours and
    trains to eager's gradients."""
    pytest.importorskip("transformers")
    from benchmarks.corpus import build
    from compiler.compile import make_backend

    case = build("mixtral")
    model = case.model.train()
    backend = make_backend(rules=load_rules("all"), validate="raise", iter_limit=4)
    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(*case.inputs).square().mean()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model(*case.inputs).square().mean().backward()
    for key, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[key], p.grad, rtol=1e-4, atol=1e-5)
    code = "".join(entry.module.code for entry in backend.cache.values())
    assert "kernels_grouped_mm" in code and "grouped_mm_fallback" not in code
