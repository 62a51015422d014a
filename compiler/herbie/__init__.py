"""Herbie's method for tensor programs: localise the error, rewrite there, expand in series,
and split the input range into regimes.

:func:`improve_accuracy` takes a GraphModule and sample inputs and returns a GraphModule
whose elementwise formulas are more accurate in the working dtype (float32, float16,
bfloat16), as Herbie (Panchekha et al., PLDI 2015) improves a scalar expression:

1. *Localise* (:func:`frontends.fx.error_analysis.local_error`): each op's own error on the
   samples, its result in the working dtype from exactly computed arguments against the exact
   result. Only the elementwise formulas that hold an op past ``threshold`` bits are looked
   at, so the search stays small on large graphs (a model without unstable code costs one
   analysed run).
2. *Translate* each such formula (the elementwise ops feeding one value used elsewhere) to
   a sympy expression over its leaves (graph inputs, or results of reductions, matrix products
   and other ops that are not elementwise).
3. *Candidates*: rewrites of the subexpressions where the error was localised, and of the
   whole: flipping a difference into a quotient (``a - b = (a^2 - b^2) / (a + b)``, and with
   cubes), fraction arithmetic, sum-to-product, half-angle and addition formulas, log and exp
   identities, sympy's simplifier (:data:`REWRITES`); then the same once more on the best
   candidates; those and the formula on their inputs scaled by powers of two where they
   are homogeneous (:mod:`~compiler.herbie.scaling`: ``c*c`` overflows where
   ``(a*c + b*d) / (c*c + d*d)`` does not); and the series of the formula around 0 and
   infinity in each variable (:mod:`compiler.series`). Emission fuses ``exp(u) - 1`` into
   ``expm1(u)`` and ``log(1 + u)`` into ``log1p(u)``.
4. *Measure* every candidate in the working dtype on the sample points against the formula
   evaluated in mpmath at 150 digits (error in bits, as
   :func:`compiler.stability.error_bits`).
5. *Regimes* (:mod:`compiler.regimes`): per input range, the most accurate candidate;
   emitted as ``torch.where`` on that input. A formula is replaced only where this is more
   accurate on the samples, and guarded: where the program is not a finite number and
   the formula is, the formula's value is kept (:func:`~compiler.herbie.emit.emit_program`).

What changed is in ``gm.meta["accuracy_report"]`` (:class:`AccuracyReport`). The package
is the method, a module per phase: :mod:`~compiler.herbie.localise` (steps 1 and 2),
:mod:`~compiler.herbie.rewriting` (3, with :mod:`~compiler.herbie.domain`: a candidate
undefined where the formula is defined is dropped, and :mod:`~compiler.herbie.scaling`),
:mod:`~compiler.herbie.measure` (4), :mod:`compiler.regimes` and
:mod:`~compiler.herbie.probes` (5), and :mod:`~compiler.herbie.emit` (from sympy back to
torch); :func:`improve_accuracy` below is the outline.

>>> import torch
>>> from compiler.herbie import improve_accuracy
>>> naive = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
>>> x = 10 ** torch.linspace(0, 30, 200)
>>> better = improve_accuracy(naive, (x,))
>>> print(better.meta["accuracy_report"].improvements[0])  # doctest: +ELLIPSIS
sub: -sqrt(x) + sqrt(x + 1) -> 1/(sqrt(x) + sqrt(x + 1))  [20.0... -> 0.33 bits on 200 points]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from compiler.herbie.emit import emit_program, evaluate, program_text
from compiler.herbie.localise import (
    Formula,
    drop_unused,
    formulas,
    node_values,
    to_sympy,
)
from compiler.herbie.measure import (
    at_points,
    error_in_bits,
    exact_values,
    program_error,
    representable,
    scores,
)
from compiler.herbie.probes import (
    ROUNDS,
    loses_on_other_points,
    off_samples,
    refine_thresholds,
    refuting_probes,
    resample,
)
from compiler.herbie.rewriting import REWRITES, candidates, rule_candidates
from compiler.regimes import infer_regimes
from compiler.series import SeriesTimeout
from frontends.fx.error_analysis import local_error
from frontends.fx.exported import ExportedModule
from frontends.fx.source import FxSource

__all__ = ["HELD_OUT", "MIN_GAIN_BITS", "REWRITES", "AccuracyReport", "Improvement", "candidates",
           "improve_accuracy", "improve_validated", "less_accurate_than_source",
           "rule_candidates", "to_sympy"]

MIN_GAIN_BITS = 1.0
"""A formula is replaced only when the candidate is this many bits more accurate on average
over the samples. Smaller gains are within what the samples can tell apart: an expanded
cube won 0.05 bits on a softmax's samples at one size and lost 3 bits at another."""


@dataclass
class Improvement:
    """One formula replaced: where (the FX node of its value), the formula and its
    replacement (sympy syntax; a piecewise one names its branches), the mean error on the
    sample points before and after, in bits of the working dtype, ``how`` each branch
    was found (a rewrite strategy, the rule library, a series), and how many input ranges
    (``regimes``) the replacement has."""

    location: str
    before: str
    after: str
    bits_before: float
    bits_after: float
    points: int
    how: str = ""
    regimes: int = 1

    def __str__(self) -> str:
        return (f"{self.location}: {self.before} -> {self.after}  [{self.bits_before:.2f} -> "
                f"{self.bits_after:.2f} bits on {self.points} points]")


@dataclass
class AccuracyReport:
    """What :func:`improve_accuracy` did: the ``improvements``, the ops whose local error
    passed the threshold (``localised``: node, op, mean bits), the time it took, and why
    validation refused the rewritten program (``refused``, :func:`improve_validated`)."""

    improvements: list[Improvement] = field(default_factory=list)
    localised: list[tuple[str, str, float]] = field(default_factory=list)
    seconds: float = 0.0
    refused: str | None = None

    def __str__(self) -> str:
        lines = [str(i) for i in self.improvements] or ["no formula improved"]
        if self.refused:
            lines.append(f"not kept: {self.refused}")
        lines.append("error localised at: " + (", ".join(
            f"{name} ({op}, {bits:.1f} bits)" for name, op, bits in self.localised) or "none"))
        return "\n".join(lines)


def improve_accuracy(gm: fx.GraphModule, example_inputs, *, points: int = 256,
                     threshold: float = 0.5, time_limit_s: float = 60.0,
                     max_regimes: int = 4,
                     ranges: dict[str, tuple[float, float]] | None = None,
                     series: bool = True) -> fx.GraphModule:
    """A copy of ``gm`` with its inaccurate elementwise formulas replaced (see the module
    docstring); ``meta["accuracy_report"]`` says what changed. ``points``: sample points per
    formula (drawn from the elements of the example inputs); ``threshold``: the local error
    (mean bits) that makes an op worth rewriting; ``max_regimes``: the most input ranges a
    formula is split into (1: one candidate everywhere, no branch); ``ranges``: the
    declared range of inputs (by placeholder name), which the probes off the samples keep
    to; ``series``: whether series expansions are candidates (False: identities alone)."""
    start = time.perf_counter()
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    out = fx.GraphModule(gm, gm.graph.__deepcopy__())
    out.meta.update(gm.meta)
    report = AccuracyReport()
    out.meta["accuracy_report"] = report
    if not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs) or all(
            to_sympy(n) is None for n in out.graph.nodes):
        return out  # nothing to run: no floating input, or no formula sympy can express
    try:
        local = local_error(out, inputs)
    except Exception:  # noqa: BLE001 - a graph the analysis cannot run is left as it is
        return out
    report.localised = [(name, e.op, e.mean_bits) for name, e in local.items()
                        if e.mean_bits >= threshold]
    if not report.localised:
        report.seconds = time.perf_counter() - start
        return out
    units = formulas(out, set(local), {name for name, _, _ in report.localised})
    values = node_values(out, inputs, {leaf.name for u in units for leaf in u.leaves}
                     | {u.root.name for u in units})
    changed = False
    for unit in units:
        if time.perf_counter() - start > time_limit_s:
            break
        try:
            found = _improve(out, unit, values, points, max_regimes,
                             deadline=start + time_limit_s, ranges=ranges or {},
                             series=series)
        except (SeriesTimeout, ArithmeticError, ValueError, TypeError, RuntimeError):
            found = None
        if found is not None:
            report.improvements.append(found)
            changed = True
    if changed:
        drop_unused(out, [n for u in units for n in u.nodes])
        out.recompile()
    report.seconds = time.perf_counter() - start
    return out


def improve_validated(source: FxSource, gm: fx.GraphModule, example_inputs=None,
                      reference: str = "auto", time_limit_s: float = 60.0
                      ) -> tuple[fx.GraphModule, AccuracyReport]:
    """:func:`improve_accuracy` on ``gm`` (a program equal to ``source``'s, checked already),
    the rewritten program kept only if it still agrees with ``source``
    (:func:`compiler.validate.validate_module` with ``defined_only``: the search judged
    accuracy against 150 digits, validation judges finiteness, scale and overflow on inputs
    the search did not see). A program split into regimes that validation refuses is
    searched again without branches (regimes chosen on one input can be wrong on inputs
    the samples did not combine: Hamming's 3.4.2 splits on ``eps`` where accuracy
    depends on ``a * eps``), and where that is refused too, from identities alone
    (:data:`_SEARCHES`). Where the result is less accurate on the samples than the
    source itself (:func:`less_accurate_than_source`: an extraction by estimated error
    that reassociated ``(x / y) * z`` into ``(x * z) / y``, which overflows), the source
    is searched instead, as Herbie keeps the input program among its candidates, and
    where that search's result is less accurate than the source too, the source is
    kept. Returns the program to use and the search's report, whose ``refused`` says why
    a rewrite was not kept. ``example_inputs``: the samples of the search (default: the
    source's examples); ``time_limit_s``: the seconds all its searches share (each stops
    adding candidates at the deadline and goes on with those it has). Both entry points,
    extraction under ``Curvature`` and :class:`compiler.stability.StabilityRewriter`,
    use this.

    >>> import torch
    >>> from egraph import EGraph
    >>> naive = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
    >>> source = EGraph.from_fx(naive, (10 ** torch.linspace(0, 30, 200),)).fx
    >>> better, report = improve_validated(source, naive)
    >>> report.refused is None and len(report.improvements)
    1
    """
    samples = source.example_inputs if example_inputs is None else example_inputs
    deadline = time.perf_counter() + time_limit_s
    found, report = _searched(source, gm, samples, reference, deadline)
    worse = less_accurate_than_source(source, found, samples)
    if worse is None:
        return found, report
    original = fx.GraphModule(source.graph_module, source.graph_module.graph)
    found, report = _searched(source, original, samples, reference, deadline)
    report.refused = f"{worse}: the original was searched instead"
    if found is not original:
        again = less_accurate_than_source(source, found, samples)
        if again is not None:  # (the search judges each formula, this the program)
            report.refused += f", and its search's result was {again.removeprefix('less ')}"
            report.improvements = []
            return original, report
    return found, report


def _searched(source: FxSource, gm: fx.GraphModule, samples, reference: str,
              deadline: float) -> tuple[fx.GraphModule, AccuracyReport]:
    """:func:`improve_accuracy` on ``gm``, kept where validation agrees (see
    :func:`improve_validated`)."""
    from compiler.validate import validate_module

    refused, unbranched = None, None
    for max_regimes, series in _SEARCHES:
        if unbranched == series:
            continue  # (the last search made no branch: without them it finds the same)
        improved = improve_accuracy(gm, samples, max_regimes=max_regimes,
                                    ranges=source.ranges, series=series,
                                    time_limit_s=deadline - time.perf_counter())
        report = improved.meta["accuracy_report"]
        if not report.improvements:
            break
        check = validate_module(source, improved, reference=reference, defined_only=True)
        if check.ok:
            return improved, report
        refused = refused or check.reason
        unbranched = series if all(i.regimes == 1 for i in report.improvements) else None
    report.refused = refused
    return gm, report


HELD_OUT = 512
"""The least number of points off the samples on which a program is judged against its
source (:func:`less_accurate_than_source`), where the inputs are columns of one shape:
on 64, a branch that is a series in ``alpha`` around 0 (Octave's jcobi/3) looked 1.9 bits
better than the source; on 1,024 new points it is 1.4 bits worse."""


_SEARCHES = ((4, True), (1, True), (1, False))
"""The searches :func:`_searched` tries in turn until validation keeps one: regimes; one
formula everywhere; one formula from identities alone. A series fits where the samples
are (float32 draws over the bit patterns of ``(-1, 1)`` make almost every ``eps`` tiny:
Hamming's 3.4.2 is ``1/a + 1/b`` on them) and can be wrong everywhere else, which
validation's inputs show; then the identities' best (three ``expm1``: 22.9 -> 12.1 bits)
is what is left."""


def less_accurate_than_source(source: FxSource, gm: fx.GraphModule, samples) -> str | None:
    """Why ``gm`` is a worse program than ``source``'s for accuracy on the ``samples``,
    or on points off them (:func:`~compiler.herbie.probes.off_samples`, at least
    :data:`HELD_OUT` where the inputs are columns of one shape: an
    extraction under Curvature that expands basilisk's polynomial in ``(alt - 526.8) /
    292.86`` into cancelling monomials is no worse on its 64 samples and 0.9 bits worse on
    new points): more non-finite results where the truth is finite, or more mean bits of
    error (:func:`~compiler.herbie.measure.program_error`, both against the reals: float64
    cancels too, in ``sqrt(x + 1) - sqrt(x)`` past 1e16). None where it is not, or
    where the program is too large to run over the reals
    (:data:`compiler.validate.reference.EXACT_LIMIT`) or draws.

    >>> import torch
    >>> from egraph import EGraph
    >>> x = torch.tensor([1e308, 2.0, -3.0], dtype=torch.float64)
    >>> source = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: (x / 4) * 2), (x,)).fx
    >>> less_accurate_than_source(source, torch.fx.symbolic_trace(lambda x: x * 0.5), (x,))
    >>> less_accurate_than_source(source, torch.fx.symbolic_trace(lambda x: (x * 2) / 4), (x,))
    'less accurate than the original on the samples (0 -> 1 non-finite results)'
    """
    for where, before, after in _measured(source, gm, samples) or ():
        if after[1] > before[1]:
            return (f"less accurate than the original on {where} ({before[1]} -> "
                    f"{after[1]} non-finite results)")
        if after[0] > before[0] + MIN_GAIN_BITS / 2:
            return (f"less accurate than the original on {where} ({before[0]:.2f} -> "
                    f"{after[0]:.2f} mean bits of error)")
    return None


def _measured(source: FxSource, gm: fx.GraphModule, samples
              ) -> list[tuple[str, tuple[float, int], tuple[float, int]]] | None:
    """``(where, source's error, gm's error)`` against the reals
    (:func:`~compiler.herbie.measure.program_error`: mean bits, non-finite results) on
    the ``samples`` and on points off them
    (:func:`~compiler.herbie.probes.off_samples`); None where the program is too large
    to run over the reals (:data:`compiler.validate.reference.EXACT_LIMIT`), draws, or
    has no exact value."""
    from compiler.validate import program_numel
    from compiler.validate.reference import EXACT_LIMIT, exact_reference
    from compiler.validate.runs import flat_outputs

    graph, samples = source.graph_module, tuple(samples)
    if source.random or isinstance(source.module, ExportedModule) or (
            program_numel(graph, samples) > EXACT_LIMIT):
        return None  # (an exported graph takes its parameters as inputs too)
    gen = torch.Generator().manual_seed(2)
    shapes = {s.shape for s in samples if isinstance(s, torch.Tensor) and s.numel()}
    times = 1  # (columns of one shape are drawn longer; other inputs, as many again)
    if len(shapes) == 1 and len(shape := next(iter(shapes))):
        times = max(1, -(-HELD_OUT // math.prod(shape)))
    held_out = tuple(
        off_samples(s, times * s.numel(), gen).reshape(
            (times * s.shape[0], *s.shape[1:]) if s.dim() else ())
        if isinstance(s, torch.Tensor) and s.numel() else s for s in samples)
    out = []
    for points, where in ((samples, "the samples"), (held_out, "points off the samples")):
        with torch.no_grad():
            truth = exact_reference(graph)(points)
            if truth is None:
                return None
            out.append((where, program_error(flat_outputs(graph(*points)), truth),
                        program_error(flat_outputs(gm(*points)), truth)))
    return out


def _improve(gm: fx.GraphModule, unit: Formula, values: dict, points: int, max_regimes: int,
             deadline: float, ranges: dict, series: bool = True) -> Improvement | None:
    """Replace one formula when a candidate program is more accurate on its samples."""
    root_value = values.get(unit.root.name)
    if not isinstance(root_value, torch.Tensor) or not root_value.is_floating_point():
        return None
    dtype = root_value.dtype
    leaves = [values[n.name] for n in unit.leaves]
    leaves = [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=dtype)
              for v in leaves]
    *flat, source = [v.to(dtype).reshape(-1)
                     for v in torch.broadcast_tensors(*leaves, root_value)]
    if not flat or not source.numel():
        return None
    gen = torch.Generator().manual_seed(0)
    pick = torch.randperm(source.numel(), generator=gen)[:points]
    samples = [v[pick] for v in flat]
    # where the candidates must be defined wherever the formula is: every sampled point,
    # those with no finite exact value too (a negative x in x**(1/n) at a tiny n)
    domain = dict(zip(unit.symbols, samples))
    exact = exact_values(unit.expr, unit.symbols, samples)
    keep = representable(exact, dtype)
    if int(keep.sum()) < 8:
        return None
    samples = [s[keep] for s in samples]
    exact = exact[keep]
    source = source[pick][keep]
    env = dict(zip(unit.symbols, samples))
    before = float(error_in_bits(source, exact, dtype).mean())
    if before < 0.25:
        return None
    found = candidates(unit.expr, unit.symbols, unit.hot, env, exact, dtype, deadline,
                       domain=domain, series=series)
    found += rule_candidates(gm, unit, samples, deadline, domain=domain)
    # Candidate 0 is the formula itself as emitted here (with expm1 and log1p fused).
    exprs, labels = [], []
    for label, e in [("the formula", unit.expr), *found]:
        try:
            evaluate(e, env)
        except (TypeError, ValueError, RuntimeError, ArithmeticError):
            continue
        exprs.append(e)
        labels.append(label)
    # regimes the probes still refute after ROUNDS give way to one formula everywhere (3.4.2's
    # regimes on eps alone are wrong wherever a * eps is not small; its expm1 form is not)
    caps = [max_regimes] * ROUNDS + ([1] * ROUNDS if max_regimes > 1 else [])
    step = 0
    while step < len(caps):
        cap = caps[step]
        step += 1
        rows = scores(exprs, env, exact, dtype)
        regimes = infer_regimes(rows, [s.double().numpy() for s in samples], cap)
        if regimes.mean_error > before - MIN_GAIN_BITS:
            return None
        refine_thresholds(unit, regimes, exprs, samples, dtype)
        key = unit.symbols[regimes.variable]
        leaf = unit.leaves[regimes.variable]
        bounds = ranges.get(leaf.name) if leaf.op == "placeholder" else None
        refuted = refuting_probes(unit, regimes, exprs, samples, dtype, bounds)
        if refuted is None:
            if not loses_on_other_points(unit, regimes, exprs, samples, dtype):
                break
            if cap == 1:
                return None
            step = caps.index(1)  # regimes that hold only on the samples
            continue
        # Herbie samples more where the program is in doubt: points around each probe
        # that refuted it join the samples, and the regimes are inferred again
        more, more_exact = resample(unit, samples, regimes.variable, refuted, dtype)
        if more_exact is None:
            return None
        samples = [torch.cat([s, m]) for s, m in zip(samples, more)]
        exact = torch.cat([exact, more_exact])
        env = dict(zip(unit.symbols, samples))
        source = torch.cat([source, at_points(evaluate(unit.expr, dict(zip(
            unit.symbols, more))), more_exact).to(dtype)])
        before = float(error_in_bits(source, exact, dtype).mean())
    else:
        return None
    emit_program(gm, unit, regimes, exprs,
          {s for s, n in zip(unit.symbols, unit.leaves)
           if not isinstance(values[n.name], torch.Tensor)})
    how = "; ".join(dict.fromkeys(labels[c] for c in regimes.candidates))
    return Improvement(unit.root.name, str(unit.expr), program_text(regimes, exprs, key), before,
                       regimes.mean_error, len(exact), how, len(regimes.candidates))
