"""The e-node as the public API shows it: an operator and its child class ids.

Inside the engine an e-node is a plain tuple ``(op, child, ...)``; :class:`ENode` is the
named view that ``EGraph.nodes`` returns and callable cost functions receive.

>>> from egraph.enode import ENode
>>> node = ENode("+", (3, 4))
>>> node.op, node.children, str(node)
('+', (3, 4), '(+ #3 #4)')
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from egraph.term import format_op

__all__ = ["ENode"]


class ENode(NamedTuple):
    """An e-node: an operator and its child class ids (see the module docstring)."""

    op: Hashable
    children: tuple[int, ...]

    def __str__(self) -> str:
        if not self.children:
            return format_op(self.op)
        return "(" + " ".join([format_op(self.op)] + [f"#{c}" for c in self.children]) + ")"
