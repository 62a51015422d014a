"""Operator merging, TENSAT's multi-pattern rules, and the split algebra it needs.

Two matmuls, linears or convolutions that share an input become one op on concatenated
weights followed by a split (TENSAT's multi-pattern rules, converted from TASO's generated
substitutions: the source of its speedups). The weight concatenation is a parameter-only
subexpression, computed once when the module is emitted. So that n ops on one input give
each merged subset once (not once per order), the second weight must be a single weight,
later than every weight concatenated into the first: q, k, v give qk, qv, kv and qkv.

A merged op is used by each of its parts: DAG-aware extraction (the default for cost models
with numeric costs, and ``method="ilp"``) pays for it once and chooses it where the cost
model finds one larger op cheaper than the parts; greedy extraction's tree cost
(``method="greedy"``) pays for it once per part, so it keeps the separate ops.

These rules add few e-nodes, so the ``layout`` family (in ``'all'``) carries them; TASO's
other axioms are the opt-in ``tensat`` family (:mod:`egraph.rules.tensat`).

>>> [r.name for r in MERGING][:3]
['split-cat', 'cat-split', 'split-split']
"""

from __future__ import annotations

import weakref

from egraph.cache import current_cache
from egraph.ops import cat, conv2d, getitem, linear, split
from egraph.rules.define import IMG, KERNEL, SAME, F, LibraryRule, M, add_literal, rule, torch
from egraph.rules.guards import (
    Guard,
    all_of,
    dim_of,
    distinct,
    is_none,
    literal_is,
    named,
    rank_is,
    scalar,
    shape_of,
    value_of,
)
from egraph.term import vars

__all__ = ["CONV", "GROUPS_1", "MERGING", "conv", "conv_args"]

(a, b, c, d, d1, i, j, k, s, w, x, y, w1, w2, b1, b2, st, pa, pb, di, g) = vars(
    "a b c d d1 i j k s w x y w1 w2 b1 b2 st pa pb di g")

CONV = (st, pa, di, g)
"""A convolution's stride, padding, dilation and groups, as pattern variables."""
GROUPS_1 = literal_is(g, 1)


def conv(inp, weight, bias):
    """The pattern ``conv2d(inp, weight, bias, *CONV)``.

    >>> str(conv(x, w, b))
    '(conv2d ?x ?w ?b ?st ?pa ?di ?g)'
    """
    return conv2d(inp, weight, bias, *CONV)


def conv_args(subst) -> list[int]:
    """The classes a match bound to :data:`CONV`, in order (a right side's conv2d
    arguments after the input, weight and bias)."""
    return [subst["st"], subst["pa"], subst["di"], subst["g"]]


def _same_image(p, q) -> Guard:
    """``?p`` and ``?q`` are batches of equally shaped images (any batch sizes)."""
    @named(f"{p.name}, {q.name} equal but for the batch")
    def guard(egraph, subst) -> bool:
        sp, sq = shape_of(egraph, subst[p.name]), shape_of(egraph, subst[q.name])
        return sp is not None and sq is not None and sp[1:] == sq[1:]
    return guard


# -- the concat and split algebra -------------------------------------------------------


def _split_of_cat(egraph, subst):
    """``split(cat(d, x0, x1, ...), sizes, d)[k]`` is ``xk`` when the sizes are the
    operands' sizes along d (a cat of any number of operands)."""
    shape = shape_of(egraph, subst["x"])
    k = value_of(egraph, subst["k"])
    sizes = value_of(egraph, subst["s"])
    if shape is None or type(k) is not int:
        return None
    dim = dim_of(egraph, subst["d"], len(shape))
    for node in egraph.nodes(subst["x"]):
        if node.op != "cat" or dim_of(egraph, node.children[0], len(shape)) != dim:
            continue
        parts = node.children[1:]
        lengths = [(shape_of(egraph, p) or ())[dim:dim + 1] for p in parts]
        if any(len(n) != 1 for n in lengths):
            continue
        lengths = [n[0] for n in lengths]
        if type(sizes) is int:
            want = [sizes] * (shape[dim] // sizes) + ([shape[dim] % sizes] if shape[dim] % sizes
                                                      else [])
        else:
            want = list(sizes) if isinstance(sizes, tuple) else None
        if lengths == want and 0 <= k < len(parts):
            return parts[k]
    return None


def _cat_of_splits(egraph, subst):
    """``cat(d, split(x, s, d)[0], split(x, s, d)[1])`` is x when s has two parts."""
    sizes = value_of(egraph, subst["s"])
    shape = shape_of(egraph, subst["x"])
    if shape is None or not isinstance(sizes, tuple) or len(sizes) != 2:
        return None
    if dim_of(egraph, subst["d"], len(shape)) != dim_of(egraph, subst["d1"], len(shape)):
        return None
    return subst["x"]


def _flat_split(egraph, subst):
    """``split(split(x, s, d)[i], t, d)[j]`` is piece ``i + j`` of ``x`` split by ``s`` with
    ``s[i]`` refined into ``t``; every other piece of the outer split is a piece of that
    one split too. Merging three projections pairwise nests two splits; this makes them
    one (a call and a view fewer per merged op)."""
    shape = shape_of(egraph, subst["x"])
    sizes, inner = value_of(egraph, subst["s"]), value_of(egraph, subst["k"])
    i, j = value_of(egraph, subst["i"]), value_of(egraph, subst["j"])
    if (shape is None or not isinstance(sizes, tuple) or not isinstance(inner, tuple)
            or type(i) is not int or type(j) is not int
            or not 0 <= i < len(sizes) or not 0 <= j < len(inner)
            or sum(inner) != sizes[i]):
        return None
    dim = dim_of(egraph, subst["d"], len(shape))
    if dim is None or dim != dim_of(egraph, subst["d1"], len(shape)):
        return None
    flat = egraph.add_node("split", [subst["x"], add_literal(egraph, sizes[:i] + inner
                                                      + sizes[i + 1:]), subst["d"]])
    outer = egraph.add_node("split", [subst["x"], subst["s"], subst["d"]])
    for k in range(len(sizes)):
        if k != i:
            egraph.union(egraph.add_node("getitem", [outer, add_literal(egraph, k)]),
                         egraph.add_node("getitem", [flat, add_literal(
                             egraph, k if k < i else k + len(inner) - 1)]), "split-split")
    return egraph.add_node("getitem", [flat, add_literal(egraph, i + j)])


# -- operator merging --------------------------------------------------------------------


def _weights_of(egraph, cid) -> list[int] | None:
    """The single weights concatenated into class ``cid`` (itself if it holds no cat)."""
    for node in egraph.nodes(cid):
        if node.op == "cat":
            out = []
            for part in node.children[1:]:
                inner = _weights_of(egraph, part)
                if inner is None:
                    return None
                out += inner
            return out
    return [egraph.find(cid)]


def _merge_order(op: str, first: str, second: str, shared: str, shared_at: int = 0) -> Guard:
    """``?second`` is a single operand and ``?first`` the run of single operands just before
    it, in the order of their classes among the ``op`` calls with ``?shared`` at
    ``shared_at`` (0 or 1; the operand merged is the other): each contiguous run of those
    calls is merged once. Any subset, as ``?first`` could be before, merged 2^k - k - 1 ways
    for k calls; a run, k (k - 1) / 2 ways (a TransformerConv's four linears of one input:
    11 -> 6; LoRA's adapters beside their base weights ran away)."""
    merged_at = 1 - shared_at
    store: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def order_on(egraph, common: int) -> list[int]:
        runs = current_cache(store, egraph)  # per class shared
        if common not in runs:
            singles = set()
            for parent in egraph.parents(common):
                for node in egraph.nodes(parent):
                    if (node.op == op and len(node.children) > 1
                            and egraph.find(node.children[shared_at]) == common):
                        found = _weights_of(egraph, node.children[merged_at])
                        if found is not None and len(found) == 1:
                            singles.add(found[0])
            runs[common] = sorted(singles)
        return runs[common]

    @named(f"{first} the run of {op}s on {shared} just before {second}")
    def guard(egraph, subst) -> bool:
        later = _weights_of(egraph, subst[second])
        earlier = _weights_of(egraph, subst[first])
        if later is None or earlier is None or len(later) != 1 or max(earlier) >= later[0]:
            return False
        order = order_on(egraph, egraph.find(subst[shared]))
        end = order.index(later[0]) if later[0] in order else -1
        return end >= len(earlier) and order[end - len(earlier):end] == earlier
    return guard


def _not_linear(*names: str) -> Guard:
    """None of the classes holds a ``linear``: those merge by ``linear-merge``, and merging
    the matmuls of their unfused forms too would only repeat it."""
    @named(f"{', '.join(names)} not linears")
    def guard(egraph, subst) -> bool:
        return not any(n.op == "linear" for v in names for n in egraph.nodes(subst[v]))
    return guard


def _split_pair(egraph, merged: int, sizes: tuple[int, int], dim: int, second: str, subst):
    """Union ``?second`` with the second part of ``merged``; return the first part."""
    parts = egraph.add_node("split", [merged, add_literal(egraph, sizes), add_literal(egraph, dim)])
    egraph.union(subst[second], egraph.add_node("getitem", [parts, add_literal(egraph, 1)]),
                 "merge")
    return egraph.add_node("getitem", [parts, add_literal(egraph, 0)])


def _widths(egraph, subst, dim_of) -> tuple[int, int, int] | None:
    su, sv = shape_of(egraph, subst["u"]), shape_of(egraph, subst["v"])
    if su is None or sv is None or len(su) != len(sv):
        return None
    dim = dim_of(len(su))
    return dim, su[dim], sv[dim]


def _merge_matmul_right(egraph, subst):
    """x @ a, x @ c -> split(x @ cat(1, a, c), last dim) (a, c matrices)."""
    found = _widths(egraph, subst, lambda r: r - 1)
    if found is None:
        return None
    dim, m, n = found
    weights = egraph.add_node("cat", [add_literal(egraph, 1), subst["a"], subst["c"]])
    merged = egraph.add_node("matmul", [subst["x"], weights])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_matmul_left(egraph, subst):
    """a @ w, c @ w -> split(cat(0, a, c) @ w, rows) (matrices)."""
    found = _widths(egraph, subst, lambda r: r - 2)
    if found is None:
        return None
    dim, m, n = found
    rows = egraph.add_node("cat", [add_literal(egraph, 0), subst["a"], subst["c"]])
    merged = egraph.add_node("matmul", [rows, subst["w"]])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_linear(egraph, subst):
    """linear(x, w1, b1), linear(x, w2, b2) -> split(linear(x, [w1; w2], [b1; b2]))."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    found = _widths(egraph, subst, lambda r: r - 1)
    if none1 != none2 or found is None:
        return None
    dim, m, n = found
    weights = egraph.add_node("cat", [add_literal(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [add_literal(egraph, 0), subst["b1"], subst["b2"]])
    merged = egraph.add_node("linear", [subst["x"], weights, bias])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_conv_weights(egraph, subst):
    """conv(x, w1), conv(x, w2) -> split(conv(x, [w1; w2]), channels)."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    sw1, sw2 = shape_of(egraph, subst["w1"]), shape_of(egraph, subst["w2"])
    found = _widths(egraph, subst, lambda r: 1)
    if none1 != none2 or found is None or sw1 is None or sw1[1:] != (sw2 or ())[1:]:
        return None
    dim, m, n = found
    weights = egraph.add_node("cat", [add_literal(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [add_literal(egraph, 0), subst["b1"], subst["b2"]])
    merged = egraph.add_node("conv2d", [subst["x"], weights, bias, *conv_args(subst)])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_conv_inputs(egraph, subst):
    """conv(x, w), conv(y, w) -> split(conv(cat(0, x, y), w), batch)."""
    found = _widths(egraph, subst, lambda r: 0)
    if found is None:
        return None
    dim, m, n = found
    batch = egraph.add_node("cat", [add_literal(egraph, 0), subst["x"], subst["y"]])
    merged = egraph.add_node("conv2d", [batch, subst["w"], subst["b1"], *conv_args(subst)])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _pair(value) -> tuple[int, int] | None:
    """A conv attribute (``1``, ``(1, 1)``, ``[1, 1]``) as a pair of ints; None for the
    string paddings (``"same"``) and anything else."""
    if type(value) is int:
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            type(v) is int for v in value):
        return tuple(value)
    return None


def _enlarge(egraph, subst):
    """conv(x, w1, p1) beside conv(x, w2, p2), w1's kernel smaller: w1 padded with zeros
    to w2's size is the same conv at w2's padding (TASO's ``enlarge``), which then merges
    with the other by ``conv-merge`` (an inception block's 1x1 and 3x3 branches)."""
    k1, k2 = shape_of(egraph, subst["w1"]), shape_of(egraph, subst["w2"])
    pads = [_pair(value_of(egraph, subst[v])) for v in ("pa", "pb", "di")]
    if k1 is None or k2 is None or len(k1) != 4 or len(k2) != 4 or None in pads:
        return None
    (p1h, p1w), (p2h, p2w), (dh, dw) = pads
    grow = (k2[2] - k1[2], k2[3] - k1[3])
    if min(grow) < 0 or max(grow) == 0 or grow[0] % 2 or grow[1] % 2:
        return None
    gh, gw = grow[0] // 2, grow[1] // 2
    if (p1h + gh * dh, p1w + gw * dw) != (p2h, p2w):
        return None  # the enlarged conv would not line up with the other
    weight = egraph.add_node("pad", [subst["w1"], add_literal(egraph, (gw, gw, gh, gh)),
                                     add_literal(egraph, 0.0)])
    return egraph.add_node("conv2d", [subst["x"], weight, subst["b1"], subst["st"],
                                      subst["pb"], subst["di"], subst["g"]])


MERGING: list[LibraryRule] = [
    # -- split and concatenation (split-definition-0, -1 for any number of parts)
    rule("split-cat", getitem(split(x, s, d), k), _split_of_cat,
         example=lambda x, y: torch.split(torch.cat([x, y], 1), [8, 8], 1)[1],
         inputs=SAME, description="split(cat(x0, x1, ...))[k] = xk"),
    rule("cat-split", cat(d, getitem(split(x, s, d1), 0), getitem(split(x, s, d1), 1)),
         _cat_of_splits,
         example=lambda x: torch.cat([torch.split(x, [3, 5], 1)[0],
                                      torch.split(x, [3, 5], 1)[1]], 1), inputs={"x": M},
         description="cat(split(x)) = x"),
    rule("split-split", getitem(split(getitem(split(x, s, d), i), k, d1), j), _flat_split,
         example=lambda x: torch.split(torch.split(x, [5, 3], 1)[0], [2, 3], 1)[1],
         inputs={"x": M}, description="a split of a split's piece is one split"),
    # -- operator merging (TENSAT's multi-pattern rules)
    rule("matmul-merge", [("u", x @ a), ("v", x @ c)], _merge_matmul_right,
         when=all_of(distinct(a, c), rank_is(a, 2), rank_is(c, 2), _not_linear("u", "v"),
                     _merge_order("matmul", "a", "c", "x")),
         example=lambda x, a, c: (x @ a) * (x @ c),
         inputs={"x": (4, 8), "a": (8, 6), "c": (8, 6)},
         description="two matmuls of one input are one on concatenated weights, split"),
    rule("matmul-merge-rows", [("u", a @ w), ("v", c @ w)], _merge_matmul_left,
         when=all_of(distinct(a, c), rank_is(a, 2), rank_is(c, 2), rank_is(w, 2),
                     _merge_order("matmul", "a", "c", "w", shared_at=1)),
         example=lambda a, c, w: (a @ w).sum() + (c @ w).sum(),
         inputs={"a": (4, 8), "c": (3, 8), "w": (8, 6)},
         description="two matmuls by one matrix are one on concatenated rows, split"),
    rule("linear-merge", [("u", linear(x, w1, b1)), ("v", linear(x, w2, b2))], _merge_linear,
         when=all_of(distinct(w1, w2), _merge_order("linear", "w1", "w2", "x")),
         example=(lambda x, w1, b1, w2, b2: F.linear(x, w1, b1) * F.linear(x, w2, b2),
                  lambda x, w1, b1, w2, b2: F.silu(F.linear(x, w1)) * F.linear(x, w2)),
         inputs={"x": (2, 4, 8), "w1": (6, 8), "b1": (6,), "w2": (6, 8), "b2": (6,)},
         description="linears of one input (QKV, gate and up) are one linear, split"),
    rule("linear-low-rank", linear(x, w, b) + linear(linear(x, a, None), c, None) * s,
         linear(x, w + (c @ a) * s, b),
         when=all_of(rank_is(w, 2), rank_is(a, 2), rank_is(c, 2), scalar(s)),
         example=lambda x, w, b, a, c: F.linear(x, w, b) + F.linear(F.linear(x, a), c) * 0.5,
         inputs={"x": (2, 4, 8), "w": (6, 8), "b": (6,), "a": (2, 8), "c": (6, 2)},
         description="a low-rank adapter beside a linear (LoRA's B(A x) * scale) is the "
                     "linear of the weight plus the adapter's product: made once of "
                     "weights, it costs nothing per call"),
    rule("conv-merge", [("u", conv(x, w1, b1)), ("v", conv(x, w2, b2))],
         _merge_conv_weights, when=all_of(distinct(w1, w2), GROUPS_1,
                                                _merge_order("conv2d", "w1", "w2", "x")),
         example=lambda x, w1, w2: F.conv2d(x, w1, padding=1) * F.conv2d(x, w2, padding=1),
         inputs={"x": IMG, "w1": KERNEL, "w2": KERNEL},
         description="convs of one input are one conv with stacked kernels, split"),
    rule("conv-enlarge", [("u", conv2d(x, w1, b1, st, pa, di, g)),
                          ("v", conv2d(x, w2, b2, st, pb, di, g))], _enlarge,
         when=distinct(w1, w2),
         example=lambda x, w1, w2: F.conv2d(x, w1) * F.conv2d(x, w2, padding=1),
         inputs={"x": IMG, "w1": (5, 4, 1, 1), "w2": KERNEL},
         description="a smaller kernel beside a larger one on one input is the larger "
                     "conv of the kernel padded with zeros"),
    rule("conv-merge-batch", [("u", conv(x, w, b1)), ("v", conv(y, w, b1))],
         _merge_conv_inputs, when=all_of(distinct(x, y), _same_image(x, y),
                                         _merge_order("conv2d", "x", "y", "w", shared_at=1)),
         example=lambda x, y, w: F.conv2d(x, w, padding=1).sum() + F.conv2d(y, w, padding=1).sum(),
         inputs={"x": IMG, "y": (3, 4, 6, 6), "w": KERNEL},
         description="convs with one kernel are one conv over the concatenated batch, split"),
]
"""Operator merging and the split algebra it needs: cheap enough for every pipeline, so the
``layout`` family (in ``'all'``) carries them; :data:`RULES` is the opt-in ``tensat``
family."""
