"""Extraction benchmark: greedy, DAG-aware and ILP extraction on extraction-gym's e-graphs.

Runs every method on every ``*.json`` file under FOLDER (default: the extraction-gym
data beside the checkout, ``../shared/data/extraction-gym``) and prints per file: nodes,
classes, then for ``greedy``, ``dag`` and ``ilp`` the tree cost, DAG cost and time
(seconds, loading included; ``ilp`` includes the ``dag`` run that warm-starts it),
whether the ILP proved optimality, and the gap of ``dag``'s DAG cost to the best known
(the ILP optimum where proven). Then the geometric-mean gaps and the totals.

    .venv/bin/python benchmarks/extraction_gym.py [FOLDER] [--ilp-time-limit 60]

What it prints is written, stamped with the run (``benchmarks/report.py``), to
benchmarks/results/extraction_gym.md (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import Transcript, add_out_option, write_results  # noqa: E402
from extractors import extract_serialized  # noqa: E402

DEFAULT_FOLDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "extraction-gym"
METHODS = ("greedy", "dag", "ilp")


def fmt(value) -> str:
    """A cost in at most 10 characters (tree costs can have hundreds of digits)."""
    if isinstance(value, int) and abs(value) >= 10 ** 9:
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"
    return f"{value:.6g}"


def gap(cost, best) -> float:
    """Relative excess of ``cost`` over ``best`` (0 when both are 0)."""
    if best == 0:
        return 0.0 if cost == 0 else math.inf
    return cost / best - 1.0


def geomean_gap(gaps: list[float]) -> float:
    return math.exp(sum(math.log1p(g) for g in gaps) / len(gaps)) - 1.0 if gaps else 0.0


def compare(folder: Path, files: list[Path], time_limit: float) -> None:
    """Print each method's costs and time on each of ``files`` (under ``folder``), then
    the gaps to the best known DAG cost and the totals; ``time_limit``: the ILP's seconds
    per file."""
    width = max(len(str(p.relative_to(folder))) for p in files) + 1
    head = f"{'file':<{width}}{'nodes':>7}{'classes':>8}"
    for method in METHODS:
        head += f"  {method + ' tree':>10}{'DAG':>10}{'s':>7}"
    print(head + f"{'optimal':>9}{'dag gap':>9}")
    rows = []
    for path in files:
        data = json.loads(path.read_text())
        results = {m: extract_serialized(data, m, time_limit=time_limit)
                   for m in METHODS}
        ilp = results["ilp"]
        best = ilp.dag_cost if ilp.optimal else min(r.dag_cost for r in results.values())
        row = {"file": str(path.relative_to(folder)), "nodes": len(data["nodes"]),
               "classes": len({str(n["eclass"]) for n in data["nodes"].values()}),
               "results": results, "best": best, "optimal": ilp.optimal,
               "gap": {m: gap(r.dag_cost, best) for m, r in results.items()}}
        rows.append(row)
        line = f"{row['file']:<{width}}{row['nodes']:>7}{row['classes']:>8}"
        for method in METHODS:
            r = results[method]
            line += f"  {fmt(r.tree_cost):>10}{fmt(r.dag_cost):>10}{r.time_s:>7.2f}"
        print(line + f"{'yes' if ilp.optimal else 'NO':>9}{row['gap']['dag']:>9.2%}", flush=True)

    print()
    for method in ("greedy", "dag"):
        print(f"geometric-mean gap of {method} to the best known DAG cost: "
              f"{geomean_gap([r['gap'][method] for r in rows]):.3%} "
              f"(worst {max(r['gap'][method] for r in rows):.2%})")
    for method in METHODS:
        total = sum(r["results"][method].time_s for r in rows)
        print(f"total time {method}: {total:.2f} s")
    proven = [r for r in rows if r["optimal"]]
    print(f"ILP proved optimal: {len(proven)} of {len(rows)} files")
    small = [r for r in rows if r["nodes"] < 6000]
    print(f"files under 6,000 nodes proven within {time_limit:g} s: "
          f"{sum(1 for r in small if r['optimal'])} of {len(small)}")
    tensat = [r for r in rows if r["file"].startswith("tensat")]
    if tensat:
        largest = max(tensat, key=lambda r: r["nodes"])
        print(f"dag on the largest tensat file ({largest['file']}, {largest['nodes']} nodes): "
              f"{largest['results']['dag'].time_s:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--ilp-time-limit", type=float, default=60.0,
                        help="seconds per file for the ILP solver")
    add_out_option(parser, "extraction_gym")
    args = parser.parse_args()
    files = sorted(args.folder.rglob("*.json"))
    if not files:
        sys.exit(f"no *.json files under {args.folder}")
    with Transcript() as printed:
        compare(args.folder, files, args.ilp_time_limit)
    write_results("extraction_gym", "Extraction: greedy, DAG-aware and ILP on "
                  "extraction-gym's e-graphs", printed.block(), out=args.out)


if __name__ == "__main__":
    main()
