"""Terms, pattern variables, literals and the s-expression syntax.

A :class:`Term` is an operator applied to argument terms; a leaf is a term with no arguments.
The operator of a leaf is a symbol (``x``), a number (``3``, egg's untagged arithmetic), a
string literal (``"x"``) or a typed literal (``#float:1.0``) as used by tensor programs.
A term that contains :class:`Var` leaves (``?x``) is a pattern.

>>> t = parse("(+ ?a (* ?b 2))")
>>> str(t)
'(+ ?a (* ?b 2))'
>>> parse(str(t)) == t
True
>>> x, y = vars("x y")
>>> str(x @ (y + x))
'(matmul ?x (add ?y ?x))'

Python operators build the canonical ops: ``+ - * / @ ** // %`` are ``add sub mul div
matmul pow floordiv remainder``, unary ``- abs ~`` are ``neg abs bitwise_not``, and
``< <= > >=`` are ``lt le gt ge`` (``==`` stays structural equality of terms).

>>> str(1 / (1 + 2 ** -x) < x % 3)
'(lt (div #int:1 (add #int:1 (pow #int:2 (neg ?x)))) (remainder ?x #int:3))'
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable, Iterator
from typing import Any

from egraph.dims import Size, SymbolicSize

NAN = float("nan")
"""The one NaN object every literal NaN is mapped to, so that hash-consing finds it again."""

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)$")
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": NAN}

# Typed literals of tensor programs are hashed as ``(tag, value)`` tuples: in Python
# ``True == 1 == 1.0`` would otherwise collapse keepdim=True, dim=1 and the scalar 1.0.
LITERAL_TAGS = ("int", "float", "bool", "str", "none", "ints", "dtype", "device",
                "layout", "ellipsis")


class SyntaxError_(ValueError):
    """A malformed s-expression; the message names the position and the fix."""


def canonical_number(value: float | int) -> float | int:
    """Map every NaN to :data:`NAN` so equal-looking literals hash-cons together.

    >>> canonical_number(float("nan")) is NAN
    True
    """
    if isinstance(value, float) and value != value:
        return NAN
    return value


def literal(value: Any) -> tuple:
    """The typed literal operator of a Python scalar, as tensor programs spell it.

    >>> literal(1), literal(1.0), literal(True)
    (('int', 1), ('float', 1.0), ('bool', True))
    """
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, Size):
        raise SymbolicSize(f"a literal of the symbolic size {value} would fix the example's "
                           "size into the program")
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", canonical_number(value))
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("none", None)
    if value is Ellipsis:
        return ("ellipsis", None)
    if isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        if any(isinstance(v, Size) for v in value):
            raise SymbolicSize(f"a literal of the symbolic shape {tuple(value)} would fix the "
                               "example's sizes into the program")
        return ("ints", tuple(value))
    raise TypeError(
        f"cannot make a literal of {value!r} ({type(value).__name__}); "
        "literals are int, float, bool, str, None or a tuple of ints"
    )


def is_literal_op(op: Hashable) -> bool:
    """True for a typed-literal operator such as ``('float', 1.0)``."""
    return type(op) is tuple and len(op) == 2 and op[0] in LITERAL_TAGS


def is_number_op(op: Hashable) -> bool:
    """True for an untagged number (egg's arithmetic constants)."""
    return type(op) in (int, float)


def format_op(op: Hashable) -> str:
    """The s-expression spelling of an operator or leaf."""
    kind = type(op)
    if kind is str:
        return op
    if kind is int:
        return str(op)
    if kind is float:
        return _format_float(op)
    if is_literal_op(op):
        tag, value = op
        if tag == "str":
            return json.dumps(value)
        if tag == "none":
            return "#none"
        if tag == "ellipsis":
            return "#ellipsis"
        if tag == "dtype":
            return f"#dtype:{value}"
        if tag == "bool":
            return "#bool:true" if value else "#bool:false"
        if tag == "float":
            return "#float:" + _format_float(value, keep_point=True)
        if tag == "ints":
            return "#ints:" + ",".join(map(str, value))
        return f"#{tag}:{value}"
    return repr(op)


def _format_float(value: float, keep_point: bool = False) -> str:
    if value != value:
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if not keep_point and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _parse_typed(token: str, pos: int) -> tuple:
    tag, _, text = token[1:].partition(":")
    try:
        if tag == "none" and not text:
            return ("none", None)
        if tag == "ellipsis" and not text:
            return ("ellipsis", None)
        if tag == "dtype" and text.isidentifier():
            return ("dtype", text)
        if tag == "device" and text:
            return ("device", text)
        if tag == "layout" and text.isidentifier():
            return ("layout", text)
        if tag == "bool" and text in ("true", "false"):
            return ("bool", text == "true")
        if tag == "int":
            return ("int", int(text))
        if tag == "float":
            return ("float", canonical_number(_SPECIAL_FLOATS.get(text) or float(text)))
        if tag == "ints":
            return ("ints", tuple(int(v) for v in text.split(",")) if text else ())
    except ValueError:
        pass
    raise SyntaxError_(
        f"bad typed literal {token!r} at position {pos}: use #int:3, #float:1.0, "
        "#bool:true, #none or #ints:2,3"
    )


class _TermOps:
    """Python operators that build terms of the canonical tensor vocabulary."""

    __slots__ = ()

    def __add__(self, other):
        return Term("add", (self, as_term(other)))

    def __radd__(self, other):
        return Term("add", (as_term(other), self))

    def __sub__(self, other):
        return Term("sub", (self, as_term(other)))

    def __rsub__(self, other):
        return Term("sub", (as_term(other), self))

    def __mul__(self, other):
        return Term("mul", (self, as_term(other)))

    def __rmul__(self, other):
        return Term("mul", (as_term(other), self))

    def __truediv__(self, other):
        return Term("div", (self, as_term(other)))

    def __rtruediv__(self, other):
        return Term("div", (as_term(other), self))

    def __matmul__(self, other):
        return Term("matmul", (self, as_term(other)))

    def __rmatmul__(self, other):
        return Term("matmul", (as_term(other), self))

    def __pow__(self, other):
        return Term("pow", (self, as_term(other)))

    def __rpow__(self, other):
        return Term("pow", (as_term(other), self))

    def __floordiv__(self, other):
        return Term("floordiv", (self, as_term(other)))

    def __rfloordiv__(self, other):
        return Term("floordiv", (as_term(other), self))

    def __mod__(self, other):
        return Term("remainder", (self, as_term(other)))

    def __rmod__(self, other):
        return Term("remainder", (as_term(other), self))

    # ``==`` and ``!=`` stay structural equality (terms are dict keys); ``eq`` and ``ne``
    # are spelled with :mod:`egraph.ops`. Python reflects ``2 < x`` to ``x > 2`` itself.
    def __lt__(self, other):
        return Term("lt", (self, as_term(other)))

    def __le__(self, other):
        return Term("le", (self, as_term(other)))

    def __gt__(self, other):
        return Term("gt", (self, as_term(other)))

    def __ge__(self, other):
        return Term("ge", (self, as_term(other)))

    def __neg__(self):
        return Term("neg", (self,))

    def __abs__(self):
        return Term("abs", (self,))

    def __invert__(self):
        return Term("bitwise_not", (self,))


class Term(_TermOps):
    """An operator applied to argument terms; immutable and hashable.

    >>> Term("+", (Term("x"), Term(1)))
    Term('(+ x 1)')
    """

    __slots__ = ("op", "args", "_hash")

    def __init__(self, op: Hashable, args: tuple = ()):
        self.op = op
        self.args = tuple(args)
        self._hash = hash((op, self.args))

    def __eq__(self, other):
        if self is other:
            return True
        if type(other) is not Term:
            return NotImplemented if not isinstance(other, Term) else False
        # Tuples compare elements by identity first, so the NaN singleton equals itself.
        return self._hash == other._hash and (self.op, self.args) == (other.op, other.args)

    def __hash__(self):
        return self._hash

    def __str__(self):
        return to_sexpr(self)

    def __repr__(self):
        return f"Term({str(self)!r})"

    def __bool__(self):
        return True

    @property
    def is_ground(self) -> bool:
        """True when the term has no pattern variables."""
        return not any(isinstance(t, Var) for t in walk(self))

    def variables(self) -> list[str]:
        """Names of the pattern variables, in order of first occurrence."""
        seen: dict[str, None] = {}
        for t in walk(self):
            if isinstance(t, Var):
                seen.setdefault(t.name, None)
        return list(seen)


class Var(Term):
    """A pattern variable ``?name``.

    >>> Var("x")
    Var('?x')
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not name or not re.match(r"^[A-Za-z_][\w.]*$", name):
            raise ValueError(f"bad pattern variable name {name!r}: use letters, digits and _")
        self.name = name
        self.op = None
        self.args = ()
        self._hash = hash(("?var", name))

    def __eq__(self, other):
        return isinstance(other, Var) and other.name == self.name

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"Var('?{self.name}')"


def vars(names: str) -> tuple[Var, ...]:  # noqa: A001 - the public name is part of the design
    """Pattern variables from a space-separated string of names.

    >>> x, y = vars("x y")
    >>> str(x + y)
    '(add ?x ?y)'
    """
    return tuple(Var(n) for n in names.replace(",", " ").split())


def as_term(value: Any) -> Term:
    """A term for a Python value: a Term stays, a scalar becomes a typed literal leaf.

    >>> as_term(2.0)
    Term('#float:2.0')
    """
    if isinstance(value, Term):
        return value
    return Term(literal(value))


def walk(term: Term) -> Iterator[Term]:
    """Every subterm, parents before children (iterative, so deep terms are fine)."""
    stack = [term]
    while stack:
        t = stack.pop()
        yield t
        stack.extend(reversed(t.args))


def to_sexpr(term: Term) -> str:
    """The s-expression text of a term; ``parse(to_sexpr(t)) == t``."""
    out: list[str] = []
    stack: list[Any] = [term]
    while stack:
        t = stack.pop()
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, Var):
            out.append("?" + t.name)
        elif not t.args:
            out.append(format_op(t.op))
        else:
            out.append("(" + format_op(t.op))
            stack.append(")")
            for a in reversed(t.args):
                stack.append(a)
                stack.append(" ")
    return "".join(out)


_TOKEN = re.compile(r'\s*(?:(\()|(\))|("(?:[^"\\]|\\.)*")|([^\s()"]+))')


def _leaf(token: str, pos: int) -> Term:
    if token.startswith("?"):
        return Var(token[1:])
    if token.startswith("#"):
        return Term(_parse_typed(token, pos))
    if _NUMBER.match(token):
        if re.match(r"^[+-]?\d+$", token):
            return Term(int(token))
        return Term(float(token))
    if token in _SPECIAL_FLOATS:
        return Term(_SPECIAL_FLOATS[token])
    return Term(token)


def parse(text: str) -> Term:
    """Parse one s-expression in egg's syntax into a :class:`Term`.

    ``?x`` is a pattern variable; numbers are egg numbers (``1`` and ``1.0`` are the same
    number); ``inf``, ``-inf`` and ``nan`` are floats; ``"text"`` is a string literal;
    ``#int:3``, ``#float:1.0``, ``#bool:true``, ``#none`` and ``#ints:2,3`` are typed literals.

    >>> parse("(sqrt (+ x 1))").args[0].op
    '+'
    >>> parse("(+ x")
    Traceback (most recent call last):
    ...
    egraph.term.SyntaxError_: unbalanced s-expression: 1 unclosed '(' at the end of '(+ x'; add ')'
    """
    if not isinstance(text, str):
        raise TypeError(f"parse expects an s-expression string, got {type(text).__name__}")
    stack: list[list] = [[]]
    from_lists: set[int] = set()
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise SyntaxError_(f"cannot read {text[pos:pos + 20]!r} at position {pos}")
        start = m.start(m.lastindex) if m.lastindex else pos
        pos = m.end()
        opened, closed, string, token = m.groups()
        if opened:
            stack.append([start])
        elif closed:
            if len(stack) == 1:
                raise SyntaxError_(
                    f"unbalanced s-expression: unexpected ')' at position {start} in {text!r}"
                )
            items = stack.pop()
            if len(items) < 2:
                raise SyntaxError_(f"empty list '()' at position {items[0]}: write an operator")
            head = items[1]
            if id(head) in from_lists or isinstance(head, Var):
                raise SyntaxError_(
                    f"the operator at position {items[0]} must be a symbol, not {head}"
                )
            made = Term(head.op, items[2:])
            from_lists.add(id(made))
            stack[-1].append(made)
        elif string is not None:
            stack[-1].append(Term(("str", json.loads(string))))
        else:
            stack[-1].append(_leaf(token, start))
    if len(stack) > 1:
        raise SyntaxError_(
            f"unbalanced s-expression: {len(stack) - 1} unclosed '(' at the end of {text!r}; "
            "add ')'"
        )
    items = stack[0]
    if len(items) != 1:
        what = "nothing" if not items else f"{len(items)} expressions"
        raise SyntaxError_(f"expected one s-expression, found {what} in {text!r}")
    return items[0]
