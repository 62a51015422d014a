"""What a generated kernel computes, independent of where its tensors live: the
:class:`KernelSpec` that :mod:`backends.triton.regions` lowers a fusion region to, that
:mod:`backends.triton.codegen` turns into Triton source and :mod:`backends.triton.launch`
compiles and runs.

>>> import torch
>>> from egraph import EGraph
>>> from backends.triton.regions import plan
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + 1),
...                     (torch.randn(3),))
>>> print("\\n".join(plan(eg)[0].kernel.spec.describe()))
v0 = exp(x0)
v1 = add(v0, 1)
out0 = v1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backends.triton.templates import Stmt

__all__ = ["KernelSpec", "StepRef", "TensorArg"]

# An argument of a program step: ("input", i), ("value", j) or ("literal", v).
StepRef = tuple[str, Any]


@dataclass(frozen=True)
class TensorArg:
    """An input or output of a kernel: dtype, shape, and the iteration-space axis each of
    its dims runs along (None: a dim of size 1, or one the value is constant along).

    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x, b: x * b),
    ...                     (torch.randn(3, 4), torch.randn(4)))
    >>> plan(eg)[0].kernel.spec.inputs[1]
    TensorArg(dtype=torch.float32, shape=(4,), axes=(1,))
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    axes: tuple[int | None, ...]


@dataclass(frozen=True)
class KernelSpec:
    """Everything a fused kernel computes, independent of where its tensors live.

    ``program`` is the region as canonical ops (each step ``(op, *refs)``), what the eager
    path runs; ``stmts`` its Triton statements; ``space`` the sizes of the iteration space;
    ``reduced`` the axes each row reduces (None: a pointwise kernel); ``stores`` the
    statement written to each output, ``results`` the program step it is.

    >>> from egraph import EGraph
    >>> from backends.triton.regions import plan
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.softmax(-1).sum(-1)),
    ...                     (torch.randn(3, 5),))
    >>> spec = plan(eg)[0].kernel.spec
    >>> spec.space, spec.reduced, spec.stores
    ((3, 5), (1,), ('sum_1',))
    """

    name: str
    program: tuple[tuple, ...]
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    results: tuple[int, ...]
    space: tuple[int, ...]
    reduced: tuple[int, ...] | None
    stmts: tuple[Stmt, ...]
    stores: tuple[str, ...]

    def describe(self) -> list[str]:
        """The program, one line per step (``v1 = softmax(v0, (1,))``), then its outputs."""
        def show(ref: StepRef) -> str:
            kind, v = ref
            return f"x{v}" if kind == "input" else f"v{v}" if kind == "value" else repr(v)

        lines = [f"v{j} = {op}({', '.join(map(show, refs))})"
                 for j, (op, *refs) in enumerate(self.program)]
        outs = ", ".join(f"out{i} = v{j}" for i, j in enumerate(self.results))
        return [*lines, outs]
