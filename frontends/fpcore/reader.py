"""From FPCore text to checked programs: each ``(FPCore ...)`` form is read into a
:class:`~frontends.fpcore.program.Program`, or into the error that says why it cannot be.

Every operator must be FPCore's (:mod:`frontends.fpcore.language`) with its arity, every
variable bound, every property a keyword with a value; constructs outside the language
covered (loops, tensors, operators torch or the op table lacks, precisions other than
binary32 and binary64) are :class:`~frontends.fpcore.errors.UnsupportedFPCore`.

>>> [p.name for p in read_programs('(FPCore (x) :name "a" x) (FPCore f (y) (* y y))')]
['a', 'f']
>>> read_programs("(FPCore (x) (sqr x))")[0]
MalformedFPCore("FPCore '#1', line 1:14: unknown operator 'sqr'")
"""

from __future__ import annotations

import re
from fractions import Fraction

from frontends.fpcore.errors import FPCoreError, MalformedFPCore, UnsupportedFPCore
from frontends.fpcore.expression import Annotation, Call, Constant, Expr, If, Let, Number, Variable
from frontends.fpcore.language import CONSTANTS, OPERATORS, REFUSED, UNSUPPORTED
from frontends.fpcore.program import PRECISIONS, Program
from frontends.fpcore.syntax import Atom, List, read

__all__ = ["read_programs"]

_ASSOCIATIVE = ("+", "-", "*")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([esfdl][+-]?\d+)?", re.IGNORECASE)
_RATIONAL = re.compile(r"[+-]?\d+/\d*[1-9]\d*")
_HEX = re.compile(r"[+-]?0x([0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(p[+-]?\d+)?", re.IGNORECASE)


def number(text: str) -> Fraction | None:
    """The exact value of an FPCore number literal (decimal, rational or hexadecimal),
    None if ``text`` is not one. A decimal's exponent may also be marked as Racket marks
    it (``s``, ``f``, ``d``, ``l``), as Herbie reads it: pbrt's benchmarks write ``0.6931f0``.

    >>> number("1e-3"), number("-1/3"), number("0x1.8p1"), number("x")
    (Fraction(1, 1000), Fraction(-1, 3), Fraction(3, 1), None)
    >>> number("0.6931f0"), number("2d-1")
    (Fraction(6931, 10000), Fraction(1, 5))
    """
    if _DECIMAL.fullmatch(text):
        return Fraction(re.sub("[sfdl]", "e", text, flags=re.IGNORECASE))
    if _RATIONAL.fullmatch(text):
        return Fraction(text)
    if _HEX.fullmatch(text):
        return Fraction(float.fromhex(text))
    return None


def read_programs(text: str) -> list[Program | FPCoreError]:
    """Every FPCore form of ``text``, in order: its program, or the error that says why it
    is none (named by the benchmark's ``:name``, else its identifier, else its number).
    Text that is not a sequence of s-expressions raises :class:`MalformedFPCore`."""
    out: list[Program | FPCoreError] = []
    named: dict[str, Program] = {}
    for index, form in enumerate(read(text), 1):
        label = f"#{index}"
        try:
            label, program = _program(form, label, named)
            out.append(program)
            if program.identifier is not None:
                named[program.identifier] = program
        except FPCoreError as err:
            out.append(err.named(label))
    return out


def _program(form, label: str, named: dict[str, Program]) -> tuple[str, Program]:
    if not (isinstance(form, List) and form.items and isinstance(form.items[0], Atom)
            and form.items[0].text == "FPCore"):
        raise MalformedFPCore("expected (FPCore (arguments) properties... body)",
                              position=form.position)
    items = list(form.items[1:])
    identifier = None
    if items and isinstance(items[0], Atom) and not items[0].is_string:
        identifier = items.pop(0).text
        label = identifier
    if len(items) < 2 or not isinstance(items[0], List):
        raise MalformedFPCore("expected an argument list and a body", label, form.position)
    arguments, body, properties = items[0], items[-1], items[1:-1]
    props: dict[str, Atom | List] = {}
    alternatives = []
    if len(properties) % 2:
        raise MalformedFPCore("a property without a value (or a body missing)", label,
                              properties[-1].position)
    for key, value in zip(properties[::2], properties[1::2]):
        if not (isinstance(key, Atom) and key.text.startswith(":")):
            raise MalformedFPCore("expected a :property", label, key.position)
        if key.text == ":alt":
            alternatives.append(value)
        else:
            props[key.text] = value
    name = props.get(":name")
    if isinstance(name, Atom) and name.is_string:
        label = name.string
    precision = _precision(props.get(":precision"), "binary64", label)
    names = []
    for arg in arguments.items:
        if isinstance(arg, List):
            if arg.items and isinstance(arg.items[0], Atom) and arg.items[0].text == "!":
                arg = arg.items[-1]
            else:
                raise UnsupportedFPCore(UNSUPPORTED["tensor"] + " (an array argument)", label,
                                        arg.position)
        if not isinstance(arg, Atom) or number(arg.text) is not None or arg.is_string:
            raise MalformedFPCore("an argument must be a name", label, arg.position)
        if arg.text in names:
            raise MalformedFPCore(f"argument {arg.text!r} is declared twice", label,
                                  arg.position)
        names.append(arg.text)
    check = _Checker(label, precision, named)
    expression = check(body, frozenset(names))
    pre = props.get(":pre")
    pre_expr = None if pre is None else check(pre, frozenset(names))
    alts: list[Expr | FPCoreError] = []
    for alt in alternatives:
        try:
            alts.append(check(alt, frozenset(names)))
        except FPCoreError as err:
            alts.append(err)
    extra = {k: _text(v) for k, v in props.items() if k not in (":name", ":pre", ":precision")}
    return label, Program(label, tuple(names), precision, expression, pre_expr,
                          identifier=identifier, properties=extra, alternatives=tuple(alts))


def _precision(datum, default: str, label: str) -> str:
    if datum is None:
        return default
    text = datum.text if isinstance(datum, Atom) else _text(datum)
    if text not in PRECISIONS:
        raise UnsupportedFPCore(f"precision {text} is not supported (only binary32 and "
                                "binary64)", label, datum.position)
    return text


def _text(datum) -> str:
    if isinstance(datum, Atom):
        return datum.text
    return "(" + " ".join(_text(d) for d in datum.items) + ")"


class _Checker:
    """Builds the expression tree of one benchmark, checking it as it goes."""

    def __init__(self, label: str, precision: str, named: dict[str, Program]):
        self.label, self.precision, self.named = label, precision, named

    def malformed(self, problem: str, datum) -> MalformedFPCore:
        return MalformedFPCore(problem, self.label, datum.position)

    def __call__(self, datum, scope: frozenset[str], precision: str | None = None) -> Expr:
        precision = precision or self.precision
        if isinstance(datum, Atom):
            return self.atom(datum, scope)
        if not datum.items:
            raise self.malformed("an empty expression ()", datum)
        head = datum.items[0]
        if not isinstance(head, Atom) or head.is_string:
            raise self.malformed("an operator must be a name", head)
        op, args = head.text, datum.items[1:]
        if op in ("let", "let*"):
            return self.let(datum, args, scope, precision, op == "let*")
        if op == "if":
            self.arity(datum, op, args, 3)
            return If(*(self(a, scope, precision) for a in args))
        if op == "!":
            return self.annotation(datum, args, scope, precision)
        if op == "cast":  # rounds to the current precision, which every value has already
            self.arity(datum, op, args, 1)
            return self(args[0], scope, precision)
        if op == "digits":
            self.arity(datum, op, args, 3)
            m, e, b = (number(a.text) if isinstance(a, Atom) else None for a in args)
            if None in (m, e, b) or e.denominator != 1:
                raise self.malformed("(digits m e b) takes three integers", datum)
            return Number(m * b ** int(e), _text(datum))
        if op in UNSUPPORTED:
            raise UnsupportedFPCore(UNSUPPORTED[op], self.label, head.position)
        if op in REFUSED:
            raise UnsupportedFPCore(f"{op}: {REFUSED[op]}", self.label, head.position)
        if op in self.named and op not in scope:
            return self.inline(datum, self.named[op], args, scope, precision)
        operator = OPERATORS.get(op)
        if operator is None:
            raise self.malformed(f"unknown operator {op!r}", head)
        if operator.minus_one and len(args) == 1:
            return Call("-", (self(args[0], scope, precision),))
        if op in _ASSOCIATIVE and len(args) != 2 and args:
            # Herbie reads n-ary arithmetic as nested to the left: (+ a b c) is (+ (+ a b) c)
            result = self(args[0], scope, precision)
            for arg in args[1:]:
                result = Call(op, (result, self(arg, scope, precision)))
            return result
        if operator.arity is None:
            if len(args) < operator.least:
                raise self.malformed(f"{op!r} takes at least {operator.least} arguments, "
                                     f"got {len(args)}", datum)
        else:
            self.arity(datum, op, args, operator.arity)
        if operator.torch is None and precision == "binary64":
            raise UnsupportedFPCore(
                f"{op} in binary64: torch has no {op} and no wider dtype than float64 to "
                "compute it exactly", self.label, head.position)
        return Call(op, tuple(self(a, scope, precision) for a in args))

    def inline(self, datum, callee: Program, args, scope, precision) -> Expr:
        """A call of another FPCore of the file (by its identifier): its body, with its
        arguments bound to the call's."""
        self.arity(datum, callee.identifier, args, len(callee.arguments))
        values = [self(a, scope, precision) for a in args]
        return Let(tuple(zip(callee.arguments, values)), callee.body)

    def arity(self, datum, op: str, args, count: int) -> None:
        if len(args) != count:
            raise self.malformed(f"{op!r} takes {count} argument{'s' * (count != 1)}, got "
                                 f"{len(args)}", datum)

    def atom(self, datum: Atom, scope: frozenset[str]) -> Expr:
        text = datum.text
        if datum.is_string:
            raise self.malformed(f"a string {text} where a value is expected", datum)
        value = number(text)
        if value is not None:
            return Number(value, text)
        if text in scope:
            return Variable(text)
        if text in CONSTANTS:
            return Constant(text)
        raise self.malformed(f"undefined variable {text!r}", datum)

    def let(self, datum, args, scope, precision, sequential: bool) -> Expr:
        if len(args) != 2 or not isinstance(args[0], List):
            raise self.malformed("expected (let ([name value] ...) body)", datum)
        bindings, inner = [], scope
        for pair in args[0].items:
            if not (isinstance(pair, List) and len(pair.items) == 2
                    and isinstance(pair.items[0], Atom)):
                raise self.malformed("a binding must be [name value]", pair)
            name = pair.items[0].text
            value = self(pair.items[1], inner if sequential else scope, precision)
            bindings.append((name, value))
            if sequential:
                inner = inner | {name}
        bound = scope | {n for n, _ in bindings}
        return Let(tuple(bindings), self(args[1], bound, precision), sequential)

    def annotation(self, datum, args, scope, precision) -> Expr:
        if not args or len(args) % 2 != 1:
            raise self.malformed("expected (! :property value ... body)", datum)
        props = []
        for key, value in zip(args[:-1:2], args[1:-1:2]):
            if not (isinstance(key, Atom) and key.text.startswith(":")):
                raise self.malformed("expected a :property", key)
            props.append((key.text, _text(value)))
        inner = dict(props).get(":precision")
        if inner is not None:
            inner = _precision(args[[k for k, _ in props].index(":precision") * 2 + 1],
                               precision, self.label)
        return Annotation(tuple(props), self(args[-1], scope, inner or precision))
