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
   candidates; and the series of the formula around 0 and infinity in each variable
   (:mod:`compiler.series`). Emission fuses ``exp(u) - 1`` into ``expm1(u)`` and
   ``log(1 + u)`` into ``log1p(u)``.
4. *Measure* every candidate in the working dtype on the sample points against the formula
   evaluated in mpmath at 150 digits (error in bits, as
   :func:`compiler.stability.error_bits`).
5. *Regimes* (:mod:`compiler.regimes`): per input range, the most accurate candidate;
   emitted as ``torch.where`` on that input. A formula is replaced only where this is more
   accurate on the samples and makes no finite result non-finite.

What changed is in ``gm.meta["accuracy_report"]`` (:class:`AccuracyReport`).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import mpmath as mp
import numpy as np
import sympy as sp
import torch
import torch.fx as fx
from sympy.simplify.fu import TR2, TR9, TR2i

from compiler.ordinals import from_ordinals, midpoint, ordinals, uniform
from compiler.regimes import Regimes, between, infer_regimes, select
from compiler.series import SeriesTimeout, series_candidates, time_limit
from egraph.ops.table import TABLE, sympy_form
from frontends.fx.error_analysis import local_error
from frontends.fx.source import FxSource
from frontends.fx.vocabulary import lower

__all__ = ["MIN_GAIN_BITS", "REWRITES", "AccuracyReport", "Improvement", "candidates",
           "improve_accuracy", "improve_validated", "rule_candidates", "to_sympy"]

# The elementwise ops of the vocabulary as sympy builders: the op table's ``sympy`` facts.
_VOCABULARY: dict[str, Callable] = {
    name: sympy_form(name) for name, entry in TABLE.items()
    if entry.kind == "pointwise" and entry.sympy is not None}
# Elementwise torch functions the vocabulary does not model (opaque to the e-graph), by name.
_OUTSIDE: dict[str, Callable] = {
    "asin": sp.asin, "acos": sp.acos, "asinh": sp.asinh, "acosh": sp.acosh, "atanh": sp.atanh,
}
# sympy functions back to torch.
_TORCH = {sp.exp: torch.exp, sp.log: torch.log, sp.sin: torch.sin, sp.cos: torch.cos,
          sp.tan: torch.tan, sp.atan: torch.atan, sp.sinh: torch.sinh, sp.cosh: torch.cosh,
          sp.tanh: torch.tanh, sp.asin: torch.asin, sp.acos: torch.acos,
          sp.asinh: torch.asinh, sp.acosh: torch.acosh, sp.atanh: torch.atanh,
          sp.Abs: torch.abs, sp.sign: torch.sign}

_DIGITS = 150  # of the mpmath reference (see benchmarks/stability/hamming.py)
_MAX_OPS = 40  # ops of one formula; larger formulas are cut into pieces at their leaves
WRONG_PROBES = 0.1
"""The share of the points probed between samples where a program may lose more than
half the dtype's bits against the formula (see ``_refuting_probes``)."""
NEAR = 512
"""Points added around a refuting probe lie within this fraction of the dtype's values
between its neighbouring samples (see ``_resample``)."""
ROUNDS = 3
"""Regime inferences per formula: after each whose program a probe refutes, points around
the refuting probes join the samples (see ``_resample``)."""
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
                     max_regimes: int = 4) -> fx.GraphModule:
    """A copy of ``gm`` with its inaccurate elementwise formulas replaced (see the module
    docstring); ``meta["accuracy_report"]`` says what changed. ``points``: sample points per
    formula (drawn from the elements of the example inputs); ``threshold``: the local error
    (mean bits) that makes an op worth rewriting; ``max_regimes``: the most input ranges a
    formula is split into (1: one candidate everywhere, no branch)."""
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
    units = _units(out, set(local), {name for name, _, _ in report.localised})
    values = _values(out, inputs, {leaf.name for u in units for leaf in u.leaves}
                     | {u.root.name for u in units})
    changed = False
    for unit in units:
        if time.perf_counter() - start > time_limit_s:
            break
        try:
            found = _improve(out, unit, values, points, max_regimes,
                             deadline=start + time_limit_s)
        except (SeriesTimeout, ArithmeticError, ValueError, TypeError, RuntimeError):
            found = None
        if found is not None:
            report.improvements.append(found)
            changed = True
    if changed:
        _drop_unused(out, [n for u in units for n in u.nodes])
        out.recompile()
    report.seconds = time.perf_counter() - start
    return out


def improve_validated(source: FxSource, gm: fx.GraphModule, example_inputs=None,
                      reference: str = "auto") -> tuple[fx.GraphModule, AccuracyReport]:
    """:func:`improve_accuracy` on ``gm`` (a program equal to ``source``'s, checked already),
    the rewritten program kept only if it still agrees with ``source``
    (:func:`compiler.validate.validate_module` with ``defined_only``: the search judged
    accuracy against 150 digits, validation judges finiteness, scale and overflow on inputs
    the search did not see). A program split into regimes that validation refuses is
    searched again without branches (regimes chosen on one input can be wrong on inputs
    the samples did not combine: Hamming's 3.4.2 splits on ``eps`` where accuracy
    depends on ``a * eps``). Returns the program to use and the search's report, whose
    ``refused`` says why a rewrite was not kept. ``example_inputs``: the samples of the
    search (default: the source's examples). Both entry points, extraction under
    ``Curvature`` and :class:`compiler.stability.StabilityRewriter`, use this.

    >>> import torch
    >>> from egraph import EGraph
    >>> naive = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
    >>> source = EGraph.from_fx(naive, (10 ** torch.linspace(0, 30, 200),)).fx
    >>> better, report = improve_validated(source, naive)
    >>> report.refused is None and len(report.improvements)
    1
    """
    from compiler.validate import validate_module

    samples = source.example_inputs if example_inputs is None else example_inputs
    refused = None
    for max_regimes in (4, 1):
        improved = improve_accuracy(gm, samples, max_regimes=max_regimes)
        report = improved.meta["accuracy_report"]
        if not report.improvements:
            break
        check = validate_module(source, improved, reference=reference, defined_only=True)
        if check.ok:
            return improved, report
        refused = refused or check.reason
        if all(i.regimes == 1 for i in report.improvements):
            break  # no branch to give up
    report.refused = refused
    return gm, report


@dataclass
class _Unit:
    """One elementwise formula: its value's node, its sympy expression over the leaves'
    symbols, and the expressions of the localised ops inside it."""

    root: fx.Node
    expr: sp.Expr
    leaves: list[fx.Node]
    symbols: list[sp.Symbol]
    hot: list[sp.Expr]
    nodes: list[fx.Node]
    node_exprs: dict[fx.Node, sp.Expr]


def to_sympy(node: fx.Node):
    """``(builder, arguments)`` for an elementwise call sympy can express, else None.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.tan(x) + 1)
    >>> [to_sympy(n)[0](sp.Symbol("x"), *to_sympy(n)[1][1:]) for n in gm.graph.nodes
    ...  if n.op == "call_function"]
    [tan(x), x + 1]
    """
    if node.op not in ("call_function", "call_method"):
        return None
    method = node.op == "call_method"
    lowered = lower(node.target, node.args, node.kwargs, method=method)
    if lowered is not None:
        op, args = lowered[0], list(lowered[1])
        builder = _VOCABULARY.get(op)
        return None if builder is None or len(args) != len(TABLE[op].params) else (
            builder, args)
    name = node.target if method else getattr(node.target, "__name__", "")
    if name in _OUTSIDE and (method or getattr(torch, name, None) is node.target) and len(
            node.args) == 1 and not node.kwargs:
        return _OUTSIDE[name], list(node.args)
    return None


def _number(value) -> sp.Expr | None:
    """A Python number as an exact sympy number: the simple fraction a literal such as
    ``1 / 3`` was written as, else the float's exact binary value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return sp.Integer(value)
    if not math.isfinite(value):
        return None
    simple = Fraction(value).limit_denominator(1000)
    if float(simple) == value:
        return sp.Rational(simple.numerator, simple.denominator)
    return sp.Rational(Fraction(value).numerator, Fraction(value).denominator)


def _units(gm: fx.GraphModule, floating: set[str], hot: set[str]) -> list[_Unit]:
    """The elementwise formulas of ``gm`` that hold a localised op."""
    scalar = {n: t for n in gm.graph.nodes if n.name in floating
              for t in [to_sympy(n)] if t is not None}
    units = []
    for root in scalar:
        if all(u in scalar for u in root.users):
            continue  # not a value used outside the formula: part of a larger one
        symbols: dict[fx.Node, sp.Symbol] = {}
        exprs: dict[fx.Node, sp.Expr] = {}
        budget = [_MAX_OPS]

        def expr_of(n, symbols=symbols, exprs=exprs, budget=budget):
            if n in exprs:
                return exprs[n]
            if n in scalar and budget[0] > 0:
                budget[0] -= 1
                builder, args = scalar[n]
                parts = []
                for a in args:
                    if isinstance(a, fx.Node):
                        parts.append(expr_of(a))
                    else:
                        number = _number(a)
                        if number is None:
                            raise ValueError(f"argument {a!r} of {n.name}")
                        parts.append(number)
                exprs[n] = builder(*parts)
                return exprs[n]
            number = _number(_python_value(n))
            if number is not None:  # computed from literals alone (-2 as neg(2))
                exprs[n] = number
                return number
            if n not in symbols:
                symbols[n] = sp.Symbol(n.name, real=True)
            return symbols[n]

        try:
            expr = expr_of(root)
        except (ValueError, TypeError):
            continue
        inside = [n for n in exprs if n.name in hot]
        if not inside or not expr.free_symbols or expr.has(sp.zoo, sp.nan, sp.I):
            continue
        leaves = list(symbols)
        units.append(_Unit(root, expr, leaves, [symbols[n] for n in leaves],
                           [exprs[n] for n in inside], list(exprs), exprs))
    return units


def _python_value(n: fx.Node | object, depth: int = 8):
    """The Python number a node computes from literals alone (``operator.neg(2)``), else
    None; a value that depends on an input (a size) is not a constant of the formula."""
    if not isinstance(n, fx.Node):
        return n if isinstance(n, (int, float)) and not isinstance(n, bool) else None
    if n.op != "call_function" or n.kwargs or depth <= 0 or n.target.__module__ not in (
            "_operator", "operator", "math"):
        return None
    args = [_python_value(a, depth - 1) for a in n.args]
    if any(a is None for a in args):
        return None
    try:
        value = n.target(*args)
    except (ArithmeticError, ValueError, TypeError):
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _drop_unused(gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
    """Erase the formulas' nodes that nothing uses any more (and only those: other calls
    without users, such as checks, stay)."""
    formula = {n for n in nodes if n.graph is gm.graph}
    for n in reversed(list(gm.graph.nodes)):
        if n in formula and not n.users:
            gm.graph.erase_node(n)


def _values(gm: fx.GraphModule, inputs: tuple, names: set[str]) -> dict[str, object]:
    """The values of the named nodes when ``gm`` runs on ``inputs`` (in their dtype)."""
    kept: dict[str, object] = {}

    class Keep(fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if n.name in names:
                kept[n.name] = value
            return value

    with torch.no_grad():
        Keep(gm).run(*inputs)
    return kept


def _improve(gm: fx.GraphModule, unit: _Unit, values: dict, points: int, max_regimes: int,
             deadline: float) -> Improvement | None:
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
    exact = _exact(unit.expr, unit.symbols, samples)
    keep = _representable(exact, dtype)
    if int(keep.sum()) < 8:
        return None
    samples = [s[keep] for s in samples]
    exact = exact[keep]
    source = source[pick][keep]
    env = dict(zip(unit.symbols, samples))
    before = float(_bits(source, exact, dtype).mean())
    if before < 0.25:
        return None
    found = candidates(unit.expr, unit.symbols, unit.hot, env, exact, dtype, deadline)
    found += rule_candidates(gm, unit, samples, deadline)
    # Candidate 0 is the formula itself as emitted here (with expm1 and log1p fused).
    exprs, labels = [], []
    for label, e in [("the formula", unit.expr), *found]:
        try:
            _evaluate(e, env)
        except (TypeError, ValueError, RuntimeError, ArithmeticError):
            continue
        exprs.append(e)
        labels.append(label)
    for _ in range(ROUNDS):
        rows = _scores(exprs, env, exact, dtype)
        regimes = infer_regimes(rows, [s.double().numpy() for s in samples], max_regimes)
        if regimes.mean_error > before - MIN_GAIN_BITS:
            return None
        _refine_thresholds(unit, regimes, exprs, samples, dtype)
        key = unit.symbols[regimes.variable]
        got = _run_program(regimes, exprs, key, env)
        if int((~torch.isfinite(got)).sum()) > int((~torch.isfinite(source)).sum()):
            return None
        refuted = _refuting_probes(unit, regimes, exprs, samples, dtype)
        if refuted is None:
            break
        # Herbie samples more where the program is in doubt: points around each probe
        # that refuted it join the samples, and the regimes are inferred again
        more, more_exact = _resample(unit, samples, regimes.variable, refuted, dtype)
        if more_exact is None:
            return None
        samples = [torch.cat([s, m]) for s, m in zip(samples, more)]
        exact = torch.cat([exact, more_exact])
        env = dict(zip(unit.symbols, samples))
        source = torch.cat([source, _at_points(_evaluate(unit.expr, dict(zip(
            unit.symbols, more))), more_exact).to(dtype)])
        before = float(_bits(source, exact, dtype).mean())
    else:
        return None
    _emit(gm, unit, regimes, exprs,
          {s for s, n in zip(unit.symbols, unit.leaves)
           if not isinstance(values[n.name], torch.Tensor)})
    how = "; ".join(dict.fromkeys(labels[c] for c in regimes.candidates))
    return Improvement(unit.root.name, str(unit.expr), _program(regimes, exprs, key), before,
                       regimes.mean_error, len(exact), how, len(regimes.candidates))


def _scores(exprs: list[sp.Expr], env: dict, exact: torch.Tensor,
            dtype: torch.dtype) -> np.ndarray:
    """(candidates, points) bits of error; a candidate that cannot be evaluated at these
    points costs every bit."""
    rows = []
    for e in exprs:
        try:
            rows.append(_bits(_evaluate(e, env), exact, dtype).numpy())
        except (TypeError, ValueError, RuntimeError, ArithmeticError):
            rows.append(np.full(len(exact), float(_mantissa(dtype))))
    return np.stack(rows)


def _resample(unit: _Unit, samples: list[torch.Tensor], variable: int,
              around: torch.Tensor, dtype: torch.dtype, count: int = 16
              ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """``count`` new points near each value of input ``variable`` in ``around``: within
    1/``NEAR`` of the values of the dtype between the samples on either side of it (so
    that they fall where the probe failed: below 2.9e-39, say, where ``1/n`` overflows,
    not anywhere between the smallest subnormal and the first sample), the other inputs
    taken from random samples; with their exact values. None where none is defined."""
    key = samples[variable].double()
    kind = samples[variable].dtype
    gen = torch.Generator().manual_seed(len(key))
    columns, picks = [], []
    for value in around.double().tolist():
        below, above = key[key < value], key[key > value]
        ends = torch.tensor([float(below.max()) if len(below) else value, value,
                             float(above.min()) if len(above) else value], dtype=kind)
        lo, at, hi = (int(o) for o in ordinals(ends))
        width = max(1, (hi - lo) // NEAR)
        near = from_ordinals(torch.tensor([max(lo, at - width), min(hi, at + width)]), kind)
        columns.append(uniform(float(near[0]), float(near[1]), (count,), kind, gen))
        picks.append(torch.randint(0, len(key), (count,), generator=gen))
    env, exact = _probe(unit, samples, variable, torch.cat(columns), torch.cat(picks))
    defined = _representable(exact, dtype)
    if not bool(defined.any()):
        return [], None
    return [env[s][defined] for s in unit.symbols], exact[defined]


def _refine_thresholds(unit: _Unit, regimes: Regimes, exprs: list[sp.Expr],
                       samples: list[torch.Tensor], dtype: torch.dtype,
                       steps: int = 40, width: int = 8) -> None:
    """Move each threshold, by bisection between the two samples it falls between, to
    where the candidate on its right becomes the more accurate (Herbie's boundary
    refinement): sparse samples can leave a threshold far from the crossing, with a
    series used where it is already poor. The bisection halves the count of ``dtype``
    values between the ends (:func:`compiler.ordinals.midpoint`), so it crosses every binade
    between 0 and a sample. The other inputs are taken from the ``width`` samples
    nearest the threshold."""
    key = samples[regimes.variable].double()
    for i, t in enumerate(regimes.thresholds):
        below, above = key[key < t], key[key >= t]
        if not len(below) or not len(above):
            continue
        lo, hi = float(below.max()), float(above.min())
        # the other inputs of the samples nearest the threshold, and of samples spread
        # over the whole set: a leading-order series (-c/b) can hold for the first and
        # not yet where another input is larger (4ac against b^2)
        near = torch.cat([torch.argsort((key - t).abs())[:width],
                          torch.linspace(0, len(key) - 1, width).long()])
        left, right = exprs[regimes.candidates[i]], exprs[regimes.candidates[i + 1]]
        for _ in range(steps):
            mid = midpoint(lo, hi, samples[regimes.variable].dtype)
            if not lo < mid < hi:
                break  # the dtype has no value between lo and hi
            column = torch.full((len(near),), mid, dtype=samples[regimes.variable].dtype)
            env, exact = _probe(unit, samples, regimes.variable, column, near)
            try:
                err_left = float(_bits(_evaluate(left, env), exact, dtype).mean())
                err_right = float(_bits(_evaluate(right, env), exact, dtype).mean())
            except (TypeError, ValueError, RuntimeError, ArithmeticError):
                break
            if err_left <= err_right:
                lo = mid
            else:
                hi = mid
        regimes.thresholds[i] = between(lo, hi)


def _refuting_probes(unit: _Unit, regimes: Regimes, exprs: list[sp.Expr],
                     samples: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
    """Where the piecewise program fails between or beyond the samples (the values of the
    branching input there), or None where it holds. Probed: its extremes and the dtype's
    (the smallest subnormal, the largest value, of each sign the samples have), both sides
    of each threshold (a branch that overflows past 44.36 when chosen up to 44.40: no
    sample lay between; a series ``1`` of ``sigmoid(2x)`` chosen from 0 when no sample lay
    below 12), and the same values with the other sign (a series at +inf, ``1/x`` for
    ``rsqrt(x^2 + c)``, is wrong for negative x, which samples of one sign never show);
    the other inputs are taken from the samples. The program fails where it is not finite
    though the exact value and the formula are, or when it loses more than half the
    dtype's bits against the formula at more than :data:`WRONG_PROBES` of the points: a
    branch may be a little less accurate than the formula near a threshold (both are,
    there), and a leading-order series wrong where another input is as large as its own
    (``-c/b`` where ``4ac`` is near ``b^2``: a split on one input cannot avoid that), not
    wrong across a range."""
    key = samples[regimes.variable]
    lo, hi = float(key.min()), float(key.max())
    probes = [lo, hi]
    for t in regimes.thresholds:
        for step in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
            probes += [t - abs(t) * step, t + abs(t) * step] if t else [-step, step]
    probes = [p for p in probes if lo <= p <= hi] or [lo, hi]
    probes += [-p for p in probes if p]
    column = torch.cat([torch.tensor(probes, dtype=key.dtype),
                        *[sign * _extremes(key.dtype) for sign in (1, -1)
                          if bool((key * sign > 0).any())]])
    env, exact = _probe(unit, samples, regimes.variable, column,
                        torch.arange(len(column)) % key.numel())
    got = _at_points(_run_program(regimes, exprs, unit.symbols[regimes.variable], env), exact)
    defined = _representable(exact, dtype)
    try:
        formula = _at_points(_evaluate(unit.expr, env), exact)
    except (TypeError, ValueError, RuntimeError, ArithmeticError):
        formula = None  # the formula cannot be evaluated here: finiteness is the check
    else:
        defined &= torch.isfinite(formula)  # where it overflows, the program may too
    broken = defined & ~torch.isfinite(got)
    if formula is not None and not bool(broken.any()) and bool(defined.any()):
        lost = _bits(got, exact, dtype) - _bits(formula, exact, dtype)
        wrong = defined & (lost > _mantissa(dtype) / 2)
        if float(wrong.sum()) <= WRONG_PROBES * float(defined.sum()):
            return None
        broken = wrong
    return column[broken] if bool(broken.any()) else None


def _extremes(dtype: torch.dtype, count: int = 8) -> torch.Tensor:
    """Positive values of ``dtype`` at its two ends: the smallest and the largest, and
    ``count - 1`` more at random within each of the quarter binades next to them (the
    subnormals up, the largest values down): ``2*x`` of a rewrite overflows from 1.7e38 in
    float32 into ``inf - inf`` where ``sin(x/2)`` beside it is not 0, which the round
    values of an evenly spaced probe can all miss."""
    step = 1 << (_mantissa(dtype) - 3)
    top = int(ordinals(torch.tensor([torch.finfo(dtype).max], dtype=dtype)))
    offsets = torch.randint(0, step, (2, count - 1), generator=torch.Generator().manual_seed(0))
    offsets += torch.arange(count - 1) * step
    counts = torch.cat([torch.tensor([1]), 1 + offsets[0], torch.tensor([top]),
                        top - offsets[1]])
    return from_ordinals(counts, dtype)


def _at_points(value, exact: torch.Tensor) -> torch.Tensor:
    """A program's value (a tensor, or a number where it is constant) at each point of
    ``exact``, in float64."""
    if torch.is_tensor(value):
        return value.double().expand(exact.shape)
    return torch.full_like(exact, float(value))


def _probe(unit: _Unit, samples: list[torch.Tensor], variable: int, column: torch.Tensor,
           pick: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """``(env, exact)`` at points off the samples: input ``variable`` takes the values
    ``column``, the others their samples at ``pick``."""
    points = [column if i == variable else s[pick] for i, s in enumerate(samples)]
    return dict(zip(unit.symbols, points)), _exact(unit.expr, unit.symbols, points)


def _exact(expr: sp.Expr, symbols: list[sp.Symbol], samples: list[torch.Tensor]
           ) -> torch.Tensor:
    """``expr`` at each sample point in mpmath (``_DIGITS`` digits), as float64."""
    f = sp.lambdify(symbols, expr, modules="mpmath")
    cols = [s.double().tolist() for s in samples]
    out = []
    with mp.workdps(_DIGITS):
        for point in zip(*cols):
            try:
                v = f(*[mp.mpf(p) for p in point])
                out.append(float(v) if mp.im(v) == 0 else math.nan)
            except (ZeroDivisionError, ValueError, TypeError, OverflowError):
                out.append(math.nan)
    return torch.tensor(out, dtype=torch.float64)


def _representable(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where an exact value is a finite number of ``dtype``: the points a program is
    judged on."""
    return torch.isfinite(exact) & (exact.abs() <= float(torch.finfo(dtype).max))


def _mantissa(dtype: torch.dtype) -> int:
    """Significand bits of ``dtype`` (24 for float32): the most a result can be off by."""
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def _bits(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per point error in bits of ``dtype`` (a non-finite result costs every bit)."""
    mantissa = _mantissa(dtype)
    got = got.double().reshape(exact.shape) if got.numel() == exact.numel() else (
        got.double().expand(exact.shape))
    ulp = exact.abs().clamp(min=torch.finfo(dtype).tiny) * 2.0 ** (1 - mantissa)
    err = torch.log2(1 + (got - exact).abs() / ulp).clamp(max=float(mantissa))
    return torch.where(torch.isfinite(got), err, float(mantissa)).nan_to_num(
        nan=float(mantissa))


# ---------------------------------------------------------------- candidates: the rewrites


def _flip(e: sp.Expr) -> list[sp.Expr]:
    """``a - b = (a^2 - b^2) / (a + b) = (a^3 - b^3) / (a^2 + ab + b^2)``."""
    if not isinstance(e, sp.Add):
        return []
    neg = [t for t in e.args if t.could_extract_minus_sign()]
    pos = [t for t in e.args if not t.could_extract_minus_sign()]
    if not pos or not neg:
        return []
    a, b = sp.Add(*pos), -sp.Add(*neg)
    out = []
    for num, den in ((a ** 2 - b ** 2, a + b), (a ** 3 - b ** 3, a ** 2 + a * b + b ** 2)):
        out += [num / den, sp.expand(num) / den]
    return out


def _fractions(e: sp.Expr) -> list[sp.Expr]:
    """One fraction with its numerator expanded (the cancellation done exactly), and
    sympy's cancel and factor."""
    n, d = sp.fraction(sp.together(e))
    return [sp.expand(n) / d, sp.factor(sp.expand(n)) / d, sp.cancel(e)]


def _half_angle(e: sp.Expr) -> list[sp.Expr]:
    """``cos u = 1 - 2 sin^2(u/2)``, ``sin u = 2 sin(u/2) cos(u/2)``, then fractions."""
    if not e.has(sp.cos, sp.sin):
        return []
    halved = e.replace(sp.cos, lambda u: 1 - 2 * sp.sin(u / 2) ** 2)
    both = halved.replace(sp.sin, lambda u: 2 * sp.sin(u / 2) * sp.cos(u / 2)) if e.has(
        sp.sin) else halved
    return [halved, sp.cancel(sp.together(halved)), sp.cancel(sp.together(both))]


def _trig(e: sp.Expr) -> list[sp.Expr]:
    """Sum to product, tangent as sine over cosine and back, the addition formulas."""
    if not e.has(sp.sin, sp.cos, sp.tan):
        return []
    expanded = sp.expand_trig(e)
    return [TR9(e), TR2(e), TR2i(e), expanded, sp.together(expanded),
            TR9(sp.together(TR2(e)))]


def _logs(e: sp.Expr) -> list[sp.Expr]:
    """``log a - log b = log(a/b)``, ``log(a/b) = log a - log b``, and ``log u`` as
    ``log1p(u - 1)`` with ``u - 1`` in one fraction."""
    if not e.has(sp.log):
        return []
    combined = sp.logcombine(e, force=True)
    out = [combined, sp.expand_log(e, force=True)]
    for f in (e, combined):
        out.append(f.replace(sp.log, lambda u: sp.log(1 + sp.cancel(sp.together(u - 1)))))
    return out


def _exps(e: sp.Expr) -> list[sp.Expr]:
    """``exp(k u) = exp(u)^k`` then cancel; numerator and denominator divided by
    ``exp(u)``."""
    if not e.has(sp.exp):
        return []
    t = sp.Dummy("t")
    out = []
    for u in sorted({a.args[0] for a in e.atoms(sp.exp)}, key=sp.default_sort_key):
        k, rest = u.as_coeff_Mul()
        if k.is_Integer and abs(k) > 1:
            powers = e.replace(
                lambda a, rest=rest: a.func == sp.exp and (a.args[0] / rest).is_Integer,
                lambda a, rest=rest: t ** (a.args[0] / rest))
            out.append(sp.cancel(powers).subs(t, sp.exp(rest)))
        n, d = sp.fraction(sp.together(e))
        if d != 1:
            out.append(sp.expand(n * sp.exp(-u)) / sp.expand(d * sp.exp(-u)))
    return out


def _simplify(e: sp.Expr) -> list[sp.Expr]:
    return [sp.simplify(e)]


REWRITES: dict[str, Callable[[sp.Expr], list[sp.Expr]]] = {
    "flip": _flip, "fractions": _fractions, "half-angle": _half_angle, "trig": _trig,
    "logs": _logs, "exps": _exps, "simplify": _simplify,
}
"""The rewrite strategies applied where the error is: each maps a sympy expression to
equal expressions (identities wherever both sides are defined)."""


def candidates(expr: sp.Expr, symbols: list[sp.Symbol], hot: list[sp.Expr], env: dict,
               exact: torch.Tensor, dtype: torch.dtype, deadline: float,
               rounds: int = 2, keep: int = 3) -> list[tuple[str, sp.Expr]]:
    """``(label, expression)`` candidates for ``expr``: every :data:`REWRITES` strategy at
    each localised subexpression ``hot`` and at the whole (then again, on the sums inside the
    ``keep`` most accurate candidates so far, ``rounds`` times in all), and the series
    expansions.

    >>> import torch
    >>> x = sp.Symbol("x", real=True)
    >>> e = 1 / (x + 1) - 1 / x
    >>> xs = 10 ** torch.linspace(1, 30, 50)
    >>> env, exact = {x: xs}, -1 / (xs.double() * (xs.double() + 1))
    >>> found = candidates(e, [x], [e], env, exact, torch.float32, time.perf_counter() + 30)
    >>> any(str(c) == "-1/(x*(x + 1))" for _, c in found)
    True
    """
    seen = {expr}
    found: list[tuple[str, sp.Expr]] = []

    def add(label: str, c: sp.Expr) -> None:
        if c in seen or not isinstance(c, sp.Expr) or _undefined(c):
            return
        seen.add(c)
        found.append((label, c))

    sites = [(expr, hot)]
    for _ in range(rounds):
        for base, places in sites:
            for place in dict.fromkeys([*places, base]):
                for name, rewrite in REWRITES.items():
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return found
                    try:
                        with time_limit(min(left, 2.0)):
                            results = rewrite(place)
                    except (SeriesTimeout, Exception):  # noqa: BLE001 - sympy gave up
                        continue
                    for r in results:
                        add(name, base.xreplace({place: r}) if place != base else r)
        scored = []
        for label, c in found:
            try:
                scored.append((float(_bits(_evaluate(c, env), exact, dtype).mean()), label, c))
            except (TypeError, ValueError, RuntimeError, ArithmeticError):
                continue
        scored.sort(key=lambda s: s[0])
        sites = [(c, [a for a in sp.preorder_traversal(c) if isinstance(a, sp.Add)])
                 for _, _, c in scored[:keep]]
    left = deadline - time.perf_counter()
    for label, c in series_candidates(expr, symbols, seconds=min(max(left, 0.0), 6.0)):
        add(label, c)
    return found


def _undefined(e: sp.Expr) -> bool:
    """Whether ``e`` holds an infinity, a complex unit or a NaN other than the NaN branch
    of a one-sided series (``Piecewise((1/x, x > 0), (nan, True))``, see
    :func:`compiler.series.series_candidates`), which stands for "not here"."""
    if isinstance(e, sp.Piecewise):
        return any(value is not sp.nan and _undefined(value) for value, _ in e.args)
    if e in (sp.zoo, sp.nan, sp.I, sp.oo, -sp.oo):
        return True
    return any(_undefined(a) for a in e.args)


def rule_candidates(gm: fx.GraphModule, unit: _Unit, samples: list[torch.Tensor],
                    deadline: float, families: tuple[str, ...] = ("herbie", "stability"),
                    iter_limit: int = 2, node_limit: int = 2_000) -> list[tuple[str, sp.Expr]]:
    """Candidates from the rule library, localised: the formula alone (its leaves as
    inputs, the sample points as example inputs) in an FX e-graph, saturated with
    ``families`` (Herbie's database, :mod:`egraph.rules.herbie`, and the stable forms) within
    small limits; then, for the formula's value and for each localised op, every e-node of
    its class with the rest of the program the smallest (AstSize) one, each as a sympy
    expression ``("rule <applied rules>", expr)``."""
    from backends.fx import build_module
    from egraph.egraph import EGraph
    from egraph.extract import AstSize, best_nodes
    from egraph.extract.program import is_acyclic
    from egraph.rules import load_rules

    left = deadline - time.perf_counter()
    if left <= 0:
        return []
    inside = set(unit.nodes)
    closed = inside | set(unit.leaves)
    if any(a not in closed for n in unit.nodes for a in n.all_input_nodes):
        # The formula's nodes read a value its expression does not name (the condition of
        # a where): the formula cannot be cut out of the graph alone.
        return []
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for leaf, symbol in zip(unit.leaves, unit.symbols):
        env[leaf] = graph.placeholder(symbol.name)
    for n in gm.graph.nodes:
        if n in inside:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[unit.root])
    eg = EGraph.from_fx(fx.GraphModule(gm, graph), tuple(samples))
    eg.saturate(load_rules(*families), iter_limit=iter_limit, node_limit=node_limit,
                time_limit=min(left, 5.0))
    applied = ", ".join(sorted(name for name, r in eg.report.rules.items() if r.applied))
    base = {c: v[1] for c, v in best_nodes(eg, AstSize()).items()}
    hot = {env[n].name for n in inside if any(n.name == h for h in _hot_names(unit))}
    targets = [eg.find(eg.roots[0])] + [eg.find(c) for c, name in eg.fx.origins.items()
                                        if name in hot]
    out: list[tuple[str, sp.Expr]] = []
    for c in dict.fromkeys(targets):
        for node in eg.nodes(c):
            if time.perf_counter() > deadline:
                return out
            choice = {**base, c: (node.op, *node.children)}
            if not is_acyclic(eg, choice, [eg.roots[0]]):
                continue
            try:
                expr = _formula(build_module(eg, choice))
            except (ValueError, TypeError, RuntimeError, KeyError, RecursionError):
                continue  # a choice that cycles back into its class, or leaves sympy's reach
            if expr is not None:
                out.append((f"rules ({applied})", expr))
    return out


def _hot_names(unit: _Unit) -> set[str]:
    return {n.name for n in unit.nodes if unit.node_exprs.get(n) in unit.hot}


def _formula(gm: fx.GraphModule) -> sp.Expr | None:
    """The output of an elementwise GraphModule as a sympy expression over its
    placeholders, or None when an op is not elementwise algebra sympy can express."""
    values: dict[fx.Node, sp.Expr] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            values[n] = sp.Symbol(n.name, real=True)
        elif n.op == "output":
            result = n.args[0]
            return values.get(result) if isinstance(result, fx.Node) else None
        else:
            found = to_sympy(n)
            if found is None:
                return None
            builder, args = found
            parts = [values[a] if isinstance(a, fx.Node) else _number(a) for a in args]
            if any(p is None for p in parts):
                return None
            values[n] = builder(*parts)
    return None


# ------------------------------------------------------------ from sympy back to torch


def _evaluate(expr: sp.Expr, env: dict, memo: dict | None = None):
    """``expr`` computed with torch on ``env`` (symbol -> tensor, or fx proxy: then the
    calls are recorded in its graph). ``exp(u) - 1`` runs as ``expm1(u)``, ``log(1 + u)``
    as ``log1p(u)``."""
    memo = {} if memo is None else memo
    value = _walk(expr, env, memo)
    if isinstance(value, (int, float)):
        ref = next(iter(env.values()))
        return torch.full_like(ref, float(value))
    return value


def _walk(e: sp.Expr, env: dict, memo: dict):
    if e in memo:
        return memo[e]
    if e in env:
        return env[e]
    if e.is_Number or e.is_NumberSymbol:
        if not e.is_finite or not e.is_real:
            raise ValueError(f"{e} is not a finite real")
        return float(e)
    if isinstance(e, sp.Add):
        value = _add(e, env, memo)
    elif isinstance(e, sp.Mul):
        value = _mul(e, env, memo)
    elif isinstance(e, sp.Pow):
        value = _pow(e.base, e.exp, env, memo)
    elif e.func == sp.log and isinstance(e.args[0], sp.Add) and 1 in e.args[0].args:
        value = torch.log1p(_walk(e.args[0] - 1, env, memo))
    elif e.func in _TORCH:
        value = _TORCH[e.func](_tensor(_walk(e.args[0], env, memo), env))
    elif isinstance(e, sp.Piecewise):
        *pieces, (value, _) = e.args
        value = math.nan if value is sp.nan else _walk(value, env, memo)
        for piece, condition in reversed(pieces):
            value = torch.where(_condition(condition, env, memo),
                                _tensor(_walk(piece, env, memo), env), _tensor(value, env))
    else:
        raise ValueError(f"no torch for {e.func}")
    memo[e] = value
    return value


def _condition(c: sp.Basic, env: dict, memo: dict):
    """A comparison of a Piecewise branch (the side of a series at infinity)."""
    compare = {sp.StrictGreaterThan: lambda a, b: a > b, sp.StrictLessThan: lambda a, b: a < b}
    if type(c) not in compare:
        raise ValueError(f"no torch for the condition {c}")
    return compare[type(c)](_tensor(_walk(c.lhs, env, memo), env), _walk(c.rhs, env, memo))


def _tensor(value, env):
    if isinstance(value, (int, float)):
        return torch.full_like(next(iter(env.values())), float(value))
    return value


def _add(e: sp.Add, env: dict, memo: dict):
    constant, terms = e.as_coeff_add()
    terms = list(terms)
    for i, t in enumerate(terms):  # c*exp(u) - c  ->  c*expm1(u)
        coeff, rest = t.as_coeff_Mul()
        if constant != 0 and rest.func == sp.exp and coeff == -constant:
            fused = torch.expm1(_tensor(_walk(rest.args[0], env, memo), env))
            terms[i] = None
            constant = sp.Integer(0)
            value = fused if coeff == 1 else -fused if coeff == -1 else fused * float(coeff)
            break
    else:
        value = None
    pos = [t for t in terms if t is not None and not t.could_extract_minus_sign()]
    neg = [-t for t in terms if t is not None and t.could_extract_minus_sign()]
    for t in pos:
        v = _walk(t, env, memo)
        value = v if value is None else value + v
    if constant != 0:
        value = float(constant) if value is None else value + float(constant)
    for t in neg:
        v = _walk(t, env, memo)
        value = -v if value is None else value - v
    return value


def _mul(e: sp.Mul, env: dict, memo: dict):
    coeff, factors = e.as_coeff_mul()
    num, den = [], []
    for f in factors:
        if isinstance(f, sp.Pow) and f.exp.is_Number and f.exp < 0:
            den.append(f.base ** -f.exp)
        else:
            num.append(f)
    value = None
    for f in num:
        v = _walk(f, env, memo)
        value = v if value is None else value * v
    if value is None:
        value = float(coeff)
        coeff = sp.Integer(1)
    for f in den:
        value = value / _walk(f, env, memo)
    if coeff == -1:
        return -value
    return value if coeff == 1 else value * float(coeff)


def _pow(base: sp.Expr, exp: sp.Expr, env: dict, memo: dict):
    if exp == 1:
        return _walk(base, env, memo)
    if exp == sp.Rational(1, 2):
        return torch.sqrt(_tensor(_walk(base, env, memo), env))
    if exp.is_Integer and 1 < exp <= 4:
        b = _walk(base, env, memo)
        value = b
        for _ in range(int(exp) - 1):
            value = value * b
        return value
    if exp.is_Number and exp < 0:
        return 1.0 / _pow(base, -exp, env, memo)
    b = _walk(base, env, memo)
    x = _walk(exp, env, memo)
    if isinstance(b, (int, float)) and isinstance(x, (int, float)):
        value = float(b) ** float(x)
        if isinstance(value, complex):
            raise ValueError(f"{base}**{exp} is not real")
        return value
    return torch.pow(b, x)


def _run_program(regimes: Regimes, exprs: list[sp.Expr], key: sp.Symbol, env: dict):
    memo: dict = {}
    return select(regimes, [lambda e=e: _evaluate(e, env, memo) for e in exprs], env[key],
                  torch.where)


def _program(regimes: Regimes, exprs: list[sp.Expr], key: sp.Symbol) -> str:
    """The chosen program in words (sympy syntax with the fused ``expm1`` and ``log1p``,
    branches on ``key``)."""
    if not regimes.thresholds:
        return str(_fused(exprs[regimes.candidates[0]]))
    parts = [f"{_fused(exprs[c])} if {key} < {t:.6g}"
             for c, t in zip(regimes.candidates, regimes.thresholds)]
    return "; ".join(parts) + f"; else {_fused(exprs[regimes.candidates[-1]])}"


_EXPM1, _LOG1P = sp.Function("expm1"), sp.Function("log1p")


def _fused(e: sp.Expr) -> sp.Expr:
    """``e`` as :func:`_evaluate` runs it: ``c*exp(u) - c`` as ``c*expm1(u)``, ``log(1 + u)``
    as ``log1p(u)`` (for display)."""
    if not e.args:
        return e
    args = [_fused(a) for a in e.args]
    if e.func == sp.log and isinstance(e.args[0], sp.Add) and 1 in e.args[0].args:
        return _LOG1P(_fused(e.args[0] - 1))
    if isinstance(e, sp.Add):
        constant, terms = e.as_coeff_add()
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            if constant != 0 and rest.func == sp.exp and coeff == -constant:
                others = [_fused(o) for o in terms if o is not t]
                return sp.Add(coeff * _EXPM1(_fused(rest.args[0])), *others, evaluate=False)
    return e.func(*args)


def _emit(gm: fx.GraphModule, unit: _Unit, regimes: Regimes, exprs: list[sp.Expr],
          numbers: set[sp.Symbol] = frozenset()) -> None:
    """Replace the unit's value in ``gm`` by the chosen (piecewise) program. The leaves
    ``numbers`` hold Python numbers when the program runs (``3 * 0.1`` folded by Python):
    the program takes them as 0-d tensors, which torch's functions accept and which
    broadcast and promote as the number would."""
    small = fx.Graph()
    tracer = fx.proxy.GraphAppendingTracer(small)
    proxies = {s: fx.Proxy(small.placeholder(s.name), tracer) for s in unit.symbols}
    for s in numbers:
        proxies[s] = torch.as_tensor(proxies[s])
    key = unit.symbols[regimes.variable]
    out = _run_program(regimes, exprs, key, proxies)
    small.output(out.node if isinstance(out, fx.Proxy) else out)
    mapping = {p.node: leaf for p, leaf in zip(proxies.values(), unit.leaves)}
    with gm.graph.inserting_before(unit.root):
        new = gm.graph.graph_copy(small, mapping)
    unit.root.replace_all_uses_with(new)
