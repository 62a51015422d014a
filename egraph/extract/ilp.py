"""Optimal DAG-cost extraction as an integer program, solved by HiGHS (``highspy``).

One binary per node and per class: the root classes are chosen, a chosen class has
exactly one chosen node, a chosen node's child classes are chosen, and the objective is
the sum of the chosen nodes' costs (the DAG cost). What makes it solve fast:

* Bounds and pruning. An acyclic sub-DAG under node ``n`` costs at least
  ``cost(n) + max(bound of each child class)`` (``n`` is never inside its children's
  sub-DAGs), and any answer that uses ``n`` also holds a chain of distinct nodes from a
  root down to ``n``'s class; a node whose two bounds add up to more than the warm start
  costs is dropped, and the root's bound alone may already prove the warm start optimal.
  Also dropped: nodes that use their own class or a class with no acyclic term, nodes
  dominated by a same-class node (no higher cost, a subset of its child classes) and
  classes the roots no longer reach. A class left with one node shares that node's
  variable; a class whose only node is a free leaf leaves the model.
* Exclusive users. The plain link ``x[node] <= y[child class]`` lets the relaxation pay
  for a shared class once while alternatives that are never chosen together each "use"
  it, which leaves the LP bound far below the optimum on e-graphs full of alternatives.
  Two nodes are *exclusive* when no answer that keeps only the classes used from the
  roots holds both: nodes of one class, two nodes that would close a cycle (each one's
  children force the other's class into every acyclic term), and, inductively, a node
  all of whose class's users are exclusive with the other. Each class ``k`` gets
  ``y[k] >= sum(x[u] for u in S)`` for groups ``S`` of pairwise exclusive users.
* Chains fold away. A class of one node whose users all belong to one class is used
  exactly when one of them is: its cost and children move into those users and it
  leaves the model (most of a model's program: the 12-layer decoder's 2,023 nodes and
  1,343 classes shrink to 1,070 and 390).
* Acyclicity only where it can fail: a continuous topological level per class inside a
  strongly connected component of the class graph, constrained on the edges inside it.
* A warm start from the DAG-aware heuristic's answer.

>>> from egraph.extract.graph import Graph
>>> from egraph.extract.greedy import greedy_tree
>>> g = Graph.load({"nodes": {
...     "x": {"op": "x", "eclass": "x", "cost": 5}, "y": {"op": "y", "eclass": "y", "cost": 9},
...     "fx": {"op": "f", "children": ["x"], "eclass": "b"},
...     "gx": {"op": "g", "children": ["x"], "eclass": "c"},
...     "sy": {"op": "s", "children": ["y"], "eclass": "d"},
...     "p": {"op": "p", "children": ["fx", "gx"], "eclass": "r"},
...     "q": {"op": "q", "children": ["sy"], "eclass": "r"}},
...     "root_eclasses": ["r"]})
>>> start, order = greedy_tree(g)
>>> pick, optimal = solve_ilp(g, start, order, time_limit=10)
>>> g.node_ids[pick[g.roots[0]]], g.dag_cost(pick), optimal
('p', 8, True)
"""

from __future__ import annotations

import time
from heapq import heappop, heappush

import numpy as np

from egraph.extract.graph import Cost, Graph
from egraph.extract.highs import Rows, solve_mip

#: Relative optimality gap at which a float-cost answer counts as proven optimal.
REL_GAP = 1e-6
#: Above this many nodes in the pruned model the exclusive-user relation (a bit matrix
#: of nodes squared) is not built; users are then grouped by class only.
MAX_EXCLUSIVE_NODES = 30_000
#: Node costs from here on are out of the solver's range.
MAX_COST = 1e15


def solve_ilp(graph: Graph, start: list[int], safe_order: list[int],
              time_limit: float = 60.0) -> tuple[list[int], bool]:
    """``(pick, proven optimal?)`` of the minimum DAG cost, starting from the acyclic
    ``start`` pick. ``safe_order`` lists the classes that have an acyclic term (as
    :func:`egraph.extract.greedy.greedy_tree` settles them). Returns ``start``, unproven,
    when the solver finds nothing better within ``time_limit`` seconds, or when ``start``
    costs :data:`MAX_COST` or more (out of the solver's range)."""
    deadline = time.perf_counter() + time_limit
    try:
        import highspy  # noqa: F401  (an optional dependency: fail before any work)
    except ImportError:
        raise ImportError("method='ilp' needs the HiGHS solver: pip install highspy") from None
    upper = graph.dag_cost(start)
    if upper >= MAX_COST:
        # (HiGHS reads costs from MAX_COST on as infinite; below it, pruning drops every
        # node dearer than the start, so the model holds none of them)
        return start, False
    model = _Model(graph, start, set(safe_order))
    if model.lower >= upper - _tolerance(upper):
        return start, True
    if time.perf_counter() >= deadline:
        return start, False
    pick, optimal = model.solve(deadline)
    if pick is None:
        return start, False
    if graph.dag_cost(pick) > upper:
        return start, optimal
    return pick, optimal


class _Model:
    """The pruned e-graph with local node numbers, and its integer program.

    ``nodes[i]`` is a graph node, ``ncls[i]`` its class, ``nkids[i]`` its child classes
    in the model; ``members[c]`` the local nodes of class ``c``; ``free`` maps the
    classes decided outside the solver to their node."""

    def __init__(self, graph: Graph, start: list[int], feasible: set[int]):
        self.graph = graph
        self.start = start
        self.dominator: dict[int, int] = {}
        chosen, self.lower = self._prune(feasible, graph.dag_cost(start))
        kids, cost = graph.kids, graph.cost
        self.free = {c: ns[0] for c, ns in chosen.items()
                     if len(ns) == 1 and not kids[ns[0]] and not cost[ns[0]]}
        classes = [c for c in chosen if c not in self.free]
        node_kids = {n: tuple(k for k in kids[n] if k not in self.free)
                     for c in classes for n in chosen[c]}
        node_cost = {n: cost[n] for n in node_kids}
        self.absorbed = _absorb(classes, chosen, node_kids, node_cost, graph.node_class,
                                set(graph.roots))
        self.classes = [c for c in classes if c not in self.absorbed]
        self.nodes: list[int] = []
        self.members: dict[int, list[int]] = {}
        for c in self.classes:
            self.members[c] = list(range(len(self.nodes), len(self.nodes) + len(chosen[c])))
            self.nodes.extend(chosen[c])
        self.ncls = [graph.node_class[n] for n in self.nodes]
        self.nkids = [node_kids[n] for n in self.nodes]
        self.ncost = [node_cost[n] for n in self.nodes]

    # -- pruning ----------------------------------------------------------------------

    def _prune(self, feasible: set[int], upper: Cost) -> tuple[dict[int, list[int]], Cost]:
        """Class -> the nodes an optimal answer may use, and a lower bound on the
        optimum."""
        g = self.graph
        kids, cost, roots = g.kids, g.cost, g.roots
        members = {c: [n for n in g.class_nodes[c] if c not in kids[n]] for c in feasible}
        limit = upper + _tolerance(upper)
        while True:
            below = _acyclic_bounds(g, members)
            above = _path_costs(g, members, below)
            kept: dict[int, list[int]] = {}
            changed = False
            for c, ns in members.items():
                keep = []
                if c in above:
                    for n in ns:
                        if all(k in below for k in kids[n]):
                            least = max((below[k] for k in kids[n]), default=0)
                            if above[c] + cost[n] + least <= limit:
                                keep.append(n)
                    keep = self._undominated(keep)
                changed = changed or len(keep) < len(ns)
                if keep:
                    kept[c] = keep
            members = kept
            if not changed:
                return members, max(below[r] for r in roots)

    def _undominated(self, ns: list[int]) -> list[int]:
        """``ns`` without the nodes dominated by another; each dropped node remembers
        its dominator."""
        kids, cost = self.graph.kids, self.graph.cost
        keep: list[tuple[int, frozenset]] = []
        for n in sorted(ns, key=lambda n: (len(kids[n]), cost[n], n)):
            mine = frozenset(kids[n])
            for a, theirs in keep:
                if cost[a] <= cost[n] and theirs <= mine:
                    self.dominator[n] = a
                    break
            else:
                keep.append((n, mine))
        return sorted(a for a, _ in keep)

    # -- structure --------------------------------------------------------------------

    def _exclusive(self, users: dict[int, list[int]], pairs: dict[int, list[int]],
                   parents_first: list[int], deadline: float = np.inf) -> np.ndarray:
        """Bit matrix (rows packed with ``np.packbits``): bit ``j`` of row ``i`` says
        local nodes ``i`` and ``j`` are never both in an answer that only keeps the
        classes used from the roots. The least symmetric relation that holds for two
        nodes of one class and for ``i, j`` when every user of ``j``'s class is
        exclusive with ``i`` (and for the ``pairs`` that would close a cycle); a node
        exclusive with itself is in no such answer. Past the ``deadline`` it stops after
        the round it is in: every bit set is true, so the cliques made of fewer bits are
        still valid constraints, only weaker."""
        num = len(self.nodes)
        bits = np.zeros((num, (num + 7) // 8), dtype=np.uint8)
        for ns in self.members.values():
            if len(ns) > 1:
                row = np.zeros(num, dtype=bool)
                row[ns] = True
                packed = np.packbits(row)
                for i in ns:
                    bits[i] = packed
                    bits[i, i >> 3] &= ~np.uint8(0x80 >> (i & 7))
        for a, bs in pairs.items():
            for b in bs:
                bits[a, b >> 3] |= np.uint8(0x80 >> (b & 7))
                bits[b, a >> 3] |= np.uint8(0x80 >> (a & 7))
        roots = set(self.graph.roots)
        steps = [(self.members[c], np.array(users[c])) for c in parents_first
                 if c not in roots and users[c]]
        while True:
            before = bits.copy()
            for ns, us in steps:
                common = np.bitwise_and.reduce(bits[us], axis=0)
                bits[ns] |= common
            _mirror(bits, before, num)
            if np.array_equal(bits, before) or time.perf_counter() >= deadline:
                return bits

    def _cycle_pairs(self, users: dict[int, list[int]],
                     components: list[list[int]]) -> dict[int, list[int]]:
        """Local node -> the nodes it forms a cycle with whenever both are chosen (itself
        if it always does). Every acyclic term of a class holds the classes of its
        ``forced`` set (a bit per class, computed downwards from "everything" to the
        greatest fixed point); if node ``a``'s children force ``b``'s class and ``b``'s
        children force ``a``'s, the two reach each other, so their classes share a
        strongly connected component of ``components``: only those are looked at."""
        members, nkids, ncls = self.members, self.nkids, self.ncls
        index = {c: j for j, c in enumerate(self.classes)}
        same_component = {}
        for comp in components:
            mask = 0
            for c in comp:
                mask |= 1 << index[c]
            for c in comp:
                same_component[c] = mask
        forced = {c: None for c in self.classes}
        parents = {c: {ncls[i] for i in users[c]} for c in self.classes}
        work = list(self.classes)
        queued = set(work)
        while work:
            c = work.pop()
            queued.discard(c)
            acc = None
            for i in members[c]:
                below = 0
                for k in nkids[i]:
                    if forced[k] is None:
                        break
                    below |= forced[k]
                else:
                    acc = below if acc is None else acc & below
            if acc is None:
                continue
            new = acc | (1 << index[c])
            if new != forced[c]:
                forced[c] = new
                for p in parents[c]:
                    if p not in queued:
                        queued.add(p)
                        work.append(p)
        below = []
        for ks in nkids:
            acc = 0
            for k in ks:
                acc |= forced[k] or 0
            below.append(acc)
        pairs = {}
        for a, acc in enumerate(below):
            acc &= same_component[ncls[a]]
            ca = index[ncls[a]]
            while acc:
                low = acc & -acc
                j = low.bit_length() - 1
                acc ^= low
                cb = self.classes[j]
                if j == ca:
                    pairs.setdefault(a, []).append(a)
                    continue
                for b in members[cb]:
                    if below[b] >> ca & 1:
                        pairs.setdefault(a, []).append(b)
        return pairs

    # -- the integer program ----------------------------------------------------------

    def solve(self, deadline: float) -> tuple[list[int] | None, bool]:
        """``(pick, proven optimal?)`` from HiGHS; pick is None if it found nothing."""
        g = self.graph
        members = self.members
        num = len(self.nodes)
        # Columns: one per local node, then one per class with several nodes (a class
        # with one node shares that node's column), then the levels.
        class_col = {}
        num_binary = num
        for c in self.classes:
            if len(members[c]) == 1:
                class_col[c] = members[c][0]
            else:
                class_col[c] = num_binary
                num_binary += 1
        edges = {c: {k for i in members[c] for k in self.nkids[i]} for c in self.classes}
        components = _strongly_connected(self.classes, edges)
        level_col: dict[int, int] = {}
        level_size: list[float] = []
        for comp in components:
            if len(comp) > 1:
                for c in comp:
                    level_col[c] = num_binary + len(level_size)
                    level_size.append(float(len(comp)))
        num_cols = num_binary + len(level_size)

        col_cost = np.zeros(num_cols)
        col_cost[:num] = [float(v) for v in self.ncost]
        col_lower = np.zeros(num_cols)
        col_upper = np.ones(num_cols)
        col_upper[num_binary:] = np.array(level_size) - 1.0
        for r in g.roots:
            if r in class_col:
                col_lower[class_col[r]] = 1.0
        rows = self._rows(class_col, level_col, components, col_upper, deadline)
        if time.perf_counter() >= deadline:
            return None, False
        warm = self._warm_start(num_cols, class_col, level_col, components)
        values, optimal = solve_mip(col_cost, col_lower, col_upper, num_binary, rows, warm,
                                    deadline, REL_GAP, all(isinstance(v, int) for v in g.cost))
        if values is None:
            return None, False
        pick = [-1] * g.num_classes
        for c in self.classes:
            pick[c] = self.nodes[max(members[c], key=lambda i: values[i])]
        for c, n in (*self.free.items(), *self.absorbed.items()):
            pick[c] = n
        return pick, optimal

    def _rows(self, class_col: dict[int, int], level_col: dict[int, int],
              components: list[list[int]], col_upper: np.ndarray, deadline: float) -> Rows:
        """The constraints; nodes that can be in no answer get upper bound 0."""
        members, ncls, nkids = self.members, self.ncls, self.nkids
        num = len(self.nodes)
        rows = Rows()

        def total(group: list[int]) -> list[int]:
            return _class_columns(group, members, ncls, class_col)

        for c in self.classes:
            ns = members[c]
            if len(ns) > 1:
                rows.add([*ns, class_col[c]], [1.0] * len(ns) + [-1.0], 0.0, 0.0)
        users: dict[int, list[int]] = {c: [] for c in self.classes}
        for i, ks in enumerate(nkids):
            for k in ks:
                users[k].append(i)
        pairs = self._cycle_pairs(users, components)
        for a, bs in pairs.items():
            by_class: dict[int, list[int]] = {}
            for b in bs:
                if b > a:
                    by_class.setdefault(ncls[b], []).append(b)
            for group in by_class.values():
                cols = [a, *total(group)]
                rows.add(cols, [1.0] * len(cols), -np.inf, 1.0)
        exclusive = None
        if num <= MAX_EXCLUSIVE_NODES:
            parents_first = [c for comp in reversed(components) for c in comp]
            bits = self._exclusive(users, pairs, parents_first, deadline)
            diagonal = bits[np.arange(num), np.arange(num) >> 3] >> (7 - np.arange(num) % 8)
            col_upper[:num][(diagonal & 1) != 0] = 0.0
            exclusive = _row_masks(bits, num)
        for k, us in users.items():
            for group in _cliques(us, exclusive, ncls):
                cols = total(group)
                rows.add([*cols, class_col[k]], [1.0] * len(cols) + [-1.0], -np.inf, 0.0)
        component = {c: j for j, comp in enumerate(components) for c in comp}
        for c, col in level_col.items():
            size = float(len(components[component[c]]))
            by_kid: dict[int, list[int]] = {}
            for i in members[c]:
                for k in nkids[i]:
                    if component[k] == component[c]:
                        by_kid.setdefault(k, []).append(i)
            for k, group in by_kid.items():
                cols = total(group)
                rows.add([level_col[k], col, *cols], [1.0, -1.0] + [size] * len(cols),
                         -np.inf, size - 1.0)
        return rows

    def _warm_start(self, num_cols: int, class_col: dict[int, int], level_col: dict[int, int],
                    components: list[list[int]]) -> np.ndarray | None:
        """Column values of the start pick (dominated nodes replaced by their
        dominators), or None if it does not fit the pruned model."""
        g = self.graph
        local = {n: i for i, n in enumerate(self.nodes)}
        pick = list(self.start)
        for c, n in enumerate(pick):
            while n in self.dominator:
                n = self.dominator[n]
            pick[c] = n
        try:
            order = g.order(pick)
        except ValueError:
            return None
        component = {c: j for j, comp in enumerate(components) for c in comp}
        placed = [0] * len(components)
        values = np.zeros(num_cols)
        for c in order:
            if c in self.free:
                continue
            if c in self.absorbed:
                if pick[c] != self.absorbed[c]:
                    return None
                continue
            i = local.get(pick[c])
            if i is None:
                return None
            values[class_col[c]] = 1.0
            values[i] = 1.0
            if c in level_col:
                values[level_col[c]] = placed[component[c]]
                placed[component[c]] += 1
        return values


def _absorb(classes: list[int], members: dict[int, list[int]],
            node_kids: dict[int, tuple[int, ...]], node_cost: dict[int, Cost],
            node_class: tuple[int, ...], roots: set[int]) -> dict[int, int]:
    """Fold each class of one node whose users all belong to one class into those users:
    at most one of them is chosen, so the class is used exactly when one is, and each
    user takes on its cost and its child classes (``node_kids`` and ``node_cost`` are
    updated in place). Returns the folded classes with their node. Most of a model's
    program is such chains of single-node classes, so the integer program keeps only
    the classes where something is chosen. Classes on a cycle of the class graph and
    root classes stay: the levels that keep an answer acyclic live on the cycles."""
    users: dict[int, list[int]] = {c: [] for c in classes}
    for c in classes:
        for n in members[c]:
            for k in node_kids[n]:
                users[k].append(n)
    edges = {c: {k for n in members[c] for k in node_kids[n]} for c in classes}
    cyclic = {c for comp in _strongly_connected(classes, edges) if len(comp) > 1
              for c in comp}
    fixed = roots | cyclic
    work = [c for c in classes if len(members[c]) == 1]
    absorbed: dict[int, int] = {}
    while work:
        k = work.pop()
        us = users[k]
        if k in fixed or k in absorbed or not us or any(
                node_class[u] != node_class[us[0]] for u in us):
            continue
        (n,) = members[k]
        below = node_kids[n]
        for u in us:
            node_cost[u] += node_cost[n]
            node_kids[u] = tuple(dict.fromkeys(
                [j for j in node_kids[u] if j != k] + list(below)))
        for j in below:
            users[j] = list(dict.fromkeys(
                [u for u in users[j] if u != n] + [u for u in us if u not in users[j]]))
            if len(members[j]) == 1:
                work.append(j)
        absorbed[k] = n
    return absorbed


def _tolerance(value: Cost) -> Cost:
    """How far apart two costs may be and still count as equal."""
    return 0 if isinstance(value, int) else REL_GAP * abs(value)


def _acyclic_bounds(graph: Graph, members: dict[int, list[int]]) -> dict:
    """Class -> a lower bound on the DAG cost of any acyclic term of it (classes with
    none are absent): ``min(cost(node) + max(bound of each child class))``, as a node
    is never inside its own children's sub-DAGs. Settled cheapest first, as in
    :func:`egraph.extract.greedy.greedy_tree`."""
    kids, cost, node_class = graph.kids, graph.cost, graph.node_class
    users: dict[int, list[int]] = {}
    missing: dict[int, int] = {}
    heap: list = []
    for c, ns in members.items():
        for n in ns:
            missing[n] = len(kids[n])
            for k in kids[n]:
                users.setdefault(k, []).append(n)
            if not kids[n]:
                heappush(heap, (cost[n], c))
    below: dict = {}
    while heap:
        value, c = heappop(heap)
        if c in below:
            continue
        below[c] = value
        for n in users.get(c, ()):
            missing[n] -= 1
            if not missing[n] and node_class[n] not in below:
                heappush(heap, (cost[n] + max([below[k] for k in kids[n]]), node_class[n]))
    return below


def _path_costs(graph: Graph, members: dict[int, list[int]], below: dict) -> dict:
    """Class -> the cheapest chain of nodes leading to it from a root (the nodes that
    must sit above it in any answer that uses it); unreachable classes are absent."""
    kids, cost = graph.kids, graph.cost
    above: dict = {}
    heap: list = [(0, r) for r in graph.roots if r in below]
    while heap:
        value, c = heappop(heap)
        if c in above:
            continue
        above[c] = value
        for n in members[c]:
            if all(k in below for k in kids[n]):
                for k in kids[n]:
                    if k not in above:
                        heappush(heap, (value + cost[n], k))
    return above


def _class_columns(group, members, ncls, class_col) -> list[int]:
    """The columns summing the nodes of ``group``, a class's column standing in for all
    of its nodes."""
    by_class: dict[int, list[int]] = {}
    for i in group:
        by_class.setdefault(ncls[i], []).append(i)
    cols = []
    for c, ns in by_class.items():
        if len(ns) == len(members[c]):
            cols.append(class_col[c])
        else:
            cols.extend(ns)
    return cols


def _cliques(users: list[int], exclusive: list[int] | None, ncls: list[int]
             ) -> list[list[int]]:
    """``users`` split greedily into groups of pairwise exclusive nodes (by class when
    there is no ``exclusive`` relation: :func:`_row_masks`)."""
    if len(users) < 2 or exclusive is None:
        by_class: dict[int, list[int]] = {}
        for i in users:
            by_class.setdefault(ncls[i], []).append(i)
        return list(by_class.values())
    groups: list[tuple[int, list[int]]] = []
    for a in users:
        row = exclusive[a]
        for index, (mask, group) in enumerate(groups):
            if row & mask == mask:
                groups[index] = (mask | 1 << a, group)
                group.append(a)
                break
        else:
            groups.append((1 << a, [a]))
    return [group for _, group in groups]


def _row_masks(bits: np.ndarray, num: int) -> list[int]:
    """The rows of a square bit matrix packed with ``np.packbits`` as Python ints, bit
    ``j`` of row ``i`` set where ``bits`` has it: tests of a few bits each, as the
    cliques make, cost a shift and an ``and`` instead of an array lookup."""
    little = _BIT_REVERSED[bits]  # packbits is big-endian within a byte
    return [int.from_bytes(little[i].tobytes(), "little") for i in range(num)]


_BIT_REVERSED = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=np.uint8)


def _mirror(bits: np.ndarray, before: np.ndarray, num: int) -> None:
    """Make the square bit matrix ``bits`` symmetric again where its rows gained bits since
    the symmetric ``before``: each new bit ``(i, j)`` is mirrored to ``(j, i)``, row by
    row where few rows changed (the later rounds of :meth:`_Model._exclusive`), by one
    whole transpose where many did."""
    rows = np.flatnonzero((bits != before).any(axis=1))
    if len(rows) > num // 16:
        bits |= _transpose(bits, num)
        return
    gained = np.unpackbits(bits[rows] & ~before[rows], axis=1, count=num)
    for i, row in zip(rows.tolist(), gained):
        bits[np.flatnonzero(row), i >> 3] |= np.uint8(0x80 >> (i & 7))


def _transpose(bits: np.ndarray, num: int) -> np.ndarray:
    """The transpose of a square bit matrix whose rows are packed with ``np.packbits``."""
    out = np.zeros_like(bits)
    block = 2048
    for start in range(0, num, block):
        rows = np.unpackbits(bits[start:start + block], axis=1, count=num)
        out[:, start >> 3:(start + len(rows) + 7) >> 3] = np.packbits(rows.T, axis=1)
    return out


def _strongly_connected(nodes: list[int], edges: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, children's components first."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(edges.get(root, ()))))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
    return out
