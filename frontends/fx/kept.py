"""Kept state: a run of a graph at compile time (recording values, validation) leaves the
caller's state as it was, however it ends: the global state its calls change
(:func:`state_kept`), the tensors it writes into (:func:`attributes_kept`) and the random
generators it draws from (:func:`generators_kept`).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.effects import is_in_place
from frontends.fx.recorded import recorded_value, storage_key

__all__ = ["attributes_kept", "generators_kept", "generators_of", "state_kept",
           "written_attributes"]


@contextmanager
def state_kept() -> Iterator[None]:
    """Leave the global state that a graph's calls change as it was, however a run of the
    graph ends: dynamo's graphs hold a vmap's entry and exit (``_vmap_increment_nesting``,
    transformers' masks) and grad mode's changes as calls, and a run stopped between the
    two (an op that raises on the values given) would leave the vmap level on for every
    later tensor op of the process.

    >>> with state_kept():
    ...     level = torch._C._functorch._vmap_increment_nesting(2, "error")
    >>> torch._C._functorch.maybe_current_level() is None
    True
    """
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

    functorch = torch._C._functorch
    level, grad = functorch.maybe_current_level(), torch.is_grad_enabled()
    try:
        yield
    finally:
        while (current := functorch.maybe_current_level()) is not None and (
                level is None or current > level):
            kind = retrieve_current_functorch_interpreter().key().name.lower()
            getattr(functorch, f"_{'func' if kind == 'functionalize' else kind}"
                               "_decrement_nesting")()
        torch.set_grad_enabled(grad)



def written_attributes(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm`` holds (parameters, buffers, an optimizer's state) that a call of
    its graph changes in place: a compiled ``optimizer.step``'s ``p.add_(...)`` and
    ``exp_avg.lerp_(...)``, BatchNorm's running statistics. The storages of the values the
    tracer recorded tell which (as :func:`updates_an_input` tells for inputs); where none
    is recorded, each attribute an updated value is read from through first operands.

    >>> class Step(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w, self.v = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    ...     def forward(self, g):
    ...         return self.w.view(2).add_(g) * self.v
    >>> gm = fx.symbolic_trace(Step())
    >>> [t is gm.w for t in written_attributes(gm)]
    [True]
    """
    def storage(node: Any):
        return storage_key(recorded_value(node))

    held = {n: value for n in gm.graph.nodes if n.op == "get_attr"
            and isinstance(value := _attribute(gm, n.target), torch.Tensor)}
    by_storage = {key: n for n in held if (key := storage(n)) is not None}
    found: list[torch.Tensor] = []
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method") or not n.args or not (
                is_in_place(n) or n.kwargs.get("out") is not None):
            continue
        written = n.kwargs.get("out", n.args[0])
        for target in written if isinstance(written, (list, tuple)) else (written,):
            key = storage(target)
            source = by_storage.get(key) if key is not None else _read_through_first(target)
            if source in held and all(held[source] is not t for t in found):
                found.append(held[source])
    return found


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    try:
        return operator.attrgetter(target)(gm)
    except AttributeError:
        return None


def _read_through_first(node: Any) -> fx.Node | None:
    """The ``get_attr`` node a value is read from through first operands, or None."""
    while isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and (
            node.args):
        node = node.args[0]
    return node if isinstance(node, fx.Node) and node.op == "get_attr" else None


@contextlib.contextmanager
def attributes_kept(gm: fx.GraphModule):
    """Give the tensors the graph of ``gm`` writes into (:func:`written_attributes`) their
    values back after the block: a run at compile time (recording values, validation)
    must leave the caller's parameters and state as they were. Only a tensor written
    (its version moved) is copied back: a write bumps the version, and autograd refuses
    a backward through a tensor saved before it.

    >>> class Count(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.n = nn.Parameter(torch.zeros(1), requires_grad=False)
    ...     def forward(self, x):
    ...         return self.n.add_(1) + x
    >>> gm = fx.symbolic_trace(Count())
    >>> with attributes_kept(gm):
    ...     _ = gm(torch.ones(1))
    >>> gm.n.item()
    0.0
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # (a copy made under a fake mode would be fake)
        # (an inference tensor has no version counter: it is restored where a write was
        # possible, inside inference mode, whatever happened)
        saved = [(t, None if t.is_inference() else t._version, t.detach().clone())
                 for t in written_attributes(gm)]
    try:
        with generators_kept(gm):
            yield [t for t, _, _ in saved]
    finally:
        with unset_fake_temporarily(), torch.no_grad():
            for t, version, value in saved:
                if (torch.is_inference_mode_enabled() if version is None
                        else t._version != version):
                    t.copy_(value)


def generators_of(*gms: nn.Module) -> list[torch.Generator]:
    """The random number generators the graphs of ``gms`` read as attributes
    (``torch.randn(shape, generator=self.gen)``; torch.export lifts them to constants),
    each once; a module that is no GraphModule reads none.

    >>> class Noise(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.gen = torch.Generator().manual_seed(0)
    ...     def forward(self, x):
    ...         return x + torch.randn(x.shape, generator=self.gen)
    >>> noise = Noise()
    >>> [gen is noise.gen for gen in generators_of(fx.symbolic_trace(noise))]
    [True]
    """
    found = {id(value): value for gm in gms if isinstance(gm, fx.GraphModule)
             for node in gm.graph.nodes if node.op == "get_attr"
             and isinstance(value := _attribute(gm, node.target), torch.Generator)}
    return list(found.values())


@contextlib.contextmanager
def generators_kept(*gms: nn.Module):
    """Give the generators the graphs of ``gms`` draw from (:func:`generators_of`) their
    states back after the block: a run at compile time must not move the caller's
    stream of random numbers. Yields the generators.

    >>> gen = torch.Generator().manual_seed(0)
    >>> gm = fx.symbolic_trace(lambda x: x + torch.rand(3, generator=gen))
    >>> with generators_kept(gm):
    ...     first = gm(torch.zeros(3))
    >>> torch.equal(gm(torch.zeros(3)), first)          # the same draws again
    True
    """
    saved = [(g, g.get_state()) for g in generators_of(*gms)]
    try:
        yield [g for g, _ in saved]
    finally:
        for g, state in saved:
            g.set_state(state)

