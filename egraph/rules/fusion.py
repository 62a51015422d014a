"""Fusion: the fused ops users could have called, recovered from the pieces they wrote.

Softmax, log_softmax, layer_norm and rms_norm from their arithmetic; linear from matmul and
bias; GELU and SiLU from their formulas; attention from matmul, scale, (causal mask),
softmax and matmul; convolution with an eval-mode batch norm folded into its weights.
"""

from __future__ import annotations

import math

from egraph.rules import register
from egraph.rules.guards import (
    all_of,
    is_none,
    literal_is,
    literal_near,
    not_none,
    rank_is,
    single_dim,
    value_of,
)
from egraph.term import literal


def _fuse(name, lhs, rhs, example, inputs, when=None, description=""):
    register("fusion", name, lhs, rhs, example=example, inputs=inputs, when=when,
             description=description)


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
    def guard(egraph, subst) -> bool:
        target = value_of(egraph, subst["s"])
        return all(_shape(egraph, subst[n]) == target for n in names)
    guard.__name__ = " and ".join(f"shape {n} == normalized shape" for n in names)
    return guard


def _last_two(var_x: str, var_a: str, var_b: str):
    def guard(egraph, subst) -> bool:
        shape = _shape(egraph, subst[var_x])
        if shape is None or len(shape) < 2:
            return False
        r = len(shape)
        return {value_of(egraph, subst[var_a]), value_of(egraph, subst[var_b])} == {r - 2, r - 1}
    guard.__name__ = f"transpose of the last two dims of {var_x}"
    return guard


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


_fuse("softmax", "(div (exp ?x) (sum (exp ?x) ?d #bool:true))", "(softmax ?x ?d)",
      "torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)", {"x": (4, 8)},
      when=single_dim("d"), description="exp(x)/sum(exp(x)) is softmax (max-shifted, fused)")
_fuse("softmax-shifted", "(div (exp (sub ?x (amax ?x ?d #bool:true))) "
      "(sum (exp (sub ?x (amax ?x ?d #bool:true))) ?d #bool:true))", "(softmax ?x ?d)",
      "torch.exp(x - x.amax(-1, keepdim=True)) / "
      "torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)", {"x": (4, 8)},
      when=single_dim("d"), description="the max-shifted softmax written out")
_fuse("log-softmax-pieces", "(sub ?x (logsumexp ?x ?d #bool:true))", "(log_softmax ?x ?d)",
      "x - torch.logsumexp(x, -1, keepdim=True)", {"x": (4, 8)}, when=single_dim("d"),
      description="x - logsumexp(x) is log_softmax")
_fuse("layer-norm", "(div (sub ?x (mean ?x ?d #bool:true)) "
      "(sqrt (add (var ?x ?d #int:0 #bool:true) ?eps)))", _layer_norm,
      "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)"
      " + 1e-5)", {"x": (4, 8)},
      description="(x - mean) / sqrt(var + eps) over trailing dims is layer_norm")
_fuse("layer-norm-affine", "(add (mul (layer_norm ?x ?s #none #none ?e) ?w) ?b)",
      "(layer_norm ?x ?s ?w ?b ?e)",
      "torch.nn.functional.layer_norm(x, (8,)) * w + b", {"x": (4, 8), "w": (8,), "b": (8,)},
      when=_affine_matches("w", "b"), description="the affine of layer_norm fused in")
_fuse("rms-norm", "(div ?x (sqrt (add (mean (mul ?x ?x) ?d #bool:true) ?eps)))", _rms_norm,
      "x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)", {"x": (4, 8)},
      description="x / sqrt(mean(x^2) + eps) over trailing dims is rms_norm")
_fuse("rms-norm-rsqrt", "(mul ?x (rsqrt (add (mean (mul ?x ?x) ?d #bool:true) ?eps)))",
      _rms_norm, "x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)", {"x": (4, 8)},
      description="x * rsqrt(mean(x^2) + eps) is rms_norm")
_fuse("rms-norm-affine", "(mul (rms_norm ?x ?s #none ?e) ?w)", "(rms_norm ?x ?s ?w ?e)",
      "torch.nn.functional.rms_norm(x, (8,), eps=1e-6) * w", {"x": (4, 8), "w": (8,)},
      when=_affine_matches("w"), description="the scale of rms_norm fused in")
_fuse("linear", "(add (matmul ?x (transpose ?w #int:0 #int:1)) ?b)", "(linear ?x ?w ?b)",
      "x @ w.t() + b", {"x": (4, 8), "w": (6, 8), "b": (6,)},
      when=all_of(rank_is("w", 2), rank_is("b", 1)), description="x @ w.T + b is linear")
_fuse("linear-nobias", "(matmul ?x (transpose ?w #int:0 #int:1))", "(linear ?x ?w #none)",
      "x @ w.t()", {"x": (4, 8), "w": (6, 8)}, when=rank_is("w", 2),
      description="x @ w.T is linear without bias")
_fuse("linear-add-bias", "(add (linear ?x ?w #none) ?b)", "(linear ?x ?w ?b)",
      "torch.nn.functional.linear(x, w) + b", {"x": (4, 8), "w": (6, 8), "b": (6,)},
      when=rank_is("b", 1), description="a bias added after linear fuses into it")
_fuse("gelu-tanh", "(mul (mul ?half ?x) (add ?one (tanh (mul ?c (add ?x (mul ?k "
      "(pow ?x ?three)))))))", "(gelu ?x \"tanh\")",
      "0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))",
      {"x": (4, 8)},
      when=all_of(literal_is("half", 0.5), literal_is("one", 1),
                  literal_near("c", math.sqrt(2 / math.pi)), literal_near("k", 0.044715),
                  literal_is("three", 3)),
      description="GELU's tanh approximation written out")
_fuse("gelu-erf", "(mul (mul ?half ?x) (add ?one (erf (div ?x ?r))))", "(gelu ?x \"none\")",
      "0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", {"x": (4, 8)},
      when=all_of(literal_is("half", 0.5), literal_is("one", 1),
                  literal_near("r", math.sqrt(2.0))),
      description="exact GELU written with erf")
_fuse("silu", "(mul ?x (sigmoid ?x))", "(silu ?x)", "x * torch.sigmoid(x)", {"x": (4, 8)},
      description="x * sigmoid(x) is SiLU")

_QK = "(matmul ?q (transpose ?k ?a ?b))"
_CAUSAL = ("(masked_fill {s} (bitwise_not (tril (ones_like (to {s} #dtype:bool)) #int:0))"
           " #float:-inf)")
_ATTN_IN = {"q": (2, 3, 6, 4), "k": (2, 3, 6, 4), "v": (2, 3, 6, 4)}
for _name, _scored, _divide, _example in [
    ("sdpa", f"(mul {_QK} ?s)", False, "torch.softmax((q @ k.transpose(-2, -1)) * 0.5, -1) @ v"),
    ("sdpa-div", f"(div {_QK} ?s)", True, "torch.softmax((q @ k.transpose(-2, -1)) / 2.0, -1) @ v"),
]:
    _fuse(_name, f"(matmul (softmax {_scored} ?d) ?v)", _scale_of(_name, _divide), _example,
          _ATTN_IN, when=all_of(_last_two("k", "a", "b"), _softmax_last),
          description="matmul, scale, softmax, matmul is scaled_dot_product_attention")
    _causal = _CAUSAL.format(s=_scored)
    _score_code = "(q @ k.transpose(-2, -1)) " + ("/ 2.0" if _divide else "* 0.5")
    _fuse(_name + "-causal", f"(matmul (softmax {_causal} ?d) ?v)",
          _scale_of(_name + "-causal", _divide),
          f"torch.softmax(({_score_code}).masked_fill(~torch.ones_like({_score_code}, "
          "dtype=torch.bool).tril(), float('-inf')), -1) @ v", _ATTN_IN,
          when=all_of(_last_two("k", "a", "b"), _softmax_last, _square),
          description="attention with a causal mask is causal scaled_dot_product_attention")
_fuse("conv-bn", "(batch_norm (conv2d ?x ?w ?b ?st ?pa ?di ?g) ?mean ?var ?ga ?be ?eps)",
      _fold_bn,
      "torch.nn.functional.batch_norm(torch.nn.functional.conv2d(x, w, c, padding=1), m, v, "
      "ga, be, eps=1e-5)",
      {"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "c": (4,), "m": (4,),
       "v": ((4,), "positive"), "ga": (4,), "be": (4,)},
      when=all_of(not_none("ga"), not_none("be")),
      description="an eval batch norm after a convolution folds into its weight and bias")
