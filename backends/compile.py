"""The ``egraph`` torch.compile backend.

``torch.compile(model, backend="egraph")`` works once this module is imported (it registers
the name) or the package is installed (the ``torch_dynamo_backends`` entry point). The
backend goes through aot_autograd, so inference and training both work: the forward and
the backward graphs each go through ``from_fx -> saturate -> extract`` and come back as
validated GraphModules.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
>>> compiled = torch.compile(model, backend=egraph_backend)
>>> x = torch.randn(2, 4)
>>> torch.allclose(compiled(x), model(x))
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from egraph import AstSize, EGraph


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], rules=(),
                  cost=None, validate: str = "strict", iter_limit: int = 10,
                  node_limit: int = 50_000, time_limit: float = 10.0,
                  target: str | None = None) -> torch.fx.GraphModule:
    """One graph through the pipeline: ingest, saturate ``rules``, extract under ``cost``
    for ``target`` (None: ``cuda`` for CUDA inputs, ``cpu`` otherwise)."""
    eg = EGraph.from_fx(gm, tuple(example_inputs))
    if rules:
        eg.saturate(rules, iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit)
    return eg.extract(cost if cost is not None else AstSize(), validate=validate,
                      target=target)


def _signature(gm: torch.fx.GraphModule, example_inputs) -> tuple:
    """What makes two graphs compile the same: their code and their inputs' shapes, dtypes
    and devices (aot_autograd passes parameters as inputs, so the result does not hold
    them)."""
    metas = tuple((tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor)
                  else repr(x) for x in example_inputs)
    return gm.code, metas


def make_backend(rules=(), cost=None, validate: str = "strict", **limits) -> Callable:
    """A torch.compile backend with chosen rules, cost model and validation mode.

    Repeated compiles of the same graph (a recompile, a second model with the same
    architecture) hit a cache instead of saturating again.
    """
    cache: dict[tuple, Callable] = {}

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        key = _signature(gm, example_inputs)
        if key not in cache:
            cache[key] = make_boxed_func(compile_graph(gm, example_inputs, rules, cost,
                                                       validate, **limits))
        return cache[key]

    compiler.cache = cache
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


_default = make_backend()


def egraph_backend(gm: torch.fx.GraphModule, example_inputs):
    """The default ``egraph`` backend: aot_autograd around the e-graph pipeline."""
    return _default(gm, example_inputs)


register_backend(name="egraph", compiler_fn=egraph_backend)
