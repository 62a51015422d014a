"""Extraction from e-graphs in the egraph-serialize JSON format (extraction-gym's files).

Nodes carry their own costs; an answer picks one node per class reached from the roots,
acyclically. Three methods:

* ``"greedy"``: each class takes the node with the cheapest tree cost (a shared subterm
  counted at each use), egg's extractor, settled on a priority queue.
* ``"dag"``: DAG-aware: a greedy that counts each class of a node's sub-DAG once (after
  extraction-gym's faster-greedy-dag), started from the better of it and ``"greedy"``,
  then a local search that re-chooses classes while the DAG cost drops.
* ``"ilp"``: the minimum DAG cost, proven by an integer program on HiGHS, warm-started
  from ``"dag"``; at the time limit it returns the best answer found, unproven.

>>> data = {"nodes": {
...     "x": {"op": "x", "eclass": "x", "cost": 5}, "y": {"op": "y", "eclass": "y", "cost": 9},
...     "fx": {"op": "f", "children": ["x"], "eclass": "b"},
...     "gx": {"op": "g", "children": ["x"], "eclass": "c"},
...     "sy": {"op": "s", "children": ["y"], "eclass": "d"},
...     "p": {"op": "p", "children": ["fx", "gx"], "eclass": "r"},
...     "q": {"op": "q", "children": ["sy"], "eclass": "r"}},
...     "root_eclasses": ["r"]}
>>> tree = extract_serialized(data, "greedy")
>>> tree.choice["r"], tree.tree_cost, tree.dag_cost
('q', 11, 11)
>>> best = extract_serialized(data, "ilp")
>>> best.choice, best.tree_cost, best.dag_cost, best.optimal
({'r': 'p', 'c': 'gx', 'b': 'fx', 'x': 'x'}, 13, 8, True)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from egraph.extract.dag import greedy_dag, improve
from egraph.extract.graph import Cost, Graph, acyclic
from egraph.extract.greedy import greedy_tree
from egraph.extract.ilp import solve_ilp

METHODS = ("greedy", "dag", "ilp")


@dataclass(frozen=True)
class Extraction:
    """An extracted answer.

    ``choice`` maps each class reached from the roots to its chosen node id (roots
    first); ``dag_cost`` counts each chosen node once, ``tree_cost`` a shared subterm at
    each use (exact for integral costs, ``inf`` where floats overflow); ``optimal`` is
    True when the ILP proved the DAG cost minimal, False when it stopped at the time
    limit, None for the heuristics; ``time_s`` covers loading and extracting.

    >>> e = Extraction({"r": "n"}, 1, 1, None, "greedy", 0.0)
    >>> e.choice["r"], e.optimal
    ('n', None)
    """

    choice: dict[str, str]
    dag_cost: Cost
    tree_cost: Cost
    optimal: bool | None
    method: str
    time_s: float


def extract_serialized(data: dict | str, method: str = "dag", time_limit: float = 60.0,
                       roots: Iterable[str | int] | None = None) -> Extraction:
    """Extract from egraph-serialize ``data`` (the parsed JSON dict, or its text) with
    ``method`` ``"greedy"``, ``"dag"`` or ``"ilp"`` (``time_limit`` seconds for the
    solver). ``roots`` overrides the file's ``root_eclasses``. Malformed data raises
    :class:`egraph.serialize.SerializedFormatError`; a root whose every term is cyclic
    raises ``ValueError``.

    >>> data = {"nodes": {"a": {"op": "a", "eclass": "c", "cost": 2},
    ...                   "f": {"op": "f", "children": ["a", "a"], "eclass": "r"}},
    ...         "root_eclasses": ["r"]}
    >>> e = extract_serialized(data)
    >>> e.choice, e.dag_cost, e.tree_cost, e.method
    ({'r': 'f', 'c': 'a'}, 3, 5, 'dag')
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r}: choose one of {', '.join(map(repr, METHODS))}")
    start = time.perf_counter()
    graph = Graph.load(data, roots)
    pick, optimal = extract_graph(graph, method, time_limit)
    choice = graph.choice(pick)
    elapsed = time.perf_counter() - start
    return Extraction(choice, graph.dag_cost(pick), graph.tree_cost(pick), optimal, method,
                      elapsed)


def extract_graph(graph: Graph, method: str = "dag", time_limit: float = 60.0
                  ) -> tuple[list[int], bool | None]:
    """``(pick, proven optimal?)`` on a loaded :class:`~egraph.extract.graph.Graph`: the
    work of :func:`extract_serialized` without the text ids, for a caller that builds the
    graph itself (extraction from a live e-graph).

    >>> g = Graph.load({"nodes": {"a": {"op": "a", "eclass": "c", "cost": 2},
    ...                           "f": {"op": "f", "children": ["a", "a"], "eclass": "r"}},
    ...                 "root_eclasses": ["r"]})
    >>> extract_graph(g, "ilp")
    ([0, 1], True)
    """
    tree, order = greedy_tree(graph)
    for r in graph.roots:
        if tree[r] < 0:
            raise ValueError(f"root class {graph.class_ids[r]!r} has no acyclic term: every "
                             "node in it depends on the class itself")
    optimal = None
    if method == "greedy":
        pick = tree
    else:
        pick = acyclic(graph, greedy_dag(graph), tree, order)
        if graph.dag_cost(tree) < graph.dag_cost(pick):
            pick = tree
        pick = improve(graph, pick)
        if method == "ilp":
            pick, optimal = solve_ilp(graph, pick, order, time_limit)
    return pick, optimal
