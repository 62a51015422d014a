"""An FPCore precondition (``:pre``): as declared ranges where it is a conjunction of
bounds, and as a predicate otherwise.

The bounds are read as Herbie reads them to sample: each variable's set of allowed values
as a union of closed intervals, from comparisons of one variable with constants
(``(<= 0 x 1)``, ``(< x 1e-3)``, ``(== x 0)``, ``(<= (fabs x) 5)``) joined by ``and`` and
``or``. :attr:`Precondition.ranges` is each bounded variable's hull (what the entry points
are given as ``ranges``), :attr:`Precondition.intervals` the union (what the sampler draws
from); :attr:`Precondition.is_ranges` says whether the bounds are the whole precondition
(otherwise the rest is checked on each point: strict bounds, ``!=``, conditions on
several variables). Calling it evaluates the whole precondition on float64 tensors.

>>> from frontends.fpcore import parse
>>> (p,) = parse("(FPCore (x y) :pre (and (<= -1 x 1) (or (== y 0) (< 2 y 3))) x)")
>>> p.pre.ranges, p.pre.intervals["y"], p.pre.is_ranges
({'x': (-1.0, 1.0), 'y': (0.0, 3.0)}, ((0.0, 0.0), (2.0, 3.0)), True)
>>> (q,) = parse("(FPCore (a b) :pre (and (< 0 a) (< a b)) a)")
>>> q.pre.ranges, q.pre.is_ranges
({'a': (0.0, inf)}, False)
"""

from __future__ import annotations

import math

import mpmath as mp
import torch

from frontends.fpcore.expression import Call, Constant, Expr, Variable
from frontends.fpcore.module import build_predicate
from frontends.fpcore.reference import evaluate

__all__ = ["Intervals", "Precondition", "bounds"]

Intervals = tuple[tuple[float, float], ...]
"""A union of closed intervals, sorted and disjoint."""

_INF = math.inf
_COMPARISONS = ("<", "<=", ">", ">=", "==")


class Precondition:
    """``:pre`` of a program over ``arguments`` (see the module docstring)."""

    def __init__(self, expression: Expr, arguments: tuple[str, ...]):
        self.expression, self.arguments = expression, arguments
        found, self.is_ranges = bounds(expression)
        self.intervals: dict[str, Intervals] = {
            v: found[v] for v in arguments if v in found}
        self.ranges: dict[str, tuple[float, float]] = {
            v: (iv[0][0], iv[-1][1]) for v, iv in self.intervals.items() if iv}
        self._predicate = None

    def __call__(self, *values: torch.Tensor) -> torch.Tensor:
        """Where the precondition holds, on float64 tensors (one per argument)."""
        if self._predicate is None:
            self._predicate = build_predicate(self.expression, self.arguments)
        with torch.no_grad():
            return self._predicate(*(v.to(torch.float64) for v in values)).to(torch.bool)

    def __str__(self) -> str:
        return str(self.expression)

    def __repr__(self) -> str:
        return f"Precondition({self})"


def _constant(expr: Expr) -> float | None:
    if expr.free() or isinstance(expr, Constant) and expr.name in ("TRUE", "FALSE"):
        return None
    with mp.workprec(128):
        value = evaluate(expr, {})
    if isinstance(value, bool) or mp.isnan(value):
        return None
    return float(value)


def _intersect(a: Intervals, b: Intervals) -> Intervals:
    out = [(max(lo1, lo2), min(hi1, hi2)) for lo1, hi1 in a for lo2, hi2 in b]
    return tuple(sorted((lo, hi) for lo, hi in out if lo <= hi))


def _union(a: Intervals, b: Intervals) -> Intervals:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(a + b):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _pair(op: str, left: Expr, right: Expr) -> tuple[str, Intervals] | None:
    """The interval one comparison of a variable (or its ``fabs``) with a constant gives."""
    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}
    if _constant(left) is not None:
        left, right, op = right, left, flip[op]
    bound = _constant(right)
    absolute = isinstance(left, Call) and left.op == "fabs" and isinstance(left.args[0],
                                                                          Variable)
    if bound is None or not (isinstance(left, Variable) or absolute):
        return None
    if op == "==":
        allowed: Intervals = ((bound, bound),)
    elif op in ("<", "<="):
        allowed = ((-_INF, bound),)
    else:
        allowed = ((bound, _INF),)
    if absolute:
        var = left.args[0].name
        magnitude = _intersect(allowed, ((0.0, _INF),))
        return var, _union(magnitude, tuple((-hi, -lo) for lo, hi in magnitude))
    return left.name, allowed


def bounds(expr: Expr) -> tuple[dict[str, Intervals], bool]:
    """Each variable's allowed values that ``expr``'s bounds imply, and whether those bounds
    are all of ``expr`` (see the module docstring).

    >>> from frontends.fpcore.reader import read_programs
    >>> (p,) = read_programs("(FPCore (x) :pre (or (<= (fabs x) 1) (== x 10)) x)")
    >>> bounds(p.pre.expression)
    ({'x': ((-1.0, 1.0), (10.0, 10.0))}, True)
    """
    if isinstance(expr, Constant) and expr.name == "TRUE":
        return {}, True
    if not isinstance(expr, Call):
        return {}, False
    if expr.op in _COMPARISONS:
        found: dict[str, Intervals] = {}
        exact = True
        for left, right in zip(expr.args, expr.args[1:]):
            pair = _pair(expr.op, left, right)
            if pair is None:
                exact = False
                continue
            var, allowed = pair
            found[var] = _intersect(found.get(var, ((-_INF, _INF),)), allowed)
        return found, exact
    if expr.op == "and":
        found, exact = {}, True
        for item in expr.args:
            sub, sub_exact = bounds(item)
            exact = exact and sub_exact
            for var, allowed in sub.items():
                found[var] = _intersect(found.get(var, ((-_INF, _INF),)), allowed)
        return found, exact
    if expr.op == "or" and expr.args:
        parts = [bounds(item) for item in expr.args]
        common = set.intersection(*(set(sub) for sub, _ in parts))
        found = {}
        for var in sorted(common):
            allowed: Intervals = ()
            for sub, _ in parts:
                allowed = _union(allowed, sub[var])
            found[var] = allowed
        exact = all(e and set(sub) == common for sub, e in parts) and len(common) == 1
        return found, exact
    return {}, False
