"""Calls on constants fold at ingest where running them is pure: masks made from positions
alone, in the spellings of real model code, through torch.export and dynamo's graphs.
A fold that ran a call wrongly (a view shared, an argument written into, a random draw
frozen) gives a different mask from the source's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.sizes import is_input_check
from egraph import AstSize, EGraph

# Ways model code builds a bool mask of shape (B, L) from positions ``p`` (B, L), a
# length ``n`` and a threshold ``k`` (transformers' packed-sequence and causal masks,
# padding masks, sliding windows).
STEPS = {
    "packed": lambda p, n, k: torch.diff(p, prepend=p[:, :1] - 1, dim=-1) != 1,
    "segments": lambda p, n, k: (p % (k + 1) == 0).cumsum(-1) <= 1,
    "ones": lambda p, n, k: p.new_ones(p.shape, dtype=torch.bool),
    "reversed": lambda p, n, k: p[:, torch.arange(n).flip(0)] >= k,
    "tril": lambda p, n, k: torch.tril(torch.ones(n, n, dtype=torch.bool))[k % n].expand(
        p.shape[0], -1),
    "moved": lambda p, n, k: p.to(p.device) < k,
    "where": lambda p, n, k: torch.where(p > k, p, 0).bool(),
    "rolled": lambda p, n, k: torch.roll(p, 1, -1) < p,
    "window": lambda p, n, k: (p[:, :, None] - p[:, None, :]).abs().le(k).any(-1),
    "gathered": lambda p, n, k: p.gather(-1, p.flip(-1)) % 2 == 0,
}


class Masked(nn.Module):
    """``x`` filled where a mask made of ``steps`` (combined with ``&`` and ``|``) is
    False; the batch and length are the module's, fixed as dynamo specialises them."""

    def __init__(self, steps: list[tuple[str, int, bool]], batch: int, length: int):
        super().__init__()
        self.steps, self.batch, self.length = steps, batch, length

    def forward(self, x):
        n = self.length
        p = torch.arange(n).unsqueeze(0).expand(self.batch, -1)
        mask = None
        for name, k, either in self.steps:
            step = STEPS[name](p, n, k)
            mask = step if mask is None else (mask | step if either else mask & step)
        return x.masked_fill(~mask, -1e4) + mask.sum(-1, keepdim=True)


def _dynamo_graph(model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """The graph dynamo hands a backend (symbolic tracing would run the calls on constants
    itself, so only dynamo's and torch.export's graphs hold them)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, dynamic=False)(x)
    (gm,) = graphs
    return gm


def _optimised(model: nn.Module, x: torch.Tensor, entry: str) -> torch.fx.GraphModule:
    source = (torch.export.export(model, (x,)) if entry == "export"
              else _dynamo_graph(model, x))
    return EGraph.from_fx(source, (x,)).extract(AstSize(), validate="raise")


_steps = st.lists(st.tuples(st.sampled_from(sorted(STEPS)), st.integers(0, 6), st.booleans()),
                  min_size=1, max_size=4)


@settings(max_examples=30, deadline=None)
@given(_steps, st.integers(1, 3), st.integers(2, 9))
def test_a_mask_of_positions_folds_and_keeps_its_values(steps, batch, length):
    model = Masked(steps, batch, length)
    x = torch.randn(batch, length)
    opt = _optimised(model, x, "export")
    calls = [n for n in opt.graph.nodes
             if n.op in ("call_function", "call_method") and not is_input_check(n)]
    # what remains reads the input: the fill, the sum's add
    assert len(calls) <= 2, opt.code
    for _ in range(2):  # a second call sees the same constants
        torch.testing.assert_close(opt(x), model(x))


@pytest.mark.parametrize("entry", ["export", "compile"])
@pytest.mark.parametrize("name", sorted(STEPS))
def test_each_spelling_folds_alone(name, entry):
    model = Masked([(name, 2, False)], 2, 6)
    x = torch.randn(2, 6)
    opt = _optimised(model, x, entry)
    calls = [n for n in opt.graph.nodes
             if n.op in ("call_function", "call_method") and not is_input_check(n)]
    assert len(calls) <= 2, opt.code
    out = opt(x)
    torch.testing.assert_close(out[0] if entry == "compile" else out, model(x))


def test_the_fold_limit_is_in_bytes():
    """A causal mask of 90,000 bools (88 KiB, T=300) folds; a float32 table of 360,000
    elements (1.4 MiB) stays computed: it would weigh the module down more than computing
    it costs."""
    class Masks(nn.Module):
        def forward(self, x):
            causal = torch.tril(torch.ones(300, 300, dtype=torch.bool))
            table = torch.ones(600, 600).cumsum(-1)
            return x.masked_fill(~causal, 0.0), table[:2, :3] * x[:2, :3]

    x = torch.randn(300, 300)
    opt = _optimised(Masks(), x, "export")
    assert "tril" not in opt.code and "cumsum" in opt.code
    for got, want in zip(opt(x), Masks()(x)):
        torch.testing.assert_close(got, want)
