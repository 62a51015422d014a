"""Extraction from a live :class:`~egraph.EGraph`: greedy, DAG-aware and optimal.

:func:`extract` is what ``eg.extract(cost)`` runs on a plain e-graph. For ``"dag"`` and
``"ilp"``, :func:`choose` hands the e-graph's classes reachable from the roots to the
serialized extractors (:func:`egraph.extract.serialized.extract_serialized`) with each
e-node's own cost under the cost model,
so a shared subterm is paid once (``"dag"``: DAG-aware greedy plus local search; ``"ilp"``:
HiGHS, proven optimal or best found in the time limit). A callable cost
``(enode, child_costs)`` contributes ``cost(enode, [0, ...])`` per e-node: DAG and ILP
extraction minimise the sum of those.

>>> from egraph import EGraph, AstSize, parse
>>> eg = EGraph()
>>> root = eg.add(parse("(+ (* x y) (* x y))"), root=True)
>>> choice, cost, optimal = choose(eg, AstSize(), "ilp")
>>> cost, optimal
(4, True)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from egraph.extract.program import node_costs, program_roots
from egraph.extract.tree import best_nodes, build_term, canonical_nodes

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from egraph.term import Term

METHODS = ("greedy", "dag", "ilp")


TIE = 1e-9
"""The relative surcharge on e-nodes outside ``prefer`` in :func:`choose`: far below any
real difference in cost, it makes ties go to the preferred (the source's) e-nodes."""


def choose(egraph: EGraph, cost, method: str, roots: list[int] | None = None,
           time_limit: float = 60.0, prefer: dict[int, list[tuple]] | None = None
           ) -> tuple[dict[int, tuple], Any, bool | None]:
    """``(class -> chosen e-node, DAG cost, proven optimal?)`` for ``roots`` (default:
    :func:`~egraph.extract.program.program_roots`). Ties go to the e-nodes of ``prefer``
    (class -> e-nodes, such as the source program's): every other e-node costs
    :data:`TIE` more, relatively, so a rewrite that does not pay is not made."""
    # The solver needs numpy and highspy: imported when used, so the engine imports neither.
    from egraph.extract.graph import Graph
    from egraph.extract.serialized import extract_graph

    egraph.rebuild()
    find = egraph.find
    cnodes = egraph.class_nodes
    if roots is None:
        roots = program_roots(egraph)
    if not roots:
        raise ValueError("no root to extract: pass root=<class id> or add a term with root=True")
    node_cost = node_costs(egraph, cost)
    preferred = None if prefer is None else canonical_nodes(egraph, prefer)
    index: dict[int, int] = {}
    stack = [find(r) for r in roots]
    while stack:
        c = stack.pop()
        if c not in index:
            index[c] = len(index)
            stack.extend(find(k) for node in cnodes[c] for k in node[1:])
    reached = list(index)
    classes = []
    for c in reached:
        nodes = []
        for node in cnodes[c]:
            value = node_cost(c, node)
            if not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ValueError(
                    f"{method} extraction needs a finite, non-negative number per e-node; "
                    f"{cost!r} gave {value!r} (lexicographic costs: use method='greedy', or a "
                    "weighted sum)")
            if preferred is not None and (node[0], *map(find, node[1:])) not in preferred:
                value = value * (1 + TIE)
            nodes.append((value, tuple([index[find(k)] for k in node[1:]])))
        classes.append(nodes)
    graph = Graph.of(classes, [index[find(r)] for r in roots], tuple(map(str, reached)))
    pick, optimal = extract_graph(graph, method, time_limit)
    choice = {}
    for c in reversed(graph.order(pick)):  # each class before its children
        cls = reached[c]
        choice[cls] = cnodes[cls][pick[c] - graph.class_nodes[c][0]]
    return choice, graph.dag_cost(pick), optimal


def extract(egraph: EGraph, cost, root: int | None = None, method: str = "greedy",
            time_limit: float = 60.0) -> tuple[Term, Any]:
    """``(term, cost)`` of the best term of ``root`` (default: the first root).

    ``method="greedy"``: tree cost, bottom-up (:func:`~egraph.extract.tree.best_nodes`).
    ``"dag"`` and ``"ilp"`` count a shared subterm once (:func:`choose`; ILP on HiGHS).

    >>> from egraph import EGraph, AstSize
    >>> eg = EGraph()
    >>> root = eg.add("(+ (* x y) (* x y))", root=True)
    >>> extract(eg, AstSize()), extract(eg, AstSize(), method="dag")[1]
    ((Term('(+ (* x y) (* x y))'), 7), 4)
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r}: use 'greedy', 'dag' or 'ilp'")
    if root is None:
        roots = egraph.roots
        if not roots:
            raise ValueError(
                "no root to extract: pass root=<class id> or add a term with root=True"
            )
        root = roots[0]
    start = time.perf_counter()
    root = egraph.find(root)
    optimal = None
    if method == "greedy":
        choice = best_nodes(egraph, cost)
        if root not in choice:
            raise ValueError(f"class {root} has no finite term (every e-node in it is cyclic)")
        value = choice[root][0]
    else:
        picked, value, optimal = choose(egraph, cost, method, [root], time_limit)
        choice = {c: (None, n) for c, n in picked.items()}
    term = build_term(egraph, choice, root)
    if egraph.report is not None:
        egraph.report.extraction = {
            "method": method, "cost": value, "optimal": optimal,
            "time": round(time.perf_counter() - start, 6),
        }
    return term, value
