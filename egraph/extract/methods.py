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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egraph.extract.program import node_costs, program_roots
from egraph.extract.tree import best_nodes, build_term, canonical_nodes

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from egraph.extract.graph import Graph
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
    from egraph.extract.serialized import extract_graph

    program = ProgramGraph.of(egraph, cost, method, roots, prefer)
    pick, optimal = extract_graph(program.graph, method, time_limit)
    return program.choice(pick), program.graph.dag_cost(pick), optimal


@dataclass(frozen=True)
class ProgramGraph:
    """The classes of a live e-graph reachable from its program's roots, as the
    :class:`~egraph.extract.graph.Graph` the serialized extractors work on: ``classes[i]``
    is graph class ``i``'s canonical class id, ``nodes[n]`` graph node ``n``'s e-node.

    >>> from egraph import EGraph, AstSize
    >>> eg = EGraph()
    >>> root = eg.add("(f (g x))", root=True)
    >>> program = ProgramGraph.of(eg, AstSize())
    >>> program.classes, program.nodes
    ((2, 1, 0), (('f', 1), ('g', 0), ('x',)))
    """

    graph: Graph
    classes: tuple[int, ...]
    nodes: tuple[tuple, ...]

    @classmethod
    def of(cls, egraph: EGraph, cost, method: str = "dag", roots: list[int] | None = None,
           prefer: dict[int, list[tuple]] | None = None) -> ProgramGraph:
        """The program graph of ``roots`` (default:
        :func:`~egraph.extract.program.program_roots`), each e-node with its own cost
        under ``cost`` (``prefer``: as :func:`choose`); ``method`` names the extraction in
        errors."""
        # The solver needs numpy and highspy: imported when used, so the engine imports
        # neither.
        from egraph.extract.graph import Graph

        egraph.rebuild()
        find = egraph.find
        cnodes = egraph.class_nodes
        if roots is None:
            roots = program_roots(egraph)
        if not roots:
            raise ValueError(
                "no root to extract: pass root=<class id> or add a term with root=True")
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
        kept: list[tuple] = []
        for c in reached:
            nodes = []
            for node in cnodes[c]:
                value = node_cost(c, node)
                if not isinstance(value, (int, float)) or value < 0 or value != value:
                    raise ValueError(
                        f"{method} extraction needs a finite, non-negative number per e-node; "
                        f"{cost!r} gave {value!r} (lexicographic costs: use method='greedy', "
                        "or a weighted sum)")
                if preferred is not None and (node[0], *map(find, node[1:])) not in preferred:
                    value = value * (1 + TIE)
                nodes.append((value, tuple([index[find(k)] for k in node[1:]])))
                kept.append(node)
            classes.append(nodes)
        graph = Graph.of(classes, [index[find(r)] for r in roots], tuple(map(str, reached)))
        return cls(graph, tuple(reached), tuple(kept))

    def restricted(self, keep: Callable[[int], bool],
                   costs: Sequence[float] | None = None) -> ProgramGraph:
        """The same classes with only the graph nodes ``keep`` accepts (a class left with
        none makes every program through it impossible), each costing ``costs[n]``
        instead where given (another objective over the same e-nodes).

        >>> from egraph import EGraph, AstSize
        >>> eg = EGraph()
        >>> root = eg.add("(f (g x))", root=True)
        >>> program = ProgramGraph.of(eg, AstSize())
        >>> program.restricted(lambda n: program.nodes[n][0] != "g").graph.class_nodes
        ((0,), (), (1,))
        """
        from egraph.extract.graph import Graph

        graph = self.graph
        values = graph.cost if costs is None else costs
        classes, nodes = [], []
        for members in graph.class_nodes:
            kept = [n for n in members if keep(n)]
            classes.append([(values[n], graph.children[n]) for n in kept])
            nodes.extend(self.nodes[n] for n in kept)
        return ProgramGraph(Graph.of(classes, graph.roots, graph.class_ids), self.classes,
                            tuple(nodes))

    def choice(self, pick: list[int]) -> dict[int, tuple]:
        """The choice (class -> e-node, each class before its children) ``pick`` makes."""
        return {self.classes[c]: self.nodes[pick[c]]
                for c in reversed(self.graph.order(pick))}


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

