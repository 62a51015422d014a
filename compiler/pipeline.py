"""One graph through the pipeline: ingest (``EGraph.from_fx``), saturation, extraction
under a cost model (:func:`default_cost` for the inputs' device), validation, and the
:class:`GraphReport` of what was done. :func:`compile_graph` takes the options one by one;
the torch.compile backend (:mod:`compiler.compile`) hands each graph dynamo gives it to
:func:`compile_one` with its :class:`~compiler.options.BackendOptions`.

>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) + torch.exp(x))
>>> report = compile_graph(gm, (torch.randn(3),)).meta["egraph_graph"]
>>> report.name, report.extraction.validation.ok
('graph', True)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from compiler.autotune import Autotune, Autotuned
from compiler.fx import ExtractionReport, cuda_device
from compiler.memory import peak_bytes
from compiler.options import BackendOptions
from compiler.partition import SavedForBackward
from compiler.regions import optimise_regions
from compiler.signature import SYMBOLIC
from compiler.validate import stand_ins
from egraph import EGraph
from egraph.run import Report
from frontends.fx.effects import updates_inputs

__all__ = ["GraphReport", "compile_graph", "compile_one", "default_cost",
           "has_symbolic_sizes", "hinted_inputs"]

log = logging.getLogger("egraph.compiler")


@dataclass
class GraphReport:
    """What the backend did to one graph dynamo handed it; ``str()`` of it is the INFO
    line the backend logs.

    ``name``: which graph (``graph 0``: a graph dynamo handed the backend, run as
    emitted or handed to Inductor; ``forward 0``, ``backward 0``: the graphs of one that
    went through aot_autograd), ``extraction``: the emitted module's report (costs, nodes,
    rewrites, validation), ``saturation``: the saturation run's (None without rules),
    ``times``: seconds per phase (``gradients``: the check of a graph run as emitted under
    autograd), ``memory``: measured peak bytes of the ``source`` and the
    ``optimised`` module on the example inputs (with ``memory=True``), ``regions``: the
    reports of the region bodies optimised on their own (:func:`compiler.regions.optimise_regions`),
    ``saved``: what a training graph saves for its backward and what it recomputes, where
    a memory budget chose it (:class:`compiler.partition.SavedForBackward`). With the
    ``autotune`` option, ``extraction.autotune`` (:class:`compiler.autotune.Autotuned`)
    says how many programs were timed and the measured milliseconds of the one kept and
    of the cost model's choice.
    """

    name: str
    extraction: ExtractionReport
    saturation: Report | None = None
    times: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] | None = None
    regions: list[GraphReport] = field(default_factory=list)
    saved: SavedForBackward | None = None

    @property
    def autotune(self) -> Autotuned | None:
        """What autotuning did (None: it was off): programs timed, kept, their times."""
        return self.extraction.autotune

    @property
    def fell_back(self) -> bool:
        """True when validation refused the optimised program and the source was kept."""
        return self.extraction.fell_back

    @property
    def fallback_reason(self) -> str:
        """Why the source was kept (empty when it was not)."""
        v = self.extraction.validation
        return v.reason if self.fell_back and v is not None else ""

    def __str__(self) -> str:
        e = self.extraction
        rewrites = ", ".join(f"{n} x{k}" for n, k in sorted(e.used.items())) or "none"
        parts = [f"{self.name}: nodes {e.nodes_before} -> {e.nodes_after}",
                 f"rewrites {rewrites}", f"cost {e.cost_before:.4g} -> {e.cost_after:.4g}"]
        if self.saturation is not None:
            parts.append(f"saturation {self.saturation.stop_reason} after "
                         f"{len(self.saturation.iterations)} iterations")
        parts.append("times " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                          for k, v in self.times.items()))
        if e.autotune is not None:
            parts.append(str(e.autotune))
        v = e.validation
        parts.append("validation " + ("off" if v is None else
                                      f"{'passed' if v.ok else 'failed'} ({v.reference})"))
        if self.memory is not None:
            parts.append(f"peak memory {self.memory['source']} -> "
                         f"{self.memory['optimised']} bytes")
        if self.fell_back:
            parts.append(f"fell back to the source: {self.fallback_reason}")
        if self.regions:
            parts.append(f"{len(self.regions)} region bodies optimised on their own")
        if self.saved is not None:
            parts.append(f"for the backward: {self.saved}")
        return "; ".join(parts)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], rules=(),
                  cost=None, validate: str = "strict", iter_limit: int = 10,
                  node_limit: int = 50_000, time_limit: float = 10.0,
                  target: str | None = None, reference: str = "auto",
                  memory: bool = False, autotune: bool | Autotune = False
                  ) -> torch.fx.GraphModule:
    """One graph through the pipeline: ingest, saturate ``rules``, extract under ``cost``
    for ``target`` (None: ``cuda`` for CUDA inputs, ``cpu`` otherwise), validated against
    the source in float64 or in its working dtype (``reference``, see
    :mod:`compiler.validate`); with ``memory``, the peak bytes the source and the result
    allocate are measured; with ``autotune``, the programs the cost model is unsure
    between are timed (:mod:`compiler.autotune`). The :class:`GraphReport` is
    ``module.meta["egraph_graph"]``.

    With dynamic shapes the graph takes SymInt inputs and its tensors have symbolic sizes:
    the e-graph keeps them symbolic (the graph's own metadata), so the program reads its
    sizes from its inputs; validation runs on real inputs of the sizes dynamo hints.
    """
    options = BackendOptions(rules=rules, cost=cost, validate=validate, reference=reference,
                             memory=memory, iter_limit=iter_limit, node_limit=node_limit,
                             time_limit=time_limit, autotune=autotune)
    return compile_one(gm, example_inputs, options, target)


def compile_one(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                options: BackendOptions, target: str | None = None,
                name: str = "graph") -> torch.fx.GraphModule:
    """One graph through the pipeline under ``options``, as the backend compiles each
    graph (:func:`compile_graph` takes the options one by one): the region bodies first,
    each on its own (:func:`compiler.regions.optimise_regions`), then ingest, saturation,
    extraction for ``target`` and validation; the module's ``meta["egraph_graph"]`` is the
    :class:`GraphReport`, named ``name``.

    >>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) * 1)
    >>> module = compile_one(gm, (torch.randn(3),), BackendOptions(rules=()))
    >>> module.meta["egraph_graph"].name, module.meta["egraph_graph"].fell_back
    ('graph', False)
    """
    example_inputs = tuple(example_inputs)
    cost = options.cost if options.cost is not None else default_cost(example_inputs)
    # (each region body's phases are timed in its own report; their memory is not measured)
    inner = dataclasses.replace(options, cost=cost, memory=False)
    gm, regions = optimise_regions(gm, lambda body, inputs, at: compile_one(
        body, inputs, inner, target, name=f"{name} region {at}"))
    clock = time.perf_counter
    t0 = clock()
    if any(has_symbolic_sizes(x) for x in example_inputs):
        eg = EGraph.from_fx(gm, hinted_inputs(example_inputs, gm), observe=False)
    else:
        eg = EGraph.from_fx(gm, example_inputs)
    times = {"ingest": clock() - t0}
    if options.rules:
        t1 = clock()
        eg.saturate(options.rules, **options.limits)
        times["saturate"] = clock() - t1
    # (dynamo's guards give each graph only sizes it was compiled for)
    module = eg.extract(cost, validate=options.validate, target=target,
                        reference=options.reference, other_sizes="refuse",
                        autotune=options.autotune)
    extraction = module.meta["egraph_report"]
    report = GraphReport(name, extraction, eg.report, {**times, **extraction.times},
                         regions=regions)
    if options.memory:
        report.memory = _measure_memory(gm, module, example_inputs)
    module.meta["egraph_graph"] = report
    log.info("%s", report)
    return module


def _measure_memory(source: torch.fx.GraphModule, module: torch.fx.GraphModule,
                    example_inputs: tuple) -> dict[str, int]:
    """Peak bytes of the source and the optimised module on real example inputs (copies
    of the caller's tensors where a graph writes into its inputs: each runs once more)."""

    with unset_fake_temporarily():
        inputs = hinted_inputs(example_inputs, source)
        writes = updates_inputs(source.graph)

        def given() -> list:
            return [x.detach().clone() if writes and isinstance(x, torch.Tensor) else x
                    for x in inputs]
        return {"source": peak_bytes(source, *given()),
                "optimised": peak_bytes(module, *given())}


def default_cost(example_inputs: Sequence[Any], fused: bool = False):
    """The cost model fit for the device the inputs live on: the time on this machine's
    calibrated CPU profile (:func:`extractors.calibration.cpu_profile`, measured once and
    cached; ``EGRAPH_CALIBRATION=builtin``: the shipped one) with each op its own kernel
    (CPU emission calls eager torch ops; ``fused`` where Inductor generates the code), or
    on the GPU's profile with fusion regions as kernels (CUDA emission fuses them into
    Triton kernels).

    >>> cost = default_cost((torch.randn(2),))
    >>> cost.hardware.name.startswith("cpu"), cost.fused
    (True, False)
    """
    from extractors import Roofline
    from extractors.calibration import cpu_profile
    from extractors.convolution_times import measured_convolutions
    from extractors.hardware import HARDWARE

    device = cuda_device(example_inputs)
    if device is None:  # (own emission runs torch's convolutions: timed per shape)
        return Roofline(cpu_profile(), fused=fused,
                        convolution_times=None if fused else measured_convolutions())
    name = torch.cuda.get_device_name(device)
    return Roofline(next((p for p in HARDWARE if p != "cpu" and p in name), "H100"))


def has_symbolic_sizes(x: Any) -> bool:
    """Whether ``x`` is a symbolic number or a tensor with a symbolic size (dynamo's
    dynamic shapes).

    >>> has_symbolic_sizes(torch.ones(2)), has_symbolic_sizes(3)
    (False, False)
    """
    if isinstance(x, SYMBOLIC):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)


def hinted_inputs(example_inputs: Sequence[Any], gm: torch.fx.GraphModule | None = None
                  ) -> tuple:
    """Real values standing for the example inputs dynamo hands a backend
    (:func:`compiler.validate.stand_ins`, requiring the gradients the inputs require):
    SymInts by their hinted value, fake tensors (symbolic sizes too) as random tensors of
    the hinted shape, dtype, device and layout, and those ``gm`` reads as a generator's
    state as a valid state."""
    return stand_ins(example_inputs, gm, grad=True)
