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

from egraph.extract.program import program_order, program_roots, source_program
from egraph.ops.table import names

VIEWS = names(kind="view")
"""Ops that move no data (the op table's views)."""
LIBRARY = names(kind="library") | names(kind="opaque")
"""Ops that run as their own kernel: library kernels, and calls kept as they were."""


@dataclass
class Region:
    """Classes computed by one kernel, the classes it reads from outside, and the ones
    whose values leave it."""

    classes: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    inputs: set[int] = field(default_factory=set)
    outputs: set[int] = field(default_factory=set)
    library: bool = False


def _is_tensor(egraph, cid: int) -> bool:
    meta = egraph.data(cid)
    return getattr(meta, "kind", None) == "tensor"


def regions(egraph, choice: dict[int, tuple] | None = None) -> list[Region]:
    """The kernels of the program ``choice`` (default: the source program), in order."""
    find = egraph.find
    if choice is None:
        choice = source_program(egraph)
    order, roots = program_order(egraph, choice), program_roots(egraph)
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
        if op in LIBRARY:
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
