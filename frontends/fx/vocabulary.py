"""The canonical op vocabulary: one table of every op, its parameters, implementation and
the spellings that map to it.

An e-node of a tensor program is ``(name, *params)``: tensors first, then the attributes
that change meaning (dims, keepdim, shapes, scalars) as literal leaves, in the order of
:attr:`OpSpec.params`. ``impl`` is the torch callable the emitted code calls (and that
shape inference runs on meta tensors); ``call`` turns the canonical parameter values into
that callable's arguments. Spellings map a torch-level or aten-level target, with its own
signature, to a canonical expression. Adding an op is one :func:`op` entry plus spellings.

>>> SPECS["softmax"].params
('x', 'dim')
>>> lower(torch.softmax, ("x", -1), {})
('softmax', ['x', -1])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten


@dataclass(frozen=True)
class OpSpec:
    """One canonical op: parameter names (``*rest`` for a variadic tail), implementation
    (a torch callable, or a method name as a string), and how canonical values become the
    implementation's ``(args, kwargs)``."""

    name: str
    params: tuple[str, ...]
    impl: Callable | str
    call: Callable[..., tuple[tuple, dict]] | None = None
    normalize: Callable[[list, list], list] | None = field(default=None, compare=False)

    def run(self, values: list):
        """Apply the op to concrete (or meta) values."""
        args, kwargs = self.arguments(values)
        if isinstance(self.impl, str):
            return getattr(args[0], self.impl)(*args[1:], **kwargs)
        return self.impl(*args, **kwargs)

    def arguments(self, values: list) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for :attr:`impl` from canonical parameter values."""
        if self.call is not None:
            return self.call(*values)
        return tuple(values), {}


SPECS: dict[str, OpSpec] = {}


def op(name: str, params: str, impl: Callable, call: Callable | None = None,
       normalize: Callable | None = None) -> OpSpec:
    """Register a canonical op (``params`` is a space-separated list of names)."""
    spec = OpSpec(name, tuple(params.split()), impl, call, normalize)
    SPECS[name] = spec
    return spec


# -- attribute normalisation (needs the input's rank) --------------------------------------


class _Unknown:
    """Stands for an attribute whose value is not a known literal (left as it is)."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN_VALUE = _Unknown()


def _rank(meta) -> int | None:
    shape = getattr(meta, "shape", None)
    return None if shape is None else len(shape)


def dims_of(dim, rank: int | None):
    """Reduction dims as a sorted tuple of non-negative ints (None: every dim)."""
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


# -- the table -----------------------------------------------------------------------------

for _name, _impl in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                     ("div", torch.div), ("pow", torch.pow), ("maximum", torch.maximum),
                     ("minimum", torch.minimum), ("eq", torch.eq), ("ne", torch.ne),
                     ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge),
                     ("atan2", torch.atan2), ("floordiv", torch.floor_divide),
                     ("remainder", torch.remainder), ("logaddexp", torch.logaddexp),
                     ("hypot", torch.hypot)]:
    op(_name, "x y", _impl)

for _name, _impl in [("neg", torch.neg), ("exp", torch.exp), ("log", torch.log),
                     ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("abs", torch.abs),
                     ("sin", torch.sin), ("cos", torch.cos), ("tanh", torch.tanh),
                     ("sigmoid", torch.sigmoid), ("relu", torch.relu), ("silu", F.silu),
                     ("erf", torch.erf), ("log1p", torch.log1p), ("expm1", torch.expm1),
                     ("reciprocal", torch.reciprocal), ("sign", torch.sign),
                     ("logsigmoid", F.logsigmoid), ("floor", torch.floor), ("ceil", torch.ceil),
                     ("logical_not", torch.logical_not), ("bitwise_not", torch.bitwise_not)]:
    op(_name, "x", _impl)

op("gelu", "x approximate", F.gelu, lambda x, a: ((x,), {} if a == "none" else {"approximate": a}))
op("softplus", "x beta threshold", F.softplus)
op("clamp", "x min max", torch.clamp)
op("where", "cond x y", torch.where)
op("masked_fill", "x mask value", torch.masked_fill)

for _name, _impl in [("sum", torch.sum), ("mean", torch.mean), ("amax", torch.amax),
                     ("amin", torch.amin), ("logsumexp", torch.logsumexp)]:
    op(_name, "x dim keepdim", _impl, _reduce_call, _norm_reduce)
op("var", "x dim correction keepdim", torch.var,
   lambda x, d, c, k: ((x,), {"dim": d, "correction": c, "keepdim": k}), _norm_reduce)
# One dim, held as a 1-tuple like the reductions' dims, so rules bind the same literal.
op("softmax", "x dim", torch.softmax, lambda x, d: ((x, d[0]), {}), _norm_reduce)
op("log_softmax", "x dim", torch.log_softmax, lambda x, d: ((x, d[0]), {}), _norm_reduce)
op("gather", "x dim index", torch.gather, normalize=_norm_dim(1))
op("cumsum", "x dim", torch.cumsum, normalize=_norm_dim(1))

op("matmul", "x y", torch.matmul)
op("linear", "x weight bias", F.linear)
op("layer_norm", "x shape weight bias eps", F.layer_norm)
op("rms_norm", "x shape weight eps", F.rms_norm)
op("batch_norm", "x mean var weight bias eps", F.batch_norm,
   lambda x, m, v, w, b, eps: ((x, m, v, w, b), {"training": False, "eps": eps}))
# padding_idx changes only the gradient (that row gets none), but the emitted module may be
# trained, so it is kept: None, or the non-negative row index.
op("embedding", "indices weight padding_idx", F.embedding,
   lambda i, w, p: ((i, w), {} if p is None else {"padding_idx": p}), _norm_padding_idx)
op("conv1d", "x weight bias stride padding dilation groups", F.conv1d)
op("conv2d", "x weight bias stride padding dilation groups", F.conv2d)
op("sdpa", "q k v mask causal scale", F.scaled_dot_product_attention,
   lambda q, k, v, m, c, s: ((q, k, v), {"attn_mask": m, "is_causal": c, "scale": s}))

op("reshape", "x shape", torch.reshape, normalize=_norm_shape)
op("permute", "x dims", torch.permute, normalize=_norm_permute)
op("transpose", "x dim0 dim1", torch.transpose, normalize=_norm_transpose)
op("unsqueeze", "x dim", torch.unsqueeze, normalize=_norm_dim(1, extra=1))
op("squeeze", "x dim", torch.squeeze, normalize=_norm_dim(1))
op("expand", "x shape", "expand")
op("flatten", "x start end", torch.flatten)
op("cat", "dim *xs", torch.cat, lambda d, *xs: ((list(xs),), {"dim": d}))
op("stack", "dim *xs", torch.stack, lambda d, *xs: ((list(xs),), {"dim": d}))
op("tril", "x diagonal", torch.tril)
op("triu", "x diagonal", torch.triu)
op("to", "x dtype", "to")
op("getitem", "x index", operator.getitem)
op("size", "x dim", "size", lambda x, d: ((x,) if d is None else (x, d), {}),
   normalize=_norm_dim(1))
op("split", "x size dim", torch.split)
op("chunk", "x chunks dim", torch.chunk)
op("max_dim", "x dim keepdim", torch.max, normalize=_norm_dim(1))

# Creation ops (no tensor input): shapes, fill values and dtypes are literals.
op("full", "shape value dtype", torch.full, lambda s, v, d: ((s, v), {"dtype": d}))
op("arange", "start end step dtype", torch.arange,
   lambda a, b, s, d: ((a, b, s), {"dtype": d}))
op("ones_like", "x", torch.ones_like)
op("zeros_like", "x", torch.zeros_like)
op("full_like", "x value", torch.full_like)


# -- spellings -----------------------------------------------------------------------------
# Each maps a target's own signature to a canonical expression: (name, [values]) where a
# value is an FX argument, a Python constant, or a nested canonical expression.

Lowered = tuple[str, list]


def _binary(name: str):
    def lower(input, other, alpha=1, *, out=None, rounding_mode=None):
        if rounding_mode is not None:
            raise _Unsupported(f"{name} with rounding_mode={rounding_mode!r}")
        if alpha != 1:
            other = ("mul", [other, alpha])
        return (name, [input, other])
    return lower


def _reverse(name: str):
    def lower(a, b):
        return (name, [b, a])
    return lower


def _unary(name: str):
    def lower(input, *args, **kwargs):
        if args or any(v is not None for k, v in kwargs.items() if k != "inplace"):
            raise _Unsupported(f"{name} with extra arguments {args} {kwargs}")
        return (name, [input])
    return lower


def _reduce(name: str):
    def lower(input, dim=None, keepdim=False, *, dtype=None, out=None):
        if dtype is not None:
            input = ("to", [input, dtype])
        return (name, [input, dim, keepdim])
    return lower


def _softmax(name: str):
    def lower(input, dim=None, _stacklevel=3, dtype=None, half_to_float=None):
        if dim is None:
            raise _Unsupported(f"{name} without a dim (deprecated implicit dim)")
        if dtype is not None:
            input = ("to", [input, dtype])
        return (name, [input, dim])
    return lower


class _Unsupported(Exception):
    """A known op called with arguments the vocabulary does not model (kept opaque)."""


def _var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if correction is None:
        correction = 0 if unbiased is False else 1
    return ("var", [input, dim, correction, keepdim])


def _gelu(input, approximate="none"):
    return ("gelu", [input, approximate])


def _softplus(input, beta=1.0, threshold=20.0):
    return ("softplus", [input, beta, threshold])


def _clamp(input, min=None, max=None):
    return ("clamp", [input, min, max])


def _where(condition, input, other):
    return ("where", [condition, input, other])


def _masked_fill(input, mask, value):
    return ("masked_fill", [input, mask, value])


def _matmul(input, other):
    return ("matmul", [input, other])


def _linear(input, weight, bias=None):
    return ("linear", [input, weight, bias])


def _addmm(input, mat1, mat2, *, beta=1, alpha=1):
    product = ("matmul", [mat1, mat2])
    if alpha != 1:
        product = ("mul", [product, alpha])
    bias = input if beta == 1 else ("mul", [input, beta])
    return ("add", [product, bias])


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5,
                cudnn_enable=None):
    return ("layer_norm", [input, tuple(normalized_shape), weight, bias, eps])


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    return ("rms_norm", [input, tuple(normalized_shape), weight, eps])


def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise _Unsupported("embedding with max_norm (it renormalises the weight in place)")
    if scale_grad_by_freq or sparse:
        raise _Unsupported("embedding with scale_grad_by_freq or sparse gradients")
    return ("embedding", [input, weight, padding_idx])


def _aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``aten.embedding`` and ``torch.embedding`` take the weight first; -1 is no padding."""
    return _embedding(indices, weight, None if padding_idx == -1 else padding_idx,
                      scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


def _conv(name: str):
    def lower(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return (name, [input, weight, bias, stride, padding, dilation, groups])
    return lower


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if dropout_p:
        raise _Unsupported("scaled_dot_product_attention with dropout (random)")
    return ("sdpa", [query, key, value, attn_mask, is_causal, scale])


def _holds_shape(value) -> bool:
    """True for an FX node whose value is a whole shape (a ``torch.Size`` with symbolic
    sizes in the graphs torch.compile hands over: ``x.view(x.size()[:-1] + (nf,))``)."""
    meta = getattr(value, "meta", None) or {}
    return isinstance(meta.get("example_value", meta.get("val")), (torch.Size, tuple, list))


def _reshape(input, *shape):
    if len(shape) == 1 and _holds_shape(shape[0]):
        return ("reshape", [input, shape[0]])
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = tuple(shape[0])
    return ("reshape", [input, tuple(shape)])


def _permute(input, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    return ("permute", [input, tuple(dims)])


def _transpose(input, dim0, dim1):
    return ("transpose", [input, dim0, dim1])


def _t(input):
    return ("transpose", [input, 0, 1])


def _expand(input, *sizes, implicit=False):
    if len(sizes) == 1 and _holds_shape(sizes[0]):
        return ("expand", [input, sizes[0]])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = tuple(sizes[0])
    return ("expand", [input, tuple(sizes)])


def _identity(input, *args, **kwargs):
    return ("identity", [input])


def _contiguous(input, memory_format=None):
    return ("identity", [input])


def _flatten(input, start_dim=0, end_dim=-1):
    return ("flatten", [input, start_dim, end_dim])


def _unsqueeze(input, dim):
    return ("unsqueeze", [input, dim])


def _squeeze(input, dim=None):
    if dim is None:
        raise _Unsupported("squeeze without a dim (its result depends on the shape)")
    return ("squeeze", [input, dim])


def _cat(tensors, dim=0):
    return ("cat", [dim, *tensors])


def _stack(tensors, dim=0):
    return ("stack", [dim, *tensors])


def _tri(name: str):
    def lower(input, diagonal=0):
        return (name, [input, diagonal])
    return lower


def _to(input, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif a is not None and not isinstance(a, (bool, torch.memory_format)):
            raise _Unsupported(f"to({a!r}): only dtype conversions are modelled")
    if any(k not in ("dtype", "copy", "non_blocking", "memory_format") for k in kwargs):
        raise _Unsupported(f"to with {kwargs}")
    if dtype is None:
        return ("identity", [input])
    return ("to", [input, dtype])


def _dtype_method(dtype: torch.dtype):
    def lower(input, memory_format=None):
        return ("to", [input, dtype])
    return lower


def _size(input, dim=None):
    return ("size", [input, dim])


def _getattr(obj, name, *default):
    if name != "shape":
        raise _Unsupported(f"attribute {name!r}")
    return ("size", [obj, None])


def _split(tensor, split_size_or_sections, dim=0):
    size = split_size_or_sections
    return ("split", [tensor, tuple(size) if isinstance(size, list) else size, dim])


def _chunk(input, chunks, dim=0):
    return ("chunk", [input, chunks, dim])


def _max(input, dim=None, keepdim=False):
    if dim is None:
        return ("amax", [input, None, False])
    if not isinstance(dim, int):
        return ("maximum", [input, dim])
    return ("max_dim", [input, dim, keepdim])


def _min(input, dim=None, keepdim=False):
    if dim is None:
        return ("amin", [input, None, False])
    if not isinstance(dim, int):
        return ("minimum", [input, dim])
    raise _Unsupported("min with a dim (values and indices)")


def _getitem(obj, index):
    return ("getitem", [obj, index])


def _full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
          requires_grad=False):
    return ("full", [tuple(size), fill_value, dtype])


def _filled(value):
    def lower(*size, dtype=None, layout=None, device=None, pin_memory=None,
              requires_grad=False, out=None):
        if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
            size = tuple(size[0])
        return ("full", [tuple(size), value, dtype])
    return lower


def _arange(start, end=None, step=1, *, dtype=None, layout=None, device=None,
            pin_memory=None, requires_grad=False, out=None):
    if end is None:
        start, end = 0, start
    return ("arange", [start, end, step, dtype])


def _like(name: str):
    def lower(input, *, dtype=None, layout=None, device=None, pin_memory=None,
              requires_grad=False, memory_format=None):
        if dtype is not None:
            input = ("to", [input, dtype])
        return (name, [input])
    return lower


def _full_like(input, fill_value, *, dtype=None, layout=None, device=None,
               pin_memory=None, requires_grad=False, memory_format=None):
    if dtype is not None:
        input = ("to", [input, dtype])
    return ("full_like", [input, fill_value])


def _square(input):
    return ("mul", [input, input])


def _rsub(input, other, alpha=1):
    return ("sub", [other, input if alpha == 1 else ("mul", [input, alpha])])


def _batch_norm(input, running_mean, running_var, weight=None, bias=None,
                training=False, momentum=0.1, eps=1e-5, cudnn_enabled=None):
    if training:
        raise _Unsupported("batch_norm in training mode (it updates running statistics)")
    return ("batch_norm", [input, running_mean, running_var, weight, bias, eps])


# Targets whose result is random or that have side effects: always opaque, kept in order.
IMPURE: set = {
    torch.rand, torch.randn, torch.randint, torch.rand_like,
    torch.randn_like, torch.bernoulli, torch.multinomial, torch.normal, print,
    aten.native_dropout.default, aten.bernoulli.default, aten.rand.default,
    aten.randn.default, aten.rand_like.default, aten.randn_like.default,
}

_UNARY = ["neg", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid",
          "relu", "erf", "log1p", "expm1", "reciprocal", "sign", "floor", "ceil",
          "logical_not"]
_BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
           "gt", "ge", "atan2", "logaddexp", "hypot"]
_REDUCE = ["sum", "mean", "amax", "amin", "logsumexp"]

SPELLINGS: dict[Any, Callable[..., Lowered]] = {}
METHODS: dict[str, Callable[..., Lowered]] = {}


def _spell(lower: Callable[..., Lowered], *targets, methods: tuple[str, ...] = ()) -> None:
    for t in targets:
        SPELLINGS[t] = lower
    for m in methods:
        METHODS[m] = lower


for _n in _BINARY:
    _fn = _binary(_n)
    _spell(_fn, getattr(torch, _n), methods=(_n,))
for _n, _pyop in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                  ("div", operator.truediv), ("pow", operator.pow), ("eq", operator.eq),
                  ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                  ("gt", operator.gt), ("ge", operator.ge)]:
    _spell(_binary(_n), _pyop, methods=(f"__{_pyop.__name__}__",))
    _spell(_reverse(_n), methods=(f"__r{_pyop.__name__}__",))
_spell(_binary("div"), torch.true_divide, methods=("true_divide",))
_spell(_binary("mul"), torch.multiply, methods=("multiply",))
_spell(_binary("sub"), torch.subtract, methods=("subtract",))
_spell(_rsub, torch.rsub)
for _n in _UNARY:
    _spell(_unary(_n), getattr(torch, _n), methods=(_n,))
_spell(_unary("neg"), operator.neg, torch.negative, methods=("__neg__", "negative"))
_spell(_unary("abs"), operator.abs, methods=("__abs__",))
_spell(_unary("relu"), F.relu)
_spell(_unary("sigmoid"), F.sigmoid)
_spell(_unary("tanh"), F.tanh)
_spell(_unary("silu"), F.silu)
_spell(_unary("logsigmoid"), F.logsigmoid)
_spell(_unary("bitwise_not"), operator.invert, torch.bitwise_not,
       methods=("__invert__", "bitwise_not"))
_spell(_square, torch.square, methods=("square",))
# Python's math on shape-derived scalars (``math.sqrt(x.size(-1))``) folds to a literal;
# ingest keeps these calls opaque when their argument is not a known scalar.
SCALAR_FUNCTIONS = {getattr(math, n) for n in ("sqrt", "exp", "log", "tanh", "sin", "cos",
                                                "floor", "ceil")}
for _fn in SCALAR_FUNCTIONS:
    _spell(_unary(_fn.__name__), _fn)
_spell(_binary("floordiv"), operator.floordiv, torch.floor_divide,
       methods=("__floordiv__", "floor_divide"))
_spell(_reverse("floordiv"), methods=("__rfloordiv__",))
_spell(_binary("remainder"), operator.mod, torch.remainder, methods=("__mod__", "remainder"))
_spell(_gelu, F.gelu)
_spell(_softplus, F.softplus)
_spell(_clamp, torch.clamp, torch.clip, methods=("clamp", "clip"))
_spell(_where, torch.where)


def _gather(input, dim, index, *, sparse_grad=False):
    return ("gather", [input, dim, index])


_spell(_gather, torch.gather, aten.gather.default, methods=("gather",))
_spell(_masked_fill, torch.masked_fill, methods=("masked_fill",))
for _n in _REDUCE:
    _spell(_reduce(_n), getattr(torch, _n), methods=(_n,))
_spell(_var, torch.var, methods=("var",))
_spell(_softmax("softmax"), torch.softmax, F.softmax, methods=("softmax",))
_spell(_softmax("log_softmax"), torch.log_softmax, F.log_softmax, methods=("log_softmax",))
_spell(_matmul, torch.matmul, torch.mm, torch.bmm, operator.matmul,
       methods=("matmul", "mm", "bmm", "__matmul__"))
_spell(_linear, F.linear)
_spell(_addmm, torch.addmm)
_spell(_layer_norm, F.layer_norm, torch.layer_norm)
_spell(_rms_norm, F.rms_norm)
_spell(_batch_norm, F.batch_norm, torch.batch_norm)
_spell(_embedding, F.embedding)
_spell(_conv("conv1d"), F.conv1d, torch.conv1d)
_spell(_conv("conv2d"), F.conv2d, torch.conv2d)
_spell(_sdpa, F.scaled_dot_product_attention)
_spell(_reshape, torch.reshape, methods=("reshape", "view"))
_spell(_permute, torch.permute, methods=("permute",))
_spell(_transpose, torch.transpose, torch.swapaxes, methods=("transpose", "swapaxes"))
_spell(_t, torch.t, methods=("t",))
_spell(_expand, methods=("expand",))
_spell(_contiguous, methods=("contiguous",))
_spell(_identity, torch.clone, methods=("clone", "detach"))
_spell(_flatten, torch.flatten, methods=("flatten",))
_spell(_unsqueeze, torch.unsqueeze, methods=("unsqueeze",))
_spell(_squeeze, torch.squeeze, methods=("squeeze",))
_spell(_cat, torch.cat, torch.concat, torch.concatenate)
_spell(_stack, torch.stack)
_spell(_tri("tril"), torch.tril, methods=("tril",))
_spell(_tri("triu"), torch.triu, methods=("triu",))
_spell(_to, methods=("to",))
for _m, _dt in [("float", torch.float32), ("half", torch.float16), ("double", torch.float64),
                ("bfloat16", torch.bfloat16), ("long", torch.int64), ("int", torch.int32),
                ("bool", torch.bool)]:
    _spell(_dtype_method(_dt), methods=(_m,))
_spell(_size, methods=("size",))
_spell(_getattr, getattr)  # x.shape
_spell(_split, torch.split, methods=("split",))
_spell(_chunk, torch.chunk, methods=("chunk",))
_spell(_max, torch.max, methods=("max",))
_spell(_min, torch.min, methods=("min",))
_spell(_getitem, operator.getitem)
_spell(_full, torch.full)
_spell(_filled(1.0), torch.ones)
_spell(_filled(0.0), torch.zeros)
_spell(_arange, torch.arange)
_spell(_like("ones_like"), torch.ones_like)
_spell(_like("zeros_like"), torch.zeros_like)
_spell(_full_like, torch.full_like)

# aten overloads (torch.export programs and the graphs aot_autograd hands a backend).
for _n in _BINARY:
    for _ov in ("Tensor", "Scalar"):
        _t_ov = getattr(getattr(aten, _n), _ov, None)
        if _t_ov is not None:
            _spell(_binary(_n), _t_ov)
for _n in _UNARY:
    _spell(_unary(_n), getattr(aten, _n).default)
for _n in _REDUCE:
    for _ov in ("dim_IntList", "default", "dim"):
        _t_ov = getattr(getattr(aten, _n), _ov, None)
        if _t_ov is not None:
            _spell(_reduce(_n), _t_ov)
_spell(_binary("maximum"), aten.maximum.default)
_spell(_binary("minimum"), aten.minimum.default)
_spell(_rsub, aten.rsub.Scalar, aten.rsub.Tensor)
_spell(_var, aten.var.correction, aten.var.dim)


def _aten_softmax(name: str, half_to_float: bool):
    """``aten._softmax(x, dim, half_to_float)`` and ``aten.softmax.int(x, dim, dtype)``:
    the third positional argument is not torch.softmax's."""
    def lower(input, dim, third=None):
        if half_to_float:
            return _softmax(name)(input, dim, dtype=torch.float32 if third else None)
        return _softmax(name)(input, dim, dtype=third)
    return lower


for _n in ("softmax", "log_softmax"):
    _spell(_aten_softmax(_n, True), getattr(aten, f"_{_n}").default)
    _spell(_aten_softmax(_n, False), getattr(aten, _n).int)
_spell(_matmul, aten.mm.default, aten.bmm.default, aten.matmul.default)
_spell(_addmm, aten.addmm.default)
_spell(_linear, aten.linear.default)
_spell(_gelu, aten.gelu.default)
_spell(_unary("silu"), aten.silu.default)
_spell(_where, aten.where.self)
_spell(_masked_fill, aten.masked_fill.Scalar, aten.masked_fill.Tensor)
_spell(_reshape, aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_spell(_size, aten.sym_size.int)
_spell(_permute, aten.permute.default)
_spell(_transpose, aten.transpose.int)
_spell(_t, aten.t.default)
_spell(_expand, aten.expand.default)
_spell(_identity, aten.clone.default, aten.alias.default, aten.detach.default)
_spell(_unsqueeze, aten.unsqueeze.default)
_spell(_squeeze, aten.squeeze.dim)
_spell(_cat, aten.cat.default)
_spell(_tri("tril"), aten.tril.default)
_spell(_tri("triu"), aten.triu.default)
_spell(_aten_embedding, aten.embedding.default, torch.embedding)
_spell(_layer_norm, aten.layer_norm.default)
_spell(_sdpa, aten.scaled_dot_product_attention.default)
_spell(_square, aten.square.default)


def _aten_to_copy(input, *, dtype=None, layout=None, device=None, pin_memory=None,
                  non_blocking=False, memory_format=None):
    return ("to", [input, dtype]) if dtype is not None else ("identity", [input])


_spell(_aten_to_copy, aten._to_copy.default)


def lower(target, args: tuple, kwargs: dict, method: bool = False) -> Lowered | None:
    """The canonical expression of a call, or None if the vocabulary does not model it."""
    fn = METHODS.get(target) if method else SPELLINGS.get(target)
    if fn is None or (not method and target in IMPURE):
        return None
    try:
        result = fn(*args, **kwargs)
    except (_Unsupported, TypeError):
        return None
    return result
