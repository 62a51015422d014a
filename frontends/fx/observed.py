"""What a real example value shows, read once at ingest: the range of its finite values
(``lo``/``hi``, and the smallest magnitude) and whether it is a causal mask (a bool one,
or an additive one: transformers' float mask). Like every
observed fact (:class:`frontends.fx.analysis.Meta`), a rule may let it choose the form it
writes but never rest on it for values it has not seen."""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["dropping_below", "observed_range", "triangle_of"]


def observed_range(value: torch.Tensor) -> dict:
    """``lo``/``hi`` and the smallest magnitude ``small`` of a real tensor's finite values
    (nothing for fake or meta tensors)."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if isinstance(value, FakeTensor) or value.device.type == "meta" or value.numel() == 0:
        return {}
    if value.dtype == torch.bool or value.is_complex():
        return {}
    if torch._C._functorch.is_functorch_wrapped_tensor(value):
        # recorded inside a vmap (transformers' mask functions): its batch level is gone
        # and its values cannot be read
        return {}
    # A real constant inside torch.compile's fake mode: measure it as the real tensor it is.
    with torch.no_grad(), unset_fake_temporarily():
        lo, hi = torch.aminmax(value)  # one pass; filter non-finite values only if present
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            value = value[torch.isfinite(value)]
            if value.numel() == 0:
                return {}
            lo, hi = float(value.min()), float(value.max())
        return {"lo": lo, "hi": hi, "small": float(value.abs().min())}


def dropping_below(dtype: torch.dtype) -> float:
    """The value at or below which an entry added to scores of ``dtype`` takes its score
    out of a softmax, as -inf does (its weight ``exp(fill + score - rowmax)`` is 0 for
    scores of any size a model makes): -1e9 (transformers' ``finfo.min`` and the
    Annotated Transformer's -1e9 are at or below it), or half the lowest value of a
    dtype whose lowest is above that (float16).

    >>> dropping_below(torch.float32), dropping_below(torch.float16)
    (-1000000000.0, -32752.0)
    """
    return max(-1e9, torch.finfo(dtype).min / 2)


def triangle_of(value: torch.Tensor) -> str | None:
    """Which causal mask a real tensor holds in every matrix of its last two dims:
    ``"tril"``, 1 (or True) on and below the diagonal and 0 (False) above (nanoGPT's ``bias``
    buffer, the entries sdpa's ``is_causal`` keeps), ``"triu"``, 1 only above it (the
    entries it drops), ``"additive"``, a float mask 0 on and below it and at most
    :func:`dropping_below` above (transformers' causal mask, added to the scores); None
    for any other values, and for fake or meta tensors or symbolic sizes.

    >>> ones = torch.ones(1, 1, 4, 4)
    >>> triangle_of(ones.tril()), triangle_of(ones.bool().triu(1)), triangle_of(ones)
    ('tril', 'triu', None)
    >>> triangle_of(torch.zeros(4, 4).masked_fill(ones.bool().triu(1), -torch.inf))
    'additive'
    """
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    # (a symbolic size compared here would guard it to its example's value)
    if not all(type(s) is int for s in value.shape):
        return None
    if (value.dim() < 2 or min(value.shape[-2:]) < 2 or value.is_complex()
            or isinstance(value, FakeTensor) or value.device.type == "meta"
            or torch._C._functorch.is_functorch_wrapped_tensor(value)):
        return None
    # (a real value inside torch.compile's fake mode is read as the real tensor it is)
    with torch.no_grad(), unset_fake_temporarily():
        first = value[(0,) * (value.dim() - 2)]
        name = {(1, 0): "tril", (0, 1): "triu"}.get(
            (int(first[0, 0] != 0), int(first[0, 1] != 0)))
        if name is None or int(first[1, 0] != 0) != (name == "tril"):
            return None  # (the corner of a weight or an activation: no pass over it)
        above = _triangle("triu", *value.shape[-2:], torch.bool, value.device)
        if value.is_floating_point() and first[0, 1] <= dropping_below(value.dtype):
            return "additive" if bool(((value <= dropping_below(value.dtype)) == above).all()
                                      and (value.masked_fill(above, 0) == 0).all()) else None
        expected = _triangle(name, *value.shape[-2:], value.dtype, value.device)
        return name if torch.equal(value, expected.expand(value.shape)) else None


@functools.lru_cache(maxsize=8)
def _triangle(name: str, rows: int, cols: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """``ones(rows, cols).tril()`` or ``.triu(1)`` in ``dtype``: made once for a decoder's
    layers, whose buffers are alike (making one costs more than comparing with it)."""
    ones = torch.ones(rows, cols, dtype=torch.bool, device=device)
    return (ones.tril() if name == "tril" else ones.triu(1)).to(dtype)
