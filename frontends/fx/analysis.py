"""The analysis of e-graphs built from FX: shape, dtype and folded scalar values per class.

Each class carries a :class:`Meta`. Shapes come from the example inputs (fake tensors, no
real compute) and are propagated through every canonical op by running its torch
implementation on meta tensors, so a rule's right side gets its shape checked without any
per-op shape code. Merging two classes whose shapes or dtypes differ is an unsound rule and
raises :class:`~egraph.egraph.UnsoundMerge`. Scalar arithmetic on known values (``x.size(-1)
** 0.5``) folds to a literal.

Symbolic sizes (torch.compile's dynamic shapes, torch.export's ``Dim``) stay symbolic: a
shape holds :class:`~egraph.dims.Size` expressions such as ``s0`` or ``2*s0``, propagated
on fake tensors of a shape environment of the analysis' own; a shape that would hold only
for the example's sizes stays unknown.

>>> import torch
>>> m = Meta.of(torch.empty(2, 3))
>>> m.shape, m.dtype
((2, 3), torch.float32)
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from egraph import signs
from egraph.analysis import Analysis
from egraph.dims import Size, decide, map_sizes, sizes_in
from egraph.egraph import UnsoundMerge
from egraph.ops.table import TABLE, interval_of
from egraph.scalars import FLOAT_OPS, Fraction, exact_of, fold, representable
from egraph.signs import ANY, NEG, NONNEG, NONPOS, POS, ZERO
from egraph.term import is_literal_op, literal
from frontends.fx.observed import observed_range, triangle_of
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class Meta(NamedTuple):
    """What is known of a class: ``kind`` is tensor, literal, scalar, tuple or unknown;
    ``sign`` the proven signs of its values (:mod:`egraph.signs`); ``lo``/``hi`` the range
    observed from the example inputs, ``small`` the smallest magnitude and ``sens`` how much
    a relative error in the value moves the outputs (NaN: not measured); they inform costs
    only, never rules. ``from_size``: a number (or tuple, slice) computed from a tensor's
    size (``x.size(0)``, ``C // nh``, a SymInt): it keeps the example's value for guards
    and normalisation, but is never replaced by a literal, so the emitted program
    recomputes it from its input and runs on other sizes. ``finite``: every value is
    proven finite, whatever the inputs hold (an integer tensor, a finite number, an op
    the op table says cannot overflow applied to finite values): rules whose right side
    drops an operand (``x - x -> 0``) need it, as inf - inf is NaN. ``triangle``: the
    example value is a causal mask (:func:`triangle_of`); like ``lo``/``hi`` it is observed,
    so a rule may let it choose the form it writes but never rest on it (nanoGPT's mask
    buffer becomes attention that checks the mask at run time)."""

    kind: str
    shape: tuple | None = None
    dtype: Any = None
    value: Any = None
    sign: int = ANY
    lo: float = -math.inf
    hi: float = math.inf
    small: float = 0.0
    sens: float = math.nan
    exact: Any = None
    from_size: bool = False
    finite: bool = False
    triangle: str | None = None

    @classmethod
    def of(cls, value: Any, observe: bool = True) -> Meta:
        """The meta of a concrete, fake or meta tensor, a tuple of them, or a scalar;
        a real tensor's observed range comes with it unless ``observe`` is false (a pass
        over the values: a large embedding's costs more than the rest of ingest)."""
        if isinstance(value, torch.Tensor):
            # A symbolic size is read as its expression (never int(), which would make
            # dynamo guard on, that is specialise, the example's size).
            shape = tuple(size_of(s) for s in value.shape)
            meta = cls("tensor", None if None in shape else shape, value.dtype,
                       finite=_exact_dtype(value.dtype))
            return meta._replace(**observed_range(value),
                                 triangle=triangle_of(value)) if observe else meta
        if isinstance(value, (tuple, list)):
            return cls("tuple", value=tuple(cls.of(v, observe) for v in value))
        if isinstance(value, torch.SymInt):
            size = size_of(value)
            if isinstance(size, Size):
                return _number("scalar", None, size)._replace(from_size=True)
            return cls("scalar", from_size=True)  # an unbacked number: value unknown
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            return cls("scalar", from_size=True)  # symbolic: value unknown, never baked
        if isinstance(value, (bool, int, float)):
            return _number("scalar", exact_of(value), value)
        return cls("unknown")

    def signature(self) -> tuple:
        """What shape inference reads of this class: a tensor's shape and dtype, or a
        number's type and value (``1``, ``1.0``, ``True`` and ``-0.0`` stay apart).

        >>> Meta.of(torch.empty(2, 3)).signature()
        ('tensor', (2, 3), torch.float32)
        """
        if self.kind == "tensor":
            if self.shape is None or self.dtype is None:
                raise _Unknown
            return ("tensor", self.shape, self.dtype)
        if self.kind == "tuple" and isinstance(self.value, tuple):
            return ("tuple", tuple(m.signature() for m in self.value))
        if self.kind in ("literal", "scalar"):
            if self.value is None and self.kind == "scalar":
                raise _Unknown
            value = self.value
            return ("value", type(value), _frozen(value),
                    math.copysign(1.0, value) if isinstance(value, float) else None)
        raise _Unknown


class _Slice(tuple):
    """A slice's start, stop and step in a signature: hashable, where Python 3.11's
    ``slice`` is not, so that the inferred meta of an indexing op (``x[:, :t]``) is
    remembered like any other's (a Llama's rotary tables are sliced once per layer)."""

    __slots__ = ()


def _frozen(value: Any) -> Any:
    """``value`` with each slice in it (in tuples, at any depth) a :class:`_Slice`."""
    if isinstance(value, slice):
        return _Slice(map(_frozen, (value.start, value.stop, value.step)))
    if type(value) is tuple:
        return tuple(map(_frozen, value))
    return value


def _thawed(value: Any) -> Any:
    """``value`` as it was before :func:`_frozen`."""
    if isinstance(value, _Slice):
        return slice(*map(_thawed, value))
    if type(value) is tuple:
        return tuple(map(_thawed, value))
    return value


def size_of(size: Any) -> int | Size | None:
    """A size as the analysis holds it: an int, a :class:`~egraph.dims.Size` for a
    symbolic one (its expression, the example's value of it and of each of its symbols,
    and the least value each may take), or None for a size no example value stands for
    (an unbacked ``x.nonzero()`` length).

    >>> size_of(3)
    3
    """
    if not isinstance(size, torch.SymInt):
        return int(size)
    node = size.node
    expr = node.expr
    if getattr(expr, "is_Integer", False):
        return int(expr)
    env = node.shape_env
    values = getattr(env, "backed_var_to_val", None)  # (its name from torch 2.10 on)
    values = env.var_to_val if values is None else values
    bindings = {}
    for symbol in expr.free_symbols:
        hint = values.get(symbol)
        bound = env.var_to_range.get(symbol)
        if hint is None or bound is None:
            return None
        low, high = bound.lower, bound.upper  # (either may be infinite)
        bindings[symbol] = (int(hint), int(low) if getattr(low, "is_Integer", False) else None,
                            int(high) if getattr(high, "is_Integer", False) else None)
    hint = node.hint
    if hint is None:
        hint = expr.xreplace({s: h for s, (h, _, _) in bindings.items()})
    return Size(int(hint), expr, bindings)


def literal_value(op: tuple) -> Any:
    """The Python value of a typed literal operator (dtypes become torch dtypes, devices
    torch devices, layouts torch memory formats).

    >>> literal_value(("layout", "channels_last"))
    torch.channels_last
    """
    tag, value = op
    if tag in ("dtype", "layout"):
        return getattr(torch, value)
    if tag == "device":
        return torch.device(value)
    if tag == "ellipsis":
        return Ellipsis
    return value


class _Unknown(Exception):
    """Shape inference cannot run: some input's shape is not known."""


UNKNOWN = Meta("unknown")

SCALAR_OPS = FLOAT_OPS
"""Python implementations of ops on scalars (shape arithmetic), used to emit."""


def _number(kind: str, exact: Fraction | None, value: Any) -> Meta:
    """The meta of a known number: its exact value (None if not known exactly) and the
    value Python computes; the sign and range follow the exact value when there is one.
    An approximate zero proves no sign: ``math.exp(-1000)`` underflows to 0.0 but is > 0."""
    if isinstance(value, bool) or value is None:
        return Meta(kind, value=value, finite=value is not None)
    if isinstance(value, Size):
        sign = POS if decide(value, 0, ">") else NEG if decide(value, 0, "<") else ANY
        return Meta(kind, value=value, sign=sign, finite=True)
    v = float(exact) if exact is not None and representable(exact) else float(value)
    if exact is None:
        sign = signs.of_value(float(value)) if value != 0 else ANY
    else:
        sign = POS if exact > 0 else NEG if exact < 0 else ZERO
    return Meta(kind, value=value, sign=sign, lo=v, hi=v, exact=exact,
                finite=isinstance(value, int) or math.isfinite(value))


def _exact_dtype(dtype: Any) -> bool:
    """Integer and boolean tensors hold only finite values."""
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def _argument(signature: tuple, tensor: Callable) -> Any:
    """The value a signature (:meth:`Meta.signature`) stands for, tensors made by
    ``tensor(shape, dtype)``."""
    if signature[0] == "tensor":
        return tensor(signature[1], signature[2])
    if signature[0] == "tuple":
        return tuple(_argument(s, tensor) for s in signature[1])
    return _thawed(signature[2])


def _meta_tensor(shape: tuple, dtype: Any) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _infer(op: str, key: tuple) -> Meta:
    """The meta of ``op`` applied to classes of these signatures (:meth:`Meta.signature`),
    by running its torch implementation on meta tensors."""
    args = [_argument(k, _meta_tensor) for k in key]
    try:
        return Meta.of(SPECS[op].run(args))
    except Exception:  # noqa: BLE001 - an op meta tensors cannot run: shape stays unknown
        return UNKNOWN


@functools.lru_cache(maxsize=1 << 16)
def _inferred(op: str, key: tuple) -> Meta:
    """:func:`_infer`, remembered: the layers of a model repeat the same ops on the same
    shapes, and running an op on meta tensors costs a millisecond."""
    return _infer(op, key)


@functools.lru_cache(maxsize=1 << 14)
def _inferred_symbolic(op: str, key: tuple, bindings: tuple) -> Meta:
    """The meta of ``op`` on classes of these signatures where some size is symbolic, by
    running it on fake tensors whose sizes are symbols of a shape environment of the
    analysis' own (``bindings``: each symbol's example value and range). The result holds
    for every size only if the op never asked which way a comparison of sizes goes: where
    it did (broadcasting ``s0`` against ``s1``, or against 8), the shape holds for the
    example's sizes alone and stays unknown."""
    shapes = _SHAPES.get(bindings)
    if shapes is None:
        if len(_SHAPES) >= 64:
            _SHAPES.pop(next(iter(_SHAPES)))
        shapes = _SHAPES[bindings] = _SymbolicShapes(bindings)
    meta = shapes.infer(op, key)
    if shapes.spoiled:  # what it assumed would hold for later ops: start afresh
        del _SHAPES[bindings]
    return meta


class _SymbolicShapes:
    """A shape environment with a symbol for each of the graph's (same example value, same
    range), in which ops run on fake tensors. One serves every op on the same symbols
    (making one costs more than most ops) until an op leaves something behind: a guard,
    a runtime assertion or a replacement of one symbol by another, all facts of the
    example's sizes."""

    def __init__(self, bindings: tuple):
        from torch._dynamo.source import ConstantSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

        self.env = env = ShapeEnv(duck_shape=False)
        self.mode = FakeTensorMode(shape_env=env)
        # (the analysis remembers each signature's answer, so fake tensors' own cache of
        # dispatches only costs: it halves the inference of a symbolic graph's ops)
        self.mode.cache_enabled = False
        self.ours: dict = {}
        self.theirs: dict = {}
        self.bindings = dict(bindings)
        self.usable, self.spoiled = True, False
        for symbol, (hint, low, high) in bindings:
            if low is None or low < 2 or hint < 2:
                self.usable = False  # a size that may be 0 or 1 broadcasts differently
                return
            mine = env.create_symbol(hint, ConstantSource(symbol.name),
                                     dynamic_dim=DimDynamic.DYNAMIC)
            if high is not None or low > 2:
                env.constrain_symbol_range(mine, low, high if high is not None else sys.maxsize)
            self.ours[symbol], self.theirs[mine] = mine, symbol
        self.clean = self._state()

    def _state(self) -> tuple:
        env = self.env
        return (len(env.guards), len(env.replacements),
                sum(len(v) for v in env.deferred_runtime_asserts.values()))

    def _symint(self, size: Size) -> torch.SymInt:
        return self.env.create_symintnode(size.expr.xreplace(self.ours), hint=int(size))

    def infer(self, op: str, key: tuple) -> Meta:
        if not self.usable:
            return UNKNOWN
        quiet = logging.getLogger("torch._subclasses.fake_tensor")
        was = quiet.disabled
        quiet.disabled = True  # it logs every op it cannot run, which is an answer here
        try:
            with self.mode:
                args = [_argument(map_sizes(k, self._symint), _meta_tensor) for k in key]
                meta = Meta.of(SPECS[op].run_symbolic(args))
        except Exception:  # noqa: BLE001 - an op fake tensors cannot run: shape unknown
            meta = UNKNOWN
        finally:
            quiet.disabled = was
        if self._state() != self.clean:
            self.spoiled = True
            return UNKNOWN
        return _renamed(meta, self.theirs, self.bindings)


_SHAPES: dict[tuple, _SymbolicShapes] = {}
"""The shape environments of the symbols met lately (the graphs being optimised)."""


def _renamed(meta: Meta, symbols: dict, bindings: dict) -> Meta:
    """``meta`` with each symbol of a private shape environment replaced by the graph's."""
    def size(value: Size) -> Size:
        expr = value.expr.xreplace(symbols)
        return Size(int(value), expr, {s: bindings[s] for s in expr.free_symbols})

    if meta.kind == "tuple" and isinstance(meta.value, tuple):
        return meta._replace(value=tuple(_renamed(m, symbols, bindings) for m in meta.value))
    return meta._replace(shape=map_sizes(meta.shape, size), value=map_sizes(meta.value, size))


def _bindings(key: tuple) -> tuple:
    """The symbols of the sizes in a signature, each with its example value and range."""
    found: dict = {}
    for size in sizes_in(key):
        found.update(size.bindings)
    return tuple(sorted(found.items(), key=lambda kv: kv[0].name))


_DEVICE_PARAM = {name: spec.params.index("device") for name, spec in SPECS.items()
                 if "device" in spec.params}
"""The position of the device among each creation op's operands."""

_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class TensorAnalysis(Analysis):
    """Shape/dtype/value analysis over the canonical vocabulary.

    ``leaves`` maps the name of each input, parameter, constant and opaque call to its meta.
    """

    def __init__(self, leaves: dict[str, Meta] | None = None):
        self.leaves: dict[str, Meta] = dict(leaves or {})

    def make(self, egraph: EGraph, node: tuple) -> Meta:
        meta = self._make(egraph, node)
        if len(node) > 1 and meta.kind in ("scalar", "literal", "tuple") and _from_size(
                egraph, node):
            meta = _sized(meta)
        if len(node) == 1 or meta.kind not in ("tensor", "scalar"):
            return meta
        if not meta.finite and _finite(egraph, node, meta):
            meta = meta._replace(finite=True)
        sign = _sign(egraph, node) & meta.sign
        lo, hi = meta.lo, meta.hi
        if meta.kind == "tensor" and isinstance(node[0], str) and node[0] not in (
                "input", "param", "const", "opaque"):
            lo, hi = _observed_interval(egraph, node, meta)
        lo, hi = _clip_to_sign(lo, hi, sign)
        small = max(meta.small, _smallest(lo, hi))
        if (sign, lo, hi, small) == (meta.sign, meta.lo, meta.hi, meta.small):
            return meta
        return meta._replace(sign=sign, lo=lo, hi=hi, small=small)

    def _make(self, egraph: EGraph, node: tuple) -> Meta:
        op = node[0]
        if len(node) == 1:
            if is_literal_op(op):
                value = literal_value(op)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return _number("literal", exact_of(value), value)
                return Meta("literal", value=value)
            return UNKNOWN
        data = egraph.class_data
        find = egraph.union_find.find
        kids = [data[find(c)] or UNKNOWN for c in node[1:]]
        if op in ("tuple", "slice"):
            if all(k.kind in ("literal", "scalar") and (k.value is not None or k.kind ==
                                                         "literal") for k in kids):
                values = [k.value for k in kids]
                return Meta("literal", value=tuple(values) if op == "tuple" else slice(*values))
            if op == "tuple" and any(k.kind == "tensor" for k in kids) and all(
                    k.kind in ("tensor", "literal") for k in kids):
                return Meta("tuple", value=tuple(kids))  # an index: ``x[rows, cols]``
            return UNKNOWN
        if op in ("input", "param", "const"):
            return self.leaves.get(f"{op}:{kids[0].value}", UNKNOWN)
        if op == "opaque":
            return self.leaves.get(f"opaque:{kids[0].value}", UNKNOWN)
        if op == "getitem" and kids[0].kind == "tuple" and isinstance(kids[1].value, int):
            items = kids[0].value
            index = kids[1].value
            return items[index] if -len(items) <= index < len(items) else UNKNOWN
        if op == "size" and kids[0].kind == "tensor" and kids[0].shape is None:
            return Meta("scalar")
        if all(k.kind in ("literal", "scalar") for k in kids) and op in FLOAT_OPS:
            if not all(isinstance(k.value, (int, float)) for k in kids):
                return Meta("scalar")
            if op in _COMPARISONS and any(isinstance(k.value, Size) for k in kids):
                # Size's == is "the same expression"; a fold needs "equal for every size"
                return _number("scalar", None, decide(kids[0].value, kids[1].value,
                                                      _COMPARISONS[op]))
            exact, value = fold(op, [(k.exact, k.value) for k in kids])
            return _number("scalar", exact, value)
        if op not in SPECS:
            return UNKNOWN
        if op in _DEVICE_PARAM and kids[_DEVICE_PARAM[op]].kind == "unknown":
            # a device read at run time (``device=q.device`` in a symbolic trace): what it
            # makes has the same shape and dtype anywhere
            kids[_DEVICE_PARAM[op]] = Meta("literal", value=None)
        try:
            key = tuple(k.signature() for k in kids)
        except _Unknown:
            return UNKNOWN
        bindings = _bindings(key)
        if bindings:
            try:
                return _inferred_symbolic(op, key, bindings)
            except TypeError:  # an unhashable attribute (a list): infer without the memo
                return _inferred_symbolic.__wrapped__(op, key, bindings)
        try:
            return _inferred(op, key)
        except TypeError:  # an unhashable attribute (a list): infer without the memo
            return _infer(op, key)

    def merge(self, a: Meta | None, b: Meta | None) -> Meta | None:
        if a is None or a.kind == "unknown":
            return b if b is not None and b.kind != "unknown" else a
        if b is None or b.kind == "unknown":
            return a
        sign = a.sign & b.sign
        if not sign:
            raise UnsoundMerge(f"merging a value proven {signs.describe(a.sign)} with one "
                               f"proven {signs.describe(b.sign)}")
        if a.kind == "tensor" and b.kind == "tensor":
            if a.shape is not None and b.shape is not None and a.shape != b.shape and (
                    _different(a.shape, b.shape)):
                raise UnsoundMerge(f"merging a tensor of shape {a.shape} with one of {b.shape}")
            if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
                raise UnsoundMerge(f"merging a {a.dtype} tensor with a {b.dtype} tensor")
            base = b if a.shape is None and b.shape is not None else a
            lo, hi = _tighter(a.lo, b.lo, max), _tighter(a.hi, b.hi, min)
            small = _tighter(a.small, b.small, max)
            sens = a.sens if a.sens == a.sens else b.sens  # measured on the source, if any
            finite = a.finite or b.finite
            triangle = a.triangle or b.triangle  # (a leaf's, merged with a view of it)
            if (base.sign, base.lo, base.hi, base.small, base.finite, base.triangle) == (
                    sign, lo, hi, small, finite, triangle) and (
                    base.sens == sens or base.sens != base.sens and sens != sens):
                return base
            return base._replace(sign=sign, lo=lo, hi=hi, small=small, sens=sens,
                                 finite=finite, triangle=triangle)
        if a.kind in ("literal", "scalar") and b.kind in ("literal", "scalar"):
            if a.exact is not None and b.exact is not None:
                if a.exact != b.exact:
                    raise UnsoundMerge(f"merging the value {a.value!r} with {b.value!r}")
                return a
            if a.exact is None and b.exact is not None:
                return b  # the exact value is the better description of the class
            # Two values known only approximately (sqrt(48) evaluated two ways) may differ
            # by roundings, even by cancellation: keep the first, never refuse.
            return b if a.value is None and b.value is not None else a
        if {a.kind, b.kind} & {"literal", "scalar"} and {a.kind, b.kind} & {"tensor"}:
            raise UnsoundMerge(f"merging a {a.kind} with a {b.kind}")
        return a

    def modify(self, egraph: EGraph, cid: int) -> None:
        """A folded number becomes a literal only when the literal is exactly its value (a
        float literal for ``1e-5 * 1e5``, which is not a float, would change the program);
        otherwise the class keeps computing it as written."""
        meta = egraph.data(cid)
        if meta is None or meta.kind != "scalar" or meta.value is None or meta.from_size:
            return
        value = meta.value
        if isinstance(value, bool):
            leaf = egraph.add_node(literal(value))
        elif representable(meta.exact):
            number = int(meta.exact) if isinstance(value, int) else float(meta.exact)
            leaf = egraph.add_node(literal(number))
        else:
            return
        egraph.union(cid, leaf, "constant-fold")


def _different(a: tuple, b: tuple) -> bool:
    """Whether two shapes that are not the same expressions differ: in rank, or in a size
    at the example's sizes. Two expressions of one value (``2*s0 + 2`` and
    ``2*(s0 + 1)``, a floor and torch's ``FloorDiv``) are not told apart."""
    return len(a) != len(b) or any(int(x) != int(y) for x, y in zip(a, b))


def _from_size(egraph: EGraph, node: tuple) -> bool:
    """True when an e-node's (non-tensor) value is computed from a tensor's size."""
    if node[0] == "size":
        return True
    find, data = egraph.union_find.find, egraph.class_data
    return any(getattr(data[find(c)], "from_size", False) for c in node[1:])


def _sized(meta: Meta) -> Meta:
    """``meta`` marked as computed from sizes (the items of a tuple too)."""
    if meta.kind == "tuple" and isinstance(meta.value, tuple):
        return meta._replace(from_size=True, value=tuple(
            _sized(m) if isinstance(m, Meta) else m for m in meta.value))
    return meta if meta.from_size else meta._replace(from_size=True)


def _sign(egraph: EGraph, node: tuple) -> int:
    """The signs an op guarantees, from its operands' proven signs (the op table's sign
    rule), and two relational facts: ``x * x >= 0`` and ``x - amax(x) <= 0``."""
    op = node[0]
    entry = TABLE.get(op) if isinstance(op, str) else None
    if entry is None or entry.sign is None:
        return ANY
    if isinstance(entry.sign, int):
        return entry.sign
    find = egraph.union_find.find
    data = egraph.class_data
    kids = [data[find(c)] or UNKNOWN for c in node[1:]]
    if op == "mul" and find(node[1]) == find(node[2]):
        return POS if not kids[0].sign & ZERO else NONNEG
    if op == "sub" and _is_max_of(egraph, node[2], node[1]):
        return NONPOS
    return entry.sign([k.sign for k in kids], [k.value for k in kids])


def _finite(egraph: EGraph, node: tuple, meta: Meta) -> bool:
    """Whether every value of an e-node is finite, whatever the inputs hold: an integer
    or boolean result; a creation op's values (``zeros_like(x)`` of any x, ``full`` of a
    finite fill); an op the op table marks ``finite`` (or a view) of finite operands; a
    conversion of finite values to a dtype whose range holds the source's."""
    if meta.kind == "tensor" and _exact_dtype(meta.dtype):
        return True
    op = node[0]
    entry = TABLE.get(op) if isinstance(op, str) else None
    if entry is None or not (entry.finite or entry.kind in ("view", "creation")):
        return False
    find = egraph.union_find.find
    data = egraph.class_data
    kids = [data[find(c)] or UNKNOWN for c in node[1:]]
    if op in ("zeros_like", "ones_like", "arange"):
        return True
    # (a size is an integer; literals other than numbers are attributes: dims, dtypes)
    operands = [k for k in kids if not (k.kind == "scalar" and k.from_size or (
        k.kind == "literal" and not isinstance(k.value, (int, float))))]
    if op in ("full", "full_like"):
        operands = [kids[entry.params.index("value")]]
    if not all(k.finite for k in operands):
        return False
    if op == "to":
        source = kids[0].dtype
        return source is not None and meta.dtype is not None and (
            _largest(meta.dtype) >= _largest(source))
    return True


def _largest(dtype: Any) -> float:
    """The largest finite value of a dtype."""
    if dtype == torch.bool:
        return 1.0
    info = torch.finfo(dtype) if dtype.is_floating_point or dtype.is_complex else (
        torch.iinfo(dtype))
    return float(info.max)


def _is_max_of(egraph: EGraph, candidate: int, x: int) -> bool:
    """True when class ``candidate`` holds ``amax(x, dims, keepdim=True)``."""
    find, data = egraph.union_find.find, egraph.class_data
    x = find(x)
    for n in egraph.class_nodes[find(candidate)] or ():
        if n[0] == "amax" and find(n[1]) == x:
            keep = data[find(n[3])]
            if keep is not None and keep.value is True:
                return True
    return False


def _tighter(x: float, y: float, pick) -> float:
    """The tighter bound, ignoring changes below 1e-9 relative (so cycles settle)."""
    best = pick(x, y)
    if math.isinf(x):
        return best
    return x if abs(best - x) <= 1e-9 * max(1.0, abs(x)) else best


def _smallest(lo: float, hi: float) -> float:
    """The smallest magnitude in ``[lo, hi]`` (0 when it contains 0)."""
    return 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))


def _clip_to_sign(lo: float, hi: float, sign: int) -> tuple[float, float]:
    if not sign & NEG:
        lo = max(lo, 0.0)
    if not sign & POS:
        hi = min(hi, 0.0)
    return lo, hi


def _observed_interval(egraph: EGraph, node: tuple, meta: Meta) -> tuple[float, float]:
    find, data = egraph.union_find.find, egraph.class_data
    kids = [data[find(c)] or UNKNOWN for c in node[1:]]
    intervals = []
    values = []
    for k in kids:
        if k.kind == "literal" and k.value is None:
            intervals.append(None)
        elif k.kind in ("literal", "scalar") and isinstance(k.value, (int, float)):
            v = float(int(k.value) if isinstance(k.value, Size) else k.value)  # (observed)
            intervals.append((v, v))
        else:
            intervals.append((k.lo, k.hi))
        values.append(k.value)
    op = node[0]
    if op == "div" and _is_max_abs_of(egraph, node[2], node[1]):
        return (-1.0, 1.0)  # x / max|x| (relational: interval arithmetic cannot see it)
    shapes = (meta.shape, *(k.shape for k in kids))
    try:
        # (observed: a bound made of a symbolic size is read at the example's value)
        lo, hi = (float(int(b)) if isinstance(b, Size) else float(b)
                  for b in interval_of(op, intervals, values, shapes))
    except (TypeError, ValueError, ArithmeticError, IndexError):
        return (-math.inf, math.inf)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        return (-math.inf, math.inf)
    return (lo, hi)


def _is_max_abs_of(egraph: EGraph, candidate: int, x: int, depth: int = 2) -> bool:
    """True when class ``candidate`` holds ``amax(abs(x), dims, keepdim=True)``, possibly
    clamped from below by a positive literal."""
    find, data, cnodes = egraph.union_find.find, egraph.class_data, egraph.class_nodes
    x = find(x)
    for n in cnodes[find(candidate)] or ():
        if n[0] == "amax" and any(m[0] == "abs" and find(m[1]) == x
                                  for m in cnodes[find(n[1])] or ()):
            keep = data[find(n[3])]
            if keep is not None and keep.value is True:
                return True
        if n[0] == "clamp" and depth > 0:
            low = data[find(n[2])]
            if low is not None and isinstance(low.value, (int, float)) and low.value > 0 and (
                    _is_max_abs_of(egraph, n[1], x, depth - 1)):
                return True
    return False
