"""Observed value ranges: interval arithmetic from the example inputs' ranges.

These ranges inform costs only (the curvature cost), never rules: they describe the values
seen on example inputs, not what the ops guarantee (that is :mod:`egraph.signs`). Each op
maps its inputs' intervals to an enclosure of its output; unknown means ``(-inf, inf)``.

>>> interval_of("exp", [(0.0, 1.0)], [], None)
(1.0, 2.718281828459045)
>>> interval_of("sub", [(0.0, 1.0), (0.0, 1.0)], [], None)
(-1.0, 1.0)
"""

from __future__ import annotations

import math
from typing import Any

INF = math.inf
UNBOUNDED = (-INF, INF)

_SAME = {"reshape", "permute", "transpose", "expand", "unsqueeze", "squeeze", "flatten",
         "getitem", "to", "amax", "amin", "mean", "gather", "cumsum"}


def _safe(fn, x: float) -> float:
    try:
        return fn(x)
    except OverflowError:
        return INF
    except ValueError:
        return math.nan


def _monotone(fn, lo: float, hi: float) -> tuple[float, float]:
    a, b = _safe(fn, lo), _safe(fn, hi)
    if math.isnan(a) or math.isnan(b):
        return UNBOUNDED
    return (a, b)


def _product(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    values = []
    for x in a:
        for y in b:
            v = x * y
            values.append(0.0 if math.isnan(v) else v)  # 0 * inf: the bound is 0 there
    return (min(values), max(values))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def _softplus(x: float) -> float:
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def _pow(a: tuple[float, float], k: Any) -> tuple[float, float]:
    lo, hi = a
    if not isinstance(k, (int, float)) or isinstance(k, bool):
        return UNBOUNDED
    if float(k).is_integer():
        k = int(k)
        ends = [_safe(lambda v: v**k, lo), _safe(lambda v: v**k, hi)]
        if k % 2 == 0 and lo < 0 < hi:
            return (0.0, max(ends))
        return (min(ends), max(ends))
    if lo >= 0:
        return _monotone(lambda v: v**k, lo, hi) if k > 0 else _monotone(
            lambda v: v**k, hi, lo)
    return UNBOUNDED


def interval_of(op: str, kids: list[tuple[float, float]], values: list[Any],
                shapes: Any) -> tuple[float, float]:
    """The output interval of ``op`` from its inputs' intervals (``values``: the literal
    values of attribute children; ``shapes``: (output shape, first input shape) or None)."""
    if op in _SAME:
        return kids[0]
    if op == "add":
        return (kids[0][0] + kids[1][0], kids[0][1] + kids[1][1])
    if op == "sub":
        return (kids[0][0] - kids[1][1], kids[0][1] - kids[1][0])
    if op == "neg":
        return (-kids[0][1], -kids[0][0])
    if op == "mul":
        return _product(kids[0], kids[1])
    if op in ("div", "reciprocal"):
        num, den = (kids[0], kids[1]) if op == "div" else ((1.0, 1.0), kids[0])
        if den[0] > 0 or den[1] < 0:
            return _product(num, (1.0 / den[1], 1.0 / den[0]))
        return UNBOUNDED
    lo, hi = kids[0] if kids else UNBOUNDED
    if op == "abs":
        if lo >= 0:
            return (lo, hi)
        if hi <= 0:
            return (-hi, -lo)
        return (0.0, max(-lo, hi))
    if op == "exp":
        return _monotone(math.exp, lo, hi)
    if op == "expm1":
        return _monotone(math.expm1, lo, hi)
    if op == "log":
        return _monotone(math.log, lo, hi) if lo > 0 else (-INF, _safe(math.log, hi)
                                                           if hi > 0 else INF)
    if op == "log1p":
        return _monotone(math.log1p, lo, hi) if lo > -1 else UNBOUNDED
    if op == "sqrt":
        return (math.sqrt(max(lo, 0.0)), math.sqrt(hi) if hi >= 0 else 0.0)
    if op == "rsqrt":
        return (1.0 / math.sqrt(hi), 1.0 / math.sqrt(lo)) if lo > 0 else (0.0, INF)
    if op == "pow":
        return _pow(kids[0], values[1] if len(values) > 1 else None)
    if op in ("sigmoid", "tanh", "logsigmoid", "softplus", "erf"):
        fn = {"sigmoid": _sigmoid, "tanh": math.tanh, "erf": math.erf, "softplus": _softplus,
              "logsigmoid": lambda v: -_softplus(-v)}[op]
        return _monotone(fn, lo, hi)
    if op in ("sin", "cos"):
        return (-1.0, 1.0)
    if op == "relu":
        return (max(lo, 0.0), max(hi, 0.0))
    if op in ("gelu", "silu"):
        return (lo if lo >= 0 else -0.28, max(hi, 0.0))
    if op == "softmax":
        return (1.0, 1.0) if _reduced(shapes, values) == 1 else (0.0, 1.0)
    if op == "log_softmax":
        n = _reduced(shapes, values)
        return (lo - hi - math.log(n), 0.0) if n else (-INF, 0.0)
    if op == "logsumexp":
        n = _reduced(shapes, values)
        return (lo, hi + math.log(n)) if n else UNBOUNDED
    if op == "sum":
        n = _reduced(shapes, values)
        return _product((lo, hi), (float(n), float(n))) if n else UNBOUNDED
    if op == "var":
        return (0.0, (hi - lo) ** 2 / 4 if math.isfinite(hi - lo) else INF)
    if op in ("matmul", "linear", "conv1d", "conv2d"):
        k = _contraction(op, shapes)
        if not k:
            return UNBOUNDED
        base = _product((lo, hi), kids[1])
        out = (base[0] * k, base[1] * k)
        if op != "matmul" and len(kids) > 2 and kids[2] is not None:
            out = (out[0] + kids[2][0], out[1] + kids[2][1])
        return out
    if op in ("layer_norm", "rms_norm"):
        n = _normalized(shapes)
        if not n:
            return UNBOUNDED
        out = (-math.sqrt(n), math.sqrt(n))
        weight = kids[2] if op == "layer_norm" else kids[2]
        if weight is not None:
            out = _product(out, weight)
        if op == "layer_norm" and kids[3] is not None:
            out = (out[0] + kids[3][0], out[1] + kids[3][1])
        return out
    if op == "sdpa":
        return kids[2]
    if op in ("maximum", "minimum"):
        (alo, ahi), (blo, bhi) = kids
        pick = max if op == "maximum" else min
        return (pick(alo, blo), pick(ahi, bhi))
    if op == "where":
        return (min(kids[1][0], kids[2][0]), max(kids[1][1], kids[2][1]))
    if op == "masked_fill":
        return (min(lo, kids[2][0]), max(hi, kids[2][1]))
    if op == "clamp":
        low = values[1] if isinstance(values[1], (int, float)) else -INF
        high = values[2] if isinstance(values[2], (int, float)) else INF
        return (min(max(lo, low), high), max(min(hi, high), low))
    if op in ("full", "full_like"):
        v = values[1]
        return (float(v), float(v)) if isinstance(v, (int, float)) else UNBOUNDED
    if op == "ones_like":
        return (1.0, 1.0)
    if op == "zeros_like":
        return (0.0, 0.0)
    if op == "embedding":
        return kids[1]
    if op in ("cat", "stack"):
        tensors = [k for k in kids[1:] if k is not None]
        return (min(k[0] for k in tensors), max(k[1] for k in tensors)) if tensors else UNBOUNDED
    return UNBOUNDED


def _reduced(shapes, values) -> int:
    """How many elements a reduction over ``values[1]`` (dims) combines."""
    if shapes is None or shapes[1] is None or len(values) < 2:
        return 0
    dims = values[1]
    if not isinstance(dims, tuple):
        return 0
    return math.prod(shapes[1][d] for d in dims if d < len(shapes[1]))


def _contraction(op: str, shapes) -> int:
    if shapes is None or shapes[1] is None or not shapes[1]:
        return 0
    if op in ("matmul", "linear"):
        return shapes[1][-1]
    return shapes[2] if len(shapes) > 2 and shapes[2] else 0


def _normalized(shapes) -> int:
    if shapes is None or len(shapes) < 3 or shapes[2] is None:
        return 0
    return shapes[2]
