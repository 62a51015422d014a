"""Triton kernels for the fusion regions of an extracted program (CUDA targets).

``EGraph.extract(cost, target="cuda")`` (or CUDA example inputs) emits each region that the
Roofline model says pays as one generated Triton kernel, called from the GraphModule like
any function (``softmax = fused_softmax_3(x)``). :mod:`~backends.triton.regions` finds the
regions' iteration spaces and lowers them to specs, :mod:`~backends.triton.templates` holds
the per-op code, :mod:`~backends.triton.codegen` writes the kernels and
:mod:`~backends.triton.launch` the wrappers that run them (or the eager ops, on CPU).

>>> import torch
>>> from egraph import EGraph
>>> from extractors import Roofline
>>> fn = lambda x: torch.softmax(x * 0.5, -1)
>>> opt = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 8),)).extract(
...     Roofline(), target="cuda")
>>> print(opt.code.strip().splitlines()[1].strip())  # doctest: +ELLIPSIS
softmax = fused_mul_softmax_...(x);  x = None
>>> kernels(opt)[0].spec.space
(4, 8)
"""

from __future__ import annotations

import torch.fx as fx

from backends.triton.launch import BLOCKS, Blocks, FusedKernel, interpreting, kernel_for
from backends.triton.regions import Fusion, lower, pays, plan
from backends.triton.spec import KernelSpec
from backends.triton.templates import Unsupported

__all__ = ["BLOCKS", "Blocks", "FusedKernel", "Fusion", "KernelSpec", "Unsupported",
           "interpreting", "kernel_for", "kernels", "lower", "pays", "plan"]


def kernels(gm: fx.GraphModule) -> list[FusedKernel]:
    """The fused kernels a GraphModule calls, in order of first call (each once).

    >>> import torch
    >>> from egraph import EGraph
    >>> from extractors import Roofline
    >>> gm = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2 + 1),
    ...                     (torch.randn(64, 64),)).extract(Roofline(), target="cuda")
    >>> [k.spec.name for k in kernels(gm)]
    ['fused_exp_mul_add']
    """
    found = [n.target for n in gm.graph.nodes
             if n.op == "call_function" and isinstance(n.target, FusedKernel)]
    return list(dict.fromkeys(found))
