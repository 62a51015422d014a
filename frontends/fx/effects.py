"""What a call does beyond computing its value, as ingest must know it: whether it
updates its first operand in place (by its spelling, or by the schema of an aten
overload), what its out-of-place twin is, whether torch's op schemas say it is functional,
and whether running it on constants is pure (nothing written into an argument, no random
draw), so that ingest may run it once and keep its result.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from egraph.moved import moved_names
from egraph.ops.table import UNKNOWN_VALUE
from frontends.fx.recorded import recorded_value, same_storage, storage_key
from frontends.fx.vocabulary import IMPURE

_AUGMENTED = {operator.iadd: operator.add, operator.isub: operator.sub,
              operator.imul: operator.mul, operator.itruediv: operator.truediv,
              operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
              operator.ipow: operator.pow, operator.imatmul: operator.matmul,
              operator.iand: operator.and_, operator.ior: operator.or_,
              operator.ixor: operator.xor, operator.ilshift: operator.lshift,
              operator.irshift: operator.rshift}
"""Augmented assignments (``x += y``) as dynamo and symbolic tracing record them, and their
out-of-place twins: on a tensor they update it in place, on a number they make a new one."""


def generator_state_inputs(gm: fx.GraphModule) -> dict[int, torch.device]:
    """The positions of the inputs that a graph reads as a random generator's state, each
    with the device of the op it replays: the state an aot backward graph replays a random
    op from (``run_with_rng_state``, in activation checkpointing). Such an input holds a
    state, not data: random bytes are no state at all ("Invalid mt19937 state"), so it is
    given a real one (:func:`generator_state`) and never drawn. (The state of a CUDA
    generator is a CPU tensor too: the op's device says whose it is.)

    >>> g = fx.Graph()
    >>> state, x = g.placeholder("state"), g.placeholder("x")
    >>> _ = g.output(g.call_function(torch.ops.higher_order.run_with_rng_state,
    ...                              (state, torch.ops.aten.rand_like.default, x)))
    >>> generator_state_inputs(fx.GraphModule({}, g))
    {0: device(type='cpu')}
    """
    replay = torch.ops.higher_order.run_with_rng_state
    devices: dict[fx.Node, torch.device] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is replay and n.args:
            operands = (recorded_value(a) for a in n.args[2:])
            devices[n.args[0]] = next((v.device for v in operands
                                       if isinstance(v, torch.Tensor)), torch.device("cpu"))
    placeholders = (n for n in gm.graph.nodes if n.op == "placeholder")
    return {i: devices[n] for i, n in enumerate(placeholders) if n in devices}


def generator_state(device: torch.device) -> torch.Tensor:
    """The state of the default generator of ``device``, a valid value for an input
    :func:`generator_state_inputs` names.

    >>> generator_state(torch.device("cpu")).equal(torch.get_rng_state())
    True
    """
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def is_in_place(node: fx.Node, module: nn.Module | None = None) -> bool:
    """Whether a call updates its first operand in place, by its spelling: ``x.add_(y)``,
    ``torch.relu_(x)``, ``inplace=True``, ``x += y`` or ``x[i] = y`` on a tensor (ingest
    makes such a call out of place and rebinds the name), or each tensor of its first
    operand (``torch._foreach_add_(xs, 1)``, which ingest splits per tensor first).

    >>> gm = fx.symbolic_trace(lambda x: x.mul_(2).exp())
    >>> [is_in_place(n) for n in gm.graph.nodes if n.op == "call_method"]
    [True, False]
    """
    if (node.op == "call_function" and node.target in _AUGMENTED or _is_setitem(node)):
        value = recorded_value(node.args[0]) if node.args else None
        return value is None or isinstance(value, torch.Tensor)
    if node.op == "call_method":
        name = node.target
        return name.endswith("_") and not name.startswith("_")
    if node.op == "call_function":
        if node.kwargs.get("inplace"):
            return True
        if isinstance(node.target, torch._ops.OpOverload):
            return _aten_out_of_place(node.target) is not None
        name = getattr(node.target, "__name__", "")
        if not name.endswith("_") or "torch" not in str(getattr(node.target, "__module__", "")):
            return False
        return not name.startswith("_") or (
            name.startswith("_foreach_") and getattr(torch, name, None) is node.target)
    if node.op == "call_module":
        return bool(getattr(module, "inplace", False))
    return False


def _is_setitem(node: fx.Node) -> bool:
    """``x[index] = value``: dynamo's ``operator.setitem``, or the method."""
    return (node.op == "call_function" and node.target is operator.setitem) or (
        node.op == "call_method" and node.target == "__setitem__")


def _aten_out_of_place(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional twin of an aten overload that writes into its first argument
    (``aten.add_.Tensor`` -> ``aten.add.Tensor``, as torch.export keeps T5's ``+=`` on an
    intermediate), or None for any other overload."""
    schema = target._schema
    first = schema.arguments[0] if schema.arguments else None
    name = schema.name.split("::")[-1]
    if first is None or first.alias_info is None or not first.alias_info.is_write or (
            not name.endswith("_") or name.startswith("_")):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def out_of_place(node: fx.Node):
    """The out-of-place twin of an in-place call (``add_`` -> ``add``), else the target.

    >>> gm = fx.symbolic_trace(lambda x: torch.relu_(x.mul_(2)))
    >>> [getattr(out_of_place(n), "__name__", out_of_place(n))
    ...  for n in gm.graph.nodes if n.op.startswith("call")]
    ['mul', 'relu']
    """
    target = node.target
    if node.op == "call_function" and target in _AUGMENTED:
        return _AUGMENTED[target]
    if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        return _aten_out_of_place(target) or target
    if node.op == "call_method":
        return target[:-1] if is_in_place(node, None) and not _is_setitem(node) else target
    name = getattr(target, "__name__", "")
    if is_in_place(node, None) and name.endswith("_"):
        for namespace in (torch, F):
            twin = getattr(namespace, name[:-1], None)
            if twin is not None:
                return twin
    return target


def is_functional(target: Any, method: bool = False) -> bool:
    """True for a call whose result depends only on its arguments, by torch's op schemas:
    an aten operator that mutates nothing and draws no random numbers (``aten.arange``,
    ``aten._assert_tensor_metadata``, ``aten.to.dtype_layout``), or a torch function or
    Tensor method (``method``: ``target`` is the method's name) whose aten namesake's
    overloads, ``out=`` ones aside, all are so and return something (dynamo's
    ``torch.cumsum``, ``x.index_add``; not ``torch.empty_like``, whose values are whatever
    the memory held). Equal calls may then be shared and unused ones dropped.

    >>> is_functional(torch.ops.aten.arange.default), is_functional(torch.ops.aten.add_.Tensor)
    (True, False)
    >>> is_functional(torch.ops.aten.rand.default), is_functional(print)
    (False, False)
    >>> is_functional(torch.cumsum), is_functional("index_add", method=True)
    (True, True)
    >>> is_functional("bernoulli", method=True), is_functional("backward", method=True)
    (False, False)
    >>> is_functional(F.batch_norm)              # updates its running statistics in training
    False
    """
    if isinstance(target, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded in target.tags or (
                target._schema.name.split("::")[-1] in _UNMARKED_UPDATES):
            return False
        return not target._schema.is_mutable
    name = _torch_name(target, method)
    return isinstance(name, str) and _functional_namesake(name)


def foldable_call(target: Any) -> bool:
    """Whether an opaque call of ``target`` may be computed once for given operands: an
    ATen operator that is functional and draws no random numbers (``aten.cumsum``,
    ``aten.diff``; not ``aten.rand``, ``aten.add_``, nor a Python function). Emission
    folds such a call of folded values (:mod:`backends.folding`), and the peak-memory
    replay (:mod:`extractors.peak`) counts it as emission runs it.

    >>> foldable_call(torch.ops.aten.cumsum.default), foldable_call(torch.ops.aten.rand.default)
    (True, False)
    """
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


def draws_random(target: Any, method: bool = False) -> bool:
    """Whether a call draws random numbers whatever its arguments, by torch's op schemas
    (the ``nondeterministic_seeded`` tag, on an op with no argument that turns the
    drawing off): an aten operator so tagged, or a torch function or Tensor method
    (``method``: ``target`` is the name) with such an aten namesake. Such a call is never
    shared, folded or dropped, and validation judges its program against the source
    under one seed.

    >>> draws_random(torch.randperm), draws_random("uniform_", method=True)
    (True, True)
    >>> draws_random(torch.ops.aten.normal.Tensor_float), draws_random(torch.add)
    (True, False)
    >>> draws_random(torch.nn.functional.scaled_dot_product_attention)  # dropout_p
    False
    """
    if isinstance(target, torch._ops.OpOverload):
        return _draws_whatever_its_arguments(target)
    if not method:
        module = getattr(target, "__module__", None) or ""
        if not (module == "torch" or module.startswith(_TORCH_MODULES)):
            return False
        target = getattr(target, "__name__", None)
    return isinstance(target, str) and _random_namesake(target)


@functools.cache
def _random_namesake(name: str) -> bool:
    return any(_draws_whatever_its_arguments(o) for o in _tensor_overloads(name))


def _draws_whatever_its_arguments(op: torch._ops.OpOverload) -> bool:
    """Tagged random, and not only where an argument asks for it: a dropout, attention's
    ``dropout_p``, an RNN's dropout between layers and rrelu draw only in training (the
    ingest of dropouts and of dropout modules tells those apart)."""
    return torch.Tag.nondeterministic_seeded in op.tags and not any(
        a.name in _DRAWS_WHEN for a in op._schema.arguments)


_DRAWS_WHEN = frozenset({"train", "training", "dropout_p", "dropout"})


def _torch_name(target: Any, method: bool) -> str | None:
    """The name of a torch function (its aten namesake's) or of a Tensor method
    (``method``: ``target`` is the name); None for a callable torch does not own."""
    if method:
        return target
    return getattr(target, "__name__", None) if torch_owned(target) else None


_UNMARKED_UPDATES = frozenset({"batch_norm", "native_batch_norm", "instance_norm",
                               "_batch_norm_impl_index", "cudnn_batch_norm",
                               "miopen_batch_norm"})
"""aten ops whose schemas mark no argument as written, yet which update the running
statistics they are given in training (``F.batch_norm(x, mean, var, training=True)``):
effects, never shared or dropped."""


@functools.cache
def _functional_namesake(name: str) -> bool:
    """Whether aten's op of this name is functional in every overload but ``out=`` ones,
    and returns something (:func:`is_functional`); once per name, not per call."""
    if name in UNINITIALISED or name in _UNMARKED_UPDATES or name.endswith("_"):
        return False
    overloads = _tensor_overloads(name)
    return bool(overloads) and all(
        is_functional(o) and o._schema.returns for o in overloads)


def _tensor_overloads(name: str) -> list[torch._ops.OpOverload]:
    """aten's overloads of ``name`` that a call on tensors may dispatch to: not ``out=``
    ones, nor TorchScript's on lists (:func:`_writes`)."""
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return []
    # (getattr, not the packet's __getattr__: that makes a new overload object in place of
    # the one graphs and the vocabulary hold, which compare by identity)
    return [o for o in (getattr(packet, each) for each in packet.overloads())
            if not any(_writes(a) and (a.kwarg_only or isinstance(a.type, torch.ListType))
                       for a in o._schema.arguments)]


def returns_new_tensors(target: Any, method: bool = False) -> bool:
    """True for a call whose results are tensors of their own, by torch's op schemas: an
    aten operator whose returns alias no argument, or a torch function or Tensor method
    (``method``: ``target`` is the name) whose aten namesake's overloads all are so (two
    equal calls are then two tensors, which a caller may write into apart).

    >>> returns_new_tensors(torch.ops.aten.sort.default), returns_new_tensors(torch.flip)
    (True, True)
    >>> returns_new_tensors("new_zeros", method=True), returns_new_tensors(torch.ops.aten.t.default)
    (True, False)
    """
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.returns) and all(
            r.alias_info is None for r in target._schema.returns)
    name = _torch_name(target, method)
    return isinstance(name, str) and _new_namesake(name)


@functools.cache
def _new_namesake(name: str) -> bool:
    overloads = [o for o in _tensor_overloads(name) if o._schema.returns]
    return bool(overloads) and all(returns_new_tensors(o) for o in overloads)


def _writes(argument: torch.Argument) -> bool:
    """Whether a schema argument is written into. ``out=`` arguments (keyword-only) and
    lists (TorchScript's ``list.sort``, an overload of ``aten::sort``) are what
    :func:`_functional_namesake` sets aside: a call on tensors never dispatches to them."""
    return argument.alias_info is not None and argument.alias_info.is_write


UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided",
                           "new_empty_strided", "empty_permuted"})
"""Allocations whose values are whatever the memory held: never shared, never dropped."""


def aten_name(node: fx.Node) -> str | None:
    """The aten name of the call ``node`` (``empty_like`` for ``torch.empty_like``,
    ``aten.empty_like.default`` and ``x.new_empty``'s method name alike), or None.

    >>> gm = fx.symbolic_trace(lambda x: torch.empty_like(x).copy_(x))
    >>> [aten_name(n) for n in gm.graph.nodes if n.op.startswith("call")]
    ['empty_like', 'copy_']
    """
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target.overloadpacket.__name__
    if node.op not in ("call_function", "call_method"):
        return None
    return _torch_name(node.target, node.op == "call_method")


def leaves_memory_unwritten(gm: fx.GraphModule) -> bool:
    """Whether the graph allocates a tensor of whatever the memory held
    (:data:`UNINITIALISED`): the elements it does not write differ from run to run.

    >>> leaves_memory_unwritten(fx.symbolic_trace(lambda x: torch.empty_like(x)[0]))
    True
    """
    return any(aten_name(n) in UNINITIALISED for n in gm.graph.nodes)


def torch_owned(target: Any) -> bool:
    """Whether ``target`` is torch's own (an aten overload, a torch function, a Python
    operator), so that running it on constants at ingest runs nothing of the user's.

    >>> torch_owned(torch.diff), torch_owned(torch.ops.aten.index.Tensor), torch_owned(print)
    (True, True, False)
    """
    if target in IMPURE:
        return False
    if isinstance(target, torch._ops.OpOverload):
        return True
    module = getattr(target, "__module__", None) or ""
    return module in ("torch", "_operator") or module.startswith(_TORCH_MODULES)


_TORCH_MODULES = ("torch.nn.functional", "torch.functional", "torch.linalg", "torch.fft",
                  "torch.special", "torch._C._nn", "torch._C._linalg", "torch._C._fft",
                  "torch._C._special")
"""Modules of torch's own functions (``torch.linalg.vector_norm`` is
``torch._C._linalg``'s)."""


def sees_rng_replays(mode: type[TorchDispatchMode]) -> type[TorchDispatchMode]:
    """Class decorator: under a ``mode`` of this class, the calls of activation
    checkpointing's ``run_and_save_rng_state`` and ``run_with_rng_state`` (in aot graphs)
    run their random op through the mode as any other op, where a higher-order op under a
    dispatch mode without an implementation of its own raises NotImplementedError.

    >>> @sees_rng_replays
    ... class Seen(TorchDispatchMode):
    ...     def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    ...         print(func)
    ...         return func(*args, **(kwargs or {}))
    >>> x = torch.zeros(2)
    >>> with Seen():
    ...     _ = torch.ops.higher_order.run_and_save_rng_state(torch.ops.aten.rand_like.default, x)
    aten.rand_like.default
    """
    for name in ("run_and_save_rng_state", "run_with_rng_state"):
        replay = getattr(torch.ops.higher_order, name)
        replay.py_impl(mode)(functools.partial(_replayed_under, replay))
    return mode


def _replayed_under(replay, mode: TorchDispatchMode, *args, **kwargs) -> Any:
    """``replay``'s call on its device, its op seen by ``mode`` (which torch has popped)."""
    with mode:
        return replay.py_kernels[torch._C.DispatchKey.BackendSelect](*args, **kwargs)


@sees_rng_replays
class _WriteWatch(TorchDispatchMode):
    """Notes whether an aten op run under it writes into a tensor of ``storages`` (the
    arguments' storages, as :func:`~frontends.fx.recorded.storage_key` keys them), draws
    random numbers or updates running statistics its schema does not mark."""

    def __init__(self, storages: set):
        super().__init__()
        self.storages = storages
        self.pure = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags or (
                func._schema.name.split("::")[-1] in _UNMARKED_UPDATES):
            self.pure = False
        elif func._schema.is_mutable:
            bound = list(zip(func._schema.arguments, args))
            bound += [(a, kwargs[a.name]) for a in func._schema.arguments if a.name in kwargs]
            for schema, value in bound:
                if _writes(schema) and (key := storage_key(value)) is not None and (
                        key in self.storages):
                    self.pure = False
        return func(*args, **kwargs)


def _watched(target: Callable, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """``target(*args, **kwargs)`` and whether the run was pure (:class:`_WriteWatch`)."""
    storages: set = set()
    fx.node.map_aggregate((args, kwargs), lambda a: storages.add(storage_key(a)))
    storages.discard(None)
    watch = _WriteWatch(storages)
    with watch, torch.no_grad():
        result = target(*args, **kwargs)
    return result, watch.pure


def dispatches_functionally(node: fx.Node,
                            example: Callable[[fx.Node], Any] = recorded_value) -> bool:
    """Whether a call of a torch function that has no aten namesake (``F.interpolate``,
    which dispatches to ``upsample_*``) is functional, by the aten ops it dispatches to
    when run on the example values of its arguments (``example``: by default the values
    the tracer recorded, fake tensors; None where unknown): none draws random numbers or
    writes into an argument (:func:`run_pure`'s watch), and it takes and returns tensors
    (``torch._assert`` and ``torch.set_default_dtype`` are there for what else they do).
    Its arguments other than tensors are the call's own, so the ops are the ones every
    run dispatches to.

    >>> gm = torch.fx.symbolic_trace(lambda x: F.interpolate(x, scale_factor=2.0))
    >>> shaped = lambda a: torch.empty(1, 2, 4, 4, device="meta")
    >>> [dispatches_functionally(n, shaped) for n in gm.graph.nodes if n.op == "call_function"]
    [True]
    """
    if node.op != "call_function" or not torch_owned(node.target) or hasattr(
            torch.ops.aten, getattr(node.target, "__name__", "")):
        return False
    missing = []

    def value(a):
        if not isinstance(a, fx.Node):
            return a
        known = example(a)
        if known is None:
            missing.append(a)
        return known
    args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), value)
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    if missing or not any(isinstance(a, torch.Tensor) for a in leaves):
        return False  # (a call on no tensor changes the process: torch.set_default_dtype)
    from torch._subclasses.fake_tensor import FakeTensor

    # (the values' own mode: the tracing context's may be another one)
    fakes = [a for a in leaves if isinstance(a, FakeTensor)]
    mode = fakes[0].fake_mode if fakes else None
    if mode is None:  # (real tensors: their shapes alone, on the meta device)
        mode = contextlib.nullcontext()
        args, kwargs = fx.node.map_aggregate(
            (args, kwargs), lambda a: a.to("meta") if isinstance(a, torch.Tensor) else a)
    try:
        with mode:
            result, pure = _watched(node.target, args, kwargs)
    except Exception:  # noqa: BLE001 - not known to be functional: the call stays an effect
        return False
    # (a call whose value is not a tensor is there for what else it does: torch._assert)
    values = result if isinstance(result, (tuple, list)) else (result,)
    return pure and bool(values) and all(isinstance(v, torch.Tensor) for v in values)


def run_pure(target: Callable, args: tuple, kwargs: dict) -> Any:
    """``target(*args, **kwargs)`` run on copies of its tensor arguments, or
    :data:`UNKNOWN_VALUE` when the run is not pure: it raised, drew random numbers, or
    wrote into an argument (by the schemas of the aten ops it dispatched to: ``new_ones``
    fills a tensor it made, which is pure; ``add_`` on its argument is not). A tensor
    result is a copy, sharing no storage with the arguments.

    >>> x = torch.arange(4)
    >>> run_pure(torch.diff, (x,), {}), run_pure(torch.Tensor.add_, (x, 1), {})
    (tensor([1, 1, 1]), <unknown>)
    >>> run_pure(torch.rand, (2,), {})
    <unknown>
    """
    copies = fx.node.map_aggregate(
        (args, kwargs), lambda a: a.clone() if isinstance(a, torch.Tensor) else a)
    try:
        result, pure = _watched(target, *copies)
    except Exception:  # noqa: BLE001 - not foldable here: the call stays
        return UNKNOWN_VALUE
    if not pure:
        return UNKNOWN_VALUE
    return result.clone() if isinstance(result, torch.Tensor) else result


def updates_an_input(n: fx.Node) -> bool:
    """Whether a call changes a graph input in place (``x.add_(y)``, ``torch.relu_``,
    ``x[i] = y``, ``x.t().add_(1)``, ``inplace=True``, ``out=``, ``aten.copy_``), as the
    storages of the values the tracer recorded tell (True where none is recorded); ingest
    makes an in-place op on the graph's own values out of place, but an input must really
    change.

    >>> gm = fx.symbolic_trace(lambda x: x.t().add_(1))
    >>> [updates_an_input(n) for n in gm.graph.nodes]  # (a symbolic trace records none)
    [False, False, True, False]
    """
    if n.op not in ("call_function", "call_method"):
        return False
    if n.kwargs.get("out") is not None:
        return True
    if not is_in_place(n) or not n.args:
        return False
    written = n.args[0] if isinstance(n.args[0], (list, tuple)) else (n.args[0],)
    storages = [storage_key(recorded_value(a)) for a in written]
    if any(storage is None for storage in storages):
        return True
    for p in n.graph.nodes:
        if p.op != "placeholder":
            break
        if any(same_storage(recorded_value(p), storage) for storage in storages):
            return True
    return False


def updates_inputs(graph: fx.Graph) -> bool:
    """Whether a call of ``graph`` changes one of its inputs in place
    (:func:`updates_an_input`): its runs must not be given the caller's own tensors, and
    what they leave must be compared.

    >>> updates_inputs(fx.symbolic_trace(lambda x: x.t().add_(1)).graph)
    True
    """
    return any(map(updates_an_input, graph.nodes))


def updates_an_alias(graph: fx.Graph) -> bool:
    """Whether an in-place call in ``graph`` updates a tensor whose storage another value
    read later shares (a view taken before an update of its base, or the base of a view
    updated in place), by the storages of the values the tracer recorded: making the
    call out of place and rebinding its operand, as ingest does, leaves that other value
    stale.

    >>> class Scaled(torch.nn.Module):
    ...     def forward(self, x):
    ...         h = x * 2
    ...         h[:, :1].mul_(3)  # through a view: h must see it
    ...         return h + (x * 2).mul_(3)  # an intermediate nothing else shares
    >>> program = torch.export.export(Scaled(), (torch.randn(2, 2),))
    >>> updates_an_alias(program.graph)
    True
    >>> updates_an_alias(program.run_decompositions({}).graph)
    False
    """
    def storage(node: fx.Node):
        return storage_key(recorded_value(node))

    order = {n: i for i, n in enumerate(graph.nodes)}
    sharing: dict[Any, list[fx.Node]] = {}
    for n in graph.nodes:
        if (key := storage(n)) is not None:
            sharing.setdefault(key, []).append(n)
    for n in graph.nodes:
        if n.op not in ("call_function", "call_method") or not is_in_place(n) or (
                not n.args or not isinstance(n.args[0], fx.Node)) or (
                key := storage(n.args[0])) is None:
            continue
        tensor = tensor_of(n.args[0])
        for other in sharing.get(key, ()):
            if other not in (n, n.args[0]) and tensor_of(other) is not tensor and (
                    order[other] < order[n]) and any(order[user] > order[n]
                                                     for user in other.users):
                return True
    return False


def tensor_of(node: Any) -> Any:
    """The node whose tensor ``node`` is: an in-place call returns its operand
    (``b.mul_(0.9).addcmul_(g, g)``, Adam's spelling, updates ``b`` twice), so the chain
    is followed down to the first operand that no in-place call made.

    >>> gm = fx.symbolic_trace(lambda b: b.mul_(0.9).add_(1) * 2)
    >>> [tensor_of(n).name for n in gm.graph.nodes if n.op != "output"]
    ['b', 'b', 'b', 'mul']
    """
    while isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and (
            node.args and isinstance(node.args[0], fx.Node) and is_in_place(node)
            and not _is_setitem(node)):
        node = node.args[0]
    return node


MOVED = {**dict.fromkeys(["recorded_key", "recorded_parts"], "frontends.fx.recorded"),
         **dict.fromkeys(["attributes_kept", "generators_kept", "generators_of",
                          "written_attributes"], "frontends.fx.kept")}
"""Names that moved out of this module, by their new module (``recorded_value`` moved to
:mod:`frontends.fx.recorded` too, and is read here)."""


__getattr__ = moved_names(__name__, MOVED)
