"""Foreach calls, one call per tensor: ``torch._foreach_add_(xs, 1)`` becomes ``x.add_(1)``
for each ``x`` of ``xs``.

A compiled ``optimizer.step`` with ``foreach=True`` (the default on CUDA) spells its
update as calls over lists of parameters and states (``_foreach_lerp_``,
``_foreach_addcdiv_``). Split per tensor, each update is an ordinary in-place call on a
parameter, which ingest knows how to keep in order and to read after, and each
out-of-place result an ordinary value that rules can rewrite and CSE can share (Adam's
``1 - beta ** step`` is one expression per parameter).

>>> import torch, torch.fx as fx
>>> def step(a, b):
...     torch._foreach_mul_([a, b], 0.5)
...     return torch._foreach_sqrt([a, b])[1]
>>> gm = split_foreach(fx.symbolic_trace(step))
>>> [n.target if n.op == "call_method" else n.target.__name__
...  for n in gm.graph.nodes if n.op.startswith("call")]
['mul_', 'mul_', 'sqrt', 'sqrt']
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from frontends.fx.recorded import recorded_key, recorded_value

PREFIX = "_foreach_"

_ELEMENT_FUNCTIONS = {"norm": torch.linalg.vector_norm, "max": torch.max}
"""Out-of-place foreach calls whose per-tensor twin is not the torch function of their
name: ``_foreach_norm(xs, 2)`` is each tensor's vector norm, ``_foreach_max`` its
largest element."""

_BOUNDS = {torch.maximum: torch.clamp_min, torch.minimum: torch.clamp_max}
"""``_foreach_maximum(xs, 0.5)``: against a number, each tensor's twin is a clamp."""

_LOCATION = ("stack_trace", "nn_module_stack")
"""What a split call keeps of the foreach call's metadata: where it came from."""

_SCALED = ("addcmul", "addcdiv")
"""Foreach calls whose fourth operand (``scalars``) is the per-tensor ``value=``."""


def foreach_name(target: Any) -> str | None:
    """The per-tensor name of a torch foreach function (``"add_"`` for
    ``torch._foreach_add_``), else None.

    >>> foreach_name(torch._foreach_lerp_), foreach_name(torch.add)
    ('lerp_', None)
    """
    name = getattr(target, "__name__", None)
    if not isinstance(name, str) or not name.startswith(PREFIX) or (
            getattr(torch, name, None) is not target):
        return None
    return name[len(PREFIX):]


def split_foreach(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each foreach call made one call per tensor (a new GraphModule over the
    same parameters, buffers and submodules; ``gm`` itself is left as it is), or ``gm``
    where it has none. A result list read by index becomes its items; one passed whole
    (to another foreach call, to ``torch.stack``) becomes the list of them."""
    if not any(n.op == "call_function" and foreach_name(n.target) for n in gm.graph.nodes):
        return gm
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = gm.graph._codegen
    key = recorded_key(gm)
    env: dict[fx.Node, Any] = {}
    split: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is operator.getitem and (
                node.args[0] in split) and isinstance(node.args[1], int):
            env[node] = env[node.args[0]][node.args[1]]
            continue
        if node.op == "call_function" and foreach_name(node.target):
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            results = _split(graph, node, list(args), dict(kwargs), key)
            if results is not None:
                env[node] = results
                split.add(node)
                continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    if not split:
        return gm
    module = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    module.meta.update(gm.meta)
    return module


def _element_target(name: str) -> Any:
    """What one tensor's call is: a Tensor method's name (in place), else a function."""
    if name.endswith("_"):
        if hasattr(torch.Tensor, name):
            return name
        return getattr(torch, name[:-1], None)  # (no method: the result is copied in)
    return _ELEMENT_FUNCTIONS.get(name, getattr(torch, name, None))


def _length(args: list) -> int | None:
    """How many tensors a foreach call runs over: the length of its first list operand."""
    for a in args:
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, fx.Node) for x in a):
            return len(a)
    return None


def _split(graph: fx.Graph, node: fx.Node, args: list, kwargs: dict,
           key: str | None) -> list[fx.Node] | None:
    """The per-tensor calls of the foreach call ``node`` (``args`` and ``kwargs``: its
    operands in the new graph), or None where it has no per-tensor twin."""
    name = foreach_name(node.target)
    target = _element_target(name)
    count = _length(args)
    if target is None or count is None:
        return None
    scaled = name.rstrip("_") in _SCALED
    if scaled:
        if len(args) > 3:
            kwargs["value"] = args.pop(3)
        if "scalars" in kwargs:
            kwargs["value"] = kwargs.pop("scalars")
    recorded = recorded_value(node)
    results = []
    for i in range(count):
        def element(a, i=i):
            if isinstance(a, (list, tuple)) and len(a) == count:
                return a[i]
            if scaled and isinstance(a, fx.Node) and a is kwargs.get("value"):
                return _indexed(graph, a, i, key)  # (a 1-D tensor of per-tensor values)
            return a

        call_args = tuple(element(a) for a in args)
        call_kwargs = {k: element(v) for k, v in kwargs.items()}
        call = target
        if call in _BOUNDS and len(call_args) > 1 and isinstance(call_args[1], (int, float)):
            call = _BOUNDS[call]  # (a number: torch.maximum takes tensors only)
        if isinstance(call, str):
            result = graph.call_method(call, call_args, call_kwargs)
            _record(result, key, call_args[0].meta.get(key) if key else None, run=False)
        else:
            result = graph.call_function(call, call_args, call_kwargs)
            _record(result, key, recorded[i] if not name.endswith("_") and isinstance(
                recorded, (list, tuple)) and len(recorded) == count else None)
            if name.endswith("_"):  # an in-place call without a method: copied into place
                result = graph.call_method("copy_", (call_args[0], result))
                _record(result, key, call_args[0].meta.get(key) if key else None, run=False)
        result.meta.update({k: node.meta[k] for k in _LOCATION if k in node.meta})
        results.append(result)
    return results


def _indexed(graph: fx.Graph, tensor: fx.Node, i: int, key: str | None) -> fx.Node:
    item = graph.call_function(operator.getitem, (tensor, i))
    _record(item, key)
    return item


def _record(node: fx.Node, key: str | None, value: Any = None, run: bool = True) -> None:
    """Give a new node the value its tracer would have recorded (``key``): ``value``, else
    (``run``: a call that writes into nothing) its target run on its operands' recorded
    values (fake tensors run as fakes)."""
    if key is None:
        return
    if value is None:
        if not run or any(key not in a.meta for a in node.all_input_nodes):
            return
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta[key])
        with torch.no_grad():
            value = node.target(*args, **kwargs) if node.op == "call_function" else (
                getattr(args[0], node.target)(*args[1:], **kwargs))
    node.meta[key] = value
