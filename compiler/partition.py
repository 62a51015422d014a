"""What a training graph saves for its backward pass, and what the backward recomputes,
chosen under a memory budget.

aot_autograd traces a graph's forward and backward into one joint graph and then splits
it: every value the backward reads from the forward is either *saved* (an output of the
forward graph, alive until the backward runs) or *recomputed* (copied into the backward
graph, from saved values and the inputs). :class:`BudgetedPartition` makes that choice as
an extraction: a mixed-integer program (HiGHS) over the forward's values, one pair of 0/1
choices for each (saved, recomputed), that minimises the estimated time of the
recomputation while the saved bytes stay within the budget:

- a value the backward reads is saved or recomputed;
- a recomputed value's inputs are saved, recomputed, or inputs of the graph (parameters
  and inputs exist anyway and cost nothing to keep);
- a random op (dropout) is recomputed only by replaying it from its generator's state,
  which the forward then keeps (:mod:`compiler.replay`): the backward draws the
  forward's numbers; ops that change a tensor in place, update one (batch norm's running
  statistics) or read one the forward changes are never recomputed; a value a user's
  ``torch.utils.checkpoint`` region marks for recomputation is not saved;
- a view costs the bytes of the storage it keeps alive (a view of a parameter, nothing).

The budget is bytes, or a fraction of what torch's own min-cut partitioner (Inductor's
default) saves for the same joint graph; a budget below the least any partition saves is
an error that names that least. Which of the graph's equivalent forms is partitioned (a
fused attention saves a row statistic, a written-out one a probability matrix) is chosen
with it by :mod:`compiler.forms`; a :class:`compiler.forms.FormChoice` given to
:meth:`BudgetedPartition.keeping` holds the partition to the budget the choice took from
the source's joint graph.

>>> import torch
>>> from torch._dynamo.backends.common import aot_autograd
>>> from torch._functorch.aot_autograd import make_boxed_func
>>> choice = BudgetedPartition(MemoryBudget(fraction=0.5))
>>> backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), partition_fn=choice)
>>> linear = torch.nn.Linear(64, 64, bias=False)
>>> f = torch.compile(lambda x: linear(x).tanh().sin().sum(), backend=backend)
>>> x = torch.randn(32, 64)
>>> f(x).backward()
>>> decision = choice.decisions[-1]  # x (8 KiB) must stay; min-cut keeps tanh's 8 KiB too
>>> decision.least_bytes, decision.min_cut_bytes, decision.budget_bytes
(8192, 16384, 8192)
>>> decision.saved_bytes, "mm" in decision.recomputed  # tanh does not fit: recomputed
(8192, True)
>>> w = linear.weight.detach().requires_grad_()
>>> expected = torch.func.grad(lambda w: (x @ w.t()).tanh().sin().sum())(w)
>>> torch.allclose(linear.weight.grad, expected, atol=1e-5)
True
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from compiler.replay import Replayable, draws_nothing, make_replayable

__all__ = ["BudgetedPartition", "MemoryBudget", "SavedForBackward", "UnmetMemoryBudget",
           "seconds_of"]

SOLVE_SECONDS = 2.0
"""The time the mixed-integer program may take; past it, its best answer so far is used
(and the report gives its distance from the bound)."""


@dataclass(frozen=True)
class MemoryBudget:
    """The activations a training graph may save for its backward: a ``fraction`` in
    (0, 1] of what torch's min-cut partitioner saves, or ``bytes``.

    >>> MemoryBudget(fraction=0.5), MemoryBudget(bytes=1 << 20).bytes
    (MemoryBudget(fraction=0.5, bytes=None), 1048576)
    >>> MemoryBudget(fraction=1.5)
    Traceback (most recent call last):
    ...
    ValueError: memory_budget=1.5: a fraction in (0, 1] of what torch's min-cut partitioner saves
    """

    fraction: float | None = None
    bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.bytes is None):
            raise ValueError("a memory budget is a fraction (memory_budget) or a number of "
                             "bytes (memory_budget_bytes), one of them")
        if self.fraction is not None and (
                isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float))
                or not 0 < self.fraction <= 1):
            raise ValueError(f"memory_budget={self.fraction!r}: a fraction in (0, 1] of "
                             "what torch's min-cut partitioner saves")
        if self.bytes is not None and (isinstance(self.bytes, bool)
                                       or not isinstance(self.bytes, int) or self.bytes < 0):
            raise ValueError(f"memory_budget_bytes={self.bytes!r}: a number of bytes, an "
                             "integer >= 0")

    def of(self, min_cut: int) -> int:
        """The budget in bytes, for a graph whose min-cut partition saves ``min_cut`` bytes.

        >>> MemoryBudget(fraction=0.5).of(1000), MemoryBudget(bytes=300).of(1000)
        (500, 300)
        """
        return self.bytes if self.bytes is not None else int(self.fraction * min_cut)

    def unmet(self, min_cut: int, least: int) -> str:
        """Why no partition of a graph meets this budget, and what would: the least the
        graph can save, as bytes and as a fraction of ``min_cut``."""
        asked = (f"memory_budget_bytes={self.bytes}" if self.bytes is not None else
                 f"memory_budget={self.fraction} ({self.of(min_cut)} bytes of the {min_cut} "
                 f"torch's min-cut partitioner saves)")
        return (f"{asked}: no partition of this graph saves so little for its backward; the "
                f"least it can save is {least} bytes (inputs the backward reads, random ops' "
                f"generator states, values no op recomputes), a fraction of "
                f"{math.ceil(1000 * least / max(min_cut, 1)) / 1000:g}: raise the budget to "
                f"at least that")


class UnmetMemoryBudget(ValueError):
    """No choice of what to save meets the budget: the error names the least that can be
    saved; ``least_bytes``, ``budget_bytes`` and ``min_cut_bytes`` hold it, the budget
    and what the min-cut partitioner saves, where they are known."""

    def __init__(self, message: str, least_bytes: int | None = None,
                 budget_bytes: int | None = None, min_cut_bytes: int | None = None):
        super().__init__(message)
        self.least_bytes, self.budget_bytes = least_bytes, budget_bytes
        self.min_cut_bytes = min_cut_bytes


@dataclass
class SavedForBackward:
    """One partition's choice: ``saved`` and ``recomputed`` values (name -> bytes; a view's
    are its storage's), the bytes the saved values keep alive (``saved_bytes``: each storage
    once), the ``budget_bytes``, what torch's min-cut partitioner saves
    (``min_cut_bytes``), the least any partition can save (``least_bytes``), the
    estimated seconds the recomputation adds (``recompute_seconds``), the solver's time,
    whether its answer is proven optimal (else it is the best found in
    :data:`SOLVE_SECONDS`), and the random ops the backward draws again from their saved
    generator states (``replayed``, :mod:`compiler.replay`); ``form``: where the form of
    the graph was chosen with it (:mod:`compiler.forms`), that choice (the budget and the
    min-cut bytes are then the source's)."""

    saved: dict[str, int]
    recomputed: dict[str, int]
    saved_bytes: int
    budget_bytes: int
    min_cut_bytes: int
    least_bytes: int
    recompute_seconds: float
    solve_seconds: float
    optimal: bool
    replayed: list[str] = field(default_factory=list)
    form: Any = None

    def __str__(self) -> str:
        mib = 1 / (1 << 20)
        return (f"saved {len(self.saved)} values, {self.saved_bytes * mib:.2f} MiB (budget "
                f"{self.budget_bytes * mib:.2f}, min-cut {self.min_cut_bytes * mib:.2f}, least "
                f"{self.least_bytes * mib:.2f}); recomputed {len(self.recomputed)} values, "
                f"{sum(self.recomputed.values()) * mib:.2f} MiB, about "
                f"{self.recompute_seconds * 1e3:.3f} ms; solved in "
                f"{self.solve_seconds * 1e3:.0f} ms"
                + ("" if self.optimal else ", not proven optimal")
                + (f"; replayed {len(self.replayed)} random ops from their saved states"
                   if self.replayed else "")
                + (f"; {self.form}" if self.form is not None else ""))


class BudgetedPartition(CustomPartitionerFn):
    """A ``partition_fn`` for aot_autograd (and Inductor's ``custom_partitioner_fn``):
    the joint graph split so that the forward saves at most ``budget``, recomputing in
    the backward what it does not save, at the least estimated time (see the module's
    docstring). ``fused``: the backward's code fuses a recomputed pointwise op into the
    kernel that reads it (Inductor's), so it costs its arithmetic only. Each call's choice
    is appended to ``decisions``."""

    def __init__(self, budget: MemoryBudget, fused: bool = False):
        self.budget = budget
        self.fused = fused
        self.decisions: list[SavedForBackward] = []
        self.kept_inputs: tuple[int, ...] = ()
        self.form: Any = None

    @contextmanager
    def keeping(self, indices: Iterable[int], form: Any = None) -> Iterator[None]:
        """Within the block, the joint graph's inputs at ``indices`` are parameters (free to
        keep) besides those aot_autograd marks: where it cannot tell (a graph that did not
        come from dynamo, as the emitted module handed to Inductor); with ``form`` (a
        :class:`compiler.forms.FormChoice`), the graph is that form of its source, held to
        the budget in bytes the choice took from the source's joint graph."""
        self.kept_inputs, self.form = tuple(indices), form
        try:
            yield
        finally:
            self.kept_inputs, self.form = (), None

    def __call__(self, joint_module: fx.GraphModule, joint_inputs: Sequence[Any], *,
                 num_fwd_outputs: int, static_lifetime_input_indices: list[int] | None = None,
                 **_: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch import config as functorch_config
        from torch._functorch import partitioners as p

        joint_module.graph.eliminate_dead_code()
        joint_module.recompile()
        if functorch_config.cse:
            joint_module.graph = p.fx_graph_cse(joint_module.graph)
        if p.has_recomputable_ops(joint_module):
            joint_module = p.cleanup_recompute_tags(joint_module, is_default_partition=False)
        p.force_save_collectives(joint_module)
        p.force_save_effectful_ops(joint_module)
        p.force_save_bw_mutation_src(joint_module)
        static = sorted({*(static_lifetime_input_indices or ()), *self.kept_inputs})
        info = p.classify_nodes(joint_module, static, num_fwd_outputs)
        if not info.required_bw_nodes:
            return p.default_partition(
                joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_indices=static,
                static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        _, gradients, _, _ = p._extract_fwd_bwd_outputs(joint_module,
                                                        num_fwd_outputs=num_fwd_outputs)
        # (what torch's min-cut partitioner saves: of the graph as traced, its random ops'
        # outputs saved)
        min_cut = self._min_cut(joint_module.graph, info)
        replayable = make_replayable(joint_module.graph, info.required_bw_nodes)
        if replayable.draws:
            info = p.classify_nodes(joint_module, static, num_fwd_outputs)
        saved = self._choose(joint_module.graph, info, gradients, min_cut, replayable)
        if replayable.draws:
            joint_module.recompile()
        sym = [n for n in saved if p.is_sym_node(n)]
        fw, bw = p._extract_fwd_bwd_modules(
            joint_module, [n for n in saved if not p.is_sym_node(n)], saved_sym_nodes=sym,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        bw = p.reordering_to_mimic_autograd_engine(bw)
        return p.raise_getitems(fw), p.raise_getitems(bw)

    @staticmethod
    def _min_cut(graph: fx.Graph, info) -> list[fx.Node]:
        """What torch's min-cut partitioner saves for ``graph``."""
        from torch._functorch import partitioners as p

        for node in reversed(graph.nodes):  # (what the min-cut solver reads)
            if node.op != "output" and not info.is_required_fw(node):
                node.dist_from_bw = 0
            else:
                node.dist_from_bw = min((u.dist_from_bw + 1 for u in node.users),
                                        default=int(1e9))
        return p.choose_saved_values_set(graph, info, memory_budget=1.0)

    def _choose(self, graph: fx.Graph, info, gradients: list, min_cut_saves: list[fx.Node],
                replayable: Replayable) -> list[fx.Node]:
        """The values the forward saves (see the module's docstring), the random ops the
        backward does not replay turned back as they were."""
        started = time.perf_counter()
        problem = _Problem(graph, info, gradients, self.fused, replayable.inputs)
        min_cut = problem.bytes_of(min_cut_saves)
        least = problem.least()
        budget = self.budget.of(min_cut)
        if self.form is not None:  # (the source's min-cut, which the budget is of)
            budget, min_cut = self.form.budget_bytes, self.form.min_cut_bytes
        if least > budget:
            raise UnmetMemoryBudget(self.budget.unmet(min_cut, least), least, budget, min_cut)
        chosen, optimal = problem.solve(budget)
        parameters = problem.free_inputs_read(chosen["recomputed"])
        replayed = replayable.settle(chosen["recomputed"], info.required_bw_nodes)
        self.decisions.append(SavedForBackward(
            saved={n.name: b for n, b in problem.sizes(chosen["saved"])},
            recomputed={n.name: b for n, b in problem.sizes(chosen["recomputed"])},
            saved_bytes=problem.bytes_of(chosen["saved"]), budget_bytes=budget,
            min_cut_bytes=min_cut, least_bytes=least,
            recompute_seconds=sum(problem.seconds[n] for n in chosen["recomputed"]),
            solve_seconds=time.perf_counter() - started, optimal=optimal,
            replayed=replayed, form=self.form))
        return chosen["saved"] + parameters

    def uuid(self) -> Any:
        """The key Inductor's caches file this partitioner's programs under: its code and
        the replay's, the hardware profiles its estimates read, the budget."""
        from torch._inductor.custom_graph_pass import get_hash_for_files

        import compiler.replay
        import extractors.hardware
        from extractors.calibration import cpu_profile

        return (get_hash_for_files((__file__, compiler.replay.__file__,
                                    extractors.hardware.__file__)),
                repr(cpu_profile()), self.budget, self.fused, None if self.form is None else
                (self.form.budget_bytes, self.form.min_cut_bytes))


class _Problem:
    """The choice of what to save, as a mixed-integer program over a joint graph's
    forward values (:class:`BudgetedPartition`): a pair of 0/1 columns for each value,
    saved and recomputed. The values are the forward's ops and the inputs that are not
    parameters (an activation from an earlier graph costs its bytes when saved, and
    cannot be recomputed here); parameters cost nothing to keep. ``replays``: the values
    recomputed from other inputs than their node's (a random op's outputs, from its kept
    generator state: :class:`compiler.replay.Replayable`), and those inputs."""

    def __init__(self, graph: fx.Graph, info, gradients: list, fused: bool,
                 replays: dict[fx.Node, list[fx.Node]]):
        from torch._functorch import partitioners as p

        self.inputs = {n: replays.get(n) or n.all_input_nodes for n in graph.nodes}

        self.backward = bw = info.required_bw_nodes
        self.free = {n for n in graph.nodes if n.op == "placeholder" and (
            n in info.static_lifetime_input_nodes or p._is_fwd_seed_offset(n))}
        self.values = [n for n in graph.nodes if n not in bw and n not in self.free and (
            n.op == "call_function" or n.op == "placeholder" and p._is_primal(n))]
        self.index = {n: i for i, n in enumerate(self.values)}
        # (the output node counts as backward's: it returns the gradients)
        self.read = [n for n in self.values if n in gradients or any(
            u in bw and u.op != "output" for u in n.users)]
        self.seconds = {n: seconds_of(n, fused) for n in self.values}
        self.recomputable: dict[fx.Node, bool] = {}
        self.savable: dict[fx.Node, bool] = {}
        available: dict[fx.Node, bool] = {}
        # (the forward writes into these at its end)
        written = {n.args[0] for n in graph.nodes if isinstance(n.target, torch._ops.OpOverload)
                   and n.target._schema.is_mutable and n.args and isinstance(n.args[0], fx.Node)}
        for n in self.values:  # (in the graph's order: inputs first)
            inputs = [a for a in self.inputs[n] if a in self.index]
            # (a part of a multi-output op is recomputed with it; what reads an input the
            # forward changes cannot run after it)
            self.recomputable[n] = n in replays or _recomputable(n) and not (
                written.intersection(n.all_input_nodes)) and (
                n.target is not operator.getitem or self.recomputable.get(inputs[0], False))
            can_save = isinstance(n.meta.get("val"), torch.Tensor) or p.is_sym_node(n)
            recomputable = self.recomputable[n] and all(available[a] for a in inputs)
            # (a value a checkpoint region marks is recomputed, where it can be)
            self.savable[n] = can_save and not (p.must_recompute(n) and recomputable)
            available[n] = self.savable[n] or recomputable
        self.size = np.array([float(self.nbytes(v)) for v in self.values])
        self.rows, self.budget_row = self._rows()
        self.upper = np.concatenate([[float(self.savable[v]) for v in self.values],
                                     [float(self.recomputable[v]) for v in self.values]])

    def _base(self, node: fx.Node) -> fx.Node | None:
        """The value whose storage ``node`` uses (None: a parameter's, which is free)."""
        while isinstance(node.args[0] if node.args else None, fx.Node) and (
                getattr(node.target, "is_view", False) or node.target is operator.getitem
                and getattr(node.args[0].target, "is_view", False)):  # (a split's part)
            node = node.args[0]
        return node if node in self.index else None

    def nbytes(self, node: fx.Node) -> int:
        """The bytes saving ``node`` keeps alive (a view: its base's storage)."""
        base = self._base(node)
        return 0 if base is None else _nbytes(base.meta.get("val"))

    def bytes_of(self, nodes: Iterable[fx.Node]) -> int:
        """The bytes saving ``nodes`` keeps alive (each storage once)."""
        bases = {self._base(n) for n in nodes} - {None}
        return sum(_nbytes(b.meta.get("val")) for b in bases)

    def sizes(self, nodes: Iterable[fx.Node]) -> list[tuple[fx.Node, int]]:
        return [(n, self.nbytes(n)) for n in nodes]

    def free_inputs_read(self, recomputed: list[fx.Node]) -> list[fx.Node]:
        """The parameters the backward reads, itself or to recompute: saved beside the
        chosen values (they exist anyway)."""
        readers = [*recomputed, *(n for n in self.backward if n.op != "output")]
        return list({a: None for n in readers for a in self.inputs[n] if a in self.free})

    def _rows(self):
        """The constraints, and the index of the budget's row (its bound set per solve):
        a value the backward reads is saved or recomputed; a recomputed value's inputs
        are saved or recomputed."""
        from egraph.extract.highs import Rows

        n = len(self.values)
        rows = Rows()
        for v in self.read:
            rows.add([self.index[v], n + self.index[v]], [1.0, 1.0], 1.0, 2.0)
        for v in self.values:
            for a in self.inputs[v]:
                if a in self.index:
                    rows.add([n + self.index[v], self.index[a], n + self.index[a]],
                             [1.0, -1.0, -1.0], -math.inf, 0.0)
        budget_row = len(rows.lower)
        rows.add(list(range(n)), list(self.size), -math.inf, math.inf)
        return rows, budget_row

    def _run(self, cost: np.ndarray, budget: float, rel_gap: float):
        from egraph.extract.highs import solve_mip

        self.rows.upper[self.budget_row] = budget
        return solve_mip(cost, np.zeros(len(cost)), self.upper, len(cost), self.rows, None,
                         time.perf_counter() + SOLVE_SECONDS, rel_gap, False)

    def least(self) -> int:
        """The least bytes any partition saves (past the solver's deadline, what saving
        every value the backward reads takes)."""
        values, _ = self._run(np.concatenate([self.size, np.zeros(len(self.values))]),
                              math.inf, 1e-6)
        if values is None:  # (the solver's deadline)
            return self.bytes_of(self.read)
        return int(round(float(self.size @ np.array(values[:len(self.values)]))))

    def solve(self, budget: int) -> tuple[dict[str, list[fx.Node]], bool]:
        """``({"saved": [...], "recomputed": [...]}, optimal?)``: the least recomputation
        time within ``budget`` bytes (of choices of equal time, the one saving least)."""
        seconds = np.array([self.seconds[v] for v in self.values])
        tie = 1e-6 * (seconds.max(initial=0.0) or 1.0) / max(self.size.sum(), 1.0)
        values, optimal = self._run(np.concatenate([self.size * tie, seconds]),
                                    budget + 0.5, 1e-4)
        if values is None:
            raise UnmetMemoryBudget(f"memory budget {budget} bytes: the solver found no "
                                    f"partition within it in {SOLVE_SECONDS} s")
        return self._needed(values), optimal

    def _needed(self, values: Sequence[float]) -> dict[str, list[fx.Node]]:
        """The solver's choice, cut to what the backward needs: the values it reads, and
        for each one recomputed and not saved, the values its recomputation reads."""
        saved: dict[fx.Node, None] = {}
        recomputed: dict[fx.Node, None] = {}
        stack = list(self.read)
        while stack:
            v = stack.pop()
            if v in saved or v in recomputed:
                continue
            i = self.index[v]
            if values[i] > 0.5:
                saved[v] = None
            else:
                recomputed[v] = None
                stack.extend(a for a in self.inputs[v] if a in self.index)
        return {"saved": sorted(saved, key=self.index.get),
                "recomputed": sorted(recomputed, key=self.index.get)}


def _nbytes(value: Any) -> int:
    """The bytes of a tensor value (its hint where its size is symbolic)."""
    if not isinstance(value, torch.Tensor):
        return 0
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    return optimization_hint(value.numel(), fallback=4096) * value.dtype.itemsize


def _recomputable(node: fx.Node) -> bool:
    """Whether the backward may compute ``node`` again: not a random op (it would draw
    anew; :mod:`compiler.replay`'s replay of one is not random), not an op that changes a
    tensor in place or has effects."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        # (a *_functional op is functionalisation's form of one that updates its inputs:
        # batch norm's running statistics, which the forward changes once it has run)
        if target._schema.is_mutable or target._schema.name.endswith("_functional") or (
                torch.Tag.nondeterministic_seeded in target.tags and not draws_nothing(node)):
            return False
    elif isinstance(target, torch._ops.HigherOrderOperator):
        return False
    return node.op == "call_function"


def _pointwise(node: fx.Node) -> bool:
    """Whether ``node`` is a pointwise op (fused code computes it where it is read)."""
    return isinstance(node.target, torch._ops.OpOverload) and (
        torch.Tag.pointwise in node.target.tags)


_MATRIX = {"mm": lambda a, b: 2 * a[0] * a[1] * b[1],
           "addmm": lambda c, a, b: 2 * a[0] * a[1] * b[1],
           "bmm": lambda a, b: 2 * a[0] * a[1] * a[2] * b[2],
           "baddbmm": lambda c, a, b: 2 * a[0] * a[1] * a[2] * b[2]}


def seconds_of(node: fx.Node, fused: bool) -> float:
    """The estimated time of computing ``node`` (once more, in the backward), on the
    hardware profile of its device: a roofline of its FLOPs and the bytes it moves, with a
    launch; an op of several outputs (a fused attention, a layer norm, a convolution's
    backward) writes them all; a pointwise op in fused code whose readers are pointwise
    too costs its arithmetic only (it runs inside their kernel; read by a matrix product or
    a reduction, it is written out first). Views and sizes cost next to nothing.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> a = torch.randn(256, 256)
    >>> product, = (n for n in make_fx(torch.mm)(a, a).graph.nodes if n.op == "call_function")
    >>> 1e-6 < seconds_of(product, fused=False) < 1e-2  # 34 MFLOP
    True
    """
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    from extractors.calibration import cpu_profile
    from extractors.hardware import HARDWARE

    value = node.meta.get("val")
    target = node.target
    outputs = [v for v in (value if isinstance(value, (tuple, list)) else (value,))
               if isinstance(v, torch.Tensor)]
    if not outputs or getattr(target, "is_view", False):
        return 1e-9
    value = outputs[0]
    hw = cpu_profile() if value.device.type == "cpu" else HARDWARE["H100"]
    out = sum(map(_nbytes, outputs))
    elements = _nbytes(value) / value.dtype.itemsize
    name = getattr(getattr(target, "_overloadpacket", None), "__name__", str(target))
    shapes = [[optimization_hint(s, fallback=4096) for s in a.meta["val"].shape]
              for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    flops, kind = elements, "add"
    if name in _MATRIX and len(shapes) == len(_MATRIX[name].__code__.co_varnames):
        flops, kind = _MATRIX[name](*shapes), "matmul"
    elif name == "convolution":
        weight = shapes[1]
        flops, kind = 2 * elements * math.prod(weight[1:]), "conv2d"
    elif name == "convolution_backward":  # (the input's gradient and the weight's)
        flops, kind = 4 * math.prod(shapes[0]) * math.prod(shapes[2][1:]), "conv2d"
    elif "scaled_dot_product" in name:
        # (the backward, reading the output's gradient first, does 2.5x the products)
        backward = name.endswith("_backward")
        q, k = shapes[backward], shapes[1 + backward]
        flops, kind = 4 * math.prod(q) * k[-2] * (2.5 if backward else 1), "sdpa"
    moved = out + sum(_nbytes(a.meta.get("val")) for a in node.all_input_nodes)
    compute = hw.compute_time(kind, flops, value.dtype, moved)
    compute = max(compute, hw.element_time(name, elements))
    if fused and _pointwise(node) and all(map(_pointwise, node.users)):
        return compute + 1e-9  # (inside the kernel of the op that reads it)
    return max(compute, hw.moving(moved)) + hw.launch_overhead
