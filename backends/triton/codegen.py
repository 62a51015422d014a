"""Triton source for a kernel spec, as a reader would write it.

Three shapes of kernel, all over an iteration space whose axes are grouped the way one
call's tensors lie in memory (:class:`Layout`: adjacent axes that every tensor steps through
contiguously are merged, so contiguous tensors index with a single ``row``/``col``/``index``
and transposed or broadcast ones with one coordinate per group):

* pointwise: ``BLOCK`` elements per program, masked at the ragged end;
* rows held in registers ("persistent"): ``BLOCK_R`` rows of ``BLOCK_N >= cols``
  elements per program, every statement once, reductions along ``axis=1``;
* looped rows, for rows longer than one block (a 50k-wide vocabulary): one pass over the
  row per level of reductions, each recomputing what it needs from the inputs and
  accumulating lane-wise (the softmax denominator online, rescaled as the maximum grows),
  then a last pass that computes and stores the outputs.

Every input is read through its own strides (zero for broadcast dims), every output is
written with its own; reductions accumulate in fp32 (fp64 for fp64 data).

A pointwise kernel with a broadcast operand (``y`` has no stride along the rows):

>>> import torch
>>> from egraph import EGraph
>>> from backends.triton.regions import plan
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x, y: torch.exp(x) * y),
...                     (torch.randn(4, 10), torch.randn(10)))
>>> spec = plan(eg)[0].kernel.spec
>>> print(generate(spec, contiguous_layout(spec, looped=False), "k"))
import triton
import triton.language as tl
<BLANKLINE>
<BLANKLINE>
@triton.jit
def k(x0_ptr, x0_stride_0, x0_stride_1, x1_ptr, x1_stride_1, out0_ptr, out0_stride_0, out0_stride_1,
      size_0, size_1, BLOCK: tl.constexpr):
    # v0 = exp(x0)
    # v1 = mul(v0, x1)
    # out0 = v1
    numel = size_0 * size_1
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = index < numel
    index_1 = index % size_1
    index_0 = index // size_1
    x0 = tl.load(x0_ptr + index_0 * x0_stride_0 + index_1 * x0_stride_1, mask=mask, other=0)
    exp_0 = tl.exp(x0)
    x1 = tl.load(x1_ptr + index_1 * x1_stride_1, mask=mask, other=0)
    mul_1 = exp_0 * x1
    tl.store(out0_ptr + index_0 * out0_stride_0 + index_1 * out0_stride_1, mul_1, mask=mask)
<BLANKLINE>
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

from backends.triton.spec import KernelSpec, TensorArg
from backends.triton.templates import HELPERS, Stmt, helpers_for, storage_type

_NEG_INF = '-float("inf")'
_POS_INF = 'float("inf")'


@dataclass(frozen=True)
class Layout:
    """How one call's tensors map onto the iteration space of a spec.

    ``groups`` lists the merged axis groups: the rows' groups first (``rows`` of them),
    then the columns' (or, for a pointwise kernel, all of the index's). ``strided[t][g]``
    says whether tensor ``t`` (inputs, then outputs) moves along group ``g``. ``looped``
    selects the looped row kernel; ``wide`` 64-bit offsets.

    >>> Layout(groups=((0, 1),), rows=0, strided=((True,), (True,))).groups
    ((0, 1),)
    """

    groups: tuple[tuple[int, ...], ...]
    rows: int
    strided: tuple[tuple[bool, ...], ...]
    looped: bool = False
    wide: bool = False


def contiguous_layout(spec: KernelSpec, looped: bool) -> Layout:
    """The layout of a call on contiguous tensors (what :attr:`FusedKernel.source` shows).

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.sum(-1)),
    ...                     (torch.randn(2, 3, 5),))
    >>> contiguous_layout(plan(eg)[0].kernel.spec, looped=False).groups
    ((0, 1), (2,))
    """
    args = spec.inputs + spec.outputs
    return layout_of(spec, [axis_strides(spec, a, _contiguous(a.shape)) for a in args], looped,
                     wide=False)


def _contiguous(shape: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    step = 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return out[::-1]


def axis_strides(spec: KernelSpec, arg: TensorArg, strides: tuple[int, ...] | list[int]
                 ) -> list[int]:
    """A tensor's stride along each axis of the iteration space (0 where it is constant).

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x, b: x + b),
    ...                     (torch.randn(4, 3), torch.randn(3)))
    >>> spec = plan(eg)[0].kernel.spec
    >>> axis_strides(spec, spec.inputs[1], (1,))
    [0, 1]
    """
    along = [0] * len(spec.space)
    for axis, stride in zip(arg.axes, strides):
        if axis is not None:
            along[axis] += stride
    return along


def layout_of(spec: KernelSpec, strides: list[list[int]], looped: bool, wide: bool) -> Layout:
    """The layout for tensors (inputs, then outputs) with the given :func:`axis_strides`:
    adjacent axes of the rows (and of the columns) that every tensor steps through
    contiguously become one group.

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + 1),
    ...                     (torch.randn(3, 4),))
    >>> spec = plan(eg)[0].kernel.spec
    >>> layout_of(spec, [[4, 1], [4, 1]], looped=False, wide=False).groups  # contiguous
    ((0, 1),)
    >>> layout_of(spec, [[1, 3], [4, 1]], looped=False, wide=False).groups  # transposed in
    ((0,), (1,))
    """
    if spec.reduced is None:
        parts = [list(range(len(spec.space)))]
    else:
        parts = [[p for p in range(len(spec.space)) if p not in spec.reduced],
                 list(spec.reduced)]
    groups: list[tuple[int, ...]] = []
    counts = []
    for part in parts:
        merged: list[list[int]] = []
        for p in part:
            if merged and all(a[merged[-1][-1]] == a[p] * spec.space[p] for a in strides):
                merged[-1].append(p)
            else:
                merged.append([p])
        groups += [tuple(g) for g in merged]
        counts.append(len(merged))
    strided = tuple(tuple(a[g[-1]] != 0 for g in groups) for a in strides)
    rows = counts[0] if spec.reduced is not None else 0
    return Layout(tuple(groups), rows, strided, looped, wide)


class _Source:
    """Lines of a kernel body at the current indentation, wrapped at 100 columns."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, line: str) -> None:
        indent = "    " * self.depth
        line = indent + line
        while len(line) > _WIDTH:
            cut = _break_point(line)
            if cut < 0:
                break
            self.lines.append(line[:cut + 1].rstrip())
            line = indent + "    " + line[cut + 1:].lstrip()
        self.lines.append(line)


_WIDTH = 100


def _break_point(line: str) -> int:
    """The last ``", "`` inside brackets before column 100 (-1: none)."""
    depth, best = 0, -1
    for i, ch in enumerate(line[:_WIDTH]):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth > 0:
            best = i
    return best


class _Kernel:
    """The pieces every kernel shape shares: names, coordinates, loads and stores."""

    def __init__(self, spec: KernelSpec, layout: Layout, name: str):
        self.spec = spec
        self.layout = layout
        self.name = name
        self.tensors = [f"x{i}" for i in range(len(spec.inputs))] + [
            f"out{i}" for i in range(len(spec.outputs))]
        rows = layout.rows
        n_groups = len(layout.groups)
        if spec.reduced is None:
            self.labels = self._labels("index", n_groups)
            self.sizes = ["numel"] if n_groups == 1 else self._labels("size", n_groups)
        else:
            self.labels = self._labels("row", rows) + self._labels("col", n_groups - rows)
            self.sizes = (self._labels("rows", rows) + self._labels("cols", n_groups - rows))
        self.row_groups = set(range(rows)) if spec.reduced is not None else set()
        self.stmts = {s.name: s for s in spec.stmts}

    @staticmethod
    def _labels(base: str, n: int) -> list[str]:
        return [base] if n == 1 else [f"{base}_{i}" for i in range(n)]

    def signature(self) -> str:
        args = []
        for t, strided in enumerate(self.layout.strided):
            args.append(f"{self.tensors[t]}_ptr")
            args += [self.stride(t, g) for g, s in enumerate(strided) if s]
        args += self.sizes
        if self.spec.reduced is None:
            args.append("BLOCK: tl.constexpr")
        else:
            args += ["BLOCK_R: tl.constexpr", "BLOCK_N: tl.constexpr"]
        head = f"def {self.name}("
        body = textwrap.fill(", ".join(args), width=100 - len(head), break_long_words=False,
                             break_on_hyphens=False)
        lines = body.splitlines()
        return "\n".join([head + lines[0]] + [" " * len(head) + ln for ln in lines[1:]]) + "):"

    def stride(self, t: int, g: int) -> str:
        """The name of tensor ``t``'s stride along group ``g`` (``x0_stride_col``)."""
        if self.spec.reduced is None:
            return f"{self.tensors[t]}_stride" + ("" if len(self.labels) == 1 else f"_{g}")
        return f"{self.tensors[t]}_stride_{self.labels[g]}"

    def coordinates(self, out: _Source, groups: list[int], whole: str) -> None:
        """``whole`` (a flat coordinate) split into one coordinate per group."""
        if len(groups) < 2:
            return
        for k in reversed(range(len(groups))):
            later = [self.sizes[g] for g in groups[k + 1:]]
            div = later[0] if len(later) == 1 else f"({' * '.join(later)})"
            label, size = self.labels[groups[k]], self.sizes[groups[k]]
            if k == len(groups) - 1:
                out(f"{label} = {whole} % {size}")
            elif k == 0:
                out(f"{label} = {whole} // {div}")
            else:
                out(f"{label} = {whole} // {div} % {size}")

    def totals(self, out: _Source, groups: list[int], total: str) -> None:
        if not groups:
            out(f"{total} = 1")
        elif len(groups) > 1:
            out(f"{total} = {' * '.join(self.sizes[g] for g in groups)}")

    def offset(self, t: int) -> tuple[str, bool, bool]:
        """The offset of tensor ``t`` and whether it moves with the rows and the columns."""
        terms, rows, cols = [], False, False
        for g, strided in enumerate(self.layout.strided[t]):
            if not strided:
                continue
            terms.append(f"{self.labels[g]} * {self.stride(t, g)}")
            if g in self.row_groups:
                rows = True
            else:
                cols = True
        return " + ".join(terms), rows, cols

    def mask(self, rows: bool, cols: bool) -> str:
        if self.spec.reduced is None:
            return "mask" if cols else ""
        return {(True, True): "mask", (True, False): "row_mask", (False, True): "col_mask",
                (False, False): ""}[rows, cols]

    def load(self, stmt: Stmt) -> str:
        off, rows, cols = self.offset(stmt.index)
        arg = self.spec.inputs[stmt.index]
        ptr = f"x{stmt.index}_ptr" + (f" + {off}" if off else "")
        mask = self.mask(rows, cols)
        text = f"tl.load({ptr}, mask={mask}, other=0)" if mask else f"tl.load({ptr})"
        if storage_type(arg.dtype) != stmt.dtype:
            text += f".to({stmt.dtype})"
        return f"{stmt.name} = {text}"

    def store(self, i: int) -> str:
        t = len(self.spec.inputs) + i
        off, rows, cols = self.offset(t)
        # an output constant along the rows (or everywhere) still gets a block of pointers,
        # all to the same place: the lanes store the same value there
        if self.spec.reduced is None and not off:
            off, cols = "0 * index", True
        elif self.spec.reduced is not None and not rows:
            off, rows = " + ".join(filter(None, [off, "0 * row"])), True
        arg = self.spec.outputs[i]
        value = self.spec.stores[i]
        if storage_type(arg.dtype) != self.stmts[value].dtype:
            value = f"{value}.to({storage_type(arg.dtype)})"
        ptr = f"out{i}_ptr" + (f" + {off}" if off else "")
        mask = self.mask(rows, cols)
        return f"tl.store({ptr}, {value}" + (f", mask={mask})" if mask else ")")

    def uses_cols(self, name: str, memo: dict[str, bool]) -> bool:
        """True when statement ``name`` varies along the columns in this layout."""
        if name not in memo:
            s = self.stmts[name]
            if s.kind == "load":
                memo[name] = self.offset(s.index)[2]
            elif s.kind == "expr":
                memo[name] = any(self.uses_cols(a, memo) for a in s.args)
            else:
                memo[name] = False
        return memo[name]

    def expr(self, stmt: Stmt) -> str:
        return f"{stmt.name} = {stmt.text.format(*stmt.args)}"

    def statement(self, stmt: Stmt) -> str:
        return self.load(stmt) if stmt.kind == "load" else self.expr(stmt)

    def preamble(self, out: _Source) -> None:
        for line in self.spec.describe():
            out(f"# {line}")

    def source(self, body: list[str]) -> str:
        text = "\n".join(body)
        helpers = helpers_for(text)
        parts = ["import triton", "import triton.language as tl", ""]
        for h in helpers:
            parts.append(HELPERS[h].rstrip())
            parts.append("")
        parts += ["", "@triton.jit", self.signature(), text, ""]
        return "\n".join(parts)


def generate(spec: KernelSpec, layout: Layout, name: str) -> str:
    """The Triton source of ``spec`` for ``layout``: helper jit functions, then the
    kernel ``name``.

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.tanh(x).sum(-1)),
    ...                     (torch.randn(3, 4),))
    >>> spec = plan(eg)[0].kernel.spec
    >>> source = generate(spec, contiguous_layout(spec, looped=True), "k")
    >>> "def _tanh(x):" in source, "for start in range(0, cols, BLOCK_N):" in source
    (True, True)
    """
    k = _Kernel(spec, layout, name)
    out = _Source()
    k.preamble(out)
    if spec.reduced is None:
        _pointwise(k, out)
    elif layout.looped:
        _looped(k, out)
    else:
        _persistent(k, out)
    return k.source(out.lines)


def _pointwise(k: _Kernel, out: _Source) -> None:
    groups = list(range(len(k.layout.groups)))
    k.totals(out, groups, "numel")
    pid = "tl.program_id(0).to(tl.int64)" if k.layout.wide else "tl.program_id(0)"
    out(f"index = {pid} * BLOCK + tl.arange(0, BLOCK)")
    out("mask = index < numel")
    k.coordinates(out, groups, "index")
    for s in k.spec.stmts:
        out(k.statement(s))
    for i in range(len(k.spec.outputs)):
        out(k.store(i))


def _rows(k: _Kernel, out: _Source) -> None:
    rows = list(range(k.layout.rows))
    cols = list(range(k.layout.rows, len(k.layout.groups)))
    k.totals(out, rows, "rows")
    k.totals(out, cols, "cols")
    pid = "tl.program_id(0).to(tl.int64)" if k.layout.wide else "tl.program_id(0)"
    out(f"row = {pid} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    out("row_mask = row < rows")
    k.coordinates(out, rows, "row")


def _columns(k: _Kernel, out: _Source, start: str) -> None:
    cols = list(range(k.layout.rows, len(k.layout.groups)))
    offset = f"{start} + " if start else ""
    col = f"{offset}tl.arange(0, BLOCK_N)[None, :]"
    out(f"col = ({col}).to(tl.int64)" if k.layout.wide and start else f"col = {col}")
    out("col_mask = col < cols")
    k.coordinates(out, cols, "col")
    out("mask = row_mask & col_mask")


_NEUTRAL = {"sum": "0.0", "max": _NEG_INF, "min": _POS_INF}
_REDUCE = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}


def _persistent(k: _Kernel, out: _Source) -> None:
    _rows(k, out)
    _columns(k, out, "")
    for s in k.spec.stmts:
        if s.kind in ("load", "expr"):
            out(k.statement(s))
        elif s.kind == "sumexp":
            x, shift = s.args
            out(f"{s.name} = tl.sum(tl.where(mask, tl.exp({x} - {shift}), 0.0), axis=1, "
                "keep_dims=True)")
        else:
            out(f"{s.name} = {_REDUCE[s.kind]}(tl.where(mask, {s.args[0]}, {_NEUTRAL[s.kind]}),"
                " axis=1, keep_dims=True)")
    for i in range(len(k.spec.outputs)):
        out(k.store(i))


def _passes(spec: KernelSpec) -> dict[int, list[Stmt]]:
    """The reductions of ``spec`` by the loop over the columns that computes them: a
    reduction of a value that needs ``p`` reductions first is in pass ``p``."""
    level: dict[str, int] = {}
    passes: dict[int, list[Stmt]] = {}
    for s in spec.stmts:
        if s.kind == "load":
            level[s.name] = 0
        elif s.kind == "expr":
            level[s.name] = max((level[a] for a in s.args), default=0)
        else:
            p = level[s.args[0]]
            passes.setdefault(p, []).append(s)
            level[s.name] = p + 1
    return passes


def _accumulate(reductions: list[Stmt], out: _Source) -> None:
    """Fold one block of columns into each reduction's accumulator (masked lanes
    neutral); a sum of exponentials keeps its running maximum beside its sum."""
    for s in reductions:
        a = s.args[0]
        if s.kind == "sum":
            out(f"{s.name}_acc += tl.where(mask, {a}, 0.0)")
        elif s.kind in ("max", "min"):
            fn = "tl.maximum" if s.kind == "max" else "tl.minimum"
            out(f"{s.name}_acc = {fn}({s.name}_acc, tl.where(mask, {a}, "
                f"{_NEUTRAL[s.kind]}))")
        else:
            out(f"{s.name}_acc, {s.name}_max = _online_sumexp({s.name}_acc, {s.name}_max, "
                f"tl.where(mask, {a}, {_NEG_INF}))")


def _looped(k: _Kernel, out: _Source) -> None:
    spec = k.spec
    memo: dict[str, bool] = {}
    passes = _passes(spec)
    _rows(k, out)
    done: set[str] = set()

    def rows_ready() -> None:
        for s in spec.stmts:
            if (s.name not in done and s.kind in ("load", "expr")
                    and not k.uses_cols(s.name, memo) and all(a in done for a in s.args)):
                out(k.statement(s))
                done.add(s.name)

    def loop_body(targets: list[str]) -> None:
        _columns(k, out, "start")
        needed: set[str] = set()
        stack = [t for t in targets if k.uses_cols(t, memo)]
        while stack:
            name = stack.pop()
            if name not in needed:
                needed.add(name)
                stack += [a for a in k.stmts[name].args if k.uses_cols(a, memo)]
        for s in spec.stmts:
            if s.name in needed:
                out(k.statement(s))

    rows_ready()
    for p in sorted(passes):
        reductions = passes[p]
        out(f"# pass {p + 1}: " + ", ".join(s.name for s in reductions))
        for s in reductions:
            dtype = s.dtype
            if s.kind == "sumexp":
                out(f"{s.name}_max = tl.full([BLOCK_R, BLOCK_N], {_NEG_INF}, {dtype})")
                out(f"{s.name}_acc = tl.zeros([BLOCK_R, BLOCK_N], {dtype})")
            else:
                out(f"{s.name}_acc = tl.full([BLOCK_R, BLOCK_N], {_NEUTRAL[s.kind]}, {dtype})")
        out("for start in range(0, cols, BLOCK_N):")
        out.depth += 1
        loop_body([s.args[0] for s in reductions])
        _accumulate(reductions, out)
        out.depth -= 1
        for s in reductions:
            if s.kind != "sumexp":
                out(f"{s.name} = {_REDUCE[s.kind]}({s.name}_acc, axis=1, keep_dims=True)")
                done.add(s.name)
        rows_ready()
        for s in reductions:
            if s.kind == "sumexp":
                shift = s.args[1]
                out(f"{s.name} = _sumexp_rows({s.name}_acc, {s.name}_max, {shift})")
                done.add(s.name)
        rows_ready()
    outputs = range(len(spec.outputs))
    along = [i for i in outputs if k.offset(len(spec.inputs) + i)[2]]
    if along:
        out("# last pass: the outputs")
        out("for start in range(0, cols, BLOCK_N):")
        out.depth += 1
        loop_body([spec.stores[i] for i in along])
        for i in along:
            out(k.store(i))
        out.depth -= 1
    for i in outputs:
        if i not in along:
            out(k.store(i))


def block_sizes(spec: KernelSpec, row_limit: int, loop_block: int, tile: int,
                pointwise: int) -> tuple[bool, dict[str, int], int, int]:
    """``(looped, constexpr block sizes, num_warps, programs)`` for a spec: power-of-two
    blocks, whole rows in one block up to ``row_limit`` elements, ``loop_block`` per step
    beyond, about ``tile`` elements per program for short rows.

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.softmax(-1) * 2),
    ...                     (torch.randn(3, 50257),))
    >>> block_sizes(plan(eg)[0].kernel.spec, 8192, 2048, 4096, 1024)
    (True, {'BLOCK_R': 1, 'BLOCK_N': 2048}, 8, 3)
    """
    numel = math.prod(spec.space)
    if spec.reduced is None:
        block = min(pointwise, _pow2(numel))
        return False, {"BLOCK": block}, _warps(block), -(-numel // block)
    cols = math.prod(spec.space[p] for p in spec.reduced)
    rows = numel // cols
    if _pow2(cols) > row_limit:
        return True, {"BLOCK_R": 1, "BLOCK_N": min(loop_block, _pow2(cols))}, 8, rows
    block_n = _pow2(cols)
    block_r = min(_pow2(rows), max(1, tile // block_n))
    return False, {"BLOCK_R": block_r, "BLOCK_N": block_n}, _warps(block_r * block_n), -(
        -rows // block_r)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(elements: int) -> int:
    return 4 if elements <= 2048 else 8 if elements <= 8192 else 16
