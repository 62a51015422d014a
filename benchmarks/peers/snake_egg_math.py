"""Peer adapter: egg's math suite and the growth run on ``snake-egg`` (0.1.0).

snake-egg wraps egg 0.9.2.  What its Python API offers, and how this adapter
uses it:

* Terms are Python objects: an operator is a namedtuple class (one per egg
  operator), constants are ``float`` leaves and symbols are ``str`` leaves.
* ``EGraph.run`` always builds ``Runner::default()``, i.e. egg's
  ``BackoffScheduler`` with its defaults (match limit 1000, ban length 5); the
  scheduler cannot be changed, so the growth run uses it too.  It takes
  iteration, node and time limits, returns nothing, and has no hooks, so it
  cannot stop when the goals are proven: every case runs to its limits (or to
  saturation) and the goals are checked afterwards with ``EGraph.equiv``.
* The e-class analysis is a Python ``eval(head, child_data)`` callback whose
  non-``None`` result is unioned back into the class as a leaf.  It gives
  egg's constant folding.  Symbol leaves evaluate to themselves (unioning a
  symbol leaf into its own class is a no-op), so guards can see symbols.
* A rewrite's right-hand side may be a Python callable.  It receives the
  analysis data of every pattern variable as keyword arguments and returns the
  pattern to instantiate.  Guards are built on that: when a guard fails the
  callable returns the rule's own left-hand side, which is already in the
  matched class, so nothing changes.
* snake-egg 0.1.0's ``merge`` of analysis data never copies data from the
  absorbed class (it filters for ``None`` instead of for not-``None``), so a
  class whose surviving root had no data keeps none after a union, and its
  parents are not re-folded.  Constant folding and the guards therefore see
  only the data each class's root had when it was created; ``not_zero`` can
  pass on a class that is in fact 0.  As a soundness canary the note says
  when 0 and 1 ended up in one class.
* No size accessors exist; sizes are measured after the timed run.  egg's
  runner refuses to start an iteration when ``total_size()`` (the hashcons
  size, which keeps stale entries and is what egg's node limit uses) exceeds
  ``node_limit``, so a binary search with one-iteration runs of a rule that
  matches a probe node reads ``total_size()``.  Canonical e-nodes and
  e-classes are counted with no-op rules (one per operator, one per possible
  leaf, ``?c`` for classes) whose callables count their matches; that costs
  a Python call per e-node, so ``run_growth`` reports ``total_size()``.
* Iterations are counted by one extra rule whose left-hand side is the start
  term itself and whose callable returns that term unchanged: it matches once
  per iteration and never alters the e-graph.  The stop reason is inferred
  from the limits and that count.
"""

from __future__ import annotations

import time
from collections import namedtuple
from collections.abc import Callable

from .math_cases import (
    GROWTH_ITER_LIMIT,
    GROWTH_RULES,
    GROWTH_START,
    MATH_CASES,
    MATH_RULES,
    MATH_RULES_BY_NAME,
    SExpr,
    is_var,
    parse_sexpr,
)

try:
    import snake_egg
except ImportError:
    snake_egg = None

AVAILABLE: bool = snake_egg is not None

CASES_SUPPORTED: set[str] = {case["name"] for case in MATH_CASES} if AVAILABLE else set()

DROPPED_RULES: dict[str, str] = {}

_OPS: dict[str, type] = {
    head: namedtuple(name, fields)
    for head, name, fields in [
        ("+", "Add", "a b"),
        ("-", "Sub", "a b"),
        ("*", "Mul", "a b"),
        ("/", "Div", "a b"),
        ("pow", "Pow", "a b"),
        ("ln", "Ln", "a"),
        ("sqrt", "Sqrt", "a"),
        ("sin", "Sin", "a"),
        ("cos", "Cos", "a"),
        ("d", "Diff", "x e"),
        ("i", "Integral", "e x"),
    ]
}
_Probe = namedtuple("_Probe", "")

_FOLD: dict[type, Callable[[float, float], float]] = {
    _OPS["+"]: lambda a, b: a + b,
    _OPS["-"]: lambda a, b: a - b,
    _OPS["*"]: lambda a, b: a * b,
}


def _to_term(expr: SExpr) -> object:
    """Convert a parsed s-expression into snake-egg's term/pattern objects."""
    if isinstance(expr, tuple):
        head, *args = expr
        if head not in _OPS:
            raise ValueError(f"unknown operator {head!r}")
        return _OPS[head](*(_to_term(arg) for arg in args))
    if is_var(expr):
        return snake_egg.Var(expr[1:])
    return expr


def _constant_folder(seen: set) -> Callable[[object, list], object]:
    """egg's ConstantFold ``make`` as snake-egg's analysis callback.

    Constants evaluate to their value; symbols evaluate to themselves so that
    guards can recognise symbol classes; ``+ - *`` fold constant children and
    ``/`` folds when the divisor is not zero.  Every value is recorded in
    ``seen`` so that the constant leaves can be counted afterwards.
    """

    def fold(head: object, child_data: list) -> object:
        if isinstance(head, (int, float)):
            return float(head)
        if isinstance(head, str):
            return head
        if len(child_data) != 2 or not all(isinstance(d, float) for d in child_data):
            return None
        a, b = child_data
        if head in _FOLD:
            value = _FOLD[head](a, b)
        elif head is _OPS["/"] and b != 0.0:
            value = a / b
        else:
            return None
        seen.add(value)
        return value

    return fold


def _not_zero(data: dict, v: str) -> bool:
    value = data[v]
    return not (isinstance(value, float) and value == 0.0)


def _is_sym(data: dict, v: str) -> bool:
    return isinstance(data[v], str)


def _is_const(data: dict, v: str) -> bool:
    return isinstance(data[v], float)


def _is_const_or_distinct_var(data: dict, c: str, x: str) -> bool:
    # Classes differ whenever their data differ, and a constant or a symbol
    # lives in exactly one class, so equal data means the same class.
    value = data[c]
    return isinstance(value, (float, str)) and value != data[x]


_GUARDS: dict[str, Callable[..., bool]] = {
    "not_zero": _not_zero,
    "is_sym": _is_sym,
    "is_const": _is_const,
    "is_const_or_distinct_var": _is_const_or_distinct_var,
}


def _guarded_applier(lhs: object, rhs: object, guards: list[tuple[str, ...]]) -> Callable:
    checks = [(_GUARDS[kind], [v[1:] for v in args]) for kind, *args in guards]

    def apply(**data: object) -> object:
        if all(check(data, *names) for check, names in checks):
            return rhs
        return lhs

    return apply


def _make_rewrite(rule: dict) -> object:
    lhs = _to_term(parse_sexpr(rule["lhs"]))
    rhs = _to_term(parse_sexpr(rule["rhs"]))
    if rule["guards"]:
        rhs = _guarded_applier(lhs, rhs, rule["guards"])
    return snake_egg.Rewrite(lhs, rhs, rule["name"])


_REWRITES: dict[str, object] = {}


def _rewrites(names: list[str]) -> list:
    for name in names:
        if name not in _REWRITES:
            _REWRITES[name] = _make_rewrite(MATH_RULES_BY_NAME[name])
    return [_REWRITES[name] for name in names]


def _iteration_counter(start: object) -> tuple[object, list[int]]:
    count = [0]

    def tick() -> object:
        count[0] += 1
        return start

    return snake_egg.Rewrite(start, tick, "iteration-counter"), count


def _count_hashcons(egraph: object, hint: int) -> int:
    """Return egg's ``total_size()`` (hashcons entries) by probing the node limit.

    egg's runner refuses to start an iteration when ``total_size() >
    node_limit``, so a one-iteration run of a rule matching only the probe
    node fires exactly when ``total_size() <= node_limit``.
    """
    egraph.add(_Probe())
    fired = [False]

    def mark() -> object:
        fired[0] = True
        return _Probe()

    probe = [snake_egg.Rewrite(_Probe(), mark, "size-probe")]

    def fits(limit: int) -> bool:
        fired[0] = False
        egraph.run(probe, iter_limit=1, time_limit=1e9, node_limit=limit)
        return fired[0]

    lo, hi = 0, max(hint, 1)
    while not fits(hi):
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi - 1


def _count_exact(egraph: object, leaves: set) -> tuple[int, int]:
    """Return (canonical e-nodes, e-classes) by counting no-op rule matches.

    One rule per operator ``(op ?v0 ...)``, one per possible leaf, and ``?c``
    for the classes; each returns its own left-hand side, so nothing changes.
    The backoff scheduler bans a rule while it has too many matches and
    doubles its limit each time, so every rule is eventually applied; a
    ``tick`` rule that matches the probe node numbers the iterations, and each
    rule's count is taken from the first iteration in which it was applied.
    """
    egraph.add(_Probe())
    iteration = [0]
    per_rule: dict[str, dict[int, int]] = {}

    def tick() -> object:
        iteration[0] += 1
        return _Probe()

    def counter(key: str, pattern: object) -> Callable:
        def count(**_data: object) -> object:
            by_iteration = per_rule.setdefault(key, {})
            by_iteration[iteration[0]] = by_iteration.get(iteration[0], 0) + 1
            return pattern

        return count

    patterns: dict[str, object] = {"classes": snake_egg.Var("c")}
    for op in _OPS.values():
        patterns[op.__name__] = op(*(snake_egg.Var(f"v{i}") for i in range(len(op._fields))))
    for index, leaf in enumerate(leaves):
        patterns[f"leaf{index}"] = leaf
    rules = [snake_egg.Rewrite(_Probe(), tick, "count-tick")]
    rules += [
        snake_egg.Rewrite(pattern, counter(key, pattern), f"count-{key}")
        for key, pattern in patterns.items()
    ]
    egraph.run(rules, iter_limit=1_000_000, time_limit=1e9, node_limit=1 << 62)

    counts = {key: by_iteration[min(by_iteration)] for key, by_iteration in per_rule.items()}
    classes = counts.pop("classes") - 1
    return sum(counts.values()), classes


def _leaves(expr: SExpr, out: set) -> set:
    if isinstance(expr, tuple):
        for arg in expr[1:]:
            _leaves(arg, out)
    elif not is_var(expr):
        out.add(expr)
    return out


def _unavailable() -> RuntimeError:
    return RuntimeError("snake-egg is not installed")


def run_case(
    start: str,
    goals: list[str],
    iter_limit: int = 30,
    node_limit: int = 10_000,
    time_limit: float = 5.0,
    *,
    add_goals_first: bool = False,
) -> dict:
    """Run one math case on snake-egg and report time, size and proof status.

    Builds a fresh e-graph (goal terms first when ``add_goals_first``, as egg's
    ``diff_power_harder`` does), runs all of egg's math rules with egg's
    BackoffScheduler under the given limits, then checks that every goal is in
    the start term's class.  snake-egg cannot stop early on proven goals, so
    the run always goes to a limit or to saturation.
    """
    if not AVAILABLE:
        raise _unavailable()
    parsed = [parse_sexpr(text) for text in [start, *goals]]
    leaves: set = set()
    for expr in parsed:
        _leaves(expr, leaves)
    for rule in MATH_RULES:
        _leaves(parse_sexpr(rule["lhs"]), leaves)
        _leaves(parse_sexpr(rule["rhs"]), leaves)
    start_term, *goal_terms = (_to_term(expr) for expr in parsed)
    counter, iterations = _iteration_counter(start_term)
    rules = [*_rewrites([rule["name"] for rule in MATH_RULES]), counter]

    t0 = time.perf_counter()
    egraph = snake_egg.EGraph(_constant_folder(leaves))
    if add_goals_first:
        for goal in goal_terms:
            egraph.add(goal)
    egraph.add(start_term)
    egraph.run(rules, iter_limit=iter_limit, time_limit=time_limit, node_limit=node_limit)
    elapsed = time.perf_counter() - t0

    hashcons = _count_hashcons(egraph, node_limit)
    nodes, classes = _count_exact(egraph, leaves)
    proved = all(egraph.equiv(start_term, goal) for goal in goal_terms)
    if hashcons > node_limit:
        stop_reason = "node_limit"
    elif elapsed >= time_limit:
        stop_reason = "time_limit"
    elif iterations[0] >= iter_limit:
        stop_reason = "iter_limit"
    else:
        stop_reason = "saturated"
    note = (
        f"{iterations[0]} iterations, BackoffScheduler(1000, 5), no early stop on goals; "
        f"egg total_size (hashcons, limit basis) {hashcons}; stop_reason inferred"
    )
    if egraph.equiv(0.0, 1.0):
        note += "; UNSOUND: 0 and 1 were merged"
    return {
        "time_s": elapsed,
        "nodes": nodes,
        "classes": classes,
        "proved": proved,
        "stop_reason": stop_reason,
        "note": note,
    }


def run_growth(target_nodes: int = 1_000_000, time_limit: float = 120.0) -> dict:
    """Grow the growth workload on snake-egg until ``target_nodes`` e-nodes.

    Uses only the GROWTH_RULES, iteration limit 100 and node limit
    ``target_nodes``.  snake-egg always uses egg's BackoffScheduler (it cannot
    select SimpleScheduler), and no analysis is attached (none is needed).
    """
    if not AVAILABLE:
        raise _unavailable()
    start_term = _to_term(parse_sexpr(GROWTH_START))
    rules = _rewrites(GROWTH_RULES)

    t0 = time.perf_counter()
    egraph = snake_egg.EGraph()
    egraph.add(start_term)
    egraph.run(rules, iter_limit=GROWTH_ITER_LIMIT, time_limit=time_limit, node_limit=target_nodes)
    elapsed = time.perf_counter() - t0

    nodes = _count_hashcons(egraph, target_nodes)
    return {
        "time_s": elapsed,
        "nodes": nodes,
        "nodes_per_s": nodes / elapsed if elapsed > 0 else None,
        "note": (
            "egg BackoffScheduler(1000, 5) (SimpleScheduler not selectable), no analysis; "
            "nodes = egg total_size (hashcons, includes stale entries)"
        ),
    }
