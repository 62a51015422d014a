"""Measuring a candidate: its error in bits of the working dtype at each sample point,
against the formula evaluated in mpmath at 150 digits (as
:func:`compiler.stability.error_bits` measures a program).

>>> import torch
>>> x = sp.Symbol("x", real=True)
>>> exact = exact_values(sp.sqrt(x + 1) - sp.sqrt(x), [x], [torch.tensor([1e8])])
>>> naive = torch.sqrt(torch.tensor([1e8 + 1])) - torch.sqrt(torch.tensor([1e8]))
>>> round(float(error_in_bits(naive, exact, torch.float32)[0]))
23
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import sympy as sp
import torch

from compiler.herbie.emit import evaluate
from egraph.ops.reals import lambdify
from frontends.fx.exact import BITS as EXACT_BITS

__all__ = ["at_points", "error_in_bits", "exact_values", "mantissa_bits", "representable",
           "scores"]

_DIGITS = 150  # of the mpmath reference (see benchmarks/stability/hamming.py)


def exact_values(expr: sp.Expr, symbols: list[sp.Symbol], samples: list[torch.Tensor]
           ) -> torch.Tensor:
    """``expr`` at each sample point in mpmath (``_DIGITS`` digits; for float64 samples
    :data:`frontends.fx.exact.BITS` bits, where sums of float64 values are exact), as
    float64 (NaN where it is not a real number).

    >>> x = sp.Symbol("x", real=True)
    >>> exact_values(sp.log(x), [x], [torch.tensor([1.0, -1.0])])
    tensor([0., nan], dtype=torch.float64)
    """
    f = lambdify(symbols, expr)
    cols = [s.double().tolist() for s in samples]
    out = []
    wide = any(s.dtype == torch.float64 for s in samples)
    with mp.workprec(EXACT_BITS) if wide else mp.workdps(_DIGITS):
        for point in zip(*cols):
            try:
                v = f(*[mp.mpf(p) for p in point])
                out.append(float(v) if mp.im(v) == 0 else math.nan)
            except (ZeroDivisionError, ValueError, TypeError, OverflowError, MemoryError):
                # (MemoryError: mpmath aligns the digits of a sum by shifting one term by
                # the distance of their exponents, which past exp(1e300) is no number a
                # machine holds; the point is not judged, as one with no real value)
                out.append(math.nan)
    return torch.tensor(out, dtype=torch.float64)


def representable(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where an exact value is a finite number of ``dtype``: the points a program is
    judged on.

    >>> representable(torch.tensor([1.0, 1e39, math.nan], dtype=torch.float64), torch.float32)
    tensor([ True, False, False])
    """
    return torch.isfinite(exact) & (exact.abs() <= float(torch.finfo(dtype).max))


def mantissa_bits(dtype: torch.dtype) -> int:
    """Significand bits of ``dtype`` (24 for float32): the most a result can be off by.

    >>> mantissa_bits(torch.float32), mantissa_bits(torch.bfloat16)
    (24, 8)
    """
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def error_in_bits(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per point error in bits of ``dtype`` (a non-finite result costs every bit). See
    the module's example."""
    mantissa = mantissa_bits(dtype)
    got = got.double().reshape(exact.shape) if got.numel() == exact.numel() else (
        got.double().expand(exact.shape))
    ulp = exact.abs().clamp(min=torch.finfo(dtype).tiny) * 2.0 ** (1 - mantissa)
    err = torch.log2(1 + (got - exact).abs() / ulp).clamp(max=float(mantissa))
    return torch.where(torch.isfinite(got), err, float(mantissa)).nan_to_num(
        nan=float(mantissa))


def program_error(outputs: list, reference: list) -> tuple[float, int]:
    """A whole program's error on its sample inputs: the mean bits of error of every
    floating output element whose reference is a finite number of the output's dtype
    (:func:`error_in_bits`), and how many of those the program makes non-finite.

    >>> exact = [torch.tensor([1.0, 2.0], dtype=torch.float64)]
    >>> program_error([torch.tensor([1.0, math.inf])], exact)
    (12.0, 1)
    """
    bits, nonfinite = [], 0
    for got, exact in zip(outputs, reference):
        if not (isinstance(got, torch.Tensor) and got.is_floating_point()
                and isinstance(exact, torch.Tensor)):
            continue
        exact = exact.double().reshape(got.shape)
        judged = representable(exact, got.dtype)
        bits.append(error_in_bits(got[judged], exact[judged], got.dtype))
        nonfinite += int((~torch.isfinite(got[judged])).sum())
    every = torch.cat(bits) if bits else torch.zeros(0)
    return (float(every.mean()) if every.numel() else 0.0), nonfinite


def at_points(value, exact: torch.Tensor) -> torch.Tensor:
    """A program's value (a tensor, or a number where it is constant) at each point of
    ``exact``, in float64.

    >>> at_points(2, torch.zeros(3, dtype=torch.float64))
    tensor([2., 2., 2.], dtype=torch.float64)
    """
    if torch.is_tensor(value):
        return value.double().expand(exact.shape)
    return torch.full_like(exact, float(value))


def scores(exprs: list[sp.Expr], env: dict, exact: torch.Tensor,
           dtype: torch.dtype) -> np.ndarray:
    """(candidates, points) bits of error; a candidate that cannot be evaluated at these
    points costs every bit.

    >>> x = sp.Symbol("x", real=True)
    >>> xs = torch.tensor([1e-8])
    >>> exact = exact_values(sp.exp(x) - 1, [x], [xs])
    >>> scores([sp.exp(x) - 1, x], {x: xs}, exact, torch.float32).round()
    array([[0.],
           [0.]])
    """
    rows = []
    for e in exprs:
        try:
            rows.append(error_in_bits(evaluate(e, env), exact, dtype).numpy())
        except (TypeError, ValueError, RuntimeError, ArithmeticError):
            rows.append(np.full(len(exact), float(mantissa_bits(dtype))))
    return np.stack(rows)
