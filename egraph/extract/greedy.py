"""Greedy bottom-up extraction under the tree cost (egg's ``Extractor``), on a priority queue.

Each class's cost is the cheapest ``cost(node) + sum(child class costs)`` over its nodes,
the least fixed point that egg's extractor iterates to. Costs are non-negative, so the
fixed point can be settled in one pass, cheapest class first (Knuth's generalisation of
Dijkstra's algorithm): a node is evaluated once, when the last of its child classes is
settled. Classes are settled after the classes their choice uses, so the pick is acyclic.

>>> from egraph.extract.graph import Graph
>>> g = Graph.load({"nodes": {"x": {"op": "x", "eclass": "x"},
...                           "f": {"op": "f", "children": ["x"], "eclass": "r"},
...                           "g": {"op": "g", "children": ["f"], "eclass": "r"}},
...                 "root_eclasses": ["r"]})
>>> pick, order = greedy_tree(g)
>>> [g.node_ids[pick[c]] for c in order]
['x', 'f']
"""

from __future__ import annotations

from heapq import heappop, heappush

from egraph.extract.graph import Graph


def greedy_tree(graph: Graph, paid: dict[int, int] | None = None) -> tuple[list[int], list[int]]:
    """``(pick, order)``: the tree-cost-greedy node of every class that has a finite
    (acyclic) term, ``-1`` for the others, and the classes in the order they were settled
    (every chosen node's child classes come earlier). ``paid`` maps classes that cost
    nothing any more (already in an answer) to their node; they are settled first."""
    node_class, cost, children, kids = graph.node_class, graph.cost, graph.children, graph.kids
    num_classes = graph.num_classes
    parents = graph.parents()
    missing = [len(ks) for ks in kids]
    best: list = [0] * num_classes
    pick = [-1] * num_classes
    settled = [False] * num_classes
    heap: list = []
    for c, n in (paid or {}).items():
        best[c], pick[c] = 0, n
    for ns in graph.class_nodes:
        for n in ns:
            if not kids[n]:
                c = node_class[n]
                if paid and c in paid:
                    continue
                if pick[c] < 0 or cost[n] < best[c]:
                    best[c], pick[c] = cost[n], n
    for c in range(num_classes):
        if pick[c] >= 0:
            heappush(heap, (best[c], c))
    order = []
    while heap:
        _, c = heappop(heap)
        if settled[c]:
            continue
        settled[c] = True
        order.append(c)
        for n in parents[c]:
            missing[n] -= 1
            if missing[n]:
                continue
            p = node_class[n]
            if settled[p]:
                continue
            value = cost[n] + sum([best[k] for k in children[n]])
            if pick[p] < 0 or value < best[p]:
                best[p], pick[p] = value, n
                heappush(heap, (value, p))
    return pick, order
