"""What the tracer recorded: the value torch.export, aot_autograd and dynamo record for each
node of the graphs they make (real, fake or symbolic), the key they record it under, and
the storages of those values, which tell which nodes share a tensor.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["recorded_key", "recorded_parts", "recorded_value", "same_storage", "storage_key"]


def recorded_value(arg: Any) -> Any:
    """The value the tracer recorded for the FX node ``arg`` (torch.export's and
    aot_autograd's ``val``, dynamo's ``example_value``), or None (nothing recorded, or
    ``arg`` not a node).

    >>> program = torch.export.export(torch.nn.Linear(2, 3), (torch.randn(4, 2),))
    >>> [tuple(recorded_value(n).shape) for n in program.graph.nodes if n.op == "placeholder"]
    [(3, 2), (3,), (4, 2)]
    """
    if not isinstance(arg, fx.Node):
        return None
    return arg.meta.get("val", arg.meta.get("example_value"))


def recorded_key(gm: fx.GraphModule) -> str | None:
    """The meta key under which the graph's tracer recorded every node's value
    (``"val"``: torch.export, aot_autograd; ``"example_value"``: dynamo), or None (a
    symbolic trace). A node nothing reads needs none (torch.export's module() adds an
    unused call of its input guards, ``_guards_fn``, without one), nor one read only by
    index where each part is recorded (aot_autograd records the parts of a
    ``run_with_rng_state`` call, activation checkpointing's replay of a random op, not
    the call: :func:`recorded_parts`).

    >>> recorded_key(fx.symbolic_trace(lambda x: x + 1)) is None
    True
    >>> linear = torch.nn.Linear(2, 2)
    >>> recorded_key(torch.export.export(linear, (torch.randn(1, 2),)).graph_module)
    'val'
    """
    for key in ("val", "example_value"):
        if all(key in n.meta or recorded_parts(n, key) is not None for n in gm.graph.nodes
               if n.op not in ("output", "get_attr") and n.users):
            return key
    return None


def recorded_parts(node: fx.Node, key: str) -> tuple | None:
    """The recorded values of a node read only by index, by position (None at a position
    nothing reads), or None where a user reads it whole or a part is not recorded.

    >>> g = fx.Graph()
    >>> pair = g.call_function(torch.ops.aten.max.dim, (g.placeholder("x"), 0))
    >>> second = g.call_function(operator.getitem, (pair, 1))
    >>> second.meta["val"] = torch.zeros(3, dtype=torch.long)
    >>> recorded_parts(pair, "val")
    (None, tensor([0, 0, 0]))
    """
    if not node.users:
        return None
    parts: dict[int, Any] = {}
    for user in node.users:
        if not (user.op == "call_function" and user.target is operator.getitem
                and isinstance(user.args[1], int) and key in user.meta):
            return None
        parts[user.args[1]] = user.meta[key]
    return tuple(parts.get(i) for i in range(max(parts) + 1))


def storage_key(value: Any):
    """A key for the storage of a tensor, real or fake; None for anything else, and for
    a tensor without a storage of its own (the values dynamo records inside a
    ``torch.func`` transform are functorch's batched or gradient-tracking wrappers).

    >>> x = torch.ones(4)
    >>> storage_key(x.view(2, 2)) == storage_key(x), storage_key(3)
    (True, None)
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):
        return None


def same_storage(value: Any, key: Any) -> bool:
    """Whether ``value`` is a tensor whose storage is the one ``key`` names (a storage key
    compared with None raises, so a value without one is told apart first).

    >>> x = torch.ones(4)
    >>> same_storage(x[1:], storage_key(x)), same_storage(None, storage_key(x))
    (True, False)
    """
    own = storage_key(value)
    return own is not None and own == key

