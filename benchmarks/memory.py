"""Training memory, measured: what a training step keeps for its backward, its peak, and its
time, for eager, checkpointing per layer, Inductor, Inductor under torch's activation memory
budget, and the egraph backend under its own budgets (its own emission and Inductor's).

    .venv/bin/python benchmarks/memory.py [--models gpt2,bert] [--batch 1] [--seq 512]
        [--layers N] [--dropout P] [--systems NAME,...] [--rounds 5] [--tiny] [--out PATH]

Models are the real-size corpus's (:mod:`benchmarks.real_size`: published configs, random
weights), in training mode with dropout off, or at probability ``--dropout`` everywhere
the config has one; ``--layers`` shortens a transformer's stack (the activations per layer
are the published model's). The loss (:func:`loss_of`) is compiled with the model. Each
system's first step starts from one seed and, with dropout, Inductor draws eager's random
numbers (``fallback_random``), so that every row's gradients can be held to eager's.

Columns: ``saved MiB``, the bytes autograd keeps for the backward
(:func:`compiler.memory.saved_bytes`: saved-tensor hooks, which see compiled graphs too;
inputs and parameters not counted); ``peak MiB``, the step's peak allocation, forward and
backward (:func:`compiler.memory.training_peak_bytes`); ``step ms``, the median of
interleaved rounds (each round runs every system once, so drift in the machine's load falls
on all alike); ``recompute est. ms``, for the egraph backend's budgets, the time the
least recomputation that meets the budget adds to the step, as the partition's
mixed-integer program estimates it; ``grad error``, the largest gradient difference from
eager's relative to the largest gradient; ratios against Inductor's default partition. A
chart per model plots step time against saved memory: every system's point, and the egraph
backend's budgets as its frontier.
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
from benchmarks.corpus import TensorModel  # noqa: E402
from benchmarks.real_size import REAL_SIZE, SEED  # noqa: E402
from benchmarks.report import (  # noqa: E402
    RESULTS,
    add_out_option,
    markdown_table,
    write_results,
)
from compiler.compile import capture  # noqa: E402
from compiler.memory import saved_bytes, training_peak_bytes  # noqa: E402
from compiler.partition import UnmetMemoryBudget  # noqa: E402

MIB = 1 << 20
BUDGETS = (0.5, 0.33, 0.25, 0.1)
"""The budgets of the egraph rows (fractions of what the min-cut partition saves)."""
LAYER_FIELDS = ("n_layer", "num_hidden_layers", "num_layers", "encoder_layers")


def training_model(name: str, batch: int, seq: int, layers: int | None = None,
                   tiny: bool = False, dropout: float = 0.0
                   ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Corpus model ``name`` in training mode with every dropout probability ``dropout``
    (off by default), and its inputs; ``layers``: that many layers of a transformer's
    stack. ``nanogpt``: the plainly written GPT-2-small decoder of
    :mod:`benchmarks.nanogpt` (its attention written out over a ``tril`` buffer; no
    dropout), which no library's attention kernel reaches.

    >>> model, inputs = training_model("gpt2", 1, 8, tiny=True)
    >>> model.training, tuple(inputs[0].shape)
    (True, (1, 8))
    >>> model, inputs = training_model("nanogpt", 2, 8, layers=1, tiny=True)
    >>> tuple(model(*inputs).shape)
    (2, 8, 256)
    """
    if name == "nanogpt":
        from benchmarks.nanogpt import GPT, GPTConfig

        config = GPTConfig(block_size=seq, n_layer=12 if layers is None else layers,
                           **(dict(vocab_size=256, n_head=4, n_embd=64) if tiny else {}))
        torch.manual_seed(SEED)
        return GPT(config).train(), (torch.randint(0, config.vocab_size, (batch, seq)),)
    entry = REAL_SIZE[name]
    fields = entry.config(tiny)
    if layers is not None:
        fields[next(f for f in LAYER_FIELDS if f in fields)] = layers
    torch.manual_seed(SEED)
    model = TensorModel(entry.make(fields), entry.names, entry.outputs).train()
    for module in model.modules():
        for attribute, value in list(vars(module).items()):
            if "drop" in attribute and isinstance(value, float):
                setattr(module, attribute, dropout)
        if isinstance(module, torch.nn.Dropout):
            module.p = dropout
    return model, entry.draw(fields, batch, seq)


def loss_of(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The step's loss, part of what each system compiles: a language model's next-token
    cross entropy on its input ids, or the mean square of each floating output, summed.

    >>> model, inputs = training_model("gpt2", 1, 8, tiny=True)
    >>> float(loss_of(model)(*inputs).detach()) > 0
    True
    """
    def loss(*inputs: torch.Tensor) -> torch.Tensor:
        out = model(*inputs)
        if getattr(model, "outputs", None) == ("logits",) and not inputs[0].is_floating_point():
            ids = inputs[0]
            return torch.nn.functional.cross_entropy(
                out[:, :-1].reshape(-1, out.size(-1)).float(), ids[:, 1:].reshape(-1))
        outs = out if isinstance(out, tuple) else (out,)
        return sum(o.float().square().mean() for o in outs if o.is_floating_point())
    return loss


def torch_budget(budget: float) -> Callable:
    """Inductor under torch's activation memory budget ``budget``: a backend of its own,
    so that dynamo keeps its programs apart from default Inductor's (the budget is read
    when aot_autograd partitions the joint graph, inside Inductor's compilation)."""
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)

    return backend


def systems() -> dict[str, Callable[[torch.nn.Module], Callable[..., torch.Tensor]]]:
    """Each system: the step's loss function (:func:`loss_of`) for a fresh copy of the
    model, compiled whole (the loss inside the graph) where the system compiles."""
    def checkpointed(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
        inner = getattr(model, "model", model)
        if not getattr(inner, "supports_gradient_checkpointing", False):
            raise NotImplementedError("the model has no checkpointing per layer")
        inner.gradient_checkpointing_enable({"use_reentrant": False})
        return loss_of(model)

    found: dict[str, Callable] = {
        "eager": loss_of, "checkpoint per layer": checkpointed,
        "Inductor": lambda m: torch.compile(loss_of(m))}
    for budget in (0.5, 0.25, 0.1):
        found[f"Inductor torch-budget {budget}"] = (
            lambda m, b=budget: torch.compile(loss_of(m), backend=torch_budget(b)))
    for codegen, label in (("eager", "egraph"), ("inductor", "egraph + Inductor")):
        found[label] = lambda m, c=codegen: torch.compile(
            loss_of(m), backend="egraph", options={"codegen": c})
        for budget in BUDGETS:
            found[f"{label} budget {budget}"] = lambda m, c=codegen, b=budget: torch.compile(
                loss_of(m), backend="egraph", options={"codegen": c, "memory_budget": b})
    return found


def measure(model: torch.nn.Module, inputs: tuple, chosen: list[str], rounds: int,
            unmet: list[str] | None = None) -> list:
    """One row per system (see the module's docstring); a budget below the least a graph
    can save leaves its row out, its error appended to ``unmet``."""
    unmet = [] if unmet is None else unmet
    parameters = list(model.parameters())
    torch.manual_seed(SEED)  # (each system's first step draws eager's numbers)
    loss_of(model)(*inputs).backward()
    expected = [p.grad.clone() for p in parameters]
    scale = max(float(g.abs().max()) for g in expected) or 1.0
    steps, rows = {}, {}
    for name in chosen:
        copied = copy.deepcopy(model)
        copied.zero_grad(set_to_none=True)
        try:
            step = systems()[name](copied)
        except NotImplementedError as why:
            print(f"{name}: skipped ({why})", flush=True)
            continue
        torch.manual_seed(SEED)
        started = time.perf_counter()
        try:
            with capture() as seen:
                step(*inputs).backward()  # (compiles the forward and the backward)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            if not isinstance(error.inner_exception, UnmetMemoryBudget):
                raise
            print(f"{name}: {error.inner_exception}", flush=True)
            unmet.append(f"- {name}: {error.inner_exception}")
            continue
        first = time.perf_counter() - started
        error = max(float((p.grad - e).abs().max()) for p, e in zip(copied.parameters(),
                                                                    expected)) / scale
        kept = list(copied.parameters())
        decisions = [r.saved for r in seen.reports if getattr(r, "saved", None) is not None]
        rows[name] = {"system": name, "first call s": first, "grad error": error,
                      "saved MiB": saved_bytes(step, *inputs, parameters=kept) / MIB,
                      "peak MiB": training_peak_bytes(step, *inputs) / MIB, "_times": [],
                      "recompute est. ms": sum(d.recompute_seconds for d in decisions) * 1e3
                      if decisions else None}
        steps[name] = (step, copied)
        print(f"{name}: compiled in {first:.1f} s, saved {rows[name]['saved MiB']:.1f} MiB",
              flush=True)
    for _ in range(rounds):
        for name, (step, copied) in steps.items():
            copied.zero_grad(set_to_none=True)
            started = time.perf_counter()
            step(*inputs).backward()
            rows[name]["_times"].append(time.perf_counter() - started)
    reference = rows.get("Inductor") or next(iter(rows.values()))
    base_ms = statistics.median(reference["_times"]) * 1e3
    for row in rows.values():
        row["step ms"] = statistics.median(row.pop("_times")) * 1e3
        row["saved / Inductor"] = row["saved MiB"] / max(reference["saved MiB"], 1e-9)
        row["time / Inductor"] = row["step ms"] / base_ms
        if row["recompute est. ms"] is None:
            row["recompute est. ms"] = ""
    return list(rows.values())


def chart(name: str, rows: list[dict], path: Path) -> Path | None:
    """Step time against saved memory: every system's point, the egraph backend's budgets
    as its frontier (None without matplotlib)."""
    from compiler import charts

    try:
        (ax,) = charts.panels(1, columns=1, size=(7.0, 4.5))
    except charts.ChartsUnavailable:
        return None
    for row in rows:
        ax.scatter(row["saved MiB"], row["step ms"], label=row["system"])
    for label in ("egraph", "egraph + Inductor"):
        ours = sorted((r["saved MiB"], r["step ms"]) for r in rows
                      if r["system"] == label or r["system"].startswith(label + " budget"))
        if len(ours) > 1:
            ax.plot(*zip(*ours), linestyle="--", label=f"{label}: frontier")
    ax.set(xlabel="saved for the backward (MiB)", ylabel="step (ms)", title=name)
    ax.legend(fontsize="x-small")
    path.parent.mkdir(parents=True, exist_ok=True)
    return charts.save(ax.figure, path)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="every dropout's probability (0: off)")
    parser.add_argument("--systems", default=",".join(systems()))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the corpus's tiny configs")
    add_out_option(parser, "memory")
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64  # (one entry per system of one forward)
    # (torch's budget is not in the caches' keys: a cached default partition would answer)
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fallback_random = args.dropout > 0
    chosen = args.systems.split(",")
    unknown = sorted(set(chosen) - set(systems()))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(systems())}")
    sections, plots = [], []
    for name in args.models.split(","):
        model, inputs = training_model(name, args.batch, args.seq, args.layers, args.tiny,
                                       args.dropout)
        unmet: list[str] = []
        rows = measure(model, inputs, chosen, args.rounds, unmet)
        table = markdown_table(rows, ["system", "saved MiB", "saved / Inductor", "peak MiB",
                                      "step ms", "time / Inductor",
                                      "recompute est. ms", "grad error",
                                      "first call s"])
        shape = ", ".join(f"{tuple(x.shape)}" for x in inputs)
        sections.append(f"## {name}{'' if args.layers is None else f', {args.layers} layers'}"
                        f"{f', dropout {args.dropout}' if args.dropout else ''}"
                        f": inputs {shape}\n\n{table}"
                        + ("\n\nBudgets below the least a graph can save:\n" + "\n".join(unmet)
                           if unmet else ""))
        print(sections[-1], flush=True)
        plot = chart(name, rows, RESULTS / f"memory-{name}.svg")
        if plot is not None:
            plots.append(plot)
    write_results("memory", "Training memory: what a step saves for its backward, its peak "
                  "and its time", "\n\n".join(sections), out=args.out, plots=plots)


if __name__ == "__main__":
    main()
