"""Experiment 2: real blocks as people write them, on adversarial but realistic inputs.

Attention with large logits, layer norm on large activations (and on activations where
the naive form stays finite but cancels most of its bits), batch norm (eval), cross
entropy from probabilities with large logits, and a GPT-style block; fp32, fp16 and bf16
(float32's range with 8 bits: the fp32 magnitudes). Each is
rewritten by ``StabilityRewriter``; the error is the normwise relative error
``max|got - ref| / max|ref|`` against the float64 reference (inf where a finite reference
gets a non-finite value).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from compiler.stability import StabilityRewriter
from egraph.examples.zoo import NaiveTransformer


class NaiveAttention(nn.Module):
    """Scaled dot-product attention with the softmax written out."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
        return weights @ v


class NaiveLayerNorm(nn.Module):
    """Layer norm through E[x^2] - E[x]^2."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class NaiveCrossEntropy(nn.Module):
    """Cross-entropy from probabilities: -log(softmax(logits)[target]), averaged."""

    def forward(self, logits, target):
        probs = torch.softmax(logits, -1)
        return -torch.log(probs.gather(-1, target)).mean()


class BatchNormBlock(nn.Module):
    """A conv feature map through an eval-mode batch norm (already stable: must not get
    worse)."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x)


def _normwise(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.isfinite(got[finite]).all():
        return math.inf
    scale = ref[finite].abs().max()
    return float((got - ref)[finite].abs().max() / scale) if scale > 0 else 0.0


def _blocks(dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    half = dtype == torch.float16  # bfloat16 has float32's range, with 8 bits
    logit = 12.0 if half else 120.0  # large logits: exp overflows in the working dtype
    d = 64
    yield "attention", NaiveAttention(), tuple(
        torch.randn((2, 128, d), generator=g) * s for s in (math.sqrt(logit), math.sqrt(logit),
                                                            1.0))
    yield "layer-norm", NaiveLayerNorm(d), (torch.randn((8, 32, d), generator=g) * 0.5 + (
        300.0 if half else 3000.0),)
    # a smaller offset: the one-pass variance stays positive and the naive output finite,
    # but most of its bits cancel
    yield "layer-norm (finite)", NaiveLayerNorm(d), (torch.randn((8, 32, d), generator=g) * 0.5
                                                     + (10.0 if half else 100.0),)
    bn = BatchNormBlock(16).eval()
    with torch.no_grad():
        bn.bn.running_mean.uniform_(-1, 1, generator=g)
        bn.bn.running_var.uniform_(0.5, 2, generator=g)
    yield "batch-norm (eval)", bn, (torch.randn((4, 16, 8, 8), generator=g) * 50,)
    yield "cross-entropy", NaiveCrossEntropy(), (
        torch.randn((64, 1000), generator=g) * logit / 3,
        torch.randint(0, 1000, (64, 1), generator=g))
    torch.manual_seed(0)
    yield "gpt-style block", NaiveTransformer(d, 4 * d).eval(), (
        torch.randn((2, 64, d), generator=g) + (300.0 if half else 3000.0),)


def run_blocks() -> list[dict]:
    """One row per block and dtype: errors before and after, and the rewrites."""
    rewriter = StabilityRewriter()
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for name, module, inputs in _blocks(dtype):
            opt = rewriter.optimize(module, inputs, dtype=dtype)
            cast = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
            model = copy.deepcopy(module).to(dtype)
            ref_model = copy.deepcopy(module).to(torch.float64)
            with torch.no_grad():
                ref = ref_model(*[x.double() if x.is_floating_point() else x for x in inputs])
                before = model(*cast)
                after = opt(*cast)
            err_before, err_after = _normwise(before, ref), _normwise(after, ref)
            report = opt.meta["stability_report"]
            rows.append({
                "block": name, "dtype": str(dtype).removeprefix("torch."),
                "error_before": err_before, "error_after": err_after,
                "improvement": (err_before / err_after if err_after > 0 else math.inf)
                if math.isfinite(err_before) else math.inf,
                "rewrites": "; ".join(f"{r.before[:40]} -> {r.after[:40]}"
                                      for r in report.rewrites) or "-",
            })
    return rows
