"""Herbie's sampling of an FPCore program's inputs, and its measure of error.

Points are drawn as Herbie draws them: each argument uniformly over the bit patterns of
the program's precision that lie inside the bounds ``:pre`` declares for it (so every
binade is equally likely: as many points in [1e-300, 1e-299] as in [1, 10]), with
rejection for the rest of the precondition (strict bounds, ``!=``, relations between
arguments) and for points whose exact result is not a finite float of the precision (NaN
outside the function's domain, overflow). The search runs on training points; its result
is judged on separate test points (Herbie re-evaluates on 8,000). Error is Herbie's, in
bits: ``log2(1 + ulps between the result and the correctly rounded exact value)``
(:func:`compiler.stability.error_bits`), mean and worst over the points.

>>> from frontends import fpcore
>>> (p,) = fpcore.parse("(FPCore (x) :pre (<= 1 x 1e300) (- (sqrt (+ x 1)) (sqrt x)))")
>>> (x,), exact = sample(p, 64, seed=1)
>>> bool(((x >= 1) & (x <= 1e300)).all()), x.dtype, bool((x > 1e200).any())
(True, torch.float64, True)
>>> errors(p.module()(x), exact, p.precision).mean > 20  # cancellation for large x
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compiler.ordinals import from_ordinals, ordinals
from frontends.fpcore import Program

__all__ = ["Errors", "SamplingError", "errors", "sample", "train_and_test"]


class SamplingError(RuntimeError):
    """Too few points satisfy the precondition and have a finite exact result."""


@dataclass(frozen=True)
class Errors:
    """Bits of error over points: ``mean`` and ``worst``, and how many results are not
    finite where the exact value is (``nonfinite``)."""

    mean: float
    worst: float
    nonfinite: int


def _ordinal_ranges(program: Program, name: str) -> list[tuple[int, int]]:
    dtype = program.dtype
    largest = torch.finfo(dtype).max
    intervals = program.pre.intervals.get(name) if program.pre is not None else None
    out = []
    for lo, hi in intervals or ((-math.inf, math.inf),):
        ends = torch.tensor([max(lo, -largest), min(hi, largest)], dtype=torch.float64)
        ends = ends.to(dtype)
        # an end that rounded outward in a narrower dtype: step back inside
        if float(ends[0]) < lo:
            ends[0] = torch.nextafter(ends[0], torch.tensor(math.inf, dtype=dtype))
        if float(ends[1]) > hi:
            ends[1] = torch.nextafter(ends[1], torch.tensor(-math.inf, dtype=dtype))
        first, last = (int(v) for v in ordinals(ends))
        if first <= last:
            out.append((first, last))
    return out


def _draw(ranges: list[tuple[int, int]], count: int, dtype: torch.dtype,
          gen: torch.Generator) -> torch.Tensor:
    """``count`` values uniform over the ordinals of a union of ranges."""
    sizes = torch.tensor([float(b) - float(a) + 1 for a, b in ranges], dtype=torch.float64)
    which = torch.multinomial(sizes / sizes.sum(), count, replacement=True, generator=gen)
    u = torch.rand(count, generator=gen, dtype=torch.float64)
    offsets = torch.floor(u * sizes[which]).tolist()
    # the offset in float64, the sum in Python's integers: the whole float64 line holds
    # 2^64 ordinals, and an offset past 2^63 wrapped in int64 (every positive draw of an
    # unbounded input came out as one value, 2.2e-308)
    counts = [min(max(ranges[w][0] + int(o), ranges[w][0]), ranges[w][1])
              for w, o in zip(which.tolist(), offsets)]
    return from_ordinals(torch.tensor(counts, dtype=torch.int64), dtype)


def sample(program: Program, count: int, seed: int, batches: int = 60
           ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """``count`` points of ``program`` (one tensor per argument, in its precision) and the
    exact result at each (float64; see the module docstring). :class:`SamplingError` when
    ``batches`` rounds of drawing find too few."""
    dtype = program.dtype
    if not program.arguments:
        return (), torch.tensor([program.reference()], dtype=torch.float64)
    ranges = [_ordinal_ranges(program, a) for a in program.arguments]
    if any(not r for r in ranges):
        raise SamplingError("the precondition's bounds leave no value of the precision")
    gen = torch.Generator().manual_seed(seed)
    kept: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    have = 0
    for _ in range(batches):
        xs = torch.stack([_draw(r, 4 * count, dtype, gen) for r in ranges])
        ok = torch.isfinite(xs).all(0)
        if program.pre is not None:
            ok &= program.pre(*xs)
        xs = xs[:, ok][:, : 2 * (count - have)]
        if xs.shape[1] == 0:
            continue
        exact = program.reference(*xs)
        good = torch.isfinite(exact)
        kept.append(xs[:, good])
        values.append(exact[good])
        have += int(good.sum())
        if have >= count:
            break
    if have < count:
        raise SamplingError(f"{have} of {count} points satisfy the precondition and have a "
                            f"finite exact result after {batches} rounds (NaN: outside the "
                            f"domain, or a comparison no precision decides)")
    xs = torch.cat(kept, 1)[:, :count]
    return tuple(xs), torch.cat(values)[:count]


def train_and_test(program: Program, train: int, test: int, seed: int = 0):
    """Training points (what the search sees) and separate test points (where the result
    is judged), each ``(inputs, exact)``."""
    return sample(program, train, seed=2 * seed + 1), sample(program, test, seed=2 * seed + 2)


def errors(got: torch.Tensor, exact: torch.Tensor, precision: str) -> Errors:
    """Herbie's error of results ``got`` against the exact values, in bits of
    ``precision``; a non-finite result where the truth is finite costs every bit.

    >>> exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> errors(exact + torch.tensor([0.0, 2 ** -51], dtype=torch.float64), exact, "binary64")
    Errors(mean=0.5, worst=1.0, nonfinite=0)
    """
    from compiler.stability import error_bits

    dtype = torch.float32 if precision == "binary32" else torch.float64
    got = got.reshape(exact.shape) if got.numel() == exact.numel() else got.expand_as(exact)
    nonfinite = int((~torch.isfinite(got) & torch.isfinite(exact)).sum())
    return Errors(error_bits(got, exact, dtype), error_bits(got, exact, dtype, "max"),
                  nonfinite)
