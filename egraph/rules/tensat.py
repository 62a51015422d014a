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

The family is split by what it costs. Operator merging and the split algebra
(:data:`egraph.rules.merging.MERGING`, TENSAT's multi-pattern rules) add few e-nodes and
are loaded by ``'all'`` (with the ``layout`` family); the other axioms
(:data:`RULES`, the opt-in ``tensat`` family) let a search reach TENSAT's rewrites but
distribute every matmul and concatenation they meet: on the bundled demo (one thread) they
take saturation from 0.67 s and 2105 e-nodes to 1.65 s and 3410, and find nothing the
extraction keeps that ``'all'`` misses, so they are loaded by name,
``load_rules("all", "tensat")``. Saturating in phases (algebra and layout, then these, then
the rest) was slower still (4.6 s, 4948 e-nodes).

>>> "cat-relu" in [r.name for r in RULES]
True
"""

from __future__ import annotations

from egraph.ops import avg_pool2d, cat, matmul, max_pool2d, relu, transpose
from egraph.rules.define import IMG, KERNEL, SAME, F, LibraryRule, M, add_literal, rule, torch
from egraph.rules.guards import (
    Guard,
    all_of,
    dim_of,
    is_none,
    literal_is,
    named,
    rank_is,
    same_shape,
    shape_of,
    value_of,
)
from egraph.rules.merging import GROUPS_1, conv, conv_args
from egraph.term import vars

__all__ = ["RULES"]

# Loaded only by name (TASO's axioms distribute every matmul and concatenation, more than
# doubling saturation time; its operator merging is in ``layout``).
LOADED = "by name"
ORDER = 11

(b, d, d0, d1, i, j, s, w, x, y, z, w1, w2, b1, b2) = vars(
    "b d d0 d1 i j s w x y z w1 w2 b1 b2")


# -- what the guards and right sides read -------------------------------------------------


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
        return dim_of(egraph, subst[var.name], len(shape)) == want
    return guard


def _joinable(p, q, dim_var) -> Guard:
    """``?p`` and ``?q`` can be concatenated along ``dim_var`` (equal shapes elsewhere)."""
    @named(f"{p.name}, {q.name} join along {dim_var.name}")
    def guard(egraph, subst) -> bool:
        sp, sq = shape_of(egraph, subst[p.name]), shape_of(egraph, subst[q.name])
        if sp is None or sq is None or len(sp) != len(sq):
            return False
        dim = dim_of(egraph, subst[dim_var.name], len(sp))
        return dim is not None and all(
            m == n for n_, (m, n) in enumerate(zip(sp, sq)) if n_ != dim)
    return guard


def _no_bias(var) -> Guard:
    @named(f"{var.name} is None")
    def guard(egraph, subst) -> bool:
        return is_none(egraph, subst[var.name])
    return guard


def _swap_dim(dim: int, p: int, q: int) -> int:
    return q if dim == p else p if dim == q else dim


def _cat_through_transpose(egraph, subst):
    """``cat(d, x^T, y^T) = (cat(d', x, y))^T``, d' the dim d comes from."""
    shape = shape_of(egraph, subst["x"])
    p, q = value_of(egraph, subst["i"]), value_of(egraph, subst["j"])
    if shape is None or type(p) is not int or type(q) is not int:
        return None
    dim = dim_of(egraph, subst["d"], len(shape))
    if dim is None:
        return None
    joined = egraph.add_node("cat", [add_literal(egraph, _swap_dim(dim, p, q)), subst["x"],
                                     subst["y"]])
    return egraph.add_node("transpose", [joined, subst["i"], subst["j"]])


def _transpose_into_cat(egraph, subst):
    shape = shape_of(egraph, subst["x"])
    p, q = value_of(egraph, subst["i"]), value_of(egraph, subst["j"])
    if shape is None or type(p) is not int or type(q) is not int:
        return None
    dim = dim_of(egraph, subst["d"], len(shape))
    if dim is None:
        return None
    parts = [egraph.add_node("transpose", [subst[n], subst["i"], subst["j"]]) for n in "xy"]
    return egraph.add_node("cat", [add_literal(egraph, _swap_dim(dim, p, q)), *parts])


@named("d0 != d1, x and z (y and w) equally wide along d1")
def _geometry(egraph, subst) -> bool:
    shapes = [shape_of(egraph, subst[n]) for n in "xyzw"]
    if any(sh is None for sh in shapes) or len({len(sh) for sh in shapes}) != 1:
        return False
    rank = len(shapes[0])
    outer, inner = dim_of(egraph, subst["d0"], rank), dim_of(egraph, subst["d1"], rank)
    sx, sy, sz, sw = shapes
    return (outer is not None and inner is not None and outer != inner
            and sx[inner] == sz[inner] and sy[inner] == sw[inner])


def _conv_weight_cat(egraph, subst):
    """cat(1, conv(x, w1, b1), conv(x, w2, b2)) = conv(x, cat(0, w1, w2), cat(0, b1, b2))."""
    none1, none2 = is_none(egraph, subst["b1"]), is_none(egraph, subst["b2"])
    if none1 != none2:
        return None
    weights = egraph.add_node("cat", [add_literal(egraph, 0), subst["w1"], subst["w2"]])
    bias = subst["b1"] if none1 else egraph.add_node(
        "cat", [add_literal(egraph, 0), subst["b1"], subst["b2"]])
    return egraph.add_node("conv2d", [subst["x"], weights, bias, *conv_args(subst)])


# -- the rules ----------------------------------------------------------------------------

MATS = {"x": (4, 8), "y": (8, 6), "z": (8, 6)}
LEFT = _cat_dim(d, "last")


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
        dim = dim_of(egraph, subst[var.name], len(shape))
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
    rule("conv-scale-weight", conv(x * s, w, b), conv(x, w * s, b), when=_scalar(s),
         example=lambda x, w: F.conv2d(x * 0.5, w, padding=1), inputs={"x": IMG, "w": KERNEL},
         description="conv(s x, w) = conv(x, s w)"),
    rule("conv-scale-out", conv(x, w, b) * s, conv(x * s, w, b),
         when=all_of(_scalar(s), _no_bias(b)),
         example=lambda x, w: F.conv2d(x, w, padding=1) * 0.5, inputs={"x": IMG, "w": KERNEL},
         description="s conv(x, w) = conv(s x, w) (no bias)"),
    rule("conv-distribute-weight", conv(x, w1 + w2, b), conv(x, w1, b) + conv(x, w2, b),
         when=all_of(same_shape(w1, w2), _no_bias(b)),
         example=lambda x, w1, w2: F.conv2d(x, w1 + w2, padding=1),
         inputs={"x": IMG, "w1": KERNEL, "w2": KERNEL},
         description="conv(x, w1 + w2) = conv(x, w1) + conv(x, w2)"),
    rule("conv-factor-weight", conv(x, w1, b) + conv(x, w2, b), conv(x, w1 + w2, b),
         when=all_of(same_shape(w1, w2), _no_bias(b)),
         example=lambda x, w1, w2: F.conv2d(x, w1, padding=1) + F.conv2d(x, w2, padding=1),
         inputs={"x": IMG, "w1": KERNEL, "w2": KERNEL},
         description="conv(x, w1) + conv(x, w2) = conv(x, w1 + w2)"),
    rule("conv-distribute-input", conv(x + y, w, b), conv(x, w, b) + conv(y, w, b),
         when=all_of(same_shape(x, y), _no_bias(b)),
         example=lambda x, y, w: F.conv2d(x + y, w, padding=1),
         inputs={"x": IMG, "y": IMG, "w": KERNEL},
         description="conv(x + y, w) = conv(x, w) + conv(y, w)"),
    rule("conv-factor-input", conv(x, w, b) + conv(y, w, b), conv(x + y, w, b),
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
         when=all_of(rank_is(x, 2), rank_is(z, 2), literal_is(d, 1), literal_is(d1, 0),
                     _joinable(x, z, d), _joinable(y, w, d1)),
         example=lambda x, z, y, w: torch.cat([x, z], 1) @ torch.cat([y, w], 0),
         inputs={"x": (4, 3), "z": (4, 5), "y": (3, 6), "w": (5, 6)},
         description="[x z] [y; w] = xy + zw"),
    rule("cat-conv-batch", cat(d, conv(x, w, b), conv(y, w, b)), conv(cat(d, x, y), w, b),
         when=all_of(literal_is(d, 0), _joinable(x, y, d)),
         example=lambda x, y, w: torch.cat([F.conv2d(x, w, padding=1),
                                            F.conv2d(y, w, padding=1)], 0),
         inputs={"x": IMG, "y": (3, 4, 6, 6), "w": KERNEL},
         description="cat over the batch of convs with one kernel = conv of the cat"),
    rule("cat-conv-channels", cat(d, conv(x, w1, b1), conv(x, w2, b2)), _conv_weight_cat,
         when=all_of(literal_is(d, 1), GROUPS_1),
         example=lambda x, w1, w2: torch.cat([F.conv2d(x, w1, padding=1),
                                              F.conv2d(x, w2, padding=1)], 1),
         inputs={"x": IMG, "w1": KERNEL, "w2": (3, 4, 3, 3)},
         description="cat over channels of convs of one input = conv with stacked kernels"),
    rule("conv-cat-channels", conv(cat(d, x, z), cat(d1, y, w), b),
         conv(x, y, b) + conv(z, w, b),
         when=all_of(literal_is(d, 1), literal_is(d1, 1), _no_bias(b), GROUPS_1,
                     _joinable(x, z, d), _joinable(y, w, d1)),
         example=lambda x, z, y, w: F.conv2d(torch.cat([x, z], 1), torch.cat([y, w], 1),
                                             padding=1),
         inputs={"x": IMG, "z": (2, 3, 6, 6), "y": KERNEL, "w": (5, 3, 3, 3)},
         description="a conv over concatenated channels is the sum of the convs"),
    # -- concatenation and pooling (concatenation-and-pooling-0..2)
    *_pool_rules("max-pool", _max_pool, lambda t: F.max_pool2d(t, 3, 2, padding=1)),
    *_pool_rules("avg-pool", _avg_pool, lambda t: F.avg_pool2d(t, 2)),
]

