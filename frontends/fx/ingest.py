"""Ingest: a torch.fx graph (or module, or torch.export program) becomes an e-graph.

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

import copy
import importlib
import inspect
import logging
import math
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from egraph.dims import is_symbolic
from egraph.egraph import EGraph
from egraph.ops.table import TABLE
from egraph.term import literal
from frontends.fx.analysis import Meta, TensorAnalysis
from frontends.fx.effects import (
    dispatches_functionally,
    draws_random,
    is_functional,
    is_in_place,
    out_of_place,
    recorded_key,
    recorded_value,
    returns_new_tensors,
    run_pure,
    tensor_of,
    torch_owned,
    updates_an_alias,
    updates_an_input,
)
from frontends.fx.exported import (
    ExportedModule,
    InputGuards,
    argument_names,
    attribute_at,
    export_dynamic,
    input_guards,
    input_structure,
    is_input_guards,
    pytree_info,
    written_targets,
)
from frontends.fx.foreach import split_foreach
from frontends.fx.metadata import node_metas
from frontends.fx.mismatch import check_count
from frontends.fx.ranges import DOMAINS, declare, observe_ranges, observing
from frontends.fx.tracing import UntraceableModel, spread_star_inputs, trace
from frontends.fx.vocabulary import (
    IMPURE,
    SCALAR_FUNCTIONS,
    SPECS,
    UNKNOWN_VALUE,
    lower,
    module_op,
)


@dataclass
class OpaqueCall:
    """An FX call kept as is: its target and its arguments with e-class ids for nodes."""

    op: str
    target: Any
    args: Any
    kwargs: Any
    name: str
    pure: bool = False  # functional by torch's op schema: it writes into no argument
    updates: int | None = None  # the class of the input or parameter it updates in place


@dataclass
class FxSource:
    """What an e-graph built from FX remembers of its source graph, for emission.
    ``module`` runs the source (for a torch.export program: :class:`ExportedModule`)."""

    module: nn.Module
    graph_module: fx.GraphModule
    inputs: list[str]
    input_classes: list[int]
    output: Any  # the output structure with class ids in place of nodes
    effects: list[int] = field(default_factory=list)
    opaque: dict[str, OpaqueCall] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    example_inputs: tuple | None = None
    initial: dict[int, list[tuple]] = field(default_factory=dict)
    random: bool = False
    origins: dict[int, str] = field(default_factory=dict)
    domains: dict[str, int] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    guards: InputGuards | None = None  # (an exported source's: its module checks them)
    structure: tuple[list[str], Any] | None = None  # (see exported.input_structure)

    def location(self, cid: int, find) -> str | None:
        """Where in the source a class came from: the FX node, with its module path when
        the graph records one (``blocks.0.attn: softmax``)."""
        cid = find(cid)
        for c, name in self.origins.items():
            if find(c) == cid:
                return name
        return None


_CLONES = (torch.clone, torch.ops.aten.clone.default, torch.ops.aten.lift_fresh_copy.default)
"""Call targets that copy their input (``Tensor.clone`` is the method): the op table models
them as the identity, but the source's result is a new tensor."""


class _Builder:
    """Walks the FX graph once and adds each node's canonical expression."""

    def __init__(self, gm: fx.GraphModule, example_inputs, param_names: dict[str, str],
                 make_egraph: Callable[..., EGraph] = EGraph, observe: bool = True):
        self.gm = gm
        self.observe = observe  # parameters' ranges too (they inform the curvature cost)
        self.metas = node_metas(gm, example_inputs, param_names, observe)
        self.analysis = TensorAnalysis()
        self.eg = make_egraph(analysis=self.analysis)
        self.env: dict[fx.Node, Any] = {}
        self.param_names = param_names
        # torch.export's lifted tensor constants (``torch.tensor(-1e9)`` in a forward, a
        # mask captured from outside it): constants of the program, by placeholder name
        self.lifted_constants: dict[str, torch.Tensor] = {}
        self.opaque: dict[str, OpaqueCall] = {}
        self.effect: int | None = None
        self.effects: list[int] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.inputs: list[str] = []
        self.input_classes: list[int] = []
        self.output: Any = None
        self.random = False
        self.origins: dict[int, str] = {}
        self.observed: dict[str, dict] = {}
        self.folded: dict[int, torch.Tensor] = {}
        self.lowered_ops: dict[fx.Node, str] = {}  # the op each modelled call became
        # whether an in-place update a view shares stops ingest (_UpdateThroughView: a
        # traced graph's, which from_fx then captures with torch.export)
        self.follows_views = False
        self._order: dict[fx.Node, int] = {}
        # an input (its node) or attribute (its name) updated in place -> the nodes that
        # are its tensor: its reads (a symbolic trace reads ``self.b`` afresh, by a new
        # get_attr, each time) and what in-place calls of it returned
        self.aliases: dict[fx.Node | str, list[fx.Node]] = {}

    # -- leaves ---------------------------------------------------------------------------

    def literal(self, value: Any) -> int:
        eg = self.eg
        if isinstance(value, torch.dtype):
            return eg.add_node(("dtype", str(value).removeprefix("torch.")))
        if isinstance(value, torch.device):
            return eg.add_node(("device", str(value)))
        if isinstance(value, (torch.Size, list)):
            value = tuple(value)
        if isinstance(value, tuple):
            if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return eg.add_node(literal(value))
            return self._tuple([self.value(v) for v in value])
        if isinstance(value, slice):
            # A bound may be a traced size (``bias[:, :, :t, :t]`` with ``t = x.size(1)``).
            return eg.add_node("slice", [self.value(value.start), self.value(value.stop),
                                         self.value(value.step)])
        if isinstance(value, torch.Tensor):
            return self.constant(value)
        if isinstance(value, torch.memory_format):
            return eg.add_node(("layout", str(value).removeprefix("torch.")))
        return eg.add_node(literal(value))

    def constant(self, tensor: torch.Tensor) -> int:
        name = f"_egraph_const{len(self.constants)}"
        self.constants[name] = tensor
        self.analysis.leaves[f"const:{name}"] = Meta.of(tensor)
        cid = self.eg.add_node("const", [self.eg.add_node(literal(name))])
        # Where a folded constant is one the rules read, its class also holds how it is
        # made: a causal mask (``ones(T, T).triu(1)``, for ``sdpa-causal``; an additive
        # one, 0 below a fill, for ``sdpa-causal-additive``), a float of no dims
        # (``torch.full([], finfo.min)``, a fill the mask rules read as a number).
        triangle = _triangle(tensor)
        additive = _additive_triangle(tensor) if triangle is None else None
        if triangle is not None:
            made = self.eg.add_node(triangle[0], [
                self._full(triangle[2], tensor.device, True, torch.bool),
                self.literal(triangle[1])])
            if tuple(tensor.shape) != triangle[2]:
                made = self.eg.add_node("reshape", [made, self.literal(tuple(tensor.shape))])
            self.eg.union(cid, made)
        elif additive is not None:
            fill, size = additive
            above = self.eg.add_node("triu", [
                self._full((size, size), tensor.device, True, torch.bool), self.literal(1)])
            zeros = self._full(tuple(tensor.shape), tensor.device, 0.0, tensor.dtype)
            self.eg.union(cid, self.eg.add_node("masked_fill", [zeros, above,
                                                                self.literal(fill)]))
        elif tensor.dim() == 0 and tensor.is_floating_point():
            self.eg.union(cid, self._full((), tensor.device, tensor.item(), tensor.dtype))
        return cid

    def _full(self, shape: tuple, device: torch.device, value, dtype: torch.dtype) -> int:
        """The class of ``full(shape, value)`` of ``dtype`` on ``device``."""
        return self.eg.add_node("full", [self.literal(tuple(shape)), self.literal(value),
                                         self.literal(dtype), self.literal(device)])

    def leaf(self, kind: str, name: str, meta: Meta | None) -> int:
        if meta is not None:
            self.analysis.leaves[f"{kind}:{name}"] = meta
        return self.eg.add_node(kind, [self.eg.add_node(literal(name))])

    def value(self, arg: Any) -> int:
        """The class of an FX argument: a node's class, a literal, a nested structure."""
        if isinstance(arg, fx.Node):
            cid = self.env[arg]
            if cid is None:
                raise ValueError(f"{arg.name} has no value (an output of an effect?)")
            return cid
        return self.literal(arg)

    # -- expressions ----------------------------------------------------------------------

    def expr(self, lowered: tuple[str, list]) -> int:
        name, values = lowered
        kids = [self.expr(v) if _is_expr(v) else self.value(v) for v in values]
        if name == "identity":
            return kids[0]
        if name == "tuple":  # a pair of results (var_mean), picked from by getitem
            return self._tuple(kids)
        return self.apply(name, kids)

    def apply(self, name: str, kids: list[int]) -> int:
        """The class of op ``name`` over the classes ``kids``: sizes resolved, attributes
        normalised, constant inputs folded."""
        shaped = self._shape_value(name, kids)
        if shaped is not None:
            return shaped
        if name in SHAPE_PARAMS:
            kids[SHAPE_PARAMS[name]] = self._whole_shape(kids[SHAPE_PARAMS[name]])
        spec = SPECS[name]
        if spec.normalize is not None:
            kids = self._normalized(spec, kids)
        folded = self._fold(spec, kids)
        if folded is not None:
            return folded
        return self.eg.add_node(name, kids)

    # -- sizes: ``x.size()`` is the tuple of its dims, each computed from the input -------

    def _elements(self, cid: int) -> list[int] | None:
        """The classes of the items of a tuple-valued class (a shape), or None."""
        for n in self.eg.nodes(cid):
            if n.op == "tuple":
                return list(n.children)
        meta = self.eg.data(cid)
        if meta is not None and meta.kind == "literal" and isinstance(meta.value, tuple) and all(
                type(v) is int for v in meta.value):
            return [self.literal(v) for v in meta.value]
        return None

    def _tuple(self, items: list[int]) -> int:
        """A tuple of classes: a literal when every item is a plain int literal."""
        metas = [self.eg.data(c) for c in items]
        if all(m is not None and m.kind == "literal" and type(m.value) is int for m in metas):
            return self.literal(tuple(m.value for m in metas))
        return self.eg.add_node("tuple", items)

    def _shape_value(self, name: str, kids: list[int]) -> int | None:
        """Size arithmetic resolved at ingest, so each dim stays its own ``size(x, d)``:
        ``x.size()`` (rank known) is the tuple of the dims, ``shape[i]`` and
        ``shape[a:b]`` pick items, ``shape[:-1] + (nh, hd)`` concatenates. None when
        ``name`` is not such an operation."""
        eg = self.eg
        if name == "size":
            shape = getattr(eg.data(kids[0]), "shape", None)
            if self._is_none(kids[1]) and shape is not None:
                return self._tuple([eg.add_node("size", [kids[0], self.literal(d)])
                                    for d in range(len(shape))])
            return None
        if name == "getitem":
            index = eg.data(kids[1])
            if index is None or index.kind != "literal" or index.from_size:
                return None
            items = self._elements(kids[0])
            if items is not None:
                if type(index.value) is int and -len(items) <= index.value < len(items):
                    return items[index.value]
                if isinstance(index.value, slice):
                    return self._tuple(items[index.value])
                return None
            whole = self._sized(kids[0]) if type(index.value) is int else None
            if whole is not None:
                return eg.add_node("size", [whole, self.literal(index.value)])
            return None
        if name == "add":
            left, right = self._elements(kids[0]), self._elements(kids[1])
            if left is not None and right is not None:
                return self._tuple(left + right)
        return None

    def _whole_shape(self, cid: int) -> int:
        """A shape given as one value (``x.view(shape)``, ``x.expand(y.size())``) arrives as
        a one-item tuple holding it: the shape itself, as a tuple of its dims."""
        items = self._elements(cid)
        if items is not None and len(items) == 1:
            inner = self._elements(items[0])
            if inner is not None:
                return self._tuple(inner)
            if self._whole_size(items[0]):
                return items[0]
        return cid

    def _whole_size(self, cid: int) -> bool:
        """Whether class ``cid`` is a whole shape as one value whose items ingest does not
        see: ``x.size()`` of an input of unknown rank, or a ``torch.Size`` made at run time
        (``input_shape + (4,)`` under dynamic shapes)."""
        meta = self.eg.data(cid)
        return (meta is not None and meta.kind == "tuple") or self._sized(cid) is not None

    def _sized(self, cid: int) -> int | None:
        """The tensor whose whole ``size()`` class ``cid`` is (a ``size`` whose dim is the
        literal None), or None."""
        for n in self.eg.nodes(cid):
            if n.op == "size" and self._is_none(n.children[1]):
                return n.children[0]
        return None

    def _is_none(self, cid: int) -> bool:
        meta = self.eg.data(cid)
        return meta is not None and meta.kind == "literal" and meta.value is None

    def _constant_value(self, cid: int) -> Any:
        """The value of class ``cid`` when it is a constant (a literal, or a constant
        tensor made in the graph, never a parameter or buffer), else :data:`UNKNOWN_VALUE`.
        Values computed from sizes are not constants: a tensor made from ``x.size(1)``
        stays computed, so the program follows the input's size."""
        meta = self.eg.data(cid)
        if meta is not None and meta.from_size:
            return UNKNOWN_VALUE
        if meta is not None and meta.kind in ("literal", "scalar") and (
                meta.value is not None or meta.kind == "literal"):
            return meta.value
        found = self.folded.get(self.eg.find(cid), UNKNOWN_VALUE)
        if found is UNKNOWN_VALUE:  # an index of constant tensors (``mask[b, q]``)
            for n in self.eg.nodes(cid):
                if n.op in ("tuple", "slice"):
                    items = [self._constant_value(k) for k in n.children]
                    if any(v is UNKNOWN_VALUE for v in items):
                        return UNKNOWN_VALUE
                    return tuple(items) if n.op == "tuple" else slice(*items)
        return found

    def _folded_constant(self, result: Any) -> int | None:
        """A constant leaf holding ``result``, when it is a tensor small enough to keep."""
        if not isinstance(result, torch.Tensor) or (
                result.numel() * result.element_size() > _MAX_FOLDED_BYTES):
            return None
        cid = self.constant(result)
        self.folded[self.eg.find(cid)] = result
        return cid

    def _fold(self, spec, kids: list[int]) -> int | None:
        """A constant leaf for an op whose inputs are all constants
        (:meth:`_constant_value`); None otherwise."""
        values = [self._constant_value(k) for k in kids]
        if any(v is UNKNOWN_VALUE for v in values):
            return None
        if not any(isinstance(v, torch.Tensor) for v in values) and spec.name not in (
                "full", "arange"):
            return None

        def run():
            try:
                return spec.run(values)
            except Exception:  # noqa: BLE001 - not foldable here: keep the op
                return None
        return self._folded(run, values)

    def _folded(self, run: Callable[[], Any], values: list) -> int | None:
        """A constant leaf for what ``run()`` returns, computed from the constant
        ``values`` outside any fake mode (inside aot_autograd's, ``torch.arange`` makes a
        fake tensor, which the emitted program cannot hold: Falcon-H1's decoding step
        fell back); None where a value is itself fake or there is no tensor to keep."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        if any(isinstance(v, FakeTensor) for v in values):
            return None
        with unset_fake_temporarily():
            return self._folded_constant(run())

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
                a = self._constant_value(cid) if isinstance(cid, int) else UNKNOWN_VALUE
            values.append(a)
            return a

        args = fx.node.map_aggregate(node.args, value)
        kwargs = fx.node.map_aggregate(node.kwargs, value)
        if any(v is UNKNOWN_VALUE for v in values) or kwargs.get("requires_grad") or not (
                target in _TENSORS_OF_LITERALS or any(
                    isinstance(v, torch.Tensor) for v in values)):
            return None
        return self._folded(lambda: run_pure(target, args, kwargs), values)

    def _normalized(self, spec, kids: list[int]) -> list[int]:
        """Attributes in normal form (positive dims, concrete shapes) so that the same
        operation always hashes the same. An attribute computed from sizes (``x.view(B,
        T, nh, -1)`` with ``B, T, C = x.size()``) stays as computed: its literal would
        bake the example's size into the program."""
        metas = [self.eg.data(k) for k in kids]
        values: list[Any] = [
            m.value if m is not None and m.kind in ("literal", "scalar") and m.value is not None
            else UNKNOWN_VALUE for m in metas
        ]
        normalized = spec.normalize(list(values), metas)
        return [k if v is UNKNOWN_VALUE or (m is not None and m.from_size) or is_symbolic(v)
                else self.literal(v) for k, v, m in zip(kids, normalized, metas)]

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
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                constant = self.lifted_constants.get(node.name)
                if constant is not None:
                    cid = self._folded_constant(constant)
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
                        sens=seen.get("sens", meta.sens)))
                if is_in_place(node, self._module(node)) and node.args and isinstance(
                        node.args[0], fx.Node):
                    target = node.args[0]
                    leaf = _leaf_of(target)
                    if self.follows_views and self._shared_update(leaf or target, node):
                        raise _UpdateThroughView(node)
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
        if _is_expr(lowered):
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


def _triangle(tensor: torch.Tensor) -> tuple[str, int, tuple] | None:
    """``("triu", 1, shape)`` for a bool tensor that is ``ones(..., T, T).triu(1)`` (the
    entries above the diagonal), ``("tril", 0, shape)`` for ``ones(..., T, T).tril()``,
    where ``shape`` is the tensor's own; or, for a (T, T) triangle with unit dims after
    or between (sequence-first code's ``mask.unsqueeze(-1)``), the (T, T) one it is a
    reshape of. Else None.

    >>> _triangle(torch.ones(1, 3, 3, dtype=torch.bool).triu(1))
    ('triu', 1, (1, 3, 3))
    >>> _triangle(torch.ones(3, 3, dtype=torch.bool).tril()[:, :, None, None])
    ('tril', 0, (3, 3))
    """
    if tensor.dtype != torch.bool or tensor.dim() < 2:
        return None
    shape = tuple(tensor.shape)
    if shape[-1] != shape[-2] or shape[-1] == 1:
        shape = tuple(n for n in shape if n != 1)
        if len(shape) != 2:
            return None
        tensor = tensor.reshape(shape)
    if shape[-1] != shape[-2] or shape[-1] < 2:
        return None
    ones = torch.ones(tensor.shape[-2:], dtype=torch.bool, device=tensor.device)
    for name, diagonal in (("triu", 1), ("tril", 0)):
        if torch.equal(tensor, getattr(ones, name)(diagonal).expand(tensor.shape)):
            return name, diagonal, shape
    return None


def _additive_triangle(tensor: torch.Tensor) -> tuple[float, int] | None:
    """``(fill, T)`` for a float tensor whose last two dims are (T, T), 0 on and below the
    diagonal and one fill at or below -1e4 above it, alike at every leading index: an
    additive causal mask (transformers' constant one, ``finfo.min`` above the diagonal,
    batch copies in front); else None.

    >>> mask = torch.zeros(2, 1, 3, 3).masked_fill(torch.ones(3, 3).triu(1).bool(), -1e9)
    >>> _additive_triangle(mask), _additive_triangle(torch.zeros(3, 3))
    ((-1000000000.0, 3), None)
    """
    if not tensor.is_floating_point() or tensor.dim() < 2:
        return None
    size = tensor.shape[-1]
    if tensor.shape[-2] != size or size < 2 or tensor.device.type == "meta":
        return None
    rows = tensor.reshape(-1, size, size)
    first = rows[0]
    fill = float(first[0, 1])
    if not fill <= -1e4 or float(first[0, 0]) != 0:
        return None
    above = torch.ones(size, size, dtype=torch.bool, device=tensor.device).triu(1)
    if not (bool((first[~above] == 0).all()) and bool((first[above] == fill).all())
            and bool((rows == first).all())):
        return None
    return fill, size


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


SHAPE_PARAMS = {"reshape": 1, "expand": 1, "full": 0}
"""Ops whose parameter at that position is a whole target shape."""

_MAX_FOLDED_BYTES = 1 << 20
"""Constant subgraphs whose result takes more bytes stay computed (they would bloat the
module): a float32 table of 256K elements, a bool causal mask of 2 x 724 x 724."""


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


@dataclass(frozen=True)
class AttributeRef:
    """An attribute of the source module passed to a call, by its path, where it is no
    tensor and no literal: a submodule (the region of a higher-order op of a torch.export
    graph, ``wrap_with_autocast``, ``wrap_with_set_grad_enabled``, so that the region
    keeps its autocast or grad mode) or an object (the ``torch.Generator`` a call draws
    from, which the emitted call must advance as the source's did). The call stays
    opaque; the emitted module holds the same object."""

    target: str


@dataclass(frozen=True)
class ClassRef:
    """An e-class id standing where an FX node was, in an opaque call's arguments."""

    cid: int


@dataclass(frozen=True)
class WrittenRef(ClassRef):
    """The operand an opaque call updates in place, a value the graph made: the emitted
    call updates a copy of it (the class may be shared by other expressions)."""


@dataclass(frozen=True)
class ContiguousRef(ClassRef):
    """An argument of a functional opaque call that was contiguous in the source: the
    emitted call is given it contiguous too (ingest drops ``clone`` and ``contiguous``,
    which make a layout, not a value), and so is a random op's (it draws in memory
    order, so the layout decides which element gets which draw)."""


@dataclass(frozen=True)
class OutputRef(ClassRef):
    """An output of the source graph: its class, and what the source's tensor was beyond
    its value, which the emitted program keeps. ``fresh``: a tensor the source made (no
    storage shared with an input, a parameter or a constant: ``x * 1``, ``x.clone()``),
    False where it may share one (``x.view(-1)``, an opaque call that may return a view);
    ``contiguous``: whether it was contiguous, None where no example told; ``maker``: the
    name of the source node that made its tensor (outputs of different makers never share
    one: ``zeros_like(x)`` twice, each then written by the caller, may be one class)."""

    fresh: bool = False
    contiguous: bool | None = None
    maker: str | None = None


def _is_expr(value: Any) -> bool:
    return (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], list))


def _param(builder: _Builder, node: fx.Node, attr: str) -> int:
    value = getattr(builder.gm.get_submodule(node.target), attr)
    name = f"{node.target}.{attr}"
    return builder.leaf("param", builder.param_names.get(name, name),
                        Meta.of(value, builder.observe))


def _lower_module(b: _Builder, module: nn.Module, node: fx.Node) -> int | None:
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


def _renamed(by_input: dict | None, names: list[str],
             program: torch.export.ExportedProgram) -> dict | None:
    """``by_input``, keyed by the module's argument ``names``, keyed instead by the names
    the exported ``program`` gives those inputs (by position: export may rename them)."""
    if not by_input:
        return by_input
    renamed = dict(zip(names, program.graph_signature.user_inputs))
    return {renamed.get(name, name): value for name, value in by_input.items()}


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
    module = source
    if isinstance(source, torch.export.ExportedProgram):
        functional = _functional(source)
        gm, param_names, example_inputs = _from_export(functional, example_inputs)
        if functional is not source:  # (the source runs as it was: it updates in place)
            gm = _written_back(functional)
        module = ExportedModule(source)
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
    if example_inputs is not None:
        check_count(gm, example_inputs, param_names)
    observe = observing(gm, example_inputs, observe)
    # Without example inputs nothing is observed, but parameters are still measured.
    builder = _Builder(gm, example_inputs, param_names, make_egraph,
                       observe=observe is not False)
    if isinstance(source, torch.export.ExportedProgram):
        builder.lifted_constants = _lifted_constants(functional)
    declare(builder.metas, gm, domains, ranges)
    if observe and not ranges:
        builder.observed = observe_ranges(gm, example_inputs)
    # (a traced graph's updates only: where the tracer recorded values, their storages
    # tell, torch.export's are made functional above and torch.compile's by aot_autograd)
    builder.follows_views = follow_views and recorded_key(gm) is None
    try:
        builder.run()
    except _UpdateThroughView as update:
        program = _exported(source, example_inputs, update.node)
        if program is None:  # validation judges the program as ingested before
            return from_fx(source, example_inputs, domains, ranges, observe, make_egraph,
                           follow_views=False)
        egraph = from_fx(program, example_inputs, domains, ranges, observe, make_egraph)
        egraph.fx.guards = None  # (exported here, for the view: the source is shape-generic)
        return egraph
    if isinstance(source, torch.export.ExportedProgram):
        builder.output = _user_outputs(source, builder.output)
    else:
        builder.output = _unflattened_outputs(gm, builder.output)
    eg = builder.eg
    eg.rebuild()
    outputs: list[int] = []
    fx.node.map_aggregate(builder.output, lambda a: outputs.append(a.cid)
                          if isinstance(a, ClassRef) else None)
    eg.set_roots(outputs)
    eg.fx = FxSource(
        module=module, graph_module=gm, inputs=builder.inputs,
        input_classes=builder.input_classes, output=builder.output,
        effects=builder.effects, opaque=builder.opaque, constants=builder.constants,
        example_inputs=tuple(example_inputs) if example_inputs is not None else None,
        initial={c: list(eg.class_nodes[c]) for c in eg.classes()}, random=builder.random,
        origins=builder.origins,
        domains={name: DOMAINS[d] for name, d in (domains or {}).items()},
        ranges={name: (float(lo), float(hi)) for name, (lo, hi) in (ranges or {}).items()},
        guards=input_guards(source),
        structure=input_structure(source) if isinstance(
            source, (torch.export.ExportedProgram, fx.GraphModule)) else None,
    )
    return eg


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


class _UpdateThroughView(Exception):
    """Ingest met an in-place update that a view shares (:meth:`_Builder._shared_update`)."""

    def __init__(self, node: fx.Node):
        super().__init__(node.name)
        self.node = node


def _exported(source: nn.Module, example_inputs, update: fx.Node):
    """``source`` captured by torch.export on the example inputs, for its update through
    a view (``update``), or None where there are no example inputs or export fails."""
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


def _functional(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with its updates seen through views made functional
    (``run_decompositions`` with no decompositions: ``h[:, :1].mul_(3)`` becomes a
    ``slice_scatter`` into ``h``) where making each call out of place, as ingest does,
    would leave a view stale (:func:`frontends.fx.effects.updates_an_alias`) or the
    caller's input or buffer unchanged (``x.t().add_(1)``). Otherwise ``program``
    itself."""
    graph = program.graph
    if not updates_an_alias(graph) and not any(
            updates_an_input(n) and n.args[0].op != "placeholder" for n in graph.nodes):
        return program
    return program.run_decompositions({})


def _written_back(program: torch.export.ExportedProgram) -> fx.GraphModule:
    """The graph of a functional ``program`` that writes the new values of the inputs and
    buffers it updates into them (``aten.copy_``, at the end), where the program returns
    them as outputs: the source updates them, and emission keeps such a write."""
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


MOVED = {"InputMismatch": "frontends.fx.mismatch", "UntraceableModel": "frontends.fx.tracing",
         "observe_ranges": "frontends.fx.ranges", "spread_star_inputs": "frontends.fx.tracing",
         "state_kept": "frontends.fx.kept", "trace": "frontends.fx.tracing"}
"""Names that moved out of this module to the passes of ingest, by their new module."""


def __getattr__(name: str) -> Any:
    """A name that moved (:data:`MOVED`), for one release, with a DeprecationWarning that
    names its new path.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     from frontends.fx.ingest import state_kept
    >>> print(caught[0].message)
    frontends.fx.ingest.state_kept moved to frontends.fx.kept.state_kept
    """
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} moved to {MOVED[name]}.{name}", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module(MOVED[name]), name)
