"""An FPCore program's expression tree, checked: every operator known with its arity, every
variable bound. :mod:`frontends.fpcore.reader` builds it from the s-expressions; the module
builder, the reference and the writer walk it.

>>> e = Call("+", (Variable("x"), Number(Fraction(1, 10), "0.1")))
>>> e.free(), str(e)
(frozenset({'x'}), '(+ x 0.1)')
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Annotation", "Call", "Constant", "Expr", "Fraction", "If", "Let", "Number",
           "Variable"]


@dataclass(frozen=True)
class Number:
    """A literal: its exact value (a fraction) and how it was written."""

    value: Fraction
    text: str

    def free(self) -> frozenset[str]:
        """The variables it reads: none."""
        return frozenset()

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Constant:
    """A named constant: ``PI``, ``E``, ``INFINITY``, ``TRUE``, ..."""

    name: str

    def free(self) -> frozenset[str]:
        """The variables it reads: none."""
        return frozenset()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Variable:
    """An argument or a ``let``-bound name."""

    name: str

    def free(self) -> frozenset[str]:
        """The variables it reads: itself."""
        return frozenset({self.name})

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Call:
    """An operator (FPCore's name, :data:`frontends.fpcore.language.OPERATORS`) applied to
    its arguments."""

    op: str
    args: tuple[Expr, ...]

    def free(self) -> frozenset[str]:
        """The variables its arguments read."""
        return frozenset().union(*(a.free() for a in self.args))

    def __str__(self) -> str:
        return f"({' '.join([self.op, *map(str, self.args)])})"


@dataclass(frozen=True)
class If:
    """``(if cond then else)``."""

    cond: Expr
    then: Expr
    orelse: Expr

    def free(self) -> frozenset[str]:
        """The variables its three parts read."""
        return self.cond.free() | self.then.free() | self.orelse.free()

    def __str__(self) -> str:
        return f"(if {self.cond} {self.then} {self.orelse})"


@dataclass(frozen=True)
class Let:
    """``(let ([name value] ...) body)``; ``sequential`` for ``let*``, where each value
    sees the names bound before it."""

    bindings: tuple[tuple[str, Expr], ...]
    body: Expr
    sequential: bool = False

    def free(self) -> frozenset[str]:
        """The variables it reads from outside."""
        free, bound = set(), set()
        for name, value in self.bindings:
            free |= value.free() - (bound if self.sequential else set())
            bound.add(name)
        return frozenset(free | (self.body.free() - bound))

    def __str__(self) -> str:
        pairs = " ".join(f"[{n} {v}]" for n, v in self.bindings)
        return f"({'let*' if self.sequential else 'let'} ({pairs}) {self.body})"


@dataclass(frozen=True)
class Annotation:
    """``(! :property value ... body)``: properties (as written) that hold inside ``body``;
    ``:precision`` changes the precision its operations round to."""

    properties: tuple[tuple[str, str], ...]
    body: Expr

    @property
    def precision(self) -> str | None:
        """The ``:precision`` it declares, if any."""
        return dict(self.properties).get(":precision")

    def free(self) -> frozenset[str]:
        """The variables its body reads."""
        return self.body.free()

    def __str__(self) -> str:
        props = " ".join(f"{k} {v}" for k, v in self.properties)
        return f"(! {props} {self.body})"


Expr = Number | Constant | Variable | Call | If | Let | Annotation
"""An FPCore expression."""
