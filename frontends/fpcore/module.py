"""An FPCore expression as a ``torch.fx.GraphModule``: one tensor per argument, one torch
op per FPCore operation, in the program's precision (float32 for binary32, float64 for
binary64), so it goes through ``EGraph.from_fx`` and ``StabilityRewriter`` like any model.

Arithmetic is Python's operators (``x + 1``), the functions torch's (``torch.fmax``: FPCore's
``fmax`` ignores a NaN operand, as ``torch.fmax`` does and ``torch.maximum`` does not),
``if`` a ``torch.where``, ``let`` a name for a node. Subexpressions without variables are
folded to their exact value rounded once (as a compiler folds constants). What torch lacks
is written in torch where that is exact: in binary32, ``fma`` and ``cbrt`` run in float64
(the product of two float32 values is exact there) and round once more to float32; in
binary64 the reader refuses them. A ``(! :precision ...)`` annotation converts its operands
to that precision and its result back.

>>> from frontends.fpcore import parse
>>> (p,) = parse("(FPCore (x y) (if (< x y) (fmax x 0) (- 1 (sqrt y))))")
>>> print(build_module(p).code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, x, y):
    lt = x < y
    full_like = torch.full_like(x, 0)
    fmax = torch.fmax(x, full_like);  x = full_like = None
    sqrt = torch.sqrt(y);  y = None
    sub = 1 - sqrt;  sqrt = None
    where = torch.where(lt, fmax, sub);  lt = fmax = sub = None
    return where
"""

from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING

import mpmath as mp
import torch
import torch.fx as fx

from frontends.fpcore.expression import Annotation, Call, Expr, If, Let, Variable
from frontends.fpcore.language import OPERATORS
from frontends.fpcore.reference import START_BITS, correctly_rounded, evaluate

if TYPE_CHECKING:
    from frontends.fpcore.program import Program

__all__ = ["DTYPES", "build_module", "build_predicate", "python_names"]

DTYPES = {"binary32": torch.float32, "binary64": torch.float64}
"""The torch dtype of each FPCore precision covered."""

# Operands that torch takes as a Python number; any other number becomes a tensor first.
_NUMBER_OK = {"pow": (0, 1), "fmod": (1,), "copysign": (1,)}
_EXACT_INT = {"binary32": 2 ** 24, "binary64": 2 ** 53}


def python_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """FPCore argument names as Python identifiers (the module's parameter names): FPCore
    allows ``x.re``, ``z*`` and ``E3/2``, Python does not.

    >>> python_names(("x.re", "x_re", "2t", "θ"))
    ('x_re', 'x_re_1', '_2t', 'θ')
    """
    out: list[str] = []
    for name in names:
        base = re.sub(r"\W", "_", name)
        base = base if base and not base[0].isdigit() else f"_{base}"
        if base in ("self", "torch", "operator"):
            base += "_"
        candidate, k = base, 0
        while candidate in out:
            k += 1
            candidate = f"{base}_{k}"
        out.append(candidate)
    return tuple(out)


def build_module(program: Program) -> fx.GraphModule:
    """``program`` as a GraphModule (see the module docstring)."""
    return _build(program.body, program.arguments, program.precision)


def build_predicate(expr: Expr, arguments: tuple[str, ...]) -> fx.GraphModule:
    """A precondition as a GraphModule over float64 tensors that returns a bool tensor.

    >>> from frontends.fpcore import parse
    >>> (p,) = parse("(FPCore (x y) :pre (and (< 0 x) (!= x y)) x)")
    >>> build_predicate(p.pre.expression, p.arguments)(torch.tensor([1., -1.]),
    ...                                                  torch.tensor([2., 0.])).tolist()
    [True, False]
    """
    return _build(expr, arguments, "binary64", boolean=True)


def _build(expr: Expr, arguments: tuple[str, ...], precision: str,
           boolean: bool = False) -> fx.GraphModule:
    graph = fx.Graph()
    inputs = [graph.placeholder(n) for n in python_names(arguments)]
    builder = _Builder(graph, inputs)
    env = {name: node for name, node in zip(arguments, inputs)}
    for node in inputs:
        builder.dtypes[node] = precision
    result = builder.value(expr, env, precision)
    if not isinstance(result, fx.Node):
        result = builder.tensor(result, precision, boolean)
    elif not boolean and builder.dtypes.get(result, precision) != precision:
        result = builder.cast(result, precision)
    graph.output(result)
    return fx.GraphModule(torch.nn.Module(), graph)


class _Builder:
    def __init__(self, graph: fx.Graph, inputs: list[fx.Node]):
        self.graph, self.inputs = graph, inputs
        self.dtypes: dict[fx.Node, str] = {}

    def call(self, target, args: tuple, precision: str, method: bool = False) -> fx.Node:
        node = (self.graph.call_method(target, args) if method
                else self.graph.call_function(target, args))
        self.dtypes[node] = precision
        return node

    def tensor(self, value, precision: str, boolean: bool = False) -> fx.Node:
        """A constant as a tensor of the inputs' shape."""
        if self.inputs:
            like = self.inputs[0]
            if boolean or isinstance(value, bool):
                return self.call(torch.full_like, (like, bool(value)), precision)
            if self.dtypes[like] != precision:
                like = self.cast(like, precision)
            return self.call(torch.full_like, (like, value), precision)
        dtype = torch.bool if boolean or isinstance(value, bool) else DTYPES[precision]
        node = self.graph.call_function(torch.full, ((), value), {"dtype": dtype})
        self.dtypes[node] = precision
        return node

    def cast(self, node: fx.Node, precision: str) -> fx.Node:
        return self.call("to", (node, DTYPES[precision]), precision, method=True)

    def constant(self, expr: Expr, precision: str):
        with mp.workprec(START_BITS[precision]):
            if isinstance(evaluate(expr, {}), bool):
                return bool(evaluate(expr, {}))  # comparisons and logic fold to booleans
        value = correctly_rounded(expr, (), (), precision)
        if value.is_integer() and abs(value) < _EXACT_INT[precision]:
            return int(value)
        return value

    def value(self, expr: Expr, env: dict, precision: str):
        if isinstance(expr, Variable):
            node = env[expr.name]
            if isinstance(node, fx.Node) and self.dtypes.get(node, precision) != precision:
                return self.cast(node, precision)
            return node
        if not expr.free():
            return self.constant(expr, precision)
        if isinstance(expr, Call):
            args = [self.value(a, env, precision) for a in expr.args]
            if not any(isinstance(a, fx.Node) for a in args):  # let-bound constants
                args[0] = self.tensor(args[0], precision)
            return self.operation(expr, args, precision)
        if isinstance(expr, If):
            cond = self.value(expr.cond, env, precision)
            if not isinstance(cond, fx.Node):
                return self.value(expr.then if cond else expr.orelse, env, precision)
            then = self.value(expr.then, env, precision)
            orelse = self.value(expr.orelse, env, precision)
            if not isinstance(then, fx.Node) and not isinstance(orelse, fx.Node):
                then = self.tensor(then, precision)
            return self.call(torch.where, (cond, then, orelse), precision)
        if isinstance(expr, Let):
            inner = dict(env)
            for name, bound in expr.bindings:
                inner[name] = self.value(bound, inner if expr.sequential else env, precision)
            return self.value(expr.body, inner, precision)
        if isinstance(expr, Annotation):
            inside = expr.precision or precision
            result = self.value(expr.body, env, inside)
            if isinstance(result, fx.Node) and inside != precision:
                result = self.cast(result, precision)
            return result
        raise TypeError(f"not an FPCore expression: {expr!r}")

    def operation(self, expr: Call, args: list, precision: str):
        op = expr.op
        if op == "-" and len(args) == 1:
            return self.call(operator.neg, (args[0],), precision)
        if op in ("<", ">", "<=", ">=", "=="):
            target = _resolve(OPERATORS[op].torch)
            return self.conjunction([self.call(target, self.nodes(a, b, precision), precision)
                                     for a, b in zip(args, args[1:])], precision)
        if op == "!=":
            return self.conjunction([
                self.call(operator.ne, self.nodes(a, b, precision), precision)
                for i, a in enumerate(args) for b in args[i + 1:]], precision)
        if op in ("and", "or"):
            nodes = [a for a in args if isinstance(a, fx.Node)]
            if any(not isinstance(a, fx.Node) and bool(a) == (op == "or") for a in args):
                return self.tensor(op == "or", precision, boolean=True)
            return (self.conjunction(nodes, precision) if op == "and"
                    else self.disjunction(nodes, precision))
        if op == "cbrt":
            wide = self.cast(args[0], "binary64")
            root = self.call(torch.pow, (self.call(torch.abs, (wide,), "binary64"), 1 / 3),
                             "binary64")
            signed = self.call(torch.copysign, (root, wide), "binary64")
            return self.cast(signed, precision)
        if op == "fma":
            x, y, z = (self.cast(a, "binary64") if isinstance(a, fx.Node) else a for a in args)
            product = self.call(operator.mul, self.nodes(x, y, "binary64"), "binary64")
            return self.cast(self.call(operator.add, (product, z), "binary64"), precision)
        target = _resolve(OPERATORS[op].torch)
        if target.__module__ == "_operator":
            return self.call(target, tuple(args), precision)
        allowed = _NUMBER_OK.get(op, ())
        args = [a if isinstance(a, fx.Node) or i in allowed else self.tensor(a, precision)
                for i, a in enumerate(args)]
        return self.call(target, tuple(args), precision)

    def nodes(self, a, b, precision: str) -> tuple:
        """Two operands, at least one of them a node."""
        if isinstance(a, fx.Node) or isinstance(b, fx.Node):
            return a, b
        return self.tensor(a, precision), b

    def conjunction(self, nodes: list, precision: str):
        if not nodes:
            return self.tensor(True, precision, boolean=True)
        result = nodes[0]
        for node in nodes[1:]:
            result = self.call(operator.and_, (result, node), precision)
        return result

    def disjunction(self, nodes: list, precision: str):
        if not nodes:
            return self.tensor(False, precision, boolean=True)
        result = nodes[0]
        for node in nodes[1:]:
            result = self.call(operator.or_, (result, node), precision)
        return result


def _resolve(qualified: str):
    module, _, name = qualified.rpartition(".")
    return getattr(operator if module == "operator" else torch, name)
