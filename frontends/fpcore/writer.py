"""FPCore out: a program, or a rewritten module of one, written as FPCore text that Herbie,
FPTaylor and the rest of FPBench's tools read.

A module's graph is read back op by op through the vocabulary (:func:`frontends.fx.
vocabulary.lower`, so every spelling of an op is one FPCore operation): ops FPCore has
become that operation (``log1p``, ``fmax``, ``copysign``, ``torch.where`` -> ``if``), ops
it lacks are written as their definition over the reals, the op table's ``sympy`` fact
(``sigmoid(x)`` -> ``(/ 1 (+ 1 (exp (- x))))``), and a value used twice is a ``let*``
binding. Conversions between precisions are written as the value they convert.

>>> from frontends.fpcore import parse
>>> import torch
>>> (p,) = parse('(FPCore (x) :name "log1m" :pre (< (fabs x) 1) (log (- 1 x)))')
>>> rewritten = torch.fx.symbolic_trace(lambda x: torch.log1p(-x))
>>> print(write_module(rewritten, p))
(FPCore (x)
 :name "log1m"
 :precision binary64
 :pre (< (fabs x) 1)
 (log1p (- x)))
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

import sympy as sp
import torch.fx as fx

from egraph.ops.reals import rational
from egraph.ops.table import TABLE, sympy_form
from frontends.fpcore.expression import Call, Constant, Expr, If, Let, Number, Variable
from frontends.fx.vocabulary import lower

if TYPE_CHECKING:
    from frontends.fpcore.program import Program

__all__ = ["UnwritableModule", "module_expression", "write_module", "write_program"]

# Canonical ops (the op table's names) that are one FPCore operation.
_FPCORE = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "neg": "-", "abs": "fabs",
    "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
    "bitwise_and": "and", "bitwise_or": "or", "logical_not": "not",
    "maximum": "fmax", "minimum": "fmin",
    **{name: name for name in (
        "exp", "log", "sqrt", "sin", "cos", "tan", "atan", "sinh", "cosh", "tanh", "erf",
        "log1p", "expm1", "floor", "ceil", "pow", "atan2", "hypot", "asin", "acos",
        "asinh", "acosh", "atanh", "erfc", "log2", "fmod", "fmax", "fmin", "copysign")},
}


class UnwritableModule(ValueError):
    """A module with an operation FPCore cannot say (a reduction, a matrix product, an op
    with no definition over the reals in the op table)."""


def write_program(program: Program) -> str:
    """``program`` as FPCore text: its arguments, name, precision, precondition, body.

    >>> from frontends.fpcore import parse
    >>> (p,) = parse("(FPCore (x.re) :precision binary32 (let ([a (* x.re 2)]) (+ a a)))")
    >>> print(write_program(p))
    (FPCore (x.re)
     :name "#1"
     :precision binary32
     (let ([a (* x.re 2)]) (+ a a)))
    """
    lines = [f"(FPCore ({' '.join(program.arguments)})",
             f" :name {_string(program.name)}", f" :precision {program.precision}"]
    if program.pre_expression is not None:
        lines.append(f" :pre {program.pre_expression}")
    lines.append(f" {program.body})")
    return "\n".join(lines)


def write_module(module: fx.GraphModule, program: Program) -> str:
    """A module of ``program``'s arguments (its rewritten form) as FPCore text, with the
    program's name, precision and precondition."""
    return write_program(program.with_body(module_expression(module, program.arguments)))


def _string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _number(value) -> Expr:
    if isinstance(value, bool):
        return Constant("TRUE" if value else "FALSE")
    if isinstance(value, float) and math.isnan(value):
        return Constant("NAN")
    if isinstance(value, float) and math.isinf(value):
        return Constant("INFINITY") if value > 0 else Call("-", (Constant("INFINITY"),))
    if isinstance(value, int):
        return Number(Fraction(value), str(value))
    if not isinstance(value, float):
        raise UnwritableModule(f"{value!r}: not a number FPCore can say")
    return Number(Fraction(value), repr(value))


def module_expression(module: fx.GraphModule, arguments: tuple[str, ...]) -> Expr:
    """The FPCore expression of a module whose inputs are ``arguments`` (in order) and
    whose output is one value; shared values become ``let*`` bindings.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (lambda s: s * s)(torch.sigmoid(x)))
    >>> print(module_expression(gm, ("x",)))
    (let* ([sigmoid (/ 1 (+ 1 (exp (- x))))]) (* sigmoid sigmoid))
    """
    graph = module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    values: dict[fx.Node, Expr] = {p: Variable(a) for p, a in zip(placeholders, arguments)}
    taken = set(arguments)
    bindings: list[tuple[str, Expr]] = []
    (output,) = [n for n in graph.nodes if n.op == "output"]
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op not in ("call_function", "call_method"):
            raise UnwritableModule(f"{node.format_node()}: not a call FPCore can say")
        expr = _call(node, values)
        if _uses(node) > 1 and not isinstance(expr, (Variable, Number, Constant)):
            name = node.name
            while name in taken:
                name += "_"
            taken.add(name)
            bindings.append((name, expr))
            expr = Variable(name)
        values[node] = expr
    result = output.args[0]
    if isinstance(result, (tuple, list)):
        if len(result) != 1:
            raise UnwritableModule("an FPCore program has one result")
        result = result[0]
    body = values[result] if isinstance(result, fx.Node) else _number(result)
    return Let(tuple(bindings), body, sequential=True) if bindings else body


def _uses(node: fx.Node) -> int:
    count = 0
    for user in node.users:
        found: list[fx.Node] = []
        fx.node.map_arg((user.args, user.kwargs), found.append)
        count += sum(a is node for a in found)
    return count


def _call(node: fx.Node, values: dict) -> Expr:
    method = node.op == "call_method"
    lowered = lower(node.target, node.args, node.kwargs, method=method)
    if lowered is None:
        raise UnwritableModule(f"{node.format_node()}: not in the vocabulary")
    return _lowered(lowered[0], list(lowered[1]), values, node)


def _lowered(op: str, args: list, values: dict, node: fx.Node) -> Expr:
    """The FPCore expression of ``op`` on ``args`` as :func:`lower` gives them: nodes,
    numbers, or a lowered call of its own (``add(x, y, alpha=a)`` is ``x + y * a``)."""
    def arg(a) -> Expr:
        if isinstance(a, fx.Node):
            return values[a]
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
            return _lowered(a[0], list(a[1]), values, node)
        return _number(a)

    if op in ("to", "identity", "detach"):
        return arg(args[0])
    if op in ("full_like", "full"):
        return _number(args[1])
    if op == "where":
        return If(arg(args[0]), arg(args[1]), arg(args[2]))
    if op == "relu":
        return Call("fmax", (arg(args[0]), Number(Fraction(0), "0")))
    if op == "clamp":
        expr = arg(args[0])
        if args[1] is not None:
            expr = Call("fmax", (expr, arg(args[1])))
        if args[2] is not None:
            expr = Call("fmin", (expr, arg(args[2])))
        return expr
    if op in _FPCORE:
        return Call(_FPCORE[op], tuple(arg(a) for a in args))
    entry = TABLE.get(op)
    if entry is None or entry.sympy is None:
        raise UnwritableModule(f"{node.format_node()}: {op} has no FPCore form")
    symbols = [sp.Symbol(f"_arg{i}") for i in range(len(args))]
    known = {s: arg(a) for s, a in zip(symbols, args)
             if isinstance(a, fx.Node) or not isinstance(a, (int, float))}
    real = [s if s in known else rational(a) for s, a in zip(symbols, args)]
    if any(r is None for r in real):
        raise UnwritableModule(f"{node.format_node()}: a constant that is not a finite number")
    return _from_sympy(sympy_form(op)(*real), known)


_FUNCTIONS = {sp.exp: "exp", sp.log: "log", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan",
              sp.atan: "atan", sp.sinh: "sinh", sp.cosh: "cosh", sp.tanh: "tanh",
              sp.Abs: "fabs", sp.asin: "asin", sp.acos: "acos", sp.asinh: "asinh",
              sp.acosh: "acosh", sp.atanh: "atanh", sp.erf: "erf", sp.erfc: "erfc"}


def _from_sympy(expr: sp.Expr, known: dict) -> Expr:
    """A sympy expression over ``known``'s symbols as an FPCore expression."""
    if expr in known:
        return known[expr]
    if expr.is_Rational:
        value = Fraction(int(expr.p), int(expr.q))
        text = str(value.numerator) if value.denominator == 1 else (
            f"{value.numerator}/{value.denominator}")
        return Number(value, text) if value >= 0 else Call("-", (Number(-value, text[1:]),))
    if expr.is_Float:
        return _number(float(expr))
    if expr is sp.pi:
        return Constant("PI")
    if expr is sp.E:
        return Constant("E")
    args = [_from_sympy(a, known) for a in expr.args]
    if expr.is_Add:
        return _fold("+", args)
    if expr.is_Mul:
        if expr.args[0] == -1:
            return Call("-", (_fold("*", args[1:]),))
        return _fold("*", args)
    if expr.is_Pow:
        base, exponent = args[0], expr.args[1]
        if exponent == sp.Rational(1, 2):
            return Call("sqrt", (base,))
        if exponent == -1:
            return Call("/", (Number(Fraction(1), "1"), base))
        if exponent == -sp.Rational(1, 2):
            return Call("/", (Number(Fraction(1), "1"), Call("sqrt", (base,))))
        return Call("pow", (base, args[1]))
    name = _FUNCTIONS.get(expr.func)
    if name is None:
        raise UnwritableModule(f"{expr}: no FPCore form")
    return Call(name, tuple(args))


def _fold(op: str, args: list[Expr]) -> Expr:
    result = args[0]
    for a in args[1:]:
        result = Call(op, (result, a))
    return result
