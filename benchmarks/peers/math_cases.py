"""Shared workload definitions for the peer-engine benchmarks.

Everything here is plain data plus a tiny s-expression reader, so that our own
engine and every peer adapter run exactly the same cases and rules.

The math suite is egg's ``tests/math.rs``: the rewrite rules (``MATH_RULES``),
their guards, and the test cases (``MATH_CASES``).  Terms use egg's syntax:
``(op arg ...)``, numbers are constants, ``?name`` is a pattern variable and any
other atom is a symbol.
"""

from __future__ import annotations

SExpr = float | str | tuple

DEFAULT_ITER_LIMIT = 30
DEFAULT_NODE_LIMIT = 10_000
DEFAULT_TIME_LIMIT = 5.0


def _case(
    name: str,
    start: str,
    goals: list[str],
    *,
    iter_limit: int = DEFAULT_ITER_LIMIT,
    node_limit: int = DEFAULT_NODE_LIMIT,
    time_limit: float = DEFAULT_TIME_LIMIT,
    add_goals_first: bool = False,
) -> dict:
    return {
        "name": name,
        "start": start,
        "goals": goals,
        "iter_limit": iter_limit,
        "node_limit": node_limit,
        "time_limit": time_limit,
        "add_goals_first": add_goals_first,
    }


MATH_CASES: list[dict] = [
    _case("math_simplify_add", "(+ x (+ x (+ x x)))", ["(* 4 x)"]),
    _case("math_powers", "(* (pow 2 x) (pow 2 y))", ["(pow 2 (+ x y))"]),
    _case("math_simplify_const", "(+ 1 (- a (* (- 2 1) a)))", ["1"]),
    _case(
        "math_simplify_root",
        "(/ 1 (- (/ (+ 1 (sqrt five)) 2) (/ (- 1 (sqrt five)) 2)))",
        ["(/ 1 (sqrt five))"],
        node_limit=75_000,
    ),
    _case("math_simplify_factor", "(* (+ x 3) (+ x 1))", ["(+ (+ (* x x) (* 4 x)) 3)"]),
    _case("math_diff_same", "(d x x)", ["1"]),
    _case("math_diff_different", "(d x y)", ["0"]),
    _case("math_diff_simple1", "(d x (+ 1 (* 2 x)))", ["2"]),
    _case("math_diff_simple2", "(d x (+ 1 (* y x)))", ["y"]),
    _case("math_diff_ln", "(d x (ln x))", ["(/ 1 x)"]),
    _case("diff_power_simple", "(d x (pow x 3))", ["(* 3 (pow x 2))"]),
    _case(
        "diff_power_harder",
        "(d x (- (pow x 3) (* 7 (pow x 2))))",
        ["(* x (- (* 3 x) 14))"],
        iter_limit=60,
        node_limit=100_000,
        time_limit=10.0,
        add_goals_first=True,
    ),
    _case("integ_one", "(i 1 x)", ["x"]),
    _case("integ_sin", "(i (cos x) x)", ["(sin x)"]),
    _case("integ_x", "(i (pow x 1) x)", ["(/ (pow x 2) 2)"]),
    _case("integ_part1", "(i (* x (cos x)) x)", ["(+ (* x (sin x)) (cos x))"]),
    _case("integ_part2", "(i (* (cos x) x) x)", ["(+ (* x (sin x)) (cos x))"]),
    _case("integ_part3", "(i (ln x) x)", ["(- (* x (ln x)) x)"]),
]


def _rule(name: str, lhs: str, rhs: str, *guards: tuple[str, ...]) -> dict:
    return {"name": name, "lhs": lhs, "rhs": rhs, "guards": list(guards)}


# Guards are (kind, var, ...) tuples over pattern variables:
#   ("not_zero", "?v")   the class of ?v has no folded constant equal to 0
#   ("is_sym", "?v")     the class of ?v contains a symbol leaf
#   ("is_const", "?v")   the class of ?v has a folded constant
#   ("is_const_or_distinct_var", "?c", "?x")
#                        find(?c) != find(?x) and ?c is a constant or has a symbol leaf
MATH_RULES: list[dict] = [
    _rule("comm-add", "(+ ?a ?b)", "(+ ?b ?a)"),
    _rule("comm-mul", "(* ?a ?b)", "(* ?b ?a)"),
    _rule("assoc-add", "(+ ?a (+ ?b ?c))", "(+ (+ ?a ?b) ?c)"),
    _rule("assoc-mul", "(* ?a (* ?b ?c))", "(* (* ?a ?b) ?c)"),
    _rule("sub-canon", "(- ?a ?b)", "(+ ?a (* -1 ?b))"),
    _rule("div-canon", "(/ ?a ?b)", "(* ?a (pow ?b -1))", ("not_zero", "?b")),
    _rule("zero-add", "(+ ?a 0)", "?a"),
    _rule("zero-mul", "(* ?a 0)", "0"),
    _rule("one-mul", "(* ?a 1)", "?a"),
    _rule("add-zero", "?a", "(+ ?a 0)"),
    _rule("mul-one", "?a", "(* ?a 1)"),
    _rule("cancel-sub", "(- ?a ?a)", "0"),
    _rule("cancel-div", "(/ ?a ?a)", "1", ("not_zero", "?a")),
    _rule("distribute", "(* ?a (+ ?b ?c))", "(+ (* ?a ?b) (* ?a ?c))"),
    _rule("factor", "(+ (* ?a ?b) (* ?a ?c))", "(* ?a (+ ?b ?c))"),
    _rule("pow-mul", "(* (pow ?a ?b) (pow ?a ?c))", "(pow ?a (+ ?b ?c))"),
    _rule("pow0", "(pow ?x 0)", "1", ("not_zero", "?x")),
    _rule("pow1", "(pow ?x 1)", "?x"),
    _rule("pow2", "(pow ?x 2)", "(* ?x ?x)"),
    _rule("pow-recip", "(pow ?x -1)", "(/ 1 ?x)", ("not_zero", "?x")),
    _rule("recip-mul-div", "(* ?x (/ 1 ?x))", "1", ("not_zero", "?x")),
    _rule("d-variable", "(d ?x ?x)", "1", ("is_sym", "?x")),
    _rule(
        "d-constant",
        "(d ?x ?c)",
        "0",
        ("is_sym", "?x"),
        ("is_const_or_distinct_var", "?c", "?x"),
    ),
    _rule("d-add", "(d ?x (+ ?a ?b))", "(+ (d ?x ?a) (d ?x ?b))"),
    _rule("d-mul", "(d ?x (* ?a ?b))", "(+ (* ?a (d ?x ?b)) (* ?b (d ?x ?a)))"),
    _rule("d-sin", "(d ?x (sin ?x))", "(cos ?x)"),
    _rule("d-cos", "(d ?x (cos ?x))", "(* -1 (sin ?x))"),
    _rule("d-ln", "(d ?x (ln ?x))", "(/ 1 ?x)", ("not_zero", "?x")),
    _rule(
        "d-power",
        "(d ?x (pow ?f ?g))",
        "(* (pow ?f ?g) (+ (* (d ?x ?f) (/ ?g ?f)) (* (d ?x ?g) (ln ?f))))",
        ("not_zero", "?f"),
        ("not_zero", "?g"),
    ),
    _rule("i-one", "(i 1 ?x)", "?x"),
    _rule(
        "i-power-const",
        "(i (pow ?x ?c) ?x)",
        "(/ (pow ?x (+ ?c 1)) (+ ?c 1))",
        ("is_const", "?c"),
    ),
    _rule("i-cos", "(i (cos ?x) ?x)", "(sin ?x)"),
    _rule("i-sin", "(i (sin ?x) ?x)", "(* -1 (cos ?x))"),
    _rule("i-sum", "(i (+ ?f ?g) ?x)", "(+ (i ?f ?x) (i ?g ?x))"),
    _rule("i-dif", "(i (- ?f ?g) ?x)", "(- (i ?f ?x) (i ?g ?x))"),
    _rule(
        "i-parts",
        "(i (* ?a ?b) ?x)",
        "(- (* ?a (i ?b ?x)) (i (* (d ?x ?a) (i ?b ?x)) ?x))",
    ),
]

MATH_RULES_BY_NAME: dict[str, dict] = {rule["name"]: rule for rule in MATH_RULES}

GROWTH_START = "(* (+ a (+ b (+ c (+ d (+ e f))))) (+ g (+ h (+ i (+ j (+ k l))))))"
GROWTH_RULES = ["comm-add", "comm-mul", "assoc-add", "assoc-mul", "distribute"]
GROWTH_ITER_LIMIT = 100


def parse_sexpr(text: str) -> SExpr:
    """Parse one egg-syntax s-expression.

    Lists become tuples ``(head, *args)`` with a ``str`` head; numeric atoms
    become ``float``; every other atom (symbols and ``?vars``) stays a ``str``.
    """
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    pos = 0

    def read() -> SExpr:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"unexpected end of s-expression: {text!r}")
        token = tokens[pos]
        pos += 1
        if token == ")":
            raise ValueError(f"unexpected ')' in {text!r}")
        if token != "(":
            try:
                return float(token)
            except ValueError:
                return token
        items = []
        while pos < len(tokens) and tokens[pos] != ")":
            items.append(read())
        if pos >= len(tokens):
            raise ValueError(f"missing ')' in {text!r}")
        pos += 1
        if not items or not isinstance(items[0], str):
            raise ValueError(f"list without an operator head in {text!r}")
        return tuple(items)

    expr = read()
    if pos != len(tokens):
        raise ValueError(f"trailing tokens in {text!r}")
    return expr


def is_var(atom: SExpr) -> bool:
    """Return True if ``atom`` is a pattern variable (``?name``)."""
    return isinstance(atom, str) and atom.startswith("?")
