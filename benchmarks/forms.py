"""What choosing a training graph's form with what it saves buys (:mod:`compiler.forms`):
the same backend, budget and model, trained in the form chosen among the source and the
e-graph's programs, and in the source's form only, step times interleaved in one process.

    .venv/bin/python benchmarks/forms.py [--model nanogpt] [--layers 4] [--seq 512]
        [--budgets 0.5,0.33] [--codegens eager,inductor] [--rounds 5] [--tiny]

Models are :func:`benchmarks.memory.training_model`'s (``nanogpt``: the plainly written
decoder, its attention over a ``tril`` buffer). Both rows of a pair hold the same budget in
bytes (a fraction of what the min-cut partitioner saves for the source's joint graph);
each row gives the form trained, the bytes its partition saves, and the step's median time
over interleaved rounds, against the source-only row's.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler.compile as backend_module  # noqa: E402
from benchmarks.memory import loss_of, training_model  # noqa: E402


def source_form_only(gm, example_inputs, options, fused=False):
    """:func:`compiler.forms.training_forms` with the source as the only form."""
    return {"source": gm}


def pair(model: torch.nn.Module, inputs: tuple, codegen: str, budget: float,
         rounds: int) -> list[dict]:
    """The two rows of one budget: the forms searched, and the source's form only."""
    searched = backend_module.training_forms
    steps = {}
    for label, forms in (("source's form", source_form_only), ("forms searched", searched)):
        backend_module.training_forms = forms
        try:
            copied = copy.deepcopy(model)
            backend = backend_module.make_backend(codegen=codegen, memory_budget=budget)
            step = torch.compile(loss_of(copied), backend=backend)
            step(*inputs).backward()
        finally:
            backend_module.training_forms = searched
        (decision,) = [r.saved for r in backend.reports if r.saved is not None]
        steps[label] = (step, copied, decision, [])
    for _ in range(rounds):
        for step, copied, _, times in steps.values():
            copied.zero_grad(set_to_none=True)
            started = time.perf_counter()
            step(*inputs).backward()
            times.append(time.perf_counter() - started)
    base = statistics.median(steps["source's form"][3])
    return [{"codegen": codegen, "budget": budget, "system": label,
             "form": decision.form.name, "saved MiB": decision.saved_bytes / 2**20,
             "step ms": statistics.median(times) * 1e3,
             "ratio": statistics.median(times) / base}
            for label, (_, _, decision, times) in steps.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nanogpt")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--budgets", default="0.5,0.33")
    parser.add_argument("--codegens", default="eager,inductor")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    model, inputs = training_model(args.model, args.batch, args.seq, args.layers, args.tiny)
    print("| codegen | budget | system | form | saved MiB | step ms | time / source's form |")
    print("|---|---:|---|---|---:|---:|---:|")
    for codegen in args.codegens.split(","):
        for budget in map(float, args.budgets.split(",")):
            for row in pair(model, inputs, codegen, budget, args.rounds):
                print(f"| {row['codegen']} | {row['budget']:g} | {row['system']} | "
                      f"{row['form']} | {row['saved MiB']:.1f} | {row['step ms']:.1f} | "
                      f"{row['ratio']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
