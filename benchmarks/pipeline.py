"""Pipeline benchmark: from_fx -> saturate -> extract -> emit on the model zoo, in one run
with torch.compile's cold compile time and eager vs optimised run time.

    .venv/bin/python benchmarks/pipeline.py [--models mlp,gpt2_small] [--no-inductor]

Per model it prints: ingest (from_fx), saturate (with the rules available: ``--rules``
names a set of ``egraph.rules.load_rules`` once it exists, otherwise none), extract+emit,
validation (timed separately), the pipeline total (without validation), torch.compile's
cold compile time (Inductor, measured on the first call after a reset), and the median
eager and optimised run times. The table is written, stamped with the run
(``benchmarks/report.py``), to benchmarks/results/pipeline.md (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# A cold compile means no Inductor cache from an earlier run.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import Transcript, add_out_option, write_results  # noqa: E402
from compiler.timing import median_seconds  # noqa: E402
from egraph import AstSize, EGraph  # noqa: E402
from egraph.examples.zoo import MODELS, build  # noqa: E402


def _rules(name: str | None):
    if not name:
        return []
    from egraph.rules import load_rules

    return load_rules(name)


def run(name: str, rules, inductor: bool) -> dict:
    """Time each stage for one zoo model."""
    model, inputs = build(name)
    out: dict = {"model": name}
    with torch.no_grad():
        t0 = time.perf_counter()
        eg = EGraph.from_fx(model, inputs)
        t1 = time.perf_counter()
        if rules:
            eg.saturate(rules, iter_limit=8, node_limit=100_000, time_limit=30.0)
        t2 = time.perf_counter()
        opt = eg.extract(AstSize(), validate="off")
        t3 = time.perf_counter()
        from compiler.validate import validate_module

        check = validate_module(eg.fx, opt)
        t4 = time.perf_counter()
        out.update(ingest=t1 - t0, saturate=t2 - t1, extract=t3 - t2, validate=t4 - t3,
                   pipeline=t3 - t0, valid=check.ok, classes=eg.num_classes,
                   nodes=eg.num_nodes)
        out["eager"] = median_seconds(lambda: model(*inputs))
        out["optimised"] = median_seconds(lambda: opt(*inputs))
        if inductor:
            torch._dynamo.reset()
            torch._inductor.config.force_disable_caches = True
            compiled = torch.compile(model)
            t5 = time.perf_counter()
            compiled(*inputs)
            out["inductor_cold"] = time.perf_counter() - t5
            out["inductor"] = median_seconds(lambda: compiled(*inputs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS + ("gpt2_small",)))
    parser.add_argument("--rules", default=None, help="a rule set name for load_rules")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_out_option(parser, "pipeline")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rules = _rules(args.rules)
    # One-time costs of the first ingest (fake-tensor machinery) are not any model's.
    EGraph.from_fx(torch.nn.Linear(2, 2), (torch.randn(1, 2),)).extract(AstSize())
    cols = ["ingest", "saturate", "extract", "pipeline", "validate", "inductor_cold", "eager",
            "optimised", "inductor"]
    with Transcript() as printed:
        print(f"{'model':<20}" + "".join(f"{c:>14}" for c in cols) + f"{'opt/eager':>11}"
              f"{'valid':>7}")
        for name in args.models.split(","):
            r = run(name, rules, not args.no_inductor)
            cells = "".join(
                (f"{r[c] * 1e3:>14.3f}" if c in ("eager", "optimised", "inductor") else
                 f"{r[c]:>14.4f}") if c in r else f"{'-':>14}" for c in cols)
            print(f"{name:<20}{cells}{r['optimised'] / r['eager']:>11.3f}"
                  f"{str(r['valid']):>7}", flush=True)
        print("\nseconds, except eager/optimised/inductor: median run times in ms; pipeline = "
              "ingest + saturate + extract/emit (validation separate)")
    write_results("pipeline", "Pipeline: from_fx, saturate, extract and emit on the model zoo",
                  printed.block(), out=args.out)


if __name__ == "__main__":
    main()
