"""Fusion: the fused ops users could have called, recovered from the pieces they wrote.

Softmax, log_softmax, layer_norm and rms_norm from their arithmetic; linear from matmul and
bias; GELU and SiLU from their formulas; attention from matmul, scale, a mask (causal, bool
or additive; filled with -inf or with a value low enough to drop its entries, finfo.min or
-1e9; after a bias such as ALiBi; a fill before an additive mask, or a sum floored at
finfo.min), softmax and matmul; convolution with an eval-mode batch
norm folded into its weights. Each fused form is matched in one canonical spelling: the
algebra rules bring the others to it (a division by sqrt to a multiplication by rsqrt and
back, x**2 to x*x, a scale on q or after the mask to one on the scores, ``where`` to
``masked_fill``).

>>> next(r for r in RULES if r.name == "silu").rewrite
Rewrite('silu', '(mul ?x (sigmoid ?x))' => '(silu ?x)')
"""

from __future__ import annotations

import math

from egraph.ops import (
    addmm,
    amax,
    batch_norm,
    clamp,
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
    rms_norm,
    sdpa,
    sigmoid,
    silu,
    softmax,
    sqrt,
    sum,
    tanh,
    transpose,
    var,
    where,
)
from egraph.rules.define import F, LibraryRule, rule, torch
from egraph.rules.guards import (
    all_of,
    boolean,
    floating,
    is_none,
    literal_near,
    named,
    not_none,
    number_of,
    rank_is,
    same_dtype,
    shape_of,
    single_dim,
    tensor,
    value_of,
)
from egraph.term import Term, literal, vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 2

(x, w, b, d, s, e, eps, q, k, v, i, j, c, r, st, pa, di, g, mu, sigma2, ga, be, m, p) = vars(
    "x w b d s e eps q k v i j c r st pa di g mu sigma2 ga be m p")


def _trailing_shape(egraph, subst):
    """The normalised shape of a norm over the trailing dims ``?d`` of ``?x``, or None."""
    shape, dims = shape_of(egraph, subst["x"]), value_of(egraph, subst["d"])
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


def _centred_rms(egraph, subst):
    """``rms_norm(x - mean(x, d), s, w, eps)`` is ``layer_norm(x, s, w, None, eps)`` when
    ``d`` are the dims ``s`` normalises."""
    if _trailing_shape(egraph, subst) != value_of(egraph, subst["s"]):
        return None
    return egraph.add_node("layer_norm", [subst["x"], subst["s"], subst["w"],
                                          egraph.add_node(literal(None)), subst["e"]])


def _affine_matches(*names):
    names = tuple(n.name for n in names)

    @named(" and ".join(f"shape {n} == normalized shape" for n in names))
    def guard(egraph, subst) -> bool:
        target = value_of(egraph, subst["s"])
        return all(shape_of(egraph, subst[n]) == target for n in names)
    return guard


@named("x and w are matrices and c has the shape of their product")
def _product_shaped(egraph, subst) -> bool:
    a, b = shape_of(egraph, subst["x"]), shape_of(egraph, subst["w"])
    return (a is not None and b is not None and len(a) == len(b) == 2
            and shape_of(egraph, subst["c"]) == (a[0], b[1]))


@named("transpose of the last two dims of k")
def _last_two(egraph, subst) -> bool:
    shape = shape_of(egraph, subst["k"])
    if shape is None or len(shape) < 2:
        return False
    r = len(shape)
    return {value_of(egraph, subst["i"]), value_of(egraph, subst["j"])} == {r - 2, r - 1}


@named("softmax over the last dim")
def _softmax_last(egraph, subst) -> bool:
    shape, dims = shape_of(egraph, subst["q"]), value_of(egraph, subst["d"])
    return shape is not None and dims == (len(shape) - 1,)


def _sdpa(mask: str | None, causal: bool, scaled: bool = True):
    """The right side: ``sdpa(q, k, v, mask, causal, scale, gqa=False)``; ``mask`` names
    the bool mask of the dropped entries (``"dropped"``, passed negated: sdpa's bool mask
    keeps), the additive one (``"additive"``), or a bias ``p`` added to the scores before
    they are filled where ``m`` drops (``"biased"``: MPT's ALiBi, passed as the float mask
    ``p`` filled with -inf).

    A row whose every entry is masked is NaN in the written form (softmax of -inf only)
    and 0 in sdpa; the result is divided by the row's largest kept flag (1, or 0 for such
    a row: 0/0 is NaN), or, for an additive mask, has its row maximum minus itself added
    (0, or NaN where the row is -inf), so both forms agree everywhere."""
    @named(f"sdpa(q, k, v, {mask or 'None'}, causal={causal})")
    def rhs(egraph, subst):
        scale = number_of(egraph, subst["s"]) if scaled else 1.0
        if scale is None or scale == 0:
            return None
        add = egraph.add_node
        last, keep = add(literal((-1,))), add(literal(True))
        if mask in ("dropped", "biased"):
            dtype = getattr(egraph.data(subst["q"]), "dtype", None)
            if dtype is None:
                return None
            kept_entries = add("bitwise_not", [subst["m"]])
            flags = add("to", [kept_entries, add(("dtype", str(dtype).removeprefix("torch.")))])
            kept = add("amax", [flags, last, keep])
            # (a bias added before the fill: sdpa's float mask, -inf where dropped)
            attn_mask = kept_entries if mask == "dropped" else add(
                "masked_fill", [subst["p"], subst["m"], add(literal(-math.inf))])
            # (a finite fill: a row with every entry dropped is the uniform softmax, the
            # mean of v; elsewhere the fill's weights are exactly 0, see _drops)
            finite = value_of(egraph, subst["c"]) != -math.inf
            guard, combine = kept, "uniform" if finite else "div"
        elif mask == "additive":
            attn_mask = subst["m"]
            row = add("amax", [attn_mask, last, keep])
            guard, combine = add("sub", [row, row]), "add"
        else:
            attn_mask, guard, combine = add(literal(None)), None, None
        out = add("sdpa", [subst["q"], subst["k"], subst["v"], attn_mask,
                           add(literal(causal)), add(literal(float(scale))),
                           add(literal(False))])
        if combine == "uniform":
            uniform = add("mean", [subst["v"], add(literal((-2,))), keep])
            return add("where", [add("gt", [guard, add(literal(0.0))]), out, uniform])
        return out if guard is None else add(combine, [out, guard])
    return rhs


def _fits(var: str):
    """``?var`` broadcasts to the scores' shape without growing it (sdpa broadcasts its
    mask)."""
    @named(f"{var} broadcasts to the scores")
    def guard(egraph, subst) -> bool:
        q, k, m = (shape_of(egraph, subst[v]) for v in ("q", "k", var))
        if q is None or k is None or m is None or len(m) > len(q):
            return False
        scores = (*q[:-1], k[-2])
        return all(a in (1, b) for a, b in zip(reversed(m), reversed(scores)))
    return guard


_mask_fits = _fits("m")


@named("query and key lengths are equal")
def _square(egraph, subst) -> bool:
    q, k = shape_of(egraph, subst["q"]), shape_of(egraph, subst["k"])
    return q is not None and k is not None and q[-2] == k[-2]


def _unit_dim_at_two(egraph, cid: int, shape: tuple) -> int | None:
    """The class's ``x`` when it is ``x`` of ``(b, h, t, d)`` with a unit dim inserted at
    2 (``x[:, :, None]``, ``x.unsqueeze(2)``, a reshape to ``(b, h, 1, t, d)``); else
    None. A view that keeps the element order and only inserts a unit dim is this one."""
    for node in egraph.nodes(cid):
        if node.op not in ("unsqueeze", "reshape", "getitem"):
            continue
        if node.op == "getitem":
            index = value_of(egraph, node.children[1])
            if not isinstance(index, tuple) or not all(
                    i is None or i is Ellipsis or i == slice(None) for i in index):
                continue
        x = node.children[0]
        inner = shape_of(egraph, x)
        if inner is not None and len(inner) == 4 and shape == (*inner[:2], 1, *inner[2:]):
            return x
    return None


def _repeated_heads(egraph, cid: int) -> tuple[int, int] | None:
    """``(x, groups)`` when the class is ``x``'s heads each repeated ``groups`` times in a
    row, Llama's ``repeat_kv``: ``x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t,
    d)`` (or ``.flatten(1, 2)``), for a ``(b, h, t, d)`` tensor ``x``; else None."""
    out = shape_of(egraph, cid)
    if out is None or len(out) != 4:
        return None
    for node in egraph.nodes(cid):
        if node.op == "flatten":
            if (value_of(egraph, node.children[1]), value_of(egraph, node.children[2])) != (1, 2):
                continue
        elif node.op != "reshape":
            continue
        size = shape_of(egraph, node.children[0])
        if size is None or len(size) != 5 or type(size[2]) is not int:
            continue
        groups = size[2]
        if out != (size[0], size[1] * groups, *size[3:]):
            continue
        for grown in egraph.nodes(node.children[0]):
            if grown.op != "expand":
                continue
            unit = shape_of(egraph, grown.children[0])
            if unit is None or unit != (*size[:2], 1, *size[3:]):
                continue
            x = _unit_dim_at_two(egraph, grown.children[0], unit)
            if x is not None:
                return x, groups
    return None


def _grouped_query(egraph, subst):
    """sdpa on keys and values whose heads were repeated for the query's groups is sdpa
    with ``enable_gqa`` on the unrepeated ones: the copies are never made."""
    grouped = _unrepeated(egraph, subst)
    if grouped is None:
        return None
    add = egraph.add_node
    return add("sdpa", [subst["q"], *grouped, subst["m"], subst["c"], subst["s"],
                        add(literal(True))])


def _unrepeated(egraph, subst) -> tuple[int, int] | None:
    """The keys and values before their heads were repeated for the query's groups
    (Llama's ``repeat_kv``), where both were, alike; else None."""
    keys, values = _repeated_heads(egraph, subst["k"]), _repeated_heads(egraph, subst["v"])
    if keys is None or values is None or keys[1] != values[1]:
        return None
    return keys[0], values[0]


def _repeat_kv(x, flat=False):
    """Llama's ``repeat_kv`` for two query heads per key head, in its two spellings."""
    b, h, t, d = x.shape
    grown = x[:, :, None].expand(b, h, 2, t, d)
    return grown.flatten(1, 2) if flat else grown.reshape(b, h * 2, t, d)


def fold_bn(conv: str):
    """The right side of conv-bn for the convolution op ``conv``: ``conv(x, w, b)`` then
    eval batch norm = ``conv(x, w * s, (b - mean) * s + beta)``, s = gamma / sqrt(var +
    eps), broadcast over the output channel."""
    def fold(egraph, subst):
        return _fold_bn(egraph, subst, conv)
    fold.__name__ = f"{conv} with the batch norm folded in"
    return fold


def _fold_bn(egraph, subst, conv: str):
    w_shape = shape_of(egraph, subst["w"])
    if w_shape is None:
        return None
    add = egraph.add_node
    scale = add("div", [subst["ga"], add("sqrt", [add("add", [subst["sigma2"], subst["eps"]])])])
    per_channel = add(literal((w_shape[0],) + (1,) * (len(w_shape) - 1)))
    weight = add("mul", [subst["w"], add("reshape", [scale, per_channel])])
    bias_in = add("zeros_like", [subst["mu"]]) if is_none(egraph, subst["b"]) else subst["b"]
    bias = add("add", [add("mul", [add("sub", [bias_in, subst["mu"]]), scale]), subst["be"]])
    return add(conv, [subst["x"], weight, bias, subst["st"], subst["pa"], subst["di"],
                      subst["g"]])


def _all_true(egraph, cid: int) -> bool:
    """The class is a tensor of ones (or True): ``ones_like``, ``full(.., 1)``."""
    for n in egraph.nodes(cid):
        if n.op == "ones_like":
            return True
        if n.op == "full" and value_of(egraph, n.children[1]) in (1, True):
            return True
    return False


def _above_diagonal(egraph, cid: int, reshaped: bool = True) -> bool:
    """The class is the bool mask of the entries above the diagonal of an all-true
    tensor: ``triu(ones, 1)`` or ``~tril(ones)``, or (``reshaped``) such a (T, T) mask
    given leading unit dims by a reshape (a sequence-first mask, permuted to the
    scores' order)."""
    for n in egraph.nodes(cid):
        if reshaped and n.op == "reshape":
            inner, target = shape_of(egraph, n.children[0]), value_of(egraph, n.children[1])
            if (inner is not None and len(inner) == 2 and isinstance(target, tuple)
                    and target[-2:] == tuple(inner) and all(d == 1 for d in target[:-2])
                    and _above_diagonal(egraph, n.children[0], reshaped=False)):
                return True
        if n.op == "triu" and value_of(egraph, n.children[1]) == 1 and _all_true(
                egraph, n.children[0]):
            return True
        if n.op == "bitwise_not" and any(
                t.op == "tril" and value_of(egraph, t.children[1]) == 0
                and _all_true(egraph, t.children[0]) for t in egraph.nodes(n.children[0])):
            return True
    return False


_FLIPPED = {"tril": "triu", "triu": "tril"}


def _observed_triangle(egraph, cid: int, depth: int = 8) -> str | None:
    """Which causal mask the class held in the example (``"tril"``: ones on and below the
    diagonal of its last two dims, ``"triu"``: ones above it, ``"additive"``: 0 on and
    below it and a fill that drops its entries above it; the analysis observes it on
    buffers, inputs and the values a program computes from sizes alone), followed
    through the top-left slices, comparisons with 0, negations, casts and views that keep
    the last two dims (nanoGPT's ``bias[:, :, :T, :T] == 0``). Observed, not proven: a
    rule it selects must check at run time."""
    found = getattr(egraph.data(cid), "triangle", None)
    if found is not None or depth == 0:
        return found
    shape = shape_of(egraph, cid)
    for n in egraph.nodes(cid):
        if not n.children:
            continue
        inner_shape = shape_of(egraph, n.children[0])
        if n.op in ("to", "reshape", "expand", "unsqueeze") and (
                shape is not None and inner_shape is not None
                and shape[-2:] == inner_shape[-2:]):
            flip = False
        elif n.op == "getitem" and _top_left(value_of(egraph, n.children[1]), inner_shape):
            flip = False
        elif n.op in ("eq", "ne") and value_of(egraph, n.children[1]) == 0:
            flip = n.op == "eq"
        elif n.op in ("bitwise_not", "logical_not"):
            flip = True
        else:
            continue
        inner = _observed_triangle(egraph, n.children[0], depth - 1)
        if inner is not None:
            return _FLIPPED.get(inner) if flip else inner
    return None


def _top_left(index, shape: tuple | None) -> bool:
    """Whether indexing a tensor of ``shape`` with ``index`` (a slice or a tuple of slices
    and ints) keeps a top-left block of each matrix of its last two dims."""
    index = index if isinstance(index, tuple) else (index,)
    if shape is None or len(index) > len(shape) or not all(
            isinstance(i, slice) or type(i) is int for i in index):
        return False
    return all(isinstance(i, slice) and i.start in (None, 0) and i.step in (None, 1)
               for i in index[len(shape) - 2:])


@named("m drops the entries above the diagonal in the example (checked at run time)")
def _observed_causal(egraph, subst) -> bool:
    return _observed_triangle(egraph, subst["m"]) == "triu"


@named("m is an additive causal mask in the example (checked at run time)")
def _observed_additive_causal(egraph, subst) -> bool:
    return _observed_triangle(egraph, subst["m"]) == "additive"


@named("the fill c is -inf")
def _neg_inf_fill(egraph, subst) -> bool:
    return value_of(egraph, subst["c"]) == -math.inf


@named("masked_attention(q, k, v, m, scale, gqa)")
def _masked_attention(egraph, subst):
    """``masked_attention`` of the match (scale 1 for scores without one); on the keys and
    values before their heads were repeated for the query's groups where they were
    (``gqa``: no copies are made)."""
    scale = number_of(egraph, subst["s"]) if "s" in subst else 1.0
    if scale is None or scale == 0:
        return None
    add = egraph.add_node
    grouped = _unrepeated(egraph, subst)
    keys, values = grouped or (subst["k"], subst["v"])
    return add("masked_attention", [subst["q"], keys, values, subst["m"],
                                    add(literal(float(scale))), add(literal(grouped is not None))])


DROPPED_BELOW = -1e9
"""A fill at or below this (or, in float16, at or below half its lowest) takes its entry
out of a softmax, as -inf does: HF's ``finfo.min``, x-transformers' ``-finfo.max``, the
Annotated Transformer's ``-1e9``."""


@named("the fill c is -inf, or low enough that its softmax weight is 0")
def _drops(egraph, subst) -> bool:
    """The fill ``?c`` of the scores is -inf, or so low that ``exp(c - rowmax)`` is 0 in
    the scores' dtype (it underflows below -104 in float32, -17 in float16) for any row
    whose largest kept score is above ``c + 104``: for a fill of -1e9 or finfo.min, every
    row of scores that are not themselves near the fill."""
    return _dropping(egraph, value_of(egraph, subst["c"]), subst["q"])


def _dropping(egraph, fill, q: int) -> bool:
    """Whether ``fill`` takes its entries out of a softmax of scores of ``q``'s dtype
    (:func:`_drops`)."""
    if not isinstance(fill, float) or fill != fill:
        return False
    if fill <= DROPPED_BELOW:
        return True
    dtype = str(getattr(egraph.data(q), "dtype", None)).removeprefix("torch.")
    return dtype in _HALF_LOWEST and fill <= _HALF_LOWEST[dtype]


# Half the lowest value of the float dtypes whose lowest is above DROPPED_BELOW.
_HALF_LOWEST = {"float16": -65504.0 / 2}


LOWEST = {"float32": -3.4028234663852886e38, "bfloat16": -3.3895313892515355e38,
          "float64": -1.7976931348623157e308}
"""The lowest finite value of the float dtypes where it absorbs any score: ``s + lowest``
rounds to ``lowest`` for ``|s|`` below half its spacing (2**103 in float32). float16's
(-65504, spacing 32) absorbs only scores below 16 and is left out."""


@named("c is the lowest finite value of x's dtype")
def _floors_at_lowest(egraph, subst) -> bool:
    """``?c`` is the lowest finite value of the scores' dtype (:data:`LOWEST`)."""
    dtype = str(getattr(egraph.data(subst["x"]), "dtype", None)).removeprefix("torch.")
    return dtype in LOWEST and value_of(egraph, subst["c"]) == LOWEST[dtype]


@named("the fill c is -inf or the lowest finite value of x's dtype")
def _absorbing_fill(egraph, subst) -> bool:
    """The fill ``?c`` is -inf or the lowest finite value of the scores' dtype
    (:data:`LOWEST`): adding a finite mask value to it, or it to a score, leaves it."""
    fill = value_of(egraph, subst["c"])
    return fill == -math.inf or _floors_at_lowest(egraph, subst)


@named("m masks the entries above the diagonal (causal), square scores")
def _causal_mask(egraph, subst) -> bool:
    q, m = shape_of(egraph, subst["q"]), shape_of(egraph, subst["m"])
    return (_square(egraph, subst) and m is not None and len(m) >= 2
            and m[-2:] == (q[-2], q[-2]) and _above_diagonal(egraph, subst["m"]))


def _all_zero(egraph, cid: int) -> bool:
    """The class is a tensor of zeros: ``zeros_like``, ``full(.., 0)``."""
    return any(n.op == "zeros_like" or n.op == "full" and value_of(egraph, n.children[1]) == 0
               for n in egraph.nodes(cid))


@named("m is an additive causal mask (0, then a dropping fill above)")
def _additive_causal(egraph, subst) -> bool:
    """``?m`` is an additive causal mask of the square scores: 0 on and below the diagonal
    and a fill that drops its entries above it (``zeros.masked_fill(triu(ones, 1), c)``,
    as ingest gives transformers' constant ``finfo.min`` mask), with leading dims that
    broadcast. No row is wholly dropped, so sdpa's ``is_causal`` gives the same rows."""
    q, m = shape_of(egraph, subst["q"]), shape_of(egraph, subst["m"])
    if not (_square(egraph, subst) and m is not None and len(m) >= 2
            and m[-2:] == (q[-2], q[-2]) and _fits("m")(egraph, subst)):
        return False
    return any(n.op == "masked_fill" and _all_zero(egraph, n.children[0])
               and _above_diagonal(egraph, n.children[1])
               and _dropping(egraph, value_of(egraph, n.children[2]), subst["q"])
               for n in egraph.nodes(subst["m"]))


def _causal_scores(scores, fill=-3.4028234663852886e38):
    """``scores`` plus transformers' additive causal mask, made of constants."""
    size = scores.shape[-1]
    above = torch.ones((size, size), dtype=torch.bool).triu(1)
    return scores + torch.zeros((scores.shape[0], 1, size, size)).masked_fill(above, fill)


def _masked(scores):
    return scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf"))


def _masked_above(scores, fill=float("-inf")):
    return scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), fill)


QKV = {"q": (2, 3, 6, 4), "k": (2, 3, 6, 4), "v": (2, 3, 6, 4)}
ATTENTION = all_of(_last_two, _softmax_last)


def _attention(name: str, scores: Term, rhs, description: str, example, when=(),
               inputs=None) -> LibraryRule:
    return rule(name, matmul(softmax(scores, d), v), rhs, when=all_of(ATTENTION, *when),
                example=example, inputs={**QKV, **(inputs or {})}, description=description)


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
    rule("softmax-exp-log-softmax", exp(log_softmax(x, d)), softmax(x, d),
         example=lambda x: torch.exp(torch.log_softmax(x, -1)), inputs={"x": (4, 8)},
         description="exp(log_softmax(x)) is softmax"),
    rule("log-softmax-pieces", x - logsumexp(x, d, True), log_softmax(x, d), when=single_dim(d),
         example=lambda x: x - torch.logsumexp(x, -1, keepdim=True), inputs={"x": (4, 8)},
         description="x - logsumexp(x) is log_softmax"),
    rule("layer-norm", (x - mean(x, d, True)) / sqrt(var(x, d, 0, True) + eps), _layer_norm,
         example=lambda x: (x - x.mean(-1, keepdim=True))
         / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5),
         inputs={"x": (4, 8)},
         description="(x - mean) / sqrt(var + eps) over trailing dims is layer_norm"),
    rule("layer-norm-centred-rms", rms_norm(x - mean(x, d, True), s, w, e), _centred_rms,
         example=lambda x: F.rms_norm(x - x.mean(-1, keepdim=True), (8,), eps=1e-5),
         inputs={"x": (4, 8)},
         description="the RMS norm of the centred values is layer_norm (without bias)"),
    rule("layer-norm-scale", layer_norm(x, s, None, None, e) * w, layer_norm(x, s, w, None, e),
         when=_affine_matches(w), example=lambda x, w: F.layer_norm(x, (8,)) * w,
         inputs={"x": (4, 8), "w": (8,)}, description="the scale of layer_norm fused in"),
    rule("layer-norm-bias", layer_norm(x, s, w, None, e) + b, layer_norm(x, s, w, b, e),
         when=_affine_matches(b),
         example=(lambda x, w, b: F.layer_norm(x, (8,), w) + b,
                  lambda x, w, b: b + F.layer_norm(x, (8,), w)),
         inputs={"x": (4, 8), "w": (8,), "b": (8,)},
         description="the bias of layer_norm fused in"),
    rule("rms-norm", x / sqrt(mean(x * x, d, True) + eps), _rms_norm,
         example=lambda x: x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6),
         inputs={"x": (4, 8)},
         description="x / sqrt(mean(x^2) + eps) over trailing dims is rms_norm"),
    rule("rms-norm-affine", rms_norm(x, s, None, e) * w, rms_norm(x, s, w, e),
         when=_affine_matches(w), example=lambda x, w: F.rms_norm(x, (8,), eps=1e-6) * w,
         inputs={"x": (4, 8), "w": (8,)}, description="the scale of rms_norm fused in"),
    rule("linear", x @ transpose(w, 0, 1) + b, linear(x, w, b),
         when=all_of(rank_is(w, 2), rank_is(b, 1)), example=lambda x, w, b: x @ w.t() + b,
         inputs={"x": (4, 8), "w": (6, 8), "b": (6,)}, description="x @ w.T + b is linear"),
    rule("linear-nobias", x @ transpose(w, 0, 1), linear(x, w, None), when=rank_is(w, 2),
         example=lambda x, w: x @ w.t(), inputs={"x": (4, 8), "w": (6, 8)},
         description="x @ w.T is linear without bias"),
    rule("matmul-linear", matmul(x, w), linear(x, transpose(w, 0, 1), None),
         when=all_of(rank_is(w, 2), floating(x)), example=lambda x, w: torch.matmul(x, w),
         inputs={"x": (2, 5, 8), "w": (8, 6)},
         description="a product by a matrix is linear by its transpose (a view): with "
                     "the bias added after, addmm's one kernel (GPT-2's Conv1D)"),
    rule("linear-add-bias", linear(x, w, None) + b, linear(x, w, b), when=rank_is(b, 1),
         example=lambda x, w, b: F.linear(x, w) + b, inputs={"x": (4, 8), "w": (6, 8), "b": (6,)},
         description="a bias added after linear fuses into it"),
    rule("addmm", matmul(x, w) + c, addmm(c, x, w),
         when=all_of(_product_shaped, floating(x), same_dtype(x, w, c)),
         example=(lambda x, w, c: x @ w + c, lambda x, w, c: c + x.t().t() @ w),
         inputs={"x": (4, 8), "w": (8, 6), "c": (4, 6)},
         description="a matrix product plus a tensor of its shape is addmm, which adds it "
                     "as it writes the product (a tied weight's two gradients)"),
    rule("gelu-tanh", 0.5 * x * (1 + tanh(c * (x + r * x ** 3))), gelu(x, "tanh"),
         when=all_of(literal_near(c, math.sqrt(2 / math.pi)), literal_near(r, 0.044715)),
         example=lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi)
                                                       * (x + 0.044715 * x ** 3))),
         inputs={"x": (4, 8)}, description="GELU's tanh approximation written out"),
    rule("gelu-erf", 0.5 * x * (1 + erf(x * r)), gelu(x, "none"),
         when=literal_near(r, math.sqrt(0.5)),
         example=lambda x: 0.5 * x * (1.0 + torch.erf(x * math.sqrt(0.5))), inputs={"x": (4, 8)},
         description="exact GELU written with erf"),
    rule("silu", x * sigmoid(x), silu(x), example=lambda x: x * torch.sigmoid(x),
         inputs={"x": (4, 8)}, description="x * sigmoid(x) is SiLU"),
    # Attention is matched in one form of its scores, QK * s: the scale anywhere else (on
    # q or k, a division, after the mask) and the masks' spellings (where, ~mask,
    # mask == 0) reach it through the algebra rules.
    _attention("sdpa", QK * s, _sdpa(None, False),
               "matmul, scale, softmax, matmul is scaled_dot_product_attention",
               lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)) * 0.5, -1) @ v),
    _attention("sdpa-unscaled", QK, _sdpa(None, False, scaled=False),
               "attention without a scale is scaled_dot_product_attention with scale 1",
               lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v),
    _attention("sdpa-causal", masked_fill(QK * s, m, c), _sdpa(None, True),
               "attention with a causal mask (filled with -inf, finfo.min or -1e9) is "
               "causal scaled_dot_product_attention",
               (lambda q, k, v: torch.softmax(_masked((q @ k.transpose(-2, -1)) * 0.5), -1) @ v,
                lambda q, k, v: torch.softmax(_masked_above((q @ k.transpose(-2, -1)) * 0.5), -1)
                @ v,
                lambda q, k, v: torch.softmax(_masked_above((q @ k.transpose(-2, -1)) * 0.5,
                                                            -3.4028234663852886e38), -1) @ v),
               when=(_drops, _causal_mask)),
    _attention("sdpa-causal-additive", QK * s + m, _sdpa(None, True),
               "an additive causal mask (0 on and below the diagonal, finfo.min, -1e9 or "
               "-inf above: transformers' constant mask) is causal "
               "scaled_dot_product_attention, which reads no mask",
               (lambda q, k, v: torch.softmax(_causal_scores(q @ k.transpose(-2, -1) * 0.5),
                                              -1) @ v,
                lambda q, k, v: torch.softmax(_causal_scores(q @ k.transpose(-2, -1) * 0.5,
                                                             float("-inf")), -1) @ v),
               when=(_additive_causal,)),
    _attention("sdpa-causal-additive-unscaled", QK + m, _sdpa(None, True, scaled=False),
               "scores without a scale plus an additive causal mask: causal sdpa with "
               "scale 1",
               lambda q, k, v: torch.softmax(_causal_scores(q @ k.transpose(-2, -1)), -1) @ v,
               when=(_additive_causal,)),
    _attention("sdpa-causal-checked", masked_fill(QK * s, m, c), _masked_attention,
               "scores filled with -inf where a mask that was causal when compiled is set "
               "(nanoGPT's bias buffer, which the caller may change): masked attention, run "
               "as causal sdpa while a check at run time finds the mask causal",
               (lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1) * 0.5)
                                                 .masked_fill(~m, float("-inf")), -1) @ v,
                lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1) * 0.5)
                                                 .masked_fill(m.float() == 0, float("-inf")),
                                                 -1) @ v),
               when=(_neg_inf_fill, boolean(m), _mask_fits, _observed_causal),
               inputs={"m": ((6, 6), "causal")}),
    _attention("sdpa-causal-additive-checked", QK * s + m, _masked_attention,
               "an additive mask that was causal in the example (transformers' mask made "
               "from the sizes of a program whose sizes are symbolic): masked attention, run "
               "as causal sdpa while a check at run time finds the mask causal, as sdpa "
               "under the mask otherwise",
               lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) * 0.5 + m, -1) @ v,
               when=(tensor(m), floating(m), same_dtype(q, m), _mask_fits,
                     _observed_additive_causal),
               inputs={"m": ((6, 6), "additive-causal")}),
    _attention("sdpa-causal-additive-checked-unscaled", QK + m, _masked_attention,
               "scores without a scale plus an additive mask that was causal in the "
               "example: masked attention with scale 1, checked at run time",
               lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) + m, -1) @ v,
               when=(tensor(m), floating(m), same_dtype(q, m), _mask_fits,
                     _observed_additive_causal),
               inputs={"m": ((6, 6), "additive-causal")}),
    _attention("sdpa-masked", masked_fill(QK * s, m, c), _sdpa("dropped", False),
               "scores filled with -inf (or finfo.min, -1e9) where a bool mask is set: sdpa "
               "keeping the rest",
               (lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1) * 0.5)
                                                 .masked_fill(m, float("-inf")), -1) @ v,
                lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1) * 0.5)
                                                 .masked_fill(m, -1e9), -1) @ v),
               when=(_drops, boolean(m), _mask_fits), inputs={"m": ((2, 1, 1, 6), "bool")}),
    _attention("sdpa-masked-unscaled", masked_fill(QK, m, c), _sdpa("dropped", False,
                                                                 scaled=False),
               "scores without a scale (it went on the query before a rotary embedding) "
               "filled where a bool mask is set: sdpa with scale 1",
               lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1))
                                                .masked_fill(m, -3.4028234663852886e38), -1) @ v,
               when=(_drops, boolean(m), _mask_fits), inputs={"m": ((2, 1, 1, 6), "bool")}),
    _attention("sdpa-masked-bias", masked_fill(QK * s + p, m, c), _sdpa("biased", False),
               "a bias (ALiBi) added to the scores, then a bool mask's fill: sdpa with the bias "
               "as its float mask, -inf where dropped",
               (lambda q, k, v, p, m: torch.softmax(((q @ k.transpose(-2, -1)) * 0.5 + p)
                                                    .masked_fill(m, -3.4028234663852886e38), -1)
                @ v,
                lambda q, k, v, p, m: torch.softmax(((q @ k.transpose(-2, -1)) * 0.5 + p)
                                                    .masked_fill(m, float("-inf")), -1) @ v),
               when=(_drops, boolean(m), _mask_fits, tensor(p), floating(p), same_dtype(q, p),
                     _fits("p")),
               inputs={"p": (1, 3, 1, 6), "m": ((2, 1, 1, 6), "bool")}),
    _attention("sdpa-additive", QK * s + m, _sdpa("additive", False),
               "an additive mask (-inf, -1e9, finfo.min where dropped) is sdpa's float mask",
               lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) * 0.5 + m, -1) @ v,
               when=(tensor(m), floating(m), same_dtype(q, m), _mask_fits),
               inputs={"m": (2, 1, 6, 6)}),
    _attention("sdpa-additive-unscaled", QK + m, _sdpa("additive", False, scaled=False),
               "scores without a scale (it went on the query before the heads were split) "
               "plus an additive mask: sdpa with scale 1",
               lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) + m, -1) @ v,
               when=(tensor(m), floating(m), same_dtype(q, m), _mask_fits),
               inputs={"m": (2, 1, 6, 6)}),
    rule("softmax-floored-mask", softmax(clamp(x + m, c, None), d),
         softmax(x + clamp(m, c, None), d),
         when=all_of(_floors_at_lowest, tensor(m), floating(m), same_dtype(x, m)),
         example=lambda x, m: torch.softmax(torch.clamp(x + m, min=-3.4028234663852886e38), -1),
         inputs={"x": (2, 3, 4, 6), "m": (2, 1, 4, 6)},
         description="scores plus a mask floored at the lowest float are, under softmax, the "
                     "scores plus the floored mask: both are the sum wherever it is finite, "
                     "and the lowest float where the mask is -inf (the scores, far below "
                     "its spacing, vanish beside it), so the additive sdpa rule reads it"),
    rule("softmax-fill-then-mask", softmax(masked_fill(x, m, c) + p, d),
         softmax(x + where(m, p + c, p), d),
         when=all_of(_absorbing_fill, boolean(m), tensor(p), floating(p), same_dtype(x, p)),
         example=(lambda x, m, p: torch.softmax(x.masked_fill(m, -3.4028234663852886e38) + p,
                                                -1),
                  lambda x, m, p: torch.softmax(x.masked_fill(m, float("-inf")) + p, -1)),
         inputs={"x": (2, 3, 4, 6), "m": ((1, 1, 4, 6), "bool"), "p": (2, 1, 4, 6)},
         description="scores filled where a bool mask drops them, then an additive mask "
                     "added: the scores plus one mask, the fill added to the additive "
                     "mask where dropped (GPT-Neo's causal fill, then its attention mask)"),
    rule("sdpa-grouped-query", sdpa(q, k, v, m, c, s, False), _grouped_query,
         example=(lambda q, k, v: F.scaled_dot_product_attention(q, _repeat_kv(k), _repeat_kv(v)),
                  lambda q, k, v: F.scaled_dot_product_attention(
                      q, _repeat_kv(k, flat=True), _repeat_kv(v, flat=True), is_causal=True)),
         inputs={"q": (2, 4, 6, 8), "k": (2, 2, 6, 8), "v": (2, 2, 6, 8)},
         description="sdpa on heads repeated for the query's groups (repeat_kv) is sdpa "
                     "with enable_gqa, which never makes the copies"),
    rule("conv-bn", batch_norm(conv2d(x, w, b, st, pa, di, g), mu, sigma2, ga, be, eps),
         fold_bn("conv2d"),
         when=all_of(not_none(ga), not_none(be)),
         example=lambda x, w, c, m, v, ga, be: F.batch_norm(F.conv2d(x, w, c, padding=1), m, v,
                                                            ga, be, eps=1e-5),
         inputs={"x": (2, 3, 6, 6), "w": (4, 3, 3, 3), "c": (4,), "m": (4,),
                 "v": ((4,), "positive"), "ga": (4,), "be": (4,)},
         description="an eval batch norm after a convolution folds into its weight and bias"),
]
