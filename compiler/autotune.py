"""Autotuning: where the cost model is unsure, the clock decides between the programs.

``eg.extract(cost, autotune=True)`` (and the backend's ``options={"autotune": True}``, or
``mode="max-autotune"``) takes the cost model's choice and a few programs it cannot tell
from it (:func:`candidates`): the choices of other cost models (:func:`rival_costs`) and
the programs the model prices within a margin of its own (the source, and extractions
under the model's costs jittered at random, :class:`extractors.RandomCost`). Each is
emitted and validated against the source (one that fails is never kept); at most
:attr:`Autotune.programs` of them are timed on the example inputs, in interleaved rounds
(:mod:`compiler.timing`), the model's choice twice. The fastest is kept only if it beats
the model's choice by more than the two copies of the model's choice differ (and by
:attr:`Autotune.min_gain`); else the model's choice stays: a difference within the noise
changes nothing.

The decision is remembered in :data:`DECISIONS` (for the life of the process), keyed by the
source graph, the inputs' shapes, dtypes and devices, and the candidate programs: the same
graph on the same kind of inputs gets the same program again without timing
(``report.autotune.cached``).

>>> import torch
>>> from egraph import EGraph
>>> from egraph.rules import load_rules
>>> from extractors import Flops
>>> gm = torch.fx.symbolic_trace(lambda x: torch.log(1 + torch.exp(x)) * 2)
>>> eg = EGraph.from_fx(gm, (torch.randn(64),)).saturate(load_rules("all"), iter_limit=3)
>>> tuned = eg.extract(Flops(), autotune=True).meta["egraph_report"].autotune
>>> tuned.timed >= 2, tuned.chosen_ms > 0
(True, True)
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from backends.folding import share_folded
from backends.fx import build_module
from compiler.timing import interleaved_times
from compiler.validate import stand_ins, validate_module
from egraph.egraph import EGraph
from egraph.extract import source_program
from egraph.extract.program import dag_cost
from extractors import Flops, Memory, RandomCost, Roofline
from frontends.fx.effects import updates_inputs

__all__ = ["DECISIONS", "MODEL", "TWIN", "Autotune", "Autotuned", "Candidate", "Candidates",
           "autotune", "candidates", "rival_costs", "run_key"]

MODEL = "model"
"""The label of the cost model's own choice among the candidates (and the timer's key)."""
TWIN = "model again"
"""The timer's key of the second copy of the model's choice: the yardstick of the noise."""
JITTER = 0.3
"""How far a jittered extraction's node costs stray from the model's (``exp(0.3 z)``)."""

Timer = Callable[[Mapping[str, Callable[[], Any]]], Mapping[str, float]]
"""What times the candidates: zero-argument calls by label in, median milliseconds by
label out (:attr:`Autotune.timer`)."""

DECISIONS: dict[tuple, tuple[int, dict[str, float]]] = {}
"""The decisions taken in this process: key (the source graph, the inputs' kinds, the
candidates' code) -> (the place of the program kept among the candidates, the measured
milliseconds by label). ``DECISIONS.clear()`` makes every graph timed again."""


@dataclass(frozen=True)
class Autotune:
    """How autotuning chooses (``extract(cost, autotune=Autotune(...))``; ``True`` means
    the defaults): at most ``programs`` candidates timed (the model's choice included);
    ``margin``: how much dearer than the model's choice, under the model, a program may be
    and still be a candidate; ``draws``: jittered extractions tried; ``rounds`` (at most)
    and ``min_rounds`` of timing, which stops after ``seconds`` once ``min_rounds`` are
    done (a large model's programs take a second a call on a busy CPU); ``min_gain``: the
    least relative gain that replaces the
    model's choice, on top of the measured spread; ``rivals``: the other cost models whose
    choices are candidates (None: :func:`rival_costs`); ``timer``: the function that times
    (labels to zero-argument calls, returning median milliseconds by label; None:
    interleaved rounds, :func:`compiler.timing.interleaved_times`).

    >>> Autotune.of(True) == Autotune(), Autotune.of(False)
    (True, None)
    >>> Autotune(programs=1)
    Traceback (most recent call last):
    ...
    ValueError: Autotune(programs=1): a whole number of programs, at least 2
    """

    programs: int = 8
    margin: float = 0.1
    draws: int = 8
    rounds: int = 30
    min_rounds: int = 3
    seconds: float = 20.0
    min_gain: float = 0.02
    rivals: tuple | None = field(default=None, repr=False)
    timer: Timer | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, least in (("programs", 2), ("draws", 0), ("rounds", 1), ("min_rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"Autotune({name}={value!r}): a whole number of {name}, "
                                 f"at least {least}")
        for name in ("margin", "min_gain", "seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < float("inf")):
                raise ValueError(f"Autotune({name}={value!r}): a finite number, 0 or more")
        if self.timer is not None and not callable(self.timer):
            raise TypeError(f"Autotune(timer={self.timer!r}): a function of the calls by "
                            "label, returning milliseconds by label")

    @classmethod
    def of(cls, value: bool | Autotune | None) -> Autotune | None:
        """The settings ``autotune=value`` asks for: None where it is off.

        >>> Autotune.of("yes")
        Traceback (most recent call last):
        ...
        TypeError: autotune='yes': use True, False or compiler.autotune.Autotune(...)
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        raise TypeError(f"autotune={value!r}: use True, False or "
                        "compiler.autotune.Autotune(...)")


@dataclass
class Candidate:
    """One distinct program: who found it (labels, the first its timer's key), its choice
    (class -> e-node), the emitted module, and once timed, its median milliseconds."""

    found_by: list[str]
    choice: dict[int, tuple]
    module: fx.GraphModule
    ms: float | None = None

    @property
    def code(self) -> str:
        """The emitted code."""
        return self.module.code


_FOLDED = re.compile(r"folded_\d+\b")


def run_key(module: fx.GraphModule) -> tuple:
    """What tells programs apart at run time: the emitted code with its folded constants
    (:mod:`backends.folding`) named in the order the code reads them, and each one's
    shape, strides and dtype. Two choices that fold one constant by different recipes (a
    bias summed in another order) run the same calls on the same layouts: one program.

    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x * 2), (torch.randn(3),))
    >>> code, layouts = run_key(build_module(eg, source_program(eg)))
    >>> "torch.mul(x, 2)" in code, layouts
    (True, ())
    """
    order: dict[str, str] = {}
    code = _FOLDED.sub(lambda m: order.setdefault(m.group(), f"folded_{len(order)}"),
                       module.code)
    folded = getattr(module, "folded_constants", None)
    layouts = []
    for name in order:
        value = getattr(folded, name, None)
        layouts.append((tuple(value.shape), value.stride(), value.dtype)
                       if isinstance(value, torch.Tensor) else None)
    return code, tuple(layouts)


class Candidates:
    """The distinct programs found (by :func:`run_key`: emitted code and the layouts of
    its folded constants), each validated against the source
    on its example inputs, and those left out with why: at most ``limit``. ``build``
    emits a choice (default :func:`backends.fx.build_module` for the CPU).

    >>> from egraph import EGraph
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x * 2), (torch.randn(3),))
    >>> found = Candidates(eg)
    >>> found.offer("source", source_program(eg)) is found.offer("again", source_program(eg))
    True
    >>> found.programs[0].found_by
    ['source', 'again']
    """

    def __init__(self, egraph: EGraph, build: Callable[[dict], fx.GraphModule] | None = None,
                 limit: float = float("inf")):
        self.eg, self.limit = egraph, limit
        self.build = build or (lambda choice: build_module(egraph, choice))
        self.programs: list[Candidate] = []
        self.by_key: dict[tuple, Candidate] = {}
        self.left_out: list[tuple[str, str]] = []  # (found by, why)
        self.folded: dict = {}  # the programs' shared folded constants (FoldedConstants.share)

    @property
    def full(self) -> bool:
        """Whether ``limit`` programs are found."""
        return len(self.programs) >= self.limit

    def offer(self, label: str, choice: dict[int, tuple]) -> Candidate | None:
        """Emit ``choice``; keep it where its code is new and it passes validation (or
        name ``label`` among the finders of the program with that code)."""
        try:
            module = self.build(choice)
        except Exception as exc:  # noqa: BLE001 - a program emission refuses is left out
            self.left_out.append((label, f"emission: {type(exc).__name__}: {exc}"[:160]))
            return None
        share_folded(module, self.folded)
        key = run_key(module)
        known = self.by_key.get(key)
        if known is not None:
            known.found_by.append(label)
            return known
        if self.full:
            return None
        try:
            # (a candidate's warnings are its trial's: the kept program's validation
            # warns again)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                verdict = validate_module(self.eg.fx, module, trials=0)
        except Exception as exc:  # noqa: BLE001 - a program that cannot run is left out
            self.left_out.append((label, f"run: {type(exc).__name__}: {exc}"[:160]))
            return None
        if not verdict.ok:
            self.left_out.append((label, f"validation: {verdict.reason}"[:160]))
            return None
        program = self.by_key[key] = Candidate([label], choice, module)
        self.programs.append(program)
        return program


def rival_costs(cost: Any) -> list[Any]:
    """The other cost models whose choices are candidates beside ``cost``'s: FLOPs and
    bytes moved, and for a time on a hardware profile, the same time with fusion seen the
    other way (each op its own kernel, or fusion regions as kernels).

    >>> rival_costs(Roofline("cpu", fused=False))
    [Flops(), Memory(), Roofline('cpu')]
    """
    rivals: list[Any] = [Flops(), Memory()]
    if isinstance(cost, Roofline):
        rivals.append(Roofline(cost.hardware, fused=not cost.fused))
    return rivals


def candidates(egraph: EGraph, cost: Any, picked: dict[int, tuple],
               choose: Callable[[Any], dict[int, tuple]], tune: Autotune,
               build: Callable[[dict], fx.GraphModule] | None = None) -> Candidates:
    """The programs autotuning times: the model's choice ``picked`` (label
    :data:`MODEL`), each rival's choice (``choose(rival)``: the program extraction picks
    under it), then, where the model prices them within ``tune.margin`` of ``picked``,
    the source and the programs chosen under the model's costs jittered at random (seeded:
    the same e-graph gives the same candidates); at most ``tune.programs``, each validated.
    Where the model's choice itself fails validation, it is the only one offered.

    >>> from compiler.fx import choose_program
    >>> from egraph import EGraph
    >>> from egraph.rules import load_rules
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.log(1 + torch.exp(x))),
    ...                     (torch.randn(8),)).saturate(load_rules("all"), iter_limit=3)
    >>> def choose(cost):
    ...     return choose_program(eg, cost)[0]
    >>> found = candidates(eg, Flops(), choose(Flops()), choose, Autotune())
    >>> found.programs[0].found_by[0], len(found.programs) >= 2
    ('model', True)
    """
    found = Candidates(egraph, build, tune.programs)
    if found.offer(MODEL, picked) is None:
        return found
    rivals = rival_costs(cost) if tune.rivals is None else tune.rivals
    for rival in rivals:
        found.offer(repr(rival), choose(rival))
    bound = float(dag_cost(egraph, cost, picked)) * (1 + tune.margin)

    def close(choice: dict[int, tuple]) -> bool:
        return float(dag_cost(egraph, cost, choice)) <= bound

    source = source_program(egraph)
    if close(source):
        found.offer("source", source)
    for draw in range(tune.draws):
        if found.full:
            break
        choice = choose(RandomCost(draw, cost, JITTER))
        if close(choice):
            found.offer(f"jittered {draw}", choice)
    return found


@dataclass
class Autotuned:
    """What autotuning did to one program (``report.autotune``): how many programs were
    ``timed`` (0: nothing to choose between, ``note`` says why), which was kept
    (``chosen``, its finders' labels: :data:`MODEL` for the cost model's choice), the
    measured median milliseconds of the kept program and of the model's choice, the
    spread the gain had to beat (the model's choice timed twice), whether the decision
    came from :data:`DECISIONS` (``cached``), the seconds autotuning took (``timing``:
    those spent timing; the rest found, emitted and validated the candidates), and the
    candidates (each with its ``ms``) and those left out with why."""

    timed: int
    chosen: str = MODEL
    chosen_ms: float | None = None
    model_ms: float | None = None
    spread_ms: float | None = None
    cached: bool = False
    seconds: float = 0.0
    timing: float = 0.0
    candidates: list[Candidate] = field(default_factory=list, repr=False)
    left_out: list[tuple[str, str]] = field(default_factory=list, repr=False)
    note: str = ""

    def __str__(self) -> str:
        if not self.timed:
            return f"autotune: nothing timed ({self.note})"
        cached = ", remembered" if self.cached else ""
        kept = "the model's choice" if self.chosen.split(", ")[0] == MODEL else self.chosen
        return (f"autotune: {self.timed} programs timed{cached}; kept {kept} at "
                f"{self.chosen_ms:.3f} ms (the model's choice {self.model_ms:.3f} ms, "
                f"spread {self.spread_ms:.3f} ms); {self.seconds:.1f} s, "
                f"{self.timing:.1f} s of it timing")


def autotune(egraph: EGraph, cost: Any, picked: dict[int, tuple],
             choose: Callable[[Any], dict[int, tuple]], tune: Autotune,
             build: Callable[[dict], fx.GraphModule] | None = None
             ) -> tuple[dict[int, tuple], Autotuned]:
    """The program to emit, of the model's choice ``picked`` and the :func:`candidates`
    around it, timed on ``egraph``'s example inputs, and the :class:`Autotuned` report (the
    module docstring says how it decides). With a timer that finds them all alike, the
    model's choice stays:

    >>> from compiler.fx import choose_program
    >>> from egraph import EGraph
    >>> from egraph.rules import load_rules
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.log(1 + torch.exp(x))),
    ...                     (torch.randn(8),)).saturate(load_rules("all"), iter_limit=3)
    >>> def choose(cost):
    ...     return choose_program(eg, cost)[0]
    >>> alike = Autotune(timer=lambda calls: {label: 1.0 for label in calls})
    >>> kept, report = autotune(eg, Flops(), choose(Flops()), choose, alike)
    >>> kept == choose(Flops()), report.chosen.split(", ")[0], report.timed >= 2
    (True, 'model', True)
    """
    start = time.perf_counter()
    if egraph.fx.example_inputs is None:
        raise ValueError("autotune times programs on the example inputs: build the e-graph "
                         "with EGraph.from_fx(model, example_inputs)")
    found = candidates(egraph, cost, picked, choose, tune, build)
    programs = found.programs
    if len(programs) < 2:  # (none: the model's choice failed, and no other was offered)
        note = ("the model's choice failed validation" if not programs
                else "no other valid program near the model's choice")
        return picked, Autotuned(0, note=note, left_out=found.left_out,
                                 candidates=programs, seconds=time.perf_counter() - start)
    inputs = _real_inputs(egraph)
    key = _decision_key(egraph, inputs, programs, tune)
    cached = key in DECISIONS
    timing = time.perf_counter()
    if not cached:
        DECISIONS[key] = _decide(programs, inputs, egraph.fx.graph_module, tune)
    index, ms = DECISIONS[key]
    timing = time.perf_counter() - timing
    for program in programs:
        program.ms = ms[program.found_by[0]]
    report = Autotuned(len(programs), ", ".join(programs[index].found_by),
                       programs[index].ms, ms[MODEL], abs(ms[TWIN] - ms[MODEL]), cached,
                       time.perf_counter() - start, timing, programs, found.left_out)
    return programs[index].choice, report


def _decide(programs: Sequence[Candidate], inputs: tuple, source: fx.GraphModule,
            tune: Autotune) -> tuple[int, dict[str, float]]:
    """Time the programs (the model's choice, first, twice) and pick: the fastest where it
    beats the model's choice by more than the twins' gap and ``tune.min_gain``."""
    fns: dict[str, Callable[[], Any]] = {
        p.found_by[0]: _call(p.module, inputs, updates_inputs(source.graph)) for p in programs}
    fns[TWIN] = fns[MODEL]
    timer = tune.timer or _steady_timer(tune)
    with torch.no_grad():
        ms = {key: float(value) for key, value in timer(fns).items()}
    missing = [key for key in fns if key not in ms]
    if missing:
        raise ValueError(f"the autotune timer gave no time for {missing}: it must return "
                         "milliseconds for every label it is given")
    model = ms[MODEL]
    need = max(abs(ms[TWIN] - model), tune.min_gain * model)
    best = min(range(len(programs)), key=lambda i: (ms[programs[i].found_by[0]], i))
    if model - ms[programs[best].found_by[0]] <= need:
        best = 0
    return best, ms


def _steady_timer(tune: Autotune) -> Timer:
    """Median milliseconds over interleaved rounds, stopping once the model's two copies
    agree within 1 % or ``tune.seconds`` are spent (at least ``tune.min_rounds`` rounds,
    at most ``tune.rounds``)."""
    def timer(fns: Mapping[str, Callable[[], Any]]) -> dict[str, float]:
        times = interleaved_times(fns, tune.rounds, twins=(MODEL, TWIN),
                                  min_rounds=min(tune.min_rounds, tune.rounds),
                                  seconds=tune.seconds)
        return {key: statistics.median(ts) * 1e3 for key, ts in times.items()}
    return timer


def _call(module: fx.GraphModule, inputs: tuple, writes: bool) -> Callable[[], Any]:
    """A call of ``module`` on ``inputs`` (copies of them where the graph writes into its
    inputs), waiting for the GPU where they live on one."""
    cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)

    def call() -> Any:
        args = [x.clone() if writes and isinstance(x, torch.Tensor) else x for x in inputs]
        out = module(*args)
        if cuda:
            torch.cuda.synchronize()
        return out
    return call


def _real_inputs(egraph: EGraph) -> tuple:
    """The example inputs as real values (random ones of the kind for fake tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return stand_ins(egraph.fx.example_inputs, egraph.fx.graph_module)


def _decision_key(egraph: EGraph, inputs: tuple, programs: Sequence[Candidate],
                  tune: Autotune) -> tuple:
    """What a decision is remembered by: the source graph, the inputs' kinds, the
    candidates' code in order (the model's choice first) and the settings."""
    def digest(text: str) -> str:
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    kinds = tuple((tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(
        x, torch.Tensor) else repr(x) for x in inputs)
    return (digest(egraph.fx.graph_module.code), kinds,
            tuple(digest(p.code) for p in programs), repr(tune), repr(tune.rivals),
            tune.timer is None)

