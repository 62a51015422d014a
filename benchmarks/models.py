"""Real architectures (the ``transformers`` and ``diffusers`` corpus of benchmarks/corpus.py)
through the pipeline, against eager and Inductor in one run.

    .venv/bin/python benchmarks/models.py [--models gpt2,llama] [--entries export,compile,inductor]
                                          [--attn eager] [--repeat 20] [--no-inductor]
                                          [--device cuda] [--autocast bfloat16] [--dtype bfloat16]
                                          [--inductor-option pattern_matcher=True]
                                          [--entries train --checkpointing]

One row per model and entry point:

- ``export``: torch.export -> ``EGraph.from_fx`` -> ``saturate(load_rules("all"))`` ->
  ``extract(default_cost(inputs))`` (the time on this machine's profile, as the backend's
  default; validation strict: a mismatch falls back and is counted);
- ``compile``: ``torch.compile(model, backend=make_backend(rules=...))`` (its default cost),
  inference, then a second sequence length (or batch) through the same compiled model;
- ``inductor``: the same with ``codegen="inductor"`` (ours + Inductor: the optimised graph
  handed to Inductor's code generation, under the fused cost model of the device);
- ``train`` (only when asked for): the same backend on a training step (forward, a loss,
  backward);
- ``train-ind`` (only when asked for): the training step with ``codegen="inductor"`` (ours
  + Inductor: Inductor's aot_autograd splits the optimised graph and generates the code
  of its forward and backward);
- ``second`` (only when asked for): inference at a second sequence length (or batch)
  compiled with that size dynamic, as dynamo recompiles a model served inputs of several
  lengths (the backend specialises the symbolic graph for a size met again). Timed at
  the second size against eager's and Inductor's there (Inductor's dynamic compile),
  then checked at a third size (another batch and sequence length);
- ``second-ind`` (only when asked for): the same with ``codegen="inductor"`` (ours +
  Inductor on the symbolic graph: Inductor's dynamic code with our rewrites under it);
- ``export-second`` (only when asked for): torch.export with the batch and the sequence
  length ``Dim``s, so the graph's sizes are symbolic and one program serves every size;
  checked at the second and third sizes and timed at the second, against eager's and
  Inductor's dynamic compile there, and against a static program exported at that size
  (column "time / static": the symbolic program's time over the static one's, in
  interleaved rounds of their own; column "pipeline / static": the pipeline's time on the
  symbolic graph over its time on the static one, from ingest to the validated program,
  the least of five interleaved runs each after a first);
- ``generate`` (only when asked for, on the models that generate): greedy ``generate`` of
  6 tokens with the key/value cache (``--cache dynamic`` or ``static``), the model's
  forward compiled with the backend as transformers documents it; the tokens must equal
  eager's. Timed: the whole ``generate`` call, against eager's and Inductor's (its cold
  compile is the first call: the prompt's graph and the step's);
- ``generate-ind`` (only when asked for): the same with ``codegen="inductor"``.

Columns: whether it works (or the exception), the second and third sizes, graphs compiled
and how many fell back, graph nodes before -> after and the distinct rules / total
rewrites applied (summed over the graphs of the first call), the pipeline's seconds
(ingest, saturate, extract, emit and validation, summed over those graphs), the first
call's seconds (torch.export or dynamo and aot_autograd included), Inductor's cold
compile seconds on the same model in the same run (default ``torch.compile`` after
``torch._dynamo.reset()``, caches disabled), and median run times in ms of eager, ours and
Inductor (one intra-op thread unless ``--threads``). For the ``export`` entry, peak memory
in KiB: the :class:`~extractors.peak.PeakMemory` estimate of the source program beside
the measured peak bytes allocated by a run of the source and of ours
(:func:`compiler.memory.peak_bytes`). Geometric means close each entry point. The table
is printed and written to benchmarks/results/models.md (``--out``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A cold compile means no Inductor cache from an earlier run.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler.compile as compile_backend  # noqa: E402
from benchmarks.corpus import (  # noqa: E402
    CACHES,
    DIFFUSION,
    GENERATES,
    LARGE,
    MODELS,
    Case,
    Generation,
    build,
    build_generation,
)
from benchmarks.report import add_out_option, results_path, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.memory import peak_bytes  # noqa: E402
from compiler.specialise import SPECIALISE_AT_CALL  # noqa: E402
from compiler.timing import interleaved_ms, interleaved_times, twin_gap  # noqa: E402
from compiler.validate import float64_copy, judge  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.logs import progress  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors import PeakMemory  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
INDUCTOR_OPTIONS: dict = {}
"""Inductor config patches for the ours + Inductor entries (``--inductor-option``), over
:func:`compiler.compile.default_inductor_options`."""
CHECKPOINTING = False
"""Train entries with transformers' gradient checkpointing on (``--checkpointing``;
non-reentrant, as transformers recommends)."""
TOL = dict(rtol=1e-4, atol=1e-5)
TIMED = "_timed"
"""A runner's row holds its program's call here until the interleaved timing."""
TRAINED = ("gpt2", "bert", "llama", "mixtral")
"""The models the train entry runs on by default (Inductor's cold compile of a training
step takes a minute or more per model on a small CPU)."""


def _loss(out) -> torch.Tensor:
    """The mean square of every floating tensor the model returns, however nested (an
    LSTM's ``(output, (h, c))``)."""
    leaves = torch.utils._pytree.tree_leaves(out)
    return sum(o.square().mean() for o in leaves
               if isinstance(o, torch.Tensor) and o.is_floating_point())


def _wide(case_inputs: tuple) -> tuple:
    return tuple(x.double() if x.is_floating_point() else x for x in case_inputs)


def _check(got, expected, exact: Callable[[], Any], what: str = "outputs") -> None:
    """Raise unless ``got`` equals eager's ``expected`` within :data:`TOL` or, where it
    does not, is as close to ``exact()`` (the same in float64) as eager is: the figures
    are float64-judged, as validation judges a program (on a GPU eager's own TF32
    convolutions are 1e-3 away from the exact result, and Inductor's code differs from
    them by as much). The structures must be the same, classes included (a model's output
    class, whose fields users read by name)."""
    got_structure, want_structure = pytree.tree_structure(got), pytree.tree_structure(expected)
    if got_structure != want_structure:
        raise AssertionError(f"{what}: structured as {_brief(got_structure)}, where eager's"
                             f" are {_brief(want_structure)}")
    try:
        torch.testing.assert_close(got, expected, **TOL)
    except AssertionError as close:
        first = str(close).splitlines()[0]
        try:
            reference = exact()
        except Exception as error:  # noqa: BLE001 - then eager's result is the judge
            raise AssertionError(f"{what}: {first} (no float64 reference: the model "
                                 f"raises in float64: {_error(error)})") from None
        why = judge(got, expected, reference)
        if why is not None:
            raise AssertionError(f"{what}: {why} against float64 ({first})") from None


def _error(exc: BaseException, width: int = 160) -> str:
    return _brief(f"{type(exc).__name__}: {exc}", width)


def _brief(what: Any, width: int = 160) -> str:
    text = " ".join(str(what).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _reports(reports: list, row: dict) -> None:
    """Sum what the pipeline reports over the graphs it compiled."""
    rewrites: dict[str, int] = {}
    for r in reports:
        for name, n in r.rewrites.items():
            rewrites[name] = rewrites.get(name, 0) + n
    row.update(graphs=len(reports), fallbacks=sum(bool(r.fell_back) for r in reports),
               nodes_before=sum(r.nodes_before for r in reports),
               nodes_after=sum(r.nodes_after for r in reports),
               rules=len(rewrites), rewrites=sum(rewrites.values()), rewrite_names=rewrites,
               fallback_reasons=[r.validation.reason for r in reports
                                 if r.fell_back and r.validation is not None])


def _regions(reports: list, row: dict) -> None:
    """How many region bodies (checkpointed layers) were optimised on their own."""
    row["regions"] = sum(len(r.regions) for r in reports)


PHASES = ("ingest", "saturate", "extract", "emit", "validate", "gradients")


def _phases(reports: list, row: dict) -> None:
    """Pipeline seconds per phase, summed over the graphs the backend compiled (each
    :class:`~compiler.compile.GraphReport` times its own phases)."""
    phases: dict[str, float] = {}
    for r in reports:
        for phase, seconds in r.times.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    row["phases"] = phases
    row["pipeline_s"] = sum(phases.values())


def _breaks(seen, row: dict) -> None:
    """Dynamo's graph breaks, as :func:`compiler.compile.capture` collected them."""
    row["breaks"] = sum(b.count for b in seen.graph_breaks)
    row["break_reasons"] = [f"{b.reason} (x{b.count})" for b in seen.graph_breaks]


def run_export(case: Case, rules) -> dict:
    return _exported_row(case, rules, dynamic=False)


def run_export_second(case: Case, rules) -> dict:
    """(export with the size that varies a ``Dim``: one program for every size)"""
    return _exported_row(case, rules, dynamic=True)


def _exported_row(case: Case, rules, dynamic: bool) -> dict:
    """The row of ``case`` through torch.export and the pipeline; with ``dynamic`` the
    size that varies (sequence length, or batch) is exported as a ``Dim``, and the
    program is checked and timed at the second size."""
    row: dict = {}
    model, inputs = case.model.eval(), case.inputs
    shapes = None
    if dynamic:  # the batch, and the sequence length where the model takes one
        dims = (0, 1) if case.varies == "seq" else (0,)  # (AUTO: export finds which are one)
        shapes = (tuple({d: torch.export.Dim.AUTO for d in dims if d < x.dim()} or None
                        for x in inputs),)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        program = torch.export.export(model, inputs, dynamic_shapes=shapes)
        t1 = time.perf_counter()
        eg = EGraph.from_fx(program, inputs)
        t2 = time.perf_counter()
        eg.saturate(rules, **LIMITS)
        t3 = time.perf_counter()
        opt = eg.extract(default_cost(inputs), validate="strict")
        t4 = time.perf_counter()
        _check(opt(*inputs), model(*inputs), lambda: float64_copy(model)(*_wide(inputs)))
        report = opt.meta["egraph_report"]
        row.update(pipeline_s=t4 - t1, first_s=t4 - t0,
                   phases={"ingest": t2 - t1, "saturate": t3 - t2, **report.times})
        _reports([report], row)
        if dynamic:
            second, third = case.second_inputs(), case.third_inputs()
            for column, sizes in (("second", second), ("third", third)):
                fixed = _fixed_by_export(program, sizes)
                if fixed:  # the source's own program refuses it: not a size we could run
                    row[column] = fixed
                    continue
                _check(opt(*sizes), model(*sizes),
                       lambda sizes=sizes: float64_copy(model)(*_wide(sizes)))
                row[column] = "ok"
            row["pipeline_vs_static"] = _pipeline_against_static(model, inputs, program, rules)
            if row["second"] == "ok":
                row["vs_static"] = _against_static(model, second, rules, opt)
                row[TIMED] = _inference(lambda: opt(*second))
            return row
        row[TIMED] = _inference(lambda: opt(*inputs))
        row.update(peak_est=PeakMemory().program_cost(eg), peak_src=peak_bytes(model, *inputs),
                   peak_ours=peak_bytes(opt, *inputs))
    return row


def _fixed_by_export(program: torch.export.ExportedProgram, inputs: tuple) -> str:
    """Why torch.export's own program refuses ``inputs`` (it made a size static that the
    model's code specialises on: Mamba's scan over the sequence), or "" where it runs
    them. Such a size is the source's, not one the pipeline could serve."""
    try:
        with torch.no_grad():
            program.module()(*inputs)
    except Exception as exc:  # noqa: BLE001 - the guard torch.export wrote names the size
        return _brief(f"fixed by torch.export: {exc}", 80)
    return ""


STATIC_ROUNDS = 201
"""The most interleaved rounds of the symbolic export program against the static one."""

STATIC_SPREAD = 0.01
"""Rounds stop once two copies of the static program time within this of each other,
after :data:`STATIC_MIN_ROUNDS` (copies agree by chance in fewer: a symbolic DeBERTa timed
1.06x its static twin over 15 rounds, and 0.99-1.01x over 200, in three runs)."""

STATIC_MIN_ROUNDS = 101


def _against_static(model: torch.nn.Module, inputs: tuple, rules, dynamic: Callable) -> str:
    """The time of the ``dynamic`` export program (one for every size) over that of a
    static one exported at ``inputs``' sizes, both through the pipeline
    (:func:`_time_against_static`): what serving every size with one program costs."""
    program = torch.export.export(model, inputs)
    static = EGraph.from_fx(program, inputs).saturate(rules, **LIMITS).extract(
        default_cost(inputs), validate="strict")
    return _time_against_static(_inference(lambda: dynamic(*inputs)),
                                _inference(lambda: static(*inputs)))


def _compiled_against_static(case: Case, rules, codegen: str, dynamic: Callable,
                             inputs: tuple) -> str:
    """The time of the ``dynamic`` compile of ``case``'s model (a graph with a symbolic
    size, specialised where the backend does) over that of a static compile of a copy of
    the model (``dynamic=False``), both on ``inputs`` (:func:`_time_against_static`)."""
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           inductor_options=INDUCTOR_OPTIONS, **LIMITS)
    static = torch.compile(copy.deepcopy(case.model), backend=backend, dynamic=False)
    unmarked = tuple(x.clone() for x in inputs)  # (not marked dynamic, as ``inputs`` are)
    return _time_against_static(_inference(lambda: dynamic(*inputs)),
                                _inference(lambda: static(*unmarked)))


def _time_against_static(dynamic: Callable, static: Callable) -> str:
    """The median time of ``dynamic`` over that of ``static``, each program timed twice a
    round (as "again"), in interleaved rounds until the static program's two timings agree
    within :data:`STATIC_SPREAD` (or :data:`STATIC_ROUNDS` rounds), with the gap between
    them, which a ratio must beat to mean anything (these programs take milliseconds).
    Each is timed twice so that each follows itself as often as the other does (a call
    right after its own last one finds its folded weights in cache): with the static
    program alone timed twice, it alone had that advantage."""
    twins = ("static", "static again")
    times = interleaved_times({"dynamic": dynamic, "dynamic again": dynamic,
                               "static": static, "static again": static},
                              STATIC_ROUNDS, twins=twins, spread=STATIC_SPREAD,
                              min_rounds=STATIC_MIN_ROUNDS)
    ratio = statistics.median(times["dynamic"] + times["dynamic again"]) / statistics.median(
        times["static"] + times["static again"])
    return f"{ratio:.3f} (copies {twin_gap(times, twins):.1%})"


PIPELINE_ROUNDS = 5
"""Interleaved runs of the pipeline on the symbolic graph and on its static twin."""


def _pipeline_against_static(model: torch.nn.Module, inputs: tuple, symbolic,
                             rules) -> float:
    """The pipeline's time on the ``symbolic`` export program over its time on a static
    one exported at ``inputs``' sizes (from ingest to the validated program), the least
    of :data:`PIPELINE_ROUNDS` interleaved runs after one run of each (what a first run
    caches, the rules' compiled patterns and the shape inference of ops met before,
    serves both). The least, not the median: what slows a run of a second or so (a
    collection of the cyclic garbage, another process) only adds, and medians of five
    moved BART's ratio from 0.98 to 1.33 between two runs of the same code."""
    programs = {"symbolic": symbolic, "static": torch.export.export(model, inputs)}
    seconds: dict[str, list[float]] = {name: [] for name in programs}
    for round_ in range(PIPELINE_ROUNDS + 1):
        for name, program in programs.items():
            t0 = time.perf_counter()
            EGraph.from_fx(program, inputs).saturate(rules, **LIMITS).extract(
                default_cost(inputs), validate="strict")
            if round_:
                seconds[name].append(time.perf_counter() - t0)
    return round(min(seconds["symbolic"]) / min(seconds["static"]), 3)


def _compiled_inference(model: torch.nn.Module, inputs: tuple, rules, codegen: str = "eager",
                        calls: int = 1) -> tuple[dict, Callable]:
    """The row of ``model`` compiled with the backend and called ``calls`` times on
    ``inputs`` in inference (the calls timed as the first call's seconds), and the
    compiled model."""
    row: dict = {}
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           inductor_options=INDUCTOR_OPTIONS, **LIMITS)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    t0 = time.perf_counter()
    with compile_backend.capture() as seen:
        for _ in range(calls):
            out = compiled(*inputs)
    row["first_s"] = time.perf_counter() - t0
    _phases(backend.reports, row)
    _breaks(seen, row)
    _reports([r.extraction for r in backend.reports], row)
    _check(out, model(*inputs), lambda: float64_copy(model)(*_wide(inputs)))
    row[TIMED] = _inference(lambda: compiled(*inputs))
    return row, compiled


def run_compile(case: Case, rules, codegen: str = "eager") -> dict:
    model = case.model.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row, compiled = _compiled_inference(model, case.inputs, rules, codegen)
        second = case.second_inputs()
        try:
            with compile_backend.capture() as again:
                out = compiled(*second)
            _check(out, model(*second), lambda: float64_copy(model)(*_wide(second)))
            # a graph break here is the backend failing on the dynamic-shape graph
            reasons = [b.reason for b in again.graph_breaks]
            row["second"] = "graph break: " + "; ".join(reasons) if reasons else "ok"
        except Exception as exc:  # noqa: BLE001 - a row of the table
            row["second"] = _error(exc)
        row["third"] = _third_size(case, compiled)
        # After the second size, dynamo runs the first size through the symbolic graph,
        # which compiles its program for that size at the SPECIALISE_AT_CALL-th call: made
        # here, it is not timed (with --repeat 2 it was half the median).
        for _ in range(SPECIALISE_AT_CALL):
            compiled(*case.inputs)
    return row


def second_size(case: Case) -> tuple[torch.Tensor, ...]:
    """The inputs of the second size with the size that varies marked dynamic (where the
    model leaves it so), as dynamo marks it when a second size recompiles a frame: every
    compile of them, after any reset, is the dynamic one."""
    inputs = case.second_inputs()
    dim = 1 if case.varies == "seq" else 0
    for x in inputs:
        if x.dim() > dim:
            torch._dynamo.maybe_mark_dynamic(x, dim)
    return inputs


def run_second(case: Case, rules, codegen: str = "eager") -> dict:
    """(called as often as a size must be met to be specialised; then once at a third
    size, another batch and sequence length)"""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second = second_size(case)
        row, compiled = _compiled_inference(case.model.eval(), second, rules, codegen,
                                            calls=SPECIALISE_AT_CALL)
        row["third"] = _third_size(case, compiled)
        row["vs_static"] = _compiled_against_static(case, rules, codegen, compiled, second)
        return row


def _third_size(case: Case, compiled: Callable) -> str:
    """``ok`` where ``compiled`` gives the model's results at the third size (dynamo
    recompiles where it must), or what went wrong."""
    third = case.third_inputs()
    try:
        _check(compiled(*third), case.model(*third),
               lambda: float64_copy(case.model)(*_wide(third)))
    except Exception as exc:  # noqa: BLE001 - a row of the table
        return _error(exc)
    return "ok"


def run_second_inductor(case: Case, rules) -> dict:
    return run_second(case, rules, codegen="inductor")


def _train_step(model, inputs):
    # Each step draws the same random numbers (dropout masks, patch dropout's choice of
    # patches), so that the compiled step is judged against eager's on equal draws.
    def step():
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        loss = _loss(model(*inputs))
        loss.backward()
        return loss
    return step


def run_train(case: Case, rules, codegen: str | None = None) -> dict:
    row: dict = {}
    model, inputs = case.model.train(), case.inputs
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           inductor_options=INDUCTOR_OPTIONS, **LIMITS)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    # Each step starts from the same buffers: a step that updates them (a vector
    # quantiser's codebook, moved by an average of its inputs) is then judged on them too.
    first = {k: b.clone() for k, b in model.named_buffers()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        with compile_backend.capture() as seen:
            loss = _train_step(compiled, inputs)()
        row["first_s"] = time.perf_counter() - t0
        _phases(backend.reports, row)
        _breaks(seen, row)
        _reports([r.extraction for r in backend.reports], row)
        _regions(backend.reports, row)
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        updated = {k: b.clone() for k, b in model.named_buffers()}
        _restore_buffers(model, first)
        wide = {}

        def exact(key=None):
            if not wide:  # the step in float64, once, for any loss or gradient that differs
                wide_model = float64_copy(model)
                _restore_buffers(wide_model, first)
                wide["loss"] = _train_step(wide_model, _wide(inputs))().detach()
                wide.update((k, p.grad) for k, p in wide_model.named_parameters())
                wide.update(wide_model.named_buffers())
            return wide[key or "loss"]

        expected = _train_step(model, inputs)()
        _check(loss, expected, exact, "loss")
        for key, p in model.named_parameters():
            if p.grad is not None:
                _check(grads[key], p.grad, lambda k=key: exact(k), f"gradient of {key}")
        for key, b in model.named_buffers():
            _check(updated[key], b, lambda k=key: exact(k), f"buffer {key}")
        _restore_buffers(model, first)
        row[TIMED] = _train_step(compiled, inputs)
    return row


def _restore_buffers(model: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, b in model.named_buffers():
            b.copy_(values[key])


def run_generate(generation: Generation, rules, codegen: str = "eager") -> dict:
    row: dict = {}
    expected = generation.fresh()()
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           inductor_options=INDUCTOR_OPTIONS, **LIMITS)
    torch._dynamo.reset()
    generation.model.forward = torch.compile(generation.model.forward, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        with compile_backend.capture() as seen:
            tokens = generation()
        row["first_s"] = time.perf_counter() - t0
    _phases(backend.reports, row)
    _breaks(seen, row)
    _reports([r.extraction for r in backend.reports], row)
    if not torch.equal(tokens, expected):
        differ = (tokens != expected).nonzero()[0].tolist()
        raise AssertionError(f"generated tokens differ from eager's first at {differ}")
    row[TIMED] = generation
    return row


def _synced(fn: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``fn`` that returns once the device has finished its work (CUDA runs asynchronously:
    a timer around the call alone would time the launches)."""
    if device == "cpu":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize()
        return out
    return run


def run_eager(subject: Case | Generation, mode: str) -> Callable[[], Any]:
    """The eager model's call (or training step, or generation), to be timed."""
    if mode == "generate":
        return subject
    if mode == "train":
        return _train_step(subject.model.train(), subject.inputs)
    model = subject.model.eval()
    inputs = second_size(subject) if mode == "second" else subject.inputs
    return _inference(lambda: model(*inputs))


def _inference(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run():
        with torch.no_grad():
            return fn()
    return run


def run_inductor(subject: Case | Generation, mode: str) -> dict:
    """Inductor's cold compile (the first call after a reset, caches disabled) and its
    call, to be timed."""
    torch._dynamo.reset()
    train = mode == "train"
    if mode == "generate":
        subject.model.forward = torch.compile(subject.model.forward)
    else:
        model = subject.model.train() if train else subject.model.eval()
        compiled = torch.compile(model)
    uncached = torch._inductor.config.patch(fx_graph_cache=False, force_disable_caches=True)
    with warnings.catch_warnings(), uncached, (
            contextlib.nullcontext() if train else torch.no_grad()):
        warnings.simplefilter("ignore")
        # (timed as compiled, under no_grad in inference: with grad enabled dynamo would
        # recompile for it, and Inductor's graph would save activations for a backward)
        inputs = second_size(subject) if mode == "second" else subject.inputs
        if mode == "generate":
            fn = subject
        elif train:
            fn = _train_step(compiled, inputs)
        else:
            fn = _inference(lambda: compiled(*inputs))
        t0 = time.perf_counter()
        fn()
        cold = time.perf_counter() - t0
    return {"inductor_s": cold, TIMED: fn}


def run_compile_inductor(case: Case, rules) -> dict:
    return run_compile(case, rules, codegen="inductor")


def run_train_inductor(case: Case, rules) -> dict:
    return run_train(case, rules, codegen="inductor")


def run_generate_inductor(generation: Generation, rules) -> dict:
    return run_generate(generation, rules, codegen="inductor")


RUNNERS = {"export": run_export, "compile": run_compile, "inductor": run_compile_inductor,
           "second": run_second, "second-ind": run_second_inductor,
           "export-second": run_export_second, "train": run_train,
           "train-ind": run_train_inductor,
           "generate": run_generate, "generate-ind": run_generate_inductor}
ENTRIES = tuple(RUNNERS)
TRAINING = ("train", "train-ind")
"""The entry points that run a training step."""
GENERATING = ("generate", "generate-ind")
"""The entry points that generate text (the rest run the model's forward in inference)."""


def mode_of(entry: str) -> str:
    """What an entry point runs: ``"train"``, ``"generate"``, ``"second"`` (inference at
    a second size) or ``"infer"``."""
    if entry in ("second", "second-ind", "export-second"):
        return "second"
    return "train" if entry in TRAINING else "generate" if entry in GENERATING else "infer"


def run_model(name: str, entries: list[str], attn: str, rules, repeat: int,
              inductor: bool, device: str = "cpu", cache: str = "dynamic",
              dtype: torch.dtype | None = None) -> list[dict]:
    """One row per entry point. Eager, each entry point's program and Inductor are timed
    at the end, in interleaved rounds (each round calls every one once), so that drift in
    the machine's load falls on all of them alike. Inductor compiles last: dynamo's caches
    are reset before each of ours (a cold start for each), and our programs compiled
    before it recompile once, in the warm-up, rather than Inductor's."""
    rows = []
    timed: dict[str, Callable[[], Any]] = {}
    peer: dict[str, dict] = {}
    label = name if attn == "eager" else f"{name}@{attn}"

    def subject(mode: str) -> Case | Generation:
        if mode == "generate":
            return build_generation(name, attn, device, cache)
        case = build(name, attn, device, dtype)
        if CHECKPOINTING and mode == "train":
            inner = getattr(case.model, "model", case.model)  # (corpus.TensorModel's)
            if not getattr(inner, "supports_gradient_checkpointing", False):
                raise ValueError(f"{name} has no gradient checkpointing")
            inner.gradient_checkpointing_enable({"use_reentrant": False})
        return case
    for entry in entries:
        mode = mode_of(entry)
        row: dict = {"model": label, "entry": entry, "status": "ok"}
        try:
            timed.setdefault(f"eager {mode}", run_eager(subject(mode), mode))
            torch._dynamo.reset()
            row.update(RUNNERS[entry](subject(mode), rules))
            if TIMED in row:  # (not where the source itself refuses the timed size)
                timed[entry] = row.pop(TIMED)
            if row.get("fallbacks"):  # the source ran, not ours: a failure here
                row["status"] = f"fell back: {'; '.join(row['fallback_reasons'])}"
        except Exception as exc:  # noqa: BLE001 - a row of the table
            row["status"] = _error(exc)
            row.pop(TIMED, None)
        rows.append(row)
    if inductor:
        for mode in dict.fromkeys(mode_of(row["entry"]) for row in rows):
            try:
                peer[mode] = run_inductor(subject(mode), mode)
                timed[f"inductor {mode}"] = peer[mode].pop(TIMED)
            except Exception as exc:  # noqa: BLE001
                peer[mode] = {"inductor_error": _error(exc)}
    ms = interleaved_ms({key: _synced(fn, device) for key, fn in timed.items()}, repeat)
    torch._dynamo.reset()
    for row in rows:
        mode = mode_of(row["entry"])
        row["eager_ms"] = ms.get(f"eager {mode}")
        if row["entry"] in ms:
            row["ours_ms"] = ms[row["entry"]]
        if inductor:
            row.update(peer[mode])
            if f"inductor {mode}" in ms:
                row["inductor_ms"] = ms[f"inductor {mode}"]
    return rows


COLUMNS = [
    ("model", "model"), ("entry", "entry"), ("status", "works"), ("second", "2nd size"),
    ("third", "3rd size"), ("vs_static", "time / static"),
    ("pipeline_vs_static", "pipeline / static"),
    ("graphs", "graphs"), ("breaks", "graph breaks"), ("fallbacks", "fallbacks"),
    ("nodes", "nodes before->after"),
    ("rw", "rules/rewrites"), ("pipeline_s", "pipeline s"), ("first_s", "first call s"),
    ("inductor_s", "Inductor cold s"), ("eager_ms", "eager ms"), ("ours_ms", "ours ms"),
    ("inductor_ms", "Inductor ms"), ("ours_x", "ours/eager"), ("inductor_x", "Inductor/eager"),
    ("peak_est", "peak KiB est. (source)"), ("peak_src", "peak KiB source"),
    ("peak_ours", "peak KiB ours"),
]


def _cells(row: dict) -> dict[str, str]:
    out = {}
    for key, _ in COLUMNS:
        if key == "nodes":
            value = (f"{row['nodes_before']}->{row['nodes_after']}"
                     if "nodes_before" in row else "")
        elif key == "rw":
            value = f"{row['rules']}/{row['rewrites']}" if "rules" in row else ""
        elif key == "ours_x":
            value = (f"{row['ours_ms'] / row['eager_ms']:.2f}"
                     if "ours_ms" in row and row.get("eager_ms") else "")
        elif key == "inductor_x":
            value = (f"{row['inductor_ms'] / row['eager_ms']:.2f}"
                     if "inductor_ms" in row and row.get("eager_ms") else "")
        elif key == "inductor_s" and "inductor_error" in row:
            value = row["inductor_error"]
        elif key.endswith("_s") and key in row:
            value = f"{row[key]:.2f}"
        elif key.endswith("_ms") and row.get(key) is not None:
            value = f"{row[key]:.3f}"
        elif key.startswith("peak_") and key in row:
            value = f"{row[key] / 1024:.1f}"
        else:
            value = str(row.get(key, ""))
        out[key] = value
    return out


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def geomean_rows(rows: list[dict]) -> list[dict]:
    """One row per entry point: geometric means over the models where it worked."""
    out = []
    for entry in ENTRIES:
        ok = [r for r in rows if r["entry"] == entry and r["status"] == "ok"]
        if not any(r["entry"] == entry for r in rows):
            continue
        summary: dict = {"model": "geomean", "entry": entry,
                         "status": f"{len(ok)}/{sum(r['entry'] == entry for r in rows)} ok"}
        for key in ("pipeline_s", "first_s", "inductor_s", "eager_ms", "ours_ms",
                    "inductor_ms"):
            value = _geomean([r.get(key) for r in ok])
            if value is not None:
                summary[key] = value
        cells = {}
        for key, num in (("ours_x", "ours_ms"), ("inductor_x", "inductor_ms")):
            value = _geomean([r[num] / r["eager_ms"] for r in ok if num in r and r.get("eager_ms")])
            if value is not None:
                cells[key] = f"{value:.2f}"
        summary["_cells"] = cells
        out.append(summary)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows + geomean_rows(rows):
        cells = _cells(row)
        cells.update(row.get("_cells", {}))
        if row["model"] == "geomean":
            cells = {k: (f"**{v}**" if v else v) for k, v in cells.items()}
        lines.append("| " + " | ".join(cells[k].replace("|", "\\|") for k, _ in COLUMNS)
                     + " |")
    return "\n".join(lines)


def phases_section(rows: list[dict]) -> str:
    """Pipeline seconds per phase of each row (summed over its graphs)."""
    lines = ["| model | entry | " + " | ".join(PHASES) + " | total |",
             "|---|---|" + "---|" * (len(PHASES) + 1)]
    for row in rows:
        phases = row.get("phases")
        if phases:
            cells = [f"{phases.get(p, 0.0):.2f}" for p in PHASES]
            lines.append(f"| {row['model']} | {row['entry']} | " + " | ".join(cells)
                         + f" | {sum(phases.values()):.2f} |")
    return "\n".join(lines)


def reasons_section(rows: list[dict]) -> str:
    """Each graph break and each fallback, with its reason."""
    lines = []
    for row in rows:
        for reason in row.get("break_reasons", []):
            lines.append(f"- {row['model']} ({row['entry']}): graph break: {reason}")
        for reason in row.get("fallback_reasons", []):
            lines.append(f"- {row['model']} ({row['entry']}): fallback: {reason}")
    return "\n".join(lines) or "none"


def plot(rows: list[dict], out: Path) -> list[Path]:
    """Two charts beside the markdown (PNG and SVG, :mod:`compiler.charts`): run time as a
    fraction of eager, Inductor against ours + Inductor, and compile seconds, Inductor's
    cold compile against our pipeline."""
    from compiler import charts

    timed = [r for r in rows if r["entry"] == "inductor" and r["status"] == "ok"
             and "inductor_ms" in r and r.get("eager_ms")]
    compiled = [r for r in rows if r["entry"] in ("compile", "inductor") and
                r["status"] == "ok" and "inductor_s" in r and "pipeline_s" in r]
    compiled = list({r["model"]: r for r in compiled}.values())  # one per model
    if not timed and not compiled:
        return []
    left, right = charts.panels(2, size=(7.0, 1.5 + 0.45 * max(len(timed), len(compiled))))
    charts.before_after_bars([r["model"] for r in timed],
                             [r["inductor_ms"] / r["eager_ms"] for r in timed],
                             [r["ours_ms"] / r["eager_ms"] for r in timed], ax=left,
                             title="run time, fraction of eager (lower is faster)",
                             unit="time / eager time", names=("Inductor", "ours + Inductor"))
    charts.before_after_bars([r["model"] for r in compiled],
                             [r["inductor_s"] for r in compiled],
                             [r["pipeline_s"] for r in compiled], ax=right, log=True,
                             title="compile seconds", unit="seconds (log scale)",
                             names=("Inductor cold compile", "our pipeline"))
    return charts.save(left.figure, out.with_suffix(".png"), out.with_suffix(".svg"))


def rewrites_section(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        names = row.get("rewrite_names")
        if names:
            top = ", ".join(f"{n} x{c}" for n, c in sorted(names.items(), key=lambda kv: -kv[1]))
            lines.append(f"- {row['model']} ({row['entry']}): {top}")
    return "\n".join(lines)


def _diffusers_version(names) -> str:
    """`` and `diffusers` <version>`` where the run has diffusers' models."""
    if not set(names) & DIFFUSION:
        return ""
    import diffusers

    return f" and `diffusers` {diffusers.__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--entries", default="export,compile,inductor",
                        help=f"comma-separated, from: {', '.join(ENTRIES)}")
    parser.add_argument("--train-models", default=",".join(TRAINED),
                        help="the models the train entries run on (comma-separated; 'all' for "
                             "every model)")
    parser.add_argument("--large", action="store_true",
                        help="add the 12-layer GPT-2-small-sized decoder (benchmarks/corpus.py "
                             "LARGE: T=128, vocabulary 50304) through export, compile and inductor")
    parser.add_argument("--attn", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--cache", default="dynamic", choices=CACHES,
                        help="the generate entry's key/value cache")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per median")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared machine more "
                             "threads than idle cores make every parallel op stall)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where models, inputs and programs live (cuda: the default "
                             "cost is the GPU's profile, fusion regions become Triton kernels)")
    parser.add_argument("--inductor-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an Inductor config patch for ours + Inductor, e.g. "
                             "pattern_matcher=True (Inductor's own pattern rewrites on)")
    parser.add_argument("--autocast", choices=("bfloat16", "float16"),
                        help="run every entry point, eager and Inductor inside "
                             "torch.autocast(device, dtype) (mixed-precision inference "
                             "and training as users write them)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"),
                        help="models and their floating inputs in this dtype (model.to(dtype)"
                             "; the generate entries keep float32)")
    parser.add_argument("--tf32", action="store_true",
                        help="on CUDA, keep torch's default of TF32 convolutions (without it "
                             "convolutions are IEEE float32, so that outputs can be judged "
                             "against float64)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="the train entries (eager's and Inductor's too) with "
                             "transformers' gradient checkpointing on")
    add_out_option(parser, "models")
    return parser


def _about(args: argparse.Namespace, names: list[str], total: float) -> str:
    """What the run measured and how, the paragraphs before its tables (the stamp
    names the command, the machine and the versions)."""
    import transformers

    probe = (torch.zeros(1, device=args.device),)
    return (
        f"Models from `transformers` {transformers.__version__}{_diffusers_version(names)} "
        "built from small configs (benchmarks/corpus.py: 2 layers, hidden 64, vocabulary "
        "1000, batch 2, sequence 8, 16x16 latents; random weights), attention "
        f"`{args.attn}` (diffusers' models keep their sdpa processors); the run took "
        f"{total:.0f} s.\n\n"
        f"Rules `all`, the default cost (`{compile_backend.default_cost(probe)!r}`), "
        "saturation limits "
        f"{LIMITS['iter_limit']} iterations / {LIMITS['node_limit']} nodes; validation strict "
        "(a mismatch falls back to the source and counts under fallbacks). `pipeline s`: "
        "ingest + saturate + extract + emit + validation, summed over the graphs of the first "
        "call (a second size compiles more: dynamic shapes); `first "
        "call s`: the whole first call (torch.export, or dynamo and aot_autograd, "
        "included); `Inductor cold s`: default `torch.compile` on the same model, first "
        "call after a reset with caches disabled. Run times are medians over "
        f"{args.repeat} interleaved rounds (each calls eager, ours and Inductor once); "
        "ratios below 1 are faster than eager. Geometric means are over the models where "
        "the entry point worked.\n\n"
    )


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    global CHECKPOINTING
    CHECKPOINTING = args.checkpointing
    if args.device == "cuda" and not args.tf32:
        # Inductor lays convolutions out channels-last, where cuDNN takes TF32 kernels
        # (torch's default for convolutions): its outputs, and ours + Inductor's alike,
        # were 1.6e-4 to 3e-4 from float64 normwise on the corpus's vision models, eager's
        # 2.5e-7 to 4e-7 (benchmarks/GPU.md), and the check judges against float64.
        torch.backends.cudnn.allow_tf32 = False
    for option in args.inductor_option:
        key, _, value = option.partition("=")
        INDUCTOR_OPTIONS[key] = ast.literal_eval(value)
    names = [n for n in args.models.split(",") if n]
    entries = [e for e in args.entries.split(",") if e]
    unknown = [n for n in names if n not in MODELS] + [e for e in entries if e not in ENTRIES]
    if unknown:
        parser.error(f"unknown model or entry point: {', '.join(unknown)}")
    torch.set_num_threads(args.threads)
    # Every generating model of a class compiles the class's one ``forward``: dynamo keeps
    # their graphs (prompt, step, dynamic step: three per model, for ours, ours + Inductor
    # and Inductor) in one cache per code object, and past its limit of 8 it runs the rest
    # uncompiled, which would time eager as ours.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    import transformers

    transformers.logging.set_verbosity_error()
    rules = load_rules("all")
    start = time.perf_counter()
    rows: list[dict] = []
    trained = set(MODELS) if args.train_models == "all" else set(args.train_models.split(","))
    plan = [(name, [e for e in entries if (e not in TRAINING or name in trained)
                    and (e not in GENERATING or name in GENERATES)]) for name in names]
    if args.large:
        plan += [(name, [e for e in entries if e in ("export", "compile", "inductor")])
                 for name in LARGE]
    plan = [(name, model_entries) for name, model_entries in plan if model_entries]
    autocast = (torch.autocast(args.device, dtype=getattr(torch, args.autocast))
                if args.autocast else contextlib.nullcontext())
    for name, model_entries in progress(plan, desc="models", unit="model"):
        with autocast:
            model_rows = run_model(name, model_entries, args.attn, rules, args.repeat,
                                   not args.no_inductor, args.device, args.cache,
                                   getattr(torch, args.dtype) if args.dtype else None)
        for row in model_rows:
            rows.append(row)
            cells = _cells(row)
            print(f"{cells['model']:<16} {cells['entry']:<8} {cells['status'][:60]:<60} "
                  f"pipeline {cells['pipeline_s']:>6} s  Inductor cold "
                  f"{cells['inductor_s'][:20]:>6} s  eager/ours/Inductor "
                  f"{cells['eager_ms']}/{cells['ours_ms']}/{cells['inductor_ms']} ms",
                  flush=True)
    total = time.perf_counter() - start
    text = table(rows)
    document = (_about(args, names, total) + text
                + "\n\nPipeline seconds by phase:\n\n" + phases_section(rows)
                + "\n\nGraph breaks and fallbacks:\n\n" + reasons_section(rows)
                + "\n\nRewrites applied, by rule:\n\n" + rewrites_section(rows) + "\n")
    print()
    print(text)
    out = args.out or results_path("models")
    out.parent.mkdir(parents=True, exist_ok=True)
    charts_written = plot(rows, out)
    write_results("models", "Real architectures: pipeline vs eager and Inductor", document,
                  out=out, plots=[p for p in charts_written if p.suffix == ".svg"],
                  device=args.device)
    for path in charts_written:
        print(f"written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
