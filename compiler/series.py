"""Series expansions (sympy) of a scalar formula around the points where it cancels.

Near 0 or at infinity a formula such as ``(1 - cos x) / x**2`` or ``atan(N + 1) - atan(N)``
loses every bit to cancellation, while its truncated series (``1/2 - x**2/24``,
``1/N**2 - 1/N**3``) is accurate there. :func:`series_candidates` gives, for each variable,
the expansions around 0, +inf and -inf (in Horner form where they are polynomials);
:mod:`compiler.herbie` measures them on the sample points and :mod:`compiler.regimes` keeps
one only on the input range where it is the most accurate candidate, as a ``torch.where``
branch.

>>> import sympy as sp
>>> x = sp.Symbol("x", real=True)
>>> dict(series_candidates((1 - sp.cos(x)) / x**2, [x]))["series in x around 0"]
1/2 - x**2/24
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import sympy as sp

__all__ = ["SeriesTimeout", "series_candidates", "time_limit"]


class SeriesTimeout(Exception):
    """A sympy computation ran past its time limit (:func:`time_limit`)."""


REPEAT_S = 0.05
"""After the time limit, the alarm fires again every this many seconds until the block
ends (see :func:`time_limit`)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`SeriesTimeout` in the block after ``seconds`` (main thread only:
    elsewhere the block runs unbounded, since only the main thread receives signals). An
    alarm already set around the block (a caller's own time limit) is set again after it,
    for the time it had left: a benchmark's minute had been lost to the first series
    inside it, and one ran for two.

    >>> with time_limit(1.0):
    ...     sp.series(sp.exp(sp.Symbol("x")), sp.Symbol("x"), 0, 3)
    1 + x + x**2/2 + O(x**3)
    """
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum, frame):
        if not _in_error_report(frame):
            raise SeriesTimeout(f"over {seconds:.1f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    # The alarm repeats until the block ends: an exception raised while Python runs a
    # weakref or garbage-collection callback is printed and dropped, and a single alarm
    # lost that way let a series run on until it took all the memory.
    outer, outer_repeat = signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    began = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:  # an alarm set around this block (a caller's time limit) goes on,
            # firing at once if it came due inside
            left = outer - (time.perf_counter() - began)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-4), outer_repeat)


_REPORTING = frozenset({"unraisable_hook", "unraisablehook", "excepthook", "showwarning",
                        "format_exception", "print_exception"})
"""Functions that report an exception Python dropped: an alarm raised inside them is not
caught by the block, it breaks the report (under pytest, the test fails for it)."""


def _in_error_report(frame) -> bool:
    """Whether ``frame`` runs inside the report of a dropped exception; the alarm then
    waits for its next repeat, after the report."""
    while frame is not None:
        if frame.f_code.co_name in _REPORTING:
            return True
        frame = frame.f_back
    return False


def series_candidates(expr: sp.Expr, symbols: list[sp.Symbol], terms: int = 4,
                      seconds: float = 4.0) -> list[tuple[str, sp.Expr]]:
    """``(label, truncated series)`` of ``expr`` in each of ``symbols`` around 0, +inf and
    -inf (``terms`` orders: up to ``x**(terms - 1)``), skipping expansions that sympy cannot
    make within ``seconds`` in all, that keep an unevaluated part, or that equal ``expr``.
    A series at +inf (-inf) that differs from the one at -inf (+inf) holds for positive
    (negative) values only and is NaN on the other side: ``rsqrt(x^2 + 1)`` is ``1/x`` at
    +inf and ``-1/x`` at -inf, while ``atan(x + 1) - atan(x)`` is ``1/x^2`` at both."""
    out: list[tuple[str, sp.Expr]] = []
    deadline = time.perf_counter() + seconds
    for s in symbols:
        if s not in expr.free_symbols:
            continue
        at: dict[str, sp.Expr] = {}
        for point, name in ((0, "0"), (sp.oo, "+inf"), (-sp.oo, "-inf")):
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                with time_limit(left):
                    approx = sp.series(expr, s, point, terms).removeO()
                    shorter = _truncations(approx, s, point)
                    approx = _horner(approx, s)
                    shorter = [_horner(t, s) for t in shorter]
            except (SeriesTimeout, Exception):  # noqa: BLE001 - sympy cannot expand it
                continue
            if (approx.has(sp.Order, sp.zoo, sp.nan, sp.oo, sp.I, sp.Subs, sp.Derivative)
                    or approx == expr or not approx.free_symbols):
                if approx.is_number and approx.is_finite:
                    out.append((f"series in {s} around {name}", approx))
                continue
            at[name] = [approx, *shorter]
        for name, approxes in at.items():
            other = {"+inf": "-inf", "-inf": "+inf"}.get(name)
            one_sided = other in at and sp.expand(approxes[0] - at[other][0]) != 0
            for approx in approxes:
                count = len(sp.Add.make_args(sp.expand(approx)))
                label = f"series in {s} around {name}" + (
                    f" ({count} term{'s' * (count > 1)})" if approx is not approxes[0] else "")
                if one_sided:
                    # a series at +inf holds for positive values only where the one at
                    # -inf differs (sqrt(x^2) is x there, -x at -inf): NaN on the other
                    # side, so that a regime choosing it there fails the search's finite
                    # checks (a formula with one expansion, log x at +inf, is not defined
                    # on the other)
                    side = s > 0 if name == "+inf" else s < 0
                    approx = sp.Piecewise((approx, side), (sp.nan, True))
                out.append((label, approx))
    return out


def _truncations(approx: sp.Expr, s: sp.Symbol, point) -> list[sp.Expr]:
    """The series ``approx`` cut to its leading order, and to its two leading orders,
    where it has more: fewer terms are less accurate near the point but overflow later
    away from it (``c/b - b/a`` holds where ``a*c**2/b**3`` overflows first), and
    Herbie's regimes often keep only the leading term.

    >>> x = sp.Symbol("x")
    >>> _truncations(1 - x**2/6 + x**4/120, x, 0)
    [1, 1 - x**2/6]
    """
    orders: dict = {}
    for term in sp.Add.make_args(sp.expand(approx)):
        orders.setdefault(term.as_coeff_exponent(s)[1], []).append(term)
    if not all(k.is_number for k in orders):
        return []
    # leading: the lowest power at 0, the highest at infinity
    ranked = sorted(orders, key=lambda k: float(k), reverse=point != 0)
    return [sp.Add(*(t for k in ranked[:n] for t in orders[k]))
            for n in (1, 2) if n < len(ranked)]


def _horner(expr: sp.Expr, s: sp.Symbol) -> sp.Expr:
    """A polynomial in ``s`` (or in ``1/s``) in Horner form: fewer roundings, and no large
    power that overflows before the coefficients shrink it."""
    if expr.is_polynomial(s):
        return sp.horner(expr, wrt=s)
    t = sp.Dummy("t")
    inverted = sp.expand(expr.subs(s, 1 / t))
    if inverted.is_polynomial(t):
        return sp.horner(inverted, wrt=t).subs(t, 1 / s)
    return expr
