"""Explaining input mismatches: example inputs that do not fit the model (their number, or
a shape or dtype the first op that rejects them cannot take) become an
:class:`InputMismatch` that names the inputs and the op, in place of the op's own error
from deep inside the run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

__all__ = ["InputMismatch", "check_count", "explain_mismatch"]


class InputMismatch(ValueError):
    """The example inputs do not fit the model (their number, or a shape or dtype the first
    op that rejects them says it cannot take); the message names them and the op."""


def check_count(gm: fx.GraphModule, example_inputs, param_names: dict[str, str]) -> None:
    """Raise :class:`InputMismatch` when the number of example inputs is not one the
    graph takes (inputs with defaults may be left out; ``param_names`` are the inputs
    that hold parameters, which the caller does not pass).

    >>> gm = fx.symbolic_trace(lambda x, y: x + y)
    >>> check_count(gm, (torch.ones(1),), {})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    frontends.fx.mismatch.InputMismatch: the model takes 2 inputs (x, y), but 1 example ...
    """
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name not in param_names]
    if any(n.target.startswith("*") for n in inputs):
        return  # *args: any number
    required = [n for n in inputs if not n.args]
    if len(required) <= len(example_inputs) <= len(inputs):
        return
    names = ", ".join(n.target for n in inputs)
    takes = (f"{len(inputs)}" if len(required) == len(inputs)
             else f"{len(required)} to {len(inputs)}")
    raise InputMismatch(
        f"the model takes {takes} input{'s' if len(inputs) != 1 else ''} ({names}), but "
        f"{len(example_inputs)} example input{'s were' if len(example_inputs) != 1 else ' was'}"
        " given; pass one example per input, in order"
    )


def explain_mismatch(gm: fx.GraphModule, example_inputs, node: fx.Node | None,
                     err: Exception) -> None:
    """Raise :class:`InputMismatch` for ``err``, raised by ``node`` (None: unknown) of
    ``gm`` on the example inputs, naming the inputs ``node`` depends on.

    >>> gm = fx.symbolic_trace(lambda x, y: x @ y)
    >>> matmul = next(n for n in gm.graph.nodes if n.op == "call_function")
    >>> explain_mismatch(gm, (torch.ones(2, 3), torch.ones(2, 3)), matmul,
    ...                  RuntimeError("shapes cannot be multiplied"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    frontends.fx.mismatch.InputMismatch: ... input 'y' of shape (2, 3) (float32); FX node ...
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = dict(zip(placeholders, example_inputs))
    used = _inputs_of(node) if node is not None else set()
    named = [n for n in values if n in used] or list(values)
    described = ", ".join(f"input {n.target!r} {_describe_value(values[n])}" for n in named)
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = f"{_describe_node(node)} rejects it" if node is not None else "the model rejects it"
    raise InputMismatch(
        f"the example inputs do not fit the model: {described}; {where}: {message}. "
        "Pass example inputs of the shapes and dtypes the model takes."
    ) from None


def _inputs_of(node: fx.Node) -> set[fx.Node]:
    """The placeholders ``node`` depends on."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return {n for n in seen if n.op == "placeholder"}


def _describe_value(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"of shape {tuple(x.shape)} ({str(x.dtype).removeprefix('torch.')})"
    return f"= {x!r}"


def _describe_node(node: fx.Node) -> str:
    """An FX node as a reader knows it: its name and what it calls."""
    if node.op == "call_module":
        what = f"module {node.target!r}"
    elif node.op == "call_method":
        what = f"method .{node.target}()"
    elif node.op == "call_function":
        name = getattr(node.target, "__qualname__", None)
        module = str(getattr(node.target, "__module__", "") or "").replace("_operator",
                                                                             "operator")
        what = f"{module}.{name}" if name and module and not hasattr(
            node.target, "_schema") else str(node.target)  # aten ops: aten.mm.default
    else:
        what = node.op
    return f"FX node {node.name!r} ({what})"
