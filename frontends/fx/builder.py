"""The builder: the last pass of ingest walks the FX graph once and adds each node's
canonical expression (:class:`~frontends.fx.terms.TermBuilder`), reading the metadata,
declared and observed ranges the passes before it made. Module calls are lowered to
functional ops over parameter leaves; calls it does not model, and impure ones, become
opaque e-nodes chained in their original order; in-place updates of the graph's own values
are made out of place, and later reads of every name of the tensor read the update.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from egraph.dims import is_symbolic
from egraph.egraph import EGraph
from egraph.ops.table import TABLE
from egraph.term import literal
from frontends.fx.analysis import Meta
from frontends.fx.effects import (
    dispatches_functionally,
    draws_random,
    is_functional,
    is_in_place,
    out_of_place,
    returns_new_tensors,
    run_pure,
    tensor_of,
    torch_owned,
)
from frontends.fx.exported import attribute_at, is_input_guards
from frontends.fx.recorded import recorded_value
from frontends.fx.source import (
    AttributeRef,
    ClassRef,
    ContiguousRef,
    OpaqueCall,
    OutputRef,
    WrittenRef,
)
from frontends.fx.terms import TermBuilder
from frontends.fx.tracing import UntraceableModel
from frontends.fx.vocabulary import (
    IMPURE,
    SCALAR_FUNCTIONS,
    UNKNOWN_VALUE,
    is_expression,
    lower,
    module_op,
)

__all__ = ["Builder", "UpdateThroughView"]


class UpdateThroughView(Exception):
    """The builder met an in-place update that a view shares (:meth:`Builder.run` raises it
    where ``follows_views``): rebinding the updated name would leave the view stale."""

    def __init__(self, node: fx.Node):
        super().__init__(node.name)
        self.node = node


class Builder(TermBuilder):
    """Walks the FX graph ``gm`` once and adds each node's canonical expression, from the
    ``metas`` of its nodes (:func:`frontends.fx.metadata.node_metas`, with the declared
    ranges) and the ranges ``observed`` on the example inputs
    (:func:`frontends.fx.ranges.observe_ranges`, with the causal masks computed from sizes,
    :func:`frontends.fx.sized.sized_triangles`); ``param_names`` names the inputs that
    hold parameters, ``lifted_constants`` torch.export's lifted tensor constants
    (``torch.tensor(-1e9)`` in a forward, a mask captured from outside it: constants of
    the program, by placeholder name). ``observe``: parameters' ranges are measured too
    (they inform the curvature cost). ``follows_views``: an in-place update a view shares
    stops the walk with :class:`UpdateThroughView`.

    >>> gm = fx.symbolic_trace(lambda x: torch.exp(x) * 2)
    >>> builder = Builder(gm, {"x": Meta("tensor", shape=(3,), dtype=torch.float32)}, {})
    >>> builder.run()
    >>> builder.inputs, [builder.eg.data(c.cid).shape for c in [builder.output]]
    (['x'], [(3,)])
    """

    def __init__(self, gm: fx.GraphModule, metas: dict[str, Meta], param_names: dict[str, str],
                 make_egraph: Callable[..., EGraph] = EGraph, observe: bool = True,
                 observed: dict[str, dict] | None = None,
                 lifted_constants: dict[str, torch.Tensor] | None = None,
                 follows_views: bool = False):
        super().__init__(make_egraph)
        self.gm = gm
        self.observe = observe
        self.metas = metas
        self.param_names = param_names
        self.lifted_constants = lifted_constants or {}
        self.observed = observed or {}
        self.follows_views = follows_views
        self.opaque: dict[str, OpaqueCall] = {}
        self.effect: int | None = None
        self.effects: list[int] = []
        self.inputs: list[str] = []
        self.input_classes: list[int] = []
        self.output: Any = None
        self.random = False
        self.origins: dict[int, str] = {}
        self.lowered_ops: dict[fx.Node, str] = {}  # the op each modelled call became
        self._order: dict[fx.Node, int] = {}
        # an input (its node) or attribute (its name) updated in place -> the nodes that
        # are its tensor: its reads (a symbolic trace reads ``self.b`` afresh, by a new
        # get_attr, each time) and what in-place calls of it returned
        self.aliases: dict[fx.Node | str, list[fx.Node]] = {}

    def _fold_call(self, node: fx.Node) -> int | None:
        """A constant leaf for a call the vocabulary does not model (``torch.diff``,
        ``Tensor.new_ones``, ``aten.index.Tensor``) whose arguments are all constants, when
        running it on them is pure (:func:`run_pure`); None otherwise. transformers builds
        a decoder's causal mask this way from position ids: folded, no call computes it.
        A tensor must be among the arguments, but for the tensors made of numbers
        (``torch.tensor(-1e9)``): torch's functions of literals alone include ones that set
        global state (``torch.set_default_dtype``), which the dispatcher never sees."""
        if node.op == "call_method":
            def target(obj, *args, **kwargs):
                return getattr(obj, node.target)(*args, **kwargs)
        elif node.op == "call_function" and torch_owned(node.target):
            target = node.target
        else:
            return None
        values: list = []

        def value(a):
            if isinstance(a, fx.Node):
                cid = self.env.get(a)
                a = self.constant_value(cid) if isinstance(cid, int) else UNKNOWN_VALUE
            values.append(a)
            return a

        args = fx.node.map_aggregate(node.args, value)
        kwargs = fx.node.map_aggregate(node.kwargs, value)
        if any(v is UNKNOWN_VALUE for v in values) or kwargs.get("requires_grad") or not (
                target in _TENSORS_OF_LITERALS or any(
                    isinstance(v, torch.Tensor) for v in values)):
            return None
        return self.folded_from(lambda: run_pure(target, args, kwargs), values)


    def _example(self, node: fx.Node) -> Any:
        """An example of ``node``'s value: the tracer's, else a meta tensor of its shape
        and dtype (a symbolic trace records none), or None."""
        recorded = recorded_value(node)
        if recorded is not None:
            return recorded
        meta = self.metas.get(node.name)
        if meta is None or meta.kind != "tensor" or meta.shape is None or is_symbolic(
                meta.shape):
            return None
        return torch.empty(meta.shape, dtype=meta.dtype, device="meta")

    def opaque_call(self, node: fx.Node, random: bool = False) -> int:
        """Keep ``node`` as is: a unique token, chained after the previous opaque call.

        ``random``: the call draws random numbers (validation then compares under a seed).
        A call that torch's op schema says is functional (:func:`is_functional`) is pure
        instead: keyed by its target and arguments, so equal calls share one class (CSE),
        and outside the effect chain, so an unused one is dropped.
        """
        if not random:
            folded = self._fold_call(node)
            if folded is not None:
                return folded
        self.random = self.random or random
        # an in-place update of a value the graph made (``a.index_put_(...)``): made on a
        # copy, so that a class it shares (``x * 2`` computed twice) keeps its values; a
        # leaf's update stays the source's call
        copied = node.op != "call_module" and is_in_place(node) and not _updates_a_leaf(node)
        pure = not random and node.op != "call_module" and (is_functional(
            out_of_place(node) if copied else node.target, method=node.op == "call_method")
            or not copied and dispatches_functionally(node, self._example)
            or _reads_a_tensor_attribute(node))
        token = node.name
        arg_classes: list[int] = []
        # (aten's kernels may assume the layout they were given, where torch's functions
        # and pointwise kernels take any: group norm's take the contiguous tensors made by
        # clones that ingest drops)
        layout_bound = pure and isinstance(node.target, torch._ops.OpOverload) and (
            torch.Tag.pointwise not in node.target.tags)

        def mark(a):
            if isinstance(a, fx.Node):
                value = self.value(a)
                if isinstance(value, AttributeRef):
                    return value
                arg_classes.append(value)
                if copied and len(arg_classes) == 1 and node.args and a is node.args[0]:
                    return WrittenRef(value)
                if (layout_bound and _makes_layout(a) or random) and self._contiguous(a):
                    # (a random op draws in its operand's memory order: dropout of a
                    # rewritten, permuted operand would give other elements eager's mask)
                    return ContiguousRef(value)
                return ClassRef(value)
            return a

        args = fx.node.map_aggregate(node.args, mark)
        kwargs = fx.node.map_aggregate(node.kwargs, mark)
        if node.target is F.multi_head_attention_forward:
            args, kwargs = _weights_unasked(node, args, kwargs)
        if pure:
            token = f"{node.target}{args!r}{sorted(kwargs.items())!r}"
        updates = self.env[node.args[0]] if not pure and _updates_a_leaf(
            node, self._module(node)) else None
        updates = updates if isinstance(updates, int) else None
        self.opaque.setdefault(token, OpaqueCall(node.op, node.target, args, kwargs, node.name,
                                                 pure, updates))
        meta = self.metas.get(node.name)
        if meta is None and updates is not None:  # (``x[i] = v`` returns nothing: it is x)
            meta = self.eg.data(updates)
        if meta is not None:
            self.analysis.leaves.setdefault(f"opaque:{token}", meta)
        eg = self.eg
        none = eg.add_node(literal(None))
        prev = none if pure or self.effect is None else self.effect
        cid = eg.add_node("opaque", [eg.add_node(literal(token)), prev, *arg_classes])
        if not pure:
            self.effect = cid
        return cid

    # -- the walk -------------------------------------------------------------------------

    def run(self) -> None:
        """Add every node of the graph in order, then the effect chain's last call."""
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                constant = self.lifted_constants.get(node.name)
                if constant is not None:
                    cid = self.folded_constant(constant)
                    if cid is not None:
                        self.env[node] = cid
                        continue
                if node.name in self.param_names:
                    self.env[node] = self.leaf("param", self.param_names[node.name],
                                               self.metas.get(node.name))
                    continue
                self.inputs.append(node.name)
                cid = self.leaf("input", node.name, self.metas.get(node.name))
                self.input_classes.append(cid)
                self.env[node] = cid
            elif node.op == "get_attr":
                self.env[node] = self.get_attr(node)
            elif not node.users and is_input_guards(self._module(node)):
                continue  # (torch's check of the inputs: emission checks them itself)
            elif node.op == "output":
                self.output = fx.node.map_aggregate(node.args[0], self._out)
            else:
                self.env[node] = self.call(node)
                self.origins.setdefault(self.env[node], _location(node))
                seen = self.observed.get(node.name)
                meta = self.eg.data(self.env[node])
                if seen and meta is not None and meta.kind == "tensor":
                    self.eg.set_data(self.env[node], meta._replace(
                        lo=max(meta.lo, seen.get("lo", -math.inf)),
                        hi=min(meta.hi, seen.get("hi", math.inf)),
                        small=max(meta.small, seen.get("small", 0.0)),
                        sens=seen.get("sens", meta.sens),
                        triangle=seen.get("triangle", meta.triangle)))
                if is_in_place(node, self._module(node)) and node.args and isinstance(
                        node.args[0], fx.Node):
                    target = node.args[0]
                    leaf = _leaf_of(target)
                    if self.follows_views and self._shared_update(leaf or target, node):
                        raise UpdateThroughView(node)
                    # later reads of every name of the tensor read the update (of a
                    # leaf: the source's call, kept in order): ``d = h.sqrt_(); q =
                    # d.div_(s); q.mul_(g)`` leaves ``h``, ``d`` and ``q`` one tensor
                    base = tensor_of(target)
                    names = self.aliases.setdefault(
                        base.target if base.op == "get_attr" else base, [])
                    if base not in names:
                        names.append(base)
                    names += [n for n in (target, node) if n not in names]
                    for alias in names:
                        self.env[alias] = self.env[node]
        if self.effect is not None:
            self.effects.append(self.effect)

    def _shared_update(self, target: fx.Node, update: fx.Node) -> bool:
        """Whether the in-place ``update`` of ``target`` changes a value that shares its
        storage, which rebinding ``target`` to the out-of-place result would leave stale:
        ``target`` is a view of another value (``to`` and ``contiguous`` may return their
        input, and an unmodelled call may return a view), or a view of ``target`` taken
        before the update is read after it (also where ``target`` is an input or parameter,
        whose update stays in place: the e-graph would read that view as the old value)."""
        def shares(n: fx.Node) -> bool:
            op = self.lowered_ops.get(n)
            if op is None:
                return n.op in ("call_function", "call_method", "call_module") and not (
                    _is_clone(n))
            return not _makes_storage(op)

        if shares(target):
            return True
        if not self._order:
            self._order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        order = self._order
        # (a symbolic trace reads an attribute afresh at each ``self.b``: a view of any
        # read of it before the update shares its storage)
        views = [n for n in self._order if n.op == "get_attr" and n.target == target.target
                 and order[n] < order[update]] if target.op == "get_attr" else [target]
        seen = set(views)
        while views:
            for user in views.pop().users:
                if user in seen or order[user] >= order[update] or not shares(user) or (
                        _same_leaf(_leaf_of(user), target)):
                    continue  # (an in-place call's result is the tensor itself: rebound)
                if any(order[reader] > order[update] for reader in user.users):
                    return True
                seen.add(user)
                views.append(user)
        return False

    def _out(self, arg):
        if isinstance(arg, fx.Node):
            maker, fresh = self._maker(arg)
            return OutputRef(self.env[arg], fresh, self._contiguous(arg), maker.name)
        return arg

    def _maker(self, node: fx.Node) -> tuple[fx.Node, bool]:
        """The node whose tensor the source's value of ``node`` lives in (``node``, or what
        it is a view of), and whether that is a tensor the source made, sharing no storage
        with an input, parameter or constant: made by a modelled op that is not a view
        (``to`` and ``contiguous`` may return their input), or a view of such a tensor;
        a call whose schema returns tensors of their own, modelled or opaque (aten's
        ``_to_copy``, ``torch.sort``, ``x.new_zeros``: two equal calls may be one class)."""
        while True:
            if _is_clone(node):
                return node, True
            op = self.lowered_ops.get(node)
            made = node.op in ("call_function", "call_method") and (
                returns_new_tensors(node.target, node.op == "call_method"))
            if op is None:  # a leaf, an opaque call, a value passed through (eval dropout)
                return node, made
            if made or _makes_storage(op):  # (aot's ``_to_copy`` is a cast that copies)
                return node, True
            base = next((a for a in node.args if isinstance(a, fx.Node)), None)
            if base is None:
                return node, False
            node = base

    def _contiguous(self, node: fx.Node) -> bool | None:
        """Whether the source's value of ``node`` was contiguous: from the example value
        torch.export and dynamo record, else from the run on the example inputs."""
        value = recorded_value(node)
        if isinstance(value, torch.Tensor):
            try:
                return bool(value.is_contiguous())
            except Exception:  # noqa: BLE001 - a data-dependent symbolic stride
                return None
        return self.observed.get(node.name, {}).get("contiguous")

    def _module(self, node: fx.Node) -> nn.Module | None:
        if node.op != "call_module":
            return None
        return self.gm.get_submodule(node.target)

    def get_attr(self, node: fx.Node) -> int | AttributeRef:
        """The class of a read of an attribute: a parameter leaf for a tensor, a literal,
        or a reference to any other object; after an update in place, the update."""
        names = self.aliases.get(node.target)
        if names:  # (read after an update in place: the updated value)
            latest = self.env[names[-1]]
            names.append(node)
            return latest
        value = attribute_at(self.gm, node.target)
        if isinstance(value, torch.Tensor):
            name = self.param_names.get(node.target, node.target)
            return self.leaf("param", name, Meta.of(value, self.observe))
        if isinstance(value, _LITERAL_TYPES):
            return self.literal(value)
        return AttributeRef(node.target)

    def call(self, node: fx.Node) -> int:
        """The class of a call: its canonical expression where the vocabulary models it,
        else an opaque call."""
        if _updates_a_leaf(node, self._module(node)):
            # an update of an input, parameter or buffer (``x.add_(1)``, BatchNorm's
            # ``num_batches_tracked``): the caller's tensor must change, so the call stays
            # the source's, in order; later reads use its result.
            return self.opaque_call(node)
        if node.op == "call_module":
            module = self._module(node)
            lowered = _lower_module(self, module, node)
            if lowered is None:
                return self.opaque_call(node, random=module.training and isinstance(
                    module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)))
            return lowered
        method = node.op == "call_method"
        if not method and node.target in _DROPOUTS:
            bound = _bind_dropout(*node.args, **node.kwargs)
            if not bound["train"] or bound["p"] == 0:
                return self.value(bound["input"])
            return self.opaque_call(node, random=True)
        if not method and node.target in IMPURE or draws_random(node.target, method):
            return self.opaque_call(node, random=True)
        if not method and node.target is getattr and node.args[1:] == ("dtype",):
            # ``x.dtype`` (``h.to(input_dtype)``): the dtype is known, a literal like any other.
            dtype = getattr(self.eg.data(self.value(node.args[0])), "dtype", None)
            if isinstance(dtype, torch.dtype):
                return self.literal(dtype)
        if (method and node.target in ("dim", "ndimension") or not method and (
                node.target is getattr and node.args[1:] == ("ndim",))) and node.args:
            # ``x.dim()``, ``x.ndim``: the rank, known here and the same at every size.
            shape = getattr(self.eg.data(self.value(node.args[0])), "shape", None)
            if shape is not None:
                return self.literal(len(shape))
        if node.target in ("type_as", torch.ops.aten.type_as.default) and len(node.args) == 2:
            # ``x.type_as(y)``: a conversion to y's dtype, known here.
            dtype = getattr(self.eg.data(self.value(node.args[1])), "dtype", None)
            if isinstance(dtype, torch.dtype):
                self.lowered_ops[node] = "to"
                return self.apply("to", [self.value(node.args[0]), self.literal(dtype)])
        if any(isinstance(a, complex) for a in torch.utils._pytree.tree_leaves(
                (node.args, node.kwargs))):
            return self.opaque_call(node)  # (``x * 1j``: literals are real numbers)
        args = tuple(self._dtype_or_arg(a) for a in node.args)
        kwargs = {k: self._dtype_or_arg(a) for k, a in node.kwargs.items()}
        destination = None if method else kwargs.pop("out", None)
        if node.target in _MOVES:
            args, kwargs = _on_own_device(node, args, kwargs)
        lowered = lower(out_of_place(node), args, kwargs, method=method)
        if lowered is None or (node.target in SCALAR_FUNCTIONS and not self._scalar(node.args)):
            if destination is not None:
                raise UntraceableModel(
                    f"{_location(node)} writes into {destination} with out=, "
                    "in a call that is not modelled; assign its result instead "
                    f"({destination} = ...)")
            return self.opaque_call(node)
        if is_expression(lowered):
            self.lowered_ops[node] = lowered[0]
        result = self.expr(lowered)
        if is_in_place(node) and node.args and isinstance(node.args[0], fx.Node):
            # (an update keeps its target's dtype: ``zeros(n).add_(x64)`` stays float32,
            # where ``add`` promotes; normflows' float64 mixture into a float32 log-density)
            result = self._in_dtype_of(result, self.env[node.args[0]])
        return result if destination is None else self._written_into(node, destination, result)

    def _in_dtype_of(self, result: int, target: int) -> int:
        """``result`` converted to the dtype of the class ``target`` where they differ."""
        have, want = self.eg.data(result), self.eg.data(target)
        if (have is not None and want is not None and isinstance(want.dtype, torch.dtype)
                and have.dtype != want.dtype):
            return self.apply("to", [result, self.literal(want.dtype)])
        return result

    def _written_into(self, node: fx.Node, out: Any, result: int) -> int:
        """``torch.add(a, b, out=c)``: the values land in ``c``, and later reads of ``c``
        read them, as for an in-place update (made out of place: ``c`` is rebound). Only a
        tensor the graph made itself, not a view of another, of the result's shape."""
        def refuse(why: str) -> UntraceableModel:
            return UntraceableModel(
                f"{_location(node)} writes into {out} with out=, {why}; "
                f"assign its result instead ({out} = ...)")
        if not isinstance(out, fx.Node):
            raise refuse("which is not one tensor")
        if out.op in ("placeholder", "get_attr"):
            raise refuse("a graph input or parameter, which the caller would see change")
        made = self.lowered_ops.get(out)
        if made is None or not _makes_storage(made):
            raise refuse("which may share storage with another tensor")
        have, want = self.eg.data(result), self.eg.data(self.env[out])
        if have is None or want is None or have.shape != want.shape:
            raise refuse("which it would resize")
        result = self._in_dtype_of(result, self.env[out])
        self.env[out] = result
        return result

    def _dtype_or_arg(self, arg):
        """A node known to be a dtype (``x.dtype`` above) as the dtype itself, so that the
        lowering of ``h.to(input_dtype)`` sees a dtype."""
        cid = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(cid, int):  # not an effect's output, nor a higher-order op's region
            for n in self.eg.nodes(cid):
                if isinstance(n.op, tuple) and n.op[0] == "dtype":
                    return getattr(torch, n.op[1])
        return arg

    def _scalar(self, args) -> bool:
        """True when every argument is a Python number or a class known to hold one."""
        for a in args:
            if isinstance(a, fx.Node):
                meta = self.eg.data(self.env[a])
                if meta is None or meta.kind not in ("literal", "scalar"):
                    return False
        return True


_TENSORS_OF_LITERALS = frozenset({torch.tensor, torch.scalar_tensor, torch.as_tensor})
"""torch's functions that make a new tensor of the numbers they are given."""

_TENSOR_ATTRIBUTES = frozenset({"device", "dtype", "layout", "is_cuda", "ndim", "shape"})


def _reads_a_tensor_attribute(node: fx.Node) -> bool:
    """``x.device`` in a symbolic trace: a read of one of a tensor's own attributes, pure
    (an unused one is dropped, equal ones shared)."""
    return (node.op == "call_function" and node.target is getattr and len(node.args) == 2
            and node.args[1] in _TENSOR_ATTRIBUTES)



_CLONES = (torch.clone, torch.ops.aten.clone.default, torch.ops.aten.lift_fresh_copy.default)
"""Call targets that copy their input (``Tensor.clone`` is the method): the op table models
them as the identity, but the source's result is a new tensor."""


def _is_clone(node: fx.Node) -> bool:
    """Whether the call ``node`` is a clone (a new tensor, whatever ingest makes of it)."""
    return (node.op == "call_method" and node.target == "clone") or (
        node.op == "call_function" and node.target in _CLONES)


def _makes_layout(node: fx.Node) -> bool:
    """Whether ``node`` is a call ingest replaces by its operand that may change the
    layout: a clone or ``contiguous`` (``clone(x, memory_format=contiguous_format)``)."""
    return _is_clone(node) or (node.op == "call_method" and node.target == "contiguous") or (
        node.op == "call_function" and node.target is torch.ops.aten.contiguous.default)


def _makes_storage(op: str) -> bool:
    """Whether the modelled op ``op`` returns a tensor of its own: not a view, nor ``to``
    (which returns its input where the dtype is already the one asked for)."""
    return op != "to" and TABLE[op].kind != "view"


def _updates_a_leaf(node: fx.Node, module: nn.Module | None = None) -> bool:
    """Whether the call ``node`` (of ``module``, for a module's call) updates a graph
    input, parameter or buffer in place (itself, or what an in-place call of it returned:
    ``b.mul_(0.9).addcmul_(g, g)``)."""
    return bool(is_in_place(node, module) and node.args and _leaf_of(node.args[0]) is not None)


def _same_leaf(a: fx.Node | None, b: fx.Node) -> bool:
    """Whether ``a`` reads the input or attribute ``b`` reads (a symbolic trace reads an
    attribute by a new get_attr each time)."""
    return a is not None and (a is b or a.op == b.op == "get_attr" and a.target == b.target)


def _leaf_of(value: Any) -> fx.Node | None:
    """The input, parameter or buffer whose tensor ``value`` is (:func:`tensor_of`)."""
    leaf = tensor_of(value)
    return leaf if isinstance(leaf, fx.Node) and leaf.op in ("placeholder", "get_attr") else None


_DROPOUTS = (F.dropout, torch.dropout, torch.ops.aten.dropout.default)
_MOVES = ("to", torch.ops.aten.to.device, torch.ops.aten.to.dtype_layout,
          torch.ops.aten._to_copy.default)
"""Calls that may move a tensor to a device (``Tensor.to`` and its aten overloads)."""


def _on_own_device(node: fx.Node, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of a move (:data:`_MOVES`) with the device dropped where it is the
    one the operand is on (recorded by torch.export or dynamo): transformers'
    ``mask.to(x.device)`` then converts nothing, and ``.to(x.device, dtype)`` only the
    dtype."""
    here = getattr(recorded_value(node.args[0]) if node.args else None, "device", None)
    if not isinstance(here, torch.device):
        return args, kwargs

    def same(a) -> bool:
        if not isinstance(a, (str, torch.device)):
            return False
        try:
            there = torch.device(a)
        except RuntimeError:
            return False
        return there.type == here.type and (there.index == here.index or (
            there.index is None and (here.type == "cpu" or (
                here.type == "cuda" and here.index == torch.cuda.current_device()))))

    return (tuple(None if same(a) else a for a in args),
            {k: None if k == "device" and same(v) else v for k, v in kwargs.items()})



def _location(node: fx.Node) -> str:
    """The FX node's name, prefixed by the module it ran in when the graph knows it."""
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        return f"{path}: {node.name}"
    if node.op == "call_module":
        return str(node.target)
    return node.name


def _bind_dropout(input, p=0.5, training=True, inplace=False, train=None):  # noqa: A002
    """The arguments of F.dropout / torch.dropout (the latter names `training` `train`)."""
    return {"input": input, "p": p, "train": training if train is None else train}


# the attribute values ingest holds as literals; any other (a submodule, a generator, a
# script object) is passed by reference
_LITERAL_TYPES = (bool, int, float, str, type(None), tuple, list, slice, torch.dtype,
                  torch.device, torch.memory_format)



def _param(builder: Builder, node: fx.Node, attr: str) -> int:
    value = getattr(builder.gm.get_submodule(node.target), attr)
    name = f"{node.target}.{attr}"
    return builder.leaf("param", builder.param_names.get(name, name),
                        Meta.of(value, builder.observe))


def _lower_module(b: Builder, module: nn.Module, node: fx.Node) -> int | None:
    """A module call as the canonical op the op table lowers it to, over parameter leaves
    (None: kept opaque)."""
    found = module_op(module)
    if found is None or node.kwargs or len(node.args) != 1:
        return None
    name, entry = found
    kids = []
    for source in entry.args:
        if source == "input":
            kids.append(b.value(node.args[0]))
            continue
        value = getattr(module, source)
        if isinstance(value, torch.Tensor):
            kids.append(_param(b, node, source))
        else:
            kids.append(b.literal(tuple(value) if isinstance(value, list) else value))
    if name == "identity":
        return kids[0]
    return b.apply(name, kids)



def _weights_unasked(node: fx.Node, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s
    call, which dynamo keeps as one) with ``need_weights=False`` where it asks for the
    attention weights (the module's default) and the graph reads only the output
    (:func:`_unread`: WavLM's dead views of the weights do not count): asked
    without them, torch runs sdpa rather than the scores written out and averaged over the
    heads (DETR's layers call the module so). Unchanged where dropout draws random numbers
    (training with ``dropout_p > 0``: the two paths draw them differently)."""
    if not all(u.op == "call_function" and u.target is operator.getitem and (
            u.args[1] == 0 or u.args[1] == 1 and _unread(u)) for u in node.users):
        return args, kwargs
    try:
        bound = inspect.signature(F.multi_head_attention_forward).bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.apply_defaults()
    given = bound.arguments
    dropout = given["dropout_p"]
    if given["need_weights"] is not True or not isinstance(dropout, (int, float)) or (
            given["training"] is not False and dropout > 0):
        return args, kwargs
    given["need_weights"] = False
    return bound.args, bound.kwargs


def _unread(node: fx.Node) -> bool:
    """Whether no value the graph returns or an effect it has depends on ``node``: its
    users, and theirs, are pure (WavLM views the weights it does not return)."""
    stack, seen = [node], {node}
    while stack:
        for user in stack.pop().users:
            if user.op == "output" or user.is_impure() or str(user.target).endswith("_"):
                return False
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return True
