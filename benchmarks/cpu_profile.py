"""Does the CPU profile pick the faster program? Pairs of equivalent programs whose choice
the CPU cost model decides, each predicted (``Roofline("cpu", fused=False)``, the cost the
backend uses on CPU inputs) and measured, at sizes from in-cache to past the cache.

    .venv/bin/python benchmarks/cpu_profile.py [--repeat 51] [--threads 1]

The pairs are the choices extraction makes on real models: GPT-2's GELU whose tanh a
training step saves for the backward pass (the fused op computes the tanh again),
transformers' erf GELU written out, a Llama RMS norm whose reciprocal is saved, a softmax
written out, a logsumexp written out.
Each row gives both programs' predicted and measured times and whether the profile ranks
them as the machine does, for this profile and for the same profile without its cache and
per-element times (every byte at DRAM speed, every op at the FLOP peak: how the profile
priced them before). Times are medians of interleaved rounds, on one thread by default.
The table is printed and written, stamped with the run (``benchmarks/report.py``), to
benchmarks/results/cpu_profile.md (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_out_option, write_results  # noqa: E402
from compiler.timing import interleaved_ms  # noqa: E402
from egraph import EGraph  # noqa: E402
from extractors import Roofline  # noqa: E402
from extractors.hardware import HARDWARE  # noqa: E402

functional = torch.nn.functional


def _inner(x):
    return math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))


def gelu_fused(x):
    return functional.gelu(x, approximate="tanh"), torch.tanh(_inner(x))


def gelu_formula(x):
    t = torch.tanh(_inner(x))
    return 0.5 * x * (1.0 + t), t


def erf_gelu_fused(x):
    return functional.gelu(x)


def erf_gelu_formula(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def rms_fused(x, w):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return functional.rms_norm(x, (x.shape[-1],), w, 1e-6), r


def rms_formula(x, w):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * (x * r), r


def softmax_fused(x):
    return torch.softmax(x, -1)


def softmax_formula(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def logsumexp_fused(x):
    return torch.logsumexp(x, -1)


def logsumexp_formula(x):
    return torch.log(torch.exp(x).sum(-1))


PAIRS = {
    "gelu, tanh saved": (gelu_fused, gelu_formula, lambda s: (torch.randn(s),)),
    "gelu (erf), written out": (erf_gelu_fused, erf_gelu_formula, lambda s: (torch.randn(s),)),
    "rms_norm, 1/rms saved": (rms_fused, rms_formula,
                              lambda s: (torch.randn(s), torch.randn(s[-1]))),
    "softmax": (softmax_fused, softmax_formula, lambda s: (torch.randn(s),)),
    "logsumexp": (logsumexp_fused, logsumexp_formula, lambda s: (torch.randn(s),)),
}
SHAPES = ((2, 8, 512), (1, 128, 3072), (8, 128, 3072))
"""The corpus models' activations (in cache), GPT-2 small's MLP at 128 tokens (in the
L3 cache) and at 8 x 128 tokens (past it)."""


def predicted_ms(fn, inputs, profile) -> float:
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), inputs)
    return Roofline(profile, fused=False).program_cost(eg) * 1e3


def run(repeat: int) -> list[dict]:
    new = HARDWARE["cpu"]
    old = dataclasses.replace(new, cache_bytes=0.0, element_seconds=())
    rows = []
    for name, (fused, formula, make) in PAIRS.items():
        for shape in SHAPES:
            inputs = make(shape)
            measured = interleaved_ms({"fused": lambda f=fused, xs=inputs: f(*xs),
                                       "formula": lambda f=formula, xs=inputs: f(*xs)},
                                      repeat)
            row = {"pair": name, "shape": shape, "measured": measured}
            for label, profile in (("new", new), ("old", old)):
                p = {"fused": predicted_ms(fused, inputs, profile),
                     "formula": predicted_ms(formula, inputs, profile)}
                row[label] = p
                row[f"agrees_{label}"] = ((p["fused"] < p["formula"])
                                          == (measured["fused"] < measured["formula"]))
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| pair | shape | measured ms fused / formula | profile ms | agrees | "
             "old profile ms | agrees |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        m, n, o = r["measured"], r["new"], r["old"]
        lines.append(
            f"| {r['pair']} | {'x'.join(map(str, r['shape']))} | {m['fused']:.3f} / "
            f"{m['formula']:.3f} | {n['fused']:.3f} / {n['formula']:.3f} | "
            f"{'yes' if r['agrees_new'] else 'no'} | {o['fused']:.3f} / {o['formula']:.3f} | "
            f"{'yes' if r['agrees_old'] else 'no'} |")
    agree_new = sum(r["agrees_new"] for r in rows)
    agree_old = sum(r["agrees_old"] for r in rows)
    lines.append(f"\nThe profile ranks {agree_new} of {len(rows)} pairs as measured; "
                 f"without its cache and element times, {agree_old}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=51)
    parser.add_argument("--threads", type=int, default=1)
    add_out_option(parser, "cpu_profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text = table(run(args.repeat))
    print(text)
    write_results("cpu_profile", "Does the CPU profile pick the faster program?", text,
                  out=args.out)


if __name__ == "__main__":
    main()
