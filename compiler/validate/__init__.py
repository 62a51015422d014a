"""Validation: the emitted module against its source, with a float64 reference.

The source is evaluated in float64 (parameters and floating inputs promoted) as the
reference; the new program must be at least as close to it as the source is, within a
tolerance scaled to the dtype, on the example inputs and on random inputs of the same
shapes, dtypes and integer ranges. Errors are relative (:func:`relative_errors`): normwise,
the new program must stay within twice the source's error plus a few dozen roundings
(:data:`NORMWISE_SLACK`: more where every input is invented from a fake tensor);
elementwise, each output element judged at its own magnitude, within
:data:`ELEMENTWISE_SLACK` times the source's worst. A rewrite that removes an overflow is
therefore not mistaken for a bug. Programs with random ops (any op torch's schemas tag as
drawing, and the generators a model holds) are compared to the source under the same seeds
instead, normwise within :func:`working_tolerance` as in working mode; an output outside it
is judged, as there, against the source in float64, which is handed the draws of the
source's own run (:class:`~compiler.validate.runs.Draws`: under one seed float64 draws
other numbers).

float64 has its own limits: ``log(x + 1) - log(x)`` is 0 in float64 for x past 1e16, where
its stable form gives the true ``1/x``. Before a program is refused, the reference is run
again with each inexact op's result moved by a few roundings at random (Monte Carlo
arithmetic, :func:`reference_spread`); what lies within that spread of the reference is not
counted as error, so a program more accurate than float64 is not refused for it. Nor is the
source's error only the one its run happened to make: an output that is 0 in truth (the
mean of a layer norm's output, a log-sum-exp of log-probabilities) may round to exactly 0
in the source and to 2e-7 in a fused form. The source is run again with each inexact op's
result moved by up to one rounding of its own dtype (:func:`rounding_samples`), and its
error is the worst of those runs': results it could as well have given.

That float64 copy of the model doubles its memory and time. ``reference="working"`` is the
cheaper mode for large models: the new program is compared with the source run in the
working dtype, normwise within :func:`working_tolerance` of the dtype (an output outside
it is judged against the source in float64 before the program is refused: the working-dtype
source may be the one that is off, a float16 sum that overflows); the report's
``reference`` says which mode was used. On a large program (:data:`SIDE_BY_SIDE_NUMEL`)
whose CPU has cores to spare, the source and the new program run side by side in two
threads, so validation takes about one forward pass, not two.

The package reads as the method: :mod:`~compiler.validate.inputs` (what it runs on),
:mod:`~compiler.validate.runs` (running both programs alike), :mod:`~compiler.validate.state`
(the caller's state where the source has effects), :mod:`~compiler.validate.reference`
(float64, working dtype, same seed; Monte Carlo spreads), :mod:`~compiler.validate.judging`
(the error measures and their slack), :mod:`~compiler.validate.verdict` (the report);
:func:`validate_module` below is the outline, and :mod:`~compiler.validate.autograd`
judges gradients the same way.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) / torch.exp(x).sum())
>>> opt = EGraph.from_fx(gm, (torch.randn(4),)).extract(AstSize())
>>> opt.meta["egraph_report"].validation.ok
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx as fx

from compiler.validate.autograd import validate_autograd
from compiler.validate.inputs import (
    STRESS_SCALE,
    in_domain,
    input_sets,
    is_fake,
    meta_state,
    program_numel,
    random_like,
    stand_ins,
    strided_like,
)
from compiler.validate.judging import (
    ELEMENTWISE_SLACK,
    NORMWISE_SLACK,
    exceeds,
    judge,
    less_accurate,
    output_changed,
    overflow_changed,
    overflows_sooner,
    relative_error,
    relative_errors,
    rounding_tolerance,
    sharing_pairs,
    working_tolerance,
)
from compiler.validate.reference import (
    EXACT_LIMIT,
    FLOAT64_LIMIT,
    REFERENCES,
    exact_reference,
    float64_copy,
    float64_reference,
    reference_mode,
    reference_spread,
    rounding_samples,
    works_in_float64,
)
from compiler.validate.runs import (
    SIDE_BY_SIDE_NUMEL,
    Draws,
    FilledBlanks,
    run_new,
    run_source,
    side_by_side,
)
from compiler.validate.state import State, caller_state_kept, effects_differ
from compiler.validate.verdict import SOURCE_REFERENCES, Validation, ValidationError, Verdict
from frontends.fx.effects import leaves_memory_unwritten
from frontends.fx.exported import ExportedModule
from frontends.fx.kept import generators_kept
from frontends.fx.source import FxSource

__all__ = [
    "ELEMENTWISE_SLACK", "FLOAT64_LIMIT", "NORMWISE_SLACK", "REFERENCES", "SIDE_BY_SIDE_NUMEL",
    "SOURCE_REFERENCES", "STRESS_SCALE", "Validation", "ValidationError", "float64_copy",
    "float64_reference", "in_domain", "is_fake", "judge", "meta_state", "program_numel",
    "random_like", "reference_spread", "relative_error", "relative_errors", "rounding_samples",
    "sharing_pairs", "stand_ins", "strided_like", "validate_autograd", "validate_module",
    "working_tolerance",
]


def validate_module(src: FxSource, new: fx.GraphModule, trials: int = 2,
                    max_numel: int = 1 << 22, reference: str = "auto",
                    defined_only: bool = False) -> Validation:
    """Check ``new`` against the source program of ``src`` (see the module docstring), with
    the source in float64 or in its working dtype as the ``reference``
    (:data:`REFERENCES`). ``defined_only``: the check of a formula rewritten for accuracy
    against a 150-digit reference (Herbie's search): only the elements where the reference
    is a number are judged (``log1p(1/x)`` for ``log(x + 1) - log(x)`` is a number at
    ``x < -1``, where the source is NaN), normwise and for finiteness, not elementwise;
    on inputs 8 times wider it must not overflow where the source does not (``x0 / s * 1e-7``
    for ``(x0 - x0 * 1.0000001) / s`` overflows 1e7 times sooner).

    >>> from egraph import EGraph
    >>> src = EGraph.from_fx(fx.symbolic_trace(lambda x: torch.exp(x) + 1),
    ...                      (torch.randn(8),)).fx
    >>> validate_module(src, fx.symbolic_trace(lambda x: torch.exp(x) + 1)).ok
    True
    >>> wrong = validate_module(src, fx.symbolic_trace(lambda x: x + 2))
    >>> wrong.ok, wrong.reason.split()[:2]
    (False, ['relative', 'error'])
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    on_meta = meta_state(src)
    if on_meta is not None:
        return Validation(False, 0.0, math.inf, 0,
                          f"{on_meta} is on the meta device, so neither program can run; "
                          "extract with validate='off', or build the model with real weights")
    # Inside torch.compile a fake mode is active; validation runs on real tensors.
    with unset_fake_temporarily(), caller_state_kept(src, new) as state, generators_kept(
            src.graph_module, src.module, new) as generators:
        inputs = stand_ins(src.example_inputs, src.graph_module)
        validator = _Validator(src, new, inputs, reference, defined_only, state, generators)
        result = validator.run(input_sets(src, inputs, trials, validator.numel, max_numel))
    if not result.ok and not result.trials and any(
            isinstance(x, torch.Tensor) and x.device.type == "meta"
            for x in src.example_inputs or ()):
        # (torch.compile lifts a meta model's weights into fake inputs: stand-ins for them
        # do not make the program's meta constants and devices runnable)
        return replace(result, reason=result.reason + "; its example inputs are on the meta "
                       "device (a model built there has no values to run): compile or "
                       "extract it with validate='off'")
    return result


@dataclass
class _Run:
    """One input set's runs: the inputs the source took, its flat outputs and the new
    program's, the random numbers the source drew, the reference's outputs; and what only
    an output that needs it computes: the spread of float64, the source's rounding
    samples, the source in float64 as working mode's second opinion."""

    xs: tuple
    before: list
    after: list
    drawn: list | None
    reference: list = field(default_factory=list)
    spread: list | None = None
    samples: list | None = None
    escalated: bool = False
    exact: list | None = None


class _Validator:
    """One validation: the source (``src``, run as ``original``) and the ``new`` program
    on the input sets, judged output by output against the reference of the ``reference``
    mode, the tally kept in a :class:`Verdict` (``state``: where the source has effects,
    the caller's state, from which each program runs on each input set; ``generators``:
    those the source draws from besides torch's own, seeded like it for each run)."""

    def __init__(self, src: FxSource, new: fx.GraphModule, inputs: tuple, reference: str,
                 defined_only: bool, state: State | None,
                 generators: Sequence[torch.Generator]):
        self.src, self.new, self.defined_only = src, new, defined_only
        self.state, self.generators = state, generators
        self.original = src.graph_module if src.module is None else src.module
        self.numel = program_numel(self.original, inputs)
        self.random = src.random
        self.working = reference_mode(reference, self.numel) == "working"
        invented = all(x is not y for x, y in zip(inputs, src.example_inputs)
                       if isinstance(y, torch.Tensor))
        self.normwise_slack = NORMWISE_SLACK["invented" if invented else "given"]
        # (a graph that works in float64 is judged against the reals: float64 cannot
        # judge itself)
        self.exact = (not self.random and not self.working and state is None
                      and not isinstance(self.original, ExportedModule)
                      and self.numel <= EXACT_LIMIT
                      and works_in_float64(src.graph_module, inputs))
        self.reference = (None if self.random or self.working
                          else exact_reference(src.graph_module) if self.exact
                          else float64_reference(self.original, state is not None))
        # where working mode needs a second opinion: the source in float64, made once
        self.float64_source = None
        self.verdict = Verdict("same-seed original" if self.random else
                               "working-dtype original" if self.working else
                               "the reals" if self.exact else "float64", 0)

    def run(self, sets: list[tuple[tuple, bool]]) -> Validation:
        """The verdict on ``sets`` (:func:`input_sets`): refused at the first output that
        fails, passed once every set is judged."""
        self.verdict.trials = len(sets)
        # Elements an allocation of whatever the memory held (``empty_like``) keeps
        # unwritten are NaN in every run (an aot graph of normflows' spline leaves the ones
        # outside its mask to the caller); otherwise each run's garbage would be judged.
        blank = leaves_memory_unwritten(self.src.graph_module)
        # (not with effects: both programs would change the same tensors at once; nor with
        # blank allocations: a dispatch mode is the thread's own)
        beside = (ThreadPoolExecutor(2, "egraph-validate") if not self.random
                  and self.state is None and not blank
                  and side_by_side(self.original, sets[0][0], self.numel) else nullcontext())
        with torch.no_grad(), beside as pool, FilledBlanks() if blank else nullcontext():
            for given, stressed in sets:
                refusal = self._judge_set(given, stressed, pool)
                if refusal is not None:
                    return refusal
        return self.verdict.result()

    def _judge_set(self, given: tuple, stressed: bool, pool: Executor | None
                   ) -> Validation | None:
        """Run the source and the new program on ``given`` (in ``pool``'s two threads
        where there is one) from the same state, and judge what they leave and return."""
        state = self.state.with_inputs(given) if self.state is not None else None
        drawn: list | None = [] if self.random else None
        ahead = None
        if pool is None:
            xs, before = run_source(self.original, given, self.generators, drawn)
        else:
            ahead = pool.submit(run_new, self.new, given)
            xs, before = pool.submit(run_source, self.original, given).result()
        if before is None:
            return None  # generated integers the source cannot take (an index too large)
        self.verdict.checked += 1
        if state is not None:  # the new program runs from the source's state
            left_by_source = state.changes()
            state.restore(left_by_source)
        try:
            after = (ahead.result() if ahead is not None and xs is given
                     else run_new(self.new, xs, self.generators))
        except Exception as error:  # noqa: BLE001 - an ill-typed rewrite: refuse it
            return self.verdict.refuse(
                "the optimised program raises where the original runs "
                f"({type(error).__name__}: {str(error).splitlines()[0]})")
        if state is not None:
            left_by_new = state.changes()
            differ = effects_differ(state, left_by_source, left_by_new)
            if differ:
                return self.verdict.refuse(differ)
            state.restore(left_by_new)  # (and the reference runs from it too)
        return self._judge_outputs(_Run(xs, before, after, drawn), stressed)

    def _judge_outputs(self, run: _Run, stressed: bool) -> Validation | None:
        """Judge the outputs of one input set's runs: their structure, then each output."""
        if len(run.before) != len(run.after):
            return self.verdict.refuse("the output structure changed")
        joined = sorted(sharing_pairs(run.after) - sharing_pairs(run.before))
        if joined:
            return self.verdict.refuse(f"outputs {joined[0][0]} and {joined[0][1]} share one "
                                       "storage where the original's are tensors of their own")
        reference = self.reference(run.xs) if self.reference is not None else run.before
        if self.exact and not _like(reference, run.before):
            # (an op the reals cannot take, an output of another kind: float64 judges)
            self.exact, self.verdict.reference = False, "float64"
            self.reference = float64_reference(self.original, self.state is not None)
            reference = self.reference(run.xs)
        if reference is None:
            reference, self.verdict.reference = (run.before,
                                                 "original (it cannot run in float64)")
        run.reference = reference
        stored = {x.untyped_storage().data_ptr() for x in run.xs
                  if isinstance(x, torch.Tensor)}
        for index, (b, a, r) in enumerate(zip(run.before, run.after, run.reference)):
            changed = output_changed(a, b, stored)
            if changed:
                return self.verdict.refuse(f"output {index}: {changed}")
            if not isinstance(b, torch.Tensor):
                continue
            if b.is_contiguous() and not a.is_contiguous():
                self.verdict.strided.add(index)
            refusal = (self._judge_stressed(a, b, r) if stressed
                       else self._judge_output(run, index, a, b, r))
            if refusal is not None:
                return refusal
        return None

    def _judge_stressed(self, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor
                        ) -> Validation | None:
        """On wide inputs both programs may lose accuracy; only a new overflow counts."""
        if b.is_floating_point() and overflows_sooner(a, b, r):
            return self.verdict.refuse(
                f"a value overflows where the original's does not (inputs {STRESS_SCALE:g} "
                "times wider than the examples)")
        return None

    def _judge_output(self, run: _Run, index: int, a: torch.Tensor, b: torch.Tensor,
                      r: torch.Tensor) -> Validation | None:
        """Judge the new program's output ``a`` against the source's ``b`` and the
        reference's ``r``. With no float64 reference (working mode, a program that draws
        random numbers) both are rounded in the working dtype, and a reassociated sum
        differs from the source's at its tiny elements: normwise within
        :func:`working_tolerance`, or else judged against the source in float64."""
        if self.working or self.random:
            n_after = relative_errors(a, b)[1]
            if n_after <= working_tolerance(b.dtype):
                self.verdict.error_after = max(self.verdict.error_after, n_after)
                return None
            r = self._second_opinion(run, index, b)
            if r is None:
                return self.verdict.refuse(
                    f"normwise relative error {n_after:.3g} from the original in {b.dtype} "
                    f"(tolerance {working_tolerance(b.dtype):.3g})",
                    error_after=max(self.verdict.error_after, n_after), error_before=0.0)
        return self._judge_against(run, index, a, b, r)

    def _second_opinion(self, run: _Run, index: int, b: torch.Tensor) -> torch.Tensor | None:
        """The source's output ``index`` in float64, to judge by where the new program is
        outside the working tolerance: the working-dtype source may be the one that is off
        (a float16 sum that overflows, which a fused softmax avoids; a deep network with
        batch statistics of few elements, where one rounding grows to the output's scale).
        The float64 run draws the random numbers the working-dtype source drew. None for
        an output that is not floating, or where the float64 run fails or draws less."""
        if not b.is_floating_point():
            return None
        if not run.escalated:
            run.escalated = True
            if self.float64_source is None:
                self.float64_source = float64_reference(self.original, self.state is not None)
            replay = Draws([] if run.drawn is None else run.drawn, replay=True)
            with replay:
                run.exact = self.float64_source(run.xs)
            if replay.at != len(replay.drawn):  # (it drew less: no reference)
                run.exact = None
        if run.exact is None:
            return None
        self.verdict.reference = "float64 (the working-dtype original disagreed)"
        return run.exact[index]

    def _judge_against(self, run: _Run, index: int, a: torch.Tensor, b: torch.Tensor,
                       r: torch.Tensor) -> Validation | None:
        """Judge ``a`` against the float64 output ``r``: as close to it as the source's
        ``b`` is, within the slack, and no overflow of the source's changed into another
        non-finite value."""
        if self.defined_only and b.is_floating_point():
            a = a.masked_fill(torch.isnan(r).to(a.device), math.nan)
        if b.is_floating_point() and overflow_changed(a, b, r):
            return self.verdict.refuse("a value the original overflows to inf becomes NaN "
                                       "or the other infinity")
        # where the source overflowed or cancelled to NaN though the reference is finite,
        # it is not judged, and neither is the new program (inf becoming NaN there is
        # checked above); elsewhere the new program must do as well
        failed = (torch.isfinite(r.to(b.device)) & ~torch.isfinite(b)
                  if b.is_floating_point() else None)
        tol = rounding_tolerance(b.dtype)
        e_before, n_before, e_after, n_after = self._errors(run, index, (a, b, r), failed, tol)
        verdict = self.verdict
        verdict.error_before = max(verdict.error_before, e_before)
        verdict.error_after = max(verdict.error_after, e_after)
        if self.defined_only:
            # elementwise accuracy was judged by the search, against 150 digits; float64
            # cannot judge it where the formula cancels (tan(x + eps) - tan(x) near a
            # pole): only the output's scale and finiteness here
            e_after = e_before
        errors = (e_before, n_before, e_after, n_after)
        # an output the source cancels to rounding noise on these inputs (no correct
        # digit: a layer norm's mean of centred values, saved for the backward) is judged
        # as on invented inputs
        slack = NORMWISE_SLACK["invented"] if n_before > 1 else self.normwise_slack
        if exceeds(*errors, slack, tol):
            return verdict.refuse(less_accurate(errors, "the original"),
                                  error_after=verdict.error_after)
        return None

    def _errors(self, run: _Run, index: int, outputs: tuple, failed: torch.Tensor | None,
                tol: float) -> tuple[float, float, float, float]:
        """The (elementwise, normwise) errors of the source's output and the new
        program's (``outputs``: new, source, reference) against the reference, the
        ``failed`` elements left out. Where the new program's exceed what the source's
        allow, the difference float64 cannot resolve is not counted, and the source's are
        the worst its own rounding could give."""
        a, b, r = outputs
        errors = (*relative_errors(b, r, ignore=failed), *relative_errors(a, r, ignore=failed))
        if not (exceeds(*errors, self.normwise_slack, tol) and self.reference is not None
                and b.is_floating_point()):
            return errors
        # Before refusing: is the difference within what float64 resolves?
        if run.spread is None:
            run.spread = ([None] * len(run.reference) if self.exact  # (it resolves all)
                          else reference_spread(self.src.graph_module, run.xs, run.reference))
        unresolved = run.spread[index]
        if unresolved is not None:
            errors = (*relative_errors(b, r, unresolved, failed),
                      *relative_errors(a, r, unresolved, failed))
        if not exceeds(*errors, self.normwise_slack, tol):
            return errors
        # ... or within what the source's own rounding could give?
        if run.samples is None:
            run.samples = rounding_samples(self.src.graph_module, run.xs)
        e_before, n_before, e_after, n_after = errors
        for sample in run.samples:
            e_before, n_before = (max(pair) for pair in zip(
                (e_before, n_before),
                _sample_errors(sample[index] if index < len(sample) else None,
                               b, r, unresolved, failed)))
        return e_before, n_before, e_after, n_after


def _like(reference: list | None, outputs: list) -> bool:
    """Whether ``reference`` gives a float64 tensor of each output's shape."""
    return reference is not None and len(reference) == len(outputs) and all(
        isinstance(o, torch.Tensor) and o.dtype == torch.float64 and r.shape == o.shape
        for r, o in zip(reference, outputs))


def _sample_errors(run: Any, source: torch.Tensor, ref: torch.Tensor,
                   unresolved: torch.Tensor | None, ignore: torch.Tensor | None
                   ) -> tuple[float, float]:
    """The errors of a :func:`rounding_samples` run's output ``run`` where it is an
    output like the ``source``'s, else none."""
    if not (isinstance(run, torch.Tensor) and run.shape == source.shape
            and run.dtype == source.dtype):
        return 0.0, 0.0
    return relative_errors(run, ref, unresolved, ignore)
