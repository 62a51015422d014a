"""The naive suite on the CPU: programs written the way people write them, in several
spellings each, timed against eager and torch.compile (Inductor) in one run.

    .venv/bin/python benchmarks/naive_suite.py [--cases attention,layer_norm] [--repeat 10]
                                               [--threads 1] [--no-inductor]

Families: attention (the GPU suite's unshifted softmax, nanoGPT's causal buffer with
``masked_fill(bias == 0, -inf)``, a bool mask with ``~mask`` and a manual max-shifted
softmax, transformers' eager attention with an additive mask), layer norm (the definition,
the centred value squared as ``xc * xc``, timm's ConvNeXt spelling, ``var_mean`` with
``rsqrt``), cross-entropy (softmax then log then gather, the max-shifted softmax,
``log_softmax`` pieces), a GELU MLP (tanh and erf formulas, a SwiGLU with SiLU written
out), duplicate computations (the same subexpression written twice) and matrix chains
(products whose order the e-graph changes).

Each spelling runs four ways: eager; ``torch.compile`` (Inductor, its default mode);
ours, ``torch.compile(backend=make_backend())`` (the whole rule library, the CPU cost
model, eager torch calls emitted); ours + Inductor, ``make_backend(codegen="inductor")``
(the optimised graph handed to Inductor's code generation). Each is checked against eager
(normwise relative error at most 1e-4, else marked wrong) and timed as the median of
``--repeat`` calls after a warm-up, with one intra-op thread unless ``--threads``. The
machine is shared, so absolute times move between runs; the ratios in one run are what to
read. Geometric means of the speedups over eager close the table, for ours alone and for
the better of ours and ours + Inductor per spelling. The table is printed and written to
benchmarks/results/naive_suite.md (``--out``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import add_out_option, write_results  # noqa: E402
from benchmarks.triton_gpu import (  # noqa: E402
    GeluMLP,
    naive_attention,
    naive_cross_entropy,
    naive_layer_norm,
)
from compiler.compile import make_backend  # noqa: E402
from compiler.timing import median_seconds  # noqa: E402

B, H, T, D = 4, 8, 256, 64          # attention: batch, heads, sequence, head size
ROWS, WIDTH = (16, 256), 1024        # layer norm rows and width
VOCAB = 8192                         # cross-entropy classes (512 rows)
MLP_D, MLP_HIDDEN = 256, 1024        # GELU MLP (a 512-token batch)


# -- attention -------------------------------------------------------------------------------

class NanoGPTCausal(nn.Module):
    """nanoGPT's manual attention: a tril buffer, ``masked_fill(bias == 0, -inf)``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class ManualSoftmaxCausal(nn.Module):
    """A bool mask, ``masked_fill(~mask, -inf)`` and a manual max-shifted softmax, for
    sequences of ``size``."""

    def __init__(self, size: int = T):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(size, size, dtype=torch.bool)))

    def forward(self, q, k, v):
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~self.mask, float("-inf"))
        att = torch.exp(att - att.amax(-1, keepdim=True))
        return (att / att.sum(-1, keepdim=True)) @ v


def hf_eager_attention(q, k, v, attention_mask):
    """transformers' eager_attention_forward with an additive causal mask."""
    attn_weights = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    attn_weights = attn_weights + attention_mask[:, :, :, : k.shape[-2]]
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)


def _qkv():
    return tuple(torch.randn(B, H, T, D) for _ in range(3))


def _additive_mask():
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool))
    return torch.zeros(1, 1, T, T).masked_fill(~keep, torch.finfo(torch.float32).min)


# -- layer norm --------------------------------------------------------------------------------

def centred_squared(x, weight, bias):
    """The issue's spelling: the centred value shared, squared as ``xc * xc``."""
    xc = x - x.mean(-1, keepdim=True)
    return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + 1e-5) * weight + bias


def timm_channels_last(x, weight, bias):
    """timm's ConvNeXt LayerNorm written out."""
    u = x.mean(-1, keepdim=True)
    s = (x - u).pow(2).mean(-1, keepdim=True)
    return weight * ((x - u) / torch.sqrt(s + 1e-5)) + bias


def var_mean_rsqrt(x, weight, bias):
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + 1e-5) * weight + bias


def _rows():
    return torch.randn(*ROWS, WIDTH), torch.randn(WIDTH), torch.randn(WIDTH)


# -- cross-entropy -----------------------------------------------------------------------------

def shifted_cross_entropy(logits, target):
    e = torch.exp(logits - logits.amax(-1, keepdim=True))
    p = e / e.sum(-1, keepdim=True)
    return -torch.log(p).gather(-1, target.unsqueeze(-1)).mean()


def log_softmax_pieces(logits, target):
    logp = logits - torch.logsumexp(logits, -1, keepdim=True)
    return -logp.gather(-1, target.unsqueeze(-1)).mean()


def _logits():
    return torch.randn(512, VOCAB), torch.randint(0, VOCAB, (512,))


# -- MLPs --------------------------------------------------------------------------------------

class ErfMLP(GeluMLP):
    """transformers' GELUActivation written in Python (erf) between two linears."""

    def forward(self, x):
        up = self.fc1(x)
        return self.fc2(up * 0.5 * (1.0 + torch.erf(up / math.sqrt(2.0))))


class SwiGLU(nn.Module):
    """A Llama MLP with SiLU written out: down(silu(gate(x)) * up(x))."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        g = self.gate(x)
        return self.down(g / (1 + torch.exp(-g)) * self.up(x))


def _tokens():
    return (torch.randn(512, MLP_D),)


# -- duplicate computations and matrix chains --------------------------------------------------

def repeated_softplus(x):
    """The same stable-softplus subexpression written three times."""
    a = torch.log(1 + torch.exp(x)) * 2
    b = torch.log(1 + torch.exp(x)) + torch.exp(x)
    return a + b * torch.log(1 + torch.exp(x))


def repeated_projection(x, w):
    """A projection and its activation computed twice, as unrolled code often does."""
    return torch.relu(x @ w) * torch.sigmoid(x @ w) + torch.relu(x @ w)


def chain_left_heavy(a, b, c):
    """(A B) c: a large product first, where A (B c) needs two matrix-vector products."""
    return (a @ b) @ c


def chain_low_rank(x, u, v, w):
    """x (U V) W with a rank-64 U V: reassociated, no 1024 x 1024 product is formed."""
    return x @ (u @ v) @ w


CASES: dict[str, list[tuple[str, Callable, Callable]]] = {
    "attention": [
        ("unshifted softmax (GPU suite)", lambda: naive_attention, _qkv),
        ("nanoGPT causal buffer", NanoGPTCausal, _qkv),
        ("~mask, manual max-shifted softmax", ManualSoftmaxCausal, _qkv),
        ("transformers eager, additive mask", lambda: hf_eager_attention,
         lambda: (*_qkv(), _additive_mask())),
    ],
    "layer_norm": [
        ("definition with (x - mean) ** 2", lambda: naive_layer_norm, _rows),
        ("xc * xc (the issue's)", lambda: centred_squared, _rows),
        ("timm ConvNeXt", lambda: timm_channels_last, _rows),
        ("var_mean and rsqrt", lambda: var_mean_rsqrt, _rows),
    ],
    "cross_entropy": [
        ("-log(softmax) gathered (GPU suite)", lambda: naive_cross_entropy, _logits),
        ("max-shifted softmax", lambda: shifted_cross_entropy, _logits),
        ("logsumexp pieces", lambda: log_softmax_pieces, _logits),
    ],
    "mlp": [
        ("GELU tanh formula (GPU suite)", lambda: GeluMLP(MLP_D, MLP_HIDDEN), _tokens),
        ("GELU erf, transformers' Python GELU", lambda: ErfMLP(MLP_D, MLP_HIDDEN), _tokens),
        ("SwiGLU with SiLU as x / (1 + exp(-x))", lambda: SwiGLU(MLP_D, MLP_HIDDEN), _tokens),
    ],
    "duplicates": [
        ("softplus written three times", lambda: repeated_softplus,
         lambda: (torch.randn(2048, 1024),)),
        ("projection written three times", lambda: repeated_projection,
         lambda: (torch.randn(1024, 512), torch.randn(512, 512))),
    ],
    "matrix_chains": [
        ("(A B) c", lambda: chain_left_heavy,
         lambda: (torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(1024, 1))),
        ("x (U V) W, rank 64", lambda: chain_low_rank,
         lambda: (torch.randn(256, 1024), torch.randn(1024, 64), torch.randn(64, 1024),
                  torch.randn(1024, 256))),
    ],
}


def _ways(inductor: bool) -> dict[str, Callable]:
    ways = {"eager": lambda f: f,
            "ours": lambda f: torch.compile(f, backend=make_backend(), dynamic=False)}
    if inductor:
        ways["compile"] = lambda f: torch.compile(f, dynamic=False)
        ways["ours+inductor"] = lambda f: torch.compile(
            f, backend=make_backend(codegen="inductor"), dynamic=False)
    return ways


def _run(build: Callable, make_inputs: Callable, ways: dict, repeat: int) -> dict:
    torch.manual_seed(0)
    fn, inputs = build(), make_inputs()
    if isinstance(fn, nn.Module):
        fn.eval()
    with torch.no_grad():
        expected = fn(*inputs)
        row: dict = {}
        for name, wrap in ways.items():
            torch._dynamo.reset()
            start = time.perf_counter()
            compiled = wrap(fn)
            got = compiled(*inputs)
            row[f"{name}_first_s"] = time.perf_counter() - start
            # Normwise: a reassociated product differs elementwise where entries cancel.
            if (got - expected).norm() > 1e-4 * expected.norm():
                row[f"{name}_ok"] = False
            row[name] = median_seconds(lambda c=compiled: c(*inputs), repeat)
    return row


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-inductor", action="store_true")
    add_out_option(parser, "naive_suite")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    ways = _ways(not args.no_inductor)
    lines = [
        "The machine is shared: read the ratios, taken in one run.", "",
        "| family | spelling | eager ms | " + " | ".join(
            f"{w} ms" for w in ways if w != "eager") + " | ours / eager | best ours / eager"
        " | compile / eager |",
        "|" + "---|" * (len(ways) + 5)]
    ours, best, inductor = [], [], []
    for family in args.cases.split(","):
        for label, build, make_inputs in CASES[family]:
            row = _run(build, make_inputs, ways, args.repeat)
            eager = row["eager"]
            cells = [f"{row[w] * 1e3:.2f}" + ("" if row.get(f"{w}_ok", True) else " (wrong)")
                     for w in ways if w != "eager"]
            ours.append(eager / row["ours"])
            fastest = min(row[w] for w in ("ours", "ours+inductor") if w in row)
            best.append(eager / fastest)
            if "compile" in row:
                inductor.append(eager / row["compile"])
            line = (f"| {family} | {label} | {eager * 1e3:.2f} | " + " | ".join(cells)
                    + f" | {ours[-1]:.2f}x | {best[-1]:.2f}x | "
                    + (f"{inductor[-1]:.2f}x |" if "compile" in row else "- |"))
            print(line, flush=True)
            lines.append(line)
    summary = (f"\nGeometric mean speedup over eager: ours {_geomean(ours):.2f}x, best of ours "
               f"and ours + Inductor {_geomean(best):.2f}x, torch.compile "
               f"{_geomean(inductor):.2f}x ({len(ours)} spellings).")
    print(summary)
    lines.append(summary)
    write_results("naive_suite", "The naive suite on the CPU", "\n".join(lines), out=args.out,
                  argv=None if argv is None else [__file__, *argv])


if __name__ == "__main__":
    main()
