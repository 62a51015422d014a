"""How the emitted GraphModule spells its kernel calls.

FX names a called function after its module path (``backends_triton_launch_fused_...``);
:class:`KernelNames` claims each fused kernel's own name first, so ``print(gm.code)`` reads
``softmax = fused_softmax_3(x)``.

>>> import torch
>>> from egraph import EGraph
>>> from backends.fx import build_module
>>> from egraph.extract import source_program
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + 1),
...                     (torch.randn(3),))
>>> gm = build_module(eg, source_program(eg), target="cuda")
>>> isinstance(gm.graph._codegen, KernelNames)
True
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from backends.triton.launch import FusedKernel


class KernelNames(fx.graph.CodeGen):
    """FX code generation that calls each :class:`FusedKernel` by its own name.

    >>> import torch
    >>> from egraph import EGraph
    >>> from backends.fx import build_module
    >>> from egraph.extract import source_program
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(3),))
    >>> code = build_module(eg, source_program(eg), target="cuda").code
    >>> "mul = fused_exp_mul_" in code
    True
    """

    def _gen_python_code(self, nodes, root_module: str, namespace, *args: Any,
                         **kwargs: Any) -> fx.graph.PythonCode:
        for node in nodes:
            if node.op == "call_function" and isinstance(node.target, FusedKernel):
                namespace.create_name(node.target.__name__, node.target)
        return super()._gen_python_code(nodes, root_module, namespace, *args, **kwargs)
