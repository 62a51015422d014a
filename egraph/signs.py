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


# -- transfer rules: the signs an op guarantees from its operands' signs ----------------------
# Each takes the operands' sign sets and their literal values (None where not a known
# number) and returns the result's sign set; the op table names one per op.

def same(s: list[int], values: list) -> int:
    """The first operand's signs (views, selections, monotone odd functions).

    >>> describe(same([POS], [None]))
    '> 0'
    """
    return s[0]


def one_signed(s: list[int], values: list) -> int:
    """A sum or mean keeps a sign shared by all its terms; mixed signs give anything.

    >>> describe(one_signed([NONNEG], [None])), describe(one_signed([NONZERO], [None]))
    ('>= 0', 'any sign')
    """
    return s[0] if s[0] in (POS, NONNEG, NEG, NONPOS, ZERO) else ANY


def product(s: list[int], values: list) -> int:
    """``x * y``.

    >>> describe(product([NEG, NEG], [None, None]))
    '> 0'
    """
    return of_product(s[0], s[1])


def total(s: list[int], values: list) -> int:
    """``x + y``.

    >>> describe(total([POS, NONNEG], [None, None]))
    '> 0'
    """
    return of_sum(s[0], s[1])


def difference(s: list[int], values: list) -> int:
    """``x - y``.

    >>> describe(difference([POS, NEG], [None, None]))
    '> 0'
    """
    return of_sum(s[0], negated(s[1]))


def quotient(s: list[int], values: list) -> int:
    """``x / y``.

    >>> describe(quotient([NEG, POS], [None, None]))
    '< 0'
    """
    return of_quotient(s[0], s[1])


def negation(s: list[int], values: list) -> int:
    """``-x``.

    >>> describe(negation([NONNEG], [None]))
    '<= 0'
    """
    return negated(s[0])


def reciprocal(s: list[int], values: list) -> int:
    """``1 / x``: x's signs, unless x may be 0.

    >>> describe(reciprocal([NEG], [None]))
    '< 0'
    """
    return s[0] if not s[0] & ZERO else ANY


def magnitude(s: list[int], values: list) -> int:
    """``|x|``.

    >>> describe(magnitude([NONZERO], [None]))
    '> 0'
    """
    return POS if not s[0] & ZERO else NONNEG


def root(s: list[int], values: list) -> int:
    """``sqrt(x)`` (NaN below 0 has no sign to prove, so only > 0 is kept).

    >>> describe(root([POS], [None])), describe(root([ANY], [None]))
    ('> 0', '>= 0')
    """
    return POS if s[0] == POS else NONNEG


def log1p(s: list[int], values: list) -> int:
    """``log(1 + x)``: the sign of x, for x >= 0.

    >>> describe(log1p([POS], [None]))
    '> 0'
    """
    return s[0] if not s[0] & NEG else ANY


def power(s: list[int], values: list) -> int:
    """``x ** y``: positive for a positive base; an even integer power is >= 0, an odd
    one keeps x's sign.

    >>> describe(power([ANY, ANY], [None, 2])), describe(power([NEG, ANY], [None, 3]))
    ('>= 0', '< 0')
    """
    exponent = values[1]
    if s[0] == POS:
        return POS
    if isinstance(exponent, (int, float)) and float(exponent).is_integer():
        if int(exponent) % 2 == 0:
            return POS if not s[0] & ZERO else NONNEG
        return s[0]
    return NONNEG if s[0] & NEG == 0 else ANY


def larger(s: list[int], values: list) -> int:
    """``maximum(x, y)``: > 0 if either is; >= 0 if either is.

    >>> describe(larger([POS, ANY], [None, None]))
    '> 0'
    """
    a, b = s
    if a == POS or b == POS:
        return POS
    return NONNEG if not (a & NEG) or not (b & NEG) else ANY


def fill(s: list[int], values: list) -> int:
    """The fill value's signs (``full(shape, v)``, ``full_like(x, v)``).

    >>> describe(fill([ANY, POS], [None, 2.0]))
    '> 0'
    """
    return s[1]


def either(s: list[int], values: list) -> int:
    """``where(c, x, y)``: x's or y's signs.

    >>> describe(either([ANY, POS, ZERO], [None] * 3))
    '>= 0'
    """
    return s[1] | s[2]


def filled(s: list[int], values: list) -> int:
    """``masked_fill(x, mask, v)``: x's or v's signs.

    >>> describe(filled([POS, ANY, ZERO], [None] * 3))
    '>= 0'
    """
    return s[0] | s[2]


def clamped(s: list[int], values: list) -> int:
    """``clamp(x, lo, hi)``: a literal lower bound >= 0 proves the sign.

    >>> describe(clamped([ANY, ANY, ANY], [None, 0.5, None]))
    '> 0'
    """
    low = values[1]
    if isinstance(low, (int, float)):
        return POS if low > 0 else NONNEG if low >= 0 else ANY
    return ANY
