"""Where the error is, as formulas: the elementwise formulas of a graph that hold an op
whose local error (:func:`frontends.fx.error_analysis.local_error`) passed the threshold,
each cut out as a sympy expression over its leaves (:class:`Formula`), and the values its
nodes take on the example inputs.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
>>> [str(f.expr) for f in formulas(gm, {"add", "sqrt", "sqrt_1", "sub"}, {"sub"})]
['-sqrt(x) + sqrt(x + 1)']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp
import torch
import torch.fx as fx

from egraph.ops.reals import rational
from egraph.ops.table import TABLE, sympy_form
from frontends.fx.vocabulary import is_expression, lower

__all__ = ["Formula", "drop_unused", "formulas", "node_values", "sympy_number", "to_sympy"]

_VOCABULARY: dict[str, Callable] = {
    name: sympy_form(name) for name, entry in TABLE.items()
    if entry.kind == "pointwise" and entry.sympy is not None}

_MAX_OPS = 40  # ops of one formula; larger formulas are cut into pieces at their leaves


@dataclass
class Formula:
    """One elementwise formula: its value's node, its sympy expression over the leaves'
    symbols, and the expressions of the localised ops inside it (``hot``), its nodes and
    their expressions.

    >>> x = sp.Symbol("x", real=True)
    >>> Formula(None, x + 1, [], [x], [x + 1], [], {}).expr
    x + 1
    """

    root: fx.Node
    expr: sp.Expr
    leaves: list[fx.Node]
    symbols: list[sp.Symbol]
    hot: list[sp.Expr]
    nodes: list[fx.Node]
    node_exprs: dict[fx.Node, sp.Expr]


def to_sympy(node: fx.Node):
    """``(builder, arguments)`` for an elementwise call sympy can express, else None.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.tan(x) + 1)
    >>> [to_sympy(n)[0](sp.Symbol("x"), *to_sympy(n)[1][1:]) for n in gm.graph.nodes
    ...  if n.op == "call_function"]
    [tan(x), x + 1]
    """
    if node.op not in ("call_function", "call_method"):
        return None
    method = node.op == "call_method"
    lowered = lower(node.target, node.args, node.kwargs, method=method)
    if lowered is None:
        return None
    leaves: list = []
    built = _composed(lowered, leaves)
    return None if built is None else (lambda *parts: built(iter(parts)), leaves)


def _composed(expression, leaves: list):
    """A function building the sympy form of a lowered expression from an iterator over
    its leaf operands, which are appended to ``leaves`` (an operand may be a lowered
    expression itself: ``add(x, y, alpha=4)`` is ``x + 4*y``); None where an op has no
    sympy form."""
    op, args = expression
    builder = _VOCABULARY.get(op)
    if builder is None or len(args) != len(TABLE[op].params):
        return None
    parts = []
    for a in args:
        if is_expression(a):
            part = _composed(a, leaves)
            if part is None:
                return None
            parts.append(part)
        else:
            leaves.append(a)
            parts.append(next)
    return lambda operands: builder(*(part(operands) for part in parts))


def sympy_number(value) -> sp.Expr | None:
    """A Python number as an exact sympy number: the real number it stands for
    (:func:`egraph.ops.reals.rational`: the simple fraction or short decimal it was
    written as, else the float's exact binary value); None for a bool, inf, NaN or what is
    not a number.

    >>> sympy_number(1 / 3), sympy_number(0.3275911), sympy_number(0.1 + 0.2)
    (1/3, 3275911/10000000, 1351079888211149/4503599627370496)
    >>> sympy_number(float("inf")) is None
    True
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return rational(value)


def formulas(gm: fx.GraphModule, floating: set[str], hot: set[str]) -> list[Formula]:
    """The elementwise formulas of ``gm`` that hold a localised op: ``floating`` names
    the nodes the analysis ran on, ``hot`` those whose local error passed the threshold.
    A formula is the elementwise ops feeding one value used elsewhere (at most
    ``_MAX_OPS`` of them: a larger one is cut at its leaves). See the module's example."""
    scalar = {n: t for n in gm.graph.nodes if n.name in floating
              for t in [to_sympy(n)] if t is not None}
    units = []
    for root in scalar:
        if all(u in scalar for u in root.users):
            continue  # not a value used outside the formula: part of a larger one
        symbols: dict[fx.Node, sp.Symbol] = {}
        exprs: dict[fx.Node, sp.Expr] = {}
        budget = [_MAX_OPS]

        def expr_of(n, symbols=symbols, exprs=exprs, budget=budget):
            if n in exprs:
                return exprs[n]
            if n in scalar and budget[0] > 0:
                budget[0] -= 1
                builder, args = scalar[n]
                parts = []
                for a in args:
                    if isinstance(a, fx.Node):
                        parts.append(expr_of(a))
                    else:
                        number = sympy_number(a)
                        if number is None:
                            raise ValueError(f"argument {a!r} of {n.name}")
                        parts.append(number)
                exprs[n] = builder(*parts)
                return exprs[n]
            number = sympy_number(_python_value(n))
            if number is not None:  # computed from literals alone (-2 as neg(2))
                exprs[n] = number
                return number
            if n not in symbols:
                symbols[n] = sp.Symbol(n.name, real=True)
            return symbols[n]

        try:
            expr = expr_of(root)
        except (ValueError, TypeError):
            continue
        inside = [n for n in exprs if n.name in hot]
        # (a formula that sympy folds to a constant, ``(1 + x) - x``, is kept: the
        # constant is its most accurate form; one of literals alone has no leaves)
        if not inside or not symbols or expr.has(sp.zoo, sp.nan, sp.I):
            continue
        leaves = list(symbols)
        units.append(Formula(root, expr, leaves, [symbols[n] for n in leaves],
                           [exprs[n] for n in inside], list(exprs), exprs))
    return units


def _python_value(n: fx.Node | object, depth: int = 8):
    """The Python number a node computes from literals alone (``operator.neg(2)``), else
    None; a value that depends on an input (a size) is not a constant of the formula."""
    if not isinstance(n, fx.Node):
        return n if isinstance(n, (int, float)) and not isinstance(n, bool) else None
    if n.op != "call_function" or n.kwargs or depth <= 0 or n.target.__module__ not in (
            "_operator", "operator", "math"):
        return None
    args = [_python_value(a, depth - 1) for a in n.args]
    if any(a is None for a in args):
        return None
    try:
        value = n.target(*args)
    except (ArithmeticError, ValueError, TypeError):
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def drop_unused(gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
    """Erase the formulas' nodes that nothing uses any more (and only those: other calls
    without users, such as checks, stay).

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> dead = gm.graph.call_function(torch.sin, (next(iter(gm.graph.nodes)),))
    >>> drop_unused(gm, [dead]); len(gm.graph.nodes)
    3
    """
    formula = {n for n in nodes if n.graph is gm.graph}
    for n in reversed(list(gm.graph.nodes)):
        if n in formula and not n.users:
            gm.graph.erase_node(n)


def node_values(gm: fx.GraphModule, inputs: tuple, names: set[str]) -> dict[str, object]:
    """The values of the named nodes when ``gm`` runs on ``inputs`` (in their dtype).

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (x + 1) * 2)
    >>> node_values(gm, (torch.ones(1),), {"add"})
    {'add': tensor([2.])}
    """
    kept: dict[str, object] = {}

    class Keep(fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if n.name in names:
                kept[n.name] = value
            return value

    with torch.no_grad():
        Keep(gm).run(*inputs)
    return kept
