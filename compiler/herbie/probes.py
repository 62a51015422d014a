"""Checking a piecewise program off its samples, as Herbie does: each threshold moved by
bisection to where the candidates cross (:func:`refine_thresholds`), probes between and
beyond the samples that refute the program (:func:`refuting_probes`), and new samples
around them for the next round of regime inference (:func:`resample`)."""

from __future__ import annotations

import sympy as sp
import torch

from compiler.herbie.emit import evaluate, run_program
from compiler.herbie.localise import Formula
from compiler.herbie.measure import (
    at_points,
    error_in_bits,
    exact_values,
    mantissa_bits,
    representable,
)
from compiler.ordinals import from_ordinals, midpoint, ordinals, uniform
from compiler.regimes import Regimes, between

__all__ = ["NEAR", "OTHER_POINTS", "ROUNDS", "WRONG_PROBES", "loses_on_other_points",
           "off_samples", "refine_thresholds", "refuting_probes", "resample"]

WRONG_PROBES = 0.1
"""The share of the points probed between samples where a program may lose more than
half the dtype's bits against the formula (see ``refuting_probes``)."""


NEAR = 512
"""Points added around a refuting probe lie within this fraction of the dtype's values
between its neighbouring samples (see ``resample``)."""


ROUNDS = 3
"""Regime inferences per formula: after each whose program a probe refutes, points around
the refuting probes join the samples (see ``resample``)."""


OTHER_POINTS = 256
"""Points off the samples on which a program is checked (see ``loses_on_other_points``)."""


def resample(unit: Formula, samples: list[torch.Tensor], variable: int,
             around: torch.Tensor, dtype: torch.dtype, count: int = 16
              ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """``count`` new points near each value of input ``variable`` in ``around``: within
    1/``NEAR`` of the values of the dtype between the samples on either side of it (so
    that they fall where the probe failed: below 2.9e-39, say, where ``1/n`` overflows,
    not anywhere between the smallest subnormal and the first sample), the other inputs
    taken from random samples; with their exact values. None where none is defined.

    >>> x = sp.Symbol("x", real=True)
    >>> formula = Formula(None, 1 / x, [], [x], [], [], {})
    >>> samples = [torch.linspace(1, 4, 8)]
    >>> more, exact = resample(formula, samples, 0, torch.tensor([2.0]), torch.float32, 4)
    >>> len(more[0]), bool(((more[0] - 2).abs() < 1e-2).all())
    (4, True)
    """
    key = samples[variable].double()
    kind = samples[variable].dtype
    gen = torch.Generator().manual_seed(len(key))
    columns, picks = [], []
    for value in around.double().tolist():
        below, above = key[key < value], key[key > value]
        ends = torch.tensor([float(below.max()) if len(below) else value, value,
                             float(above.min()) if len(above) else value], dtype=kind)
        lo, at, hi = (int(o) for o in ordinals(ends))
        width = max(1, (hi - lo) // NEAR)
        near = from_ordinals(torch.tensor([max(lo, at - width), min(hi, at + width)]), kind)
        columns.append(uniform(float(near[0]), float(near[1]), (count,), kind, gen))
        picks.append(torch.randint(0, len(key), (count,), generator=gen))
    env, exact = _probe(unit, samples, variable, torch.cat(columns), torch.cat(picks))
    defined = representable(exact, dtype)
    if not bool(defined.any()):
        return [], None
    return [env[s][defined] for s in unit.symbols], exact[defined]


def refine_thresholds(unit: Formula, regimes: Regimes, exprs: list[sp.Expr],
                      samples: list[torch.Tensor], dtype: torch.dtype,
                      steps: int = 40, width: int = 8) -> None:
    """Move each threshold, by bisection between the two samples it falls between, to
    where the candidate on its right becomes the more accurate (Herbie's boundary
    refinement): sparse samples can leave a threshold far from the crossing, with a
    series used where it is already poor. The bisection halves the count of ``dtype``
    values between the ends (:func:`compiler.ordinals.midpoint`), so it crosses every binade
    between 0 and a sample. The other inputs are taken from the ``width`` samples
    nearest the threshold.

    >>> x = sp.Symbol("x", real=True)
    >>> formula = Formula(None, 1 / x, [], [x], [], [], {})
    >>> regimes = Regimes(0, [2.0], [0, 1], 0.0)   # 1/x below 2, 2/x (wrong) above
    >>> refine_thresholds(formula, regimes, [1 / x, 2 / x], [torch.linspace(1, 4, 8)],
    ...                   torch.float32)
    >>> regimes.thresholds[0] > 2.2                  # moved up to the next sample
    True
    """
    key = samples[regimes.variable].double()
    for i, t in enumerate(regimes.thresholds):
        below, above = key[key < t], key[key >= t]
        if not len(below) or not len(above):
            continue
        lo, hi = float(below.max()), float(above.min())
        # the other inputs of the samples nearest the threshold, and of samples spread
        # over the whole set: a leading-order series (-c/b) can hold for the first and
        # not yet where another input is larger (4ac against b^2)
        near = torch.cat([torch.argsort((key - t).abs())[:width],
                          torch.linspace(0, len(key) - 1, width).long()])
        left, right = exprs[regimes.candidates[i]], exprs[regimes.candidates[i + 1]]
        for _ in range(steps):
            mid = midpoint(lo, hi, samples[regimes.variable].dtype)
            if not lo < mid < hi:
                break  # the dtype has no value between lo and hi
            column = torch.full((len(near),), mid, dtype=samples[regimes.variable].dtype)
            env, exact = _probe(unit, samples, regimes.variable, column, near)
            try:
                err_left = float(error_in_bits(evaluate(left, env), exact, dtype).mean())
                err_right = float(error_in_bits(evaluate(right, env), exact, dtype).mean())
            except (TypeError, ValueError, RuntimeError, ArithmeticError):
                break
            if err_left <= err_right:
                lo = mid
            else:
                hi = mid
        regimes.thresholds[i] = between(lo, hi)


def refuting_probes(unit: Formula, regimes: Regimes, exprs: list[sp.Expr],
                    samples: list[torch.Tensor], dtype: torch.dtype,
                    bounds: tuple[float, float] | None = None) -> torch.Tensor | None:
    """Where the piecewise program fails between or beyond the samples (the values of the
    branching input there), or None where it holds. Probed: its extremes and the dtype's
    (the smallest subnormal, the largest value, of each sign the samples have), both sides
    of each threshold (a branch that overflows past 44.36 when chosen up to 44.40: no
    sample lay between; a series ``1`` of ``sigmoid(2x)`` chosen from 0 when no sample lay
    below 12), and the same values with the other sign (a series at +inf, ``1/x`` for
    ``rsqrt(x^2 + c)``, is wrong for negative x, which samples of one sign never show);
    the other inputs are taken from the samples. The program fails where it is not finite
    though the exact value and the formula are, or when it loses more than half the
    dtype's bits against the formula at more than :data:`WRONG_PROBES` of the points: a
    branch may be a little less accurate than the formula near a threshold (both are,
    there), and a leading-order series wrong where another input is as large as its own
    (``-c/b`` where ``4ac`` is near ``b^2``: a split on one input cannot avoid that), not
    wrong across a range. ``bounds``: the branching input's declared range, where it has
    one; no probe leaves it, and its ends take the place of the dtype's (a series of
    ``1/x - 1/tan(x)`` declared on (-0.026, 0.026) is not refuted at 1e308).

    >>> x = sp.Symbol("x", real=True)
    >>> formula = Formula(None, 1 / x, [], [x], [], [], {})
    >>> everywhere, samples = Regimes(0, [], [0], 0.0), [torch.linspace(1, 4, 8)]
    >>> refuting_probes(formula, everywhere, [1 / x], samples, torch.float32) is None
    True
    >>> refuting_probes(formula, everywhere, [x], samples, torch.float32) is None
    False
    """
    key = samples[regimes.variable]
    lo, hi = float(key.min()), float(key.max())
    probes = [lo, hi]
    for t in regimes.thresholds:
        for step in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
            probes += [t - abs(t) * step, t + abs(t) * step] if t else [-step, step]
    probes = [p for p in probes if lo <= p <= hi] or [lo, hi]
    probes += [-p for p in probes if p]
    ends = [sign * _extremes(key.dtype) for sign in (1, -1) if bool((key * sign > 0).any())]
    if bounds is not None:
        inside = [p for p in probes if bounds[0] <= p <= bounds[1]]
        probes = inside + [b for b in bounds if abs(b) < float("inf")]
        ends = [e[(e >= bounds[0]) & (e <= bounds[1])] for e in ends]
    column = torch.cat([torch.tensor(probes, dtype=key.dtype), *ends])
    env, exact = _probe(unit, samples, regimes.variable, column,
                        torch.arange(len(column)) % key.numel())
    got = at_points(run_program(regimes, exprs, unit.symbols[regimes.variable], env), exact)
    defined = representable(exact, dtype)
    try:
        formula = at_points(evaluate(unit.expr, env), exact)
    except (TypeError, ValueError, RuntimeError, ArithmeticError):
        formula = None  # the formula cannot be evaluated here: finiteness is the check
    else:
        defined &= torch.isfinite(formula)  # where it overflows, the program may too
    broken = defined & ~torch.isfinite(got)
    if formula is not None and not bool(broken.any()) and bool(defined.any()):
        lost = error_in_bits(got, exact, dtype) - error_in_bits(formula, exact, dtype)
        wrong = defined & (lost > mantissa_bits(dtype) / 2)
        if float(wrong.sum()) <= WRONG_PROBES * float(defined.sum()):
            return None
        broken = wrong
    return column[broken] if bool(broken.any()) else None


def loses_on_other_points(unit: Formula, regimes: Regimes, exprs: list[sp.Expr],
                          samples: list[torch.Tensor], dtype: torch.dtype,
                          tolerance: float = 0.25) -> bool:
    """Whether the piecewise program is less accurate than the formula (by more than
    ``tolerance`` mean bits, or non-finite at more points where the formula is finite) on
    :data:`OTHER_POINTS` points off the samples: half combine the sampled values anew
    (each input's samples shuffled on their own), half are drawn uniformly over the
    dtype's values between each input's smallest and largest sample. Regimes split on one
    input choose, for each of its values, the candidate that was best with the other
    inputs the samples paired it with; with few samples in many inputs that choice can
    fit the samples alone (basilisk's vVec_z in six inputs: 64 samples put four regimes
    on ``mu`` that went 3.7 -> 1.4 bits on them and 3.0 -> 5.8 on 256 new points).

    >>> x, y = sp.symbols("x y", real=True)
    >>> formula = Formula(None, x + y, [], [x, y], [], [], {})
    >>> samples = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])]
    >>> split = Regimes(0, [2.5], [0, 1], 0.0)   # 2*x below 2.5 (true on the diagonal)
    >>> loses_on_other_points(formula, split, [2 * x, x + y], samples, torch.float32)
    True
    """
    gen = torch.Generator().manual_seed(1)
    points = [off_samples(s, OTHER_POINTS, gen) for s in samples]
    exact = exact_values(unit.expr, unit.symbols, points)
    defined = representable(exact, dtype)
    if not bool(defined.any()):
        return False
    env = dict(zip(unit.symbols, points))
    try:
        formula = at_points(evaluate(unit.expr, env), exact)
    except (TypeError, ValueError, RuntimeError, ArithmeticError):
        return False  # nothing to judge the program against here
    got = at_points(run_program(regimes, exprs, unit.symbols[regimes.variable], env), exact)
    finite = defined & torch.isfinite(formula)
    if int((finite & ~torch.isfinite(got)).sum()) > 0:
        return True
    lost = (error_in_bits(got[defined], exact[defined], dtype).mean()
            - error_in_bits(formula[defined], exact[defined], dtype).mean())
    return float(lost) > tolerance


def off_samples(values: torch.Tensor, count: int, generator: torch.Generator
                ) -> torch.Tensor:
    """``count`` values of one input off its samples ``values``: half of them sampled
    values drawn anew (each input drawn on its own, so the points combine them anew), half
    drawn uniformly over the dtype's values between the smallest and the largest finite
    sample (the range the samples, and any declared range, keep to).

    >>> x = off_samples(torch.tensor([1.0, 2.0, 1e30]), 100, torch.Generator().manual_seed(0))
    >>> x.shape, bool(((x >= 1) & (x <= 1e30)).all()), bool((x > 1e10).any())
    (torch.Size([100]), True, True)
    """
    flat = values.reshape(-1)
    half = count // 2
    again = flat[torch.randint(0, flat.numel(), (half,), generator=generator)]
    finite = flat[torch.isfinite(flat)] if flat.is_floating_point() else flat[:0]
    if finite.numel():
        drawn = uniform(float(finite.min()), float(finite.max()), (count - half,), flat.dtype,
                        generator)
    else:  # (integers, or no finite sample: drawn from the samples too)
        drawn = flat[torch.randint(0, flat.numel(), (count - half,), generator=generator)]
    return torch.cat([again, drawn])


def _extremes(dtype: torch.dtype, count: int = 8) -> torch.Tensor:
    """Positive values of ``dtype`` at its two ends: the smallest and the largest, and
    ``count - 1`` more at random within each of the quarter binades next to them (the
    subnormals up, the largest values down): ``2*x`` of a rewrite overflows from 1.7e38 in
    float32 into ``inf - inf`` where ``sin(x/2)`` beside it is not 0, which the round
    values of an evenly spaced probe can all miss."""
    step = 1 << (mantissa_bits(dtype) - 3)
    top = int(ordinals(torch.tensor([torch.finfo(dtype).max], dtype=dtype)))
    offsets = torch.randint(0, step, (2, count - 1), generator=torch.Generator().manual_seed(0))
    offsets += torch.arange(count - 1) * step
    counts = torch.cat([torch.tensor([1]), 1 + offsets[0], torch.tensor([top]),
                        top - offsets[1]])
    return from_ordinals(counts, dtype)


def _probe(unit: Formula, samples: list[torch.Tensor], variable: int, column: torch.Tensor,
           pick: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """``(env, exact)`` at points off the samples: input ``variable`` takes the values
    ``column``, the others their samples at ``pick``."""
    points = [column if i == variable else s[pick] for i, s in enumerate(samples)]
    return dict(zip(unit.symbols, points)), exact_values(unit.expr, unit.symbols, points)
