"""Layout: transposes, permutes, reshapes and expands that cancel or compose; a permute
moved past the scale, fill, bias and softmax of attention scores (sequence-first code's);
an einsum as the permutes, reshapes and matmul it is made of; splits of concatenations
that cancel, and ops sharing an input merged into one on concatenated weights (TENSAT's
operator merging, :data:`egraph.rules.merging.MERGING`).

>>> next(r for r in RULES if r.name == "reshape-reshape").rewrite
Rewrite('reshape-reshape', '(reshape (reshape ?x ?s1) ?s2)' => '(reshape ?x ?s2)')
"""

from __future__ import annotations

import math

from egraph.ops import (
    add,
    einsum,
    expand,
    getitem,
    log_softmax,
    masked_fill,
    matmul,
    mul,
    permute,
    reshape,
    size,
    softmax,
    squeeze,
    transpose,
    unsqueeze,
)
from egraph.ops.einsum_plan import plan
from egraph.rules.define import LibraryRule, rule, torch
from egraph.rules.guards import (
    named,
    reordered_shape,
    reshape_gives,
    scalar,
    shape_of,
    value_of,
)
from egraph.rules.merging import MERGING
from egraph.term import literal, vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 3

a, b, c, e, m, x, i, j, p, q, s, s1, s2, d = vars("a b c e m x i j p q s s1 s2 d")


@named("shape x == s")
def _shape_is_s(egraph, subst) -> bool:
    shape = shape_of(egraph, subst["x"])
    return reshape_gives(value_of(egraph, subst["s"]), shape)


def _compose(egraph, subst):
    p, q = value_of(egraph, subst["p"]), value_of(egraph, subst["q"])
    if not isinstance(p, tuple) or not isinstance(q, tuple) or len(p) != len(q):
        return None
    composed = tuple(p[i] for i in q)
    if composed == tuple(range(len(composed))):
        return subst["x"]
    return egraph.add_node("permute", [subst["x"], egraph.add_node(literal(composed))])


def _swap(egraph, subst):
    """``permute(x, p)`` where ``p`` exchanges two dims is ``transpose(x, i, j)`` (the
    attention rules read ``k.transpose(-2, -1)``; einsum and einops spell it a permute)."""
    p = value_of(egraph, subst["p"])
    if not isinstance(p, tuple):
        return None
    moved = [d for d, to in enumerate(p) if d != to]
    if len(moved) != 2:
        return None
    i, j = moved
    return egraph.add_node("transpose", [subst["x"], egraph.add_node(literal(i)),
                                         egraph.add_node(literal(j))])


def _sunk_unsqueeze(egraph, subst):
    """``permute(unsqueeze(x, d), p)`` is ``unsqueeze(permute(x, p'), d')``: the unit dim
    lands where ``p`` sends it and the others keep their order (torch's einsum lines its
    operands up so, with unit dims for the letters they lack, in aot_autograd's graphs)."""
    d, p = value_of(egraph, subst["d"]), value_of(egraph, subst["p"])
    if type(d) is not int or not isinstance(p, tuple) or not 0 <= d < len(p):
        return None
    rest = tuple(i - (i > d) for i in p if i != d)
    inner = subst["x"] if rest == tuple(range(len(rest))) else egraph.add_node(
        "permute", [subst["x"], egraph.add_node(literal(rest))])
    return egraph.add_node("unsqueeze", [inner, egraph.add_node(literal(p.index(d)))])


@named("p moves only dims of size 1")
def _moves_units_only(egraph, subst) -> bool:
    """``permute(x, p)`` keeps the order of every dim of ``x`` but those of size 1, so it
    keeps the order of the elements: a reshape."""
    shape, p = shape_of(egraph, subst["x"]), value_of(egraph, subst["p"])
    if shape is None or not isinstance(p, tuple) or len(p) != len(shape):
        return False
    kept = [i for i in p if shape[i] != 1]
    return kept == sorted(kept) and all(type(n) is int for n in shape)


def _as_reshape(egraph, subst):
    shape, p = shape_of(egraph, subst["x"]), value_of(egraph, subst["p"])
    return egraph.add_node("reshape", [subst["x"], egraph.add_node(
        literal(tuple(shape[i] for i in p)))])


def _split_whole(egraph, subst) -> tuple | None:
    """The shape of ``op(a, b)`` where ``reshape(op(a, b), s)`` splits the first dim of a
    batch of matrices (heads flattened into the batch, viewed per head again); else None.
    Other reshapes of sums, such as a linear's rows restored to (batch, length), gain
    nothing from the rules below and would grow every sum's class (GPT-2's rewrites 460 ->
    928)."""
    shapes = [getattr(egraph.data(subst[v]), "shape", None) for v in ("a", "b")
              if getattr(egraph.data(subst[v]), "kind", None) not in ("literal", "scalar")]
    whole, target = _broadcast(shapes), value_of(egraph, subst["s"])
    if whole is None or len(whole) < 3 or not isinstance(target, tuple) or len(
            target) <= len(whole) or target[len(target) - len(whole) + 1:] != whole[1:]:
        return None
    return whole


@named("s splits the first dim of a batch of matrices")
def _splits_batch(egraph, subst) -> bool:
    return _split_whole(egraph, subst) is not None


def _reshaped_operands(op: str):
    """``reshape(op(a, b), s)`` as ``op`` of the operands reshaped, each tensor first
    expanded to the result's shape where it broadcasts (a number stays as it is): BLOOM
    adds its ALiBi bias to the scores of heads flattened into the batch, then views them
    per head (:func:`_split_whole`)."""
    @named(f"{op} of the reshaped operands")
    def rhs(egraph, subst):
        whole, operands = _split_whole(egraph, subst), []
        for var in ("a", "b"):
            cid, meta = subst[var], egraph.data(subst[var])
            if getattr(meta, "kind", None) not in ("literal", "scalar"):
                if meta.shape != whole:
                    cid = egraph.add_node("expand", [cid, egraph.add_node(literal(whole))])
                cid = egraph.add_node("reshape", [cid, subst["s"]])
            operands.append(cid)
        return egraph.add_node(op, operands)
    return rhs


def _broadcast(shapes: list) -> tuple | None:
    """The shape the tensors of these shapes broadcast to (sizes that are ints), or None
    (a shape unknown, symbolic or not broadcastable)."""
    if not shapes or any(s is None or not all(type(n) is int for n in s) for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    whole = []
    for dim in range(rank):
        sizes = {s[dim - rank + len(s)] for s in shapes if dim - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        whole.append(sizes.pop() if sizes else 1)
    return tuple(whole)


def _transposed_first(egraph, subst):
    """``transpose(reshape(x, s), i, j)`` over the last two dims, where the reshape keeps
    ``x``'s last two dims (it only merges or splits the ones before, as heads are
    flattened into the batch), is ``x`` transposed, then reshaped."""
    shape, target = shape_of(egraph, subst["x"]), value_of(egraph, subst["s"])
    dims = {value_of(egraph, subst["i"]), value_of(egraph, subst["j"])}
    if shape is None or len(shape) < 2 or not isinstance(target, tuple) or len(target) < 2:
        return None
    rank = len(target)
    if dims not in ({rank - 2, rank - 1}, {-2, -1}) or tuple(shape[-2:]) != target[-2:]:
        return None
    swapped_target = reordered_shape(egraph, subst["s"], (*range(rank - 2), rank - 1, rank - 2))
    if swapped_target is None:
        return None
    add_node, n = egraph.add_node, len(shape)
    swapped = add_node("transpose", [subst["x"], add_node(literal(n - 2)),
                                     add_node(literal(n - 1))])
    return add_node("reshape", [swapped, swapped_target])


def _permutation(egraph, cid) -> tuple | None:
    """The permutation literal ``cid`` with its dims counted from 0, or None."""
    p = value_of(egraph, cid)
    if not isinstance(p, tuple) or not all(type(i) is int for i in p):
        return None
    n = len(p)
    p = tuple(i % n if -n <= i < n else -1 for i in p)
    return p if sorted(p) == list(range(n)) else None


def _dim_before(egraph, cid: int, p: tuple) -> int | None:
    """The dim that the one dim class ``cid`` names (a softmax's) held before the
    permute ``p``; None where ``cid`` is not one dim."""
    dims = value_of(egraph, cid)
    if not isinstance(dims, tuple) or len(dims) != 1 or type(
            dims[0]) is not int or not -len(p) <= dims[0] < len(p):
        return None
    return p[dims[0] % len(p)]


def _orderable(egraph, cid: int, p: tuple) -> bool:
    """Class ``cid`` has a known shape of no more dims than the permute ``p``."""
    shape = shape_of(egraph, cid)
    return shape is not None and len(shape) <= len(p)


def _in_order_before(egraph, cid: int, p: tuple) -> int:
    """Class ``cid`` (a tensor that broadcasts against ``permute(x, p)``, and
    :func:`_orderable`) put in ``x``'s order: given leading unit dims up to ``x``'s rank,
    then permuted by the inverse of ``p``."""
    shape = shape_of(egraph, cid)
    add_node = egraph.add_node
    if len(shape) < len(p):
        cid = add_node("reshape", [cid, add_node(literal((1,) * (len(p) - len(shape))
                                                         + tuple(shape)))])
    inverse = tuple(p.index(i) for i in range(len(p)))
    return add_node("permute", [cid, add_node(literal(inverse))])


def _before_permute(op: str, biased: bool = False):
    """``op(permute(x, p), ...)``, for ``op`` softmax or masked_fill, as ``op`` applied
    before the permute, then permuted: the softmax over the dim its dim held before
    (:func:`_dim_before`), the fill with its mask put in ``x``'s order
    (:func:`_in_order_before`). Einsum attention in sequence-first layout (labml's
    ``'ijbh'`` scores normalised over ``j`` at dim 1) reaches the attention rules so.

    ``biased``: ``op(permute(x, p) + b, ...)``, the bias put in ``x``'s order too (labml's
    ALiBi, an (i, j, 1, h) bias added to the scores). Only under these two ops: a permute
    moved out of every sum (residual streams included) grew the e-graph threefold (a
    Conformer's 527 e-nodes to 1,509) for nothing."""
    @named(f"{op} of the {'sum' if biased else 'values'} before the permute")
    def rhs(egraph, subst):
        p = _permutation(egraph, subst["p"])
        if p is None or biased and (getattr(egraph.data(subst["b"]), "kind", None) != "tensor"
                                    or not _orderable(egraph, subst["b"], p)):
            return None
        if op == "softmax":
            dim = _dim_before(egraph, subst["d"], p)
            if dim is None:
                return None
        elif not _orderable(egraph, subst["m"], p):
            return None
        add_node, scores = egraph.add_node, subst["x"]
        if biased:
            scores = add_node("add", [scores, _in_order_before(egraph, subst["b"], p)])
        if op == "softmax":
            inner = add_node("softmax", [scores, add_node(literal((dim,)))])
        else:
            mask = _in_order_before(egraph, subst["m"], p)
            inner = add_node("masked_fill", [scores, mask, subst["c"]])
        return add_node("permute", [inner, subst["p"]])
    return rhs


@named("the reshape keeps x's last dim, the one normalised")
def _keeps_last_dim(egraph, subst) -> bool:
    """``op(reshape(x, s), d)`` normalises the last dim of the reshape, which keeps
    ``x``'s last dim (it only merges or splits the dims before it: heads flattened into
    the batch, as fairseq-style attention writes ``bmm`` on ``(b * h, t, s)`` scores)."""
    shape, target = shape_of(egraph, subst["x"]), value_of(egraph, subst["s"])
    dims = value_of(egraph, subst["d"])
    if shape is None or not shape or not isinstance(target, tuple) or not target:
        return False
    if not isinstance(dims, tuple) or len(dims) != 1 or dims[0] not in (-1, len(target) - 1):
        return False
    last = target[-1]
    if last == -1:  # (inferred: the elements over the other sizes given)
        if not all(type(n) is int for n in (*shape, *target[:-1])) or -1 in target[:-1]:
            return False
        last = math.prod(shape) // max(1, math.prod(target[:-1]))
    return last == shape[-1]


def _before_reshape(op: str):
    """``op(reshape(x, s), d)`` (softmax or log_softmax over the last dim) as ``op`` of
    ``x`` over its own last dim, then reshaped: each row is the same row."""
    @named(f"{op} over x's last dim, reshaped")
    def rhs(egraph, subst):
        rank = len(shape_of(egraph, subst["x"]))
        inner = egraph.add_node(op, [subst["x"], egraph.add_node(literal((rank - 1,)))])
        return egraph.add_node("reshape", [inner, subst["s"]])
    return rhs


def _last_two_swapped(egraph, subst):
    """``a @ permute(x, p)`` is ``a @ permute(x, p').transpose(-2, -1)`` where ``p'`` is
    ``p`` with its last two dims exchanged: the attention rules read ``k`` so (einsum's
    ``'ibhd,jbhd->ijbh'`` permutes keys laid out (j, b, h, d) to (b, h, d, j)). Only where
    ``p'`` itself moves a dim: otherwise ``permute-as-transpose`` says it."""
    p = _permutation(egraph, subst["p"])
    if p is None or len(p) < 3:
        return None
    swapped = (*p[:-2], p[-1], p[-2])
    if swapped == tuple(range(len(p))):
        return None
    add_node, n = egraph.add_node, len(p)
    inner = add_node("permute", [subst["x"], add_node(literal(swapped))])
    key = add_node("transpose", [inner, add_node(literal(n - 2)), add_node(literal(n - 1))])
    return add_node("matmul", [subst["a"], key])


class _Operand(int):
    """An operand's class id in a planned einsum (an int of another kind than a number)."""


def _added(egraph, expr) -> int:
    """Class of a planned expression (:mod:`egraph.ops.einsum_plan`)."""
    if isinstance(expr, _Operand):
        return int(expr)
    if isinstance(expr, tuple) and len(expr) == 2 and isinstance(expr[0], str) and isinstance(
            expr[1], list):
        return egraph.add_node(expr[0], [_added(egraph, k) for k in expr[1]])
    return egraph.add_node(literal(expr))


def _einsum_lowered(egraph, subst):
    """The ops ``einsum(e, a[, b])`` is made of (:func:`egraph.ops.einsum_plan.plan`):
    permutes, sums, reshapes and a matmul or mul, which the attention and layout rules
    read. The call stays in the class, for the cost model to weigh against them."""
    operands = [subst[v] for v in ("a", "b") if v in subst]
    expr = plan(value_of(egraph, subst["e"]), [_Operand(c) for c in operands],
                [shape_of(egraph, c) for c in operands])
    return None if expr is None else _added(egraph, expr)


_TO_THE_END = 1 << 62
"""A slice's stop at or past which it runs to the end whatever the size (torch.export
writes ``x[:, :]`` on a symbolic size as a slice to 2**63 - 1)."""


@named("the index selects every element")
def _selects_all(egraph, subst) -> bool:
    """``x[i]`` is ``x``: every item of ``i`` is ``...`` or a slice from 0 to the end,
    step 1 (the end given as nothing, as the dim's size or past any size)."""
    shape, index = shape_of(egraph, subst["x"]), value_of(egraph, subst["i"])
    if shape is None or index is None:
        return False
    items = index if isinstance(index, tuple) else (index,)
    if Ellipsis in items:
        cut = items.index(Ellipsis)
        before, after = items[:cut], items[cut + 1:]
        if Ellipsis in after:
            return False
    else:
        before, after = items, ()
    if len(before) + len(after) > len(shape):
        return False
    pairs = [*zip(before, shape), *zip(after, shape[len(shape) - len(after):])]
    return all(isinstance(item, slice) and item.start in (None, 0) and item.step in (None, 1)
               and (item.stop is None or item.stop == size or type(item.stop) is int and (
                   item.stop >= _TO_THE_END or type(size) is int and item.stop >= size))
               for item, size in pairs)


@named("transpose of the last two dims, equal ranks")
def _last_two_equal_rank(egraph, subst) -> bool:
    sa, sb = shape_of(egraph, subst["a"]), shape_of(egraph, subst["b"])
    if sa is None or sb is None or len(sa) != len(sb) or len(sa) < 2:
        return False
    r = len(sa)
    return {value_of(egraph, subst["i"]), value_of(egraph, subst["j"])} == {r - 2, r - 1}


def _given_size(egraph, subst):
    """``size(view(x, s), i)`` is ``s[i]``, the size the view was given, unless that is -1
    (inferred). With the item itself (a size of another tensor, or a product of sizes), the
    view is no longer needed for its size alone, and a size that varies stays symbolic."""
    i = value_of(egraph, subst["i"])
    if type(i) is not int or i < 0:
        return None
    for node in egraph.nodes(subst["s"]):
        if node.op == "tuple" and i < len(node.children):
            item = node.children[i]
            return item if value_of(egraph, item) not in (-1, None) else None
    shape = value_of(egraph, subst["s"])
    if (isinstance(shape, tuple) and i < len(shape) and type(shape[i]) is int and shape[i] >= 0
            and not getattr(egraph.data(subst["s"]), "from_size", True)):
        return egraph.add_node(literal(shape[i]))
    return None


RULES: list[LibraryRule] = [
    rule("transpose-transpose", transpose(transpose(x, i, j), i, j), x,
         example=lambda x: x.transpose(0, 1).transpose(0, 1), inputs={"x": (4, 8)},
         description="transposing twice is the identity"),
    rule("permute-permute", permute(permute(x, p), q), _compose,
         example=lambda x: x.permute(2, 0, 1).permute(1, 2, 0), inputs={"x": (2, 3, 4)},
         description="two permutes compose into one (or none)"),
    rule("permute-as-transpose", permute(x, p), _swap,
         example=lambda x: x.permute(0, 2, 1), inputs={"x": (2, 3, 4)},
         description="a permute that exchanges two dims is a transpose"),
    rule("reshape-reshape", reshape(reshape(x, s1), s2), reshape(x, s2),
         example=lambda x: x.reshape(8, 4).reshape(2, 16), inputs={"x": (4, 8)},
         description="a reshape of a reshape is one reshape"),
    rule("reshape-noop", reshape(x, s), x, when=_shape_is_s,
         example=lambda x: x.reshape(4, 8), inputs={"x": (4, 8)},
         description="a reshape to the same shape does nothing"),
    rule("expand-noop", expand(x, s), x, when=_shape_is_s,
         example=lambda x: x.expand(4, 8), inputs={"x": (4, 8)},
         description="an expand to the same shape does nothing"),
    rule("getitem-noop", getitem(x, i), x, when=_selects_all,
         example=lambda x: x[:, 0:9223372036854775807][..., :8], inputs={"x": (4, 8)},
         description="an index that selects every element does nothing"),
    rule("squeeze-unsqueeze", squeeze(unsqueeze(x, d), d), x,
         example=lambda x: x.unsqueeze(1).squeeze(1), inputs={"x": (4, 8)},
         description="squeezing the dim just unsqueezed is the identity"),
    rule("permute-unsqueeze", permute(unsqueeze(x, d), p), _sunk_unsqueeze,
         example=lambda x: x.unsqueeze(3).permute(0, 1, 3, 2), inputs={"x": (2, 3, 4)},
         description="a permute moves an unsqueezed unit dim where it sends it"),
    rule("permute-units", permute(x, p), _as_reshape, when=_moves_units_only,
         example=lambda x: x.permute(0, 2, 1, 3), inputs={"x": (2, 1, 4, 3)},
         description="a permute that moves only dims of size 1 is a reshape"),
    rule("reshape-unsqueeze", reshape(unsqueeze(x, d), s), reshape(x, s),
         example=lambda x: x.unsqueeze(1).reshape(8, 4), inputs={"x": (4, 8)},
         description="a reshape of an unsqueeze is a reshape (the order of elements is kept)"),
    rule("reshape-add", reshape(add(a, b), s), _reshaped_operands("add"), when=_splits_batch,
         example=lambda a, b: (a + b).reshape(2, 3, 4, 4), inputs={"a": (6, 4, 4), "b": (6, 1, 4)},
         description="splitting the first dim of a sum is the sum of the operands split "
                     "(broadcast)"),
    rule("reshape-mul", reshape(mul(a, b), s), _reshaped_operands("mul"), when=_splits_batch,
         example=(lambda a, b: (a * 0.5).reshape(2, 3, 4, 2) + b.reshape(2, 3, 4, 2),
                  lambda a, b: (a * b).reshape(2, 3, 4, 2)),
         inputs={"a": (6, 4, 2), "b": (6, 4, 2)},
         description="splitting the first dim of a product is the product of the operands "
                     "split (broadcast)"),
    rule("transpose-reshape", transpose(reshape(x, s), i, j), _transposed_first,
         example=lambda x: x.reshape(6, 4, 5).transpose(1, 2), inputs={"x": (2, 3, 4, 5)},
         description="transposing the last two dims commutes with a reshape of the dims "
                     "before them"),
    rule("transpose-matmul", transpose(a @ b, i, j), transpose(b, i, j) @ transpose(a, i, j),
         when=_last_two_equal_rank, example=lambda a, b: (a @ b).transpose(-2, -1),
         inputs={"a": (2, 4, 8), "b": (2, 8, 3)}, description="(AB)^T = B^T A^T"),
    rule("scale-permute", permute(x, p) * s, permute(x * s, p), when=scalar(s),
         example=lambda x: x.permute(2, 0, 1) * 0.25, inputs={"x": (2, 3, 4)},
         description="s permute(x) = permute(s x)"),
    rule("softmax-permute", softmax(permute(x, p), d), _before_permute("softmax"),
         example=lambda x: torch.softmax(x.permute(2, 3, 0, 1), 1), inputs={"x": (2, 3, 4, 5)},
         description="softmax over a permuted dim is softmax over that dim before the permute, "
                     "permuted"),
    rule("softmax-reshape", softmax(reshape(x, s), d), _before_reshape("softmax"),
         when=_keeps_last_dim,
         example=(lambda x: torch.softmax(x.reshape(6, 4, 5), -1),
                  lambda x: torch.softmax(x.view(-1, 4, 5), 2)),
         inputs={"x": (2, 3, 4, 5)},
         description="softmax over the last dim of a reshape that keeps it is the reshape "
                     "of the softmax"),
    rule("log-softmax-reshape", log_softmax(reshape(x, s), d), _before_reshape("log_softmax"),
         when=_keeps_last_dim, example=lambda x: torch.log_softmax(x.reshape(6, 4, 5), -1),
         inputs={"x": (2, 3, 4, 5)},
         description="log_softmax over the last dim of a reshape that keeps it is the "
                     "reshape of the log_softmax"),
    rule("masked-fill-permute", masked_fill(permute(x, p), m, c), _before_permute("masked_fill"),
         example=(lambda x, m: x.permute(2, 3, 0, 1).masked_fill(m, float("-inf")),
                  lambda x, m: x.permute(2, 3, 0, 1).masked_fill(m[0], -1e9)),
         inputs={"x": (2, 3, 4, 5), "m": ((4, 5, 1, 1), "bool")},
         description="a fill of permuted values is the fill, with the mask put back in their "
                     "order, permuted"),
    rule("einsum-sum", einsum(e, a), _einsum_lowered,
         example=(lambda a: torch.einsum("bij->bji", a), lambda a: torch.einsum("bij->b", a),
                  lambda a: torch.einsum("...ij->...i", a)),
         inputs={"a": (2, 3, 4)},
         description="an einsum of one operand is a permute of its sums"),
    rule("einsum-product", einsum(e, a, b), _einsum_lowered,
         example=(lambda a, b: torch.einsum("bhid,bhjd->bhij", a, b),
                  lambda a, b: torch.einsum("... i d, ... j d -> ... i j", a, b),
                  lambda a, b: torch.einsum("bhid,bhjd->ijbh", a, b),
                  lambda a, b: torch.einsum("bhid,bhjd->bhi", a, b),
                  lambda a, b: torch.einsum("bhid,bhjd->ij", a, b),
                  lambda a, b: torch.einsum("bhid,bhjd->bhijd", a, b)),
         inputs={"a": (2, 3, 4, 5), "b": (2, 3, 6, 5)},
         description="an einsum of two operands is a matmul (or mul) between permutes, "
                     "reshapes where letters are flattened"),
    rule("masked-fill-add-permute", masked_fill(permute(x, p) + b, m, c),
         _before_permute("masked_fill", biased=True),
         example=lambda x, b, m: (x.permute(2, 3, 0, 1) + b).masked_fill(m, float("-inf")),
         inputs={"x": (2, 3, 4, 5), "b": (5, 1, 3), "m": ((4, 5, 1, 1), "bool")},
         description="a bias added to permuted scores, then a fill: both before the "
                     "permute, the bias and mask put in the scores' order"),
    rule("softmax-add-permute", softmax(permute(x, p) + b, d),
         _before_permute("softmax", biased=True),
         example=lambda x, b: torch.softmax(x.permute(2, 3, 0, 1) + b, 1),
         inputs={"x": (2, 3, 4, 5), "b": (5, 1, 3)},
         description="a bias added to permuted scores, then softmax: both before the "
                     "permute, the bias put in the scores' order"),
    rule("matmul-permute-last-two", matmul(a, permute(x, p)), _last_two_swapped,
         example=lambda a, x: a @ x.permute(1, 2, 3, 0), inputs={"a": (3, 4, 6, 5),
                                                             "x": (2, 3, 4, 5)},
         description="a matmul's right operand permuted is a permute, then a transpose of "
                     "its last two dims"),
    rule("size-of-reshape", size(reshape(x, s), i), _given_size,
         example=lambda x: x[:, : x.reshape(2, x.size(0) * 4).size(1)], inputs={"x": (4, 8)},
         description="the size of a reshape is the size it was given"),
    rule("size-of-expand", size(expand(x, s), i), _given_size,
         example=lambda x: x[: x.expand(3, x.size(1)).size(0)], inputs={"x": (1, 8)},
         description="the size of an expand is the size it was given"),
    *MERGING,
]
