"""One FPCore benchmark, read and checked: its name, arguments, precision, precondition
and body, and what it becomes: a torch module and an exact reference.

>>> from frontends.fpcore import parse
>>> (p,) = parse('''(FPCore (x) :name "NMSE example 3.1" :pre (>= x 0)
...                  (- (sqrt (+ x 1)) (sqrt x)))''')
>>> p.name, p.arguments, p.precision, p.pre.ranges
('NMSE example 3.1', ('x',), 'binary64', {'x': (0.0, inf)})
>>> import torch
>>> x = torch.tensor([1e12], dtype=torch.float64)
>>> p.module()(x).item(), p.reference(1e12)  # float64 loses most digits; the truth
(5.00003807246685e-07, 4.99999999999875e-07)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from frontends.fpcore.errors import FPCoreError
from frontends.fpcore.expression import Expr
from frontends.fpcore.module import DTYPES, build_module
from frontends.fpcore.precondition import Precondition
from frontends.fpcore.reference import correctly_rounded

__all__ = ["PRECISIONS", "Program"]

PRECISIONS = tuple(DTYPES)
"""The precisions covered: ``binary32`` and ``binary64``."""


@dataclass(frozen=True, eq=False)
class Program:
    """An FPCore benchmark (see the module docstring). ``name`` is its ``:name`` (else its
    identifier, else its number in the file); ``pre`` None when it declares none;
    ``alternatives`` its ``:alt`` bodies (or why one cannot be read); ``properties`` the
    other properties, as written."""

    name: str
    arguments: tuple[str, ...]
    precision: str
    body: Expr
    pre_expression: Expr | None = None
    identifier: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    alternatives: tuple[Expr | FPCoreError, ...] = ()

    @cached_property
    def pre(self) -> Precondition | None:
        """The precondition: declared ranges and the predicate (:class:`Precondition`)."""
        if self.pre_expression is None:
            return None
        return Precondition(self.pre_expression, self.arguments)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of its precision."""
        return DTYPES[self.precision]

    @cached_property
    def parameters(self) -> tuple[str, ...]:
        """The names of the module's inputs (its placeholders), in argument order: the
        arguments as Python identifiers, as torch.fx names them (``cosTheta`` is
        ``cos_theta``); what ``ranges`` are keyed by."""
        return tuple(n.name for n in self.module().graph.nodes if n.op == "placeholder")

    def ranges(self) -> dict[str, tuple[float, float]] | None:
        """The declared ranges by parameter name, as the entry points take them."""
        if self.pre is None or not self.pre.ranges:
            return None
        by_name = dict(zip(self.arguments, self.parameters))
        return {by_name[v]: r for v, r in self.pre.ranges.items()}

    def module(self) -> torch.fx.GraphModule:
        """An ``nn.Module`` (a GraphModule) taking one tensor per argument
        (:mod:`frontends.fpcore.module`)."""
        return build_module(self)

    def with_body(self, body: Expr) -> Program:
        """The same benchmark with another body (an alternative, a rewritten program)."""
        return Program(self.name, self.arguments, self.precision, body, self.pre_expression,
                       self.identifier, self.properties)

    def reference(self, *values):
        """The exact result at a point, rounded once to the precision
        (:mod:`frontends.fpcore.reference`): Python floats give a float, tensors (one per
        argument, of one shape) a float64 tensor of that shape."""
        if values and isinstance(values[0], torch.Tensor):
            columns = [v.detach().to(torch.float64).flatten().tolist() for v in values]
            out = [correctly_rounded(self.body, self.arguments, point, self.precision)
                   for point in zip(*columns)]
            return torch.tensor(out, dtype=torch.float64).reshape(values[0].shape)
        return correctly_rounded(self.body, self.arguments, tuple(map(float, values)),
                                 self.precision)

    def __str__(self) -> str:
        from frontends.fpcore.writer import write_program

        return write_program(self)
