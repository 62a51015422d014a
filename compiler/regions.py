"""Region bodies: the subgraphs that higher-order calls in dynamo's and aot_autograd's
graphs run as plain functions of their operands (activation checkpointing's,
``torch.compiler.nested_compile_region``'s), optimised on their own while the calls stay."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from compiler.signature import structure
from frontends.fx.recorded import recorded_value

if TYPE_CHECKING:
    from compiler.compile import GraphReport


def _region_bodies() -> dict[Any, int]:
    """The higher-order ops that call a region body as a plain function of their operands
    (the body's position among their arguments): activation checkpointing's (the body is
    run again in the backward) and ``nested_compile_region``'s (one body, many calls)."""
    higher_order = torch.ops.higher_order
    return {getattr(higher_order, name): 0 for name in
            ("tag_activation_checkpoint", "invoke_subgraph") if hasattr(higher_order, name)}


def optimise_regions(gm: torch.fx.GraphModule,
                     compile_region: Callable[[torch.fx.GraphModule, tuple, str],
                                              torch.fx.GraphModule]
                     ) -> tuple[torch.fx.GraphModule, list[GraphReport]]:
    """``gm`` with the body of each region its higher-order calls run as a function
    (:func:`_region_bodies`) replaced by ``compile_region(body, inputs, name)``, where the
    inputs are the values dynamo recorded for the body's own inputs; a copy, ``gm`` is left
    as it is. The call stays (an opaque one to the e-graph of ``gm``), so a checkpointed
    layer is still recomputed in the backward, now from its optimised body; before, the
    region was not optimised at all where dynamo's graph is compiled whole (Inductor's
    code generation). A body shared by several calls is compiled once, and so is a body
    of the same structure and input kinds as one compiled before that reads no attribute
    (the layers of a model, each checkpointed: their parameters are the body's inputs).
    Also the reports of the bodies compiled, in order. A body that ``compile_region``
    raises on is kept as it is, with a warning.

    >>> import torch.utils.checkpoint as checkpoint
    >>> seen = []
    >>> def backend(gm, example_inputs):
    ...     gm, _ = optimise_regions(gm, lambda body, inputs, at: seen.append(at) or body)
    ...     return gm
    >>> f = torch.compile(lambda x: checkpoint.checkpoint(torch.sin, x, use_reentrant=False),
    ...                   backend=backend)
    >>> _ = f(torch.ones(2, requires_grad=True))
    >>> seen
    ['wrap_body_0']
    """
    bodies = _region_bodies()
    compiled: dict[str, torch.fx.GraphModule] = {}
    alike: dict[tuple, torch.fx.GraphModule] = {}
    reports = []
    for node in gm.graph.nodes:
        at = bodies.get(node.target) if node.op == "call_function" else None
        body_node = node.args[at] if at is not None and len(node.args) > at else None
        if not (isinstance(body_node, torch.fx.Node) and body_node.op == "get_attr") or (
                body_node.target in compiled):
            continue
        body = getattr(gm, body_node.target)
        inputs = [recorded_value(p) for p in body.graph.nodes if p.op == "placeholder"]
        if not isinstance(body, torch.fx.GraphModule) or None in inputs:
            continue
        key = structure(body, inputs)
        if key is not None and key in alike:
            compiled[body_node.target] = alike[key]
            continue
        try:
            optimised = compile_region(body, tuple(inputs), body_node.target)
        except Exception as error:  # noqa: BLE001 - the body runs as it was
            # (before, no body was optimised at all: one that cannot be is kept, not made
            # a crash of the whole graph)
            first = (str(error).splitlines() or [""])[0]
            warnings.warn(f"egraph: region body {body_node.target} kept as it is "
                          f"({type(error).__name__}: {first})", stacklevel=2)
            optimised = body
        if "egraph_graph" in optimised.meta:
            reports.append(optimised.meta["egraph_graph"])
        if key is not None:
            alike[key] = optimised
        compiled[body_node.target] = optimised
    if not compiled:
        return gm, []
    graph = torch.fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = gm.graph._codegen
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        copied[node] = graph.node_copy(node, copied.__getitem__)
    module = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    module.meta.update(gm.meta)
    for target, body in compiled.items():
        setattr(module, target, body)
    return module, reports
