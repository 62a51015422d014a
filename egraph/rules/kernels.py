"""Kernels: other library kernels for an op, beside the one torch calls for it, that the
cost model chooses between by this machine's measured curves.

``linear-onednn``: a float32 linear through oneDNN's inner product
(:func:`frontends.fx.kernels.onednn_linear`), which ran GPT-2 small's and BERT-base's
projections 2.2-2.9x faster than torch's linear on an AVX-512 CPU and the projections of a
tiny model 3x slower. Only a profile that measured it (:mod:`extractors.calibration`)
prices it; others never choose it. It reaches every product by a matrix through the
fusion rules ``matmul-linear`` and ``linear-add-bias`` (``addmm``: GPT-2's ``Conv1D``,
aot_autograd's graphs of ``nn.Linear``).

``linear-mkl``: a float32 linear through MKL's product with its weight packed once for the
input's row count (:func:`frontends.fx.kernels.mkl_linear`, what Inductor's CPU freezing
path calls), which ran GPT-2 small's projections at 128 tokens 1.2-1.3x faster than torch's
linear on an AVX-512 Xeon, where oneDNN's inner product ran no faster than torch's; priced
the same way, so that each machine's curves choose among the three.

``conv2d-onednn``: a float32 convolution (one group: depthwise ones are not measured)
through oneDNN with its weight packed once (:func:`frontends.fx.kernels.onednn_conv2d`),
and channels-last activations, which ran ResNet-50's convolutions 1.76x faster than
torch's conv2d on one CPU, priced the same way; ``conv-bn-onednn`` folds an eval batch
norm into it as ``conv-bn`` does into torch's, in the same step, so that the folded
convolution is not left to a later iteration (saturation of a whole ResNet stops at its
limits before that).

``conv-relu-onednn``, ``conv-add-relu-onednn`` and ``linear-gelu-onednn`` (with
``linear-reshape-gelu-onednn`` for a GELU of the product's reshaped rows): oneDNN's
convolution with a ReLU, or a same-shaped sum then a ReLU (a residual block's end), and
its inner product with a GELU (a transformer's MLP), each as one call that applies them to
each block of the output while it is in cache
(:func:`frontends.fx.kernels.onednn_conv2d_relu`, :func:`~frontends.fx.kernels.onednn_linear_gelu`):
ResNet-50's sums and ReLUs had taken 37 ms of a 223 ms call at batch 8 as calls of their
own. They are e-graph alternatives rather than an emission pass so that the cost model
prices the program that runs: DAG extraction pays for the fused call as one library call,
and for a product something else also reads once more, so it fuses only where that pays.

>>> next(r for r in RULES if r.name == "linear-onednn").rewrite
Rewrite('linear-onednn', '(linear ?x ?w ?b)' => '(onednn_linear ?x ?w ?b)')
"""

from __future__ import annotations

from egraph.ops import (
    add,
    batch_norm,
    conv2d,
    gelu,
    linear,
    mkl_linear,
    onednn_conv2d,
    onednn_conv2d_relu,
    onednn_linear,
    onednn_linear_gelu,
    relu,
    reshape,
)
from egraph.rules.define import F, LibraryRule, rule, torch
from egraph.rules.fusion import fold_bn
from egraph.rules.guards import all_of, literal_is, not_none, same_dtype, shape_of, single_precision
from egraph.term import vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 4

x, w, b, st, pa, di, g, mu, sigma2, ga, be, eps, y, a, sh = vars(
    "x w b st pa di g mu sigma2 ga be eps y a sh")
CONVOLUTION = ("x", "w", "b", "st", "pa", "di", "g")


def _residual_post_op(egraph, subst):
    """``relu(conv2d(..) + y)`` as oneDNN's convolution with the sum and the ReLU as its
    post-ops, where ``y`` has the convolution's shape (a broadcast ``y`` is not a post-op
    oneDNN takes: the kernel would run the calls one by one, slower than priced)."""
    conv = egraph.add_node("conv2d", [subst[v] for v in CONVOLUTION])
    shape = shape_of(egraph, conv)
    if shape is None or shape != shape_of(egraph, subst["y"]):
        return None
    return egraph.add_node("onednn_conv2d_relu", [subst[v] for v in CONVOLUTION] + [subst["y"]])


_residual_post_op.__name__ = "onednn_conv2d_relu with the sum as a post-op"


RULES: list[LibraryRule] = [
    rule("linear-onednn", linear(x, w, b), onednn_linear(x, w, b), when=single_precision(x),
         example=lambda x, w, b: F.linear(x, w, b),
         inputs={"x": (2, 5, 8), "w": (6, 8), "b": (6,)},
         description="a float32 linear is oneDNN's inner product on the CPU, torch's "
                     "linear elsewhere: the same values, another kernel"),
    rule("linear-mkl", linear(x, w, b), mkl_linear(x, w, b), when=single_precision(x),
         example=lambda x, w, b: F.linear(x, w, b),
         inputs={"x": (2, 5, 8), "w": (6, 8), "b": (6,)},
         description="a float32 linear is MKL's product with its weight packed once on "
                     "the CPU, torch's linear elsewhere: the same values, another kernel"),
    rule("conv2d-onednn", conv2d(x, w, b, st, pa, di, g), onednn_conv2d(x, w, b, st, pa, di, g),
         when=all_of(single_precision(x), literal_is(g, 1)),
         example=lambda x, w, b: F.conv2d(x, w, b, padding=1),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "b": (4,)},
         description="a float32 convolution is oneDNN's with its weight packed once on the "
                     "CPU, torch's elsewhere: the same values, another kernel"),
    rule("conv-bn-onednn", batch_norm(conv2d(x, w, b, st, pa, di, g), mu, sigma2, ga, be, eps),
         fold_bn("onednn_conv2d"),
         when=all_of(not_none(ga), not_none(be), single_precision(x), literal_is(g, 1)),
         example=lambda x, w, c, m, v, ga, be: F.batch_norm(F.conv2d(x, w, c, padding=1), m, v,
                                                            ga, be, eps=1e-5),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "c": (4,), "m": (4,),
                 "v": ((4,), "positive"), "ga": (4,), "be": (4,)},
         description="an eval batch norm after a convolution folds into oneDNN's "
                     "convolution as into torch's (conv-bn), in one step"),
    rule("conv-relu-onednn", relu(conv2d(x, w, b, st, pa, di, g)),
         onednn_conv2d_relu(x, w, b, st, pa, di, g, None),
         when=all_of(single_precision(x), literal_is(g, 1)),
         example=lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "b": (4,)},
         description="a ReLU after a float32 convolution is oneDNN's post-op on the CPU"),
    rule("conv-add-relu-onednn", relu(add(conv2d(x, w, b, st, pa, di, g), y)),
         _residual_post_op,
         when=all_of(single_precision(x), same_dtype(x, y), literal_is(g, 1)),
         example=lambda x, w, b, y: torch.relu(F.conv2d(x, w, b, padding=1) + y),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "b": (4,), "y": (2, 4, 6, 6)},
         description="a residual sum then a ReLU after a float32 convolution are oneDNN's "
                     "post-ops on the CPU"),
    rule("linear-gelu-onednn", gelu(linear(x, w, b), a), onednn_linear_gelu(x, w, b, a),
         when=single_precision(x),
         example=(lambda x, w, b: F.gelu(F.linear(x, w, b)),
                  lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh")),
         inputs={"x": (2, 5, 8), "w": (6, 8), "b": (6,)},
         description="a GELU after a float32 linear is oneDNN's post-op on the CPU"),
    rule("linear-reshape-gelu-onednn", gelu(reshape(linear(x, w, b), sh), a),
         reshape(onednn_linear_gelu(x, w, b, a), sh), when=single_precision(x),
         example=lambda x, w, b: F.gelu(F.linear(x, w, b).view(2, 5, 6), approximate="tanh"),
         inputs={"x": (10, 8), "w": (6, 8), "b": (6,)},
         description="a GELU of a float32 linear's reshaped rows (GPT-2's Conv1D: addmm "
                     "over flattened rows, then a view) is oneDNN's post-op on the CPU"),
]
