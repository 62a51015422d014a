"""Emission: the extracted program becomes a new torch.fx.GraphModule.

The chosen DAG is walked in dependency order and each chosen e-node becomes one FX node
calling an ordinary torch function, so ``print(gm.code)`` reads like hand-written code.
The signature (placeholders, in order), the output structure and the parameters (same
state_dict keys, same tensors) are those of the source; opaque calls are replayed as they
were, in their original order. The source module is never mutated.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) + torch.exp(x))
>>> opt = EGraph.from_fx(gm, (torch.randn(3),)).extract(AstSize())
>>> print(opt.code.strip().splitlines()[-2].strip())
add = torch.add(exp, exp);  exp = None
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.fx.immutable_collections import immutable_dict, immutable_list

from backends.sizes import (
    check_guards,
    dispatch_sizes_of,
    explain_sizes,
    explain_sizes_of,
    general_of,
    require_guards,
)
from egraph.dims import is_symbolic
from egraph.ops.table import TABLE
from egraph.term import is_literal_op
from frontends.fx.analysis import SCALAR_OPS, literal_value
from frontends.fx.effects import aten_name, is_in_place, recorded_value
from frontends.fx.exported import attribute_at, owner_of
from frontends.fx.ingest import (
    SHAPE_PARAMS,
    AttributeRef,
    ClassRef,
    ContiguousRef,
    FxSource,
    OutputRef,
    WrittenRef,
)
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from backends.triton.regions import Fusion
    from egraph.egraph import EGraph
    from extractors.costs import Roofline

_NOT_FOLDED = {"leaf", "shape", "opaque"}
"""Op kinds never folded: leaves are what is folded from, shapes and opaque calls are not
tensor arithmetic. A view of a parameter folds (sharing its storage) so that what is made
of it folds too: conv-bn's ``weight * scale.reshape(-1, 1, 1, 1)``; so does a creation op
shaped like one (``zeros_like``), while one with no parameter (``full``) does not."""

_ALLOCATIONS = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like",
                          "empty_like", "full_like", "new_zeros", "new_ones", "new_empty",
                          "new_full", "clone"})
"""Calls whose result is a new tensor, sharing storage with nothing: an in-place update of
one that nothing else reads may write into it (:func:`_update_in_place`)."""

_STRIDING = {"transpose", "t", "permute", "expand", "getitem", "split", "chunk"}
"""View ops whose result may not be contiguous though their operand is."""
_ORDER_KEEPING = {"detach", "flatten", "identity", "reshape", "squeeze", "unsqueeze", "to"}
"""View ops (and casts) that keep a strided operand's dims in row-major order."""

TARGETS = ("cpu", "cuda")
"""What emission targets: ``cpu`` (eager torch ops), ``cuda`` (fusion regions as Triton
kernels, which run as eager torch ops on CPU tensors)."""


def _plain_matmul(a: tuple | None, b: tuple | None):
    """``torch.mm`` for a product of matrices, ``torch.bmm`` for batches of matrices of the
    same batch size, else None (``torch.matmul``). matmul reaches the same kernel through
    reshapes and views: 10 us a call on the CPU, 0.3 ms of a small GPT-2's training step.

    >>> _plain_matmul((4, 3), (3, 2)) is torch.mm, _plain_matmul((2, 4, 3), (3, 2))
    (True, None)
    """
    if a is None or b is None:
        return None
    if len(a) == len(b) == 2:
        return torch.mm
    if len(a) == len(b) == 3 and type(a[0]) is int and a[0] == b[0] and a[0] != 1:
        return torch.bmm
    return None


class _Folded:
    """A reference to another folded value inside a folded value's recipe."""

    def __init__(self, name: str):
        self.name = name


class _Size:
    """A size of an input inside a folded value's recipe: dim ``dim`` of the ``index``-th
    tensor the program hands :class:`FoldedConstants` (a symbolic program's
    ``x.size(1)``)."""

    def __init__(self, index: int, dim: int):
        self.index, self.dim = index, dim

    def __repr__(self) -> str:
        return f"inputs[{self.index}].size({self.dim})"


class _Scalar:
    """Size arithmetic inside a folded value's recipe: :data:`SCALAR_OPS` ``op`` over
    sizes, other such arithmetic and numbers (``T - 1``)."""

    def __init__(self, op: str, args: tuple):
        self.op, self.args = op, args

    def __repr__(self) -> str:
        return f"{self.op}{self.args!r}"


def _recipe_value(value: Any, inside: Any) -> Any:
    """``value`` with every FX node in it (nested in tuples, lists, dicts and slices too)
    replaced by what ``inside`` maps it to: a source tensor, :class:`_Folded`,
    :class:`_Size` or :class:`_Scalar`."""
    return fx.node.map_aggregate(value, lambda v: inside[v] if isinstance(v, fx.Node) else v)


CALL = "call"
"""The op of a folded recipe that calls a torch operator outside the op table (a call
ingest kept opaque): its parameters are the operator, its args and its kwargs."""


def _foldable_call(target: Any) -> bool:
    """Whether an opaque call of ``target`` may be computed once for given operands: an
    ATen operator that is functional and draws no random numbers (``aten.cumsum``,
    ``aten.diff``; not ``aten.rand``, ``aten.add_``, nor a Python function)."""
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


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
    (op, the op's canonical parameter values: source tensors, literals, :class:`_Folded`,
    :class:`_Size`, :class:`_Scalar`), in dependency order; ``outputs``: the names the
    program reads (default: every one).

    >>> w = nn.Parameter(torch.ones(2, 3))
    >>> folded = FoldedConstants({"folded_0": ("cat", [0, w, w])})
    >>> first = folded.folded_0
    >>> with torch.no_grad():
    ...     folded.refresh()
    >>> first.shape, folded.folded_0 is first
    (torch.Size([4, 3]), True)

    A value made from a size is remade when the size changes:

    >>> t = _Size(0, 1)  # (dim 1 of the first input the program hands it)
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

    def __getstate__(self) -> dict:
        # Copies and pickles hold detached values, recomputed on their first call.
        state = self.__dict__.copy()
        state["_buffers"] = {k: v.detach() for k, v in self._buffers.items()}
        state["key"] = None
        return state

    def _compute(self) -> None:
        values: dict[str, torch.Tensor] = {}

        def value(k: Any) -> Any:
            if isinstance(k, _Folded):
                return values[k.name]
            if isinstance(k, _Size):
                return self.sizes[k.index][k.dim]
            if isinstance(k, _Scalar):
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
    return any(isinstance(v, (_Size, _Scalar)) for v in leaves)


class _Emitter:
    def __init__(self, egraph: EGraph, choice: dict[int, tuple], fusions: list[Fusion] = ()):
        self.eg = egraph
        self.src: FxSource = egraph.fx
        self.choice = choice
        self.graph = fx.Graph()
        self.values: dict[int, Any] = {}
        self.attrs: dict[str, fx.Node] = {}
        self.constants: dict[str, torch.Tensor] = {}
        # attributes passed by reference (regions of higher-order ops, generators)
        self.referenced: set[str] = set()
        self.find = egraph.find
        # class -> the fused kernel call that computes it (CUDA targets)
        self.fused = {c: f for f in fusions for c in f.members}
        # literal target shapes the program holds (``reshape to (2, 16, 4, 16)``)
        self.baked: list[str] = []
        # parameter and constant nodes -> their tensors, folded nodes -> their names, the
        # inputs' sizes and arithmetic of them -> what computes them from the inputs
        self.foldable: dict[fx.Node, torch.Tensor | _Folded | _Size | _Scalar] = {}
        # the inputs whose sizes folded values read, in the order the call is given them
        self.sized_inputs: list[fx.Node] = []
        self.folded: dict[str, tuple[str, list]] = {}
        # nodes whose storage is a folded buffer (not a parameter's): one tensor shared by
        # every call, which an output must not hand to the caller
        self.in_buffer: set[fx.Node] = set()
        # nodes that may share storage with an input, a parameter, a constant or a buffer
        self.shared: set[fx.Node] = set()
        # nodes that may not be contiguous: views that move strides and what is made of
        # them elementwise (a pointwise op keeps its operand's layout, not a broadcast's);
        # of those, the ones whose dims are in row-major order with gaps (a piece of a
        # split), of which a pointwise op makes a contiguous tensor
        self.strided: set[fx.Node] = set()
        self.ordered: set[fx.Node] = set()
        # a view (or a cast that may return its operand) -> the value whose storage it is;
        # and each storage an output returned -> the source node that made that output's
        self.view_of: dict[fx.Node, fx.Node] = {}
        self.returned: dict[fx.Node, str] = {}
        self.broadcast: set[fx.Node] = set()
        # emitted nodes -> the analysis data of their class (shape, dtype)
        self.metas: dict[fx.Node, Any] = {}
        # new tensors (allocations, copies) and the copies made for in-place updates
        self.allocated: set[fx.Node] = set()
        self.copies: set[fx.Node] = set()
        # each class -> the needed classes that read it, and the output classes (made on
        # the first in-place update of an input or parameter)
        self.readers: dict[int, list[int]] | None = None
        self.outputs: set[int] = set()
        self.out_spec: pytree.TreeSpec | None = None  # (a structure FX would not rebuild)

    def run(self) -> fx.Graph:
        src = self.src
        # (an input keeps its default, ``def f(x, scale=2.0)``, and its star, ``*xs``: the
        # signature is the source's)
        given = {n.name: n for n in src.graph_module.graph.nodes if n.op == "placeholder"}
        examples = dict(zip(src.inputs, src.example_inputs or ()))
        for name, cid in zip(src.inputs, src.input_classes):
            source = given.get(name)
            star = source is not None and str(source.target).startswith("*")
            self.values[self.find(cid)] = node = self.graph.placeholder(
                source.target if star else name, default_value=source.args[0]
                if source is not None and source.args else inspect.Signature.empty)
            self.metas[node] = self.eg.data(cid)
            self.shared.add(node)
            if _strided(recorded_value(source) if source is not None else None,
                        examples.get(name)):
                # (an aot graph's saved activation in channels-last: a clone the source
                # made contiguous for an aten kernel is given back where it was dropped)
                self.strided.add(node)
        for effect in src.effects:
            self.value(effect)
        out = src.output
        if not _rebuilt_alike(out):  # (the graph returns the leaves, its code the structure)
            leaves, self.out_spec = pytree.tree_flatten(out)
            out = tuple(leaves)
        self.graph.output(fx.node.map_aggregate(out, lambda a: self.output_value(a)
                                                if isinstance(a, ClassRef) else a))
        return self.graph

    def output_value(self, ref: ClassRef) -> Any:
        """The value of an output, as the source's was beyond its value: a new tensor where
        the source made one (the rewrites ``x * 1 -> x`` and ``x.clone() -> x`` would hand
        the caller its own input, to be written through), never a folded buffer
        (:meth:`unshared`), contiguous where the source's was (``x.t().contiguous() ->
        x.t()`` would break the caller's ``view``), and a tensor of its own for each tensor
        the source made (two ``zeros_like(x)`` are one class; normflows' spline writes into
        each by masks)."""
        value = self.value(ref.cid)
        # (a kernel's outputs have no meta of their own: their class's tells)
        meta = self.metas.get(value) or self.eg.data(ref.cid)
        if not isinstance(value, fx.Node) or getattr(meta, "kind", None) != "tensor":
            return value
        fresh = isinstance(ref, OutputRef) and ref.fresh
        contiguous = isinstance(ref, OutputRef) and bool(ref.contiguous)
        if fresh and value in self.shared:
            return self.copy(value, contiguous)
        if fresh and self.returned.setdefault(self.view_of.get(value, value), ref.maker) != (
                ref.maker):
            return self.copy(value, contiguous)  # one tensor for two the source made
        value = self.unshared(value, contiguous)
        if contiguous and value in self.strided:
            return self.graph.call_method("contiguous", (value,))
        return value

    def unshared(self, value: Any, contiguous: bool = False) -> Any:
        """``value``, or a copy where it lives in a folded buffer or constant, for code that
        may write into it (the caller, given an output; an opaque call that is not
        functional: T5's ``relative_buckets += ...`` is ``aten.add_`` on what becomes a
        constant once its ``arange`` folds). The source makes a new tensor on every call
        (``w * 2``); the buffer is one tensor for all calls, and a write into it would
        change what later calls compute."""
        return self.copy(value, contiguous) if value in self.in_buffer else value

    def copy(self, value: fx.Node, contiguous: bool) -> fx.Node:
        """A new tensor of ``value``: contiguous, or in ``value``'s own layout."""
        layout = torch.contiguous_format if contiguous else torch.preserve_format
        copy = self.graph.call_function(torch.clone, (value,), {"memory_format": layout})
        self.allocated.add(copy)
        return copy

    def value(self, cid: int) -> Any:
        """The FX node or Python value of class ``cid``, emitting its sub-DAG first."""
        root = self.find(cid)
        stack = [root]
        while stack:
            c = stack[-1]
            if c in self.values:
                stack.pop()
                continue
            fusion = self.fused.get(c)
            if fusion is not None:
                missing = [k for k in fusion.inputs if self.find(k) not in self.values]
                if missing:
                    stack.extend(reversed(missing))
                    continue
                stack.pop()
                self.call_kernel(fusion)
                continue
            node = self.choice[c]
            missing = [k for k in map(self.find, node[1:]) if k not in self.values]
            if missing:
                stack.extend(reversed(missing))
                continue
            stack.pop()
            self.values[c] = value = self.emit(node, self.eg.data(c))
            if isinstance(value, fx.Node):
                self.metas[value] = self.eg.data(c)
                self.note_storage(node[0], [self.values[self.find(k)] for k in node[1:]],
                                  value)
        return self.values[root]

    def emit(self, node: tuple, meta: Any) -> Any:
        op = node[0]
        kids = [self.values[self.find(k)] for k in node[1:]]
        if meta is not None and meta.kind == "scalar" and op in SCALAR_OPS:
            # shape arithmetic on Python numbers: operator/math, not torch
            call = self.graph.call_function(SCALAR_OPS[op], tuple(kids))
            if all(k in self.foldable and isinstance(self.foldable[k], (_Size, _Scalar))
                   for k in kids if isinstance(k, fx.Node)):
                self.foldable[call] = _Scalar(op, tuple(_recipe_value(kids, self.foldable)))
            return call
        if is_literal_op(op):
            return literal_value(op)
        if op == "tuple":
            return tuple(kids)
        if op == "slice":
            return slice(*kids)
        if op == "input":
            raise KeyError(f"input {kids[0]!r} is not a placeholder of the source graph")
        if op == "param":
            node = self.attr(kids[0])
            self.foldable[node] = attribute_at(self.src.module, kids[0])
            return node
        if op == "const":
            self.constants[kids[0]] = self.src.constants[kids[0]]
            node = self.attr(kids[0])
            self.foldable[node] = self.constants[kids[0]]
            # a constant ingest folded (``arange(8)``) is one tensor for every call, where
            # the source made a new one each time
            self.in_buffer.add(node)
            return node
        if op == "opaque":
            return self.replay(kids[0], meta)
        spec = SPECS[op]
        folded = self.fold(op, kids, meta)
        if folded is not None:
            return folded
        if op in ("add", "mul") and isinstance(kids[0], (int, float)) and isinstance(
                kids[1], fx.Node):
            # tensor first: torch.mul(3e12, half_tensor) rounds 3e12 to float16 (inf) before
            # multiplying, torch.mul(half_tensor, 3e12) computes in float32 as x * 3e12 does
            kids = [kids[1], kids[0]]
        if op in SHAPE_PARAMS:
            shape = kids[SHAPE_PARAMS[op]]
            if isinstance(shape, tuple) and all(type(d) is int for d in shape):
                self.baked.append(f"{op} to {shape}")
        args, kwargs = spec.arguments(kids)
        if op == "split" and isinstance(kids[1], tuple):
            # torch.split is a Python wrapper over this call, 5 us slower on the CPU
            return self.graph.call_function(torch.split_with_sizes, (kids[0], list(kids[1]),
                                                                     kids[2]))
        args = spec.numbers_as_tensors(
            args, lambda like, number: self.graph.call_method("new_tensor", (like, number)))
        if op == "matmul":
            plain = _plain_matmul(*(getattr(self.eg.data(k), "shape", None) for k in node[1:]))
            if plain is not None:
                return self.graph.call_function(plain, args, kwargs)
        if op == "size" and isinstance(kids[0], fx.Node) and kids[0].op == "placeholder" \
                and isinstance(kids[1], int):
            return self.input_size(kids[0], kids[1])
        if isinstance(spec.impl, str):
            return self.graph.call_method(spec.impl, args, kwargs)
        return self.graph.call_function(spec.impl, args, kwargs)

    def input_size(self, given: fx.Node, dim: int) -> fx.Node:
        """``given.size(dim)`` of an input, which a folded value may read
        (:class:`_Size`)."""
        call = self.graph.call_method("size", (given, dim))
        if given not in self.sized_inputs:
            self.sized_inputs.append(given)
        self.foldable[call] = _Size(self.sized_inputs.index(given), dim)
        return call

    def fold(self, op: str, kids: list, meta: Any) -> fx.Node | None:
        """An op of parameters, constants, literals and the inputs' sizes, computed once
        (per size) into a buffer rather than per call (:class:`FoldedConstants`); None when
        it depends on an input's values."""
        if op != CALL and TABLE[op].kind in _NOT_FOLDED or getattr(
                meta, "kind", None) != "tensor":
            return None
        nodes = [k for k in kids if isinstance(k, fx.Node)]
        inside: list[fx.Node] = []
        fx.node.map_aggregate(kids, lambda a: inside.append(a) if isinstance(a, fx.Node)
                              else None)
        if not inside or not all(k in self.foldable for k in inside):
            return None
        name = f"folded_{len(self.folded)}"
        self.folded[name] = (op, [_recipe_value(k, self.foldable) for k in kids])
        node = self.graph.get_attr(f"folded_constants.{name}")
        self.foldable[node] = _Folded(name)
        if op == CALL or TABLE[op].kind != "view" or not nodes or nodes[0] in self.in_buffer:
            self.in_buffer.add(node)  # computed into the buffer (a view of a parameter is not)
        return node

    def converts(self, base: Any, value: fx.Node) -> bool:
        """Whether ``value`` is known to hold another dtype than ``base``: a cast that
        makes a tensor of its own (autocast's bfloat16 copy of a weight), never its
        operand."""
        before, after = self.metas.get(base), self.metas.get(value)
        dtypes = getattr(before, "dtype", None), getattr(after, "dtype", None)
        return None not in dtypes and dtypes[0] != dtypes[1]

    def note_storage(self, op: str, kids: list, value: fx.Node) -> None:
        """Record what ``value``, emitted for ``op`` of ``kids``, may share and whether it
        may be strided (:meth:`output_value` reads both)."""
        if value.op == "get_attr":
            self.shared.add(value)
        kind = "opaque" if op == "opaque" else TABLE[op].kind
        base = next((k for k in kids if isinstance(k, fx.Node)), None)
        if kind == "view" or op == "to" and not self.converts(base, value):
            # a view (or a cast that may return its operand) shares its operand's storage
            if base is not None:
                self.view_of[value] = self.view_of.get(base, base)
            for held in (self.in_buffer, self.shared):
                if base in held:
                    held.add(value)
            # an item of a multi-output op's tuple is that op's own output, not a view
            item = op == "getitem" and getattr(self.metas.get(base), "kind", None) == "tuple"
            layout = ("contiguous" if item or op not in _STRIDING
                      else self.view_layout(value, base))
            if base in self.strided:
                keeps_order = item or op in _ORDER_KEEPING or layout != "strided"
                layout = "ordered" if base in self.ordered and keeps_order else "strided"
            if layout != "contiguous":
                self.strided.add(value)
            if layout == "ordered":
                self.ordered.add(value)
        elif kind == "pointwise" and any(
                k in self.strided and k not in self.broadcast and k not in self.ordered
                for k in kids if isinstance(k, fx.Node)):
            self.strided.add(value)
        elif op == "to_layout" or (kind in ("opaque", "library") and not (
                kind == "library" and TABLE[op].contiguous) and any(
                isinstance(a, fx.Node) and a in self.strided for a in value.all_input_nodes)):
            # (it may keep an operand's layout, as it was passed: a convolution of a
            # channels-last input returns channels-last)
            self.strided.add(value)
        if op == "expand":
            self.broadcast.add(value)
        if kind == "creation" and value.op != "get_attr":
            self.allocated.add(value)

    def view_layout(self, view: fx.Node, base: fx.Node) -> str:
        """The layout of ``view`` of a contiguous ``base``: ``"contiguous"`` (``x[:1]``,
        a transpose of a unit dim, a gather ``x[index]``), ``"ordered"`` (row-major with
        gaps: a piece of a split along a later dim, ``x[:, ::2]``) or ``"strided"`` (a
        transpose, or not known), as the same view of meta tensors of the operands'
        sizes says."""
        shape = getattr(self.metas.get(base), "shape", None)
        if shape is None or is_symbolic(shape) or not view.args or view.args[0] is not base:
            return "strided"
        operands = self.on_meta((view.args[1:], view.kwargs))
        if operands is None:
            return "strided"
        (args, kwargs), meta = operands, torch.empty(tuple(shape), device="meta")
        try:
            if view.op == "call_method":
                out = getattr(meta, view.target)(*args, **kwargs)
            else:
                out = view.target(meta, *args, **kwargs)
        except Exception:  # noqa: BLE001 - then it may be strided
            return "strided"
        parts = out if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(p, torch.Tensor) for p in parts):
            return "strided"
        if all(p.is_contiguous() for p in parts):
            return "contiguous"
        return "ordered" if all(_row_major(p) for p in parts) else "strided"

    def on_meta(self, args: Any) -> Any:
        """``args`` with each node a meta tensor of its sizes and dtype (an index tensor),
        or None where a node's are not known."""
        unknown = []

        def meta_of(arg: Any) -> Any:
            if not isinstance(arg, fx.Node):
                return arg
            data = self.metas.get(arg)
            shape = getattr(data, "shape", None)
            if (getattr(data, "kind", None) != "tensor" or shape is None
                    or is_symbolic(shape) or not isinstance(data.dtype, torch.dtype)):
                unknown.append(arg)
                return arg
            return torch.empty(tuple(shape), dtype=data.dtype, device="meta")
        converted = fx.node.map_aggregate(args, meta_of)
        return None if unknown else converted

    def call_kernel(self, fusion: Fusion) -> None:
        """One call of a fused kernel; its outputs become the values of their classes."""
        args = tuple(self.values[self.find(k)] for k in fusion.inputs)
        names = [self.choice[c][0] for c in fusion.outputs]
        if len(names) == 1:
            self.values[fusion.outputs[0]] = self.graph.create_node(
                "call_function", fusion.kernel, args, name=names[0])
            return
        call = self.graph.create_node("call_function", fusion.kernel, args,
                                      name=fusion.kernel.spec.name)
        for i, (c, name) in enumerate(zip(fusion.outputs, names)):
            self.values[c] = self.graph.create_node("call_function", operator.getitem,
                                                    (call, i), name=name)

    def attr(self, name: str) -> fx.Node:
        node = self.attrs.get(name)
        if node is None:
            node = self.attrs[name] = self.graph.get_attr(name)
        return node

    def replay(self, token: str, meta: Any = None) -> fx.Node:
        call = self.src.opaque[token]
        kept = self.read_before_update(call.updates, token) if call.updates is not None else ()
        written: list[fx.Node] = []

        def resolve(a):
            if isinstance(a, AttributeRef):
                self.referenced.add(a.target)
                return self.attr(a.target)
            if isinstance(a, ClassRef):
                value = self.values[self.find(a.cid)]
                if isinstance(a, WrittenRef):
                    written.append(self.copy(value, contiguous=False))
                    self.copies.add(written[-1])
                    return written[-1]
                if isinstance(a, ContiguousRef) and value in self.strided:
                    return self.graph.call_method("contiguous", (value,))
                return value if call.pure else self.unshared(value)
            return a

        args = fx.node.map_aggregate(call.args, resolve)
        kwargs = fx.node.map_aggregate(call.kwargs, resolve)
        for old in kept:  # (the call itself writes into the tensor, later reads the copy)
            value = self.values[old]
            self.values[old] = copy = self.copy(value, contiguous=False)
            self.metas[copy] = self.metas.get(value)
            if value in self.strided:
                self.strided.add(copy)
        if (call.op == "call_function" and call.pure and call.updates is None
                and _foldable_call(call.target)):
            folded = self.fold(CALL, [call.target, args, kwargs], meta)
            if folded is not None:
                return folded
        node = self.graph.create_node(call.op, call.target, args, kwargs)
        if call.updates is not None:  # (it returns the caller's tensor it updated)
            self.shared.add(node)
            if call.target in (operator.setitem, "__setitem__"):
                # ``x[i] = v`` returns nothing: later reads read ``x[...]``, the whole of
                # ``x`` after the call (not ``x`` itself, whose values may be folded)
                node = self.graph.call_function(operator.getitem, (args[0], Ellipsis))
                self.shared.add(node)
        if written or aten_name(node) in _ALLOCATIONS:
            # (an in-place update returns the copy it wrote into)
            self.allocated.add(node)
        return node

    def read_before_update(self, leaf: int, token: str) -> list[int]:
        """Emit now every class the program needs that reads the value of ``leaf`` (an
        input or parameter that the call ``token`` is about to update in place), directly
        or through views of it: the source read it before the update (``m = x * b;
        b.copy_(y)``, as Rprop's foreach step reads its previous gradients, then
        overwrites them), and emitted lazily after it, the read would see the new values.
        Returns ``leaf`` and those views where something still reads them afterwards (an
        output: ``a = b.clone(); b.add_(1); return a`` once the clone is dropped; a later
        call with effects): their values must be copied before the update."""
        readers, outputs = self._readers()
        pending, seen, kept = [self.find(leaf)], {self.find(leaf)}, []
        while pending:
            old = pending.pop()
            later = [r for r in readers.get(old, ()) if not self._is_call(r, token)]
            for reader in later:
                if reader in seen:
                    continue
                seen.add(reader)
                op = self.choice[reader][0]
                if op == "to" or getattr(TABLE.get(op), "kind", None) == "view":
                    pending.append(reader)  # (a view of it, or a cast that may return it)
                if reader not in self.values and not self._waits_for_an_effect(reader):
                    self.value(reader)
            if old in self.values and (old in outputs or any(
                    r not in self.values for r in later)):
                kept.append(old)
        return kept

    def _is_call(self, cid: int, token: str) -> bool:
        node = self.choice[cid]
        return node[0] == "opaque" and self._token(node) == token

    def _readers(self) -> tuple[dict[int, list[int]], set[int]]:
        """Each class -> the classes the program needs whose chosen e-node reads it; and
        the classes of the outputs."""
        if self.readers is None:
            self.readers = {}
            outputs: list[int] = []
            fx.node.map_aggregate(self.src.output, lambda a: outputs.append(self.find(a.cid))
                                  if isinstance(a, ClassRef) else None)
            self.outputs = set(outputs)
            seen: set[int] = set()
            stack = [*map(self.find, self.src.effects), *outputs]
            while stack:
                c = stack.pop()
                if c in seen:
                    continue
                seen.add(c)
                for kid in map(self.find, self.choice[c][1:]):
                    self.readers.setdefault(kid, []).append(c)
                    stack.append(kid)
        return self.readers, self.outputs

    def _waits_for_an_effect(self, cid: int) -> bool:
        """Whether emitting ``cid`` would emit a call with effects not emitted yet."""
        stack, seen = [cid], {cid}
        while stack:
            c = stack.pop()
            if c in self.values:
                continue
            node = self.choice[c]
            if node[0] == "opaque" and not self.src.opaque[self._token(node)].pure:
                return True
            for kid in map(self.find, node[1:]):
                if kid not in seen:
                    seen.add(kid)
                    stack.append(kid)
        return False

    def _token(self, node: tuple) -> str:
        """The token of an opaque e-node (its first child, a literal)."""
        return literal_value(self.choice[self.find(node[1])][0])


def _set_path(root: nn.Module, path: str, value: torch.Tensor, buffer: bool) -> None:
    module, leaf = owner_of(root, path)
    if hasattr(module, leaf):
        return
    if isinstance(value, nn.Parameter):
        module.register_parameter(leaf, value)
    elif buffer:
        module.register_buffer(leaf, value)
    else:
        setattr(module, leaf, value)


def build_module(egraph: EGraph, choice: dict[int, tuple], target: str = "cpu",
                 judge: Roofline | None = None) -> fx.GraphModule:
    """The GraphModule of a choice (class -> chosen e-node) over an e-graph from FX.

    ``target="cuda"`` emits the fusion regions as Triton kernel calls
    (:mod:`backends.triton`): those ``judge`` (a Roofline model) says pay, or every region
    that lowers when no judge is given; their kernels are in ``gm.meta["triton_kernels"]``.

    >>> from egraph import EGraph
    >>> from egraph.extract import source_program
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(3),))
    >>> print(build_module(eg, source_program(eg)).code.strip().splitlines()[-2].strip())
    mul = torch.mul(exp, 2);  exp = None
    >>> list(build_module(eg, source_program(eg), target="cuda").meta["triton_kernels"])
    ... # doctest: +ELLIPSIS
    ['fused_exp_mul_...']
    """
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: use one of {', '.join(map(repr, TARGETS))}")
    fusions: list[Fusion] = []
    if target == "cuda":
        from backends.triton.regions import plan

        fusions = plan(egraph, choice, judge)
    emitter = _Emitter(egraph, choice, fusions)
    graph = emitter.run()
    if fusions:
        from backends.triton.emit import KernelNames

        graph.set_codegen(KernelNames())
    if emitter.out_spec is not None:
        _take_structures(graph, out_spec=emitter.out_spec)
    src = egraph.fx
    explanation = explain_sizes(graph, egraph, emitter.baked) if emitter.baked else None
    if src.guards is not None:
        require_guards(graph, src.guards)
    _bias_into_matmul(graph, emitter.metas)
    _update_in_place(graph, emitter.copies, emitter.allocated)
    _arithmetic_into_update(graph, emitter.metas, emitter.view_of)
    _scale_into_add(graph, emitter.metas)
    _lerp_into_update(graph, emitter.metas)
    holder = nn.Module()
    # The parameters a folded value was made from, and the folded values inside a larger
    # one, were emitted before the op that folded them: drop the ones nothing uses.
    for node in reversed(list(graph.nodes)):
        if node in emitter.foldable and not node.users:
            graph.erase_node(node)
    if emitter.folded:
        read = {n.target.partition(".")[2] for n in graph.nodes
                if n.op == "get_attr" and n.target.startswith("folded_constants.")}
        holder.folded_constants = FoldedConstants(emitter.folded, read)
        # Before anything reads them, the folded values are brought up to date (after the
        # exported source's guards: a folded value may read a size they check).
        first = next(n for n in graph.nodes
                     if n.op != "placeholder" and n.target is not check_guards)
        with graph.inserting_before(first):
            graph.call_module("folded_constants", tuple(emitter.sized_inputs))
    for name in emitter.attrs:
        if name in emitter.referenced:
            owner, leaf = owner_of(holder, name)
            value = attribute_at(src.graph_module, name)
            if isinstance(value, nn.Module):
                owner.add_module(leaf, value)
            else:
                setattr(owner, leaf, value)
        elif name in emitter.constants:
            _set_path(holder, name, emitter.constants[name], buffer=True)
        else:
            _set_path(holder, name, attribute_at(src.module, name), buffer=True)
    for call in src.opaque.values():
        if call.op == "call_module" and any(
                n.op == "call_module" and n.target == call.target for n in graph.nodes):
            owner, leaf = owner_of(holder, call.target)
            owner.add_module(leaf, src.module.get_submodule(call.target))
    graph.lint()
    gm = fx.GraphModule(holder, graph, class_name=type(src.module).__name__ + "Optimized")
    # Every parameter and buffer of the source, used or not, so checkpoints still load;
    # folded constants are not state.
    for name, value in src.module.state_dict(keep_vars=True).items():
        _set_path(gm, name, value, buffer=not isinstance(value, nn.Parameter))
    for name, value in emitter.constants.items():
        gm.register_buffer(name, value, persistent=False)
    if fusions:
        gm.meta["triton_kernels"] = {f.kernel.__name__: f.kernel for f in fusions}
    if explanation is not None:
        gm.meta["egraph_sizes_explained"] = explanation
    return gm


_SAVED_META = ("egraph_report", "egraph_sizes_explained", "egraph_general", "egraph_dispatch",
               "egraph_built_shapes")
"""What a saved emitted module keeps of its ``meta`` (torch.fx keeps none of it): the
extraction's report, and how its code explains sizes it was not built for."""


def keep_meta_when_saved(gm: fx.GraphModule) -> None:
    """Make a pickled ``gm`` (``torch.save``) load with the entries of its ``meta`` in
    :data:`_SAVED_META`, and with its code explaining sizes as before. torch.fx saves
    a GraphModule as its code and traces that again on load, so ``meta`` and the code's
    transforms would be lost. (Each GraphModule has a class of its own: this changes
    ``gm``'s alone.)"""
    def reduce(self):
        if "egraph_dispatch" in self.meta:
            general_of(self)  # (saved made: what makes it is not saved)
        rebuild, args = fx.GraphModule.__reduce__(self)
        kept = {key: self.meta[key] for key in _SAVED_META if key in self.meta}
        return _loaded_with_meta, (rebuild, args, kept, getattr(self, "_out_spec", None))

    type(gm).__reduce__ = reduce


def _loaded_with_meta(rebuild, args: tuple, meta: dict, out_spec: Any = None
                      ) -> fx.GraphModule:
    gm = rebuild(*args)
    gm.meta.update(meta)
    if out_spec is not None:  # (tracing the saved code again made the structure a dict)
        output = gm.graph.output_node()
        output.args = (tuple(pytree.tree_leaves(output.args[0])),)
        _take_structures(gm.graph, out_spec=out_spec)
        gm.recompile()
    if "egraph_sizes_explained" in meta:
        explain_sizes_of(gm.graph, *meta["egraph_sizes_explained"])
        gm.recompile()
    if "egraph_dispatch" in meta:
        dispatch_sizes_of(gm.graph, *meta["egraph_dispatch"])
        gm.recompile()
    keep_meta_when_saved(gm)
    return gm


def take_structured_inputs(gm: fx.GraphModule, structure: tuple[list[str], Any]) -> None:
    """Make the emitted ``gm`` take its source's arguments (``structure``: their names and
    the spec whose leaves are the graph's inputs, :func:`frontends.fx.exported.
    input_structure`) in place of their leaves, as torch's unlifted module does: a
    ``forward(self, d)`` for ``d = {"a": x, "b": y}``, not ``forward(self, d_a, d_b)``."""
    _take_structures(gm.graph, *structure)
    gm.recompile()


class _Structures(_PyTreeCodeGen):
    """torch.fx's code for structured arguments and results (that of torch's unlifted
    module), where the arguments may be the graph's own placeholders (no input spec)."""

    def process_inputs(self, *inputs: Any) -> Any:
        return inputs if self.pytree_info.in_spec is None else super().process_inputs(*inputs)

    def gen_fn_def(self, free_vars: list[str], maybe_return_annotation: str, *,
                   expanded_def: bool = False) -> str:
        if self.pytree_info.in_spec is None:
            return fx.graph.CodeGen.gen_fn_def(self, free_vars, maybe_return_annotation,
                                               expanded_def=expanded_def)
        return super().gen_fn_def(free_vars, maybe_return_annotation,
                                  expanded_def=expanded_def)


def _take_structures(graph: fx.Graph, names: list[str] | None = None, in_spec: Any = None,
                     out_spec: Any = None) -> None:
    """Make ``graph``'s code take structured arguments (``names``, ``in_spec``) or rebuild
    a structured result from its flat outputs (``out_spec``), keeping what its code did
    before: the other of the two, the names of fused kernels, the explanation of sizes."""
    codegen = graph._codegen
    before = getattr(codegen, "pytree_info", None)
    if before is not None:
        if in_spec is None:
            names, in_spec = before.orig_args, before.in_spec
        out_spec = out_spec or before.out_spec
        kind = type(codegen)
    elif type(codegen) is fx.graph.CodeGen:
        kind = _Structures
    else:  # (fused kernels named by their own code generation)
        kind = type(f"{type(codegen).__name__}OfStructures", (type(codegen), _Structures), {})
    structured = kind(_PyTreeInfo(list(names or ()), in_spec, out_spec))
    structured._body_transformer = codegen._body_transformer  # (explain_sizes's)
    graph.set_codegen(structured)


def _rebuilt_alike(structure: Any) -> bool:
    """Whether an output written into an FX graph as it is comes back as the same
    structure: plain tuples, lists and dicts and named tuples do; a dict of another class
    (transformers' ``ModelOutput``, an ``OrderedDict``) comes back a plain dict, and a
    structure pytree knows of (a registered dataclass) does not come back at all."""
    if isinstance(structure, (tuple, list)):
        return ((type(structure) in (tuple, list, immutable_list) or hasattr(structure, "_fields"))
                and all(map(_rebuilt_alike, structure)))
    if isinstance(structure, dict):
        return (type(structure) in (dict, immutable_dict)
                and all(map(_rebuilt_alike, structure.values())))
    return structure is None or pytree.tree_is_leaf(structure)


def _row_major(t: torch.Tensor) -> bool:
    """Whether ``t``'s dims (those of more than one element) have strictly decreasing
    strides: a pointwise op of it allocates a contiguous result (TensorIterator keeps
    its operands' dim order, which is then row-major)."""
    strides = [st for st, n in zip(t.stride(), t.shape) if n > 1]
    return all(st > 0 for st in strides) and all(a > b for a, b in zip(strides, strides[1:]))


def make_outputs_contiguous(gm: fx.GraphModule, indices: tuple[int, ...]) -> None:
    """Make the outputs at ``indices`` (of the flattened output structure) contiguous, in
    place: validation's repair for an output the source returned contiguous where ours is
    a strided result (sdpa on a transposed query returns one), which emission's view
    tracking cannot see.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x.t(), x + 1))
    >>> make_outputs_contiguous(gm, (0,))
    >>> gm(torch.randn(2, 3))[0].is_contiguous()
    True
    """
    if not indices:
        return
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    wanted, position = set(indices), iter(range(1 << 62))

    def repaired(arg):
        if next(position) in wanted and isinstance(arg, fx.Node):
            with graph.inserting_before(output):
                return graph.call_method("contiguous", (arg,))
        return arg

    output.args = (fx.node.map_aggregate(output.args[0], repaired),)
    gm.recompile()


def _strided(*values: Any) -> bool:
    """Whether the first tensor among ``values`` (an input's recorded value, its example)
    is known not to be contiguous.

    >>> _strided(None, torch.empty(3, 2).t()), _strided(torch.empty(2, 3))
    (True, False)
    """
    for value in values:
        if isinstance(value, torch.Tensor):
            try:
                return not value.is_contiguous()
            except Exception:  # noqa: BLE001 - a data-dependent symbolic stride: unknown
                return False
    return False


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without growing it (symbolic
    sizes compared as expressions, never by the example's value)."""
    return len(shape) <= len(target) and all(
        d == 1 or d == t for d, t in zip(reversed(shape), reversed(target)))


def _update_in_place(graph: fx.Graph, copies: set[fx.Node],
                     allocated: set[fx.Node]) -> None:
    """Drop the copy an in-place update writes into where what it copies is a new tensor
    that nothing else reads. Ingest makes each update of a value the graph made on a copy,
    since the value's class may be shared; once emitted, a value read only by the copy
    (PyG's ``x.new_zeros(n, f).scatter_add_(0, index, src)``, an MoE layer's chain of
    ``index_add_`` into ``torch.zeros_like(x)``) is written as the source wrote it, with no
    copy per update. The update's result is the tensor it wrote into: new, when that was."""
    for copy in [n for n in graph.nodes if n in copies]:
        source = copy.args[0]
        if source in allocated and len(source.users) == 1:
            copy.replace_all_uses_with(source)
            graph.erase_node(copy)


def _writes_before(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node -> how many calls before it may write into a tensor they are given (an
    in-place update, a call with ``out=``, a mutating aten op, a submodule's call)."""
    def writes(n: fx.Node) -> bool:
        if n.op == "call_module":
            return True
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            return n.target._schema.is_mutable
        return n.op in ("call_function", "call_method") and (
            is_in_place(n) or "out" in n.kwargs)

    counts, seen = {}, 0
    for n in graph.nodes:
        counts[n] = seen
        seen += writes(n)
    return counts


def _unwritten(writes: dict[fx.Node, int], moved: Sequence[Any], to: fx.Node) -> bool:
    """Whether the reads of the calls ``moved`` may move to ``to``'s place: no call
    between the first of them and ``to`` writes into a tensor (``m = x @ w; w.add_(1);
    m + b`` is not ``addmm(b, x, w)`` after the update)."""
    return all(writes[to] == writes[n] for n in moved if isinstance(n, fx.Node))


def _plain_sums(graph: fx.Graph) -> list[fx.Node]:
    """The ``torch.add(x, y)`` calls of ``graph`` (no ``alpha``), in order."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target is torch.add
            and not n.kwargs and len(n.args) == 2]


def _bias_into_matmul(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``add(matmul(a, b), c)`` of 2-D floating matrices, where nothing else reads the
    product, as ``torch.addmm(c, a, b)``: the canonical vocabulary spells ``addmm`` (GPT-2's
    Conv1D) as a product and a sum, but one GEMM with the bias in its accumulator is faster
    in eager torch, and Inductor keeps it one library call instead of a GEMM and a sum.
    Scaled terms, ``matmul(a, b) * alpha + c * beta`` (Muon's Newton-Schulz step, in
    bfloat16), become ``addmm``'s ``alpha`` and ``beta``: one rounding of the sum where
    the terms rounded three times more."""
    def fits(product: fx.Node, bias: Any, total: fx.Node) -> bool:
        if not (isinstance(bias, fx.Node) and isinstance(product, fx.Node)
                and bias is not product  # p + p reads the product twice
                and product.op == "call_function" and product.target in (torch.matmul, torch.mm)
                and len(product.users) == 1 and not product.kwargs):
            return False
        described = [metas.get(n) for n in (*product.args, bias, total)]
        if any(getattr(m, "kind", None) != "tensor" or m.shape is None for m in described):
            return False
        a, b, c, out = described
        return (len(a.shape) == len(b.shape) == 2 and len(c.shape) <= 2
                and out.shape == (a.shape[0], b.shape[1])
                and _broadcasts_to(c.shape, out.shape)
                and a.dtype == b.dtype == c.dtype == out.dtype and out.dtype.is_floating_point)

    writes = _writes_before(graph)
    for node in _plain_sums(graph):
        for product_term, bias_term in (node.args, node.args[::-1]):
            (product, alpha), (bias, beta) = _scaled(product_term), _scaled(bias_term)
            moved = [product_term, product] + ([bias_term] if bias_term is not bias else [])
            if fits(product, bias, node) and _unwritten(writes, moved, node):
                scales = {k: v for k, v in (("beta", beta), ("alpha", alpha)) if v != 1}
                with graph.inserting_before(node):
                    fused = graph.call_function(torch.addmm, (bias, *product.args), scales)
                metas[fused] = metas[node]  # (a later sum may read it: Muon's next step)
                writes[fused] = writes[node]
                node.replace_all_uses_with(fused)
                graph.erase_node(node)
                for term in dict.fromkeys((product_term, product, bias_term)):
                    if term is not bias:
                        graph.erase_node(term)
                break


def _binary_call(node: Any, targets: Any, users: int = 1) -> bool:
    """Whether ``node`` calls one of ``targets`` (a function or a collection of them) on
    two arguments, without keywords, and ``users`` calls read it: a call an emission
    fusion may replace."""
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and (node.target in targets if isinstance(targets, (tuple, dict))
                 else node.target is targets)
            and len(node.args) == 2 and not node.kwargs and len(node.users) == users)


def _scaled(term: Any) -> tuple[Any, float]:
    """``(x, s)`` for ``term = x * s`` with ``s`` a number and nothing else reading the
    product, else ``(term, 1)``."""
    if _binary_call(term, torch.mul):
        x, s = term.args
        if not isinstance(x, fx.Node):
            x, s = s, x
        # (not 0: addmm ignores its input where beta is 0, where x * 0 is NaN at inf)
        if isinstance(x, fx.Node) and isinstance(s, (int, float)) and not isinstance(
                s, bool) and s != 0 and math.isfinite(s):
            return x, s
    return term, 1


_IN_PLACE_TWINS = {torch.add: "add_", torch.mul: "mul_", torch.sub: "sub_", torch.div: "div_"}
"""Arithmetic with an in-place method of the same computation (same rounding: one op)."""


def _is_copy_into(node: fx.Node) -> bool:
    """``dst.copy_(src)`` as a method or an aten call, with no other argument."""
    return len(node.args) == 2 and not node.kwargs and (
        (node.op == "call_method" and node.target == "copy_")
        or (node.op == "call_function" and node.target is torch.ops.aten.copy_.default))


def _arithmetic_into_update(graph: fx.Graph, metas: dict[fx.Node, Any],
                            view_of: dict[fx.Node, fx.Node]) -> None:
    """``dst.copy_(op(dst, other))`` where nothing else reads ``op``'s result, as
    ``dst.op_(other)``: how an update in place comes out of a functional graph (dynamo's
    ``fma`` and ``copy_`` for Adam's ``exp_avg_sq.addcmul_``, torch.export's copies into
    mutated buffers). One pass over ``dst`` instead of two, and no new tensor. Only where
    the result has ``dst``'s shape and dtype (no broadcast or promotion for the copy to
    undo) and ``other`` is not another view of ``dst``'s storage (an in-place op refuses
    an operand that partly overlaps what it writes)."""
    writes = _writes_before(graph)
    for copy in [n for n in graph.nodes if _is_copy_into(n)]:
        dst, value = copy.args
        if not _binary_call(value, _IN_PLACE_TWINS):
            continue
        a, other = value.args
        if a is not dst and value.target in (torch.add, torch.mul):
            a, other = other, a
        written, made = metas.get(dst), metas.get(value)
        if a is not dst or getattr(written, "kind", None) != "tensor" or getattr(
                made, "kind", None) != "tensor" or (written.shape, written.dtype) != (
                made.shape, made.dtype):
            continue
        if isinstance(other, fx.Node) and other is not dst and (
                view_of.get(other, other) is view_of.get(dst, dst)):
            continue
        if not _unwritten(writes, [value], copy):
            continue
        with graph.inserting_before(copy):
            update = graph.call_method(_IN_PLACE_TWINS[value.target], (dst, other))
        writes[update] = writes[copy]
        copy.replace_all_uses_with(update)
        graph.erase_node(copy)
        graph.erase_node(value)
        if update.target == "add_":
            _scaled_into_update(graph, metas, update, writes)


def _scaled_into_update(graph: fx.Graph, metas: dict[fx.Node, Any], update: fx.Node,
                        writes: dict[fx.Node, int]) -> None:
    """``dst.add_(a * b * v)`` or ``dst.add_(a / b * v)`` (``v`` a number, ``* v``
    optional) as ``dst.addcmul_(a, b, value=v)`` or ``addcdiv_``, Adam's spelling, and
    ``dst.add_(y * v)`` as ``dst.add_(y, alpha=v)``: one pass where the products made new
    tensors. Only where every product has ``dst``'s dtype (``addcmul_`` computes in it,
    where ``a * b`` of float16 operands rounds to float16 first)."""
    dst, term = update.args
    dtype = metas[dst].dtype
    product, value = _scaled(term)
    if not isinstance(term, fx.Node) or getattr(metas.get(term), "dtype", None) != dtype:
        return
    if _binary_call(product, (torch.mul, torch.div)) and all(
            isinstance(a, fx.Node) for a in product.args) and getattr(
            metas.get(product), "dtype", None) == dtype:
        method = "addcmul_" if product.target is torch.mul else "addcdiv_"
        args, kwargs, made = (dst, *product.args), {"value": value}, [term, product]
    elif product is not term and _fits_alpha(product, value, term, metas):
        method, args, kwargs, made = "add_", (dst, product), {"alpha": value}, [term]
    else:
        return
    if not _unwritten(writes, made, update):
        return
    with graph.inserting_before(update):
        fused = graph.call_method(method, args, {k: v for k, v in kwargs.items() if v != 1})
    update.replace_all_uses_with(fused)
    graph.erase_node(update)
    for node in dict.fromkeys(made):
        graph.erase_node(node)


def _fits_alpha(y: Any, scale: float, scaled: fx.Node, metas: dict[fx.Node, Any]) -> bool:
    """Whether ``y * scale`` (the node ``scaled``) may be ``add``'s ``alpha`` on ``y``:
    a tensor of the product's dtype (no promotion by the scale), and an integer scale for
    an integer tensor (torch refuses a floating alpha there)."""
    meta = metas.get(y) if isinstance(y, fx.Node) else None
    if getattr(meta, "kind", None) != "tensor" or meta.dtype != getattr(
            metas.get(scaled), "dtype", None):
        return False
    return meta.dtype.is_floating_point or meta.dtype.is_complex or type(scale) is int


def _scale_into_add(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``x + y * s`` (``s`` a number, nothing else reading the product) as
    ``torch.add(x, y, alpha=s)``: one pass and no new tensor for the product, one rounding
    where there were two (GPT-2's ``x + 0.044715 * x ** 3``; scores scaled by
    ``1 / sqrt(d)`` plus a mask)."""
    writes = _writes_before(graph)
    for node in _plain_sums(graph):
        for term, other in (node.args, node.args[::-1]):
            y, scale = _scaled(term)
            # (``v + v`` with ``v = y * s``: the sum reads the product twice, it must stay)
            if y is term or other is term or not isinstance(other, fx.Node) or getattr(
                    metas.get(other), "kind", None) != "tensor" or not _fits_alpha(
                    y, scale, term, metas) or not _unwritten(writes, [term], node):
                continue
            with graph.inserting_before(node):
                fused = graph.call_function(torch.add, (other, y), {"alpha": scale})
            metas[fused], writes[fused] = metas.get(node), writes[node]
            node.replace_all_uses_with(fused)
            graph.erase_node(node)
            graph.erase_node(term)
            break


def _lerp_into_update(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``dst.addcmul_(full_like(d, w), d)`` with ``d = end - dst`` (``w`` a number) as
    ``dst.lerp_(end, w)``: dynamo's spelling of ``torch._foreach_lerp_`` (Adam's first
    moment with ``foreach=True``), which made a tensor of ``w`` and the difference, and
    ran three passes where ``lerp_`` runs one. Only where ``end`` has ``dst``'s dtype and
    shape and no call between the difference and the update writes into a tensor."""
    writes = _writes_before(graph)
    for update in [n for n in graph.nodes if n.op == "call_method" and n.target == "addcmul_"
                   and len(n.args) == 3 and not n.kwargs]:
        dst, filled, difference = update.args
        if not (_binary_call(filled, torch.full_like)
                and _binary_call(difference, torch.sub, users=2)
                and filled.args[0] is difference and difference.args[1] is dst
                and isinstance(filled.args[1], (int, float))
                and not isinstance(filled.args[1], bool)):
            continue
        end = difference.args[0]
        written, given = metas.get(dst), metas.get(end) if isinstance(end, fx.Node) else None
        if getattr(written, "kind", None) != "tensor" or getattr(given, "kind", None) != (
                "tensor") or (written.shape, written.dtype) != (given.shape, given.dtype):
            continue
        if not _unwritten(writes, [difference, filled], update):
            continue
        with graph.inserting_before(update):
            fused = graph.call_method("lerp_", (dst, end, filled.args[1]))
        writes[fused] = writes[update]
        update.replace_all_uses_with(fused)
        graph.erase_node(update)
        graph.erase_node(filled)
        graph.erase_node(difference)
