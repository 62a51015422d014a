"""Terms: the canonical expressions of ingest added to an e-graph. Literals are tagged leaves
(a dtype, a device, a shape), constants leaves whose class also holds how a causal mask is
made, and an op over its operands' classes has its sizes resolved (``x.size()`` is the
tuple of its dims, each computed from the input), its attributes normalised and its
constant operands folded. :class:`~frontends.fx.builder.Builder` walks an FX graph with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from egraph.dims import is_symbolic
from egraph.egraph import EGraph
from egraph.term import literal
from frontends.fx.analysis import Meta, TensorAnalysis
from frontends.fx.vocabulary import SPECS, UNKNOWN_VALUE, is_expression

__all__ = ["SHAPE_PARAMS", "TermBuilder"]

SHAPE_PARAMS = {"reshape": 1, "expand": 1, "full": 0}
"""Ops whose parameter at that position is a whole target shape."""

_MAX_FOLDED_BYTES = 1 << 20
"""Constant subgraphs whose result takes more bytes stay computed (they would bloat the
module): a float32 table of 256K elements, a bool causal mask of 2 x 724 x 724."""


_CONVOLUTIONS = frozenset({"conv1d", "conv2d"})
"""Ops whose padding may be given by name (:meth:`TermBuilder._explicit_padding`)."""


def _per_dim(value: Any, dims: int) -> tuple[int, ...] | None:
    """A stride or dilation (an int, or one per spatial dim) as one int per dim; None
    where it is not known here."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * dims
    if isinstance(value, tuple) and len(value) in (1, dims) and all(
            isinstance(v, int) for v in value):
        return value * dims if len(value) == 1 else value
    return None


class TermBuilder:
    """Adds canonical expressions to a new e-graph made by ``make_egraph(analysis=...)``;
    ``env`` holds the class of each FX node added so far, for :meth:`value`.

    >>> terms = TermBuilder()
    >>> x = terms.leaf("input", "x", Meta("tensor", shape=(2, 3), dtype=torch.float32))
    >>> y = terms.apply("sum", [x, terms.literal((1,)), terms.literal(False)])
    >>> terms.eg.data(y).shape
    (2,)
    """

    def __init__(self, make_egraph: Callable[..., EGraph] = EGraph):
        self.analysis = TensorAnalysis()
        self.eg = make_egraph(analysis=self.analysis)
        self.env: dict[fx.Node, Any] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.folded: dict[int, torch.Tensor] = {}

    # -- leaves ---------------------------------------------------------------------------

    def literal(self, value: Any) -> int:
        """The class of a literal: a dtype, device or layout leaf, a tuple of ints (a
        shape), a tuple or slice of classes, a constant tensor, or a tagged number."""
        eg = self.eg
        if isinstance(value, torch.dtype):
            return eg.add_node(("dtype", str(value).removeprefix("torch.")))
        if isinstance(value, torch.device):
            return eg.add_node(("device", str(value)))
        if isinstance(value, (torch.Size, list)):
            value = tuple(value)
        if isinstance(value, tuple):
            if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return eg.add_node(literal(value))
            return self._tuple([self.value(v) for v in value])
        if isinstance(value, slice):
            # A bound may be a traced size (``bias[:, :, :t, :t]`` with ``t = x.size(1)``).
            return eg.add_node("slice", [self.value(value.start), self.value(value.stop),
                                         self.value(value.step)])
        if isinstance(value, torch.Tensor):
            return self.constant(value)
        if isinstance(value, torch.memory_format):
            return eg.add_node(("layout", str(value).removeprefix("torch.")))
        return eg.add_node(literal(value))

    def constant(self, tensor: torch.Tensor) -> int:
        """The class of a constant leaf holding ``tensor`` (kept in :attr:`constants`)."""
        name = f"_egraph_const{len(self.constants)}"
        self.constants[name] = tensor
        self.analysis.leaves[f"const:{name}"] = Meta.of(tensor)
        cid = self.eg.add_node("const", [self.eg.add_node(literal(name))])
        # Where a folded constant is one the rules read, its class also holds how it is
        # made: a causal mask (``ones(T, T).triu(1)``, for ``sdpa-causal``; an additive
        # one, 0 below a fill, for ``sdpa-causal-additive``), a float of no dims
        # (``torch.full([], finfo.min)``, a fill the mask rules read as a number).
        # (a meta tensor has no values to read: it is only a leaf)
        triangle = None if tensor.is_meta else _triangle(tensor)
        additive = None if tensor.is_meta or triangle is not None else (
            _additive_triangle(tensor))
        if triangle is not None:
            made = self.eg.add_node(triangle[0], [
                self._full(triangle[2], tensor.device, True, torch.bool),
                self.literal(triangle[1])])
            if tuple(tensor.shape) != triangle[2]:
                made = self.eg.add_node("reshape", [made, self.literal(tuple(tensor.shape))])
            self.eg.union(cid, made)
        elif additive is not None:
            fill, size = additive
            above = self.eg.add_node("triu", [
                self._full((size, size), tensor.device, True, torch.bool), self.literal(1)])
            zeros = self._full(tuple(tensor.shape), tensor.device, 0.0, tensor.dtype)
            self.eg.union(cid, self.eg.add_node("masked_fill", [zeros, above,
                                                                self.literal(fill)]))
        elif tensor.dim() == 0 and tensor.is_floating_point() and not tensor.is_meta:
            self.eg.union(cid, self._full((), tensor.device, tensor.item(), tensor.dtype))
        return cid

    def _full(self, shape: tuple, device: torch.device, value, dtype: torch.dtype) -> int:
        """The class of ``full(shape, value)`` of ``dtype`` on ``device``."""
        return self.eg.add_node("full", [self.literal(tuple(shape)), self.literal(value),
                                         self.literal(dtype), self.literal(device)])

    def leaf(self, kind: str, name: str, meta: Meta | None) -> int:
        """The class of the leaf ``(kind "name")`` (an input, a parameter), with its meta."""
        if meta is not None:
            self.analysis.leaves[f"{kind}:{name}"] = meta
        return self.eg.add_node(kind, [self.eg.add_node(literal(name))])

    def value(self, arg: Any) -> int:
        """The class of an FX argument: a node's class, a literal, a nested structure."""
        if isinstance(arg, fx.Node):
            cid = self.env[arg]
            if cid is None:
                raise ValueError(f"{arg.name} has no value (an output of an effect?)")
            return cid
        return self.literal(arg)

    # -- expressions ----------------------------------------------------------------------

    def expr(self, lowered: tuple[str, list]) -> int:
        """The class of a lowered expression (:func:`is_expression`), nested ones first."""
        name, values = lowered
        kids = [self.expr(v) if is_expression(v) else self.value(v) for v in values]
        if name == "identity":
            return kids[0]
        if name == "tuple":  # a pair of results (var_mean), picked from by getitem
            return self._tuple(kids)
        return self.apply(name, kids)

    def apply(self, name: str, kids: list[int]) -> int:
        """The class of op ``name`` over the classes ``kids``: sizes resolved, attributes
        normalised, constant inputs folded."""
        shaped = self._shape_value(name, kids)
        if shaped is not None:
            return shaped
        if name in SHAPE_PARAMS:
            kids[SHAPE_PARAMS[name]] = self._whole_shape(kids[SHAPE_PARAMS[name]])
        if name in _CONVOLUTIONS:
            kids = self._explicit_padding(kids)
        spec = SPECS[name]
        if spec.normalize is not None:
            kids = self._normalized(spec, kids)
        folded = self._fold(spec, kids)
        if folded is not None:
            return folded
        return self.eg.add_node(name, kids)

    def _explicit_padding(self, kids: list[int]) -> list[int]:
        """A convolution's operands with its padding given by name (``padding="same"`` or
        ``"valid"``, as transformers' EfficientNet and MobileNet write it) as the numbers it
        stands for, by torch's own rule: ``"valid"`` none; ``"same"`` each spatial dim's
        ``dilation * (kernel - 1)``, half on each side, the odd one on the right as a pad
        of the input. Left as given where the weight's shape is unknown or torch refuses
        the call (``"same"`` with a stride): the program then keeps the user's call.

        >>> import torch.nn.functional as F
        >>> terms = TermBuilder()
        >>> x = terms.leaf("input", "x", Meta("tensor", shape=(1, 2, 5, 5), dtype=torch.float32))
        >>> w = terms.leaf("param", "w", Meta("tensor", shape=(3, 2, 2, 3), dtype=torch.float32))
        >>> conv = terms.apply("conv2d", [x, w, terms.literal(None), terms.literal(1),
        ...                              terms.literal("same"), terms.literal(1), terms.literal(1)])
        >>> terms.eg.data(conv).shape  # a kernel of 2 rows: one row of zeros below
        (1, 3, 5, 5)
        >>> len(terms.eg.classes_with_op("pad"))
        1
        """
        padding, weight = (self.eg.data(k) for k in (kids[4], kids[1]))
        named = getattr(padding, "value", None)
        shape = getattr(weight, "shape", None)
        if named not in ("same", "valid") or shape is None or any(map(is_symbolic, shape)):
            return kids
        spatial = len(shape) - 2
        if named == "valid":
            return [*kids[:4], self.literal((0,) * spatial), *kids[5:]]
        stride, dilation = (_per_dim(getattr(self.eg.data(kids[i]), "value", None), spatial)
                            for i in (3, 5))
        if stride is None or dilation is None or any(s != 1 for s in stride):
            return kids
        totals = [d * (k - 1) for d, k in zip(dilation, shape[2:])]
        extra = [t % 2 for t in totals]
        x = kids[0]
        if any(extra):  # (torch.nn.functional.pad's order: the last dim first)
            pads = tuple(p for e in reversed(extra) for p in (0, e))
            x = self.apply("pad", [x, self.literal(pads), self.literal(0.0)])
        return [x, *kids[1:4], self.literal(tuple(t // 2 for t in totals)), *kids[5:]]

    # -- sizes: ``x.size()`` is the tuple of its dims, each computed from the input -------

    def _elements(self, cid: int) -> list[int] | None:
        """The classes of the items of a tuple-valued class (a shape), or None."""
        for n in self.eg.nodes(cid):
            if n.op == "tuple":
                return list(n.children)
        meta = self.eg.data(cid)
        if meta is not None and meta.kind == "literal" and isinstance(meta.value, tuple) and all(
                type(v) is int for v in meta.value):
            return [self.literal(v) for v in meta.value]
        return None

    def _tuple(self, items: list[int]) -> int:
        """A tuple of classes: a literal when every item is a plain int literal."""
        metas = [self.eg.data(c) for c in items]
        if all(m is not None and m.kind == "literal" and type(m.value) is int for m in metas):
            return self.literal(tuple(m.value for m in metas))
        return self.eg.add_node("tuple", items)

    def _shape_value(self, name: str, kids: list[int]) -> int | None:
        """Size arithmetic resolved at ingest, so each dim stays its own ``size(x, d)``:
        ``x.size()`` (rank known) is the tuple of the dims, ``shape[i]`` and
        ``shape[a:b]`` pick items, ``shape[:-1] + (nh, hd)`` concatenates. None when
        ``name`` is not such an operation."""
        eg = self.eg
        if name == "size":
            shape = getattr(eg.data(kids[0]), "shape", None)
            if self._is_none(kids[1]) and shape is not None:
                return self._tuple([eg.add_node("size", [kids[0], self.literal(d)])
                                    for d in range(len(shape))])
            return None
        if name == "getitem":
            index = eg.data(kids[1])
            if index is None or index.kind != "literal" or index.from_size:
                return None
            items = self._elements(kids[0])
            if items is not None:
                if type(index.value) is int and -len(items) <= index.value < len(items):
                    return items[index.value]
                if isinstance(index.value, slice):
                    return self._tuple(items[index.value])
                return None
            whole = self._sized(kids[0]) if type(index.value) is int else None
            if whole is not None:
                return eg.add_node("size", [whole, self.literal(index.value)])
            return None
        if name == "add":
            left, right = self._elements(kids[0]), self._elements(kids[1])
            if left is not None and right is not None:
                return self._tuple(left + right)
        return None

    def _whole_shape(self, cid: int) -> int:
        """A shape given as one value (``x.view(shape)``, ``x.expand(y.size())``) arrives as
        a one-item tuple holding it: the shape itself, as a tuple of its dims."""
        items = self._elements(cid)
        if items is not None and len(items) == 1:
            inner = self._elements(items[0])
            if inner is not None:
                return self._tuple(inner)
            if self._whole_size(items[0]):
                return items[0]
        return cid

    def _whole_size(self, cid: int) -> bool:
        """Whether class ``cid`` is a whole shape as one value whose items ingest does not
        see: ``x.size()`` of an input of unknown rank, or a ``torch.Size`` made at run time
        (``input_shape + (4,)`` under dynamic shapes)."""
        meta = self.eg.data(cid)
        return (meta is not None and meta.kind == "tuple") or self._sized(cid) is not None

    def _sized(self, cid: int) -> int | None:
        """The tensor whose whole ``size()`` class ``cid`` is (a ``size`` whose dim is the
        literal None), or None."""
        for n in self.eg.nodes(cid):
            if n.op == "size" and self._is_none(n.children[1]):
                return n.children[0]
        return None

    def _is_none(self, cid: int) -> bool:
        meta = self.eg.data(cid)
        return meta is not None and meta.kind == "literal" and meta.value is None

    def constant_value(self, cid: int) -> Any:
        """The value of class ``cid`` when it is a constant (a literal, or a constant
        tensor made in the graph, never a parameter or buffer), else :data:`UNKNOWN_VALUE`.
        Values computed from sizes are not constants: a tensor made from ``x.size(1)``
        stays computed, so the program follows the input's size."""
        meta = self.eg.data(cid)
        if meta is not None and meta.from_size:
            return UNKNOWN_VALUE
        if meta is not None and meta.kind in ("literal", "scalar") and (
                meta.value is not None or meta.kind == "literal"):
            return meta.value
        found = self.folded.get(self.eg.find(cid), UNKNOWN_VALUE)
        if found is UNKNOWN_VALUE:  # an index of constant tensors (``mask[b, q]``)
            for n in self.eg.nodes(cid):
                if n.op in ("tuple", "slice"):
                    items = [self.constant_value(k) for k in n.children]
                    if any(v is UNKNOWN_VALUE for v in items):
                        return UNKNOWN_VALUE
                    return tuple(items) if n.op == "tuple" else slice(*items)
        return found

    def folded_constant(self, result: Any) -> int | None:
        """A constant leaf holding ``result``, when it is a tensor small enough to keep."""
        if not isinstance(result, torch.Tensor) or (
                result.numel() * result.element_size() > _MAX_FOLDED_BYTES):
            return None
        cid = self.constant(result)
        self.folded[self.eg.find(cid)] = result
        return cid

    def _fold(self, spec, kids: list[int]) -> int | None:
        """A constant leaf for an op whose inputs are all constants
        (:meth:`constant_value`); None otherwise."""
        values = [self.constant_value(k) for k in kids]
        if any(v is UNKNOWN_VALUE for v in values):
            return None
        if not any(isinstance(v, torch.Tensor) for v in values) and spec.name not in (
                "full", "arange"):
            return None

        def run():
            try:
                return spec.run(values)
            except Exception:  # noqa: BLE001 - not foldable here: keep the op
                return None
        return self.folded_from(run, values)

    def folded_from(self, run: Callable[[], Any], values: list) -> int | None:
        """A constant leaf for what ``run()`` returns, computed from the constant
        ``values`` outside any fake mode (inside aot_autograd's, ``torch.arange`` makes a
        fake tensor, which the emitted program cannot hold: Falcon-H1's decoding step
        fell back); None where a value is itself fake or on the meta device, or there is
        no tensor to keep (a meta result has no values: a model built on ``meta`` keeps
        its constant subgraphs computed)."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        if any(isinstance(v, FakeTensor) or (isinstance(v, torch.Tensor) and v.is_meta)
               for v in values):
            return None
        with unset_fake_temporarily():
            result = run()
            if isinstance(result, torch.Tensor) and result.is_meta:
                return None
            return self.folded_constant(result)

    def _normalized(self, spec, kids: list[int]) -> list[int]:
        """Attributes in normal form (positive dims, concrete shapes) so that the same
        operation always hashes the same. An attribute computed from sizes (``x.view(B,
        T, nh, -1)`` with ``B, T, C = x.size()``) stays as computed: its literal would
        bake the example's size into the program."""
        metas = [self.eg.data(k) for k in kids]
        values: list[Any] = [
            m.value if m is not None and m.kind in ("literal", "scalar") and m.value is not None
            else UNKNOWN_VALUE for m in metas
        ]
        normalized = spec.normalize(list(values), metas)
        return [k if v is UNKNOWN_VALUE or (m is not None and m.from_size) or is_symbolic(v)
                else self.literal(v) for k, v, m in zip(kids, normalized, metas)]


def _triangle(tensor: torch.Tensor) -> tuple[str, int, tuple] | None:
    """``("triu", 1, shape)`` for a bool tensor that is ``ones(..., T, T).triu(1)`` (the
    entries above the diagonal), ``("tril", 0, shape)`` for ``ones(..., T, T).tril()``,
    where ``shape`` is the tensor's own; or, for a (T, T) triangle with unit dims after
    or between (sequence-first code's ``mask.unsqueeze(-1)``), the (T, T) one it is a
    reshape of. Else None.

    >>> _triangle(torch.ones(1, 3, 3, dtype=torch.bool).triu(1))
    ('triu', 1, (1, 3, 3))
    >>> _triangle(torch.ones(3, 3, dtype=torch.bool).tril()[:, :, None, None])
    ('tril', 0, (3, 3))
    """
    if tensor.dtype != torch.bool or tensor.dim() < 2:
        return None
    shape = tuple(tensor.shape)
    if shape[-1] != shape[-2] or shape[-1] == 1:
        shape = tuple(n for n in shape if n != 1)
        if len(shape) != 2:
            return None
        tensor = tensor.reshape(shape)
    if shape[-1] != shape[-2] or shape[-1] < 2:
        return None
    ones = torch.ones(tensor.shape[-2:], dtype=torch.bool, device=tensor.device)
    for name, diagonal in (("triu", 1), ("tril", 0)):
        if torch.equal(tensor, getattr(ones, name)(diagonal).expand(tensor.shape)):
            return name, diagonal, shape
    return None


def _additive_triangle(tensor: torch.Tensor) -> tuple[float, int] | None:
    """``(fill, T)`` for a float tensor whose last two dims are (T, T), 0 on and below the
    diagonal and one fill at or below -1e4 above it, alike at every leading index: an
    additive causal mask (transformers' constant one, ``finfo.min`` above the diagonal,
    batch copies in front); else None.

    >>> mask = torch.zeros(2, 1, 3, 3).masked_fill(torch.ones(3, 3).triu(1).bool(), -1e9)
    >>> _additive_triangle(mask), _additive_triangle(torch.zeros(3, 3))
    ((-1000000000.0, 3), None)
    """
    if not tensor.is_floating_point() or tensor.dim() < 2:
        return None
    size = tensor.shape[-1]
    if tensor.shape[-2] != size or size < 2 or tensor.device.type == "meta":
        return None
    rows = tensor.reshape(-1, size, size)
    first = rows[0]
    fill = float(first[0, 1])
    if not fill <= -1e4 or float(first[0, 0]) != 0:
        return None
    above = torch.ones(size, size, dtype=torch.bool, device=tensor.device).triu(1)
    if not (bool((first[~above] == 0).all()) and bool((first[above] == fill).all())
            and bool((rows == first).all())):
        return None
    return fill, size

