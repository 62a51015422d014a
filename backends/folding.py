"""Folded constants: what an emitted program computes from its parameters, constants,
literals and its inputs' sizes alone, computed once (or once per size) instead of on every
call.

Emission (:mod:`backends.fx`) writes each such value as a *recipe*, an op of the table (or
:data:`CALL` of an ATen operator) over source tensors, literals, other folded values
(:class:`FoldedRef`), the inputs' sizes (:class:`InputSize`) and arithmetic of sizes
(:class:`SizeArithmetic`); :class:`FoldedConstants` holds the recipes and their values.

>>> w = nn.Parameter(torch.ones(2))
>>> folded = FoldedConstants({"folded_0": ("cat", [0, w, w])})
>>> folded.folded_0
tensor([1., 1., 1., 1.])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from backends.sizes import check_guards
from frontends.fx.analysis import SCALAR_OPS
from frontends.fx.vocabulary import SPECS


class FoldedRef:
    """A reference to another folded value inside a folded value's recipe."""

    def __init__(self, name: str):
        self.name = name


class InputSize:
    """A size of an input inside a folded value's recipe: dim ``dim`` of the ``index``-th
    tensor the program hands :class:`FoldedConstants` (a symbolic program's
    ``x.size(1)``)."""

    def __init__(self, index: int, dim: int):
        self.index, self.dim = index, dim

    def __repr__(self) -> str:
        return f"inputs[{self.index}].size({self.dim})"


class SizeArithmetic:
    """Size arithmetic inside a folded value's recipe: :data:`SCALAR_OPS` ``op`` over
    sizes, other such arithmetic and numbers (``T - 1``)."""

    def __init__(self, op: str, args: tuple):
        self.op, self.args = op, args

    def __repr__(self) -> str:
        return f"{self.op}{self.args!r}"


def recipe_value(value: Any, inside: Any) -> Any:
    """``value`` with every FX node in it (nested in tuples, lists, dicts and slices too)
    replaced by what ``inside`` maps it to: a source tensor, :class:`FoldedRef`,
    :class:`InputSize` or :class:`SizeArithmetic`."""
    return fx.node.map_aggregate(value, lambda v: inside[v] if isinstance(v, fx.Node) else v)


CALL = "call"
"""The op of a folded recipe that calls a torch operator outside the op table (a call
ingest kept opaque): its parameters are the operator, its args and its kwargs."""


class FoldedConstants(nn.Module):
    """The subexpressions of parameters, constants, literals and the inputs' sizes alone
    in an emitted module (the concatenated weights of merged projections; in a program
    whose sizes are symbolic, the causal mask and the positions made from ``arange(T)``),
    held as its non-persistent buffers: computed once, and read by the program after a
    call of the module with the inputs whose sizes they read (:meth:`refresh`), which
    recomputes them only when a source was updated in place or moved (its version
    counter or storage changed) or a size they read changed, every time autograd needs
    them (grad enabled and a source requires grad), so that training through the module
    stays exact, and every time where a source keeps no version counter (an inference
    tensor). The program
    calls it as a submodule, which torch.fx keeps when it traces the code again (loading
    a saved module); a method call would run once at that trace and be gone. ``recipes``: name ->
    (op, the op's canonical parameter values: source tensors, literals, :class:`FoldedRef`,
    :class:`InputSize`, :class:`SizeArithmetic`), in dependency order; ``outputs``: the names the
    program reads (default: every one).

    >>> w = nn.Parameter(torch.ones(2, 3))
    >>> folded = FoldedConstants({"folded_0": ("cat", [0, w, w])})
    >>> first = folded.folded_0
    >>> with torch.no_grad():
    ...     folded.refresh()
    >>> first.shape, folded.folded_0 is first
    (torch.Size([4, 3]), True)

    A value made from a size is remade when the size changes:

    >>> t = InputSize(0, 1)  # (dim 1 of the first input the program hands it)
    >>> steps = FoldedConstants({"folded_0": ("full", [(t, t), 1.0, None, None])})
    >>> steps(torch.zeros(2, 3)); steps.folded_0.shape
    torch.Size([3, 3])
    >>> steps(torch.zeros(2, 5)); steps.folded_0.shape
    torch.Size([5, 5])
    """

    def __init__(self, recipes: dict[str, tuple[str, list]], outputs=None):
        super().__init__()
        self.recipes = recipes
        self.outputs = set(recipes if outputs is None else outputs)
        self.sources: list[torch.Tensor] = []
        for _, kids in recipes.values():
            for k in kids:
                if isinstance(k, torch.Tensor) and all(k is not t for t in self.sources):
                    self.sources.append(k)
        self.key: list | None = None
        # (an inference tensor has no version counter: its updates in place go unseen)
        self.untracked = any(t.is_inference() for t in self.sources)
        self.sizes: tuple = ()
        self.sized = any(_reads_size(k) for _, kids in recipes.values() for k in kids)
        if not self.sized:  # (one made from sizes waits for the program's first call)
            with torch.no_grad():
                self.refresh()

    _is_impure = True  # torch.fx: a call whose result nothing reads is not dead code

    def forward(self, *inputs: torch.Tensor) -> None:
        self.refresh(tuple(tuple(x.shape) for x in inputs))

    def refresh(self, sizes: tuple = ()) -> None:
        """Recompute the values whose sources or sizes (the shapes of the inputs the
        program hands the call) changed, or that autograd needs."""
        self.sizes = sizes
        if self.untracked or (torch.is_grad_enabled()
                              and any(t.requires_grad for t in self.sources)):
            self.key = None  # values that carry autograd history are not kept
            self._compute()
            return
        key = [sizes, *((t._version, t.data_ptr()) for t in self.sources)]
        if key != self.key:
            with torch.no_grad():
                self._compute()
            self.key = key

    def share(self, pool: dict) -> int:
        """Hold, for each value this module computes by the same recipe from the same
        source tensors as a value already in ``pool``, that tensor instead of its own; add
        its other values to ``pool``. Returns the bytes let go. Programs of one e-graph held
        at once (autotuning's candidates, a benchmark's programs) fold the same merged
        weights: shared, a 1B-parameter model's two dozen programs hold one copy of each,
        not two dozen. A value made from the inputs' sizes is not shared (it is made at the
        first call); a source updated in place is recomputed by each module on its own
        (:meth:`refresh` replaces its buffers, never writes into them).

        >>> w = nn.Parameter(torch.ones(2))
        >>> a = FoldedConstants({"folded_0": ("cat", [0, w, w])})
        >>> b = FoldedConstants({"folded_3": ("cat", [0, w, w])})
        >>> pool = {}
        >>> a.share(pool), b.share(pool), b.folded_3 is a.folded_0
        (0, 16, True)
        """
        if self.sized or self.untracked:
            return 0
        keys: dict[str, Any] = {}

        def key(kid: Any) -> Any:
            if isinstance(kid, torch.Tensor):
                return ("tensor", id(kid))
            if isinstance(kid, FoldedRef):
                return keys[kid.name]
            if isinstance(kid, (list, tuple)):
                return (type(kid).__name__, *map(key, kid))
            if isinstance(kid, dict):
                return ("dict", *((k, key(v)) for k, v in kid.items()))
            if isinstance(kid, slice):
                return ("slice", key(kid.start), key(kid.stop), key(kid.step))
            if isinstance(kid, float):  # (-0.0 == 0.0, but they fold differently)
                return ("float", kid.hex())
            return (type(kid).__name__, kid if kid.__hash__ is not None else id(kid))

        freed = 0
        for name, (op, kids) in self.recipes.items():
            keys[name] = (op, key(kids))
            if name not in self._buffers:
                continue
            # (the sources ride along in the pool, so that the ids in its keys stay theirs)
            held = pool.setdefault(keys[name], (self._buffers[name], self.sources))[0]
            if held is not self._buffers[name]:
                freed += self._buffers[name].nbytes
                self._buffers[name] = held
        return freed

    def __getstate__(self) -> dict:
        # Copies and pickles hold detached values, recomputed on their first call.
        state = self.__dict__.copy()
        state["_buffers"] = {k: v.detach() for k, v in self._buffers.items()}
        state["key"] = None
        return state

    def _compute(self) -> None:
        values: dict[str, torch.Tensor] = {}

        def value(k: Any) -> Any:
            if isinstance(k, FoldedRef):
                return values[k.name]
            if isinstance(k, InputSize):
                return self.sizes[k.index][k.dim]
            if isinstance(k, SizeArithmetic):
                return SCALAR_OPS[k.op](*resolve(k.args))
            return k

        def resolve(kid: Any) -> Any:
            return fx.node.map_aggregate(kid, value)

        for name, (op, kids) in self.recipes.items():
            if op == CALL:
                target, args, kwargs = kids
                values[name] = target(*resolve(args), **resolve(kwargs))
            else:
                values[name] = SPECS[op].run([resolve(k) for k in kids])
            if name not in self.outputs:
                continue
            if name in self._buffers:
                self._buffers[name] = values[name]
            else:
                self.register_buffer(name, values[name], persistent=False)


def _reads_size(kid: Any) -> bool:
    """Whether a recipe's parameter value reads an input's size."""
    leaves: list = []
    fx.node.map_aggregate(kid, leaves.append)
    return any(isinstance(v, (InputSize, SizeArithmetic)) for v in leaves)


def hold_folded(holder: nn.Module, graph: fx.Graph, foldable: Any, folded: dict,
                sized_inputs: list) -> None:
    """Give ``holder`` an emitted program's ``folded`` recipes, as a
    :class:`FoldedConstants` its ``graph`` calls (with the ``sized_inputs`` whose sizes
    they read) before anything reads them; the ``foldable`` nodes (parameters a folded
    value was made from, folded values inside a larger one, emitted before the op that
    folded them) that nothing uses are dropped."""
    for node in reversed(list(graph.nodes)):
        if node in foldable and not node.users:
            graph.erase_node(node)
    if not folded:
        return
    read = {n.target.partition(".")[2] for n in graph.nodes
            if n.op == "get_attr" and n.target.startswith("folded_constants.")}
    holder.folded_constants = FoldedConstants(folded, read)
    # (after the exported source's guards: a folded value may read a size they check)
    first = next(n for n in graph.nodes
                 if n.op != "placeholder" and n.target is not check_guards)
    with graph.inserting_before(first):
        graph.call_module("folded_constants", tuple(sized_inputs))


def share_folded(module: nn.Module, pool: dict) -> int:
    """:meth:`FoldedConstants.share` for an emitted ``module`` (one without folded
    constants lets nothing go): programs of one e-graph built one after another hold one
    copy of each constant they fold alike.

    >>> w = nn.Parameter(torch.ones(2))
    >>> a, b = nn.Module(), nn.Module()
    >>> a.folded_constants = FoldedConstants({"folded_0": ("cat", [0, w, w])})
    >>> b.folded_constants = FoldedConstants({"folded_0": ("cat", [0, w, w])})
    >>> pool = {}
    >>> share_folded(a, pool), share_folded(b, pool), share_folded(nn.Module(), pool)
    (0, 16, 0)
    """
    folded = getattr(module, "folded_constants", None)
    return folded.share(pool) if isinstance(folded, FoldedConstants) else 0
