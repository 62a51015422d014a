"""Do the cost models rank a model's programs as the clock does? Whole programs of a
saturated e-graph, priced by every cost model and timed on the model's real inputs.

    .venv/bin/python benchmarks/cost_models.py [--models gpt2,resnet50] [--programs 24]
                                               [--rounds 60] [--seed 0] [--quick]

``benchmarks/cpu_profile.py`` checks the CPU profile on pairs of programs; this checks each
cost model on the programs one model's e-graph holds. Per model of the real-size corpus
(``benchmarks/real_size.py``: random weights, batch 1, sequences of 128 tokens, images at
224x224; by default GPT-2 small and ResNet-50; ``--quick``: their tiny configs, few
programs and rounds):

1. torch.export, ``EGraph.from_fx``, ``saturate(load_rules("all"))`` within :data:`LIMITS`
   (the export entry of ``benchmarks/models.py``).
2. ``--programs`` distinct programs (distinct at run time,
   :func:`compiler.autotune.run_key`), found in this order: the
   source; each cost model's choice (:func:`cost_models`) by the pipeline's method
   (:func:`compiler.fx.choose_program`: what ``extract`` emits) and by greedy and DAG
   extraction where those differ; the Pareto frontier of the default cost and Curvature
   (on e-graphs of at most :data:`PARETO_NODES` e-nodes); neighbours of the default's
   program, one class's e-node changed to another that keeps the program acyclic (the
   sub-programs it adds taken from the default's greedy choice), drawn in a seeded order;
   random extractions (:class:`extractors.RandomCost`), then more neighbours where those repeat
   programs. Each is emitted as the pipeline emits the default's choice
   (:func:`compiler.fx.emitter`: channels-last convolutions where the default cost model
   says they pay) and validated against the
   source on the example inputs (:class:`compiler.autotune.Candidates`, as the backend's
   autotuning finds its candidates); one that fails is listed and left out.
3. Timed: medians of interleaved rounds (every program once per round, in a seeded
   shuffled order, after a warm-up round), the source emitted twice; each call is
   bracketed by calls of a copy of the default's program, whose speed around it divides
   out the machine's drift (``reference`` of :func:`compiler.timing.interleaved_times`);
   rounds are added until the medians of the source's two copies differ by under 1%,
   up to ``--rounds``. The programs within 5% of the fastest are then timed again, head
   to head (:func:`confirm`), so that regret is not measured against a lucky median.
4. Per cost model: its price of every program (``egraph.extract.program.dag_cost``: each
   chosen e-node once, or the model's own whole-program cost), Spearman's rank
   correlation of the prices with the measured times (:func:`spearman`), and its regret:
   the time of the program it extracts over the fastest measured, minus 1.
5. The e-graph in extraction-gym's JSON (``egraph.serialize.to_json``) with measured
   node costs in seconds (:func:`measured_node_costs`): every timed program is run again
   node by node, each call's time charged to the e-node chosen for the class it computes
   (``backends.fx.EMITTED_CLASS``), an e-node's cost the median over the programs that
   ran it; an e-node no program ran is priced by the default cost model, scaled by the
   measured-to-priced ratio of its op. So the DAG cost of a timed program in the file is
   close to its measured time less Python's per-call overhead, and an extraction
   algorithm run on the file is judged by measured costs where they exist.

``--quick`` (``.venv/bin/python benchmarks/cost_models.py --quick``, under a minute) runs
the same steps on the tiny configs; ``--threads 1`` on a machine other jobs keep busy (two
intra-op threads wait on each other there, and tiny programs' times mean nothing).

Everything lands beside the results document (``benchmarks/results/cost_models.md``, or
``--out``): in the folder of its name without the suffix, ``<model>.json`` (the e-graph)
and ``<model>/<number>.py`` (each program's code).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.fx import EMITTED_CLASS  # noqa: E402
from benchmarks import real_size  # noqa: E402
from benchmarks.report import (  # noqa: E402
    add_out_option,
    markdown_table,
    results_path,
    write_results,
)
from compiler.autotune import Candidate, Candidates  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.fx import choose_program, emitter  # noqa: E402
from compiler.timing import interleaved_times, twin_gap  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.extract import best_nodes, choose, program_order, program_roots  # noqa: E402
from egraph.extract.pareto import pareto  # noqa: E402
from egraph.extract.program import dag_cost, is_acyclic, source_program  # noqa: E402
from egraph.ops.table import TABLE  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from egraph.serialize import to_json  # noqa: E402
from egraph.term import is_literal_op  # noqa: E402
from extractors import (  # noqa: E402
    AstSize,
    CostModel,
    Curvature,
    Flops,
    Memory,
    PeakMemory,
    RandomCost,
    Roofline,
)

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
"""Saturation limits: those of ``benchmarks/models.py``'s export entry."""
METHODS = ("auto", "greedy", "dag")
"""How each cost model's programs are extracted: ``auto`` is the pipeline's (the program
the model is judged by), the others where they give another program."""
PARETO_NODES = 20_000
"""The largest e-graph whose Pareto frontier is computed: its tree-cost frontiers are
built to a fixed point over every class, in Python."""
PARETO_LIMIT = 4
"""Points kept per class on the Pareto frontier."""
SPREAD = 0.01
"""Timing stops once the two copies of the source differ by less than this."""
MIN_ROUNDS = 9
CONTENDERS = 0.05
"""Programs measured within this of the fastest are timed again, head to head
(:func:`confirm`)."""
CONFIRM_ROUNDS = 21
PROFILE_RUNS = 3
"""Node-by-node profiles of each program, whose median times are its e-nodes'."""
SUBJECTS = ("gpt2", "resnet50")
"""The models run by default (``--models all``: every entry of ``benchmarks/real_size.py``)."""


# --- the models ------------------------------------------------------------------------

def build_subject(name: str, quick: bool = False) -> tuple[torch.nn.Module, tuple]:
    """Real-size corpus entry ``name`` (``benchmarks/real_size.py``) with its inputs at
    batch 1 and sequence 128 (images at their config's size); ``quick``: its tiny config."""
    case = real_size.build(name, batch=1, seq=128, tiny=quick)
    return case.model, case.inputs


def saturated(model: torch.nn.Module, inputs: tuple, rules=None) -> EGraph:
    """``model``'s e-graph as the pipeline's export entry makes it: torch.export, ingest,
    saturation with ``rules`` (default: the whole library) within :data:`LIMITS`."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, inputs)
        eg = EGraph.from_fx(program, inputs)
        eg.saturate(load_rules("all") if rules is None else rules, **LIMITS)
    return eg


def cost_models(inputs: tuple) -> dict[str, Any]:
    """The cost models judged, by name: the pipeline's default for the inputs' device
    (on the CPU, this machine's calibrated profile with each op its own kernel,
    :func:`extractors.calibration.cpu_profile`), the shipped CPU profile it was before
    calibration, the shipped profile with fusion regions as kernels (Inductor's code
    generation), AstSize, Flops, Memory, PeakMemory and Curvature."""
    return {"default": default_cost(inputs), "shipped profile": Roofline("cpu", fused=False),
            "cpu fused": Roofline("cpu"),
            "AstSize": AstSize(), "Flops": Flops(), "Memory": Memory(),
            "PeakMemory": PeakMemory(), "Curvature": Curvature()}


# --- the programs ----------------------------------------------------------------------

def collect_programs(egraph: EGraph, costs: dict[str, Any], limit: int, seed: int = 0
                     ) -> tuple[Candidates, dict[str, Candidate]]:
    """At least the source and each cost model's choice, then Pareto points, neighbours
    of the default's program and random extractions until ``limit`` distinct programs
    (the module docstring says how each is found). Returns the collection and, per cost
    model, the program its pipeline method extracts."""
    # (every cost model's choice is kept; each emitted as the pipeline emits the default's)
    found = Candidates(egraph, emitter(egraph, costs["default"]))
    roots = program_roots(egraph)
    source = source_program(egraph)
    found.offer("source", source)
    chosen: dict[str, Candidate] = {}
    for name, cost in costs.items():
        for method in METHODS:
            choice = choose_program(egraph, cost, method, roots)[0]
            label = name if method == "auto" else f"{name} {method}"
            program = found.offer(label, choice)
            if method == "auto" and program is not None:
                chosen[name] = program
    found.limit = max(limit, len(found.programs))
    if egraph.num_nodes <= PARETO_NODES:
        frontier = pareto(egraph, costs["default"], costs["Curvature"], limit=PARETO_LIMIT,
                          build=lambda choice, root: None)
        for i, point in enumerate(frontier):
            choice = {**source, **point.choice}
            if is_acyclic(egraph, choice, roots):
                found.offer(f"pareto {i}", choice)
    base = chosen["default"].choice if "default" in chosen else source
    left = found.limit - len(found.programs)
    _offer_neighbours(found, base, costs["default"], roots, found.limit - left // 2, seed)
    draw = 0
    while not found.full and draw < 4 * limit:
        cost = RandomCost(seed * 1000 + draw, costs["default"] if draw % 2 else None)
        choice = choose(egraph, cost, "dag", roots)[0]
        found.offer(f"random {draw}" if draw % 2 == 0 else f"jittered default {draw}",
                    choice)
        draw += 1
    if not found.full:  # random draws that repeat earlier programs: more neighbours
        _offer_neighbours(found, base, costs["default"], roots, found.limit, seed)
    return found, chosen


def _offer_neighbours(found: Candidates, base: dict[int, tuple], cost, roots: list[int],
                      until: int, seed: int) -> None:
    """Offer the one-class changes of ``base`` that keep it acyclic, in a seeded order,
    until ``until`` programs are found."""
    eg = found.eg
    filler = {c: v[1] for c, v in best_nodes(eg, cost).items()}
    candidates = [(c, alt) for c in program_order(eg, base, roots)
                  for alt in eg.class_nodes[c] if alt != base[c]]
    random.Random(seed).shuffle(candidates)
    for c, alt in candidates:
        if len(found.programs) >= until:
            return
        trial = {**filler, **base, c: alt}
        if is_acyclic(eg, trial, roots):
            found.offer(f"neighbour {alt[0]} in {c}", trial)


# --- timing ----------------------------------------------------------------------------

class _NodeTimer(fx.Interpreter):
    """Runs a module node by node, adding each call's seconds to the class it computes
    (``backends.fx.EMITTED_CLASS``; None for calls of no class)."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module)
        self.seconds: dict[int | None, float] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        start = time.perf_counter()
        value = super().run_node(n)
        key = n.meta.get(EMITTED_CLASS)
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        return value


def class_seconds(module: fx.GraphModule, inputs: Sequence, runs: int = PROFILE_RUNS
                  ) -> dict[int | None, float]:
    """Seconds each class's calls take in a run of ``module`` on ``inputs`` (the median of
    ``runs`` runs after a first), key None for calls of no class.

    >>> from backends.fx import build_module
    >>> from egraph import EGraph
    >>> from egraph.extract import source_program
    >>> x = torch.randn(8)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2), (x,))
    >>> seconds = class_seconds(build_module(eg, source_program(eg)), (x,))
    >>> sorted(eg.nodes(c)[0].op for c in seconds)
    ['exp', 'mul']
    """
    profiles = []
    with torch.no_grad():
        for _ in range(runs + 1):
            timer = _NodeTimer(module)
            timer.run(*inputs)
            profiles.append(timer.seconds)
    kept = profiles[1:] or profiles
    return {k: statistics.median(p.get(k, 0.0) for p in kept) for k in kept[0]}


# --- judging ---------------------------------------------------------------------------

def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, ties sharing the mean of their ranks.

    >>> ranks([30, 10, 20, 10])
    [4.0, 1.5, 3.0, 1.5]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (:func:`ranks`,
    ties averaged); NaN where either side is constant or has fewer than 2 values.

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 45]), spearman([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    >>> round(spearman([1, 2, 2, 3], [1, 3, 2, 4]), 4)  # 3 / sqrt(10)
    0.9487
    """
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} prices for {len(ys)} times")
    rx, ry = ranks(xs), ranks(ys)
    n = len(rx)
    if n < 2:
        return math.nan
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def price(egraph: EGraph, cost, choice: dict[int, tuple]) -> float:
    """A cost model's price of a program: each chosen e-node reached from the roots
    counted once, or the model's own whole-program cost
    (:func:`egraph.extract.program.dag_cost`)."""
    return float(dag_cost(egraph, cost, choice))


def confirm(programs: Sequence[Candidate], inputs: Sequence, reference: Callable[[], Any],
            reference_seconds: Sequence[float], rounds: int, seed: int = 0) -> int:
    """Time again, head to head over ``rounds`` rounds, the programs whose ``ms`` is
    within :data:`CONTENDERS` of the fastest's, and set their ``ms`` from that run, on the
    first run's scale (their time over the ``reference``'s, times the reference's median
    in ``reference_seconds``). Returns how many were timed again (0 where one program
    leads alone).

    The fastest of two dozen noisy medians is the one whose noise ran lowest: measured
    against it, every other program's regret would come out too high. In a run of a few
    programs over more rounds that luck does not repeat.

    >>> a, b = Candidate(["a"], {}, lambda: None, ms=1.0), Candidate(["b"], {}, lambda: None,
    ...                                                               ms=1.01)
    >>> confirm([a, b], (), lambda: None, [1e-3], rounds=3), a.ms > 0 and b.ms > 0
    (2, True)
    """
    fastest = min(p.ms for p in programs)
    close = [p for p in programs if p.ms <= fastest * (1 + CONTENDERS)]
    if len(close) < 2:
        return 0
    fns: dict[Any, Callable[[], Any]] = {i: (lambda m=p.module: m(*inputs))
                                         for i, p in enumerate(close)}
    fns["reference"] = reference
    with torch.no_grad():
        runs = interleaved_times(fns, rounds, min_rounds=rounds, seed=seed + 1,
                                 reference="reference")
    scale = statistics.median(reference_seconds) / statistics.median(runs["reference"])
    for i, program in enumerate(close):
        program.ms = statistics.median(runs[i]) * scale * 1e3
    return len(close)


# --- measured node costs ---------------------------------------------------------------

def measured_node_costs(egraph: EGraph, programs: Sequence[Candidate], inputs: Sequence,
                        estimate: CostModel) -> tuple[dict[tuple, float], dict[str, int]]:
    """Seconds of every e-node ``(op, child class, ...)``, and how many were measured,
    estimated or free.

    Measured: each timed program is profiled node by node (:func:`class_seconds`), each
    call's time the chosen e-node's of the class it computes; an e-node's time is the
    median over the programs that ran it. A call emission fused from several (``addmm``
    for a product and a sum) is charged to the e-node whose value it gives, its partners
    to nothing; e-nodes a program chose that made no call (views folded away, literals,
    leaves, parameter-only values computed once) cost 0 there. Estimated: an e-node no
    program ran costs ``estimate``'s price of it times the median ratio of measured to
    estimated seconds over the measured e-nodes of its op (of all ops where its op has
    none); a kernel ``estimate`` prices infinite (one its profile never measured) is
    estimated at its class's cheapest other e-node.
    """
    runs: dict[tuple, list[float]] = {}
    for program in programs:
        seconds = class_seconds(program.module, inputs)
        for c in program_order(egraph, program.choice):
            node = program.choice[c]
            runs.setdefault(node, []).append(seconds.get(c, 0.0))
    measured = {node: statistics.median(ts) for node, ts in runs.items()}
    predicted = {}
    ratios: dict[Any, list[float]] = {}
    for c in egraph.classes():
        guesses = {node: float(estimate.node_cost(egraph, c, node))
                   for node in egraph.class_nodes[c]}
        # (a kernel the profile never measured is priced infinite: it stands in at the
        # price of the cheapest other way its class computes the same values)
        stand_in = min((g for g in guesses.values() if math.isfinite(g)), default=0.0)
        for node, guess in guesses.items():
            predicted[node] = guess = guess if math.isfinite(guess) else stand_in
            if node in measured and guess > 0 and measured[node] > 0:
                ratios.setdefault(node[0], []).append(measured[node] / guess)
    every = [r for rs in ratios.values() for r in rs]
    overall = statistics.median(every) if every else 1.0
    costs, counts = {}, {"measured": 0, "estimated": 0, "free": 0}
    for node, guess in predicted.items():
        if node in measured:
            costs[node] = measured[node]
            counts["measured"] += 1
        elif guess > 0:
            rs = ratios.get(node[0])
            costs[node] = guess * (statistics.median(rs) if rs else overall)
            counts["estimated"] += 1
        else:
            costs[node] = 0.0
            counts["free"] += 1
    return costs, counts


def misses(egraph: EGraph, programs: Sequence[Candidate], node_seconds: dict[tuple, float],
           cost: CostModel, top: int = 12) -> list[dict[str, Any]]:
    """Where ``cost`` prices e-nodes off the clock, by op: over the e-nodes the timed
    programs ran (each measured, :func:`measured_node_costs`), their measured and priced
    milliseconds summed, and the ratio; the ``top`` ops whose sums differ most.

    >>> from egraph import EGraph
    >>> from egraph.extract import source_program
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(8),))
    >>> program = Candidate(["source"], source_program(eg), None)
    >>> seconds = {n: 1e-3 for n in program.choice.values() if n[0] in ("exp", "mul")}
    >>> sorted(row["op"] for row in misses(eg, [program], seconds, Flops()))
    ['exp', 'mul']
    """
    ran: dict[tuple, int] = {}  # e-node -> its class
    for program in programs:
        for c in program_order(egraph, program.choice):
            ran.setdefault(program.choice[c], c)
    by_op: dict[str, list[float]] = {}
    for node, c in ran.items():
        if is_literal_op(node[0]) or node[0] in TABLE and TABLE[node[0]].kind == "leaf":
            continue
        priced = float(cost.node_cost(egraph, c, node))
        sums = by_op.setdefault(node[0], [0, 0.0, 0.0])
        sums[0] += 1
        sums[1] += node_seconds.get(node, 0.0) * 1e3
        sums[2] += priced * 1e3 if math.isfinite(priced) else math.nan
    rows = [{"op": op, "e-nodes": n, "measured ms": ms, "priced ms": priced,
             "measured / priced": ms / priced if priced else math.inf}
            for op, (n, ms, priced) in by_op.items() if ms or priced]
    rows.sort(key=lambda r: -abs(r["measured ms"] - r["priced ms"])
              if math.isfinite(r["priced ms"]) else 0.0)
    return rows[:top]


def gym_json(egraph: EGraph, node_seconds: dict[tuple, float]) -> dict:
    """``egraph`` in extraction-gym's JSON (``egraph.serialize.to_json``), each e-node's
    cost its seconds in ``node_seconds``."""
    return to_json(egraph, cost=lambda enode: node_seconds.get(
        (enode.op, *enode.children), 0.0))


# --- one model -------------------------------------------------------------------------

@dataclass
class ModelResult:
    """What the harness found on one model."""

    name: str
    classes: int
    nodes: int
    stop_reason: str
    programs: list[Candidate]
    prices: list[dict[str, float]]  # each program's, by cost model
    left_out: list[tuple[str, str]]
    chosen: dict[str, Candidate]
    rounds: int
    twin_spread: float
    copy_spread: float  # the default's program against its copy, the reference
    contenders: int  # programs timed again head to head (:func:`confirm`)
    judged: dict[str, dict[str, float]]  # cost model -> spearman, regret
    counts: dict[str, int]
    misses: list[dict[str, Any]]  # the default's, by op
    gym: dict
    seconds: dict[str, float]


def run_model(name: str, model: torch.nn.Module, inputs: tuple, programs: int = 24,
              rounds: int = 60, seed: int = 0, rules=None,
              min_rounds: int = MIN_ROUNDS) -> ModelResult:
    """The harness on one model (the module docstring's steps 1 to 5)."""
    clock = time.perf_counter
    t0 = clock()
    eg = saturated(model, inputs, rules)
    t1 = clock()
    costs = cost_models(inputs)
    found, chosen = collect_programs(eg, costs, programs, seed)
    t2 = clock()
    kept = found.programs
    build = emitter(eg, costs["default"])
    twin = build(kept[0].choice)  # the source again: the timing's yardstick
    default = chosen.get("default") or kept[0]
    # (every call is bracketed by calls of the default's program, which divide out the
    # machine's drift: compiler.timing)
    reference = build(default.choice)
    # (the programs share the constants they fold alike, FoldedConstants.share; these two
    # keep their own, so that the reference's calls leave no program's weights in cache)
    fns = {i: (lambda m=p.module: m(*inputs)) for i, p in enumerate(kept)}
    fns["twin"] = lambda: twin(*inputs)
    fns["reference"] = lambda: reference(*inputs)
    with torch.no_grad():
        runs = interleaved_times(fns, rounds, twins=(0, "twin"), spread=SPREAD,
                                 min_rounds=min(min_rounds, rounds), seed=seed,
                                 reference="reference")
    for i, program in enumerate(kept):
        program.ms = statistics.median(runs[i]) * 1e3
    copy_gap = twin_gap(runs, (kept.index(default), "reference"))
    contenders = confirm(kept, inputs, fns["reference"], runs["reference"],
                         min(CONFIRM_ROUNDS, 3 * rounds), seed)
    t3 = clock()
    prices = [{n: price(eg, cost, program.choice) for n, cost in costs.items()}
              for program in kept]
    fastest = min(p.ms for p in kept)
    times = [p.ms for p in kept]
    judged = {}
    for n in costs:
        mine = chosen.get(n)
        judged[n] = {"spearman": spearman([p[n] for p in prices], times),
                     "regret": mine.ms / fastest - 1 if mine is not None else math.nan}
    node_seconds, counts = measured_node_costs(eg, kept, inputs, costs["default"])
    gym = gym_json(eg, node_seconds)
    t4 = clock()
    return ModelResult(name, eg.num_classes, eg.num_nodes, eg.report.stop_reason, kept,
                       prices, found.left_out, chosen, len(runs[0]),
                       twin_gap(runs, (0, "twin")), copy_gap, contenders, judged, counts,
                       misses(eg, kept, node_seconds, costs["default"]), gym,
                       {"saturate": t1 - t0, "programs": t2 - t1, "timing": t3 - t2,
                        "node costs": t4 - t3})


# --- the report ------------------------------------------------------------------------

def _finders(program: Candidate, width: int = 3) -> str:
    names = program.found_by
    more = f" (+{len(names) - width})" if len(names) > width else ""
    return ", ".join(names[:width]) + more


def section(result: ModelResult, costs: Sequence[str]) -> str:
    """The Markdown section of one model: the cost models' table, then the programs'."""
    fastest = min(p.ms for p in result.programs)
    number = {id(p): i for i, p in enumerate(result.programs)}
    rows = [{"cost model": n, "Spearman": result.judged[n]["spearman"],
             "regret": result.judged[n]["regret"],
             "its program": number.get(id(result.chosen.get(n)), "-")} for n in costs]
    lines = [f"## {result.name}", "",
             f"E-graph: {result.classes} classes, {result.nodes} e-nodes "
             f"({result.stop_reason}). {len(result.programs)} distinct programs, "
             f"{len(result.left_out)} left out; {result.rounds} timing rounds, the source's "
             f"two copies {result.twin_spread:.2%} apart, the default's program and its copy "
             f"{result.copy_spread:.2%}; {result.contenders} programs within "
             f"{CONTENDERS:.0%} of the fastest timed again head to head. Node costs: "
             + ", ".join(f"{v} {k}" for k, v in result.counts.items()) + ". Seconds: "
             + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items()) + ".", "",
             markdown_table(rows, ["cost model", "Spearman", "regret", "its program"]), ""]
    rows = [{"#": i, "found by": _finders(p), "ms": p.ms, "/ fastest": p.ms / fastest,
             **{n: result.prices[i][n] for n in costs}} for i, p in enumerate(result.programs)]
    lines.append(markdown_table(rows, ["#", "found by", "ms", "/ fastest", *costs]))
    lines += ["", "Where the default's prices miss the clock most, by op (the e-nodes the "
              "programs ran, each measured in its program):", "",
              markdown_table(result.misses, ["op", "e-nodes", "measured ms", "priced ms",
                                             "measured / priced"])]
    if result.left_out:
        lines += ["", "Left out:", ""] + [f"- {who}: {why}" for who, why in result.left_out]
    return "\n".join(lines)


def write_artifacts(result: ModelResult, folder: Path) -> None:
    """``<model>.json`` (the e-graph with measured costs) and ``<model>/<n>.py`` (each
    program's code) under ``folder``."""
    code = folder / result.name
    code.mkdir(parents=True, exist_ok=True)
    (folder / f"{result.name}.json").write_text(json.dumps(result.gym))
    for i, program in enumerate(result.programs):
        (code / f"{i:02d}.py").write_text(
            f"# found by: {', '.join(program.found_by)}\n{program.code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SUBJECTS),
                        help=f"comma-separated, or all: {', '.join(real_size.MODELS)}")
    parser.add_argument("--programs", type=int, default=None,
                        help="distinct programs per model (default 24; --quick 8)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="the most timing rounds (default 60; --quick 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true",
                        help="the models' tiny configs, few programs and rounds")
    add_out_option(parser, "cost_models")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    programs = args.programs or (8 if args.quick else 24)
    rounds = args.rounds or (8 if args.quick else 60)
    out = args.out if args.out is not None else results_path("cost_models")
    folder = out.with_suffix("")
    sections = []
    names = real_size.MODELS if args.models == "all" else args.models.split(",")
    for name in names:
        model, inputs = build_subject(name, args.quick)
        result = run_model(name, model, inputs, programs, rounds, args.seed,
                           min_rounds=2 if args.quick else MIN_ROUNDS)
        write_artifacts(result, folder)
        sections.append(section(result, list(cost_models(inputs))))
        print(sections[-1], flush=True)
    where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    body = (f"Each model's e-graph with measured node costs, in extraction-gym's JSON: "
            f"`{where}/<model>.json`; each program's code: `{where}/<model>/<n>.py`.\n\n"
            + "\n\n".join(sections))
    write_results("cost_models", "Cost models against the clock, on whole programs", body,
                  out=out)


if __name__ == "__main__":
    main()
