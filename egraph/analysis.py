"""E-class analyses (egg's make / merge / modify) and constant folding.

An analysis attaches one value to every e-class. ``make`` computes the value of a new
e-node from its children's values, ``merge`` joins the values of two classes being unified
(returning the first argument itself when nothing changes), and ``modify`` may edit the
class once its value is known (add e-nodes, union, prune).

>>> from egraph import EGraph, ConstantFolding, parse
>>> eg = EGraph(analysis=ConstantFolding())
>>> c = eg.add(parse("(* (+ 1 2) 4)"))
>>> eg.data(c), eg.equiv(c, parse("12"))
(12, True)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from egraph.term import canonical_number, is_number_op

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class Analysis:
    """Base class: no data. Subclass and override ``make``, ``merge`` and ``modify``."""

    def make(self, egraph: EGraph, node: tuple) -> Any:
        """The value of a new e-node ``(op, child_class, ...)``."""
        return None

    def merge(self, a: Any, b: Any) -> Any:
        """The joined value of two classes; return ``a`` itself when it does not change.

        Raise :class:`~egraph.egraph.UnsoundMerge` when the two cannot be equal.
        """
        return a if a is not None else b

    def modify(self, egraph: EGraph, cid: int) -> None:
        """Edit class ``cid`` after its value changed (default: nothing)."""


def _number_of(op: Any) -> Any:
    return op if is_number_op(op) else None


def _identity(value: Any) -> Any:
    return value


def _div(a: float, b: float) -> float | None:
    if b == 0:
        return None
    return a / b


class ConstantFolding(Analysis):
    """Fold ``+ - * /`` over numeric leaves, with egg's semantics.

    A class whose e-node folds to a number gets that number's leaf unioned in, and keeps
    only its leaves (so rules stop rewriting inside arithmetic that is already known).
    Division by zero does not fold. ``ops`` maps operator symbols to functions of the
    children's values; ``constant_of(op)`` reads a leaf's value (None: not a constant) and
    ``leaf_of(value)`` spells a value as a leaf (defaults: egg's numbers).

    >>> from egraph import EGraph, parse
    >>> eg = EGraph(analysis=ConstantFolding())
    >>> [str(n) for n in eg.nodes(eg.add(parse("(- 5 (/ 4 2))")))]
    ['3']
    """

    DEFAULT_OPS: dict[str, Callable[[Any, Any], Any]] = {
        "+": operator.add,
        "-": operator.sub,
        "*": operator.mul,
        "/": _div,
    }

    def __init__(self, ops: dict[str, Callable[..., Any]] | None = None, prune: bool = True,
                 constant_of: Callable[[Any], Any] | None = None,
                 leaf_of: Callable[[Any], Any] | None = None):
        self.ops = dict(self.DEFAULT_OPS if ops is None else ops)
        self.prune = prune
        self.constant_of = constant_of or _number_of
        self.leaf_of = leaf_of or _identity

    def make(self, egraph: EGraph, node: tuple) -> Any:
        op = node[0]
        if len(node) == 1:
            return self.constant_of(op)
        fn = self.ops.get(op) if type(op) is str else None
        if fn is None:
            return None
        data = egraph.class_data
        find = egraph.union_find.find
        args = [data[find(c)] for c in node[1:]]
        if any(a is None for a in args):
            return None
        try:
            value = fn(*args)
        except (ArithmeticError, ValueError):
            return None
        if value is None or (isinstance(value, float) and math.isinf(value)):
            return None
        return canonical_number(value)

    def merge(self, a: Any, b: Any) -> Any:
        return a if a is not None else b

    def modify(self, egraph: EGraph, cid: int) -> None:
        value = egraph.data(cid)
        if value is None:
            return
        if egraph.explanations:
            self._explain_fold(egraph, cid, value)
        else:
            egraph.union(cid, egraph.add_canonical((self.leaf_of(value),)), "constant-fold")
        if self.prune:
            c = egraph.find(cid)
            egraph.set_nodes(c, [n for n in egraph.class_nodes[c] if len(n) == 1])

    def _explain_fold(self, egraph: EGraph, cid: int, value: Any) -> None:
        """Union through the folded e-node itself, so the proof reads ``(+ 2 3) -> 5``."""
        find = egraph.find
        for node in egraph.class_nodes[find(cid)]:
            if len(node) > 1 and self.make(egraph, node) == value:
                kids = [egraph.add_explained((self.leaf_of(egraph.data(c)),)) for c in node[1:]]
                folded = egraph.add_explained((node[0], *kids))
                egraph.union(folded, egraph.add_explained((self.leaf_of(value),)),
                              "constant-fold")
                return
        egraph.union(cid, egraph.add_explained((self.leaf_of(value),)), "constant-fold")
