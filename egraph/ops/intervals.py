"""Observed value ranges: interval transfer rules, one per op, named by the op table.

These ranges inform costs only (the curvature cost), never rules: they describe the values
seen on example inputs, not what the ops guarantee (that is :mod:`egraph.signs`). A rule
maps the operands' intervals (None for an absent optional operand), the literal values of
the attribute operands and the shapes ``(output, *operands)`` (None where unknown) to an
enclosure of the output; unknown is ``(-inf, inf)``.

>>> exp_rule = monotone(math.exp)
>>> exp_rule([(0.0, 1.0)], [], None)
(1.0, 2.718281828459045)

The op table holds each op's rule; :func:`egraph.ops.table.interval_of` applies it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from egraph.ops.einsum_plan import summed_count

INF = math.inf
UNBOUNDED = (-INF, INF)

Interval = tuple[float, float]
IntervalRule = Callable[[list, list, Any], Interval]
"""``(operand intervals, literal values, shapes) -> (lo, hi)``."""


def _safe(fn, x: float) -> float:
    try:
        return fn(x)
    except OverflowError:
        return INF
    except (ValueError, ZeroDivisionError):
        return math.nan


def monotone(fn: Callable[[float], float]) -> IntervalRule:
    """The rule of an increasing function of one operand: ``fn`` at both ends (unbounded
    where ``fn`` is undefined at an end).

    >>> monotone(math.exp)([(0.0, 0.0)], [], None)
    (1.0, 1.0)
    """
    def rule(kids, values, shapes) -> Interval:
        lo, hi = kids[0]
        a, b = _safe(fn, lo), _safe(fn, hi)
        if math.isnan(a) or math.isnan(b):
            return UNBOUNDED
        return (a, b)
    return rule


def decreasing(fn: Callable[[float], float]) -> IntervalRule:
    """The rule of a decreasing function of one operand: ``fn`` at both ends, swapped.

    >>> decreasing(math.erfc)([(0.0, 1.0)], [], None)
    (0.15729920705028513, 1.0)
    """
    increasing = monotone(fn)

    def rule(kids, values, shapes) -> Interval:
        lo, hi = increasing(kids, values, shapes)
        return UNBOUNDED if (lo, hi) == UNBOUNDED else (hi, lo)
    return rule


def constant(lo: float, hi: float) -> IntervalRule:
    """The rule of an op whose values always lie in ``[lo, hi]``.

    >>> constant(-1.0, 1.0)([(-5.0, 5.0)], [], None)
    (-1.0, 1.0)
    """
    return lambda kids, values, shapes: (lo, hi)


def same(kids, values, shapes) -> Interval:
    """The first operand's interval (views, selections, max/min/mean reductions).

    >>> same([(0.0, 2.0)], [], None)
    (0.0, 2.0)
    """
    return kids[0]


def _product(a: Interval, b: Interval) -> Interval:
    values = []
    for x in a:
        for y in b:
            v = x * y
            values.append(0.0 if math.isnan(v) else v)  # 0 * inf: the bound is 0 there
    return (min(values), max(values))


def total(kids, values, shapes) -> Interval:
    """``x + y``."""
    return (kids[0][0] + kids[1][0], kids[0][1] + kids[1][1])


def difference(kids, values, shapes) -> Interval:
    """``x - y``."""
    return (kids[0][0] - kids[1][1], kids[0][1] - kids[1][0])


def negation(kids, values, shapes) -> Interval:
    """``-x``."""
    return (-kids[0][1], -kids[0][0])


def product(kids, values, shapes) -> Interval:
    """``x * y``."""
    return _product(kids[0], kids[1])


def _divided(num: Interval, den: Interval) -> Interval:
    if den[0] > 0 or den[1] < 0:
        return _product(num, (1.0 / den[1], 1.0 / den[0]))
    return UNBOUNDED


def quotient(kids, values, shapes) -> Interval:
    """``x / y`` (unbounded when y's interval contains 0)."""
    return _divided(kids[0], kids[1])


def reciprocal(kids, values, shapes) -> Interval:
    """``1 / x``."""
    return _divided((1.0, 1.0), kids[0])


def magnitude(kids, values, shapes) -> Interval:
    """``|x|``."""
    lo, hi = kids[0]
    if lo >= 0:
        return (lo, hi)
    if hi <= 0:
        return (-hi, -lo)
    return (0.0, max(-lo, hi))


def logarithm(kids, values, shapes) -> Interval:
    """``log(x)``: down to -inf where x reaches 0."""
    lo, hi = kids[0]
    if lo > 0:
        return monotone(math.log)(kids, values, shapes)
    return (-INF, _safe(math.log, hi) if hi > 0 else INF)


def log1p(kids, values, shapes) -> Interval:
    """``log(1 + x)``."""
    return monotone(math.log1p)(kids, values, shapes) if kids[0][0] > -1 else UNBOUNDED


def root(kids, values, shapes) -> Interval:
    """``sqrt(x)``."""
    lo, hi = kids[0]
    return (math.sqrt(max(lo, 0.0)), math.sqrt(hi) if hi >= 0 else 0.0)


def reciprocal_root(kids, values, shapes) -> Interval:
    """``1 / sqrt(x)``."""
    lo, hi = kids[0]
    return (1.0 / math.sqrt(hi), 1.0 / math.sqrt(lo)) if lo > 0 else (0.0, INF)


def power(kids, values, shapes) -> Interval:
    """``x ** k`` for a literal exponent ``k``."""
    lo, hi = kids[0]
    k = values[1] if len(values) > 1 else None
    if not isinstance(k, (int, float)) or isinstance(k, bool):
        return UNBOUNDED
    if float(k).is_integer():
        k = int(k)
        ends = [_safe(lambda v: v**k, lo), _safe(lambda v: v**k, hi)]
        if k % 2 == 0 and lo < 0 < hi:
            return (0.0, max(ends))
        return (min(ends), max(ends))
    if lo >= 0:
        return monotone(lambda v: v**k)(kids, values, shapes) if k > 0 else monotone(
            lambda v: v**k)([(hi, lo)], values, shapes)
    return UNBOUNDED


def sigmoid(x: float) -> float:
    """``1 / (1 + exp(-x))`` without overflow."""
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def softplus(x: float) -> float:
    """``log(1 + exp(x))`` without overflow."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def relu(kids, values, shapes) -> Interval:
    """``max(x, 0)``."""
    lo, hi = kids[0]
    return (max(lo, 0.0), max(hi, 0.0))


def with_zero(kids, values, shapes) -> Interval:
    """The first operand's interval widened to hold 0 (an average over zero padding).

    >>> with_zero([(1.0, 2.0)], [], None)
    (0.0, 2.0)
    """
    lo, hi = kids[0]
    return (min(lo, 0.0), max(hi, 0.0))


def gated(kids, values, shapes) -> Interval:
    """``x * gate(x)`` (GELU, SiLU): x where x >= 0, no lower than -0.28 elsewhere."""
    lo, hi = kids[0]
    return (lo if lo >= 0 else -0.28, max(hi, 0.0))


def _reduced(shapes, values) -> int:
    """How many elements a reduction over ``values[1]`` (dims) combines."""
    if shapes is None or shapes[1] is None or len(values) < 2:
        return 0
    dims = values[1]
    if not isinstance(dims, tuple):
        return 0
    return math.prod(shapes[1][d] for d in dims if d < len(shapes[1]))


def softmax(kids, values, shapes) -> Interval:
    """In ``[0, 1]`` (exactly 1 over one element)."""
    return (1.0, 1.0) if _reduced(shapes, values) == 1 else (0.0, 1.0)


def log_softmax(kids, values, shapes) -> Interval:
    """``x - logsumexp(x)``: down to ``lo - hi - log n``, at most 0."""
    lo, hi = kids[0]
    n = _reduced(shapes, values)
    return (lo - hi - math.log(n), 0.0) if n else (-INF, 0.0)


def logsumexp(kids, values, shapes) -> Interval:
    """Between the largest term and it plus ``log n``."""
    lo, hi = kids[0]
    n = _reduced(shapes, values)
    return (lo, hi + math.log(n)) if n else UNBOUNDED


def summed(kids, values, shapes) -> Interval:
    """``n`` terms of the operand's interval."""
    n = _reduced(shapes, values)
    return _product(kids[0], (float(n), float(n))) if n else UNBOUNDED


def variance(kids, values, shapes) -> Interval:
    """At most a quarter of the squared spread."""
    lo, hi = kids[0]
    return (0.0, (hi - lo) ** 2 / 4 if math.isfinite(hi - lo) else INF)


def _summed_products(kids, k: int) -> Interval:
    base = _product(kids[0], kids[1])
    out = (base[0] * k, base[1] * k)
    if len(kids) > 2 and kids[2] is not None:
        out = (out[0] + kids[2][0], out[1] + kids[2][1])
    return out


def contraction(kids, values, shapes) -> Interval:
    """Matrix products and linear layers: ``k`` products summed (``k`` the first
    operand's last dim), plus the bias (a third operand)."""
    if shapes is None or not shapes[1]:
        return UNBOUNDED
    return _summed_products(kids, shapes[1][-1])


def accumulated_contraction(kids, values, shapes) -> Interval:
    """``c + x @ y`` (addmm's operands ``c, x, y``): ``k`` products summed (``k`` the
    second operand's last dim), plus ``c``.

    >>> accumulated_contraction([(0.0, 1.0), (-1.0, 1.0), (0.0, 2.0)], [],
    ...                         [(2, 3), (2, 3), (2, 4), (4, 3)])
    (-8.0, 9.0)
    """
    if shapes is None or not shapes[2]:
        return UNBOUNDED
    return _summed_products([kids[1], kids[2], kids[0]], shapes[2][-1])


def einsum_contraction(kids, values, shapes) -> Interval:
    """A two-operand einsum: as many products summed per output element as the letters
    no output dim keeps span (:func:`egraph.ops.einsum_plan.summed_count`).

    >>> einsum_contraction([None, (0.0, 1.0), (-1.0, 1.0)], ["ij,jk->ik"],
    ...                    [(2, 3), None, (2, 4), (4, 3)])
    (-4.0, 4.0)
    """
    if shapes is None or len(kids) != 3:
        return UNBOUNDED
    count = summed_count(values[0], shapes[2:])
    return UNBOUNDED if count is None else _summed_products(kids[1:], count)


def grouped_contraction(kids, values, shapes) -> Interval:
    """Grouped matrix products (mixture-of-experts layers): each row is a contraction
    with its group's matrix, rows past the last group are zero.

    >>> grouped_contraction([(0.0, 1.0), (0.5, 1.0), (0.0, 8.0)], [], [(4, 2), (4, 3)])
    (0.0, 3.0)
    """
    if shapes is None or not shapes[1]:
        return UNBOUNDED
    lo, hi = _summed_products(kids[:2], shapes[1][-1])
    return (min(lo, 0.0), max(hi, 0.0))


def convolution(kids, values, shapes) -> Interval:
    """Convolutions: as many products as the weight has elements per output channel,
    plus the bias."""
    weight = shapes[2] if shapes is not None else None
    if not weight:
        return UNBOUNDED
    return _summed_products(kids, math.prod(weight[1:]))


def normalised(bias: bool) -> IntervalRule:
    """Layer norm (``bias``: its fourth operand) and RMS norm: within ``sqrt(n)`` of 0
    (``n`` normalised elements, the literal shape), times the weight, plus the bias.

    >>> normalised(False)([(-9.0, 9.0), None, (0.0, 2.0), None], [None, (4,), None, None], None)
    (-4.0, 4.0)
    """
    def rule(kids, values, shapes) -> Interval:
        if not isinstance(values[1], tuple) or not values[1]:
            return UNBOUNDED
        n = math.prod(values[1])
        out = (-math.sqrt(n), math.sqrt(n))
        if kids[2] is not None:
            out = _product(out, kids[2])
        if bias and kids[3] is not None:
            out = (out[0] + kids[3][0], out[1] + kids[3][1])
        return out
    return rule


def operand(index: int) -> IntervalRule:
    """The interval of operand ``index`` (attention's values, an embedding's table).

    >>> operand(1)([(0.0, 1.0), (2.0, 3.0)], [], None)
    (2.0, 3.0)
    """
    return lambda kids, values, shapes: kids[index]


def larger(kids, values, shapes) -> Interval:
    """``maximum(x, y)``."""
    (alo, ahi), (blo, bhi) = kids
    return (max(alo, blo), max(ahi, bhi))


def smaller(kids, values, shapes) -> Interval:
    """``minimum(x, y)``."""
    (alo, ahi), (blo, bhi) = kids
    return (min(alo, blo), min(ahi, bhi))


def either(kids, values, shapes) -> Interval:
    """``where(c, x, y)``."""
    return (min(kids[1][0], kids[2][0]), max(kids[1][1], kids[2][1]))


def filled(kids, values, shapes) -> Interval:
    """``masked_fill(x, mask, v)``."""
    lo, hi = kids[0]
    return (min(lo, kids[2][0]), max(hi, kids[2][1]))


def clamped(kids, values, shapes) -> Interval:
    """``clamp(x, lo, hi)`` with literal bounds."""
    lo, hi = kids[0]
    low = values[1] if isinstance(values[1], (int, float)) else -INF
    high = values[2] if isinstance(values[2], (int, float)) else INF
    return (min(max(lo, low), high), max(min(hi, high), low))


def fill(kids, values, shapes) -> Interval:
    """The literal fill value (``full``, ``full_like``)."""
    v = values[1]
    return (float(v), float(v)) if isinstance(v, (int, float)) else UNBOUNDED


def padded(kids, values, shapes) -> Interval:
    """``pad(x, sizes, value)``: the operand's interval widened to hold the fill value.

    >>> padded([(1.0, 2.0)], [None, (1, 1), 0.0], None)
    (0.0, 2.0)
    """
    lo, hi = kids[0]
    v = values[2]
    return (min(lo, float(v)), max(hi, float(v))) if isinstance(v, (int, float)) else (
        UNBOUNDED)


def joined(kids, values, shapes) -> Interval:
    """``cat``/``stack``: the hull of the tensors' intervals."""
    tensors = [k for k in kids[1:] if k is not None]
    return (min(k[0] for k in tensors), max(k[1] for k in tensors)) if tensors else UNBOUNDED
