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

Peak memory, which is not a sum over e-nodes, is :class:`extractors.peak.PeakMemory`.

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
from typing import Any, NamedTuple

from egraph.cache import current_cache
from egraph.enode import ENode
from egraph.extract.program import (
    dag_cost,
    node_costs,
    program_order,
    program_roots,
    source_program,
)
from egraph.ops.table import TABLE, names
from extractors.fusion import regions
from extractors.hardware import (
    HARDWARE,
    MEASURED_ONLY,
    OWN_EMISSION_ONLY,
    ROW_MAJOR_OPERAND,
    Hardware,
)

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


_MEASURED_CONVOLUTIONS = {"conv2d": 0, "onednn_conv2d": 2, "onednn_conv2d_relu": 2}
"""The convolutions own emission prices at their shape's measured time where it has them
(``Roofline(convolution_times=...)``): op -> its place among the times of
:func:`~extractors.convolution_times.convolution_times` (a fused ReLU is a post-op of
oneDNN's, free beside the convolution)."""


def _number_operands(egraph, node: tuple) -> int:
    """How many operands of an elementwise e-node emission passes as Python numbers
    (literals, sizes), each of which the call makes a tensor of; attributes aside."""
    entry = TABLE.get(node[0])
    if entry is None or entry.kind != "pointwise":
        return 0
    count = 0
    for param, k in zip(entry.params, node[1:]):
        meta = _meta(egraph, k)
        value = getattr(meta, "value", None)
        if param not in entry.attributes and getattr(meta, "kind", None) in (
                "literal", "scalar") and isinstance(value, (int, float)) and not isinstance(
                value, bool):
            count += 1
    return count


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


KEEPS_LAYOUT = frozenset({"conv2d", "batch_norm", "max_pool2d", "avg_pool2d"})
"""Library ops whose CPU result takes their first operand's memory format (torch's
convolution and batch norm, the poolings)."""


class LayoutWork(NamedTuple):
    """What a program pays for mixing memory orders (:func:`layout_work`): ``mixed``, the
    elements elementwise ops compute over operands in two orders; ``reordered_weights``,
    the weight elements torch's convolution permutes on every call because its input is
    channels-last and its weight row-major; ``convolutions``, each float32 ``conv2d`` of
    torch's as ``(its shape's key, whether its input is channels-last, the weight
    elements it so permutes)`` (:func:`convolution_key`); ``converted``, the classes of
    those whose input the program converts to channels-last first (asked for with
    ``channels_last_convolutions``); and ``channels_last_outputs``, the elements of the
    program's 4-d outputs left channels-last (emission makes them contiguous where the
    source's were)."""

    mixed: int
    reordered_weights: int
    convolutions: tuple[tuple[tuple, bool, int], ...] = ()
    converted: tuple[int, ...] = ()
    channels_last_outputs: int = 0


CHANNELS_LAST = (0, 2, 3, 1)
"""The order in memory of a channels-last 4-d tensor, outermost dim first."""


def layout_work(egraph, choice: dict[int, tuple], channels_last_convolutions: bool = False
                ) -> LayoutWork:
    """The work the program ``choice`` does because of its operands' orders in memory.
    Each class's order (its dims from the outermost in memory to the innermost) is
    channels-last where its op writes that format (the op table's ``channels_last``:
    oneDNN's convolutions), its operand's order moved by a ``permute`` or ``transpose``,
    its first operand's for :data:`KEEPS_LAYOUT` and for an elementwise op (the first
    operand of the result's shape), and row-major otherwise. An elementwise op whose
    operands of the result's shape differ in order counts its elements in ``mixed``; a
    ``conv2d`` over a channels-last input with a row-major weight counts its weight's
    elements in ``reordered_weights`` where the two orders differ in memory (more than
    one input channel per group and a kernel wider than 1 x 1): torch's CPU convolution
    then permutes the weight to channels-last each call, 5.6x the time of the same
    convolution over row-major operands at ResNet-50's 512 channels, 3 x 3, on one CPU
    (``benchmarks/conv_layouts.py``). :class:`Roofline` charges them at the profile's
    ``mixed_layout`` and ``conv_weight_layout`` times per element.

    ``channels_last_convolutions``: the same program with the input of each float32
    ``conv2d`` of torch's converted to channels-last where it is not already (then
    ``converted``): what emission makes of it where
    :meth:`Roofline.channels_last_convolutions` says it pays.

    >>> import torch
    >>> from egraph import EGraph
    >>> from egraph.extract.program import source_program
    >>> def block(x, w):  # ConvNeXt's: a product over channels between two permutes
    ...     y = torch.nn.functional.linear(x.permute(0, 2, 3, 1), w)  # row-major (N, H, W, C)
    ...     return y.permute(0, 3, 1, 2) + x, y.exp() + 1  # channels-last + row-major
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(block),
    ...                     (torch.randn(1, 2, 3, 3), torch.randn(2, 2)))
    >>> layout_work(eg, source_program(eg)).mixed  # the first sum only
    18
    >>> def stage(x, p, w):  # a convolution over the product's channels-last result
    ...     y = torch.nn.functional.linear(x.permute(0, 2, 3, 1), p).permute(0, 3, 1, 2)
    ...     return torch.nn.functional.conv2d(y, w)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(stage), (torch.randn(1, 4, 6, 6),
    ...                     torch.randn(4, 4), torch.randn(8, 4, 3, 3)))
    >>> layout_work(eg, source_program(eg)).reordered_weights  # 8 x 4 x 3 x 3
    288
    >>> def stack(x, w, v):  # two convolutions, the second over the first's result
    ...     return torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, w).relu(), v)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(stack), (torch.randn(1, 4, 6, 6),
    ...                     torch.randn(4, 4, 1, 1), torch.randn(8, 4, 1, 1)))
    >>> work = layout_work(eg, source_program(eg), channels_last_convolutions=True)
    >>> len(work.converted), [cl for _, cl, _ in work.convolutions], work.channels_last_outputs
    (1, [True, True], 288)
    """
    find = egraph.find
    orders: dict[int, tuple] = {}
    mixed = reordered = 0
    convolutions: list[tuple[tuple, bool, int]] = []
    converted: list[int] = []
    for c in program_order(egraph, choice):
        node = choice[c]
        entry = TABLE.get(node[0]) if isinstance(node[0], str) else None
        meta = _meta(egraph, c)
        shape = getattr(meta, "shape", None)
        if entry is None or shape is None or len(shape) < 2 or len(node) < 2:
            continue
        rank = len(shape)
        first = find(node[1])
        if entry.channels_last and rank == 4:
            orders[c] = CHANNELS_LAST
        elif node[0] in ("permute", "transpose"):
            dims = list(range(rank))
            if node[0] == "permute":
                dims = list(getattr(_meta(egraph, find(node[2])), "value", None) or dims)
            else:
                a, b = (getattr(_meta(egraph, find(k)), "value", None) for k in node[2:4])
                if isinstance(a, int) and isinstance(b, int):
                    dims[a % rank], dims[b % rank] = dims[b % rank], dims[a % rank]
            inner = orders.get(first, tuple(range(rank)))
            if sorted(dims) == list(range(rank)) and len(inner) == rank:
                orders[c] = tuple(dims.index(d) for d in inner)
        elif node[0] in KEEPS_LAYOUT:
            order = orders.get(first)
            key = convolution_key(egraph, node) if node[0] == "conv2d" else None
            if key is not None:
                if channels_last_convolutions and order != CHANNELS_LAST and not (
                        _in_both_orders(key[0])):
                    converted.append(c)
                    order = CHANNELS_LAST
                weights = (_permuted_weight(egraph, orders, find(node[2]))
                           if order == CHANNELS_LAST else 0)
                reordered += weights
                convolutions.append((key, order == CHANNELS_LAST, weights))
            if order is not None:
                orders[c] = order
        elif entry.kind == "pointwise":
            found = [orders.get(k, tuple(range(rank))) for k in map(find, node[1:])
                     if getattr(_meta(egraph, k), "shape", None) == shape]
            if found:
                orders[c] = found[0]
                mixed += _numel(meta) if len(set(found)) > 1 else 0
    outputs = sum(_numel(_meta(egraph, r)) for r in set(map(find, program_roots(egraph)))
                  if orders.get(r) == CHANNELS_LAST)
    return LayoutWork(mixed, reordered, tuple(convolutions), tuple(converted), outputs)


def _in_both_orders(shape: tuple) -> bool:
    """Whether a 4-d tensor of ``shape`` lies alike in memory row-major and channels-last
    (one channel, or one pixel: a squeeze-and-excite's pooled channels)."""
    return shape[1] == 1 or shape[2] * shape[3] == 1


def convolution_key(egraph, node: tuple) -> tuple | None:
    """The :data:`~extractors.convolution_times.ConvolutionKey` of a ``conv2d`` e-node of
    float32 4-d tensors with numbers for its attributes, or None."""
    x, w = (_meta(egraph, egraph.find(k)) for k in node[1:3])
    shapes = [getattr(m, "shape", None) for m in (x, w)]
    if any(s is None or len(s) != 4 for s in shapes) or getattr(x, "dtype", None) is None \
            or str(x.dtype) != "torch.float32":
        return None
    attributes = [getattr(_meta(egraph, egraph.find(k)), "value", None) for k in node[4:8]]
    *pairs, groups = attributes
    pairs = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in pairs]
    if not isinstance(groups, int) or not all(
            len(p) == 2 and all(type(v) is int for v in p) for p in pairs):
        return None
    try:
        sizes = tuple(tuple(map(int, s)) for s in shapes)
    except TypeError:  # (a symbolic size)
        return None
    return (*sizes, *pairs, groups)


def _permuted_weight(egraph, orders: dict[int, tuple], weight: int) -> int:
    """The elements of a convolution's ``weight`` that moving it to channels-last
    permutes in memory: none where it is channels-last already, or where a single input
    channel per group or a 1 x 1 kernel makes the two orders one."""
    shape = getattr(_meta(egraph, weight), "shape", None)
    if orders.get(weight) == (0, 2, 3, 1) or shape is None or len(shape) != 4:
        return 0
    _, per_group, height, width = shape
    return 0 if per_group == 1 or height * width == 1 else _numel(_meta(egraph, weight))


def transposed_matrix(egraph, cid: int) -> bool:
    """Whether class ``cid`` is a transposed matrix whichever form is extracted: one of its
    e-nodes is a ``transpose`` or ``permute`` of a row-major matrix whose dims are both
    longer than 1, and none gives it in row-major order (an op that computes it anew, a
    view of a row-major tensor). A kernel of
    :data:`~extractors.hardware.ROW_MAJOR_OPERAND` copies it first.

    >>> import torch
    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda g, x: (g.t() @ x, g.t(), g.t().t())),
    ...                     (torch.randn(8, 4), torch.randn(8, 3)))
    >>> [transposed_matrix(eg, c) for c in eg.roots]
    [False, True, False]
    """
    return _matrix_order(egraph, egraph.find(cid), {}) == "transposed"


def _matrix_order(egraph, cid: int, seen: dict) -> str | None:
    """``"row"`` where some form of class ``cid`` is row-major in memory, else
    ``"transposed"`` where some form is a transposed row-major matrix, else None (not
    known: a cycle of views, a view of a tensor of another rank)."""
    if cid in seen:
        return seen[cid]
    seen[cid] = None  # (a cycle through this class tells nothing)
    shape = getattr(_meta(egraph, cid), "shape", None)
    found = set()
    for node in egraph.nodes(cid):
        entry = TABLE.get(node.op) if isinstance(node.op, str) else None
        if entry is None or entry.kind != "view":
            found.add("row")
            break
        inner = egraph.find(node.children[0]) if node.children else None
        inner_shape = getattr(_meta(egraph, inner), "shape", None) if inner is not None else None
        if node.op in ("transpose", "permute") and shape is not None and len(shape) == 2:
            if min(map(int, shape)) > 1:
                order = _matrix_order(egraph, inner, seen)
                found.add({"row": "transposed", "transposed": "row"}.get(order))
            else:
                found.add("row")
        elif inner_shape is not None and tuple(inner_shape) == tuple(shape or ()):
            found.add(_matrix_order(egraph, inner, seen))
        elif node.op == "reshape" and _matrix_order(egraph, inner, seen) == "row":
            found.add("row")
    seen[cid] = "row" if "row" in found else "transposed" if "transposed" in found else None
    return seen[cid]


class KernelBlind:
    """``cost`` as extraction uses it where the model does not price machine kernels (every
    model but :class:`Roofline`, whose profile prices them by its measured curves): an
    e-node of a kernel of :data:`~extractors.hardware.MEASURED_ONLY` (oneDNN's and MKL's
    products and convolutions, with their post-ops) costs infinity, so that such a model
    keeps torch's ops. Otherwise AstSize would take oneDNN's convolution with its ReLU for
    one e-node where torch's two are two, a kernel no measurement chose. Every other
    attribute is the model's own.

    >>> import torch
    >>> from egraph import AstSize, EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x + 1), (torch.randn(2),))
    >>> blind = KernelBlind(AstSize())
    >>> blind.node_cost(eg, 0, ("onednn_conv2d_relu", 0)), blind.node_cost(eg, 0, ("add", 0))
    (inf, 1)
    """

    prices_kernels = True  # (as the model extraction uses: not wrapped again)

    def __init__(self, cost: Any):
        self.cost, self.kernels = cost, MEASURED_ONLY

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["cost"], name)

    def node_cost(self, egraph, cid: int, node: tuple) -> Any:
        cost = node_costs(egraph, self.cost)(cid, node)
        return _infinite(cost) if node[0] in self.kernels else cost

    def bind(self, egraph) -> Callable[[int, tuple, list], Any]:
        cost, kernels = self.cost, self.kernels
        if hasattr(cost, "bind"):
            bound = cost.bind(egraph)
        else:
            def bound(cid: int, node: tuple, child_costs: list) -> Any:
                return cost(ENode(node[0], node[1:]), child_costs)

        def total(cid: int, node: tuple, child_costs: list) -> Any:
            found = bound(cid, node, child_costs)
            return _infinite(found) if node[0] in kernels else found
        return total

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> Any:
        if choice is None:
            choice = source_program(egraph)
        cost = dag_cost(egraph, self.cost, choice)
        if any(choice[c][0] in self.kernels for c in program_order(egraph, choice)):
            return _infinite(cost)
        return cost

    def __repr__(self) -> str:
        return repr(self.cost)


def _infinite(cost: Any) -> Any:
    """An infinite cost of ``cost``'s kind (a number, or a :class:`LexCost`)."""
    if isinstance(cost, LexCost):
        return LexCost((math.inf,) * len(cost.parts))
    return math.inf


def kernel_blind(cost: Any) -> Any:
    """``cost`` itself where it prices machine kernels (``prices_kernels``), else
    :class:`KernelBlind` of it.

    >>> from egraph import AstSize
    >>> type(kernel_blind(AstSize())).__name__, type(kernel_blind(Roofline("cpu"))).__name__
    ('KernelBlind', 'Roofline')
    """
    return cost if getattr(cost, "prices_kernels", False) else KernelBlind(cost)


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
    kernel (a plain sum). ``hardware`` is a :class:`Hardware` or a profile name. Fused,
    it prices the kernels whose speed holds only in our own emission
    (:data:`~extractors.hardware.OWN_EMISSION_ONLY`) infinite.

    Per op, where the profile measured them, it also charges the copy a kernel of
    :data:`~extractors.hardware.ROW_MAJOR_OPERAND` makes of a transposed matrix
    (:func:`transposed_matrix`, ``transposed_copy``) and, unfused, the page faults of a
    result too large for the allocator to keep (:meth:`Hardware.fresh_time`; generated
    code reuses its dead buffers), each eager call's fixed cost beyond a launch and each
    Python number an elementwise call is given (:meth:`Hardware.call_time`).
    ``convolution_times`` (:func:`~extractors.convolution_times.convolution_times`), where
    given, prices each float32 ``conv2d`` of own emission at its shape's measured time,
    and its input's format (:meth:`channels_last_convolutions`).
    """

    prices_kernels = True  # (its profile's curves do: MEASURED_ONLY)

    def __init__(self, hardware: str | Hardware = "H100", fused: bool = True,
                 convolution_times: Callable | None = None):
        if isinstance(hardware, str):
            if hardware not in HARDWARE:
                raise ValueError(f"no hardware profile {hardware!r}; profiles: "
                                 f"{', '.join(HARDWARE)}")
            hardware = HARDWARE[hardware]
        self.hardware = hardware
        self.fused = fused
        self.local = not fused
        self.convolution_times = convolution_times
        # per e-graph: (its version when asked, (class, e-node) -> cost); one extraction asks
        # for each e-node's cost several times (the DAG pass, the source program, the
        # local search), and each answer walks the e-node's operands
        self._node_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def program_cost(self, egraph, choice: dict[int, tuple] | None = None) -> float:
        if choice is None:
            choice = source_program(egraph)
        if not self.fused:
            return super().program_cost(egraph, choice) + self._layouts(egraph, choice)[0]
        hw = self.hardware
        total = 0.0
        for region in regions(egraph, choice):
            if region.library and region.ops[0] in OWN_EMISSION_ONLY:
                return math.inf
            f = sum(flops(egraph, c, choice[c]) for c in region.classes)
            if region.library:
                b = sum(bytes_moved(egraph, c, choice[c]) for c in region.classes)
            else:
                b = sum(_bytes(_meta(egraph, k)) for k in region.inputs | region.outputs)
            if f == 0 and b == 0:
                continue
            dtype = getattr(_meta(egraph, region.classes[0]), "dtype", None)
            compute = hw.compute_time(region.ops[0] if region.library else "add", f, dtype,
                                      b)
            measured = sum(self._element_time(egraph, c, choice[c]) for c in region.classes)
            fixed = hw.launch_overhead + (
                hw.extern_time(region.ops[0]) + sum(self._operand_copy(egraph, choice[c])
                                                    for c in region.classes)
                if region.library else 0.0)
            total += max(compute, measured, hw.moving(b)) + fixed
        return total

    def channels_last_convolutions(self, egraph, choice: dict[int, tuple]) -> frozenset[int]:
        """The ``conv2d`` classes of the program ``choice`` whose input emission should
        convert to channels-last: all those of :func:`layout_work`'s ``converted`` where
        the program is cheaper so, none otherwise. Priced by each convolution's own times
        over the two formats (``convolution_times``, :mod:`extractors.convolution_times`),
        with the copies the conversions and the outputs left channels-last make; only for
        a profile that times them (own emission on a calibrated CPU profile).

        >>> import torch
        >>> from egraph import EGraph
        >>> from egraph.extract.program import source_program
        >>> def stack(x, w, v):
        ...     return torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, w).relu(), v)
        >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(stack), (torch.randn(1, 4, 6, 6),
        ...                     torch.randn(4, 4, 1, 1), torch.randn(8, 4, 1, 1)))
        >>> def faster(keys):  # as if channels-last ran every convolution in a tenth
        ...     return {k: (1e-3, 1e-4, 1e-3) for k in keys}
        >>> len(Roofline("cpu", fused=False, convolution_times=faster)
        ...     .channels_last_convolutions(eg, source_program(eg)))  # the first one's input
        1
        >>> Roofline("cpu", fused=False).channels_last_convolutions(eg, source_program(eg))
        frozenset()
        """
        return self._layouts(egraph, choice)[1]

    def _layouts(self, egraph, choice: dict[int, tuple]) -> tuple[float, frozenset[int]]:
        """What the program ``choice`` pays for its memory orders on this profile, and the
        convolutions whose input it converts to channels-last to pay least (see
        :meth:`channels_last_convolutions`); nothing where the profile measured none of it."""
        if self.convolution_times is None and not (
                {"mixed_layout", "conv_weight_layout"} & self.hardware.measured_ops):
            return 0.0, frozenset()
        work = layout_work(egraph, choice)
        seconds = self._layout_time(work)
        if self.fused or self.convolution_times is None or all(
                cl for _, cl, _ in work.convolutions):
            return seconds, frozenset()
        converting = layout_work(egraph, choice, channels_last_convolutions=True)
        converted = self._layout_time(converting) + sum(
            self._copy_time(_bytes(_meta(egraph, egraph.find(choice[c][1]))))
            for c in converting.converted)
        if converted < seconds:
            return converted, frozenset(converting.converted)
        return seconds, frozenset()

    def _layout_time(self, work: LayoutWork) -> float:
        """What the memory orders of :func:`layout_work`'s ``work`` cost on this profile:
        its mixed elements and reordered weights at the profile's ``mixed_layout`` and
        ``conv_weight_layout`` times, and, where ``convolution_times`` times torch's
        convolutions, each channels-last one's time over its row-major time (its weight's
        reordering included) and the copy that makes the outputs left channels-last
        contiguous."""
        hw = self.hardware
        seconds = hw.element_time("mixed_layout", work.mixed)
        reordered = work.reordered_weights
        if self.convolution_times is not None and work.convolutions:
            times = self.convolution_times({key for key, _, _ in work.convolutions})
            for key, channels_last, weights in work.convolutions:
                if channels_last:
                    row_major, over_channels_last, _ = times[key]
                    seconds += over_channels_last - row_major
                    reordered -= weights
            # (float32 elements: the outputs of convolutions timed in float32)
            seconds += self._copy_time(4 * work.channels_last_outputs)
        return seconds + hw.element_time("conv_weight_layout", reordered)

    def _copy_time(self, nbytes: float) -> float:
        """Seconds one copy of ``nbytes`` into another memory order takes: a read and a
        write, and a call (nothing for no bytes)."""
        return self.hardware.moving(2 * nbytes) + self.hardware.launch_overhead if nbytes else 0.0

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
        if self.fused and node[0] in OWN_EMISSION_ONLY:
            return math.inf
        measured = _MEASURED_CONVOLUTIONS.get(node[0])
        if measured is not None and not self.fused and self.convolution_times is not None:
            key = convolution_key(egraph, node)
            seconds = self.convolution_times([key])[key][measured] if key else math.inf
            if math.isfinite(seconds):
                # (the shape's own time: torch's over a row-major input, whose
                # channels-last time _layouts weighs, or oneDNN's; see
                # extractors.convolution_times for what a curve misses)
                return seconds
        f = flops(egraph, cid, node)
        b = bytes_moved(egraph, cid, node)
        if f == 0 and b == 0:
            return 1e-12 if len(node) > 1 else 0.0
        dtype = getattr(_meta(egraph, cid), "dtype", None)
        hw = self.hardware
        kernels, passes = hw.kernels_and_passes(node[0])
        compute = max(hw.compute_time(node[0], f, dtype, b),
                      self._element_time(egraph, cid, node))
        fixed = kernels * hw.launch_overhead + (hw.extern_time(node[0]) if self.fused else 0.0)
        if not self.fused:  # (generated code reuses its dead buffers: Inductor plans them)
            fixed += hw.fresh_time(_bytes(_meta(egraph, cid))) + hw.call_time(
                node[0], _variant(egraph, node)) + _number_operands(egraph, node) * (
                hw.call_time("number_operand"))
        return max(compute, passes * hw.moving(b)) + fixed + self._operand_copy(egraph, node)

    def _operand_copy(self, egraph, node: tuple) -> float:
        """Seconds a kernel of :data:`~extractors.hardware.ROW_MAJOR_OPERAND` spends
        copying its transposed first operand to row-major (0 for any other e-node)."""
        if node[0] not in ROW_MAJOR_OPERAND or not transposed_matrix(egraph, node[1]):
            return 0.0
        hw, operand = self.hardware, _meta(egraph, node[1])
        moved = 2 * _bytes(operand)  # (read strided, written row-major)
        return (max(hw.element_time("transposed_copy", _numel(operand)), hw.moving(moved))
                + (0.0 if self.fused else hw.fresh_time(moved / 2)) + hw.launch_overhead)

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
