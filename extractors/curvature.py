"""The numerical-risk cost model: the bits of the working precision a program puts at risk.

:class:`Curvature` charges each op from the value ranges of its inputs and its dtype
(overflow, cancellation, condition numbers); see its docstring for the terms.

>>> Curvature.to_bits(2.0 ** 24 - 1)  # every bit of float32's mantissa at risk
24.0
"""

from __future__ import annotations

import math

from egraph.ops.table import names
from extractors.costs import CostModel

__all__ = ["Curvature"]

_FREE = names(flops=0.0)  # the op table's ops that compute nothing

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
        sens = getattr(egraph.data(cid), "sens", math.nan)
        if bits <= self.rounding or sens != sens or not math.isfinite(sens):
            return bits
        # A value whose relative errors barely reach the outputs (measured on the examples)
        # puts fewer bits at risk; one the outputs amplify, more (up to the whole mantissa).
        cap, _ = _format(egraph.data(cid))
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
        out = egraph.data(cid)
        if getattr(out, "kind", None) != "tensor":
            return 0.0
        bits, largest = _format(out)
        # An unbounded range means "not known", not overflow; a finite bound past the
        # dtype's largest value is an overflow.
        if any(math.isfinite(v) and abs(v) > largest
               for v in (getattr(out, "lo", 0.0), getattr(out, "hi", 0.0))):
            return float(bits)
        kids = [egraph.data(k) for k in node[1:]]
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
            exponents.append(egraph.data(inner))
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
                if getattr(egraph.data(k), "kind", None) == "tensor"):
            return True
    return False
