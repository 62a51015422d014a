"""Optimal DAG-cost extraction as an integer program, solved by HiGHS (``highspy``).

One binary per node and per class: the roots' classes are chosen, a chosen class has
exactly one chosen node, a chosen node's child classes are chosen; the objective is the
sum of the chosen nodes' costs (each counted once: the DAG cost). Acyclicity is encoded
with a continuous topological level per class, only on the classes that sit in a
strongly connected component of the class graph, and only on the edges inside it.

Before the solver sees it the e-graph is pruned of everything no optimal answer needs:
nodes that use their own class, nodes that need a class with no acyclic term, nodes
dominated by a same-class node with no higher cost and a subset of its children, nodes
that alone cost more than the known upper bound allows, and classes the roots cannot
reach. Classes left with one node share that node's variable; classes whose only node is
a free leaf leave the model. The solver starts from a known acyclic answer.

>>> from extractors.graph import Graph
>>> from extractors.greedy import greedy_tree
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

import highspy
import numpy as np

from extractors.graph import Graph

#: Relative optimality gap at which a float-cost answer counts as proven optimal.
REL_GAP = 1e-6


def solve_ilp(graph: Graph, start: list[int], safe_order: list[int],
              time_limit: float = 60.0) -> tuple[list[int], bool]:
    """``(pick, proven optimal?)`` of the minimum DAG cost, starting from the acyclic
    ``start`` pick. ``safe_order`` lists the classes that have an acyclic term (as
    :func:`extractors.greedy.greedy_tree` settles them). Returns ``start`` itself, not
    proven, when the solver finds nothing better within ``time_limit`` seconds."""
    deadline = time.perf_counter() + time_limit
    problem = _Problem(graph, start, safe_order)
    pick, optimal = problem.solve(max(0.0, deadline - time.perf_counter()))
    if pick is None or graph.dag_cost(pick) > graph.dag_cost(start):
        return start, optimal and pick is not None
    return pick, optimal


class _Problem:
    """The pruned e-graph (``members``: class -> candidate nodes; ``free``: classes
    decided outside the solver) and its integer program."""

    def __init__(self, graph: Graph, start: list[int], safe_order: list[int]):
        self.graph = graph
        self.start = start
        self.upper = graph.dag_cost(start)
        self.dominator: dict[int, int] = {}
        self.members = self._prune(set(safe_order))
        self.free = {c: ns[0] for c, ns in self.members.items()
                     if len(ns) == 1 and not graph.kids[ns[0]] and not graph.cost[ns[0]]}

    # -- pruning ----------------------------------------------------------------------

    def _prune(self, feasible: set[int]) -> dict[int, list[int]]:
        g = self.graph
        kids, cost, roots = g.kids, g.cost, g.roots
        members = {c: [n for n in g.class_nodes[c]
                       if c not in kids[n] and all(k in feasible for k in kids[n])]
                   for c in feasible}
        root_set = set(roots)
        lower = sum(min(cost[n] for n in members[r]) for r in roots)
        slack = self.upper - lower + 1e-9 * max(1.0, abs(self.upper))
        for c, ns in members.items():
            base = min((cost[n] for n in ns), default=0) if c in root_set else 0
            ns[:] = [n for n in ns if cost[n] - base <= slack]
        for c, ns in members.items():
            ns[:] = self._undominated(ns)
        while True:
            reached = self._reachable(members)
            members = {c: ns for c, ns in members.items() if c in reached}
            changed = False
            for ns in members.values():
                keep = [n for n in ns if all(members.get(k) for k in kids[n])]
                if len(keep) < len(ns):
                    ns[:] = keep
                    changed = True
            if not changed:
                return members

    def _undominated(self, ns: list[int]) -> list[int]:
        """``ns`` without the nodes dominated by another (no higher cost, a subset of
        the children); each dropped node remembers its dominator."""
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

    def _reachable(self, members: dict[int, list[int]]) -> set[int]:
        kids = self.graph.kids
        seen = set(self.graph.roots)
        stack = list(seen)
        while stack:
            for n in members.get(stack.pop(), ()):
                for k in kids[n]:
                    if k not in seen:
                        seen.add(k)
                        stack.append(k)
        return seen

    # -- the integer program ----------------------------------------------------------

    def solve(self, time_limit: float) -> tuple[list[int] | None, bool]:
        g = self.graph
        kids, cost = g.kids, g.cost
        members, free = self.members, self.free
        classes = [c for c in members if c not in free]
        col_cost: list[float] = []
        class_col: dict[int, int] = {}
        node_col: dict[int, int] = {}
        for c in classes:
            ns = members[c]
            if len(ns) > 1:
                class_col[c] = len(col_cost)
                col_cost.append(0.0)
            for n in ns:
                node_col[n] = len(col_cost)
                col_cost.append(float(cost[n]))
            if len(ns) == 1:
                class_col[c] = node_col[ns[0]]
        num_binary = len(col_cost)
        lower = np.zeros(num_binary)
        for r in g.roots:
            if r not in free:
                lower[class_col[r]] = 1.0
        upper = np.ones(num_binary)

        rows: list[tuple[list[int], list[float], float, float]] = []
        edges: dict[int, set[int]] = {}
        for c in classes:
            ns = members[c]
            y = class_col[c]
            if len(ns) > 1:
                rows.append(([*(node_col[n] for n in ns), y], [1.0] * len(ns) + [-1.0],
                             0.0, 0.0))
            shared = set.intersection(*(set(kids[n]) for n in ns)) - free.keys()
            for k in shared:
                rows.append(([y, class_col[k]], [1.0, -1.0], -np.inf, 0.0))
            out = edges.setdefault(c, set())
            for n in ns:
                for k in kids[n]:
                    if k in free:
                        continue
                    out.add(k)
                    if k not in shared:
                        rows.append(([node_col[n], class_col[k]], [1.0, -1.0], -np.inf, 0.0))

        level_col: dict[int, int] = {}
        level_upper: list[float] = []
        for comp in _strongly_connected(classes, edges):
            if len(comp) < 2:
                continue
            size = float(len(comp))
            inside = set(comp)
            for c in comp:
                level_col[c] = num_binary + len(level_upper)
                level_upper.append(size - 1.0)
            for c in comp:
                by_kid: dict[int, list[int]] = {}
                for n in members[c]:
                    for k in kids[n]:
                        if k in inside:
                            by_kid.setdefault(k, []).append(node_col[n])
                for k, cols in by_kid.items():
                    if len(members[c]) == 1 or len(cols) == len(members[c]):
                        cols = [class_col[c]]
                    rows.append(([level_col[k], level_col[c], *cols],
                                 [1.0, -1.0] + [size] * len(cols), -np.inf, size - 1.0))

        num_cols = num_binary + len(level_upper)
        lp = highspy.HighsLp()
        lp.num_col_ = num_cols
        lp.num_row_ = len(rows)
        lp.col_cost_ = np.array(col_cost + [0.0] * len(level_upper))
        lp.col_lower_ = np.concatenate([lower, np.zeros(len(level_upper))])
        lp.col_upper_ = np.concatenate([upper, np.array(level_upper)])
        lp.row_lower_ = np.array([r[2] for r in rows])
        lp.row_upper_ = np.array([r[3] for r in rows])
        starts = np.zeros(len(rows) + 1, dtype=np.int32)
        starts[1:] = np.cumsum([len(r[0]) for r in rows])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = np.array([i for r in rows for i in r[0]], dtype=np.int32)
        lp.a_matrix_.value_ = np.array([v for r in rows for v in r[1]])
        lp.integrality_ = ([highspy.HighsVarType.kInteger] * num_binary
                           + [highspy.HighsVarType.kContinuous] * len(level_upper))

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", max(time_limit, 0.01))
        h.setOptionValue("mip_rel_gap", REL_GAP)
        if all(isinstance(v, int) for v in cost):
            h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
        h.passModel(lp)
        warm = self._warm_start(num_cols, class_col, node_col, level_col)
        if warm is not None:
            h.setSolution(_solution(warm))
        h.run()
        status = h.getModelStatus()
        optimal = status == highspy.HighsModelStatus.kOptimal
        if h.getInfo().primal_solution_status != 2:
            return None, optimal
        values = h.getSolution().col_value
        pick = [-1] * g.num_classes
        for c in classes:
            ns = members[c]
            pick[c] = max(ns, key=lambda n: values[node_col[n]])
        for c, n in free.items():
            pick[c] = n
        return pick, optimal

    def _warm_start(self, num_cols, class_col, node_col, level_col) -> np.ndarray | None:
        """Column values of the start pick (dominated nodes replaced by their
        dominators), or None if it does not fit the pruned model."""
        g = self.graph
        pick = list(self.start)
        for c, n in enumerate(pick):
            while n in self.dominator:
                n = self.dominator[n]
            pick[c] = n
        try:
            order = g.order(pick)
        except ValueError:
            return None
        values = np.zeros(num_cols)
        for i, c in enumerate(order):
            if c in self.free:
                continue
            n = pick[c]
            if n not in node_col:
                return None
            values[class_col[c]] = 1.0
            values[node_col[n]] = 1.0
            if c in level_col:
                values[level_col[c]] = i
        return values


def _solution(values: np.ndarray) -> highspy.HighsSolution:
    sol = highspy.HighsSolution()
    sol.col_value = values
    sol.value_valid = True
    return sol


def _strongly_connected(nodes: list[int], edges: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
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
