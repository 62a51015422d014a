"""The op table's sympy forms evaluated over mpmath reals, at the caller's precision.

:func:`lambdify` is sympy's ``lambdify`` into mpmath with the functions mpmath computes
slowly at high precision far from 0 replaced (:data:`FUNCTIONS`: ``exp`` and the
functions made of it). The exact references of validation,
of the accuracy search and of FPCore programs all evaluate through it, so a point whose
value is far past any float's range costs milliseconds, not a tenth of a second.

>>> import mpmath as mp, sympy as sp
>>> x = sp.Symbol("x")
>>> with mp.workprec(2200):
...     float(lambdify([x], sp.exp(x) / sp.exp(x - 1))(mp.mpf("1e300")))
2.718281828459045
>>> with mp.workprec(2200):
...     all(abs(f(v) / g(v) - 1) < mp.mpf(2) ** -2190 for f, g in (
...         (sinh, mp.sinh), (cosh, mp.cosh), (tanh, mp.tanh), (expm1, mp.expm1))
...         for v in (mp.mpf(-3e3), mp.mpf(1500), mp.mpf(7e10)))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import mpmath as mp

__all__ = ["FUNCTIONS", "cosh", "exp", "expm1", "lambdify", "literal", "power", "rational",
           "sinh", "tanh"]


def literal(value: float) -> Fraction | None:
    """The real number a float constant of a program stands for: the simple fraction it
    rounds (``1 / 3``), else the decimal of at most 15 digits it rounds (``0.3275911``, as
    written in the source: every such decimal rounds to a float of its own), else the
    float's own binary value (``math.pi``, ``0.1 + 0.2``); None for inf and NaN. References
    read constants this way, as FPCore and Herbie do, so a program is judged against the
    formula its author wrote, not against the rounding of its literals.

    >>> literal(1 / 3), literal(0.3275911), literal(1e-05), literal(0.1 + 0.2) == 0.1 + 0.2
    (Fraction(1, 3), Fraction(3275911, 10000000), Fraction(1, 100000), True)
    """
    if not math.isfinite(value):
        return None
    simple = Fraction(value).limit_denominator(1000)
    if float(simple) == value:
        return simple
    written = repr(float(value))
    digits = written.split("e")[0].replace("-", "").replace(".", "").strip("0")
    return Fraction(written) if len(digits) <= 15 else Fraction(value)


def rational(value: int | float):
    """A Python number as the exact sympy number it stands for (:func:`literal` for a
    float); None for inf and NaN.

    >>> rational(3), rational(0.3275911), rational(float("nan")) is None
    (3, 3275911/10000000, True)
    """
    import sympy as sp

    fraction = Fraction(value) if isinstance(value, int) else literal(value)
    return None if fraction is None else sp.Rational(fraction.numerator, fraction.denominator)


def exp(x):
    """``exp`` over the reals, the same value as ``mp.exp``, computed far from 0 as
    ``2^n * exp(r)`` with ``x = n log 2 + r``: above 600 bits mpmath computes the exp of
    a large integer (every float past 2^53 is one) as a power of ``e`` by
    repeated squaring, 18 ms at 2,200 bits near 1e300, where this takes under 1 ms.

    >>> with mp.workprec(1536):
    ...     exp(mp.mpf("1e600")) == mp.exp(mp.mpf("1e600"))
    True
    """
    if _near(x):
        return mp.exp(x)
    with mp.workprec(mp.mp.prec + int(mp.mag(x)) + 20):
        n = mp.floor(x / mp.ln2)
        r = x - n * mp.ln2
    return mp.ldexp(mp.exp(r), int(n))


def _near(x) -> bool:
    """Whether mpmath's own function is quick at ``x`` (below 1024 in magnitude)."""
    return not mp.isfinite(x) or abs(x) < 1024


def _far(name: str, function: Callable, near: Callable) -> Callable:
    """``near`` below 1024 in magnitude, else ``function`` (a form through :func:`exp`
    that does not cancel there: one of ``exp(x)``, ``exp(-x)`` is below the other's last
    digit by a factor of ``e**2048``)."""
    def real(x):
        return near(x) if _near(x) else function(x)
    real.__name__ = name
    real.__doc__ = f"``{name}`` over the reals, through :func:`exp` far from 0."
    return real


sinh = _far("sinh", lambda x: (exp(x) - exp(-x)) / 2, mp.sinh)
cosh = _far("cosh", lambda x: (exp(x) + exp(-x)) / 2, mp.cosh)
tanh = _far("tanh", lambda x: mp.sign(x) * (1 - 2 / (exp(2 * abs(x)) + 1)), mp.tanh)
expm1 = _far("expm1", lambda x: exp(x) - 1, mp.expm1)


def power(x, y):
    """``x**y`` over the reals (NaN for a negative ``x`` and a ``y`` that is not an
    integer). A result past ``2**(2**20)`` or below its inverse is infinite or 0: its
    digits are out of reach (``3**(2**1000)``), and no precision covered tells it from
    either. Past any float's range it is ``exp(y log |x|)`` through :func:`exp`: mpmath
    computes ``10**n`` of an integer ``n`` near 1e1800 (a polynomial of degree 6 at 1e300)
    by squaring, 0.5 s at 2,200 bits.

    >>> with mp.workprec(2200):
    ...     float(power(10, mp.mpf(400)) / power(10, mp.mpf(399))), power(-8, mp.mpf(1) / 3)
    (10.0, mpf('nan'))
    """
    if x < 0 and not mp.isint(y):
        return mp.nan
    if x != 0 and mp.isfinite(x) and mp.isfinite(y) and abs(x) != 1:
        with mp.workprec(30):
            scale = y * mp.log(abs(x), 2)
        # (mpmath is quick below 600 bits, and for small integer powers at any precision)
        slow = mp.mp.prec > 600 and not (mp.isint(y) and abs(y) < 2 ** 16)
        if abs(scale) > 2 ** 20 or (abs(scale) > 1024 and slow):
            # y odd, without int(y): 1e300's digits would take the whole memory
            negative = x < 0 and mp.isint(y) and not mp.isint(y / 2)
            if abs(scale) > 2 ** 20:
                magnitude = mp.inf if scale > 0 else mp.mpf(0)
            else:
                with mp.workprec(mp.mp.prec + int(mp.mag(y)) + 20):
                    t = y * mp.log(abs(x))
                magnitude = exp(t)
            return -magnitude if negative else magnitude
    return mp.power(x, y)


FUNCTIONS = {"exp": exp, "sinh": sinh, "cosh": cosh, "tanh": tanh, "expm1": expm1,
             "power": power}
"""mpmath's functions that :func:`lambdify` replaces, by sympy's printed name; a power
whose exponent is not an integer constant is printed as ``power``."""


def lambdify(symbols, expr) -> Callable:
    """``expr`` (sympy, over ``symbols``) as a function of mpmath numbers, computed with
    mpmath except for :data:`FUNCTIONS` (see the module docstring)."""
    import sympy as sp
    from sympy.printing.pycode import MpmathPrinter

    class Printer(MpmathPrinter):
        def _print_Pow(self, e, rational=False):
            if e.exp.is_Integer or e.exp == sp.Rational(1, 2):
                return super()._print_Pow(e, rational=rational)
            return f"power({self._print(e.base)}, {self._print(e.exp)})"

    printer = Printer({"fully_qualified_modules": False, "inline": True,
                       "allow_unknown_functions": True,
                       "user_functions": {name: name for name in FUNCTIONS}})
    return sp.lambdify(symbols, expr, modules=[FUNCTIONS, "mpmath"], printer=printer)
