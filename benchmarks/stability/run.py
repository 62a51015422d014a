"""The stability experiments: one command, results tables and plots in a folder.

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

Each experiment's results document (formulas.md, blocks.md, correlation.md, hamming.md) is
written through ``benchmarks/report.py``, stamped with the run and linking its plots.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.report import markdown_table, write_results  # noqa: E402
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


def _formula_charts(out: Path, rows: list[dict]) -> list[Path]:
    """Error before and after per formula, and predicted against measured gains; the
    charts written."""
    names = [r["formula"] for r in rows]
    fig = charts.before_after_bars(
        names, [r["bits_before"] for r in rows], [r["bits_after"] for r in rows],
        title="known unstable formulas\nmean error against a 60-digit reference",
        unit="bits of the working precision")
    written = charts.save(fig, out / "formulas.png", out / "formulas.svg")
    fig = charts.scatter(
        [r["curvature_before"] - r["curvature_after"] for r in rows],
        [r["bits_before"] - r["bits_after"] for r in rows],
        title="known unstable formulas: does curvature predict the gain?",
        xlabel="predicted error reduction (curvature, bits)",
        ylabel="measured mean error reduction (bits)", points="formulas")
    return written + charts.save(fig, out / "formulas-correlation.png",
                                 out / "formulas-correlation.svg")


def _block_chart(out: Path, rows: list[dict]) -> list[Path]:
    """Normwise relative error before and after per block and dtype (log scale); the
    charts written."""
    fig = charts.before_after_bars(
        [f"{r['block']} ({r['dtype']})" for r in rows], [r["error_before"] for r in rows],
        [r["error_after"] for r in rows], log=True,
        title="real blocks: error against float64\n(inf: a finite value became inf or nan)",
        unit="normwise relative error max|got - ref| / max|ref|")
    return charts.save(fig, out / "blocks.png", out / "blocks.svg")


def _svgs(paths: list[Path]) -> list[Path]:
    return [path for path in paths if path.suffix == ".svg"]


def formulas(out: Path) -> None:
    """Experiment 1, printed and written to ``out``: formulas.md and its charts."""
    rows = run_formulas(out)
    plots = _formula_charts(out, rows) + [out / f"formula-{r['formula']}.svg" for r in rows]
    fixed = [r for r in rows if r["bits_before"] - r["bits_after"] >= 1
             and r["nonfinite_after"] == 0]
    for r in rows:
        print(f"{r['formula']:<34}{r['dtype']:<9}{r['bits_before']:8.2f} ->"
              f"{r['bits_after']:6.2f} bits  non-finite {r['nonfinite_before']:>4} -> "
              f"{r['nonfinite_after']:<4} {r['rewrite'][:60]}")
    summary = (f"experiment 1: {len(fixed)} of {len(rows)} formulas at least 1 bit better with "
               "no non-finite value where the truth is finite")
    print(summary)
    table = markdown_table(rows, ["formula", "dtype", "bits_before", "bits_after",
                                  "nonfinite_before", "nonfinite_after", "curvature_before",
                                  "curvature_after", "rewrite"])
    write_results("stability/formulas", "Known unstable formulas", f"{table}\n\n{summary}",
                  out=out / "formulas.md", plots=_svgs(plots))


def blocks(out: Path) -> None:
    """Experiment 2, printed and written to ``out``: blocks.md and its chart."""
    from benchmarks.stability.blocks import run_blocks

    rows = run_blocks()
    plots = _block_chart(out, rows)
    for r in rows:
        print(f"{r['block']:<28}{r['dtype']:<9}{r['error_before']:10.3g} ->"
              f"{r['error_after']:10.3g}  x{r['improvement']:<10.3g} {r['rewrites'][:50]}")
    table = markdown_table(rows, ["block", "dtype", "error_before", "error_after",
                                  "improvement", "rewrites"])
    write_results("stability/blocks", "Real blocks: error against float64", table,
                  out=out / "blocks.md", plots=_svgs(plots))


def correlation(out: Path, graphs: int) -> None:
    """Experiment 3 on both pools of idioms, printed and written to ``out``:
    correlation.md, linking the points (CSV) and the charts."""
    from benchmarks.stability.graphs import run_correlation

    lines, plots = [], []
    for idioms in ("library", "hamming"):
        summary = run_correlation(graphs, out, idioms=idioms)
        lines.append(
            f"experiment 3 ({idioms} idioms): {summary['graphs']} random graphs "
            f"({summary['failed']} refused), {summary['rewritten']} rewritten; "
            "curvature reduction vs mean-error reduction: Pearson "
            f"{summary['pearson_mean']:.3f}, Spearman {summary['spearman_mean']:.3f}; "
            f"vs worst-element error reduction: Pearson {summary['pearson_worst']:.3f}, "
            f"Spearman {summary['spearman_worst']:.3f}; {summary['worse']} graphs with "
            "a worse mean error after; the cost model's bits at risk instead: Spearman "
            f"{summary['risk_spearman_mean']:.3f} (mean), "
            f"{summary['risk_spearman_worst']:.3f} (worst)")
        print(lines[-1])
        tag = "" if idioms == "library" else f"-{idioms}"
        lines.append(f"The points: [correlation{tag}.csv](correlation{tag}.csv).")
        plots += [out / f"correlation{tag}-{kind}.svg" for kind in ("mean", "worst")]
    write_results("stability/correlation", "Does curvature predict the error reduction?",
                  "\n\n".join(lines), out=out / "correlation.md", plots=plots)


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
        formulas(out)
    if "blocks" in parts:
        blocks(out)
    if "correlation" in parts:
        correlation(out, args.graphs)
    if "hamming" in parts:
        from benchmarks.stability.hamming import report_hamming, run_hamming

        report_hamming(run_hamming(), out)
    print(f"tables and plots in {out}")


if __name__ == "__main__":
    main()
