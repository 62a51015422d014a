"""Whether a new program can run under autograd in place of its source: the gradients of
the inputs that require grad, for one random cotangent per output, judged against the
source's in float64 as validation judges outputs (:func:`validate_autograd`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx
import torch.nn as nn

from compiler.validate.inputs import STRESS_SCALE, program_numel, random_like
from compiler.validate.judging import (
    ELEMENTWISE_SLACK,
    NORMWISE_SLACK,
    relative_errors,
    rounding_tolerance,
    working_tolerance,
)
from compiler.validate.reference import (
    Float64Interpreter,
    float64_copy,
    reference_mode,
    rounding_samples,
    to_float64,
)
from compiler.validate.runs import flat_outputs, seed_torch
from frontends.fx.kept import state_kept

__all__ = ["validate_autograd"]


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
    wide = reference_mode(reference, program_numel(source, inputs)) == "float64"
    leaves = [i for i, x in enumerate(inputs)
              if isinstance(x, torch.Tensor) and x.requires_grad]
    float64_run = Float64Interpreter(float64_copy(source)).run if wide else None
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
        runs.append(("the source in float64", float64_run, [to_float64(x) for x in inputs]))
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
            rounding = rounding_tolerance(expected.dtype)
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
        outs = [o for o in flat_outputs(program(*xs)) if isinstance(o, torch.Tensor)
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
        seed_torch()
        versions = [x._version if isinstance(x, torch.Tensor) else None for x in xs]
        outs = flat_outputs(program(*xs))
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
