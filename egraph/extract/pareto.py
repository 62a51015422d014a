"""Pareto extraction: the programs no other program beats on both of two objectives.

Each class keeps a frontier of non-dominated ``(cost_a, cost_b)`` points (at most
``limit``, spread along the first objective), built bottom-up to a fixed point like greedy
extraction; an e-node's points combine its children's frontiers (exhaustively for up to
three children, through each child's two extremes beyond that). Costs are tree costs. The
result lists, for each non-dominated point of the root, the program and its two costs, so a
user sees the trade-off (for example curvature against roofline time).

>>> from egraph import EGraph, rewrite, AstSize, AstDepth
>>> eg = EGraph()
>>> root = eg.add("(+ a (+ b (+ c d)))", root=True)
>>> _ = eg.saturate([rewrite("assoc", "(+ ?x (+ ?y ?z))", "(+ (+ ?x ?y) ?z)"),
...                  rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")])
>>> [(str(p.program), p.costs) for p in pareto(eg, AstSize(), AstDepth())][:1]
[('(+ (+ a b) (+ c d))', (7, 3))]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egraph.enode import ENode
from egraph.extract.tree import build_term

if TYPE_CHECKING:
    from egraph.egraph import EGraph

Point = tuple
"""A frontier point: ``(cost_a, cost_b, e-node, ((child class, child point), ...))``. A
point holds the points of its children it was made from, not their places in the
children's frontiers: those are pruned again as the frontiers improve, and an index
would then name another point, or none."""


@dataclass
class ParetoPoint:
    """A non-dominated program and its two costs."""

    program: Any
    costs: tuple
    choice: dict[int, tuple]

    def __repr__(self) -> str:
        return f"ParetoPoint(costs={self.costs})"


def _bind(cost, egraph):
    if hasattr(cost, "bind"):
        return cost.bind(egraph)
    return lambda cid, node, kids: cost(ENode(node[0], node[1:]), kids)


def _prune(points: list[Point], limit: int) -> list[Point]:
    points = sorted(points, key=lambda p: (p[0], p[1]))
    frontier: list[Point] = []
    for p in points:
        if not frontier or p[1] < frontier[-1][1]:
            frontier.append(p)
    if len(frontier) <= limit:
        return frontier
    step = (len(frontier) - 1) / (limit - 1)
    return [frontier[round(i * step)] for i in range(limit)]


def frontiers(egraph, cost_a, cost_b, limit: int = 8) -> dict[int, list[Point]]:
    """Per class, its frontier of points ``(a, b, node, child refs)``."""
    egraph.rebuild()
    fa, fb = _bind(cost_a, egraph), _bind(cost_b, egraph)
    classes = egraph.classes()
    cnodes = egraph.class_nodes
    front: dict[int, list[Point]] = {}
    changed = True
    while changed:
        changed = False
        for c in classes:
            candidates = list(front.get(c, []))
            for node in cnodes[c]:
                kids = node[1:]
                if any(k not in front for k in kids):
                    continue
                options = [range(len(front[k])) for k in kids]
                if len(kids) > 3:
                    options = [sorted({0, len(front[k]) - 1}) for k in kids]
                for pick in itertools.product(*options):
                    pts = [front[k][i] for k, i in zip(kids, pick)]
                    a = fa(c, node, [p[0] for p in pts])
                    b = fb(c, node, [p[1] for p in pts])
                    candidates.append((a, b, node, tuple(zip(kids, pts))))
            pruned = _prune(candidates, limit)
            if [(p[0], p[1]) for p in pruned] != [(p[0], p[1]) for p in front.get(c, [])]:
                front[c] = pruned
                changed = True
    return front


def _choice(root: int, point: Point) -> dict[int, tuple]:
    """One e-node per class following a root point (a class reached twice keeps the first
    point's e-node, so the program is a DAG)."""
    choice: dict[int, tuple] = {}
    stack = [(root, point)]
    while stack:
        c, point = stack.pop()
        if c in choice:
            continue
        choice[c] = point[2]
        stack.extend(point[3])
    return choice


def pareto(egraph: EGraph, cost_a, cost_b, root: int | None = None, limit: int = 8,
           build: Callable[[dict[int, tuple], int], Any] | None = None,
           starts: list[dict[int, tuple]] | None = None) -> list[ParetoPoint]:
    """The non-dominated programs of ``root`` (default: the first root) under two costs.

    Each program is ``build(choice, root)``; by default the term the choice spells
    (an e-graph built from PyTorch builds validated GraphModules instead).

    A second cost of the whole program (``cost_b.local`` False, such as peak memory,
    with ``program_cost`` and ``node_cost``) is not a tree sum: the points are then the
    programs of every root that :func:`egraph.extract.budget.frontier` finds, each with
    its DAG cost under ``cost_a`` and ``cost_b.program_cost`` (``starts``: programs to
    measure too, such as the source).
    """
    root = egraph.find(root if root is not None else egraph.roots[0])
    if build is None:
        def build(choice, root):
            return build_term(egraph, {c: (None, n) for c, n in choice.items()}, root)
    if not getattr(cost_b, "local", True):
        from egraph.extract.budget import frontier

        # (ties go to the e-nodes the e-graph was built with, as extraction's do)
        programs = frontier(egraph, cost_a, cost_b, starts, getattr(egraph, "initial", None),
                            limit=limit)
        return [ParetoPoint(build(p.choice, root), (p.cost, p.peak), p.choice)
                for p in programs]
    front = frontiers(egraph, cost_a, cost_b, limit)
    if root not in front:
        raise ValueError(f"class {root} has no finite program")
    out = []
    for point in front[root]:
        choice = _choice(root, point)
        out.append(ParetoPoint(build(choice, root), (point[0], point[1]), choice))
    return out
