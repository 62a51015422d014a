"""Random ops drawn again from the generator state the forward kept: what lets a training
graph's backward recompute a dropout instead of saving its mask.

A random op computed a second time draws different numbers, so aot_autograd's
partitioners save the outputs of every random op the backward reads (a dropout's mask, a
byte per element) whatever the memory budget; torch replays them only on CUDA, with
``functionalize_rng_ops``. :func:`make_replayable` rewrites each such op of a joint graph
into torch's ``run_and_save_rng_state``, which takes the state of its device's generator
and then runs the op, drawing from that generator as before (the numbers are eager's),
and makes its outputs values a partition may recompute, from the state (5 KiB on the
CPU, 16 bytes on CUDA) and the op's inputs. The partition chooses, as for any value,
between saving the outputs and saving the state; :meth:`Replayable.settle` then gives the
backward ``run_with_rng_state`` for each output it recomputes (the op run again with the
generator set to the state, and set back: a deterministic function of the state), and
turns every op whose outputs were saved back into the op as it was, so that a graph no
budget touches is unchanged. Both are higher-order ops torch has for activation
checkpointing, which Inductor calls as they are and ingest already reads.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from frontends.fx.effects import generator_state

__all__ = ["Replayable", "draws_nothing", "make_replayable"]

_SAVING = torch.ops.higher_order.run_and_save_rng_state
_REPLAY = torch.ops.higher_order.run_with_rng_state


@dataclass(eq=False)
class _Draw:
    """One random op rewritten: the op, its ``run_and_save_rng_state`` node, the node of
    its outputs there (``outputs``: a tuple where the op returns several), the nodes of
    its outputs by their index (``drawn``: the op's own, now read from ``outputs``) and
    the state."""

    op: torch._ops.OpOverload
    saving: fx.Node
    outputs: fx.Node
    drawn: dict[int, fx.Node]
    state: fx.Node

    @property
    def args(self) -> tuple:
        """The op's arguments."""
        return self.saving.args[1:]

    @property
    def single(self) -> bool:
        return len(self.op._schema.returns) == 1


class Replayable:
    """The random ops of a joint graph rewritten by :func:`make_replayable`: their outputs
    are values a partition may recompute from the kept state and the op's inputs
    (:attr:`inputs`), by a replay that :meth:`settle` writes once it has chosen."""

    def __init__(self, graph: fx.Graph, draws: list[_Draw]):
        self.graph = graph
        self.draws = draws
        self.inputs: dict[fx.Node, list[fx.Node]] = {
            out: [d.state, *d.saving.all_input_nodes] for d in draws
            for out in d.drawn.values()}
        """What recomputing each drawn output reads: the state and the op's inputs."""

    def settle(self, recomputed: list[fx.Node], backward: set[fx.Node]) -> list[str]:
        """The graph made as the partition chose, ``recomputed`` being the values the
        backward computes again (in the graph's order) and ``backward`` its nodes: a drawn
        output recomputed is read from the op's replay, and each recomputed value that
        reads one (directly or through others) is copied to read the replay, the
        backward reading the copies; the ops with no output recomputed are turned back
        into the op as it was. Returns the ops replayed, each with its node's name."""
        draw_of = {out: d for d in self.draws for out in d.drawn.values()}
        again: dict[fx.Node, fx.Node] = {}  # (a recomputed value -> its backward's node)
        replayed: dict[_Draw, fx.Node] = {}
        for node in recomputed:  # (in the graph's order: a value's inputs first)
            draw = draw_of.get(node)
            if draw is not None:
                if draw not in replayed:
                    replayed[draw] = self._replay(draw, node, again)
                if draw.single:
                    again[node] = replayed[draw]
                else:
                    with self.graph.inserting_after(replayed[draw]):
                        again[node] = self.graph.call_function(
                            operator.getitem, (replayed[draw], node.args[1]))
                    again[node].meta = dict(node.meta)
            elif any(a in again for a in node.all_input_nodes):
                with self.graph.inserting_after(node):
                    again[node] = self.graph.node_copy(node, lambda a: again.get(a, a))
        for draw in self.draws:
            if draw not in replayed:
                self._restore(draw)
        for node in backward:
            if node.op != "output":
                for a in node.all_input_nodes:
                    if a in again:
                        node.replace_input_with(a, again[a])
        return [f"{draw.op} ({draw.saving.name})" for draw in replayed]

    def _replay(self, draw: _Draw, after: fx.Node, again: dict[fx.Node, fx.Node]) -> fx.Node:
        """``draw``'s op run again from its state, on its inputs as the backward has them,
        after ``after``."""
        with self.graph.inserting_after(after):
            node = self.graph.call_function(
                _REPLAY, (draw.state, draw.op, *fx.map_arg(draw.args, lambda a: again.get(a, a))),
                fx.map_arg(draw.saving.kwargs, lambda a: again.get(a, a)))
        node.meta = dict(draw.outputs.meta)
        return node

    def _restore(self, draw: _Draw) -> None:
        """The op as it was, its outputs the nodes they were."""
        with self.graph.inserting_before(draw.saving):
            original = self.graph.call_function(draw.op, draw.args, draw.saving.kwargs)
        original.meta = dict(draw.outputs.meta)
        draw.outputs.replace_all_uses_with(original)
        for node in (draw.outputs, draw.state, draw.saving):
            self.graph.erase_node(node)


def make_replayable(graph: fx.Graph, backward: set[fx.Node]) -> Replayable:
    """Each random op of ``graph`` whose outputs the ``backward`` nodes read, directly or
    through other values, rewritten to keep its generator's state (see the module's
    docstring); the ops with a generator of their own, or a dropout that drops nothing,
    stay as they are.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def step(x, grad):  # a forward's dropout, and a backward reading its mask
    ...     out, mask = torch.ops.aten.native_dropout(x, 0.5, True)
    ...     return out, grad * mask
    >>> gm = make_fx(step)(torch.ones(8), torch.ones(8))
    >>> backward = {n for n in gm.graph.nodes if n.name == "mul"}
    >>> replayable = make_replayable(gm.graph, backward)
    >>> mask = next(n for n in gm.graph.nodes if n.name == "getitem_1")
    >>> replayable.settle([mask], backward)  # the backward replays the mask
    ['aten.native_dropout.default (run_and_save_rng_state)']
    >>> _ = gm.recompile()
    >>> out, back = gm(torch.ones(1000), torch.ones(1000))
    >>> torch.equal(out != 0, back != 0)  # the backward's mask is the forward's
    True
    """
    read = _read_by(graph, backward)
    draws = []
    for node in list(graph.nodes):
        if node not in read or not _replayable(node) or draws_nothing(node):
            continue
        op, single = node.target, len(node.target._schema.returns) == 1
        # (the op's output nodes, by their index among its outputs)
        drawn = {0: node} if single else {
            u.args[1]: u for u in node.users if u.target is operator.getitem}
        if not single and len(drawn) != len(node.users):
            continue
        value = node.meta.get("val")
        state_value = _state_like(value if single else value[0])
        with graph.inserting_before(node):
            saving = graph.call_function(_SAVING, (op, *node.args), node.kwargs)
            state = graph.call_function(operator.getitem, (saving, 0))
        saving.meta = {**node.meta, "val": (state_value, value)}
        state.meta = {**node.meta, "val": state_value}
        # (the output nodes stay, read from the new one: a partition's choice made before
        # the rewrite names them still)
        if single:
            node.target, node.args, node.kwargs = operator.getitem, (saving, 1), {}
            outputs = node
        else:
            with graph.inserting_before(node):
                outputs = graph.call_function(operator.getitem, (saving, 1))
            outputs.meta = dict(node.meta)
            for out in drawn.values():
                out.update_arg(0, outputs)
            graph.erase_node(node)
        draws.append(_Draw(op, saving, outputs, drawn, state))
    return Replayable(graph, draws)


def _replayable(node: fx.Node) -> bool:
    """A call of an aten random op whose outputs are tensors and which draws from its
    device's default generator (no generator of its own given): one whose state
    :func:`make_replayable` can keep."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or (
            op.namespace != "aten" or torch.Tag.nondeterministic_seeded not in op.tags
            or op._schema.is_mutable):
        return False
    schema, given = op._schema, _arguments(node)
    return bool(schema.returns) and all(str(r.type) == "Tensor" for r in schema.returns) and (
        all(given.get(a.name) is None for a in schema.arguments
            if "Generator" in str(a.type)))


def _arguments(node: fx.Node) -> dict[str, object]:
    """An operator call's arguments by their names in its schema, those not given at their
    defaults (aot_autograd traces sdpa's CPU kernel with ``dropout_p`` left at its 0)."""
    schema = node.target._schema.arguments
    defaults = {a.name: a.default_value for a in schema if a.has_default_value()}
    return defaults | dict(zip((a.name for a in schema), node.args)) | node.kwargs


def _read_by(graph: fx.Graph, backward: set[fx.Node]) -> set[fx.Node]:
    """The nodes outside ``backward`` whose values its nodes read, directly or through
    other such nodes."""
    read: set[fx.Node] = set()
    stack = [a for n in backward for a in n.all_input_nodes if a not in backward]
    while stack:
        node = stack.pop()
        if node not in read:
            read.add(node)
            stack.extend(a for a in node.all_input_nodes if a not in backward)
    return read


def _state_like(value: torch.Tensor) -> torch.Tensor:
    """A (fake, where ``value`` is) tensor like the state of ``value``'s device's
    generator (a CPU tensor, a CUDA generator's too): a kept state's value in a traced
    graph."""
    mode = getattr(value, "fake_mode", None)
    with contextlib.nullcontext() if mode is None else mode:
        return torch.empty(_state_size(value.device), dtype=torch.uint8)


@functools.cache
def _state_size(device: torch.device) -> int:
    with unset_fake_temporarily():
        return generator_state(device).numel()


def draws_nothing(node: fx.Node) -> bool:
    """Whether a random op's node draws nothing: a dropout asked to drop with probability
    0 (attention without dropout, which aot_autograd traces as the op that can drop), or
    not in training.

    >>> g = fx.Graph()
    >>> x = g.placeholder("x")
    >>> draws_nothing(g.call_function(torch.ops.aten.native_dropout.default, (x, 0.0, True)))
    True
    >>> sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    >>> draws_nothing(g.call_function(sdpa, (x, x, x), {"scale": 0.125}))  # (p left at 0)
    True
    """
    given = _arguments(node)
    return any(name in given and given[name] == 0 for name in ("dropout_p", "p")) or (
        given.get("train", True) is False)
