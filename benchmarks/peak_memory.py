"""Peak memory, estimated and measured: PeakMemory against the allocator on the corpus.

    .venv/bin/python benchmarks/peak_memory.py [--models gpt2,bert] [--quick] [--out PATH]

Per corpus model (``benchmarks/corpus.py``, inference on its example inputs): torch.export ->
``EGraph.from_fx`` -> ``saturate(load_rules("all"))`` -> ``extract(default_cost(inputs))``,
the program the backend's default cost picks. Columns: the
:class:`~extractors.peak.PeakMemory` estimate of the extracted program (the choice
:func:`compiler.fx.choose_program` makes, which extraction emits), the peak measured
while the emitted program runs (:func:`compiler.memory.peak_bytes`: every block torch's
allocator hands out, after a first call has computed its folded values), their ratio, and
whether the estimate is within :data:`TOLERANCE` of the measurement. Inputs and parameters
are counted by neither. ``--quick`` runs :data:`QUICK` with a shorter saturation (the
test's run). Written to benchmarks/results/peak_memory.md (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import corpus  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.fx import choose_program  # noqa: E402
from compiler.memory import peak_bytes  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors import PeakMemory  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
QUICK_LIMITS = dict(iter_limit=3, node_limit=20_000, time_limit=30.0)
QUICK = ("gpt2", "bert")
"""The models of ``--quick``: small, and their peaks set by different things (GPT-2's
logits; BERT's attention and feed-forward values)."""
TOLERANCE = 0.15
"""How far the estimate may be from the measured peak (a fraction of it)."""
COLUMNS = ["model", "estimate KiB", "measured KiB", "estimate / measured", "within 15%"]


def row_of(name: str, limits: dict) -> dict:
    """Model ``name``'s estimated and measured peak of the extracted program."""
    case = corpus.build(name)
    model, inputs = case.model.eval(), case.inputs
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, inputs)
        eg = EGraph.from_fx(program, inputs).saturate(load_rules("all"), **limits)
        cost = default_cost(inputs)
        estimate = PeakMemory().program_cost(eg, choose_program(eg, cost)[0])
        emitted = eg.extract(cost, validate="strict")
        emitted(*inputs)  # (the first call computes the folded values)
    measured = peak_bytes(emitted, *inputs)
    ratio = estimate / measured
    fell_back = emitted.meta["egraph_report"].fell_back
    return {"model": name + (" (fell back)" if fell_back else ""),
            "estimate KiB": f"{estimate / 1024:.1f}", "measured KiB": f"{measured / 1024:.1f}",
            "estimate / measured": f"{ratio:.3f}", "ratio": ratio,
            "within 15%": "yes" if abs(ratio - 1) <= TOLERANCE else "no"}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated corpus models (default: all of them)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(QUICK)} with a shorter saturation")
    add_out_option(parser, "peak_memory")
    args = parser.parse_args(argv)
    names = (args.models.split(",") if args.models
             else list(QUICK) if args.quick else list(corpus.MODELS))
    limits = QUICK_LIMITS if args.quick else LIMITS
    rows = []
    for name in names:
        rows.append(row_of(name, limits))
        print(markdown_table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
    within = sum(r["within 15%"] == "yes" for r in rows)
    body = (markdown_table(rows, COLUMNS)
            + f"\n\n{within} of {len(rows)} models within 15% of the measured peak.\n")
    write_results("peak_memory", "Peak memory: the PeakMemory estimate against the measured "
                  "peak of the emitted program", body, out=args.out,
                  argv=None if argv is None else [__file__, *argv])
    return rows


if __name__ == "__main__":
    main()
