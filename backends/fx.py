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
import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from backends.folding import (
    CALL,
    FoldedRef,
    InputSize,
    SizeArithmetic,
    hold_folded,
    recipe_value,
)
from backends.passes import peephole
from backends.signature import rebuilt_alike, take_structures
from backends.sizes import explain_sizes, require_guards
from egraph.dims import is_symbolic
from egraph.extract.program import items_taken
from egraph.ops.table import NOT_FOLDED, TABLE
from egraph.term import is_literal_op
from frontends.fx.analysis import SCALAR_OPS, literal_value
from frontends.fx.effects import aten_name, foldable_call
from frontends.fx.exported import attribute_at, owner_of
from frontends.fx.recorded import recorded_value
from frontends.fx.source import (
    AttributeRef,
    ClassRef,
    ContiguousRef,
    FxSource,
    OutputRef,
    WrittenRef,
)
from frontends.fx.terms import SHAPE_PARAMS
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from backends.triton.regions import Fusion
    from egraph.egraph import EGraph
    from extractors.costs import Roofline

_ALLOCATIONS = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like",
                          "empty_like", "full_like", "new_zeros", "new_ones", "new_empty",
                          "new_full", "clone"})
"""Calls whose result is a new tensor, sharing storage with nothing: an in-place update of
one that nothing else reads may write into it (:func:`backends.passes.update_in_place`)."""

_STRIDING = {"transpose", "t", "permute", "expand", "getitem", "split", "chunk"}
"""View ops whose result may not be contiguous though their operand is."""
_ORDER_KEEPING = {"detach", "flatten", "identity", "reshape", "squeeze", "unsqueeze", "to"}
"""View ops (and casts) that keep a strided operand's dims in row-major order."""
_RESHAPING = {"reshape", "flatten"}
"""View ops that copy where no view of the operand's strides has the new sizes."""

TARGETS = ("cpu", "cuda")
"""What emission targets: ``cpu`` (eager torch ops), ``cuda`` (fusion regions as Triton
kernels, which run as eager torch ops on CPU tensors)."""

EMITTED_CLASS = "egraph_class"
"""The ``node.meta`` key of each emitted FX node that computes the value of a class: that
class's id (canonical when emitted). A node a peephole pass fused from several keeps the
key of the one whose value it gives (:mod:`backends.passes`). Benchmarks that profile a
program node by node attribute each node's time to the chosen e-node of its class."""


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
    if len(a) == len(b) == 3 and isinstance(a[0], int) and a[0] == b[0] and a[0] != 1:
        return torch.bmm
    return None


class _Emitter:
    def __init__(self, egraph: EGraph, choice: dict[int, tuple], fusions: list[Fusion] = (),
                 channels_last: frozenset[int] = frozenset()):
        self.eg = egraph
        self.src: FxSource = egraph.fx
        self.choice = choice
        # the convolutions whose input is converted to channels-last first
        self.channels_last = frozenset(map(egraph.find, channels_last))
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
        self.foldable: dict[fx.Node, torch.Tensor | FoldedRef | InputSize | SizeArithmetic] = {}
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
        # views whose sizes and strides are known exactly (a meta tensor of them, a tuple
        # for a split's pieces): views of contiguous values, and views of those
        self.view_metas: dict[fx.Node, torch.Tensor | tuple] = {}
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
            node = self.graph.placeholder(
                source.target if star else name, default_value=source.args[0]
                if source is not None and source.args else inspect.Signature.empty)
            chosen = self.choice.get(self.find(cid))
            if chosen is None or not is_literal_op(chosen[0]):
                # (a number input the guards hold to its example's value is that literal
                # where extraction chose it: a specialised program's ``w[:, :s0]`` at s0 =
                # 12 is a slice of constants, folded once, not one read per call)
                self.values[self.find(cid)] = node
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
        if not rebuilt_alike(out):  # (the graph returns the leaves, its code the structure)
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
            first = self.to_channels_last(node[1]) if c in self.channels_last else None
            self.values[c] = value = self.emit(node, self.eg.data(c), first)
            if isinstance(value, fx.Node):
                value.meta.setdefault(EMITTED_CLASS, c)
                self.metas[value] = self.eg.data(c)
                kids = [self.values[self.find(k)] for k in node[1:]]
                self.note_storage(node[0], kids if first is None else [first, *kids[1:]],
                                  value)
                if getattr(self.eg.data(c), "kind", None) == "tuple":
                    stack.extend(reversed(self.items_read(c)))
        return self.values[root]

    def items_read(self, cid: int) -> list[int]:
        """The items of the multi-output call ``cid`` that the program reads, taken as soon
        as it returns: a tuple held until its last item is taken keeps every item alive (a
        training forward's batch norm output, with its saved statistics taken for the
        outputs at the end). The program's order follows the same rule
        (:func:`egraph.extract.program.items_at_once`)."""
        readers, _ = self._readers()
        return [r for r in items_taken(self.eg, self.choice, cid, readers.get(cid, ()))
                if r not in self.values and r not in self.fused]

    def emit(self, node: tuple, meta: Any, first: fx.Node | None = None) -> Any:
        """The FX value of e-node ``node`` (its class's analysis data ``meta``), its
        operands emitted; ``first`` stands for its first operand where given."""
        op = node[0]
        kids = [self.values[self.find(k)] for k in node[1:]]
        if first is not None:
            kids[0] = first
        if meta is not None and meta.kind == "scalar" and op in SCALAR_OPS:
            # shape arithmetic on Python numbers: operator/math, not torch
            call = self.graph.call_function(SCALAR_OPS[op], tuple(kids))
            if all(k in self.foldable and isinstance(self.foldable[k], (InputSize, SizeArithmetic))
                   for k in kids if isinstance(k, fx.Node)):
                self.foldable[call] = SizeArithmetic(op, tuple(recipe_value(kids, self.foldable)))
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

    def to_channels_last(self, cid: int) -> fx.Node:
        """Class ``cid``'s value converted to channels-last (the same tensor where it is
        already): a convolution's input, where the cost model says it runs faster so."""
        value = self.graph.call_method("contiguous", (self.values[self.find(cid)],),
                                       {"memory_format": torch.channels_last})
        self.metas[value] = self.eg.data(cid)
        self.strided.add(value)
        return value

    def input_size(self, given: fx.Node, dim: int) -> fx.Node:
        """``given.size(dim)`` of an input, which a folded value may read
        (:class:`InputSize`)."""
        call = self.graph.call_method("size", (given, dim))
        if given not in self.sized_inputs:
            self.sized_inputs.append(given)
        self.foldable[call] = InputSize(self.sized_inputs.index(given), dim)
        return call

    def fold(self, op: str, kids: list, meta: Any) -> fx.Node | None:
        """An op of parameters, constants, literals and the inputs' sizes, computed once
        (per size) into a buffer rather than per call (:class:`FoldedConstants`); None when
        it depends on an input's values."""
        if op != CALL and TABLE[op].kind in NOT_FOLDED or getattr(
                meta, "kind", None) != "tensor":
            return None
        nodes = [k for k in kids if isinstance(k, fx.Node)]
        inside: list[fx.Node] = []
        fx.node.map_aggregate(kids, lambda a: inside.append(a) if isinstance(a, fx.Node)
                              else None)
        if not inside or not all(k in self.foldable for k in inside):
            return None
        name = f"folded_{len(self.folded)}"
        self.folded[name] = (op, [recipe_value(k, self.foldable) for k in kids])
        node = self.graph.get_attr(f"folded_constants.{name}")
        self.foldable[node] = FoldedRef(name)
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
        if op in _RESHAPING and self.copied(value, base):
            pass  # (a reshape of strides no view can take makes a contiguous copy)
        elif kind == "view" or op == "to" and not self.converts(base, value):
            # an item of a multi-output op's tuple is that op's own output, not a view
            # (a layer norm's output and its statistics are three tensors), unless the
            # op itself makes views (split's items share its operand's storage)
            item = op == "getitem" and getattr(self.metas.get(base), "kind", None) == "tuple"
            # a view (or a cast that may return its operand) shares its operand's storage
            if base is not None and (not item or base in self.view_of):
                self.view_of[value] = self.view_of.get(base, base)
            for held in (self.in_buffer, self.shared):
                if base in held:
                    held.add(value)
            exact = base in self.view_metas  # (else a strided base's strides are unknown)
            layout = ("contiguous" if (item or op not in _STRIDING) and not exact
                      else self.view_layout(value, base))
            if base in self.strided and not exact:
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
        elif op == "to_layout" or (kind == "library" and TABLE[op].channels_last) or (
                kind in ("opaque", "library") and not (
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
        """The layout of ``view`` of a contiguous ``base``, or of a view of known
        strides: ``"contiguous"`` (``x[:1]``, a transpose of a unit dim, a gather
        ``x[index]``), ``"ordered"`` (row-major with gaps: a piece of a split along a later
        dim, ``x[:, ::2]``) or ``"strided"`` (a transpose, or not known), as the same view
        of meta tensors of the operands' sizes and strides says (:meth:`exact_view`)."""
        out = self.exact_view(view, base)
        parts = out if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(p, torch.Tensor) for p in parts):
            return "strided"
        if all(p.is_contiguous() for p in parts):
            return "contiguous"
        return "ordered" if all(_row_major(p) for p in parts) else "strided"

    def copied(self, value: fx.Node, base: fx.Node) -> bool:
        """Whether ``value``, a reshape of ``base``, is a copy: ``base``'s strides are
        known, and no view has the new sizes (the heads of a transposed ``q`` merged
        into the batch, as aot_autograd saves them for ``bmm``)."""
        if base not in self.view_metas:
            return False
        out = self.exact_view(value, base)
        return isinstance(out, torch.Tensor) and not out._is_view()

    def exact_view(self, view: fx.Node, base: fx.Node) -> Any:
        """``view`` of a meta tensor with ``base``'s sizes and strides, where they are
        known (``base`` contiguous, or a view of known strides: the pieces of a split),
        or None; a view is remembered as ``view``'s (:attr:`view_metas`)."""
        if view in self.view_metas:  # (asked once whether a reshape copies, then its layout)
            return self.view_metas[view]
        if not view.args or view.args[0] is not base:
            return None
        meta = self.view_metas.get(base)
        if meta is None and base not in self.strided:
            meta = self.on_meta(base)
        operands = self.on_meta((view.args[1:], view.kwargs))
        if not isinstance(meta, (torch.Tensor, tuple)) or operands is None:
            return None
        args, kwargs = operands
        try:
            if view.op == "call_method":
                out = getattr(meta, view.target)(*args, **kwargs)
            else:
                out = view.target(meta, *args, **kwargs)
        except Exception:  # noqa: BLE001 - then it is not known
            return None
        parts = out if isinstance(out, (tuple, list)) else (out,)
        if all(isinstance(p, torch.Tensor) and p._is_view() for p in parts):
            self.view_metas[view] = tuple(out) if isinstance(out, list) else out
        return out

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
                and foldable_call(call.target)):
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
                 judge: Roofline | None = None, channels_last: frozenset[int] = frozenset()
                 ) -> fx.GraphModule:
    """The GraphModule of a choice (class -> chosen e-node) over an e-graph from FX.

    ``channels_last``: the convolutions whose input is converted to channels-last first
    (:meth:`extractors.costs.Roofline.channels_last_convolutions`); a convolution keeps its
    input's format, so one conversion serves the stack after it.

    ``target="cuda"`` emits the fusion regions as Triton kernel calls
    (:mod:`backends.triton`): those ``judge`` (a Roofline model) says pay, or every region
    that lowers when no judge is given; their kernels are in ``gm.meta["triton_kernels"]``.

    >>> from egraph import EGraph
    >>> from egraph.extract import source_program
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(3),))
    >>> gm = build_module(eg, source_program(eg))
    >>> print(gm.code.strip().splitlines()[-2].strip())
    mul = torch.mul(exp, 2);  exp = None
    >>> [eg.nodes(n.meta[EMITTED_CLASS])[0].op for n in gm.graph.nodes
    ...  if n.op == "call_function"]  # the class each call computes
    ['exp', 'mul']
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
    emitter = _Emitter(egraph, choice, fusions, channels_last)
    graph = emitter.run()
    if fusions:
        from backends.triton.emit import KernelNames

        graph.set_codegen(KernelNames())
    if emitter.out_spec is not None:
        take_structures(graph, out_spec=emitter.out_spec)
    src = egraph.fx
    explanation = explain_sizes(graph, egraph, emitter.baked) if emitter.baked else None
    if src.guards is not None:
        require_guards(graph, src.guards)
    peephole(graph, emitter.metas, emitter.copies, emitter.allocated, emitter.view_of)
    holder = nn.Module()
    hold_folded(holder, graph, emitter.foldable, emitter.folded, emitter.sized_inputs)
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


def _row_major(t: torch.Tensor) -> bool:
    """Whether ``t``'s dims (those of more than one element) have strictly decreasing
    strides: a pointwise op of it allocates a contiguous result (TensorIterator keeps
    its operands' dim order, which is then row-major)."""
    strides = [st for st, n in zip(t.stride(), t.shape) if n > 1]
    return all(st > 0 for st in strides) and all(a > b for a, b in zip(strides, strides[1:]))



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
