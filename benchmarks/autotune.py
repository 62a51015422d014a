"""What autotuning buys: the default cost model's program against the program autotuning
keeps, timed on the real-size corpus, and what autotuning adds to the compile.

    .venv/bin/python benchmarks/autotune.py [--models gpt2,resnet50] [--rounds 40]
                                            [--threads N] [--quick]

Per model (``benchmarks/real_size.py`` at batch 1, sequences of 128 tokens, images at
224x224; ``--quick``: the tiny configs): the e-graph as ``benchmarks/cost_models.py``
makes it (torch.export, the whole rule library within its limits), extracted under the
inputs' default cost model twice, without and with ``autotune=True``
(:mod:`compiler.autotune`, its decisions forgotten first), each extraction's seconds
measured; then eager, the default's program and autotune's, timed in ``--rounds``
interleaved rounds (:func:`compiler.timing.interleaved_ms`). The table gives both
programs' times, their ratio, what autotuning measured (its programs timed, the kept
program's and the model's choice's medians) and its extra seconds; where autotuning kept
the default's program ("same program"), the two columns time one program twice: their
ratio is the noise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import real_size  # noqa: E402
from benchmarks.cost_models import SUBJECTS, build_subject, saturated  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.autotune import DECISIONS  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.timing import interleaved_ms  # noqa: E402

COLUMNS = ["model", "e-nodes", "eager ms", "default ms", "autotune ms",
           "autotune / default", "same program", "timed", "kept", "its ms (autotune's own)",
           "model's ms (autotune's own)", "extract s", "extract + autotune s"]


def run_model(name: str, quick: bool, rounds: int) -> dict:
    """One row of the table (the module docstring's steps)."""
    model, inputs = build_subject(name, quick)
    eg = saturated(model, inputs)
    cost = default_cost(inputs)
    start = time.perf_counter()
    default = eg.extract(cost)
    plain = time.perf_counter() - start
    DECISIONS.clear()
    start = time.perf_counter()
    tuned = eg.extract(cost, autotune=True)
    with_tuning = time.perf_counter() - start
    report = tuned.meta["egraph_report"].autotune
    with torch.no_grad():
        ms = interleaved_ms({"eager": lambda: model(*inputs),
                             "default": lambda: default(*inputs),
                             "autotune": lambda: tuned(*inputs)}, rounds)
    print(report, flush=True)
    return {"model": name, "e-nodes": eg.num_nodes, "eager ms": ms["eager"],
            "default ms": ms["default"], "autotune ms": ms["autotune"],
            "autotune / default": ms["autotune"] / ms["default"],
            "same program": "yes" if tuned.code == default.code else "no", "timed": report.timed,
            "kept": report.chosen, "its ms (autotune's own)": report.chosen_ms,
            "model's ms (autotune's own)": report.model_ms, "extract s": plain,
            "extract + autotune s": with_tuning}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SUBJECTS),
                        help=f"comma-separated, of: {', '.join(real_size.MODELS)}")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved timing rounds (default 40; --quick 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="the models' tiny configs")
    add_out_option(parser, "autotune")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (5 if args.quick else 40)
    rows = []
    for name in args.models.split(","):
        rows.append(run_model(name, args.quick, rounds))
        print(markdown_table(rows[-1:], COLUMNS), flush=True)
    write_results("autotune", "Autotuning against the default cost model's program",
                  markdown_table(rows, COLUMNS), out=args.out)


if __name__ == "__main__":
    main()
