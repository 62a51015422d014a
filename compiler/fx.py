"""The FX e-graph: a PyTorch program in an e-graph, with its extraction policy.

``EGraph.from_fx`` returns an :class:`FxEGraph`: the engine's e-graph plus what the
pipeline knows of the source (``eg.fx``: inputs, output structure, side effects, opaque
calls, the e-nodes it was built with). Its ``extract(cost)`` chooses the program (greedy,
DAG-aware or ILP, then local search for whole-program costs), emits it as a GraphModule
(:mod:`backends.fx`), validates it against the source (:mod:`compiler.validate`), checks
which sizes it holds (:mod:`compiler.sizes`) and reports what happened
(``gm.meta["egraph_report"]``: the DAG costs of the source and of the emitted program).

>>> import torch
>>> from egraph import EGraph
>>> from extractors import Flops
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) + torch.exp(x)),
...                     (torch.randn(3),))
>>> type(eg).__name__
'FxEGraph'
>>> report = eg.extract(Flops()).meta["egraph_report"]
>>> report.cost_before == report.cost_after  # exp is computed once: nothing to gain
True
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from backends.fx import TARGETS, build_module
from backends.signature import (
    keep_meta_when_saved,
    make_outputs_contiguous,
    take_structured_inputs,
)
from backends.sizes import dispatch_sizes, is_input_check, require_sizes
from compiler.autotune import Autotune, Autotuned
from compiler.autotune import autotune as autotune_program
from compiler.options import VALIDATIONS
from compiler.sizes import check_other_sizes, probe_sizes, resized_inputs, runs_on
from compiler.validate import Validation, ValidationError, validate_module
from egraph.egraph import EGraph
from egraph.extract import best_nodes, cheaper, choose, program_roots, source_program
from egraph.extract.budget import BudgetedProgram, check_budget, within_budget
from egraph.extract.local_search import improve
from egraph.extract.pareto import ParetoPoint
from egraph.extract.pareto import pareto as pareto_frontier
from egraph.extract.program import dag_cost, program_order
from egraph.extract.tree import canonical_nodes
from egraph.gcpause import gc_paused
from extractors import PeakMemory
from extractors.costs import Roofline, kernel_blind
from extractors.peak import peak_of
from frontends.fx.exported import ExportedModule, is_input_guards
from frontends.fx.ingest import from_fx as ingest
from frontends.fx.source import FxSource


class FxEGraph(EGraph):
    """An e-graph built from a PyTorch program (``EGraph.from_fx``).

    Besides the engine's API: ``fx`` (the source, :class:`~frontends.fx.FxSource`),
    ``effects`` (classes of side effects every program keeps, in order) and ``initial``
    (the e-nodes each class had when built: the source program,
    :func:`egraph.extract.source_program`). ``extract`` and ``pareto`` give GraphModules.

    >>> import torch
    >>> eg = from_fx(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> eg.effects, len(eg.initial) == eg.num_classes
    ([], True)
    """

    fx: FxSource

    @property
    def effects(self) -> list[int]:
        """Classes of the source's side effects (opaque calls kept in order)."""
        return self.fx.effects

    @property
    def initial(self) -> dict[int, list[tuple]]:
        """The e-nodes of each class when the e-graph was built (before saturation)."""
        return self.fx.initial

    def extract(self, cost, root: int | None = None, **options):
        """The best program under ``cost`` as a validated ``torch.fx.GraphModule``
        (:func:`extract_module`); with ``root``: ``(term, cost)`` of that class, as on a
        plain e-graph."""
        if root is not None:
            return super().extract(cost, root=root, **options)
        with gc_paused():
            return extract_module(self, cost, **options)

    def pareto(self, cost_a, cost_b, root: int | None = None, limit: int = 8,
               validate: str = "strict") -> list[ParetoPoint]:
        """The non-dominated programs under two costs, each a GraphModule (validated
        unless ``validate="off"``, the result in ``gm.meta["egraph_validation"]``); a
        whole-program second cost such as :class:`~extractors.costs.PeakMemory` is
        measured on each whole program (``pareto(Roofline("cpu"), PeakMemory())``: time
        against peak memory)."""
        source = source_program(self)

        def build(choice: dict[int, tuple], root: int) -> fx.GraphModule:
            # other outputs and effects: the source's e-nodes
            gm = build_module(self, {**source, **choice})
            if validate != "off" and self.fx.example_inputs is not None:
                gm.meta["egraph_validation"] = validate_module(self.fx, gm)
            return gm

        return pareto_frontier(self, cost_a, cost_b, root=root, limit=limit, build=build,
                               starts=[source])


def from_fx(source, example_inputs=None, domains: dict[str, str] | None = None,
            ranges: dict[str, tuple[float, float]] | None = None,
            observe: bool | None = None, dynamic=False) -> FxEGraph:
    """The :class:`FxEGraph` of a GraphModule, an nn.Module or a torch.export program
    (what ``EGraph.from_fx`` returns; arguments as :func:`frontends.fx.from_fx`).

    >>> import torch
    >>> eg = from_fx(torch.nn.ReLU(), (torch.randn(2),))
    >>> [str(n) for n in eg.nodes(eg.roots[0])]
    ['(relu #1)']
    """
    return ingest(source, example_inputs, domains=domains, ranges=ranges, observe=observe,
                  make_egraph=FxEGraph, dynamic=dynamic)


@dataclass
class ExtractionReport:
    """What ``extract`` did to an FX program; ``print(report)`` reads as a summary.

    ``cost_before`` and ``cost_after`` are the DAG costs (each e-node once, whatever the
    extraction method) of the source program and of the emitted one. ``rewrites``: how
    often each rule applied during saturation; ``used``: the rules whose e-nodes the emitted
    program holds, with how many (what the program owes to each rule).
    ``accuracy_refused``: why the accuracy search's rewrite (under ``Curvature``) was not
    kept, when its program failed the validation the extracted one passed.
    ``channels_last``: the convolutions whose input the program converts to channels-last
    (:meth:`extractors.costs.Roofline.channels_last_convolutions`).
    """

    cost_before: Any
    cost_after: Any
    method: str
    rewrites: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    optimal: bool | None = None
    validation: Validation | None = None
    fell_back: bool = False
    times: dict[str, float] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    kernels: list[str] = field(default_factory=list)
    built_for: dict[str, dict[int, int]] = field(default_factory=dict)
    general: bool = False  # other sizes than built_for's run the source's form
    accuracy_refused: str | None = None
    memory: BudgetedProgram | None = None  # under a memory budget: the peak and its bounds
    autotune: Autotuned | None = None  # with autotune: what was timed, what was kept
    channels_last: int = 0

    def __str__(self) -> str:
        lines = [
            f"cost {self.cost_before} -> {self.cost_after} ({self.method}"
            + (", proven optimal" if self.optimal else "") + ")",
            f"graph nodes {self.nodes_before} -> {self.nodes_after}",
        ]
        for label, counts in (("rewrites in the program", self.used),
                              ("rewrites applied", self.rewrites)):
            lines.append(f"{label}: " + (", ".join(
                f"{name} x{n}" for name, n in sorted(counts.items())) or "none"))
        if self.memory is not None:
            lines.append(str(self.memory))
        if self.autotune is not None:
            lines.append(str(self.autotune))
        if self.validation is not None:
            lines.append(str(self.validation))
        if self.kernels:
            lines.append("fused kernels: " + ", ".join(self.kernels))
        if self.channels_last:
            lines.append(f"channels-last: the inputs of {self.channels_last} convolutions "
                         "converted (each keeps the format for the ones after it)")
        if self.fell_back:
            lines.append("validation failed: the original program was returned" + (
                "" if self.memory is None else ", whose peak the memory budget does not hold"))
        if self.accuracy_refused:
            lines.append(f"the accuracy search's program was not kept: {self.accuracy_refused}")
        if self.built_for:
            sizes = ", ".join(f"{name} dim {d} = {n}" for name, dims in self.built_for.items()
                              for d, n in dims.items())
            lines.append(
                f"specialised for the example's sizes {sizes} (a rewrite computed with "
                "them); other sizes run the source's program, captured with its sizes "
                "symbolic when first met"
                if self.general else f"runs only on inputs of the example's sizes: {sizes} "
                "(a rewrite computed with them)")
        lines.append("times: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                           for k, v in self.times.items()))
        return "\n".join(lines)


def _rewrites_used(egraph: EGraph, choice: dict[int, tuple],
                   roots: list[int]) -> dict[str, int]:
    """The rules whose e-nodes the chosen program holds, with how many of its e-nodes each
    added (an e-node the source program also holds counts for no rule)."""
    added = egraph.added_by()
    if not added:
        return {}
    source = canonical_nodes(egraph, egraph.initial)
    used: dict[str, int] = {}
    for node in (choice[c] for c in program_order(egraph, choice, roots)):
        name = added.get(node)
        if name is not None and node not in source:
            used[name] = used.get(name, 0) + 1
    return used


EXACT_NODES = 10_000
"""``method="auto"`` solves the extraction exactly (ILP, warm-started from the DAG
heuristic's answer, which it keeps unless it finds a cheaper one) on e-graphs of at most
this many e-nodes, within :data:`EXACT_SECONDS` (the bundled transformer's e-graph: 2,105
e-nodes, solved in 0.09 s)."""
EXACT_SECONDS = 0.5
"""The exact solution's time limit under ``method="auto"``: the 12-layer GPT-2-sized
decoder's e-graph (4,138 e-nodes) is proven optimal in 0.2 s, the DAG heuristic
included; the backward graph of a 2-layer Llama training step is not proven in 5 s (the
heuristic's answer is kept)."""


def _solver_installed() -> bool:
    """Whether HiGHS is importable: ``method="auto"`` keeps the DAG heuristic's answer
    without it rather than fail a program that extracts fine."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


def extract_module(egraph: FxEGraph, cost, method: str = "auto", validate: str = "strict",
                   target: str | None = None, time_limit: float = 60.0,
                   reference: str = "auto", other_sizes: str = "source",
                   memory_budget: float | None = None, memory=None,
                   autotune: bool | Autotune = False) -> fx.GraphModule:
    """Extract the best program under ``cost``, emit it, validate it, and report: the
    extraction policy of :meth:`FxEGraph.extract`.

    ``method``: ``"greedy"`` (tree cost), ``"dag"`` or ``"ilp"`` (each shared e-node paid
    once; ties go to the source's e-nodes in each), or ``"auto"`` (the default): ``"dag"`` for a
    cost model whose node costs are plain numbers (``cost.additive``), so that one op
    serving several values (a merged projection) is paid once as it runs once, improved
    by an exact solution on small e-graphs (:data:`EXACT_NODES`) where HiGHS is installed,
    and ``"greedy"`` otherwise (:class:`~extractors.costs.Lexicographic`). A whole-program
    cost (``cost.local`` False) is then improved by local search. ``validate``:
    ``"strict"`` (fall back to the source with a warning on a mismatch), ``"raise"`` or
    ``"off"``; ``reference``: the source in ``"float64"``, in its ``"working"`` dtype, or
    ``"auto"``: float64 unless the model is large (:data:`compiler.validate.REFERENCES`).
    ``time_limit``: seconds for the extraction's solver, and again for the accuracy
    search where the cost is :class:`~extractors.curvature.Curvature`.
    ``target``: ``"cpu"`` or ``"cuda"`` (default: the device of the example inputs).
    ``other_sizes``: what a program a rewrite specialised for the example's sizes does at
    others: run the ``"source"``'s program, captured with its sizes symbolic (where it
    can be), or ``"refuse"`` them with a clear error (the compile backend's choice:
    dynamo's guards already hand each graph only the sizes it was compiled for).
    ``memory_budget`` (bytes): the cheapest program whose peak under ``memory`` (default
    :class:`~extractors.costs.PeakMemory`) fits, by the DAG heuristic and ILP bound of
    :func:`egraph.extract.budget.within_budget` (``report.memory``: the peak, the bounds,
    the search's time); a budget no program meets raises
    :class:`~egraph.extract.budget.MemoryBudgetError`. ``autotune`` (True or a
    :class:`compiler.autotune.Autotune`): the chosen program and the few the model cannot
    tell from it are timed on the example inputs and the fastest kept where it beats the
    model's choice beyond the noise (:mod:`compiler.autotune`; ``report.autotune``).
    """
    tune = _check_choices(validate, other_sizes, method, autotune, memory_budget)
    if memory_budget is not None:
        check_budget(memory_budget)
        memory = PeakMemory() if memory is None else memory
    if target is None:
        target = _device_target(egraph.fx.example_inputs)
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: use one of {', '.join(map(repr, TARGETS))} "
                         "(None: the device of the example inputs)")
    t0 = time.perf_counter()
    roots = program_roots(egraph)
    chosen = choose_program(egraph, cost, method, roots, time_limit)
    picked, method, optimal, cost_before, cost_after = chosen
    budgeted = None
    if memory_budget is not None and roots:
        budgeted = within_budget(egraph, cost, memory, memory_budget,
                                 [picked, source_program(egraph, cost)],
                                 prefer=egraph.initial, time_limit=min(time_limit, 1.0))
        picked, cost_after = budgeted.choice, budgeted.cost
        method, optimal = "budget", budgeted.optimal
    times = {"extract": time.perf_counter() - t0}
    judge = None
    if target == "cuda":
        judge = cost if isinstance(cost, Roofline) else Roofline()

    tuned = None
    if tune is not None and roots:
        picked, tuned = autotune_program(
            egraph, cost, picked, lambda rival: choose_program(
                egraph, rival, "auto", roots, time_limit)[0], tune,
            emitter(egraph, cost, target, judge, memory_budget))
        cost_after, times["autotune"] = dag_cost(egraph, cost, picked), tuned.seconds
    t1 = time.perf_counter()
    converted = channels_last_convolutions(egraph, cost, picked, target, memory_budget)
    gm = build_module(egraph, picked, target, judge, converted)
    times["emit"] = time.perf_counter() - t1
    rewrites = {}
    if egraph.report is not None:
        rewrites = {name: s.applied for name, s in egraph.report.rules.items() if s.applied}
    report = ExtractionReport(
        cost_before=cost_before, cost_after=cost_after, method=method, rewrites=rewrites,
        used=_rewrites_used(egraph, picked, roots),
        optimal=optimal, times=times, nodes_before=_count(egraph.fx.graph_module),
        nodes_after=_count(gm), kernels=list(gm.meta.get("triton_kernels", ())),
        memory=budgeted, autotune=tuned,
        channels_last=len(converted),
    )
    if validate != "off" and egraph.fx.example_inputs is not None:
        gm = _validated(egraph, gm, report, (picked, roots), validate, reference)
    if getattr(cost, "refine_accuracy", False) and egraph.fx.example_inputs is not None:
        gm = _refined(egraph.fx, gm, report, reference, time_limit)
    if report.built_for and not report.fell_back:
        _serve_other_sizes(egraph.fx, gm, report, other_sizes)
    if egraph.fx.structure is not None and not report.fell_back:
        take_structured_inputs(gm, egraph.fx.structure)
    gm.meta["egraph_report"] = report
    keep_meta_when_saved(gm)
    if egraph.report is not None:
        egraph.report.extraction = {"method": method, "cost": cost_after,
                                    "optimal": optimal, "time": round(times["extract"], 6),
                                    "memory": budgeted}
    return gm


def channels_last_convolutions(egraph: EGraph, cost: Any, choice: dict[int, tuple],
                               target: str = "cpu", memory_budget: float | None = None
                               ) -> frozenset[int]:
    """The convolutions of program ``choice`` whose input emission converts to
    channels-last: where ``cost`` is a :class:`~extractors.costs.Roofline` for the CPU
    that says it pays (:meth:`~extractors.costs.Roofline.channels_last_convolutions`),
    and, under a ``memory_budget`` (bytes), where the conversions' copies keep the
    program's peak (:func:`extractors.peak.peak_of`) within it."""
    if target != "cpu" or not isinstance(cost, Roofline):
        return frozenset()
    converted = cost.channels_last_convolutions(egraph, choice)
    if converted and memory_budget is not None and peak_of(
            egraph, choice, converted) > memory_budget:
        return frozenset()
    return converted


def emitter(egraph: EGraph, cost: Any, target: str = "cpu", judge: Roofline | None = None,
            memory_budget: float | None = None
            ) -> Callable[[dict[int, tuple]], fx.GraphModule]:
    """How the pipeline emits a program of ``egraph`` chosen under ``cost`` (and
    ``memory_budget``): :func:`backends.fx.build_module`, with
    :func:`channels_last_convolutions`; for tools that time programs as the pipeline
    would run them (autotuning, the cost-model harness).

    >>> eg = from_fx(torch.fx.symbolic_trace(lambda x: x * 2), (torch.randn(3),))
    >>> print(emitter(eg, None)(source_program(eg)).code.strip().splitlines()[-2].strip())
    mul = torch.mul(x, 2);  x = None
    """
    return lambda choice: build_module(egraph, choice, target, judge, channels_last_convolutions(
        egraph, cost, choice, target, memory_budget))


def _check_choices(validate: str, other_sizes: str, method: str, autotune: Any = False,
                   memory_budget: float | None = None) -> Autotune | None:
    """Raise a ValueError naming the choices for an argument of :func:`extract_module`
    that is not one of them; the autotuning asked for (None: none)."""
    tune = Autotune.of(autotune)
    if tune is not None and memory_budget is not None:
        raise ValueError("autotune and memory_budget together: autotuning keeps the fastest "
                         "program, which may not fit the budget; pass one of them")
    if validate not in VALIDATIONS:
        raise ValueError(f"validate={validate!r}: use one of "
                         f"{', '.join(map(repr, VALIDATIONS))}")
    if other_sizes not in ("source", "refuse"):
        raise ValueError(f"other_sizes={other_sizes!r}: use 'source' or 'refuse'")
    if method not in ("auto", "greedy", "dag", "ilp"):
        raise ValueError(f"method={method!r}: use 'auto', 'greedy', 'dag' or 'ilp'")
    return tune


def choose_program(egraph: FxEGraph, cost, method: str = "auto", roots: list | None = None,
                   time_limit: float = 60.0) -> tuple[dict, str, bool | None, Any, Any]:
    """The program :func:`extract_module` emits, by ``method`` (its choices), before
    emission: ``(picked e-node per class, the method used, proven optimal or not (None:
    unknown), the source's cost, the program's cost)``, both costs of the DAG run, each
    e-node once; never a program dearer than the source. ``roots``: default
    :func:`~egraph.extract.program_roots`. Benchmarks that time the programs several cost
    models pick call it to get exactly the program extraction would emit.

    >>> from extractors import Flops
    >>> eg = from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2), (torch.randn(3),))
    >>> picked, method, optimal, before, after = choose_program(eg, Flops())
    >>> method, optimal, before == after
    ('ilp', True, True)
    """
    if roots is None:
        roots = program_roots(egraph)
    cost = kernel_blind(cost)
    exact = False
    if method == "auto":
        method = "dag" if getattr(cost, "additive", False) else "greedy"
        exact = method == "dag" and egraph.num_nodes <= EXACT_NODES and _solver_installed()
    optimal = None
    if not roots:  # a program of no tensor (dynamo hands over ``return ()``)
        picked, optimal = {}, True
    elif method == "greedy":
        choice = best_nodes(egraph, cost, prefer=egraph.initial)
        missing = [r for r in roots if r not in choice]
        if missing:
            raise ValueError(f"classes {missing} have no finite program under {cost!r}")
        picked = {c: v[1] for c, v in choice.items()}
    else:
        if exact:
            # DAG extraction is greedy per class: three projections merged into one
            # linear pay only when all three take it, which no single switch shows. The
            # solver starts from the DAG heuristic's answer and keeps it if it finds
            # nothing cheaper in time.
            method, time_limit = "ilp", min(time_limit, EXACT_SECONDS)
        picked, _, optimal = choose(egraph, cost, method, roots, time_limit,
                                    prefer=egraph.initial)
    if not getattr(cost, "local", True):
        # a whole-program cost: the proxy's choice, improved under the exact cost
        picked = improve(egraph, picked, cost)
    # What a user reads is the cost of the program run: its DAG, each e-node once.
    cost_after = dag_cost(egraph, cost, picked)
    source = source_program(egraph, cost)
    cost_before = dag_cost(egraph, cost, source)
    if cheaper(cost_before, cost_after):
        # A tree-cost choice can be dearer as a DAG than the source (a shared value
        # recomputed in two places): never emit a program worse than the one given.
        picked, cost_after = source, cost_before
    return picked, method, optimal, cost_before, cost_after


def _validated(egraph: FxEGraph, gm: fx.GraphModule, report: ExtractionReport,
               program: tuple[dict, list], validate: str, reference: str) -> fx.GraphModule:
    """``gm`` validated against the source (``report.validation``), with the sizes it
    was built for (``report.built_for``); the source's module where it fails under
    ``validate="strict"`` (``report.fell_back``)."""
    picked, roots = program
    t2 = time.perf_counter()
    result = validate_module(egraph.fx, gm, reference=reference)
    if result.ok:
        result = check_other_sizes(egraph, gm) or result
    report.times["validate"] = time.perf_counter() - t2
    report.validation = result
    if not result.ok:
        why = (f"{result.reason}; rewrites involved: "
               + (", ".join(sorted(report.used or report.rewrites))
                  or "none (emission itself)"))
        if validate == "raise":
            raise ValidationError(why)
        # (stacklevel: the caller of FxEGraph.extract)
        warnings.warn(f"egraph: the optimised program failed validation ({why}); "
                      "returning the original", stacklevel=4)
        report.fell_back = True
        return _original_module(egraph.fx)
    make_outputs_contiguous(gm, result.strided)
    t3 = time.perf_counter()
    # (a program holding literal target shapes is probed, rewritten or not:
    # ingest reads ``reshape(-1, 6)`` as the example's ``(15, 6)``)
    baked = "egraph_sizes_explained" in gm.meta
    report.built_for = probe_sizes(egraph, picked, roots, gm, bool(report.rewrites) or baked)
    if report.built_for is None:  # too large to probe: where it holds literal
        # shapes, every size of its inputs (else, as the source, none)
        report.built_for = _every_size(egraph.fx) if baked else {}
    report.times["sizes"] = time.perf_counter() - t3
    return gm


def _refined(src: FxSource, gm: fx.GraphModule, report: ExtractionReport,
             reference: str, time_limit: float) -> fx.GraphModule:
    """Accuracy is the objective (Curvature): Herbie's search on the validated program,
    within ``time_limit`` seconds. It judges against a 150-digit reference, which the
    float64 validation could not (float64 cancels too)."""
    from compiler.herbie import improve_validated

    t4 = time.perf_counter()
    explained = gm.meta.get("egraph_sizes_explained")
    gm, accuracy = improve_validated(src, gm, reference=reference, time_limit_s=time_limit)
    if explained is not None:  # (a new module where formulas were replaced)
        gm.meta["egraph_sizes_explained"] = explained
    report.accuracy_refused = accuracy.refused
    report.times["accuracy"] = time.perf_counter() - t4
    return gm


def _serve_other_sizes(src: FxSource, gm: fx.GraphModule, report: ExtractionReport,
                       other_sizes: str) -> None:
    """Make ``gm``, built for the sizes ``report.built_for``, run the source's general
    program at others (``report.general``), or refuse them saying why."""
    if other_sizes == "source" and _capturable(src):
        # (captured when first called at another size: torch.export takes longer
        # than the whole pipeline on a small program)
        shapes = {name: tuple(x.shape) for name, x in zip(src.inputs, src.example_inputs)
                  if name in report.built_for}
        dispatch_sizes(gm, report.built_for, shapes,
                       functools.partial(general_program, src, report.built_for))
        report.general = True
    else:  # the module refuses other sizes, saying why
        require_sizes(gm, report.built_for, src)


def _every_size(src: FxSource) -> dict[str, dict[int, int]]:
    """Every dim of every tensor input of ``src`` at its example's size."""
    return {name: dict(enumerate(x.shape)) for name, x in zip(src.inputs, src.example_inputs)
            if isinstance(x, torch.Tensor)}


def _capturable(src: FxSource) -> bool:
    """Whether :func:`general_program` may capture ``src`` again: a module given with
    real example inputs, flat, outside torch.compile (where dynamo's guards choose the
    program per size) and not an export program (whose own guards hold)."""
    return (src.guards is None and src.structure is None and bool(src.example_inputs)
            and torch._guards.TracingContext.try_get() is None)


def general_program(src: FxSource, fixed: dict[str, dict[int, int]]
                    ) -> fx.GraphModule | None:
    """The source's program with its input sizes symbolic (captured again with
    torch.export, every size left free that the program lets vary), emitted as it is:
    what a program specialised for the example's sizes ``fixed`` runs at other sizes.
    None where the source cannot be captured so, or where the emitted program disagrees
    with the source."""
    source = src.module if isinstance(src.module, nn.Module) else src.graph_module
    # torch.export, as dynamo, holds a size of 0 or 1 static: it is captured at 2 where
    # the source runs there (the specialised program serves the example's size); a size
    # the source cannot change (a 1 it broadcasts) stays the example's
    small = [(src.inputs.index(name), d) for name, dims in fixed.items()
             for d, n in dims.items() if n < 2]
    small = [m for m in small if runs_on(src, resized_inputs(src, [m], 2))]
    inputs = resized_inputs(src, small, 2) if small else src.example_inputs
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            symbolic = from_fx(source, inputs, dynamic=True)
            general = build_module(symbolic, source_program(symbolic))
            agrees = validate_module(dataclasses.replace(src, example_inputs=inputs), general,
                                     trials=0).ok
    except Exception:  # noqa: BLE001 - not capturable so
        return None
    return general if agrees else None


def cuda_device(example_inputs) -> torch.device | None:
    """The CUDA device of the first example input that lives on one (nested inputs
    included), or None: where the program will run, for the target, cost model and code
    generator that fit it. A lone tensor counts as the one input.

    >>> cuda_device((torch.randn(2), [3])) is None
    True
    >>> cuda_device(torch.randn(2)) is None
    True
    """
    found: list[Any] = []
    fx.node.map_aggregate(example_inputs, found.append)
    return next((x.device for x in found
                 if isinstance(x, torch.Tensor) and x.device.type == "cuda"), None)


def _device_target(example_inputs) -> str:
    """``cuda`` when an example input lives on a CUDA device, ``cpu`` otherwise."""
    return "cpu" if cuda_device(example_inputs) is None else "cuda"


def _original_module(src: FxSource) -> fx.GraphModule:
    """The source program with the emitted module's signature (the user's inputs)."""
    gm = src.graph_module
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if isinstance(src.module, ExportedModule) and (
            placeholders != list(src.inputs) or src.structure is not None):
        # the exported graph takes parameters as inputs, or the leaves of structures
        return src.module.program.module()
    original = fx.GraphModule(src.module if isinstance(src.module, nn.Module) else gm,
                              gm.graph)
    if hasattr(gm, "_in_spec"):  # (its code flattens structures: torch's unlifted module)
        original._in_spec, original._out_spec = gm._in_spec, getattr(gm, "_out_spec", None)
    return original


def _count(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")
               and not is_input_check(n) and not is_input_guards(_called_module(gm, n)))


def _called_module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return gm.get_submodule(node.target) if node.op == "call_module" else None
