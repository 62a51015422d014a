"""Which example sizes an emitted program depends on where its source does not.

A number a rule computed from a size (a sum over a broadcast dim becomes a product with its
length) ties the program to the example's sizes: other sizes would give wrong results,
silently. :func:`probe_sizes` runs the program on inputs of other sizes where the source
runs them; the emitted module then refuses the sizes it was not built for
(:func:`backends.sizes.require_sizes`). A program with symbolic sizes (torch.compile's
dynamic shapes, torch.export's ``Dim``) is meant for every size: :func:`check_other_sizes`
judges it at sizes other than its example's, where a size read as its example's value
would show.

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
from torch.utils._python_dispatch import TorchDispatchMode

from compiler.validate import (
    Validation,
    in_domain,
    is_fake,
    program_numel,
    random_like,
    validate_module,
)
from egraph.dims import Size, is_symbolic, map_sizes, sizes_in
from egraph.term import is_literal_op
from frontends.fx.effects import generator_state_inputs
from frontends.fx.kept import attributes_kept

if TYPE_CHECKING:
    from egraph.egraph import EGraph
    from frontends.fx.source import FxSource


MAX_PROBED = 1 << 20
"""Programs with more input and parameter elements are not probed on other sizes."""


def probe_sizes(egraph: EGraph, choice: dict[int, tuple], roots: list[int],
                gm: fx.GraphModule, rewritten: bool = True,
                max_numel: int = MAX_PROBED) -> dict[str, dict[int, int]] | None:
    """The input dims whose example size the emitted program ``gm`` depends on where the
    source does not: ``{input: {dim: size}}``; None where the program is too large to be
    probed (more than ``max_numel`` input and parameter elements).

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
        return None
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
    inputs = resized_inputs(src, dims, size + max(1, size // 2))
    if not runs_on(src, inputs, original):
        return None if runs_on(src, inputs, gm) else False
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return validate_module(dataclasses.replace(src, example_inputs=inputs), gm,
                                   trials=0).ok
        except Exception:  # noqa: BLE001 - the program fails where the source runs
            return False


def runs_on(src: FxSource, inputs: tuple, program=None) -> bool:
    """Whether ``program`` (default: the source's) runs on ``inputs``, leaving the random
    state and the state the source's graph writes (the caller's buffers) as they were.
    A batch norm whose statistics do not fit its input's channels is refused
    (:class:`ChannelsChecked`)."""
    if program is None:
        program = src.graph_module if src.module is None else src.module
    emitted = program if isinstance(program, fx.GraphModule) else src.graph_module
    # (a GraphModule that raises prints its code to stderr first: not wanted here)
    with contextlib.redirect_stderr(io.StringIO()), torch.random.fork_rng(), (
            attributes_kept(src.graph_module)), attributes_kept(emitted), torch.no_grad():
        try:
            with ChannelsChecked():
                program(*inputs)
        except Exception:  # noqa: BLE001 - it refuses these sizes
            return False
    return True


_BATCH_NORMS = frozenset({
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "native_batch_norm", "native_batch_norm_backward",
    "batch_norm_backward", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "_batch_norm_no_update"})
"""aten's batch norms, whose CPU kernels do not check that the weight, bias and
statistics have as many elements as the input has channels."""
_PER_CHANNEL = frozenset({"weight", "bias", "running_mean", "running_var", "save_mean",
                          "save_invstd", "save_var"})


class ChannelsChecked(TorchDispatchMode):
    """aten's batch norms checked as their meta kernels check them: a weight, bias or
    statistic with another number of elements than the input's channels raises. A probe
    of other sizes resizes some dims of the inputs, and the CPU kernels read statistics
    of fewer channels past their end: ResNet's forward in training, validated, resized a
    convolution weight's channels alone, and the process crashed.

    >>> stats = torch.zeros(4)
    >>> norm = torch.ops.aten._native_batch_norm_legit_functional.default
    >>> with ChannelsChecked():
    ...     norm(torch.randn(2, 6, 3, 3), None, None, stats, stats, True, 0.1, 1e-5)
    Traceback (most recent call last):
    RuntimeError: _native_batch_norm_legit_functional: running_mean has 4 elements for 6 channels
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in _BATCH_NORMS:
            given = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
            x = given.get("input")
            channels = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() > 1 else None
            for key, value in given.items():
                if key in _PER_CHANNEL and isinstance(value, torch.Tensor) and (
                        channels is not None and value.numel() != channels):
                    raise RuntimeError(f"{name}: {key} has {value.numel()} elements for "
                                       f"{channels} channels")
        return func(*args, **kwargs)


def resized_inputs(src: FxSource, dims: list[tuple[int, int]], size: int) -> tuple:
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


def check_other_sizes(egraph: EGraph, gm: fx.GraphModule) -> Validation | None:
    """The judgement of ``gm``, emitted from an e-graph with symbolic sizes, on inputs
    where every symbol takes another value than its example's (one more, or one less
    where its range ends there): a failed :class:`~compiler.validate.Validation` naming
    those sizes where the program fails or disagrees with the source, None where it
    agrees, where nothing is symbolic, or where the source itself does not run there
    (dynamo's guards hold it to sizes the graph does not show). Validation on the
    example's inputs alone cannot see a size read as its example's value
    (``x / x.numel()`` folded to ``x * 0.0111``)."""
    src = egraph.fx
    inputs = src.example_inputs or ()
    if src.guards is not None or not inputs or any(map(is_fake, inputs)):
        return None
    states = generator_state_inputs(src.graph_module)
    metas = [egraph.data(c) for c in src.input_classes]
    held = {s for i, meta in enumerate(metas) if i in states
            for size in sizes_in(getattr(meta, "shape", None)) for s in size.expr.free_symbols}
    values: dict = {}
    for meta in metas:
        for size in sizes_in((getattr(meta, "shape", None), getattr(meta, "value", None))):
            for symbol, (hint, low, high) in size.bindings:
                if symbol not in held and symbol not in values:
                    values[symbol] = _other_value(hint, low, high)
    values = {s: v for s, v in values.items() if v is not None}
    if not values:
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    at = ", ".join(f"{s}={v}" for s, v in sorted(values.items(), key=lambda kv: kv[0].name))
    # (inside torch.compile a fake mode is active: these runs are real)
    with unset_fake_temporarily(), contextlib.redirect_stderr(io.StringIO()):
        resized = _with_sizes(src, metas, states, values)
        if not runs_on(src, resized):
            return None
        try:
            result = validate_module(dataclasses.replace(src, example_inputs=resized), gm,
                                     trials=0)
        except Exception as err:  # noqa: BLE001 - the program fails where the source runs
            return Validation(False, 0.0, float("inf"), 1,
                              f"at sizes {at} it raises {type(err).__name__}: {err}")
    if result.ok:
        return None
    return dataclasses.replace(result, reason=f"at sizes {at}: {result.reason}")


def _other_value(hint: int, low: int | None, high: int | None) -> int | None:
    """A value of a symbol other than its example's ``hint``, inside ``[low, high]``."""
    for value in (hint + 1, hint - 1):
        if (low is None or value >= low) and (high is None or value <= high):
            return value
    return None


def _with_sizes(src: FxSource, metas: list, states: dict, values: dict) -> tuple:
    """The source's example inputs with each symbolic size evaluated at ``values``:
    random tensors of the new shapes (in the examples' range, inside declared domains),
    symbolic numbers at their new values, the rest as they are."""
    generator = torch.Generator().manual_seed(0)

    def at(size: Size) -> int:
        return int(size.expr.xreplace(values))

    out: list[Any] = []
    for i, (name, x, meta) in enumerate(zip(src.inputs, src.example_inputs, metas)):
        shape = getattr(meta, "shape", None)
        if isinstance(x, torch.Tensor) and i not in states and is_symbolic(shape):
            x = in_domain(random_like(x, generator, shape=map_sizes(tuple(shape), at)),
                          src.domains.get(name)).requires_grad_(x.requires_grad)
        elif isinstance(getattr(meta, "value", None), Size):
            x = at(meta.value)
        out.append(x)
    return tuple(out)
