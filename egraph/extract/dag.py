"""DAG-aware greedy extraction (after extraction-gym's ``faster-greedy-dag``), and a
local search that improves any acyclic answer.

Each class keeps a *cost set*: ``{class: cost of its chosen node}`` over the classes of the
sub-DAG its choice uses, so a subterm shared by two children is paid once. A node's
candidate set is the union of its child classes' sets plus itself; the class takes the
node whose set has the lowest total. Nodes are re-evaluated on a priority queue whenever a
child class improves, cheapest candidates first. Each class decides alone, so sharing
that pays only when several classes switch together is left to :func:`improve`.

>>> from egraph.extract.graph import Graph
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

from bisect import bisect_left
from heapq import heappop, heappush

from egraph.extract.graph import Graph
from egraph.extract.greedy import greedy_tree


def greedy_dag(graph: Graph) -> list[int]:
    """The pick (class -> node, ``-1`` where none) of the DAG-aware greedy; it may be
    cyclic, so callers pass it through :func:`egraph.extract.graph.acyclic`."""
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


def improve(graph: Graph, pick: list[int]) -> list[int]:
    """An acyclic pick at least as cheap as the acyclic ``pick``, by local search (see
    :class:`_LocalSearch`)."""
    search = _LocalSearch(graph, pick)
    search.descend()
    search.share()
    return search.pick


class _LocalSearch:
    """An acyclic pick with a use count per class (one per chosen node using it, one
    per root), so that re-choosing a class has an exact price: the classes that come
    into use are added, each with the tree-greedy node that counts the classes already
    in use as free, and the classes that fall out of use are dropped.

    ``descend`` keeps single re-choices that lower the DAG cost until none does.
    ``share`` then looks for a class that re-choices of two or more classes would bring
    in (one fused matrix product serving several others, say): it prices them as if
    their common part were paid once and, where that wins, makes them together, keeping
    the result only if the DAG cost really drops."""

    def __init__(self, graph: Graph, pick: list[int]):
        self.graph = graph
        self.pick = list(pick)
        self.refs = [0] * graph.num_classes
        for r in graph.roots:
            self.refs[r] += 1
        for c in graph.order(self.pick):
            for k in graph.kids[self.pick[c]]:
                self.refs[k] += 1
        self.total = graph.dag_cost(self.pick)
        self.epsilon = 0 if isinstance(self.total, int) else 1e-9 * self.total
        self.undo: list[tuple[list[int], int, int]] = []
        # (class, node) -> (gain, classes brought into use) of each re-choice tried.
        self.brings: dict[tuple[int, int], tuple] = {}
        self._suggest()
        self.usable = [all(self.pick[k] >= 0 for k in ks) for ks in graph.kids]

    def _suggest(self) -> None:
        """Give each class not in use the tree-greedy node that counts the classes in
        use as free (``-1`` if it has no acyclic term)."""
        graph, pick = self.graph, self.pick
        suggest, _ = greedy_tree(graph, {c: pick[c] for c in graph.order(pick)})
        for c, uses in enumerate(self.refs):
            if not uses:
                pick[c] = suggest[c]

    def _count(self, start: tuple[int, ...], step: int, brought: list[int] | None = None):
        """Add ``step`` to the use counts of the classes ``start`` (and onwards); returns
        the cost of the classes that come into use (step 1) or fall out of use (-1), and
        appends those classes to ``brought``."""
        refs, pick, cost, kids = self.refs, self.pick, self.graph.cost, self.graph.kids
        undo = self.undo
        total = 0
        stack = list(start)
        while stack:
            k = stack.pop()
            undo.append((refs, k, refs[k]))
            refs[k] += step
            if refs[k] == (1 if step > 0 else 0):
                total += cost[pick[k]]
                stack.extend(kids[pick[k]])
                if brought is not None:
                    brought.append(k)
        return total

    def _move(self, c: int, n: int, position: _Order, keep_if_worse: bool = False
              ) -> _Order | None:
        """Re-choose ``c`` as ``n``; kept when acyclic and cheaper (or, with
        ``keep_if_worse``, acyclic), undone otherwise. Returns the order of the classes
        then in use (``position`` updated) where it was kept, None where it was undone."""
        kids, cost = self.graph.kids, self.graph.cost
        old = self.pick[c]
        self.undo.clear()
        self.undo.append((self.pick, c, old))
        self.pick[c] = n
        brought: list[int] = []
        dropped: list[int] = []
        gain = (cost[old] - cost[n] - self._count(kids[n], 1, brought)
                + self._count(kids[old], -1, dropped))
        self.brings[c, n] = (gain, brought)
        if ((gain > self.epsilon or keep_if_worse)
                and not _reaches(kids, self.pick, kids[n], c, position.at)):
            self.total -= gain
            return self._placed(position, c, brought, dropped)
        for array, k, value in reversed(self.undo):
            array[k] = value
        return None

    def _positions(self) -> _Order:
        return _Order(self.graph.order(self.pick))

    def _placed(self, position: _Order, c: int, brought: list[int],
                dropped: list[int]) -> _Order:
        """``position`` after the kept re-choice of ``c`` that ``brought`` classes into
        use and ``dropped`` others: the classes brought are placed just below ``c``, the
        classes in use reordered first where one of their children lies above ``c``
        (:meth:`_lifted`), so a move costs what it touches rather than a walk of the
        whole program (a 32-layer decoder keeps hundreds of moves)."""
        position.drop(dropped)
        kids, pick, at = self.graph.kids, self.pick, position.at
        new = set(brought)
        below = {k for x in (c, *brought) for k in kids[pick[x]] if k not in new}
        if any(at[k] > at[c] for k in below) and not self._lifted(position, c, below):
            return self._positions()
        if not position.insert_below(c, _children_first(kids, pick, brought, new)):
            return self._positions()
        return position

    def _lifted(self, position: _Order, c: int, below: set[int]) -> bool:
        """Reorder ``position`` so that the classes ``below`` (in use) come before ``c``,
        as Pearce and Kelly keep a topological order when an edge is added: the classes
        they reach placed above ``c`` and the classes that reach ``c`` placed below the
        highest of them trade positions, each group keeping its own order. False
        (``position`` as it was) where the two groups meet: a cycle."""
        kids, pick, graph, at = self.graph.kids, self.pick, self.graph, position.at
        high, top = at[c], max(at[k] for k in below)
        down: set[int] = set()
        stack = [k for k in below if at[k] > high]
        while stack:
            k = stack.pop()
            if k not in down:
                down.add(k)
                stack.extend(j for j in kids[pick[k]] if at[j] > high)
        up: set[int] = set()
        stack = [c]
        parents, node_class = graph.parents(), graph.node_class
        while stack:
            x = stack.pop()
            if x not in up:
                up.add(x)
                stack.extend(node_class[n] for n in parents[x]
                             if pick[node_class[n]] == n and at.get(node_class[n], top) < top)
        if up & down:
            return False
        position.trade(down, up)
        return True

    def descend(self) -> None:
        kids, class_nodes, usable = self.graph.kids, self.graph.class_nodes, self.usable
        improved = True
        while improved:
            improved = False
            self._suggest()
            position = self._positions()
            for c in sorted(position.at, key=position.at.__getitem__, reverse=True):
                for n in class_nodes[c]:
                    if self.refs[c] and n != self.pick[c] and usable[n] and c not in kids[n]:
                        placed = self._move(c, n, position)
                        if placed is not None:
                            improved = True
                            position = placed

    def share(self) -> None:
        cost, pick = self.graph.cost, self.pick
        wanted: dict[int, list[tuple[int, int]]] = {}
        for move, (_, brought) in self.brings.items():
            for k in brought:
                wanted.setdefault(k, []).append(move)
        plans = []
        for moves in wanted.values():
            if len({c for c, _ in moves}) < 2:
                continue
            common = set.intersection(*(set(self.brings[m][1]) for m in moves))
            price = sum(cost[pick[j]] for j in common)
            best: dict[int, tuple] = {}
            for c, n in moves:
                gain = self.brings[c, n][0] + price
                if gain > best.get(c, (0,))[0]:
                    best[c] = (gain, n)
            if sum(gain for gain, _ in best.values()) > price + self.epsilon:
                plans.append(sorted((c, n) for c, (_, n) in best.items()))
        changed = False
        # (the order changes only where a move is kept: a move undone leaves it as it was)
        position = self._positions()
        for plan in sorted(plans):
            saved = (list(self.pick), list(self.refs), self.total, position.copy())
            for i, (c, n) in enumerate(plan):
                placed = (self._move(c, n, position, keep_if_worse=i == 0)
                          if self.refs[c] and self.pick[c] != n else None)
                if placed is not None:
                    position = placed
            if self.total < saved[2] - self.epsilon:
                changed = True
            else:
                self.pick, self.refs, self.total, position = saved
        if changed:
            self.descend()


class _Order:
    """A children-first order of the classes in use as distinct positions (``at``: class
    -> position; ``values``: the positions, sorted), kept as classes are re-chosen."""

    NARROWEST = 1e-6
    """The least gap between positions :meth:`insert_below` makes: below it, the order is
    computed afresh."""

    def __init__(self, classes: list[int]):
        self.at: dict[int, float] = {c: i for i, c in enumerate(classes)}
        self.values: list[float] = list(range(len(classes)))

    def copy(self) -> _Order:
        order = _Order([])
        order.at, order.values = dict(self.at), list(self.values)
        return order

    def drop(self, classes: list[int]) -> None:
        """Forget ``classes`` (out of use)."""
        for c in classes:
            del self.values[bisect_left(self.values, self.at.pop(c))]

    def insert_below(self, c: int, classes: list[int]) -> bool:
        """Place ``classes`` (in their order) between ``c`` and the position just below it;
        False (nothing placed) where the gap is too narrow."""
        high = self.at[c]
        i = bisect_left(self.values, high)
        low = self.values[i - 1] if i else high - 1
        step = (high - low) / (len(classes) + 1)
        if step < self.NARROWEST:
            return False
        placed = [low + j * step for j in range(1, len(classes) + 1)]
        self.values[i:i] = placed
        self.at.update(zip(classes, placed))
        return True

    def trade(self, down: set[int], up: set[int]) -> None:
        """Give the positions of ``down`` and ``up`` to ``down`` first, then ``up``, each in
        its own order (the same positions: :attr:`values` stays as it is)."""
        at = self.at
        slots = sorted(at[x] for x in down | up)
        moved = sorted(down, key=at.__getitem__) + sorted(up, key=at.__getitem__)
        at.update(zip(moved, slots))


def _children_first(kids, pick: list[int], classes: list[int], among: set[int]) -> list[int]:
    """``classes`` in an order where each comes after its children through ``pick`` that
    are ``among`` them (an acyclic pick)."""
    ordered: list[int] = []
    seen: set[int] = set()
    for start in classes:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(kids[pick[start]]))]
        while stack:
            x, rest = stack[-1]
            for k in rest:
                if k in among and k not in seen:
                    seen.add(k)
                    stack.append((k, iter(kids[pick[k]])))
                    break
            else:
                stack.pop()
                ordered.append(x)
    return ordered


def _reaches(kids, pick: list[int], start: tuple[int, ...], target: int,
             position: dict[int, float]) -> bool:
    """Whether ``target`` can be reached from the classes ``start`` through ``pick``;
    ``position`` is a children-first order of the classes in use, so a class placed
    before ``target`` cannot lead to it."""
    limit = position[target]
    seen = set()
    stack = list(start)
    while stack:
        k = stack.pop()
        if k == target:
            return True
        if k in seen or position.get(k, limit + 1) < limit:
            continue
        seen.add(k)
        stack.extend(kids[pick[k]])
    return False
