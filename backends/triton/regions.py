"""From fusion regions to kernel specs: what each generated kernel computes.

:func:`plan` takes the regions of a chosen program (:func:`extractors.fusion.regions`:
pointwise ops, broadcasts and row reductions whose intermediates stay inside), keeps those
the Roofline model says pay (one fused kernel is faster than one kernel per op) and lowers
each to a :class:`KernelSpec`: its inputs and outputs, its iteration space and the
statements of :mod:`backends.triton.templates`. Library ops (matrix products, convolutions,
attention) stay torch calls; their epilogues are the next region's first ops.

The iteration space is found by unifying axes: every axis of every value is an axis of the
space or constant (size 1); broadcasting identifies the axes it aligns, views inside the
region (unsqueeze, squeeze, expand, permute, transpose, reshapes that only add or drop size-1
dims) relabel them, and a row reduction marks the axes it reduces. A region lowers when all
its reductions reduce the same axes (the rows' columns); the rest are the rows. Anything
else (a reshape that merges dims, a slice, an integer reduction) keeps the region eager.

>>> import torch
>>> from egraph import EGraph
>>> fn = lambda x, w: torch.softmax(x * w, -1)
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(6, 10), torch.randn(10)))
>>> [f.kernel.spec.space for f in plan(eg)]
[(6, 10)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.triton.spec import KernelSpec, StepRef, TensorArg
from backends.triton.templates import (
    POINTWISE,
    ROW_OPS,
    Builder,
    Operand,
    Unsupported,
    attributes_of,
    compute_type,
)
from egraph.dims import is_symbolic
from egraph.extract.program import program_roots, source_program
from egraph.term import is_literal_op
from extractors.costs import Roofline, flops
from extractors.fusion import VIEWS, Region, regions
from frontends.fx.analysis import literal_value
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from backends.triton.launch import FusedKernel
    from egraph.egraph import EGraph

# Fewer rows than this, each longer than that, stay eager: torch splits a long reduction
# across the GPU, a row kernel runs each row in one program.
_FEW_ROWS, _LONG_ROW = 16, 1 << 16

@dataclass
class Fusion:
    """A region emitted as one kernel call: the classes it reads (in argument order), the
    classes it returns (in result order) and every class it computes.

    >>> import torch
    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + 1),
    ...                     (torch.randn(3),))
    >>> fusion = plan(eg)[0]
    >>> len(fusion.inputs), len(fusion.outputs), len(fusion.members)
    (1, 1, 2)
    """

    kernel: FusedKernel
    inputs: list[int]
    outputs: list[int]
    members: set[int]


def pays(egraph: EGraph, choice: dict[int, tuple], region: Region, judge: Roofline) -> bool:
    """True when the Roofline time of ``region`` as one kernel (inputs read and outputs
    written once) is below its time as one kernel per op.

    >>> import torch
    >>> from egraph import EGraph
    >>> from extractors.fusion import regions
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(64, 64),))
    >>> choice = source_program(eg)
    >>> [pays(eg, choice, r, Roofline()) for r in regions(eg, choice)]
    [True]
    """
    if any(egraph.data(c).shape is None or is_symbolic(egraph.data(c).shape)
           for c in region.classes):
        return False  # symbolic shapes: a kernel is built for one shape
    hw = judge.hardware
    single = Roofline(hw, fused=False)
    alone = sum(single.node_cost(egraph, c, choice[c]) for c in region.classes)
    work = sum(flops(egraph, c, choice[c]) for c in region.classes)
    moved = sum(_nbytes(egraph, k) for k in region.inputs | region.outputs)
    dtype = egraph.data(region.classes[0]).dtype
    fused = max(work / hw.peak_flops("add", dtype), hw.moving(moved)) + hw.launch_overhead
    return fused < alone


def _nbytes(egraph: EGraph, cid: int) -> int:
    meta = egraph.data(cid)
    return math.prod(meta.shape or ()) * getattr(meta.dtype, "itemsize", 4)


class _Consumers:
    """Who reads each class in the chosen program (reached from the roots)."""

    def __init__(self, egraph: EGraph, choice: dict[int, tuple]):
        find = egraph.find
        self.roots = set(program_roots(egraph))
        self.users: dict[int, set[int]] = {}
        seen: set[int] = set()
        stack = list(self.roots)
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for k in choice[c][1:]:
                k = find(k)
                self.users.setdefault(k, set()).add(c)
                stack.append(k)
        self.choice = choice

    def leaves_region(self, c: int, members: set[int]) -> bool:
        """True when ``c``'s value is needed outside ``members`` (views seen through)."""
        if c in self.roots:
            return True
        for u in self.users.get(c, ()):
            if u in members:
                continue
            if self.choice[u][0] in VIEWS and not self.leaves_region(u, members):
                continue
            return True
        return False


class _Axes:
    """Union-find over axis ids; each id has a size."""

    def __init__(self):
        self.parent: list[int] = []
        self.size: list[int] = []

    def new(self, size: int) -> int:
        self.parent.append(len(self.parent))
        self.size.append(size)
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a != b:
            if self.size[a] != self.size[b]:
                raise Unsupported("broadcast axes of different sizes")
            self.parent[b] = a
        return a


# Per dim of a value: its axis id (None for size 1) and whether the value varies along it.
_Frame = tuple[tuple[int | None, bool], ...]


class _Lowering:
    """One region to one KernelSpec (see the module docstring)."""

    def __init__(self, egraph: EGraph, choice: dict[int, tuple], region: Region,
                 consumers: _Consumers):
        self.eg = egraph
        self.find = egraph.find
        self.choice = choice
        self.members = set(region.classes)
        self.region = region
        self.consumers = consumers
        self.axes = _Axes()
        self.frames: dict[int, _Frame] = {}
        self.refs: dict[int, StepRef] = {}
        self.names: dict[int, str] = {}
        self.inputs: list[int] = []
        self.program: list[tuple] = []
        self.builder = Builder()
        self.reductions: list[set[int]] = []

    # -- values ------------------------------------------------------------------------

    def meta(self, cid: int):
        meta = self.eg.data(cid)
        if meta is None or meta.kind != "tensor":
            return meta
        if meta.shape is None or meta.dtype is None:
            raise Unsupported("a value of unknown shape or dtype")
        if is_symbolic(meta.shape):
            raise Unsupported(f"a value of symbolic shape {meta.shape}: a kernel is built "
                              "for one shape")
        compute_type(meta.dtype)
        return meta

    def literal(self, cid: int) -> Any:
        node = self.choice.get(cid)
        if node is not None and len(node) == 1 and is_literal_op(node[0]):
            return literal_value(node[0])
        meta = self.eg.data(cid)
        if meta is not None and meta.kind in ("literal", "scalar") and (
                meta.value is not None or meta.kind == "literal"):
            return meta.value
        raise Unsupported("an argument that is neither a tensor nor a known scalar")

    def operand(self, cid: int) -> tuple[StepRef, Operand]:
        """The program ref and template operand of child class ``cid``."""
        cid = self.find(cid)
        meta = self.meta(cid)
        if meta is None or meta.kind != "tensor":
            value = self.literal(cid)
            return ("literal", value), Operand(value)
        if cid not in self.refs:
            node = self.choice[cid]
            if cid not in self.members and node[0] in VIEWS and self._inside(cid):
                self.view(cid, node)
            elif cid not in self.members:
                self.refs[cid] = ("input", len(self.inputs))
                self.names[cid] = self.builder.load(len(self.inputs), meta.dtype)
                self.frames[cid] = tuple((self.axes.new(s), True) if s != 1 else (None, False)
                                         for s in meta.shape)
                self.inputs.append(cid)
            else:
                raise Unsupported("a region member used before it is computed")
        return self.refs[cid], Operand(self.names[cid], tensor=True)

    def _inside(self, cid: int) -> bool:
        """True for a view (chain) of a region member."""
        while self.choice[cid][0] in VIEWS and len(self.choice[cid]) > 1:
            cid = self.find(self.choice[cid][1])
        return cid in self.members

    def step(self, cid: int, op: str, refs: list[StepRef]) -> None:
        self.refs[cid] = ("value", len(self.program))
        self.program.append((op, *refs))

    # -- frames ------------------------------------------------------------------------

    def broadcast(self, frames: list[_Frame], shape: tuple[int, ...]) -> _Frame:
        out: list[tuple[int | None, bool]] = []
        n = len(shape)
        for k in range(n):
            ids, varies = [], False
            for f in frames:
                j = len(f) - n + k
                if j >= 0 and f[j][0] is not None:
                    ids.append(f[j][0])
                    varies = varies or f[j][1]
            for other in ids[1:]:
                self.axes.union(ids[0], other)
            if ids:
                out.append((ids[0], varies))
            elif shape[k] != 1:
                raise Unsupported("a broadcast this backend cannot follow")
            else:
                out.append((None, False))
        return tuple(out)

    def view(self, cid: int, node: tuple) -> None:
        """A view of a region member: a relabelling of its frame, no code."""
        op = node[0]
        ref, base = self.operand(node[1])
        frame = self.frames[self.find(node[1])]
        attrs = [self.literal(self.find(k)) for k in node[2:]]
        shape = self.meta(cid).shape
        if op == "permute":
            frame = tuple(frame[d] for d in attrs[0])
        elif op == "transpose":
            a, b = attrs
            f = list(frame)
            f[a], f[b] = f[b], f[a]
            frame = tuple(f)
        elif op == "expand":
            frame = self._expand(frame, shape)
        elif op in ("unsqueeze", "squeeze", "reshape", "flatten"):
            frame = self._regroup(frame, shape)
        else:
            raise Unsupported(f"{op} of a value computed inside the region")
        self.frames[cid] = frame
        self.names[cid] = base.value
        self.step(cid, op, [ref, *(("literal", a) for a in attrs)])

    def _expand(self, frame: _Frame, shape: tuple[int, ...]) -> _Frame:
        lead = len(shape) - len(frame)
        out = [(self.axes.new(s), False) if s != 1 else (None, False) for s in shape[:lead]]
        for (axis, varies), s in zip(frame, shape[lead:]):
            out.append((self.axes.new(s), False) if axis is None and s != 1 else (axis, varies))
        return tuple(out)

    def _regroup(self, frame: _Frame, shape: tuple[int, ...]) -> _Frame:
        kept = [a for a in frame if a[0] is not None]
        if [self.axes.size[a[0]] for a in kept] != [s for s in shape if s != 1]:
            raise Unsupported("a reshape that merges or splits dims inside the region")
        it = iter(kept)
        return tuple(next(it) if s != 1 else (None, False) for s in shape)

    # -- ops ---------------------------------------------------------------------------

    def member(self, cid: int) -> None:
        node = self.choice[cid]
        op = node[0]
        spec = SPECS.get(op)
        if spec is None or not (op in POINTWISE or op in ROW_OPS or op in (
                "ones_like", "zeros_like", "full_like", "full")):
            raise Unsupported(f"no Triton template for {op}")
        attribute_names = attributes_of(op)
        params = dict(zip(spec.params, node[1:]))
        attrs = {p: self.literal(self.find(k)) for p, k in params.items()
                 if p in attribute_names}
        refs: list[StepRef] = []
        operands: list[Operand] = []
        tensors: list[int] = []
        for p, k in params.items():
            if p in attribute_names:
                refs.append(("literal", attrs[p]))
                continue
            ref, operand = self.operand(k)
            refs.append(ref)
            operands.append(operand)
            if operand.tensor:
                tensors.append(self.find(k))
        meta = self.meta(cid)
        if op in ROW_OPS:
            x = self.meta(tensors[0])
            self.names[cid] = self.builder.row(op, operands, attrs, meta.dtype, x.dtype)
            self.frames[cid] = self.row_frame(op, attrs, tensors, meta.shape)
        else:
            self.names[cid] = self.builder.pointwise(op, operands, attrs, meta.dtype)
            if op == "full":
                self.frames[cid] = tuple((self.axes.new(s), False) if s != 1 else (None, False)
                                         for s in meta.shape)
            elif op in ("ones_like", "zeros_like", "full_like"):
                self.frames[cid] = tuple((a, False) for a, _ in self.frames[tensors[0]])
            else:
                self.frames[cid] = self.broadcast([self.frames[t] for t in tensors],
                                                  meta.shape)
        self.step(cid, op, refs)

    def row_frame(self, op: str, attrs: dict, tensors: list[int],
                  shape: tuple[int, ...]) -> _Frame:
        x = self.frames[tensors[0]]
        if op in ("layer_norm", "rms_norm"):
            dims = tuple(range(len(x) - len(attrs["shape"]), len(x)))
            frame = self.broadcast([self.frames[t] for t in tensors], shape)
        else:
            dims = attrs["dim"]
            dims = tuple(range(len(x))) if dims is None else tuple(d % len(x) for d in dims)
            frame = x
        self.reductions.append({x[d][0] for d in dims if x[d][0] is not None})
        if op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
            return frame
        if attrs["keepdim"]:
            return tuple((None, False) if d in dims else a for d, a in enumerate(x))
        return tuple(a for d, a in enumerate(x) if d not in dims)

    # -- the spec ----------------------------------------------------------------------

    def spec(self) -> tuple[KernelSpec, list[int], list[int]]:
        for c in self.region.classes:
            self.member(c)
        outputs = [c for c in self.region.classes
                   if self.consumers.leaves_region(c, self.members)]
        find = self.axes.find
        reduced = None
        if self.reductions:
            sets = {frozenset(find(a) for a in s) for s in self.reductions}
            if len(sets) != 1:
                raise Unsupported("row reductions over different axes")
            reduced_ids = next(iter(sets))
        order: dict[int, int] = {}
        frames = [self.frames[c] for c in outputs] + [self.frames[c] for c in self.inputs]
        for frame in sorted(frames, key=len, reverse=True) + list(self.frames.values()):
            ids = [find(a) for a, _ in frame if a is not None]
            if len(set(ids)) != len(ids):
                raise Unsupported("a value that runs along one axis twice")
            for a in ids:
                order.setdefault(a, len(order))
        space = tuple(self.axes.size[a] for a in order)
        if self.reductions:
            reduced = tuple(sorted(order[a] for a in reduced_ids))
            rows = math.prod(s for p, s in enumerate(space) if p not in reduced)
            if rows < _FEW_ROWS and math.prod(space) // rows > _LONG_ROW:
                # one program per row: a few very long rows would leave the GPU idle
                raise Unsupported(f"{rows} rows of {math.prod(space) // rows} elements")

        def arg(c: int) -> TensorArg:
            meta = self.meta(c)
            axes = tuple(order[find(a)] if a is not None else None for a, _ in self.frames[c])
            return TensorArg(meta.dtype, tuple(meta.shape), axes)

        if not self.inputs:
            raise Unsupported("a region that reads no tensor")
        if any(math.prod(self.meta(c).shape) == 0 for c in [*self.inputs, *outputs]):
            raise Unsupported("an empty tensor: nothing to launch")
        ops = list(dict.fromkeys(step[0] for step in self.program if step[0] not in VIEWS))
        name = "fused_" + "_".join(ops[:3])
        spec = KernelSpec(
            name=name, program=tuple(self.program),
            inputs=tuple(arg(c) for c in self.inputs), outputs=tuple(arg(c) for c in outputs),
            results=tuple(self.refs[c][1] for c in outputs), space=space, reduced=reduced,
            stmts=tuple(self.builder.stmts), stores=tuple(self.names[c] for c in outputs))
        return spec, list(self.inputs), outputs


def lower(egraph: EGraph, choice: dict[int, tuple], region: Region) -> Fusion:
    """The fused kernel of ``region`` (raises :class:`Unsupported` with the reason when it
    cannot be generated).

    >>> import torch
    >>> from egraph import EGraph
    >>> from extractors.fusion import regions
    >>> fn = lambda x: (x - x.mean(-1, keepdim=True)).exp()
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 8),))
    >>> choice = source_program(eg)
    >>> print("\\n".join(lower(eg, choice, regions(eg, choice)[0]).kernel.spec.describe()))
    v0 = mean(x0, (1,), True)
    v1 = sub(x0, v0)
    v2 = exp(v1)
    out0 = v2
    """
    return _lower(egraph, choice, region, _Consumers(egraph, choice))


def _lower(egraph: EGraph, choice: dict[int, tuple], region: Region,
           consumers: _Consumers) -> Fusion:
    from backends.triton.launch import kernel_for

    spec, inputs, outputs = _Lowering(egraph, choice, region, consumers).spec()
    members = set(region.classes)
    if _reads_itself(egraph, choice, inputs, members):
        raise Unsupported("the region reads a value computed from its own outputs")
    return Fusion(kernel_for(spec), inputs, outputs, members)


def _reads_itself(egraph: EGraph, choice: dict[int, tuple], inputs: list[int],
                  members: set[int]) -> bool:
    """True when an input of the kernel depends on one of its members (a view of a member
    feeds another region that feeds this one back): one call could not compute it."""
    find = egraph.find
    seen: set[int] = set()
    stack = [find(k) for k in inputs]
    while stack:
        c = stack.pop()
        if c in members:
            return True
        if c not in seen:
            seen.add(c)
            stack += [find(k) for k in choice[c][1:]]
    return False


def plan(egraph: EGraph, choice: dict[int, tuple] | None = None,
         judge: Roofline | None = None) -> list[Fusion]:
    """The regions of the program ``choice`` (default: the source program) emitted as
    fused kernels, in program order: those that lower and, when a ``judge`` is given, that
    its hardware says pay. Library regions and regions that cannot be lowered stay eager
    torch calls.

    >>> import torch
    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.softmax(x, -1)),
    ...                     (torch.randn(4, 8),))
    >>> len(plan(eg)), len(plan(eg, judge=Roofline()))  # one op alone does not pay
    (1, 0)
    """
    if choice is None:
        choice = source_program(egraph)
    out = []
    consumers = _Consumers(egraph, choice)
    for region in regions(egraph, choice):
        if region.library or (judge is not None and not pays(egraph, choice, region, judge)):
            continue
        try:
            out.append(_lower(egraph, choice, region, consumers))
        except Unsupported:
            continue
    return out
