"""DAG-aware greedy extraction (after extraction-gym's ``faster-greedy-dag``).

Each class keeps a *cost set*: ``{class: cost of its chosen node}`` over the classes of the
sub-DAG its choice uses, so a subterm shared by two children is paid once. A node's
candidate set is the union of its child classes' sets plus itself; the class takes the
node whose set has the lowest total. Nodes are re-evaluated on a priority queue whenever a
child class improves, cheapest candidates first.

>>> from extractors.graph import Graph
>>> g = Graph.load({"nodes": {
...     "x": {"op": "x", "eclass": "x", "cost": 5}, "y": {"op": "y", "eclass": "y", "cost": 9},
...     "fx": {"op": "f", "children": ["x"], "eclass": "b"},
...     "gx": {"op": "g", "children": ["x"], "eclass": "c"},
...     "sy": {"op": "s", "children": ["y"], "eclass": "d"},
...     "p": {"op": "p", "children": ["fx", "gx"], "eclass": "r"},
...     "q": {"op": "q", "children": ["sy"], "eclass": "r"}},
...     "root_eclasses": ["r"]})
>>> pick = greedy_dag(g)
>>> g.node_ids[pick[g.roots[0]]], g.dag_cost(pick), g.tree_cost(pick)
('p', 8, 13)
"""

from __future__ import annotations

from heapq import heappop, heappush

from extractors.graph import Graph


def greedy_dag(graph: Graph) -> list[int]:
    """The pick (class -> node, ``-1`` where none) of the DAG-aware greedy; it may be
    cyclic, so callers pass it through :func:`extractors.graph.acyclic`."""
    node_class, cost, kids = graph.node_class, graph.cost, graph.kids
    num_classes = graph.num_classes
    parents = graph.parents()
    missing = [len(ks) for ks in kids]
    sets: list = [None] * num_classes
    total: list = [0] * num_classes
    pick = [-1] * num_classes
    heap: list = []
    for ns in graph.class_nodes:
        for n in ns:
            if not kids[n]:
                heappush(heap, (cost[n], n))
    while heap:
        _, n = heappop(heap)
        c = node_class[n]
        ks = kids[n]
        best = total[c] if pick[c] >= 0 else None
        if not ks:
            if best is not None and cost[n] >= best:
                continue
            new = {c: cost[n]}
            value = cost[n]
        else:
            if c in ks:
                continue
            if best is not None and cost[n] + max(total[k] for k in ks) >= best:
                continue
            biggest = max(ks, key=lambda k: len(sets[k]))
            new = sets[biggest].copy()
            for k in ks:
                if k != biggest:
                    new.update(sets[k])
            if c in new:
                continue
            new[c] = cost[n]
            value = sum(new.values())
            if best is not None and value >= best:
                continue
        first = pick[c] < 0
        sets[c], total[c], pick[c] = new, value, n
        for p in parents[c]:
            if first:
                missing[p] -= 1
            if not missing[p]:
                heappush(heap, (value + cost[p], p))
    return pick
