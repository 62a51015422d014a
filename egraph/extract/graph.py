"""An egraph-serialize e-graph as compact int arrays, and what every extractor shares.

Classes and nodes are numbered ``0..n-1`` in the order the JSON lists its nodes. A
*pick* is a list giving, per class, the chosen node index (``-1``: none). A pick is
valid for the roots when following it from the roots never returns to a class on the
current path (an acyclic term DAG) and every class it reaches has a node.

>>> g = Graph.load({"nodes": {"x": {"op": "x", "eclass": "a", "cost": 1},
...                           "f": {"op": "f", "children": ["x", "x"], "eclass": "b"}},
...                 "root_eclasses": ["b"]})
>>> g.class_ids, g.children, g.cost
(('a', 'b'), ((), (0, 0)), (1, 1))
>>> pick = [0, 1]
>>> g.tree_cost(pick), g.dag_cost(pick), g.choice(pick)
(3, 2, {'b': 'f', 'a': 'x'})
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from egraph.serialize import SerializedFormatError, validate

Cost = int | float


class Graph:
    """A validated e-graph: ``node_class``, ``cost``, ``children`` (child classes, with
    repeats, as the term counts them), ``kids`` (distinct child classes), ``class_nodes``
    and ``roots``, all indexed by small ints.

    Costs are Python ints when every cost in the file is integral (tree costs then stay
    exact however large), floats otherwise. Subsumed nodes are never extracted.
    """

    __slots__ = ("node_ids", "class_ids", "node_class", "cost", "children", "kids",
                 "class_nodes", "roots", "_parents")

    def __init__(self, node_ids: tuple[str, ...], class_ids: tuple[str, ...],
                 node_class: tuple[int, ...], cost: tuple[Cost, ...],
                 children: tuple[tuple[int, ...], ...],
                 class_nodes: tuple[tuple[int, ...], ...], roots: tuple[int, ...]):
        self.node_ids = node_ids
        self.class_ids = class_ids
        self.node_class = node_class
        self.cost = cost
        self.children = children
        self.kids = tuple(ch if len(ch) < 2 else tuple(dict.fromkeys(ch)) for ch in children)
        self.class_nodes = class_nodes
        self.roots = roots
        self._parents: list[list[int]] | None = None

    @classmethod
    def load(cls, data: Any, roots: Iterable[str | int] | None = None) -> Graph:
        """Parse egraph-serialize ``data`` (a dict or JSON text); ``roots`` overrides the
        file's ``root_eclasses``. Raises :class:`SerializedFormatError` on bad input."""
        data = validate(data)
        nodes = data["nodes"]
        node_ids = tuple(nodes)
        node_index = {nid: i for i, nid in enumerate(node_ids)}
        class_index: dict[str, int] = {}
        node_class = []
        raw_costs = []
        for nid, node in nodes.items():
            node_class.append(class_index.setdefault(str(node["eclass"]), len(class_index)))
            c = node.get("cost", 1.0)
            if c < 0 or (isinstance(c, float) and not math.isfinite(c)):
                raise SerializedFormatError(
                    f"node {nid!r}: cost {c!r} must be finite and non-negative")
            raw_costs.append(c)
        cost = _exact(raw_costs)
        children = tuple(tuple(node_class[node_index[ch]] for ch in node.get("children", ()))
                         for node in nodes.values())
        members: list[list[int]] = [[] for _ in class_index]
        for i, node in enumerate(nodes.values()):
            if not node.get("subsumed", False):
                members[node_class[i]].append(i)
        if roots is None:
            roots = data.get("root_eclasses", [])
        root_ids = []
        for r in dict.fromkeys(str(r) for r in roots):
            if r not in class_index:
                raise SerializedFormatError(f"root class {r!r} has no node in 'nodes'")
            root_ids.append(class_index[r])
        if not root_ids:
            raise SerializedFormatError(
                "no root classes to extract: the data has no 'root_eclasses'; pass roots=[...]")
        return cls(node_ids, tuple(class_index), tuple(node_class), cost, children,
                   tuple(map(tuple, members)), tuple(root_ids))

    @classmethod
    def of(cls, classes: list[list[tuple[Cost, tuple[int, ...]]]], roots: Iterable[int],
           names: tuple[str, ...] | None = None) -> Graph:
        """A graph from its classes numbered ``0..n-1``: each a list of its nodes as
        ``(cost, child classes)``, node ``j`` of class ``i`` named ``"i.j"``; ``names``
        gives the classes' ids (default their numbers). Costs must be finite and
        non-negative (not checked: the caller built them).

        >>> g = Graph.of([[(2, ())], [(1, (0, 0))]], roots=[1])
        >>> g.children, g.dag_cost([0, 1]), g.choice([0, 1])
        (((), (0, 0)), 3, {'1': '1.0', '0': '0.0'})
        """
        node_ids, node_class, raw_costs, children, members = [], [], [], [], []
        for i, nodes in enumerate(classes):
            first = len(node_ids)
            members.append(tuple(range(first, first + len(nodes))))
            for j, (value, kids) in enumerate(nodes):
                node_ids.append(f"{i}.{j}")
                node_class.append(i)
                raw_costs.append(value)
                children.append(kids)
        if names is None:
            names = tuple(map(str, range(len(classes))))
        return cls(tuple(node_ids), names, tuple(node_class), _exact(raw_costs),
                   tuple(children), tuple(members), tuple(dict.fromkeys(roots)))

    @property
    def num_classes(self) -> int:
        return len(self.class_ids)

    def parents(self) -> list[list[int]]:
        """Per class, the extractable nodes that have it as a (distinct) child."""
        if self._parents is None:
            kids = self.kids
            self._parents = [[] for _ in self.class_ids]
            for ns in self.class_nodes:
                for n in ns:
                    for k in kids[n]:
                        self._parents[k].append(n)
        return self._parents

    def order(self, pick: list[int]) -> list[int]:
        """The classes reached from the roots through ``pick``, children before parents.

        Raises ``ValueError`` if ``pick`` is cyclic or misses a reached class."""
        kids, state, out = self.kids, {}, []
        for root in self.roots:
            if root in state:
                continue
            stack = [(root, 0)]
            state[root] = 1
            while stack:
                c, i = stack[-1]
                n = pick[c]
                if n < 0:
                    raise ValueError(f"class {self.class_ids[c]!r} is reached but has no choice")
                ks = kids[n]
                if i < len(ks):
                    stack[-1] = (c, i + 1)
                    k = ks[i]
                    s = state.get(k)
                    if s is None:
                        state[k] = 1
                        stack.append((k, 0))
                    elif s == 1:
                        raise ValueError(f"the choice is cyclic through class "
                                         f"{self.class_ids[k]!r}")
                else:
                    stack.pop()
                    state[c] = 2
                    out.append(c)
        return out

    def choice(self, pick: list[int]) -> dict[str, str]:
        """``{class id: node id}`` for the classes reached from the roots, each class
        before its children."""
        return {self.class_ids[c]: self.node_ids[pick[c]] for c in reversed(self.order(pick))}

    def dag_cost(self, pick: list[int]) -> Cost:
        """Each chosen node reached from the roots counted once."""
        cost = self.cost
        return _total(cost[pick[c]] for c in self.order(pick))

    def tree_cost(self, pick: list[int]) -> Cost:
        """A shared subterm counted at each use, summed over the roots (``inf`` on float
        overflow; exact for integral costs)."""
        cost, children = self.cost, self.children
        tree: dict[int, Cost] = {}
        for c in self.order(pick):
            n = pick[c]
            tree[c] = cost[n] + sum(tree[k] for k in children[n])
        return sum(tree[r] for r in self.roots)


def _total(values: Iterable[Cost]) -> Cost:
    values = list(values)
    if all(isinstance(v, int) for v in values):
        return sum(values)
    return math.fsum(values)


def acyclic(graph: Graph, pick: list[int], safe_pick: list[int],
            safe_order: list[int]) -> list[int]:
    """``pick`` made acyclic: classes are settled children first, each with its node in
    ``pick`` once that node's child classes are settled; when every remaining class waits
    on a cycle, the first of them in ``safe_order`` is settled with its ``safe_pick`` node
    (an acyclic pick whose nodes only use classes earlier in ``safe_order``, such as
    :func:`egraph.extract.greedy.greedy_tree`'s). An acyclic ``pick`` comes back unchanged
    on every class it reaches from the roots.

    >>> g = Graph.load({"nodes": {"x": {"op": "x", "eclass": "a"},
    ...                           "f": {"op": "f", "children": ["g"], "eclass": "a"},
    ...                           "g": {"op": "g", "children": ["f"], "eclass": "b"}},
    ...                 "root_eclasses": ["b"]})
    >>> acyclic(g, [1, 2], [0, 2], [0, 1])
    [0, 2]
    """
    kids = graph.kids
    num_classes = graph.num_classes
    waiting = [0] * num_classes
    waiters: list[list[int]] = [[] for _ in range(num_classes)]
    want = [-1] * num_classes
    ready = []
    for c in safe_order:
        n = pick[c] if pick[c] >= 0 else safe_pick[c]
        want[c] = n
        waiting[c] = len(kids[n])
        for k in kids[n]:
            waiters[k].append(c)
        if not kids[n]:
            ready.append(c)
    out = [-1] * num_classes
    position = 0
    while True:
        while ready:
            c = ready.pop()
            if out[c] < 0:
                out[c] = want[c]
                for w in waiters[c]:
                    waiting[w] -= 1
                    if not waiting[w]:
                        ready.append(w)
        while position < len(safe_order) and out[safe_order[position]] >= 0:
            position += 1
        if position == len(safe_order):
            return out
        c = safe_order[position]
        want[c] = safe_pick[c]
        ready.append(c)


def _exact(costs: list[Cost]) -> tuple[Cost, ...]:
    """Costs as Python ints when every one is integral (tree costs then stay exact
    however large), as floats otherwise."""
    if all(isinstance(c, int) or c.is_integer() for c in costs):
        return tuple(int(c) for c in costs)
    return tuple(map(float, costs))
