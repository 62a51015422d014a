"""The FPCore language this front end covers: its operators and constants, each with the
torch function that computes it and its meaning over the reals (mpmath).

An :class:`Operator` is FPCore's name, its arity, the torch callable (by qualified name: the
op table's spelling of the op it becomes, so ingest, emission, the sympy proofs and the
accuracy search know it) and the function over mpmath reals that the reference evaluates.
Operators of FPCore's standard that torch computes but the op table does not model, and
those torch has no function for, are listed in :data:`REFUSED` with the reason.

>>> OPERATORS["fmax"].torch, OPERATORS["fmax"].arity
('torch.fmax', 2)
>>> import mpmath
>>> OPERATORS["sqrt"].real(mpmath.mpf(-1))  # no real square root: not a number
mpf('nan')
>>> REFUSED["tgamma"]
'the gamma function is not in the op table'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mpmath as mp

from egraph.ops.reals import cosh, exp, expm1, power, sinh, tanh

__all__ = ["CONSTANTS", "CONTROL", "OPERATORS", "REFUSED", "UNSUPPORTED", "Operator",
           "real_value"]


@dataclass(frozen=True)
class Operator:
    """An FPCore operator: ``arity`` (None: any number, at least ``least``), the torch
    callable that computes it (``torch``, a qualified name; None where the module builder
    writes it out of other ops: ``cbrt``, ``fma``), and its meaning over the reals
    (``real``, on mpmath numbers; booleans for comparisons and logic)."""

    name: str
    arity: int | None
    torch: str | None
    real: Callable
    least: int = 0
    minus_one: bool = False
    """``-`` with one argument is negation."""


def real_value(value):
    """An mpmath result as a real: NaN where the mathematics leaves the reals (a complex
    result, a division by zero, a value outside the function's domain).

    >>> real_value(mp.sqrt(mp.mpf(-4))), real_value(mp.mpf(2))
    (mpf('nan'), mpf('2.0'))
    """
    if isinstance(value, mp.mpc):
        return value.real if value.imag == 0 else mp.nan
    return value


def _real(function: Callable, domain: Callable | None = None) -> Callable:
    def real(*args):
        if any(mp.isnan(a) for a in args):
            return mp.nan
        if domain is not None and not domain(*args):
            return mp.nan
        try:
            return real_value(function(*args))
        except (ZeroDivisionError, ValueError):
            return mp.nan
    real.__name__ = getattr(function, "__name__", "real")
    return real


def _divide(x, y):
    if y == 0:
        raise ZeroDivisionError
    return x / y


def _fmod(x, y):
    """C's fmod: the remainder of the division truncated toward zero (sign of ``x``)."""
    if y == 0 or mp.isinf(x):
        return mp.nan
    if mp.isinf(y):
        return x
    if x != 0 and mp.mag(x) - mp.mag(y) > 2 ** 20:
        # the remainder is x's digits below |y|: none is known of an x that far above y
        # (exp(1e300) at any precision covered), and mpmath would shift x's digits by the
        # whole distance ("too many digits in integer")
        return mp.nan
    r = mp.fmod(abs(x), abs(y))
    return r if x >= 0 else -r


def _cbrt(x):
    return mp.cbrt(x) if x >= 0 else -mp.cbrt(-x)


def _fmax(x, y):
    return y if mp.isnan(x) else x if mp.isnan(y) else max(x, y)


def _fmin(x, y):
    return y if mp.isnan(x) else x if mp.isnan(y) else min(x, y)


def _copysign(x, y):
    return abs(x) if y >= 0 else -abs(x)


def _atanh(x):
    if abs(x) == 1:
        return mp.inf * x
    return mp.atanh(x)


def _chain(compare: Callable) -> Callable:
    def chained(*args):
        return all(compare(a, b) for a, b in zip(args, args[1:]))
    return chained


def _distinct(*args):
    return all(a != b for i, a in enumerate(args) for b in args[i + 1:])


def _op(name: str, arity: int | None, torch: str | None, real: Callable, **kw) -> Operator:
    return Operator(name, arity, torch, real, **kw)


_UNIT = lambda x: -1 <= x <= 1  # noqa: E731 - the domain of asin and acos
OPERATORS: dict[str, Operator] = {o.name: o for o in [
    _op("+", 2, "operator.add", lambda x, y: x + y),
    _op("-", 2, "operator.sub", lambda x, y: x - y, minus_one=True),
    _op("*", 2, "operator.mul", lambda x, y: x * y),
    _op("/", 2, "operator.truediv", _real(_divide)),
    _op("fabs", 1, "torch.abs", abs),
    _op("sqrt", 1, "torch.sqrt", _real(mp.sqrt, lambda x: x >= 0)),
    _op("cbrt", 1, None, _real(_cbrt)),
    _op("exp", 1, "torch.exp", _real(exp)),
    _op("expm1", 1, "torch.expm1", _real(expm1)),
    _op("log", 1, "torch.log", _real(mp.log, lambda x: x >= 0)),
    _op("log1p", 1, "torch.log1p", _real(mp.log1p, lambda x: x >= -1)),
    _op("log2", 1, "torch.log2", _real(lambda x: mp.log(x, 2) if x else -mp.inf,
                                       lambda x: x >= 0)),
    _op("pow", 2, "torch.pow", _real(power)),
    _op("hypot", 2, "torch.hypot", _real(mp.hypot)),
    _op("fma", 3, None, lambda x, y, z: x * y + z),
    _op("sin", 1, "torch.sin", _real(mp.sin)),
    _op("cos", 1, "torch.cos", _real(mp.cos)),
    _op("tan", 1, "torch.tan", _real(mp.tan)),
    _op("asin", 1, "torch.asin", _real(mp.asin, _UNIT)),
    _op("acos", 1, "torch.acos", _real(mp.acos, _UNIT)),
    _op("atan", 1, "torch.atan", _real(mp.atan)),
    _op("atan2", 2, "torch.atan2", _real(mp.atan2)),
    _op("sinh", 1, "torch.sinh", _real(sinh)),
    _op("cosh", 1, "torch.cosh", _real(cosh)),
    _op("tanh", 1, "torch.tanh", _real(tanh)),
    _op("asinh", 1, "torch.asinh", _real(mp.asinh)),
    _op("acosh", 1, "torch.acosh", _real(mp.acosh, lambda x: x >= 1)),
    _op("atanh", 1, "torch.atanh", _real(_atanh, _UNIT)),
    _op("erf", 1, "torch.erf", _real(mp.erf)),
    _op("erfc", 1, "torch.erfc", _real(mp.erfc)),
    _op("floor", 1, "torch.floor", _real(mp.floor)),
    _op("ceil", 1, "torch.ceil", _real(mp.ceil)),
    _op("fmod", 2, "torch.fmod", _real(_fmod)),
    _op("fmax", 2, "torch.fmax", _fmax),
    _op("fmin", 2, "torch.fmin", _fmin),
    _op("copysign", 2, "torch.copysign", _real(_copysign)),
    _op("<", None, "operator.lt", _chain(lambda a, b: a < b), least=2),
    _op(">", None, "operator.gt", _chain(lambda a, b: a > b), least=2),
    _op("<=", None, "operator.le", _chain(lambda a, b: a <= b), least=2),
    _op(">=", None, "operator.ge", _chain(lambda a, b: a >= b), least=2),
    _op("==", None, "operator.eq", _chain(lambda a, b: a == b), least=2),
    _op("!=", None, "operator.ne", _distinct, least=2),
    _op("and", None, "operator.and_", lambda *a: all(a)),
    _op("or", None, "operator.or_", lambda *a: any(a)),
    _op("not", 1, "torch.logical_not", lambda a: not a),
]}
"""FPCore's operators that run here, by name."""

CONSTANTS: dict[str, Callable] = {
    "E": lambda: mp.e, "LOG2E": lambda: 1 / mp.ln2, "LOG10E": lambda: 1 / mp.ln10,
    "LN2": lambda: mp.ln2, "LN10": lambda: mp.ln10, "PI": lambda: mp.pi,
    "PI_2": lambda: mp.pi / 2, "PI_4": lambda: mp.pi / 4, "M_1_PI": lambda: 1 / mp.pi,
    "M_2_PI": lambda: 2 / mp.pi, "M_2_SQRTPI": lambda: 2 / mp.sqrt(mp.pi),
    "SQRT2": lambda: mp.sqrt(2), "SQRT1_2": lambda: 1 / mp.sqrt(2),
    "INFINITY": lambda: mp.inf, "NAN": lambda: mp.nan, "TRUE": lambda: True,
    "FALSE": lambda: False,
}
"""FPCore's named constants, as mpmath values at the working precision."""

CONTROL = ("if", "let", "let*", "!", "cast", "digits")
"""The special forms this front end reads (besides the operators)."""

_NOT_IN_TABLE = "is not in the op table"
REFUSED: dict[str, str] = {
    **{name: f"{what} {_NOT_IN_TABLE}" for name, what in [
        ("exp2", "exp2"), ("log10", "log10"), ("tgamma", "the gamma function"),
        ("lgamma", "the log-gamma function"), ("trunc", "trunc"), ("round", "round"),
        ("nearbyint", "nearbyint"), ("remainder", "IEEE remainder"), ("fdim", "fdim"),
        ("isfinite", "isfinite"), ("isinf", "isinf"), ("isnan", "isnan"),
        ("isnormal", "isnormal"), ("signbit", "signbit")]},
}
"""FPCore's standard operators that are refused, with the reason."""

UNSUPPORTED: dict[str, str] = {
    "while": "loops ('while') are not supported: a tensor program has no loop",
    "while*": "loops ('while*') are not supported: a tensor program has no loop",
    "for": "loops ('for') are not supported: a tensor program has no loop",
    "for*": "loops ('for*') are not supported: a tensor program has no loop",
    "tensor": "tensors ('tensor') are not supported: arguments and results are scalars",
    "tensor*": "tensors ('tensor*') are not supported: arguments and results are scalars",
    "ref": "tensors ('ref') are not supported: arguments and results are scalars",
    "dim": "tensors ('dim') are not supported: arguments and results are scalars",
    "size": "tensors ('size') are not supported: arguments and results are scalars",
    "array": "tensors ('array') are not supported: arguments and results are scalars",
}
"""FPCore constructs outside the language covered, with the reason."""
