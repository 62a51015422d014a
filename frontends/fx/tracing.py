"""Tracing: an ``nn.Module`` becomes a ``torch.fx`` graph, the first step of normalising a
source that is not a graph yet. Arguments of ``forward`` the example inputs leave out are
traced as their defaults, a tensor default included, and ``*xs`` is spread into one input
per example.
"""

from __future__ import annotations

import inspect
import operator
import warnings
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx._symbolic_trace import _assert_is_none

__all__ = ["UntraceableModel", "spread_star_inputs", "trace"]

class UntraceableModel(ValueError):
    """The model cannot be captured as a static graph; the message says how to proceed."""


def trace(model: nn.Module, example_inputs: tuple | list | None = None) -> fx.GraphModule:
    """``torch.fx.symbolic_trace`` with a clear error for models it cannot capture. The
    arguments of ``forward`` that ``example_inputs`` leave out take their defaults and are
    traced as those values (``forward(self, x, mask=None)`` given ``(x,)``: the branch on
    ``mask is not None`` is not taken), as ``model(*example_inputs)`` runs; the module
    traced asserts them (torch.fx's ``concrete_args``).

    >>> class Scaled(nn.Module):
    ...     def forward(self, x, mask=None, scale=2.0):
    ...         return x * scale if mask is None else x.masked_fill(mask, 0.0)
    >>> print(trace(Scaled(), (torch.ones(2),))(torch.ones(2)))
    tensor([2., 2.])
    """
    if isinstance(model, fx.GraphModule):
        return model
    try:
        concrete = _left_out(model, example_inputs)
        tracer = _TensorDefaultsTracer(_tensor_defaulted(model))
        with warnings.catch_warnings():
            # (torch.fx cannot assert a tensor specialised; the tracer asserts it is None)
            warnings.filterwarnings("ignore", "Was not able to add assertion")
            graph = tracer.trace(model, concrete_args=concrete)
        return fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception as err:
        raise UntraceableModel(
            f"torch.fx cannot trace {type(model).__name__}: {err}. Symbolic tracing cannot "
            "follow data-dependent control flow (an `if` or loop on tensor values) or Python "
            "operations that need concrete values. Capture it with "
            "torch.export.export(model, args) and pass the program to EGraph.from_fx, or "
            "use torch.compile(model, backend='egraph'), which splits the graph at such "
            "points."
        ) from err


def spread_star_inputs(gm: fx.GraphModule, example_inputs: tuple | list | None,
                       forward: Callable | None = None) -> fx.GraphModule:
    """``gm`` taking one input per example where its forward takes ``*xs``
    (``xs[0] * 2 + xs[1]``, ``torch.cat(xs)``): the count specialised to the examples', as
    torch.export specialises it; otherwise ``gm`` itself. A new module: ``gm`` is left
    as it is. ``forward`` (default ``gm.forward``) is the function whose signature names
    the inputs before the star: a traced module's own, since torch.fx's code moves its
    keyword-only inputs before the star, where a call's examples would bind to them.

    >>> class Pair(nn.Module):
    ...     def forward(self, *xs):
    ...         return xs[0] * 2 + xs[1]
    >>> spread = spread_star_inputs(fx.symbolic_trace(Pair()), (torch.ones(2), torch.ones(2)))
    >>> [n.name for n in spread.graph.nodes if n.op == "placeholder"]
    ['xs_0', 'xs_1']
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    star = next((n for n in placeholders if str(n.target).startswith("*")
                 and not str(n.target).startswith("**")), None)
    if star is None or example_inputs is None:
        return gm
    leading = [p.name for p in inspect.signature(forward or gm.forward).parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = [n for n in placeholders if n.target in leading]
    if any(n.args for n in first):  # (an input with a default before them: left as is)
        return gm
    count = len(example_inputs) - len(first)
    graph, env = fx.Graph(), {}
    for node in first:
        env[node] = graph.node_copy(node, env.__getitem__)
    # (read whole, ``torch.cat(xs)``, it is the tuple of them)
    env[star] = tuple(graph.placeholder(f"{str(star.target)[1:]}_{i}") for i in range(count))
    for node in gm.graph.nodes:
        if node in env:
            continue
        at = node.args[1] if node.target is operator.getitem and len(node.args) == 2 and (
            node.args[0] is star) else None
        if isinstance(at, int) and -count <= at < count:
            env[node] = env[star][at]
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph)


class _TensorDefaultsTracer(fx.Tracer):
    """torch.fx's tracer for a ``forward`` whose arguments default to tensors
    (``scale=torch.tensor(2.0)``), which the code torch.fx writes cannot spell: an argument
    the examples give becomes an input without a default, one they leave out is traced as
    its default tensor (a constant of the module), with an input in its place that must be
    None (:func:`_left_out` passes the tensor as a concrete argument)."""

    def __init__(self, defaulted: frozenset[str]):
        super().__init__()
        self.defaulted = defaulted

    def create_proxy(self, kind, target, args, kwargs, *rest, **more):
        if kind != "placeholder" or not (args and isinstance(args[0], torch.Tensor)):
            return super().create_proxy(kind, target, args, kwargs, *rest, **more)
        name = str(target)
        if name in self.defaulted:  # (given by the examples: an input like any other)
            return super().create_proxy(kind, target, (), kwargs, *rest, **more)
        proxy = super().create_proxy(kind, target, (None,), kwargs, *rest, **more)
        base = name.rsplit("_", 1)[0]
        super().create_proxy("call_function", _assert_is_none, (proxy, (
            f"{base} was traced as its default tensor; give it in the example inputs to "
            "make it an input")), {})
        return proxy


def _tensor_defaulted(model: nn.Module) -> frozenset[str]:
    """The names of the arguments of ``model.forward`` that default to a tensor."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in parameters if isinstance(p.default, torch.Tensor))


def _left_out(model: nn.Module, example_inputs: tuple | list | None) -> dict | None:
    """The arguments of ``model.forward`` after the ``example_inputs`` (and its keyword-only
    ones) that have defaults, with their defaults, and those given as None, as None (None
    without example inputs: every argument is traced)."""
    if example_inputs is None:
        return None
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # (a forward without a signature: traced as it is)
        return None
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = [p for p in parameters if p.kind == p.KEYWORD_ONLY]
    if not any(p.kind == p.VAR_POSITIONAL for p in parameters):  # (else *xs takes the rest)
        keywords = positional[len(example_inputs):] + keywords
    # (plain values, which torch.fx writes into the code it generates, and tensors, which
    # _TensorDefaultsTracer holds as constants)
    left = {p.name: p.default for p in keywords
            if p.default is None or type(p.default) in (bool, int, float, str)
            or isinstance(p.default, torch.Tensor)}
    # (None given is None traced: ``if mask is not None`` cannot branch on a proxy)
    left.update((p.name, None) for p, x in zip(positional, example_inputs) if x is None)
    return left or None

