"""An FX graph's values over the reals (mpmath), the reference for float64 programs.

A float64 program cannot be judged against float64: its error is invisible there. This
interpreter runs a graph on sample inputs with every elementwise op the op table defines
over the reals (its ``sympy`` fact, evaluated in mpmath at :data:`BITS` bits), so each
value is the real number the formula denotes at those inputs; selections (``where``,
comparisons, ``maximum``, conversions) act on those values; any other op runs in float64
on the values rounded (its result then counts as exact). A float constant is the real
number it was written as (:func:`egraph.ops.reals.literal`: ``0.3275911``, not its
float's binary value), as in FPCore. Values are numpy arrays of mpmath
numbers; :func:`rounded` gives them as float64 tensors (each correctly rounded).

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: (x + 1) - x)
>>> x = torch.tensor([1e300, 2.0], dtype=torch.float64)
>>> gm(x).tolist(), rounded(exact_values(gm, (x,))[-1]).tolist()
([0.0, 1.0], [1.0, 1.0])
"""

from __future__ import annotations

import functools
import operator

import mpmath as mp
import numpy as np
import torch
import torch.fx as fx

from egraph.ops.reals import lambdify, literal
from egraph.ops.table import TABLE, sympy_form
from frontends.fx.vocabulary import is_expression, lower

__all__ = ["BITS", "ExactInterpreter", "exact_outputs", "exact_values", "real_function",
           "rounded"]

BITS = 2200
"""Working precision of the reference: a sum of float64 values is exact at 2,100 bits
(their exponents span 2^-1074 .. 2^1024), so cancellation between them is exact too."""

_SELECT = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
           "eq": operator.eq, "ne": operator.ne}


@functools.cache
def real_function(op: str):
    """Op ``op`` over mpmath reals, from its sympy fact (NaN outside the reals); None where
    the op table gives it none.

    >>> with mp.workprec(200):
    ...     float(real_function("log1p")(mp.mpf("1e-30")))  # log(1 + x), exactly enough
    1e-30
    >>> real_function("sqrt")(mp.mpf(-1))
    mpf('nan')
    """
    form = sympy_form(op)
    entry = TABLE.get(op)
    if form is None or entry is None or entry.kind != "pointwise":
        return None
    import sympy as sp

    symbols = [sp.Symbol(p) for p in entry.params]
    f = lambdify(symbols, form(*symbols))

    def real(*args):
        try:
            value = f(*args)
        except (ZeroDivisionError, ValueError, TypeError, OverflowError):
            return mp.nan
        if isinstance(value, mp.mpc):
            return value.real if value.imag == 0 else mp.nan
        return value if isinstance(value, mp.mpf) else mp.mpf(value)
    return real


_FILLS = ("full", "full_like")


def _literal(value):
    """A float operand as the real number it stands for (:func:`literal`: ``0.3275911``
    as that decimal, not its float's binary value); any other operand as it is."""
    if not isinstance(value, float):
        return value
    fraction = literal(value)
    if fraction is None:
        return mp.mpf(value)
    return mp.mpf(fraction.numerator) / fraction.denominator


def _exact(value):
    """A float64 tensor (or a number) as an array of mpmath numbers."""
    if isinstance(value, torch.Tensor):
        flat = [mp.mpf(v) for v in value.detach().to(torch.float64).flatten().tolist()]
        return np.array(flat + [None], dtype=object)[:-1].reshape(tuple(value.shape))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return mp.mpf(value)


def rounded(value) -> torch.Tensor:
    """Exact values (an array of mpmath numbers) as a float64 tensor, each rounded to the
    nearest float64."""
    if not isinstance(value, np.ndarray):
        return torch.tensor(float(value), dtype=torch.float64)
    flat = [float(v) if not isinstance(v, (bool, np.bool_)) else float(v)
            for v in value.reshape(-1)]
    return torch.tensor(flat, dtype=torch.float64).reshape(value.shape)


class ExactInterpreter(fx.Interpreter):
    """Runs a graph over mpmath reals (see the module docstring); ``values`` holds each
    node's exact value."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            value = _exact(super().run_node(n))
        elif n.op in ("call_function", "call_method"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            value = self.call(n, args, kwargs)
        else:
            value = super().run_node(n)
        self.values[n.name] = value
        return value

    def call(self, n: fx.Node, args, kwargs):
        lowered = lower(n.target, args, kwargs, method=n.op == "call_method")
        op, operands = (lowered[0], list(lowered[1])) if lowered else (None, [])
        with mp.workprec(BITS):
            if op in _FILLS and isinstance(operands[1], float):
                shape = self.fallback(n, args, kwargs).shape
                return np.full(tuple(shape), _literal(operands[1]), dtype=object)
            operands = [_literal(a) for a in operands]
            if op in ("to", "identity", "detach"):
                return operands[0]
            if op == "where":
                cond = operands[0]
                cond = cond.astype(bool) if isinstance(cond, np.ndarray) else bool(cond)
                return np.where(cond, operands[1], operands[2])
            if op in _SELECT:
                return np.vectorize(_SELECT[op], otypes=[bool])(operands[0], operands[1])
            if op and not any(isinstance(a, str) for a in operands):
                value = _real_value((op, operands))
                if value is not None:
                    return value
        return self.fallback(n, args, kwargs)

    def fallback(self, n: fx.Node, args, kwargs):
        """The op in float64 on the values rounded; its result taken as exact."""
        def to_float(a):
            if isinstance(a, np.ndarray):
                return rounded(a) if a.dtype == object else torch.from_numpy(a)
            return float(a) if isinstance(a, mp.mpf) else a
        args, kwargs = fx.node.map_aggregate((args, kwargs), to_float)
        if n.op == "call_method":
            out = getattr(args[0], n.target)(*args[1:], **kwargs)
        else:
            out = n.target(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            return out.numpy()
        return _exact(out) if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def _real_value(expression):
    """The exact value of a lowered expression whose operands may be lowered expressions
    themselves (``add(x, y, alpha=4)`` is ``("add", [x, ("mul", [y, 4])])``); None where
    one of its ops has no real function."""
    if not is_expression(expression):
        return _literal(expression)
    op, operands = expression
    real = real_function(op)
    if real is None:
        return None
    values = [_real_value(a) for a in operands]
    if any(v is None for v in values):
        return None
    return np.vectorize(real, otypes=[object])(*values)


def exact_values(gm: fx.GraphModule, inputs) -> list:
    """The exact value of every node of ``gm`` on ``inputs``, in graph order (the last is
    the output)."""
    interp = ExactInterpreter(gm)
    with torch.no_grad():
        interp.run(*inputs)
    return [interp.values[n.name] for n in gm.graph.nodes if n.op != "output"]


def exact_outputs(gm: fx.GraphModule, inputs) -> list[torch.Tensor]:
    """The exact values of ``gm``'s tensor outputs on ``inputs``, each rounded to float64:
    the reference a float64 program's results are judged against.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (torch.exp(x) - 1, x * 2))
    >>> [t.tolist() for t in exact_outputs(gm, (torch.tensor([1e-20], dtype=torch.float64),))]
    [[1e-20], [2e-20]]
    """
    interp = ExactInterpreter(gm)
    with torch.no_grad():
        out = interp.run(*inputs)
    leaves: list = []
    fx.node.map_aggregate(out, lambda a: leaves.append(a) if isinstance(a, np.ndarray)
                          or isinstance(a, mp.mpf) else None)
    return [rounded(v) if not isinstance(v, np.ndarray) or v.dtype == object
            else torch.from_numpy(v) for v in leaves]
