"""Cost models over the tensor vocabulary: what "best" means.

A cost model gives each e-node a local cost from what the analysis knows of its class and
its children (shapes, dtypes); a program's cost is the sum over its e-nodes (tree
extraction counts a shared subterm per use, DAG extraction once). Models combine: weighted
sums (``Flops() + 1e-3 * Memory()``) and lexicographic order (``Lexicographic(a, b)``).

* :class:`Flops`: floating-point operations (matmul 2mnk, convolution, attention, norms,
  elementwise and reductions), layout ops and views free.
* :class:`Memory`: bytes moved, each op reading its inputs and writing its output once
  (views move nothing).
* :class:`Roofline`: time on a hardware profile, each op a kernel:
  ``max(flops / peak, bytes / bandwidth) + launch overhead``.

>>> import torch
>>> from egraph import EGraph
>>> eg = EGraph.from_fx(torch.nn.Linear(64, 32), (torch.randn(8, 64),))
>>> round(Flops().program_cost(eg))  # 2 * 8 * 32 * 64 multiply-adds, plus the bias
33024
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egraph.egraph import current_cache
from egraph.extract.program import program_order, program_roots, source_program
from egraph.ops.table import TABLE, names
from extractors.fusion import regions
from extractors.hardware import HARDWARE, Hardware

# From the op table: ops that compute nothing, views, and ops that move no bytes.
_FREE = names(flops=0.0)
_VIEWS = names(kind="view")
_NO_TRAFFIC = _VIEWS | names(kind="leaf") | names(kind="shape")


def _meta(egraph, cid: int):
    return egraph.data(cid)


def _numel(meta) -> int:
    shape = getattr(meta, "shape", None)  # a symbolic size counts as the example's
    return math.prod(map(int, shape)) if shape is not None else 0


def _bytes(meta) -> int:
    dtype = getattr(meta, "dtype", None)
    size = getattr(dtype, "itemsize", 4) if dtype is not None else 4
    return _numel(meta) * size


_SOURCES = frozenset({"param", "const"})
_PER_CALL = (names(kind="leaf") | names(kind="opaque")) - _SOURCES  # inputs, opaque calls
# per e-graph: (its version when asked, class -> parameter-only)
_COMPUTED_ONCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def parameter_only(egraph, cid: int) -> bool:
    """True when class ``cid`` is computed from parameters, constants and literals alone:
    emission folds such a subexpression (the concatenated weights of merged projections)
    into a value computed once, not per call (``backends.folding.FoldedConstants``), so the cost
    models charge nothing for it.

    >>> import torch
    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> [parameter_only(eg, c) for c in eg.roots]
    [False]
    """
    return _parameter_only(egraph, egraph.find(cid), _known(egraph))


def _known(egraph) -> dict[int, bool]:
    """The classes known to be parameter-only or not, for the e-graph as it is now."""
    return current_cache(_COMPUTED_ONCE, egraph)


def _parameter_only(egraph, cid: int, known: dict[int, bool]) -> bool:
    """Whether class ``cid`` has an e-node of parameters, constants and literals alone,
    memoised in ``known``. Depth-first with a stack of its own: a folded network's chains
    of parameter-only e-nodes (a RegNet's, 1,400 classes) are deeper than Python's
    recursion allows. A class in progress counts as not constant (a cycle through it
    does not make it constant)."""
    if cid in known:
        return known[cid]
    find = egraph.find

    def start(c: int) -> list | None:
        """The frame that decides class ``c``, or None where it is decided at once."""
        kind = getattr(_meta(egraph, c), "kind", None)
        nodes = egraph.nodes(c)
        if kind == "literal" or any(n.op in _SOURCES for n in nodes):
            known[c] = True
            return None
        known[c] = False
        if kind != "tensor":
            return None
        candidates = [n.children for n in nodes
                      if isinstance(n.op, str) and n.op not in _PER_CALL and n.children]
        return [c, candidates, 0, 0] if candidates else None

    frame = start(cid)
    frames = [frame] if frame is not None else []
    while frames:
        frame = frames[-1]
        c, candidates, i, j = frame
        if i == len(candidates):  # no e-node of constants alone
            frames.pop()
        elif j == len(candidates[i]):  # every child of this e-node is constant
            known[c] = True
            frames.pop()
        else:
            kid = find(candidates[i][j])
            if kid not in known:
                child = start(kid)
                if child is not None:
                    frames.append(child)
            elif known[kid]:
                frame[3] = j + 1
            else:
                frame[2], frame[3] = i + 1, 0
    return known[cid]


def _computed_once(egraph, node: tuple) -> bool:
    """An e-node of parameters, constants and literals only (with a tensor among them)."""
    kids = node[1:]
    if not kids or node[0] in _SOURCES:
        return False
    known, find = _known(egraph), egraph.find
    return all(_parameter_only(egraph, find(k), known) for k in kids) and any(
        getattr(_meta(egraph, k), "kind", None) == "tensor" for k in kids)


def flops(egraph, cid: int, node: tuple) -> float:
    """Floating-point operations of one e-node (0 for leaves, literals, views and
    parameter-only subexpressions, computed once when the module is emitted)."""
    op = node[0]
    if len(node) == 1 or op in _FREE or not isinstance(op, str):
        return 0.0
    if _computed_once(egraph, node):
        return 0.0
    out = _meta(egraph, cid)
    if getattr(out, "kind", None) != "tensor":
        return 0.0
    kids = [_meta(egraph, k) for k in node[1:]]
    n = _numel(out)
    entry = TABLE.get(op)
    if entry is None:  # an op of another vocabulary: one per element
        return float(n)
    if callable(entry.flops):
        return entry.flops(n, kids)
    return float(entry.flops * _elements(entry, n, kids))


def _elements(entry, out_numel: int, kids: list) -> int:
    """The elements an op's work is counted over: reductions and library ops per input
    element, pointwise ops per output one."""
    return _numel(kids[0]) if entry.kind in ("reduction", "library") else out_numel


def _work_elements(egraph, cid: int, node: tuple) -> int:
    """The elements one e-node's work is counted over (:func:`_elements`)."""
    entry = TABLE.get(node[0])
    n = _numel(_meta(egraph, cid))
    if entry is None:
        return n
    return _elements(entry, n, [_meta(egraph, k) for k in node[1:]])


def _variant(egraph, node: tuple) -> str | None:
    """Which form of its op an e-node computes, where an attribute names it (GELU's
    ``approximate="tanh"``): the first string literal among its arguments."""
    for k in node[2:]:
        value = getattr(_meta(egraph, k), "value", None)
        if isinstance(value, str):
            return value
    return None


def bytes_moved(egraph, cid: int, node: tuple) -> float:
    """Bytes one e-node reads and writes as its own kernel (0 for views, leaves and
    parameter-only subexpressions)."""
    op = node[0]
    if len(node) == 1 or op in _NO_TRAFFIC or not isinstance(op, str):
        return 0.0
    if _computed_once(egraph, node):
        return 0.0
    out = _meta(egraph, cid)
    if getattr(out, "kind", None) != "tensor":
        return 0.0
    reads = sum(_bytes(_meta(egraph, k)) for k in node[1:]
                if getattr(_meta(egraph, k), "kind", None) == "tensor")
    return float(reads + _bytes(out))


class CostModel:
    """What a cost model gives extraction: the protocol every model here follows.

    A model is a class with:

    * ``node_cost(egraph, cid, node) -> cost``: the cost of one e-node on its own, not
      counting its children. ``cid`` is the canonical class the e-node is in, ``node`` the
      e-node as a tuple ``(op, child class, ...)``; ``egraph.data(cid)`` is what the
      analysis knows of the class (for a tensor program: ``kind``, ``shape``, ``dtype``,
      value range), and of each child class alike. Greedy extraction adds an e-node's cost
      to its children's (a tree cost); DAG and ILP extraction, the report and
      :meth:`program_cost` count each chosen e-node once (a DAG cost).
    * Costs are numbers ``>= 0`` (int or float, finite) that add with ``+`` and compare with
      ``<``; a leaf should cost something (or every e-node above it should) so that a
      cycle never looks free. Greedy extraction also accepts any other value that adds and
      compares (:class:`Lexicographic` gives tuples compared in order); DAG and ILP
      extraction need plain numbers. ``additive`` says which: True (the default) where
      node costs are plain numbers, so ``extract``'s default method pays each shared e-node
      once (DAG-aware); False where only greedy extraction applies.
    * Optionally, ``program_cost(egraph, choice=None) -> cost``: the cost of a whole
      program (``choice``: class -> chosen e-node; default the source program,
      :func:`egraph.extract.source_program`). The default sums :meth:`node_cost` over the
      e-nodes reached from the roots, each once. A model whose true cost is not such a sum
      (fusion-aware time, peak memory) overrides it and sets ``local = False``: extraction
      then optimises the node costs as a proxy and improves the result under
      ``program_cost`` by local search.

    Subclassing :class:`CostModel` gives the default ``program_cost``, ``+`` and ``*``
    (weighted sums). A user's own model, counting each call of ``exp`` as ten ops and
    every other op as one:

    >>> import torch
    >>> from egraph import EGraph
    >>> class ExpHeavy(CostModel):
    ...     def node_cost(self, egraph, cid, node):
    ...         if len(node) == 1 or node[0] in ("input", "param", "const"):
    ...             return 0  # literals, and the leaves that name an input or a weight
    ...         return 10 if node[0] == "exp" else 1
    >>> f = lambda x: torch.exp(x) * torch.exp(x)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(4),))
    >>> ExpHeavy().program_cost(eg)  # exp computed once, then squared
    11
    >>> opt = eg.extract(ExpHeavy() + 0.5 * Flops())
    >>> opt.meta["egraph_report"].cost_after < 20
    True
    """

    local = True
    additive = True

    def node_cost(self, egraph, cid: int, node: tuple) -> Any:
        """The cost of one e-node, without its children (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must define node_cost")

    def bind(self, egraph) -> Callable[[int, tuple, list], Any]:
        """The function greedy extraction calls: ``(class id, e-node, child costs) ->
        node_cost + sum(child costs)``."""
        node_cost = self.node_cost

        def total(cid: int, node: tuple, child_costs: list) -> Any:
            cost = node_cost(egraph, cid, node)
            for c in child_costs:
                cost = cost + c
            return cost

        return total

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> Any:
        """DAG cost of a program: each chosen e-node reached from the roots (and effects)
        counted once; default choice: the source program."""
        if choice is None:
            choice = source_program(egraph)
        total: Any = 0
        for c in program_order(egraph, choice):
            total = total + self.node_cost(egraph, c, choice[c])
        return total

    def __add__(self, other: CostModel) -> CostModel:
        return WeightedSum([(1.0, self), (1.0, other)])

    def __mul__(self, weight: float) -> CostModel:
        return WeightedSum([(float(weight), self)])

    __rmul__ = __mul__


class WeightedSum(CostModel):
    """``sum(weight * model)`` of several cost models."""

    def __init__(self, terms: list[tuple[float, CostModel]]):
        flat: list[tuple[float, CostModel]] = []
        for w, m in terms:
            if isinstance(m, WeightedSum):
                flat.extend((w * w2, m2) for w2, m2 in m.terms)
            else:
                flat.append((w, m))
        self.terms = flat

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        return sum(w * m.node_cost(egraph, cid, node) for w, m in self.terms)

    def __repr__(self) -> str:
        return " + ".join(f"{w:g} * {m!r}" for w, m in self.terms)


@dataclass(frozen=True, order=True)
class LexCost:
    """A cost compared component by component (first decides, then the next...)."""

    parts: tuple

    def __add__(self, other: Any) -> LexCost:
        if isinstance(other, LexCost):
            return LexCost(tuple(a + b for a, b in zip(self.parts, other.parts)))
        if other == 0:
            return self
        return NotImplemented

    __radd__ = __add__

    def __repr__(self) -> str:
        return "(" + ", ".join(f"{p:.6g}" for p in self.parts) + ")"


class Lexicographic(CostModel):
    """The first model decides; ties go to the next (``Lexicographic(Curvature(), Flops())``:
    stability first, then speed). Its costs are tuples: greedy extraction only."""

    additive = False

    def __init__(self, *models: CostModel):
        self.models = models

    def node_cost(self, egraph, cid: int, node: tuple) -> LexCost:
        return LexCost(tuple(m.node_cost(egraph, cid, node) for m in self.models))

    def program_cost(self, egraph, choice=None) -> LexCost:
        return LexCost(tuple(m.program_cost(egraph, choice) for m in self.models))

    def __repr__(self) -> str:
        return f"Lexicographic({', '.join(map(repr, self.models))})"


class Flops(CostModel):
    """Floating-point operations: matmul ``2mnk``, linear and convolution likewise plus the
    bias, attention ``4 L S D + 5 L S`` per head, norms a few per element, reductions one
    per input element, elementwise one per output element (a few for GELU, SiLU, sigmoid);
    views, layout ops, leaves and literals are free. A tiny per-e-node term (1e-6) breaks
    ties towards fewer ops."""

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        return flops(egraph, cid, node) + (1e-6 if len(node) > 1 else 0.0)

    def __repr__(self) -> str:
        return "Flops()"


class Memory(CostModel):
    """Bytes moved: each op reads its tensor inputs and writes its output once, at its
    dtype's size; views and leaves move nothing (plus 1e-6 per e-node for ties)."""

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        return bytes_moved(egraph, cid, node) + (1e-6 if len(node) > 1 else 0.0)

    def __repr__(self) -> str:
        return "Memory()"


class Roofline(CostModel):
    """Time in seconds on a hardware profile: the sum over kernels of
    ``max(flops / peak, bytes / bandwidth) + launch overhead``; a view costs a picosecond,
    so ties go to fewer ops (two nested splits where one would do are an extra call).

    Fusion-aware (``fused=True``, the default): the kernels are the program's fusion
    regions (:mod:`extractors.fusion`); a region reads its inputs and writes its outputs
    once, whatever happens inside. Extraction optimises the per-op time as a proxy, then
    improves the choice under the fused time. ``fused=False`` charges each op as its own
    kernel (a plain sum). ``hardware`` is a :class:`Hardware` or a profile name.
    """

    def __init__(self, hardware: str | Hardware = "H100", fused: bool = True):
        if isinstance(hardware, str):
            if hardware not in HARDWARE:
                raise ValueError(f"no hardware profile {hardware!r}; profiles: "
                                 f"{', '.join(HARDWARE)}")
            hardware = HARDWARE[hardware]
        self.hardware = hardware
        self.fused = fused
        self.local = not fused
        # per e-graph: (its version when asked, (class, e-node) -> cost); one extraction asks
        # for each e-node's cost several times (the DAG pass, the source program, the
        # local search), and each answer walks the e-node's operands
        self._node_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> float:
        if not self.fused:
            return super().program_cost(egraph, choice)
        if choice is None:
            choice = source_program(egraph)
        hw = self.hardware
        total = 0.0
        for region in regions(egraph, choice):
            f = sum(flops(egraph, c, choice[c]) for c in region.classes)
            if region.library:
                b = sum(bytes_moved(egraph, c, choice[c]) for c in region.classes)
            else:
                b = sum(_bytes(_meta(egraph, k)) for k in region.inputs | region.outputs)
            if f == 0 and b == 0:
                continue
            dtype = getattr(_meta(egraph, region.classes[0]), "dtype", None)
            peak = hw.peak_flops(region.ops[0] if region.library else "add", dtype)
            measured = sum(self._element_time(egraph, c, choice[c]) for c in region.classes)
            fixed = hw.launch_overhead + (hw.extern_time(region.ops[0]) if region.library
                                          else 0.0)
            total += max(f / peak, measured, hw.moving(b)) + fixed
        return total

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        costs = current_cache(self._node_costs, egraph)
        cost = costs.get((cid, node))
        if cost is None:
            cost = costs[cid, node] = self._node_cost(egraph, cid, node)
        return cost

    def __getstate__(self) -> dict:  # copies and pickles leave the cache behind
        return {k: v for k, v in self.__dict__.items() if k != "_node_costs"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _node_costs=weakref.WeakKeyDictionary())

    def _node_cost(self, egraph, cid: int, node: tuple) -> float:
        f = flops(egraph, cid, node)
        b = bytes_moved(egraph, cid, node)
        if f == 0 and b == 0:
            return 1e-12 if len(node) > 1 else 0.0
        dtype = getattr(_meta(egraph, cid), "dtype", None)
        hw = self.hardware
        kernels, passes = hw.kernels_and_passes(node[0])
        compute = max(f / hw.peak_flops(node[0], dtype), self._element_time(egraph, cid, node))
        fixed = kernels * hw.launch_overhead + (hw.extern_time(node[0]) if self.fused else 0.0)
        return max(compute, passes * hw.moving(b)) + fixed

    def _element_time(self, egraph, cid: int, node: tuple) -> float:
        """The measured compute time of one e-node (``Hardware.element_seconds``); 0 where
        its op has none or it computes nothing per call."""
        hw = self.hardware
        if node[0] not in hw.measured_ops or not flops(egraph, cid, node):
            return 0.0
        return hw.element_time(node[0], _work_elements(egraph, cid, node),
                               _variant(egraph, node))

    def __repr__(self) -> str:
        return f"Roofline({self.hardware.name!r}{'' if self.fused else ', fused=False'})"


class PeakMemory(CostModel):
    """Peak bytes of live tensors when the program runs in order, each value freed after
    its last use (inputs and parameters not counted). Not a sum over e-nodes: extraction
    uses the bytes each op writes as its proxy, then improves the choice under the peak."""

    local = False

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        if len(node) == 1 or node[0] in _VIEWS or node[0] in ("input", "param", "const"):
            return 0.0
        return float(_bytes(_meta(egraph, cid))) + 1e-6

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> float:
        if choice is None:
            choice = source_program(egraph)
        order, roots = program_order(egraph, choice), program_roots(egraph)
        find = egraph.find
        last_use: dict[int, int] = {}
        for i, c in enumerate(order):
            for k in choice[c][1:]:
                last_use[find(k)] = i
        for r in roots:
            last_use[r] = len(order)
        live = peak = 0.0
        owner: dict[int, int] = {}  # a view keeps its base alive: count bytes once
        for i, c in enumerate(order):
            node = choice[c]
            size = self.node_cost(egraph, c, node)
            if node[0] in _VIEWS and len(node) > 1:
                owner[c] = owner.get(find(node[1]), find(node[1]))
            live += size
            peak = max(peak, live)
            for k in {find(k) for k in node[1:]}:
                base = owner.get(k, k)
                if last_use.get(k) == i and last_use.get(base, -1) <= i:
                    live -= self.node_cost(egraph, base, choice[base])
        return peak

    def __repr__(self) -> str:
        return "PeakMemory()"


# Mantissa bits and largest finite value of each working dtype.
_FORMATS = {"float64": (53, 1.7976931348623157e308), "float32": (24, 3.4028234663852886e38),
            "float16": (11, 65504.0), "bfloat16": (8, 3.3895313892515355e38)}
_BOUNDED = names(stable=True)  # the op table's fused, numerically stable ops


def _format(meta) -> tuple[int, float]:
    name = str(getattr(meta, "dtype", "torch.float32")).removeprefix("torch.")
    return _FORMATS.get(name, _FORMATS["float32"])


def _magnitude(meta) -> tuple[float, float]:
    """Smallest and largest |value| (observed on the examples, or bounded by the range)."""
    lo, hi = getattr(meta, "lo", -math.inf), getattr(meta, "hi", math.inf)
    top = max(abs(lo), abs(hi))
    bottom = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
    return max(bottom, getattr(meta, "small", 0.0)), top


class Curvature(CostModel):
    """Numerical risk of a program: each op's bits of the working precision at risk, added
    as ulps (``2**bits - 1``, so the total is additive and dominated by the worst op) and
    reported on the log scale, ``log2(1 + total)`` bits (:meth:`to_bits`).

    Per op, from the value ranges of its inputs (observed on example inputs, or given by
    the user) and its dtype, clipped to the mantissa width (24 bits in fp32, 11 in fp16):

    * overflow costs every bit: an output bound past the dtype's largest value, or ``exp``
      of more than ``log(max)`` (88.7 in fp32, 11.09 in fp16);
    * ``log`` of a range reaching 0, and division by a range containing 0, cost every bit;
    * an op amplifies the relative error already in an inexact input by its condition
      number ``k``, costing ``log2(1 + k)`` bits: ``exp`` ``|x|``, ``log`` ``1/|ln x|``,
      ``pow`` ``|p|``; exact inputs (graph inputs, parameters, literals) carry no error;
    * ``exp(a) * exp(b)`` (and ``exp(a) / exp(b)``) with exponents that can push opposite
      ways costs what ``exp(a + b)`` costs, ``log2(1 + |a| + |b|)``: its factors overflow
      before the product does, so it is never preferred to the combined form for accuracy;
    * ``a +- b`` costs the bits lost to cancellation, ``log2((|a| + |b|) / |a +- b|)``,
      unless both operands are exact (``log(1 + x)`` for tiny x is charged at the log,
      whose condition number ``1/|ln(1 + x)|`` is what amplifies the rounding of 1 + x);
    * where the example inputs were run (small graphs, or ``observe=True``), each value's
      measured sensitivity ``s`` (how much a relative error in it moves the outputs)
      shifts its bits by ``log2(s)``: risk in a value the outputs ignore does not count;
    * fused stable ops (softmax, logsumexp, log1p, ...) cost a bounded 1 bit, other ops half
      a bit of rounding.

    The stability design's curvature bounds (``e^(2x)`` for exp, ``1/x^2`` for log,
    ``1/|d|^3`` for division) rank programs in the same direction but charge accurate
    operations on exact inputs; condition numbers of inexact inputs and explicit overflow
    and cancellation terms track the measured error more closely (benchmarks/stability).
    What a whole program's error is on sample inputs, per element, is measured by
    :func:`frontends.fx.error_analysis.rounding_error`; that is what
    ``compiler.stability.StabilityRewriter`` reports as curvature and checks each rewrite
    against, and experiment 3 correlates both with the error measured at 60 digits.

    >>> import torch
    >>> from egraph import EGraph
    >>> x = torch.linspace(-100, 100, 64).reshape(4, 16)
    >>> naive = lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    >>> stable = lambda x: torch.softmax(x, -1)
    >>> costs = [Curvature().program_cost(EGraph.from_fx(torch.fx.symbolic_trace(f), (x,)))
    ...          for f in (naive, stable)]
    >>> [round(Curvature.to_bits(c), 1) for c in costs]  # bits at risk
    [24.0, 1.0]
    """

    # Accuracy is the objective: the pipeline also runs Herbie's search on the elementwise
    # formulas of the program this cost extracts (compiler.herbie, on the example inputs).
    refine_accuracy = True

    def __init__(self, rounding: float = 0.5):
        self.rounding = rounding

    def bits(self, egraph, cid: int, node: tuple) -> float:
        """The bits one e-node puts at risk (after its measured sensitivity, if any)."""
        bits = self._local_bits(egraph, cid, node)
        sens = getattr(_meta(egraph, cid), "sens", math.nan)
        if bits <= self.rounding or sens != sens or not math.isfinite(sens):
            return bits
        # A value whose relative errors barely reach the outputs (measured on the examples)
        # puts fewer bits at risk; one the outputs amplify, more (up to the whole mantissa).
        cap, _ = _format(_meta(egraph, cid))
        return min(float(cap), max(self.rounding, bits + math.log2(max(sens, 1e-300))))

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        """Units in the last place at risk, ``2**bits - 1``: errors from different ops add
        in ulps, so the program's total is additive; :meth:`to_bits` puts it back on the
        log scale."""
        bits = self.bits(egraph, cid, node)
        return 2.0 ** bits - 1.0 if bits else 0.0

    @staticmethod
    def to_bits(total: float) -> float:
        """A total of ulps at risk as bits of precision at risk: ``log2(1 + total)``."""
        return math.log2(1.0 + total)

    def _local_bits(self, egraph, cid: int, node: tuple) -> float:
        op = node[0]
        if len(node) == 1 or not isinstance(op, str) or op in _FREE:
            return 0.0
        out = _meta(egraph, cid)
        if getattr(out, "kind", None) != "tensor":
            return 0.0
        bits, largest = _format(out)
        # An unbounded range means "not known", not overflow; a finite bound past the
        # dtype's largest value is an overflow.
        if any(math.isfinite(v) and abs(v) > largest
               for v in (getattr(out, "lo", 0.0), getattr(out, "hi", 0.0))):
            return float(bits)
        kids = [_meta(egraph, k) for k in node[1:]]
        if op in _BOUNDED:
            return 1.0
        if op in ("add", "sub"):
            return min(float(bits), self._cancellation(egraph, node, out, kids))
        if op in ("mul", "div"):
            split = self._split_exponent(egraph, node)
            if split > self.rounding:
                return min(float(bits), split)
        x = kids[0]
        lo, hi = getattr(x, "lo", -math.inf), getattr(x, "hi", math.inf)
        exact = _is_exact(egraph, node[1])
        if op == "exp":
            if hi > math.log(largest):
                return float(bits)
            cond = max(abs(lo), abs(hi))
        elif op == "log":
            if lo == hi:
                return self.rounding  # a constant input: nothing to amplify
            if lo <= 0 and getattr(x, "small", 0.0) == 0:
                return float(bits)
            smallest_log, _ = _magnitude(out)  # |ln x| at the values seen (or bounded)
            cond = 1.0 / smallest_log if smallest_log > 0 else math.inf
        elif op in ("div", "reciprocal"):
            small, _ = _magnitude(kids[-1])
            return float(bits) if small == 0 else self.rounding
        elif op == "pow":
            p = getattr(kids[1], "value", None)
            cond = abs(p) if isinstance(p, (int, float)) else math.inf
        else:
            return self.rounding
        if exact or not math.isfinite(lo) or not math.isfinite(hi):
            return self.rounding
        return min(float(bits), max(self.rounding, math.log2(1.0 + cond)))

    def _split_exponent(self, egraph, node: tuple) -> float:
        """Bits at risk in ``exp(a) * exp(b)`` (or ``exp(a) / exp(b)``) where the exponents
        can push opposite ways: the factors overflow before ``exp(a +- b)`` does (``a = 100,
        b = -50`` in float32), so the product is charged what ``exp`` of the combined
        exponent is charged, ``log2(1 + |a| + |b|)``, and is no cheaper than that form."""
        exponents = []
        cnodes, find = egraph.class_nodes, egraph.find
        for k in node[1:3]:
            inner = next((n[1] for n in cnodes[find(k)] or () if n[0] == "exp"), None)
            if inner is None:
                return 0.0
            exponents.append(_meta(egraph, inner))
        (a_lo, a_hi), (b_lo, b_hi) = [(getattr(m, "lo", -math.inf), getattr(m, "hi", math.inf))
                                      for m in exponents]
        if node[0] == "div":
            b_lo, b_hi = -b_hi, -b_lo
        if (a_lo >= 0 and b_lo >= 0) or (a_hi <= 0 and b_hi <= 0):
            return 0.0  # same signs: the product overflows no later than its factors
        top = _magnitude(exponents[0])[1] + _magnitude(exponents[1])[1]
        return math.log2(1.0 + top) if math.isfinite(top) else math.inf

    def _cancellation(self, egraph, node: tuple, out, kids) -> float:
        """Bits lost by ``a +- b``: the condition number ``(|a| + |b|) / |a +- b|`` over
        the observed magnitudes (capped by the dtype's precision), unless both operands
        are exact."""
        (_, a_top), (_, b_top) = _magnitude(kids[0]), _magnitude(kids[1])
        risk = self.rounding
        if all(_is_exact(egraph, k) for k in node[1:]) or not math.isfinite(a_top + b_top):
            return risk
        # Operands that always push the same way cannot cancel: the condition number is 1.
        a_lo, a_hi = getattr(kids[0], "lo", -math.inf), getattr(kids[0], "hi", math.inf)
        b_lo, b_hi = getattr(kids[1], "lo", -math.inf), getattr(kids[1], "hi", math.inf)
        if node[0] == "sub":
            b_lo, b_hi = -b_hi, -b_lo
        if (a_lo >= 0 and b_lo >= 0) or (a_hi <= 0 and b_hi <= 0):
            return risk
        r_low, _ = _magnitude(out)
        bits, _ = _format(out)
        floor = (a_top + b_top) * 2.0 ** -bits
        return max(risk, math.log2((a_top + b_top) / max(r_low, floor)) if a_top + b_top else 0)

    def __repr__(self) -> str:
        return "Curvature()"


_EXACT_OPS = names(exact=True)  # the op table's ops that never round


def _is_exact(egraph, cid: int, depth: int = 4) -> bool:
    """A class whose value carries no rounding error: a leaf (input, parameter, literal),
    or an operation that only moves, negates or selects exact values."""
    find = egraph.find
    for n in egraph.class_nodes[find(cid)] or ():
        if len(n) == 1 or n[0] in ("input", "param", "const"):
            return True
        if depth and n[0] in _EXACT_OPS and all(
                _is_exact(egraph, k, depth - 1) for k in n[1:]
                if getattr(_meta(egraph, k), "kind", None) == "tensor"):
            return True
    return False
