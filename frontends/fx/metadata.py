"""Metadata: the shape and dtype of every value of a graph, read from what its tracer
recorded (torch.export, aot_autograd, dynamo) or propagated through a run on the example
inputs (real tensors where they are real, fake ones otherwise). Example inputs the model
rejects are explained (:mod:`frontends.fx.mismatch`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from frontends.fx.analysis import Meta
from frontends.fx.exported import attribute_at
from frontends.fx.kept import attributes_kept, state_kept
from frontends.fx.mismatch import explain_mismatch
from frontends.fx.observed import observed_range, triangle_of
from frontends.fx.recorded import recorded_key, recorded_parts, recorded_value

__all__ = ["node_metas"]


def node_metas(gm: fx.GraphModule, example_inputs, param_names: dict[str, str],
               observe: bool = True, module: nn.Module | None = None) -> dict[str, Meta]:
    """Meta of every FX node of ``gm`` (by name), with the observed ranges of the example
    inputs (they inform costs, never rules) and the causal masks among them
    (:func:`~frontends.fx.observed.triangle_of`); ``param_names`` are the inputs that hold
    parameters (by their names in ``module``, whose buffers are checked for causal masks
    too), and a parameter aot_autograd passes as an input is measured as parameters
    are, only when ``observe`` (a pass over a 12-layer decoder's weights: 0.37 s).

    >>> gm = fx.symbolic_trace(lambda x: x.sum(0))
    >>> metas = node_metas(gm, (torch.ones(2, 3),), {})
    >>> metas["x"].shape, metas["sum_1"].shape, metas["x"].lo
    ((2, 3), (3,), 1.0)
    """
    metas = _metas(gm, example_inputs)
    user_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"
                   and n.name not in param_names]
    for node, value in zip(user_inputs, example_inputs or ()):
        traced = recorded_value(node)
        if isinstance(value, nn.Parameter) and not observe:
            continue
        if isinstance(value, torch.Tensor) and node.name in metas:
            metas[node.name] = metas[node.name]._replace(**observed_range(value),
                                                         triangle=triangle_of(value))
        elif node.name not in metas and isinstance(traced, torch.SymInt):
            # A symbolic size dynamo passes as an input (a number in the hinted run
            # that propagated shapes): a number from sizes, as in aot_autograd's
            # graphs, so size arithmetic on it is emitted as Python arithmetic.
            metas[node.name] = Meta.of(traced)
    for name, target in param_names.items():
        value = attribute_at(module, target) if module is not None and name in metas else None
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            metas[name] = metas[name]._replace(triangle=triangle_of(value))
    return metas


def _metas(gm: fx.GraphModule, example_inputs) -> dict[str, Meta]:
    """Meta of every FX node: from the value its tracer recorded (``node.meta["val"]`` from
    torch.export and aot_autograd, ``"example_value"`` from dynamo), else shape
    propagation: a run on the example inputs where they are real tensors (cheaper than
    importing torch._dynamo, which fake tensors need), fake tensors otherwise."""
    out: dict[str, Meta] = {}
    key = recorded_key(gm)
    if key is not None:
        for n in gm.graph.nodes:
            if key in n.meta:
                out[n.name] = Meta.of(n.meta[key])
            elif (parts := recorded_parts(n, key)) is not None:
                out[n.name] = Meta("tuple", value=tuple(
                    Meta("unknown") if v is None else Meta.of(v) for v in parts))
        return out
    if example_inputs is None:
        return out
    if _real(example_inputs):
        run = _Propagation(gm)
        try:
            _run_real(run, example_inputs)
        except Exception as err:  # noqa: BLE001 - the model rejects the inputs
            explain_mismatch(gm, example_inputs, run.node, err)
        return run.metas
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    run = _Propagation(gm, mode)
    try:
        with _quiet("torch._subclasses.fake_tensor"), state_kept():
            run.run(*fakes)
    except Exception as err:  # noqa: BLE001 - sorted below: a mismatch, or fake's limits
        if not _fake_limit(err):  # (real inputs took the real run above)
            explain_mismatch(gm, example_inputs, run.node, err)
        return out  # shapes stay unknown where fake propagation cannot run
    return run.metas


def _real(example_inputs) -> bool:
    """True when every tensor among the inputs is a real one (not fake, not meta)."""
    return all(not isinstance(x, torch.Tensor) or (
        type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type != "meta")
        for x in example_inputs)


def _run_real(run: fx.Interpreter, example_inputs) -> None:
    """Run the graph on copies of the real inputs, leaving the caller's RNG state and the
    module's tensors (:func:`attributes_kept`) as they were."""
    inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in example_inputs]
    with torch.random.fork_rng(), torch.no_grad(), state_kept(), attributes_kept(run.module):
        run.run(*inputs)

class _Propagation(fx.Interpreter):
    """Runs the graph (on fake tensors under ``mode``), keeping the meta of every node's
    value (the user's graph and its nodes' metadata are left as they are) and the node
    that is running."""

    def __init__(self, gm: fx.GraphModule, mode=None):
        super().__init__(gm)
        self.mode = mode
        self.metas: dict[str, Meta] = {}
        self.node: fx.Node | None = None

    def run_node(self, n: fx.Node):
        self.node = n
        if self.mode is None:
            result = super().run_node(n)
        else:
            with self.mode:
                result = super().run_node(n)
        meta = _meta_of_value(result)
        if meta is None and n.op == "placeholder" and type(result) in (bool, int, float, str):
            # a number (or name) the caller passes, or its default: Python, not torch
            meta = Meta("scalar")
        if meta is not None:
            self.metas[n.name] = meta
        return result


def _meta_of_value(value: Any) -> Meta | None:
    """The shape and dtype of a propagated value holding tensors, else None (no observed
    range: whether ranges are observed is :func:`frontends.fx.ingest.from_fx`'s ``observe``)."""
    if isinstance(value, torch.Tensor):
        return Meta.of(value.detach().to("meta")) if value.device.type != "meta" else (
            Meta.of(value))
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        return Meta("tuple", value=tuple(_meta_of_value(v) or Meta("unknown") for v in value))
    return None


def _fake_limit(err: Exception) -> bool:
    """True for errors that say fake tensors cannot run an op (data-dependent shapes, no
    meta kernel), not that the inputs are wrong."""
    from torch._subclasses import fake_tensor
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    limits = (NotImplementedError, GuardOnDataDependentSymNode,
              fake_tensor.DataDependentOutputException,
              fake_tensor.DynamicOutputShapeException,
              fake_tensor.UnsupportedOperatorException,
              fake_tensor.UnsupportedFakeTensorException)
    return isinstance(err, limits)


class _quiet:
    """Drops a torch logger's records for a while (fake propagation logs every op it
    cannot run at ERROR level, with a traceback, before raising)."""

    def __init__(self, name: str):
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.logger.addFilter(_drop)

    def __exit__(self, *exc):
        self.logger.removeFilter(_drop)
        return False


def _drop(record) -> bool:
    return False

