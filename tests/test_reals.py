"""The op table's forms over mpmath reals (egraph.ops.reals): the functions it computes
its own way far from 0 are mpmath's values, at the precision of the exact references."""

import math
import sys

import mpmath as mp
import sympy as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from egraph.ops import reals

BITS = 2200  # (frontends.fx.exact.BITS: the reference of float64 programs)

# doubles of every magnitude, the far ones (where the functions take their own way) too
doubles = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e308, max_value=1e308)


def _close(a, b) -> bool:
    if mp.isnan(a) or mp.isnan(b):
        return bool(mp.isnan(a) and mp.isnan(b))
    if a == b:
        return True
    return abs(a - b) <= abs(b) * mp.mpf(2) ** (10 - BITS)


@settings(max_examples=60, deadline=None)
@given(st.one_of(doubles, st.floats(-5e3, 5e3)))
def test_functions_of_exp_are_mpmaths_values(x):
    with mp.workprec(BITS):
        v = mp.mpf(x)
        for ours, theirs in ((reals.exp, mp.exp), (reals.sinh, mp.sinh), (reals.cosh, mp.cosh),
                             (reals.tanh, mp.tanh), (reals.expm1, mp.expm1)):
            assert _close(ours(v), theirs(v)), (ours.__name__, x)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-300, 1e300), st.floats(-2e4, 2e4))
def test_power_is_mpmaths_value_wherever_its_digits_are_in_reach(x, y):
    with mp.workprec(BITS):
        got, want = reals.power(mp.mpf(x), mp.mpf(y)), mp.power(mp.mpf(x), mp.mpf(y))
        if abs(y * math.log2(x)) > 2 ** 20:
            assert got in (mp.inf, 0)
        else:
            assert _close(got, want), (x, y)


def test_power_of_a_negative_base_keeps_the_sign_of_odd_integer_exponents():
    with mp.workprec(BITS):
        assert reals.power(mp.mpf(-2), mp.mpf(2001)) == -mp.power(2, 2001)
        assert reals.power(mp.mpf(-2), mp.mpf(2000)) == mp.power(2, 2000)
        assert mp.isnan(reals.power(mp.mpf(-2), mp.mpf(0.5)))
        assert reals.power(mp.mpf(-10), mp.mpf(1e300)) == mp.inf


def test_a_formula_far_past_any_float_is_evaluated_through_them():
    # basilisk's atmosphericDensity_poly at alt = 1e300: 10 to a degree-6 polynomial
    alt = sp.Symbol("alt")
    u = (alt - sp.Float("526.8")) / sp.Float("292.8563")
    f = reals.lambdify([alt], 10 ** (sp.Float("0.34047") * u ** 6 - 12) / 10 ** (
        sp.Float("0.34047") * u ** 6 - 13))
    with mp.workprec(BITS):
        assert f(mp.mpf(3000)) == 10 or _close(f(mp.mpf(3000)), 10)
        assert mp.isnan(f(mp.mpf(1e300)))  # (inf / inf: out of reach, not judged)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_literal_rounds_to_its_own_float(value):
    assert float(reals.literal(value)) == value


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10 ** 15 - 1), st.integers(-300, 300))
def test_a_decimal_of_at_most_15_digits_is_read_as_written(digits, exponent):
    from fractions import Fraction

    written = Fraction(digits) * Fraction(10) ** exponent
    assume(written <= sys.float_info.max)  # (1.79769314e308 is past float's range)
    value = float(written)
    if float(written.limit_denominator(1000)) != value:  # (else the simple fraction)
        assert reals.literal(value) == written
