"""The emitted module's signature: the structured arguments it takes and the structured
result it rebuilds (as the source's), its outputs' layout, and what it keeps when saved.

"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.fx.immutable_collections import immutable_dict, immutable_list

from backends.sizes import dispatch_sizes_of, explain_sizes_of, general_of

_SAVED_META = ("egraph_report", "egraph_sizes_explained", "egraph_general", "egraph_dispatch",
               "egraph_built_shapes")
"""What a saved emitted module keeps of its ``meta`` (torch.fx keeps none of it): the
extraction's report, and how its code explains sizes it was not built for."""


def keep_meta_when_saved(gm: fx.GraphModule) -> None:
    """Make a pickled ``gm`` (``torch.save``) load with the entries of its ``meta`` in
    :data:`_SAVED_META`, and with its code explaining sizes as before. torch.fx saves
    a GraphModule as its code and traces that again on load, so ``meta`` and the code's
    transforms would be lost. (Each GraphModule has a class of its own: this changes
    ``gm``'s alone.)"""
    def reduce(self):
        if "egraph_dispatch" in self.meta:
            general_of(self)  # (saved made: what makes it is not saved)
        rebuild, args = fx.GraphModule.__reduce__(self)
        kept = {key: self.meta[key] for key in _SAVED_META if key in self.meta}
        return _loaded_with_meta, (rebuild, args, kept, getattr(self, "_out_spec", None))

    type(gm).__reduce__ = reduce


def _loaded_with_meta(rebuild, args: tuple, meta: dict, out_spec: Any = None
                      ) -> fx.GraphModule:
    gm = rebuild(*args)
    gm.meta.update(meta)
    if out_spec is not None:  # (tracing the saved code again made the structure a dict)
        output = gm.graph.output_node()
        output.args = (tuple(pytree.tree_leaves(output.args[0])),)
        take_structures(gm.graph, out_spec=out_spec)
        gm.recompile()
    if "egraph_sizes_explained" in meta:
        explain_sizes_of(gm.graph, *meta["egraph_sizes_explained"])
        gm.recompile()
    if "egraph_dispatch" in meta:
        dispatch_sizes_of(gm.graph, *meta["egraph_dispatch"])
        gm.recompile()
    keep_meta_when_saved(gm)
    return gm


def take_structured_inputs(gm: fx.GraphModule, structure: tuple[list[str], Any]) -> None:
    """Make the emitted ``gm`` take its source's arguments (``structure``: their names and
    the spec whose leaves are the graph's inputs, :func:`frontends.fx.exported.
    input_structure`) in place of their leaves, as torch's unlifted module does: a
    ``forward(self, d)`` for ``d = {"a": x, "b": y}``, not ``forward(self, d_a, d_b)``."""
    take_structures(gm.graph, *structure)
    gm.recompile()


class _Structures(_PyTreeCodeGen):
    """torch.fx's code for structured arguments and results (that of torch's unlifted
    module), where the arguments may be the graph's own placeholders (no input spec)."""

    def process_inputs(self, *inputs: Any) -> Any:
        return inputs if self.pytree_info.in_spec is None else super().process_inputs(*inputs)

    def gen_fn_def(self, free_vars: list[str], maybe_return_annotation: str, *,
                   expanded_def: bool = False) -> str:
        if self.pytree_info.in_spec is None:
            return fx.graph.CodeGen.gen_fn_def(self, free_vars, maybe_return_annotation,
                                               expanded_def=expanded_def)
        return super().gen_fn_def(free_vars, maybe_return_annotation,
                                  expanded_def=expanded_def)


def take_structures(graph: fx.Graph, names: list[str] | None = None, in_spec: Any = None,
                     out_spec: Any = None) -> None:
    """Make ``graph``'s code take structured arguments (``names``, ``in_spec``) or rebuild
    a structured result from its flat outputs (``out_spec``), keeping what its code did
    before: the other of the two, the names of fused kernels, the explanation of sizes."""
    codegen = graph._codegen
    before = getattr(codegen, "pytree_info", None)
    if before is not None:
        if in_spec is None:
            names, in_spec = before.orig_args, before.in_spec
        out_spec = out_spec or before.out_spec
        kind = type(codegen)
    elif type(codegen) is fx.graph.CodeGen:
        kind = _Structures
    else:  # (fused kernels named by their own code generation)
        kind = type(f"{type(codegen).__name__}OfStructures", (type(codegen), _Structures), {})
    structured = kind(_PyTreeInfo(list(names or ()), in_spec, out_spec))
    structured._body_transformer = codegen._body_transformer  # (explain_sizes's)
    graph.set_codegen(structured)


def rebuilt_alike(structure: Any) -> bool:
    """Whether an output written into an FX graph as it is comes back as the same
    structure: plain tuples, lists and dicts and named tuples do; a dict of another class
    (transformers' ``ModelOutput``, an ``OrderedDict``) comes back a plain dict, and a
    structure pytree knows of (a registered dataclass) does not come back at all."""
    if isinstance(structure, (tuple, list)):
        return ((type(structure) in (tuple, list, immutable_list) or hasattr(structure, "_fields"))
                and all(map(rebuilt_alike, structure)))
    if isinstance(structure, dict):
        return (type(structure) in (dict, immutable_dict)
                and all(map(rebuilt_alike, structure.values())))
    return structure is None or pytree.tree_is_leaf(structure)


def make_outputs_contiguous(gm: fx.GraphModule, indices: tuple[int, ...]) -> None:
    """Make the outputs at ``indices`` (of the flattened output structure) contiguous, in
    place: validation's repair for an output the source returned contiguous where ours is
    a strided result (sdpa on a transposed query returns one), which emission's view
    tracking cannot see.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (x.t(), x + 1))
    >>> make_outputs_contiguous(gm, (0,))
    >>> gm(torch.randn(2, 3))[0].is_contiguous()
    True
    """
    if not indices:
        return
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    wanted, position = set(indices), iter(range(1 << 62))

    def repaired(arg):
        if next(position) in wanted and isinstance(arg, fx.Node):
            with graph.inserting_before(output):
                return graph.call_method("contiguous", (arg,))
        return arg

    output.args = (fx.node.map_aggregate(output.args[0], repaired),)
    gm.recompile()
