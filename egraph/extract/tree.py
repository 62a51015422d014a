"""Greedy bottom-up extraction under a tree cost (egg's ``Extractor``).

A cost function is any callable ``(enode, child_costs) -> cost`` whose costs compare with
``<``; :class:`AstSize` and :class:`AstDepth` are the classic ones. Each class's cost is
the best over its e-nodes, iterated to a fixed point, so shared subterms are counted once
per use (a tree cost). DAG-aware and optimal (ILP) extraction are in
:mod:`egraph.extract.methods`.

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> a = eg.add(parse("(+ (* x 1) 0)"))
>>> _ = eg.union(a, eg.add(parse("x")))
>>> choice = best_nodes(eg, AstSize())
>>> build_term(eg, choice, a), choice[eg.find(a)][0]
(Term('x'), 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from egraph.enode import ENode
from egraph.term import Term

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class AstSize:
    """Number of e-nodes in the term: ``1 + sum(child costs)``."""

    def __call__(self, enode: ENode, child_costs: list) -> int:
        return 1 + sum(child_costs)

    def __repr__(self) -> str:
        return "AstSize()"


class AstDepth:
    """Height of the term: ``1 + max(child costs)``."""

    def __call__(self, enode: ENode, child_costs: list) -> int:
        return 1 + max(child_costs, default=0)

    def __repr__(self) -> str:
        return "AstDepth()"


def canonical_nodes(egraph: EGraph, by_class: dict[int, list[tuple]]) -> set[tuple]:
    """The e-nodes of ``by_class`` (class -> e-node tuples, such as the source program's
    ``egraph.initial``) with their children made canonical, as the e-graph holds them now.

    >>> from egraph import EGraph, parse
    >>> eg = EGraph()
    >>> x, y = eg.add(parse("x")), eg.add(parse("y"))
    >>> f = eg.add(parse("(f y)"))
    >>> _ = eg.union(x, y), eg.rebuild()
    >>> canonical_nodes(eg, {f: [("f", y)]}) == {("f", eg.find(x))}
    True
    """
    find = egraph.find
    return {(n[0], *map(find, n[1:])) for nodes in by_class.values() for n in nodes}


def best_nodes(egraph: EGraph, cost: Callable[[ENode, list], Any],
               nodes_of: dict[int, list[tuple]] | None = None,
               prefer: dict[int, list[tuple]] | None = None) -> dict[int, tuple[Any, tuple]]:
    """For every class with a finite term: ``(best cost, chosen e-node tuple)``.

    Ties go to the smaller term (fewer e-nodes), so an equally cheap program is never a
    larger one, and then to the e-nodes of ``prefer`` (class -> e-nodes, such as the source
    program's), so a rewrite that does not pay is not made: reassociating a float sum
    for nothing can lose bits where it cancels. ``nodes_of`` restricts the choice to some
    e-nodes per class (for example the ones a source program had before saturation).
    """
    egraph.rebuild()
    find = egraph.find
    if nodes_of is None:
        classes = egraph.classes()
        cnodes = egraph.class_nodes
    else:
        groups: dict[int, dict[tuple, None]] = {}
        for c, nodes in nodes_of.items():
            group = groups.setdefault(find(c), {})
            for n in nodes:
                group[(n[0], *map(find, n[1:]))] = None
        classes = list(groups)
        cnodes = {c: list(g) for c, g in groups.items()}
    # A cost model that reads the analysis binds to the e-graph: (class, e-node, costs).
    bound = cost.bind(egraph) if hasattr(cost, "bind") else None
    preferred = set() if prefer is None else canonical_nodes(egraph, prefer)
    best: dict[int, tuple[Any, tuple]] = {}
    size: dict[int, int] = {}  # term size of each class's choice: the tie-breaker
    changed = True
    while changed:
        changed = False
        for c in classes:
            current = best.get(c)
            for n in cnodes[c]:
                kids = n[1:]
                try:
                    child_costs = [best[k][0] for k in kids]
                except KeyError:
                    continue
                if bound is not None:
                    value = bound(c, n, child_costs)
                else:
                    value = cost(ENode(n[0], kids), child_costs)
                if current is not None and not cheaper(value, current[0]):
                    if not _tied(value, current[0]):
                        continue
                    n_size = 1 + sum(size[k] for k in kids)
                    if n_size > size[c] or n_size == size[c] and (
                            n not in preferred or current[1] in preferred):
                        continue
                current = (value, n)
                best[c] = current
                size[c] = 1 + sum(size[k] for k in kids)
                changed = True
    return best


_TIE = 1e-9
"""Float costs within this relative difference are equal: summing the same costs in
another order must not decide between two programs."""


def _tied(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= _TIE * max(abs(a), abs(b))
    return a == b


def cheaper(a: Any, b: Any) -> bool:
    """``a < b`` by more than float noise (costs summed in another order tie).

    >>> cheaper(0.1 + 0.2 + 0.3, 0.3 + 0.2 + 0.1), cheaper(1.0, 2.0)
    (False, True)
    """
    return a < b and not _tied(a, b)


def build_term(egraph: EGraph, choice: dict[int, tuple[Any, tuple]], root: int) -> Term:
    """The term rooted at ``root`` that follows the chosen e-node of each class."""
    find = egraph.find
    built: dict[int, Term] = {}
    on_path: set[int] = set()
    stack = [find(root)]
    while stack:
        c = stack[-1]
        if c in built:
            stack.pop()
            continue
        node = choice[c][1]
        missing = [k for k in node[1:] if k not in built]
        if missing:
            if c in on_path:
                raise ValueError(
                    f"the cost function chose a cycle through class {c}: costs must grow "
                    "with each e-node (cost(node) > cost of every child)"
                )
            on_path.add(c)
            stack.extend(missing)
            continue
        stack.pop()
        on_path.discard(c)
        built[c] = Term(node[0], tuple(built[k] for k in node[1:]))
    return built[find(root)]
