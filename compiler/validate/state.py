"""The caller's state where the source has effects: the inputs and buffers a program may
change in place, taken before a validation, each program run from it, what each leaves
compared (:func:`effects_differ`), and given back as it was afterwards."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from compiler.validate.inputs import is_fake
from compiler.validate.judging import relative_errors, working_tolerance
from frontends.fx.effects import updates_an_input, updates_inputs
from frontends.fx.exported import attribute_at
from frontends.fx.kept import written_attributes
from frontends.fx.source import FxSource

__all__ = ["State", "caller_state_kept", "effects_differ"]


class State:
    """The tensors a program with effects may change in place and their values when
    taken, to run each program of a validation from the same state and to compare what
    each leaves. A tensor whose elements share memory (an expanded constant) is left
    out: torch refuses every in-place write into it, ``copy_`` included; so is a fake
    one (torch.compile's example inputs: validation runs on real ones of its own).

    >>> counter = torch.zeros(2)
    >>> state = State([counter])
    >>> _ = counter.add_(1)
    >>> list(state.changes())
    [0]
    >>> state.restore(); counter
    tensor([0., 0.])
    """

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

    def with_inputs(self, inputs: tuple) -> State:
        """This state and the tensors of ``inputs`` at their values now."""
        return State([*self.tensors, *inputs], self.values)


@contextmanager
def caller_state_kept(src: FxSource, new: nn.Module) -> Iterator[State | None]:
    """The caller's state (the example inputs and the buffers of the source and of the
    new program) where the source has effects, else None, given back as it was
    afterwards: validation runs each program several times, and one with effects may
    update an input or a buffer in place on every run (``x.add_(1)``, BatchNorm's
    running statistics in training, a counter).

    >>> from egraph import EGraph
    >>> src = EGraph.from_fx(fx.symbolic_trace(lambda x: x + 1), (torch.zeros(2),)).fx
    >>> with caller_state_kept(src, src.graph_module) as state:
    ...     state is None                        # no effects: nothing to keep
    True
    """
    written = written_attributes(src.graph_module)
    if not src.effects and not written and not updates_inputs(src.graph_module.graph):
        yield None
        return
    tensors = [*written, *_written_state(src),
               *(x for x in src.example_inputs or () if isinstance(x, torch.Tensor))]
    for module in (src.module, src.graph_module, new):
        if isinstance(module, nn.Module):
            tensors.extend(module.buffers())
    state = State(tensors)
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


def effects_differ(state: State, by_source: dict[int, torch.Tensor],
                   by_new: dict[int, torch.Tensor]) -> str | None:
    """Why the tensors of ``state`` hold other values after the new program than after
    the source, both run from it (``by_source`` and ``by_new``: :meth:`State.changes`),
    or None.

    >>> state = State([torch.zeros(2)])
    >>> effects_differ(state, {0: torch.ones(2)}, {})
    'an input or buffer changed in place (0) holds other values'
    """
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
