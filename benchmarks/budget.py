"""Extraction under a memory budget on the corpus: its time and its distance from the bound.

    .venv/bin/python benchmarks/budget.py [--models gpt2,bert] [--real gpt2]
                                          [--budgets 0.75,0.5,least] [--seq 128]

Per model (the corpus of ``benchmarks/corpus.py``; ``--real`` adds entries of
``benchmarks/real_size.py`` at batch 1 and ``--seq``, such as GPT-2 small): torch.export ->
``EGraph.from_fx`` -> ``saturate(load_rules("all"))`` -> the program the default cost picks
(:func:`compiler.fx.choose_program`), its peak under :class:`~extractors.peak.PeakMemory`,
then :func:`egraph.extract.budget.within_budget` at each fraction of that peak, and at
the least peak of the time/peak frontier (``least``: the budget that buys the most memory
the e-graph offers), as ``extract(cost, memory_budget=...)`` runs it. Columns: the peak
found, its cost over the unbudgeted program's, how far it can be above the optimum
(``optimal``: proven; the bound is the ILP's over the e-nodes whose footprint fits, or the
unbudgeted optimum, see ``egraph.extract.budget``), the least peak any program can have
(where the footprints bound it), how many programs were measured, and the search's seconds
(measured beside other jobs on a shared machine). A budget no program meets shows the
smallest peak found. Written to
benchmarks/results/budget.md (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import corpus, real_size  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.fx import choose_program  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.extract import source_program  # noqa: E402
from egraph.extract.budget import MemoryBudgetError, frontier, within_budget  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors import PeakMemory  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
COLUMNS = ["model", "e-nodes", "peak KiB", "budget", "found KiB", "cost x", "above bound",
           "least KiB", "measured", "seconds"]


def saturated(case) -> EGraph:
    """``case``'s model through torch.export, ingest and the rule library."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(case.model.eval(), case.inputs)
        return EGraph.from_fx(program, case.inputs).saturate(load_rules("all"), **LIMITS)


def rows_of(name: str, case, budgets: list[str]) -> list[dict]:
    """One row per budget of ``case``: a fraction of its unbudgeted peak, or ``least``."""
    eg = saturated(case)
    cost = default_cost(case.inputs)
    picked, _, _, _, unbudgeted = choose_program(eg, cost)
    peak = PeakMemory().program_cost(eg, picked)
    starts = [picked, source_program(eg, cost)]
    rows = []
    for budget in budgets:
        if budget == "least":
            amount = frontier(eg, cost, PeakMemory(), starts, prefer=eg.initial)[-1].peak
        else:
            amount = float(budget) * peak
        row = {"model": name, "e-nodes": eg.num_nodes, "peak KiB": peak / 1024,
               "budget": budget if budget == "least" else f"{float(budget):.0%}"}
        start = time.perf_counter()
        try:
            found = within_budget(eg, cost, PeakMemory(), amount, starts, prefer=eg.initial)
        except MemoryBudgetError as error:
            row.update({"found KiB": f"none (smallest {error.smallest / 1024:.1f})",
                        "seconds": time.perf_counter() - start})
        else:
            gap = found.gap
            row.update({
                "found KiB": found.peak / 1024, "cost x": found.cost / unbudgeted,
                "above bound": "optimal" if found.optimal else "" if gap is None
                else f"{gap:.2%}",
                "least KiB": "" if found.peak_bound is None else found.peak_bound / 1024,
                "measured": found.candidates, "seconds": found.seconds})
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,bert,llama,t5_encoder,vit,resnet",
                        help="corpus models, comma-separated ('all': every one)")
    parser.add_argument("--real", default="", help="real-size models, comma-separated")
    parser.add_argument("--seq", type=int, default=128, help="the real-size sequence length")
    parser.add_argument("--budgets", default="0.75,0.5,least",
                        help="fractions of the unbudgeted program's peak, or 'least': the "
                             "least peak of the time/peak frontier")
    add_out_option(parser, "budget")
    args = parser.parse_args(argv)
    budgets = args.budgets.split(",")
    names = corpus.MODELS if args.models == "all" else [m for m in args.models.split(",") if m]
    torch.set_num_threads(1)
    rows = []
    for name in names:
        rows += rows_of(name, corpus.build(name), budgets)
    for name in filter(None, args.real.split(",")):
        rows += rows_of(f"{name} (real size)", real_size.build(name, 1, args.seq), budgets)
    rows = [{column: row.get(column, "") for column in COLUMNS} for row in rows]
    write_results("budget", "Extraction under a memory budget",
                  markdown_table(rows, COLUMNS), out=args.out)


if __name__ == "__main__":
    main()
