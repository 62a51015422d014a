"""Mixed precision as users write it on the CPU: a training step of each corpus model
(benchmarks/corpus.py) inside ``torch.autocast("cpu", dtype)``, or with the model cast
whole to the dtype, through ``torch.compile`` with the backend (rules ``all``,
``validate="raise"``: a fallback is a failure here), against eager's own step.

    .venv/bin/python benchmarks/mixed_precision.py [--models gpt2,t5] [--dtype bfloat16]
                                                   [--mode autocast|cast]

One row per model: whether the step works (or the exception), the loss in float32, of
eager's low-precision step and of ours, and the worst parameter's gradient error: each
gradient's normwise error from the float32 step's, ours over eager's own (floored at
1e-3, so that a gradient both get right to rounding does not count). 1.00 is eager's
accuracy; validation lets a rewrite be at most twice as far from float64 as the source.
The loss is the outputs' sum weighted by fixed random tensors, so every parameter gets a
gradient (a layer-normed output's mean square has almost none). The table is printed and
written to benchmarks/results/mixed_precision.md (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.corpus import MODELS, build  # noqa: E402
from benchmarks.report import add_out_option, write_results  # noqa: E402
from compiler.compile import make_backend  # noqa: E402
from egraph.logs import progress  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

GRADIENT_FLOOR = 1e-3
"""Eager's gradient error below this counts as this: the ratio then measures errors
above bfloat16's rounding of a well-computed gradient, not noise over noise."""


def _floating(out) -> list[torch.Tensor]:
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in out if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _step(model, inputs: tuple, weights: list[torch.Tensor], precision) -> tuple:
    """A training step's loss and float32 gradients by parameter name."""
    model.zero_grad(set_to_none=True)
    with precision():
        outputs = _floating(model(*inputs))
    loss = sum((o.float() * w).sum() for o, w in zip(outputs, weights))
    loss.backward()
    module = getattr(model, "_orig_mod", model)
    return loss.item(), {name: p.grad.float().clone() for name, p in module.named_parameters()
                         if p.grad is not None}


def measure(name: str, dtype: torch.dtype, mode: str, rules) -> dict:
    """One corpus model's row (see the module's docstring)."""
    row = {"model": name}
    start = time.perf_counter()
    try:
        case = build(name)
        model = case.model.train()
        with torch.no_grad():
            torch.manual_seed(1)
            weights = [torch.randn(o.shape) for o in _floating(model(*case.inputs))]
        full, full_grads = _step(model, case.inputs, weights, torch.enable_grad)
        if mode == "autocast":
            low, inputs = model, case.inputs

            def precision():
                return torch.autocast("cpu", dtype=dtype)
        else:
            low, precision = copy.deepcopy(model).to(dtype), torch.enable_grad
            inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                           else x for x in case.inputs)
        eager, eager_grads = _step(low, inputs, weights, precision)
        torch._dynamo.reset()
        backend = make_backend(rules=rules, validate="raise", iter_limit=4)
        ours, our_grads = _step(torch.compile(low, backend=backend), inputs, weights,
                                precision)
        worst, at = 0.0, ""
        for key, grad in full_grads.items():
            scale = grad.norm().item()
            if scale == 0:
                continue
            theirs = (eager_grads[key] - grad).norm().item() / scale
            mine = (our_grads[key] - grad).norm().item() / scale
            ratio = mine / max(theirs, GRADIENT_FLOOR)
            if ratio > worst:
                worst, at = ratio, key
        row.update(status="ok", loss=full, eager=eager, ours=ours, ratio=worst, at=at)
    except Exception as error:  # noqa: BLE001 - a row reports it
        row["status"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    row["seconds"] = time.perf_counter() - start
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | works | loss float32 | loss eager | loss ours | worst gradient error, "
             "ours / eager | at | s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['status']} |  |  |  |  |  | "
                         f"{r['seconds']:.1f} |")
            continue
        lines.append(f"| {r['model']} | ok | {r['loss']:.5g} | {r['eager']:.5g} | "
                     f"{r['ours']:.5g} | {r['ratio']:.2f} | {r['at']} | {r['seconds']:.1f} |")
    ok = [r for r in rows if r["status"] == "ok"]
    worst = max((r["ratio"] for r in ok), default=float("nan"))
    lines.append(f"| **all** | **{len(ok)}/{len(rows)} ok** |  |  |  | **{worst:.2f}** |  |  |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--mode", default="autocast", choices=("autocast", "cast"),
                        help="autocast: the step inside torch.autocast; cast: the model and "
                             "its floating inputs cast whole to the dtype")
    add_out_option(parser, "mixed_precision")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model: {', '.join(unknown)}")
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    rules, dtype = load_rules("all"), getattr(torch, args.dtype)
    rows = []
    for name in progress(names, desc="models", unit="model"):
        rows.append(measure(name, dtype, args.mode, rules))
        r = rows[-1]
        print(f"{name:<16} {r['status'][:70]:<70} "
              f"{r.get('ratio', float('nan')):.2f} {r['seconds']:.1f} s", flush=True)
    text = table(rows)
    print(text)
    write_results("mixed_precision", f"Mixed precision: {args.mode} {args.dtype}, training "
                  "steps", text, out=args.out)


if __name__ == "__main__":
    main()
