"""The form of a training graph chosen together with what it saves for its backward.

Equivalent programs save different things for the backward: a written-out attention
saves its T x T probabilities, ``scaled_dot_product_attention`` a row statistic; a fused
normalisation its mean and reciprocal deviation, a written-out one the centred tensor. The
program extracted for time alone is not the one to train under a memory budget, and a
partition of one program's joint graph cannot see another's. :func:`choose_form` makes
the two choices together: for each candidate form of a graph (the source, and the e-graph's
programs under a time cost and under :class:`extractors.peak.PeakMemory`:
:func:`training_forms`), it traces the joint forward-backward graph, partitions it under
the budget (:class:`compiler.partition.BudgetedPartition`: the least recomputation within
it), prices the partitioned forward and backward (the partition's own estimate of each
op, so that a form that recomputes more pays for it), and keeps the fastest form that
meets the budget. The budget's fraction is of what torch's min-cut partitioner saves for
the *source's* joint graph, so a form that saves less meets a tighter budget with less
recomputation.

>>> import torch
>>> from compiler.partition import MemoryBudget
>>> def f(x, w):  # a softmax written out: its backward reads the output
...     e = (x @ w).exp()
...     return ((e / e.sum(-1, keepdim=True)).sum(),)
>>> gm = torch.fx.symbolic_trace(f)
>>> inputs = (torch.randn(64, 32), torch.randn(32, 64, requires_grad=True))
>>> choice = choose_form({"source": gm}, inputs, MemoryBudget(fraction=1.0))
>>> choice.name, choice.budget_bytes == choice.min_cut_bytes, len(choice.trials)
('source', True, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from compiler.options import BackendOptions
from compiler.partition import BudgetedPartition, MemoryBudget, UnmetMemoryBudget, seconds_of

__all__ = ["FormChoice", "FormTrial", "choose_form", "training_forms"]


@dataclass(frozen=True)
class FormTrial:
    """One candidate form under the budget: the bytes its partition saves (None: no
    partition of it meets the budget), the least any partition of it saves, and the
    estimated seconds of its partitioned forward and backward, recomputation included."""

    name: str
    saved_bytes: int | None
    least_bytes: int
    seconds: float | None

    def __str__(self) -> str:
        if self.seconds is None:
            return f"{self.name}: over the budget (least {self.least_bytes / 2**20:.2f} MiB)"
        return (f"{self.name}: saves {self.saved_bytes / 2**20:.2f} MiB, about "
                f"{self.seconds * 1e3:.2f} ms")


@dataclass
class FormChoice:
    """The form kept (``name``, ``module``), the budget in bytes and what the min-cut
    partitioner saves for the source's joint graph (which a fractional budget is of), and
    every form's trial."""

    name: str
    module: fx.GraphModule | None
    budget_bytes: int
    min_cut_bytes: int
    trials: list[FormTrial]

    def __str__(self) -> str:
        return f"form {self.name!r} of {len(self.trials)} ({'; '.join(map(str, self.trials))})"


def training_forms(gm: fx.GraphModule, example_inputs: Sequence[Any], options: BackendOptions,
                   fused: bool = False) -> dict[str, fx.GraphModule]:
    """The candidate forms of a training graph: the ``source`` and the e-graph's programs
    under the default time cost (``fused`` where Inductor generates the code) and under
    :class:`extractors.peak.PeakMemory`, in torch's ops, not the machine's kernels (the
    pipeline chooses those for the partitioned forward and backward), each distinct one
    once; a program that fell back to the source is the source.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (x * 2 * 3).sum())
    >>> sorted(training_forms(gm, (torch.randn(4, requires_grad=True),), BackendOptions()))
    ['source', 'time']
    """
    from compiler.pipeline import compile_one, default_cost
    from extractors.costs import KernelBlind
    from extractors.peak import PeakMemory

    # (torch's own ops: aot_autograd differentiates a kernel of ours, oneDNN's product, into
    # plain products the backward's pipeline no longer gives to oneDNN's kernel)
    costs = {"time": KernelBlind(options.cost or default_cost(example_inputs, fused=fused)),
             "peak memory": PeakMemory()}
    forms: dict[str, fx.GraphModule] = {"source": gm}
    seen = {gm.code}
    for name, cost in costs.items():
        module = compile_one(gm, example_inputs, dataclasses.replace(options, cost=cost),
                             target="cpu", name=f"training form under {name}")
        if module.meta["egraph_graph"].fell_back or module.code in seen:
            continue
        seen.add(module.code)
        forms[name] = module
    return forms


def choose_form(forms: Mapping[str, fx.GraphModule], example_inputs: Sequence[Any],
                budget: MemoryBudget, fused: bool = False,
                kept: Callable[[fx.GraphModule], Sequence[int]] = lambda module: ()
                ) -> FormChoice:
    """The fastest of ``forms`` (name -> module, the source first) whose joint graph has a
    partition within ``budget`` (see the module's docstring); ``fused``: the code
    generator fuses pointwise ops (Inductor's); ``kept(module)``: the places of a form's
    own parameters among its joint graph's inputs (free to keep). A budget no form meets
    is an :class:`compiler.partition.UnmetMemoryBudget` naming the least any form saves.
    """
    names = list(forms)
    trials: list[FormTrial] = []
    budget_bytes = min_cut = None
    best: tuple[float, str] | None = None
    least = None
    for name in names:
        module = forms[name]
        partition = BudgetedPartition(budget if budget_bytes is None else
                                      MemoryBudget(bytes=budget_bytes), fused)
        with partition.keeping(kept(module)):
            try:
                seconds = _partitioned_seconds(module, example_inputs, partition, fused)
            except UnmetMemoryBudget as unmet:
                if unmet.min_cut_bytes is None:
                    raise
                budget_bytes = unmet.budget_bytes if budget_bytes is None else budget_bytes
                min_cut = unmet.min_cut_bytes if min_cut is None else min_cut
                least = unmet.least_bytes if least is None else min(least, unmet.least_bytes)
                trials.append(FormTrial(name, None, unmet.least_bytes, None))
                continue
        decision = partition.decisions[-1]
        if budget_bytes is None:
            budget_bytes, min_cut = decision.budget_bytes, decision.min_cut_bytes
        trials.append(FormTrial(name, decision.saved_bytes, decision.least_bytes, seconds))
        if best is None or seconds < best[0]:
            best = (seconds, name)
    if best is None:
        raise UnmetMemoryBudget(
            budget.unmet(min_cut, least).replace("no partition of this graph",
                                                 f"no partition of the {len(names)} forms "
                                                 "of this graph"),
            budget_bytes=budget_bytes, min_cut_bytes=min_cut, least_bytes=least)
    return FormChoice(best[1], forms[best[1]], budget_bytes, min_cut, trials)


def _partitioned_seconds(module: fx.GraphModule, example_inputs: Sequence[Any],
                         partition: BudgetedPartition, fused: bool) -> float:
    """The estimated seconds of ``module``'s forward and backward as ``partition`` splits
    its joint graph (traced by aot_autograd, with Inductor's decompositions where its code
    is ``fused``; compiled by nothing)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    graphs: list[fx.GraphModule] = []

    def split(joint: fx.GraphModule, inputs: Sequence[Any], **kwargs: Any):
        graphs.extend(partition(joint, inputs, **kwargs))
        return graphs[-2], graphs[-1]

    def boxed(gm: fx.GraphModule, _: Any) -> Callable:
        return make_boxed_func(gm)

    aot_autograd(fw_compiler=boxed, bw_compiler=boxed, partition_fn=split,
                 decompositions=select_decomp_table() if fused else None)(
        module, list(example_inputs))
    return sum(seconds_of(n, fused) for g in graphs for n in g.graph.nodes
               if n.op == "call_function")
