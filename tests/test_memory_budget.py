"""Extraction under a memory budget, and the (cost, peak memory) frontier."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph import EGraph
from egraph.extract.budget import MemoryBudgetError, frontier, within_budget
from egraph.extract.program import is_acyclic, program_order, program_roots

SIZES = {"wide": 100, "cube": 60, "half": 25, "tile": 20, "use": 10, "join": 10, "sum": 1}
COSTS = {"wide": 1, "cube": 2, "half": 3, "tile": 4, "use": 1, "join": 1, "sum": 1}


class LiveBytes:
    """A toy peak: each value lives from its e-node's run to its last reader's (roots to
    the end), with the bytes of ``sizes`` by op (leaves hold none)."""

    local = False  # a whole-program cost

    def __init__(self, sizes=SIZES):
        self.sizes = sizes

    def node_cost(self, egraph, cid, node):
        return self.sizes.get(node[0], 0)

    def program_cost(self, egraph, choice):
        order = program_order(egraph, choice)
        last = {k: i for i, c in enumerate(order) for k in choice[c][1:]}
        last.update((r, len(order)) for r in program_roots(egraph))
        live = peak = 0
        for i, c in enumerate(order):
            live += self.node_cost(egraph, c, choice[c])
            peak = max(peak, live)
            for k in set(choice[c][1:]):
                if last[k] == i:
                    live -= self.node_cost(egraph, k, choice[k])
        return peak


class OpCost:
    """A tree cost of ``costs`` by op (leaves free)."""

    def __init__(self, costs=COSTS):
        self.costs = costs

    def __call__(self, enode, child_costs):
        return self.costs.get(enode.op, 0) + sum(child_costs)


op_cost = OpCost()


def alternatives() -> EGraph:
    """A root with four forms, from cheap and wide to dear and narrow, sharing x."""
    eg = EGraph()
    root = eg.add("(sum (use (wide x)))", root=True)
    for form in ("(sum (use (cube x)))", "(sum (join (half x) (half y)))",
                 "(sum (join (tile x) (tile y)))"):
        eg.union(root, eg.add(form))
    eg.rebuild()
    return eg


def every_program(eg: EGraph, sizes=SIZES, costs=COSTS):
    """(cost, peak) of every acyclic program of ``eg``, by enumeration."""
    classes = eg.classes()
    roots = program_roots(eg)
    for nodes in itertools.product(*(eg.class_nodes[c] for c in classes)):
        choice = dict(zip(classes, nodes))
        if not is_acyclic(eg, choice, roots):
            continue
        reached = {c: choice[c] for c in program_order(eg, choice)}
        cost = sum(costs.get(n[0], 0) for n in reached.values())
        yield cost, LiveBytes(sizes).program_cost(eg, reached), reached


def test_the_budget_forces_the_narrow_program():
    eg = alternatives()
    cheapest = eg.extract(op_cost, method="dag")
    assert str(cheapest[0]) == "(sum (use (wide x)))"
    # peaks: wide 110, cube 70, half 60, tile 50; costs 3, 4, 8, 10
    for budget, form, cost in ((70, "(use (cube x))", 4), (69, "(join (half x) (half y))", 8),
                               (59, "(join (tile x) (tile y))", 10)):
        term, found_cost = eg.extract(op_cost, memory_budget=budget, memory=LiveBytes())
        assert (str(term), found_cost) == (f"(sum {form})", cost)
        found = within_budget(eg, op_cost, LiveBytes(), budget)
        assert found.peak <= budget and found.optimal and found.gap == 0


def test_a_budget_that_binds_nothing_keeps_the_cheapest_program():
    eg = alternatives()
    found = within_budget(eg, op_cost, LiveBytes(), math.inf)
    assert found.cost == 3 and found.peak == 110 and found.optimal


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=0.0, max_value=1.0))
def test_the_program_found_fits_and_costs_no_less_than_the_unbudgeted_optimum(fraction):
    eg = alternatives()
    programs = list(every_program(eg))
    least = min(p for _, p, _ in programs)
    most = max(p for _, p, _ in programs)
    budget = least + fraction * (most - least)
    found = within_budget(eg, op_cost, LiveBytes(), budget)
    unbudgeted = min(c for c, _, _ in programs)
    optimum = min(c for c, p, _ in programs if p <= budget)
    assert found.peak <= budget and found.cost >= unbudgeted
    assert found.peak == LiveBytes().program_cost(eg, found.choice)
    if found.cost_bound is not None:
        assert found.cost_bound <= optimum + 1e-9
    assert found.peak_bound <= least
    assert found.cost == optimum  # the heuristic finds it on this e-graph


def test_the_frontier_holds_non_dominated_programs_with_their_peaks():
    eg = alternatives()
    points = frontier(eg, op_cost, LiveBytes())
    costs = [(p.cost, p.peak) for p in points]
    assert costs == [(3, 110), (4, 70), (8, 60), (10, 50)]
    for a, b in costs:
        assert not any(a2 <= a and b2 <= b and (a2, b2) != (a, b) for a2, b2 in costs)
    for p in points:
        assert p.peak == LiveBytes().program_cost(eg, p.choice)
    exact = {}
    for c, p, _ in every_program(eg):
        exact[p] = min(c, exact.get(p, c))
    best = [(c, p) for p, c in exact.items()
            if not any(c2 <= c and p2 <= p and (c2, p2) != (c, p) for p2, c2 in exact.items())]
    assert sorted(best) == costs


def test_pareto_measures_a_whole_program_cost_as_the_program_peaks():
    eg = alternatives()
    points = eg.pareto(op_cost, LiveBytes())
    assert [p.costs for p in points][0] == (3, 110)
    assert all(p.costs[1] == LiveBytes().program_cost(eg, p.choice) for p in points)
    assert str(points[-1].program) == "(sum (join (tile x) (tile y)))"


def test_a_budget_no_program_meets_names_the_smallest_peak():
    eg = alternatives()
    with pytest.raises(MemoryBudgetError, match=r"memory_budget=10 B.*smallest peak found is "
                                                 r"50 B.*can peak below 50 B"):
        eg.extract(op_cost, memory_budget=10, memory=LiveBytes())


@pytest.mark.parametrize("budget", [-1, float("nan"), "1GB", True, None])
def test_a_budget_that_is_not_a_number_of_bytes_is_refused_with_the_range(budget):
    eg = alternatives()
    if budget is None:  # a plain e-graph has no memory model of its own
        with pytest.raises(ValueError, match="needs memory="):
            eg.extract(op_cost, memory_budget=100)
        return
    with pytest.raises((ValueError, TypeError), match=r"a number of bytes, 0 or more"):
        eg.extract(op_cost, memory_budget=budget, memory=LiveBytes())


# -- an e-graph built from FX: PeakMemory by default ------------------------------------


@pytest.fixture(scope="module")
def bert():
    """The corpus's BERT through torch.export and the rule library, with its cost."""
    pytest.importorskip("transformers")
    import warnings

    import torch

    from benchmarks.corpus import build
    from compiler.compile import default_cost
    from egraph.rules import load_rules

    case = build("bert")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(case.model.eval(), case.inputs)
        eg = EGraph.from_fx(program, case.inputs).saturate(
            load_rules("all"), iter_limit=10, node_limit=50_000, time_limit=120.0)
    return case, eg, default_cost(case.inputs)


def test_a_corpus_model_extracted_within_its_least_peak_is_validated_and_correct(bert):
    """Under the peak the emitted program really reaches (PeakMemory matches the measured
    peak), the corpus BERT's inference programs trade no time for memory: its outputs
    and feed-forward values set the peak whatever the rewrites, so the budget is the
    least peak the frontier finds, and the program extracted under it runs correctly and
    peaks where the estimate says."""
    import torch

    from compiler.memory import peak_bytes
    from extractors import PeakMemory

    case, eg, cost = bert
    free = eg.extract(cost, validate="raise").meta["egraph_report"]
    least = min(p.costs[1] for p in eg.pareto(cost, PeakMemory(), validate="off"))
    opt = eg.extract(cost, memory_budget=least, validate="raise")
    report = opt.meta["egraph_report"]
    assert report.memory.peak <= least and report.method == "budget"
    assert report.cost_after >= free.cost_after and report.validation.ok
    assert "peak memory" in str(report) and report.memory.seconds > 0
    with torch.no_grad():
        torch.testing.assert_close(opt(*case.inputs), case.model(*case.inputs),
                                   rtol=1e-4, atol=1e-5)
    assert peak_bytes(opt, *case.inputs) == pytest.approx(report.memory.peak, rel=0.15)


def _chosen(eg, cost):
    from compiler.fx import choose_program

    return choose_program(eg, cost)[0]


def test_a_corpus_model_refuses_budgets_out_of_range_and_unmet(bert):
    _, eg, cost = bert
    with pytest.raises(ValueError, match="0 or more"):
        eg.extract(cost, memory_budget=-5)
    with pytest.raises(TypeError, match="a number of bytes"):
        eg.extract(cost, memory_budget="half")
    with pytest.raises(MemoryBudgetError, match=r"memory_budget=1 B: the smallest peak found"):
        eg.extract(cost, memory_budget=1)


def test_a_lexicographic_cost_under_a_budget_is_refused_with_the_fix(bert):
    from extractors import Flops, Lexicographic
    from extractors.curvature import Curvature

    _, eg, _ = bert
    with pytest.raises(ValueError, match="weigh its parts into one sum"):
        eg.extract(Lexicographic(Curvature(), Flops()), memory_budget=2**20)


def test_the_peak_frontier_of_a_corpus_model_is_non_dominated(bert):
    from extractors import PeakMemory

    _, eg, cost = bert
    points = eg.pareto(cost, PeakMemory(), validate="off")
    costs = [p.costs for p in points]
    assert points and costs == sorted(costs)  # (BERT's: one point, see above)
    for a, b in costs:
        assert not any(a2 <= a and b2 <= b and (a2, b2) != (a, b) for a2, b2 in costs)
    assert all(b == PeakMemory().program_cost(eg, p.choice) for p, (_, b) in zip(points, costs))


@st.composite
def random_egraphs(draw):
    """Small e-graphs of ops f, g, h, k (one or two operands) over leaves x and y, with
    some classes merged, and bytes and costs per op."""
    eg = EGraph()
    classes = [eg.add("x"), eg.add("y")]
    for _ in range(draw(st.integers(2, 6))):
        op = draw(st.sampled_from("fghk"))
        kids = draw(st.lists(st.sampled_from(classes), min_size=1, max_size=2))
        classes.append(eg.add_node(op, kids))
    root = classes[-1]
    eg.add_root(root)
    for _ in range(draw(st.integers(1, 3))):
        a, b = draw(st.sampled_from(classes[2:])), draw(st.sampled_from(classes[2:]))
        eg.union(a, b)
    eg.rebuild()
    sizes = {op: draw(st.integers(1, 100)) for op in "fghk"}
    costs = {op: draw(st.integers(1, 20)) for op in "fghk"}
    return eg, sizes, costs


@settings(max_examples=60, deadline=None)
@given(random_egraphs(), st.floats(min_value=-0.5, max_value=1.0))
def test_on_random_egraphs_the_program_fits_and_the_bounds_hold(drawn, fraction):
    eg, sizes, costs = drawn
    programs = [(c, p) for c, p, _ in every_program(eg, sizes, costs)]
    least, most = min(p for _, p in programs), max(p for _, p in programs)
    budget = max(0, least + fraction * (most - least))
    if budget < least:  # no program fits: the error's figures hold
        with pytest.raises(MemoryBudgetError) as refused:
            within_budget(eg, OpCost(costs), LiveBytes(sizes), budget)
        assert refused.value.smallest >= least and refused.value.peak_bound <= least
        return
    found = within_budget(eg, OpCost(costs), LiveBytes(sizes), budget)
    optimum = min(c for c, p in programs if p <= budget)
    assert found.peak <= budget and found.cost >= min(c for c, _ in programs)
    assert found.cost_bound is None or found.cost_bound <= optimum
    assert found.peak_bound is None or found.peak_bound <= least
    assert not found.optimal or found.cost == optimum
