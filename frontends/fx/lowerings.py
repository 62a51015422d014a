"""Lowerings: how each spelling of an op (a torch function, Tensor method, Python operator
or aten overload) maps its own signature to a canonical expression ``(name, [values])``,
where a value is an FX argument, a Python constant, or a nested canonical expression. The
op table names them (a factory given the op's name, such as ``binary``, or a fixed one,
such as ``linear``); :func:`lowering` finds the one a spelling names.

>>> lowering("sub", "binary")("x", "y", alpha=2)
('sub', ['x', ('mul', ['y', 2])])
>>> lowering("linear", "linear")("x", "w")
('linear', ['x', 'w', None])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Lowered", "Unsupported", "lowering"]


Lowered = tuple[str, list]


def _binary(name: str):
    def lower(input, other, alpha=1, *, out=None, rounding_mode=None):
        if rounding_mode is not None:
            raise Unsupported(f"{name} with rounding_mode={rounding_mode!r}")
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
            raise Unsupported(f"{name} with extra arguments {args} {kwargs}")
        return (name, [input])
    return lower


def _reduce(name: str):
    def lower(input, dim=None, keepdim=False, *, dtype=None, out=None):
        if dtype is not None:
            input = ("to", [input, dtype])
        return (name, [input, dim, keepdim])
    return lower


def _softmax_of(name: str, input, dim, dtype) -> Lowered:
    if dim is None:
        raise Unsupported(f"{name} without a dim (deprecated implicit dim)")
    if dtype is not None:
        input = ("to", [input, dtype])
    return (name, [input, dim])


def _softmax(name: str):
    """``F.softmax(input, dim, _stacklevel, dtype)``: the functional's order."""
    def lower(input, dim=None, _stacklevel=3, dtype=None):
        return _softmax_of(name, input, dim, dtype)
    return lower


def _torch_softmax(name: str):
    """``torch.softmax(input, dim, dtype)`` and ``x.softmax(dim, dtype)``: the dtype is
    third (in the functional, ``_stacklevel`` is)."""
    def lower(input, dim=None, dtype=None):
        return _softmax_of(name, input, dim, dtype)
    return lower


class Unsupported(Exception):
    """A known op called with arguments the vocabulary does not model (kept opaque): a
    lowering raises it, and :func:`frontends.fx.vocabulary.lower` returns None for it."""


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


def _clamp_min(input, min):
    return ("clamp", [input, min, None])


def _clamp_max(input, max):
    return ("clamp", [input, None, max])


def _where(condition, input, other):
    return ("where", [condition, input, other])


def _masked_fill(input, mask, value):
    return ("masked_fill", [input, mask, value])


def _matmul(input, other):
    return ("matmul", [input, other])


def _einsum(equation, *operands, path=None):
    """``torch.einsum`` (and aten's, whose operands come as a list): the ``einsum`` op,
    its equation without spaces. The rules ``einsum-product`` and ``einsum-sum`` add the ops
    it is made of.

    >>> _einsum("b h i d, b h j d -> b h i j", "q", "k")
    ('einsum', ['bhid,bhjd->bhij', 'q', 'k'])
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise Unsupported(f"einsum of the equation {equation!r}")
    return ("einsum", [equation.replace(" ", ""), *operands])


def _linear(input, weight, bias=None):
    return ("linear", [input, weight, bias])


def _addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _added_product(input, ("matmul", [mat1, mat2]), beta, alpha)


def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``baddbmm`` (BLOOM's ALiBi scores, GPT-2's upcast attention)."""
    return _added_product(input, ("matmul", [batch1, batch2]), beta, alpha)


def _added_product(input, product, beta, alpha):
    """``beta * input + alpha * product``; where ``beta`` is 0, ``input`` is not read at
    all, as torch's addmm and baddbmm do not read it (GPT-2 passes an uninitialised
    ``torch.empty``: its NaN would survive ``0 * input``).

    >>> _added_product("acc", ("matmul", ["a", "b"]), 0, 0.5)
    ('mul', [('matmul', ['a', 'b']), 0.5])
    """
    if alpha != 1:
        product = ("mul", [product, alpha])
    if isinstance(beta, (int, float)) and beta == 0:
        return product
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
        raise Unsupported("embedding with max_norm (it renormalises the weight in place)")
    if scale_grad_by_freq or sparse:
        raise Unsupported("embedding with scale_grad_by_freq or sparse gradients")
    return ("embedding", [input, weight, padding_idx])


def _aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``aten.embedding`` and ``torch.embedding`` take the weight first; -1 is no padding."""
    return _embedding(indices, weight, None if padding_idx == -1 else padding_idx,
                      scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


def _conv(name: str):
    def lower(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return (name, [input, weight, bias, stride, padding, dilation, groups])
    return lower


def _conv2d_relu(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                 other=None):
    """oneDNN's convolution with its post-ops, as emitted: ``relu(conv2d(...) + other)``."""
    conv = _conv("conv2d")(input, weight, bias, stride, padding, dilation, groups)
    return ("relu", [conv if other is None else ("add", [conv, other])])


def _linear_gelu(input, weight, bias=None, approximate="none"):
    """oneDNN's inner product with its GELU post-op, as emitted."""
    return _gelu(_linear(input, weight, bias), approximate)


def _max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
    if return_indices:
        raise Unsupported("max_pool2d with return_indices (two outputs)")
    return ("max_pool2d", [input, kernel_size, stride, padding, dilation, ceil_mode])


def _avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return ("avg_pool2d", [input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                           divisor_override])


def _global_mean(input, output_size):
    """An adaptive average pooling to one element per channel (a ResNet's or a
    squeeze-and-excite block's, as torch.export and nn.AdaptiveAvgPool2d spell it) is the
    mean over the last two dims: the same sum and divisor, a reduction the e-graph can
    rewrite and fuse where the pooling was opaque."""
    if output_size not in (1, (1,), (1, 1), [1], [1, 1]):
        raise Unsupported(f"adaptive average pooling to {output_size!r}, not one element")
    return ("mean", [input, (-2, -1), True])


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if dropout_p:
        raise Unsupported("scaled_dot_product_attention with dropout (random)")
    return ("sdpa", [query, key, value, attn_mask, is_causal, scale, enable_gqa])


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


def _in_layout(lowered: Lowered, memory_format) -> Lowered:
    """``lowered`` copied into ``memory_format`` where that names a layout (channels-last);
    the contiguous and preserved formats leave it as it is (emission makes an output
    contiguous where the source's is)."""
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return lowered
    return ("to_layout", [lowered, memory_format])


def _contiguous(input, memory_format=None):
    """``contiguous`` and ``clone``: the value itself, in a layout where one is named."""
    return _in_layout(("identity", [input]), memory_format)


def _converted(input, dtype, memory_format) -> Lowered:
    """``input`` in ``dtype`` (None: its own) and ``memory_format``."""
    return _in_layout(("to", [input, dtype]) if dtype is not None else ("identity", [input]),
                      memory_format)


def _flatten(input, start_dim=0, end_dim=-1):
    return ("flatten", [input, start_dim, end_dim])


def _unsqueeze(input, dim):
    return ("unsqueeze", [input, dim])


def _squeeze(input, dim=None):
    if dim is None:
        raise Unsupported("squeeze without a dim (its result depends on the shape)")
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
    """``Tensor.to`` and aten's ``to`` overloads: a dtype conversion, in a memory format
    where one is named. A device (ingest drops one that is where the operand already is)
    stays the source's own call."""
    dtype, memory_format = kwargs.get("dtype"), kwargs.get("memory_format")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.memory_format):
            memory_format = a
        elif a is not None and not isinstance(a, bool):
            raise Unsupported(f"to({a!r}): only dtype conversions are modelled")
    _same_device("to", kwargs.get("device"))
    if kwargs.get("layout") not in (None, torch.strided):
        raise Unsupported(f"to layout {kwargs['layout']}")
    if any(k not in ("dtype", "copy", "non_blocking", "memory_format", "device", "layout",
                     "pin_memory") for k in kwargs):
        raise Unsupported(f"to with {kwargs}")
    return _converted(input, dtype, memory_format)


def _tensor_type(input, dtype=None, non_blocking=False, **kwargs):
    """``Tensor.type(dtype)``: a conversion. Without a dtype it returns the type's name,
    and a name (``"torch.FloatTensor"``) may move the tensor: both stay the source's."""
    if not isinstance(dtype, torch.dtype):
        raise Unsupported(f"type({dtype!r}): only a dtype is modelled")
    return ("to", [input, dtype])


def _dtype_method(dtype: torch.dtype):
    def lower(input, memory_format=None):
        return _in_layout(("to", [input, dtype]), memory_format)
    return lower


def _var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """``var_mean`` is the pair ``(var, mean)``; indexing it picks one at ingest."""
    variance = _var(input, dim, unbiased, keepdim, correction=correction)
    return ("tuple", [variance, ("mean", [input, dim, keepdim])])


def _size(input, dim=None):
    return ("size", [input, dim])


def _getattr(obj, name, *default):
    # ``.values`` and ``.indices`` of the pairs max and min over a dim return.
    if name in ("values", "indices"):
        return ("getitem", [obj, 0 if name == "values" else 1])
    if name != "shape":
        raise Unsupported(f"attribute {name!r}")
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
    return ("min_dim", [input, dim, keepdim])


def _getitem(obj, index):
    return ("getitem", [obj, index])


def _setitem(obj, index, value):
    return ("setitem", [obj, index, value])


def _along(dim, index) -> tuple:
    """The index that applies ``index`` along dimension ``dim`` (``x[:, :, index]``)."""
    if not isinstance(dim, int):
        raise Unsupported(f"an index along a computed dim {dim!r}")
    if dim >= 0:
        return (slice(None),) * dim + (index,)
    return (Ellipsis, index) + (slice(None),) * (-dim - 1)


def _aten_slice(input, dim=0, start=None, end=None, step=1):
    """``aten.slice.Tensor``: ``input[start:end:step]`` along ``dim``."""
    return ("getitem", [input, _along(dim, slice(start, end, step))])


def _aten_select(input, dim, index):
    """``aten.select.int``: ``input[index]`` along ``dim`` (the dim goes)."""
    return ("getitem", [input, _along(dim, index)])


def _aten_index(input, indices):
    """``aten.index.Tensor``: advanced indexing by a list of index tensors (None for a
    whole dim), ``input[None-or-tensor, ...]``."""
    return ("getitem", [input, tuple(slice(None) if i is None else i for i in indices)])


def _device(device) -> torch.device | None:
    """A creation op's device, kept as an attribute: the program must make its tensor
    where the source did (``torch.arange(t, device=x.device)`` in a CUDA graph)."""
    if isinstance(device, (str, int, torch.device)):
        return torch.device(device)
    return device  # None (the default device), or a traced value such as ``x.device``


def _same_device(name: str, device) -> None:
    """Ops modelled as staying on their input's device: a move elsewhere stays the
    source's own call (opaque), as the e-graph does not track devices."""
    if device is not None:
        raise Unsupported(f"{name} to device {device}: moves between devices are not "
                           "modelled")


def _full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
          requires_grad=False):
    return ("full", [tuple(size), fill_value, dtype, _device(device)])


def _filled(value):
    def lower(*size, dtype=None, layout=None, device=None, pin_memory=None,
              requires_grad=False, out=None):
        if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
            size = tuple(size[0])
        return ("full", [tuple(size), value, dtype, _device(device)])
    return lower


def _arange(start, end=None, step=1, *, dtype=None, layout=None, device=None,
            pin_memory=None, requires_grad=False, out=None):
    if end is None:
        start, end = 0, start
    return ("arange", [start, end, step, dtype, _device(device)])


def _arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``aten.arange.default``, whose one positional argument is the end."""
    return _arange(0, end, dtype=dtype, device=device)


def _like(name: str):
    def lower(input, *, dtype=None, layout=None, device=None, pin_memory=None,
              requires_grad=False, memory_format=None):
        _same_device(name, device)
        if dtype is not None:
            input = ("to", [input, dtype])
        return _in_layout((name, [input]), memory_format)
    return lower


def _full_like(input, fill_value, *, dtype=None, layout=None, device=None,
               pin_memory=None, requires_grad=False, memory_format=None):
    _same_device("full_like", device)
    if dtype is not None:
        input = ("to", [input, dtype])
    return _in_layout(("full_like", [input, fill_value]), memory_format)


def _square(input):
    return ("mul", [input, input])


def _fma(a, b, c):
    """``prims.fma``: dynamo's spelling of ``x.addcmul_(t1, t2, value=v)`` (``fma(t1 * t2,
    v, x)`` copied into ``x``), of ``addcdiv_`` and of ``add_`` with a tensor ``alpha``;
    its eager implementation is ``a * b + c``, a Python call 10x slower than the two ops."""
    return ("add", [("mul", [a, b]), c])


def _scaled_sum(product: str):
    """``addcmul`` and ``addcdiv``: ``input + value * (t1 op t2)``."""
    def lower(input, tensor1, tensor2, *, value=1):
        term = (product, [tensor1, tensor2])
        return ("add", [input, term if value == 1 else ("mul", [term, value])])
    return lower


def _rsub(input, other, alpha=1):
    return ("sub", [other, input if alpha == 1 else ("mul", [input, alpha])])


def _batch_norm(input, running_mean, running_var, weight=None, bias=None,
                training=False, momentum=0.1, eps=1e-5, cudnn_enabled=None):
    if training:
        raise Unsupported("batch_norm in training mode (it updates running statistics)")
    return ("batch_norm", [input, running_mean, running_var, weight, bias, eps])


def _aten_batch_norm(input, weight, bias, running_mean, running_var, training=False,
                     momentum=0.1, eps=1e-5, cudnn_enabled=None):
    """``torch.batch_norm`` and ``aten.batch_norm``: weight and bias come before the
    running statistics (``F.batch_norm`` takes the statistics first)."""
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                       eps)


def _pad(input, pad, mode="constant", value=None):
    if mode != "constant":
        raise Unsupported(f"pad with mode={mode!r} (only constant padding is an op)")
    return ("pad", [input, tuple(pad), 0.0 if value is None else value])


def _constant_pad_nd(input, pad, value=0):
    return ("pad", [input, tuple(pad), value])


def _grouped_mm_fallback(input, weight, offs):
    """``transformers``' grouped product, what its experts run under torch.compile in
    float32: rows in groups times one matrix each. (torch's own ``_grouped_mm`` stays as
    it is: its result where offsets leave rows out is undefined, and Inductor has
    kernels for it.)"""
    return ("grouped_mm", [input, weight, offs])


def _gather(input, dim, index, *, sparse_grad=False):
    return ("gather", [input, dim, index])


def _aten_softmax(name: str, half_to_float: bool):
    """``aten._softmax(x, dim, half_to_float)`` and ``aten.softmax.int(x, dim, dtype)``:
    the third positional argument is not torch.softmax's."""
    def lower(input, dim, third=None):
        if half_to_float:
            return _softmax(name)(input, dim, dtype=torch.float32 if third else None)
        return _softmax(name)(input, dim, dtype=third)
    return lower


def _aten_to_copy(input, *, dtype=None, layout=None, device=None, pin_memory=None,
                  non_blocking=False, memory_format=None):
    _same_device("_to_copy", device)
    return _converted(input, dtype, memory_format)


# Lowerings the op table names: a factory given the op's name, or a fixed lowering.
_FACTORIES: dict[str, Callable[[str], Callable[..., Lowered]]] = {
    "unary": _unary, "binary": _binary, "reverse": _reverse, "reduce": _reduce,
    "softmax": _softmax, "log_softmax": _softmax, "torch_softmax": _torch_softmax,
    "tri": _tri, "conv": _conv, "like": _like,
    "aten_softmax": lambda name: _aten_softmax(name, False),
    "aten_softmax_half": lambda name: _aten_softmax(name, True),
}
_FIXED: dict[str, Callable[..., Lowered]] = {
    "rsub": _rsub, "square": _square, "fma": _fma, "addcmul": _scaled_sum("mul"),
    "addcdiv": _scaled_sum("div"), "var": _var, "var_mean": _var_mean, "gelu": _gelu,
    "softplus": _softplus,
    "clamp": _clamp, "clamp_min": _clamp_min, "clamp_max": _clamp_max,
    "where": _where, "masked_fill": _masked_fill, "gather": _gather,
    "matmul": _matmul, "einsum": _einsum, "linear": _linear, "addmm": _addmm,
    "as_conv2d": _conv("conv2d"), "as_conv2d_relu": _conv2d_relu,
    "as_linear_gelu": _linear_gelu,
    "baddbmm": _baddbmm,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm, "batch_norm": _batch_norm, "aten_batch_norm": _aten_batch_norm,
    "embedding": _embedding, "grouped_mm_fallback": _grouped_mm_fallback,
    "aten_embedding": _aten_embedding, "sdpa": _sdpa, "reshape": _reshape,
    "max_pool2d": _max_pool2d, "avg_pool2d": _avg_pool2d, "pad": _pad,
    "global_mean": _global_mean,
    "constant_pad_nd": _constant_pad_nd,
    "permute": _permute, "transpose": _transpose, "t": _t, "expand": _expand,
    "identity": _identity, "contiguous": _contiguous, "flatten": _flatten,
    "unsqueeze": _unsqueeze, "squeeze": _squeeze, "cat": _cat, "stack": _stack, "to": _to,
    "to_copy": _aten_to_copy, "size": _size, "shape": _getattr, "split": _split,
    "chunk": _chunk, "max": _max, "min": _min, "getitem": _getitem, "setitem": _setitem,
    "full": _full,
    "ones": _filled(1.0), "zeros": _filled(0.0), "arange": _arange, "arange_end": _arange_end,
    "full_like": _full_like, "aten_slice": _aten_slice, "aten_select": _aten_select,
    "aten_index": _aten_index, "tensor_type": _tensor_type,
}


# ``to_<dtype>``: the dtype methods (``x.half()``).
_DTYPE_METHODS = ("float32", "float16", "float64", "bfloat16", "int64", "int32", "bool")


def lowering(name: str, adapter: str) -> Callable[..., Lowered]:
    """The lowering the op table's ``adapter`` names for the op ``name``: a factory's
    (``binary``, ``reduce``), a dtype method's (``to_float16``), or a fixed one.

    >>> lowering("half", "to_float16")("x")
    ('to', ['x', torch.float16])
    """
    if adapter in _FACTORIES:
        return _FACTORIES[adapter](name)
    if adapter.removeprefix("to_") in _DTYPE_METHODS:
        return _dtype_method(getattr(torch, adapter.removeprefix("to_")))
    return _FIXED[adapter]
