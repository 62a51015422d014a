"""Fusion: the fused ops users could have called, recovered from the pieces they wrote.

Softmax, log_softmax, layer_norm and rms_norm from their arithmetic; linear from matmul and
bias; GELU and SiLU from their formulas; attention from matmul, scale, (causal mask),
softmax and matmul; convolution with an eval-mode batch norm folded into its weights.

>>> next(r for r in RULES if r.name == "silu").rewrite
Rewrite('silu', '(mul ?x (sigmoid ?x))' => '(silu ?x)')
"""

from __future__ import annotations

import math

from egraph.ops import (
    amax,
    batch_norm,
    bitwise_not,
    conv2d,
    erf,
    exp,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    logsumexp,
    masked_fill,
    matmul,
    mean,
    ones_like,
    rms_norm,
    rsqrt,
    sigmoid,
    silu,
    softmax,
    sqrt,
    sum,
    tanh,
    to,
    transpose,
    tril,
    var,
)
from egraph.rules.define import F, LibraryRule, rule, torch
from egraph.rules.guards import (
    all_of,
    is_none,
    literal_near,
    not_none,
    rank_is,
    single_dim,
    value_of,
)
from egraph.term import Term, literal, vars

__all__ = ["RULES"]

(x, w, b, d, s, e, eps, q, k, v, i, j, c, r, st, pa, di, g, mu, sigma2, ga, be) = vars(
    "x w b d s e eps q k v i j c r st pa di g mean var ga be")

def _shape(egraph, cid):
    return getattr(egraph.data(cid), "shape", None)


def _trailing_shape(egraph, subst):
    """The normalised shape of a norm over the trailing dims ``?d`` of ``?x``, or None."""
    shape, dims = _shape(egraph, subst["x"]), value_of(egraph, subst["d"])
    if shape is None or not isinstance(dims, tuple) or not dims:
        return None
    rank = len(shape)
    if tuple(dims) != tuple(range(rank - len(dims), rank)):
        return None
    return tuple(shape[rank - len(dims):])


def _layer_norm(egraph, subst):
    shape = _trailing_shape(egraph, subst)
    if shape is None:
        return None
    none = egraph.add_node(literal(None))
    return egraph.add_node("layer_norm", [subst["x"], egraph.add_node(literal(shape)), none,
                                          none, subst["eps"]])


def _rms_norm(egraph, subst):
    shape = _trailing_shape(egraph, subst)
    if shape is None:
        return None
    return egraph.add_node("rms_norm", [subst["x"], egraph.add_node(literal(shape)),
                                        egraph.add_node(literal(None)), subst["eps"]])


def _affine_matches(*names):
    names = tuple(n.name for n in names)

    def guard(egraph, subst) -> bool:
        target = value_of(egraph, subst["s"])
        return all(_shape(egraph, subst[n]) == target for n in names)
    guard.__name__ = " and ".join(f"shape {n} == normalized shape" for n in names)
    return guard


def _last_two(egraph, subst) -> bool:
    shape = _shape(egraph, subst["k"])
    if shape is None or len(shape) < 2:
        return False
    r = len(shape)
    return {value_of(egraph, subst["i"]), value_of(egraph, subst["j"])} == {r - 2, r - 1}


_last_two.__name__ = "transpose of the last two dims of k"


def _softmax_last(egraph, subst) -> bool:
    shape, dims = _shape(egraph, subst["q"]), value_of(egraph, subst["d"])
    return shape is not None and dims == (len(shape) - 1,)


_softmax_last.__name__ = "softmax over the last dim"


def _scale_of(name: str, divide: bool):
    def rhs(egraph, subst):
        s = value_of(egraph, subst["s"])
        if not isinstance(s, (int, float)) or isinstance(s, bool) or s == 0:
            return None
        scale = 1.0 / float(s) if divide else float(s)
        causal = name.endswith("causal")
        return egraph.add_node("sdpa", [subst["q"], subst["k"], subst["v"],
                                        egraph.add_node(literal(None)),
                                        egraph.add_node(literal(causal)),
                                        egraph.add_node(literal(scale))])
    rhs.__name__ = f"{name}(q, k, v, scale={'1/s' if divide else 's'})"
    return rhs


def _square(egraph, subst) -> bool:
    q, k = _shape(egraph, subst["q"]), _shape(egraph, subst["k"])
    return q is not None and k is not None and q[-2] == k[-2]


_square.__name__ = "query and key lengths are equal"


def _fold_bn(egraph, subst):
    """conv(x, w, b) then eval batch norm = conv(x, w * s, (b - mean) * s + beta),
    s = gamma / sqrt(var + eps), broadcast over the output channel."""
    w_shape = _shape(egraph, subst["w"])
    if w_shape is None:
        return None
    add = egraph.add_node
    scale = add("div", [subst["ga"], add("sqrt", [add("add", [subst["var"], subst["eps"]])])])
    per_channel = add(literal((w_shape[0],) + (1,) * (len(w_shape) - 1)))
    weight = add("mul", [subst["w"], add("reshape", [scale, per_channel])])
    bias_in = add("zeros_like", [subst["mean"]]) if is_none(egraph, subst["b"]) else subst["b"]
    bias = add("add", [add("mul", [add("sub", [bias_in, subst["mean"]]), scale]), subst["be"]])
    return add("conv2d", [subst["x"], weight, bias, subst["st"], subst["pa"], subst["di"],
                          subst["g"]])




def _causal(scores: Term) -> Term:
    """``scores`` with the entries above the diagonal set to -inf."""
    return masked_fill(scores, bitwise_not(tril(ones_like(to(scores, BOOL)), 0)), -math.inf)


def _attention(name: str, scores: Term, divide: bool, example, causal: bool) -> LibraryRule:
    if causal:
        name, scores = name + "-causal", _causal(scores)
    return rule(name, matmul(softmax(scores, d), v), _scale_of(name, divide),
                when=all_of(_last_two, _softmax_last, *([_square] if causal else [])),
                example=example, inputs={"q": (2, 3, 6, 4), "k": (2, 3, 6, 4), "v": (2, 3, 6, 4)},
                description="attention with a causal mask is causal scaled_dot_product_attention"
                if causal else "matmul, scale, softmax, matmul is scaled_dot_product_attention")


def _masked(scores):
    return scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf"))


BOOL = Term(("dtype", "bool"))
SHIFTED = exp(x - amax(x, d, True))
QK = q @ transpose(k, i, j)
RULES: list[LibraryRule] = [
    rule("softmax", exp(x) / sum(exp(x), d, True), softmax(x, d), when=single_dim(d),
         example=lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), inputs={"x": (4, 8)},
         description="exp(x)/sum(exp(x)) is softmax (max-shifted, fused)"),
    rule("softmax-shifted", SHIFTED / sum(SHIFTED, d, True), softmax(x, d), when=single_dim(d),
         example=lambda x: torch.exp(x - x.amax(-1, keepdim=True))
         / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True),
         inputs={"x": (4, 8)}, description="the max-shifted softmax written out"),
    rule("log-softmax-pieces", x - logsumexp(x, d, True), log_softmax(x, d), when=single_dim(d),
         example=lambda x: x - torch.logsumexp(x, -1, keepdim=True), inputs={"x": (4, 8)},
         description="x - logsumexp(x) is log_softmax"),
    rule("layer-norm", (x - mean(x, d, True)) / sqrt(var(x, d, 0, True) + eps), _layer_norm,
         example=lambda x: (x - x.mean(-1, keepdim=True))
         / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5),
         inputs={"x": (4, 8)},
         description="(x - mean) / sqrt(var + eps) over trailing dims is layer_norm"),
    rule("layer-norm-affine", layer_norm(x, s, None, None, e) * w + b, layer_norm(x, s, w, b, e),
         when=_affine_matches(w, b), example=lambda x, w, b: F.layer_norm(x, (8,)) * w + b,
         inputs={"x": (4, 8), "w": (8,), "b": (8,)},
         description="the affine of layer_norm fused in"),
    rule("rms-norm", x / sqrt(mean(x * x, d, True) + eps), _rms_norm,
         example=lambda x: x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6),
         inputs={"x": (4, 8)},
         description="x / sqrt(mean(x^2) + eps) over trailing dims is rms_norm"),
    rule("rms-norm-rsqrt", x * rsqrt(mean(x * x, d, True) + eps), _rms_norm,
         example=lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6),
         inputs={"x": (4, 8)}, description="x * rsqrt(mean(x^2) + eps) is rms_norm"),
    rule("rms-norm-affine", rms_norm(x, s, None, e) * w, rms_norm(x, s, w, e),
         when=_affine_matches(w), example=lambda x, w: F.rms_norm(x, (8,), eps=1e-6) * w,
         inputs={"x": (4, 8), "w": (8,)}, description="the scale of rms_norm fused in"),
    rule("linear", x @ transpose(w, 0, 1) + b, linear(x, w, b),
         when=all_of(rank_is(w, 2), rank_is(b, 1)), example=lambda x, w, b: x @ w.t() + b,
         inputs={"x": (4, 8), "w": (6, 8), "b": (6,)}, description="x @ w.T + b is linear"),
    rule("linear-nobias", x @ transpose(w, 0, 1), linear(x, w, None), when=rank_is(w, 2),
         example=lambda x, w: x @ w.t(), inputs={"x": (4, 8), "w": (6, 8)},
         description="x @ w.T is linear without bias"),
    rule("linear-add-bias", linear(x, w, None) + b, linear(x, w, b), when=rank_is(b, 1),
         example=lambda x, w, b: F.linear(x, w) + b, inputs={"x": (4, 8), "w": (6, 8), "b": (6,)},
         description="a bias added after linear fuses into it"),
    rule("gelu-tanh", 0.5 * x * (1 + tanh(c * (x + r * x ** 3))), gelu(x, "tanh"),
         when=all_of(literal_near(c, math.sqrt(2 / math.pi)), literal_near(r, 0.044715)),
         example=lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi)
                                                       * (x + 0.044715 * x ** 3))),
         inputs={"x": (4, 8)}, description="GELU's tanh approximation written out"),
    rule("gelu-erf", 0.5 * x * (1 + erf(x / r)), gelu(x, "none"),
         when=literal_near(r, math.sqrt(2.0)),
         example=lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), inputs={"x": (4, 8)},
         description="exact GELU written with erf"),
    rule("silu", x * sigmoid(x), silu(x), example=lambda x: x * torch.sigmoid(x),
         inputs={"x": (4, 8)}, description="x * sigmoid(x) is SiLU"),
    _attention("sdpa", QK * s, False, causal=False,
               example=lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)) * 0.5, -1) @ v),
    _attention("sdpa", QK * s, False, causal=True,
               example=lambda q, k, v: torch.softmax(_masked((q @ k.transpose(-2, -1)) * 0.5),
                                                     -1) @ v),
    _attention("sdpa-div", QK / s, True, causal=False,
               example=lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)) / 2.0, -1) @ v),
    _attention("sdpa-div", QK / s, True, causal=True,
               example=lambda q, k, v: torch.softmax(_masked((q @ k.transpose(-2, -1)) / 2.0),
                                                     -1) @ v),
    rule("conv-bn", batch_norm(conv2d(x, w, b, st, pa, di, g), mu, sigma2, ga, be, eps), _fold_bn,
         when=all_of(not_none(ga), not_none(be)),
         example=lambda x, w, c, m, v, ga, be: F.batch_norm(F.conv2d(x, w, c, padding=1), m, v,
                                                            ga, be, eps=1e-5),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "c": (4,), "m": (4,),
                 "v": ((4,), "positive"), "ga": (4,), "be": (4,)},
         description="an eval batch norm after a convolution folds into its weight and bias"),
]
