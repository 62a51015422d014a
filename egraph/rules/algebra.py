"""Algebra: identities that hold for tensors with broadcasting, canonical forms, and the
reassociations that let matmul chains and scalar factors move.

Identities with a literal keep the left side's dtype (guarded to floating tensors, since
``int_tensor * 1.0`` is a float tensor). ``x * 0 -> zeros_like(x)`` and ``x - x ->
zeros_like(x)`` hold for finite x (inf * 0 is nan).

>>> [r.name for r in RULES][:3]
['comm-add', 'comm-mul', 'assoc-add']
"""

from __future__ import annotations

import math

from egraph.ops import (
    abs,
    bitwise_not,
    bitwise_or,
    clamp,
    eq,
    exp,
    expand,
    full,
    getitem,
    linear,
    log,
    masked_fill,
    max_dim,
    maximum,
    mean,
    ne,
    neg,
    reciprocal,
    relu,
    reshape,
    rsqrt,
    sigmoid,
    sqrt,
    sum,
    tanh,
    to,
    transpose,
    where,
    zeros_like,
)
from egraph.rules.define import AB, ABC, F, LibraryRule, X, rule, torch
from egraph.rules.guards import (
    ONE_DTYPE,
    all_of,
    boolean,
    finite,
    floating,
    named,
    nonneg,
    nonzero,
    number_of,
    positive,
    product_in_range,
    rank_is,
    reshape_gives,
    same_dtype,
    scalar,
    short_chain,
    tensor,
    value_of,
)
from egraph.term import literal, vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 0

a, b, c, s, w, x, d, k, d1, d2, m, n, t = vars("a b c s w x d k d1 d2 m n t")
CHAIN = {"a": (4, 8), "b": (8, 3), "c": (3, 5)}
CHAIN_LIMIT = 3
"""The most operands of a sum a regrouping makes a group of
(:func:`~egraph.rules.guards.short_chain`, on ``assoc-add``, ``distribute`` and ``factor``):
three give every grouping of a sum of four, so every pairing of two ``x @ w + b`` is
reached, while a model's long sums (the residual stream: a term or two per block) get a
few classes per term, not the 2^n of all their groupings, and saturate."""
PRODUCT_LIMIT = 4
"""The same for products (``assoc-mul``): transformers' FastGELU writes the cube inside
GELU's tanh as ``x * 0.7978845608 * (1 + 0.044715 * x * x)``, and reaching
``c * (x + r * x**3)`` groups four factors.

On the corpus of benchmarks/models.py both limits extract the same programs, at the same
cost, as no limit."""
MATRICES = all_of(rank_is(a, 2), rank_is(b, 2), rank_is(c, 2))


def _count_of(egraph, subst) -> int | None:
    """How many elements ``sum(?x, ?d, _)`` or ``mean(?x, ?d, _)`` reduces per result
    (None: unknown)."""
    shape, dims = getattr(egraph.data(subst["x"]), "shape", None), value_of(egraph, subst["d"])
    if shape is None or not isinstance(dims, tuple):
        return None
    return math.prod(shape[d] for d in dims)


@named("b broadcasts into x")
def _absorbs(egraph, subst) -> bool:
    """``x`` and ``b`` broadcast to ``x``'s shape, in ``x``'s dtype: ``x + zeros_like(b)``
    is ``x`` itself, not a larger or converted tensor."""
    sx, sb = (getattr(egraph.data(subst[n]), "shape", None) for n in ("x", "b"))
    if sx is None or sb is None or len(sb) > len(sx):
        return False
    return all(q in (1, p) for p, q in zip(reversed(sx), reversed(sb)))


def _mean_as_sum(egraph, subst):
    n = _count_of(egraph, subst)
    if not n:
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
    v = number_of(egraph, subst["s"])
    if v is None or v == 0:
        return None
    return egraph.add_node("mul", [subst["x"], egraph.add_node(literal(1.0 / v))])


@named("n is the number of elements summed")
def _divides_by_count(egraph, subst) -> bool:
    n = value_of(egraph, subst["n"])
    return (isinstance(n, (int, float)) and not isinstance(n, bool) and n != 0
            and n == _count_of(egraph, subst))


@named("full(s, c, t, d) is a float of no dims")
def _float_of_no_dims(egraph, subst) -> bool:
    """``full(s, c, t, d)`` is a float tensor of no dims: beside a float tensor it is
    promoted as a number is (the other's dtype holds the result), and ``c`` is its value
    exactly (ingest reads it from the tensor)."""
    return value_of(egraph, subst["s"]) == () and getattr(
        value_of(egraph, subst["t"]), "is_floating_point", False)


def _scaled_fill(egraph, subst):
    """``masked_fill(a, m, c) * s`` as ``masked_fill(a * s, m, c * s)``: both numbers are
    literals, so ``c * s`` is one literal (-inf stays -inf for s > 0)."""
    c, scale = number_of(egraph, subst["c"]), number_of(egraph, subst["s"])
    if c is None or scale is None:
        return None
    if scale == 0 or math.isnan(c * scale):
        return None
    product = egraph.add_node("mul", [subst["a"], subst["s"]])
    return egraph.add_node("masked_fill", [product, subst["m"],
                                           egraph.add_node(literal(float(c * scale)))])


@named("the reshapes flatten and restore the batch dims")
def _flattened_batch(egraph, subst) -> bool:
    """``?s1`` and ``?s2`` flatten the batch dims of ``?a`` and ``?b`` (equal, at least one)
    into one, and ``?s`` restores them on the product: how aot_autograd writes a batched
    matmul (reshape, bmm, reshape)."""
    sa = getattr(egraph.data(subst["a"]), "shape", None)
    sb = getattr(egraph.data(subst["b"]), "shape", None)
    if sa is None or sb is None or len(sa) < 3 or len(sa) != len(sb) or sa[:-2] != sb[:-2]:
        return False
    n = math.prod(sa[:-2])
    return (reshape_gives(value_of(egraph, subst["d1"]), (n, *sa[-2:]))
            and reshape_gives(value_of(egraph, subst["d2"]), (n, *sb[-2:]))
            and reshape_gives(value_of(egraph, subst["s"]), (*sa[:-2], sa[-2], sb[-1])))


def _amax_of_max(egraph, subst):
    dim = value_of(egraph, subst["d"])
    if not isinstance(dim, int) or isinstance(dim, bool):
        return None
    return egraph.add_node("amax", [subst["x"], egraph.add_node(literal((dim,))),
                                    subst["k"]])


@named("x already has dtype t")
def _cast_is_noop(egraph, subst) -> bool:
    dtype = getattr(egraph.data(subst["x"]), "dtype", None)
    return dtype is not None and dtype == value_of(egraph, subst["t"])


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


def _through_expand(op, example) -> LibraryRule:
    return rule(f"{op.name}-through-expand", op(expand(x, s)), expand(op(x), s),
                example=example, inputs={"x": ((4, 1), "positive")},
                description=f"{op.name} of a broadcast is the broadcast of {op.name}: "
                            "computed once per value")


RULES: list[LibraryRule] = [
    # The commutative and associative laws generate every operand order themselves, so
    # they match only as written (variants=False): matching both orders repeats work.
    rule("comm-add", a + b, b + a, variants=False, example=lambda a, b: a + b, inputs=AB,
         description="a + b = b + a"),
    rule("comm-mul", a * b, b * a, variants=False, example=lambda a, b: a * b, inputs=AB,
         description="ab = ba"),
    rule("assoc-add", a + (b + c), (a + b) + c,
         when=all_of(ONE_DTYPE, short_chain("add", CHAIN_LIMIT, a, b)), variants=False,
         example=lambda a, b, c: a + (b + c), inputs=ABC,
         description="addition reassociates"),
    rule("assoc-mul", a * (b * c), (a * b) * c,
         when=all_of(ONE_DTYPE, short_chain("mul", PRODUCT_LIMIT, a, b),
                     product_in_range(a, b, a, b, c)), variants=False,
         example=lambda a, b, c: a * (b * c), inputs=ABC,
         description="multiplication reassociates"),
    rule("distribute", a * (b + c), a * b + a * c,
         when=all_of(ONE_DTYPE, short_chain("add", CHAIN_LIMIT, b, c),
                     product_in_range(a, b, a, b, c), product_in_range(a, c, a, b, c)),
         variants=False,
         example=lambda a, b, c: a * (b + c), inputs=ABC, description="a(b + c) = ab + ac"),
    rule("factor", a * b + a * c, a * (b + c),
         when=all_of(ONE_DTYPE, short_chain("add", CHAIN_LIMIT, b, c),
                     product_in_range(a, (b, c), a, b, c)), variants=False,
         example=lambda a, b, c: a * b + a * c, inputs=ABC, description="ab + ac = a(b + c)"),
    rule("sub-canon", a - b, a + -b, example=lambda a, b: a - b, inputs=AB,
         description="subtraction as adding the negation"),
    rule("add-neg", a + -b, a - b, example=lambda a, b: a + (-b), inputs=AB,
         description="adding a negation is subtraction"),
    rule("neg-neg", neg(neg(x)), x, example=lambda x: -torch.neg(x), inputs=X,
         description="--x = x"),
    rule("zero-add", x + 0, x, when=floating(x), example=(lambda x: x + 0.0, lambda x: 0 + x),
         inputs=X, description="x + 0 = x"),
    rule("one-mul", x * 1, x, when=floating(x), example=(lambda x: x * 1.0, lambda x: 1 * x),
         inputs=X, description="x * 1 = x"),
    rule("zero-mul", x * 0, zeros_like(x), when=all_of(floating(x), finite(x)),
         example=lambda x: x * 0.0, inputs={"x": ((4, 8), "finite")},
         description="x * 0 = 0 (finite x: inf * 0 is NaN)"),
    rule("sub-self", x - x, zeros_like(x), when=finite(x), example=lambda x: x - x,
         inputs={"x": ((4, 8), "finite")}, description="x - x = 0 (finite x: inf - inf is NaN)"),
    rule("zeros-add", x + zeros_like(b), x, when=all_of(_absorbs, same_dtype(x, b)),
         example=lambda x, b: x + torch.zeros_like(b), inputs={"x": (4, 8), "b": (4, 1)},
         description="adding a tensor of zeros that broadcasts into x is x"),
    rule("div-one", x / 1, x, when=floating(x), example=lambda x: x / 1.0, inputs=X,
         description="x / 1 = x"),
    rule("div-constant", x / s, _div_by_constant, when=all_of(floating(x), scalar(s)),
         example=(lambda x: x / 4.0, lambda x: x / 8), inputs=X,
         description="x / c = x * (1/c) for a constant c"),
    # Division and multiplication by a reciprocal are one class, so fused forms are
    # written once, with a division.
    rule("div-as-reciprocal", a / b, a * (1 / b),
         when=all_of(floating(a), floating(b), tensor(b), same_dtype(a, b)),
         example=lambda a, b: a / b, inputs={"a": (4, 8), "b": ((4, 8), "nonzero")},
         description="a / b = a * (1/b)"),
    rule("reciprocal-as-div", a * (1 / b), a / b,
         when=all_of(floating(a), floating(b), same_dtype(a, b)),
         example=(lambda a, b: a * (1.0 / b), lambda a, b: (1 / b) * a),
         inputs={"a": (4, 8), "b": ((4, 8), "nonzero")},
         description="a * (1/b) = a / b"),
    rule("reciprocal", reciprocal(x), 1 / x, when=floating(x),
         example=lambda x: torch.reciprocal(x), inputs={"x": ((4, 8), "nonzero")},
         description="reciprocal(x) is 1 / x"),
    rule("rsqrt-as-div", rsqrt(x), 1 / sqrt(x), when=floating(x),
         example=lambda x: torch.rsqrt(x), inputs={"x": ((4, 8), "positive")},
         description="rsqrt(x) = 1 / sqrt(x)"),
    rule("rsqrt", 1 / sqrt(x), rsqrt(x), when=floating(x),
         example=lambda x: 1.0 / torch.sqrt(x), inputs={"x": ((4, 8), "positive")},
         description="1 / sqrt(x) is rsqrt(x), one op"),
    rule("cast-noop", to(x, t), x, when=_cast_is_noop,
         example=lambda x: x.to(torch.float32), inputs=X,
         description="a conversion to the dtype x already has is x"),
    rule("sum-div-count", sum(x, d, k) / n, mean(x, d, k), when=_divides_by_count,
         example=(lambda x: x.sum(-1, keepdim=True) / 8, lambda x: x.sum(-1) / x.shape[-1]),
         inputs=X, description="a sum divided by the number of its terms is the mean"),
    rule("log-mul", log(a * b), log(a) + log(b), when=all_of(positive(a), positive(b)),
         example=lambda a, b: torch.log(a * b),
         inputs={"a": ((4, 8), "positive"), "b": ((4, 8), "positive")},
         description="log(ab) = log a + log b, a, b > 0"),
    rule("sqrt-times-sqrt", sqrt(x) * sqrt(x), x, when=nonneg(x),
         example=lambda x: torch.sqrt(x) * torch.sqrt(x), inputs={"x": ((4, 8), "nonneg")},
         description="sqrt(x)^2 = x for x >= 0"),
    rule("recip-recip", 1 / (1 / x), x, when=all_of(nonzero(x), floating(x)),
         example=lambda x: 1.0 / (1.0 / x), inputs={"x": ((4, 8), "nonzero")},
         description="1 / (1 / x) = x for x != 0"),
    rule("mean-sum", mean(x, d, k), _mean_as_sum, when=floating(x),
         example=lambda x: x.mean(-1), inputs=X, description="mean = sum / n"),
    rule("sum-of-sum", sum(sum(x, d1, True), d2, True), _sum_of_sum,
         example=lambda x: x.sum(-1, keepdim=True).sum(0, keepdim=True), inputs=X,
         description="nested keepdim sums are one sum over both dims"),
    rule("matmul-assoc", (a @ b) @ c, a @ (b @ c), when=MATRICES,
         example=lambda a, b, c: (a @ b) @ c, inputs=CHAIN,
         description="matrix chains reassociate (the cost model picks the cheaper order)"),
    rule("matmul-assoc-rev", a @ (b @ c), (a @ b) @ c, when=MATRICES,
         example=lambda a, b, c: a @ (b @ c), inputs=CHAIN,
         description="matrix chains reassociate the other way"),
    rule("matmul-batched", reshape(reshape(a, d1) @ reshape(b, d2), s), a @ b,
         when=_flattened_batch,
         example=lambda a, b: (a.reshape(6, 4, 8) @ b.reshape(6, 8, 3)).reshape(2, 3, 4, 3),
         inputs={"a": (2, 3, 4, 8), "b": (2, 3, 8, 3)},
         description="a bmm over flattened batch dims is the batched matmul"),
    rule("matmul-scale-left", (a * s) @ b, (a @ b) * s, when=scalar(s),
         example=(lambda a, b: (a * 0.5) @ b, lambda a, b: (2 * a) @ b),
         inputs={"a": (4, 8), "b": (8, 3)}, description="a scalar factor moves through matmul"),
    rule("matmul-scale-right", a @ (b * s), (a @ b) * s, when=scalar(s),
         example=(lambda a, b: a @ (b * 0.5), lambda a, b: a @ (2 * b)),
         inputs={"a": (4, 8), "b": (8, 3)},
         description="a scalar factor on the right moves out of matmul"),
    rule("linear-unfuse", linear(x, w, b), x @ transpose(w, 0, 1) + b,
         when=all_of(rank_is(w, 2), rank_is(b, 1)), example=lambda x, w, b: F.linear(x, w, b),
         inputs={"x": (4, 8), "w": (6, 8), "b": (6,)},
         description="linear as matmul + bias, so matmul rules can reorder it"),
    rule("sum-of-broadcast", sum(expand(x, s), d, True), _sum_of_broadcast, when=floating(x),
         example=lambda x: x.expand(4, 8).sum(-1, keepdim=True), inputs={"x": (4, 1)},
         description="summing a broadcast dim is multiplying by its size"),
    _through_expand(exp, lambda x: torch.exp(x.expand(4, 8))),
    _through_expand(log, lambda x: torch.log(x.expand(4, 8))),
    _through_expand(neg, lambda x: torch.neg(x.expand(4, 8))),
    _through_expand(relu, lambda x: torch.relu(x.expand(4, 8))),
    _through_expand(sigmoid, lambda x: torch.sigmoid(x.expand(4, 8))),
    _through_expand(tanh, lambda x: torch.tanh(x.expand(4, 8))),
    _through_expand(sqrt, lambda x: torch.sqrt(x.expand(4, 8))),
    _through_expand(abs, lambda x: torch.abs(x.expand(4, 8))),
    rule("max-values", getitem(max_dim(x, d, k), 0), _amax_of_max,
         example=lambda x: x.max(-1, keepdim=True)[0], inputs=X,
         description="the values of max over a dim are amax over it"),
    # Masks: one spelling per meaning (bool masks marking what is dropped, filled).
    rule("not-not", bitwise_not(bitwise_not(m)), m, when=boolean(m),
         example=lambda m: ~~m, inputs={"m": ((4, 8), "bool")},
         description="~~m = m for a bool mask"),
    rule("fill-twice", masked_fill(masked_fill(a, m, c), n, c), masked_fill(a, bitwise_or(m, n), c),
         when=all_of(boolean(m), boolean(n), scalar(c)),
         example=lambda a, m, n: a.masked_fill(m, -1e9).masked_fill(n, -1e9),
         inputs={"a": (2, 4, 8), "m": ((4, 8), "bool"), "n": ((2, 1, 8), "bool")},
         description="two fills with one value are one fill where either mask is set "
                     "(local-attention's causal, then padding, mask)"),
    rule("not-eq", bitwise_not(eq(a, b)), ne(a, b), example=lambda a, b: ~(a == b),
         inputs={"a": ((4, 8), "index:2"), "b": ((4, 8), "index:2")},
         description="~(a == b) is a != b"),
    rule("where-as-fill", where(m, a, c), masked_fill(a, bitwise_not(m), c),
         when=all_of(boolean(m), scalar(c), floating(a)),
         example=(lambda m, a: torch.where(m, a, float("-inf")),
                  lambda m, a: torch.where(m, a, -1e9)),
         inputs={"m": ((4, 8), "bool"), "a": (4, 8)},
         description="where(m, a, c) fills a with c where m is false"),
    rule("where-as-fill-flipped", where(m, c, a), masked_fill(a, m, c),
         when=all_of(boolean(m), scalar(c), floating(a)),
         example=lambda m, a: torch.where(m, float("-inf"), a),
         inputs={"m": ((4, 8), "bool"), "a": (4, 8)},
         description="where(m, c, a) fills a with c where m is true"),
    rule("where-tensor-fill", where(m, a, full(s, c, t, d)), where(m, a, c),
         when=all_of(_float_of_no_dims, scalar(c), floating(a)),
         example=lambda m, a: torch.where(m, a, torch.full([], -1e9, dtype=a.dtype)),
         inputs={"m": ((4, 8), "bool"), "a": (4, 8)},
         description="a fill given as a float tensor of no dims is the number"),
    rule("fill-tensor-value", masked_fill(a, m, full(s, c, t, d)), masked_fill(a, m, c),
         when=all_of(_float_of_no_dims, scalar(c), floating(a)),
         example=lambda m, a: a.masked_fill(m, torch.full([], -1e9, dtype=a.dtype)),
         inputs={"m": ((4, 8), "bool"), "a": (4, 8)},
         description="a fill value given as a float tensor of no dims is the number"),
    rule("maximum-tensor-bound", maximum(a, full(s, c, t, d)), clamp(a, c, None),
         when=all_of(_float_of_no_dims, scalar(c), floating(a)),
         example=lambda a: torch.max(a, torch.full((), -3.4028234663852886e38, dtype=a.dtype)),
         inputs={"a": (4, 8)},
         description="the larger of a and a float tensor of no dims is a clamped from below "
                     "by the number (XGLM's scores floored at finfo.min)"),
    rule("fill-then-scale", masked_fill(a, m, c) * s, _scaled_fill,
         when=all_of(floating(a), scalar(s), scalar(c)),
         example=lambda a, m: a.masked_fill(m, float("-inf")) * 0.25,
         inputs={"a": (4, 8), "m": ((4, 8), "bool")},
         description="a scale after a fill is a scale before it, the fill value scaled"),
]
