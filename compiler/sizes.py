"""Which example sizes an emitted program depends on where its source does not.

A number a rule computed from a size (a sum over a broadcast dim becomes a product with its
length) ties the program to the example's sizes: other sizes would give wrong results,
silently. :func:`probe_sizes` runs the program on inputs of other sizes where the source
runs them; the emitted module then refuses the sizes it was not built for
(:func:`backends.sizes.require_sizes`).

>>> import torch
>>> from egraph import EGraph, AstSize
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.sum(-1) * 2), (torch.randn(3, 4),))
>>> opt = eg.extract(AstSize())
>>> from egraph.extract import program_roots, source_program
>>> probe_sizes(eg, source_program(eg), program_roots(eg), opt)
{}
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from compiler.validate import in_domain, program_numel, random_like, validate_module
from egraph.dims import is_symbolic
from egraph.term import is_literal_op
from frontends.fx.effects import attributes_kept

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from frontends.fx.ingest import FxSource


MAX_PROBED = 1 << 20
"""Programs with more input and parameter elements are not probed on other sizes."""


def probe_sizes(egraph: EGraph, choice: dict[int, tuple], roots: list[int],
                gm: fx.GraphModule, rewritten: bool = True,
                max_numel: int = MAX_PROBED) -> dict[str, dict[int, int]]:
    """The input dims whose example size the emitted program ``gm`` depends on where the
    source does not: ``{input: {dim: size}}``.

    A program exported by torch.export is not probed: its module checks the sizes the
    export made static or bounded (:func:`backends.sizes.require_guards`). Only programs
    that rewrites changed (``rewritten``: a rule's condition may have held
    for the example's sizes only, as ``expand`` to a batch of 1 is no expand) or that hold
    literals the source did not are probed, on real example inputs of known sizes (graphs
    from torch.compile have fake ones or symbolic sizes: dynamo guards the sizes, or the
    program reads them). Each size of the example inputs (the dims of one size together,
    then one by one where the source refuses that) is grown by half (1 becomes 2); where
    the source runs on such inputs, the program must agree with it (the validation's
    float64 judgement).
    """
    src = egraph.fx
    if src.guards is not None:
        return {}  # an exported source: the module checks the sizes its export holds
    inputs = src.example_inputs or ()
    tensors = [(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if not tensors or not all(type(x) is torch.Tensor and x.device.type != "meta"
                              for _, x in tensors):
        return {}
    if any(getattr(egraph.data(src.input_classes[i]), "shape", None) is None
           or is_symbolic(egraph.data(src.input_classes[i]).shape) for i, _ in tensors):
        return {}  # symbolic sizes (dynamic shapes): the program reads them all
    if not rewritten and not _new_literals(egraph, choice, roots):
        return {}
    original = src.graph_module if src.module is None else src.module
    if program_numel(original, inputs) > max_numel:
        return {}
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, x in tensors:
        for d, n in enumerate(x.shape):
            if n > 0:
                groups.setdefault(int(n), []).append((i, d))
    fixed: dict[str, dict[int, int]] = {}
    for size, members in sorted(groups.items()):
        verdict = _agrees(src, original, gm, members, size)
        if verdict is True:
            continue
        if verdict is False and len(members) == 1:
            failing = members
        else:  # the source refuses them together, or the program fails: one by one
            failing = [m for m in members if _agrees(src, original, gm, [m], size) is False]
            if verdict is False and not failing:
                failing = members
        for i, d in failing:
            fixed.setdefault(src.inputs[i], {})[d] = size
    return fixed


def _new_literals(egraph: EGraph, choice: dict[int, tuple], roots: list[int]) -> bool:
    """True when the chosen program holds a literal the source program did not."""
    initial = {n[0] for nodes in egraph.fx.initial.values() for n in nodes if len(n) == 1}
    find = egraph.find
    seen: set[int] = set()
    stack = [find(r) for r in roots]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        node = choice.get(c)
        if node is None:
            continue
        if len(node) == 1 and is_literal_op(node[0]) and node[0] not in initial:
            return True
        stack.extend(find(k) for k in node[1:])
    return False


def _agrees(src: FxSource, original, gm: fx.GraphModule, dims: list[tuple[int, int]],
            size: int) -> bool | None:
    """Whether ``gm`` agrees with the source on inputs whose ``dims`` are resized; None
    when the source itself does not run on them and the program does (nothing to judge).
    Where both fail (the source holds a literal size, ``view(2, 12)``, and the program
    constants of that size), the program's failure would be the less clear: it does not
    agree, so it refuses those sizes by name."""
    inputs = _resized(src, dims, size + max(1, size // 2))
    # (a GraphModule that raises prints its code to stderr first: not wanted here)
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            # (the runs leave the state the graphs write, the caller's buffers, as it was)
            with torch.random.fork_rng(), attributes_kept(src.graph_module), torch.no_grad():
                original(*inputs)
        except Exception:  # noqa: BLE001 - the source refuses these sizes
            try:
                with torch.random.fork_rng(), attributes_kept(gm), torch.no_grad():
                    gm(*inputs)
            except Exception:  # noqa: BLE001 - and so does the program, less clearly
                return False
            return None
        try:
            return validate_module(dataclasses.replace(src, example_inputs=inputs), gm,
                                   trials=0).ok
        except Exception:  # noqa: BLE001 - the program fails where the source runs
            return False


def _resized(src: FxSource, dims: list[tuple[int, int]], size: int) -> tuple:
    """Random example inputs like the source's, with ``dims`` ``(input, dim)`` of length
    ``size`` (values in the examples' range, inside declared domains)."""
    generator = torch.Generator().manual_seed(0)
    out: list[Any] = []
    for i, (name, x) in enumerate(zip(src.inputs, src.example_inputs)):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        shape = list(x.shape)
        for j, d in dims:
            if j == i:
                shape[d] = size
        out.append(in_domain(random_like(x, generator, shape=tuple(shape)),
                             src.domains.get(name)))
    return tuple(out)


