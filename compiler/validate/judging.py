"""Judging a new program's outputs against the source's: the error measures
(:func:`relative_errors`, elementwise and normwise), the slack a new program has beyond
the source's own error (:data:`NORMWISE_SLACK`, :data:`ELEMENTWISE_SLACK`, a few
roundings), the tolerance of a working-dtype comparison, and what no accuracy excuses: an
output of another kind, one sharing an input's storage, an overflow the source did not
have. :func:`judge` applies them to results validation does not see."""

from __future__ import annotations

import math
from typing import Any

import torch

from compiler.validate.runs import flat_outputs

__all__ = ["ELEMENTWISE_SLACK", "NORMWISE_SLACK", "all_finite", "exceeds", "judge",
           "less_accurate", "output_changed", "overflow_changed", "overflows_sooner",
           "relative_error", "relative_errors", "rounding_tolerance", "sharing_pairs",
           "working_tolerance"]


def relative_errors(got: torch.Tensor, ref: torch.Tensor,
                    unresolved: torch.Tensor | None = None,
                    ignore: torch.Tensor | None = None) -> tuple[float, float]:
    """``(elementwise, normwise)`` relative errors of ``got`` against the reference ``ref``.

    Elementwise: ``max |got - ref| / max(|ref|, tiny)``, tiny being the smallest normal
    number of ``got``'s dtype, so each element is judged at its own magnitude (a result
    scaled by 1e-9 is judged at 1e-9, not against the largest output). Normwise:
    ``max |got - ref| / max |ref|``, the error at the scale of the whole output, which
    rounding noise where a sum cancels does not inflate. Non-finite values must match the
    reference's exactly (inf where the reference is finite is an infinite error); integer
    and bool outputs must be equal; complex ones are judged as pairs of reals (both parts
    count). ``unresolved``: how far the reference itself may be off
    per element (:func:`reference_spread`); that much difference is not error. ``ignore``:
    elements left out of the judgement (where the source itself failed).

    >>> relative_errors(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 1.0], dtype=torch.float64))
    (1.0, 0.5)
    >>> relative_errors(torch.tensor([1 + 2j]), torch.tensor([1 + 1j], dtype=torch.complex128))
    (1.0, 1.0)
    """
    if not (got.is_floating_point() or got.is_complex()):
        exact = torch.equal(got, ref.to(got.dtype))
        return (0.0, 0.0) if exact else (math.inf, math.inf)
    if got.is_complex():  # (judged as pairs of reals: both parts count)
        got, ref = (torch.view_as_real(t.resolve_conj()) if t.is_complex() else (
            torch.stack([t, torch.zeros_like(t)], -1)) for t in (got, ref))
        unresolved, ignore = (None if t is None else t.unsqueeze(-1)
                              for t in (unresolved, ignore))
    tiny = torch.finfo(got.dtype).tiny
    # Two float32 outputs (a working-dtype reference) are compared in float32: half the
    # memory traffic of widening both, and a difference that overflows is redone wide.
    narrow = got.dtype == ref.dtype == torch.float32 and unresolved is None
    ref = ref if narrow else ref.to(torch.float64)
    if unresolved is not None:
        # elements float64 cannot tell at all are not judged
        vague = torch.isinf(unresolved.to(got.device)).expand_as(got)
        ignore = vague if ignore is None else ignore.to(got.device) | vague
    if ignore is not None and bool(ignore.any()):
        keep = ~ignore.to(got.device)
        got, ref = got[keep], ref.to(got.device)[keep]
        if unresolved is not None:
            unresolved = unresolved.to(got.device).expand_as(keep)[keep]
    if not all_finite(ref):  # rare: select the finite elements (a copy of each side)
        finite = torch.isfinite(ref)
        if (finite & ~torch.isfinite(got)).any() or (
                ~finite & ~((got == ref) | (torch.isnan(got) & torch.isnan(ref)))).any():
            return math.inf, math.inf
        if not finite.any():
            return 0.0, 0.0
        got, ref = got[finite], ref[finite]
        if unresolved is not None:
            unresolved = unresolved.expand_as(finite)[finite]
    elif not all_finite(got):
        return math.inf, math.inf
    if not got.numel():
        return 0.0, 0.0
    wide = got.to(ref.dtype)  # a mixed-dtype subtraction is twice as slow as this
    difference = (wide.sub_(ref) if wide is not got else wide - ref).abs_()
    if narrow and not all_finite(difference):  # past float32's range: redone wide
        ref = ref.to(torch.float64)
        difference = got.to(torch.float64).sub_(ref).abs_()
    if unresolved is not None:
        difference = (difference - unresolved.to(difference.device)).clamp_(min=0)
    lo, hi = torch.aminmax(ref)
    largest = max(-float(lo), float(hi), tiny)
    normwise = float(difference.max()) / largest
    elementwise = float(difference.div_(ref.abs().clamp_(min=tiny)).max())
    return elementwise, normwise


def all_finite(x: torch.Tensor) -> bool:
    """True when no element is inf or NaN, in one pass without a copy (both extremes are
    finite exactly then: NaN propagates into them).

    >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, math.nan]))
    (True, False)
    """
    if not x.numel():
        return True
    if x.is_complex():
        return bool(torch.isfinite(x).all())
    lo, hi = torch.aminmax(x)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The elementwise relative error of :func:`relative_errors`.

    >>> relative_error(torch.tensor([0.0, 1.0]), torch.tensor([1e-9, 1.0], dtype=torch.float64))
    1.0
    """
    return relative_errors(got, ref)[0]


NORMWISE_SLACK = {"given": 2, "invented": 16}
"""How many times the source's normwise error an optimised program may reach: twice on the
user's example inputs; 16 times (4 bits) where every input was invented from a fake tensor
(the graphs torch.compile hands over, a backward graph's saved activations), since random
values that break the relations between saved tensors make sums cancel as no real input
would, and the two programs' rounding then differs by such factors. An output the source
itself cancels to noise on the user's inputs (normwise error above 1: no correct digit)
is judged with the second."""


ELEMENTWISE_SLACK = 1024
"""How many times the source's worst elementwise relative error an optimised program may
reach (10 bits): where a sum cancels, a reassociated sum's error at that element is as
likely as the source's to be large, and the two differ by such factors; a wrong rule errs
by far more (a dropped 1e-9 term: ~1e7 times float32's rounding)."""


def working_tolerance(dtype: torch.dtype) -> float:
    """How far, normwise, the new program may be from the source run in the same dtype
    (``reference="working"``): the square root of the dtype's epsilon, half its digits
    (3.5e-4 in float32, 0.031 in float16). Two correct programs differ by their rounding,
    which with no exact reference cannot be told from a small error; a wrong rewrite
    changes the result at its own scale.

    >>> working_tolerance(torch.float32) < 4e-4
    True
    """
    return torch.finfo(dtype).eps ** 0.5 if dtype.is_floating_point else 0.0


def rounding_tolerance(dtype: torch.dtype) -> float:
    """The relative error a rewrite may add beyond twice the source's: a few dozen
    roundings in the dtype (reassociating float constants changes the last bits).

    >>> rounding_tolerance(torch.float32) == 64 * 2 ** -23, rounding_tolerance(torch.int64)
    (True, 0.0)
    """
    return 64 * torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def exceeds(e_before: float, n_before: float, e_after: float, n_after: float,
            normwise_slack: float, tol: float) -> bool:
    """Whether the new program's errors (elementwise ``e_after``, normwise ``n_after``)
    exceed what the source's allow: ``normwise_slack`` (:data:`NORMWISE_SLACK`) and
    :data:`ELEMENTWISE_SLACK` times the source's, plus ``tol``.

    >>> exceeds(1e-7, 1e-7, 1e-6, 1e-7, normwise_slack=2, tol=0.0)
    False
    >>> exceeds(1e-7, 1e-7, 1e-7, 1e-6, normwise_slack=2, tol=0.0)
    True
    """
    return n_after > normwise_slack * n_before + tol or (
        e_after > ELEMENTWISE_SLACK * e_before + tol)


def judge(got: Any, source: Any, reference: Any) -> str | None:
    """Why the outputs ``got`` of a compiled program are less accurate than the source's
    outputs ``source`` on the same inputs, judged against ``reference`` (the source's
    outputs in float64) as validation judges a program on the user's inputs; None where
    they are as accurate. For results validation does not see: code generated after it
    (Inductor's), gradients, another machine's run. A plain comparison with the source at
    a fixed tolerance would refuse a program that is closer to the exact result than the
    source is (eager's TF32 convolutions on a GPU are 1e-3 away from it).

    >>> ref = torch.linspace(1, 2, 8, dtype=torch.float64)
    >>> source = ref.float() + 1e-3               # the source itself is off by 1e-3
    >>> judge(ref.float(), source, ref) is None  # closer than the source: accepted
    True
    >>> judge(ref.float() + 1e-2, source, ref)
    'output 0: relative error 0.01 elementwise, 0.005 normwise vs 0.001 and 0.0005 for the source'
    """
    outs = [flat_outputs(x) for x in (got, source, reference)]
    if not len(outs[0]) == len(outs[1]) == len(outs[2]):
        return "the output structure differs"
    for index, (a, b, r) in enumerate(zip(*outs)):
        changed = output_changed(a, b)
        if changed:
            return f"output {index}: {changed}"
        if not isinstance(b, torch.Tensor):
            continue
        errors = (*relative_errors(b, r), *relative_errors(a, r))
        if exceeds(*errors, NORMWISE_SLACK["given"], rounding_tolerance(b.dtype)):
            return f"output {index}: {less_accurate(errors, 'the source')}"
    return None


def output_changed(new: Any, source: Any, stored: set[int] | frozenset[int] = frozenset()
                   ) -> str | None:
    """Why the output ``new`` cannot stand for the source's output ``source`` whatever its
    values (a non-tensor that differs, another shape or dtype; a tensor sharing the
    storage of an input, ``stored`` holding their addresses, where the source's is a new
    one); None where it can.

    >>> output_changed(torch.ones(2), torch.ones(2, dtype=torch.float64))
    'its shape or dtype changed'
    >>> x = torch.ones(2)
    >>> output_changed(x, x + 0, {x.untyped_storage().data_ptr()})
    "it shares an input's storage where the original's is a new tensor"
    """
    return _kind_changed(new, source) or _storage_changed(new, source, stored)


def _kind_changed(new: Any, source: Any) -> str | None:
    if not isinstance(source, torch.Tensor):
        return None if new == source else f"its value changed ({source!r} -> {new!r})"
    if not isinstance(new, torch.Tensor) or new.shape != source.shape or (
            new.dtype != source.dtype):
        return "its shape or dtype changed"
    return None


def _storage_changed(new: Any, source: Any, stored: set[int] | frozenset[int]
                     ) -> str | None:
    """Whether the output ``new`` shares an input's storage (``stored``: the inputs'
    storage addresses) where the source's output ``source``, computed from the same
    inputs, is a new tensor: a caller writing into it would write into its input. (Layout
    is not judged: an op the source did not call, sdpa for a written-out attention, may
    return a strided result on strided inputs.)"""
    if not (isinstance(new, torch.Tensor) and isinstance(source, torch.Tensor)):
        return None
    if (new.untyped_storage().data_ptr() in stored
            and source.untyped_storage().data_ptr() not in stored):
        return "it shares an input's storage where the original's is a new tensor"
    return None


def sharing_pairs(outs: list) -> set[tuple[int, int]]:
    """The pairs ``(j, k)``, ``j < k``, of outputs that are tensors sharing one storage.

    >>> y = torch.ones(3)
    >>> sorted(sharing_pairs([y, torch.ones(3), y.view(3, 1)]))
    [(0, 2)]
    """
    ptrs = [o.untyped_storage().data_ptr() if isinstance(o, torch.Tensor) and o.numel()
            else None for o in outs]
    return {(j, k) for k, p in enumerate(ptrs) for j in range(k)
            if p is not None and ptrs[j] == p}


def less_accurate(errors: tuple[float, float, float, float], source: str) -> str:
    """The message for a program whose (elementwise, normwise) errors, after the
    source's, exceed what the source's allow.

    >>> less_accurate((1e-7, 1e-7, 1e-3, 1e-4), "the source")
    'relative error 0.001 elementwise, 0.0001 normwise vs 1e-07 and 1e-07 for the source'
    """
    e_before, n_before, e_after, n_after = errors
    return (f"relative error {e_after:.3g} elementwise, {n_after:.3g} normwise vs "
            f"{e_before:.3g} and {n_before:.3g} for {source}")


def overflow_changed(new: torch.Tensor, source: torch.Tensor, ref: torch.Tensor) -> bool:
    """True where the source's result is non-finite though the reference is finite (an
    overflow in the working dtype) and the new result is another non-finite value: inf
    becoming NaN (``a*b - a*c`` for ``a*(b - c)`` when both products overflow) changes
    what later code sees (isinf checks, clamps). A finite result there is an improvement,
    and so is the reference's own value in the working dtype, the infinity of its sign
    where it is past the dtype's range (a softmax's NaN of ``inf / inf`` becoming the inf
    the exact result rounds to).

    >>> ref = torch.tensor([1e39], dtype=torch.float64)
    >>> inf, nan = torch.tensor([math.inf]), torch.tensor([math.nan])
    >>> overflow_changed(nan, inf, ref), overflow_changed(torch.tensor([3.0]), inf, ref)
    (True, False)
    """
    ref = ref.to(new.device)
    changed = torch.isfinite(ref) & ~torch.isfinite(source) & ~torch.isfinite(new) & ~(
        (new == source) | (torch.isnan(new) & torch.isnan(source)) | (new == ref.to(new.dtype)))
    return bool(changed.any())


def overflows_sooner(new: torch.Tensor, source: torch.Tensor, ref: torch.Tensor) -> bool:
    """True where the new result is non-finite but the reference is finite and the
    source's is within 100% of it (next to a pole, ``(x - sin x) / (x - tan x)`` at
    x = 4.4934, the source's finite value is noise and the rewrite's inf no worse).

    >>> ref = torch.tensor([1e30], dtype=torch.float64)
    >>> overflows_sooner(torch.tensor([math.inf]), torch.tensor([1e30]), ref)
    True
    """
    ref = ref.to(new.device).double()
    meaningful = torch.isfinite(ref) & ((source.double() - ref).abs() <= ref.abs())
    return bool((meaningful & ~torch.isfinite(new)).any())
