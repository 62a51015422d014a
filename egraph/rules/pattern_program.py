"""The PyTorch program a pattern spells: a rule's default example.

A library rule needs PyTorch code it fires on, which the soundness tests trace and run
(see :func:`egraph.rules.define.rule`). Where a rule gives none, its left side is that
code: each op is called through the op table's torch implementation (``impl``, its
arguments placed by ``call``), the literals are the numbers, tuples and dtypes they hold,
and the pattern variables in operand places are the program's tensor inputs, in the order
they first appear.

>>> from egraph import vars
>>> from egraph.ops import exp, log, softmax
>>> (x,) = vars("x")
>>> write_pattern(log(exp(x) + 1))
(('x',), 'torch.log(torch.add(torch.exp(x), 1))')
>>> import torch
>>> pattern_program(log(exp(x) + 1), {"torch": torch})(torch.zeros(2))
tensor([0.6931, 0.6931])

A variable in an attribute's place (a reduction's dims) has no value a program could
choose, so such a rule must be given its example:

>>> (d,) = vars("d")
>>> write_pattern(softmax(x, d))
Traceback (most recent call last):
...
ValueError: ?d is softmax's attribute 'dim', which a generated example cannot choose
"""

from __future__ import annotations

import linecache
import math
from collections.abc import Callable
from typing import Any

from egraph.ops import lookup
from egraph.term import LITERAL_TAGS, Term, Var, is_number_op

__all__ = ["pattern_program", "write_pattern"]


class _Code:
    """Python source standing for a value in the written program."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _number(value: float | int) -> Any:
    """A number as source (``inf`` and ``nan`` are not Python literals)."""
    if isinstance(value, float) and not math.isfinite(value):
        return _Code(f"float('{value}')")
    return value


def _call(impl: str, args: tuple, kwargs: dict) -> _Code:
    written = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    if impl == "operator.getitem":
        return _Code(f"{written[0]}[{', '.join(written[1:])}]")
    if impl.startswith("Tensor."):
        return _Code(f"{written[0]}.{impl.partition('.')[2]}({', '.join(written[1:])})")
    return _Code(f"{impl}({', '.join(written)})")


def write_pattern(pattern: Term) -> tuple[tuple[str, ...], str]:
    """The program ``pattern`` spells: its parameters (the pattern's variables in operand
    places) and the Python expression of its body."""
    parameters: list[str] = []

    def written(term: Term) -> Any:
        if isinstance(term, Var):
            if term.name not in parameters:
                parameters.append(term.name)
            return _Code(term.name)
        op = term.op
        if is_number_op(op):
            return _number(op)
        if type(op) is tuple and op[0] in LITERAL_TAGS:
            tag, value = op
            return _Code(f"torch.{value}") if tag == "dtype" else (
                _number(value) if tag == "float" else value)
        spec = lookup(op)
        if spec.impl is None or spec.impl.startswith("frontends."):
            raise ValueError(f"{op} has no torch callable of its own to write an example with")
        for name, arg in zip(spec.params, term.args):
            if isinstance(arg, Var) and name in spec.attributes:
                raise ValueError(f"{arg} is {op}'s attribute {name!r}, which a generated "
                                 "example cannot choose")
        values = [written(arg) for arg in term.args]
        args, kwargs = spec.call(*values) if spec.call is not None else (tuple(values), {})
        return _call(spec.impl, args, kwargs)

    body = repr(written(pattern))
    return tuple(parameters), body


def pattern_program(pattern: Term, namespace: dict[str, Any]) -> Callable:
    """The program ``pattern`` spells as a Python function (a lambda, which torch.fx
    traces and whose source ``inspect`` finds), its names looked up in ``namespace``
    (``torch``)."""
    parameters, body = write_pattern(pattern)
    source = f"lambda {', '.join(parameters)}: {body}\n"
    filename = f"<the program of {pattern}>"
    linecache.cache[filename] = (len(source), None, [source], filename)
    # (the source is written above from the op table, never from a user's text)
    return eval(compile(source, filename, "eval"), dict(namespace))  # noqa: S307
