"""Saturation: the runner loop, its schedulers, limits and report.

Each iteration searches every rule (only where the e-graph changed since that rule's last
complete search, when incremental), then applies all matches, then rebuilds once, as egg's
``Runner`` does. Limits are checked between rules and inside a rule's application, so a
node limit is never overshot by more than one match's worth of e-nodes.

>>> from egraph import EGraph, rewrite, BackoffScheduler
>>> eg = EGraph()
>>> _ = eg.add("(+ a (+ b c))", root=True)
>>> rules = [rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)"),
...          rewrite("assoc", "(+ ?x (+ ?y ?z))", "(+ (+ ?x ?y) ?z)")]
>>> eg.saturate(rules, scheduler=BackoffScheduler()).report.stop_reason
'saturated'
>>> eg.num_classes
7
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from egraph.gcpause import gc_paused
from egraph.logs import SaturationLog
from egraph.pattern import Pattern
from egraph.rewrite import Rewrite
from egraph.term import Term, parse

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class SimpleScheduler:
    """Search and apply every rule every iteration."""

    def search(self, iteration: int, rule: Rewrite, search: Callable[[int], list]) -> list | None:
        """Run ``search(limit)`` for ``rule``; None means the rule sat this iteration out."""
        return search(1 << 62)

    def can_stop(self, iteration: int) -> bool:
        """Whether an iteration with no change may end saturation."""
        return True


@dataclass
class _BackoffStats:
    times_applied: int = 0
    banned_until: int = 0
    times_banned: int = 0


class BackoffScheduler:
    """egg's backoff scheduler: a rule that matches too often is banned for a while.

    A rule may match up to ``match_limit << times_banned`` times in one iteration; beyond
    that it is banned for ``ban_length << times_banned`` iterations. Saturation is only
    declared once no rule is banned (banned rules are brought forward instead).
    """

    def __init__(self, match_limit: int = 1000, ban_length: int = 5):
        self.match_limit = match_limit
        self.ban_length = ban_length
        self.stats: dict[str, _BackoffStats] = {}

    def search(self, iteration: int, rule: Rewrite, search: Callable[[int], list]) -> list | None:
        stats = self.stats.setdefault(rule.name, _BackoffStats())
        if iteration < stats.banned_until:
            return None
        threshold = self.match_limit << stats.times_banned
        matches = search(threshold)
        if len(matches) > threshold:
            stats.banned_until = iteration + (self.ban_length << stats.times_banned)
            stats.times_banned += 1
            return None
        stats.times_applied += 1
        return matches

    def can_stop(self, iteration: int) -> bool:
        banned = [s for s in self.stats.values() if s.banned_until > iteration]
        if not banned:
            return True
        delta = min(s.banned_until for s in banned) - iteration
        for s in banned:
            s.banned_until -= delta
        return False


@dataclass
class Iteration:
    """What one iteration did."""

    index: int
    nodes: int
    classes: int
    applied: dict[str, int]
    search_time: float
    apply_time: float
    rebuild_time: float
    repairs: int


@dataclass
class RuleStats:
    """Totals for one rule over a run (``skipped``: iterations a scheduler banned it)."""

    searches: int = 0
    matches: int = 0
    applied: int = 0
    skipped: int = 0
    search_time: float = 0.0
    apply_time: float = 0.0


@dataclass
class Report:
    """What a saturation run did; ``str(report)`` prints a summary table."""

    stop_reason: str | None = None
    iterations: list[Iteration] = field(default_factory=list)
    rules: dict[str, RuleStats] = field(default_factory=dict)
    total_time: float = 0.0
    nodes: int = 0
    classes: int = 0
    extraction: dict[str, Any] | None = None

    @property
    def search_time(self) -> float:
        return sum(i.search_time for i in self.iterations)

    @property
    def apply_time(self) -> float:
        return sum(i.apply_time for i in self.iterations)

    @property
    def rebuild_time(self) -> float:
        return sum(i.rebuild_time for i in self.iterations)

    def __str__(self) -> str:
        lines = [
            f"stop reason: {self.stop_reason}; {len(self.iterations)} iterations, "
            f"{self.nodes} e-nodes, {self.classes} e-classes, {self.total_time:.3f} s "
            f"(search {self.search_time:.3f}, apply {self.apply_time:.3f}, "
            f"rebuild {self.rebuild_time:.3f})",
            f"{'rule':<24}{'matches':>10}{'applied':>10}{'skipped':>8}{'search s':>10}",
        ]
        for name, s in self.rules.items():
            lines.append(
                f"{name:<24}{s.matches:>10}{s.applied:>10}{s.skipped:>8}{s.search_time:>10.4f}"
            )
        if self.extraction:
            lines.append("extraction: " + ", ".join(f"{k}={v}" for k, v in self.extraction.items()))
        return "\n".join(lines)


def flatten_rules(rules: Iterable) -> list[Rewrite]:
    """Rules from nested lists (``birewrite`` returns two); names must be unique."""
    out: list[Rewrite] = []
    stack = [rules]
    while stack:
        item = stack.pop()
        if isinstance(item, Rewrite):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            raise TypeError(
                f"expected Rewrite rules (from rewrite() or birewrite()), got {type(item).__name__}"
            )
    seen: set[str] = set()
    for r in out:
        if r.name in seen:
            raise ValueError(f"two rules are named {r.name!r}: rule names must be unique")
        seen.add(r.name)
    return out


def goal_met(egraph: EGraph, a, b) -> bool:
    """Whether the goal pair ``(a, b)`` holds: equal classes, or, where one side is a
    pattern (a term with ``?vars``), that pattern matches in the other side's class (egg's
    goals given as patterns).

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> root = eg.add("(f x)")
    >>> goal_met(eg, root, "(f ?any)"), goal_met(eg, root, "(f y)")
    (True, False)
    """
    if _is_pattern(a):
        a, b = b, a
    if not _is_pattern(b):
        return egraph.equiv(a, b)
    egraph.rebuild()
    cid = egraph.class_of(a)
    return cid is not None and bool(Pattern.of(b).search_tuples(egraph, [cid], limit=0))


def _is_pattern(side) -> bool:
    if isinstance(side, str):
        return "?" in side and not parse(side).is_ground
    return isinstance(side, Term) and not side.is_ground


class Runner:
    """Runs rules on an e-graph under limits; :meth:`EGraph.saturate` is the usual entry."""

    def __init__(self, iter_limit: int = 30, node_limit: int = 10_000, time_limit: float = 5.0,
                 scheduler=None, goals=None, incremental: bool = True):
        for name, value in (("iter_limit", iter_limit), ("node_limit", node_limit)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not time_limit > 0:
            raise ValueError(f"time_limit must be positive seconds, got {time_limit!r}")
        self.iter_limit = iter_limit
        self.node_limit = node_limit
        self.time_limit = time_limit
        self.scheduler = scheduler if scheduler is not None else BackoffScheduler()
        self.goals = list(goals or [])
        self.incremental = incremental

    def _goals_met(self, egraph: EGraph) -> bool:
        return bool(self.goals) and all(goal_met(egraph, a, b) for a, b in self.goals)

    def run(self, egraph: EGraph, rules) -> Report:
        """Saturate ``egraph`` with ``rules``; the report is also ``egraph.report``.

        Python's cyclic garbage collector is paused for the run: an e-graph is millions
        of small lists and tuples with no cycles, and the collector's passes over them
        cost as much as saturation itself (45% of the growth benchmark). Cyclic garbage
        a guard or analysis makes meanwhile is collected once the run ends.
        """
        with gc_paused():
            return self._run(egraph, rules)

    def _run(self, egraph: EGraph, rules) -> Report:
        rules = flatten_rules(rules)
        clock = time.perf_counter
        start = clock()
        deadline = start + self.time_limit
        report = Report(rules={r.name: RuleStats() for r in rules})
        egraph.report = report
        egraph.rebuild()
        watch = SaturationLog(report, self.iter_limit)  # DEBUG lines, progress past 2 s
        # Per rule: (position in the change log, number of e-nodes) at its last complete
        # search; None means search everything.
        positions: list[tuple[int, int] | None] = [None] * len(rules)
        memo = egraph.hashcons
        stop = None
        iteration = 0
        while stop is None:
            stop = self._limit_reached(egraph, iteration, deadline, clock)
            if stop:
                break
            size_before = (len(memo), egraph.num_classes)
            t0 = clock()
            mark = (len(egraph.change_log), egraph.num_created)
            reaches: dict[tuple[int, int], list | None] = {}
            found: list[list | None] = []
            for i, rule in enumerate(rules):
                rs = report.rules[rule.name]
                ts = clock()
                roots = (self._roots(egraph, rule, positions[i], reaches) if self.incremental
                         else None)
                matches = self.scheduler.search(
                    iteration, rule, lambda limit, rule=rule, roots=roots: rule.search(
                        egraph, roots, limit)
                )
                rs.search_time += clock() - ts
                if matches is None:
                    rs.skipped += 1
                else:
                    rs.searches += 1
                    rs.matches += len(matches)
                found.append(matches)
                if clock() > deadline:
                    stop = "time_limit"
                    break
            reaches.clear()  # its sets can be half the e-graph: free them before applying
            t1 = clock()
            applied: dict[str, int] = {}
            if stop is None:
                applied, stop = self._apply(egraph, rules, found, positions, mark, deadline,
                                            clock)
            t2 = clock()
            repairs = egraph.rebuild()
            t3 = clock()
            self._trim_log(egraph, positions)
            report.iterations.append(Iteration(
                iteration, len(memo), egraph.num_classes, applied, t1 - t0, t2 - t1, t3 - t2,
                repairs,
            ))
            watch.iteration()
            if stop is None and not applied and self.scheduler.can_stop(iteration) and (
                size_before == (len(memo), egraph.num_classes)
            ):
                stop = "saturated"
            iteration += 1
        egraph.compact()
        report.stop_reason = stop
        report.total_time = clock() - start
        report.nodes = egraph.num_nodes
        report.classes = egraph.num_classes
        watch.done()
        return report

    def _limit_reached(self, egraph: EGraph, iteration: int, deadline: float,
                       clock: Callable[[], float]) -> str | None:
        """The limit that ends the run before iteration ``iteration`` (a stop reason), or
        None to go on."""
        if iteration >= self.iter_limit:
            return "iter_limit"
        if len(egraph.hashcons) > self.node_limit:
            return "node_limit"
        if clock() > deadline:
            return "time_limit"
        if self._goals_met(egraph):
            return "goal"
        return None

    def _apply(self, egraph: EGraph, rules: list[Rewrite], found: list[list | None],
               positions: list[tuple[int, int] | None], mark: tuple[int, int],
               deadline: float, clock: Callable[[], float]) -> tuple[dict[str, int], str | None]:
        """Apply each rule's matches of this iteration, recording per rule its time, its
        merges and the e-nodes it added, and moving a rule whose application completed to
        ``mark`` in ``positions``. Returns the merges per rule, and the limit that cut the
        application short (None: every rule was applied)."""
        report = egraph.report
        applied: dict[str, int] = {}
        for i, (rule, matches) in enumerate(zip(rules, found)):
            if matches is None:
                continue
            ta, first = clock(), egraph.num_created
            merged, complete = rule.apply(egraph, matches, self.node_limit, deadline, clock)
            report.rules[rule.name].apply_time += clock() - ta
            if egraph.num_created > first:
                egraph.origins.append((first, egraph.num_created, rule.name))
            if merged:
                applied[rule.name] = merged
                report.rules[rule.name].applied += merged
            if complete:
                positions[i] = mark
            else:
                over = len(egraph.hashcons) > self.node_limit
                return applied, "node_limit" if over else "time_limit"
        return applied, None

    @staticmethod
    def _trim_log(egraph: EGraph, positions: list[tuple[int, int] | None]) -> None:
        if not positions or any(p is None for p in positions):
            return
        low = min(p[0] for p in positions)
        if low:
            egraph.forget_changes(low)
            positions[:] = [(p[0] - low, p[1]) for p in positions]

    @staticmethod
    def _roots(egraph: EGraph, rule: Rewrite, position: tuple[int, int] | None,
               reaches: dict) -> set[int] | None:
        """Classes where a new match of ``rule`` can be rooted, or None for all of them.

        A new match touches a class that changed since the rule's last search (a new
        e-node, a merge, new analysis data), at most ``rule.depth`` parent steps below
        its root. New e-nodes are the ids past the recorded node count. ``reaches`` keeps,
        per position, the classes within each number of parent steps: rules searched
        from the same position share them within an iteration.
        """
        if position is None or not hasattr(rule.lhs, "term"):
            return None
        if position not in reaches:
            reaches[position] = _changed_since(egraph, position)
        levels = reaches[position]
        if levels is None:
            return None
        op = rule.root_op
        if op is None:
            return levels[0][0]
        reach = _within(egraph, levels, rule.depth)
        if reach is None:
            return None
        every = egraph.classes_with_op(op)
        if len(reach) > 2 * len(every):
            return None
        return reach & every


def _changed_since(egraph: EGraph, position: tuple[int, int]) -> list | None:
    """``[(changed, changed)]``: the classes changed since ``position``, as the first of
    the ``(reach, frontier)`` levels :func:`_within` extends; None when most changed."""
    log_pos, node_mark = position
    log = egraph.change_log
    created = egraph.num_created
    num_new = len(log) - log_pos + created - node_mark
    if num_new * 2 > egraph.num_classes:
        return None
    find = egraph.union_find.find
    changed = {find(c) for c in log[log_pos:]}
    changed.update([find(c) for c in range(node_mark, created)])
    return [(changed, changed)]


def _within(egraph: EGraph, levels: list, depth: int) -> set[int] | None:
    """The classes at most ``depth`` parent steps above a changed class (None: most of
    the e-graph), extending the cached ``levels`` as far as needed."""
    uf = egraph.union_find
    find, P = uf.find, uf.parents
    parents = egraph.node_parents
    while len(levels) <= depth:
        last = levels[-1]
        if last is None:
            return None
        reach, frontier = last
        if not frontier:
            return reach
        step: set[int] = set()
        for c in frontier:
            plist = parents[c]
            if plist:
                step.update([p if P[p] == p else find(p) for p in plist])
        frontier = step - reach
        reach = reach | frontier
        levels.append((reach, frontier) if len(reach) * 2 <= egraph.num_classes else None)
    last = levels[depth]
    return None if last is None else last[0]
