"""Reassociation keeps to short chains: every grouping of a short sum or product is found,
and a long one (a model's residual stream) grows the e-graph linearly, not as 2^n."""

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph import EGraph
from egraph.rules import load_rules
from egraph.rules.algebra import CHAIN_LIMIT
from egraph.rules.guards import chain_length, short_chain
from extractors import Roofline


def _tree(leaves: list[str], splits: list[int], op: str) -> str:
    """A binary ``op`` tree over ``leaves``, shaped by ``splits``."""
    if len(leaves) == 1:
        return leaves[0]
    cut = 1 + splits[0] % (len(leaves) - 1)
    rest = splits[1:] or [0]
    return f"({op} {_tree(leaves[:cut], rest, op)} {_tree(leaves[cut:], rest[1:] or [0], op)})"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 50), min_size=1, max_size=12),
       st.integers(1, 12))
def test_chain_length_counts_the_operands_of_a_tree(n, splits, limit):
    eg = EGraph()
    leaves = [f"x{i}" for i in range(n)]
    cid = eg.add(_tree(leaves, splits, "add"))
    assert chain_length(eg, cid, "add", limit) == min(n, limit + 1)
    assert chain_length(eg, cid, "mul", limit) == 1


def test_chain_length_is_the_longest_spelling_of_a_class():
    eg = EGraph()
    fused = eg.add("(linear x w b)")
    eg.union(fused, eg.add("(add (matmul x wt) b)"))
    eg.rebuild()
    # linear(x, w, b) is also x @ w.T + b: two operands of a sum
    assert chain_length(eg, fused, "add", 10) == 2
    assert chain_length(eg, eg.add("(add (linear x w b) r)"), "add", 10) == 3


def test_a_cycle_spells_nothing_longer():
    eg = EGraph()
    x = eg.add("(add y z)")
    eg.union(x, eg.add("(add x zero)"))  # x + 0 = x: one-mul and zero-add make these
    eg.rebuild()
    assert chain_length(eg, x, "add", 5) == 2
    assert short_chain("add", 3, "a", "b")(eg, {"a": x, "b": eg.add("w")})
    assert not short_chain("add", 2, "a", "b")(eg, {"a": x, "b": eg.add("w")})


def _saturated(term: str) -> EGraph:
    eg = EGraph()
    eg.add(term, root=True)
    eg.saturate(load_rules("algebra"), iter_limit=40, node_limit=100_000, time_limit=60)
    return eg


def test_every_grouping_of_a_short_sum_is_found():
    leaves = [f"x{i}" for i in range(CHAIN_LIMIT + 1)]
    eg = _saturated(_tree(leaves, [0], "add"))
    assert eg.report.stop_reason == "saturated"
    for order in itertools.permutations(leaves):
        for splits in itertools.product(range(CHAIN_LIMIT), repeat=CHAIN_LIMIT):
            assert eg.equiv(eg.roots[0], _tree(list(order), list(splits), "add"))
    # and each subset of operands is a class of its own
    for size in range(2, CHAIN_LIMIT + 1):
        for subset in itertools.combinations(leaves, size):
            assert eg.lookup(_tree(list(subset), [0], "add")) is not None


def test_a_long_sum_grows_the_egraph_linearly():
    sizes = {}
    for n in (8, 16, 32):
        leaves = [f"x{i}" for i in range(n)]
        residual = leaves[0]
        for leaf in leaves[1:]:  # h = h + block(h): one more term per block
            residual = f"(add {residual} {leaf})"
        eg = _saturated(residual)
        assert eg.report.stop_reason == "saturated"
        sizes[n] = eg.num_classes
    # all groupings of 32 operands would be 2^32 classes
    assert sizes[32] < 2.5 * sizes[16] < 6.25 * sizes[8]
    assert sizes[32] < 60 * 32


def test_a_deep_residual_stream_saturates_and_keeps_its_fusions():
    class Blocks(torch.nn.Module):
        def __init__(self, depth: int):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(depth))

        def forward(self, h):
            for layer in self.layers:
                u = layer(h)
                # GPT-2's gelu, spelled as its modeling code does
                h = h + 0.5 * u * (1.0 + torch.tanh(0.7978845608028654 * (
                    u + 0.044715 * torch.pow(u, 3.0))))
            return h

    model, x = Blocks(12).eval(), torch.randn(4, 16)
    gm = torch.fx.symbolic_trace(model)
    eg = EGraph.from_fx(gm, (x,))
    eg.saturate(load_rules("all"), iter_limit=30, node_limit=50_000, time_limit=60)
    assert eg.report.stop_reason == "saturated"
    out = eg.extract(Roofline("cpu", fused=False), validate="raise")
    gelus = [n for n in out.graph.nodes if "gelu" in str(n.target)]
    assert len(gelus) == 12 and all(n.kwargs.get("approximate") == "tanh" for n in gelus)
    torch.testing.assert_close(out(x), model(x))
