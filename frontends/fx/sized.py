"""The causal masks a graph computes from its inputs' sizes alone, read on their values at
the example's sizes. A program whose sizes are symbolic makes its causal mask from them
(transformers' mask code: ``arange``, comparisons, ``where``), so no constant holds it
and nothing is observed on it; ingest runs that part of the graph once on the example's
sizes, and the classes of the masks it finds carry the observed ``triangle``
(:class:`~frontends.fx.analysis.Meta`). Observed, like every such fact: the attention it
selects (:func:`frontends.fx.kernels.masked_attention`) checks the mask at run time, at
every size.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from frontends.fx.analysis import size_of
from frontends.fx.effects import is_functional, run_pure, torch_owned
from frontends.fx.observed import triangle_of
from frontends.fx.vocabulary import UNKNOWN_VALUE

__all__ = ["sized_triangles"]

_MAX_ELEMENTS = 1 << 22
"""Values with more elements at the example's sizes are not made (nor what reads them)."""

_SIZE_OF = {torch.ops.aten.sym_size.int, torch.ops.aten.size.default}

_OPERATORS = frozenset(f for f in vars(operator).values() if callable(f))
"""Python's operators (``and_``, ``ge``, ``getitem``), which transformers' mask code calls."""


def sized_triangles(gm: fx.GraphModule, example_inputs, param_names) -> dict[str, str]:
    """The causal masks (:func:`~frontends.fx.observed.triangle_of`) among the values of
    ``gm`` computed from the sizes of its inputs, numbers and literals alone (never from
    the values of an input, parameter or buffer), by node name, at the sizes of
    ``example_inputs`` (the inputs of ``gm`` that ``param_names`` does not name).

    >>> def mask(x):
    ...     t = torch.arange(x.size(1))
    ...     return torch.where(t[:, None] >= t[None, :], 0.0, -torch.inf) + x[0, 0]
    >>> gm = fx.symbolic_trace(mask)
    >>> sized_triangles(gm, (torch.randn(2, 5),), {})
    {'ge': 'tril', 'where': 'additive'}
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    users = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name not in param_names]
    env: dict[fx.Node, Any] = {}
    shapes: dict[fx.Node, tuple[int, ...]] = {}
    for node, value in zip(users, example_inputs or ()):
        if isinstance(value, torch.Tensor):
            shape = tuple(_hint(s) for s in value.shape)
            if None not in shape:
                shapes[node] = shape
        elif isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool) and (
                _hint(value) is not None):
            env[node] = _hint(value)
    found: dict[str, str] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method"):
                continue
            value = _size_of(node, shapes)
            if value is UNKNOWN_VALUE:
                value = _run(node, env)
            if value is UNKNOWN_VALUE:
                continue
            env[node] = value
            if isinstance(value, torch.Tensor):
                triangle = triangle_of(value)
                if triangle is not None:
                    found[node.name] = triangle
    return found


def _hint(size) -> int | None:
    """The example's value of a size (a SymInt's, read without guarding it), or None for
    a size no example value stands for."""
    value = size_of(size)
    return None if value is None else int(value)


def _size_of(node: fx.Node, shapes: dict[fx.Node, tuple[int, ...]]) -> Any:
    """The example's value of ``node`` where it reads an input's size (``x.size(1)``,
    ``aten.sym_size.int(x, 1)``, ``x.shape``, ``x.dim()``), else UNKNOWN_VALUE."""
    source = node.args[0] if node.args else None
    if source not in shapes:
        return UNKNOWN_VALUE
    shape = shapes[source]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.target in _SIZE_OF or node.op == "call_method" and node.target == "size":
        return shape if dim is None else shape[dim]
    if node.op == "call_method" and node.target == "dim" or node.target is torch.Tensor.dim:
        return len(shape)
    if node.target is getattr and node.args[1] == "shape":
        return shape
    return UNKNOWN_VALUE


def _run(node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    """``node``'s value from the values of its arguments in ``env``, where each is known
    and running it is pure and small (a Tensor method, Python's operators, or a torch call
    whose result depends only on its arguments: never one that changes the process's
    state, as ``torch.set_default_dtype`` does); else UNKNOWN_VALUE."""
    known = True

    def value(a):
        nonlocal known
        if isinstance(a, fx.Node):
            known = known and a in env
            return env.get(a)
        return a

    args = fx.node.map_aggregate(node.args, value)
    kwargs = fx.node.map_aggregate(node.kwargs, value)
    if not known:
        return UNKNOWN_VALUE
    if node.op == "call_method":
        def target(obj, *rest, **kw):
            return getattr(obj, node.target)(*rest, **kw)
    elif node.target in _OPERATORS or (torch_owned(node.target)
                                        and is_functional(node.target)):
        target = node.target  # (not torch.set_default_dtype: it changes the process)
    else:
        return UNKNOWN_VALUE
    result = run_pure(target, args, kwargs)
    if isinstance(result, torch.Tensor) and result.numel() > _MAX_ELEMENTS:
        return UNKNOWN_VALUE
    return result
