"""Floating-point values counted in order: the ``n``-th value of a dtype above the most
negative one, as Herbie counts them to sample every binade alike and to bisect a range.

Between 0 and 12.5 float32 has about 1.09e9 values, almost all of them below 1: halving
that count lands near 1e-19, where the arithmetic mean (6.25) would skip 38 binades.

>>> import torch
>>> midpoint(0.0, 12.5, torch.float32) < 1e-18
True
"""

from __future__ import annotations

import torch

__all__ = ["from_ordinals", "midpoint", "ordinals", "uniform", "within"]

_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def ordinals(values: torch.Tensor) -> torch.Tensor:
    """The ordinal (int64) of each value of a floating tensor: 0 for +-0, increasing with
    the value, negative for negative values.

    >>> ordinals(torch.tensor([-1.0, 0.0, 1.4e-45, 1.0])).tolist()
    [-1065353216, 0, 1, 1065353216]
    """
    bits = values.contiguous().view(_INTS[values.dtype.itemsize]).long()
    sign = 1 << (8 * values.dtype.itemsize - 1)
    # negative floats count down from -0 (bit patterns with the sign bit set)
    return torch.where(bits < 0, -(bits + sign), bits)


def from_ordinals(counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ``dtype`` values of the ordinals ``counts`` (the inverse of :func:`ordinals`).

    >>> from_ordinals(torch.tensor([-1065353216, 1]), torch.float32).tolist()
    [-1.0, 1.401298464324817e-45]
    """
    sign = 1 << (8 * dtype.itemsize - 1)
    pattern = torch.where(counts < 0, -counts - sign, counts)
    return pattern.to(_INTS[dtype.itemsize]).view(dtype)


def midpoint(lo: float, hi: float, dtype: torch.dtype) -> float:
    """The ``dtype`` value halfway between ``lo`` and ``hi`` in the order of all its values.

    >>> midpoint(1.0, 4.0, torch.float32), midpoint(-1.0, 1.0, torch.float32)
    (2.0, 0.0)
    """
    counts = ordinals(torch.tensor([lo, hi], dtype=dtype))
    return float(from_ordinals(counts.sum().div(2, rounding_mode="floor").reshape(1), dtype))


def uniform(lo: float, hi: float, shape: tuple, dtype: torch.dtype,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Values of ``dtype`` in ``[lo, hi]`` drawn uniformly over its ordinals there (each
    binade alike); an infinite end stands for the dtype's largest finite value.

    >>> x = uniform(1e-30, float("inf"), (1000,), torch.float32, torch.Generator().manual_seed(0))
    >>> bool((x >= 1e-30).all()), bool((x < 1).any() and (x > 1e30).any())
    (True, True)
    """
    largest = torch.finfo(dtype).max
    ends = torch.tensor([max(lo, -largest), min(hi, largest)], dtype=dtype)
    first, last = (int(v) for v in ordinals(ends))
    # in float64: a float64 range holds more ordinals than an int64 can count
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    counts = (first + torch.floor(u * (float(last) - float(first) + 1))).long()
    return from_ordinals(counts.clamp_(first, last), dtype)


def within(values: torch.Tensor, lo: float, hi: float,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """``values`` with those outside ``[lo, hi]`` replaced by :func:`uniform` draws inside
    it: sample or random inputs moved into a range the user declared.

    >>> x = within(torch.tensor([-3.0, 0.5, 7.0]), 0.0, 1.0, torch.Generator().manual_seed(0))
    >>> bool(((x >= 0) & (x <= 1)).all()), float(x[1])
    (True, 0.5)
    """
    if not values.is_floating_point():
        return values
    inside = uniform(lo, hi, tuple(values.shape), values.dtype, generator).to(values.device)
    return torch.where((values >= lo) & (values <= hi), values, inside)
