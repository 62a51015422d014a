"""Sizes: emitted modules on inputs of other sizes than the example's.

An emitted program computes a size from its input wherever the source did (``x.size(0)``,
``x.shape[:-1]``), so it runs on any input of the same rank and dtype where the source
would. Two things can still tie it to the example's sizes:

- a literal target shape (``reshape(x, (2, 12))``, written so in the source or built by a
  rule): on other sizes torch's reshape fails. :func:`explain_sizes` makes the generated
  ``forward`` say which input size it was built for instead (:class:`SizeMismatch`);
- a number a rule computed from a size (a sum over a broadcast dim becomes a product with
  its length): other sizes would give wrong results, silently. The pipeline finds them
  (:func:`compiler.sizes.probe_sizes`) and :func:`require_sizes` makes the module refuse
  the sizes it was not built for.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: x.view(x.size(0), -1).relu())
>>> opt = EGraph.from_fx(gm, (torch.randn(2, 3, 4),)).extract(AstSize())
>>> opt(torch.randn(5, 3, 4)).shape
torch.Size([5, 12])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.exported import InputGuards, attribute_at, named_shape, owner_of

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from frontends.fx.source import FxSource


class SizeMismatch(RuntimeError):
    """An emitted module was called with inputs of other sizes than the ones it was built
    for, and it holds those sizes (the message names the input, its shape and the shape
    the module was built for)."""


# -- literal target shapes: explain torch's error ---------------------------------------------


def explain_sizes(graph: fx.Graph, egraph: EGraph, baked: list[str]
                  ) -> tuple[list[str], dict, list[str]] | None:
    """Make the generated ``forward`` explain a failure on inputs of other sizes than the
    example's when the program holds literal target shapes (``baked``: ``reshape to (2,
    12)``): the body runs in a ``try``, and a RuntimeError on inputs whose shapes differ
    from the example's becomes a :class:`SizeMismatch` that names them. On the normal
    path it costs a read of each input's shape; it keeps no input alive (a backward's
    saved activations are freed after their last use). Returns what
    :func:`explain_sizes_of` takes to do it again (on a graph traced anew from the code,
    as a loaded module's is), or None where it did nothing."""
    # forward's parameter names: a placeholder's node name can differ from its target
    # (fx renames a parameter called ``input`` to ``input_1`` inside the body, which runs
    # after this wrapper's first line)
    names = [str(n.target).lstrip("*") for n in graph.nodes if n.op == "placeholder"]
    shapes = {}
    for name, cid in zip(names, egraph.fx.input_classes):
        shape = getattr(egraph.data(cid), "shape", None)
        if shape is not None:
            # (a symbolic size, an aot graph's generator state ``(s96,)``, by its name:
            # any size fits it)
            shapes[name] = tuple(d if isinstance(d, int) else str(d) for d in shape)
    if not shapes:
        return None
    explanation = (names, shapes, sorted(set(baked))[:3])
    explain_sizes_of(graph, *explanation)
    return explanation


def explain_sizes_of(graph: fx.Graph, names: list[str], shapes: dict, held: list[str]) -> None:
    """Wrap the generated ``forward``'s body as :func:`explain_sizes` does: ``names``
    are forward's parameters, ``shapes`` the sizes it was built for, ``held`` the literal
    shapes it holds."""
    def make(previous):
        def transform(body: list[str]) -> list[str]:
            if previous is not None:
                body = previous(body)
            lines = "".join(body).split("\n")
            inner = "\n".join("    " + line if line.strip() else line for line in lines)
            # (the shapes, not the inputs: a tuple of the inputs would keep each alive
            # to the end, a backward's saved activations among them)
            # (None for an input no shape was recorded of: check_sizes skips it)
            read = ", ".join(f"getattr({name}, 'shape', None)" if name in shapes else "None"
                             for name in names)
            return [
                f"_egraph_shapes = ({read},)\n", "try:\n", inner,
                "except RuntimeError as _egraph_error:\n",
                "    from backends.sizes import check_sizes\n",
                f"    check_sizes(_egraph_error, {tuple(names)!r}, _egraph_shapes, {shapes!r}, "
                f"{held!r})\n",
                "    raise\n",
            ]
        return transform

    graph.on_generate_code(make)


def check_sizes(error: Exception, names: tuple, shapes: tuple, built: dict,
                held: list[str]) -> None:
    """Raise :class:`SizeMismatch` (from ``error``) when an input's shape (``shapes``:
    each input's, None for one that is not a tensor) differs from the shape the module
    was built for; return otherwise (the caller re-raises)."""
    if isinstance(error, SizeMismatch):
        return
    wrong = [(name, shape, built[name]) for name, shape in zip(names, shapes)
             if name in built and shape is not None and not _fits(shape, built[name])]
    if not wrong:
        return
    got = "; ".join(f"input {name!r} has shape {tuple(shape)}, the module was built for {want}"
                    for name, shape, want in wrong)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise SizeMismatch(
        f"{got}. The optimised program holds sizes of its example inputs "
        f"({', '.join(held)}), so it runs only on inputs of those sizes: build it again "
        "from an example of this shape, or compute sizes from the input in the source "
        f"(x.size(0), x.shape[-1]) so that they stay symbolic. (torch: {first})"
    ) from error


def _fits(shape: tuple, built: tuple) -> bool:
    """Whether ``shape`` is the shape a module was built for (a symbolic size, written by
    its name, fits any).

    >>> _fits((2, 5), (2, "s0")), _fits((3, 5), (2, "s0")), _fits((2,), (2, 1))
    (True, False, False)
    """
    return len(shape) == len(built) and all(
        not isinstance(want, int) or got == want for got, want in zip(shape, built))


# -- sizes a rewrite computed: refuse other sizes ---------------------------------------------


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
    was built for in a dim it depends on. Traced (torch.fx traces a pickled GraphModule's
    code again when it is loaded), it records itself as a call of the new graph."""
    proxy = next((x for x in inputs if isinstance(x, fx.Proxy)), None)
    if proxy is not None:
        proxy.tracer.create_proxy("call_function", check_built_for,
                                  (inputs, names, fixed, shapes), {})
        return
    for name, x in zip(names, inputs):
        for d, n in fixed[name].items():
            if not isinstance(x, torch.Tensor) or x.dim() <= d or x.shape[d] != n:
                raise SizeMismatch(
                    f"{named_shape(name, x)}, the module was built for "
                    f"{shapes[name]}: a rewrite made part of the program from its size {n} "
                    f"in dim {d} (or the source was captured for that size alone), so it "
                    "runs only on inputs of that size there (others would fail or give "
                    "wrong results). Build it again from an example of this shape.")


# -- sizes a rewrite computed: the source's form at other sizes ------------------------------


def dispatch_sizes(gm: fx.GraphModule, fixed: dict[str, dict[int, int]], shapes: dict,
                   make_general: Callable[[], fx.GraphModule | None]) -> None:
    """Make ``gm`` run a general program (the source's form, emitted with symbolic sizes)
    on inputs whose sizes differ from ``fixed`` (``{input: {dim: size}}``, the sizes a
    rewrite computed with), and itself on the others: specialised where the example's
    sizes are met, never refusing a size the source runs at. ``make_general()`` makes
    the general program (None where it cannot) when first needed, or when ``gm`` is
    saved; it is kept in ``gm.meta`` (not a submodule: the state dict keeps the source's
    keys) and reads ``gm``'s parameters and buffers when it runs (:func:`run_general`).
    ``shapes``: the example's shapes of the inputs in ``fixed``, for the error where no
    general program can be made."""
    names = [str(n.target).lstrip("*") for n in gm.graph.nodes if n.op == "placeholder"]
    gm.meta["egraph_general_maker"] = make_general
    gm.meta["egraph_built_shapes"] = dict(shapes)
    gm.meta["egraph_dispatch"] = (names, {k: dict(v) for k, v in fixed.items()})
    dispatch_sizes_of(gm.graph, *gm.meta["egraph_dispatch"])
    gm.recompile()


def general_of(gm: fx.GraphModule) -> fx.GraphModule | None:
    """The general program of a module :func:`dispatch_sizes` made, made now if it was
    not yet (None where it cannot be)."""
    if "egraph_general" not in gm.meta:
        make = gm.meta.pop("egraph_general_maker", None)
        gm.meta["egraph_general"] = make() if make is not None else None
    return gm.meta["egraph_general"]


def dispatch_sizes_of(graph: fx.Graph, names: list[str], fixed: dict) -> None:
    """Put the test of :func:`dispatch_sizes` first in ``graph``'s ``forward`` (again on
    a graph traced anew from the code, as a loaded module's is)."""
    def make(previous):
        def transform(body: list[str]) -> list[str]:
            if previous is not None:
                body = previous(body)
            inputs = f"({', '.join(names)},)"
            return [
                "from backends.sizes import fits_sizes, run_general\n",
                f"if not fits_sizes({inputs}, {tuple(names)!r}, {fixed!r}):\n",
                f"    return run_general(self, {inputs})\n",
                *body,
            ]
        return transform

    graph.on_generate_code(make)


def fits_sizes(inputs: tuple, names: tuple, fixed: dict) -> bool:
    """Whether ``inputs`` (bound to ``names``) have the sizes in ``fixed``; True while
    torch.fx traces the code again (a loaded module: the specialised body is the graph).

    >>> fits_sizes((torch.ones(2, 3),), ("x",), {"x": {0: 2}})
    True
    >>> fits_sizes((torch.ones(5, 3),), ("x",), {"x": {0: 2}})
    False
    """
    if any(isinstance(x, fx.Proxy) for x in inputs):
        return True
    for name, x in zip(names, inputs):
        for d, n in fixed.get(name, {}).items():
            if not isinstance(x, torch.Tensor) or x.dim() <= d or x.shape[d] != n:
                return False
    return True


def run_general(owner: fx.GraphModule, inputs: tuple):
    """Run ``owner``'s general program on ``inputs``, with ``owner``'s parameters and
    buffers as they are now (moved by ``.to()``, loaded from a checkpoint)."""
    general = general_of(owner)
    if general is None:  # the source could not be captured with symbolic sizes
        names, fixed = owner.meta["egraph_dispatch"]
        check_built_for(inputs, tuple(names), fixed, owner.meta["egraph_built_shapes"])
    for name, value in [*general.named_parameters(), *general.named_buffers()]:
        try:
            current = attribute_at(owner, name)
        except AttributeError:
            continue
        holder, leaf = owner_of(general, name)
        # (only the general program's own holders: a module it calls is the user's)
        if isinstance(current, torch.Tensor) and current is not value and (
                holder is general or type(holder) is nn.Module):
            if isinstance(current, nn.Parameter):
                holder._parameters[leaf] = current
            else:
                holder._buffers[leaf] = current
    return general(*inputs)


# -- the contract of an exported source: refuse what torch.export's module refuses ------------


def require_guards(graph: fx.Graph, guards: InputGuards) -> None:
    """Make ``graph`` check, first thing, the conditions its exported source holds its
    inputs to (``guards``: the inputs' names, in order, and the conditions over them;
    :func:`frontends.fx.exported.input_guards`), raising :class:`SizeMismatch` where one
    fails. Where a condition fails the source's program does not apply (a branch on a
    size was taken at export): torch's unlifted module refuses such inputs, and so does
    the emitted one, which can be saved (torch's check cannot be pickled)."""
    names, conditions = guards
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not conditions or len(placeholders) != len(names):
        return
    with graph.inserting_after(placeholders[-1]):
        graph.call_function(check_guards, (tuple(placeholders), tuple(names),
                                           tuple(conditions)))


def check_guards(inputs: tuple, names: tuple, conditions: tuple) -> None:
    """Raise :class:`SizeMismatch` when ``inputs`` (bound to ``names``) break one of the
    ``conditions`` of the exported program the module was built from. Traced, it records
    itself as a call of the new graph (as :func:`check_built_for`).

    >>> check_guards((torch.ones(3),), ("x",), ("x.size()[0] == 3",))
    >>> check_guards((torch.ones(2),), ("x",), ("x.size()[0] == 3",))
    Traceback (most recent call last):
    ...
    backends.sizes.SizeMismatch: input 'x' has shape (2,), but the exported program ...
    """
    proxy = next((x for x in inputs if isinstance(x, fx.Proxy)), None)
    if proxy is not None:
        proxy.tracer.create_proxy("call_function", check_guards, (inputs, names, conditions),
                                  {})
        return
    guards = InputGuards(names, conditions)
    broken = guards.broken(inputs)
    if broken is None:
        return
    raise SizeMismatch(
        f"{guards.describe(inputs)}, but the exported program the module was built from "
        f"holds its inputs to {broken} (torch.export made static the sizes it was not "
        "told vary, bounded the dynamic ones and took branches on them): export it again "
        "with dynamic_shapes naming the dims that vary (torch.export.Dim), or from an "
        "example of these sizes.")


def is_input_check(node: fx.Node) -> bool:
    """Whether ``node`` checks the module's inputs (:func:`check_guards`,
    :func:`check_built_for`) rather than computing: not counted as the program's work.

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> any(is_input_check(n) for n in gm.graph.nodes)
    False
    """
    return node.op == "call_function" and node.target in (check_guards, check_built_for)
