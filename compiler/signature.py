"""What makes two graphs, or two region bodies, compile the same: the keys of the
backend's cache (:func:`compiler.compile.make_backend`), so that a graph compiled once is
not compiled again, and a graph that differs is never handed another's program."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from compiler.validate import is_fake
from frontends.fx.exported import attribute_at

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
"""The types of the symbolic numbers dynamo hands a backend under dynamic shapes."""


def signature(gm: torch.fx.GraphModule, example_inputs) -> tuple:
    """What makes two graphs compile the same: their code, what they read by attribute
    (:func:`_held`) and their inputs' shapes, dtypes and devices (aot_autograd passes
    parameters as inputs, so the result does not hold them). Symbolic sizes and numbers
    count by their expression (``s0``, ``2*s1``): the program reads them from its inputs,
    whatever their value.

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> signature(gm, (torch.ones(2),))[-1]
    (((2,), torch.float32, 'cpu'),)
    """
    return gm.code, _held(gm), _input_specs(example_inputs)


def sizeless_signature(gm: torch.fx.GraphModule, example_inputs) -> tuple:
    """What makes two graphs one program at different sizes: the ops that make tensors, in
    order, with their non-tensor arguments, what the graph reads by attribute, and its
    tensor inputs' ranks, dtypes and devices. Dynamo's recompile of a frame for a new batch
    size (automatic dynamic shapes) has the static graph's ops plus size inputs and size
    arithmetic; the backend keeps, under this key, what it learned about the program at
    any one size (a rewrite whose gradients differ on the user's values at one size is not
    run under autograd at another).

    >>> def f(x):
    ...     return (x * 2).softmax(-1)
    >>> gm = torch.fx.symbolic_trace(f)
    >>> sizeless_signature(gm, (torch.ones(3, 4),)) == sizeless_signature(gm, (torch.ones(7, 4),))
    True
    >>> sizeless_signature(gm, (torch.ones(3, 4),)) == sizeless_signature(gm, (torch.ones(3),))
    False
    """
    ops = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if node.op in ("placeholder", "output") or (
                value is not None and not isinstance(value, torch.Tensor)):
            continue  # (sizes, and the arithmetic on them, differ between the two graphs)
        constants = torch.fx.node.map_aggregate((node.args, node.kwargs), _leaf)
        ops.append((node.op, str(node.target), repr(constants)))
    ranks = tuple((x.dim(), x.dtype, x.device.type) for x in example_inputs
                  if isinstance(x, torch.Tensor))
    return tuple(ops), _held(gm), ranks


def _leaf(argument: Any) -> Any:
    """An argument that may be the same at every size, else None: a node, a symbolic
    number, or an integer (a size where the other graph has a symbolic one; the key then
    also joins graphs that differ only in a dim, which costs them the direct path only)."""
    if isinstance(argument, (torch.fx.Node, *SYMBOLIC)) or (
            isinstance(argument, int) and not isinstance(argument, bool)):
        return None
    return argument


def _input_specs(inputs: Sequence[Any]) -> tuple:
    """Each input's kind: a tensor's sizes (symbolic ones by expression), dtype and device
    type; a symbolic number's type and expression; anything else by its repr."""
    def spec(x):
        if isinstance(x, torch.Tensor):
            return (tuple(expression(s) for s in x.shape), x.dtype, x.device.type)
        if isinstance(x, SYMBOLIC):
            return (type(x).__name__, expression(x))
        return repr(x)

    return tuple(spec(x) for x in inputs)


def _held(gm: torch.fx.GraphModule) -> tuple:
    """What a graph reads by attribute, as far as it decides the program: a region body's
    code (and what it reads), a constant tensor's values, a parameter or any other object
    itself (its id: the compiled program holds it, so the id is not reused while the cache
    holds the program; a parameter's values are read when the program runs, and a large
    model's are not hashed on every compile).
    Two flex_attention calls with different ``score_mod`` functions, or two
    checkpointed functions, have the same code and differ only in their bodies: the second
    was handed the first's program (a silent wrong result).

    >>> import torch.fx as fx
    >>> g = fx.Graph()
    >>> _ = g.output(g.get_attr("c"))
    >>> one = fx.GraphModule({"c": torch.ones(2)}, g)
    >>> two = fx.GraphModule({"c": torch.zeros(2)}, g)
    >>> _held(one) == _held(one), _held(one) == _held(two)
    (True, False)
    """
    held = []
    for node in gm.graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        value = attribute_at(gm, node.target)
        if isinstance(value, torch.fx.GraphModule):
            held.append((node.target, value.code, _held(value)))
        elif isinstance(value, torch.Tensor) and not isinstance(
                value, torch.nn.Parameter) and not is_fake(value):
            held.append((node.target, tuple(value.shape), value.dtype, _digest(value)))
        else:
            held.append((node.target, id(value)))
    return tuple(held)


def _digest(tensor: torch.Tensor) -> str | int:
    """A digest of a tensor's values, or its id where its bytes cannot be read (a sparse or
    quantised tensor)."""
    try:
        # (aot_autograd compiles its graphs under its fake mode)
        with unset_fake_temporarily():
            data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            return hashlib.blake2b(data.numpy().tobytes()).hexdigest()
    except (RuntimeError, TypeError):
        return id(tensor)


def expression(s: Any) -> Any:
    """A symbolic number by its expression (``s0``, ``2*s1``), any other as it is.

    >>> expression(3)
    3
    """
    return str(s.node.expr) if isinstance(s, SYMBOLIC) else s


def structure(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> tuple | None:
    """What makes two region bodies compile the same whatever their names: each node's
    kind, target and arguments (earlier nodes by position), and the inputs' kinds (as
    :func:`signature`); None for a body that reads an attribute (a constant of its own).

    >>> def doubled_sine(y):
    ...     return torch.sin(y) * 2
    >>> one = torch.fx.symbolic_trace(lambda x: torch.sin(x) * 2)
    >>> structure(one, (torch.ones(2),)) == structure(torch.fx.symbolic_trace(doubled_sine),
    ...                                               (torch.ones(2),))
    True
    """
    position: dict[torch.fx.Node, int] = {}
    nodes = []
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return None
        position[node] = len(position)
        arguments = torch.fx.node.map_arg((node.args, node.kwargs), position.__getitem__)
        nodes.append((node.op, None if node.op == "placeholder" else str(node.target),
                      repr(arguments)))
    return tuple(nodes), _input_specs(inputs)
