"""The stability experiments: one command, a results table and plots in a folder.

Plots are PNG and SVG, drawn with matplotlib (the ``plot`` extra: ``pip install .[plot]``).

    .venv/bin/python benchmarks/stability/run.py [--out benchmarks/results/stability]
        [--only formulas,blocks,correlation,hamming] [--graphs 200]

1. Known unstable patterns (benchmarks/stability/formulas.py): each naive formula on inputs
   from its natural domain, rewritten by ``StabilityRewriter``; mean error in bits of the
   working precision against a 60-digit mpmath reference, before and after, and NaN/inf
   where the truth is finite. Success: every formula at least 1 bit better, no non-finite
   value where the truth is finite.
2. Real blocks (benchmarks/stability/blocks.py): attention, layer norm, batch norm (eval),
   cross-entropy and a GPT-style block, fp32 and fp16, adversarial inputs; maximum
   relative error against float64 before and after.
3. Curvature predicts error (benchmarks/stability/graphs.py): random computation graphs,
   composed of the rule library's idioms and of Hamming's formulas (which the rules were
   not written for); Pearson and Spearman correlation between curvature reduction and error
   reduction.
4. Herbie's suite (benchmarks/stability/hamming.py): Hamming's 28 NMSE benchmarks in
   float32 through both entry points, mean bits of error on held-out points before and after.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from compiler import charts  # noqa: E402
from compiler.stability import StabilityRewriter, error_bits  # noqa: E402


def _nonfinite(got, ref) -> int:
    finite = torch.isfinite(ref)
    return int((finite & ~torch.isfinite(got.double())).sum())


def run_formulas(out: Path) -> list[dict]:
    """Experiment 1; returns one row per formula."""
    from benchmarks.stability.formulas import FORMULAS

    rewriter = StabilityRewriter()
    rows = []
    for f in FORMULAS:
        gen = torch.Generator().manual_seed(0)
        inputs = f.sample(gen)
        start = time.perf_counter()
        opt = rewriter.optimize(f.fn, inputs, domains=f.domains or None)
        elapsed = time.perf_counter() - start
        with torch.no_grad():
            before, after = f.fn(*inputs), opt(*inputs)
        exact = f.exact(*inputs)
        report = opt.meta["stability_report"]
        rows.append({
            "formula": f.name, "dtype": str(f.dtype).removeprefix("torch."),
            "bits_before": error_bits(before, exact, f.dtype),
            "bits_after": error_bits(after, exact, f.dtype),
            "nonfinite_before": _nonfinite(before, exact),
            "nonfinite_after": _nonfinite(after, exact),
            "curvature_before": report.curvature_before,
            "curvature_after": report.curvature_after,
            "rewrite": "; ".join(f"{r.before} -> {r.after}" for r in report.rewrites) or "-",
            "seconds": elapsed,
        })
        charts.save(report.chart(), out / f"formula-{f.name}.png",
                    out / f"formula-{f.name}.svg")
    return rows


def _write_table(path: Path, rows: list[dict], columns: list[str]) -> None:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def _formula_charts(out: Path, rows: list[dict]) -> None:
    """Error before and after per formula, and predicted against measured gains."""
    names = [r["formula"] for r in rows]
    fig = charts.before_after_bars(
        names, [r["bits_before"] for r in rows], [r["bits_after"] for r in rows],
        title="known unstable formulas\nmean error against a 60-digit reference",
        unit="bits of the working precision")
    charts.save(fig, out / "formulas.png", out / "formulas.svg")
    fig = charts.scatter(
        [r["curvature_before"] - r["curvature_after"] for r in rows],
        [r["bits_before"] - r["bits_after"] for r in rows],
        title="known unstable formulas: does curvature predict the gain?",
        xlabel="predicted error reduction (curvature, bits)",
        ylabel="measured mean error reduction (bits)", points="formulas")
    charts.save(fig, out / "formulas-correlation.png", out / "formulas-correlation.svg")


def _block_chart(out: Path, rows: list[dict]) -> None:
    """Normwise relative error before and after per block and dtype (log scale)."""
    fig = charts.before_after_bars(
        [f"{r['block']} ({r['dtype']})" for r in rows], [r["error_before"] for r in rows],
        [r["error_after"] for r in rows], log=True,
        title="real blocks: error against float64\n(inf: a finite value became inf or nan)",
        unit="normwise relative error max|got - ref| / max|ref|")
    charts.save(fig, out / "blocks.png", out / "blocks.svg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stability"))
    parser.add_argument("--only", default="formulas,blocks,correlation,hamming")
    parser.add_argument("--graphs", type=int, default=200)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    charts.require()  # before minutes of experiments, not after
    torch.set_num_threads(1)
    parts = args.only.split(",")
    if "formulas" in parts:
        rows = run_formulas(out)
        _write_table(out / "formulas.md", rows, ["formula", "dtype", "bits_before",
                                                  "bits_after", "nonfinite_before",
                                                  "nonfinite_after", "curvature_before",
                                                  "curvature_after", "rewrite"])
        _formula_charts(out, rows)
        fixed = [r for r in rows if r["bits_before"] - r["bits_after"] >= 1
                 and r["nonfinite_after"] == 0]
        for r in rows:
            print(f"{r['formula']:<34}{r['dtype']:<9}{r['bits_before']:8.2f} ->"
                  f"{r['bits_after']:6.2f} bits  non-finite {r['nonfinite_before']:>4} -> "
                  f"{r['nonfinite_after']:<4} {r['rewrite'][:60]}")
        print(f"experiment 1: {len(fixed)} of {len(rows)} formulas at least 1 bit better with "
              "no non-finite value where the truth is finite")
    if "blocks" in parts:
        from benchmarks.stability.blocks import run_blocks

        rows = run_blocks()
        _write_table(out / "blocks.md", rows, ["block", "dtype", "error_before",
                                                "error_after", "improvement", "rewrites"])
        _block_chart(out, rows)
        for r in rows:
            print(f"{r['block']:<28}{r['dtype']:<9}{r['error_before']:10.3g} ->"
                  f"{r['error_after']:10.3g}  x{r['improvement']:<10.3g} {r['rewrites'][:50]}")
    if "correlation" in parts:
        from benchmarks.stability.graphs import run_correlation

        for idioms in ("library", "hamming"):
            summary = run_correlation(args.graphs, out, idioms=idioms)
            print(f"experiment 3 ({idioms} idioms): {summary['graphs']} random graphs "
                  f"({summary['failed']} refused), {summary['rewritten']} rewritten; "
                  "curvature reduction vs mean-error reduction: Pearson "
                  f"{summary['pearson_mean']:.3f}, Spearman {summary['spearman_mean']:.3f}; "
                  f"vs worst-element error reduction: Pearson {summary['pearson_worst']:.3f}, "
                  f"Spearman {summary['spearman_worst']:.3f}; {summary['worse']} graphs with "
                  "a worse mean error after; the cost model's bits at risk instead: Spearman "
                  f"{summary['risk_spearman_mean']:.3f} (mean), "
                  f"{summary['risk_spearman_worst']:.3f} (worst)")
    if "hamming" in parts:
        from benchmarks.stability.hamming import report_hamming, run_hamming

        report_hamming(run_hamming(), out)
    print(f"tables and plots in {out}")


if __name__ == "__main__":
    main()
