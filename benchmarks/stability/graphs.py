"""Experiment 3: does curvature predict error? Random computation graphs, seeded.

Each graph composes random idioms over random inputs at random scales. Two pools of idioms:
``library`` (naive softmax, logsumexp, log(1+x), exp(x)-1, one-pass variance, sigmoid and
softplus from exponentials, differences of square roots, plain arithmetic and elementwise
functions: the spellings the rule library was written for) and ``hamming`` (the
one-variable formulas of Hamming's NMSE benchmarks, :mod:`benchmarks.stability.hamming`,
each fed through a map of its argument into the bounds of its precondition, composed with
plain arithmetic: formulas the rules were not written for). For each one
``StabilityRewriter`` reports the curvature before and after (the predicted error of the
first-order analysis, ``frontends.fx.error_analysis``, and the bits at risk by the
extraction's ``Curvature`` cost model), and we measure the error in bits of fp32 against
the same program evaluated at 60 digits with mpmath (a float64 evaluation of a naive
program is itself wrong where it cancels); then we correlate curvature reduction with
error reduction, for both notions of curvature.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import mpmath as mp
import numpy as np
import torch

from compiler import charts
from compiler.stability import StabilityRewriter, error_bits

mp.mp.dps = 60

class _Torch:
    """The idioms' operations on torch tensors (the programs that get traced)."""

    exp, log, sqrt, tanh = torch.exp, torch.log, torch.sqrt, torch.tanh

    @staticmethod
    def rsum(a):
        return a.sum(-1, keepdim=True)

    @staticmethod
    def rmean(a):
        return a.mean(-1, keepdim=True)

    @staticmethod
    def softmax(a):
        return torch.softmax(a, -1)

    @staticmethod
    def hamming(bench, a):
        return bench.fn(a)


class _Exact:
    """The same operations on numpy arrays of 60-digit mpmath numbers (the reference)."""

    exp = staticmethod(np.vectorize(mp.exp, otypes=[object]))
    log = staticmethod(np.vectorize(mp.log, otypes=[object]))
    sqrt = staticmethod(np.vectorize(mp.sqrt, otypes=[object]))
    tanh = staticmethod(np.vectorize(mp.tanh, otypes=[object]))

    @staticmethod
    def rsum(a):
        return a.sum(-1, keepdims=True)

    @staticmethod
    def rmean(a):
        return a.sum(-1, keepdims=True) / a.shape[-1]

    @staticmethod
    def softmax(a):
        e = _Exact.exp(a)
        return e / e.sum(-1, keepdims=True)

    @staticmethod
    def hamming(bench, a):
        def exact(v):
            try:
                value = bench.exact(v)
            except (ZeroDivisionError, ValueError):
                return mp.nan
            return value if mp.im(value) == 0 else mp.nan

        return np.vectorize(exact, otypes=[object])(a)


# Each idiom: (arity, builder over an operations namespace t). Reductions keep the last dim.
_IDIOMS = [
    (1, lambda t, a: t.exp(a) / t.rsum(t.exp(a))),
    (1, lambda t, a: t.log(t.rsum(t.exp(a)))),
    (1, lambda t, a: t.log(1 + a * a)),
    (1, lambda t, a: t.exp(a * 1e-3) - 1),
    (1, lambda t, a: t.rmean(a * a) - t.rmean(a) ** 2),
    (1, lambda t, a: 1 / (1 + t.exp(-a))),
    (1, lambda t, a: t.log(1 + t.exp(a))),
    (1, lambda t, a: t.log(t.softmax(a))),
    (1, lambda t, a: t.sqrt(a * a + 1) - t.sqrt(a * a)),
    (1, lambda t, a: t.tanh(a)),
    (1, lambda t, a: a * 0.5),
    (2, lambda t, a, b: a + b),
    (2, lambda t, a, b: a * b),
    (2, lambda t, a, b: t.log(t.exp(a) + t.exp(b))),
]


def _into_bounds(bounds: tuple[float, float] | None):
    """A map of any value into a precondition's bounds, over an operations namespace:
    ``lo + max(|lo|, 1) * a*a`` below an open top, the middle plus a tanh between two
    finite ends, the value itself without bounds."""
    if bounds is None:
        return lambda t, a: a
    lo, hi = bounds
    if hi == float("inf"):
        return lambda t, a: lo + max(abs(lo), 1.0) * (a * a)
    return lambda t, a: (lo + hi) / 2 + (hi - lo) / 2 * 0.99 * t.tanh(a)


def _hamming_idioms() -> list:
    from benchmarks.stability.hamming import BENCHMARKS

    def formula(bench):
        into = _into_bounds((bench.ranges or {}).get(bench.args[0]))
        return lambda t, a: t.hamming(bench, into(t, a))

    return [(1, formula(b)) for b in BENCHMARKS if len(b.args) == 1] + [
        (2, lambda t, a, b: a + b),
        (2, lambda t, a, b: a * b),
        (1, lambda t, a: a * 0.5),
    ]


IDIOMS = {"library": _IDIOMS, "hamming": _hamming_idioms()}
"""The pools of idioms random graphs are composed of (see the module docstring)."""


def _random_program(rng: random.Random, depth: int, inputs: int, idioms: list = _IDIOMS):
    """A random expression as nested tuples: ('x', i) leaves, (idiom index, children)."""
    if depth <= 0:
        return ("x", rng.randrange(inputs))
    index = rng.randrange(len(idioms))
    arity = idioms[index][0]
    return (index, [_random_program(rng, depth - 1 - rng.randrange(2), inputs, idioms)
                    for _ in range(arity)])


def _evaluate(program, xs, ops=_Torch, idioms: list = _IDIOMS):
    if program[0] == "x":
        return xs[program[1]]
    index, kids = program
    return idioms[index][1](ops, *[_evaluate(k, xs, ops, idioms) for k in kids])


def _exact(program, xs, idioms: list = _IDIOMS) -> torch.Tensor:
    """The program at 60 digits (mpmath), rounded to float64."""
    values = [np.vectorize(lambda v: mp.mpf(float(v)), otypes=[object])(x.double().numpy())
              for x in xs]
    out = _evaluate(program, values, _Exact, idioms)
    return torch.tensor(np.vectorize(_real_or_nan)(out).astype(np.float64))


def _real_or_nan(v) -> float:
    """A reference value as a float: NaN where it is not real; an mpmath complex number
    with no imaginary part (a Hamming formula's reference on a negative argument) is
    its real part.

    >>> _real_or_nan(mp.mpc(2, 0)), _real_or_nan(mp.mpc(2, 1)), _real_or_nan(mp.mpf(3))
    (2.0, nan, 3.0)
    """
    return float(mp.re(v)) if mp.im(v) == 0 else math.nan


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    def ranks(v: np.ndarray) -> np.ndarray:
        order = v.argsort(kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # average ranks of ties
            tie = v == value
            r[tie] = r[tie].mean()
        return r
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def run_correlation(count: int, out: Path, seed: int = 0, idioms: str = "library") -> dict:
    """Run ``count`` random graphs composed of the pool ``idioms`` (:data:`IDIOMS`); write
    the points (correlation[-hamming].csv) and scatter plots of error reduction against
    curvature reduction (correlation[-hamming]-mean and -worst, PNG and SVG); return the
    correlations."""
    pool = IDIOMS[idioms]
    tag = "" if idioms == "library" else f"-{idioms}"
    rng = random.Random(seed)
    rewriter = StabilityRewriter(iter_limit=6, node_limit=20_000)
    points = []
    for i in range(count):
        n_inputs = rng.randint(1, 2)
        program = _random_program(rng, rng.randint(1, 3), n_inputs, pool)
        gen = torch.Generator().manual_seed(seed * 100_000 + i)
        scale = rng.choice([0.1, 1.0, 10.0, 60.0])
        offset = rng.choice([0.0, 0.0, 100.0])
        xs = tuple(torch.randn((8, 16), generator=gen) * scale + offset
                   for _ in range(n_inputs))
        names = ", ".join(f"x{j}" for j in range(n_inputs))
        fn = eval(f"lambda {names}: evaluate(program, [{names}], idioms=pool)",  # noqa: S307
                  {"evaluate": _evaluate, "program": program, "pool": pool})
        try:
            opt = rewriter.optimize(torch.fx.symbolic_trace(fn), xs)
        except Exception as err:  # noqa: BLE001 - a graph the pipeline refuses is reported
            points.append({"graph": i, "error": repr(err)[:80]})
            continue
        report = opt.meta["stability_report"]
        exact = _exact(program, xs, pool)
        with torch.no_grad():
            before, after = fn(*xs), opt(*xs)
        points.append({
            "graph": i, "curvature_before": report.curvature_before,
            "curvature_after": report.curvature_after,
            "risk_before": report.risk_before, "risk_after": report.risk_after,
            "bits_before": error_bits(before, exact, torch.float32),
            "bits_after": error_bits(after, exact, torch.float32),
            "worst_before": error_bits(before, exact, torch.float32, "max"),
            "worst_after": error_bits(after, exact, torch.float32, "max"),
            "rewrites": len(report.rewrites),
        })
    good = [p for p in points if "error" not in p]
    dc = np.array([p["curvature_before"] - p["curvature_after"] for p in good])
    drisk = np.array([p["risk_before"] - p["risk_after"] for p in good])
    mean_gain = np.array([p["bits_before"] - p["bits_after"] for p in good])
    worst_gain = np.array([p["worst_before"] - p["worst_after"] for p in good])
    result = {"graphs": len(points), "failed": len(points) - len(good),
              "rewritten": sum(1 for p in good if p["rewrites"]),
              "worse": sum(1 for p in good if p["bits_after"] > p["bits_before"] + 0.1)}
    for name, gain in (("mean", mean_gain), ("worst", worst_gain)):
        result[f"pearson_{name}"] = float(np.corrcoef(dc, gain)[0, 1])
        result[f"spearman_{name}"] = _spearman(dc, gain)
        result[f"risk_spearman_{name}"] = _spearman(drisk, gain)
    with open(out / f"correlation{tag}.csv", "w") as f:
        f.write("graph,curvature_before,curvature_after,risk_before,risk_after,bits_before,"
                "bits_after,worst_bits_before,worst_bits_after,rewrites\n")
        for p in good:
            f.write(f"{p['graph']},{p['curvature_before']:.4f},{p['curvature_after']:.4f},"
                    f"{p['risk_before']:.4f},{p['risk_after']:.4f},"
                    f"{p['bits_before']:.4f},{p['bits_after']:.4f},{p['worst_before']:.4f},"
                    f"{p['worst_after']:.4f},{p['rewrites']}\n")
    for name, gain in (("mean", mean_gain), ("worst", worst_gain)):
        _correlation_chart(out, name, dc, drisk, gain, result, tag)
    return result


def _correlation_chart(out: Path, kind: str, curvature: np.ndarray, risk: np.ndarray,
                       gain: np.ndarray, result: dict, tag: str = "") -> None:
    """Measured error reduction against each estimate of it: the first-order analysis's
    curvature and the cost model's bits at risk (correlation-<kind>.png and .svg)."""
    what = {"mean": "mean", "worst": "worst-element"}[kind]
    left, right = charts.panels(2)
    charts.scatter(curvature, gain, ax=left, points="graphs",
                   title=f"first-order analysis (Spearman {result[f'spearman_{kind}']:.2f})",
                   xlabel="predicted error reduction (curvature, bits)",
                   ylabel=f"measured {what} error reduction (bits of fp32)")
    charts.scatter(risk, gain, ax=right, points="graphs",
                   title=f"cost model (Spearman {result[f'risk_spearman_{kind}']:.2f})",
                   xlabel="reduction of the bits at risk (Curvature cost model)",
                   ylabel=f"measured {what} error reduction (bits of fp32)")
    left.figure.suptitle(f"random graphs: does curvature predict the {what} error reduction?")
    charts.save(left.figure, out / f"correlation{tag}-{kind}.png",
                out / f"correlation{tag}-{kind}.svg")
