"""Validation: the emitted module against its source, with a float64 reference.

The source is evaluated in float64 (parameters and floating inputs promoted) as the
reference; the new program must be at least as close to it as the source is, within a
tolerance scaled to the dtype, on the example inputs and on random inputs of the same
shapes, dtypes and integer ranges. Errors are relative (:func:`relative_errors`): normwise,
the new program must stay within twice the source's error plus a few dozen roundings
(:data:`NORMWISE_SLACK`: more where every input is invented from a fake tensor);
elementwise, each output element judged at its own magnitude, within
:data:`ELEMENTWISE_SLACK` times the source's worst. A rewrite that removes an overflow is
therefore not mistaken for a bug. Programs with random ops (any op torch's schemas tag as
drawing, and the generators a model holds) are compared to the source under the same seeds
instead, normwise within :func:`working_tolerance` as in working mode; an output outside it
is judged, as there, against the source in float64, which is handed the draws of the
source's own run (:class:`_Draws`: under one seed float64 draws other numbers).

float64 has its own limits: ``log(x + 1) - log(x)`` is 0 in float64 for x past 1e16, where
its stable form gives the true ``1/x``. Before a program is refused, the reference is run
again with each inexact op's result moved by a few roundings at random (Monte Carlo
arithmetic, :func:`reference_spread`); what lies within that spread of the reference is not
counted as error, so a program more accurate than float64 is not refused for it. Nor is the
source's error only the one its run happened to make: an output that is 0 in truth (the
mean of a layer norm's output, a log-sum-exp of log-probabilities) may round to exactly 0
in the source and to 2e-7 in a fused form. The source is run again with each inexact op's
result moved by up to one rounding of its own dtype (:func:`rounding_samples`), and its
error is the worst of those runs': results it could as well have given.

That float64 copy of the model doubles its memory and time. ``reference="working"`` is the
cheaper mode for large models: the new program is compared with the source run in the
working dtype, normwise within :func:`working_tolerance` of the dtype (an output outside
it is judged against the source in float64 before the program is refused: the working-dtype
source may be the one that is off, a float16 sum that overflows); the report's
``reference`` says which mode was used. On a large program (:data:`SIDE_BY_SIDE_NUMEL`)
whose CPU has cores to spare, the source and the new program run side by side in two
threads, so validation takes about one forward pass, not two.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) / torch.exp(x).sum())
>>> opt = EGraph.from_fx(gm, (torch.randn(4),)).extract(AstSize())
>>> opt.meta["egraph_report"].validation.ok
True
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from compiler.ordinals import within
from egraph.ops.table import TABLE
from egraph.signs import POS
from frontends.fx.effects import (
    UNINITIALISED,
    generator_state,
    generator_state_inputs,
    is_in_place,
    leaves_memory_unwritten,
    sees_rng_replays,
    updates_an_input,
    updates_inputs,
)
from frontends.fx.exported import ExportedModule, attribute_at, deep_copy
from frontends.fx.kept import attributes_kept, generators_kept, state_kept, written_attributes
from frontends.fx.source import FxSource


class ValidationError(AssertionError):
    """The optimised program's outputs disagree with the source's."""


@dataclass
class Validation:
    """The outcome: the worst errors of the source and the new program, how many input
    sets were checked, and why it failed if it did. Against a float64 ``reference``:
    elementwise relative errors; against the source run in its working dtype (or under
    the same seed, for a program that draws random numbers), the source's error is 0 and
    the new program's is its largest normwise difference from the source, what such a
    judgement reads (at a cancelling element two correct programs differ by 200%).

    >>> str(Validation(True, 1e-7, 2e-7, 4))[:82]
    'validation passed: max elementwise relative error vs float64 reference 1e-07 (orig'
    >>> str(Validation(True, 0.0, 3e-6, 4, reference="working-dtype original"))[18:]
    ' largest normwise difference from the working-dtype original 3e-06 on 4 input sets'
    """

    ok: bool
    error_before: float
    error_after: float
    trials: int
    reason: str = ""
    reference: str = "float64"
    strided: tuple[int, ...] = ()  # flat outputs the source returned contiguous, ours not

    def __str__(self) -> str:
        verdict = "passed" if self.ok else f"FAILED ({self.reason})"
        if self.reference in SOURCE_REFERENCES:
            return (f"validation {verdict}: largest normwise difference from the "
                    f"{self.reference} {self.error_after:.3g} on {self.trials} input sets")
        return (f"validation {verdict}: max elementwise relative error vs {self.reference} "
                f"reference {self.error_before:.3g} (original) -> {self.error_after:.3g} "
                f"(optimised) on {self.trials} input sets")


SOURCE_REFERENCES = ("working-dtype original", "same-seed original")
"""The references a :class:`Validation` judged by that are the source itself (in its
working dtype; under the same seed): normwise differences from it."""


def is_fake(x: Any) -> bool:
    """Whether ``x`` is a tensor without values: a fake one (torch.compile's example
    inputs) or one on the meta device."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, torch.Tensor) and (isinstance(x, FakeTensor) or x.device.type == "meta")


def stand_ins(inputs: Sequence[Any], gm: fx.GraphModule | None = None, *,
              grad: bool = False) -> tuple:
    """Real values for inputs without values (:func:`is_fake`: torch.compile's example
    inputs, meta tensors): random values of the kind (small integers for an integer
    tensor: valid indices anywhere), of the shape (a symbolic size by the value dynamo
    hints for it), dtype, device (the CPU for meta) and layout (a program that assumed an
    aot graph's channels-last activation contiguous passes on contiguous stand-ins);
    with ``grad``, requiring the gradient the input requires. What ``gm`` reads as a
    generator's state is a valid state; a symbolic number is its hint; a real value is
    given as it is.

    >>> with torch._subclasses.fake_tensor.FakeTensorMode():
    ...     fake = torch.empty(3, 2).t()
    >>> real, = stand_ins((fake,))
    >>> is_fake(real), tuple(real.shape), real.stride()
    (False, (2, 3), (1, 2))
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    states = generator_state_inputs(gm) if gm is not None else {}

    def real(i: int, x: Any) -> Any:
        if not is_fake(x):
            return _hint(x)
        if i in states:
            return generator_state(states[i])
        shape = tuple(_hint(n) for n in x.shape)
        if x.dtype.is_floating_point or x.dtype.is_complex:
            values = torch.randn(shape, dtype=torch.complex64 if x.dtype.is_complex else None)
        else:
            values = torch.randint(0, 2, shape)
        layout = torch.empty_strided(shape, tuple(_hint(n) for n in x.stride()),
                                     dtype=x.dtype, device="meta")
        device = x.device if x.device.type != "meta" else "cpu"
        values = strided_like(values.to(device=device, dtype=x.dtype), layout)
        return values.requires_grad_(grad and x.requires_grad and values.is_floating_point())

    with unset_fake_temporarily():
        return tuple(real(i, x) for i, x in enumerate(inputs))


def _hint(n: Any) -> Any:
    """The value dynamo hints for a symbolic number (no guard is added); others as they
    are."""
    if isinstance(n, torch.SymInt):
        try:
            from torch.fx.experimental.symbolic_shapes import optimization_hint
        except ImportError:  # older torch names it hint_int
            from torch.fx.experimental.symbolic_shapes import hint_int as optimization_hint

        return optimization_hint(n)
    if isinstance(n, (torch.SymFloat, torch.SymBool)):
        return n.node.hint
    return n


def strided_like(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` laid out with ``like``'s strides: a backward graph ``view``s the
    activations it saved as they were laid out (ConvNeXt's channels-last permute), and
    refuses a contiguous stand-in. A broadcast dimension (stride 0) keeps its first slice.
    Strides count where a size is 1 too: a channels-last 1x1 convolution weight is
    contiguous either way, but the convolution's output layout follows its strides.

    >>> strided_like(torch.arange(6.).reshape(2, 3), torch.empty(3, 2).t()).stride()
    (1, 2)
    >>> weight = torch.empty(4, 2, 1, 1).to(memory_format=torch.channels_last)
    >>> strided_like(torch.ones(4, 2, 1, 1), weight).stride()
    (2, 1, 2, 2)
    """
    if values.shape != like.shape or values.stride() == like.stride():
        return values
    stride = like.stride()
    broadcast = [d for d, st in enumerate(stride) if st == 0 and like.shape[d] > 1]
    for d in broadcast:
        values = values.narrow(d, 0, 1)
    try:
        out = torch.empty_strided(values.shape, stride, dtype=values.dtype,
                                  device=values.device)
        out.copy_(values)
    except RuntimeError:  # overlapping strides other than a broadcast: keep it contiguous
        return values.expand(like.shape)
    return out.expand(like.shape) if broadcast else out


def _in_range(values: torch.Tensor, declared: tuple[float, float] | None,
              generator: torch.Generator) -> torch.Tensor:
    """Random values moved into an input's declared range (every binade alike): a
    program is promised only that range (a series at +inf for ``n > 6.8e15``)."""
    return values if declared is None else within(values, *declared, generator)


def in_domain(values: torch.Tensor, signs: int | None) -> torch.Tensor:
    """Move random values into a declared input domain (proven signs of the input)."""
    from egraph.signs import NEG, POS, ZERO

    if signs is None or not values.is_floating_point():
        return values
    magnitude = values.abs()
    if not signs & ZERO:
        magnitude = magnitude + magnitude.mean().clamp(min=1e-3) * 1e-2
    if not signs & NEG:
        return magnitude
    if not signs & POS:
        return -magnitude
    if not signs & ZERO:
        return torch.where(values < 0, -magnitude, magnitude)
    return values


STRESS_SCALE = 8.0
"""The last random input set spreads floating values this many times wider than the
examples': a rewrite that overflows sooner than the source (``exp(a) * exp(-b)`` for
``exp(a - b)``) shows there, not only at the examples' magnitudes."""


def random_like(x: torch.Tensor, generator: torch.Generator | None, scale: float = 1.0,
                shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Random values of ``x``'s kind (drawn on the CPU generator, placed on ``x``'s device)
    and of ``shape`` (default: ``x``'s): integers within ``x``'s range, booleans, floats
    (or a complex tensor's parts) about ``x``'s mean with its spread widened by ``scale``.

    >>> drawn = random_like(torch.tensor([3, 5, 7]), None, shape=(8,))
    >>> drawn.shape, bool(((drawn >= 3) & (drawn <= 7)).all())
    (torch.Size([8]), True)
    >>> random_like(torch.polar(torch.ones(2), torch.zeros(2)), None).dtype
    torch.complex64
    """
    shape = tuple(x.shape) if shape is None else shape
    if x.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool().to(x.device)
    if x.is_complex():  # (rotary frequencies: real and imaginary parts drawn alike)
        parts = random_like(torch.view_as_real(x.resolve_conj()), generator, scale,
                            (*shape, 2))
        return torch.view_as_complex(parts)
    if not x.is_floating_point():
        if x.numel():
            lo, hi = int(x.min()), int(x.max())
        else:
            lo, hi = 0, 1
        return torch.randint(lo, hi + 1, shape, generator=generator,
                             dtype=x.dtype).to(x.device)
    out = torch.randn(shape, generator=generator, dtype=torch.float64)
    if x.numel() > 1 and x.device.type != "meta":
        # in float64: the squares of float32 values past 1.8e19 overflow float32
        std, mean = x.double().std(), x.double().mean()
        if torch.isfinite(std) and std > 0:
            out = out * (std.cpu() * scale) + mean.cpu()
    return out.to(device=x.device, dtype=x.dtype)


def _flat(out: Any) -> list[Any]:
    leaves: list[Any] = []
    fx.node.map_aggregate(out, leaves.append)
    return leaves


def _to64(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        return x.to(torch.complex128 if x.is_complex() else torch.float64)
    return x


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
    if not _all_finite(ref):  # rare: select the finite elements (a copy of each side)
        finite = torch.isfinite(ref)
        if (finite & ~torch.isfinite(got)).any() or (
                ~finite & ~((got == ref) | (torch.isnan(got) & torch.isnan(ref)))).any():
            return math.inf, math.inf
        if not finite.any():
            return 0.0, 0.0
        got, ref = got[finite], ref[finite]
        if unresolved is not None:
            unresolved = unresolved.expand_as(finite)[finite]
    elif not _all_finite(got):
        return math.inf, math.inf
    if not got.numel():
        return 0.0, 0.0
    wide = got.to(ref.dtype)  # a mixed-dtype subtraction is twice as slow as this
    difference = (wide.sub_(ref) if wide is not got else wide - ref).abs_()
    if narrow and not _all_finite(difference):  # past float32's range: redone wide
        ref = ref.to(torch.float64)
        difference = got.to(torch.float64).sub_(ref).abs_()
    if unresolved is not None:
        difference = (difference - unresolved.to(difference.device)).clamp_(min=0)
    lo, hi = torch.aminmax(ref)
    largest = max(-float(lo), float(hi), tiny)
    normwise = float(difference.max()) / largest
    elementwise = float(difference.div_(ref.abs().clamp_(min=tiny)).max())
    return elementwise, normwise


def _all_finite(x: torch.Tensor) -> bool:
    """True when no element is inf or NaN, in one pass without a copy (both extremes are
    finite exactly then: NaN propagates into them)."""
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


REFERENCES = ("auto", "float64", "working")
"""Validation modes: the source in float64 as the reference, or the source in its working
dtype (no float64 copy of the model: half the memory, for large models); ``"auto"`` (the
default) is float64 up to :data:`FLOAT64_LIMIT` elements of parameters and inputs, the
working dtype beyond."""

FLOAT64_LIMIT = 1 << 24
"""Above this many elements of parameters and inputs (16.8 million: a 134 MB float64 copy,
GPT-2 small has 124 million), ``reference="auto"`` validates in the working dtype: the
float64 copy and run would cost more than the rest of the pipeline."""


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


def _tolerance(dtype: torch.dtype) -> float:
    """The relative error a rewrite may add beyond twice the source's: a few dozen
    roundings in the dtype (reassociating float constants changes the last bits)."""
    return 64 * torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


_EXACT_OPS = frozenset(name for name, entry in TABLE.items()
                       if entry.error == "exact" or entry.kind == "view") | {
    "getitem", "clone", "contiguous", "detach", "alias", "to", "_to_copy", "type_as", "slice",
    "select", "index", "index_select", "view", "unsqueeze", "squeeze", "flatten", "expand",
    "permute", "transpose", "t", "embedding", "gather", "cat", "stack", "masked_fill",
    "floor", "ceil", "round", "trunc", "sign", "max", "min"}
"""Ops whose result is one of their operands' values, or a selection of them, with no
rounding: a Monte Carlo run of the reference leaves them alone."""

_POSITIVE_OPS = frozenset(
    part for name, entry in TABLE.items() if entry.sign == POS
    for part in (name, *(target.split(".")[1] if target.startswith("aten.")
                         else target.rsplit(".", 1)[-1] for target, _ in entry.spellings)))
"""Ops (by every name a graph calls them) whose result is positive on finite operands in
exact arithmetic (``exp``, ``sigmoid``, ``softmax``): a 0 they give is an underflow."""


def _op_name(n: fx.Node, root: nn.Module) -> str:
    """What ``n`` calls, by name: a module call by its module's type (``nn.Embedding``
    selects rows, exactly, as ``F.embedding`` does)."""
    if n.op == "call_module":
        return type(root.get_submodule(n.target)).__name__.lower()
    if isinstance(n.target, str):
        return n.target
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target._opname
    return getattr(n.target, "__name__", "")


class _Float64Interpreter(fx.Interpreter):
    """Runs a graph with every floating value in float64: dtype arguments that name a
    floating dtype become float64 and dtype assertions are skipped, so graphs with explicit
    casts and checks (torch.export's ``_assert_tensor_metadata``, ``to(float32)``) still
    give a float64 reference. The regions of higher-order ops (``wrap_with_autocast``,
    ``wrap_with_set_grad_enabled``) are interpreted the same way, without autocast: the
    reference is the exact computation, not a lower-precision one.

    With ``rounding`` (a generator), each inexact function call's result is moved by a few
    roundings, up or down at random per element: a Monte Carlo sample of float64's own
    error (:func:`reference_spread`), wide rather than exact."""

    _ASSERTS = {torch.ops.aten._assert_tensor_metadata.default}

    def __init__(self, module: fx.GraphModule, rounding: torch.Generator | None = None):
        super().__init__(module)
        self.rounding = rounding

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "call_function" and n.target in self._ASSERTS:
            return None
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
            args, _ = self.fetch_args_kwargs_from_env(n)
            body = next((i for i, a in enumerate(args) if isinstance(a, fx.GraphModule)), None)
            if body is not None:
                return _Float64Interpreter(args[body], self.rounding).run(*args[body + 1:])
        out = super().run_node(n)
        if isinstance(out, torch.Tensor) and out.dtype not in (torch.float64,
                                                                torch.complex128):
            # once, where it is made (``torch.zeros(3)`` in the default dtype): promoted on
            # each read instead, ``y[1] = v`` would write into a copy and be lost
            out = _to64(out)
        if (self.rounding is not None
                and n.op in ("call_function", "call_method", "call_module")
                and isinstance(out, torch.Tensor) and out.dtype == torch.float64
                and (name := _op_name(n, self.module)) not in _EXACT_OPS):
            # k roundings, 1 <= |k| <= 16 at random: two equal values (log(x + 1) and
            # log(x) where float64 cannot tell x + 1 from x) almost never move alike
            k = torch.randint(1, 17, out.shape, generator=self.rounding, dtype=torch.float64)
            sign = torch.randint(0, 2, out.shape, generator=self.rounding) * 2 - 1
            if name in _POSITIVE_OPS and self._underflowed(n, out):
                # A 0 of an op that is positive in truth on finite operands (exp(-800),
                # a softmax of a row 1e9 apart) is an underflow: its rounding error is
                # up to the smallest subnormal, as much as the value (the log of it is
                # -inf in float64 and finite in truth: float64 cannot tell it)
                out = torch.where(out == 0, k.to(out.device) * math.ulp(0.0), out)
            out = _moved(out, self, n, k.mul_(sign))
        return out

    def _underflowed(self, n: fx.Node, out: torch.Tensor) -> bool:
        operands = [v for v in map(self.env.get, n.all_input_nodes)
                    if isinstance(v, torch.Tensor) and v.is_floating_point()]
        return bool((out == 0).any()) and all(_all_finite(v) for v in operands)

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple, dict]:
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        return _promote_all(args), _promote_all(kwargs)


class _RoundingInterpreter(fx.Interpreter):
    """Runs a graph in its own dtypes with each inexact op's result moved by a random
    fraction of a rounding of its dtype (up to one, either way, per element): a sample of
    the rounding errors the program could as well have made (Monte Carlo arithmetic)."""

    def __init__(self, module: fx.GraphModule, rounding: torch.Generator):
        super().__init__(module)
        self.rounding = rounding

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if (n.op in ("call_function", "call_method", "call_module")
                and isinstance(out, torch.Tensor) and out.is_floating_point()
                and _op_name(n, self.module) not in _EXACT_OPS):
            fraction = torch.rand(out.shape, generator=self.rounding, dtype=torch.float64)
            out = _moved(out, self, n, fraction.mul_(2).sub_(1))
        return out


def _moved(out: torch.Tensor, interpreter: fx.Interpreter, n: fx.Node,
           roundings: torch.Tensor) -> torch.Tensor:
    """``out``, the result of ``n``, moved by ``roundings`` (per element) of its dtype."""
    factor = (1 + roundings * torch.finfo(out.dtype).eps).to(out.device)
    operands = [v for v in map(interpreter.env.get, n.all_input_nodes)
                if isinstance(v, torch.Tensor)]
    if any(out is a for a in operands):
        called = (interpreter.module.get_submodule(n.target) if n.op == "call_module"
                  else None)
        if not is_in_place(n, called):
            # the operand itself, unrounded (dropout in eval, ``x.to`` its own dtype):
            # moving it would write into the caller's tensor
            return out
        # an update in place (``a = b.mul_(m)``): every name of that tensor sees its
        # rounding, and a later update through one of them; a copy would keep ``a`` at this
        # value and the spread would cover the whole update
        return out.copy_(out * factor)
    if _shares_memory(out, operands):  # a view selects values, exactly
        return out
    return (out * factor).to(out.dtype)


def rounding_samples(graph: fx.GraphModule, xs: tuple, samples: int = 4,
                     rounding: torch.Generator | None = None) -> list[list]:
    """The flat outputs of ``samples`` runs of ``graph`` on ``xs`` in its own dtypes, each
    inexact op's result moved by up to one rounding at random (:class:`_RoundingInterpreter`):
    results the program could as well have given, so its error is the worst of theirs. An
    output that cancels to rounding noise (the mean of a layer norm's output, a log-sum-exp
    of log-probabilities: 0 in truth) is as likely to be any value within their spread as
    the one the source happened to round to. [] where the graph cannot run so. The graph
    is run on a copy (its state untouched) and the inputs are left as they are.

    >>> g = fx.symbolic_trace(lambda x: (x + 1) - 1)
    >>> runs = rounding_samples(g, (torch.tensor([1e-3]),), samples=8)
    >>> len(runs), any(float(run[0][0]) != 1e-3 for run in runs)
    (8, True)
    """
    rounding = rounding if rounding is not None else torch.Generator().manual_seed(0)
    writes = updates_inputs(graph.graph)
    runs = []
    try:
        copied = deep_copy(graph)
        for _ in range(samples):
            given = [x.clone() if writes and isinstance(x, torch.Tensor) else x for x in xs]
            with torch.no_grad(), state_kept(), attributes_kept(copied):
                runs.append(_flat(_RoundingInterpreter(copied, rounding).run(*given)))
    except Exception:  # noqa: BLE001 - no samples where the graph cannot be run so
        return []
    return runs


def _shares_memory(tensor: torch.Tensor, others: Iterable[torch.Tensor]) -> bool:
    storage = tensor.untyped_storage().data_ptr()
    return any(o.untyped_storage().data_ptr() == storage for o in others)


def _promote_all(x: Any) -> Any:
    """:func:`_promote` on every value in a call's arguments. torch's named results are
    kept as they are (``x.max(dim=1)``, whose ``.values`` the next call reads: fx's
    ``map_aggregate`` would make a plain tuple of it); the run made them in float64."""
    if type(x).__module__ == "torch.return_types":
        return x
    if isinstance(x, (tuple, list)):
        items = [_promote_all(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return type(x)({k: _promote_all(v) for k, v in x.items()})
    if isinstance(x, slice):
        return slice(_promote_all(x.start), _promote_all(x.stop), _promote_all(x.step))
    return _promote(x)


def _promote(x: Any) -> Any:
    if isinstance(x, torch.dtype) and (x.is_floating_point or x.is_complex):
        return torch.complex128 if x.is_complex else torch.float64
    return _to64(x)


def float64_reference(original: nn.Module, effects: bool = False):
    """A function from inputs to the flat float64 outputs of ``original`` (None where the
    program cannot run in float64): a graph run by :class:`_Float64Interpreter` (explicit
    casts and dtype checks would stop its own forward halfway, and a computation written
    in float32 is widened too), any other module promoted to float64. With ``effects``
    every call starts from the copy's first state (a buffer the program changes in place,
    as the source's is before each of its runs).

    >>> graph = torch.fx.symbolic_trace(lambda x: (x.float() * 3).sum())
    >>> float64_reference(graph)((torch.ones(2, dtype=torch.float16),))[0].dtype
    torch.float64
    """
    wide = float64_copy(original)
    first = _State(wide.buffers()) if effects and isinstance(wide, nn.Module) else None

    def run(xs: tuple) -> list | None:
        wide_xs = [_to64(x) for x in xs]
        if first is not None:
            first.restore()
            # (an input _to64 kept, an integer counter, must not change the caller's)
            wide_xs = [w.clone() if w is x and isinstance(x, torch.Tensor) else w
                       for w, x in zip(wide_xs, xs)]
        xs = wide_xs
        try:
            with state_kept():
                if isinstance(wide, ExportedModule):
                    return _flat(_Float64Interpreter(wide.graph_module).run(
                        *wide.graph_inputs(tuple(xs))))
                if isinstance(wide, fx.GraphModule):
                    return _flat(_Float64Interpreter(wide).run(*xs))
                return _flat(wide(*xs))
        except Exception:  # noqa: BLE001 - a program that cannot run in float64
            return None

    return run


def reference_spread(graph: fx.GraphModule, xs: tuple, reference: list,
                     samples: int = 4) -> list:
    """Per output, how far float64 itself may be from the exact value: twice the largest
    distance of ``samples`` Monte Carlo runs of ``graph`` in float64 (each inexact op's
    result moved by up to 16 roundings at random) from the ``reference`` outputs (a few
    samples underestimate the spread: ``sin(x + eps) - sin(x)`` at x = 1.7e28 is 0 in
    float64 and anywhere in [-2, 2] in truth); None for an output it cannot tell.

    >>> g = fx.symbolic_trace(lambda x: torch.log(x + 1) - torch.log(x))
    >>> x = torch.tensor([1e20], dtype=torch.float64)
    >>> ref = [g(x)]                       # 0 in float64; the exact value is 1e-20
    >>> spread = reference_spread(g, (x,), ref)[0]
    >>> bool(spread[0] > 1e-20)
    True
    """
    wide = float64_copy(graph)
    xs = [_to64(x) for x in xs]
    writes = updates_inputs(graph.graph)
    spread: list = [None] * len(reference)
    for seed in range(samples):
        gen = torch.Generator().manual_seed(seed)
        # (each run from the same inputs and state: a graph that updates a buffer or an
        # input in place would otherwise run each sample on what the last one left)
        given = [x.clone() if writes and isinstance(x, torch.Tensor) else x for x in xs]
        try:
            with state_kept(), attributes_kept(wide):
                runs = _flat(_Float64Interpreter(wide, gen).run(*given))
        except Exception:  # noqa: BLE001 - no spread where the graph cannot run so
            return [None] * len(reference)
        for i, (run, ref) in enumerate(zip(runs, reference)):
            if not (isinstance(run, torch.Tensor) and isinstance(ref, torch.Tensor)
                    and run.is_floating_point() and run.shape == ref.shape):
                continue
            ref = ref.to(run.device)
            # where a run and the reference disagree on finiteness (exp(x) - 1 is 0 in
            # float64 at x = -3e-19 and not in a perturbed run), float64 cannot tell the
            # value at all: an infinite spread
            same = (run == ref) | (torch.isnan(run) & torch.isnan(ref))
            apart = ((run - ref).abs() * 2).nan_to_num_(nan=math.inf, posinf=math.inf)
            distance = torch.where(same, 0.0, apart)
            spread[i] = distance if spread[i] is None else torch.maximum(spread[i], distance)
    return spread


def float64_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its floating parameters and buffers in float64, each
    converted once (a deep copy followed by ``.to(float64)`` would copy a large model's
    weights twice); tied weights stay tied, the mode (train or eval) is kept, and
    ``module`` is left as it was: the reference that validation, and a benchmark judging
    code generated after validation, compare with.

    >>> wide = float64_copy(nn.Linear(2, 2))
    >>> wide.weight.dtype, wide.training
    (torch.float64, True)
    """
    memo: dict[int, Any] = {}
    if isinstance(module, ExportedModule):  # its graph and program hold no state to widen
        memo[id(module.graph_module)] = module.graph_module
        memo[id(module.program)] = module.program
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in memo and tensor.is_floating_point():
            wide = tensor.detach().to(torch.float64)
            memo[id(tensor)] = (nn.Parameter(wide, tensor.requires_grad)
                                if isinstance(tensor, nn.Parameter) else wide)
    return deep_copy(module, memo).to(torch.float64)


def validate_module(src: FxSource, new: fx.GraphModule, trials: int = 2,
                    max_numel: int = 1 << 22, reference: str = "auto",
                    defined_only: bool = False) -> Validation:
    """Check ``new`` against the source program of ``src`` (see the module docstring), with
    the source in float64 or in its working dtype as the ``reference``
    (:data:`REFERENCES`). ``defined_only``: the check of a formula rewritten for accuracy
    against a 150-digit reference (Herbie's search): only the elements where the reference
    is a number are judged (``log1p(1/x)`` for ``log(x + 1) - log(x)`` is a number at
    ``x < -1``, where the source is NaN), normwise and for finiteness, not elementwise;
    on inputs 8 times wider it must not overflow where the source does not (``x0 / s * 1e-7``
    for ``(x0 - x0 * 1.0000001) / s`` overflows 1e7 times sooner)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if reference not in REFERENCES:
        raise ValueError(f"reference={reference!r}: use one of "
                         f"{', '.join(map(repr, REFERENCES))}")
    # Inside torch.compile a fake mode is active; validation runs on real tensors.
    with unset_fake_temporarily(), _caller_state_kept(src, new) as state, generators_kept(
            src.graph_module, src.module, new) as generators:
        return _validate(src, new, trials, max_numel, reference, defined_only, state,
                         generators)


class _State:
    """The tensors a program with effects may change in place and their values when
    taken, to run each program of a validation from the same state and to compare what
    each leaves. A tensor whose elements share memory (an expanded constant) is left
    out: torch refuses every in-place write into it, ``copy_`` included; so is a fake
    one (torch.compile's example inputs: validation runs on real ones of its own)."""

    def __init__(self, tensors: Iterable[Any], values: list[torch.Tensor] | None = None):
        unique = {id(t): t for t in tensors if isinstance(t, torch.Tensor) and not is_fake(t)
                  and torch._debug_has_internal_overlap(t) != 1}
        self.tensors = list(unique.values())
        self.values = list(values or ())
        self.values += [t.detach().clone() for t in self.tensors[len(self.values):]]

    def changes(self) -> dict[int, torch.Tensor]:
        """Copies of the tensors whose values are no longer the state's, by position
        (most are not changed: comparing them costs less than copying them)."""
        return {i: t.detach().clone() for i, (t, v) in enumerate(zip(self.tensors, self.values))
                if not torch.equal(t, v)}

    def restore(self, changed: Iterable[int] | None = None) -> None:
        """Give the tensors at positions ``changed`` (all by default) the state's values."""
        with torch.no_grad():
            for i in range(len(self.tensors)) if changed is None else changed:
                self.tensors[i].copy_(self.values[i])

    def with_inputs(self, inputs: tuple) -> _State:
        """This state and the tensors of ``inputs`` at their values now."""
        return _State([*self.tensors, *inputs], self.values)


@contextmanager
def _caller_state_kept(src: FxSource, new: nn.Module) -> Iterator[_State | None]:
    """The caller's state (the example inputs and the buffers of the source and of the
    new program) where the source has effects, else None, given back as it was
    afterwards: validation runs each program several times, and one with effects may
    update an input or a buffer in place on every run (``x.add_(1)``, BatchNorm's
    running statistics in training, a counter)."""
    written = written_attributes(src.graph_module)
    if not src.effects and not written and not updates_inputs(src.graph_module.graph):
        yield None
        return
    tensors = [*written, *_written_state(src),
               *(x for x in src.example_inputs or () if isinstance(x, torch.Tensor))]
    for module in (src.module, src.graph_module, new):
        if isinstance(module, nn.Module):
            tensors.extend(module.buffers())
    state = _State(tensors)
    try:
        yield state
    finally:
        # (only what changed: a write bumps a tensor's version, and autograd refuses a
        # backward through a tensor saved before the write: JetMoE's router input)
        state.restore(state.changes())


def _written_state(src: FxSource) -> list[torch.Tensor]:
    """The parameters and buffers an exported source updates in place (its graph takes
    them as inputs: ``copy_`` into a parameter written under ``no_grad``)."""
    program = getattr(src.module, "program", None)
    if program is None:
        return []
    signature = program.graph_signature
    state = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    written = {n.args[0].name for n in src.graph_module.graph.nodes
               if updates_an_input(n) and isinstance(n.args[0], fx.Node)}
    return [attribute_at(src.module, state[name]) for name in sorted(written) if name in state]


def _effects_differ(state: _State, by_source: dict[int, torch.Tensor],
                    by_new: dict[int, torch.Tensor]) -> str | None:
    """Why the tensors of ``state`` hold other values after the new program than after
    the source, both run from it (``by_source`` and ``by_new``: :meth:`_State.changes`),
    or None."""
    for index in sorted(by_source.keys() | by_new.keys()):
        b, a = by_source.get(index, state.values[index]), by_new.get(index, state.values[index])
        if torch.equal(a, b):
            continue
        if a.shape != b.shape:  # (resize_)
            return f"an input or buffer changed in place ({index}) has another shape"
        if b.is_floating_point() or b.is_complex():
            if not torch.equal(torch.isnan(a), torch.isnan(b)):
                return f"an input or buffer changed in place ({index}) is NaN elsewhere"
            keep = ~torch.isnan(b)
            if relative_errors(a[keep], b[keep])[1] <= working_tolerance(b.dtype):
                continue
        return f"an input or buffer changed in place ({index}) holds other values"
    return None


def program_numel(original: Any, inputs: tuple) -> int:
    """Elements of a program's tensor inputs and parameters: what running it, or a copy
    of it, costs (the limits of validation and of probing other sizes).

    >>> program_numel(nn.Linear(3, 2), (torch.randn(4, 3),))
    20
    """
    numel = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    if isinstance(original, nn.Module):
        numel += sum(p.numel() for p in original.parameters())
    return numel


def _validate(src: FxSource, new: fx.GraphModule, trials: int, max_numel: int,
              mode: str, defined_only: bool = False, state: _State | None = None,
              generators: Sequence[torch.Generator] = ()) -> Validation:
    """(``state``: where the source has effects, the caller's state, from which each
    program runs on each input set; ``generators``: those the source draws from besides
    torch's own, seeded like it for each run.)"""
    original = src.graph_module if src.module is None else src.module
    states = generator_state_inputs(src.graph_module)  # (drawn never: replayed as given)
    inputs = stand_ins(src.example_inputs, src.graph_module)
    invented = all(x is not y for x, y in zip(inputs, src.example_inputs)
                   if isinstance(y, torch.Tensor))
    normwise_slack = NORMWISE_SLACK["invented" if invented else "given"]
    input_sets = [inputs]
    stressed = [False]
    numel = program_numel(original, inputs)
    if mode == "auto":
        mode = "working" if numel > FLOAT64_LIMIT else "float64"
    working = mode == "working"
    # Extra random input sets where cheap: each one runs the model three times.
    if numel <= max_numel:
        gen = torch.Generator().manual_seed(0)
        for scale in [1.0] * trials + [STRESS_SCALE]:
            stressed.append(scale != 1.0)
            input_sets.append(tuple(
                strided_like(_in_range(in_domain(random_like(x, gen, scale),
                                                  src.domains.get(name)),
                                       src.ranges.get(name), gen), x)
                if isinstance(x, torch.Tensor) and i not in states else x
                for i, (name, x) in enumerate(zip(src.inputs, inputs))))
    random_ops = src.random
    effects = state is not None
    reference = None if random_ops or working else float64_reference(original, effects)
    worst_before = worst_after = 0.0
    kind = ("same-seed original" if random_ops else "working-dtype original" if working
            else "float64")
    checked = 0
    strided: set[int] = set()
    # where working mode needs a second opinion: the source in float64, made once, and its
    # outputs per input set
    float64_source = None
    escalated: dict[int, list | None] = {}
    # Elements an allocation of whatever the memory held (``empty_like``) keeps unwritten
    # are NaN in every run (an aot graph of normflows' spline leaves the ones outside its
    # mask to the caller); otherwise each run's garbage would be judged.
    blank = leaves_memory_unwritten(src.graph_module)
    # (not with effects: both programs would change the same tensors at once; nor with
    # blank allocations: a dispatch mode is the thread's own)
    beside = (ThreadPoolExecutor(2, "egraph-validate") if not random_ops and not effects
              and not blank and _side_by_side(original, inputs, numel) else nullcontext())
    with torch.no_grad(), beside as pool, _Filled() if blank else nullcontext():
        for given, stress in zip(input_sets, stressed):
            ahead, run_state = None, state.with_inputs(given) if effects else None
            drawn: list | None = [] if random_ops else None
            if pool is None:
                xs, out_before = _run_source(original, given, generators, drawn)
            else:
                ahead = pool.submit(_run_new, new, given)
                xs, out_before = pool.submit(_run_source, original, given).result()
            if out_before is None:
                continue  # generated integers the source cannot take (an index too large)
            checked += 1
            if run_state is not None:  # the new program runs from the source's state
                left_by_source = run_state.changes()
                run_state.restore(left_by_source)
            try:
                out_after = (ahead.result() if ahead is not None and xs is given
                             else _run_new(new, xs, generators))
            except Exception as error:  # noqa: BLE001 - an ill-typed rewrite: refuse it
                return Validation(False, worst_before, float("inf"), len(input_sets),
                                  "the optimised program raises where the original runs "
                                  f"({type(error).__name__}: {str(error).splitlines()[0]})",
                                  reference=kind)
            if run_state is not None:
                left_by_new = run_state.changes()
                differ = _effects_differ(run_state, left_by_source, left_by_new)
                if differ:
                    return Validation(False, worst_before, float("inf"), len(input_sets),
                                      differ, reference=kind)
                run_state.restore(left_by_new)  # (and the reference runs from it too)
            if len(out_before) != len(out_after):
                return Validation(False, worst_before, float("inf"), len(input_sets),
                                  "the output structure changed", reference=kind)
            joined = sorted(sharing_pairs(out_after) - sharing_pairs(out_before))
            if joined:
                return Validation(False, worst_before, float("inf"), len(input_sets),
                                  f"outputs {joined[0][0]} and {joined[0][1]} share one "
                                  "storage where the original's are tensors of their own",
                                  reference=kind)
            out_ref = reference(xs) if reference is not None else out_before
            if out_ref is None:
                out_ref, kind = out_before, "original (it cannot run in float64)"
            spread = samples = None
            stored = {x.untyped_storage().data_ptr() for x in xs if isinstance(x, torch.Tensor)}
            for index, (b, a, r) in enumerate(zip(out_before, out_after, out_ref)):
                changed = _kind_changed(a, b) or _storage_changed(a, b, stored)
                if changed:
                    return Validation(False, worst_before, float("inf"), len(input_sets),
                                      f"output {index}: {changed}", reference=kind)
                if not isinstance(b, torch.Tensor):
                    continue
                if b.is_contiguous() and not a.is_contiguous():
                    strided.add(index)
                if stress:
                    # wide inputs: both may lose accuracy; only a new overflow counts
                    if b.is_floating_point() and _overflows_sooner(a, b, r):
                        return Validation(False, worst_before, float("inf"),
                                          len(input_sets), "a value overflows where the "
                                          f"original's does not (inputs {STRESS_SCALE:g} times "
                                          "wider than the examples)", reference=kind)
                    continue
                if working or random_ops:
                    # no float64 reference: both are rounded in the working dtype, and a
                    # reassociated sum differs from the source's at its tiny elements
                    e_after, n_after = relative_errors(a, b)
                    if n_after <= working_tolerance(b.dtype):
                        worst_after = max(worst_after, n_after)
                        continue
                    # The working-dtype source may be the one that is off (a float16 sum
                    # that overflows, which a fused softmax avoids; a deep network with
                    # batch statistics of few elements, where one rounding grows to the
                    # output's scale): before refusing, judge this output against the
                    # source in float64 as below, which draws the random numbers the
                    # working-dtype source drew.
                    if b.is_floating_point() and id(xs) not in escalated:
                        if float64_source is None:
                            float64_source = float64_reference(original, effects)
                        replay = _Draws([] if drawn is None else drawn, replay=True)
                        with replay:
                            escalated[id(xs)] = float64_source(xs)
                        if replay.at != len(replay.drawn):  # (it drew less: no reference)
                            escalated[id(xs)] = None
                    exact = escalated.get(id(xs)) if b.is_floating_point() else None
                    if exact is None:
                        return Validation(False, 0.0, max(worst_after, n_after),
                                          len(input_sets), f"normwise relative error "
                                          f"{n_after:.3g} from the original in {b.dtype} "
                                          f"(tolerance {working_tolerance(b.dtype):.3g})",
                                          reference=kind)
                    r, kind = exact[index], "float64 (the working-dtype original disagreed)"
                if defined_only and b.is_floating_point():
                    undefined = torch.isnan(r).to(a.device)
                    a = a.masked_fill(undefined, math.nan)
                # where the source overflowed or cancelled to NaN though the reference is
                # finite, it is not judged, and neither is the new program (inf becoming NaN
                # there is checked below); elsewhere the new program must do as well
                failed = (torch.isfinite(r.to(b.device)) & ~torch.isfinite(b)
                          if b.is_floating_point() else None)
                (e_before, n_before), (e_after, n_after) = (
                    relative_errors(b, r, ignore=failed), relative_errors(a, r, ignore=failed))
                if b.is_floating_point() and _overflow_changed(a, b, r):
                    return Validation(False, worst_before, float("inf"), len(input_sets),
                                      "a value the original overflows to inf becomes NaN or "
                                      "the other infinity", reference=kind)
                tol = _tolerance(b.dtype)
                errors = (e_before, n_before, e_after, n_after)
                if _exceeds(*errors, normwise_slack, tol) and reference is not None and (
                        b.is_floating_point()):
                    # Before refusing: is the difference within what float64 resolves?
                    if spread is None:
                        spread = reference_spread(src.graph_module, xs, out_ref)
                    unresolved = spread[index]
                    if unresolved is not None:
                        e_before, n_before = relative_errors(b, r, unresolved, failed)
                        e_after, n_after = relative_errors(a, r, unresolved, failed)
                    if _exceeds(e_before, n_before, e_after, n_after, normwise_slack, tol):
                        # ... or within what the source's own rounding could give?
                        if samples is None:
                            samples = rounding_samples(src.graph_module, xs)
                        for run in samples:
                            e_before, n_before = (max(pair) for pair in zip(
                                (e_before, n_before),
                                _sample_errors(run[index] if index < len(run) else None,
                                               b, r, unresolved, failed)))
                worst_before = max(worst_before, e_before)
                worst_after = max(worst_after, e_after)
                if defined_only:
                    # elementwise accuracy was judged by the search, against 150 digits;
                    # float64 cannot judge it where the formula cancels (tan(x + eps) -
                    # tan(x) near a pole): only the output's scale and finiteness here
                    e_after = e_before
                errors = (e_before, n_before, e_after, n_after)
                # an output the source cancels to rounding noise on these inputs (no
                # correct digit: a layer norm's mean of centred values, saved for the
                # backward) is judged as on invented inputs
                slack = NORMWISE_SLACK["invented"] if n_before > 1 else normwise_slack
                if _exceeds(*errors, slack, tol):
                    return Validation(False, worst_before, worst_after, len(input_sets),
                                      _less_accurate(errors, "the original"), reference=kind)
    if not checked:
        return Validation(False, 0.0, float("inf"), 0,
                          "the source program raises on every generated input set; pass real "
                          "example inputs", reference=kind)
    return Validation(True, worst_before, worst_after, checked, reference=kind,
                      strided=tuple(sorted(strided)))


def _sample_errors(run: Any, source: torch.Tensor, ref: torch.Tensor,
                   unresolved: torch.Tensor | None, ignore: torch.Tensor | None
                   ) -> tuple[float, float]:
    """The errors of a :func:`rounding_samples` run's output ``run`` where it is an
    output like the ``source``'s, else none."""
    if not (isinstance(run, torch.Tensor) and run.shape == source.shape
            and run.dtype == source.dtype):
        return 0.0, 0.0
    return relative_errors(run, ref, unresolved, ignore)


def _exceeds(e_before: float, n_before: float, e_after: float, n_after: float,
             normwise_slack: float, tol: float) -> bool:
    """Whether the new program's errors exceed what the source's allow."""
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
    outs = [_flat(x) for x in (got, source, reference)]
    if not len(outs[0]) == len(outs[1]) == len(outs[2]):
        return "the output structure differs"
    for index, (a, b, r) in enumerate(zip(*outs)):
        changed = _kind_changed(a, b)
        if changed:
            return f"output {index}: {changed}"
        if not isinstance(b, torch.Tensor):
            continue
        errors = (*relative_errors(b, r), *relative_errors(a, r))
        if _exceeds(*errors, NORMWISE_SLACK["given"], _tolerance(b.dtype)):
            return f"output {index}: {_less_accurate(errors, 'the source')}"
    return None


def _kind_changed(new: Any, source: Any) -> str | None:
    """Why the output ``new`` cannot stand for the source's output ``source`` whatever its
    values (a non-tensor that differs, another shape or dtype); None where it can."""
    if not isinstance(source, torch.Tensor):
        return None if new == source else f"its value changed ({source!r} -> {new!r})"
    if not isinstance(new, torch.Tensor) or new.shape != source.shape or (
            new.dtype != source.dtype):
        return "its shape or dtype changed"
    return None


@sees_rng_replays
class _Filled(TorchDispatchMode):
    """Allocations of whatever the memory held (``empty_like``) filled with NaN (zero
    for integers and booleans), so that runs agree on the elements a program leaves
    unwritten."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in UNINITIALISED and isinstance(out, torch.Tensor):
            out.fill_(math.nan if out.is_floating_point() or out.is_complex() else 0)
        return out


@sees_rng_replays
class _Draws(TorchDispatchMode):
    """The results of the random ops run under it, in order, recorded into ``drawn``; or
    with ``replay``, the ones recorded there handed back in turn, in the dtype the run
    asks for. A float64 run of a program that draws random numbers then sees its
    working-dtype run's draws, where under one seed float64 draws others. A replay that
    does not fit (another op, another shape) raises, which leaves that run without a
    reference.

    >>> drawn = []
    >>> with _Draws(drawn):
    ...     first = torch.rand(3)
    >>> with _Draws(drawn, replay=True):
    ...     again = torch.rand(3, dtype=torch.float64)
    >>> torch.equal(again, first.double())
    True
    """

    def __init__(self, drawn: list, replay: bool = False):
        super().__init__()
        self.drawn, self.replaying, self.at = drawn, replay, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return out
        if not self.replaying:
            self.drawn.append((func, [t.clone() for t in _tensors(out)]))
            return out
        if self.at == len(self.drawn) or self.drawn[self.at][0] is not func:
            raise RuntimeError(f"the replayed run draws otherwise ({func})")
        recorded = self.drawn[self.at][1]
        self.at += 1
        if func is torch.ops.aten.native_dropout.default and args[2:3] != (False,):
            # (its output is the input's values through the mask: kept in this dtype)
            out[1].copy_(recorded[1])
            out[0].copy_(args[0] * out[1] / (1 - args[1]))
            return out
        for made, was in zip(_tensors(out), recorded, strict=True):
            if made.shape != was.shape:
                raise RuntimeError(f"the replayed run draws another shape ({func})")
            made.copy_(was)
        return out


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in _flat(out) if isinstance(t, torch.Tensor)]


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


def _storage_changed(new: Any, source: Any, stored: set[int]) -> str | None:
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


def _less_accurate(errors: tuple[float, float, float, float], source: str) -> str:
    """The message for a program whose (elementwise, normwise) errors, after the
    source's, exceed what the source's allow."""
    e_before, n_before, e_after, n_after = errors
    return (f"relative error {e_after:.3g} elementwise, {n_after:.3g} normwise vs "
            f"{e_before:.3g} and {n_before:.3g} for {source}")


def _overflow_changed(new: torch.Tensor, source: torch.Tensor, ref: torch.Tensor) -> bool:
    """True where the source's result is non-finite though the reference is finite (an
    overflow in the working dtype) and the new result is another non-finite value: inf
    becoming NaN (``a*b - a*c`` for ``a*(b - c)`` when both products overflow) changes
    what later code sees (isinf checks, clamps). A finite result there is an improvement,
    and so is the reference's own value in the working dtype, the infinity of its sign
    where it is past the dtype's range (a softmax's NaN of ``inf / inf`` becoming the inf
    the exact result rounds to)."""
    ref = ref.to(new.device)
    changed = torch.isfinite(ref) & ~torch.isfinite(source) & ~torch.isfinite(new) & ~(
        (new == source) | (torch.isnan(new) & torch.isnan(source)) | (new == ref.to(new.dtype)))
    return bool(changed.any())


def _overflows_sooner(new: torch.Tensor, source: torch.Tensor, ref: torch.Tensor) -> bool:
    """True where the new result is non-finite but the reference is finite and the
    source's is within 100% of it (next to a pole, ``(x - sin x) / (x - tan x)`` at
    x = 4.4934, the source's finite value is noise and the rewrite's inf no worse)."""
    ref = ref.to(new.device).double()
    meaningful = torch.isfinite(ref) & ((source.double() - ref).abs() <= ref.abs())
    return bool((meaningful & ~torch.isfinite(new)).any())


SIDE_BY_SIDE_NUMEL = 1 << 20
"""Programs with at least this many elements of inputs and parameters run the source and
the new program side by side, in two worker threads, where the CPU has cores to spare
(twice torch's intra-op threads): each pass is then long enough that the two threads
seldom wait for the GIL (torch releases it inside every op), and the pair takes the time of
about one pass (the 12-layer GPT-2-sized decoder on one thread each: 1.25-1.5 s -> 0.7-1.0
s). Both run in workers: the thread that compiles under torch.compile dispatches ops
through Python (aot_autograd's Python dispatcher), holding the GIL, so a pass there and
one in a worker took as long as the two in turn."""


def _side_by_side(original: nn.Module, inputs: tuple, numel: int) -> bool:
    """Whether validation runs the source and the new program side by side
    (:data:`SIDE_BY_SIDE_NUMEL`): on the CPU, with two idle cores per intra-op thread
    count. Where torch already uses every core, two passes at once only contend."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if isinstance(original, nn.Module):
        tensors += list(original.parameters()) + list(original.buffers())
    return (numel >= SIDE_BY_SIDE_NUMEL and 2 * torch.get_num_threads() <= _cores()
            and all(t.device.type == "cpu" for t in tensors))


def _cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _silent(program: Any) -> Any:
    """``program`` to be called where it may raise on inputs it cannot take: a graph
    module's own ``forward`` (its ``__call__`` prints a traceback of the generated code to
    stderr before it raises, noise for an exception that is caught), any other as it is.

    >>> g = fx.symbolic_trace(lambda x: x + 1)
    >>> _silent(g)(torch.ones(1))
    tensor([2.])
    """
    if isinstance(program, fx.GraphModule) and not (
            program._forward_hooks or program._forward_pre_hooks):
        return program.forward
    return program


def _seed_torch() -> None:
    """``torch.manual_seed(0)`` on the devices a validation can run on: the CPU's
    generator and, once CUDA is in use, CUDA's. ``torch.manual_seed`` itself queues a
    seeding for each accelerator not yet initialised, with a formatted stack each (3 ms a
    call on a machine without one: a fifth of a small program's pipeline, which seeds
    every run of its validation)."""
    torch.default_generator.manual_seed(0)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(0)


def _seeded(generators: Sequence[torch.Generator]) -> None:
    """Seed torch's generator and ``generators`` as every run of a validation starts."""
    _seed_torch()
    for generator in generators:
        generator.manual_seed(0)


def _run_new(new: fx.GraphModule, xs: tuple,
             generators: Sequence[torch.Generator] = ()) -> list:
    """The new program's flat outputs on ``xs``, under the source's seed; grad mode is
    per thread, so it is turned off here for a run in a worker thread too."""
    _seeded(generators)
    with torch.no_grad(), state_kept():
        return _flat(_silent(new)(*xs))


def _run_source(original: nn.Module, xs: tuple, generators: Sequence[torch.Generator] = (),
                drawn: list | None = None) -> tuple[tuple, list | None]:
    """The source's flat outputs on ``xs`` (without grad, in any thread); where it raises
    on them, on ``xs`` with its integer tensors zeroed (index 0 is valid in any dim); None
    where it raises on both. ``drawn``: filled with the random ops' results
    (:class:`_Draws`)."""
    for attempt in (xs, tuple(torch.zeros_like(x) if isinstance(x, torch.Tensor) and not (
            x.is_floating_point() or x.dtype == torch.bool) else x for x in xs)):
        _seeded(generators)
        if drawn is not None:
            drawn.clear()
        try:
            with torch.no_grad(), state_kept(), (
                    nullcontext() if drawn is None else _Draws(drawn)):
                return attempt, _flat(_silent(original)(*attempt))
        except Exception:  # noqa: BLE001 - values the source cannot take: try the next
            continue
    return xs, None


def validate_autograd(source: fx.GraphModule, new: nn.Module, inputs: tuple,
                      reference: str = "auto") -> str | None:
    """Why ``new`` cannot be run under autograd in place of ``source``, or None where it
    can: ``new`` is then differentiated by autograd itself, op by op, rather than through
    a backward graph of its own. On copies of ``inputs`` under one seed, the source must
    change none of the tensors it is given (batch norm's running statistics in training:
    left to aot_autograd's functionalisation), and for one random cotangent per floating
    output, the gradient of every input that requires grad must be as close to the
    source's gradient in float64 as the source's own is: normwise, twice its error plus
    :func:`working_tolerance` (a gradient that is rounding noise, as a key bias's under
    softmax is, is noise in both), and elementwise, within :data:`ELEMENTWISE_SLACK` times
    the source's worst element, or what the source's own rounding could give
    (:func:`_gradient_samples`); on the inputs given and on inputs
    :data:`STRESS_SCALE` times wider (a fused softmax's backward loses the small
    gradients of a saturated row that the written-out one keeps). With
    ``reference="working"`` (or ``"auto"`` on a large program): on the inputs given,
    within :func:`working_tolerance` of the source's. A ``detach`` lost in a rewrite shows
    here. The caller's RNG state is kept.

    >>> gm = fx.symbolic_trace(lambda x: (x * x).sum())
    >>> x = torch.randn(3, requires_grad=True)
    >>> validate_autograd(gm, fx.symbolic_trace(lambda x: x.pow(2).sum()), (x,)) is None
    True
    >>> validate_autograd(gm, fx.symbolic_trace(lambda x: (x * x.detach()).sum()), (x,))[:65]
    'the gradient of input 0 differs: normwise relative error 0.5 from'
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference={reference!r}: use one of "
                         f"{', '.join(map(repr, REFERENCES))}")
    leaves = [i for i, x in enumerate(inputs)
              if isinstance(x, torch.Tensor) and x.requires_grad]
    wide = reference == "float64" or (
        reference == "auto" and program_numel(source, inputs) <= FLOAT64_LIMIT)
    float64_run = _Float64Interpreter(float64_copy(source)).run if wide else None
    reason = _gradients_differ(source, new, inputs, leaves, float64_run, "given")
    if reason is None and wide:
        # (where a softmax saturates its backward cancels: seen on wider inputs)
        gen = torch.Generator().manual_seed(0)
        wider = tuple(random_like(x, gen, STRESS_SCALE).requires_grad_(x.requires_grad)
                      if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs)
        reason = _gradients_differ(source, new, wider, leaves, float64_run, "invented")
        if reason is not None:
            reason += f" (on inputs {STRESS_SCALE:g} times wider than the examples)"
    return reason


def _gradients_differ(source: fx.GraphModule, new: nn.Module, inputs: tuple,
                      leaves: list[int], float64_run: Callable | None,
                      inputs_are: str) -> str | None:
    """:func:`validate_autograd` on one input set (``float64_run``: the source in
    float64, or None to judge against the source in the working dtype; ``inputs_are``:
    the :data:`NORMWISE_SLACK` the set is judged with, ``"given"`` or ``"invented"``; a
    gradient the source gets no digit of is judged as on invented inputs)."""
    wide = float64_run is not None
    runs = [("the source", source, inputs), ("the new program", new, inputs)]
    if wide:
        runs.append(("the source in float64", float64_run, [_to64(x) for x in inputs]))
    grads: list = []
    for name, program, given in runs:
        try:
            found = _gradients(program, given, leaves, grads[0][1] if grads else None)
        except Exception as error:  # noqa: BLE001 - a backward that cannot run
            found = (f"{name} raises under autograd "
                     f"({type(error).__name__}: {str(error).splitlines()[0]})")
        if isinstance(found, str) and program is not source and program is not new:
            wide = False  # no float64 reference: judged in the working dtype
            break
        if found == "none":
            return None if program is source else f"{name}'s outputs carry no gradient"
        if isinstance(found, str):
            return found if found.startswith(name) else f"{name}: {found}"
        grads.append(found)
    samples: list | None = None
    for k, (i, *found) in enumerate(zip(leaves, *(g for g, _ in grads))):
        found = [torch.zeros_like(inputs[i]) if g is None else g for g in found]
        expected, got = found[0], found[1]
        tolerance = working_tolerance(expected.dtype)
        if wide:
            e_before, before = relative_errors(expected, found[2])
            e_after, after = relative_errors(got, found[2])
            slack = NORMWISE_SLACK["invented" if before > 1 else inputs_are]
            if not after <= slack * before + tolerance:
                return (f"the gradient of input {i} differs: normwise relative error "
                        f"{after:.3g} from float64 (the source: {before:.3g})")
            rounding = _tolerance(expected.dtype)
            if e_after > ELEMENTWISE_SLACK * e_before + rounding:
                # ... or within what the source's own rounding could give?
                if samples is None:
                    samples = _gradient_samples(source, inputs, leaves, grads[0][1])
                for run in samples:
                    if k < len(run) and run[k].shape == found[2].shape:
                        e_before = max(e_before, relative_errors(run[k], found[2])[0])
                if e_after > ELEMENTWISE_SLACK * e_before + rounding:
                    return (f"the gradient of input {i} differs: elementwise relative error "
                            f"{e_after:.3g} from float64 (the source: {e_before:.3g}, at "
                            "most within its rounding)")
        else:
            _, after = relative_errors(got, expected)
            if not after <= tolerance:
                return (f"the gradient of input {i} differs: normwise relative error "
                        f"{after:.3g} from the source's")
    return None


def _gradients_of(program, leaves: list[int], cotangents: list) -> Callable:
    """The function from inputs to the gradients of the ``leaves`` (zeros for one that
    gets none) for these ``cotangents`` of ``program``'s differentiable outputs."""
    def step(*xs):
        outs = [o for o in _flat(program(*xs)) if isinstance(o, torch.Tensor)
                and o.is_floating_point() and o.requires_grad]
        wrt = [xs[i] for i in leaves]
        grads = torch.autograd.grad(outs, wrt, [c.to(o.dtype) for c, o in zip(cotangents, outs)],
                                    allow_unused=True)
        return [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
    return step


def _gradient_samples(source: fx.GraphModule, inputs: tuple, leaves: list[int],
                      cotangents: list, samples: int = 4) -> list[list]:
    """The gradients of the ``leaves`` in ``samples`` runs of the source's forward and
    backward traced as one graph, each inexact op's result moved by up to one rounding
    (:func:`rounding_samples`): gradients the source could as well have given (a
    softmax's backward cancels where the softmax saturates, and whether the source's
    rounding happens to fall right there is luck). [] where it cannot be traced."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    with unset_fake_temporarily(), torch.random.fork_rng(devices=[]), torch.enable_grad(), (
            state_kept()):
        xs = [x.detach().clone().requires_grad_(x.requires_grad)
              if isinstance(x, torch.Tensor) else x for x in inputs]
        try:
            graph = make_fx(_gradients_of(source, leaves, cotangents))(*xs)
        except Exception:  # noqa: BLE001 - no samples: the source's own run judges
            return []
        return rounding_samples(graph, tuple(x.detach() if isinstance(x, torch.Tensor)
                                             else x for x in xs), samples)


def _gradients(program, given: tuple, leaves: list[int], cotangents: list | None):
    """``(gradients of the leaves, cotangents)`` of one run of ``program`` on copies of
    ``given`` under seed 0 (``cotangents``: one random tensor per differentiable output,
    drawn here when None); ``"none"`` when nothing is differentiable, or why the run does
    not count (an input changed in place). Real tensors, even inside torch.compile."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.random.fork_rng(devices=[]), torch.enable_grad(), (
            state_kept()):
        xs = [x.detach().clone().requires_grad_(x.requires_grad)
              if isinstance(x, torch.Tensor) else x for x in given]
        _seed_torch()
        versions = [x._version if isinstance(x, torch.Tensor) else None for x in xs]
        outs = _flat(program(*xs))
        changed = [i for i, (x, v) in enumerate(zip(xs, versions))
                   if v is not None and x._version != v]
        if changed:
            return f"it changes its input {changed[0]} in place"
        differentiable = [o for o in outs if isinstance(o, torch.Tensor)
                          and o.is_floating_point() and o.requires_grad]
        if not differentiable or not leaves:
            return "none"
        if cotangents is None:
            gen = torch.Generator(device=differentiable[0].device).manual_seed(0)
            cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype,
                                      device=o.device) for o in differentiable]
        if len(differentiable) != len(cotangents):
            return "the differentiable outputs changed"
        grads = torch.autograd.grad(differentiable, [xs[i] for i in leaves],
                                    [c.to(o.dtype) for c, o in zip(cotangents, differentiable)],
                                    allow_unused=True)
    return grads, cotangents
