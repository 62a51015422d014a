"""Functionalising: a torch.export program whose in-place updates ingest cannot make out
of place one call at a time (an update seen through a view, or one that must reach the
caller's input) is made functional by torch.export, and the new values of the inputs and
buffers it returns are written back into them; a traced module that updates a view is
captured by torch.export for that.
"""

from __future__ import annotations

import copy
import logging
import warnings

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.effects import updates_an_alias, updates_an_input
from frontends.fx.exported import written_targets

__all__ = ["exported_for_update", "functional", "written_back"]


def exported_for_update(source: nn.Module, example_inputs,
                        update: fx.Node) -> torch.export.ExportedProgram | None:
    """``source`` captured by torch.export on the example inputs, for its update through
    a view (``update``), or None where there are no example inputs or export fails.

    >>> gm = fx.symbolic_trace(lambda h: h.view(-1).add_(1))
    >>> update = list(gm.graph.nodes)[2]
    >>> exported_for_update(gm, None, update) is None
    True
    """
    if example_inputs is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(source, tuple(example_inputs))
    except Exception as err:  # noqa: BLE001 - export cannot capture it: ingested as traced
        logging.getLogger(__name__).info(
            "%s updates a view in place and torch.export cannot capture the model (%s): "
            "ingested as traced", update.name, err)
        return None


def functional(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with its updates seen through views made functional
    (``run_decompositions`` with no decompositions: ``h[:, :1].mul_(3)`` becomes a
    ``slice_scatter`` into ``h``) where making each call out of place, as ingest does,
    would leave a view stale (:func:`frontends.fx.effects.updates_an_alias`) or the
    caller's input or buffer unchanged (``x.t().add_(1)``). Otherwise ``program``
    itself.

    >>> class Scaled(torch.nn.Module):
    ...     def forward(self, x):
    ...         h = x * 2
    ...         h[:, :1].mul_(3)
    ...         return h
    >>> program = torch.export.export(Scaled(), (torch.ones(2, 2),))
    >>> any("slice_scatter" in str(n.target) for n in functional(program).graph.nodes)
    True
    """
    graph = program.graph
    if not updates_an_alias(graph) and not any(
            updates_an_input(n) and n.args[0].op != "placeholder" for n in graph.nodes):
        return program
    return program.run_decompositions({})


def written_back(program: torch.export.ExportedProgram) -> fx.GraphModule:
    """The graph of a functional ``program`` that writes the new values of the inputs and
    buffers it updates into them (``aten.copy_``, at the end), where the program returns
    them as outputs: the source updates them, and emission keeps such a write.

    >>> class Bump(torch.nn.Module):
    ...     def forward(self, x):
    ...         x.add_(1)
    ...         return x * 2
    >>> program = torch.export.export(Bump(), (torch.ones(2),)).run_decompositions({})
    >>> [str(n.target) for n in written_back(program).graph.nodes if n.op == "call_function"]
    ['aten.add.Tensor', 'aten.mul.Tensor', 'aten.copy_.default']
    """
    signature = program.graph_signature
    written = written_targets(signature)
    gm = fx.GraphModule(program.graph_module, copy.deepcopy(program.graph))
    if not any(written):
        return gm
    buffers = {state: name for name, state in (
        *signature.inputs_to_buffers.items(), *signature.inputs_to_parameters.items())}
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    output = gm.graph.output_node()
    kept = []
    with gm.graph.inserting_before(output):
        for value, target in zip(output.args[0], written):
            if target is None:
                kept.append(value)
                continue
            gm.graph.call_function(torch.ops.aten.copy_.default,
                                   (placeholders[buffers.get(target, target)], value))
    output.args = (tuple(kept),)
    gm.recompile()
    return gm

