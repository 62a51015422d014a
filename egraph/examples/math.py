"""egg's math suite: arithmetic, differentiation and integration rules with constant folding.

A faithful port of egg's ``tests/math.rs``: the same rules (guards included), the same
cases with their limits, and egg's ``MathCostFn`` (``d`` and ``i`` cost 100 so extraction
gets rid of them). Used by the test suite, the benchmark and the engine demo.

>>> from egraph import EGraph
>>> case = CASES["math_diff_simple1"]
>>> eg = case.run()
>>> eg.report.stop_reason, eg.equiv(eg.roots[0], case.goals[0])
('goal', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egraph.analysis import ConstantFolding
from egraph.egraph import EGraph
from egraph.extract import AstSize
from egraph.pattern import Subst
from egraph.rewrite import Rewrite, rewrite
from egraph.run import BackoffScheduler, SimpleScheduler
from egraph.term import Term, parse


def _is_symbol(egraph: EGraph, cid: int) -> bool:
    return any(not n.children and type(n.op) is str for n in egraph.nodes(cid))


def is_not_zero(var: str):
    """Guard: the class of ``?var`` is not the constant 0 (unknown values pass, as in egg)."""
    def guard(egraph: EGraph, subst: Subst) -> bool:
        return egraph.data(subst[var]) != 0
    guard.__name__ = f"is_not_zero({var})"
    return guard


def is_sym(var: str):
    """Guard: the class of ``?var`` contains a symbol."""
    def guard(egraph: EGraph, subst: Subst) -> bool:
        return _is_symbol(egraph, subst[var])
    guard.__name__ = f"is_sym({var})"
    return guard


def is_const(var: str):
    """Guard: the class of ``?var`` folded to a constant."""
    def guard(egraph: EGraph, subst: Subst) -> bool:
        return egraph.data(subst[var]) is not None
    guard.__name__ = f"is_const({var})"
    return guard


def is_const_or_distinct_var(v: str, w: str):
    """Guard: ``?v`` and ``?w`` differ, and ``?v`` is a constant or holds a symbol."""
    def guard(egraph: EGraph, subst: Subst) -> bool:
        a, b = subst[v], subst[w]
        return egraph.find(a) != egraph.find(b) and (
            egraph.data(a) is not None or _is_symbol(egraph, a)
        )
    guard.__name__ = f"is_const_or_distinct_var({v}, {w})"
    return guard


def all_of(*guards):
    """Guard: every one of ``guards`` holds (egg's stacked ``if`` clauses)."""
    def guard(egraph: EGraph, subst: Subst) -> bool:
        return all(g(egraph, subst) for g in guards)
    guard.__name__ = " and ".join(g.__name__ for g in guards)
    return guard


def rules() -> list[Rewrite]:
    """egg's math rules, in egg's order."""
    return [
        rewrite("comm-add", "(+ ?a ?b)", "(+ ?b ?a)"),
        rewrite("comm-mul", "(* ?a ?b)", "(* ?b ?a)"),
        rewrite("assoc-add", "(+ ?a (+ ?b ?c))", "(+ (+ ?a ?b) ?c)"),
        rewrite("assoc-mul", "(* ?a (* ?b ?c))", "(* (* ?a ?b) ?c)"),
        rewrite("sub-canon", "(- ?a ?b)", "(+ ?a (* -1 ?b))"),
        rewrite("div-canon", "(/ ?a ?b)", "(* ?a (pow ?b -1))", when=is_not_zero("b")),
        rewrite("zero-add", "(+ ?a 0)", "?a"),
        rewrite("zero-mul", "(* ?a 0)", "0"),
        rewrite("one-mul", "(* ?a 1)", "?a"),
        rewrite("add-zero", "?a", "(+ ?a 0)"),
        rewrite("mul-one", "?a", "(* ?a 1)"),
        rewrite("cancel-sub", "(- ?a ?a)", "0"),
        rewrite("cancel-div", "(/ ?a ?a)", "1", when=is_not_zero("a")),
        rewrite("distribute", "(* ?a (+ ?b ?c))", "(+ (* ?a ?b) (* ?a ?c))"),
        rewrite("factor", "(+ (* ?a ?b) (* ?a ?c))", "(* ?a (+ ?b ?c))"),
        rewrite("pow-mul", "(* (pow ?a ?b) (pow ?a ?c))", "(pow ?a (+ ?b ?c))"),
        rewrite("pow0", "(pow ?x 0)", "1", when=is_not_zero("x")),
        rewrite("pow1", "(pow ?x 1)", "?x"),
        rewrite("pow2", "(pow ?x 2)", "(* ?x ?x)"),
        rewrite("pow-recip", "(pow ?x -1)", "(/ 1 ?x)", when=is_not_zero("x")),
        rewrite("recip-mul-div", "(* ?x (/ 1 ?x))", "1", when=is_not_zero("x")),
        rewrite("d-variable", "(d ?x ?x)", "1", when=is_sym("x")),
        rewrite("d-constant", "(d ?x ?c)", "0",
                when=all_of(is_sym("x"), is_const_or_distinct_var("c", "x"))),
        rewrite("d-add", "(d ?x (+ ?a ?b))", "(+ (d ?x ?a) (d ?x ?b))"),
        rewrite("d-mul", "(d ?x (* ?a ?b))", "(+ (* ?a (d ?x ?b)) (* ?b (d ?x ?a)))"),
        rewrite("d-sin", "(d ?x (sin ?x))", "(cos ?x)"),
        rewrite("d-cos", "(d ?x (cos ?x))", "(* -1 (sin ?x))"),
        rewrite("d-ln", "(d ?x (ln ?x))", "(/ 1 ?x)", when=is_not_zero("x")),
        rewrite("d-power", "(d ?x (pow ?f ?g))",
                "(* (pow ?f ?g) (+ (* (d ?x ?f) (/ ?g ?f)) (* (d ?x ?g) (ln ?f))))",
                when=all_of(is_not_zero("f"), is_not_zero("g"))),
        rewrite("i-one", "(i 1 ?x)", "?x"),
        rewrite("i-power-const", "(i (pow ?x ?c) ?x)", "(/ (pow ?x (+ ?c 1)) (+ ?c 1))",
                when=is_const("c")),
        rewrite("i-cos", "(i (cos ?x) ?x)", "(sin ?x)"),
        rewrite("i-sin", "(i (sin ?x) ?x)", "(* -1 (cos ?x))"),
        rewrite("i-sum", "(i (+ ?f ?g) ?x)", "(+ (i ?f ?x) (i ?g ?x))"),
        rewrite("i-dif", "(i (- ?f ?g) ?x)", "(- (i ?f ?x) (i ?g ?x))"),
        rewrite("i-parts", "(i (* ?a ?b) ?x)",
                "(- (* ?a (i ?b ?x)) (i (* (d ?x ?a) (i ?b ?x)) ?x))"),
    ]


class MathCost:
    """egg's ``MathCostFn``: ``d`` and ``i`` cost 100, everything else 1, plus children."""

    def __call__(self, enode, child_costs: list) -> int:
        return (100 if enode.op in ("d", "i") else 1) + sum(child_costs)


@dataclass
class Case:
    """One of egg's math test cases: start term, goals, runner limits."""

    name: str
    start: str
    goal_texts: list[str]
    iter_limit: int = 30
    node_limit: int = 10_000
    time_limit: float = 5.0
    add_goals_first: bool = False
    stop_at_goals: bool = True
    scheduler: str = "backoff"
    rules: list[str] | None = None
    analysis: bool = True
    goals: list[Term] = field(init=False)

    def __post_init__(self) -> None:
        self.goals = [parse(g) for g in self.goal_texts]

    def run(self, incremental: bool = True, explanations: bool = False) -> EGraph:
        """A fresh e-graph with the start term, saturated under the case's limits."""
        eg = EGraph(analysis=ConstantFolding() if self.analysis else None,
                    explanations=explanations)
        if self.add_goals_first:
            for g in self.goals:
                eg.add(g)
        root = eg.add(parse(self.start), root=True)
        chosen = rules()
        if self.rules is not None:
            chosen = [r for r in chosen if r.name in self.rules]
        scheduler = BackoffScheduler() if self.scheduler == "backoff" else SimpleScheduler()
        goals = [(root, g) for g in self.goals] if self.stop_at_goals else None
        return eg.saturate(chosen, iter_limit=self.iter_limit, node_limit=self.node_limit,
                           time_limit=self.time_limit, scheduler=scheduler, goals=goals,
                           incremental=incremental)


_CASES = [
    Case("math_associate_adds", "(+ 1 (+ 2 (+ 3 (+ 4 (+ 5 (+ 6 7))))))",
         ["(+ 7 (+ 6 (+ 5 (+ 4 (+ 3 (+ 2 1))))))"], iter_limit=7, stop_at_goals=False,
         scheduler="simple", rules=["comm-add", "assoc-add"], analysis=False),
    Case("math_simplify_add", "(+ x (+ x (+ x x)))", ["(* 4 x)"]),
    Case("math_powers", "(* (pow 2 x) (pow 2 y))", ["(pow 2 (+ x y))"]),
    Case("math_simplify_const", "(+ 1 (- a (* (- 2 1) a)))", ["1"]),
    Case("math_simplify_root",
         "(/ 1 (- (/ (+ 1 (sqrt five)) 2) (/ (- 1 (sqrt five)) 2)))",
         ["(/ 1 (sqrt five))"], node_limit=75_000),
    Case("math_simplify_factor", "(* (+ x 3) (+ x 1))", ["(+ (+ (* x x) (* 4 x)) 3)"]),
    Case("math_diff_same", "(d x x)", ["1"]),
    Case("math_diff_different", "(d x y)", ["0"]),
    Case("math_diff_simple1", "(d x (+ 1 (* 2 x)))", ["2"]),
    Case("math_diff_simple2", "(d x (+ 1 (* y x)))", ["y"]),
    Case("math_diff_ln", "(d x (ln x))", ["(/ 1 x)"]),
    Case("diff_power_simple", "(d x (pow x 3))", ["(* 3 (pow x 2))"]),
    Case("diff_power_harder", "(d x (- (pow x 3) (* 7 (pow x 2))))",
         ["(* x (- (* 3 x) 14))"], iter_limit=60, node_limit=100_000, time_limit=10.0,
         add_goals_first=True),
    Case("integ_one", "(i 1 x)", ["x"]),
    Case("integ_sin", "(i (cos x) x)", ["(sin x)"]),
    Case("integ_x", "(i (pow x 1) x)", ["(/ (pow x 2) 2)"]),
    Case("integ_part1", "(i (* x (cos x)) x)", ["(+ (* x (sin x)) (cos x))"]),
    Case("integ_part2", "(i (* (cos x) x) x)", ["(+ (* x (sin x)) (cos x))"]),
    Case("integ_part3", "(i (ln x) x)", ["(- (* x (ln x)) x)"]),
]

CASES: dict[str, Case] = {c.name: c for c in _CASES}
"""egg's math test cases by name (math_fail, which egg expects to fail, is in the tests)."""


def simplify(text: str, iter_limit: int = 30, node_limit: int = 10_000) -> tuple[Term, int]:
    """Saturate ``text`` with the math rules and extract the smallest equivalent term.

    >>> simplify("(+ x (+ x (+ x x)))")
    (Term('(* x 4)'), 3)
    """
    eg = EGraph(analysis=ConstantFolding())
    root = eg.add(parse(text), root=True)
    eg.saturate(rules(), iter_limit=iter_limit, node_limit=node_limit)
    return eg.extract(AstSize(), root=root)
