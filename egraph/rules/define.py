"""How a library rule is written: :func:`rule`, its example :class:`Input` s, and the
:class:`LibraryRule` it makes.

A rule reads like the identity it states, written with :mod:`egraph.ops` and Python
operators over pattern variables; its ``example`` is the naive PyTorch code it fires on
(a callable over the ``inputs``), which the soundness tests run on random instances:

>>> from egraph import vars
>>> from egraph.ops import log, log1p
>>> from egraph.rules.guards import floating
>>> (x,) = vars("x")
>>> r = rule("log1p", log(1 + x), log1p(x), when=floating(x),
...          example=lambda x: torch.log(1 + x), inputs={"x": ((4, 8), "unit")},
...          description="log(1 + x) loses x below fp eps; log1p(x) does not")
>>> r.name, r.conditions, r.example_code
('log1p', 'x is floating', 'torch.log(1 + x)')

A number in the left side matches that number as an int or a float literal, and ``add``,
``mul`` and the other commutative ops match both operand orders (see
:mod:`egraph.rewrite`), so ``log(1 + x)`` also fires on ``torch.log(x + 1.0)``. An op that
is not in the op table is an error that names the nearest one (``egraph.ops`` refuses
such a name too; an s-expression is checked when the rule is made):

>>> rule("oops", "(log (add 1 ?x))", "(log1p_ ?x)", example=lambda x: torch.log(1 + x),
...      inputs={"x": (4, 8)})
Traceback (most recent call last):
...
ValueError: rule 'oops': no op 'log1p_' in the op table; did you mean 'log1p'?
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import linecache
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egraph.ops import lookup
from egraph.rewrite import Guard, MultiPattern, Rewrite
from egraph.rules.pattern_program import pattern_program
from egraph.term import Term, literal, parse, walk

__all__ = ["F", "Input", "LibraryRule", "rule", "source_of", "torch"]


class _LazyModule:
    """A module imported on first attribute access: rule examples name ``torch`` while
    ``import egraph`` stays torch-free (torch is imported when an example runs)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


torch = _LazyModule("torch")
F = _LazyModule("torch.nn.functional")

# Example inputs rule families share (``rule(..., inputs=AB)``): name -> shape.
X = {"x": (4, 8)}
AB = {"a": (4, 8), "b": (4, 8)}
ABC = {"a": (4, 8), "b": (4, 8), "c": (4, 8)}
M = (4, 8)
SAME = {"x": M, "y": M}
IMG = (2, 4, 6, 6)  # a batch of images, and a 3x3 kernel over their channels
KERNEL = (5, 4, 3, 3)


def add_literal(egraph, value: Any) -> int:
    """The class of the literal ``value``, added where missing: a right side's argument
    such as a dim or a list of sizes.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> eg.class_nodes[add_literal(eg, (4, 4))]
    [(('ints', (4, 4)),)]
    """
    return egraph.add_node(literal(value))


@dataclass(frozen=True)
class Input:
    """An example input: a shape, and the domain its values come from (and that is
    declared to the analysis as proven): ``any``, ``positive``, ``nonneg``, ``negative``,
    ``nonzero``, ``unit`` (0..1), ``bool``, ``causal`` (a bool mask, True on and below the
    diagonal: observed, never declared; outside its domain any bool mask),
    ``additive-causal`` (a float mask, 0 on and below the diagonal and the lowest float
    above it: observed, never declared; outside its domain any floats), or ``index:N``
    (integers below N).

    >>> Input((4, 8), "positive")
    Input(shape=(4, 8), domain='positive')
    """

    shape: tuple[int, ...]
    domain: str = "any"


@dataclass(frozen=True)
class LibraryRule:
    """A library rule: the rewrite, and what users and the soundness tests need. ``examples``
    are PyTorch callables over ``inputs`` that the rule fires on (the first is the rule's
    own; more cover spellings the matcher handles, such as a mirrored operand order).
    ``family`` is set when :func:`egraph.rules.library` composes the families."""

    rewrite: Rewrite
    description: str
    examples: tuple[Callable, ...]
    inputs: dict[str, Input] = field(default_factory=dict)
    family: str = ""

    @property
    def name(self) -> str:
        return self.rewrite.name

    @property
    def example(self) -> Callable:
        """The naive PyTorch code the rule is about."""
        return self.examples[0]

    @property
    def example_code(self) -> str:
        """The source text of :attr:`example` (a lambda's body)."""
        return source_of(self.example)

    @property
    def conditions(self) -> str:
        """The side conditions, readably (empty when unconditional)."""
        guard = self.rewrite.when
        return getattr(guard, "__name__", "") if guard is not None else ""


def source_of(fn: Callable) -> str:
    """The body of a lambda as written (a named function: its name).

    >>> source_of(lambda a, b: torch.log(a) - torch.log(b))
    'torch.log(a) - torch.log(b)'
    """
    name = getattr(fn, "__name__", "")
    code = getattr(fn, "__code__", None)
    filename = inspect.getsourcefile(fn) if code is not None else None
    if name != "<lambda>" or filename is None:
        return name
    # The lambda's first instruction after RESUME sits in its body.
    first = min(((line, col) for line, _, col, _ in code.co_positions()
                 if line is not None and col), default=None)
    text = "".join(linecache.getlines(filename))
    for node in ast.walk(_syntax_tree(filename, text)):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Lambda) and node.lineno == code.co_firstlineno
                and (body.lineno, body.col_offset) <= first
                <= (body.end_lineno, body.end_col_offset)):
            return " ".join(ast.get_source_segment(text, body).split())
    return name


@functools.lru_cache(maxsize=16)
def _syntax_tree(filename: str, text: str) -> ast.Module:
    return ast.parse(text, filename)


def _as_input(spec: Any) -> Input:
    if isinstance(spec, Input):
        return spec
    if isinstance(spec, tuple) and spec and isinstance(spec[0], tuple):
        return Input(*spec)
    return Input(tuple(spec))


def _check_ops(rewrite: Rewrite) -> None:
    """Every op the rule spells is in the op table (s-expressions are not checked by
    :mod:`egraph.ops`, and a misspelled op would make a rule that never fires)."""
    lhs = rewrite.lhs
    patterns = [p for _, p in lhs.parts] if isinstance(lhs, MultiPattern) else [lhs]
    patterns += [rewrite.rhs] if rewrite.rhs is not None else [
        p for _, p in rewrite.rhs_equations or []]
    for pattern in patterns:
        for t in walk(pattern.term):
            if type(t.op) is str and t.args:
                try:
                    lookup(t.op)
                except AttributeError as err:
                    raise ValueError(f"rule {rewrite.name!r}: {err}") from None


def _left_side_program(name: str, lhs: Term | str | list) -> Callable:
    """The program ``lhs`` spells, as the example of rule ``name``."""
    pattern = parse(lhs) if isinstance(lhs, str) else lhs
    if not isinstance(pattern, Term):
        raise ValueError(f"rule {name!r}: a left side of several patterns spells no one "
                         "program; give the rule an example")
    try:
        return pattern_program(pattern, {"torch": torch})
    except (ValueError, AttributeError) as err:
        raise ValueError(f"rule {name!r}: {err}; give the rule an example") from None


def rule(name: str, lhs: Term | str | list, rhs: Term | str | Callable, *,
         example: Callable | tuple[Callable, ...] | None = None,
         inputs: dict[str, Any] | None = None, when: Guard | None = None,
         description: str = "", variants: bool = True) -> LibraryRule:
    """A library rule ``lhs => rhs`` (guarded by ``when``), with the PyTorch ``example``
    it fires on (a callable, or several) and that example's ``inputs``: a shape per
    parameter, or ``(shape, domain)`` (see :class:`Input`).

    ``lhs`` and ``rhs`` are terms built with :mod:`egraph.ops` and Python operators (or
    s-expressions); ``rhs`` may be a dynamic right side ``(egraph, subst) -> class id``.
    ``variants=False`` is for the commutative and associative laws themselves (see
    :func:`egraph.rewrite.rewrite`).

    >>> from egraph import vars
    >>> from egraph.ops import exp, log
    >>> (x,) = vars("x")
    >>> rule("log-exp", log(exp(x)), x, example=lambda x: torch.log(torch.exp(x)),
    ...      inputs={"x": (4, 8)}).rewrite
    Rewrite('log-exp', '(log (exp ?x))' => '?x')

    Without an ``example``, the program the left side spells is the example
    (:func:`~egraph.rules.pattern_program.pattern_program`), on inputs of shape (4, 8) from
    any values unless ``inputs`` says otherwise:

    >>> from egraph.ops import sigmoid
    >>> rule("sigmoid-of-neg", sigmoid(-x), 1 - sigmoid(x)).example_code
    'torch.sigmoid(torch.neg(x))'
    """
    if example is None:
        example = _left_side_program(name, lhs)
        inputs = inputs or {p: (4, 8) for p in inspect.signature(example).parameters}
    examples = example if isinstance(example, tuple) else (example,)
    if not examples or not all(callable(e) for e in examples) or not inputs:
        raise ValueError(
            f"rule {name!r}: every library rule needs a PyTorch example (a callable) and "
            "its inputs, so that its soundness is tested"
        )
    for fn in examples:
        params = list(inspect.signature(fn).parameters)
        if params != list(inputs):
            raise ValueError(
                f"rule {name!r}: the example takes ({', '.join(params)}) but the inputs "
                f"declare ({', '.join(inputs)}); give one input per parameter, in order"
            )
    rewrite = Rewrite(name, lhs, rhs, when=when, description=description, variants=variants)
    _check_ops(rewrite)
    return LibraryRule(rewrite, description, examples,
                       {k: _as_input(v) for k, v in inputs.items()})
