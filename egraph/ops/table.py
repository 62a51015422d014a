"""The op table: every canonical op, declared once with everything the project knows of it.

An e-node of a tensor program is ``(name, *params)``: the op's parameters in the order of
:attr:`OpDef.params`, tensors and attributes alike (dims, keepdim, shapes and scalars are
literal leaves). Each entry says how the op runs (``impl``, a qualified name the front end
resolves, so this module imports no torch), every spelling that becomes it, its kind, its
FLOPs, whether it rounds, how signs and observed ranges pass through it, how the error
analysis treats it, its Triton template and whether it is commutative. The sets the
analyses, cost models, fusion planner and kernels use are derived from these entries
(:func:`names`), never kept by hand.

>>> TABLE["softmax"].params, TABLE["softmax"].kind, TABLE["softmax"].attributes
(('x', 'dim'), 'reduction', ('dim',))
>>> TABLE["mul"].commutative, TABLE["neg"].exact, TABLE["exp"].triton
(True, True, 'tl.exp({x})')
>>> sorted(names(kind="view"))[:3]
['chunk', 'detach', 'expand']

Adding an op is one :func:`op` call below plus its test (``tests/test_optable.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egraph import signs
from egraph.dims import hints
from egraph.ops import einsum_plan
from egraph.ops import intervals as iv
from egraph.signs import NEG, NONNEG, NONPOS, POS, ZERO

KINDS = ("pointwise", "reduction", "view", "library", "creation", "shape", "leaf", "opaque")
"""What an op is to the fusion planner and cost models: ``pointwise`` and ``reduction``
(row ops: reductions, softmax, norms) fuse into one kernel; a ``view`` moves no data;
a ``library`` op is its own kernel (matrix products, attention, gathers); ``creation``
ops make a tensor from literals; ``shape`` ops compute sizes and tuples of them; ``leaf``
e-nodes are inputs, parameters and constants; ``opaque`` calls are kept as they are."""

NOT_FOLDED = frozenset({"leaf", "shape", "opaque"})
"""Kinds of ops emission never folds into a buffer computed once (``backends.folding``):
leaves are what is folded from, shapes and opaque calls are not tensor arithmetic. An op
of any other kind whose operands are parameters, constants, folded values or the inputs'
sizes is folded. A view of a parameter folds (sharing its storage) so that what is made
of it folds too: conv-bn's ``weight * scale.reshape(-1, 1, 1, 1)``; so does a creation op
shaped like one (``zeros_like``), while one with no parameter (``full``) does not."""

ERRORS = ("exact", "elementwise", "summing", "multilinear", "mixing")
"""How the rounding-error analysis treats an op: ``exact`` adds no rounding (it moves,
selects or negates values); ``elementwise`` rounds its result once, errors propagate
through its derivative; ``summing`` also rounds its partial sums; ``multilinear`` (matrix
products, convolutions) is linear in each operand, so errors propagate through the
others' magnitudes; ``mixing`` ops mix many elements in ways that may cancel (softmax,
norms, attention), their squared Jacobian is estimated with random probes."""

SignRule = Callable[[list, list], int]


@dataclass(frozen=True)
class Module:
    """An ``nn.Module`` whose call is this op: the module class (qualified name) and, per
    op parameter, where its value comes from: ``input`` (the call's argument) or the name
    of a module attribute (a tensor becomes a parameter leaf; lists become tuples).
    ``when`` says which configurations the op models (others stay opaque)."""

    cls: str
    args: tuple[str, ...]
    when: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class OpDef:
    """One canonical op (see the module docstring; :func:`op` fills in the defaults)."""

    name: str
    params: tuple[str, ...]
    kind: str
    impl: str | None = None
    """Qualified name of the torch callable that runs it (``Tensor.x`` for a method)."""
    symbolic_impl: str | None = None
    """Qualified name of a callable of :attr:`impl`'s arguments that the shape analysis
    runs where sizes are symbolic, when :attr:`impl` run on fake tensors reads a size as
    its example's number (torch's C++ ``constant_pad_nd`` does: a padded Swin stage came
    out of a symbolic graph with no shape, and none of the rewrites after it applied);
    None: :attr:`impl` itself."""
    call: Callable[..., tuple[tuple, dict]] | None = None
    """Canonical parameter values -> ``(args, kwargs)`` of ``impl`` (default: in order)."""
    normalize: Callable[[list, list], list] | None = None
    """Attribute values in normal form, given the operands' metas (positive dims...)."""
    attributes: tuple[str, ...] = ()
    spellings: tuple[tuple[str, str], ...] = ()
    """``(qualified target, lowering)`` pairs; the front end's lowering of that name maps
    the target's own signature to this op. ``ops.<namespace>.<op>`` names another
    library's torch operator, matched by name (it exists once that library has loaded)."""
    modules: tuple[Module, ...] = ()
    flops: float | Callable[[int, list], float] = 0.0
    """Per output element (pointwise) or per input element (reductions, library ops), or
    a rule ``(output elements, operand metas) -> flops``."""
    exact: bool = False
    error: str = "elementwise"
    sign: int | SignRule | None = None
    interval: iv.IntervalRule | None = None
    triton: str | None = None
    """A Triton expression over the parameters (``tl.exp({x})``) or ``@name``, a template
    of ``backends.triton.templates``; None: the op runs as a torch call."""
    triton_cast: tuple[str, ...] | None = None
    """Operands converted to the result's compute type first (default: all of them)."""
    commutative: bool = False
    finite: bool = False
    """Finite operands give finite values: the op neither overflows nor divides (tanh,
    where, maximum; not add, exp). Views keep finiteness without saying so."""
    stable: bool = False
    """A fused, numerically stable computation: its rounding error is bounded whatever
    its inputs (softmax, log1p, ...)."""
    contiguous: bool = False
    """Its result is a new contiguous tensor whatever its operands' layouts (linear,
    matmul; not a convolution, which keeps channels-last, nor sdpa or einsum, which may
    return a permuted result)."""
    channels_last: bool = False
    """Its result is channels-last whatever its operands' layouts (oneDNN's convolution,
    which computes in that layout): emission makes a returned one contiguous where the
    source's was."""
    sympy: str | None = None
    """The op over the reals as a sympy expression of its parameters (``"log(1 + x)"``),
    for the soundness proofs of rules (:mod:`compiler.soundness`) and the accuracy search
    (:mod:`compiler.herbie`); None where it has none (reductions, views, comparisons).
    :func:`sympy_form` builds it."""
    workspace: Callable[[list, Any], int] | str | None = None
    """The bytes one call allocates and frees inside itself beyond its result, on the CPU
    (:class:`~extractors.peak.PeakMemory` counts them at the call): a rule ``(parameter
    values, result) -> bytes`` over the operands as meta tensors (sizes, strides, dtypes;
    attributes as their values), or ``"measured"``: the call run once at those sizes and
    layouts on this CPU (convolutions and attention, whose kernels choose an algorithm by
    size). None: nothing beyond its result."""
    why: dict[str, str] = field(default_factory=dict)
    """Why a fact an op of its kind usually has is missing (``{"triton": "..."}``)."""

    @property
    def operands(self) -> tuple[str, ...]:
        """The parameters that are not attributes."""
        return tuple(p for p in self.params if p not in self.attributes)


TABLE: dict[str, OpDef] = {}


def op(name: str, params: str, kind: str, *, spell: str = "", attributes: str = "",
       **facts) -> OpDef:
    """Declare an op. ``params`` and ``attributes`` are space-separated names (``*rest``
    for a variadic tail); ``spell`` lists the targets that lower to it, each as
    ``qualified.name`` or ``qualified.name:lowering`` (default lowering: ``unary`` for a
    one-operand pointwise op, ``binary`` for two, ``reduce`` for a reduction, else the op's
    own name)."""
    entry = OpDef(name, tuple(params.split()), kind, attributes=tuple(attributes.split()),
                  **facts)
    default = _default_lowering(entry)
    spellings = tuple((t, lowering or default) for t, _, lowering in
                      (s.partition(":") for s in spell.split()))
    entry = OpDef(**{**entry.__dict__, "spellings": spellings})
    TABLE[name] = entry
    return entry


def _default_lowering(entry: OpDef) -> str:
    if entry.kind == "pointwise" and len(entry.operands) in (1, 2) and not entry.attributes:
        return "unary" if len(entry.operands) == 1 else "binary"
    if entry.kind == "reduction" and entry.params == ("x", "dim", "keepdim"):
        return "reduce"
    return entry.name


def interval_of(op: str, kids: list, values: list, shapes: Any) -> iv.Interval:
    """The output interval of ``op`` from its operands' intervals, by the op's interval
    rule (:mod:`egraph.ops.intervals`); ops without a rule are unbounded.

    >>> interval_of("exp", [(0.0, 1.0)], [], None)
    (1.0, 2.718281828459045)
    >>> interval_of("sub", [(0.0, 1.0), (0.0, 1.0)], [], None)
    (-1.0, 1.0)
    """
    entry = TABLE.get(op)
    if entry is None or entry.interval is None:
        return iv.UNBOUNDED
    return entry.interval(kids, values, shapes)


@functools.cache
def sympy_form(name: str) -> Callable | None:
    """Op ``name`` as a function of sympy expressions (its parameters in order), from its
    ``sympy`` fact; None where it has none. sympy is imported on the first call.

    >>> import sympy
    >>> sympy_form("log1p")(sympy.Symbol("a")), sympy_form("softmax")
    (log(a + 1), None)
    """
    entry = TABLE.get(name)
    if entry is None or entry.sympy is None:
        return None
    import sympy

    params = [sympy.Symbol(p) for p in entry.params]
    expr = sympy.sympify(entry.sympy, locals={p.name: p for p in params})

    def form(*args):
        return expr.xreplace(dict(zip(params, map(sympy.sympify, args))))
    form.__name__ = name
    return form


def names(**facts) -> frozenset[str]:
    """The ops whose facts equal the given values (``names(kind="view")``).

    >>> sorted(names(kind="library", error="multilinear"))[:6]
    ['addmm', 'conv1d', 'conv2d', 'einsum', 'grouped_mm', 'linear']
    """
    return frozenset(n for n, e in TABLE.items()
                     if all(getattr(e, k) == v for k, v in facts.items()))


# -- attribute normalisation (needs the operand's rank) ------------------------------------


class _Unknown:
    """Stands for an attribute whose value is not a known literal (left as it is)."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN_VALUE = _Unknown()
"""The value :attr:`OpDef.normalize` sees for an attribute that is not a known literal."""


def _rank(meta) -> int | None:
    shape = getattr(meta, "shape", None)
    return None if shape is None else len(shape)


def dims_of(dim, rank: int | None):
    """Reduction dims as a sorted tuple of non-negative ints (None: every dim).

    >>> dims_of(-1, 3), dims_of(None, 2), dims_of([2, 0], 3)
    ((2,), (0, 1), (0, 2))
    """
    if rank is None:
        if dim is None:
            return None
        return tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)
    if dim is None or dim == [] or dim == ():
        return tuple(range(rank))
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    return tuple(sorted(d % rank if rank else d for d in dims))


def _norm_reduce(values: list, metas: list) -> list:
    if values[1] is not UNKNOWN_VALUE:
        values[1] = dims_of(values[1], _rank(metas[0]))
    return values


def _norm_dim(position: int, extra: int = 0):
    def normalize(values: list, metas: list) -> list:
        rank = _rank(metas[0])
        d = values[position]
        if rank is not None and isinstance(d, int):
            values[position] = d % (rank + extra)
        return values
    return normalize


def _norm_cat(values: list, metas: list) -> list:
    """cat's dim (its first parameter) against the rank of its first operand."""
    rank = _rank(metas[1]) if len(metas) > 1 else None
    if rank and isinstance(values[0], int):
        values[0] %= rank
    return values


def _norm_permute(values: list, metas: list) -> list:
    rank = _rank(metas[0])
    if rank is not None and values[1] is not UNKNOWN_VALUE:
        values[1] = tuple(d % rank for d in values[1])
    return values


def _norm_transpose(values: list, metas: list) -> list:
    rank = _rank(metas[0])
    if rank is not None and isinstance(values[1], int) and isinstance(values[2], int):
        a, b = values[1] % rank, values[2] % rank
        values[1:3] = [min(a, b), max(a, b)]
    return values


def _norm_shape(values: list, metas: list) -> list:
    if values[1] is UNKNOWN_VALUE:
        return values
    shape = list(values[1])
    meta = metas[0]
    if -1 in shape and getattr(meta, "shape", None) is not None:
        known = math.prod(s for s in shape if s != -1)
        total = math.prod(meta.shape)
        if known:
            shape[shape.index(-1)] = total // known
    values[1] = tuple(shape)
    return values


def _norm_padding_idx(values: list, metas: list) -> list:
    rows = getattr(metas[1], "shape", None)
    p = values[2]
    if isinstance(p, int) and p < 0:
        values[2] = p + rows[0] if rows else p
    return values


def _reduce_call(x, dim, keepdim):
    return (x,), {"dim": dim, "keepdim": keepdim}


# -- workspaces: what a call allocates and frees inside itself on the CPU -------------------
# (measured with torch's allocator, compiler.memory.peak_bytes, against the result's bytes)


TRANSPOSE_BLOCK = 60
"""aten copies a transposed matrix into a row-major one in blocks of this many rows and
columns, through a buffer of one block (``copy_transpose_valid`` in ATen's Copy.cpp)."""


def transpose_buffer_bytes(shape: tuple, stride: tuple, itemsize: int) -> int:
    """The bytes of the buffer aten's copy takes to make a row-major copy of a tensor of
    ``shape`` and ``stride``: one block of :data:`TRANSPOSE_BLOCK` squared elements where
    it is the transpose of a row-major matrix of at least a block's elements, else none.

    >>> transpose_buffer_bytes((64, 64), (1, 64), 4), transpose_buffer_bytes((8, 8), (1, 8), 4)
    (14400, 0)
    """
    block = TRANSPOSE_BLOCK * TRANSPOSE_BLOCK
    transposed = len(shape) == 2 and tuple(stride) == (1, shape[0]) and shape[0] > 1
    return block * itemsize if transposed and math.prod(shape) >= block else 0


def _row_statistics(values: list, result: Any) -> int:
    """layer_norm: a mean and inverse deviation per normalised row, after a contiguous
    copy of a strided operand (not through aten's blocked transpose). They are in the
    operand's dtype, float32 where a half-precision operand has a float32 weight or bias
    (aten's mixed-type kernel)."""
    x, shape, affine = values[0], values[1], values[2:4]
    mixed = any(getattr(a, "dtype", x.dtype) != x.dtype for a in affine if a is not None)
    size = 4 if mixed else x.element_size()
    return 2 * size * (x.numel() // max(math.prod(shape), 1)) + _copy_bytes(x)


def _channel_statistics(values: list, result: Any) -> int:
    """batch_norm in inference: a scale and shift per channel, in float64 for a float64
    operand and in float32 for the others."""
    x = values[0]
    size = 8 if x.element_size() == 8 else 4
    return 2 * size * (x.shape[1] if x.dim() > 1 else 1)


def _window_indices(values: list, result: Any) -> int:
    """max_pool2d: the int64 index of each window's maximum, computed and dropped."""
    return 8 * result.numel()


def _copy_bytes(x: Any) -> int:
    """The bytes of a row-major copy of ``x`` where it is strided."""
    return 0 if x.is_contiguous() else x.numel() * x.element_size()


def _contiguous_copy(values: list, result: Any) -> int:
    """softmax, log_softmax: a contiguous copy of a strided operand first, through
    aten's copy (a transposed matrix's through its block buffer)."""
    x = values[0]
    copy = _copy_bytes(x)
    return copy + transpose_buffer_bytes(x.shape, x.stride(), x.element_size()) if copy else 0


def _reshape_copy(values: list, result: Any) -> int:
    """reshape, flatten: none where the result is a view; else aten's copy into the
    new sizes, whose temporaries are a transposed matrix's block buffer."""
    x, is_view = values[0], getattr(result, "_is_view", None)
    if is_view is None or is_view():
        return 0
    return transpose_buffer_bytes(x.shape, x.stride(), x.element_size())


def _half_gather(values: list, result: Any) -> int:
    """gather of a half-precision operand: a float32 buffer of the result's size."""
    return 4 * result.numel() if values[0].element_size() == 2 else 0


# -- FLOP rules of library kernels ----------------------------------------------------------


def _shape(meta) -> tuple | None:
    """The shape of a class as costs read it: a symbolic size is the example's."""
    shape = getattr(meta, "shape", None)
    return None if shape is None else hints(shape)


def _has_bias(meta) -> bool:
    return getattr(meta, "kind", None) == "tensor"


def _matmul_flops(n: int, kids: list) -> float:
    shape = _shape(kids[0])
    return 2.0 * n * (shape[-1] if shape else 0)


def _einsum_flops(n: int, kids: list) -> float:
    return einsum_plan.flops(getattr(kids[0], "value", None), [_shape(k) for k in kids[1:]])


def _linear_flops(n: int, kids: list) -> float:
    return _matmul_flops(n, kids) + (n if _has_bias(kids[2]) else 0)


def _conv_flops(n: int, kids: list) -> float:
    w = _shape(kids[1]) or ()
    per_output = math.prod(w[1:]) if w else 0
    return 2.0 * n * per_output + (n if _has_bias(kids[2]) else 0)


def _ints(value, length: int | None = None) -> bool:
    return (isinstance(value, tuple) and all(type(v) is int for v in value)
            and length in (None, len(value)))


def _pool_flops(n: int, kids: list) -> float:
    """A pooling's work: each output element reads its window, which ends where the padded
    input does (transformers' EfficientNet pools 7 x 7 with a kernel of 1280 and ceil_mode:
    49 reads, not 1.6 million)."""
    # kids are the classes' analysis data; the window is the kernel-size literal's value
    window, padding = (getattr(kids[i], "value", None) for i in (1, 3))
    if not _ints(window):
        return float(n)
    x = _shape(kids[0])
    if x is not None and len(x) >= len(window):
        pads = padding if _ints(padding, len(window)) else (0,) * len(window)
        window = tuple(min(k, s + 2 * p) for k, s, p in zip(window, x[-len(window):], pads))
    return float(n * math.prod(window))


def _sdpa_flops(n: int, kids: list) -> float:
    q, k = _shape(kids[0]), _shape(kids[1])
    if not q or not k:
        return 0.0
    scores = math.prod(q[:-1]) * k[-2]
    return 4.0 * scores * q[-1] + 5.0 * scores


def _masked_attention_flops(n: int, kids: list) -> float:
    mask = _shape(kids[3])
    return _sdpa_flops(n, kids) + (math.prod(mask) if mask else 0.0)


def pair(value):
    """A 2-D pooling size in normal form (``2`` and ``[2]`` are ``(2, 2)``).

    >>> pair(2), pair([3]), pair((1, 2))
    ((2, 2), (3, 3), (1, 2))
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (int(value), int(value))
    value = tuple(value)
    return value * 2 if len(value) == 1 else value


def _norm_pool(sizes: int):
    """Pooling attributes in normal form: the ``sizes`` after the input as pairs, an
    absent stride (``None`` or ``[]``, as aten spells it) as the kernel, flags as bools,
    and a window over the whole input as the input's extent (:func:`_whole_input`)."""
    def normalize(values: list, metas: list) -> list:
        absent = values[2] is UNKNOWN_VALUE and getattr(metas[2], "kind", None) in (
            "literal", "scalar") and metas[2].value is None
        if absent or values[2] is None or values[2] == [] or values[2] == ():
            values[2] = values[1]
        for i in range(1, 1 + sizes):
            if values[i] is not UNKNOWN_VALUE:
                values[i] = pair(values[i])
        for i in range(1 + sizes, len(values)):
            if isinstance(values[i], bool) or values[i] in (0, 1):
                values[i] = bool(values[i])
        extent = _whole_input(values, metas, sizes)
        if extent is not None:
            values[1] = values[2] = extent
            values[1 + sizes] = False  # (ceil_mode: the one window fits exactly)
        return values
    return normalize


def _whole_input(values: list, metas: list, sizes: int) -> tuple[int, int] | None:
    """The input's (height, width) where a pooling's one window covers all of it: no
    padding, a kernel at least that large (and no dilation). transformers' EfficientNet
    pools its 7 x 7 map with a kernel of 1280 in ceil_mode; as a kernel of 7 x 7 the
    window, its divisor and the values are the same, and Inductor reduces 49 elements
    where it looped over the 1.6 million of the kernel (11-14x slower than eager)."""
    shape = getattr(metas[0], "shape", None)
    kernel, padding = values[1], values[3]
    if shape is None or len(shape) < 3 or UNKNOWN_VALUE in (kernel, padding):
        return None
    extent = tuple(shape[-2:])
    dilated = sizes == 4 and values[4] != (1, 1)
    if (dilated or any(type(e) is not int for e in extent) or any(padding)
            or any(k < e for k, e in zip(kernel, extent)) or kernel == extent):
        return None
    return extent


# -- nn.Module conditions --------------------------------------------------------------------


def _zero_padded(m) -> bool:
    return m.padding_mode == "zeros"


def _inference_statistics(m) -> bool:
    return not m.training and m.track_running_stats


def _plain_embedding(m) -> bool:
    return m.max_norm is None and not m.scale_grad_by_freq and not m.sparse


def _inactive_dropout(m) -> bool:
    return not (m.training and m.p > 0)


def _explicit_dim(m) -> bool:
    return m.dim is not None


# -- interval rules of ops only the table uses ----------------------------------------------


def _unit(v: float) -> float:
    """``v`` clamped to [-1, 1], the domain of asin and acos."""
    return max(-1.0, min(1.0, v))


def _fmod_interval(kids, values, shapes) -> iv.Interval:
    """|fmod(x, y)| < |y| and <= |x|, with x's sign."""
    (x_lo, x_hi), (y_lo, y_hi) = kids[0], kids[1]
    bound = min(max(abs(y_lo), abs(y_hi)), max(abs(x_lo), abs(x_hi)))
    return (0.0 if x_lo >= 0 else -bound, 0.0 if x_hi <= 0 else bound)


def _copysign_interval(kids, values, shapes) -> iv.Interval:
    """|x|'s interval with y's sign."""
    lo, hi = iv.magnitude(kids[:1], values, shapes)
    y_lo, y_hi = kids[1]
    if y_lo >= 0:
        return (lo, hi)
    if y_hi < 0:
        return (-hi, -lo)
    return (-hi, hi)


# -- the table ---------------------------------------------------------------------------------

_XY_SPELL = "torch.{0} Tensor.{0} aten.{0}.Tensor aten.{0}.Scalar"
_OPERATOR = "operator.{1} Tensor.__{1}__ Tensor.__r{1}__:reverse"
_COMPARE = "operator.{1} Tensor.__{1}__"
_NO_TRITON_MATH = "needs a libdevice function; only triton.language core is used"
_UNTRACKED = "no range rule yet: observed ranges inform the curvature cost only"

op("add", "x y", "pointwise", sympy="x + y", impl="torch.add", flops=1, commutative=True,
   sign=signs.total, interval=iv.total, triton="{x} + {y}",
   spell=_XY_SPELL.format("add") + " " + _OPERATOR.format("add", "add")
   + " ops.prims.fma.default:fma torch.addcmul:addcmul Tensor.addcmul:addcmul"
   " aten.addcmul.default:addcmul torch.addcdiv:addcdiv Tensor.addcdiv:addcdiv"
   " aten.addcdiv.default:addcdiv")
op("sub", "x y", "pointwise", sympy="x - y", impl="torch.sub", flops=1, sign=signs.difference,
   interval=iv.difference, triton="{x} - {y}",
   spell=_XY_SPELL.format("sub") + " " + _OPERATOR.format("sub", "sub")
   + " torch.subtract Tensor.subtract torch.rsub:rsub aten.rsub.Scalar:rsub"
   " aten.rsub.Tensor:rsub")
op("mul", "x y", "pointwise", sympy="x * y", impl="torch.mul", flops=1, commutative=True,
   sign=signs.product, interval=iv.product, triton="{x} * {y}",
   spell=_XY_SPELL.format("mul") + " " + _OPERATOR.format("mul", "mul")
   + " torch.multiply Tensor.multiply torch.square:square Tensor.square:square"
   " aten.square.default:square")
op("div", "x y", "pointwise", sympy="x / y", impl="torch.div", flops=1, sign=signs.quotient,
   interval=iv.quotient, triton="{x} / {y}",
   spell=_XY_SPELL.format("div") + " " + _OPERATOR.format("div", "truediv")
   + " torch.true_divide Tensor.true_divide")
op("pow", "x y", "pointwise", sympy="x ** y", impl="torch.pow", flops=1, sign=signs.power,
   interval=iv.power, triton="@pow",
   spell="torch.pow Tensor.pow aten.pow.Scalar aten.pow.Tensor_Scalar aten.pow.Tensor_Tensor "
   + _OPERATOR.format("pow", "pow"))
op("maximum", "x y", "pointwise", impl="torch.maximum", flops=1, exact=True, error="exact",
   finite=True, commutative=True, sign=signs.larger, interval=iv.larger,
   triton="tl.maximum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
   spell="torch.maximum Tensor.maximum aten.maximum.default aten.max.other")
op("minimum", "x y", "pointwise", impl="torch.minimum", flops=1, exact=True, error="exact",
   finite=True, commutative=True, interval=iv.smaller,
   triton="tl.minimum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
   spell="torch.minimum Tensor.minimum aten.minimum.default aten.min.other")
for _name, _symbol, _py in [("eq", "==", "eq"), ("ne", "!=", "ne"), ("lt", "<", "lt"),
                            ("le", "<=", "le"), ("gt", ">", "gt"), ("ge", ">=", "ge")]:
    op(_name, "x y", "pointwise", impl=f"torch.{_name}", flops=1, exact=True, error="exact",
       commutative=_name in ("eq", "ne"), sign=signs.NONNEG,
       interval=iv.constant(0.0, 1.0), triton=f"{{x}} {_symbol} {{y}}", triton_cast=(),
       spell=_XY_SPELL.format(_name) + " " + _COMPARE.format(_name, _py))
# On bool tensors (masks combined: transformers' ``causal & padding``) the logical and/or.
for _name, _py in [("bitwise_and", "and"), ("bitwise_or", "or")]:
    op(_name, "x y", "pointwise", impl=f"torch.{_name}", flops=1, exact=True, error="exact",
       commutative=True,
       why={"interval": "its values are bit patterns, not a range of numbers",
            "triton": "Triton's interpreter types int1 & a broadcast int1 scalar as fp32 "
                      "and raises: not written until a GPU run checks it"},
       spell=f"torch.{_name} Tensor.{_name} aten.{_name}.Tensor aten.__{_py}__.Tensor"
       f" operator.{_py}_ Tensor.__{_py}__")
op("atan2", "x y", "pointwise", impl="torch.atan2", flops=1,
   interval=iv.constant(-math.pi, math.pi), why={"triton": _NO_TRITON_MATH},
   spell="torch.atan2 Tensor.atan2 aten.atan2.default")
# C's fmod: the remainder of the division truncated toward zero, with x's sign (torch.fmod;
# ``remainder`` is Python's, with y's). Exact: the remainder is a float of the format.
op("fmod", "x y", "pointwise", impl="torch.fmod", flops=1, exact=True, error="exact",
   sympy="Piecewise((x - y * floor(x / y), x / y >= 0), (x - y * ceiling(x / y), True))",
   interval=_fmod_interval, why={"triton": "C's fmod of negative operands needs care "
                                           "(not written)"},
   spell="torch.fmod Tensor.fmod aten.fmod.Tensor aten.fmod.Scalar")
op("copysign", "x y", "pointwise", impl="torch.copysign", flops=1, exact=True,
   error="exact", finite=True, sympy="Piecewise((Abs(x), y >= 0), (-Abs(x), True))",
   interval=_copysign_interval, why={"triton": _NO_TRITON_MATH},
   spell="torch.copysign Tensor.copysign aten.copysign.Tensor aten.copysign.Scalar")
# C's fmax and fmin: a NaN operand is ignored (torch.maximum and minimum propagate it).
op("fmax", "x y", "pointwise", sympy="Max(x, y)", impl="torch.fmax", flops=1, exact=True,
   error="exact", finite=True, commutative=True, sign=signs.larger, interval=iv.larger,
   why={"triton": "NaN-ignoring max is not written (tl.maximum's NaN rule differs)"},
   spell="torch.fmax Tensor.fmax aten.fmax.default")
op("fmin", "x y", "pointwise", sympy="Min(x, y)", impl="torch.fmin", flops=1, exact=True,
   error="exact", finite=True, commutative=True, interval=iv.smaller,
   why={"triton": "NaN-ignoring min is not written (tl.minimum's NaN rule differs)"},
   spell="torch.fmin Tensor.fmin aten.fmin.default")
op("floordiv", "x y", "pointwise", impl="torch.floor_divide", flops=1,
   why={"triton": "Python's floor division of negative operands needs care (not written)",
        "interval": _UNTRACKED},
   spell="operator.floordiv torch.floor_divide Tensor.__floordiv__ Tensor.floor_divide"
   " Tensor.__rfloordiv__:reverse aten.floor_divide.default aten.floor_divide.Scalar")
op("remainder", "x y", "pointwise", impl="torch.remainder", flops=1,
   why={"triton": "Python's remainder of negative operands needs care (not written)",
        "interval": _UNTRACKED},
   spell="operator.mod torch.remainder Tensor.__mod__ Tensor.remainder"
   " aten.remainder.Tensor aten.remainder.Scalar")
op("logaddexp", "x y", "pointwise", sympy="log(exp(x) + exp(y))",
   impl="torch.logaddexp", flops=4, commutative=True,
   stable=True, triton="_logaddexp({x}, {y})", why={"interval": _UNTRACKED},
   spell="torch.logaddexp Tensor.logaddexp aten.logaddexp.default")
op("hypot", "x y", "pointwise", sympy="sqrt(x**2 + y**2)",
   impl="torch.hypot", flops=3, commutative=True, stable=True,
   sign=signs.NONNEG, triton="_hypot({x}, {y})", why={"interval": _UNTRACKED},
   spell="torch.hypot Tensor.hypot aten.hypot.default")

_UNARY_SPELL = "torch.{0} Tensor.{0} aten.{0}.default"
op("neg", "x", "pointwise", sympy="-x",
   finite=True, impl="torch.neg", flops=1, exact=True, error="exact",
   sign=signs.negation, interval=iv.negation, triton="-{x}",
   spell=_UNARY_SPELL.format("neg") + " operator.neg torch.negative Tensor.__neg__"
   " Tensor.negative")
op("exp", "x", "pointwise", sympy="exp(x)", impl="torch.exp", flops=1, sign=POS,
   interval=iv.monotone(math.exp), triton="tl.exp({x})",
   spell=_UNARY_SPELL.format("exp") + " math.exp")
op("log", "x", "pointwise", sympy="log(x)", impl="torch.log", flops=1, interval=iv.logarithm,
   triton="tl.log({x})", spell=_UNARY_SPELL.format("log") + " math.log")
op("sqrt", "x", "pointwise", sympy="sqrt(x)", impl="torch.sqrt", flops=1, sign=signs.root,
   interval=iv.root, triton="tl.sqrt({x})", spell=_UNARY_SPELL.format("sqrt") + " math.sqrt")
op("rsqrt", "x", "pointwise", sympy="1 / sqrt(x)", impl="torch.rsqrt", flops=1, sign=POS,
   interval=iv.reciprocal_root, triton="tl.rsqrt({x})", spell=_UNARY_SPELL.format("rsqrt"))
op("abs", "x", "pointwise", sympy="Abs(x)",
   finite=True, impl="torch.abs", flops=1, exact=True, error="exact",
   stable=True, sign=signs.magnitude, interval=iv.magnitude, triton="tl.abs({x})",
   spell=_UNARY_SPELL.format("abs") + " operator.abs Tensor.__abs__")
op("sin", "x", "pointwise", sympy="sin(x)",
   finite=True, impl="torch.sin", flops=1, interval=iv.constant(-1.0, 1.0),
   triton="tl.sin({x})", spell=_UNARY_SPELL.format("sin") + " math.sin")
op("cos", "x", "pointwise", sympy="cos(x)",
   finite=True, impl="torch.cos", flops=1, interval=iv.constant(-1.0, 1.0),
   triton="tl.cos({x})", spell=_UNARY_SPELL.format("cos") + " math.cos")
op("tan", "x", "pointwise", sympy="tan(x)",
   impl="torch.tan", flops=1, triton="tl.sin({x}) / tl.cos({x})",
   spell=_UNARY_SPELL.format("tan") + " math.tan",
   why={"interval": "unbounded: a pole at every odd multiple of pi/2"})
op("atan", "x", "pointwise", sympy="atan(x)",
   finite=True, impl="torch.atan", flops=1, sign=signs.same,
   interval=iv.monotone(math.atan), spell=_UNARY_SPELL.format("atan") + " math.atan",
   why={"triton": "no Triton intrinsic for atan"})
op("asin", "x", "pointwise", sympy="asin(x)", impl="torch.asin", flops=1,
   sign=signs.same, interval=iv.monotone(lambda v: math.asin(_unit(v))),
   spell=_UNARY_SPELL.format("asin") + " torch.arcsin Tensor.arcsin",
   why={"triton": _NO_TRITON_MATH})
op("acos", "x", "pointwise", sympy="acos(x)", impl="torch.acos", flops=1, sign=NONNEG,
   interval=iv.decreasing(lambda v: math.acos(_unit(v))),
   spell=_UNARY_SPELL.format("acos") + " torch.arccos Tensor.arccos",
   why={"triton": _NO_TRITON_MATH})
op("asinh", "x", "pointwise", sympy="asinh(x)", impl="torch.asinh", flops=1, finite=True,
   sign=signs.same, interval=iv.monotone(math.asinh),
   spell=_UNARY_SPELL.format("asinh") + " torch.arcsinh Tensor.arcsinh",
   why={"triton": _NO_TRITON_MATH})
op("acosh", "x", "pointwise", sympy="acosh(x)", impl="torch.acosh", flops=1, sign=NONNEG,
   interval=iv.monotone(lambda v: math.acosh(max(v, 1.0))),
   spell=_UNARY_SPELL.format("acosh") + " torch.arccosh Tensor.arccosh",
   why={"triton": _NO_TRITON_MATH})
op("atanh", "x", "pointwise", sympy="atanh(x)", impl="torch.atanh", flops=1,
   sign=signs.same, interval=iv.monotone(
       lambda v: math.atanh(v) if abs(v) < 1 else math.copysign(math.inf, v)),
   spell=_UNARY_SPELL.format("atanh") + " torch.arctanh Tensor.arctanh",
   why={"triton": _NO_TRITON_MATH})
op("sinh", "x", "pointwise", sympy="sinh(x)", impl="torch.sinh", flops=1, sign=signs.same,
   interval=iv.monotone(math.sinh), triton="_sinh({x})",
   spell=_UNARY_SPELL.format("sinh") + " math.sinh")
op("cosh", "x", "pointwise", sympy="cosh(x)", impl="torch.cosh", flops=1, sign=POS,
   interval=lambda kids, values, shapes: iv.monotone(math.cosh)(
       [iv.magnitude(kids, values, shapes)], values, shapes),
   triton="0.5 * (tl.exp({x}) + tl.exp(-{x}))", spell=_UNARY_SPELL.format("cosh") + " math.cosh")
op("tanh", "x", "pointwise", sympy="tanh(x)",
   finite=True, impl="torch.tanh", flops=1, stable=True, sign=signs.same,
   interval=iv.monotone(math.tanh), triton="_tanh({x})",
   spell=_UNARY_SPELL.format("tanh") + " math.tanh torch.nn.functional.tanh",
   modules=(Module("torch.nn.Tanh", ("input",)),))
op("sigmoid", "x", "pointwise", sympy="1 / (1 + exp(-x))",
   finite=True, impl="torch.sigmoid", flops=4, stable=True, sign=POS,
   interval=iv.monotone(iv.sigmoid), triton="tl.sigmoid({x})",
   spell=_UNARY_SPELL.format("sigmoid") + " torch.nn.functional.sigmoid",
   modules=(Module("torch.nn.Sigmoid", ("input",)),))
op("relu", "x", "pointwise", finite=True, impl="torch.relu", flops=1, exact=True, error="exact",
   stable=True, sign=NONNEG, interval=iv.relu, triton="tl.where({x} < 0, 0, {x})",
   spell=_UNARY_SPELL.format("relu") + " torch.nn.functional.relu",
   modules=(Module("torch.nn.ReLU", ("input",)),))
op("silu", "x", "pointwise", sympy="x / (1 + exp(-x))",
   finite=True, impl="torch.nn.functional.silu", flops=4, stable=True,
   interval=iv.gated, triton="{x} * tl.sigmoid({x})",
   spell="torch.nn.functional.silu aten.silu.default",
   modules=(Module("torch.nn.SiLU", ("input",)),))
op("erf", "x", "pointwise", sympy="erf(x)", finite=True, impl="torch.erf", flops=1,
   stable=True, sign=signs.same, interval=iv.monotone(math.erf), triton="tl.erf({x})",
   spell=_UNARY_SPELL.format("erf"))
op("erfc", "x", "pointwise", sympy="erfc(x)", impl="torch.erfc", flops=1, finite=True,
   stable=True, sign=NONNEG, interval=iv.decreasing(math.erfc),
   spell=_UNARY_SPELL.format("erfc") + " torch.special.erfc", why={"triton": _NO_TRITON_MATH})
op("log2", "x", "pointwise", sympy="log(x) / log(2)", impl="torch.log2", flops=1,
   interval=lambda kids, values, shapes: tuple(
       v / math.log(2) for v in iv.logarithm(kids, values, shapes)),
   spell=_UNARY_SPELL.format("log2"), why={"triton": _NO_TRITON_MATH})
op("log1p", "x", "pointwise", sympy="log(1 + x)",
   impl="torch.log1p", flops=1, stable=True, sign=signs.log1p,
   interval=iv.log1p, triton="_log1p({x})", spell=_UNARY_SPELL.format("log1p"))
op("expm1", "x", "pointwise", sympy="exp(x) - 1",
   impl="torch.expm1", flops=1, stable=True, sign=signs.same,
   interval=iv.monotone(math.expm1), triton="_expm1({x})",
   spell=_UNARY_SPELL.format("expm1"))
op("logit", "x", "pointwise", sympy="log(x / (1 - x))", impl="torch.logit", flops=3,
   interval=iv.monotone(lambda p: math.log(p / (1 - p))), triton="tl.log({x} / (1.0 - {x}))",
   spell=_UNARY_SPELL.format("logit") + " torch.special.logit")
op("reciprocal", "x", "pointwise", sympy="1 / x",
   impl="torch.reciprocal", flops=1, sign=signs.reciprocal,
   interval=iv.reciprocal, triton="1.0 / {x}", spell=_UNARY_SPELL.format("reciprocal"))
op("sign", "x", "pointwise", finite=True, impl="torch.sign", flops=1, exact=True, error="exact",
   sign=signs.same, interval=iv.constant(-1.0, 1.0), triton_cast=(),
   triton="({x} > 0).to({x}.dtype) - ({x} < 0).to({x}.dtype)",
   spell=_UNARY_SPELL.format("sign"))
op("logsigmoid", "x", "pointwise", sympy="log(1 / (1 + exp(-x)))",
   impl="torch.nn.functional.logsigmoid", flops=5,
   stable=True, sign=NEG, interval=iv.monotone(lambda v: -iv.softplus(-v)),
   triton="tl.minimum({x}, 0.0) - _log1p(tl.exp(-tl.abs({x})))",
   spell="torch.nn.functional.logsigmoid",
   workspace="measured")  # (aten's log_sigmoid_forward also returns a buffer of its size)
op("floor", "x", "pointwise", finite=True, impl="torch.floor", flops=1, exact=True, error="exact",
   interval=iv.monotone(math.floor), triton="tl.floor({x})",
   spell=_UNARY_SPELL.format("floor") + " math.floor")
op("ceil", "x", "pointwise", finite=True, impl="torch.ceil", flops=1, exact=True, error="exact",
   interval=iv.monotone(math.ceil), triton="tl.ceil({x})",
   spell=_UNARY_SPELL.format("ceil") + " math.ceil")
op("logical_not", "x", "pointwise", finite=True, impl="torch.logical_not", flops=1, exact=True,
   error="exact", sign=NONNEG, interval=iv.constant(0.0, 1.0), triton="{x} == 0",
   triton_cast=(), spell=_UNARY_SPELL.format("logical_not"))
op("bitwise_not", "x", "pointwise", finite=True, impl="torch.bitwise_not", flops=1, exact=True,
   error="exact", triton="~{x}", triton_cast=(),
   why={"interval": "its values are bit patterns, not a range of numbers"},
   spell="operator.invert torch.bitwise_not Tensor.__invert__ Tensor.bitwise_not"
   " aten.bitwise_not.default")
op("gelu", "x approximate", "pointwise", finite=True, attributes="approximate",
   impl="torch.nn.functional.gelu", call=lambda x, a: ((x,), {} if a == "none" else {
       "approximate": a}),
   flops=8, stable=True, interval=iv.gated, triton="@gelu", triton_cast=("x",),
   spell="torch.nn.functional.gelu aten.gelu.default",
   modules=(Module("torch.nn.GELU", ("input", "approximate")),))
op("softplus", "x beta threshold", "pointwise", sympy="log(1 + exp(beta * x)) / beta",
   attributes="beta threshold",
   impl="torch.nn.functional.softplus", flops=4, stable=True, sign=POS,
   interval=iv.monotone(iv.softplus), triton="@softplus", triton_cast=("x",),
   spell="torch.nn.functional.softplus aten.softplus.default")
op("clamp", "x min max", "pointwise", finite=True, impl="torch.clamp", flops=1, exact=True,
   error="exact", sign=signs.clamped, interval=iv.clamped, triton="@clamp",
   spell="torch.clamp torch.clip Tensor.clamp Tensor.clip aten.clamp.default aten.clamp.Tensor"
   " torch.clamp_min:clamp_min Tensor.clamp_min:clamp_min aten.clamp_min.default:clamp_min"
   " aten.clamp_min.Tensor:clamp_min torch.clamp_max:clamp_max Tensor.clamp_max:clamp_max"
   " aten.clamp_max.default:clamp_max aten.clamp_max.Tensor:clamp_max")
op("where", "cond x y", "pointwise", impl="torch.where", flops=1, exact=True, error="exact",
   finite=True, sign=signs.either, interval=iv.either, triton="tl.where({cond}, {x}, {y})",
   triton_cast=("x", "y"),
   spell="torch.where aten.where.self aten.where.ScalarOther aten.where.ScalarSelf"
   " aten.where.Scalar")
op("masked_fill", "x mask value", "pointwise", finite=True, impl="torch.masked_fill", flops=1,
   exact=True, error="exact", sign=signs.filled, interval=iv.filled,
   triton="tl.where({mask}, {value}, {x})", triton_cast=("x", "value"),
   spell="torch.masked_fill Tensor.masked_fill aten.masked_fill.Scalar"
   " aten.masked_fill.Tensor")
# A conversion is exact for every analysis here: they model one working precision per
# value, and the common conversions in models widen (fp16 -> fp32 around norms), which
# round nothing; a narrowing conversion's rounding is that of its output dtype.
op("to", "x dtype", "pointwise", finite=True, attributes="dtype", impl="Tensor.to", exact=True,
   error="exact", sign=signs.same, interval=iv.same, triton="@to", triton_cast=(),
   spell="Tensor.to Tensor.float:to_float32 Tensor.half:to_float16"
   " Tensor.double:to_float64 Tensor.bfloat16:to_bfloat16 Tensor.long:to_int64"
   " Tensor.int:to_int32 Tensor.bool:to_bool aten._to_copy.default:to_copy aten.to.dtype"
   " aten.to.device aten.to.dtype_layout Tensor.type:tensor_type",
   why={"flops": "a conversion computes nothing"})
# A memory format the program asks for (``x.contiguous(memory_format=torch.channels_last)``,
# kornia's SSIM before its depthwise convolutions) is equal in value to its operand, but it
# is a layout the program chose for speed: a copy of its own, kept where the source has it
# (the plain ``contiguous`` is ``identity``; emission makes outputs contiguous as needed).
# It runs as ``to``, which gives a tensor of size-1 channels the format's own strides (kornia's
# HardNet on one-channel patches), where ``contiguous`` would keep it as it is: a convolution
# picks its kernel's layout from those strides, and dropout draws its mask in memory order.
op("to_layout", "x layout", "library", attributes="layout", impl="Tensor.to",
   call=lambda x, layout: ((x,), {"memory_format": layout}), finite=True, exact=True,
   error="exact", sign=signs.same, interval=iv.same,
   why={"flops": "a copy computes nothing",
        "triton": "a kernel writes its output contiguous; the copy runs as torch's",
        "spellings": "the memory_format of contiguous, clone and to (identity's and to's)"})

_GLOBAL_MEAN = (" torch.nn.functional.adaptive_avg_pool2d:global_mean"
                " torch._C._nn.adaptive_avg_pool2d:global_mean"
                " aten.adaptive_avg_pool2d.default:global_mean"
                " aten._adaptive_avg_pool2d.default:global_mean")
"""The adaptive average poolings to one element that are means (``global_mean``)."""

for _name, _flops, _sign, _interval, _error, _aten in [
        ("sum", 1, signs.one_signed, iv.summed, "summing", "dim_IntList default"),
        ("mean", 1, signs.one_signed, iv.same, "summing", "dim default"),
        ("amax", 1, signs.same, iv.same, "exact", "default"),
        ("amin", 1, signs.same, iv.same, "exact", "default"),
        ("logsumexp", 4, None, iv.logsumexp, "mixing", "default")]:
    op(_name, "x dim keepdim", "reduction", attributes="dim keepdim", impl=f"torch.{_name}",
       call=_reduce_call, normalize=_norm_reduce, flops=_flops, exact=_error == "exact",
       error=_error, sign=_sign, interval=_interval, triton=f"@{_name}",
       stable=_name == "logsumexp",
       # (torch's logsumexp allocates its maxima and the shifted operand, whose exp it
       # sums; a half-precision sum or mean over several dims, a float32 copy of its operand)
       workspace="measured" if _name in ("logsumexp", "sum", "mean") else None,
       spell=f"torch.{_name} Tensor.{_name} " + " ".join(
           f"aten.{_name}.{overload}" for overload in _aten.split())
       + (_GLOBAL_MEAN if _name == "mean" else ""))
op("var", "x dim correction keepdim", "reduction", attributes="dim correction keepdim",
   impl="torch.var", call=lambda x, d, c, k: ((x,), {"dim": d, "correction": c,
                                                    "keepdim": k}),
   normalize=_norm_reduce, flops=3, error="mixing", stable=True, sign=NONNEG,
   interval=iv.variance, triton="@var",
   spell="torch.var Tensor.var aten.var.correction aten.var.dim torch.var_mean:var_mean"
   " aten.var_mean.correction:var_mean aten.var_mean.dim:var_mean")


def _one_dim(x: Any, dim: Any) -> tuple[tuple, dict]:
    """The call of an op over one dim, held as a 1-tuple (or computed where the program
    runs: ``x.softmax(d)`` with ``d`` from an opaque call)."""
    return (x, dim[0] if isinstance(dim, tuple) else dim), {}


# One dim, held as a 1-tuple like the reductions' dims, so rules bind the same literal.
op("softmax", "x dim", "reduction", finite=True, attributes="dim", impl="torch.softmax",
   call=_one_dim, normalize=_norm_reduce, flops=5, error="mixing",
   stable=True, sign=POS, interval=iv.softmax, triton="@softmax",
   spell="torch.softmax:torch_softmax torch.nn.functional.softmax"
   " Tensor.softmax:torch_softmax"
   " aten._softmax.default:aten_softmax_half aten.softmax.int:aten_softmax",
   modules=(Module("torch.nn.Softmax", ("input", "dim"), _explicit_dim),),
   workspace=_contiguous_copy)
op("log_softmax", "x dim", "reduction", attributes="dim", impl="torch.log_softmax",
   call=_one_dim, normalize=_norm_reduce, flops=5, error="mixing",
   stable=True, sign=NONPOS, interval=iv.log_softmax, triton="@log_softmax",
   spell="torch.log_softmax:torch_softmax torch.nn.functional.log_softmax"
   " Tensor.log_softmax:torch_softmax"
   " aten._log_softmax.default:aten_softmax_half aten.log_softmax.int:aten_softmax",
   modules=(Module("torch.nn.LogSoftmax", ("input", "dim"), _explicit_dim),),
   workspace=_contiguous_copy)
op("layer_norm", "x shape weight bias eps", "reduction", attributes="shape eps",
   impl="torch.nn.functional.layer_norm", flops=8, error="mixing", stable=True,
   interval=iv.normalised(bias=True), triton="@layer_norm",
   spell="torch.nn.functional.layer_norm torch.layer_norm aten.layer_norm.default",
   modules=(Module("torch.nn.LayerNorm", ("input", "normalized_shape", "weight", "bias",
                                          "eps")),),
   workspace=_row_statistics)
op("rms_norm", "x shape weight eps", "reduction", attributes="shape eps",
   impl="torch.nn.functional.rms_norm", flops=5, error="mixing", stable=True,
   interval=iv.normalised(bias=False), triton="@rms_norm",
   spell="torch.nn.functional.rms_norm",
   modules=(Module("torch.nn.RMSNorm", ("input", "normalized_shape", "weight", "eps")),),
   workspace="measured")
op("max_dim", "x dim keepdim", "reduction", finite=True, attributes="dim keepdim", impl="torch.max",
   normalize=_norm_dim(1), flops=1, exact=True, error="exact",
   spell="torch.max:max Tensor.max:max aten.max.dim:max aten.max.default:max",
   why={"triton": "returns values and indices (a tuple)",
        "interval": "its value is a tuple; the items' ranges are not tracked"})
op("min_dim", "x dim keepdim", "reduction", finite=True, attributes="dim keepdim", impl="torch.min",
   normalize=_norm_dim(1), flops=1, exact=True, error="exact",
   spell="torch.min:min Tensor.min:min aten.min.dim:min aten.min.default:min",
   why={"triton": "returns values and indices (a tuple)",
        "interval": "its value is a tuple; the items' ranges are not tracked"})

_NO_KERNEL = "a library kernel (torch's), not generated"
op("gather", "x dim index", "library", finite=True, impl="torch.gather", normalize=_norm_dim(1),
   exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.gather Tensor.gather aten.gather.default", workspace=_half_gather,
   why={"triton": _NO_KERNEL})
op("cumsum", "x dim", "library", attributes="dim", impl="torch.cumsum",
   normalize=_norm_dim(1), flops=1, error="mixing", interval=None,
   why={"triton": _NO_KERNEL, "spellings": "reached only from rules, not from programs",
        "interval": "a running sum's range depends on the row length (not tracked)"})
op("matmul", "x y", "library", impl="torch.matmul", flops=_matmul_flops, contiguous=True,
   error="multilinear", interval=iv.contraction,
   spell="torch.matmul torch.mm torch.bmm operator.matmul Tensor.matmul Tensor.mm"
   " Tensor.bmm Tensor.__matmul__ aten.mm.default aten.bmm.default aten.matmul.default",
   why={"triton": _NO_KERNEL},
   # (torch.matmul views a batch as one matrix, or a matrix as a batch, copying what does
   # not fold, by the operands' strides and by whether one requires grad: measured)
   workspace="measured")
# einsum stays the source's one call beside the ops it is made of (the rules einsum-product
# and einsum-sum add them to its class, egraph.ops.einsum_plan plans them): extraction takes
# whichever the cost model prices lower (on the CPU the ops: einsum's own planning costs two
# launches), and the call where no plan exists (a diagonal, sizes that vary).
op("einsum", "equation *operands", "library", attributes="equation", impl="torch.einsum",
   flops=_einsum_flops, error="multilinear", interval=iv.einsum_contraction,
   spell="torch.einsum torch.functional.einsum aten.einsum.default",
   why={"triton": _NO_KERNEL},
   workspace="measured")
op("linear", "x weight bias", "library", impl="torch.nn.functional.linear", contiguous=True,
   workspace="measured",
   flops=_linear_flops, error="multilinear", interval=iv.contraction,
   spell="torch.nn.functional.linear aten.linear.default torch.addmm:addmm"
   " Tensor.addmm:addmm aten.addmm.default:addmm torch.baddbmm:baddbmm"
   " Tensor.baddbmm:baddbmm aten.baddbmm.default:baddbmm",
   modules=(Module("torch.nn.Linear", ("input", "weight", "bias")),),
   why={"triton": _NO_KERNEL})
# a product plus a tensor of its shape as one BLAS call that adds it while writing the
# product (a tied weight's two gradients, GPT-2's lm_head and embedding: 231 ms against 275
# for mm then add at 512 x 50304 x 768 on one CPU); programs' addmm lower to the sum and
# the product, the rule addmm joins them where the cost model prices it lower
op("addmm", "c x y", "library", impl="torch.addmm", contiguous=True, workspace="measured",
   flops=lambda n, kids: _matmul_flops(n, kids[1:]) + n, error="multilinear",
   interval=iv.accumulated_contraction,
   why={"triton": _NO_KERNEL, "spellings": "reached only from rules: torch.addmm lowers "
        "to its sum and product (linear's spellings)"})
# linear through oneDNN's inner product on the CPU (torch's linear elsewhere): the rule
# linear-onednn adds it beside linear, and the cost model chooses by this machine's
# measured curve of each (a profile that has not measured it never chooses it); a
# program that calls it (one we emitted, or its operator in a graph traced from one:
# aot_autograd's) reads back as linear
op("onednn_linear", "x weight bias", "library", impl="frontends.fx.kernels.onednn_linear",
   contiguous=True, workspace="measured", flops=_linear_flops, error="multilinear",
   interval=iv.contraction,
   spell="frontends.fx.kernels.onednn_linear:linear ops.egraph.onednn_linear.default:linear",
   why={"triton": _NO_KERNEL})
# linear through MKL's packed matrix product on the CPU, the weight packed once for the
# input's row count (torch's linear elsewhere, and under tracers): the rule linear-mkl adds
# it, priced like onednn_linear by its measured curve only
op("mkl_linear", "x weight bias", "library", impl="frontends.fx.kernels.mkl_linear",
   workspace="measured", flops=_linear_flops, error="multilinear",
   interval=iv.contraction, spell="frontends.fx.kernels.mkl_linear:linear",
   why={"triton": _NO_KERNEL})
op("grouped_mm", "x w offs", "library", impl="frontends.fx.kernels.grouped_mm",
   contiguous=True, flops=_matmul_flops, error="multilinear", interval=iv.grouped_contraction,
   spell="ops.transformers.grouped_mm_fallback:grouped_mm_fallback"
   " ops.transformers.grouped_mm_fallback.default:grouped_mm_fallback",
   why={"triton": _NO_KERNEL},
   workspace="measured")
op("batch_norm", "x mean var weight bias eps", "library", attributes="eps",
   impl="torch.nn.functional.batch_norm",
   call=lambda x, m, v, w, b, eps: ((x, m, v, w, b), {"training": False, "eps": eps}),
   flops=2, error="mixing", spell="torch.nn.functional.batch_norm torch.batch_norm:aten_batch_norm"
   " aten.batch_norm.default:aten_batch_norm",
   modules=(Module("torch.nn.BatchNorm1d", ("input", "running_mean", "running_var",
                                            "weight", "bias", "eps"), _inference_statistics),
            Module("torch.nn.BatchNorm2d", ("input", "running_mean", "running_var",
                                            "weight", "bias", "eps"), _inference_statistics)),
   why={"triton": _NO_KERNEL,
        "interval": "depends on the running statistics' values (not tracked)"},
   workspace=_channel_statistics)
# padding_idx changes only the gradient (that row gets none), but the emitted module may be
# trained, so it is kept: None, or the non-negative row index.
op("embedding", "indices weight padding_idx", "library", finite=True, attributes="padding_idx",
   contiguous=True, impl="torch.nn.functional.embedding",
   call=lambda i, w, p: ((i, w), {} if p is None else {"padding_idx": p}),
   normalize=_norm_padding_idx, exact=True, error="exact", interval=iv.operand(1),
   spell="torch.nn.functional.embedding aten.embedding.default:aten_embedding"
   " torch.embedding:aten_embedding",
   modules=(Module("torch.nn.Embedding", ("input", "weight", "padding_idx"),
                   _plain_embedding),),
   why={"triton": _NO_KERNEL})
for _name in ("conv1d", "conv2d"):
    op(_name, "x weight bias stride padding dilation groups", "library", workspace="measured",
       attributes="stride padding dilation groups", impl=f"torch.nn.functional.{_name}",
       flops=_conv_flops, error="multilinear", interval=iv.convolution,
       spell=f"torch.nn.functional.{_name}:conv torch.{_name}:conv aten.{_name}.default:conv"
       f" aten.{_name}.padding:conv",
       modules=(Module(f"torch.nn.Conv{_name[-2:-1]}d",
                       ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                       _zero_padded),),
       why={"triton": _NO_KERNEL})
# conv2d through oneDNN with packed weights on the CPU (torch's conv2d elsewhere): the rule
# conv2d-onednn adds it, priced like onednn_linear by its measured curve only
op("onednn_conv2d", "x weight bias stride padding dilation groups", "library",
   workspace="measured", channels_last=True, attributes="stride padding dilation groups",
   impl="frontends.fx.kernels.onednn_conv2d", flops=_conv_flops, error="multilinear",
   interval=iv.convolution, spell="frontends.fx.kernels.onednn_conv2d:as_conv2d"
   " ops.egraph.onednn_conv2d.default:as_conv2d", why={"triton": _NO_KERNEL})
# oneDNN's convolution and inner product with their post-ops (a residual sum, a ReLU, a
# GELU) applied to each block of the output while it is in cache: the post-op rules of
# egraph/rules/kernels.py add them beside the calls they fuse, and extraction pays for
# them as for the one library call they are, so that it
# chooses them where nothing else reads the product (DAG extraction pays for a product read
# twice once more); programs that call them read back as the plain ops
op("onednn_conv2d_relu", "x weight bias stride padding dilation groups other", "library",
   workspace="measured", channels_last=True, attributes="stride padding dilation groups",
   impl="frontends.fx.kernels.onednn_conv2d_relu",
   call=lambda x, w, b, st, pa, di, g, other: (
       (x, w, b, st, pa, di, g), {} if other is None else {"other": other}),
   # (the ReLU, and the sum where ``other`` is a tensor)
   flops=lambda n, kids: _conv_flops(n, kids) + (2 if _has_bias(kids[7]) else 1) * n,
   error="multilinear", sign=NONNEG,
   interval=lambda kids, values, shapes: iv.relu(
       [iv.convolution(kids, values, shapes) if kids[7] is None else iv.total(
           [iv.convolution(kids, values, shapes), kids[7]], values, shapes)], values, shapes),
   spell="frontends.fx.kernels.onednn_conv2d_relu:as_conv2d_relu",
   why={"triton": _NO_KERNEL})
op("onednn_linear_gelu", "x weight bias approximate", "library", attributes="approximate",
   impl="frontends.fx.kernels.onednn_linear_gelu", contiguous=True, workspace="measured",
   flops=lambda n, kids: _linear_flops(n, kids) + 8 * n, error="multilinear",
   interval=lambda kids, values, shapes: iv.gated(
       [iv.contraction(kids, values, shapes)], values, shapes),
   spell="frontends.fx.kernels.onednn_linear_gelu:as_linear_gelu",
   why={"triton": _NO_KERNEL})
# Pooling: a window's max (exact: one of its values) or average (a sum), per sample and
# channel, so both commute with concatenation over the batch or the channels.
op("max_pool2d", "x kernel stride padding dilation ceil_mode", "library", finite=True,
   attributes="kernel stride padding dilation ceil_mode",
   impl="torch.nn.functional.max_pool2d", normalize=_norm_pool(4), flops=_pool_flops,
   exact=True, error="exact",
   sign=signs.same, interval=iv.same,
   spell="torch.nn.functional.max_pool2d:max_pool2d torch.max_pool2d:max_pool2d"
   " aten.max_pool2d.default:max_pool2d",
   modules=(Module("torch.nn.MaxPool2d", ("input", "kernel_size", "stride", "padding",
                                          "dilation", "ceil_mode"),
                   lambda m: not m.return_indices),),
   why={"triton": _NO_KERNEL},
   workspace=_window_indices)
op("avg_pool2d", "x kernel stride padding ceil_mode count_include_pad divisor", "library",
   attributes="kernel stride padding ceil_mode count_include_pad divisor",
   impl="torch.nn.functional.avg_pool2d", normalize=_norm_pool(3), flops=_pool_flops,
   error="summing",
   interval=iv.with_zero,
   spell="torch.nn.functional.avg_pool2d:avg_pool2d torch._C._nn.avg_pool2d:avg_pool2d"
   " aten.avg_pool2d.default:avg_pool2d",
   modules=(Module("torch.nn.AvgPool2d", ("input", "kernel_size", "stride", "padding",
                                          "ceil_mode", "count_include_pad",
                                          "divisor_override")),),
   why={"triton": _NO_KERNEL})
# ``gqa``: grouped-query attention, keys and values with fewer heads than the query, each
# shared by a group of query heads (``enable_gqa``; Llama's cached decoding calls it).
op("sdpa", "q k v mask causal scale gqa", "library", attributes="causal scale gqa",
   impl="torch.nn.functional.scaled_dot_product_attention",
   call=lambda q, k, v, m, c, s, g: ((q, k, v), {"attn_mask": m, "is_causal": c, "scale": s,
                                                 "enable_gqa": g}),
   flops=_sdpa_flops, error="mixing", stable=True, interval=iv.operand(2),
   spell="torch.nn.functional.scaled_dot_product_attention"
   " aten.scaled_dot_product_attention.default",
   why={"triton": _NO_KERNEL},
   workspace="measured")
# Attention with the scores filled with -inf where a bool ``mask`` is set, or with a float
# ``mask`` added to them, as written; run as causal sdpa while the mask is the causal one,
# a check made at run time (a buffer's mask may change after compiling; a mask made from
# the sizes is made anew for each). It reads the mask besides what sdpa does. ``gqa`` as
# sdpa's.
op("masked_attention", "q k v mask scale gqa", "library", attributes="scale gqa",
   impl="frontends.fx.kernels.masked_attention", flops=_masked_attention_flops,
   error="mixing", stable=True, interval=iv.operand(2),
   why={"triton": _NO_KERNEL, "spellings": "the fusion rules make it from attention written "
        "out with a mask; a tracer reads its kernel's torch calls"},
   workspace="measured")
op("cat", "dim *xs", "library", finite=True, attributes="dim", impl="torch.cat",
   call=lambda d, *xs: ((list(xs),), {"dim": d}), normalize=_norm_cat, exact=True,
   error="exact",
   interval=iv.joined, spell="torch.cat torch.concat torch.concatenate aten.cat.default",
   why={"triton": _NO_KERNEL})
# Constant padding: TASO's ``enlarge`` (a kernel padded with zeros to a larger one) and
# the F.pad calls of real models. Its values are the operand's and the fill: exact.
op("pad", "x sizes value", "library", finite=True, attributes="sizes value",
   impl="torch.nn.functional.pad", call=lambda x, p, v: ((x, list(p)), {"value": v}),
   symbolic_impl="torch._refs.constant_pad_nd",
   exact=True, error="exact", interval=iv.padded,
   spell="torch.nn.functional.pad:pad torch._C._nn.pad:pad aten.pad.default:pad"
   " aten.constant_pad_nd.default:constant_pad_nd",
   why={"triton": _NO_KERNEL})
op("stack", "dim *xs", "library", finite=True, attributes="dim", impl="torch.stack",
   call=lambda d, *xs: ((list(xs),), {"dim": d}), exact=True, error="exact",
   interval=iv.joined, spell="torch.stack aten.stack.default", why={"triton": _NO_KERNEL})
for _name in ("tril", "triu"):
    op(_name, "x diagonal", "library", attributes="diagonal", finite=True, impl=f"torch.{_name}",
       exact=True, error="exact",
       spell=f"torch.{_name}:tri Tensor.{_name}:tri aten.{_name}.default:tri",
       why={"triton": _NO_KERNEL,
            "interval": "zeros join the operand's values (not tracked)"})

_VIEW = {"flops": "a view computes nothing", "triton": "a view is an indexing of its operand"}
op("reshape", "x shape", "view", attributes="shape", impl="torch.reshape",
   normalize=_norm_shape, exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.reshape Tensor.reshape Tensor.view aten.view.default aten.reshape.default"
   " aten._unsafe_view.default", workspace=_reshape_copy, why=_VIEW)
op("permute", "x dims", "view", attributes="dims", impl="torch.permute",
   normalize=_norm_permute, exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.permute Tensor.permute aten.permute.default", why=_VIEW)
op("transpose", "x dim0 dim1", "view", attributes="dim0 dim1", impl="torch.transpose",
   normalize=_norm_transpose, exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.transpose torch.swapaxes Tensor.transpose Tensor.swapaxes aten.transpose.int"
   " torch.t:t Tensor.t:t aten.t.default:t", why=_VIEW)
op("unsqueeze", "x dim", "view", attributes="dim", impl="torch.unsqueeze",
   normalize=_norm_dim(1, extra=1), exact=True, error="exact", sign=signs.same,
   interval=iv.same, spell="torch.unsqueeze Tensor.unsqueeze aten.unsqueeze.default",
   why=_VIEW)
op("squeeze", "x dim", "view", attributes="dim", impl="torch.squeeze",
   normalize=_norm_dim(1), exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.squeeze Tensor.squeeze aten.squeeze.dim", why=_VIEW)
op("expand", "x shape", "view", attributes="shape", impl="Tensor.expand", exact=True,
   error="exact", sign=signs.same, interval=iv.same,
   spell="Tensor.expand aten.expand.default", why=_VIEW)
op("flatten", "x start end", "view", attributes="start end", impl="torch.flatten",
   exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="torch.flatten Tensor.flatten aten.flatten.using_ints",
   modules=(Module("torch.nn.Flatten", ("input", "start_dim", "end_dim")),),
   workspace=_reshape_copy, why=_VIEW)
op("getitem", "x index", "view", attributes="index", impl="operator.getitem", exact=True,
   error="exact", sign=signs.same, interval=iv.same,
   spell="operator.getitem aten.slice.Tensor:aten_slice aten.select.int:aten_select"
   " aten.index.Tensor:aten_index", why=_VIEW)
# ``x[index] = value`` as a value: x's elements with value's written at index (dynamo
# spells a write into a tensor the graph made so; ingest rebinds the name to the result)
op("setitem", "x index value", "library", attributes="index",
   impl="frontends.fx.kernels.setitem", exact=True, error="exact", sign=signs.filled,
   interval=iv.filled, spell="operator.setitem Tensor.__setitem__", why={
       "flops": "a copy and a write, no arithmetic", "triton": _NO_KERNEL})
op("split", "x size dim", "view", attributes="size dim", impl="torch.split",
   normalize=_norm_dim(2), exact=True, error="exact",
   spell="torch.split Tensor.split aten.split.Tensor aten.split_with_sizes.default",
   why={**_VIEW, "interval": "its value is a tuple of views"})
op("chunk", "x chunks dim", "view", attributes="chunks dim", impl="torch.chunk",
   exact=True, error="exact", spell="torch.chunk Tensor.chunk aten.chunk.default",
   why={**_VIEW, "interval": "its value is a tuple of views"})
# The value itself, with autograd's history cut: not the identity, since a program
# autograd differentiates (the compile backend's, an exported module trained) would pass
# gradients through it.
op("detach", "x", "view", impl="torch.detach", exact=True, error="exact", sign=signs.same,
   interval=iv.same, spell="torch.detach:unary Tensor.detach:unary aten.detach.default:unary",
   why={**_VIEW, "triton": "a kernel's values carry no autograd history"})
# The value itself: ingest replaces it by its operand, so it never reaches an e-graph.
op("identity", "x", "view", exact=True, error="exact", sign=signs.same, interval=iv.same,
   spell="Tensor.contiguous:contiguous aten.contiguous.default:contiguous"
   " torch.clone:contiguous Tensor.clone:contiguous aten.clone.default:contiguous"
   " aten.alias.default"
   " aten.lift_fresh_copy.default",
   modules=(Module("torch.nn.Identity", ("input",)),
            *(Module(f"torch.nn.{d}", ("input",), _inactive_dropout)
              for d in ("Dropout", "Dropout1d", "Dropout2d", "AlphaDropout"))),
   why={**_VIEW, "impl": "replaced by its operand at ingest"})

_CREATE = {"triton": "an iota is not generated; the op runs as a torch call"}
op("full", "shape value dtype device", "creation", attributes="shape value dtype device",
   impl="torch.full", call=lambda s, v, d, at: ((s, v), {"dtype": d, "device": at}), exact=True,
   error="exact", sign=signs.fill, interval=iv.fill, triton="@constant",
   spell="torch.full torch.ones:ones torch.zeros:zeros aten.full.default aten.ones.default:ones"
   " aten.zeros.default:zeros")
op("arange", "start end step dtype device", "creation",
   attributes="start end step dtype device", impl="torch.arange",
   call=lambda a, b, s, d, at: ((a, b, s), {"dtype": d, "device": at}), exact=True,
   error="exact", spell="torch.arange aten.arange.default:arange_end aten.arange.start:arange"
   " aten.arange.start_step:arange", why={
       **_CREATE, "interval": "bounded by its literal ends (not tracked)"})
op("ones_like", "x", "creation", sympy="1", impl="torch.ones_like", exact=True, error="exact",
   sign=POS, interval=iv.constant(1.0, 1.0), triton="@constant", spell="torch.ones_like:like")
op("zeros_like", "x", "creation", sympy="0", impl="torch.zeros_like", exact=True, error="exact",
   sign=ZERO, interval=iv.constant(0.0, 0.0), triton="@constant",
   spell="torch.zeros_like:like")
op("full_like", "x value", "creation", attributes="value", impl="torch.full_like",
   exact=True, error="exact", sign=signs.fill, interval=iv.fill, triton="@constant",
   spell="torch.full_like")

_SHAPE = {"flops": "size arithmetic runs in Python", "triton": "not a tensor"}
op("size", "x dim", "shape", attributes="dim", impl="Tensor.size",
   call=lambda x, d: ((x,) if d is None else (x, d), {}), normalize=_norm_dim(1),
   exact=True, error="exact", spell="Tensor.size aten.sym_size.int builtins.getattr:shape",
   why=_SHAPE)
op("tuple", "*items", "shape", exact=True, error="exact",
   why={**_SHAPE, "impl": "a Python tuple, emitted as one"})
op("slice", "start stop step", "shape", exact=True, error="exact",
   why={**_SHAPE, "impl": "a Python slice, emitted as one"})

_LEAF = {"flops": "a leaf", "impl": "a value held outside the e-graph",
         "triton": "a kernel's input"}
for _name in ("input", "param", "const"):
    op(_name, "name", "leaf", attributes="name", exact=True, error="exact", why=_LEAF)
op("opaque", "token *args", "opaque", why={
    "flops": "unknown: the call is emitted as it was", "impl": "the original call",
    "triton": "the original call", "error": "rounds once, like an elementwise op"})
