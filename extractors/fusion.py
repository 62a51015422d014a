"""Fusion regions of a chosen program: which ops would run as one kernel.

Pointwise ops, broadcasts and row reductions over one iteration space fuse into a region
whose intermediates never touch memory: the region reads its external inputs once and
writes the values used outside it once. Matrix products, convolutions and attention stay
their own kernels (their libraries' kernels); the pointwise epilogue that follows them
(bias, activation, residual add) joins the next region. Views cost nothing and belong to
no region. This is what the fusion-aware :class:`~extractors.costs.Roofline` charges, and
what the Triton backend generates kernels for.

>>> import torch
>>> from egraph import EGraph
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x * 2) + 1),
...                     (torch.randn(8, 8),))
>>> [sorted(r.ops) for r in regions(eg)]
[['add', 'exp', 'mul']]
"""

from __future__ import annotations

from dataclasses import dataclass, field

POINTWISE = {
    "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "abs", "pow", "sin",
    "cos", "tanh", "sigmoid", "relu", "silu", "gelu", "erf", "log1p", "expm1", "reciprocal",
    "sign", "logsigmoid", "softplus", "maximum", "minimum", "where", "masked_fill", "clamp",
    "eq", "ne", "lt", "le", "gt", "ge", "logaddexp", "hypot", "to", "floor", "ceil",
    "bitwise_not", "logical_not",
}
REDUCTIONS = {"sum", "mean", "amax", "amin", "var", "logsumexp", "softmax", "log_softmax",
              "layer_norm", "rms_norm"}
VIEWS = {"reshape", "permute", "transpose", "expand", "unsqueeze", "squeeze", "flatten",
         "getitem", "split", "chunk"}
LIBRARY = {"matmul", "linear", "conv1d", "conv2d", "sdpa", "embedding", "gather", "batch_norm",
           "cat", "stack", "cumsum", "tril", "triu"}


@dataclass
class Region:
    """Classes computed by one kernel, the classes it reads from outside, and the ones
    whose values leave it."""

    classes: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    inputs: set[int] = field(default_factory=set)
    outputs: set[int] = field(default_factory=set)
    library: bool = False


def _program(egraph, choice):
    find = egraph.find
    if choice is None:
        choice = {c: egraph._cnodes[c][0] for c in egraph.classes()}
    roots = [find(r) for r in egraph.roots]
    if getattr(egraph, "fx", None) is not None:
        roots += [find(e) for e in egraph.fx.effects]
    order: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        c, done = stack.pop()
        if done:
            order.append(c)
            continue
        if c in seen:
            continue
        seen.add(c)
        stack.append((c, True))
        stack.extend((find(k), False) for k in reversed(choice[c][1:]))
    return choice, order, roots


def _is_tensor(egraph, cid: int) -> bool:
    meta = egraph._data[egraph.find(cid)]
    return getattr(meta, "kind", None) == "tensor"


def regions(egraph, choice: dict[int, tuple] | None = None) -> list[Region]:
    """The kernels of the program ``choice`` (default: the source program), in order."""
    find = egraph.find
    choice, order, roots = _program(egraph, choice)
    consumers: dict[int, set[int]] = {}
    for c in order:
        for k in choice[c][1:]:
            consumers.setdefault(find(k), set()).add(c)
    region_of: dict[int, Region] = {}
    out: list[Region] = []
    for c in order:
        node = choice[c]
        op = node[0]
        if len(node) == 1 or not isinstance(op, str) or op in VIEWS or not _is_tensor(
                egraph, c) or op in ("input", "param", "const"):
            continue
        kids = [find(k) for k in node[1:] if _is_tensor(egraph, k)]
        if op in LIBRARY or op == "opaque":
            region = Region(library=True)
            out.append(region)
        else:
            # Join the regions of the fusible producers (through views) whose values stay
            # inside, merged into one kernel when there are several; a new region otherwise.
            joined: list[Region] = []
            for k in kids:
                producer = _through_views(egraph, choice, k)
                r = region_of.get(producer)
                if r is not None and not r.library and all(r is not j for j in joined) and (
                        consumers.get(producer, set()) <= {c} | _view_users(
                            egraph, choice, consumers, producer)):
                    joined.append(r)
            if not joined:
                region = Region()
                out.append(region)
            else:
                region = joined[0]
                for other in joined[1:]:
                    for member in other.classes:
                        region_of[member] = region
                    region.classes.extend(other.classes)
                    region.ops.extend(other.ops)
                    out.remove(other)
        region.classes.append(c)
        region.ops.append(op)
        region_of[c] = region
    for region in out:
        members = set(region.classes)
        for c in region.classes:
            for k in choice[c][1:]:
                k = find(k)
                if _is_tensor(egraph, k) and _through_views(egraph, choice, k) not in members:
                    region.inputs.add(k)
            users = consumers.get(c, set())
            if c in roots or any(region_of.get(u) is not region for u in users):
                region.outputs.add(c)
    return out


def _through_views(egraph, choice, cid: int) -> int:
    find = egraph.find
    cid = find(cid)
    while choice.get(cid) is not None and choice[cid][0] in VIEWS and len(choice[cid]) > 1:
        cid = find(choice[cid][1])
    return cid


def _view_users(egraph, choice, consumers, cid: int) -> set[int]:
    """Classes that reach ``cid``'s value through views only (they do not read memory)."""
    out: set[int] = set()
    for u in consumers.get(cid, set()):
        if choice[u][0] in VIEWS:
            out.add(u)
            out |= _view_users(egraph, choice, consumers, u)
    return out
