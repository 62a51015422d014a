"""``torch.compile(model, backend="egraph")`` applies the rule library with the cost model of
the inputs' device, validated; ``options`` choose otherwise."""

from __future__ import annotations

import torch
import torch.nn as nn

from backends import compile as backend_module
from backends.compile import default_cost
from extractors import Roofline


class NaiveLayerNorm(nn.Module):
    """A layer norm written out with the one-pass variance."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + 1e-5)


def _emitted(options_key: str) -> list[str]:
    backend = backend_module._backends[options_key]
    return [entry.module.code for entry in backend.cache.values()]


def test_the_default_backend_applies_the_rule_library():
    torch._dynamo.reset()
    backend_module._backends.clear()
    model, x = NaiveLayerNorm(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="egraph")
    torch.testing.assert_close(compiled(x), model(x))
    codes = _emitted(repr([]))
    assert any("layer_norm" in code for code in codes), codes


def test_options_choose_the_rules():
    torch._dynamo.reset()
    backend_module._backends.clear()
    model, x = NaiveLayerNorm(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="egraph", options={"rules": ()})
    torch.testing.assert_close(compiled(x), model(x))
    (key,) = backend_module._backends
    assert not any("layer_norm" in code for code in _emitted(key))


def test_the_default_cost_is_the_cpu_profile_unfused_on_cpu_inputs():
    cost = default_cost((torch.randn(2), 3))
    assert isinstance(cost, Roofline) and cost.hardware.name == "cpu" and not cost.fused


class ProjectedLayerNorm(NaiveLayerNorm):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        return super().forward(self.proj(x))


def test_inductor_generates_the_code_of_the_optimised_graph():
    """codegen="inductor": the e-graph's rewrites (the fused layer norm), then Inductor's
    code generation; inference and training equal eager."""
    from backends.compile import make_backend

    torch._dynamo.reset()
    model, x = ProjectedLayerNorm(), torch.randn(4, 32)
    backend = make_backend(codegen="inductor", validate="raise")
    compiled = torch.compile(model, backend=backend)
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    (entry,) = backend.cache.values()
    assert "layer_norm" in entry.module.code
    out.square().sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().sum().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=1e-5)


class Conv1DStyle(nn.Module):
    """GPT-2's Conv1D: the output shape built from the input's, passed whole to view."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 24))

    def forward(self, x):
        size_out = x.size()[:-1] + (24,)
        return (x.view(-1, x.size(-1)) @ self.weight).view(size_out)


def test_a_whole_symbolic_shape_stays_one_shape_for_inductor():
    """With dynamic sizes (the second sequence length), dynamo's graph passes
    ``x.size()[:-1] + (24,)`` as one value: it was wrapped as a one-item shape."""
    from backends.compile import make_backend

    torch._dynamo.reset()
    model = Conv1DStyle()
    compiled = torch.compile(model, backend=make_backend(codegen="inductor", validate="raise"))
    for length in (8, 12):
        x = torch.randn(2, length, 16)
        torch.testing.assert_close(compiled(x), model(x))
