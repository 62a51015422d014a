"""Ingest: a torch.fx graph (or module, or torch.export program) becomes an e-graph, by
passes that each read the one before:

1. normalise the source (:mod:`~frontends.fx.normalise`): trace a module
   (:mod:`~frontends.fx.tracing`), split its ``foreach`` calls
   (:mod:`~frontends.fx.foreach`), make a torch.export program functional where it must be
   (:mod:`~frontends.fx.functionalise`);
2. metadata (:mod:`~frontends.fx.metadata`): the shape and dtype of every value, with
   example inputs the model rejects explained (:mod:`~frontends.fx.mismatch`);
3. value ranges (:mod:`~frontends.fx.ranges`): declared domains and ranges, observed ranges;
4. build the e-graph (:mod:`~frontends.fx.builder`, over :mod:`~frontends.fx.terms`), and
   the record emission reads (:mod:`~frontends.fx.source`).

Every call is normalised to the canonical vocabulary (``frontends.fx.vocabulary``); module
calls (Linear, Conv, LayerNorm, BatchNorm in eval, Embedding, activations, Dropout) are
lowered to functional ops whose parameters are leaves; attributes (dims, keepdim, scalars,
shapes) become literal children. Inputs are ``(input "name")`` leaves, parameters and
buffers ``(param "qualified.name")``. Ops on constants alone fold into constants; so does
a call the vocabulary does not model, where running it once on its constant arguments is
pure (:func:`frontends.fx.effects.run_pure`). Other calls it does not model, and impure
calls (random ops, dropout in training, anything with side effects), become opaque
e-nodes with a unique token, chained in their original order so they are never merged,
dropped or reordered. In-place ops on intermediates are functionalised (later uses see
the result).

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) + torch.exp(x))
>>> eg = from_fx(gm, (torch.randn(3),))
>>> eg.num_classes  # exp(x) is shared: input, its name, exp, add
4
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from egraph.egraph import EGraph
from egraph.moved import moved_names
from frontends.fx.builder import Builder, UpdateThroughView
from frontends.fx.exported import input_guards, input_structure
from frontends.fx.functionalise import exported_for_update
from frontends.fx.metadata import node_metas
from frontends.fx.mismatch import check_count
from frontends.fx.normalise import Normalised, normalise
from frontends.fx.ranges import DOMAINS, declare, observe_ranges, observing
from frontends.fx.recorded import recorded_key
from frontends.fx.sized import sized_triangles
from frontends.fx.source import ClassRef, FxSource

__all__ = ["from_fx"]


def from_fx(source, example_inputs=None, domains: dict[str, str] | None = None,
            ranges: dict[str, tuple[float, float]] | None = None,
            observe: bool | None = None, make_egraph: Callable[..., EGraph] = EGraph,
            follow_views: bool = True,
            dynamic: bool | dict[str, dict[int, tuple[int, int | None]]] = False) -> EGraph:
    """An e-graph of ``source`` (GraphModule, nn.Module or ExportedProgram).

    Roots are the graph outputs in order; ``eg.fx`` keeps what emission needs.
    ``make_egraph(analysis=...)`` makes the empty e-graph to fill (``EGraph.from_fx``
    passes the pipeline's :class:`compiler.fx.FxEGraph`).
    ``domains`` declares input domains (``{"x": "positive"}``, see :data:`DOMAINS`); rules
    whose conditions need them (``exp(log x) -> x`` needs x > 0) may then fire.
    ``ranges`` gives the value range of inputs (``{"x": (-100.0, 100.0)}``, an end may be
    infinite) for the curvature cost, in place of the range observed on the example
    inputs; it is a promise about the inputs the program will run on, so validation
    draws its random inputs inside it. ``observe``
    runs the graph once on the (real) example inputs to record every tensor's range for
    the curvature cost; by default only when inputs and parameters are small.

    ``dynamic`` is about sizes (``ranges`` about values): ``True`` makes every size of
    every input symbolic where the program lets it vary, a mapping ``{input: {dim: (low,
    high)}}`` the dims it names (``high`` None: unbounded). The module is then captured
    with torch.export (:func:`frontends.fx.exported.export_dynamic`), its sizes stay
    expressions of the input sizes, and the program extracted runs at every size; a
    dim that cannot vary is a :class:`~frontends.fx.exported.SizeConstraintError`.

    A module whose graph updates a value in place through a view of it, or a value
    another view reads later (``h[:, :1].mul_(3)``, ``h.view(-1).add_(1)``), is captured
    with torch.export and ingested as its functional program, where example inputs are
    given and export can capture it (``follow_views=False``: ingested as traced).
    """
    normalised = normalise(source, example_inputs, domains, ranges, dynamic)
    observe = observing(normalised.gm, normalised.example_inputs, observe)
    # (a traced graph's updates only: where the tracer recorded values, their storages
    # tell, torch.export's are made functional and torch.compile's by aot_autograd)
    follows_views = follow_views and recorded_key(normalised.gm) is None
    try:
        return _built(normalised, observe, make_egraph, follows_views)
    except UpdateThroughView as update:
        program = exported_for_update(normalised.source, normalised.example_inputs,
                                      update.node)
    # The retry: the program torch.export captured, made functional, or where it cannot
    # capture one, the source as traced with its updates kept in place (validation judges
    # that program as ingested).
    if program is None:
        return _built(normalised, observe, make_egraph, follows_views=False)
    exported = normalise(program, normalised.example_inputs, normalised.domains,
                         normalised.ranges)
    egraph = _built(exported, observe, make_egraph, follows_views=False)
    egraph.fx.guards = None  # (exported here, for the view: the source is shape-generic)
    return egraph


def _built(normalised: Normalised, observe: bool | None, make_egraph: Callable[..., EGraph],
           follows_views: bool) -> EGraph:
    """The e-graph of a normalised source: its metadata, its declared and observed
    ranges, the build, and the source record on ``eg.fx``."""
    gm, example_inputs = normalised.gm, normalised.example_inputs
    if example_inputs is not None:
        check_count(gm, example_inputs, normalised.param_names)
    # Without example inputs nothing is observed, but parameters are still measured.
    metas = node_metas(gm, example_inputs, normalised.param_names, observe is not False,
                       normalised.module)
    declare(metas, gm, normalised.domains, normalised.ranges)
    observed = observe_ranges(gm, example_inputs) if observe and not normalised.ranges else {}
    for name, triangle in sized_triangles(gm, example_inputs, normalised.param_names).items():
        observed[name] = {**observed.get(name, {}), "triangle": triangle}
    builder = Builder(gm, metas, normalised.param_names, make_egraph,
                      observe=observe is not False, observed=observed,
                      lifted_constants=normalised.lifted_constants,
                      follows_views=follows_views)
    builder.run()
    return _recorded(builder, normalised)


def _recorded(builder: Builder, normalised: Normalised) -> EGraph:
    """The e-graph ``builder`` built, rebuilt, with the graph outputs as its roots and
    what emission needs of the source on ``eg.fx``."""
    output = normalised.outputs(builder.output)
    eg = builder.eg
    eg.rebuild()
    outputs: list[int] = []
    fx.node.map_aggregate(output, lambda a: outputs.append(a.cid)
                          if isinstance(a, ClassRef) else None)
    eg.set_roots(outputs)
    source, example_inputs = normalised.source, normalised.example_inputs
    eg.fx = FxSource(
        module=normalised.module, graph_module=normalised.gm, inputs=builder.inputs,
        input_classes=builder.input_classes, output=output,
        effects=builder.effects, opaque=builder.opaque, constants=builder.constants,
        example_inputs=tuple(example_inputs) if example_inputs is not None else None,
        initial={c: list(eg.class_nodes[c]) for c in eg.classes()}, random=builder.random,
        origins=builder.origins,
        domains={name: DOMAINS[d] for name, d in (normalised.domains or {}).items()},
        ranges={name: (float(lo), float(hi))
                for name, (lo, hi) in (normalised.ranges or {}).items()},
        guards=input_guards(source),
        structure=input_structure(source) if isinstance(
            source, (torch.export.ExportedProgram, fx.GraphModule)) else None,
    )
    return eg


MOVED = {
    **dict.fromkeys(["AttributeRef", "ContiguousRef", "OpaqueCall", "OutputRef", "WrittenRef"],
                    "frontends.fx.source"),
    **dict.fromkeys(["UntraceableModel", "spread_star_inputs", "trace"], "frontends.fx.tracing"),
    "InputMismatch": "frontends.fx.mismatch", "SHAPE_PARAMS": "frontends.fx.terms",
    "state_kept": "frontends.fx.kept"}
"""Names that moved out of this module to the passes of ingest, by their new module."""


__getattr__ = moved_names(__name__, MOVED)
