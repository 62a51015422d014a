"""TENSAT's graph substitutions: TASO's verified tensor axioms and its operator merging.

The source is TENSAT (Yang et al., "Equality Saturation for Tensor Graph Superoptimization",
MLSys 2021; github.com/uwplse/tensat): the single-pattern axioms of ``src/rewrites.rs``
(TASO's verified identities, each with its inverse) and the multi-pattern rules of
``multi_cleaned.txt`` (converted from TASO's generated substitutions), written in our
vocabulary. TENSAT's ``ewadd``/``ewmul`` are ``add``/``mul`` on same-shape tensors (our ops
broadcast, so the rules that distribute over them ask for equal shapes), ``smul`` is ``mul``
by a scalar literal, ``concat a x y`` is ``cat(a, x, y)``, ``split_0``/``split_1`` are
``getitem(split(x, sizes, dim), 0 or 1)``, and ``transpose`` swaps any two dims (TASO's
transposes 2-D matrices).

What the algebra and layout families state already is not repeated: the commutative and
associative laws of add and mul, distributivity over a product (``distribute``,
``factor``), ``smul`` associativity and distributivity (``assoc-mul``, ``distribute``),
``transpose-is-its-own-inverse``, ``matmul-is-associative`` and ``matmul-and-transpose``
(``transpose-matmul``), ``ewmul-identity`` (``one-mul``). TASO's axioms over ops we do not
have are not written: ``conv2d`` with a fused activation (ours is ``relu(conv2d(...))``)
and the identity and pooling kernels (``Iconv``, ``Imatmul``, ``Cpool``), constants no
program holds. ``enlarge`` (a kernel padded with zeros to a larger one's size) is written
as TENSAT uses it, beside a conv with the larger kernel on the same input
(``conv-enlarge``), so that the two merge. TASO's pooling axioms hold for both pooling
ops over the batch and the channels (its three are instances).

Operator merging (TENSAT's multi-pattern rules, the source of its speedups): two matmuls,
linears or convolutions that share an input become one op on concatenated weights
followed by a split. The weight concatenation is a parameter-only subexpression, computed
once when the module is emitted. So that n ops on one input give each merged subset
once (not once per order), the second weight must be a single weight, later than every
weight concatenated into the first: q, k, v give qk, qv, kv and qkv.

The family is split by what it costs. Merging and the split algebra (:data:`MERGING`) add
few e-nodes and are loaded by ``'all'`` (with the ``layout`` family); the other axioms
(:data:`RULES`, the opt-in ``tensat`` family) let a search reach TENSAT's rewrites but
distribute every matmul and concatenation they meet: on the bundled demo (one thread) they
take saturation from 0.67 s and 2105 e-nodes to 1.65 s and 3410, and find nothing the
extraction keeps that ``'all'`` misses, so they are loaded by name,
``load_rules("all", "tensat")``. Saturating in phases (algebra and layout, then these, then
the rest) was slower still (4.6 s, 4948 e-nodes).

A merged op is used by each of its parts: DAG-aware extraction (the default for cost models
with numeric costs, and ``method="ilp"``) pays for it once and chooses it where the cost
model finds one larger op cheaper than the parts; greedy extraction's tree cost
(``method="greedy"``) pays for it once per part, so it keeps the separate ops.

>>> [r.name for r in MERGING][:3]
['split-cat', 'cat-split', 'split-split']
>>> "cat-relu" in [r.name for r in RULES]
True
"""

from __future__ import annotations

import weakref

from egraph.egraph import current_cache
from egraph.ops import (
    avg_pool2d,
    cat,
    conv2d,
    getitem,
    linear,
    matmul,
    max_pool2d,
    relu,
    split,
    transpose,
)
from egraph.rules.define import F, LibraryRule, rule, torch
from egraph.rules.guards import (
    Guard,
    all_of,
    distinct,
    is_none,
    named,
    rank_is,
    same_shape,
    scalar,
    shape_of,
    value_of,
)
from egraph.term import literal, vars

__all__ = ["MERGING", "RULES"]

(a, b, c, d, d0, d1, i, j, k, s, w, x, y, z, w1, w2, b1, b2, st, pa, pb, di, g) = vars(
    "a b c d d0 d1 i j k s w x y z w1 w2 b1 b2 st pa pb di g")


# -- what the guards and right sides read -------------------------------------------------


def _dim(egraph, cid, rank: int) -> int | None:
    """A dim literal as a non-negative int (cat's dim is kept as written)."""
    value = value_of(egraph, cid)
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if type(value) is not int or not -rank <= value < rank:
        return None
    return value % rank


def _scalar(var) -> Guard:
    @named(f"{var.name} is a scalar literal")
    def guard(egraph, subst) -> bool:
        value = value_of(egraph, subst[var.name])
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return guard


def _cat_dim(var, where: str) -> Guard:
    """The cat dim ``var`` is the output's ``where`` dim (``last`` or ``rows``, the one
    before it) of ``?x``'s rank, for the matmul rules."""
    @named(f"{var.name} is the {where} dim")
    def guard(egraph, subst) -> bool:
        shape = shape_of(egraph, subst["x"])
        if shape is None or len(shape) < 2:
            return False
        want = len(shape) - 1 if where == "last" else len(shape) - 2
        return _dim(egraph, subst[var.name], len(shape)) == want
    return guard


def _joinable(p, q, dim_var) -> Guard:
    """``?p`` and ``?q`` can be concatenated along ``dim_var`` (equal shapes elsewhere)."""
    @named(f"{p.name}, {q.name} join along {dim_var.name}")
    def guard(egraph, subst) -> bool:
        sp, sq = shape_of(egraph, subst[p.name]), shape_of(egraph, subst[q.name])
        if sp is None or sq is None or len(sp) != len(sq):
            return False
        dim = _dim(egraph, subst[dim_var.name], len(sp))
        return dim is not None and all(
            m == n for n_, (m, n) in enumerate(zip(sp, sq)) if n_ != dim)
    return guard


def _same_image(p, q) -> Guard:
    """``?p`` and ``?q`` are batches of equally shaped images (any batch sizes)."""
    @named(f"{p.name}, {q.name} equal but for the batch")
    def guard(egraph, subst) -> bool:
        sp, sq = shape_of(egraph, subst[p.name]), shape_of(egraph, subst[q.name])
        return sp is not None and sq is not None and sp[1:] == sq[1:]
    return guard


def _is_literal(var, value) -> Guard:
    @named(f"{var.name} == {value!r}")
    def guard(egraph, subst) -> bool:
        return value_of(egraph, subst[var.name]) == value
    return guard


def _no_bias(var) -> Guard:
    @named(f"{var.name} is None")
    def guard(egraph, subst) -> bool:
        return is_none(egraph, subst[var.name])
    return guard


def _lit(egraph, value) -> int:
    return egraph.add_node(literal(value))


# -- the concat and split algebra -------------------------------------------------------


def _split_of_cat(egraph, subst):
    """``split(cat(d, x0, x1, ...), sizes, d)[k]`` is ``xk`` when the sizes are the
    operands' sizes along d (a cat of any number of operands)."""
    shape = shape_of(egraph, subst["x"])
    k = value_of(egraph, subst["k"])
    sizes = value_of(egraph, subst["s"])
    if shape is None or type(k) is not int:
        return None
    dim = _dim(egraph, subst["d"], len(shape))
    for node in egraph.nodes(subst["x"]):
        if node.op != "cat" or _dim(egraph, node.children[0], len(shape)) != dim:
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
    if _dim(egraph, subst["d"], len(shape)) != _dim(egraph, subst["d1"], len(shape)):
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
    dim = _dim(egraph, subst["d"], len(shape))
    if dim is None or dim != _dim(egraph, subst["d1"], len(shape)):
        return None
    flat = egraph.add_node("split", [subst["x"], _lit(egraph, sizes[:i] + inner
                                                      + sizes[i + 1:]), subst["d"]])
    outer = egraph.add_node("split", [subst["x"], subst["s"], subst["d"]])
    for k in range(len(sizes)):
        if k != i:
            egraph.union(egraph.add_node("getitem", [outer, _lit(egraph, k)]),
                         egraph.add_node("getitem", [flat, _lit(
                             egraph, k if k < i else k + len(inner) - 1)]), "split-split")
    return egraph.add_node("getitem", [flat, _lit(egraph, i + j)])


def _swap_dim(dim: int, p: int, q: int) -> int:
    return q if dim == p else p if dim == q else dim


def _cat_through_transpose(egraph, subst):
    """``cat(d, x^T, y^T) = (cat(d', x, y))^T``, d' the dim d comes from."""
    shape = shape_of(egraph, subst["x"])
    p, q = value_of(egraph, subst["i"]), value_of(egraph, subst["j"])
    if shape is None or type(p) is not int or type(q) is not int:
        return None
    dim = _dim(egraph, subst["d"], len(shape))
    if dim is None:
        return None
    joined = egraph.add_node("cat", [_lit(egraph, _swap_dim(dim, p, q)), subst["x"],
                                     subst["y"]])
    return egraph.add_node("transpose", [joined, subst["i"], subst["j"]])


def _transpose_into_cat(egraph, subst):
    shape = shape_of(egraph, subst["x"])
    p, q = value_of(egraph, subst["i"]), value_of(egraph, subst["j"])
    if shape is None or type(p) is not int or type(q) is not int:
        return None
    dim = _dim(egraph, subst["d"], len(shape))
    if dim is None:
        return None
    parts = [egraph.add_node("transpose", [subst[n], subst["i"], subst["j"]]) for n in "xy"]
    return egraph.add_node("cat", [_lit(egraph, _swap_dim(dim, p, q)), *parts])


@named("d0 != d1, x and z (y and w) equally wide along d1")
def _geometry(egraph, subst) -> bool:
    shapes = [shape_of(egraph, subst[n]) for n in "xyzw"]
    if any(sh is None for sh in shapes) or len({len(sh) for sh in shapes}) != 1:
        return False
    rank = len(shapes[0])
    outer, inner = _dim(egraph, subst["d0"], rank), _dim(egraph, subst["d1"], rank)
    sx, sy, sz, sw = shapes
    return (outer is not None and inner is not None and outer != inner
            and sx[inner] == sz[inner] and sy[inner] == sw[inner])


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
    parts = egraph.add_node("split", [merged, _lit(egraph, sizes), _lit(egraph, dim)])
    egraph.union(subst[second], egraph.add_node("getitem", [parts, _lit(egraph, 1)]),
                 "merge")
    return egraph.add_node("getitem", [parts, _lit(egraph, 0)])


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
    weights = egraph.add_node("cat", [_lit(egraph, 1), subst["a"], subst["c"]])
    merged = egraph.add_node("matmul", [subst["x"], weights])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_matmul_left(egraph, subst):
    """a @ w, c @ w -> split(cat(0, a, c) @ w, rows) (matrices)."""
    found = _widths(egraph, subst, lambda r: r - 2)
    if found is None:
        return None
    dim, m, n = found
    rows = egraph.add_node("cat", [_lit(egraph, 0), subst["a"], subst["c"]])
    merged = egraph.add_node("matmul", [rows, subst["w"]])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_linear(egraph, subst):
    """linear(x, w1, b1), linear(x, w2, b2) -> split(linear(x, [w1; w2], [b1; b2]))."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    found = _widths(egraph, subst, lambda r: r - 1)
    if none1 != none2 or found is None:
        return None
    dim, m, n = found
    weights = egraph.add_node("cat", [_lit(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [_lit(egraph, 0), subst["b1"], subst["b2"]])
    merged = egraph.add_node("linear", [subst["x"], weights, bias])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _conv_args(subst) -> list[int]:
    return [subst["st"], subst["pa"], subst["di"], subst["g"]]


def _merge_conv_weights(egraph, subst):
    """conv(x, w1), conv(x, w2) -> split(conv(x, [w1; w2]), channels)."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    sw1, sw2 = shape_of(egraph, subst["w1"]), shape_of(egraph, subst["w2"])
    found = _widths(egraph, subst, lambda r: 1)
    if none1 != none2 or found is None or sw1 is None or sw1[1:] != (sw2 or ())[1:]:
        return None
    dim, m, n = found
    weights = egraph.add_node("cat", [_lit(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [_lit(egraph, 0), subst["b1"], subst["b2"]])
    merged = egraph.add_node("conv2d", [subst["x"], weights, bias, *_conv_args(subst)])
    return _split_pair(egraph, merged, (m, n), dim, "v", subst)


def _merge_conv_inputs(egraph, subst):
    """conv(x, w), conv(y, w) -> split(conv(cat(0, x, y), w), batch)."""
    found = _widths(egraph, subst, lambda r: 0)
    if found is None:
        return None
    dim, m, n = found
    batch = egraph.add_node("cat", [_lit(egraph, 0), subst["x"], subst["y"]])
    merged = egraph.add_node("conv2d", [batch, subst["w"], subst["b1"], *_conv_args(subst)])
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
    weight = egraph.add_node("pad", [subst["w1"], _lit(egraph, (gw, gw, gh, gh)),
                                     _lit(egraph, 0.0)])
    return egraph.add_node("conv2d", [subst["x"], weight, subst["b1"], subst["st"],
                                      subst["pb"], subst["di"], subst["g"]])


def _conv_weight_cat(egraph, subst):
    """cat(1, conv(x, w1, b1), conv(x, w2, b2)) = conv(x, cat(0, w1, w2), cat(0, b1, b2))."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    if none1 != none2:
        return None
    weights = egraph.add_node("cat", [_lit(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [_lit(egraph, 0), subst["b1"], subst["b2"]])
    return egraph.add_node("conv2d", [subst["x"], weights, bias, *_conv_args(subst)])


# -- the rules ----------------------------------------------------------------------------

M = (4, 8)
SAME = {"x": M, "y": M}
MATS = {"x": (4, 8), "y": (8, 6), "z": (8, 6)}
IMG = (2, 4, 6, 6)
KERNEL = (5, 4, 3, 3)
CONV = (st, pa, di, g)
GROUPS_1 = _is_literal(g, 1)
LEFT = _cat_dim(d, "last")


def _conv(inp, weight, bias):
    return conv2d(inp, weight, bias, *CONV)


MAX_POOL = vars("pk ps pp pd pc")
AVG_POOL = vars("ak as_ ap ac ai av")


def _max_pool(inp):
    return max_pool2d(inp, *MAX_POOL)


def _avg_pool(inp):
    return avg_pool2d(inp, *AVG_POOL)


def _pooled_dim(var) -> Guard:
    """The cat dim ``var`` is a batch or channel dim of ``?x`` (not one that pools): pooling
    works per sample and per channel."""
    @named(f"{var.name} is a batch or channel dim")
    def guard(egraph, subst) -> bool:
        shape = shape_of(egraph, subst["x"])
        if shape is None or len(shape) not in (3, 4):
            return False
        dim = _dim(egraph, subst[var.name], len(shape))
        return dim is not None and dim < len(shape) - 2
    return guard


def _pool_rules(name: str, pool, fn) -> list[LibraryRule]:
    """TENSAT's concatenation-and-pooling axioms for one pooling op, both ways."""
    return [
        rule(f"cat-{name}", cat(d, pool(x), pool(y)), pool(cat(d, x, y)),
             when=all_of(_pooled_dim(d), _joinable(x, y, d)),
             example=(lambda x, y: torch.cat([fn(x), fn(y)], 1),
                      lambda x, y: torch.cat([fn(x), fn(y)], 0)),
             inputs={"x": IMG, "y": IMG},
             description=f"cat over batch or channels of {name}s = {name} of the cat"),
        rule(f"{name}-cat", pool(cat(d, x, y)), cat(d, pool(x), pool(y)),
             when=_pooled_dim(d),
             example=(lambda x, y: fn(torch.cat([x, y], 1)),
                      lambda x, y: fn(torch.cat([x, y], 0))),
             inputs={"x": IMG, "y": IMG},
             description=f"{name} of a cat over batch or channels = cat of the {name}s"),
    ]


RULES: list[LibraryRule] = [
    # -- transpose over elementwise ops and scalar multiplication (operator-commutativity-1..3)
    rule("transpose-add", transpose(x + y, i, j), transpose(x, i, j) + transpose(y, i, j),
         when=same_shape(x, y), example=lambda x, y: (x + y).transpose(0, 1), inputs=SAME,
         description="(x + y)^T = x^T + y^T"),
    rule("add-transpose", transpose(x, i, j) + transpose(y, i, j), transpose(x + y, i, j),
         when=same_shape(x, y), example=lambda x, y: x.transpose(0, 1) + y.transpose(0, 1),
         inputs=SAME, description="x^T + y^T = (x + y)^T"),
    rule("transpose-mul", transpose(x * y, i, j), transpose(x, i, j) * transpose(y, i, j),
         when=same_shape(x, y), example=lambda x, y: (x * y).transpose(0, 1), inputs=SAME,
         description="(x * y)^T = x^T * y^T"),
    rule("mul-transpose", transpose(x, i, j) * transpose(y, i, j), transpose(x * y, i, j),
         when=same_shape(x, y), example=lambda x, y: x.transpose(0, 1) * y.transpose(0, 1),
         inputs=SAME, description="x^T * y^T = (x * y)^T"),
    rule("transpose-scale", transpose(x * s, i, j), transpose(x, i, j) * s, when=_scalar(s),
         example=lambda x: (x * 3.0).transpose(0, 1), inputs={"x": M},
         description="(s x)^T = s x^T"),
    rule("scale-transpose", transpose(x, i, j) * s, transpose(x * s, i, j), when=_scalar(s),
         example=lambda x: x.transpose(0, 1) * 3.0, inputs={"x": M},
         description="s x^T = (s x)^T"),
    # -- relu and transpose (conv-with-2-applies-relu in TENSAT's naming)
    rule("relu-transpose", relu(transpose(x, i, j)), transpose(relu(x), i, j),
         example=lambda x: torch.relu(x.transpose(0, 1)), inputs={"x": M},
         description="relu(x^T) = relu(x)^T"),
    rule("transpose-relu", transpose(relu(x), i, j), relu(transpose(x, i, j)),
         example=lambda x: torch.relu(x).transpose(0, 1), inputs={"x": M},
         description="relu(x)^T = relu(x^T)"),
    # -- matmul is linear (matmul-is-linear-0, -1) and its transpose, reversed
    rule("matmul-scale-in", (x @ y) * s, x @ (y * s), when=_scalar(s),
         example=lambda x, y: (x @ y) * 3.0, inputs={"x": (4, 8), "y": (8, 6)},
         description="s (x y) = x (s y)"),
    rule("matmul-distribute", x @ (y + z), x @ y + x @ z, when=same_shape(y, z),
         example=lambda x, y, z: x @ (y + z), inputs=MATS, description="x (y + z) = xy + xz"),
    rule("matmul-factor", x @ y + x @ z, x @ (y + z), when=same_shape(y, z),
         example=lambda x, y, z: x @ y + x @ z, inputs=MATS, description="xy + xz = x (y + z)"),
    rule("matmul-distribute-left", (x + y) @ z, x @ z + y @ z, when=same_shape(x, y),
         example=lambda x, y, z: (x + y) @ z, inputs={"x": (4, 8), "y": (4, 8), "z": (8, 6)},
         description="(x + y) z = xz + yz"),
    rule("matmul-factor-left", x @ z + y @ z, (x + y) @ z, when=same_shape(x, y),
         example=lambda x, y, z: x @ z + y @ z, inputs={"x": (4, 8), "y": (4, 8), "z": (8, 6)},
         description="xz + yz = (x + y) z"),
    rule("matmul-transpose", transpose(y, i, j) @ transpose(x, i, j),
         transpose(x @ y, i, j), when=all_of(rank_is(x, 2), rank_is(y, 2)),
         example=lambda x, y: y.transpose(0, 1) @ x.transpose(0, 1),
         inputs={"x": (4, 8), "y": (8, 6)}, description="y^T x^T = (x y)^T"),
    # -- convolution is bilinear (conv-is-bilinear-0..3, and their inverses)
    rule("conv-scale-weight", _conv(x * s, w, b), _conv(x, w * s, b), when=_scalar(s),
         example=lambda x, w: F.conv2d(x * 0.5, w, padding=1), inputs={"x": IMG, "w": KERNEL},
         description="conv(s x, w) = conv(x, s w)"),
    rule("conv-scale-out", _conv(x, w, b) * s, _conv(x * s, w, b),
         when=all_of(_scalar(s), _no_bias(b)),
         example=lambda x, w: F.conv2d(x, w, padding=1) * 0.5, inputs={"x": IMG, "w": KERNEL},
         description="s conv(x, w) = conv(s x, w) (no bias)"),
    rule("conv-distribute-weight", _conv(x, w1 + w2, b), _conv(x, w1, b) + _conv(x, w2, b),
         when=all_of(same_shape(w1, w2), _no_bias(b)),
         example=lambda x, w1, w2: F.conv2d(x, w1 + w2, padding=1),
         inputs={"x": IMG, "w1": KERNEL, "w2": KERNEL},
         description="conv(x, w1 + w2) = conv(x, w1) + conv(x, w2)"),
    rule("conv-factor-weight", _conv(x, w1, b) + _conv(x, w2, b), _conv(x, w1 + w2, b),
         when=all_of(same_shape(w1, w2), _no_bias(b)),
         example=lambda x, w1, w2: F.conv2d(x, w1, padding=1) + F.conv2d(x, w2, padding=1),
         inputs={"x": IMG, "w1": KERNEL, "w2": KERNEL},
         description="conv(x, w1) + conv(x, w2) = conv(x, w1 + w2)"),
    rule("conv-distribute-input", _conv(x + y, w, b), _conv(x, w, b) + _conv(y, w, b),
         when=all_of(same_shape(x, y), _no_bias(b)),
         example=lambda x, y, w: F.conv2d(x + y, w, padding=1),
         inputs={"x": IMG, "y": IMG, "w": KERNEL},
         description="conv(x + y, w) = conv(x, w) + conv(y, w)"),
    rule("conv-factor-input", _conv(x, w, b) + _conv(y, w, b), _conv(x + y, w, b),
         when=all_of(same_shape(x, y), _no_bias(b)),
         example=lambda x, y, w: F.conv2d(x, w, padding=1) + F.conv2d(y, w, padding=1),
         inputs={"x": IMG, "y": IMG, "w": KERNEL},
         description="conv(x, w) + conv(y, w) = conv(x + y, w)"),
    rule("cat-geometry", cat(d0, cat(d1, x, y), cat(d1, z, w)),
         cat(d1, cat(d0, x, z), cat(d0, y, w)), when=_geometry,
         example=lambda x, y, z, w: torch.cat([torch.cat([x, y], 1), torch.cat([z, w], 1)], 0),
         inputs={"x": (4, 8), "y": (4, 3), "z": (2, 8), "w": (2, 3)},
         description="a block matrix concatenates by rows or by columns alike"),
    # -- concatenation commutes with elementwise ops (operator-commutativity-5..8)
    rule("cat-scale", cat(d, x * s, y * s), cat(d, x, y) * s, when=_scalar(s),
         example=lambda x, y: torch.cat([x * 2.0, y * 2.0], 0), inputs=SAME,
         description="cat(s x, s y) = s cat(x, y)"),
    rule("scale-cat", cat(d, x, y) * s, cat(d, x * s, y * s), when=_scalar(s),
         example=lambda x, y: torch.cat([x, y], 0) * 2.0, inputs=SAME,
         description="s cat(x, y) = cat(s x, s y)"),
    rule("cat-add", cat(d, x + y, z + w), cat(d, x, z) + cat(d, y, w),
         when=all_of(same_shape(x, y), same_shape(z, w), _joinable(x, z, d)),
         example=lambda x, y, z, w: torch.cat([x + y, z + w], 0),
         inputs={"x": M, "y": M, "z": (2, 8), "w": (2, 8)},
         description="cat(x + y, z + w) = cat(x, z) + cat(y, w)"),
    rule("add-cat", cat(d, x, z) + cat(d, y, w), cat(d, x + y, z + w),
         when=all_of(same_shape(x, y), same_shape(z, w)),
         example=lambda x, y, z, w: torch.cat([x, z], 0) + torch.cat([y, w], 0),
         inputs={"x": M, "y": M, "z": (2, 8), "w": (2, 8)},
         description="cat(x, z) + cat(y, w) = cat(x + y, z + w)"),
    rule("cat-mul", cat(d, x * y, z * w), cat(d, x, z) * cat(d, y, w),
         when=all_of(same_shape(x, y), same_shape(z, w), _joinable(x, z, d)),
         example=lambda x, y, z, w: torch.cat([x * y, z * w], 0),
         inputs={"x": M, "y": M, "z": (2, 8), "w": (2, 8)},
         description="cat(x y, z w) = cat(x, z) cat(y, w)"),
    rule("mul-cat", cat(d, x, z) * cat(d, y, w), cat(d, x * y, z * w),
         when=all_of(same_shape(x, y), same_shape(z, w)),
         example=lambda x, y, z, w: torch.cat([x, z], 0) * torch.cat([y, w], 0),
         inputs={"x": M, "y": M, "z": (2, 8), "w": (2, 8)},
         description="cat(x, z) cat(y, w) = cat(x y, z w)"),
    rule("cat-relu", cat(d, relu(x), relu(y)), relu(cat(d, x, y)),
         example=lambda x, y: torch.cat([torch.relu(x), torch.relu(y)], 1), inputs=SAME,
         description="cat(relu x, relu y) = relu(cat(x, y))"),
    rule("relu-cat", relu(cat(d, x, y)), cat(d, relu(x), relu(y)),
         example=lambda x, y: torch.relu(torch.cat([x, y], 1)), inputs=SAME,
         description="relu(cat(x, y)) = cat(relu x, relu y)"),
    # -- concatenation and transpose, matmul, convolution
    rule("cat-transpose", cat(d, transpose(x, i, j), transpose(y, i, j)),
         _cat_through_transpose, when=same_shape(x, y),
         example=lambda x, y: torch.cat([x.t(), y.t()], 1), inputs=SAME,
         description="cat(1, x^T, y^T) = cat(0, x, y)^T"),
    rule("transpose-cat", transpose(cat(d, x, y), i, j), _transpose_into_cat,
         when=same_shape(x, y), example=lambda x, y: torch.cat([x, y], 0).t(), inputs=SAME,
         description="cat(0, x, y)^T = cat(1, x^T, y^T)"),
    rule("cat-matmul", cat(d, x @ y, x @ z), x @ cat(d, y, z),
         when=all_of(LEFT, rank_is(y, 2), rank_is(z, 2)),
         example=lambda x, y, z: torch.cat([x @ y, x @ z], 1),
         inputs={"x": (4, 8), "y": (8, 3), "z": (8, 5)},
         description="cat(xy, xz) along columns = x cat(y, z)"),
    rule("matmul-cat", x @ cat(d, y, z), cat(d, x @ y, x @ z),
         when=all_of(LEFT, rank_is(y, 2), rank_is(z, 2)),
         example=lambda x, y, z: x @ torch.cat([y, z], 1),
         inputs={"x": (4, 8), "y": (8, 3), "z": (8, 5)},
         description="x cat(y, z) = cat(xy, xz) along columns"),
    rule("cat-inner-matmul", matmul(cat(d, x, z), cat(d1, y, w)), x @ y + z @ w,
         when=all_of(rank_is(x, 2), rank_is(z, 2), _is_literal(d, 1), _is_literal(d1, 0),
                     _joinable(x, z, d), _joinable(y, w, d1)),
         example=lambda x, z, y, w: torch.cat([x, z], 1) @ torch.cat([y, w], 0),
         inputs={"x": (4, 3), "z": (4, 5), "y": (3, 6), "w": (5, 6)},
         description="[x z] [y; w] = xy + zw"),
    rule("cat-conv-batch", cat(d, _conv(x, w, b), _conv(y, w, b)), _conv(cat(d, x, y), w, b),
         when=all_of(_is_literal(d, 0), _joinable(x, y, d)),
         example=lambda x, y, w: torch.cat([F.conv2d(x, w, padding=1),
                                            F.conv2d(y, w, padding=1)], 0),
         inputs={"x": IMG, "y": (3, 4, 6, 6), "w": KERNEL},
         description="cat over the batch of convs with one kernel = conv of the cat"),
    rule("cat-conv-channels", cat(d, _conv(x, w1, b1), _conv(x, w2, b2)), _conv_weight_cat,
         when=all_of(_is_literal(d, 1), GROUPS_1),
         example=lambda x, w1, w2: torch.cat([F.conv2d(x, w1, padding=1),
                                              F.conv2d(x, w2, padding=1)], 1),
         inputs={"x": IMG, "w1": KERNEL, "w2": (3, 4, 3, 3)},
         description="cat over channels of convs of one input = conv with stacked kernels"),
    rule("conv-cat-channels", _conv(cat(d, x, z), cat(d1, y, w), b),
         _conv(x, y, b) + _conv(z, w, b),
         when=all_of(_is_literal(d, 1), _is_literal(d1, 1), _no_bias(b), GROUPS_1,
                     _joinable(x, z, d), _joinable(y, w, d1)),
         example=lambda x, z, y, w: F.conv2d(torch.cat([x, z], 1), torch.cat([y, w], 1),
                                             padding=1),
         inputs={"x": IMG, "z": (2, 3, 6, 6), "y": KERNEL, "w": (5, 3, 3, 3)},
         description="a conv over concatenated channels is the sum of the convs"),
    # -- concatenation and pooling (concatenation-and-pooling-0..2)
    *_pool_rules("max-pool", _max_pool, lambda t: F.max_pool2d(t, 3, 2, padding=1)),
    *_pool_rules("avg-pool", _avg_pool, lambda t: F.avg_pool2d(t, 2)),
]

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
    rule("conv-merge", [("u", _conv(x, w1, b1)), ("v", _conv(x, w2, b2))],
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
    rule("conv-merge-batch", [("u", _conv(x, w, b1)), ("v", _conv(y, w, b1))],
         _merge_conv_inputs, when=all_of(distinct(x, y), _same_image(x, y),
                                         _merge_order("conv2d", "x", "y", "w", shared_at=1)),
         example=lambda x, y, w: F.conv2d(x, w, padding=1).sum() + F.conv2d(y, w, padding=1).sum(),
         inputs={"x": IMG, "y": (3, 4, 6, 6), "w": KERNEL},
         description="convs with one kernel are one conv over the concatenated batch, split"),
]
"""Operator merging and the split algebra it needs: cheap enough for every pipeline, so the
``layout`` family (in ``'all'``) carries them; :data:`RULES` is the opt-in ``tensat``
family."""
