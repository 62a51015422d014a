"""Extraction under a memory budget: the cheapest program whose peak memory fits.

Peak memory is not a sum over e-nodes: it is the most bytes live at once while a program
runs, which depends on the whole program (which values it computes, when each is last
read). The memory model is any object with ``program_cost(egraph, choice)``, the peak of a
program, and ``node_cost(egraph, cid, node)``, the bytes one e-node's value holds
(``extractors.PeakMemory`` for tensor programs). The method is a DAG heuristic checked by
an ILP bound:

* Footprints. While an e-node runs, its value and its operands' values are live together,
  so a program peaks at least at the largest *footprint* of its e-nodes: the e-node's
  bytes plus, per distinct operand class, the fewest bytes any e-node of that class holds.
  An e-node whose footprint exceeds the budget is in no program within it.
* Candidates, each measured by the memory model: the programs the caller gives (the
  unbudgeted optimum, the source); the cheapest program (DAG heuristic) among the e-nodes
  whose footprint is at most a threshold, the threshold searched by halving between the
  least one any program allows and the budget; the cheapest under weighted sums of the
  cost and the bytes written; the fewest bytes written. The cheapest candidate within the
  budget is improved by local search (single re-choices that lower the cost and keep the
  peak within the budget).
* Bounds. The ILP optimum (HiGHS) of the cost over the e-nodes whose footprint fits the
  budget is a lower bound on the optimum under the budget, for a cost that is a sum over
  e-nodes; where its program fits, it is that optimum (``optimal``). The least threshold
  at which any program exists bounds every program's peak from below (``peak_bound``).
  Whatever the memory model, the unbudgeted optimum bounds the cost from below.

The bounds hold for a model that counts each value from its e-node's run to its last
reader's; a program measured below its own footprint shows a model that does not: then
the cost is bounded by the unbudgeted optimum only, no peak bound is claimed, and the
thresholds are searched as a heuristic.

>>> from egraph import EGraph, AstSize
>>> class Bytes:  # 'big' holds 100 bytes, everything else 1: a toy peak
...     def node_cost(self, egraph, cid, node):
...         return 100 if node[0] == "big" else 1
...     def program_cost(self, egraph, choice):
...         return max(self.node_cost(egraph, c, n) + len(n) - 1 for c, n in choice.items())
>>> eg = EGraph()
>>> root = eg.add("(big x)", root=True)
>>> _ = eg.union(root, eg.add("(small (small x))"))
>>> found = within_budget(eg, AstSize(), Bytes(), 10)
>>> sorted(n[0] for n in found.choice.values()), found.peak, found.optimal
(['small', 'small', 'x'], 2.0, True)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any

from egraph.extract.methods import TIE, ProgramGraph, choose
from egraph.extract.program import dag_cost, is_acyclic, program_order, program_roots
from egraph.extract.tree import build_term, cheaper

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from egraph.term import Term

__all__ = ["BudgetedProgram", "MemoryBudgetError", "Program", "check_budget", "extract_within",
           "frontier", "within_budget"]

WEIGHTS = (0.25, 1.0, 4.0, 16.0)
"""The weights of the bytes written against the cost in the weighted-sum candidates,
relative to their ratio in the unbudgeted optimum."""
PEAK_EVALUATIONS = 40
"""How many programs the local search measures at most (each is one run of the memory
model over the whole program)."""


class MemoryBudgetError(ValueError):
    """No program found fits the memory budget: the error names the budget, the smallest
    peak found and the least peak any program can have (``peak_bound``).

    >>> print(MemoryBudgetError(1000, 4096, 2048))  # doctest: +NORMALIZE_WHITESPACE
    no program fits memory_budget=1000 B: the smallest peak found is 4.0 KiB; no program
    of this e-graph can peak below 2.0 KiB. Raise the budget to at least 4.0 KiB, or
    saturate with rules that give lighter forms
    """

    def __init__(self, budget: float, smallest: float, peak_bound: float | None):
        self.budget, self.smallest, self.peak_bound = budget, smallest, peak_bound
        bound = "" if peak_bound is None else (
            f"; no program of this e-graph can peak below {_bytes(peak_bound)}")
        super().__init__(
            f"no program fits memory_budget={_bytes(budget)}: the smallest peak found is "
            f"{_bytes(smallest)}{bound}. Raise the budget to at least {_bytes(smallest)}, "
            "or saturate with rules that give lighter forms")


def check_budget(budget: Any) -> float:
    """``budget`` as a float number of bytes, refused with the valid range where it is not
    one (a bool, a string, NaN) or is negative.

    >>> check_budget(2**20), check_budget(float("inf"))
    (1048576.0, inf)
    >>> check_budget(-1)
    Traceback (most recent call last):
    ...
    ValueError: memory_budget=-1: a budget is a number of bytes, 0 or more (inf for none)
    """
    valid = "a budget is a number of bytes, 0 or more (inf for none)"
    if isinstance(budget, bool) or not isinstance(budget, Real):
        raise TypeError(f"memory_budget={budget!r}: {valid}")
    value = float(budget)
    if value != value or value < 0:
        raise ValueError(f"memory_budget={budget!r}: {valid}")
    return value


@dataclass(frozen=True)
class Program:
    """A program (class -> e-node over the classes it reaches) with its cost and peak.

    >>> Program({0: ("x",)}, cost=1, peak=0.0)
    Program(cost=1, peak=0.0)
    """

    choice: dict[int, tuple] = field(repr=False)
    cost: Any
    peak: float


@dataclass(frozen=True)
class BudgetedProgram(Program):
    """The program :func:`within_budget` chose, and how far from optimal it can be.

    ``cost_bound``: no program within the budget costs less (the footprints' ILP bound, or
    the unbudgeted optimum where the model breaks the footprints; None where not proven: a
    cost that is not a sum over e-nodes, the solver out of time); ``optimal``: the cost
    equals the bound. ``peak_bound``: no program peaks lower. ``candidates``: the
    programs measured; ``seconds``: the search's time.

    >>> found = BudgetedProgram({}, cost=105, peak=900.0, budget=1024, cost_bound=100)
    >>> round(found.gap, 3)
    0.05
    >>> print(found)  # doctest: +NORMALIZE_WHITESPACE
    peak memory 900 B within the budget 1.0 KiB (at most 5.0% above the optimum;
    0 programs measured in 0 ms)
    """

    budget: float = math.inf
    cost_bound: Any = None
    optimal: bool = False
    peak_bound: float | None = None
    candidates: int = 0
    seconds: float = 0.0

    @property
    def gap(self) -> float | None:
        """How far the cost is above the bound, relative to the bound (0: optimal)."""
        if self.optimal:
            return 0.0
        if self.cost_bound is None:
            return None
        if not self.cost_bound:
            return 0.0 if not self.cost else math.inf
        return max(0.0, self.cost / self.cost_bound - 1)

    def __str__(self) -> str:
        gap = ("optimal" if self.optimal else "distance to the optimum unknown"
               if self.gap is None else f"at most {self.gap:.1%} above the optimum")
        bound = "" if self.peak_bound is None else f", least possible {_bytes(self.peak_bound)}"
        return (f"peak memory {_bytes(self.peak)} within the budget {_bytes(self.budget)}"
                f"{bound} ({gap}; {self.candidates} programs measured in "
                f"{self.seconds * 1e3:.0f} ms)")


def _bytes(value: float) -> str:
    if value == math.inf:
        return "inf"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


class _Search:
    """The candidates of one e-graph under one cost and one memory model, each measured
    once; the footprints and the threshold searches that make them."""

    def __init__(self, egraph: EGraph, cost, memory, prefer=None, time_limit: float = 1.0):
        if not getattr(cost, "additive", True):
            raise ValueError(
                f"a memory budget needs a cost that gives each e-node a number; {cost!r} "
                "compares tuples in order: weigh its parts into one sum instead "
                "(Curvature() + 1e-3 * Flops())")
        self.egraph, self.cost, self.memory, self.prefer = egraph, cost, memory, prefer
        self.time_limit = time_limit
        self.roots = program_roots(egraph)
        self.program = ProgramGraph.of(egraph, cost, "budgeted", self.roots, prefer)
        self.sizes = ProgramGraph.of(egraph, memory, "budgeted", self.roots).graph.cost
        self.footprint = self._footprints()
        self.graph_node = {(self.program.classes[self.program.graph.node_class[n]], node): n
                           for n, node in enumerate(self.program.nodes)}
        self.measured: dict[frozenset, Program] = {}
        self.summed = getattr(cost, "local", True)  # a sum over e-nodes: the ILP bounds it

    def _footprints(self) -> list[float]:
        graph, sizes = self.program.graph, self.sizes
        least = [min((sizes[n] for n in members), default=0.0)
                 for members in graph.class_nodes]
        return [sizes[n] + sum(least[k] for k in graph.kids[n])
                for n in range(len(graph.node_class))]

    def measure(self, choice: dict[int, tuple]) -> Program:
        """The program ``choice`` makes from the roots, with its cost and peak."""
        choice = {c: choice[c] for c in program_order(self.egraph, choice, self.roots)}
        key = frozenset(choice.items())
        found = self.measured.get(key)
        if found is None:
            found = self.measured[key] = Program(
                choice, dag_cost(self.egraph, self.cost, choice),
                float(self.memory.program_cost(self.egraph, choice)))
        return found

    def start(self, starts: list[dict[int, tuple]]) -> Program:
        """The cheapest of ``starts`` and the DAG heuristic's program, all measured."""
        cheapest, _, _ = self.extract(math.inf)
        programs = [self.measure(choice) for choice in starts]
        if cheapest is not None:
            programs.append(cheapest)
        if not programs:
            raise ValueError("no program to start from: every root's e-nodes are cyclic")
        return min(programs, key=_by_cost)

    def extract(self, threshold: float, costs=None, method: str = "dag"
                ) -> tuple[Program | None, Any, bool | None]:
        """The cheapest program (under ``costs``, default the cost) among the e-nodes whose
        footprint is at most ``threshold``: ``(program or None where there is none, its
        value in the graph, proven optimal?)``."""
        from egraph.extract.serialized import extract_graph

        footprint = self.footprint
        program = self.program.restricted(lambda n: footprint[n] <= threshold, costs)
        try:
            pick, optimal = extract_graph(program.graph, method, self.time_limit)
        except ValueError:  # no acyclic program among those e-nodes
            return None, None, None
        return self.measure(program.choice(pick)), program.graph.dag_cost(pick), optimal

    def exact(self, threshold: float) -> tuple[Program | None, Any]:
        """The ILP's cheapest program among the e-nodes whose footprint is at most
        ``threshold``, and its cost as a lower bound on every program of those e-nodes
        (None where the cost is not a sum over e-nodes or the solver proved nothing)."""
        if not self.summed:
            return None, None
        found, value, proven = self.extract(threshold, method="ilp")
        if not proven:
            return found, None
        # (the e-nodes ``prefer`` leaves out cost a tie's surcharge more in the graph)
        return found, value if self.prefer is None else value / (1 + TIE)

    def exists(self, threshold: float) -> bool:
        from egraph.extract.greedy import greedy_tree

        footprint = self.footprint
        graph = self.program.restricted(lambda n: footprint[n] <= threshold).graph
        pick, _ = greedy_tree(graph)
        return all(pick[r] >= 0 for r in graph.roots)

    def peak_bound(self) -> float:
        """The least threshold at which a program exists: every program peaks at least
        there (by halving over the footprints)."""
        levels = sorted(set(self.footprint))
        low, high = 0, len(levels) - 1
        while low < high:
            mid = (low + high) // 2
            if self.exists(levels[mid]):
                high = mid
            else:
                low = mid + 1
        return levels[low]

    def thresholds(self, low: float, high: float, budget: float) -> None:
        """Candidates at thresholds between ``low`` and ``high``: halving towards the
        highest threshold whose cheapest program fits ``budget``."""
        levels = [t for t in sorted(set(self.footprint)) if low <= t <= high]
        first, last = 0, len(levels) - 1
        while first <= last:
            mid = (first + last) // 2
            found, _, _ = self.extract(levels[mid])
            if found is not None and found.peak <= budget:
                first = mid + 1
            else:
                last = mid - 1

    def weighted(self, anchor: Program) -> None:
        """Candidates under weighted sums of the cost and the bytes written, and the
        fewest bytes written."""
        graph = self.program.graph
        written = sum(self.sizes[n] for n in self._picked(anchor))
        scale = 1.0
        if written and isinstance(anchor.cost, (int, float)):
            scale = anchor.cost / written
        for weight in WEIGHTS:
            costs = [c + weight * scale * s for c, s in zip(graph.cost, self.sizes)]
            self.extract(math.inf, costs)
        self.extract(math.inf, self.sizes)

    def _picked(self, program: Program) -> list[int]:
        """The graph nodes of ``program``'s e-nodes."""
        where = self.graph_node
        return [where[c, node] for c, node in program.choice.items() if (c, node) in where]

    def descend(self, start: Program, budget: float) -> Program:
        """``start`` improved by single re-choices that lower the cost and keep the peak
        within ``budget``, measuring at most :data:`PEAK_EVALUATIONS` programs."""
        egraph, find = self.egraph, self.egraph.find
        best, evaluations = start, 0
        for c in program_order(egraph, start.choice, self.roots):
            for alt in egraph.class_nodes[c]:
                if c not in best.choice or alt == best.choice[c] or any(
                        find(k) not in best.choice for k in alt[1:]):
                    continue
                trial = {**best.choice, c: alt}
                if not is_acyclic(egraph, trial, self.roots):
                    continue
                if not cheaper(dag_cost(egraph, self.cost, trial), best.cost):
                    continue
                evaluations += 1
                found = self.measure(trial)
                if found.peak <= budget and cheaper(found.cost, best.cost):
                    best = found
                if evaluations >= PEAK_EVALUATIONS:
                    return best
        return best

    def bounded(self, program: Program) -> bool:
        """Whether the model counts ``program``'s footprints (its peak is not below the
        largest of them): else the footprints bound nothing."""
        footprint = self.footprint
        picked = self._picked(program)
        return not picked or program.peak >= max(footprint[n] for n in picked) * (1 - 1e-9)

    def within(self, budget: float) -> Program | None:
        fits = [p for p in self.measured.values() if p.peak <= budget]
        return min(fits, key=_by_cost, default=None)


def _by_cost(program: Program):
    return (program.cost, program.peak)


def within_budget(egraph: EGraph, cost, memory, budget: float,
                  starts: list[dict[int, tuple]] | None = None,
                  prefer: dict[int, list[tuple]] | None = None,
                  time_limit: float = 1.0) -> BudgetedProgram:
    """The cheapest program under ``cost`` found whose peak under ``memory`` is at most
    ``budget`` bytes (see the module docstring for the method), over the roots and effects
    of ``egraph`` (:func:`~egraph.extract.program.program_roots`). ``starts``: programs to
    measure first besides the cheapest under ``cost`` the DAG heuristic finds; ``prefer``: e-nodes
    ties go to, as in :func:`~egraph.extract.methods.choose`; ``time_limit``: seconds the
    solver has for each exact solution. Raises :class:`MemoryBudgetError` where nothing
    found fits.

    >>> from egraph import EGraph, AstSize
    >>> class Widest:  # a toy peak: the widest call, its value and its operands'
    ...     def node_cost(self, egraph, cid, node):
    ...         return {"wide": 100, "x": 0}.get(node[0], 10)
    ...     def program_cost(self, egraph, choice):
    ...         return max(self.node_cost(egraph, c, n) + sum(
    ...             self.node_cost(egraph, k, choice[k]) for k in n[1:])
    ...             for c, n in choice.items())
    >>> eg = EGraph()
    >>> root = eg.add("(wide x)", root=True)
    >>> _ = eg.union(root, eg.add("(g (g x))"))
    >>> found = within_budget(eg, AstSize(), Widest(), 50)
    >>> found.cost, found.peak, found.optimal
    (3, 20.0, True)
    """
    budget = check_budget(budget)
    began = time.perf_counter()
    search = _Search(egraph, cost, memory, prefer, time_limit)
    anchor = search.start(starts or [])
    least = search.peak_bound()
    bounded = all(map(search.bounded, search.measured.values()))
    if bounded and budget < least:  # no program fits: the lightest at the bound, and say so
        search.extract(least)
        raise MemoryBudgetError(budget, min(p.peak for p in search.measured.values()), least)
    if anchor.peak > budget:
        search.weighted(anchor)
        search.thresholds(least, budget if bounded else math.inf, budget)
    exact, cost_bound = search.exact(budget) if bounded else (None, None)
    best = search.within(budget)
    if best is not None and best is not anchor:
        best = search.descend(best, budget)
    bounded = bounded and all(map(search.bounded, search.measured.values()))
    peak_bound = least if bounded else None
    if best is None:
        smallest = min(p.peak for p in search.measured.values())
        raise MemoryBudgetError(budget, smallest, peak_bound)
    if not bounded:  # the footprints bound nothing: the unbudgeted optimum still does
        exact, cost_bound = search.exact(math.inf)
    optimal = bool(cost_bound is not None and exact is not None and exact.peak <= budget
                   and not cheaper(exact.cost, best.cost))
    return BudgetedProgram(best.choice, best.cost, best.peak, budget, cost_bound, optimal,
                           peak_bound, len(search.measured), time.perf_counter() - began)


def frontier(egraph: EGraph, cost, memory, starts: list[dict[int, tuple]] | None = None,
             prefer: dict[int, list[tuple]] | None = None, limit: int = 8,
             time_limit: float = 1.0) -> list[Program]:
    """The non-dominated ``(cost, peak)`` programs found, cheapest first (peak as
    ``memory.program_cost`` measures it, not a sum): the candidates of
    :func:`within_budget` at ``limit`` budgets spread from the least peak to the cheapest
    program's.

    >>> from egraph import EGraph, AstSize
    >>> class Widest:  # a toy peak: the widest call, its value and its operands'
    ...     def node_cost(self, egraph, cid, node):
    ...         return {"wide": 100, "x": 0}.get(node[0], 10)
    ...     def program_cost(self, egraph, choice):
    ...         return max(self.node_cost(egraph, c, n) + sum(
    ...             self.node_cost(egraph, k, choice[k]) for k in n[1:])
    ...             for c, n in choice.items())
    >>> eg = EGraph()
    >>> root = eg.add("(wide x)", root=True)
    >>> _ = eg.union(root, eg.add("(g (g x))"))
    >>> frontier(eg, AstSize(), Widest())
    [Program(cost=2, peak=100.0), Program(cost=3, peak=20.0)]
    """
    search = _Search(egraph, cost, memory, prefer, time_limit)
    anchor = search.start(starts or [])
    low = search.peak_bound()
    search.weighted(anchor)
    levels = [t for t in sorted(set(search.footprint)) if low <= t <= anchor.peak]
    step = max(1, len(levels) // limit)
    for threshold in levels[::step]:
        search.extract(threshold)
    points: list[Program] = []
    for program in sorted(search.measured.values(), key=_by_cost):
        if not points or program.peak < points[-1].peak:
            points.append(program)
    return points


def extract_within(egraph: EGraph, cost, root: int | None, memory_budget: float,
                   memory: Any = None, method: str = "dag", time_limit: float = 60.0
                   ) -> tuple[Term, Any]:
    """``eg.extract(cost, memory_budget=bytes, memory=model)`` on a plain e-graph:
    ``(term of root, DAG cost)`` of the cheapest program found whose peak under
    ``memory`` fits (:func:`within_budget`). The program is that of every root (the peak
    is the whole program's); ``method="ilp"`` starts from the exact unbudgeted optimum.
    What the search found is in ``egraph.report.extraction["memory"]`` where the e-graph
    has a report.

    >>> from egraph import EGraph, AstSize
    >>> class Sizes:  # a toy peak: the largest e-node, 'big' holding 100 bytes
    ...     def node_cost(self, egraph, cid, node):
    ...         return 100 if node[0] == "big" else 1
    ...     def program_cost(self, egraph, choice):
    ...         return max(self.node_cost(egraph, c, n) for c, n in choice.items())
    >>> eg = EGraph()
    >>> root = eg.add("(big x)", root=True)
    >>> _ = eg.union(root, eg.add("(f (g x))"))
    >>> eg.extract(AstSize(), memory_budget=10, memory=Sizes())
    (Term('(f (g x))'), 3)
    """
    check_budget(memory_budget)
    if method not in ("greedy", "dag", "ilp"):
        raise ValueError(f"method={method!r}: use 'greedy', 'dag' or 'ilp'")
    if not (hasattr(memory, "program_cost") and hasattr(memory, "node_cost")):
        raise ValueError(
            f"memory_budget needs memory=<a model with program_cost(egraph, choice) and "
            f"node_cost(egraph, cid, node)>, got memory={memory!r} (an e-graph built with "
            "EGraph.from_fx measures extractors.PeakMemory by default)")
    roots = program_roots(egraph)
    if root is None and roots:
        root = roots[0]
    if root is None or egraph.find(root) not in roots:
        raise ValueError(f"root={root!r}: under a memory budget the program is that of every "
                         "root (its peak is the whole program's); pass one of egraph.roots")
    start = time.perf_counter()
    anchor, _, _ = choose(egraph, cost, "ilp" if method == "ilp" else "dag", roots, time_limit)
    found = within_budget(egraph, cost, memory, memory_budget, [anchor],
                          time_limit=min(time_limit, 1.0))
    term = build_term(egraph, {c: (None, n) for c, n in found.choice.items()},
                      egraph.find(root))
    if egraph.report is not None:
        egraph.report.extraction = {
            "method": "budget", "cost": found.cost, "optimal": found.optimal,
            "time": round(time.perf_counter() - start, 6), "memory": found,
        }
    return term, found.cost
