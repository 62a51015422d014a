"""DAG-aware and optimal extraction from an :class:`~egraph.EGraph`.

The e-graph's classes reachable from the roots are handed to the serialized extractors
(:func:`extractors.extract_serialized`) with each e-node's own cost under the cost model,
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

from typing import Any


def _node_cost(egraph, cost) -> Any:
    if hasattr(cost, "node_cost"):
        return lambda cid, node: cost.node_cost(egraph, cid, node)
    from egraph.egraph import ENode

    return lambda cid, node: cost(ENode(node[0], node[1:]), [0] * (len(node) - 1))


def choose(egraph, cost, method: str, roots: list[int] | None = None,
           time_limit: float = 60.0) -> tuple[dict[int, tuple], Any, bool | None]:
    """``(class -> chosen e-node, DAG cost, proven optimal?)`` for ``roots`` (default:
    the e-graph's roots, and the effects of one built from FX)."""
    from extractors.serialized import extract_serialized

    egraph.rebuild()
    find = egraph.find
    if roots is None:
        roots = [find(r) for r in egraph.roots]
        if getattr(egraph, "fx", None) is not None:
            roots += [find(e) for e in egraph.fx.effects]
    if not roots:
        raise ValueError("no root to extract: pass root=<class id> or add a term with root=True")
    node_cost = _node_cost(egraph, cost)
    nodes: dict[str, dict] = {}
    reached, stack = set(), list(roots)
    while stack:
        c = find(stack.pop())
        if c in reached:
            continue
        reached.add(c)
        for i, node in enumerate(egraph._cnodes[c]):
            value = node_cost(c, node)
            if not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ValueError(
                    f"{method} extraction needs a finite, non-negative number per e-node; "
                    f"{cost!r} gave {value!r} (lexicographic costs: use method='greedy', or a "
                    "weighted sum)")
            nodes[f"{c}.{i}"] = {"op": str(node[0]), "eclass": str(c), "cost": value,
                                 "children": [f"{find(k)}.0" for k in node[1:]]}
            stack.extend(node[1:])
    data = {"nodes": nodes, "root_eclasses": [str(r) for r in dict.fromkeys(roots)]}
    result = extract_serialized(data, method=method, time_limit=time_limit)
    choice = {}
    for cls, nid in result.choice.items():
        c, i = nid.split(".")
        choice[int(cls)] = egraph._cnodes[int(c)][int(i)]
    return choice, result.dag_cost, result.optimal
