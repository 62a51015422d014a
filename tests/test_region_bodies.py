"""Region bodies of higher-order calls (activation checkpointing's, ``nested_compile_region``'s)
are optimised on their own, and the calls are kept: a checkpointed layer is still recomputed
in the backward, now from its optimised body."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as checkpoint

from compiler.compile import make_backend
from compiler.regions import optimise_regions


class Block(nn.Module):
    """A linear layer and a residual layer norm written out, as older model code does."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = self.linear(x)
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)
        return x + (h - mean) / torch.sqrt(var + 1e-5)


class Checkpointed(nn.Module):
    def __init__(self, layers: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


class Nested(Checkpointed):
    def forward(self, x):
        for block in self.blocks:
            x = _nested_block(block, x)
        return x


@torch.compiler.nested_compile_region
def _nested_block(block, x):
    return block(x)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _step(model, forward, x):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # (the same dropout masks)
    out = forward(x)
    out.square().sum().backward()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def _regions_of_a_step_like_eagers(model, x, backend) -> list:
    """A training step through ``backend`` gives eager's output and gradients; the
    reports of the region bodies it compiled."""
    out, grads = _step(model, torch.compile(model, backend=backend), x)
    want, want_grads = _step(model, model, x)
    torch.testing.assert_close(out, want)
    for key, grad in want_grads.items():
        torch.testing.assert_close(grads[key], grad, rtol=1e-4, atol=1e-5)
    return [r for r in backend.reports if " region " in r.name]


def _bodies(module: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    return [getattr(module, n.target) for n in module.graph.nodes
            if n.op == "get_attr" and isinstance(getattr(module, n.target), torch.fx.GraphModule)]


def test_checkpointed_layers_are_optimised_inside_their_regions_for_inductor(monkeypatch):
    """With Inductor's code generation (the default on CUDA) dynamo's graph is compiled
    whole, its checkpointed layers as ``tag_activation_checkpoint`` calls: their bodies
    went unoptimised. Now each body is the optimised program (the written-out norm is
    ``layer_norm``), the three alike layers compile once, and the step equals eager's."""
    from torch._inductor import compile_fx as inductor

    handed = []
    monkeypatch.setattr(inductor, "compile_fx",
                        lambda gm, inputs, **patches: handed.append(gm) or gm.forward)
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(4, 16, requires_grad=True)
    regions = _regions_of_a_step_like_eagers(
        model, x, make_backend(codegen="inductor", validate="raise"))
    (graph,) = handed
    calls = [n for n in graph.graph.nodes
             if n.target is torch.ops.higher_order.tag_activation_checkpoint]
    bodies = _bodies(graph)
    assert len(calls) == len(bodies) == 3
    assert all("layer_norm" in body.code and "sqrt" not in body.code for body in bodies)
    assert len(regions) == 1 and not regions[0].fell_back, [str(r) for r in regions]


def test_a_nested_compile_regions_body_is_optimised_through_aot_autograd():
    """aot_autograd keeps ``invoke_subgraph`` calls with a forward and a backward body of
    their own: both are optimised (they were opaque), once for the three calls, and the
    step equals eager's."""
    torch.manual_seed(0)
    model, x = Nested(), torch.randn(4, 16, requires_grad=True)
    regions = _regions_of_a_step_like_eagers(
        model, x, make_backend(codegen="eager", validate="raise"))
    assert [r.name.split()[0] for r in regions] == ["forward", "backward"]
    assert all(r.extraction.used and not r.fell_back for r in regions), list(map(str, regions))


def test_optimising_regions_leaves_the_given_graph_as_it_is():
    grabbed = []

    def backend(gm, example_inputs):
        grabbed.append(gm)
        return gm

    model = Checkpointed(layers=1)
    torch.compile(model, backend=backend)(torch.randn(2, 16, requires_grad=True))
    (gm,) = grabbed
    (body,) = _bodies(gm)
    code = gm.code
    optimised, reports = optimise_regions(gm, lambda body, inputs, at: torch.fx.symbolic_trace(
        torch.nn.Identity()))
    assert optimised is not gm and gm.code == code and _bodies(gm) == [body]
    assert _bodies(optimised) != [body] and reports == []


def test_graphs_that_differ_only_in_a_region_body_get_programs_of_their_own(monkeypatch):
    """Two functions whose dynamo graphs have the same code and differ only in the bodies
    their higher-order calls run (``score_mod`` of flex_attention, the function a
    checkpoint calls, compiled whole for Inductor): the backend's cache gave the second
    the first's program, a silent wrong result."""
    from torch._inductor import compile_fx as inductor
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(inductor, "compile_fx", lambda gm, inputs, **patches: gm.forward)

    def capped(score, b, h, q, kv):
        return 20 * torch.tanh(score / 20)

    def biased(score, b, h, q, kv):
        return score + (q - kv)

    backend = make_backend(validate="raise")
    q, k, v = (torch.randn(1, 2, 128, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    with torch.no_grad():
        for score_mod in (capped, biased):
            def attend(q, k, v, score_mod=score_mod):
                return flex_attention(q, k, v, score_mod=score_mod)
            torch.testing.assert_close(torch.compile(attend, backend=backend)(q, k, v),
                                       attend(q, k, v))
    backend = make_backend(codegen="inductor", validate="raise")
    x = torch.randn(8, requires_grad=True)
    for f in (torch.sin, torch.cos):
        def checkpointed(x, f=f):
            return checkpoint.checkpoint(f, x, use_reentrant=False)
        torch.testing.assert_close(torch.compile(checkpointed, backend=backend)(x), f(x))


class ChannelsLastAttention(nn.Module):
    """diffusers' VAE mid-block attention, in form: a group norm over (B, C, H*W) of a
    residual sum that is channels-last when the model is, then a projection and dropout."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.GroupNorm(4, channels)
        self.proj = nn.Linear(channels, channels)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        h = self.conv(x) + x
        b, c, height, width = h.shape
        tokens = h.view(b, c, height * width).transpose(1, 2)
        tokens = self.norm(tokens.transpose(1, 2)).transpose(1, 2)
        return self.dropout(self.proj(tokens))


class ChannelsLastModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = ChannelsLastAttention()

    def forward(self, x):
        return checkpoint.checkpoint(self.block, self.stem(x), use_reentrant=False)


def test_a_checkpointed_channels_last_block_trains_with_eagers_gradients():
    """aot_autograd's graphs take the channels-last sum as an input and clone it
    contiguous for ``native_group_norm``, whose kernel requires that layout. Ingest drops
    the clone; emission gave it back only where it knew the value strided, and it took
    every input for contiguous: the program raised "Expected X.is_contiguous"."""
    torch.manual_seed(0)
    model = ChannelsLastModel().to(memory_format=torch.channels_last).train()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    _regions_of_a_step_like_eagers(model, x, make_backend(validate="raise"))


def test_a_region_body_that_cannot_be_optimised_is_kept_with_a_warning():
    grabbed = []
    torch.compile(Checkpointed(layers=1), backend=lambda gm, example_inputs: grabbed.append(
        gm) or gm)(torch.randn(2, 16, requires_grad=True))
    (gm,) = grabbed

    def refuse(body, inputs, at):
        raise RuntimeError("no rule for this op\nsecond line")

    with pytest.warns(UserWarning, match=r"wrap_body_0 kept as it is \(RuntimeError: no "
                                         r"rule for this op\)"):
        optimised, reports = optimise_regions(gm, refuse)
    assert _bodies(optimised) == _bodies(gm) and reports == []
