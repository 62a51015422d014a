"""Herbie's cost model: what a formula costs by Herbie 2.0's heuristic per-operation costs.

Herbie (PLDI 2015; 2.0 adds a cost-accuracy Pareto search) prices a program in its
platform's units: in binary64 a variable or a literal 64, ``+``, ``-`` and negation 128,
``*`` and a comparison 256, ``/`` and ``sqrt`` 640, ``fabs`` 128, ``fma`` 256, a libm
function (``exp``, ``log``, ``pow``, ``sin``, ``hypot``, ``log1p``, ...) 6400, a boolean
operation and an ``if`` 1; binary32 costs half of each. :class:`HerbieCost` prices our
programs the same way, so a speedup reported beside Herbie's is in its units.

The ops Herbie has no name for (``sigmoid``, ``softplus``, ``logaddexp``, a reduction, a
matrix product) are priced as one libm call each: a library function in Herbie's terms.
Views cost nothing and a cast costs a variable, as Herbie's conversions between formats do.
Costs are per element and the program's DAG cost pays a shared subexpression once, as
Herbie's ``let`` does.

>>> import torch
>>> from egraph import EGraph
>>> def ratio(a, b, c):
...     return a * b / c
>>> x = torch.ones(8, dtype=torch.float64)
>>> HerbieCost().program_cost(EGraph.from_fx(torch.fx.symbolic_trace(ratio), (x, x, x)))
1088
"""

from __future__ import annotations

from egraph.ops.table import TABLE
from extractors.costs import CostModel

__all__ = ["HerbieCost"]

LIBM = 6400
"""A libm call in binary64; also the price of an op Herbie has no name for."""

BINARY64: dict[str, int] = {
    "input": 64, "param": 64, "const": 64, "to": 64,
    "neg": 128, "add": 128, "sub": 128, "abs": 128,
    "mul": 256, "eq": 256, "ne": 256, "lt": 256, "le": 256, "gt": 256, "ge": 256,
    "div": 640, "sqrt": 640,
    "where": 1, "logical_not": 1, "bitwise_and": 1, "bitwise_or": 1, "bitwise_not": 1,
}
"""Herbie 2.0's binary64 costs of the ops that are not libm calls (its ``herbie20``
platform); ``where`` is Herbie's ``if``, the boolean ops its ``and``, ``or`` and ``not``."""

_FREE = frozenset(name for name, spec in TABLE.items() if spec.kind in ("view", "shape"))


class HerbieCost(CostModel):
    """Herbie 2.0's cost of a program, per element (see the module docstring): binary64
    prices for float64 values, half of them for narrower ones."""

    def node_cost(self, egraph, cid: int, node: tuple) -> int:
        op = node[0]
        if len(node) == 1 and op not in BINARY64:  # a literal: a number, or an attribute
            number = type(op) is not tuple or op[0] in ("int", "float")
            return BINARY64["const"] if number else 0
        if op in _FREE:
            return 0
        cost = BINARY64.get(op, LIBM)
        if cost == 1:  # (booleans cost the same in every format)
            return cost
        return cost if self._binary64(egraph, (cid, *node[1:])) else cost // 2

    @staticmethod
    def _binary64(egraph, classes: tuple) -> bool:
        """Whether the op computes in binary64: its result or an operand is float64 (a
        comparison's result is a bool; its operands say the format)."""
        return any(getattr(getattr(egraph.data(c), "dtype", None), "itemsize", 0) == 8
                   and egraph.data(c).dtype.is_floating_point for c in classes)

    def __repr__(self) -> str:
        return "HerbieCost()"
