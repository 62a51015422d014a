"""Torch implementations of canonical ops that torch has no single sound call for,
registered as torch operators (``torch.ops.egraph.*``) so that emitted programs call them
like any aten op, autograd differentiates them, and tracers (``make_fx``, aot_autograd,
Inductor) see them through their fake kernels.

``setitem(x, index, value)``: ``x[index] = value`` out of place (a plain function: its
index is any Python subscript, which no operator schema can type; tracers see the clone
and the write).

``grouped_mm(x, w, offs)``: the matrix product of each group of rows of ``x`` with its
group's matrix, as mixture-of-experts layers compute it. ``x`` is ``(rows, k)`` sorted by
group, ``w`` is ``(groups, k, n)``, ``offs`` holds the cumulative row count at each
group's end; rows past the last offset are zero. Its result is that of ``transformers``'
``grouped_mm_fallback`` operator (what transformers' experts run under torch.compile in
float32: a Python loop behind a custom operator) for any offsets. It runs torch's native
grouped kernel (``torch._grouped_mm``, one call for all groups) where that kernel's
preconditions hold, and a loop of one ``mm`` per group elsewhere (other devices and dtypes,
unaligned strides, offsets that fall or leave rows out). Its backward is two grouped
products, chosen the same way.

>>> x, w = torch.randn(5, 4), torch.randn(2, 4, 8)
>>> offs = torch.tensor([2, 5], dtype=torch.int32)
>>> y = grouped_mm(x, w, offs)
>>> torch.equal(y[:2], x[:2] @ w[0]), torch.equal(y[2:], x[2:] @ w[1])
(True, True)

``onednn_linear(x, weight, bias=None)``: ``F.linear`` through oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor's CPU freezing path calls for
packed weights) where that kernel runs and nothing needs its gradient: float32 CPU tensors,
no autograd graph being recorded; ``F.linear`` everywhere else, so it is always
``F.linear``'s result. On a CPU with AVX-512 it ran GPT-2 small's and BERT-base's
projections 2.2-2.9x faster than ``F.linear`` (MKL's sgemm), and a 64 x 64 projection of a
few rows 3x slower (20 us to create its primitive): the cost model chooses between them
with this machine's measured curve of each (:mod:`extractors.calibration`).

``onednn_conv2d(x, weight, bias, stride, padding, dilation, groups)``: ``F.conv2d``
through oneDNN's convolution with the weight packed once into oneDNN's blocked layout (what
Inductor's CPU freezing path does, here for weights that may change: a weight is packed
again when written), under the same conditions as ``onednn_linear``, its result
channels-last. With packed weights and channels-last activations ResNet-50's convolutions
ran 1.76x faster than ``F.conv2d`` on one CPU. ``onednn_conv2d_relu(..., other=None)``:
``relu(conv + other)`` (or ``relu(conv)``) with the sum and the ReLU as the convolution's
post-ops, which extraction chooses (the ops of the same names, added by the rules of
:mod:`egraph.rules.kernels`) where nothing else reads the convolution or the sum;
``onednn_linear_gelu(x, weight, bias, approximate)``, likewise a GELU after the inner product.

``mkl_linear(x, weight, bias=None)``: ``F.linear`` through MKL's packed matrix product
(``torch.ops.mkl._mkl_linear``, the kernel Inductor's CPU freezing path calls for float32
linears) with the weight packed once for the call's row count, under the same conditions
as ``onednn_linear``; ``F.linear`` until the weight is packed, and where the row count
changes from call to call. On an AVX-512 Xeon it ran GPT-2 small's projections at 128
tokens 1.2-1.3x faster than ``F.linear``, and no faster at a row count it was not packed
for; its packed weight takes 1.5-2.6x the weight's memory.

``masked_attention(q, k, v, mask, scale, gqa=False)``: attention with the scores filled
with -inf where the bool ``mask`` is set, ``softmax(q @ k.T * scale).masked_fill(...) @ v``
as written (a row with every score dropped is NaN), or, for a float ``mask``, with the mask
added to the scores (sdpa's float mask; a row all -inf is NaN as written). When the mask
is the causal one (a bool mask set exactly above the diagonal: nanoGPT's ``bias == 0``, a
buffer the caller may change; a float one 0 on and below it and low enough above it to
drop those entries: transformers' mask, computed from the sizes) it runs as causal
``scaled_dot_product_attention``, reading no mask; the check is made at run time and
remembered per mask tensor and version, so a mask updated in place or replaced, or made
anew for another size, is seen. ``gqa``: keys and values have fewer heads than the
query, each shared by a group of query heads (sdpa's ``enable_gqa``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch

from frontends.fx.observed import triangle_of

__all__ = ["grouped_mm", "masked_attention", "mkl_linear", "onednn_conv2d", "onednn_conv2d_relu",
           "onednn_linear", "onednn_linear_gelu", "setitem"]

_LIBRARY = torch.library.Library("egraph", "DEF")
_LIBRARY.define("grouped_mm(Tensor x, Tensor w, Tensor offs) -> Tensor")
_LIBRARY.define(
    "grouped_mm_backward(Tensor x, Tensor w, Tensor offs, Tensor grad) -> (Tensor, Tensor)")

_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ALIGNMENT = 16
"""Bytes: torch's grouped kernel needs matrix strides and data pointers aligned to this."""


def _aligned(matrix: torch.Tensor) -> bool:
    """Whether a (batch of) matrix is laid out as torch's grouped kernel requires: one of
    its last two dims contiguous, the other's stride and the data pointer aligned."""
    rows, cols = matrix.stride()[-2:]
    if cols == 1:
        lead = rows
    elif rows == 1:
        lead = cols
    else:
        return False
    size = matrix.element_size()
    return (lead * size) % _ALIGNMENT == 0 and matrix.data_ptr() % _ALIGNMENT == 0


def _native(bounds: list[int], rows: int, offs: torch.Tensor, *matrices) -> bool:
    """Whether ``torch._grouped_mm`` computes what the loop does: on the CPU (its kernel
    loops over groups with ``mm``: the same products), in a dtype it takes, int32 offsets
    that rise to cover every row (it leaves uncovered rows unwritten), aligned operands."""
    dtype = matrices[0].dtype
    return (matrices[0].device.type == "cpu" and dtype in _NATIVE_DTYPES
            and all(m.dtype == dtype for m in matrices) and offs.dtype == torch.int32
            and bool(bounds) and bounds[-1] == rows
            and all(0 <= a <= b for a, b in zip([0, *bounds], bounds))
            and all(_aligned(m) for m in matrices))


def _groups(bounds: list[int]):
    """``(group, start, end)`` of each nonempty group, start to end as the offsets say."""
    start = 0
    for group, end in enumerate(bounds):
        if start != end:
            yield group, start, end
        start = end


def _forward(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    bounds = offs.tolist()
    if _native(bounds, x.size(0), offs, x, w):
        return torch._grouped_mm(x, w, offs=offs)
    out = x.new_zeros(x.size(0), w.size(2))
    for group, start, end in _groups(bounds):
        torch.mm(x[start:end], w[group], out=out[start:end])
    return out


def _backward(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor):
    bounds = offs.tolist()
    grad = grad.contiguous()  # autograd may hand over an expanded gradient
    w_t = w.transpose(-2, -1)
    # w's gradient in w's own layout: an expert weight stored transposed (``w`` a
    # transposed view) then accumulates into its parameter without a strided copy.
    transposed = not w.is_contiguous() and w_t.is_contiguous()
    if _native(bounds, x.size(0), offs, grad, w_t, x.t(), grad.t()):
        grad_w = (torch._grouped_mm(grad.t(), x, offs=offs).transpose(-2, -1) if transposed
                  else torch._grouped_mm(x.t(), grad, offs=offs))
        for group, (start, end) in enumerate(zip([0, *bounds], bounds)):
            if start == end:  # a group with no rows: its matrix has no gradient
                grad_w[group].zero_()
        return torch._grouped_mm(grad, w_t, offs=offs), grad_w
    grad_x, grad_w = torch.zeros_like(x), torch.zeros_like(w)
    for group, start, end in _groups(bounds):
        torch.mm(grad[start:end], w_t[group], out=grad_x[start:end])
        torch.mm(x[start:end].t(), grad[start:end], out=grad_w[group])
    return grad_x, grad_w


def _forward_fake(x, w, offs):
    torch._check(x.dim() == 2 and w.dim() == 3 and offs.dim() == 1,
                 lambda: "grouped_mm takes x (rows, k), w (groups, k, n), offs (groups,)")
    torch._check(x.size(1) == w.size(1) and offs.size(0) == w.size(0),
                 lambda: "grouped_mm: x, w and offs disagree on k or on the groups")
    return x.new_empty(x.size(0), w.size(2))


def _backward_fake(x, w, offs, grad):
    return torch.empty_like(x), torch.empty_like(w)


def _function(forward, backward) -> type[torch.autograd.Function]:
    """The autograd function of a grouped product run by ``forward``, whose backward
    ``backward(x, w, offs, grad)`` returns the gradients of ``x`` and ``w``."""

    class GroupedMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs):
            ctx.save_for_backward(x, w, offs)
            return forward(x, w, offs)

        @staticmethod
        def backward(ctx, grad):
            grad_x, grad_w = backward(*ctx.saved_tensors, grad)
            return grad_x, grad_w, None

    return GroupedMM


def _below_autograd(x, w, offs):
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.egraph.grouped_mm.default(x, w, offs)


_TRACED = _function(_below_autograd, torch.ops.egraph.grouped_mm_backward.default)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records a call on ``tensors``: it needs torch's own kernels."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _autograd_kernel(x, w, offs):
    return _TRACED.apply(x, w, offs) if _needs_grad(x, w) else _below_autograd(x, w, offs)


_LIBRARY.impl("grouped_mm", _forward, "CompositeExplicitAutograd")
_LIBRARY.impl("grouped_mm_backward", _backward, "CompositeExplicitAutograd")
_LIBRARY.impl("grouped_mm", _autograd_kernel, "Autograd")
torch.library.register_fake("egraph::grouped_mm", _forward_fake, lib=_LIBRARY)
torch.library.register_fake("egraph::grouped_mm_backward", _backward_fake, lib=_LIBRARY)
_EAGER = _function(_forward, _backward)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""The tensor types that hold values; a tracer's tensors are other subclasses."""


def one_call_when_traced(kernel: Callable) -> Callable:
    """``kernel`` as one call of itself in a graph that torch.fx's symbolic tracer records
    (its first argument, a tensor, a proxy, as every tensor of a traced graph is): what
    loading a saved module does to its code, which would otherwise trace into the
    kernel's tests of its operands' values and layouts and fail (a program of oneDNN's
    kernels could not be saved). Elsewhere the kernel itself, after one type test.

    >>> gm = torch.fx.symbolic_trace(lambda x, w: onednn_linear(x, w))
    >>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
    ['onednn_linear']
    """
    @functools.wraps(kernel)
    def call(*args, **kwargs):
        if args and isinstance(args[0], torch.fx.Proxy):
            return args[0].tracer.create_proxy("call_function", call, args, kwargs)
        return kernel(*args, **kwargs)
    return call


def _traced(*tensors: torch.Tensor) -> bool:
    """Whether the offsets have no values to read: a tracer is running (dynamo, make_fx,
    fake or functional tensors) or the tensors are meta. The operator's fake kernel runs
    there instead."""
    return (torch.compiler.is_compiling()
            or torch.utils._python_dispatch._get_current_dispatch_mode() is not None
            or any(type(t) not in _PLAIN or t.is_meta for t in tensors))


@one_call_when_traced
def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` in groups times one matrix of ``w`` each (see the module docstring).

    Called directly it skips the dispatcher's two Python kernels (half its time on small
    experts); under a tracer it is the operator ``torch.ops.egraph.grouped_mm``.

    >>> x, w = torch.randn(3, 4), torch.randn(2, 4, 8)
    >>> grouped_mm(x, w, torch.tensor([1, 3], dtype=torch.int32)).shape
    torch.Size([3, 8])
    """
    if _traced(x, w, offs):
        return torch.ops.egraph.grouped_mm.default(x, w, offs)
    return _EAGER.apply(x, w, offs) if _needs_grad(x, w) else _forward(x, w, offs)


ONEDNN = torch.backends.mkldnn.is_available()
"""Whether this torch was built with oneDNN (every x86 and ARM CPU wheel is)."""


def _float32_cpu(operands: tuple) -> bool:
    return all(t.dtype is torch.float32 and t.device.type == "cpu" for t in operands)


def _float32_linear(weight: torch.Tensor, bias: torch.Tensor | None, operands: tuple) -> bool:
    """Whether the CPU's linear kernels (oneDNN's, MKL's) compute ``F.linear`` of these
    operands: float32 CPU tensors, a matrix of weights and a bias per row."""
    return (weight.dim() == 2 and (bias is None or bias.shape == weight.shape[:1])
            and _float32_cpu(operands))


@torch.library.custom_op("egraph::onednn_linear", mutates_args=())
def _onednn_linear_op(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    operands = (x, weight) if bias is None else (x, weight, bias)
    if ONEDNN and _float32_linear(weight, bias, operands):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias).contiguous()


@_onednn_linear_op.register_fake
def _onednn_linear_fake(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _onednn_linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _onednn_linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    rows = grad.reshape(-1, grad.shape[-1])
    grad_weight = rows.t() @ x.reshape(-1, x.shape[-1])
    return grad @ weight, grad_weight, rows.sum(0) if ctx.has_bias else None


_onednn_linear_op.register_autograd(_onednn_linear_backward, setup_context=_onednn_linear_setup)


@one_call_when_traced
def onednn_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN's inner product where it runs (see
    the module docstring): the same values up to the order of the sums.

    Called directly it calls the kernel; under a tracer (dynamo, aot_autograd, Inductor)
    it is the operator ``torch.ops.egraph.onednn_linear``, which generated code calls as
    an external kernel (Inductor's own lowering of the kernel takes only frozen weights).

    >>> x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    >>> torch.allclose(onednn_linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5)
    True
    >>> x.requires_grad_()  # a gradient needed: torch's linear, which autograd knows
    ...                     # doctest: +ELLIPSIS
    tensor(...)
    >>> onednn_linear(x, w, b).grad_fn.name()
    'AddmmBackward0'
    """
    operands = (x, weight) if bias is None else (x, weight, bias)
    if not (ONEDNN and _float32_linear(weight, bias, operands)) or _needs_grad(*operands):
        return torch.nn.functional.linear(x, weight, bias)
    if _traced(*operands):
        return torch.ops.egraph.onednn_linear.default(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _PerTensor:
    """Values computed from tensors, each kept while its tensor lives and holds the data it
    was computed from (the same version and storage) under the same ``setting``; an entry
    leaves with its tensor. Inference tensors keep no version: nothing is kept of them."""

    def __init__(self):
        self.seen: dict[int, tuple[weakref.ref, tuple, object]] = {}

    def get(self, tensor: torch.Tensor, setting: tuple = ()) -> tuple[bool, object]:
        """``(found, value)``: what was kept of ``tensor`` under ``setting``."""
        seen = self.seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == (
                tensor._version, tensor.data_ptr(), setting):
            return True, seen[2]
        return False, None

    def put(self, tensor: torch.Tensor, value: object, setting: tuple = ()) -> None:
        if tensor.is_inference():
            return
        key = id(tensor)
        ref = weakref.ref(tensor, lambda r, key=key: self.seen.pop(key, None)
                          if self.seen.get(key, (None,))[0] is r else None)
        self.seen[key] = (ref, (tensor._version, tensor.data_ptr(), setting), value)


MKL = torch.backends.mkl.is_available()
"""Whether this torch was built with MKL (the x86 CPU wheels are)."""

# weight -> its copy packed by MKL for one row count of the input (None: seen once at that
# row count, not yet packed)
_MKL_PACKED = _PerTensor()


@one_call_when_traced
def mkl_linear(x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through MKL's packed matrix product with the weight
    packed for ``x``'s row count (see the module docstring): the same values.

    A weight is packed the second time it is seen with the same data (its version and
    storage) and the same row count, and the copy kept while it lives: a model's weights
    are packed once, a weight made anew on every call, or called at a new row count every
    time, never. Under a tracer it is ``F.linear`` (generated code reuses its buffers
    without new versions, so nothing it holds could be packed safely).

    >>> x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    >>> all(torch.allclose(mkl_linear(x, w, b), torch.nn.functional.linear(x, w, b),
    ...                    atol=1e-5) for _ in range(3))  # unpacked, then packed
    True
    """
    operands = (x, weight) if bias is None else (x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if (not (MKL and rows and _float32_linear(weight, bias, operands))
            or _needs_grad(*operands) or _traced(*operands)):
        return torch.nn.functional.linear(x, weight, bias)
    found, packed = _MKL_PACKED.get(weight, (rows,))
    if found and packed is None:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        _MKL_PACKED.put(weight, packed, (rows,))
    elif not found:
        _MKL_PACKED.put(weight, None, (rows,))
    if packed is None:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _pair(value) -> list[int] | None:
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, int) for v in value):
        return list(value)
    return None


def _conv_setting(weight: torch.Tensor, stride, padding, dilation) -> tuple | None:
    """``(stride, padding, dilation)`` as oneDNN takes them, or None where it takes no such
    padding (``'same'`` that pads one side more than the other)."""
    stride, dilation = _pair(stride), _pair(dilation)
    if stride is None or dilation is None:
        return None
    if padding == "valid":
        padding = 0
    elif padding == "same":
        spans = [d * (k - 1) for d, k in zip(dilation, weight.shape[-2:])]
        if any(span % 2 for span in spans):
            return None
        padding = [span // 2 for span in spans]
    padding = _pair(padding)
    return None if padding is None else (stride, padding, dilation)


def _runs_onednn_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      operands: tuple) -> bool:
    """Whether oneDNN's convolution computes ``F.conv2d`` of these operands: float32 CPU
    tensors, a batch of images and a bias per output channel."""
    return (ONEDNN and x.dim() == 4 and weight.dim() == 4
            and (bias is None or bias.shape == weight.shape[:1]) and _float32_cpu(operands))


# weight -> its copy in oneDNN's blocked layout, for one stride, padding, dilation and
# group count (None: seen once, not yet packed)
_PACKED = _PerTensor()


def _onednn_conv2d_call(x, weight, bias, stride, padding, dilation, groups, pack=True,
                        other=None, relu=False):
    setting = (tuple(stride), tuple(padding), tuple(dilation), groups)
    found, packed = _PACKED.get(weight, setting) if pack else (False, None)
    if found and packed is None:  # a weight seen twice is a model's: packed once
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            weight, padding, stride, dilation, groups, list(x.shape))
        _PACKED.put(weight, packed, setting)
    elif pack and not found:  # (a weight made anew on every call is never packed)
        _PACKED.put(weight, None, setting)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = weight if packed is None else packed
    if other is not None:  # (the sum and the ReLU as the convolution's post-ops)
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x, other.contiguous(memory_format=torch.channels_last), weight, bias, padding,
            stride, dilation, groups, "add", None, "relu" if relu else None, [], "")
    return torch.ops.mkldnn._convolution_pointwise(
        x, weight, bias, padding, stride, dilation, groups, "relu" if relu else "none", [], "")


@torch.library.custom_op("egraph::onednn_conv2d", mutates_args=())
def _onednn_conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      stride: list[int], padding: list[int], dilation: list[int],
                      groups: int) -> torch.Tensor:
    operands = (x, weight) if bias is None else (x, weight, bias)
    if _runs_onednn_conv(x, weight, bias, operands):
        # (generated code writes into buffers it reuses without a new version: what it
        # hands the operator is never packed)
        return _onednn_conv2d_call(x, weight, bias, stride, padding, dilation, groups,
                                   pack=False)
    return _onednn_conv2d_fake(x, weight, bias, stride, padding, dilation, groups)


@_onednn_conv2d_op.register_fake
def _onednn_conv2d_fake(x, weight, bias, stride, padding, dilation, groups):
    return torch.nn.functional.conv2d(x.contiguous(memory_format=torch.channels_last), weight,
                                      bias, stride, padding, dilation, groups)


def _onednn_conv2d_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.setting = inputs[3:]


def _onednn_conv2d_backward(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    kept = [t for t in (x, weight, bias) if t is not None]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in kept]
        by = dict(zip(map(id, kept), leaves))
        out = torch.nn.functional.conv2d(by[id(x)], by[id(weight)],
                                         None if bias is None else by[id(bias)], *ctx.setting)
        grads = iter(torch.autograd.grad(out, leaves, grad))
    return (next(grads), next(grads), None if bias is None else next(grads),
            None, None, None, None)


_onednn_conv2d_op.register_autograd(_onednn_conv2d_backward,
                                    setup_context=_onednn_conv2d_setup)


@one_call_when_traced
def onednn_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)``, through oneDNN's
    convolution with the weight packed once in its blocked layout where it runs (see the
    module docstring): the same values up to the order of the sums, channels-last (the
    layout oneDNN computes in; the input is made channels-last first, a copy only for the
    first convolution of a chain). Where oneDNN does not run, ``F.conv2d`` in its own
    layout.

    A weight is packed the second time it is seen with the same data (its version and
    storage), and the copy kept while it lives: a model's weights are packed once, a
    weight made anew on every call never. A weight changed behind its version counter
    (through ``.data``, or by code that writes raw memory) is not seen: write weights
    through torch. Under a tracer it is the operator ``torch.ops.egraph.onednn_conv2d``,
    which packs nothing (generated code reuses its buffers without new versions).

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> conv = torch.nn.functional.conv2d(x, w, padding=1)
    >>> all(torch.allclose(onednn_conv2d(x, w, padding=1), conv, atol=1e-5)
    ...     for _ in range(3))  # unpacked, then packed
    True
    >>> with torch.no_grad():
    ...     w.mul_(2)  # written in place: packed again
    ...     torch.allclose(onednn_conv2d(x, w, padding=1), 2 * conv, atol=1e-5)
    tensor(...)
    True
    """
    setting = _conv_setting(weight, stride, padding, dilation)
    operands = (x, weight) if bias is None else (x, weight, bias)
    if (setting is None or not _runs_onednn_conv(x, weight, bias, operands)
            or _needs_grad(*operands)):
        return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    if _traced(*operands):
        return torch.ops.egraph.onednn_conv2d.default(x, weight, bias, *setting, groups)
    return _onednn_conv2d_call(x, weight, bias, *setting, groups)


@one_call_when_traced
def onednn_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       approximate: str = "none") -> torch.Tensor:
    """``F.gelu(F.linear(x, weight, bias), approximate=approximate)`` as one call of
    oneDNN's inner product with the GELU as its post-op, applied to each block of the
    product while it is in cache (a transformer's or ConvNeXt's MLP: on one CPU a 25088 x
    96 x 384 product and its GELU took 28 ms as two calls, 16 as one). The same values as
    :func:`onednn_linear` then the GELU: the op ``onednn_linear_gelu``, which the rule
    ``linear-gelu-onednn`` adds beside the two calls. Where oneDNN does not run,
    autograd needs the graph or a tracer is running, it is the two calls.

    >>> x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    >>> all(torch.allclose(onednn_linear_gelu(x, w, b, a), torch.nn.functional.gelu(
    ...     torch.nn.functional.linear(x, w, b), approximate=a), atol=1e-5)
    ...     for a in ("none", "tanh"))
    True
    """
    operands = (x, weight) if bias is None else (x, weight, bias)
    if (not (ONEDNN and _float32_linear(weight, bias, operands))
            or approximate not in ("none", "tanh") or _traced(*operands)
            or _needs_grad(*operands)):
        return torch.nn.functional.gelu(onednn_linear(x, weight, bias), approximate=approximate)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], approximate)


@one_call_when_traced
def onednn_conv2d_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       stride=1, padding=0, dilation=1, groups: int = 1,
                       other: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups) + other)``
    (without ``other``: ``relu(F.conv2d(...))``) as one call of oneDNN's convolution, the
    sum and the ReLU its post-ops, applied to each block of the output while it is in
    cache: a residual network's sums and ReLUs no longer read and write their tensors
    once more each. The same values as :func:`onednn_conv2d` then the sum and the ReLU
    (each rounded once, in that order): the op ``onednn_conv2d_relu``, which the rules
    ``conv-relu-onednn`` and ``conv-add-relu-onednn`` add beside the calls.
    Where oneDNN does not run, autograd needs the graph, a tracer is running, or
    ``other`` is not of the output's shape and dtype, it is those calls one by one.

    >>> x, w, r = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 8, 8)
    >>> conv = torch.nn.functional.conv2d(x, w, padding=1)
    >>> all(torch.allclose(onednn_conv2d_relu(x, w, padding=1, other=r),
    ...                    torch.relu(conv + r), atol=1e-5) for _ in range(3))
    True
    >>> torch.allclose(onednn_conv2d_relu(x, w, padding=1), torch.relu(conv), atol=1e-5)
    True
    """
    setting = _conv_setting(weight, stride, padding, dilation)
    operands = tuple(t for t in (x, weight, bias, other) if t is not None)
    if (setting is None or not _runs_onednn_conv(x, weight, bias, operands)
            or _needs_grad(*operands)
            or _traced(*operands) or (other is not None and (
                other.dtype != x.dtype or other.dim() != 4
                or tuple(other.shape) != _conv_shape(x, weight, *setting)))):
        y = onednn_conv2d(x, weight, bias, stride, padding, dilation, groups)
        return torch.relu(y if other is None else y + other)
    return _onednn_conv2d_call(x, weight, bias, *setting, groups, other=other, relu=True)


def _conv_shape(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation) -> tuple:
    """The shape of ``F.conv2d(x, weight, ...)`` for oneDNN's setting of the call."""
    sizes = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(
        x.shape[-2:], weight.shape[-2:], stride, padding, dilation)]
    return (x.shape[0], weight.shape[0], *sizes)


def setitem(x: torch.Tensor, index, value) -> torch.Tensor:
    """A new tensor of ``x``'s values with ``value`` written at ``index``: what ``x`` holds
    after ``x[index] = value``, leaving ``x`` itself as it was.

    >>> x = torch.zeros(3)
    >>> setitem(x, 1, 5.0), x
    (tensor([0., 5., 0.]), tensor([0., 0., 0.]))
    """
    written = x.clone()
    written[index] = value
    return written


# mask tensor -> whether it was causal
_CAUSAL_SEEN = _PerTensor()


def _causal(mask: torch.Tensor, rows: int, cols: int) -> bool:
    """Whether ``mask`` is the causal mask of every ``(rows, cols)`` matrix of scores it
    broadcasts to (sdpa's ``is_causal``, aligned at the top left): a bool mask set
    exactly above the diagonal, a float one whose entries there drop their scores
    (:func:`~frontends.fx.observed.triangle_of`), checked once per tensor and version."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (rows, cols):
        return False
    found, causal = _CAUSAL_SEEN.get(mask)
    if found:
        return causal
    if mask.dtype == torch.bool:
        above = torch.ones(rows, cols, dtype=torch.bool, device=mask.device).triu(1)
        causal = torch.equal(mask, above.expand(mask.shape))
    else:
        causal = mask.is_floating_point() and triangle_of(mask) == "additive"
    _CAUSAL_SEEN.put(mask, causal)
    return causal


@one_call_when_traced
def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float, gqa: bool = False) -> torch.Tensor:
    """``softmax((q @ k.T * scale).masked_fill(mask, -inf)) @ v`` for a bool ``mask``,
    ``softmax(q @ k.T * scale + mask) @ v`` for a float one (see the module docstring):
    causal sdpa while ``mask`` is the causal mask, sdpa under the mask otherwise. Under a
    tracer, whose tensors hold no values to check, it is the general form.

    >>> q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    >>> above = torch.ones(4, 4, dtype=torch.bool).triu(1)
    >>> naive = torch.softmax((q @ k.transpose(-2, -1) * 0.5).masked_fill(above, -torch.inf),
    ...                       -1) @ v
    >>> torch.allclose(masked_attention(q, k, v, above, 0.5), naive, atol=1e-6)
    True
    >>> above[0, 1] = False  # changed in place: no longer causal, still right
    >>> naive = torch.softmax((q @ k.transpose(-2, -1) * 0.5).masked_fill(above, -torch.inf),
    ...                       -1) @ v
    >>> torch.allclose(masked_attention(q, k, v, above, 0.5), naive, atol=1e-6)
    True
    >>> added = torch.zeros(4, 4).masked_fill(above, torch.finfo(torch.float32).min)
    >>> naive = torch.softmax(q @ k.transpose(-2, -1) * 0.5 + added, -1) @ v
    >>> torch.allclose(masked_attention(q, k, v, added, 0.5), naive, atol=1e-6)
    True
    """
    rows, cols = q.shape[-2], k.shape[-2]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not _traced(q, k, v, mask) and _causal(mask, rows, cols):
        return sdpa(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if mask.dtype != torch.bool:
        out = sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        row = mask.amax(-1, keepdim=True)
        return out + (row - row)  # (0, or NaN for a row all -inf, as written)
    kept = ~mask
    out = sdpa(q, k, v, attn_mask=kept, scale=scale, enable_gqa=gqa)
    # (sdpa gives 0 for a row with nothing kept, the written form NaN: 0/0)
    return out / kept.to(out.dtype).amax(-1, keepdim=True)
