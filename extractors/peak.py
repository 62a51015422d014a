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
  tensor of their own, :mod:`backends.passes`), and an output in such a buffer is handed
  to the caller as a copy.

Inputs and parameters, allocated before the call, are not counted: the convention of the
measured figure this estimate answers to (:func:`compiler.memory.peak_bytes`).

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
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from egraph.cache import current_cache
from egraph.dims import hints
from egraph.extract.program import program_order, source_program
from egraph.ops.table import TABLE, names
from extractors.allocator import allocated_peak
from extractors.costs import CostModel, parameter_only
from frontends.fx.source import AttributeRef, ClassRef, WrittenRef
from frontends.fx.vocabulary import SPECS

__all__ = ["PeakMemory", "Tensor", "peak_of"]

_VIEWS = names(kind="view")
_LEAVES = frozenset({"input", "param", "const"})


@dataclass(frozen=True)
class Tensor:
    """A tensor as the replay knows it: its layout and the storage it lives in (an id of
    the replay's; ``held`` False where the storage was there before the call: an input's,
    a parameter's, a buffer of folded values)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    storage: int
    held: bool = True

    @property
    def layout(self) -> tuple:
        """What a call's result depends on: sizes, strides and dtype."""
        return ("tensor", self.shape, self.stride, self.dtype)

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


def peak_of(egraph, choice: dict[int, tuple]) -> int:
    """The most bytes live at once while the program ``choice`` of ``egraph`` runs,
    temporaries inside calls included (see the module docstring).

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
    order = program_order(egraph, choice, [*map(find, getattr(egraph, "effects", ())),
                                           *roots])
    fused = _fused(egraph, choice, order)
    position = {c: i for i, c in enumerate(order)}
    last: dict[int, int] = {}
    for i, c in enumerate(order):
        at = position[fused[c]] if c in fused else i
        for k in choice[c][1:]:
            last[find(k)] = max(last.get(find(k), -1), at)
    for r in roots:
        last[r] = len(order)
    calls = current_cache(_CALLS, egraph)
    values: dict[int, Any] = {}
    holders: dict[tuple, int] = {}   # storage -> live values holding it
    sizes: dict[tuple, int] = {}     # storage -> bytes, for the storages the program made
    live = peak = 0

    def release(value: Any) -> None:
        nonlocal live
        for t in _tensors(value):
            holders[t.storage] -= 1
            if not holders[t.storage] and t.storage in sizes:
                live -= sizes.pop(t.storage)

    for i, c in enumerate(order):
        node = choice[c]
        if c in fused:  # computed inside its reader's call: no tensor of its own
            continue
        value, workspace = _replay(egraph, c, node, values, calls, i)
        for t in _tensors(value):
            if t.held and t.storage not in holders:
                sizes[t.storage] = max(sizes.get(t.storage, 0), t.nbytes)
        live = sum(sizes.values())
        values[c] = value
        for t in _tensors(value):
            holders[t.storage] = holders.get(t.storage, 0) + 1
        peak = max(peak, live + workspace)
        read = [c, *(p for p, s in fused.items() if s == c)]
        for k in dict.fromkeys(find(k) for r in read for k in choice[r][1:]):
            if last.get(k) == i and k in values:
                release(values.pop(k))
        if c not in last:  # read by nothing
            release(values.pop(c))
    # an output in a buffer of folded values is handed to the caller as a copy
    copies = sum(t.nbytes for r in roots for t in _tensors(values.get(r))
                 if t.storage[1] == _BUFFER)
    return max(peak, live + copies)


_BUFFER = "buffer"


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
                    egraph, choice[product], product, other):
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


def _scale_fits(egraph, product: tuple, cid: int, other: int) -> bool:
    if product[0] != "mul" or len(product) != 3:
        return False
    kinds = [getattr(egraph.data(k), "kind", None) for k in product[1:]]
    if sorted(kinds) != ["literal", "tensor"] or getattr(
            egraph.data(other), "kind", None) != "tensor":
        return False
    y, s = (product[1], product[2]) if kinds[0] == "tensor" else (product[2], product[1])
    scale = getattr(egraph.data(s), "value", None)
    dtype = getattr(egraph.data(y), "dtype", None)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale == 0 \
            or not math.isfinite(scale) or dtype != getattr(egraph.data(cid), "dtype", None):
        return False
    return dtype is not None and (dtype.is_floating_point or type(scale) is int)


def _replay(egraph, cid: int, node: tuple, values: dict, calls: dict,
            at: int) -> tuple[Any, int]:
    """What the emitted call of ``node`` (class ``cid``, the ``at``-th of the program)
    makes given the operands' ``values``, and the bytes of its temporaries."""
    op = node[0]
    meta = egraph.data(cid)
    if len(node) == 1 or getattr(meta, "kind", None) in ("literal", "scalar"):
        return getattr(meta, "value", None), 0
    find = egraph.find
    kids = [values.get(find(k)) for k in node[1:]]
    if op in _LEAVES:
        return _new(meta, (at, "given"), held=False), 0
    if op == "tuple":
        return tuple(kids), 0
    if op == "slice":
        return slice(*kids), 0
    value, workspace = None, 0
    if op == "opaque":
        value = _opaque(egraph, kids[0], values, at)
    elif op in SPECS:
        value, workspace = _call(op, kids, calls, at)
    if value is None:
        value = _new(meta, (at, 0))
    if parameter_only(egraph, cid):  # computed once into a buffer, not per call
        value, workspace = _in_buffer(value, (at, _BUFFER)), 0
    return value, workspace


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
    """``op`` on ``kids`` as meta tensors: its result, each tensor of it a view of an
    operand's storage or a new one, and the workspace fact of ``op``; remembered per
    operand layouts."""
    key = (op, tuple(_layout(k) for k in kids))
    cached = None not in key[1]
    known = calls.get(key) if cached else None
    if known is None:
        known = _run_on_meta(op, kids)
        if cached:
            calls[key] = known
    shapes, workspace = known
    if shapes is None:
        return None, 0
    return _rebuild(shapes, _tensors(kids), at), workspace


def _run_on_meta(op: str, kids: list) -> tuple[Any, int]:
    """``(description of the result, workspace bytes)`` of ``op`` run on meta stand-ins
    of ``kids``; ``(None, 0)`` where meta tensors cannot run it."""
    made: list[torch.Tensor] = []
    try:
        args = _on_meta(kids, made)
        out = SPECS[op].run(args)
        workspace = _workspace(op, args, out, kids)
    except Exception:  # noqa: BLE001 - an op meta tensors cannot run: a new tensor
        return None, 0
    return _describe(out, [t.untyped_storage()._cdata for t in made]), workspace


def _on_meta(value: Any, made: list) -> Any:
    if isinstance(value, Tensor):
        t = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device="meta")
        made.append(t)
        return t
    if isinstance(value, tuple):
        return tuple(_on_meta(v, made) for v in value)
    if isinstance(value, list):
        return [_on_meta(v, made) for v in value]
    return value


def _describe(out: Any, storages: list[int]) -> Any:
    """Each tensor of ``out`` as ``("tensor", shape, stride, dtype, index of the operand
    whose storage it shares, or None)``."""
    if isinstance(out, torch.Tensor):
        key = out.untyped_storage()._cdata
        shared = storages.index(key) if key in storages else None
        return ("tensor", tuple(out.shape), tuple(out.stride()), out.dtype, shared)
    if isinstance(out, (tuple, list)):
        return ("tuple", tuple(_describe(o, storages) for o in out))
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


def _workspace(op: str, args: list, out: Any, kids: list) -> int:
    """The bytes ``op`` allocates and frees inside a call on ``args``, by its table fact."""
    fact = TABLE[op].workspace
    if fact is None:
        return 0
    if fact == "measured":
        return _measured(op, kids, out)
    return int(fact(args, out))


_MEASURED: dict[tuple, int] = {}


def _measured(op: str, kids: list, out: Any) -> int:
    """The bytes a call of ``op`` allocates beyond its result, measured once per operand
    layouts: the op run on zeros of those sizes, dtypes and strides on this CPU."""
    key = (op, tuple(_layout(k) for k in kids))
    if key not in _MEASURED:
        args = _real(kids)
        result = sum(t.numel() * t.element_size() for t in _flat(out))
        spec = SPECS[op]
        with torch.no_grad():
            _MEASURED[key] = max(0, allocated_peak(lambda: spec.run(args)) - result)
    return _MEASURED[key]


def _real(value: Any) -> Any:
    if isinstance(value, Tensor):
        extent = sum((d - 1) * s for d, s in zip(value.shape, value.stride)) + 1
        return torch.zeros(max(extent, 1), dtype=value.dtype).as_strided(
            value.shape, value.stride)
    if isinstance(value, tuple):
        return tuple(_real(v) for v in value)
    if isinstance(value, list):
        return [_real(v) for v in value]
    return value


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def _opaque(egraph, token: Any, values: dict, at: int) -> Any:
    """An opaque call replayed on meta tensors where its target runs on them (an aten
    op, mostly), each operand it writes into a copy, as emission makes; None where it
    does not run on them."""
    call = getattr(getattr(egraph, "fx", None), "opaque", {}).get(token)
    if call is None or not callable(call.target):
        return None
    find = egraph.find
    written: list[Tensor] = []

    def resolve(a: Any) -> Any:
        if isinstance(a, AttributeRef):
            raise LookupError(a.target)
        if isinstance(a, ClassRef):
            value = values.get(find(a.cid))
            if isinstance(a, WrittenRef) and isinstance(value, Tensor):
                value = Tensor(value.shape, _contiguous(value.shape), value.dtype,
                               (at, "copy", len(written)))
                written.append(value)
            return value
        return a

    made: list[torch.Tensor] = []
    try:
        args = fx.node.map_aggregate(call.args, resolve)
        kwargs = fx.node.map_aggregate(call.kwargs, resolve)
        out = call.target(*_on_meta(tuple(args), made),
                          **{k: _on_meta(v, made) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - not on meta tensors: a new tensor
        return None
    operands = _tensors((tuple(args), tuple(kwargs.values())))
    return _rebuild(_describe(out, [t.untyped_storage()._cdata for t in made]), operands, at)
