"""Training memory, measured: the activations a training step keeps for its backward pass,
and the step's time, for eager, Inductor, Inductor under torch's activation memory budget,
checkpointing per layer, and the egraph backend (its own emission and Inductor's).

    .venv/bin/python benchmarks/memory.py [--models gpt2] [--layers 4] [--width 256]
        [--seq 256] [--batch 4] [--repeat 5] [--out PATH]

Activations are the bytes autograd saves for the backward (:func:`compiler.memory.saved_bytes`:
saved-tensor hooks, which see compiled graphs too; inputs and parameters not counted). The
step is forward and backward of the model's loss; its time is the median of interleaved
rounds (each round runs every system once, so drift in the machine's load falls on all of
them alike). Models come from transformers' configs with random weights, dropout off.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler.compile  # noqa: E402,F401  (registers the "egraph" backend)
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.memory import saved_bytes  # noqa: E402

MIB = 1 << 20


def gpt2(layers: int, width: int, seq: int) -> torch.nn.Module:
    """A GPT-2 language model from transformers' config, ``layers`` blocks of ``width``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64),
                        n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


MODELS = {"gpt2": gpt2}


def budgeted(budget: float) -> Callable:
    """Inductor under torch's activation memory budget ``budget``: a backend of its own,
    so that dynamo keeps its programs apart from default Inductor's (the budget is read
    when aot_autograd partitions the joint graph, inside Inductor's compilation)."""
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)

    return backend


def systems(model: torch.nn.Module) -> dict[str, Callable]:
    """Each system's step function: ``ids -> loss``."""
    def step_of(module: torch.nn.Module) -> Callable:
        return lambda ids: module(ids, labels=ids).loss

    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable({"use_reentrant": False})
    found = {"eager": step_of(model), "checkpoint per layer": step_of(checkpointed),
             "Inductor": step_of(torch.compile(copy.deepcopy(model)))}
    for budget in (0.5, 0.25):
        found[f"Inductor, budget {budget}"] = step_of(
            torch.compile(copy.deepcopy(model), backend=budgeted(budget)))
    found["egraph"] = step_of(torch.compile(copy.deepcopy(model), backend="egraph"))
    found["egraph + Inductor"] = step_of(torch.compile(
        copy.deepcopy(model), backend="egraph", options={"codegen": "inductor"}))
    return found


def measure(model: torch.nn.Module, ids: torch.Tensor, repeat: int) -> list[dict]:
    """One row per system: activations saved, step time, and both against Inductor's."""
    found = systems(model)
    rows = {}
    for name, step in found.items():
        started = time.perf_counter()
        step(ids).backward()  # (compiles the forward and the backward)
        first = time.perf_counter() - started
        rows[name] = {"system": name, "saved MiB": saved_bytes(step, ids) / MIB,
                      "first call s": first, "_times": []}
    for _ in range(repeat):
        for name, step in found.items():
            started = time.perf_counter()
            step(ids).backward()
            rows[name]["_times"].append(time.perf_counter() - started)
    reference = rows["Inductor"]
    base_ms = statistics.median(reference["_times"]) * 1e3
    for row in rows.values():
        row["step ms"] = statistics.median(row.pop("_times")) * 1e3
        row["saved / Inductor"] = row["saved MiB"] / reference["saved MiB"]
        row["time / Inductor"] = row["step ms"] / base_ms
    return list(rows.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    add_out_option(parser, "memory")
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64  # (one entry per system of one forward)
    sections = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = MODELS[name](args.layers, args.width, args.seq).train()
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq))
        rows = measure(model, ids, args.repeat)
        table = markdown_table(rows, ["system", "saved MiB", "saved / Inductor", "step ms",
                                      "time / Inductor", "first call s"])
        sections.append(f"## {name}: {args.layers} layers, width {args.width}, sequence "
                        f"{args.seq}, batch {args.batch}\n\n{table}")
        print(sections[-1], flush=True)
    write_results("memory", "Training memory: activations saved for the backward",
                  "\n\n".join(sections), out=args.out)


if __name__ == "__main__":
    main()
