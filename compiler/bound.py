"""Parameters bound into an inference graph: what the program computes from them alone is
computed once.

torch.compile hands a backend the model's parameters and buffers as inputs of the graph
(it inlines ``nn.Module`` calls), so that nothing computed from them alone looks constant:
a batch norm folded into its convolution, the concatenated weights of merged projections,
oneDNN's packed weights would be made again on every call. For a graph compiled without
grad (dynamo guards on grad mode), :func:`bind_parameters` makes those inputs attributes of
the graph, read as parameters: emission folds what is made of them alone
(:mod:`backends.folding`), recomputed whenever one is written in place or moved, as
Inductor's freezing does once and for all. :class:`Bound` runs the program while the
tensors passed are the ones bound, and a program compiled without binding where they are
not (a parameter replaced): never a stale value. Another model of the same architecture
gets the program compiled for the first with its own tensors bound (:meth:`Bound.rebound`,
through the backend's cache), as the backend's cache gives any repeated graph.

>>> import torch.nn as nn
>>> gm = torch.fx.symbolic_trace(lambda x, w: x @ (w * 2))
>>> w = nn.Parameter(torch.ones(2, 2))
>>> bound_gm, kept = bind_parameters(gm, (torch.ones(1, 2), w))
>>> kept, [n.op for n in bound_gm.graph.nodes][:2]
([1], ['placeholder', 'get_attr'])
>>> bound_gm(torch.ones(1, 2))
tensor([[4., 4.]], grad_fn=<MmBackward0>)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["Bound", "bind_parameters", "parameter_positions"]


def parameter_positions(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[int]:
    """The places among ``gm``'s inputs of the model's parameters and buffers (real
    tensors dynamo marks static, or ``nn.Parameter``\\ s) that the graph does not write
    into.

    >>> gm = torch.fx.symbolic_trace(lambda x, w: x + w)
    >>> parameter_positions(gm, (torch.ones(2), nn.Parameter(torch.ones(2))))
    [1]
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, (node, x) in enumerate(zip(placeholders, example_inputs))
            if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor)
            and (isinstance(x, nn.Parameter) or getattr(x, "_dynamo_static_input_type", None))
            and not _written(node)]


def _written(node: fx.Node) -> bool:
    """Whether a call writes into ``node``'s value or a view of it (an in-place method or
    operator, ``x[i] = v``): a tensor the graph updates stays an input."""
    stack, seen = [node], set()
    while stack:
        value = stack.pop()
        for user in value.users:
            if user in seen or user.op not in ("call_method", "call_function"):
                continue
            seen.add(user)
            name = user.target if isinstance(user.target, str) else getattr(
                user.target, "__name__", "")
            if name == "setitem" or (name.endswith("_") and not name.endswith("__")) or (
                    "out" in user.kwargs):
                return True
            if name in _VIEWS:
                stack.append(user)
    return False


_VIEWS = frozenset({"view", "reshape", "getitem", "t", "transpose", "permute", "select",
                    "narrow", "expand", "flatten", "squeeze", "unsqueeze", "detach",
                    "as_strided", "split", "chunk", "unbind", "view_as", "unflatten",
                    "movedim", "swapaxes", "diagonal", "unfold", "real", "imag"})
"""Calls whose result may share its operand's storage (a write into it writes the
operand)."""


def bind_parameters(gm: fx.GraphModule, example_inputs: Sequence[Any]
                    ) -> tuple[fx.GraphModule, list[int]]:
    """A copy of ``gm`` that reads the inputs at :func:`parameter_positions` as its own
    attributes (the very tensors, not copies), and those places; ``gm`` is not changed."""
    positions = parameter_positions(gm, example_inputs)
    graph = fx.Graph()
    values: dict[fx.Node, fx.Node] = {}
    holder = nn.Module()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):  # (the inputs left first, in their order)
        if i not in positions:
            values[node] = graph.node_copy(node, values.__getitem__)
    for i in positions:
        name = f"bound_{i}"
        tensor = example_inputs[i]
        if isinstance(tensor, nn.Parameter):
            holder.register_parameter(name, tensor)
        else:
            holder.register_buffer(name, tensor, persistent=False)
        values[placeholders[i]] = graph.get_attr(name)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            values[node] = graph.node_copy(node, values.__getitem__)
    for name, module in gm.named_children():
        holder.add_module(name, module)
    for name in {n.target.split(".")[0] for n in gm.graph.nodes if n.op == "get_attr"}:
        if not hasattr(holder, name):
            setattr(holder, name, getattr(gm, name))
    bound = fx.GraphModule(holder, graph)
    bound.meta.update(gm.meta)
    return bound, positions


class Bound:
    """The program compiled from :func:`bind_parameters`' graph, called with every input
    of the source graph: while the tensors at ``positions`` are the ``tensors`` bound, the
    program with the other inputs; else the program ``unbound()`` compiles (once) from the
    source graph, with them all."""

    def __init__(self, compiled: Callable, positions: list[int], tensors: list[torch.Tensor],
                 unbound: Callable[[], Callable]):
        self.compiled, self.positions, self.tensors = compiled, positions, tensors
        self.module = compiled.module
        self.unbound = unbound
        self._unbound: Callable | None = None
        self._kept: list[int] | None = None

    def rebound(self, tensors: list[torch.Tensor]) -> Bound:
        """The same program with ``tensors`` bound in place of this one's (another model
        of the same architecture): a copy of the emitted module that holds them wherever
        it held the bound ones, its folded values made again from them on the first
        call."""
        memo = {id(old): new for old, new in zip(self.tensors, tensors)}
        module = copy.deepcopy(self.module, memo)
        return Bound(_Module(module), self.positions, tensors, self.unbound)

    def __call__(self, *args):
        for i, tensor in zip(self.positions, self.tensors):
            if args[i] is not tensor:
                if self._unbound is None:
                    self._unbound = self.unbound()
                return self._unbound(*args)
        if self._kept is None:
            skipped = set(self.positions)
            self._kept = [i for i in range(len(args)) if i not in skipped]
        return self.compiled(*[args[i] for i in self._kept])


class _Module:
    """An emitted module as the compiled function that runs it."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, *args):
        return self.module(*args)
