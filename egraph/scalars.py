"""Scalar folding in exact arithmetic: what a constant expression is worth, and how sure.

Rules such as ``a * (b * c) = (a * b) * c`` hold for real numbers, not for floats: folded
in floating point, ``1e-5 * 1e5`` and ``(x * 1e-5) * 1e5`` reassociated give values that
differ in the last bit, and an analysis that compared them would call a sound rule wrong.
So constants fold in exact rational arithmetic (:class:`fractions.Fraction`), where every
ring identity holds: two folds of equal real expressions give equal values, and a
disagreement between two exact values is a real bug (a wrong rule or analysis).

A fold gives ``(exact, approx)``: ``exact`` is the rational value (None where the result is
not rational or not known exactly: ``sqrt(2)``, ``exp(1)``, overflow, NaN), ``approx`` the
float that Python computes for the expression as written (what an emitted program
evaluates). A class holds a float literal only when its exact value is that float.

>>> exact, approx = fold("mul", [(Fraction(1e-5), 1e-5), (Fraction(1e5), 1e5)])
>>> exact == Fraction(1e-5) * Fraction(1e5), approx
(True, 1.0)
>>> representable(exact)  # the product of the two doubles is not 1, nor any double
False
>>> fold("sqrt", [(Fraction(9, 4), 2.25)])
(Fraction(3, 2), 1.5)
>>> fold("sqrt", [(Fraction(2), 2.0)])[0] is None
True

A symbolic size folds only by size arithmetic (its result is a size for every size); a
float made from one would be its example's value, so it is not folded:

>>> import sympy
>>> s0 = sympy.Symbol("s0", integer=True, positive=True)
>>> seq = Size(8, s0, {s0: 8})
>>> fold("mul", [(None, seq), (Fraction(2), 2)]), fold("div", [(Fraction(1), 1.0), (None, seq)])
((None, 2*s0), (None, None))
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from egraph.dims import Size

__all__ = ["Fraction", "exact_of", "fold", "representable", "FLOAT_OPS"]

def _ieee(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` with IEEE results where Python raises: a tensor program's ``exp(1000)`` is
    inf and ``log(0)`` is -inf, so an emitted program that computes a constant in Python
    must not raise where the source computed it in torch."""
    def scalar_op(*args):
        try:
            return fn(*args)
        except (OverflowError, ZeroDivisionError, ValueError):
            import numpy  # IEEE semantics, as torch computes

            with numpy.errstate(all="ignore"):
                return float(getattr(numpy, _NUMPY[name])(*map(numpy.float64, args)))
    scalar_op.__name__ = scalar_op.__qualname__ = name
    return scalar_op


# The math functions that raise where torch gives inf or NaN; Python's operators stay (the
# emitted code reads ``size ** 0.5``), as shape arithmetic does not divide by zero.
_NUMPY = {"sqrt": "sqrt", "exp": "exp", "log": "log"}


FLOAT_OPS: dict[str, Callable[..., Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": operator.pow, "neg": operator.neg, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "tanh": math.tanh, "sin": math.sin,
    "cos": math.cos, "floor": math.floor, "ceil": math.ceil, "abs": abs,
    "floordiv": operator.floordiv, "remainder": operator.mod,
}
FLOAT_OPS.update({name: _ieee(FLOAT_OPS[name], name) for name in _NUMPY})
"""Python implementations of ops on scalars (shape arithmetic), as a program evaluates them:
IEEE results (inf, nan) where Python would raise.

>>> FLOAT_OPS["exp"](1000.0), FLOAT_OPS["sqrt"](-1.0), FLOAT_OPS["log"](0.0)
(inf, nan, -inf)
"""

_EXACT_OPS: dict[str, Callable[..., Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "neg": operator.neg, "abs": abs, "floor": math.floor, "ceil": math.ceil,
    "floordiv": operator.floordiv, "remainder": operator.mod,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge,
}


def exact_of(value: Any) -> Fraction | None:
    """The exact rational value of a Python number (None for bools, NaN, infinities and
    symbolic sizes, whose ``int`` is only the example's value).

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> exact_of(3), exact_of(0.5), exact_of(Size(8, s0, {s0: 8}))
    (Fraction(3, 1), Fraction(1, 2), None)
    """
    if isinstance(value, (bool, Size)) or not isinstance(value, (int, float, Fraction)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return Fraction(value)


def representable(exact: Fraction | None) -> bool:
    """True when ``exact`` is exactly a (finite) float, so a float literal can stand for it."""
    if exact is None:
        return False
    try:
        return Fraction(float(exact)) == exact
    except OverflowError:
        return False


def _exact(op: str, values: list[Fraction]) -> Any:
    """The exact result, or None when it is not rational (or not worth computing)."""
    fn = _EXACT_OPS.get(op)
    if fn is not None:
        result = fn(*values)
        return Fraction(result) if not isinstance(result, bool) else None
    if op == "pow":
        base, exponent = values
        if exponent.denominator == 1 and abs(exponent) <= 64:
            return base ** int(exponent)
        if exponent.denominator == 2 and abs(exponent) <= 64:
            root = _exact_sqrt(base)
            return None if root is None else root ** int(exponent * 2)
        return None
    if op == "sqrt":
        return _exact_sqrt(values[0])
    return None


def _exact_sqrt(value: Fraction) -> Fraction | None:
    if value < 0:
        return None
    num, den = math.isqrt(value.numerator), math.isqrt(value.denominator)
    if num * num == value.numerator and den * den == value.denominator:
        return Fraction(num, den)
    return None


def fold(op: str, args: list[tuple[Fraction | None, Any]]) -> tuple[Fraction | None, Any]:
    """Fold ``op`` over ``(exact, approx)`` arguments: ``(exact, approx)`` of the result.

    ``approx`` is None when Python cannot evaluate the expression (division by zero, a
    domain error); ``exact`` is None when the result is not known exactly.
    """
    approx_args = [a for _, a in args]
    try:
        approx = FLOAT_OPS[op](*approx_args)
    except (ArithmeticError, ValueError, TypeError):
        return None, None
    if any(isinstance(a, Size) for a in approx_args) and (
            isinstance(approx, bool) or not isinstance(approx, int)):
        # Size arithmetic gives sizes; anything else of a symbolic size (``0.5 * s0`` is
        # float arithmetic on the example's value) is one number for one size only
        return None, None
    if isinstance(approx, complex):
        return None, None
    exacts = [e for e, _ in args]
    if any(e is None for e in exacts):
        return None, approx
    try:
        exact = _exact(op, exacts)
    except (ArithmeticError, ValueError, TypeError):
        return None, approx
    if exact is None:
        return None, approx
    return exact, approx
