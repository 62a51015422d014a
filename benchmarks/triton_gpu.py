"""Triton kernels on a GPU: eager vs torch.compile (Inductor) vs egraph (target="cuda").

One run, sized to fit a 10-minute device call: the naive suite (attention, softmax over a
50k vocabulary, layer norm, cross-entropy, a GELU MLP epilogue) and a GPT-2-small block,
in fp32 and bf16. Each case is built (from_fx -> saturate(all rules) ->
extract(Roofline("H200"), target="cuda")), checked against the float64 reference and
against eager, and timed next to eager and Inductor (triton.testing.do_bench medians);
each fused kernel's achieved bandwidth (bytes it reads and writes / its time) is compared
with a measured device-to-device copy. Targets: geometric mean at least Inductor's, at
least 3x eager on the naive suite, bandwidth-bound kernels at 80% of copy bandwidth or more.

Without a GPU, or with ``--check``, only the correctness part runs: small shapes, fp32 and
fp16 on the CPU, with TRITON_INTERPRET=1 so the generated kernels run in Triton's
interpreter.

    .venv/bin/python benchmarks/triton_gpu.py [--cases softmax,gpt2_block] [--dtypes fp32]
    .venv/bin/python benchmarks/triton_gpu.py --check        # CPU, interpreter

What it prints is written, stamped with the run (``benchmarks/report.py``), to
benchmarks/results/triton_gpu.md (``--out``); ``--json`` writes the rows as JSON too, after
each case (a run cut short keeps the rows it finished).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import Transcript, add_out_option, write_results  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.examples.zoo import GPTBlock  # noqa: E402


def naive_attention(q, k, v):
    """Attention written out: scores, exp without the max shift, normalise, weight."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    e = torch.exp(scores)
    return (e / e.sum(-1, keepdim=True)) @ v


def naive_softmax(x):
    """Softmax as exp / sum(exp)."""
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def naive_layer_norm(x, weight, bias):
    """Layer norm from its definition."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * weight + bias


def naive_cross_entropy(logits, target):
    """Cross-entropy as -log(softmax) picked at the targets, averaged."""
    e = torch.exp(logits)
    p = e / e.sum(-1, keepdim=True)
    return -torch.log(p.gather(-1, target.unsqueeze(-1))).mean()


class GeluMLP(nn.Module):
    """Linear, GELU from its tanh formula, linear: the epilogue after a matrix product."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        up = self.fc1(x)
        gelu = 0.5 * up * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (up + 0.044715 * up**3)))
        return self.fc2(gelu)


CASES = ("attention", "softmax", "layer_norm", "cross_entropy", "gelu_mlp", "gpt2_block")
NAIVE = CASES[:5]
"""The naive suite (the targets' 3x-eager set), then the GPT-2-small block."""

VOCAB = 50257


def build_case(name: str, dtype: torch.dtype, device: str, small: bool = False
               ) -> tuple[Callable, tuple]:
    """The function (or module) of a case and its inputs; ``small``: CPU-sized."""
    torch.manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    if name == "attention":
        b, h, t, d = (1, 2, 8, 16) if small else (8, 12, 1024, 64)
        return naive_attention, (randn(b, h, t, d), randn(b, h, t, d), randn(b, h, t, d))
    if name == "softmax":
        return naive_softmax, (randn(3 if small else 2048, VOCAB),)
    if name == "layer_norm":
        shape = (2, 5, 24) if small else (8, 1024, 768)
        return naive_layer_norm, (randn(*shape), randn(shape[-1]), randn(shape[-1]))
    if name == "cross_entropy":
        rows, vocab = (3, 300) if small else (2048, VOCAB)
        target = torch.randint(0, vocab, (rows,), device=device)
        return naive_cross_entropy, (randn(rows, vocab), target)
    if name == "gelu_mlp":
        rows, d = (6, 16) if small else (8 * 1024, 768)
        model = GeluMLP(d, 4 * d).to(device=device, dtype=dtype).eval()
        return model, (randn(rows, d),)
    if name == "gpt2_block":
        b, t, d, heads = (2, 8, 32, 2) if small else (8, 1024, 768, 12)
        model = GPTBlock(d, heads).to(device=device, dtype=dtype).eval()
        return model, (randn(b, t, d),)
    raise KeyError(f"no case {name!r}; cases: {', '.join(CASES)}")


def optimise(fn: Callable, inputs: tuple, saturate: bool = True, hardware: str = "H200"):
    """egraph's program for ``fn`` with Triton regions, validated against float64."""
    from egraph.rules import load_rules
    from extractors import Roofline

    source = fn if isinstance(fn, nn.Module) else torch.fx.symbolic_trace(fn)
    eg = EGraph.from_fx(source, inputs)
    if saturate:
        eg.saturate(load_rules("all"), iter_limit=10, node_limit=50_000, time_limit=60.0)
    return eg.extract(Roofline(hardware), target="cuda", validate="raise")


def _agrees(got, want, dtype: torch.dtype) -> bool:
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    scale = float(want.float().abs().max()) if want.numel() else 1.0
    return bool(((got.float() - want.float()).abs().max() <= tol * (1.0 + scale)).item())


def _median_ms(fn: Callable) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy of 1 GiB."""
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / (_median_ms(lambda: y.copy_(x)) / 1e3)


def _kernel_calls(gm, inputs) -> list[tuple]:
    """``(kernel, args, outputs)`` of every fused kernel call of one run of ``gm``."""
    from backends.triton import FusedKernel

    calls: list[tuple] = []

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            out = super().call_function(target, args, kwargs)
            if isinstance(target, FusedKernel):
                calls.append((target, args, out))
            return out

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return calls


def _nbytes(values) -> int:
    values = values if isinstance(values, (tuple, list)) else (values,)
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def run_case(name: str, dtype: torch.dtype, device: str, small: bool, inductor: bool,
             copy_bw: float | None) -> dict:
    """Build, check and (on a GPU) time one case."""
    fn, inputs = build_case(name, dtype, device, small)
    row: dict = {"case": name, "dtype": str(dtype).removeprefix("torch.")}
    t0 = time.perf_counter()
    ours = optimise(fn, inputs)
    row["build_s"] = round(time.perf_counter() - t0, 2)
    report = ours.meta["egraph_report"]
    with torch.no_grad():
        want, got = fn(*inputs), ours(*inputs)
    row["kernels"] = list(report.kernels)
    row["ok"] = bool(report.validation.ok) and _agrees(got, want, dtype)
    if device != "cuda":
        return row
    with torch.no_grad():
        row["eager_ms"] = _median_ms(lambda: fn(*inputs))
        row["ours_ms"] = _median_ms(lambda: ours(*inputs))
        if inductor:
            torch._dynamo.reset()
            compiled = torch.compile(fn)
            compiled(*inputs)
            row["inductor_ms"] = _median_ms(lambda: compiled(*inputs))
        row["bandwidth"] = []
        for kernel, args, out in _kernel_calls(ours, inputs):
            moved = _nbytes(args) + _nbytes(out)
            ms = _median_ms(lambda k=kernel, a=args: k.launch(*a))
            row["bandwidth"].append({"kernel": kernel.__name__, "bytes": moved, "ms": ms,
                                     "of_copy": moved / (ms / 1e3) / copy_bw})
    return row


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def describe(r: dict) -> list[str]:
    """One case's line, then one line per fused kernel with its bandwidth."""
    if "error" in r:
        return [f"{r['case']:<14} {r['dtype']:<9} ERROR    {r['error'][:200]}"]
    line = f"{r['case']:<14} {r['dtype']:<9} {'ok' if r['ok'] else 'MISMATCH':<8}"
    line += f" build {r['build_s']:6.2f} s  kernels {len(r['kernels'])}"
    if "ours_ms" in r:
        line += f"  eager {r['eager_ms']:8.3f}  ours {r['ours_ms']:8.3f} ms"
        line += f"  x{r['eager_ms'] / r['ours_ms']:.2f} vs eager"
        if "inductor_ms" in r:
            line += f"  inductor {r['inductor_ms']:8.3f} ms"
            line += f"  x{r['inductor_ms'] / r['ours_ms']:.2f} vs inductor"
    return [line] + [f"    {b['kernel']:<40} {b['bytes'] / 2**20:9.1f} MiB {b['ms']:8.3f} ms"
                     f"  {100 * b['of_copy']:5.1f}% of copy" for b in r.get("bandwidth", [])]


def targets(rows: list[dict], copy_bw: float) -> list[str]:
    """The geometric means and bandwidth fractions the targets are about."""
    lines = [f"copy bandwidth {copy_bw / 1e9:.0f} GB/s"]
    for dtype in sorted({r["dtype"] for r in rows}):
        naive = [r for r in rows if r["dtype"] == dtype and r["case"] in NAIVE]
        every = [r for r in rows if r["dtype"] == dtype]
        vs_eager = _geomean([r["eager_ms"] / r["ours_ms"] for r in naive])
        text = f"{dtype}: geomean x{vs_eager:.2f} vs eager on the naive suite (target 3)"
        with_inductor = [r for r in every if "inductor_ms" in r]
        if with_inductor:
            vs = _geomean([r["inductor_ms"] / r["ours_ms"] for r in with_inductor])
            text += f", x{vs:.2f} vs inductor over all cases (target 1)"
        lines.append(text)
    big = sorted(b["of_copy"] for r in rows for b in r["bandwidth"] if b["bytes"] >= 64 * 2**20)
    if big:
        lines.append(f"bandwidth-bound kernels (>= 64 MiB moved): {len(big)}, min "
                     f"{100 * big[0]:.1f}%, median {100 * big[len(big) // 2]:.1f}% of copy "
                     "(target 80%)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--check`` or without a GPU, its correctness part);
    0 when every case agrees with eager and the float64 reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dtypes", default=None,
                        help="fp32,bf16 on a GPU (default); fp32,fp16 for --check")
    parser.add_argument("--check", action="store_true",
                        help="correctness only, small shapes, CPU, Triton interpreter")
    parser.add_argument("--no-inductor", action="store_true")
    add_out_option(parser, "triton_gpu")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.check
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    dtypes = [names[d] for d in (args.dtypes or ("fp32,bf16" if gpu else "fp32,fp16")).split(",")]
    device = "cuda" if gpu else "cpu"
    copy_bw = copy_bandwidth(device) if gpu else None
    rows = []
    with Transcript() as printed:
        for name in args.cases.split(","):
            for dtype in dtypes:
                try:
                    rows.append(run_case(name, dtype, device, small=not gpu,
                                         inductor=gpu and not args.no_inductor,
                                         copy_bw=copy_bw))
                except Exception as exc:  # noqa: BLE001 - a row of the results, and go on
                    rows.append({"case": name, "dtype": str(dtype).removeprefix("torch."),
                                 "ok": False, "error": f"{type(exc).__name__}: {exc}"})
                    traceback.print_exc()
                print("\n".join(describe(rows[-1])), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
        if gpu:
            print("\n".join(targets([r for r in rows if "error" not in r], copy_bw)))
    title = ("Triton kernels: eager, Inductor and ours" if gpu else
             "Triton kernels: correctness in Triton's interpreter on the CPU")
    write_results("triton_gpu", title, printed.block(), out=args.out, device=device,
                  argv=None if argv is None else [__file__, *argv])
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
