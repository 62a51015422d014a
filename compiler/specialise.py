"""Programs for the sizes a graph with symbolic sizes is called at (dynamo's automatic
dynamic shapes, ``dynamic=True``): the symbolic program serves every size, and each of the
first :data:`SPECIALISED_SIZES` sizes called :data:`SPECIALISE_AT_CALL` times gets the
pipeline's program for that size (:class:`BySize`, :func:`specialised`)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from compiler.options import BackendOptions
from compiler.pipeline import compile_one
from compiler.signature import SYMBOLIC, expression

__all__ = ["SPECIALISED_SIZES", "SPECIALISE_AT_CALL", "BySize", "size_symbols", "specialised"]

log = logging.getLogger("egraph.compiler")


SPECIALISED_SIZES = 8
"""How many sizes a graph with symbolic sizes is specialised for (:class:`BySize`), as
many as dynamo recompiles a frame for."""
SPECIALISE_AT_CALL = 2
"""The call at a size that specialises the graph for it: a size met once (each step of a
generation's growing cache) is not worth a compile."""


class BySize:
    """What runs for a graph with symbolic sizes that the emitted module runs (dynamo's
    automatic dynamic shapes after a second sequence length, or ``dynamic=True``). The
    symbolic program has the rewrites that hold for every size (the analysis carries
    sizes as expressions); at one size more apply (a mask built from ``arange(T)`` folds
    to a constant, a condition on a size's value is decided), so each of the first
    :data:`SPECIALISED_SIZES` sizes it is called with :data:`SPECIALISE_AT_CALL` times
    gets its own program (``specialise(args, sizes)``: the graph at those sizes, or None);
    the symbolic ``general`` program runs the others and any size a specialised one could
    not serve. ``module`` is the general program's.

    >>> def general(x):
    ...     return "general"
    >>> general.module = None
    >>> by_size = BySize(general, [("s0", 0, 0)], lambda args, at: lambda x: f"at {at}")
    >>> [by_size(torch.ones(n)) for n in (3, 3, 3, 4)]
    ['general', 'at s0=3', 'at s0=3', 'general']
    """

    def __init__(self, general: Callable, symbols: list[tuple[str, int, int | None]],
                 specialise: Callable[[tuple, str], Any]):
        self.general, self.symbols, self.specialise = general, symbols, specialise
        self.module = general.module
        self.sizes: dict[tuple, Callable] = {}
        self.calls: Counter = Counter()

    def __call__(self, *args):
        # (dynamo's guards fix every other size: the symbolic ones tell the programs apart)
        key = tuple(args[i] if dim is None else args[i].shape[dim]
                    for _, i, dim in self.symbols)
        run = self.sizes.get(key)
        if run is not None:
            return run(*args)
        if len(self.sizes) < SPECIALISED_SIZES:
            self.calls[key] += 1
            if self.calls[key] >= SPECIALISE_AT_CALL:
                at = ", ".join(f"{name}={value}"
                               for (name, _, _), value in zip(self.symbols, key))
                self.sizes[key] = self.specialise(args, at) or self.general
                return self.sizes[key](*args)
        return self.general(*args)


def size_symbols(example_inputs: Sequence[Any]) -> list[tuple[str, int, int | None]]:
    """Where a graph's symbolic sizes are: ``(expression, input, dim)`` for a tensor's
    symbolic dim, ``(expression, input, None)`` for a symbolic number.

    >>> size_symbols((torch.ones(2), 3))      # no symbolic size
    []
    """
    found: dict[str, tuple[str, int, int | None]] = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, SYMBOLIC):
            found.setdefault(expression(x), (expression(x), i, None))
        elif isinstance(x, torch.Tensor):
            for d, size in enumerate(x.shape):
                if isinstance(size, torch.SymInt):
                    found.setdefault(expression(size), (expression(size), i, d))
    return list(found.values())


def specialised(gm: torch.fx.GraphModule, args: tuple, finish: Callable,
                 options: BackendOptions, name: str) -> Callable | None:
    """The program for ``gm`` at the concrete sizes of ``args`` (a call's real inputs):
    the graph's values propagated again on fake tensors of those sizes, then the whole
    pipeline; None where that fails (the symbolic program then serves these sizes).

    >>> gm = torch.fx.symbolic_trace(lambda x: x * x.size(0))
    >>> module = specialised(gm, (torch.ones(3),), lambda module, gm, args: module,
    ...                      BackendOptions(rules=()), "graph at s0=3")
    >>> module(torch.ones(3))
    tensor([3., 3., 3.])
    """
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in graph.nodes:
        node.meta.pop("example_value", None)
        node.meta.pop("val", None)
    static = torch.fx.GraphModule(gm, graph)
    try:
        with unset_fake_temporarily():
            FakeTensorProp(static, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
            _bake_sizes(static.graph, args)
            module = compile_one(static, args, options, name=name)
            return finish(module, static, args)
    except Exception as err:  # noqa: BLE001 - the symbolic program serves these sizes
        log.info("%s: not specialised: %s: %s", name, type(err).__name__, err)
        return None


def _bake_sizes(graph: torch.fx.Graph, args: tuple) -> None:
    """Make every size ``graph`` reads a constant: its number inputs (dynamo's SymInts)
    and the calls whose values, propagated on fake tensors, are numbers or tuples of them
    (``x.size(1)``, ``h.shape[:-1] + (nf,)``); a number no fake tensor knows (``x.item()``)
    would have stopped the propagation. The rules then see the shapes the program has."""
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    known = {n: v for n, v in zip(inputs, args) if isinstance(v, (int, float, bool))}
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.op in ("call_function", "call_method") and (
                isinstance(value, (int, float, bool)) or isinstance(value, tuple) and value
                and all(isinstance(v, int) for v in value)):
            known[node] = tuple(value) if isinstance(value, tuple) else value
    for node, value in known.items():
        for user in list(node.users):
            user.args, user.kwargs = torch.fx.node.map_aggregate(
                (user.args, user.kwargs), lambda a, n=node, v=value: v if a is n else a)
    # (only the size computations go: an in-place call nothing reads by its result stays)
    for node in reversed(list(known)):
        if node.op != "placeholder" and not node.users:
            graph.erase_node(node)
