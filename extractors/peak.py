"""Peak memory of a program as it runs: the :class:`PeakMemory` cost model.

A program (a choice of e-node per class) is replayed as emission (:mod:`backends.fx`)
writes it and as torch runs it on the CPU:

* in the order it runs: the side effects first, then the outputs, each value after the
  values it reads;
* each call's result a tensor of its own or a view of an operand's storage, as the same
  call on meta tensors of the operands' sizes, dtypes and strides says (a reshape of a
  transposed tensor copies, a cast to its own dtype returns its operand, the items of a
  multi-output op are its tuple's);
* a value freed after its last reader, a storage once no value holds it;
* the temporaries a call allocates and frees inside itself from the op table's
  ``workspace`` facts (:attr:`egraph.ops.table.OpDef.workspace`): a rule over the
  operands, or measured once at those sizes on this CPU (convolutions and attention,
  whose kernels pick their algorithm by size);
* what emission does beyond the choice: a value of parameters alone is computed once
  into a buffer (not per call, not counted), a matrix product read only by a sum becomes
  ``addmm`` and a product by a number read only by a sum becomes ``add``'s ``alpha`` (no
  tensor of their own, :mod:`backends.passes`), a commutative sum takes a row-major
  operand first where its first is a permuted view (the result's layout is its first
  operand's), an aten call is given an operand contiguous where the source gave it one (a
  temporary copy), and an output in such a buffer (or one the source made that would
  share another's storage, or one it returned contiguous) is handed to the caller as a
  copy, made as emission reaches that output, after which the value itself is freed.

Inputs and parameters, allocated before the call, are not counted: the convention of the
measured figure this estimate answers to (:func:`compiler.memory.peak_bytes`). The
measured temporaries are the CPU's, whatever device the program is for.

>>> import torch
>>> from egraph import EGraph
>>> f = lambda x: (x.exp() * x).transpose(0, 1).reshape(-1)
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(32, 32),))
>>> PeakMemory().program_cost(eg)  # the reshape of the transpose copies the product
8192.0
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from egraph.cache import current_cache
from egraph.dims import hints
from egraph.extract.program import items_at_once, program_order, source_program
from egraph.ops.table import NOT_FOLDED, TABLE, names, transpose_buffer_bytes
from egraph.term import is_literal_op, is_number_op
from extractors.allocator import allocated_peak
from extractors.costs import CostModel
from frontends.fx.analysis import SCALAR_OPS, literal_value
from frontends.fx.effects import foldable_call
from frontends.fx.source import AttributeRef, ClassRef, ContiguousRef, OutputRef, WrittenRef
from frontends.fx.vocabulary import (
    COMMUTATIVE_CALLS,
    LAYOUT_KEEPING_CALLS,
    PERMUTING_CALLS,
    SPECS,
    full_size,
)

__all__ = ["PeakMemory", "Tensor", "peak_of"]

_VIEWS = names(kind="view")
_LEAVES = frozenset({"input", "param", "const"})


@dataclass(frozen=True)
class Tensor:
    """A tensor as the replay knows it: its layout and the storage it lives in (an id of
    the replay's; ``held`` False where the storage was there before the call: an input's,
    a parameter's, a buffer of folded values). ``parameter``: a module's parameter, which
    requires grad even where nothing is recorded (``torch.matmul`` folds a batch into
    one matrix, copying it, where the other operand requires grad)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    storage: tuple
    held: bool = True
    parameter: bool = False

    @property
    def layout(self) -> tuple:
        """What a call's result depends on: sizes, strides, dtype, parameter or not."""
        return ("tensor", self.shape, self.stride, self.dtype, self.parameter)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class PeakMemory(CostModel):
    """Peak bytes live while the program runs on the CPU, inputs and parameters not
    counted (see the module docstring for what the replay follows). Not a sum over
    e-nodes: extraction uses the bytes each op writes as its proxy, then improves the
    choice under the peak.

    >>> import torch
    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.nn.Linear(64, 32), (torch.randn(8, 64),))
    >>> PeakMemory().program_cost(eg)  # the output, 8 x 32 floats
    1024.0
    """

    local = False

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        if len(node) == 1 or node[0] in _VIEWS or node[0] in _LEAVES:
            return 0.0
        meta = egraph.data(cid)
        return float(_bytes_of(meta)) + 1e-6

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> float:
        if choice is None:
            choice = source_program(egraph)
        return float(peak_of(egraph, choice))

    def __repr__(self) -> str:
        return "PeakMemory()"


def _bytes_of(meta: Any) -> int:
    """The bytes of a class's value as the analysis knows it (a tuple's, its tensors')."""
    kind = getattr(meta, "kind", None)
    if kind == "tuple" and isinstance(meta.value, tuple):
        return sum(_bytes_of(m) for m in meta.value)
    shape = getattr(meta, "shape", None)
    if kind != "tensor" or shape is None:
        return 0
    dtype = getattr(meta, "dtype", None) or torch.float32
    return math.prod(hints(shape)) * dtype.itemsize


# -- the replay ------------------------------------------------------------------------------

# per e-graph: (its version when asked, (op, operand layouts) -> what the call makes)
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def peak_of(egraph, choice: dict[int, tuple], channels_last: frozenset[int] = frozenset()
            ) -> int:
    """The most bytes live at once while the program ``choice`` of ``egraph`` runs,
    temporaries inside calls included (see the module docstring). ``channels_last``: the
    convolutions whose input emission converts to channels-last first
    (:meth:`extractors.costs.Roofline.channels_last_convolutions`), each conversion a copy
    live while its convolution runs.

    >>> import torch
    >>> from egraph import EGraph
    >>> from egraph.extract import source_program
    >>> f = lambda x: x.t().softmax(-1)       # softmax copies a strided operand first
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(32, 32),))
    >>> peak_of(eg, source_program(eg))
    8192
    """
    find = egraph.find
    roots = [find(r) for r in egraph.roots]
    order = items_at_once(egraph, choice, program_order(
        egraph, choice, [*map(find, getattr(egraph, "effects", ())), *roots]))
    fused = _fused(egraph, choice, order)
    program_reads = _last_reads(egraph, choice, order, fused, [])
    last = _last_reads(egraph, choice, order, fused, roots)
    calls = current_cache(_CALLS, egraph)
    foldable: set[int] = set()
    values: dict[int, Any] = {}
    holders: dict[tuple, int] = {}   # storage -> live values holding it
    sizes: dict[tuple, int] = {}     # storage -> bytes, for the storages the program made
    live = peak = 0
    addmm = {s for p, s in fused.items() if choice[p][0] == "matmul"}
    # a sum with a product by a number fused in is emitted as ``add(other, y, alpha=s)``
    alpha = {s: _as_alpha(egraph, choice, s, p) for p, s in fused.items()
             if choice[p][0] == "mul"}
    permuted: set[int] = set()
    copies = _OutputCopies(egraph, order)
    copied = 0  # the bytes of the copies of outputs made so far

    def release(value: Any) -> None:
        nonlocal live
        for t in _tensors(value):
            holders[t.storage] -= 1
            if not holders[t.storage] and t.storage in sizes:
                live -= sizes.pop(t.storage)

    def copy_outputs(at: int) -> None:
        # (a copied output's value is freed once nothing else reads it: emission hands
        # the caller the copy)
        nonlocal copied, peak
        for cid, nbytes, temporaries in copies.made_before(at, values):
            peak = max(peak, live + copied + nbytes + temporaries)
            copied += nbytes
            if copies.handed_over(cid):
                reads = program_reads.get(cid, -1)
                if reads < at and cid in values:
                    release(values.pop(cid))
                else:
                    last[cid] = reads

    for i, c in enumerate(order):
        copy_outputs(i)
        node = choice[c]
        swapped = c not in addmm and _row_major_first(egraph, c, node, permuted)
        if c in fused:  # computed inside its reader's call: no tensor of its own
            continue
        value, workspace = _replay(egraph, c, alpha.get(c, node), values, calls, i,
                                   c in channels_last, swapped and c not in alpha)
        if _folds(egraph, choice, c, foldable):  # computed once into a buffer, not per call
            value, workspace = _in_buffer(value, (i, _BUFFER)), 0
            permuted.discard(c)
        for t in _tensors(value):
            if t.held and t.storage not in holders:
                sizes[t.storage] = max(sizes.get(t.storage, 0), t.nbytes)
        live = sum(sizes.values())
        values[c] = value
        for t in _tensors(value):
            holders[t.storage] = holders.get(t.storage, 0) + 1
        peak = max(peak, live + copied + workspace)
        read = [c, *(p for p, s in fused.items() if s == c)]
        for k in dict.fromkeys(find(k) for r in read for k in choice[r][1:]):
            if last.get(k) == i and k in values:
                release(values.pop(k))
        if c not in last:  # read by nothing
            release(values.pop(c))
    copy_outputs(len(order))
    return max(peak, live + copied)


_BUFFER = "buffer"


def _last_reads(egraph, choice: dict[int, tuple], order: list[int], fused: dict[int, int],
                roots: list[int]) -> dict[int, int]:
    """Class -> the position in ``order`` of the last call that reads it (a fused
    product's operands are read by the sum it is fused into; the outputs, past the end)."""
    find = egraph.find
    position = {c: i for i, c in enumerate(order)}
    last: dict[int, int] = {}
    for i, c in enumerate(order):
        at = position[fused[c]] if c in fused else i
        for k in choice[c][1:]:
            last[find(k)] = max(last.get(find(k), -1), at)
    for r in roots:
        last[r] = len(order)
    return last


class _OutputCopies:
    """The copies emission hands the caller in place of outputs (``backends.fx``): an
    output in a buffer of folded values; a tensor the source made that would share an
    input's or a parameter's storage, or another output's of another maker; a strided
    output the source returned contiguous. Emission makes each as it reaches its output,
    in the outputs' order: once the program has computed that output and those before
    it, before the values only later outputs read (a saved activation's copy is live
    while the next one is made)."""

    def __init__(self, egraph, order: list[int]) -> None:
        self.egraph = egraph
        refs: list[ClassRef] = []
        fx.node.map_aggregate(getattr(getattr(egraph, "fx", None), "output", None),
                              lambda a: refs.append(a) if isinstance(a, ClassRef) else None)
        position = {c: i for i, c in enumerate(order)}
        reached = -1
        self.pending: list[tuple[int, ClassRef]] = []  # (position reached, output)
        self.outputs: dict[int, int] = {}  # class -> its outputs not handed over yet
        for ref in refs:
            cid = egraph.find(ref.cid)
            reached = max(reached, position.get(cid, -1))
            self.pending.append((reached, ref))
            self.outputs[cid] = self.outputs.get(cid, 0) + 1
        self.pending.reverse()
        self.makers: dict[tuple, str | None] = {}

    def made_before(self, at: int, values: dict) -> list[tuple[int, int, int]]:
        """The copies emission makes before the call at position ``at`` of the
        program's order, not made before: ``(class, bytes, temporaries' bytes)`` each."""
        made = []
        while self.pending and self.pending[-1][0] < at:
            ref = self.pending.pop()[1]
            cid = self.egraph.find(ref.cid)
            value = values.get(cid)
            if not isinstance(value, Tensor):
                continue
            fresh = isinstance(ref, OutputRef) and ref.fresh
            contiguous = isinstance(ref, OutputRef) and bool(ref.contiguous)
            # (keyed by the storage, as emission keys it: the items of a multi-output op
            # are tensors of their own, a view shares its base's)
            if value.storage[1] == _BUFFER or fresh and (
                    not value.held or self.makers.setdefault(value.storage, ref.maker)
                    != ref.maker):
                # (``clone``, in the value's own layout unless the source's was row-major)
                buffer = _copy_buffer(value) if contiguous else 0
            elif contiguous and not _is_contiguous(value):
                buffer = _copy_buffer(value)
            else:
                continue
            self.outputs[cid] -= 1
            made.append((cid, value.nbytes, buffer))
        return made

    def handed_over(self, cid: int) -> bool:
        """Whether every output of class ``cid`` is a copy made by now: the caller holds
        none of them as the program's own value."""
        return self.outputs.get(cid) == 0


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _fused(egraph, choice: dict[int, tuple], order: list[int]) -> dict[int, int]:
    """The products emission fuses into the sum that reads them (:mod:`backends.passes`):
    a matrix product of 2-D floating matrices read only by a sum with a bias that
    broadcasts to it (``addmm``), or a product by a number read only by a sum of
    tensors of its dtype (``add``'s ``alpha``): product class -> sum class."""
    find = egraph.find
    readers: dict[int, set[int]] = {}
    for c in order:
        for k in choice[c][1:]:
            readers.setdefault(find(k), set()).add(c)
    fused: dict[int, int] = {}
    for c in order:
        node = choice[c]
        if node[0] != "add" or len(node) != 3:
            continue
        a, b = find(node[1]), find(node[2])
        for product, other in ((a, b), (b, a)):
            if product == other or readers.get(product) != {c}:
                continue
            if _bias_fits(egraph, choice[product], other, c) or _scale_fits(
                    egraph, choice, choice[product], product, other):
                fused[product] = c
                break
    return fused


def _bias_fits(egraph, product: tuple, bias: int, total: int) -> bool:
    if product[0] != "matmul":
        return False
    metas = [egraph.data(k) for k in (*product[1:], bias, total)]
    if any(getattr(m, "kind", None) != "tensor" or m.shape is None for m in metas):
        return False
    a, b, c, out = metas
    shapes = [tuple(hints(m.shape)) for m in metas]
    return (len(shapes[0]) == len(shapes[1]) == 2 and len(shapes[2]) <= 2
            and all(d in (1, t) for d, t in zip(reversed(shapes[2]), reversed(shapes[3])))
            and a.dtype == b.dtype == c.dtype == out.dtype
            and out.dtype is not None and out.dtype.is_floating_point)


def _as_alpha(egraph, choice: dict[int, tuple], total: int, product: int) -> tuple:
    """The sum ``total`` as emission calls it with ``product`` (``y * s``) fused into
    ``add``'s ``alpha``: ``("add", other, y)``, the other term first (the pass writes
    ``torch.add(other, y, alpha=s)``, after putting a row-major operand first)."""
    find = egraph.find
    node = choice[total]
    other = find(node[2]) if find(node[1]) == product else find(node[1])
    y = next(find(k) for k in choice[product][1:] if _number(choice.get(find(k))) is None)
    return (node[0], other, y)


def _scale_fits(egraph, choice: dict[int, tuple], product: tuple, cid: int,
                other: int) -> bool:
    find = egraph.find
    numbers = [_number(choice.get(find(k))) for k in product[1:]]
    if product[0] != "mul" or len(product) != 3 or (numbers[0] is None) == (
            numbers[1] is None) or getattr(egraph.data(other), "kind", None) != "tensor":
        return False
    y, scale = (product[1], numbers[1]) if numbers[1] is not None else (product[2],
                                                                         numbers[0])
    if getattr(egraph.data(y), "kind", None) != "tensor":
        return False
    dtype = getattr(egraph.data(y), "dtype", None)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale == 0 \
            or not math.isfinite(scale) or dtype != getattr(egraph.data(cid), "dtype", None):
        return False
    return dtype is not None and (dtype.is_floating_point or type(scale) is int)


def _number(node: tuple | None) -> Any:
    """The Python number emission writes for a class chosen as ``node`` (a literal, a
    scalar folded to one), None where it emits a node."""
    if node is None or len(node) != 1:
        return None
    op = node[0]
    value = literal_value(op) if is_literal_op(op) else op if is_number_op(op) else None
    return value if isinstance(value, (int, float)) else None


def _row_major_first(egraph, cid: int, node: tuple, permuted: set[int]) -> bool:
    """Whether emission swaps the two operands of ``node`` (class ``cid``) to put a
    row-major one first (:func:`backends.passes.row_major_first`, whose rule this is,
    over the e-graph's ops): ``permuted`` holds the classes emitted as permuted views so
    far, and gains ``cid`` where it is one. The result of an elementwise call takes its
    first full-size operand's layout."""
    spec, meta = SPECS.get(node[0]), egraph.data(cid)
    if spec is None or isinstance(spec.impl, str) or getattr(meta, "kind", None) != "tensor" \
            or meta.shape is None:  # (a method call: not followed, as the pass does not)
        return False
    find = egraph.find
    operands = [find(k) for k in node[1:]
                if getattr(egraph.data(k), "kind", None) in ("tensor", "scalar")]
    if spec.impl in PERMUTING_CALLS:
        permuted.add(cid)
    elif spec.impl in LAYOUT_KEEPING_CALLS and operands and operands[0] in permuted:
        permuted.add(cid)
    elif TABLE[node[0]].kind == "pointwise":
        shape = tuple(hints(meta.shape))
        full = [k for k in operands if full_size(_shape(egraph, k), shape)]
        if spec.impl in COMMUTATIVE_CALLS and len(node) == 3 and len(full) == 2 \
                and full[0] in permuted and full[1] not in permuted:
            return True
        if full and full[0] in permuted:
            permuted.add(cid)
    return False


def _shape(egraph, cid: int) -> tuple[int, ...] | None:
    shape = getattr(egraph.data(cid), "shape", None)
    return None if shape is None else tuple(hints(shape))


def _replay(egraph, cid: int, node: tuple, values: dict, calls: dict,
            at: int, channels_last: bool = False, swapped: bool = False) -> tuple[Any, int]:
    """What the emitted call of ``node`` (class ``cid``, the ``at``-th of the program)
    makes given the operands' ``values``, and the bytes of its temporaries
    (``channels_last``: its first operand's copy in that format among them, where it is
    not in it already; ``swapped``: emission puts its second operand first)."""
    op = node[0]
    meta = egraph.data(cid)
    if len(node) == 1 or getattr(meta, "kind", None) in ("literal", "scalar"):
        return getattr(meta, "value", None), 0
    find = egraph.find
    kids = [values.get(find(k)) for k in node[1:]]
    if op in _LEAVES:
        given = _new(meta, (at, "given"), held=False)
        if op == "param" and isinstance(given, Tensor) and given.dtype.is_floating_point:
            given = Tensor(given.shape, given.stride, given.dtype, given.storage, False, True)
        if op == "input" and isinstance(given, Tensor):
            given = _as_given(egraph, kids[0], given)
        return given, 0
    if op == "tuple":
        return tuple(kids), 0
    if op == "slice":
        return slice(*kids), 0
    if swapped:
        kids.reverse()
    value, workspace, converted = None, 0, 0
    first = kids[0] if kids else None
    if channels_last and isinstance(first, Tensor) and len(first.shape) == 4:
        n, c, h, w = first.shape
        batch, row, column, channel = _contiguous((n, h, w, c))
        stride = (batch, channel, row, column)
        if tuple(first.stride) != stride:
            kids[0] = Tensor(first.shape, stride, first.dtype, (at, "channels_last"))
            converted = first.nbytes
    if op == "opaque":
        value, workspace = _opaque(egraph, kids[0], values, calls, at)
    elif op in SPECS:
        value, workspace = _call(op, kids, calls, at)
    workspace += converted
    if value is None:
        value = _new(meta, (at, 0))
    return value, workspace


def _as_given(egraph, name: Any, given: Tensor) -> Tensor:
    """Input ``name`` in the layout its example has, where the e-graph came from FX with
    examples: what a call receives. A backward graph's saved activations come in the
    forward's layouts (a channels-last convolution's output), and an op's temporaries
    depend on them: torch's depthwise convolution backward over channels-last operands
    took 1.6 MB where it takes 60 KB over row-major ones (ConvNeXt's, in the corpus)."""
    src = getattr(egraph, "fx", None)
    examples = dict(zip(getattr(src, "inputs", ()), getattr(src, "example_inputs", None) or ()))
    example = examples.get(name)
    if not isinstance(example, torch.Tensor) or tuple(example.shape) != given.shape:
        return given
    try:
        stride = tuple(int(st) for st in example.stride())
    except (TypeError, RuntimeError, ValueError):  # (a symbolic stride: not known)
        return given
    return Tensor(given.shape, stride, given.dtype, given.storage, given.held,
                  given.parameter)


def _folds(egraph, choice: dict[int, tuple], cid: int, foldable: set[int]) -> bool:
    """Whether emission folds class ``cid`` into a buffer computed once (per size), as
    ``backends.fx`` does: a tensor op of a kind that folds (:data:`~egraph.ops.table.
    NOT_FOLDED`) whose operands that are no literals are all parameters, constants,
    folded values, the inputs' sizes or arithmetic of sizes. Records in ``foldable``
    the classes emission may fold from (``cid`` among them where it is one)."""
    node = choice[cid]
    op, kind = node[0], getattr(egraph.data(cid), "kind", None)
    if len(node) == 1 or kind == "literal":
        return False
    inside = _nodes_inside(egraph, choice, node[1:])
    if op in _LEAVES:
        if op != "input":
            foldable.add(cid)
        return False
    if op == "opaque" and not _foldable_call(egraph, node):
        return False
    if op == "size":
        if inside and choice[inside[0]][0] == "input":
            foldable.add(cid)
        return False
    if not inside or not all(k in foldable for k in inside):
        return False
    if kind == "scalar" and op in SCALAR_OPS:
        foldable.add(cid)
        return False
    if kind != "tensor" or op != "opaque" and (op not in TABLE
                                               or TABLE[op].kind in NOT_FOLDED):
        return False
    foldable.add(cid)
    return True


def _foldable_call(egraph, node: tuple) -> bool:
    """Whether the opaque call of ``node`` is one emission may fold: a functional ATen
    operator that draws nothing (:func:`frontends.fx.effects.foldable_call`)."""
    token = getattr(egraph.data(node[1]), "value", None)
    call = getattr(getattr(egraph, "fx", None), "opaque", {}).get(token)
    return (call is not None and call.op == "call_function" and call.pure
            and call.updates is None and foldable_call(call.target))


def _nodes_inside(egraph, choice: dict[int, tuple], kids: tuple) -> list[int]:
    """The classes among ``kids`` (and inside the tuples and slices among them) that
    emission makes FX nodes of: every class but the literals."""
    find = egraph.find
    found: list[int] = []
    for k in map(find, kids):
        node = choice.get(k)
        if node is None or len(node) == 1 or getattr(egraph.data(k), "kind", None) == "literal":
            continue
        if node[0] in ("tuple", "slice"):
            found.extend(_nodes_inside(egraph, choice, node[1:]))
        else:
            found.append(k)
    return found


def _new(meta: Any, storage: tuple, held: bool = True) -> Any:
    """A contiguous tensor of a class's analysis data (a tuple of them for a tuple)."""
    kind = getattr(meta, "kind", None)
    if kind == "tuple" and isinstance(meta.value, tuple):
        return tuple(_new(m, (*storage, i), held) for i, m in enumerate(meta.value))
    if kind != "tensor" or getattr(meta, "shape", None) is None:
        return getattr(meta, "value", None)
    shape = tuple(hints(meta.shape))
    return Tensor(shape, _contiguous(shape), getattr(meta, "dtype", None) or torch.float32,
                  storage, held)


def _in_buffer(value: Any, storage: tuple) -> Any:
    if isinstance(value, Tensor):
        if not value.held:  # a view of a parameter stays the parameter's
            return value
        return Tensor(value.shape, value.stride, value.dtype, storage, False)
    if isinstance(value, tuple):
        return tuple(_in_buffer(v, storage) for v in value)
    return value


def _is_contiguous(t: Tensor) -> bool:
    """Whether ``t`` is contiguous as torch says it: row-major strides, a dim of one
    element's stride aside."""
    return all(d == 1 or s == c for d, s, c in zip(t.shape, t.stride, _contiguous(t.shape)))


def _copy_buffer(t: Tensor) -> int:
    """The temporaries of a row-major copy of ``t`` (aten's block buffer for a transposed
    matrix)."""
    return transpose_buffer_bytes(t.shape, t.stride, t.dtype.itemsize)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for d in reversed(shape):
        stride.append(step)
        step *= max(d, 1)
    return tuple(reversed(stride))


def _layout(value: Any) -> Any:
    """A hashable key of what a call on ``value`` depends on (None: not hashable)."""
    if isinstance(value, Tensor):
        return value.layout
    if isinstance(value, (tuple, list)):
        keys = tuple(_layout(v) for v in value)
        return None if None in keys else (type(value).__name__, keys)
    try:
        hash(value)
    except TypeError:
        return None
    return ("value", type(value).__name__, value)


def _call(op: str, kids: list, calls: dict, at: int) -> tuple[Any, int]:
    """``op`` on ``kids``: its result, each tensor of it a view of an operand's storage or
    a new one, and the bytes of its temporaries; remembered per operand layouts. The op
    runs on meta tensors, and its workspace fact says its temporaries; an op whose fact
    is ``"measured"`` runs on real tensors instead (its result's layout is the kernel's
    too: the CPU's attention returns its heads transposed, where meta tensors say
    contiguous)."""
    def measure() -> tuple[Any, int]:
        if TABLE[op].workspace == "measured":
            spec = SPECS[op]
            return _measured(lambda *args: spec.run(list(args)), kids)
        return _run_on_meta(op, kids)

    return _remembered(calls, (op,), kids, at, measure)


def _remembered(calls: dict, name: tuple, operands: list, at: int,
                measure: Callable[[], tuple[Any, int]]) -> tuple[Any, int]:
    """A call's result rebuilt over ``operands`` (made at step ``at``) and its temporaries'
    bytes, from ``measure()``'s description, remembered in ``calls`` under ``name`` and the
    operands' layouts (not where an operand's layout is unknown)."""
    layouts = tuple(_layout(k) for k in operands)
    key = (*name, layouts)
    cached = None not in layouts
    known = calls.get(key) if cached else None
    if known is None:
        known = measure()
        if cached:
            calls[key] = known
    shapes, workspace = known
    if shapes is None:
        return None, 0
    return _rebuild(shapes, _tensors(operands), at), workspace


def _run_on_meta(op: str, kids: list) -> tuple[Any, int]:
    """``(description of the result, workspace bytes)`` of ``op`` run on meta stand-ins
    of ``kids``; ``(None, 0)`` where meta tensors cannot run it."""
    made: list[torch.Tensor] = []
    try:
        with unset_fake_temporarily():  # (extraction may run inside a compile's fake mode)
            args = _stand_ins(kids, made, "meta")
            out = SPECS[op].run(args)
            rule = TABLE[op].workspace
            workspace = int(rule(args, out)) if rule is not None else 0
    except Exception:  # noqa: BLE001 - an op meta tensors cannot run: a new tensor
        return None, 0
    return _describe(out, made), workspace


def _measured(run: Callable[..., Any], kids: list) -> tuple[Any, int]:
    """``(description of the result, workspace bytes)`` of ``run(*kids)`` on real tensors
    of the kids' sizes, dtypes and strides (zeros; a parameter requiring grad) on this
    CPU: the bytes torch's allocator hands out beyond the result's, in a call after two
    others, as the program's calls run (oneDNN's kernels pack a weight the second time
    they see it, and keep the packed copy with the weight)."""
    made: list[torch.Tensor] = []
    results: list = []
    try:
        with unset_fake_temporarily(), torch.no_grad():
            args = _stand_ins(kids, made, "cpu")
            for _ in range(_WARM_CALLS):
                run(*args)
            peak = allocated_peak(lambda: results.append(run(*args)))
    except Exception:  # noqa: BLE001 - an op that does not run on zeros: a new tensor
        return None, 0
    shapes = _describe(results[0], made)
    return shapes, max(0, peak - _new_bytes(shapes))


_WARM_CALLS = 2
"""Calls of a measured op before the one measured: the packing of a weight, made on the
second, is what a model's first calls pay once (``frontends.fx.kernels.onednn_conv2d``)."""


def _new_bytes(shapes: tuple) -> int:
    """The bytes of the new tensors a result description holds."""
    if shapes[0] == "tensor":
        _, shape, _, dtype, shared = shapes
        return 0 if shared is not None else math.prod(shape) * dtype.itemsize
    if shapes[0] == "tuple":
        return sum(_new_bytes(s) for s in shapes[1])
    return 0


def _stand_ins(value: Any, made: list, device: str) -> Any:
    """``value`` with each :class:`Tensor` a tensor of its layout on ``device`` (zeros on a
    real one), appended to ``made`` in order."""
    if isinstance(value, Tensor):
        extent = sum((d - 1) * s for d, s in zip(value.shape, value.stride)) + 1
        base = (torch.empty if device == "meta" else torch.zeros)(
            max(extent, 1), dtype=value.dtype, device=device)
        t = base.as_strided(value.shape, value.stride)
        if value.parameter and device != "meta":
            t = nn.Parameter(t)
        made.append(t)
        return t
    if isinstance(value, tuple):
        return tuple(_stand_ins(v, made, device) for v in value)
    if isinstance(value, list):
        return [_stand_ins(v, made, device) for v in value]
    return value


def _describe(out: Any, made: list[torch.Tensor]) -> Any:
    """Each tensor of ``out`` as ``("tensor", shape, stride, dtype, index of the operand
    in ``made`` whose storage it shares, or None)``."""
    if isinstance(out, torch.Tensor):
        storages = [t.untyped_storage()._cdata for t in made]
        key = out.untyped_storage()._cdata
        shared = storages.index(key) if key in storages else None
        return ("tensor", tuple(out.shape), tuple(out.stride()), out.dtype, shared)
    if isinstance(out, (tuple, list)):
        return ("tuple", tuple(_describe(o, made) for o in out))
    return ("value", out)


def _rebuild(shapes: tuple, operands: list[Tensor], at: int, path: tuple = ()) -> Any:
    if shapes[0] == "tensor":
        _, shape, stride, dtype, shared = shapes
        if shared is not None:
            base = operands[shared]
            return Tensor(shape, stride, dtype, base.storage, base.held)
        return Tensor(shape, stride, dtype, (at, *path, 0))
    if shapes[0] == "value":
        return shapes[1]
    return tuple(_rebuild(s, operands, at, (*path, i)) for i, s in enumerate(shapes[1]))


def _opaque(egraph, token: Any, values: dict, calls: dict, at: int) -> tuple[Any, int]:
    """An opaque call replayed as emission makes it, each operand it writes into a copy
    and each the source gave it contiguous made so where it is not (a temporary): a
    functional call that draws nothing (an ATen operator, or a torch function whose aten
    namesake is so: ``torch.layer_norm`` of a shape computed from sizes) run once per
    operand layouts on real tensors (its result's layout and its temporaries measured),
    another on meta tensors (no temporaries); ``(None, 0)`` where neither runs it."""
    call = getattr(getattr(egraph, "fx", None), "opaque", {}).get(token)
    if call is None or not callable(call.target):
        return None, 0
    find = egraph.find
    written: list[Tensor] = []
    copied: list[Tensor] = []
    copied_from: list[Tensor] = []  # (the operands ``copied`` are copies of)

    def resolve(a: Any) -> Any:
        if isinstance(a, AttributeRef):
            raise LookupError(a.target)
        if isinstance(a, ClassRef):
            value = values.get(find(a.cid))
            if isinstance(a, WrittenRef) and isinstance(value, Tensor):
                value = Tensor(value.shape, _contiguous(value.shape), value.dtype,
                               (at, "copy", len(written)))
                written.append(value)
            elif isinstance(a, ContiguousRef) and isinstance(value, Tensor) and not (
                    _is_contiguous(value)):
                copied_from.append(value)
                value = Tensor(value.shape, _contiguous(value.shape), value.dtype,
                               (at, "contiguous", len(copied)))
                copied.append(value)
            return value
        return a

    try:
        args = fx.node.map_aggregate(call.args, resolve)
        kwargs = fx.node.map_aggregate(call.kwargs, resolve)
    except LookupError:
        return None, 0
    operands = [*args, *kwargs.values()]
    names = list(kwargs)

    def run(*given: Any) -> Any:
        return call.target(*given[:len(args)], **dict(zip(names, given[len(args):])))

    def measure() -> tuple[Any, int]:
        if call.pure and call.updates is None:
            return _measured(run, operands)
        made: list[torch.Tensor] = []
        try:
            with unset_fake_temporarily():
                return _describe(run(*_stand_ins(operands, made, "meta")), made), 0
        except Exception:  # noqa: BLE001 - not on meta tensors: a new tensor
            return None, 0

    value, workspace = _remembered(calls, ("opaque", token), operands, at, measure)
    return value, workspace + sum(t.nbytes for t in copied) + max(
        (_copy_buffer(t) for t in copied_from), default=0)
