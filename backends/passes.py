"""Peephole passes over an emitted FX graph: choices of spelling that depend on what the
extracted program shares, which the e-graph cannot see.

Each pass fuses calls where *nothing else reads* an intermediate (a product read only by
the sum it feeds, a new tensor read only by the copy that updates it). Whether a value has
one reader is a fact of the extracted DAG, not of an e-class: in the e-graph every class
may have any number of parents, and the same class read twice after extraction would be
computed twice if a rule had fused it into one reader. The in-place passes also need the
order of the emitted calls (no call between the fused ones may write into a tensor), which
a term has no notion of. So these stay after extraction, each kept exactly as sound as a
rule by those two checks:

- :func:`bias_into_matmul` (``mm(a, b) + c`` -> ``addmm``): the product read once;
- :func:`row_major_first` (``permuted + y`` -> ``y + permuted``): the layout the result
  takes, which an e-class (of values, not layouts) does not hold;
- :func:`scale_into_add` (``x + y * s`` -> ``add(x, y, alpha=s)``): the product read once;
- :func:`update_in_place`: a fresh tensor read only by the copy an update writes into;
- :func:`arithmetic_into_update` (``dst.copy_(dst + y)`` -> ``dst.add_(y)``, then
  ``addcmul_``/``addcdiv_``/``alpha``): the functional result read once, no write between;
- :func:`lerp_into_update` (dynamo's ``foreach_lerp`` spelling -> ``lerp_``): same.

(oneDNN's post-ops, a ReLU or a residual sum after its convolution and a GELU after its
inner product, are e-graph alternatives instead (:mod:`egraph.rules.kernels`): their
speed differs from the calls they replace by more than a spelling's, so the cost model
has to see them, and DAG extraction, which pays for a product read twice once more, takes
them only where nothing else reads the product.)

:func:`peephole` runs them in that order. A fused call takes the ``node.meta`` of the
call whose value it gives (the class it computes, :data:`backends.fx.EMITTED_CLASS`).

>>> import torch.fx as fx
>>> g = fx.Graph()
>>> a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
>>> p = g.call_function(torch.mm, (a, b))
>>> _ = g.output(g.call_function(torch.add, (p, c)))
>>> meta = type("Meta", (), {"kind": "tensor", "shape": (2, 2), "dtype": torch.float32})()
>>> bias_into_matmul(g, {n: meta for n in g.nodes})
>>> [n.target.__name__ for n in g.nodes if n.op == "call_function"]
['addmm']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from egraph.ops.table import TABLE
from frontends.fx.effects import is_in_place
from frontends.fx.vocabulary import (
    COMMUTATIVE_CALLS,
    LAYOUT_KEEPING_CALLS,
    PERMUTING_CALLS,
    full_size,
    is_expression,
    lower,
)


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without growing it (symbolic
    sizes compared as expressions, never by the example's value)."""
    return len(shape) <= len(target) and all(
        d == 1 or d == t for d, t in zip(reversed(shape), reversed(target)))


def update_in_place(graph: fx.Graph, copies: set[fx.Node],
                     allocated: set[fx.Node]) -> None:
    """Drop the copy an in-place update writes into where what it copies is a new tensor
    that nothing else reads. Ingest makes each update of a value the graph made on a copy,
    since the value's class may be shared; once emitted, a value read only by the copy
    (PyG's ``x.new_zeros(n, f).scatter_add_(0, index, src)``, an MoE layer's chain of
    ``index_add_`` into ``torch.zeros_like(x)``) is written as the source wrote it, with no
    copy per update. The update's result is the tensor it wrote into: new, when that was."""
    for copy in [n for n in graph.nodes if n in copies]:
        source = copy.args[0]
        if source in allocated and len(source.users) == 1:
            copy.replace_all_uses_with(source)
            graph.erase_node(copy)


def _writes_before(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node -> how many calls before it may write into a tensor they are given (an
    in-place update, a call with ``out=``, a mutating aten op, a submodule's call)."""
    def writes(n: fx.Node) -> bool:
        if n.op == "call_module":
            return True
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            return n.target._schema.is_mutable
        return n.op in ("call_function", "call_method") and (
            is_in_place(n) or "out" in n.kwargs)

    counts, seen = {}, 0
    for n in graph.nodes:
        counts[n] = seen
        seen += writes(n)
    return counts


def _unwritten(writes: dict[fx.Node, int], moved: Sequence[Any], to: fx.Node) -> bool:
    """Whether the reads of the calls ``moved`` may move to ``to``'s place: no call
    between the first of them and ``to`` writes into a tensor (``m = x @ w; w.add_(1);
    m + b`` is not ``addmm(b, x, w)`` after the update)."""
    return all(writes[to] == writes[n] for n in moved if isinstance(n, fx.Node))


def _plain_sums(graph: fx.Graph) -> list[fx.Node]:
    """The ``torch.add(x, y)`` calls of ``graph`` (no ``alpha``), in order."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target is torch.add
            and not n.kwargs and len(n.args) == 2]


def bias_into_matmul(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``add(matmul(a, b), c)`` of 2-D floating matrices, where nothing else reads the
    product, as ``torch.addmm(c, a, b)``: the canonical vocabulary spells ``addmm`` (GPT-2's
    Conv1D) as a product and a sum, but one GEMM with the bias in its accumulator is faster
    in eager torch, and Inductor keeps it one library call instead of a GEMM and a sum.
    (The e-graph holds ``addmm`` of a product-shaped ``c`` too, the rule ``addmm``, so that
    the cost model weighs it against other kernels for the product; this pass joins what
    extraction left as two calls, a broadcast bias and scaled terms among them.)
    Scaled terms, ``matmul(a, b) * alpha + c * beta`` (Muon's Newton-Schulz step, in
    bfloat16), become ``addmm``'s ``alpha`` and ``beta``: one rounding of the sum where
    the terms rounded three times more."""
    def fits(product: fx.Node, bias: Any, total: fx.Node) -> bool:
        if not (isinstance(bias, fx.Node) and isinstance(product, fx.Node)
                and bias is not product  # p + p reads the product twice
                and product.op == "call_function" and product.target in (torch.matmul, torch.mm)
                and len(product.users) == 1 and not product.kwargs):
            return False
        described = [metas.get(n) for n in (*product.args, bias, total)]
        if any(getattr(m, "kind", None) != "tensor" or m.shape is None for m in described):
            return False
        a, b, c, out = described
        return (len(a.shape) == len(b.shape) == 2 and len(c.shape) <= 2
                and out.shape == (a.shape[0], b.shape[1])
                and _broadcasts_to(c.shape, out.shape)
                and a.dtype == b.dtype == c.dtype == out.dtype and out.dtype.is_floating_point)

    writes = _writes_before(graph)
    for node in _plain_sums(graph):
        for product_term, bias_term in (node.args, node.args[::-1]):
            (product, alpha), (bias, beta) = _scaled(product_term), _scaled(bias_term)
            moved = [product_term, product] + ([bias_term] if bias_term is not bias else [])
            if fits(product, bias, node) and _unwritten(writes, moved, node):
                scales = {k: v for k, v in (("beta", beta), ("alpha", alpha)) if v != 1}
                with graph.inserting_before(node):
                    fused = graph.call_function(torch.addmm, (bias, *product.args), scales)
                metas[fused] = metas[node]  # (a later sum may read it: Muon's next step)
                writes[fused] = writes[node]
                node.replace_all_uses_with(fused, propagate_meta=True)
                graph.erase_node(node)
                for term in dict.fromkeys((product_term, product, bias_term)):
                    if term is not bias:
                        graph.erase_node(term)
                break


def _binary_call(node: Any, targets: Any, users: int = 1) -> bool:
    """Whether ``node`` calls one of ``targets`` (a function or a collection of them) on
    two arguments, without keywords, and ``users`` calls read it: a call an emission
    fusion may replace."""
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and (node.target in targets if isinstance(targets, (tuple, dict))
                 else node.target is targets)
            and len(node.args) == 2 and not node.kwargs and len(node.users) == users)


def _scaled(term: Any) -> tuple[Any, float]:
    """``(x, s)`` for ``term = x * s`` with ``s`` a number and nothing else reading the
    product, else ``(term, 1)``."""
    if _binary_call(term, torch.mul):
        x, s = term.args
        if not isinstance(x, fx.Node):
            x, s = s, x
        # (not 0: addmm ignores its input where beta is 0, where x * 0 is NaN at inf)
        if isinstance(x, fx.Node) and isinstance(s, (int, float)) and not isinstance(
                s, bool) and s != 0 and math.isfinite(s):
            return x, s
    return term, 1


_IN_PLACE_TWINS = {torch.add: "add_", torch.mul: "mul_", torch.sub: "sub_", torch.div: "div_"}
"""Arithmetic with an in-place method of the same computation (same rounding: one op)."""


def _is_copy_into(node: fx.Node) -> bool:
    """``dst.copy_(src)`` as a method or an aten call, with no other argument."""
    return len(node.args) == 2 and not node.kwargs and (
        (node.op == "call_method" and node.target == "copy_")
        or (node.op == "call_function" and node.target is torch.ops.aten.copy_.default))


def arithmetic_into_update(graph: fx.Graph, metas: dict[fx.Node, Any],
                            view_of: dict[fx.Node, fx.Node]) -> None:
    """``dst.copy_(op(dst, other))`` where nothing else reads ``op``'s result, as
    ``dst.op_(other)``: how an update in place comes out of a functional graph (dynamo's
    ``fma`` and ``copy_`` for Adam's ``exp_avg_sq.addcmul_``, torch.export's copies into
    mutated buffers). One pass over ``dst`` instead of two, and no new tensor. Only where
    the result has ``dst``'s shape and dtype (no broadcast or promotion for the copy to
    undo) and ``other`` is not another view of ``dst``'s storage (an in-place op refuses
    an operand that partly overlaps what it writes)."""
    writes = _writes_before(graph)
    for copy in [n for n in graph.nodes if _is_copy_into(n)]:
        dst, value = copy.args
        if not _binary_call(value, _IN_PLACE_TWINS):
            continue
        a, other = value.args
        if a is not dst and value.target in (torch.add, torch.mul):
            a, other = other, a
        written, made = metas.get(dst), metas.get(value)
        if a is not dst or getattr(written, "kind", None) != "tensor" or getattr(
                made, "kind", None) != "tensor" or (written.shape, written.dtype) != (
                made.shape, made.dtype):
            continue
        if isinstance(other, fx.Node) and other is not dst and (
                view_of.get(other, other) is view_of.get(dst, dst)):
            continue
        if not _unwritten(writes, [value], copy):
            continue
        with graph.inserting_before(copy):
            update = graph.call_method(_IN_PLACE_TWINS[value.target], (dst, other))
        writes[update] = writes[copy]
        copy.replace_all_uses_with(update)
        graph.erase_node(copy)
        graph.erase_node(value)
        if update.target == "add_":
            _scaled_into_update(graph, metas, update, writes)


def _scaled_into_update(graph: fx.Graph, metas: dict[fx.Node, Any], update: fx.Node,
                        writes: dict[fx.Node, int]) -> None:
    """``dst.add_(a * b * v)`` or ``dst.add_(a / b * v)`` (``v`` a number, ``* v``
    optional) as ``dst.addcmul_(a, b, value=v)`` or ``addcdiv_``, Adam's spelling, and
    ``dst.add_(y * v)`` as ``dst.add_(y, alpha=v)``: one pass where the products made new
    tensors. Only where every product has ``dst``'s dtype (``addcmul_`` computes in it,
    where ``a * b`` of float16 operands rounds to float16 first)."""
    dst, term = update.args
    dtype = metas[dst].dtype
    product, value = _scaled(term)
    if not isinstance(term, fx.Node) or getattr(metas.get(term), "dtype", None) != dtype:
        return
    if _binary_call(product, (torch.mul, torch.div)) and all(
            isinstance(a, fx.Node) for a in product.args) and getattr(
            metas.get(product), "dtype", None) == dtype:
        method = "addcmul_" if product.target is torch.mul else "addcdiv_"
        args, kwargs, made = (dst, *product.args), {"value": value}, [term, product]
    elif product is not term and _fits_alpha(product, value, term, metas):
        method, args, kwargs, made = "add_", (dst, product), {"alpha": value}, [term]
    else:
        return
    if not _unwritten(writes, made, update):
        return
    with graph.inserting_before(update):
        fused = graph.call_method(method, args, {k: v for k, v in kwargs.items() if v != 1})
    update.replace_all_uses_with(fused, propagate_meta=True)
    graph.erase_node(update)
    for node in dict.fromkeys(made):
        graph.erase_node(node)


def _fits_alpha(y: Any, scale: float, scaled: fx.Node, metas: dict[fx.Node, Any]) -> bool:
    """Whether ``y * scale`` (the node ``scaled``) may be ``add``'s ``alpha`` on ``y``:
    a tensor of the product's dtype (no promotion by the scale), and an integer scale for
    an integer tensor (torch refuses a floating alpha there)."""
    meta = metas.get(y) if isinstance(y, fx.Node) else None
    if getattr(meta, "kind", None) != "tensor" or meta.dtype != getattr(
            metas.get(scaled), "dtype", None):
        return False
    return meta.dtype.is_floating_point or meta.dtype.is_complex or type(scale) is int


def scale_into_add(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``x + y * s`` (``s`` a number, nothing else reading the product) as
    ``torch.add(x, y, alpha=s)``: one pass and no new tensor for the product, one rounding
    where there were two (GPT-2's ``x + 0.044715 * x ** 3``; scores scaled by
    ``1 / sqrt(d)`` plus a mask)."""
    writes = _writes_before(graph)
    for node in _plain_sums(graph):
        for term, other in (node.args, node.args[::-1]):
            y, scale = _scaled(term)
            # (``v + v`` with ``v = y * s``: the sum reads the product twice, it must stay)
            if y is term or other is term or not isinstance(other, fx.Node) or getattr(
                    metas.get(other), "kind", None) != "tensor" or not _fits_alpha(
                    y, scale, term, metas) or not _unwritten(writes, [term], node):
                continue
            with graph.inserting_before(node):
                fused = graph.call_function(torch.add, (other, y), {"alpha": scale})
            metas[fused], writes[fused] = metas.get(node), writes[node]
            node.replace_all_uses_with(fused, propagate_meta=True)
            graph.erase_node(node)
            graph.erase_node(term)
            break


def lerp_into_update(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """``dst.addcmul_(full_like(d, w), d)`` with ``d = end - dst`` (``w`` a number) as
    ``dst.lerp_(end, w)``: dynamo's spelling of ``torch._foreach_lerp_`` (Adam's first
    moment with ``foreach=True``), which made a tensor of ``w`` and the difference, and
    ran three passes where ``lerp_`` runs one. Only where ``end`` has ``dst``'s dtype and
    shape and no call between the difference and the update writes into a tensor."""
    writes = _writes_before(graph)
    for update in [n for n in graph.nodes if n.op == "call_method" and n.target == "addcmul_"
                   and len(n.args) == 3 and not n.kwargs]:
        dst, filled, difference = update.args
        if not (_binary_call(filled, torch.full_like)
                and _binary_call(difference, torch.sub, users=2)
                and filled.args[0] is difference and difference.args[1] is dst
                and isinstance(filled.args[1], (int, float))
                and not isinstance(filled.args[1], bool)):
            continue
        end = difference.args[0]
        written, given = metas.get(dst), metas.get(end) if isinstance(end, fx.Node) else None
        if getattr(written, "kind", None) != "tensor" or getattr(given, "kind", None) != (
                "tensor") or (written.shape, written.dtype) != (given.shape, given.dtype):
            continue
        if not _unwritten(writes, [difference, filled], update):
            continue
        with graph.inserting_before(update):
            fused = graph.call_method("lerp_", (dst, end, filled.args[1]))
        writes[fused] = writes[update]
        update.replace_all_uses_with(fused, propagate_meta=True)
        graph.erase_node(update)
        graph.erase_node(filled)
        graph.erase_node(difference)


def row_major_first(graph: fx.Graph, metas: dict[fx.Node, Any]) -> None:
    """Give a commutative elementwise call an operand laid out row-major first, where its
    first is a permuted view (``torch.add(x.permute(0, 2, 1), pos)`` ->
    ``torch.add(pos, x.permute(0, 2, 1))``). An elementwise result takes the layout of its
    first full-size operand, and the next kernels take it from there: Whisper's encoder
    adds its position embedding to its convolutions' permuted output, and every residual
    sum after it kept that layout, where a layer norm took 7.4x and an add 19x their time
    on row-major operands (1500 x 512). The same values: ``a + b`` is ``b + a`` in floating
    point. Permuted views are tracked through the emitted calls (a permute or transpose
    makes one, reshapes and elementwise calls keep their operand's, any other call
    writes a new tensor row-major); a layout the graph's inputs bring is not seen.
    :func:`extractors.peak.peak_of` predicts the same order.

    >>> g = fx.Graph()
    >>> x, pos = g.placeholder("x"), g.placeholder("pos")
    >>> p = g.call_function(torch.permute, (x, (0, 2, 1)))
    >>> y = g.call_function(torch.add, (p, pos))
    >>> _ = g.output(y)
    >>> meta = lambda *shape: type("Meta", (), {"shape": shape})()
    >>> row_major_first(g, {x: meta(1, 4, 3), pos: meta(3, 4), p: meta(1, 3, 4),
    ...                     y: meta(1, 3, 4)})
    >>> [a.name for a in y.args]
    ['pos', 'permute']
    """
    permuted: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        operands = [a for a in node.args if isinstance(a, fx.Node)]
        shape = getattr(metas.get(node), "shape", None)
        if node.target in PERMUTING_CALLS:
            permuted.add(node)
        elif node.target in LAYOUT_KEEPING_CALLS and operands and operands[0] in permuted:
            permuted.add(node)
        elif _elementwise(node) and shape is not None:
            full = [a for a in operands if full_size(getattr(metas.get(a), "shape", None),
                                                     shape)]
            if (node.target in COMMUTATIVE_CALLS and not node.kwargs and len(node.args) == 2
                    and len(full) == 2 and full[0] in permuted and full[1] not in permuted):
                node.args = (node.args[1], node.args[0])
            elif full and full[0] in permuted:
                permuted.add(node)


def _elementwise(node: fx.Node) -> bool:
    lowered = lower(node.target, node.args, node.kwargs)
    if not is_expression(lowered):
        return False
    entry = TABLE.get(lowered[0])
    return entry is not None and entry.kind == "pointwise"


def peephole(graph: fx.Graph, metas: dict[fx.Node, Any], copies: set[fx.Node],
             allocated: set[fx.Node], view_of: dict[fx.Node, fx.Node]) -> None:
    """Run the passes over an emitted ``graph``, in place: ``metas`` holds each emitted
    node's analysis data (shape, dtype), ``copies`` the copies emission made for in-place
    updates, ``allocated`` its new tensors, ``view_of`` each view's base."""
    bias_into_matmul(graph, metas)
    row_major_first(graph, metas)
    update_in_place(graph, copies, allocated)
    arithmetic_into_update(graph, metas, view_of)
    scale_into_add(graph, metas)
    lerp_into_update(graph, metas)
