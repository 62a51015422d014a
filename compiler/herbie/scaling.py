"""Scaling by powers of two: a formula homogeneous in a group of its inputs computed on
those inputs brought near 1, its result scaled back.

Over the whole range of a float, most of the error of ``(a*c + b*d) / (c*c + d*d)`` is
overflow and underflow: ``c*c`` is infinite past 1.3e154 where the quotient is an ordinary
number. The formula is homogeneous, of degree 1 in ``(a, b)`` and -1 in ``(c, d)``: for
every ``s, t > 0`` it is ``s / t`` times its value at ``(a/s, b/s, c/t, d/t)``. With
``s`` and ``t`` powers of two near the largest magnitude of each group, every scaling is
exact (in the normal range a power-of-two scaling commutes with rounding: the scaled
program makes the rounding errors of the original, each divided by the same power), and
only a result that does not fit the format overflows. LAPACK scales its norms and
``hypot`` its legs for the same reason; Herbie reaches such forms by rewriting and
regimes one formula at a time, Smith's algorithm for the complex quotient among them.

:func:`homogeneous_degree` finds the degree from the formula's structure (a proof, not a
test on points), :func:`homogeneous_groups` splits the inputs into the smallest groups
it is homogeneous in, and :func:`scaled` writes the scaled formula with :class:`Binade`
(the power of two of a group) and :class:`Ldexp` (an exact scaling), which
:func:`compiler.herbie.emit.evaluate` computes with torch's ``log2``, ``floor``, ``where``
and ``pow`` of 2, so the program stays inside the op table (and FPCore can say it). A
group that spans more binades than the format has its small members scaled to 0, so the
scaled formula gives way to the formula as written wherever it is not a finite number
(:class:`FiniteOr`); where it is finite but has lost those members, the search measures
it against the other candidates, and the regimes keep it off that range.

>>> import torch
>>> a, b, c, d = sp.symbols("a b c d", real=True)
>>> f = (a * c + b * d) / (c ** 2 + d ** 2)
>>> homogeneous_groups(f, [a, b, c, d])
[((a, b), 1), ((c, d), -1)]
>>> from compiler.herbie.emit import evaluate
>>> big = {a: torch.tensor([3e200], dtype=torch.float64), b: torch.tensor([1e200],
...        dtype=torch.float64), c: torch.tensor([2e180], dtype=torch.float64),
...        d: torch.tensor([5e179], dtype=torch.float64)}
>>> evaluate(f, big), evaluate(scaled(f, [a, b, c, d], torch.float64), big)
(tensor([nan], dtype=torch.float64), tensor([1.5294e+20], dtype=torch.float64))
"""

from __future__ import annotations

import itertools
import math

import sympy as sp
import torch

from compiler.herbie.emit import TorchFunction, finite_or

__all__ = ["Binade", "FiniteOr", "Ldexp", "PowersOfTwo", "homogeneous_degree",
           "homogeneous_groups", "scaled", "scaled_products"]

MOST_SUBSETS = 8
"""Formulas of at most this many inputs have every subset tried as a group; larger ones,
each input alone and all of them together."""


class Binade(TorchFunction):
    """``Binade(step, lo, hi, *values)``: the power of two of the largest magnitude among
    ``values``, ``floor(log2(max |v|))``, kept within ``[lo, hi]`` (0 and infinity at the
    ends) and rounded down to a multiple of ``step`` (a degree ``p/q`` needs ``q``). Any
    power of two would keep the scaling exact; this one brings the group near 1.

    >>> x, y = sp.symbols("x y", real=True)
    >>> from compiler.herbie.emit import evaluate
    >>> env = {x: torch.tensor([3.0, 0.0, 1e-310]), y: torch.tensor([-9.0, 0.0, 0.0])}
    >>> evaluate(Binade(1, -1074, 1023, x, y), env)
    tensor([    3., -1074., -1074.])
    """

    def torch_value(self, values: list):
        step, lo, hi, *group = values
        largest = torch.abs(group[0])
        for v in group[1:]:
            largest = torch.maximum(largest, torch.abs(v))
        e = torch.floor(torch.log2(largest))
        e = torch.where(e < lo, lo, e)  # (log2 of 0 is -inf)
        e = torch.where(e > hi, hi, e)
        return e if step == 1 else torch.floor(e / step) * step


class PowersOfTwo(TorchFunction):
    """``PowersOfTwo(n, chunk, steps)``: ``steps`` powers of two of at most ``chunk``
    binades each whose product is ``2**n`` (an integer-valued ``n`` within their reach),
    as a tuple for :class:`Ldexp`; one value per ``n`` in a program, however many inputs
    it scales (``2**n`` itself can overflow where a value times it does not).

    >>> n = sp.Symbol("n", real=True)
    >>> from compiler.herbie.emit import evaluate
    >>> powers = evaluate(PowersOfTwo(n, 1022, 2), {n: torch.tensor([1500.0, -2.0],
    ...                                                            dtype=torch.float64)})
    >>> [torch.log2(p).tolist() for p in powers]
    [[1022.0, -2.0], [478.0, 0.0]]
    """

    def torch_value(self, values: list):
        n, chunk, steps = values
        powers = []
        for _ in range(int(steps)):
            h = torch.where(n > chunk, chunk, torch.where(n < -chunk, -chunk, n))
            powers.append(torch.pow(2.0, h))
            n = n - h
        return tuple(powers)


class Ldexp(TorchFunction):
    """``Ldexp(x, PowersOfTwo(n, ...))``: ``x * 2**n``, exact where the result is a
    normal number, multiplied by each power in turn.

    >>> x, n = sp.symbols("x n", real=True)
    >>> from compiler.herbie.emit import evaluate
    >>> env = {x: torch.tensor([1e-300, 3.0], dtype=torch.float64),
    ...        n: torch.tensor([1500.0, -2.0], dtype=torch.float64)}
    >>> evaluate(Ldexp(x, PowersOfTwo(n, 1022, 2)), env)
    tensor([3.5075e+151,  7.5000e-01], dtype=torch.float64)
    """

    def torch_value(self, values: list):
        x, powers = values
        for p in powers:
            x = x * p
        return x


class FiniteOr(TorchFunction):
    """``FiniteOr(scaled, formula)``: ``scaled`` where it is a finite number, else
    ``formula`` (``s - s == 0`` holds exactly for the finite ``s``). Both are the same
    real number; the scaled one is infinite or NaN only where a group spans more binades
    than the format (``0/0`` when its small members were scaled to 0), where the formula
    as written may still be a number.

    >>> x, y = sp.symbols("x y", real=True)
    >>> from compiler.herbie.emit import evaluate
    >>> evaluate(FiniteOr(x / y, x), {x: torch.tensor([0.0, 6.0]), y: torch.tensor([0.0, 2.0])})
    tensor([0., 3.])
    """

    def torch_value(self, values: list):
        return finite_or(*values)


def homogeneous_degree(e: sp.Expr, group: set[sp.Symbol]) -> sp.Rational | None:
    """``k`` where ``e(t*g) = t**k * e(g)`` for every ``t > 0`` (``g`` the ``group``'s
    symbols, the others held), proved from ``e``'s structure; None where that does not
    show it (a sum of terms of different degrees, a function other than ``abs`` and
    ``sign`` of a value that scales).

    >>> x, y, z = sp.symbols("x y z", real=True)
    >>> homogeneous_degree(sp.sqrt(x ** 2 + y ** 2) / z, {x, y}), homogeneous_degree(x + 1, {x})
    (1, None)
    """
    if e in group:
        return sp.Integer(1)
    if not (e.free_symbols & group):
        return sp.Integer(0)
    if isinstance(e, sp.UnevaluatedExpr):
        return homogeneous_degree(e.args[0], group)
    if isinstance(e, sp.Add):
        degrees = {homogeneous_degree(a, group) for a in e.args}
        return degrees.pop() if len(degrees) == 1 else None
    if isinstance(e, sp.Mul):
        degrees = [homogeneous_degree(a, group) for a in e.args]
        return None if None in degrees else sp.Add(*degrees)
    if isinstance(e, sp.Pow):
        base = homogeneous_degree(e.base, group)
        if base is None or not e.exp.is_Rational:
            return None
        return base * e.exp
    if isinstance(e, sp.Abs):
        return homogeneous_degree(e.args[0], group)
    if isinstance(e, (sp.Max, sp.Min)):
        degrees = {homogeneous_degree(a, group) for a in e.args}
        return degrees.pop() if len(degrees) == 1 else None
    if isinstance(e, sp.sign):
        return sp.Integer(0) if homogeneous_degree(e.args[0], group) is not None else None
    return None


def homogeneous_groups(e: sp.Expr, symbols: list[sp.Symbol]
                       ) -> list[tuple[tuple[sp.Symbol, ...], sp.Rational]]:
    """Disjoint groups of ``symbols`` that ``e`` is homogeneous in, each with its degree,
    the smallest first (each group scales on its own, so smaller groups keep more of the
    range): every subset of at most :data:`MOST_SUBSETS` inputs, else each input and all.
    A single input of degree 0 is left out (scaling it changes nothing).

    >>> x, y, z = sp.symbols("x y z", real=True)
    >>> homogeneous_groups(x * y / z, [x, y, z])
    [((x,), 1), ((y,), 1), ((z,), -1)]
    """
    present = [s for s in symbols if s in e.free_symbols]
    sizes = range(1, len(present) + 1)
    if len(present) > MOST_SUBSETS:
        sizes = [1, len(present)]
    found, used = [], set()
    for size in sizes:
        for group in itertools.combinations(present, size):
            if used & set(group):
                continue
            degree = homogeneous_degree(e, set(group))
            if degree is None or (degree == 0 and size == 1):
                continue
            found.append((group, degree))
            used |= set(group)
    return found


def scaled(e: sp.Expr, symbols: list[sp.Symbol], dtype: torch.dtype) -> sp.Expr | None:
    """``e`` computed on its homogeneous groups (:func:`homogeneous_groups`) scaled by
    powers of two near 1 in ``dtype``, its result scaled back, and ``e`` as written where
    that is not a finite number (:class:`FiniteOr`); None where ``e`` is homogeneous in
    no group, or already scaled. See the module's example."""
    if e.has(Ldexp):
        return None
    groups = homogeneous_groups(e, symbols)
    if not groups:
        return None
    info = torch.finfo(dtype)
    hi = math.frexp(info.max)[1] - 1
    lo = int(math.log2(info.smallest_normal) + math.log2(info.eps))  # the least subnormal
    chunk = hi - 1  # 2**chunk and 2**-chunk are normal numbers
    reach = max(hi, -lo)
    inner = math.ceil(reach / chunk)
    replace, total, bound = {}, sp.Integer(0), 0
    for group, degree in groups:
        binade = Binade(sp.Integer(degree.q), sp.Integer(lo), sp.Integer(hi), *group)
        for s in group:
            replace[s] = Ldexp(s, PowersOfTwo(-binade, sp.Integer(chunk), sp.Integer(inner)))
        total += degree * binade
        bound += abs(degree) * reach
    inner_e = e.xreplace(replace)
    if total != 0:
        inner_e = Ldexp(inner_e, PowersOfTwo(
            total, sp.Integer(chunk), sp.Integer(max(1, math.ceil(bound / chunk)))))
    return FiniteOr(inner_e, e)


def scaled_products(e: sp.Expr, symbols: list[sp.Symbol], dtype: torch.dtype
                    ) -> sp.Expr | None:
    """``e`` with each of its outermost products that is homogeneous in some group
    :func:`scaled` on its own; None where none is. A polynomial over the whole range of a
    float has its terms overflow alone: in ``x*y*z - t*a*b`` each term scaled by its
    factors' own powers of two is exact wherever it is a number, which one scaling of all
    six inputs is not (the largest input sets the scale, and the products of the others
    underflow).

    >>> x, y, z, t = sp.symbols("x y z t", real=True)
    >>> scaled_products(x * y * z - t, [x, y, z, t], torch.float64).count(Ldexp)
    4
    """
    changed = False

    def walk(node: sp.Expr) -> sp.Expr:
        nonlocal changed
        if isinstance(node, sp.Mul) and sum(1 for a in node.args if a.free_symbols) > 1:
            s = scaled(node, [v for v in symbols if v in node.free_symbols], dtype)
            if s is not None:
                changed = True
                return s
        if not node.args or isinstance(node, TorchFunction):
            return node
        return node.func(*[walk(a) for a in node.args])

    out = walk(e)
    return out if changed else None
