"""torch.export graphs with higher-order ops (autocast and grad-mode regions, as Llama's
rotary embedding writes them) are ingested, kept as regions, and emitted runnable."""

from __future__ import annotations

import torch
import torch.nn as nn

from egraph import EGraph
from egraph.rules import load_rules
from extractors import Flops


class RotaryBlock(nn.Module):
    """A region under ``torch.autocast(enabled=False)`` and one under ``no_grad``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(4))
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        positions = torch.arange(x.shape[1]).float()
        with torch.autocast("cpu", enabled=False):
            freqs = positions[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], -1)
            cos, sin = emb.cos(), emb.sin()
        with torch.no_grad():
            total = x.sum(-1, keepdim=True)
        return self.proj(x) * cos + sin + total


def test_higher_order_regions_stay_regions_and_run():
    x = torch.randn(2, 5, 8)
    program = torch.export.export(RotaryBlock().eval(), (x,))
    assert any("wrap_with" in str(n.target) for n in program.graph_module.graph.nodes)
    opt = EGraph.from_fx(program).saturate(load_rules("all"), iter_limit=6).extract(
        Flops(), validate="raise")
    assert "wrap_with_autocast" in opt.code and "wrap_with_set_grad_enabled" in opt.code
    torch.testing.assert_close(opt(x), program.module()(x))
    reloaded = torch.fx.GraphModule(opt, opt.graph)  # the regions are submodules of it
    torch.testing.assert_close(reloaded(x), opt(x))


class NoGradBuffer(nn.Module):
    """A cast inside a grad-mode region: torch.export asserts its dtype there too."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(16, 16))

    def forward(self, x, z):
        with torch.no_grad():
            y = self.table.float()
        return y * x + y * z


def test_regions_are_validated_against_float64():
    """The float64 reference runs inside regions too; without it, validation compared with
    the float32 source and refused the factored form a*(x + z) as less accurate."""
    x, z = torch.randn(16, 16), torch.randn(16, 16)
    program = torch.export.export(NoGradBuffer(), (x, z))
    opt = EGraph.from_fx(program, (x, z)).saturate(load_rules("all")).extract(
        Flops(), validate="raise")
    assert opt.meta["egraph_report"].validation.reference == "float64"
    torch.testing.assert_close(opt(x, z), program.module()(x, z))


class Flipped(nn.Module):
    """Two equal aten calls the vocabulary does not model, and casts that torch.export
    records with dtype assertions."""

    def forward(self, x):
        first = torch.flip(x.long(), [1]).to(x.dtype)
        second = torch.flip(x.long(), [1]).to(x.dtype)
        return x + first + second


def test_functional_aten_calls_are_shared_and_unused_ones_dropped():
    x = torch.randn(2, 5)
    program = torch.export.export(Flipped(), (x,))
    assert "_assert_tensor_metadata" in program.graph_module.code
    opt = EGraph.from_fx(program).extract(Flops(), validate="raise")
    assert "_assert_tensor_metadata" not in opt.code
    assert opt.code.count("aten.flip") == 1
    torch.testing.assert_close(opt(x), program.module()(x))


def _spelled_by_dynamo(x):
    first = x.cumsum(0) * torch.linalg.vector_norm(x, dim=1)[:, None]
    second = x.cumsum(0) * 2            # the same cumsum: shared
    torch.logcumsumexp(x, 0)            # unused: dropped
    noise = x.bernoulli() + x.bernoulli()  # random: never shared
    return first + second, noise


def test_torch_functions_and_methods_functional_by_their_aten_schema_are_pure():
    """Dynamo spells the ops the vocabulary does not model as torch functions and Tensor
    methods (``torch.linalg.vector_norm``, ``x.cumsum``, ``x.index_add``), not aten
    overloads: each was an effect, kept in order, never
    shared and never dropped. Their aten namesakes' schemas say which are functional."""
    from compiler.compile import make_backend

    x = torch.rand(4, 4)
    torch._dynamo.reset()
    backend = make_backend(rules=(), validate="raise")
    torch.manual_seed(0)
    out, noise = torch.compile(_spelled_by_dynamo, backend=backend)(x)
    torch.manual_seed(0)
    expected, expected_noise = _spelled_by_dynamo(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(noise, expected_noise)
    (entry,) = backend.cache.values()
    code = entry.module.code
    assert code.count(".cumsum(") == 1 and code.count("vector_norm(") == 1, code
    assert "logcumsumexp" not in code, code
    assert code.count(".bernoulli(") == 2, code


class _Branches(nn.Module):
    """``torch.cond``: each branch a subgraph of the graph torch.compile hands over."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.proj(x).relu(),
                          lambda x: self.proj(x).tanh() * 2, (x,))


class _Jacobians(nn.Module):
    """``torch.func`` transforms in the forward (a Jacobian per example): the values
    dynamo records inside them are functorch's batched wrappers, without a storage."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 3)

    def forward(self, x):
        jacobian = torch.func.jacrev(lambda row: torch.tanh(self.proj(row)))
        return torch.func.vmap(jacobian)(x).sum(1)


def _trained_alike(model: nn.Module, x: torch.Tensor) -> None:
    import copy

    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="egraph", options={"validate": "raise"})
    expected, got = model(x), compiled(x)
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_cond_through_torch_compile_in_training():
    """The state validation keeps held torch.compile's fake example inputs, whose values
    cannot be compared: compiling crashed (DataDependentOutputException)."""
    torch._dynamo.reset()
    for sign in (1, -1):
        _trained_alike(_Branches(), sign * torch.rand(4, 8))


def test_torch_func_transforms_through_torch_compile():
    """Compiling crashed: "Cannot access storage of BatchedTensorImpl"."""
    torch._dynamo.reset()
    _trained_alike(_Jacobians(), torch.randn(5, 8))
