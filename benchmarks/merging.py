"""Operator merging, measured: each model optimised with the whole rule library and with the
library less its merging rules (two linears, matmuls or convolutions sharing an input become
one op on concatenated weights, then a split), run times interleaved in one process.

    .venv/bin/python benchmarks/merging.py [--models bert,llama] [--repeat 30] [--out PATH]

Per model: the merges the emitted program uses, the run time of eager, of the program
without merging and with it (medians of interleaved rounds: each round times every variant
once, so drift in the machine's load falls on all of them alike), and the speedup merging
gives. Both programs come from ``torch.export`` -> ``EGraph.from_fx`` -> ``saturate`` ->
``extract(default_cost(inputs))`` (the time on this machine's profile; the default
extraction is DAG-aware, so a merged op is paid once, and exact on small e-graphs, so
three projections merge when only all three together pay), validated against float64.
``demo`` is the bundled naive transformer block of ``python -m compiler``. The table is
printed and written to benchmarks/results/merging.md (``--out``).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus import MODELS, build  # noqa: E402
from benchmarks.report import add_out_option, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.timing import interleaved_ms  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.examples.zoo import build as build_zoo  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from egraph.rules.merging import MERGING  # noqa: E402

LIMITS = {"iter_limit": 10, "node_limit": 50_000, "time_limit": 10.0}
TRANSFORMERS = tuple(m for m in MODELS if m not in ("vit", "clip_vision", "whisper_encoder"))


def optimise(model, inputs, rules, exported: bool):
    """The validated program of ``model`` under the default cost, and its report."""
    source = torch.export.export(model, inputs) if exported else model
    eg = EGraph.from_fx(source, inputs)
    eg.saturate(rules, **LIMITS)
    opt = eg.extract(default_cost(inputs), validate="strict")
    return opt, opt.meta["egraph_report"]


def run(name: str, repeat: int) -> dict:
    if name == "demo":
        model, inputs = build_zoo("naive_transformer")
        exported = False
    else:
        case = build(name)
        model, inputs, exported = case.model.eval(), case.inputs, True
    merging = {r.name for r in MERGING}
    everything = load_rules("all")
    without = [r for r in everything if r.name not in merging]
    row: dict = {"model": name}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, plain_report = optimise(model, inputs, without, exported)
        merged, report = optimise(model, inputs, everything, exported)
        torch.testing.assert_close(merged(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)
        row["merges"] = sum(n for rule, n in report.used.items() if rule in merging)
        row["fell_back"] = report.fell_back or plain_report.fell_back
        row.update(interleaved_ms({"eager": lambda: model(*inputs),
                                   "without": lambda: plain(*inputs),
                                   "with": lambda: merged(*inputs)}, repeat))
    row["speedup"] = row["without"] / row["with"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | merges used | eager ms | without merging ms | with merging ms | "
             "merging speedup |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        note = " (fell back)" if r["fell_back"] else ""
        lines.append(f"| {r['model']}{note} | {r['merges']} | {r['eager']:.3f} | "
                     f"{r['without']:.3f} | {r['with']:.3f} | {r['speedup']:.3f}x |")
    merged = [r["speedup"] for r in rows if r["merges"]]
    if merged:
        mean = math.exp(sum(map(math.log, merged)) / len(merged))
        lines.append(f"| geometric mean where merging is used ({len(merged)} models) | | | | "
                     f"| {mean:.3f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(("demo", *TRANSFORMERS)))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    add_out_option(parser, "merging")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        row = run(name, args.repeat)
        rows.append(row)
        print(f"{name:16s} merges {row['merges']:2d}  eager {row['eager']:.3f} ms  without "
              f"{row['without']:.3f} ms  with {row['with']:.3f} ms  ({row['speedup']:.3f}x)",
              flush=True)
    text = f"Medians of {args.repeat} interleaved rounds.\n\n{table(rows)}\n"
    print(text)
    write_results("merging", "Operator merging", text, out=args.out)


if __name__ == "__main__":
    main()
