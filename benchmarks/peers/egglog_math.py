"""Peer adapter: egg's math suite and the growth run on ``egglog`` (13.x).

The adapter drives egglog through its low-level ``egglog.bindings.EGraph``
and generates egglog-language programs.  How egg's setup maps onto egglog:

* Terms: ``(datatype Math (Num f64) (Sym String) (Add Math Math) ...)``; egglog's
  ``f64`` treats -0.0 and 0.0 as equal, like egg's ``NotNan``.
* Analysis: egglog has no e-class analysis hook, so egg's ConstantFold is
  written as rules in an ``analysis`` ruleset that is run to saturation before
  every rewrite iteration (so it is up to date whenever rewrites search, as
  egg's analysis is after a rebuild): ``(Add (Num a) (Num b))`` is unioned
  with ``(Num (+ a b))``, likewise ``-`` and ``*``, and ``/`` when the divisor
  is not 0.  A class "has a folded constant" exactly when it contains a
  ``Num`` node.  The same ruleset keeps ``(MathU e)`` for every e-class (one
  rule per constructor), which lets ``add-zero``/``mul-one`` (left-hand side
  ``?a``) match once per e-class as in egg, and ``(ConstOrSym e)`` for classes
  holding a ``Num`` or ``Sym`` node.
* Guards become query atoms checked when the rule matches, like egg's
  conditions: ``not_zero(v)`` is ``(!= v (Num 0.0))`` (the class is not the
  class of the constant 0; ``(Num 0.0)`` is therefore added to every e-graph
  up front, since the atom needs it to exist), ``is_sym(v)`` is
  ``(= v (Sym s))``, ``is_const(v)`` is ``(= v (Num k))`` and
  ``is_const_or_distinct_var(c, x)`` is ``(ConstOrSym c) (!= c x)``.  No rule
  is dropped.  Unlike egg, egglog counts only guard-passing matches towards
  the backoff scheduler's match limit.
* Scheduling: egglog-experimental's ``back-off`` scheduler with egg's
  defaults, ``(back-off :match-limit 1000 :ban-length 5)``, all iterations in
  one ``run-schedule`` so that its state persists.  The growth run uses
  egglog's plain ``run`` (every match applied: egg's SimpleScheduler).
* Stopping (math cases): a zero-ary relation ``Stop`` is derived by an
  analysis rule when every goal is in the start term's class, and by a
  ``set-stop`` ruleset that is run whenever ``(get-size! <Math tables>)``
  exceeds the node limit; each rewrite iteration is
  ``(run-with bo math :until (Stop))``.  Both checks happen between
  iterations only (egg also checks the node limit after each rule).  egglog
  has no time limit, and the back-off state lives only inside one
  ``run-schedule`` command, so ``time_limit`` is not enforced.  ``repeat``
  does not stop on saturation, so a saturated run reports ``iter_limit``.
  Iterations are counted by a ``tick`` ruleset run alongside each rewrite
  step (a ``Tick`` relation that grows by one row per run).
* Counting: e-nodes are the rows of the ``Math`` constructor tables (canonical
  after egglog's rebuild) and e-classes are the rows of ``MathU``.
"""

from __future__ import annotations

import itertools
import time

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
    from egglog import bindings
except ImportError:
    bindings = None

AVAILABLE: bool = bindings is not None

CASES_SUPPORTED: set[str] = {case["name"] for case in MATH_CASES} if AVAILABLE else set()

DROPPED_RULES: dict[str, str] = {}

_CONSTRUCTORS: dict[str, tuple[str, int]] = {
    "+": ("Add", 2),
    "-": ("Sub", 2),
    "*": ("Mul", 2),
    "/": ("Div", 2),
    "pow": ("Pow", 2),
    "ln": ("Ln", 1),
    "sqrt": ("Sqrt", 1),
    "sin": ("Sin", 1),
    "cos": ("Cos", 1),
    "d": ("D", 2),
    "i": ("I", 2),
}
_MATH_TABLES = ["Num", "Sym", *(name for name, _ in _CONSTRUCTORS.values())]

_DATATYPE = "(datatype Math (Num f64) (Sym String) {})".format(
    " ".join(f"({name}{' Math' * arity})" for name, arity in _CONSTRUCTORS.values())
)

_FOLDS = [("Add", "+", ""), ("Sub", "-", ""), ("Mul", "*", ""), ("Div", "/", " (!= b 0.0)")]


def _num(value: float) -> str:
    if value.is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return repr(value)


def _term(expr: SExpr) -> str:
    """Render a parsed s-expression (term or pattern) in egglog syntax."""
    if isinstance(expr, tuple):
        head, *args = expr
        if head not in _CONSTRUCTORS:
            raise ValueError(f"unknown operator {head!r}")
        return f"({_CONSTRUCTORS[head][0]} {' '.join(_term(arg) for arg in args)})"
    if isinstance(expr, float):
        return f"(Num {_num(expr)})"
    if is_var(expr):
        return f"v_{expr[1:]}"
    return f'(Sym "{expr}")'


def _guard_atoms(guards: list[tuple[str, ...]], fresh: itertools.count) -> list[str]:
    atoms = []
    for kind, *args in guards:
        names = [_term(arg) for arg in args]
        if kind == "not_zero":
            atoms.append(f"(!= {names[0]} (Num 0.0))")
        elif kind == "is_sym":
            atoms.append(f"(= {names[0]} (Sym g_{next(fresh)}))")
        elif kind == "is_const":
            atoms.append(f"(= {names[0]} (Num g_{next(fresh)}))")
        elif kind == "is_const_or_distinct_var":
            atoms.append(f"(ConstOrSym {names[0]}) (!= {names[0]} {names[1]})")
        else:
            raise ValueError(f"unknown guard {kind!r}")
    return atoms


def _rule_text(rule: dict, ruleset: str) -> str:
    lhs = parse_sexpr(rule["lhs"])
    rhs = _term(parse_sexpr(rule["rhs"]))
    atoms = _guard_atoms(rule["guards"], itertools.count())
    tail = f':ruleset {ruleset} :name "{rule["name"]}"'
    if is_var(lhs):
        var = _term(lhs)
        body = " ".join([f"(MathU {var})", *atoms])
        return f"(rule ({body}) ((union {var} {rhs})) {tail})"
    when = f" :when ({' '.join(atoms)})" if atoms else ""
    return f"(rewrite {_term(lhs)} {rhs}{when} {tail})"


def _analysis_rules() -> list[str]:
    rules = []
    for name, arity in [("Num", 1), ("Sym", 1), *_CONSTRUCTORS.values()]:
        args = " ".join(f"a{i}" for i in range(arity))
        rules.append(
            f'(rule ((= e ({name} {args}))) ((MathU e)) :ruleset analysis :name "class-{name}")'
        )
    for name, op, extra in _FOLDS:
        rules.append(
            f"(rule ((= e ({name} (Num a) (Num b))){extra}) ((union e (Num ({op} a b)))) "
            f':ruleset analysis :name "fold-{name}")'
        )
    for name in ("Num", "Sym"):
        rules.append(
            f"(rule ((= e ({name} k))) ((ConstOrSym e)) "
            f':ruleset analysis :name "const-or-sym-{name}")'
        )
    return rules


_SIZE = "(get-size! {})".format(" ".join(f'"{name}"' for name in _MATH_TABLES))


def _new_egraph(commands: list[str]) -> object:
    egraph = bindings.EGraph()
    _run(egraph, "\n".join(commands))
    return egraph


def _run(egraph: object, program: str) -> list:
    return egraph.run_program(*egraph.parse_program(program))


def _sizes(egraph: object) -> dict[str, int]:
    (output,) = _run(egraph, "(print-size)")
    return dict(output.sizes)


def _math_size(egraph: object, sizes: dict[str, int] | None = None) -> int:
    sizes = _sizes(egraph) if sizes is None else sizes
    return sum(sizes.get(name, 0) for name in _MATH_TABLES)


def _holds(egraph: object, fact: str) -> bool:
    try:
        _run(egraph, f"(check {fact})")
    except bindings.EggSmolError:
        return False
    return True


def _unavailable() -> RuntimeError:
    return RuntimeError("egglog is not installed")


def run_case(
    start: str,
    goals: list[str],
    iter_limit: int = 30,
    node_limit: int = 10_000,
    time_limit: float = 5.0,
    *,
    add_goals_first: bool = False,
) -> dict:
    """Run one math case on egglog and report time, size and proof status.

    Declares the datatype, analysis and egg's math rules (not timed), then
    times adding the terms (goal terms first when ``add_goals_first``, as
    egg's ``diff_power_harder`` does) and running up to ``iter_limit``
    back-off iterations, stopping early once every goal is in the start
    term's class or the e-graph holds more than ``node_limit`` e-nodes.
    ``time_limit`` cannot be enforced by egglog and is only reported on.
    """
    if not AVAILABLE:
        raise _unavailable()
    goal_terms = [_term(parse_sexpr(goal)) for goal in goals]
    proven = " ".join(f"(= $root {goal})" for goal in goal_terms)
    setup_start = time.perf_counter()
    egraph = _new_egraph(
        [
            _DATATYPE,
            "(relation MathU (Math))",
            "(relation ConstOrSym (Math))",
            "(relation Stop ())",
            "(relation Tick (i64))",
            "(ruleset analysis)",
            "(ruleset tick)",
            "(ruleset math)",
            "(ruleset set-stop)",
            *_analysis_rules(),
            *(_rule_text(rule, "math") for rule in MATH_RULES),
            '(rule () ((Stop)) :ruleset set-stop :name "stop")',
            '(rule ((Tick n)) ((Tick (+ n 1))) :ruleset tick :name "tick")',
            "(Tick 0)",
        ]
    )
    setup = time.perf_counter() - setup_start

    program = [
        *(f"(let $goal{i} {goal})" for i, goal in enumerate(goal_terms) if add_goals_first),
        f"(let $root {_term(parse_sexpr(start))})",
        "(let $zero (Num 0.0))",
        f'(rule ({proven}) ((Stop)) :ruleset analysis :name "goals-proven")',
        "(run-schedule"
        " (let-scheduler bo (back-off :match-limit 1000 :ban-length 5))"
        f" (repeat {iter_limit}"
        "  (saturate (run analysis))"
        f"  (run set-stop :until (<= {_SIZE} {node_limit}))"
        "  (run tick :until (Stop))"
        "  (run-with bo math :until (Stop)))"
        " (saturate (run analysis)))",
    ]
    t0 = time.perf_counter()
    _run(egraph, "\n".join(program))
    elapsed = time.perf_counter() - t0

    sizes = _sizes(egraph)
    nodes = _math_size(egraph, sizes)
    proved = all(_holds(egraph, f"(= $root {goal})") for goal in goal_terms)
    if proved:
        stop_reason = "goals_proven"
    elif nodes > node_limit:
        stop_reason = "node_limit"
    else:
        stop_reason = "iter_limit"
    note = (
        f"{sizes['Tick'] - 1} iterations, back-off(1000, 5), stops on goals; "
        f"setup (declarations) {setup:.3f}s not timed; no time limit"
    )
    if elapsed > time_limit:
        note += f"; exceeded time_limit {time_limit}s (not enforceable)"
    if _holds(egraph, "(= (Num 0.0) (Num 1.0))"):
        note += "; UNSOUND: 0 and 1 were merged"
    return {
        "time_s": elapsed,
        "nodes": nodes,
        "classes": sizes.get("MathU", 0),
        "proved": proved,
        "stop_reason": stop_reason,
        "note": note,
    }


def run_growth(target_nodes: int = 1_000_000, time_limit: float = 120.0) -> dict:
    """Grow the growth workload on egglog until ``target_nodes`` e-nodes.

    Uses only the GROWTH_RULES with egglog's plain ``run`` (every match is
    applied, like egg's SimpleScheduler), one iteration per command so that
    the size and the clock can be checked in between (plain ``run`` keeps no
    scheduler state, so this equals one long run).  Stops after at most 100
    iterations, on saturation, or before an iteration once the e-graph holds
    ``target_nodes`` e-nodes or ``time_limit`` has passed; a running iteration
    cannot be interrupted.
    """
    if not AVAILABLE:
        raise _unavailable()
    egraph = _new_egraph(
        [
            _DATATYPE,
            "(ruleset growth)",
            *(_rule_text(MATH_RULES_BY_NAME[name], "growth") for name in GROWTH_RULES),
        ]
    )
    t0 = time.perf_counter()
    _run(egraph, f"(let $root {_term(parse_sexpr(GROWTH_START))})")
    history = [_math_size(egraph)]
    stop = "iter_limit"
    for _ in range(GROWTH_ITER_LIMIT):
        if history[-1] >= target_nodes:
            stop = "target"
            break
        if time.perf_counter() - t0 >= time_limit:
            stop = "time_limit"
            break
        (output,) = _run(egraph, "(run growth 1)")
        history.append(_math_size(egraph))
        if not output.report.updated:
            stop = "saturated"
            break
    elapsed = time.perf_counter() - t0

    nodes = history[-1]
    return {
        "time_s": elapsed,
        "nodes": nodes,
        "nodes_per_s": nodes / elapsed if elapsed > 0 else None,
        "note": (
            f"egglog run (all matches, = SimpleScheduler), {len(history) - 1} iterations, "
            f"stop {stop}; e-nodes after each: {history[1:]}"
        ),
    }
