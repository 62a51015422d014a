"""``torch.compile(model, backend="egraph")`` applies the rule library with the cost model of
the inputs' device, validated; ``options`` choose otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from compiler import compile as backend_module
from compiler.compile import default_cost
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


def test_an_unknown_option_is_a_clear_error_naming_the_options():
    """``options={"memory_budget": 0.5}`` once raised ``TypeError: _compile() got an
    unexpected keyword argument`` from deep inside dynamo (it is an option now); a wrong
    value of a known option is named with its choices, where the user passes it."""
    torch._dynamo.reset()
    backend_module._backends.clear()
    compiled = torch.compile(torch.cos, backend="egraph", options={"memory_limit": 0.5})
    with pytest.raises(Exception, match="unknown egraph backend option 'memory_limit'; "
                                        "the options are: rules, cost, validate, codegen"):
        compiled(torch.zeros(2))
    with pytest.raises(TypeError, match="'memory_limit'; the options are"):
        backend_module.make_backend(memory_limit=0.5)
    with pytest.raises(ValueError, match="codegen='triton': use one of 'eager', 'inductor'"):
        backend_module.make_backend(codegen="triton")
    with pytest.raises(ValueError, match="iter_limit=0: a positive number"):
        backend_module.make_backend(iter_limit=0)


def test_the_options_are_one_frozen_object_the_backend_keeps():
    import dataclasses

    backend = backend_module.make_backend(rules=(), iter_limit=3, validate="raise")
    options = backend.options
    assert (options.rules, options.validate, options.limits["iter_limit"]) == ((), "raise", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.validate = "off"


def test_the_default_cost_is_the_cpu_profile_unfused_on_cpu_inputs():
    cost = default_cost((torch.randn(2), 3))
    assert isinstance(cost, Roofline) and cost.hardware.name == "cpu" and not cost.fused


_INDUCTOR_CHECKS = """
import torch, torch.nn as nn
from compiler.compile import make_backend

# seeded: Inductor's kernels round differently from eager's, by up to a few ulps
torch.manual_seed(0)

class ProjectedLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        x = self.proj(x)
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + 1e-5)

# the e-graph's rewrites (the fused layer norm), then Inductor's code generation
model, x = ProjectedLayerNorm(), torch.randn(4, 32)
backend = make_backend(codegen="inductor", validate="raise")
out = torch.compile(model, backend=backend)(x)
torch.testing.assert_close(out, model(x))
(entry,) = backend.cache.values()
assert "layer_norm" in entry.module.code
out.square().sum().backward()
grads = {k: p.grad.clone() for k, p in model.named_parameters()}
model.zero_grad()
model(x).square().sum().backward()
for k, p in model.named_parameters():
    torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=1e-5)

# GPT-2's Conv1D: with dynamic sizes (the second length) dynamo passes
# x.size()[:-1] + (24,) as one value; it was wrapped as a one-item shape
class Conv1DStyle(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 24))

    def forward(self, x):
        size_out = x.size()[:-1] + (24,)
        return (x.view(-1, x.size(-1)) @ self.weight).view(size_out)

torch._dynamo.reset()
model = Conv1DStyle()
compiled = torch.compile(model, backend=make_backend(codegen="inductor", validate="raise"))
for length in (8, 12):
    x = torch.randn(2, length, 16)
    torch.testing.assert_close(compiled(x), model(x))

# T5's attention: unscaled scores plus a float position bias, 8 tokens. The e-graph keeps
# it unfused by cost; on the CPU Inductor's own patterns do not choose again (they would
# make it flash attention, slower at this size) unless inductor_options turn them on
from torch._dynamo.utils import counters

class BiasedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1, 4, 8, 8))

    def forward(self, q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.softmax(q @ k.transpose(2, 3) + self.bias, -1) @ v

model, qkv = BiasedAttention(), [torch.randn(2, 8, 4, 16) for _ in range(3)]
uncached = {"fx_graph_cache": False}  # (a cached graph counts no pattern)
for options, fused in ((uncached, 0), ({**uncached, "pattern_matcher": True}, 1)):
    torch._dynamo.reset()
    counters.clear()
    backend = make_backend(codegen="inductor", validate="raise", inductor_options=options)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(*qkv), model(*qkv))
    (entry,) = backend.cache.values()
    assert "sdpa" not in entry.module.code and "scaled_dot" not in entry.module.code
    assert counters["inductor"]["fuse_attention"] == fused, (options, dict(counters["inductor"]))
print("ok")
"""


def test_inductor_generates_the_code_of_the_optimised_graph():
    """codegen="inductor": inference and training equal eager, a whole symbolic shape
    stays one shape, and the form the e-graph chose is the one Inductor compiles. In a
    subprocess: Inductor imports triton for compiled kernels, which the Triton tests run
    in the interpreter."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _INDUCTOR_CHECKS], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_inductor_is_handed_torch_ops_not_our_kernels(monkeypatch):
    """With codegen="inductor" on CUDA inputs, the graph handed to Inductor holds torch
    ops only: Inductor traces it with fake tensors, and a Triton kernel of ours launched
    on a fake tensor fails ("Cannot access data pointer of Tensor", every corpus model on
    an H200). CUDA is simulated: the inputs' device decides the target."""
    from torch._inductor import compile_fx as inductor

    from backends.triton import FusedKernel
    from compiler import fx as fx_module

    monkeypatch.setattr(fx_module, "_device_target", lambda inputs: "cuda")
    handed = []
    monkeypatch.setattr(inductor, "compile_fx",
                        lambda gm, inputs, **patches: handed.append(gm) or gm.forward)

    def kernels(module):
        return [n for n in module.graph.nodes if isinstance(n.target, FusedKernel)]

    def gelu_tail(x):
        return 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * x ** 3))) * 3.0 + x

    x = torch.randn(4, 32)
    for codegen in ("eager", "inductor"):
        backend = backend_module.make_backend(codegen=codegen, validate="raise")
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(gelu_tail, backend=backend)(x), gelu_tail(x))
        module = next(iter(backend.cache.values())).module
        assert bool(kernels(module)) == (codegen == "eager"), module.code
    assert len(handed) == 1 and not kernels(handed[0])


def test_the_default_code_generator_follows_the_inputs_device(monkeypatch):
    """Inductor generates the code for CUDA inputs (measured faster there), our emission
    for CPU inputs; the backend picks per graph, so ``codegen`` need not be given."""
    from torch._inductor import compile_fx as inductor
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        on_gpu = torch.empty(2, 3, device="cuda")
    assert backend_module.default_codegen((on_gpu, 3)) == "inductor"
    assert backend_module.default_codegen((torch.randn(2), 3)) == "eager"

    handed = []
    monkeypatch.setattr(inductor, "compile_fx",
                        lambda gm, inputs, **patches: handed.append(gm) or gm.forward)
    backend = backend_module.make_backend(validate="raise")
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    torch.compile(torch.tanh, backend=backend)(x)
    assert not handed and backend.reports[0].name == "graph 0"  # CPU: our emission
    monkeypatch.setattr(backend_module, "default_codegen", lambda inputs: "inductor")
    backend = backend_module.make_backend(validate="raise")
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(torch.tanh, backend=backend)(x), torch.tanh(x))
    assert len(handed) == 1 and backend.reports[0].name == "graph 0"


def test_torch_compiles_mode_reaches_inductor_or_is_named_where_it_cannot(monkeypatch):
    """torch.compile's ``mode`` (Inductor's: autotuning, CUDA graphs) was a TypeError
    ("unexpected keyword argument 'mode'"). It now reaches Inductor as config patches
    where Inductor generates the code (CUDA simulated: Inductor is the default code
    generator there); over our own emission (the CPU's default) it runs and warns that
    the mode changes nothing there; an unknown mode is torch's error, which lists the
    modes."""
    from torch._inductor import compile_fx as inductor

    handed = []
    monkeypatch.setattr(inductor, "compile_fx", lambda gm, inputs, config_patches=None, **_:
                        handed.append(config_patches) or gm.forward)
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="'codegen': 'inductor'"):
        torch._dynamo.reset()
        g = torch.compile(torch.tanh, backend="egraph", mode="reduce-overhead")
        torch.testing.assert_close(g(x), torch.tanh(x))
    assert not handed
    monkeypatch.setattr(backend_module, "default_codegen", lambda inputs: "inductor")
    backend_module._backends.clear()
    torch._dynamo.reset()
    f = torch.compile(torch.tanh, backend="egraph", mode="max-autotune")
    torch.testing.assert_close(f(x), torch.tanh(x))
    assert handed[-1]["max_autotune"] is True and handed[-1]["triton.cudagraphs"] is True
    torch._dynamo.reset()
    with pytest.raises(Exception, match="max-autotune"):
        torch.compile(torch.tanh, backend="egraph", mode="fastest")(x)
    with pytest.raises(Exception, match="max-autotune"):
        torch.compile(torch.tanh, backend="egraph", mode="fastest")(x)


def test_names_moved_out_of_the_backend_module_still_import_with_a_warning():
    """The one-graph pipeline and the by-size dispatch have modules of their own; their
    names are still found at the old path for one release, with a warning naming the
    new one."""
    import compiler.compile
    from compiler.pipeline import compile_graph
    from compiler.specialise import SPECIALISED_SIZES

    with pytest.warns(DeprecationWarning, match="compiler.pipeline.compile_graph"):
        assert compiler.compile.compile_graph is compile_graph
    with pytest.warns(DeprecationWarning, match="compiler.specialise.SPECIALISED_SIZES"):
        assert compiler.compile.SPECIALISED_SIZES == SPECIALISED_SIZES
    with pytest.raises(AttributeError):
        compiler.compile.no_such_name  # noqa: B018
