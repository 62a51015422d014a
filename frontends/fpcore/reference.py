"""The exact value of an FPCore expression, rounded once to the program's precision.

The expression is evaluated over the reals with mpmath at a working precision well above the
target's, then at twice that, and so on, until two evaluations round to the same float of
the target precision and the working precision exceeds the bits that cancelled in the
evaluation's sums and differences by the target's (as Herbie's Rival raises its precision
until the rounding of the result is decided): the bits that cancel, and those of a smaller
operand that a sum absorbs (``1 - eps`` for ``eps`` of 1e-163 is 1 at 192 bits, and
``log((1 - eps) / (1 + eps))`` then 0, decided at every precision until the sum keeps
``eps``). Literals are exact (``0.1`` is one tenth),
functions leave the reals as NaN (``sqrt`` of a negative, ``x / 0``), and the result is
the nearest float of the precision (infinite beyond its largest).

A comparison is decided when its operands' differences agree, in sign and to the target's
bits, between two working precisions. Operands equal over the reals but computed with
rounding error (Kahan's Monster compares ``z``, exactly 0 over the reals, with 0; at ``p``
bits ``z`` is near ``2^-2p``) differ by an amount that shrinks with every doubling, so no
precision decides them, and the point's result is NaN: not a value the sampler keeps, as
Rival leaves such points unsamplable rather than guess a branch.

>>> from frontends.fpcore.expression import Call, Number, Variable
>>> from fractions import Fraction
>>> e = Call("-", (Call("+", (Variable("x"), Number(Fraction(1), "1"))), Variable("x")))
>>> correctly_rounded(e, ("x",), (1e20,), "binary64")  # (x + 1) - x is 1 over the reals
1.0
"""

from __future__ import annotations

import math
from itertools import combinations

import mpmath as mp
import numpy as np

from frontends.fpcore.expression import Annotation, Call, Constant, Expr, If, Let, Number, Variable
from frontends.fpcore.language import CONSTANTS, OPERATORS

__all__ = ["MAX_BITS", "START_BITS", "correctly_rounded", "evaluate", "round_to"]

START_BITS = {"binary32": 96, "binary64": 192}
"""The first working precision (bits) per target precision."""
MAX_BITS = 4096
"""The working precision where the doubling stops: a result not decided by then is the
last evaluation's rounding."""


_COMPARISONS = frozenset({"<", ">", "<=", ">=", "==", "!="})


def evaluate(expr: Expr, env: dict[str, object], lost: list[float] | None = None,
             compared: list | None = None):
    """``expr`` over the reals at mpmath's current precision, with ``env`` the values (mpf)
    of its free variables; booleans for comparisons and logic. ``lost`` (a one-item list)
    adds up the bits that cancel in sums and differences (all of them where one is zero);
    ``compared`` collects, in evaluation order, the differences between each comparison's
    operands (what decides it).

    >>> from frontends.fpcore.expression import Call, Variable
    >>> with mp.workprec(60):
    ...     evaluate(Call("sqrt", (Variable("x"),)), {"x": mp.mpf(2)})
    mpf('1.4142135623730950483')
    """
    if isinstance(expr, Variable):
        return env[expr.name]
    if isinstance(expr, Number):
        return mp.mpf(expr.value.numerator) / expr.value.denominator
    if isinstance(expr, Call):
        args = [evaluate(a, env, lost, compared) for a in expr.args]
        if expr.op == "-" and len(args) == 1:
            return -args[0]
        result = OPERATORS[expr.op].real(*args)
        if lost is not None and expr.op in ("+", "-"):
            lost[0] += _lost(result, args)
        if compared is not None and expr.op in _COMPARISONS:
            compared.extend(a - b for a, b in combinations(args, 2))
        return result
    if isinstance(expr, If):
        taken = expr.then if evaluate(expr.cond, env, lost, compared) else expr.orelse
        return evaluate(taken, env, lost, compared)
    if isinstance(expr, Let):
        inner = dict(env)
        for name, value in expr.bindings:
            inner[name] = evaluate(value, inner if expr.sequential else env, lost, compared)
        return evaluate(expr.body, inner, lost, compared)
    if isinstance(expr, Annotation):
        return evaluate(expr.body, env, lost, compared)
    if isinstance(expr, Constant):
        return CONSTANTS[expr.name]()
    raise TypeError(f"not an FPCore expression: {expr!r}")


def _lost(result, args) -> float:
    """Bits a sum or difference loses at the working precision: those of the larger
    operand that cancel, or the exponent gap to the smaller operand, whose bits the sum
    keeps only past it.

    >>> with mp.workprec(192):
    ...     _lost(mp.mpf(1) - mp.mpf("1e-163"), [mp.mpf(1), mp.mpf("1e-163")]) > 500
    True
    """
    sizes = [abs(a) for a in args]
    largest = max(sizes)
    if not mp.isfinite(largest) or largest == 0 or mp.isnan(result):
        return 0.0
    if result == 0:
        return float(mp.mp.prec)
    smallest = min(sizes)
    absorbed = mp.mag(largest) - mp.mag(smallest) if smallest != 0 else 0
    # (binary exponents.) A gap past MAX_BITS is not counted: no working precision tried
    # keeps that operand's bits, so doubling towards MAX_BITS cannot change the result it
    # gives (``exp(x) - 1`` at x = 1e300 went up to 4,096 bits, 0.2 s a point, for the 1.0
    # that 192 bits gave); a double exponential's gap is too large for a float anyway
    absorbed = absorbed if absorbed < MAX_BITS else 0
    return float(min(2 * MAX_BITS, max(0, mp.mag(largest) - mp.mag(result), absorbed)))


def round_to(value, precision: str) -> float:
    """A real (mpf, or a boolean: 1.0 or 0.0) rounded to the nearest float of
    ``precision``, as a Python float.

    >>> round_to(mp.mpf(1) / 3, "binary32")
    0.3333333432674408
    """
    if isinstance(value, bool):
        return float(value)
    result = float(value)
    if precision == "binary32":
        with np.errstate(over="ignore"):
            result = float(np.float32(result))
    return result


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _comparisons_agree(before: list, after: list, target: int) -> bool:
    """Whether the comparisons of two evaluations, at a precision and at twice it, are
    decided: the same number of them, and each difference of operands the same in sign and
    to ``target`` bits (or exactly zero in both).

    >>> third = mp.mpf(1) / 3
    >>> _comparisons_agree([third - 0], [third - 0], 53)
    True
    >>> _comparisons_agree([mp.ldexp(1, -400)], [mp.ldexp(1, -800)], 53)  # noise of 0
    False
    """
    if len(before) != len(after):
        return False
    for a, b in zip(before, after):
        if a == b:
            continue
        if a == 0 or b == 0 or (a < 0) != (b < 0) or abs(a - b) > abs(b) * mp.ldexp(1, -target):
            return False
    return True


def correctly_rounded(expr: Expr, names: tuple[str, ...], point: tuple[float, ...],
                      precision: str) -> float:
    """``expr`` at ``point`` (values of ``names``) over the reals, rounded to ``precision``;
    NaN where a comparison is not decided within :data:`MAX_BITS` (see the module
    docstring).

    >>> from frontends import fpcore
    >>> (p,) = fpcore.parse("(FPCore (x) (let ([r (sqrt (+ (* x x) 1))])"
    ...                     " (if (== (- r x) (/ 1 (+ x r))) 1 0)))")
    >>> correctly_rounded(p.body, ("x",), (3.0,), "binary64")  # equal over the reals
    nan
    """
    bits, last, last_compared = START_BITS[precision], None, None
    target = 24 if precision == "binary32" else 53
    while True:
        lost, compared = [0.0], []
        with mp.workprec(bits):
            env = {n: mp.mpf(v) for n, v in zip(names, point)}
            result = round_to(evaluate(expr, env, lost, compared), precision)
        agree = last is not None and _comparisons_agree(last_compared, compared, target)
        decided = agree and _same(result, last) and bits > lost[0] + 2 * target
        if decided:
            return result
        if bits >= MAX_BITS:
            return result if agree or not compared else math.nan
        last, last_compared, bits = result, compared, 2 * bits
