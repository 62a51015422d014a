"""The torch side of the op table: each canonical op's torch implementation, and the lowering
of every spelling (torch function, Tensor method, Python operator, aten overload, nn.Module)
to canonical ops.

The op table (:mod:`egraph.ops.table`) names implementations and spellings by qualified
name; this module resolves them (:func:`resolve`) and registers, for each spelling, the
lowering the table names (:mod:`frontends.fx.lowerings`): it maps a target's own signature
to a canonical expression ``(name, [values])``, where a value is an FX argument, a Python
constant, or a nested canonical expression.

>>> SPECS["softmax"].params
('x', 'dim')
>>> lower(torch.softmax, ("x", -1), {})
('softmax', ['x', -1])
>>> lower("add", ("x", 2), {}, method=True)
('add', ['x', 2])
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from egraph.ops.table import TABLE, UNKNOWN_VALUE, Module, dims_of
from frontends.fx.lowerings import Lowered, Unsupported, lowering

__all__ = ["COMMUTATIVE_CALLS", "IMPURE", "LAYOUT_KEEPING_CALLS", "METHODS", "MODULES",
           "OPERATORS_BY_NAME", "PERMUTING_CALLS", "SCALAR_FUNCTIONS", "SPECS", "SPELLINGS",
           "UNKNOWN_VALUE", "OpSpec", "dims_of", "full_size", "is_expression", "lower",
           "module_op", "resolve"]

aten = torch.ops.aten


def resolve(qualified: str) -> Any:
    """The object a qualified name of the op table names: ``torch.nn.functional.gelu``,
    ``aten.add.Tensor`` (an overload of ``torch.ops.aten``), ``operator.add``,
    ``math.sqrt``, ``builtins.getattr``; ``Tensor.x`` is the method ``torch.Tensor.x``;
    ``ops.<namespace>.<op>`` an operator of ``torch.ops`` (registered by its library).

    >>> resolve("aten.add.Tensor") is torch.ops.aten.add.Tensor
    True
    >>> resolve("torch.nn.functional.silu").__name__
    'silu'
    """
    parts = qualified.split(".")
    if parts[0] in ("aten", "ops"):
        obj: Any = aten if parts[0] == "aten" else torch.ops
        parts = parts[1:]
    elif parts[0] == "Tensor":
        obj, parts = torch.Tensor, parts[1:]
    else:
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            parts = parts[i:]
            break
        else:
            raise ValueError(f"{qualified!r} names no module")
    for part in parts:
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class OpSpec:
    """One canonical op as torch runs it: parameter names (``*rest`` for a variadic tail),
    implementation (a torch callable, or a method name as a string), how canonical values
    become the implementation's ``(args, kwargs)``, and the attribute normalisation."""

    name: str
    params: tuple[str, ...]
    impl: Callable | str
    call: Callable[..., tuple[tuple, dict]] | None = None
    normalize: Callable[[list, list], list] | None = None
    pointwise: bool = False
    symbolic_impl: Callable | None = None
    """What runs the op on fake tensors of symbolic sizes where :attr:`impl` would fix
    them (the op table's ``symbolic_impl``); None: :attr:`impl`."""

    def run(self, values: list):
        """Apply the op to concrete (or meta) values."""
        args, kwargs = self.arguments(values)
        return self.impl_call(self.numbers_as_tensors(args, torch.Tensor.new_tensor), kwargs)

    def run_symbolic(self, values: list):
        """:meth:`run` on fake tensors whose sizes are symbols: through
        :attr:`symbolic_impl` where the op has one.

        >>> x = torch.empty(3, 4, device="meta")
        >>> SPECS["pad"].run_symbolic([x, (1, 1), 0.0]).shape
        torch.Size([3, 6])
        """
        if self.symbolic_impl is None:
            return self.run(values)
        args, kwargs = self.arguments(values)
        return self.symbolic_impl(*args, **kwargs)

    def arguments(self, values: list) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for :attr:`impl` from canonical parameter values."""
        if self.call is not None:
            return self.call(*values)
        return tuple(values), {}

    def numbers_as_tensors(self, args: tuple, make: Callable) -> tuple:
        """``args`` with each Python number that :attr:`impl` refuses (``torch.hypot(x,
        1.0)``; pointwise ops only) replaced by ``make(tensor, number)``, ``tensor`` being
        the first tensor argument: a 0-d tensor of its dtype and device, as the number
        would have been taken had the function accepted it."""
        if not self.pointwise or not any(type(a) in (int, float) for a in args):
            return args
        kinds = tuple("number" if type(a) in (int, float) else "tensor"
                      if not isinstance(a, (bool, type(None), str)) else a for a in args)
        like = next((a for a, kind in zip(args, kinds) if kind == "tensor"), None)
        if like is None:
            return args
        return tuple(make(like, a) if kinds[i] == "number"
                     and not self.takes_number(i, kinds) else a
                     for i, a in enumerate(args))

    def takes_number(self, position: int, kinds: tuple) -> bool:
        """Whether :attr:`impl` accepts a Python number as argument ``position`` when the
        arguments are ``kinds`` (``"tensor"``, ``"number"``, or the value itself)
        (``torch.sub(2.0, x)`` does, ``torch.hypot(x, 1.0)`` raises TypeError), found once
        by a call on meta tensors: torch's Python binding accepts numbers for some tensor
        parameters, which the schemas do not say.

        >>> SPECS["hypot"].takes_number(1, ("tensor", "number"))
        False
        >>> SPECS["sub"].takes_number(0, ("number", "tensor"))
        True
        """
        key = (self.name, position, kinds)
        if key not in _TAKES_NUMBER:
            args = [torch.empty(2, device="meta") if k == "tensor" else 1.0 if k == "number"
                    else k for k in kinds]
            args[position] = 1.0
            try:
                self.impl_call(args, {})
                _TAKES_NUMBER[key] = True
            except TypeError:
                _TAKES_NUMBER[key] = False
            except Exception:  # noqa: BLE001 - another complaint is not about numbers
                _TAKES_NUMBER[key] = True
        return _TAKES_NUMBER[key]

    def impl_call(self, args, kwargs):
        """Call :attr:`impl` on implementation arguments (a method on the first)."""
        if isinstance(self.impl, str):
            if not isinstance(args[0], torch.Tensor):
                raise TypeError(f"Tensor.{self.impl} needs a tensor to call it on")
            return getattr(args[0], self.impl)(*args[1:], **kwargs)
        return self.impl(*args, **kwargs)


_TAKES_NUMBER: dict[tuple[str, int, tuple], bool] = {}


def _spec(entry) -> OpSpec:
    impl = entry.impl.removeprefix("Tensor.") if entry.impl.startswith("Tensor.") else (
        resolve(entry.impl))
    return OpSpec(entry.name, entry.params, impl, entry.call, entry.normalize,
                  entry.kind == "pointwise",
                  resolve(entry.symbolic_impl) if entry.symbolic_impl else None)


SPECS: dict[str, OpSpec] = {name: _spec(e) for name, e in TABLE.items() if e.impl}
"""Every op of the table that torch runs, by name."""


PERMUTING_CALLS = frozenset({torch.permute, torch.transpose, torch.t, torch.movedim,
                             torch.swapaxes, torch.swapdims})
"""The calls whose result is a permuted view of their operand."""
LAYOUT_KEEPING_CALLS = frozenset({torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten})
"""The calls whose result keeps their operand's order of dimensions in memory (a view of
a permuted tensor stays permuted where it can be a view)."""
COMMUTATIVE_CALLS = frozenset({torch.add, torch.mul, operator.add, operator.mul,
                               torch.maximum, torch.minimum})
"""The elementwise calls whose two operands can swap places with the same values
(``a + b`` is ``b + a`` in floating point)."""


def full_size(shape: Any, result: tuple) -> bool:
    """Whether an operand of ``shape`` has every size of an elementwise ``result`` (or 1 in
    place of a size 1): the operands that decide the result's layout. None: not known.

    >>> full_size((3, 4), (2, 3, 4)), full_size((1, 4), (2, 3, 4))
    (False, False)
    >>> full_size((1, 3, 4), (1, 3, 4))
    True
    """
    if shape is None or len(shape) > len(result):
        return False
    shape = (1,) * (len(result) - len(shape)) + tuple(shape)
    return all(d == t for d, t in zip(shape, result))


# Targets with effects torch's op schemas do not tell, always opaque and kept in order
# (the random ops are known from their schemas: frontends.fx.effects.draws_random):
# printing, and aot_autograd's dropout, whose mask is drawn unless its ``train`` is False.
IMPURE: set = {print, aten.native_dropout.default}


SPELLINGS: dict[Any, Callable[..., Lowered]] = {}
"""Lowering of each call target (a torch function, operator or aten overload)."""
METHODS: dict[str, Callable[..., Lowered]] = {}
"""Lowering of each Tensor method, by method name."""
SCALAR_FUNCTIONS: set = set()
"""Python's math functions on shape-derived scalars (``math.sqrt(x.size(-1))``): they fold
to a literal; ingest keeps these calls opaque when their argument is not a known scalar."""

OPERATORS_BY_NAME: dict[str, Callable[..., Lowered]] = {}
"""Lowering of each operator of another library (``ops.<namespace>.<op>`` in the table),
by the operator's name (``transformers.grouped_mm_fallback``): it exists only once that
library has loaded, so it is matched by name, not resolved here."""

for _entry in TABLE.values():
    for _target, _adapter in _entry.spellings:
        _fn = lowering(_entry.name, _adapter)
        if _target.startswith("Tensor."):
            METHODS[_target.removeprefix("Tensor.")] = _fn
        elif _target.startswith("ops."):
            OPERATORS_BY_NAME[_target.removeprefix("ops.")] = _fn
        else:
            SPELLINGS[resolve(_target)] = _fn
            if _target.startswith("math."):
                SCALAR_FUNCTIONS.add(resolve(_target))

MODULES: dict[type, tuple[str, Module]] = {
    resolve(m.cls): (e.name, m) for e in TABLE.values() for m in e.modules}
"""The op each nn.Module class lowers to, with where its parameters come from."""


def module_op(module: torch.nn.Module) -> tuple[str, Module] | None:
    """The op a module's call is, with its argument sources, or None when the table has
    no lowering for it (a subclass that overrides ``forward``, or a configuration its
    ``when`` excludes, is kept opaque).

    >>> module_op(torch.nn.Linear(2, 3))[0], module_op(torch.nn.Dropout().train()) is None
    ('linear', True)
    """
    for cls in type(module).__mro__:
        found = MODULES.get(cls)
        if found is None:
            continue
        if type(module).forward is not cls.forward:
            return None
        name, entry = found
        return found if entry.when is None or entry.when(module) else None
    return None


def is_expression(value: Any) -> bool:
    """Whether ``value`` is a lowered expression, ``(op name, [operands])``, as
    :func:`lower` returns one.

    >>> is_expression(("exp", [1])), is_expression((2, 3))
    (True, False)
    """
    return (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], list))


def lower(target, args: tuple, kwargs: dict, method: bool = False) -> Lowered | None:
    """The canonical expression of a call, or None if the vocabulary does not model it."""
    fn = METHODS.get(target) if method else SPELLINGS.get(target)
    if fn is None and isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        fn = OPERATORS_BY_NAME.get(str(target))
    if fn is None or (not method and target in IMPURE):
        return None
    try:
        result = fn(*args, **kwargs)
    except (Unsupported, TypeError):
        return None
    return result
