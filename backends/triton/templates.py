"""Kernel templates: how each canonical op becomes Triton code.

A region is lowered to a short list of :class:`Stmt`: loads of its inputs, elementwise
expressions and three primitive row reductions (``sum``, ``max``, ``min``, plus ``sumexp``,
the softmax denominator, which a looped kernel computes online). Pointwise ops are one
expression each (:data:`POINTWISE`); row ops (softmax, layer norm, variance, ...) expand to
a few statements (:data:`ROW_OPS`). Everything is computed in fp32 (fp64 for fp64 data) and
rounded once when stored; reductions accumulate in fp32. Only ``triton.language`` core
functions are used (no libdevice), so the same kernels run on NVIDIA and AMD GPUs and in the
Triton interpreter; ``tanh``, ``log1p`` and friends are small jit helpers (:data:`HELPERS`).

>>> b = Builder()
>>> x = b.load(0, torch.float16)
>>> b.pointwise("exp", [Operand(x, tensor=True)], {}, torch.float16)
'exp_0'
>>> [(s.name, s.kind, s.text) for s in b.stmts]
[('x0', 'load', ''), ('exp_0', 'expr', 'tl.exp({0})')]
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from egraph.ops.table import TABLE


class Unsupported(Exception):
    """A region (or op) the Triton backend does not generate code for; it runs eagerly.

    >>> try:
    ...     compute_type(torch.complex64)
    ... except Unsupported as err:
    ...     print(err)
    dtype torch.complex64 has no Triton compute type
    """


@dataclass(frozen=True)
class Stmt:
    """One statement of a kernel: ``name = text.format(*args)``.

    ``kind`` is ``load`` (``index``: which input), ``expr`` (elementwise), or a row
    reduction of ``args[0]`` (``sum``, ``max``, ``min``; ``sumexp`` is
    ``sum(exp(args[0] - args[1]))`` for the row value ``args[1]``). ``dtype`` is the
    Triton compute type of the value.

    >>> s = Stmt("exp_0", "expr", ("x0",), "tl.exp({0})")
    >>> f"{s.name} = {s.text.format(*s.args)}"
    'exp_0 = tl.exp(x0)'
    """

    name: str
    kind: str
    args: tuple[str, ...] = ()
    text: str = ""
    dtype: str = "tl.float32"
    index: int = -1


@dataclass(frozen=True)
class Operand:
    """An argument of a canonical op: a statement name (``tensor=True``) or a literal.

    In a pointwise template a tensor operand prints as its format slot (``{0}``), a
    literal as Triton source.

    >>> str(Operand("x0", tensor=True, slot=0)), str(Operand(0.5))
    ('{0}', '0.5')
    """

    value: object
    tensor: bool = False
    slot: int = -1

    def __str__(self) -> str:
        if self.tensor:
            return f"{{{self.slot}}}"
        return literal(self.value)


def literal(value: object) -> str:
    """A Python literal as Triton source (infinities and NaN spelled as float calls).

    >>> literal(float("-inf")), literal(0.5), literal(True)
    ('-float("inf")', '0.5', 'True')
    """
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else '-float("inf")'
    if isinstance(value, (bool, int, float)):
        return repr(value)
    raise Unsupported(f"literal {value!r} cannot appear in a kernel")


_COMPUTE = {
    torch.float16: "tl.float32", torch.bfloat16: "tl.float32", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.bool: "tl.int1", torch.int8: "tl.int8",
    torch.uint8: "tl.uint8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}
_STORAGE = {**_COMPUTE, torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}


def compute_type(dtype: torch.dtype) -> str:
    """The Triton compute type of a torch dtype (fp32 for half precisions).

    >>> compute_type(torch.bfloat16)
    'tl.float32'
    """
    if dtype not in _COMPUTE:
        raise Unsupported(f"dtype {dtype} has no Triton compute type")
    return _COMPUTE[dtype]


def storage_type(dtype: torch.dtype) -> str:
    """The Triton type of a torch dtype in memory.

    >>> storage_type(torch.bfloat16)
    'tl.bfloat16'
    """
    compute_type(dtype)
    return _STORAGE[dtype]


HELPERS: dict[str, str] = {
    "_expm1": '''
@triton.jit
def _expm1(x):
    # exp(x) - 1 without cancellation near 0 (Kahan's trick)
    u = tl.exp(x)
    y = (u - 1.0) * x / tl.log(u)
    y = tl.where(u == float("inf"), u, y)
    y = tl.where(u - 1.0 == -1.0, -1.0, y)
    return tl.where(u == 1.0, x, y)
''',
    "_log1p": '''
@triton.jit
def _log1p(x):
    # log(1 + x) without cancellation near 0 (Kahan's trick)
    u = 1.0 + x
    y = tl.log(u) * x / (u - 1.0)
    y = tl.where(u == float("inf"), u, y)
    return tl.where(u == 1.0, x, y)
''',
    "_tanh": '''
@triton.jit
def _tanh(x):
    # tanh(|x|) = -expm1(-2|x|) / (2 + expm1(-2|x|)), sign restored
    e = _expm1(-2.0 * tl.abs(x))
    y = -e / (2.0 + e)
    return tl.where(x < 0, -y, y)
''',
    "_sinh": '''
@triton.jit
def _sinh(x):
    # sinh(|x|) = (e + e / (e + 1)) / 2 with e = expm1(|x|): no cancellation near 0
    e = _expm1(tl.abs(x))
    y = 0.5 * (e + e / (e + 1.0))
    return tl.where(x < 0, -y, y)
''',
    "_logaddexp": '''
@triton.jit
def _logaddexp(a, b):
    m = tl.maximum(a, b)
    y = m + _log1p(tl.exp(-tl.abs(a - b)))
    return tl.where(a == b, a + 0.6931471805599453, y)
''',
    "_hypot": '''
@triton.jit
def _hypot(a, b):
    big = tl.maximum(tl.abs(a), tl.abs(b))
    small = tl.minimum(tl.abs(a), tl.abs(b))
    r = small / tl.where(big == 0.0, 1.0, big)
    return tl.where(big == float("inf"), big, big * tl.sqrt(1.0 + r * r))
''',
    "_safe_max": '''
@triton.jit
def _safe_max(m):
    # a row maximum to shift by: infinities (empty or overflowing rows) shift by 0
    return tl.where(tl.abs(m) == float("inf"), 0.0, m)
''',
    "_online_sumexp": '''
@triton.jit
def _online_sumexp(total, peak, x):
    # one step of a softmax denominator over a long row: lane-wise running maximum `peak`
    # and running sum of exp(x - peak), rescaled whenever the maximum grows
    new = tl.maximum(peak, x)
    shift = _safe_max(new)
    return total * tl.exp(peak - shift) + tl.exp(x - shift), new
''',
    "_sumexp_rows": '''
@triton.jit
def _sumexp_rows(total, peak, shift):
    # the lanes' running sums of exp(x - peak), rescaled to exp(x - shift) and summed per row
    scaled = tl.where(peak == -float("inf"), 0.0, total * tl.exp(_safe_max(peak) - shift))
    return tl.sum(scaled, axis=1, keep_dims=True)
''',
}
"""Small jit functions the templates call, by name; a kernel's source includes those it
uses (``_tanh`` needs ``_expm1``, ``_logaddexp`` needs ``_log1p``)."""

_HELPER_DEPENDENCIES = {"_tanh": ("_expm1",), "_sinh": ("_expm1",), "_logaddexp": ("_log1p",),
                        "_online_sumexp": ("_safe_max",), "_sumexp_rows": ("_safe_max",)}


def helpers_for(code: str) -> list[str]:
    """The helpers ``code`` calls, with those they call, each after its dependencies.

    >>> helpers_for("y = _tanh(x) + _log1p(x)")
    ['_log1p', '_expm1', '_tanh']
    """
    used: list[str] = []

    def need(name: str) -> None:
        for dep in _HELPER_DEPENDENCIES.get(name, ()):
            need(dep)
        if name not in used:
            used.append(name)

    for name in HELPERS:
        if re.search(rf"\b{name}\(", code):
            need(name)
    return used

_NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"


def _pow(x: Operand, y: Operand) -> str:
    if not y.tensor and isinstance(y.value, (int, float)) and not isinstance(y.value, bool):
        e = y.value
        if e == 0.5:
            return f"tl.sqrt({x})"
        if e == -0.5:
            return f"tl.rsqrt({x})"
        if float(e).is_integer() and abs(e) <= 8:
            n = int(abs(e))
            product = " * ".join([str(x)] * n) if n else "1.0"
            return f"1.0 / ({product})" if e < 0 else product
        # x ** e for a non-integer e: NaN for x < 0, as in torch
        return f"tl.exp({literal(float(e))} * tl.log({x}))"
    if not x.tensor and isinstance(x.value, (int, float)) and x.value > 0:
        return f"tl.exp({y} * {literal(math.log(x.value))})"
    raise Unsupported("pow with a tensor exponent of a tensor base")


def _gelu(x: Operand, approximate: str) -> str:
    if approximate == "tanh":
        return (f"0.5 * {x} * (1.0 + _tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} "
                f"* {x})))")
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _softplus(x: Operand, beta: float, threshold: float) -> str:
    scaled = f"{x} * {literal(beta)}"
    return (f"tl.where({scaled} > {literal(threshold)}, {x}, "
            f"_log1p(tl.exp({scaled})) / {literal(beta)})")


def _clamp(x: Operand, lo: Operand, hi: Operand) -> str:
    out = str(x)
    if lo.tensor or lo.value is not None:
        out = f"tl.maximum({out}, {lo}, {_NAN_ALL})"
    if hi.tensor or hi.value is not None:
        out = f"tl.minimum({out}, {hi}, {_NAN_ALL})"
    return out


def _to(x: Operand, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return f"{x} != 0"
    if dtype in (torch.float16, torch.bfloat16):
        # round to the narrow type, keep computing in fp32
        return f"{x}.to({storage_type(dtype)}).to(tl.float32)"
    return f"{x}.to({compute_type(dtype)})"


@dataclass(frozen=True)
class Pointwise:
    """The template of one pointwise op: ``expr(*params)`` gives the Triton expression;
    ``cast`` names the operands converted to the result's compute type first;
    ``attributes`` the parameters passed as plain Python values (not operands).

    >>> POINTWISE["mul"].expr(Operand("a", True, 0), Operand(2.0))
    '{0} * 2.0'
    """

    expr: Callable[..., str]
    cast: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()


# Templates that need Python (a literal exponent, an attribute), by the name the op table
# gives them as ``@name``.
_FUNCTIONS: dict[str, Callable[..., str]] = {
    "pow": _pow, "gelu": _gelu, "softplus": _softplus, "clamp": _clamp, "to": _to}


def _expression(entry) -> Callable[..., str]:
    """The template of a table entry whose Triton expression is a format string over its
    operands (``tl.exp({x})``)."""
    operands = entry.operands

    def expr(*values) -> str:
        return entry.triton.format(**{p: str(v) for p, v in zip(operands, values)})
    return expr


def _pointwise(entry) -> Pointwise:
    expr = _FUNCTIONS[entry.triton[1:]] if entry.triton.startswith("@") else _expression(
        entry)
    cast = entry.operands if entry.triton_cast is None else entry.triton_cast
    return Pointwise(expr, cast, entry.attributes)


POINTWISE: dict[str, Pointwise] = {
    name: _pointwise(entry) for name, entry in TABLE.items()
    if entry.kind == "pointwise" and entry.triton is not None}
"""Pointwise ops: one Triton expression each (from the op table)."""

_CONSTANTS = {"ones_like": 1, "zeros_like": 0}


class Builder:
    """Collects the statements of one kernel; the templates call it.

    >>> b = Builder()
    >>> x = Operand(b.load(0, torch.float32), tensor=True)
    >>> b.row("softmax", [x], {"dim": (1,)}, torch.float32, torch.float32)
    'softmax_0'
    >>> [(s.name, s.kind) for s in b.stmts][1:]  # doctest: +NORMALIZE_WHITESPACE
    [('softmax_0_max', 'max'), ('softmax_0_shift', 'expr'),
     ('softmax_0_sumexp', 'sumexp'), ('softmax_0', 'expr')]
    """

    def __init__(self):
        self.stmts: list[Stmt] = []
        self.types: dict[str, str] = {}
        self._count = 0

    def _add(self, stmt: Stmt) -> str:
        self.stmts.append(stmt)
        self.types[stmt.name] = stmt.dtype
        return stmt.name

    def load(self, index: int, dtype: torch.dtype) -> str:
        """Read input ``index`` (converted to its compute type)."""
        return self._add(Stmt(f"x{index}", "load", dtype=compute_type(dtype), index=index))

    def expr(self, name: str, text: str, args: list[str], dtype: str) -> str:
        """An elementwise statement ``name = text.format(*args)``."""
        return self._add(Stmt(name, "expr", tuple(args), text, dtype))

    def reduce(self, name: str, kind: str, args: list[str]) -> str:
        """A row reduction (fp32 accumulation) of ``args[0]``."""
        return self._add(Stmt(name, kind, tuple(args), "", self.types[args[0]]))

    def cast(self, operand: Operand, dtype: str) -> Operand:
        """``operand`` converted to the compute type ``dtype`` (literals stay as they are)."""
        if not operand.tensor or self.types[operand.value] == dtype:
            return operand
        name = f"{operand.value}_{dtype.removeprefix('tl.')}"
        if name not in self.types:
            self.expr(name, f"{{0}}.to({dtype})", [operand.value], dtype)
        return Operand(name, tensor=True)

    def fresh(self, op: str) -> str:
        """The name of the next op's value (``softmax_3``)."""
        name = f"{op}_{self._count}"
        self._count += 1
        return name

    def pointwise(self, op: str, operands: list[Operand], attributes: dict,
                  dtype: torch.dtype) -> str:
        """The statement of pointwise ``op`` (result dtype ``dtype``); ``operands`` in the
        order of the op's non-attribute parameters."""
        result = compute_type(dtype)
        name = self.fresh(op)
        if op in _CONSTANTS or op in ("full_like", "full"):
            value = _CONSTANTS.get(op, attributes.get("value"))
            return self.expr(name, f"tl.full([], {literal(value)}, {result})", [], result)
        template = POINTWISE.get(op)
        if template is None:
            raise Unsupported(f"no Triton template for {op}")
        params = [p for p in TABLE[op].params if p not in template.attributes]
        named = dict(zip(params, operands))
        for p in template.cast:
            named[p] = self.cast(named[p], result)
        args: list[str] = []
        for p, o in named.items():
            if o.tensor:
                named[p] = Operand(o.value, True, len(args))
                args.append(o.value)
        text = template.expr(*named.values(), *[attributes[a] for a in template.attributes])
        return self.expr(name, text, args, result)

    def row(self, op: str, operands: list[Operand], attributes: dict,
            dtype: torch.dtype, input_dtype: torch.dtype) -> str:
        """The statements of row op ``op``; returns the name of its result."""
        if op not in ROW_OPS:
            raise Unsupported(f"no Triton template for {op}")
        result = compute_type(dtype)
        if result not in ("tl.float32", "tl.float64"):
            raise Unsupported(f"{op} of {dtype}: row reductions are generated for floats")
        operands = [self.cast(o, result) for o in operands]
        return ROW_OPS[op](self, self.fresh(op), operands, attributes, result, input_dtype)

    def stats(self, name: str, x: str, dtype: str) -> tuple[str, str]:
        """The shift (row max, made finite) and the sum of ``exp(x - shift)``."""
        m = self.reduce(f"{name}_max", "max", [x])
        shift = self.expr(f"{name}_shift", "_safe_max({0})", [m], dtype)
        return shift, self.reduce(f"{name}_sumexp", "sumexp", [x, shift])

    def centered(self, name: str, x: str, dtype: str) -> str:
        """``x`` minus its row mean."""
        total = self.reduce(f"{name}_sum", "sum", [x])
        mean = self.expr(f"{name}_mean", "{0} / cols", [total], dtype)
        return self.expr(f"{name}_centered", "{0} - {1}", [x, mean], dtype)

    def sum_of_squares(self, name: str, x: str, dtype: str) -> str:
        """The row sum of ``x * x``."""
        square = self.expr(f"{name}_square", "{0} * {0}", [x], dtype)
        return self.reduce(f"{name}_sum_square", "sum", [square])


def _sum(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    return b.reduce(name, "sum", [ops[0].value])


def _mean(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    total = b.reduce(f"{name}_sum", "sum", [ops[0].value])
    return b.expr(name, "{0} / cols", [total], dtype)


def _amax(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    return b.reduce(name, "max", [ops[0].value])


def _amin(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    return b.reduce(name, "min", [ops[0].value])


def _var(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    total = b.sum_of_squares(name, b.centered(name, ops[0].value, dtype), dtype)
    return b.expr(name, f"{{0}} / (cols - {literal(attrs['correction'])})", [total], dtype)


def _logsumexp(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    shift, total = b.stats(name, ops[0].value, dtype)
    return b.expr(name, "{0} + tl.log({1})", [shift, total], dtype)


def _softmax(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    shift, total = b.stats(name, ops[0].value, dtype)
    return b.expr(name, "tl.exp({0} - {1}) / {2}", [ops[0].value, shift, total], dtype)


def _log_softmax(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    shift, total = b.stats(name, ops[0].value, dtype)
    return b.expr(name, "{0} - {1} - tl.log({2})", [ops[0].value, shift, total], dtype)


def _normalised(b: Builder, name: str, x: str, total: str, eps: float, scales: list[Operand],
                dtype: str) -> str:
    """``x * rsqrt(total / cols + eps)``, then times the weight and plus the bias (each
    when given); the last statement is named ``name``."""
    rstd = b.expr(f"{name}_rstd", f"tl.rsqrt({{0}} / cols + {literal(float(eps))})", [total],
                  dtype)
    steps = [(f"{name}_normed", "{0} * {1}", rstd)]
    weight, *bias = scales
    if weight.tensor:
        steps.append((f"{name}_scaled", "{0} * {1}", weight.value))
    if bias and bias[0].tensor:
        steps.append((f"{name}_shifted", "{0} + {1}", bias[0].value))
    y = x
    for i, (step, text, other) in enumerate(steps):
        y = b.expr(name if i == len(steps) - 1 else step, text, [y, other], dtype)
    return y


def _layer_norm(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    centered = b.centered(name, ops[0].value, dtype)
    total = b.sum_of_squares(name, centered, dtype)
    return _normalised(b, name, centered, total, attrs["eps"], ops[1:3], dtype)


def _rms_norm(b: Builder, name, ops, attrs, dtype, input_dtype) -> str:
    eps = attrs["eps"]
    if eps is None:
        eps = torch.finfo(input_dtype).eps
    total = b.sum_of_squares(name, ops[0].value, dtype)
    return _normalised(b, name, ops[0].value, total, eps, ops[1:2], dtype)


_RowTemplate = Callable[[Builder, str, list, dict, str, torch.dtype], str]
_ROW_TEMPLATES: dict[str, _RowTemplate] = {
    "sum": _sum, "mean": _mean, "amax": _amax, "amin": _amin, "var": _var,
    "logsumexp": _logsumexp, "softmax": _softmax, "log_softmax": _log_softmax,
    "layer_norm": _layer_norm, "rms_norm": _rms_norm,
}
ROW_OPS: dict[str, _RowTemplate] = {
    name: _ROW_TEMPLATES[entry.triton[1:]] for name, entry in TABLE.items()
    if entry.kind == "reduction" and entry.triton is not None}
"""Row ops: a few statements each, over the primitive reductions (the op table names the
template of each)."""


def attributes_of(op: str) -> tuple[str, ...]:
    """The parameters of ``op`` passed to its template as Python values (the op table's
    attributes).

    >>> attributes_of("layer_norm"), attributes_of("gelu")
    (('shape', 'eps'), ('approximate',))
    """
    return TABLE[op].attributes
