"""What a validation runs on: real stand-ins for inputs without values (torch.compile's
fake example inputs), and random input sets like the examples, in each input's declared
domain and range, the last of them :data:`STRESS_SCALE` times wider."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from compiler.ordinals import within
from frontends.fx.effects import generator_state, generator_state_inputs
from frontends.fx.source import FxSource

__all__ = ["STRESS_SCALE", "in_domain", "input_sets", "is_fake", "meta_state",
           "program_numel", "random_like", "stand_ins", "strided_like"]


def is_fake(x: Any) -> bool:
    """Whether ``x`` is a tensor without values: a fake one (torch.compile's example
    inputs) or one on the meta device."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, torch.Tensor) and (isinstance(x, FakeTensor) or x.device.type == "meta")


def meta_state(src: FxSource) -> str | None:
    """The name of a parameter, buffer or constant of the source that lives on the meta
    device (a model built under ``torch.device("meta")``), or None. Inputs can be stood in
    for; weights cannot: with one on meta, there is nothing to run the programs on.

    >>> from egraph import EGraph
    >>> with torch.device("meta"):
    ...     model = torch.nn.Linear(4, 2)
    >>> meta_state(EGraph.from_fx(model, (torch.randn(3, 4, device="meta"),)).fx)
    'weight'
    """
    modules = [m for m in (src.module, src.graph_module) if m is not None]
    named = [item for m in modules for item in (*m.named_parameters(), *m.named_buffers())]
    named += list(src.constants.items())
    return next((name for name, x in named
                 if isinstance(x, torch.Tensor) and x.device.type == "meta"), None)


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


def input_sets(src: FxSource, inputs: tuple, trials: int, numel: int,
               max_numel: int) -> list[tuple[tuple, bool]]:
    """The input sets a validation runs on, each with whether it is the stressed one:
    ``inputs`` (the examples, or their stand-ins), then, where the program is small enough
    to run several times (``numel`` elements, up to ``max_numel``: each set runs it three
    times), ``trials`` random sets like them and one :data:`STRESS_SCALE` times wider.
    Random values lie in the input's declared domain and range and keep the example's
    layout; a generator's state is never drawn (it is replayed as given).

    >>> from egraph import EGraph
    >>> src = EGraph.from_fx(fx.symbolic_trace(lambda x: x + 1), (torch.randn(3),)).fx
    >>> [stressed for _, stressed in input_sets(src, src.example_inputs, 2, 3, 1 << 22)]
    [False, False, False, True]
    """
    sets = [(inputs, False)]
    if numel > max_numel:
        return sets
    states = generator_state_inputs(src.graph_module)
    gen = torch.Generator().manual_seed(0)
    for scale in [1.0] * trials + [STRESS_SCALE]:
        sets.append((tuple(
            strided_like(_in_range(in_domain(random_like(x, gen, scale),
                                             src.domains.get(name)),
                                   src.ranges.get(name), gen), x)
            if isinstance(x, torch.Tensor) and i not in states else x
            for i, (name, x) in enumerate(zip(src.inputs, inputs))), scale != 1.0))
    return sets
