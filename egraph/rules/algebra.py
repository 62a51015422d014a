"""Algebra: identities that hold for tensors with broadcasting, canonical forms, and the
reassociations that let matmul chains and scalar factors move.

Identities with a literal keep the left side's dtype (guarded to floating tensors, since
``int_tensor * 1.0`` is a float tensor). ``x * 0 -> zeros_like(x)`` and ``x - x ->
zeros_like(x)`` hold for finite x (inf * 0 is nan).
"""

from __future__ import annotations

import math

from egraph.rules import register
from egraph.rules.guards import (
    all_of,
    floating,
    literal_is,
    nonneg,
    nonzero,
    positive,
    rank_is,
    same_dtype,
    value_of,
)
from egraph.term import literal

X = {"x": (4, 8)}
ABC = {"a": (4, 8), "b": (4, 8), "c": (4, 8)}


def _alg(name, lhs, rhs, example, inputs, when=None, description=""):
    register("algebra", name, lhs, rhs, example=example, inputs=inputs, when=when,
             description=description)


def _mean_as_sum(egraph, subst):
    shape, dims = getattr(egraph.data(subst["x"]), "shape", None), value_of(egraph, subst["d"])
    if shape is None or not isinstance(dims, tuple):
        return None
    n = math.prod(shape[d] for d in dims)
    if n == 0:
        return None
    total = egraph.add_node("sum", [subst["x"], subst["d"], subst["k"]])
    return egraph.add_node("div", [total, egraph.add_node(literal(float(n)))])


def _sum_of_sum(egraph, subst):
    inner, outer = value_of(egraph, subst["d1"]), value_of(egraph, subst["d2"])
    if not isinstance(inner, tuple) or not isinstance(outer, tuple):
        return None
    dims = tuple(sorted(set(inner) | set(outer)))
    keep = egraph.add_node(literal(True))
    return egraph.add_node("sum", [subst["x"], egraph.add_node(literal(dims)), keep])


def _div_by_constant(egraph, subst):
    s = value_of(egraph, subst["s"])
    if not isinstance(s, float) or s == 0:
        return None
    return egraph.add_node("mul", [subst["x"], egraph.add_node(literal(1.0 / s))])


def _scalar(var: str):
    def guard(egraph, subst) -> bool:
        v = value_of(egraph, subst[var])
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    guard.__name__ = f"{var} is a scalar literal"
    return guard


_alg("comm-add", "(add ?a ?b)", "(add ?b ?a)", "a + b", ABC, description="a + b = b + a")
_alg("comm-mul", "(mul ?a ?b)", "(mul ?b ?a)", "a * b", ABC, description="ab = ba")
ONE_DTYPE = same_dtype("a", "b", "c")
_alg("assoc-add", "(add ?a (add ?b ?c))", "(add (add ?a ?b) ?c)", "a + (b + c)", ABC,
     when=ONE_DTYPE, description="addition reassociates")
_alg("assoc-mul", "(mul ?a (mul ?b ?c))", "(mul (mul ?a ?b) ?c)", "a * (b * c)", ABC,
     when=ONE_DTYPE, description="multiplication reassociates")
_alg("distribute", "(mul ?a (add ?b ?c))", "(add (mul ?a ?b) (mul ?a ?c))", "a * (b + c)", ABC,
     when=ONE_DTYPE, description="a(b + c) = ab + ac")
_alg("factor", "(add (mul ?a ?b) (mul ?a ?c))", "(mul ?a (add ?b ?c))", "a * b + a * c", ABC,
     when=ONE_DTYPE, description="ab + ac = a(b + c)")
_alg("sub-canon", "(sub ?a ?b)", "(add ?a (neg ?b))", "a - b", ABC,
     description="subtraction as adding the negation")
_alg("add-neg", "(add ?a (neg ?b))", "(sub ?a ?b)", "a + (-b)", ABC,
     description="adding a negation is subtraction")
_alg("neg-neg", "(neg (neg ?x))", "?x", "-(-x)", X, description="--x = x")
_alg("zero-add", "(add ?x ?z)", "?x", "x + 0.0", X,
     when=all_of(literal_is("z", 0), floating("x")), description="x + 0 = x")
_alg("one-mul", "(mul ?x ?o)", "?x", "x * 1.0", X,
     when=all_of(literal_is("o", 1), floating("x")), description="x * 1 = x")
_alg("zero-mul", "(mul ?x ?z)", "(zeros_like ?x)", "x * 0.0", X,
     when=all_of(literal_is("z", 0), floating("x")), description="x * 0 = 0 (finite x)")
_alg("sub-self", "(sub ?x ?x)", "(zeros_like ?x)", "x - x", X,
     description="x - x = 0 (finite x)")
_alg("div-one", "(div ?x ?o)", "?x", "x / 1.0", X, when=all_of(literal_is("o", 1), floating("x")),
     description="x / 1 = x")
_alg("div-constant", "(div ?x ?s)", _div_by_constant, "x / 4.0", X,
     when=all_of(floating("x"), _scalar("s")), description="x / c = x * (1/c) for a constant c")
_alg("pow-two", "(pow ?x ?two)", "(mul ?x ?x)", "x ** 2", X,
     when=all_of(literal_is("two", 2), floating("x")), description="x^2 = x x")
_alg("pow-one", "(pow ?x ?one)", "?x", "x ** 1", X,
     when=all_of(literal_is("one", 1), floating("x")), description="x^1 = x")
_alg("exp-add", "(exp (add ?a ?b))", "(mul (exp ?a) (exp ?b))", "torch.exp(a + b)", ABC,
     description="exp(a + b) = exp(a) exp(b)")
_alg("log-mul", "(log (mul ?a ?b))", "(add (log ?a) (log ?b))", "torch.log(a * b)",
     {"a": ((4, 8), "positive"), "b": ((4, 8), "positive")},
     when=all_of(positive("a"), positive("b")), description="log(ab) = log a + log b, a, b > 0")
_alg("sqrt-times-sqrt", "(mul (sqrt ?x) (sqrt ?x))", "?x", "torch.sqrt(x) * torch.sqrt(x)",
     {"x": ((4, 8), "nonneg")}, when=nonneg("x"), description="sqrt(x)^2 = x for x >= 0")
_alg("recip-recip", "(div ?one (div ?one2 ?x))", "?x", "1.0 / (1.0 / x)",
     {"x": ((4, 8), "nonzero")},
     when=all_of(literal_is("one", 1), literal_is("one2", 1), nonzero("x"), floating("x")),
     description="1 / (1 / x) = x for x != 0")
_alg("mean-sum", "(mean ?x ?d ?k)", _mean_as_sum, "x.mean(-1)", X, when=floating("x"),
     description="mean = sum / n")
_alg("sum-of-sum", "(sum (sum ?x ?d1 #bool:true) ?d2 #bool:true)", _sum_of_sum,
     "x.sum(-1, keepdim=True).sum(0, keepdim=True)", X,
     description="nested keepdim sums are one sum over both dims")
_alg("matmul-assoc", "(matmul (matmul ?a ?b) ?c)", "(matmul ?a (matmul ?b ?c))", "(a @ b) @ c",
     {"a": (4, 8), "b": (8, 3), "c": (3, 5)},
     when=all_of(rank_is("a", 2), rank_is("b", 2), rank_is("c", 2)),
     description="matrix chains reassociate (the cost model picks the cheaper order)")
_alg("matmul-assoc-rev", "(matmul ?a (matmul ?b ?c))", "(matmul (matmul ?a ?b) ?c)",
     "a @ (b @ c)", {"a": (4, 8), "b": (8, 3), "c": (3, 5)},
     when=all_of(rank_is("a", 2), rank_is("b", 2), rank_is("c", 2)),
     description="matrix chains reassociate the other way")
_alg("matmul-scale-left", "(matmul (mul ?a ?s) ?b)", "(mul (matmul ?a ?b) ?s)",
     "(a * 0.5) @ b", {"a": (4, 8), "b": (8, 3)}, when=_scalar("s"),
     description="a scalar factor moves through matmul")
_alg("matmul-scale-right", "(matmul ?a (mul ?b ?s))", "(mul (matmul ?a ?b) ?s)",
     "a @ (b * 0.5)", {"a": (4, 8), "b": (8, 3)}, when=_scalar("s"),
     description="a scalar factor on the right moves out of matmul")
_alg("linear-unfuse", "(linear ?x ?w ?b)", "(add (matmul ?x (transpose ?w #int:0 #int:1)) ?b)",
     "torch.nn.functional.linear(x, w, b)", {"x": (4, 8), "w": (6, 8), "b": (6,)},
     when=all_of(rank_is("w", 2), rank_is("b", 1)),
     description="linear as matmul + bias, so matmul rules can reorder it")


def _sum_of_broadcast(egraph, subst):
    """sum(expand(x, s), d, keepdim) over dims where x has size 1 is x * prod(s[d])."""
    shape = getattr(egraph.data(subst["x"]), "shape", None)
    target, dims = value_of(egraph, subst["s"]), value_of(egraph, subst["d"])
    if shape is None or not isinstance(target, tuple) or not isinstance(dims, tuple):
        return None
    if len(shape) != len(target) or any(
            shape[i] != (1 if i in dims else target[i]) for i in range(len(shape))):
        return None
    n = float(math.prod(target[i] for i in dims))
    return egraph.add_node("mul", [subst["x"], egraph.add_node(literal(n))])


_alg("sum-of-broadcast", "(sum (expand ?x ?s) ?d #bool:true)", _sum_of_broadcast,
     "x.expand(4, 8).sum(-1, keepdim=True)", {"x": (4, 1)}, when=floating("x"),
     description="summing a broadcast dim is multiplying by its size")
for _op, _fn in [("exp", "torch.exp"), ("log", "torch.log"), ("neg", "torch.neg"),
                 ("relu", "torch.relu"), ("sigmoid", "torch.sigmoid"), ("tanh", "torch.tanh"),
                 ("sqrt", "torch.sqrt"), ("abs", "torch.abs")]:
    _alg(f"{_op}-through-expand", f"({_op} (expand ?x ?s))", f"(expand ({_op} ?x) ?s)",
         f"{_fn}(x.expand(4, 8))", {"x": ((4, 1), "positive")},
         description=f"{_op} of a broadcast is the broadcast of {_op}: computed once per value")
