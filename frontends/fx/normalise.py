"""Normalising the source: what the user gives ingest (a GraphModule, an nn.Module or a
torch.export program, with ``dynamic=`` sizes) becomes one FX graph to build from, with
the module that runs the source, the graph inputs that hold parameters, the example
inputs as the graph takes them (the leaves of structures) and the program's lifted
constants. A module is traced (:mod:`frontends.fx.tracing`) and its ``foreach`` calls
split (:mod:`frontends.fx.foreach`); a program is made functional where it must be
(:mod:`frontends.fx.functionalise`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.exported import (
    ExportedModule,
    argument_names,
    export_dynamic,
    pytree_info,
    written_targets,
)
from frontends.fx.foreach import split_foreach
from frontends.fx.functionalise import functional, written_back
from frontends.fx.tracing import UntraceableModel, spread_star_inputs, trace

__all__ = ["Normalised", "normalise"]


@dataclass
class Normalised:
    """A source as ingest builds from it. ``source``: what the user gave, or the program
    it became (captured with dynamic sizes, or a program's unlifted module); ``module``
    runs it; ``gm`` is the graph to build from, ``param_names`` its inputs that hold
    parameters, buffers and lifted constants (by their qualified names), and
    ``lifted_constants`` the program's lifted tensor constants by input name.
    ``domains`` and ``ranges`` are the user's, keyed by the graph's input names."""

    source: Any
    module: nn.Module
    gm: fx.GraphModule
    example_inputs: tuple | list | None
    param_names: dict[str, str] = field(default_factory=dict)
    lifted_constants: dict[str, torch.Tensor] = field(default_factory=dict)
    domains: dict[str, str] | None = None
    ranges: dict[str, tuple[float, float]] | None = None

    def outputs(self, flat: Any) -> Any:
        """The output structure the source returns, of the graph's ``flat`` outputs."""
        if isinstance(self.source, torch.export.ExportedProgram):
            return _user_outputs(self.source, flat)
        return _unflattened_outputs(self.gm, flat)


def normalise(source, example_inputs=None, domains: dict[str, str] | None = None,
              ranges: dict[str, tuple[float, float]] | None = None,
              dynamic: bool | dict[str, dict[int, tuple[int, int | None]]] = False,
              ) -> Normalised:
    """``source`` (GraphModule, nn.Module or ExportedProgram) normalised for ingest (see
    :func:`frontends.fx.ingest.from_fx` for the arguments).

    >>> normalised = normalise(nn.ReLU(), torch.ones(2))
    >>> [n.op for n in normalised.gm.graph.nodes], normalised.example_inputs[0].shape
    (['placeholder', 'call_function', 'output'], torch.Size([2]))
    """
    param_names: dict[str, str] = {}
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    if isinstance(source, torch.export.ExportedProgram) and (
            source.graph_signature.inputs_to_lifted_custom_objs):
        # (an object it lifted to an input, a torch.Generator: its unlifted module reads
        # it as an attribute, which calls take by reference)
        source = source.module()
    if dynamic and not isinstance(source, torch.export.ExportedProgram):
        if example_inputs is None or not isinstance(source, nn.Module):
            raise ValueError("dynamic= needs an nn.Module (or GraphModule) and its example "
                             "inputs; an ExportedProgram carries its own Dims")
        names = argument_names(source)
        source = export_dynamic(source, tuple(example_inputs), dynamic)
        domains, ranges = _renamed(domains, names, source), _renamed(ranges, names, source)
    module, lifted = source, {}
    if isinstance(source, torch.export.ExportedProgram):
        program = functional(source)
        gm, param_names, example_inputs = _from_export(program, example_inputs)
        if program is not source:  # (the source runs as it was: it updates in place)
            gm = written_back(program)
        module, lifted = ExportedModule(source), _lifted_constants(program)
    elif isinstance(source, nn.Module):
        gm = split_foreach(spread_star_inputs(trace(source, example_inputs), example_inputs,
                                              source.forward))
        module = source
        if _takes_structures(source):
            # (torch's unlifted module: its graph takes the leaves of its forward's
            # arguments, and its forward checks them against its export's, keywords
            # included; ingest and validation run the graph)
            module = _on_leaves(gm)
            if example_inputs is not None:
                example_inputs = tuple(torch.utils._pytree.tree_leaves(tuple(example_inputs)))
    else:
        raise TypeError(
            f"EGraph.from_fx takes a torch.fx.GraphModule, an nn.Module or a "
            f"torch.export.ExportedProgram, not {type(source).__name__}"
        )
    return Normalised(source, module, gm, example_inputs, param_names, lifted, domains, ranges)


def _renamed(by_input: dict | None, names: list[str],
             program: torch.export.ExportedProgram) -> dict | None:
    """``by_input``, keyed by the module's argument ``names``, keyed instead by the names
    the exported ``program`` gives those inputs (by position: export may rename them)."""
    if not by_input:
        return by_input
    renamed = dict(zip(names, program.graph_signature.user_inputs))
    return {renamed.get(name, name): value for name, value in by_input.items()}


def _takes_structures(module: nn.Module) -> bool:
    """Whether ``module`` is a GraphModule whose forward takes structures (or keywords)
    that its code flattens into its graph's inputs, as torch's unlifted module does."""
    return getattr(pytree_info(module), "in_spec", None) is not None


def _on_leaves(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` (its state, not copies) with a forward that takes its graph's inputs, the
    leaves of the structures its own forward takes, and returns the graph's flat outputs."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def _user_outputs(program, outputs):
    """The user-visible output structure of an export program's flat graph outputs."""
    if any(written_targets(program.graph_signature)):
        raise UntraceableModel(
            "the exported program mutates buffers or inputs (a module in training mode, such "
            "as BatchNorm updating running statistics?); call model.eval() before "
            "torch.export.export, or use torch.compile(model, backend='egraph')"
        )
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten(list(outputs), program.call_spec.out_spec)


def _unflattened_outputs(gm: fx.GraphModule, outputs):
    """What ``gm`` returns where its code rebuilds a structure from the graph's flat
    outputs (``ExportedProgram.module()`` returns a tensor, not a 1-tuple): the same
    structure, so the emitted program returns what the source does."""
    info = pytree_info(gm)
    if info is None or info.out_spec is None or not isinstance(outputs, (tuple, list)):
        return outputs
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten(list(outputs), info.out_spec)


def _lifted_constants(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensor constants ``program`` lifted to inputs, by placeholder name: the program
    is specialised on their values (they are not parameters or buffers, which a caller
    may update), so ingest holds them as constants the rules can read."""
    names = program.graph_signature.inputs_to_lifted_tensor_constants
    return {name: program.constants[target] for name, target in names.items()
            if isinstance(program.constants.get(target), torch.Tensor)}


def _from_export(program, example_inputs):
    """The graph of a torch.export program, its parameter names, and example inputs."""
    gm = program.graph_module
    sig = program.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
             **sig.inputs_to_lifted_tensor_constants}
    if example_inputs is None and program.example_inputs is not None:
        example_inputs = program.example_inputs
    if example_inputs is not None:  # (the graph's inputs are the leaves: {"a": x} is x)
        example_inputs = tuple(torch.utils._pytree.tree_leaves(example_inputs))
    return gm, names, example_inputs

