"""Hamming's NMSE benchmarks (Herbie's suite) as PyTorch functions, in float32.

The 28 benchmarks of FPBench's ``benchmarks/hamming-ch3.fpcore`` (Hamming, *Numerical
Methods for Scientists and Engineers*, chapter 3; the suite Herbie was evaluated on in
PLDI 2015), each written the naive way, as the FPCore states it, with an mpmath reference of
the same mathematics and the FPCore's precondition as its input domain (its bounds on single
variables are declared to both entry points as `ranges`, as Herbie is given the precondition).

Inputs are sampled as Herbie samples them: float32 bit patterns drawn uniformly (so every
binade is equally likely), kept where the precondition holds and the exact result is a finite
float32. Each benchmark gets a training set (the example inputs the optimisers see) and a
separate test set of the same size (where the error is measured). Error is the mean over
test points of ``log2(1 + |got - exact| / ulp(exact))`` in float32 (at most 24 bits;
:func:`compiler.stability.error_bits`), against a 150-digit mpmath reference.

    .venv/bin/python benchmarks/stability/hamming.py [--points 256] [--only "problem 3.3.1"]
        [--out benchmarks/results/stability]

runs both entry points on every benchmark:

- ``egraph``: ``EGraph.from_fx(gm, xs).saturate(load_rules("all")).extract(Curvature())``;
- ``rewriter``: ``StabilityRewriter().optimize(fn, xs)``;

and prints, per benchmark, the error before and after each and the non-finite results where
the truth is finite, then the averages; writes them with the chart (PNG and SVG), stamped
with the run (``benchmarks/report.py``), to ``hamming.md`` in ``--out``. Herbie's published
figures are in binary64 (bits of a 64-bit format) and are listed beside ours in
:data:`HERBIE_BINARY64` with their sources.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mpmath as mp
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.report import markdown_table, write_results  # noqa: E402

__all__ = ["BENCHMARKS", "HERBIE_BINARY64", "Hamming", "exact_values", "improved",
           "report_hamming", "run_hamming", "sample"]

# Digits of the reference: float32 spans 2^-149 .. 2^128, so a sum of two float32 values is
# exact in ~90 digits and cancellation down to the smallest magnitude still leaves 60.
_DIGITS = 150


@dataclass(frozen=True)
class Hamming:
    """One benchmark: ``name`` (the FPCore's, without "NMSE "), ``args`` (its variables),
    ``fn`` (naive torch code), ``exact`` (the same mathematics in mpmath, on mpf scalars),
    ``pre`` (its precondition on float64 tensors; None: every input) and ``ranges`` (the
    part of the precondition that bounds one variable, ``{"n": (6.8e15, inf)}``, declared
    to both entry points as Herbie is given the precondition)."""

    name: str
    args: tuple[str, ...]
    fn: Callable
    exact: Callable
    pre: Callable | None = None
    ranges: dict[str, tuple[float, float]] | None = None


_INF = float("inf")


def _h(name: str, args: str, fn: Callable, exact: Callable, pre: Callable | None = None,
       ranges: dict[str, tuple[float, float]] | None = None) -> Hamming:
    return Hamming(name, tuple(args.split()), fn, exact, pre, ranges)


BENCHMARKS: list[Hamming] = [
    _h("example 3.1", "x", lambda x: torch.sqrt(x + 1) - torch.sqrt(x),
       lambda x: mp.sqrt(x + 1) - mp.sqrt(x), lambda x: x >= 0, {"x": (0.0, _INF)}),
    _h("example 3.3", "x eps", lambda x, eps: torch.sin(x + eps) - torch.sin(x),
       lambda x, eps: mp.sin(x + eps) - mp.sin(x)),
    _h("example 3.4", "x", lambda x: (1 - torch.cos(x)) / torch.sin(x),
       lambda x: (1 - mp.cos(x)) / mp.sin(x), lambda x: x != 0),
    _h("example 3.5", "N", lambda n: torch.atan(n + 1) - torch.atan(n),
       lambda n: mp.atan(n + 1) - mp.atan(n)),
    _h("example 3.6", "x", lambda x: 1 / torch.sqrt(x) - 1 / torch.sqrt(x + 1),
       lambda x: 1 / mp.sqrt(x) - 1 / mp.sqrt(x + 1), lambda x: x >= 0, {"x": (0.0, _INF)}),
    _h("problem 3.3.1", "x", lambda x: 1 / (x + 1) - 1 / x, lambda x: 1 / (x + 1) - 1 / x,
       lambda x: x != 0),
    _h("problem 3.3.2", "x eps", lambda x, eps: torch.tan(x + eps) - torch.tan(x),
       lambda x, eps: mp.tan(x + eps) - mp.tan(x)),
    _h("problem 3.3.3", "x", lambda x: (1 / (x + 1) - 2 / x) + 1 / (x - 1),
       lambda x: (1 / (x + 1) - 2 / x) + 1 / (x - 1), lambda x: x != 0),
    _h("problem 3.3.4", "x", lambda x: torch.pow(x + 1, 1 / 3) - torch.pow(x, 1 / 3),
       lambda x: mp.cbrt(x + 1) - mp.cbrt(x), lambda x: x >= 0, {"x": (0.0, _INF)}),
    _h("problem 3.3.5", "x eps", lambda x, eps: torch.cos(x + eps) - torch.cos(x),
       lambda x, eps: mp.cos(x + eps) - mp.cos(x)),
    _h("problem 3.3.6", "N", lambda n: torch.log(n + 1) - torch.log(n),
       lambda n: mp.log(n + 1) - mp.log(n), lambda n: n >= 0, {"n": (0.0, _INF)}),
    _h("problem 3.3.7", "x", lambda x: (torch.exp(x) - 2) + torch.exp(-x),
       lambda x: (mp.exp(x) - 2) + mp.exp(-x)),
    _h("p42, positive", "a b c",
       lambda a, b, c: (-b + torch.sqrt(b * b - 4 * (a * c))) / (2 * a),
       lambda a, b, c: (-b + mp.sqrt(b * b - 4 * (a * c))) / (2 * a),
       lambda a, b, c: (b * b >= 4 * (a * c)) & (a != 0)),
    _h("p42, negative", "a b c",
       lambda a, b, c: (-b - torch.sqrt(b * b - 4 * (a * c))) / (2 * a),
       lambda a, b, c: (-b - mp.sqrt(b * b - 4 * (a * c))) / (2 * a),
       lambda a, b, c: (b * b >= 4 * (a * c)) & (a != 0)),
    _h("problem 3.2.1, positive", "a b2 c",
       lambda a, b2, c: (-b2 + torch.sqrt(b2 * b2 - a * c)) / a,
       lambda a, b2, c: (-b2 + mp.sqrt(b2 * b2 - a * c)) / a,
       lambda a, b2, c: (b2 * b2 >= a * c) & (a != 0)),
    _h("problem 3.2.1, negative", "a b2 c",
       lambda a, b2, c: (-b2 - torch.sqrt(b2 * b2 - a * c)) / a,
       lambda a, b2, c: (-b2 - mp.sqrt(b2 * b2 - a * c)) / a,
       lambda a, b2, c: (b2 * b2 >= a * c) & (a != 0)),
    _h("example 3.7", "x", lambda x: torch.exp(x) - 1, lambda x: mp.exp(x) - 1,
       lambda x: x > -0.00017, {"x": (-0.00017, _INF)}),
    _h("example 3.8", "N",
       lambda n: ((n + 1) * torch.log(n + 1) - n * torch.log(n)) - 1,
       lambda n: ((n + 1) * mp.log(n + 1) - n * mp.log(n)) - 1, lambda n: n > 6.8e15,
       {"n": (6.8e15, _INF)}),
    _h("example 3.9", "x", lambda x: 1 / x - 1 / torch.tan(x),
       lambda x: 1 / x - 1 / mp.tan(x), lambda x: (x > -0.026) & (x < 0.026) & (x != 0),
       {"x": (-0.026, 0.026)}),
    _h("example 3.10", "x", lambda x: torch.log(1 - x) / torch.log(1 + x),
       lambda x: mp.log(1 - x) / mp.log(1 + x), lambda x: (x > -1) & (x < 1),
       {"x": (-1.0, 1.0)}),
    _h("problem 3.4.1", "x", lambda x: (1 - torch.cos(x)) / (x * x),
       lambda x: (1 - mp.cos(x)) / (x * x)),
    _h("problem 3.4.2", "a b eps",
       lambda a, b, eps: (eps * (torch.exp((a + b) * eps) - 1))
       / ((torch.exp(a * eps) - 1) * (torch.exp(b * eps) - 1)),
       lambda a, b, eps: (eps * (mp.exp((a + b) * eps) - 1))
       / ((mp.exp(a * eps) - 1) * (mp.exp(b * eps) - 1)),
       lambda a, b, eps: (eps > -1) & (eps < 1), {"eps": (-1.0, 1.0)}),
    _h("problem 3.4.3", "eps", lambda e: torch.log((1 - e) / (1 + e)),
       lambda e: mp.log((1 - e) / (1 + e)), lambda e: (e > -1) & (e < 1), {"e": (-1.0, 1.0)}),
    _h("problem 3.4.4", "x",
       lambda x: torch.sqrt((torch.exp(2 * x) - 1) / (torch.exp(x) - 1)),
       lambda x: mp.sqrt((mp.exp(2 * x) - 1) / (mp.exp(x) - 1)), lambda x: x != 0),
    _h("problem 3.4.5", "x", lambda x: (x - torch.sin(x)) / (x - torch.tan(x)),
       lambda x: (x - mp.sin(x)) / (x - mp.tan(x)), lambda x: x != 0),
    _h("problem 3.4.6", "x n",
       lambda x, n: torch.pow(x + 1, 1 / n) - torch.pow(x, 1 / n),
       lambda x, n: mp.power(x + 1, 1 / n) - mp.power(x, 1 / n), lambda x, n: x >= 0,
       {"x": (0.0, _INF)}),
    _h("section 3.5", "a x", lambda a, x: torch.exp(a * x) - 1,
       lambda a, x: mp.exp(a * x) - 1),
    _h("section 3.11", "x", lambda x: torch.exp(x) / (torch.exp(x) - 1),
       lambda x: mp.exp(x) / (mp.exp(x) - 1), lambda x: x != 0),
]
"""The 28 benchmarks, in the order of FPBench's hamming-ch3.fpcore."""

HERBIE_BINARY64: dict[str, tuple[float, float, str]] = {
    "example 3.1": (29.6, 0.2, "https://nightly.cs.washington.edu/reports/herbie/"
                    "1547631355:warfa:develop:4ad0fa0d8e/hamming/32-2sqrtexample31/graph.html"),
    "problem 3.3.7": (29.9, 0.6, "https://nightly.cs.washington.edu/reports/herbie/"
                      "1547627843:warfa:develop:4ad0fa0d8e/hamming/29-exp2problem337/"
                      "graph.html"),
    "section 3.5": (29.7, 0.6, "https://nightly.cs.washington.edu/reports/herbie/"
                    "1547599050:pavpan-dyn-cs-washington-edu:develop:4ad0fa0d8e/"
                    "28-expaxsection35/graph.html"),
}
"""Herbie's own figures, where a published report gives them: (average bits of error before,
after, source), in binary64 (error out of 64 bits, inputs sampled over binary64); the
per-benchmark reports of Herbie's nightly runs. Not comparable bit for bit with float32
figures: a cancellation costs the same number of bits, but a format's maximum differs."""


def exact_values(bench: Hamming, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The mpmath reference (150 digits) of ``bench`` at each point, as float64 (inf or nan
    where the mathematics is not finite).

    >>> b = next(b for b in BENCHMARKS if b.name == "example 3.1")
    >>> exact_values(b, (torch.tensor([1e8]),)).item()  # 1 / (2 sqrt(1e8)), about
    4.9999999875e-05
    """
    cols = [x.double().flatten().tolist() for x in inputs]
    out = []
    with mp.workdps(_DIGITS):
        for point in zip(*cols):
            try:
                value = bench.exact(*[mp.mpf(v) for v in point])
                out.append(float(value) if mp.im(value) == 0 else float("nan"))
            except (ZeroDivisionError, ValueError):
                out.append(float("nan"))
    return torch.tensor(out, dtype=torch.float64)


def sample(bench: Hamming, count: int, seed: int) -> tuple[tuple[torch.Tensor, ...],
                                                          torch.Tensor]:
    """``count`` float32 points drawn as Herbie draws them (uniform bit patterns, kept where
    the precondition holds and the exact result is a finite float32), and their exact values.

    >>> b = next(b for b in BENCHMARKS if b.name == "example 3.1")
    >>> (x,), exact = sample(b, 8, seed=0)
    >>> bool((x >= 0).all()), x.dtype, exact.shape
    (True, torch.float32, torch.Size([8]))
    """
    gen = torch.Generator().manual_seed(seed)
    largest = torch.finfo(torch.float32).max
    kept: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    have = 0
    for _ in range(200):
        bits = torch.randint(-2 ** 31, 2 ** 31, (len(bench.args), 4 * count), generator=gen,
                             dtype=torch.int64).to(torch.int32)
        xs = bits.view(torch.float32)
        ok = torch.isfinite(xs).all(0)
        if bench.pre is not None:
            ok &= bench.pre(*xs.double())
        xs = xs[:, ok][:, : 2 * (count - have)]
        exact = exact_values(bench, tuple(xs))
        good = torch.isfinite(exact) & (exact.abs() <= largest)
        kept.append(xs[:, good])
        values.append(exact[good])
        have += int(good.sum())
        if have >= count:
            break
    xs = torch.cat(kept, 1)[:, :count]
    return tuple(xs), torch.cat(values)[:count]


def _errors(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, int]:
    from compiler.stability import error_bits

    got = got.reshape(exact.shape)
    nonfinite = int((~torch.isfinite(got)).sum())
    return error_bits(got, exact, torch.float32), nonfinite


def run_hamming(points: int = 256, only: list[str] | None = None) -> list[dict]:
    """Both entry points on each benchmark (see the module docstring): one row per benchmark
    with the error before and after each, and the non-finite results.

    >>> (row,) = run_hamming(points=32, only=["problem 3.3.1"])
    >>> improved(row, "egraph") and improved(row, "rewriter")
    True
    """
    import warnings

    from compiler.stability import StabilityRewriter
    from egraph.egraph import EGraph
    from egraph.rules import load_rules
    from extractors.curvature import Curvature

    rules = load_rules("all")
    rows = []
    for bench in BENCHMARKS:
        if only and bench.name not in only:
            continue
        train, _ = sample(bench, points, seed=1)
        test, exact = sample(bench, points, seed=2)
        gm = torch.fx.symbolic_trace(bench.fn)
        with torch.no_grad():
            before, nonfinite_before = _errors(bench.fn(*test), exact)
        row = {"benchmark": bench.name, "bits_before": before,
               "nonfinite_before": nonfinite_before}
        for entry in ("egraph", "rewriter"):
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if entry == "egraph":
                    opt = EGraph.from_fx(gm, train, ranges=bench.ranges).saturate(
                        rules, iter_limit=8, node_limit=20_000, time_limit=20.0
                    ).extract(Curvature())
                else:
                    opt = StabilityRewriter().optimize(bench.fn, train, ranges=bench.ranges)
            row[f"seconds_{entry}"] = time.perf_counter() - start
            with torch.no_grad():
                bits, nonfinite = _errors(opt(*test), exact)
            row[f"bits_{entry}"] = bits
            row[f"nonfinite_{entry}"] = nonfinite
        herbie = HERBIE_BINARY64.get(bench.name)
        row["herbie_binary64"] = f"{herbie[0]} -> {herbie[1]}" if herbie else "-"
        rows.append(row)
    return rows


def improved(row: dict, entry: str) -> bool:
    """The target: at least one bit better with no new non-finite result.

    >>> improved({"bits_before": 5.6, "nonfinite_before": 0, "bits_egraph": 0.2,
    ...           "nonfinite_egraph": 0}, "egraph")
    True
    """
    return (row["bits_before"] - row[f"bits_{entry}"] >= 1
            and row[f"nonfinite_{entry}"] <= row["nonfinite_before"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stability"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    only = [s.strip() for s in args.only.split(",") if s.strip()] or None
    report_hamming(run_hamming(args.points, only), Path(args.out))


def report_hamming(rows: list[dict], out: Path) -> None:
    """Print the table and the averages of :func:`run_hamming`'s rows; write the chart
    (PNG and SVG) and ``hamming.md``, the table and the averages, to ``out``.

    >>> import tempfile
    >>> row = {"benchmark": "problem 3.3.1", "bits_before": 5.6, "nonfinite_before": 0,
    ...        "herbie_binary64": "-", **{f"{k}_{e}": v for e in ("egraph", "rewriter")
    ...                                   for k, v in (("bits", 0.2), ("nonfinite", 0),
    ...                                                ("seconds", 1.0))}}
    >>> with tempfile.TemporaryDirectory() as out:  # doctest: +ELLIPSIS
    ...     report_hamming([row], Path(out))
    benchmark ...
    problem 3.3.1                5.60    0.20     0.20 ...
    rewriter: average 5.60 -> 0.20 bits; 1 of 1 improved by >= 1 bit with no new non-finite value
    written to .../hamming.md
    """
    print(f"{'benchmark':<26}{'before':>7}{'egraph':>8}{'rewriter':>9}  non-finite "
          f"(before/egraph/rewriter)  seconds (egraph/rewriter)  Herbie binary64")
    for r in rows:
        print(f"{r['benchmark']:<26}{r['bits_before']:7.2f}{r['bits_egraph']:8.2f}"
              f"{r['bits_rewriter']:9.2f}  {r['nonfinite_before']:>4} /"
              f"{r['nonfinite_egraph']:>4} /{r['nonfinite_rewriter']:>4}"
              f"{r['seconds_egraph']:14.1f} /{r['seconds_rewriter']:6.1f}"
              f"          {r['herbie_binary64']}")
    n = len(rows)
    averages = []
    for entry in ("egraph", "rewriter"):
        avg = sum(r[f"bits_{entry}"] for r in rows) / n
        count = sum(improved(r, entry) for r in rows)
        averages.append(f"{entry}: average {sum(r['bits_before'] for r in rows) / n:.2f} -> "
                        f"{avg:.2f} bits; {count} of {n} improved by >= 1 bit with no new "
                        "non-finite value")
        print(averages[-1])
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    try:
        from compiler import charts

        fig = charts.before_after_bars(
            [r["benchmark"] for r in rows], [r["bits_before"] for r in rows],
            [r["bits_rewriter"] for r in rows],
            title="Hamming's NMSE benchmarks in float32\nStabilityRewriter, test points",
            unit="mean bits of error (of 24)")
        charts.save(fig, out / "hamming.png", out / "hamming.svg")
        plots.append(out / "hamming.svg")
    except ImportError as err:
        print(f"no chart: {err}")
    columns = ["benchmark", "bits_before", "bits_egraph", "bits_rewriter", "nonfinite_before",
               "nonfinite_egraph", "nonfinite_rewriter", "herbie_binary64"]
    write_results("stability/hamming", "Hamming's NMSE benchmarks in float32",
                  markdown_table(rows, columns, ".2f") + "\n\n" + "\n\n".join(averages),
                  out=out / "hamming.md", plots=plots)


if __name__ == "__main__":
    main()
