"""Proven sign facts: the signs a value can take, as a 3-bit set over NEG, ZERO, POS.

These are facts the operations guarantee (``exp(x) > 0``, ``x * x >= 0``, softmax is
positive, ``x - amax(x) <= 0``) or that the user declares for an input; they never come
from values observed on example inputs. Rules with domain conditions check them, so a rule
that needs ``x > 0`` fires only where positivity is proven. Merging two classes intersects
their sets (both facts hold of the same value).

>>> describe(POS | ZERO)
'>= 0'
>>> describe(of_product(NEG, NEG | ZERO))
'>= 0'
>>> describe(of_sum(POS, POS | ZERO))
'> 0'
"""

from __future__ import annotations

NEG, ZERO, POS = 1, 2, 4
ANY = NEG | ZERO | POS
NONNEG = ZERO | POS
NONPOS = NEG | ZERO
NONZERO = NEG | POS

_NAMES = {POS: "> 0", NONNEG: ">= 0", NEG: "< 0", NONPOS: "<= 0", ZERO: "== 0",
          NONZERO: "!= 0", ANY: "any sign", 0: "impossible"}


def describe(signs: int) -> str:
    """Readable form of a sign set."""
    return _NAMES[signs]


def of_value(value: float) -> int:
    """The sign set of a known number (NaN: any)."""
    if value != value:
        return ANY
    return POS if value > 0 else NEG if value < 0 else ZERO


def _members(signs: int) -> list[int]:
    return [s for s, bit in ((-1, NEG), (0, ZERO), (1, POS)) if signs & bit]


def _bit(s: int) -> int:
    return NEG if s < 0 else POS if s > 0 else ZERO


def of_product(a: int, b: int) -> int:
    """Signs of ``x * y`` for x in ``a`` and y in ``b``."""
    out = 0
    for x in _members(a):
        for y in _members(b):
            out |= _bit(x * y)
    return out


def of_sum(a: int, b: int) -> int:
    """Signs of ``x + y``."""
    out = 0
    for x in _members(a):
        for y in _members(b):
            out |= ANY if x * y < 0 else _bit(x + y)
    return out


def negated(a: int) -> int:
    """Signs of ``-x``."""
    return (POS if a & NEG else 0) | (a & ZERO) | (NEG if a & POS else 0)


def of_quotient(a: int, b: int) -> int:
    """Signs of ``x / y`` (where y may be 0 the result may be anything)."""
    if b & ZERO:
        return ANY
    return of_product(a, b)
