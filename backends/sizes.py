"""Sizes: emitted modules on inputs of other sizes than the example's.

An emitted program computes a size from its input wherever the source did (``x.size(0)``,
``x.shape[:-1]``), so it runs on any input of the same rank and dtype where the source
would. Two things can still tie it to the example's sizes:

- a literal target shape (``reshape(x, (2, 12))``, written so in the source or built by a
  rule): on other sizes torch's reshape fails. :func:`explain_sizes` makes the generated
  ``forward`` say which input size it was built for instead (:class:`SizeMismatch`);
- a number a rule computed from a size (a sum over a broadcast dim becomes a product with
  its length): other sizes would give wrong results, silently. :func:`probe_sizes` runs
  the program on inputs of other sizes where the source runs them, and
  :func:`require_sizes` makes the module refuse the sizes it was not built for.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: x.view(x.size(0), -1).relu())
>>> opt = EGraph.from_fx(gm, (torch.randn(2, 3, 4),)).extract(AstSize())
>>> opt(torch.randn(5, 3, 4)).shape
torch.Size([5, 12])
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from egraph.signs import NEG, POS
from egraph.term import is_literal_op

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from frontends.fx.ingest import FxSource


class SizeMismatch(RuntimeError):
    """An emitted module was called with inputs of other sizes than the ones it was built
    for, and it holds those sizes (the message names the input, its shape and the shape
    the module was built for)."""


# -- literal target shapes: explain torch's error ---------------------------------------------


def explain_sizes(graph: fx.Graph, egraph: EGraph, baked: list[str]) -> None:
    """Make the generated ``forward`` explain a failure on inputs of other sizes than the
    example's when the program holds literal target shapes (``baked``: ``reshape to (2,
    12)``): the body runs in a ``try``, and a RuntimeError on inputs whose shapes differ
    from the example's becomes a :class:`SizeMismatch` that names them. Free on the
    normal path."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    shapes = {}
    for name, cid in zip(names, egraph.fx.input_classes):
        shape = getattr(egraph.data(cid), "shape", None)
        if shape is not None:
            shapes[name] = tuple(shape)
    if not shapes:
        return
    held = sorted(set(baked))[:3]

    def make(previous):
        def transform(body: list[str]) -> list[str]:
            if previous is not None:
                body = previous(body)
            lines = "".join(body).split("\n")
            inner = "\n".join("    " + line if line.strip() else line for line in lines)
            return [
                f"_egraph_inputs = ({', '.join(names)},)\n", "try:\n", inner,
                "except RuntimeError as _egraph_error:\n",
                "    from backends.sizes import check_sizes\n",
                f"    check_sizes(_egraph_error, {tuple(names)!r}, _egraph_inputs, {shapes!r}, "
                f"{held!r})\n",
                "    raise\n",
            ]
        return transform

    graph.on_generate_code(make)


def check_sizes(error: Exception, names: tuple, inputs: tuple, built: dict,
                held: list[str]) -> None:
    """Raise :class:`SizeMismatch` (from ``error``) when an input's shape differs from
    the shape the module was built for; return otherwise (the caller re-raises)."""
    if isinstance(error, SizeMismatch):
        return
    wrong = [(name, tuple(x.shape), built[name]) for name, x in zip(names, inputs)
             if name in built and isinstance(x, torch.Tensor) and tuple(x.shape) != built[name]]
    if not wrong:
        return
    got = "; ".join(f"input {name!r} has shape {shape}, the module was built for {want}"
                    for name, shape, want in wrong)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise SizeMismatch(
        f"{got}. The optimised program holds sizes of its example inputs "
        f"({', '.join(held)}), so it runs only on inputs of those sizes: build it again "
        "from an example of this shape, or compute sizes from the input in the source "
        f"(x.size(0), x.shape[-1]) so that they stay symbolic. (torch: {first})"
    ) from error


# -- numbers computed from sizes: probe, then refuse other sizes ------------------------------

MAX_PROBED = 1 << 20
"""Programs with more input and parameter elements are not probed on other sizes."""


def probe_sizes(egraph: EGraph, choice: dict[int, tuple], roots: list[int],
                gm: fx.GraphModule, rewritten: bool = True,
                max_numel: int = MAX_PROBED) -> dict[str, dict[int, int]]:
    """The input dims whose example size the emitted program ``gm`` depends on where the
    source does not: ``{input: {dim: size}}``.

    Only programs that rewrites changed (``rewritten``: a rule's condition may have held
    for the example's sizes only, as ``expand`` to a batch of 1 is no expand) or that hold
    literals the source did not are probed, on real example inputs of known sizes (graphs
    from torch.compile have fake ones or symbolic sizes: dynamo guards the sizes, or the
    program reads them). Each size of the example inputs (the dims of one size together,
    then one by one where the source refuses that) is grown by half (1 becomes 2); where
    the source runs on such inputs, the program must agree with it (the validation's
    float64 judgement).
    """
    src = egraph.fx
    inputs = src.example_inputs or ()
    tensors = [(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if not tensors or not all(type(x) is torch.Tensor and x.device.type != "meta"
                              for _, x in tensors):
        return {}
    if any(getattr(egraph.data(src.input_classes[i]), "shape", None) is None
           for i, _ in tensors):
        return {}  # symbolic sizes (dynamic shapes): the program reads them all
    if not rewritten and not _new_literals(egraph, choice, roots):
        return {}
    original = src.graph_module if src.module is None else src.module
    numel = sum(x.numel() for _, x in tensors)
    numel += sum(p.numel() for p in original.parameters())
    if numel > max_numel:
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
    when the source itself does not run on them."""
    from backends.validate import validate_module

    inputs = _resized(src, dims, size + max(1, size // 2))
    # (a GraphModule that raises prints its code to stderr first: not wanted here)
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            with torch.random.fork_rng(), torch.no_grad():
                original(*inputs)
        except Exception:  # noqa: BLE001 - the source refuses these sizes: nothing to judge
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
        out.append(_random(x, tuple(shape), generator, src.domains.get(name)))
    return tuple(out)


def _random(x: torch.Tensor, shape: tuple, generator, domain: int | None) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool().to(x.device)
    if not x.is_floating_point():
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
        return torch.randint(lo, hi + 1, shape, generator=generator, dtype=x.dtype).to(x.device)
    values = torch.randn(shape, generator=generator)
    if x.numel() > 1:
        std, mean = x.detach().float().std(), x.detach().float().mean()
        if torch.isfinite(std) and std > 0:
            values = values * std.cpu() + mean.cpu()
    if domain is not None and not domain & NEG:
        values = values.abs() + 1e-3
    elif domain is not None and not domain & POS:
        values = -(values.abs() + 1e-3)
    return values.to(device=x.device, dtype=x.dtype)


def require_sizes(gm: fx.GraphModule, fixed: dict[str, dict[int, int]], src: FxSource) -> None:
    """Make ``gm`` check, first thing, that its inputs have the sizes in ``fixed``
    (``{input: {dim: size}}``), raising :class:`SizeMismatch` otherwise."""
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    names = [name for name in src.inputs if name in fixed and name in placeholders]
    if not names:
        return
    shapes = {name: tuple(x.shape) for name, x in zip(src.inputs, src.example_inputs)
              if name in fixed}
    last = list(placeholders.values())[-1]
    with gm.graph.inserting_after(last):
        gm.graph.call_function(check_built_for, (
            tuple(placeholders[name] for name in names), tuple(names),
            {name: fixed[name] for name in names}, shapes))
    gm.recompile()


def check_built_for(inputs: tuple, names: tuple, fixed: dict, shapes: dict) -> None:
    """Raise :class:`SizeMismatch` when an input's size differs from the one the module
    was built for in a dim it depends on."""
    for name, x in zip(names, inputs):
        for d, n in fixed[name].items():
            if not isinstance(x, torch.Tensor) or x.dim() <= d or x.shape[d] != n:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else repr(x)
                raise SizeMismatch(
                    f"input {name!r} has shape {got}, the module was built for "
                    f"{shapes[name]}: a rewrite made part of the program from its size {n} "
                    f"in dim {d}, so it runs only on inputs of that size there (others "
                    "would fail or give wrong results). Build it again from an example of "
                    "this shape.")
