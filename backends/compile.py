"""The ``egraph`` torch.compile backend.

``torch.compile(model, backend="egraph")`` works once the package is installed (dynamo
finds the ``torch_dynamo_backends`` entry point and imports this module) or this module is
imported (it registers the name where no entry point does), in either order. The
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

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], rules=(),
                  cost=None, validate: str = "strict", iter_limit: int = 10,
                  node_limit: int = 50_000, time_limit: float = 10.0,
                  target: str | None = None) -> torch.fx.GraphModule:
    """One graph through the pipeline: ingest, saturate ``rules``, extract under ``cost``
    for ``target`` (None: ``cuda`` for CUDA inputs, ``cpu`` otherwise).

    With dynamic shapes the graph takes SymInt inputs and its tensors have symbolic sizes:
    the e-graph keeps them symbolic (the graph's own metadata), so the program reads its
    sizes from its inputs; validation runs on real inputs of the sizes dynamo hints.
    """
    example_inputs = tuple(example_inputs)
    if any(_is_symbolic(x) for x in example_inputs):
        eg = EGraph.from_fx(gm, hinted_inputs(example_inputs), observe=False)
    else:
        eg = EGraph.from_fx(gm, example_inputs)
    if rules:
        eg.saturate(rules, iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit)
    return eg.extract(cost if cost is not None else AstSize(), validate=validate,
                      target=target)


def _is_symbolic(x: Any) -> bool:
    if isinstance(x, _SYMBOLIC):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)


def _hint(s: Any) -> Any:
    """The value dynamo hints for a symbolic number (no guard is added)."""
    if isinstance(s, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return optimization_hint(s)
    if isinstance(s, (torch.SymFloat, torch.SymBool)):
        return s.node.hint
    return s


def hinted_inputs(example_inputs: Sequence[Any]) -> tuple:
    """Real values standing for the example inputs dynamo hands a backend: SymInts by
    their hinted value, fake tensors (symbolic sizes too) as random tensors of the hinted
    shape, dtype and device (small integers for integer tensors: valid indices)."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    def real(x):
        if not isinstance(x, torch.Tensor):
            return _hint(x)
        if not isinstance(x, FakeTensor) and x.device.type != "meta":
            return x
        shape = tuple(_hint(s) for s in x.shape)
        device = x.device if x.device.type != "meta" else "cpu"
        if x.dtype.is_floating_point or x.dtype.is_complex:
            value = torch.randn(shape, dtype=x.dtype, device=device)
        else:
            value = torch.randint(0, 2, shape, device=device).to(x.dtype)
        return value.requires_grad_(x.requires_grad and value.is_floating_point())

    with unset_fake_temporarily():
        return tuple(real(x) for x in example_inputs)


def _signature(gm: torch.fx.GraphModule, example_inputs) -> tuple:
    """What makes two graphs compile the same: their code and their inputs' shapes, dtypes
    and devices (aot_autograd passes parameters as inputs, so the result does not hold
    them). Symbolic sizes and numbers count by their expression (``s0``, ``2*s1``): the
    program reads them from its inputs, whatever their value."""
    def spec(x):
        if isinstance(x, torch.Tensor):
            return (tuple(_expression(s) for s in x.shape), x.dtype, x.device.type)
        if isinstance(x, _SYMBOLIC):
            return (type(x).__name__, _expression(x))
        return repr(x)

    return gm.code, tuple(spec(x) for x in example_inputs)


def _expression(s: Any) -> Any:
    return str(s.node.expr) if isinstance(s, _SYMBOLIC) else s


def make_backend(rules=(), cost=None, validate: str = "strict", **limits) -> Callable:
    """A torch.compile backend with chosen rules, cost model and validation mode.

    Repeated compiles of the same graph (a recompile, a second model with the same
    architecture) hit a cache instead of saturating again.
    """
    cache: dict[tuple, Callable] = {}

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        key = _signature(gm, example_inputs)
        if key not in cache:
            module = compile_graph(gm, example_inputs, rules, cost, validate, **limits)
            cache[key] = make_boxed_func(module)
            cache[key].module = module
        return cache[key]

    compiler.cache = cache
    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler)
    backend.cache = cache  # each entry's ``.module`` is the emitted GraphModule
    return backend


_default = make_backend()


def egraph_backend(gm: torch.fx.GraphModule, example_inputs):
    """The default ``egraph`` backend: aot_autograd around the e-graph pipeline."""
    return _default(gm, example_inputs)


def _register() -> None:
    """Register the name ``egraph`` unless dynamo loads it from the installed entry point
    on first use (registering it here as well would make dynamo's own registration fail
    with a duplicate name) or it is registered already."""
    from importlib.metadata import entry_points

    target = f"{__name__}:{egraph_backend.__name__}"
    if any(ep.name == "egraph" and ep.value == target
           for ep in entry_points(group="torch_dynamo_backends")):
        return
    if "egraph" not in torch._dynamo.list_backends(exclude_tags=()):
        register_backend(name="egraph", compiler_fn=egraph_backend)


_register()
