"""Scaling by powers of two (compiler.herbie.scaling): the degree of homogeneity is proved
right on random formulas, a scaled formula computes the same bits wherever nothing
overflows, and the right value where a step of the original overflows."""

from __future__ import annotations

import mpmath as mp
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.herbie.emit import evaluate
from compiler.herbie.scaling import (
    homogeneous_degree,
    homogeneous_groups,
    scaled,
    scaled_products,
)

X, Y, Z, W = sp.symbols("x y z w", real=True)
SYMBOLS = [X, Y, Z, W]

# Formulas of Herbie's suite, as its benchmarks spell them (numerics/every-cs.fpcore's
# complex division, haskell.fpcore's linear det33 in small, graphics/lod.fpcore's root,
# mathematics/arvind.fpcore's quotient of products, a cube of a complex number)
FORMULAS = [
    (X * Z + Y * W) / (Z * Z + W * W),
    X * (Y * W - Z * Z) - Y * (X * W - Z * Y) + Z * (X * Z - Y * Y),
    (abs(X) + abs(Y) - sp.sqrt((X - Y) ** 2 + 4 * Z ** 2)) / 2,
    (X * Y) / (Z * W),
    X * X * X - 3 * X * Y * Y,
    sp.Rational(1, 10) * X * Y / (X - Y) * Z / W,
]


@st.composite
def formulas(draw, depth: int = 3) -> sp.Expr:
    """Random formulas over x, y, z, w: sums, products, quotients, roots, absolute
    values, exponentials, and constants of every magnitude."""
    if depth == 0 or draw(st.booleans()):
        if draw(st.integers(0, 4)) == 0:
            return sp.Float(draw(st.sampled_from([1e-30, 0.1, 2.0, 3.5, 1e20])))
        return draw(st.sampled_from(SYMBOLS))
    kind = draw(st.sampled_from(["add", "sub", "mul", "div", "sqrt", "abs", "exp"]))
    a = draw(formulas(depth - 1))
    if kind in ("sqrt", "abs", "exp"):
        if a.is_Number:
            return a  # (sympy would fold exp(1e20) into a number of 1e20 digits)
        return {"sqrt": sp.sqrt, "abs": sp.Abs, "exp": sp.exp}[kind](a)
    b = draw(formulas(depth - 1))
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[kind]


@settings(max_examples=150, deadline=None)
@given(formulas(), st.sets(st.sampled_from(SYMBOLS), min_size=1),
       st.lists(st.floats(0.01, 100), min_size=4, max_size=4),
       st.floats(1e-6, 1e6))
def test_a_proved_degree_holds_at_every_scale(e, group, point, t):
    degree = homogeneous_degree(e, group)
    if degree is None:
        return
    values = dict(zip(SYMBOLS, point))
    with mp.workdps(60):
        f = sp.lambdify(SYMBOLS, e, modules="mpmath")
        at = [mp.mpf(values[s]) * (mp.mpf(t) if s in group else 1) for s in SYMBOLS]
        try:
            base, moved = f(*[mp.mpf(values[s]) for s in SYMBOLS]), f(*at)
        except (ZeroDivisionError, ValueError, OverflowError):
            return
        expected = mp.mpf(t) ** mp.mpf(float(degree)) * base
        assert abs(moved - expected) <= mp.mpf(10) ** -40 * max(abs(expected), 1e-300)


def test_groups_are_the_smallest_sets_the_formula_scales_in():
    complex_division, det = FORMULAS[0], FORMULAS[1]
    assert homogeneous_groups(complex_division, SYMBOLS) == [((X, Y), 1), ((Z, W), -1)]
    assert homogeneous_groups(det, SYMBOLS) == [((X, Y, Z, W), 3)]
    assert homogeneous_groups(X + 1, SYMBOLS) == []
    assert homogeneous_groups(sp.exp(X) * Y, SYMBOLS) == [((Y,), 1)]


def _points(dtype, lo, hi, n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    magnitudes = 10 ** (torch.rand(4, n, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    signs = torch.where(torch.rand(4, n, generator=gen) < 0.5, -1.0, 1.0).double()
    return dict(zip(SYMBOLS, (magnitudes * signs).to(dtype)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("formula", FORMULAS[:2] + FORMULAS[3:])
def test_a_scaled_formula_computes_the_same_values_where_nothing_overflows(formula, dtype):
    # a power-of-two scaling commutes with rounding in the normal range, so the scaled
    # program makes the original's rounding errors, scaled (up to the order sympy puts
    # the factors of a product in)
    env = _points(dtype, -3, 3)
    before, after = evaluate(formula, env), evaluate(scaled(formula, SYMBOLS, dtype), env)
    assert after.dtype == dtype
    torch.testing.assert_close(after, before, rtol=8 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("formula", FORMULAS[:2] + FORMULAS[3:])  # (lod's root runs as hypot)
def test_a_scaled_formula_is_right_where_a_step_of_the_original_overflows(formula, dtype):
    top = 300 if dtype == torch.float64 else 36
    env = _points(dtype, top - 40, top, n=48, seed=1)
    got = evaluate(scaled(formula, SYMBOLS, dtype), env).double()
    f = sp.lambdify(SYMBOLS, formula, modules="mpmath")
    limit = torch.finfo(dtype).max
    with mp.workdps(80):
        for i in range(48):
            exact = f(*[mp.mpf(float(env[s][i])) for s in SYMBOLS])
            if abs(exact) >= limit or abs(exact) < torch.finfo(dtype).smallest_normal:
                continue  # (the result itself does not fit the format)
            assert abs(float(got[i]) - exact) <= 1e-4 * abs(exact), (i, exact, got[i])
    assert not torch.isfinite(evaluate(formula, env)).all()  # the original overflowed


def test_scaling_leaves_what_it_cannot_prove_alone():
    assert scaled(sp.log(X) * Y + 1, SYMBOLS, torch.float64) is None
    once = scaled(FORMULAS[0], SYMBOLS, torch.float64)
    assert scaled(once, SYMBOLS, torch.float64) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_each_term_of_a_polynomial_is_scaled_on_its_own(dtype):
    # the terms of a determinant over the whole range of a float: one input sets the
    # scale of all of them and the others' products underflow, while each term scaled by
    # its own factors is right wherever it is a number
    polynomial = X * Y * Z - Y * Z * W + X * W
    top = 300 if dtype == torch.float64 else 36
    env = _points(dtype, -top, top, n=200, seed=2)
    got = evaluate(scaled_products(polynomial, SYMBOLS, dtype), env).double()
    info = torch.finfo(dtype)
    right = 0
    with mp.workdps(80):
        for i in range(200):
            v = {s: mp.mpf(float(env[s][i])) for s in SYMBOLS}
            terms = [v[X] * v[Y] * v[Z], -v[Y] * v[Z] * v[W], v[X] * v[W]]
            if not all(info.smallest_normal <= abs(t) < info.max for t in terms):
                continue
            exact = sum(terms)
            assert abs(float(got[i]) - exact) <= 4 * info.eps * max(abs(t) for t in terms)
            right += 1
    assert right > 20
    naive = evaluate(polynomial, env)
    assert not torch.isfinite(naive).all()
