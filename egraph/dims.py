"""Symbolic sizes: a dimension known by its expression in the input sizes (sympy), as
torch.compile's dynamic shapes and torch.export's ``Dim`` hand them over.

A :class:`Size` is an ``int`` whose value is the example's size and whose identity is its
expression. Costs read it as the number it was in the example (:func:`hints`); rules read
it soundly: two sizes are equal only when their expressions are, and a size never equals
a number. Integer arithmetic gives sizes (``s0 * 64``, ``s0 // 2``); an order holds only
where the expressions prove it. Anything in Python that would need the example's value to
decide (a division to a float, ``s0 < s1``, a literal of a size) raises
:class:`SymbolicSize`, which a rule reads as "does not apply": no rule can bake the
example's size into a program meant for every size. C code that takes an int (torch's
argument parser, ``range``) reads the example's value: sizes reach torch only as the
SymInts that the shape analysis makes of them.

>>> import sympy
>>> s0 = sympy.Symbol("s0", integer=True, positive=True)
>>> seq = Size(8, s0, {s0: 8})
>>> seq * 64, int(seq * 64), seq * 64 == Size(512, 64 * s0, {s0: 8}), seq == 8
(64*s0, 512, True, False)
>>> hints((2, seq, 64))
(2, 8, 64)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

LEAST = 2
"""The least value of a dynamic size: torch.compile and torch.export specialise sizes 0
and 1, so a symbol stands for 2 or more."""


class SymbolicSize(TypeError):
    """A question about a symbolic size that only its example value could answer.

    >>> import sympy
    >>> try:
    ...     float(Size(8, sympy.Symbol("s0", integer=True, positive=True)))
    ... except SymbolicSize as err:
    ...     print(err)
    the size s0 has no one value (only its example has)
    """


class Size(int):
    """A symbolic size: the example's value (``int(size)``), the ``expr`` it stands for,
    and for each symbol in it the example's value and the range it may take
    (``bindings``: ``{symbol: (hint, low, high)}``, None for no bound; a plain
    ``{symbol: hint}`` for the range dynamic sizes have, 2 or more), so that shape
    inference can rebuild it elsewhere.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> Size(8, s0, {s0: 8}) // 2 + 1
    floor(s0/2) + 1
    """

    expr: Any
    bindings: tuple

    def __new__(cls, hint: int, expr: Any, bindings: Mapping | tuple = ()) -> Any:
        if getattr(expr, "is_Integer", False):
            return int(expr)
        self = super().__new__(cls, hint)
        self.expr = expr
        self.bindings = tuple(sorted(
            ((symbol, bound if isinstance(bound, tuple) else (bound, LEAST, None))
             for symbol, bound in dict(bindings).items()), key=lambda kv: kv[0].name))
        return self

    def __reduce__(self):
        return (Size, (int(self), self.expr, self.bindings))

    def __repr__(self) -> str:
        return str(self.expr)

    __str__ = __repr__

    def __hash__(self) -> int:
        return hash(self.expr)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Size):
            return self.expr == other.expr
        if isinstance(other, (int, float)):
            return False  # an expression with a symbol in it is not one number
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __bool__(self) -> bool:
        zero = self.expr.is_zero
        if zero is None:
            raise SymbolicSize(f"whether {self.expr} is zero depends on the input's sizes")
        return not zero

    def __index__(self) -> int:
        raise SymbolicSize(f"the size {self.expr} has no one value (only its example has)")

    def __float__(self) -> float:
        raise SymbolicSize(f"the size {self.expr} has no one value (only its example has)")

    def __truediv__(self, other: Any) -> Any:
        raise SymbolicSize(f"{self.expr} / {other} is a number only for one size")

    def __rtruediv__(self, other: Any) -> Any:
        raise SymbolicSize(f"{other} / {self.expr} is a number only for one size")

    def __neg__(self) -> Any:
        return Size(-int(self), -self.expr, self.bindings)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        import sympy

        return Size(abs(int(self)), sympy.Abs(self.expr), self.bindings)

    def __floor__(self) -> Any:
        return self

    __ceil__ = __trunc__ = __floor__

    def __round__(self, ndigits: Any = None) -> Any:
        return self

    def __pow__(self, other: Any) -> Any:
        if type(other) is int and other >= 0:
            return _arith(self, other, operator.pow, operator.pow)
        raise SymbolicSize(f"{self.expr} ** {other} is a number only for one size")

    def __rpow__(self, other: Any) -> Any:
        raise SymbolicSize(f"{other} ** {self.expr} is a number only for one size")

    def __lt__(self, other: Any) -> bool:
        return _order(self, other, "<")

    def __le__(self, other: Any) -> bool:
        return _order(self, other, "<=")

    def __gt__(self, other: Any) -> bool:
        return _order(self, other, ">")

    def __ge__(self, other: Any) -> bool:
        return _order(self, other, ">=")


def _floordiv(a: Any, b: Any) -> Any:
    import sympy

    return sympy.floor(a / b)


def _mod(a: Any, b: Any) -> Any:
    import sympy

    return sympy.Mod(a, b)


def _binary(name: str, on_exprs: Callable, on_ints: Callable) -> None:
    def forward(self, other):
        return _arith(self, other, on_exprs, on_ints)

    def reflected(self, other):
        return _arith(other, self, on_exprs, on_ints)

    forward.__name__, reflected.__name__ = f"__{name}__", f"__r{name}__"
    setattr(Size, forward.__name__, forward)
    setattr(Size, reflected.__name__, reflected)


for _name, _exprs, _ints in (("add", operator.add, operator.add),
                             ("sub", operator.sub, operator.sub),
                             ("mul", operator.mul, operator.mul),
                             ("floordiv", _floordiv, operator.floordiv),
                             ("mod", _mod, operator.mod)):
    _binary(_name, _exprs, _ints)


def _arith(a: Any, b: Any, on_exprs: Callable, on_ints: Callable) -> Any:
    """``a op b`` where one of them is a size and the other an int or a size; a float
    has no size arithmetic (Python's float operators read the example's value)."""
    if isinstance(a, bool) or isinstance(b, bool) or not (
            isinstance(a, int) and isinstance(b, int)):
        return NotImplemented
    try:
        hint = on_ints(int(a), int(b))
    except ZeroDivisionError:
        raise SymbolicSize(f"{a} by {b}: a division by zero at the example's size") from None
    bindings = dict(getattr(a, "bindings", ()))
    bindings.update(getattr(b, "bindings", ()))
    return Size(hint, on_exprs(expression(a), expression(b)), bindings)


def _order(a: Size, b: Any, relation: str) -> bool:
    if isinstance(b, bool) or not isinstance(b, (int, float)):
        return NotImplemented
    decided = decide(a, b, relation)
    if decided is None:
        raise SymbolicSize(f"whether {a} {relation} {b} depends on the input's sizes")
    return decided


_RELATIONS = {"==": "Eq", "!=": "Ne", "<": "Lt", "<=": "Le", ">": "Gt", ">=": "Ge"}


def decide(a: Any, b: Any, relation: str) -> bool | None:
    """Whether ``a relation b`` holds for every size, fails for every size, or (None)
    depends on the sizes; ``relation`` is one of ``== != < <= > >=``.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> seq = Size(8, s0, {s0: 8})
    >>> decide(seq, 0, ">"), decide(seq + 1, seq, "=="), decide(seq, 8, "==")
    (True, False, None)
    """
    import sympy

    x = expression(a) if isinstance(a, int) else sympy.nsimplify(a)
    y = expression(b) if isinstance(b, int) else sympy.nsimplify(b)
    # each symbol s of least value L is L + t for a t >= 0 that sympy can reason about
    shifted = {}
    for size in (a, b):
        for symbol, (_, low, _) in getattr(size, "bindings", ()):
            if low is not None:
                shifted[symbol] = low + sympy.Symbol(f"{symbol.name}_over", integer=True,
                                                     nonnegative=True)
    truth = getattr(sympy, _RELATIONS[relation])(x.xreplace(shifted), y.xreplace(shifted))
    if truth is sympy.true or truth is sympy.false:
        return bool(truth)
    return None


def expression(value: int) -> Any:
    """The sympy expression of a size or an int.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> expression(Size(8, s0) * 2), expression(3)
    (2*s0, 3)
    """
    if isinstance(value, Size):
        return value.expr
    import sympy

    return sympy.Integer(value)


def sizes_in(value: Any) -> Iterator[Size]:
    """The sizes in a value: a size, or a tuple, list or slice holding some (at any
    depth).

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> list(sizes_in((2, [Size(8, s0)], slice(0, Size(8, s0) + 1))))
    [s0, s0 + 1]
    """
    if isinstance(value, Size):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from sizes_in(item)
    elif isinstance(value, slice):
        yield from sizes_in((value.start, value.stop, value.step))


def map_sizes(value: Any, fn: Callable[[Size], Any]) -> Any:
    """``value`` with each size in it (as :func:`sizes_in` finds them) replaced by
    ``fn(size)``, tuples, lists and slices rebuilt around them.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> map_sizes((2, slice(None, Size(8, s0))), int)
    (2, slice(None, 8, None))
    """
    if isinstance(value, Size):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_sizes(item, fn) for item in value)
    if isinstance(value, slice):
        return slice(map_sizes(value.start, fn), map_sizes(value.stop, fn),
                     map_sizes(value.step, fn))
    return value


def is_symbolic(value: Any) -> bool:
    """True for a size, or a tuple, list or slice holding one (at any depth).

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> is_symbolic((2, slice(0, Size(8, s0)))), is_symbolic((2, 8))
    (True, False)
    """
    return any(True for _ in sizes_in(value))


def hints(shape: tuple) -> tuple:
    """The shape the example had: each size as the plain int it was (what costs read).

    >>> import sympy
    >>> hints((2, Size(8, sympy.Symbol("s0", integer=True, positive=True)) + 1))
    (2, 9)
    """
    return tuple(int(s) for s in shape)
