"""A plainly written GPT-2-small decoder in nanoGPT's form (Karpathy's ``model.py``): the
causal mask a registered ``tril`` buffer filled with ``-inf``, the softmax written out as
``exp(att - att.max(-1).values) / sum`` (or ``F.softmax``), a GELU MLP, LayerNorm, a tied
``lm_head``. Random weights, never downloaded; batch 1, inference.

    .venv/bin/python benchmarks/nanogpt.py [--layers 12] [--seq 128] [--softmax manual|F]
                                           [--repeat 10] [--threads 2]

Prints the pipeline's seconds in a fresh process (validation on, counted from the first
import of the project, torch already imported) for both entry points, then the run time
of eager, ``torch.compile(backend="egraph")`` and ``EGraph.from_fx(torch.export(...))
.saturate().extract()`` (medians of interleaved rounds, each output checked against
eager's), and the attention line of the program extracted.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402


@dataclass
class GPTConfig:
    """GPT-2 small's shape (nanoGPT's defaults, the vocabulary padded to 50304)."""

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    softmax: str = "manual"       # "manual": exp(att - max) / sum; "F": F.softmax


class CausalSelfAttention(nn.Module):
    """nanoGPT's slow attention path: the scores masked by the ``bias`` buffer."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.softmax = config.softmax
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        if self.softmax == "manual":
            att = torch.exp(att - att.max(-1, keepdim=True).values)
            att = att / att.sum(-1, keepdim=True)
        else:
            att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The decoder: token and position embeddings, the blocks, a final LayerNorm and the
    ``lm_head`` tied to the token embedding; ``forward(idx)`` returns the logits.

    >>> model = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=8))
    >>> model(torch.zeros(1, 8, dtype=torch.long)).shape
    torch.Size([1, 8, 32])
    """

    outputs = ("logits",)  # (what ``forward`` returns: a language model's loss reads them)

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build(config: GPTConfig, seq: int) -> tuple[GPT, torch.Tensor]:
    """The decoder in eval mode (seeded random weights) and a batch of one sequence."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    return model, torch.randint(0, config.vocab_size, (1, seq))


def pipeline_seconds(config: GPTConfig, seq: int, entry: str) -> float:
    """The pipeline's seconds in this process, from the first import of the project:
    ``entry`` "export" is ``EGraph.from_fx(torch.export(model)).saturate().extract()``
    (the export not counted), "compile" the first call of ``torch.compile(backend=
    "egraph")`` (dynamo's capture counted)."""
    model, idx = build(config, seq)
    with torch.no_grad():
        if entry == "export":
            program = torch.export.export(model, (idx,))
            start = time.perf_counter()
            from compiler.compile import default_cost
            from egraph import EGraph
            from egraph.rules import load_rules

            EGraph.from_fx(program, example_inputs=(idx,)).saturate(load_rules("all")).extract(
                default_cost((idx,)))
        else:
            start = time.perf_counter()
            import compiler.compile  # noqa: F401 - registers the backend

            torch.compile(model, backend="egraph")(idx)
    return time.perf_counter() - start


def fresh_pipeline_seconds(args, entry: str) -> float:
    """:func:`pipeline_seconds` in a fresh Python process."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import torch; "
            f"torch.set_num_threads({args.threads}); from benchmarks.nanogpt import *; "
            f"print(pipeline_seconds(replace(GPTConfig(), n_layer={args.layers}, "
            f"softmax={args.softmax!r}), {args.seq}, {entry!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--softmax", choices=("manual", "F"), default="manual")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    add_out_option(parser, "nanogpt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = replace(GPTConfig(), n_layer=args.layers, softmax=args.softmax)
    rows = [{"entry": f"pipeline, {entry}, fresh process",
             "seconds": fresh_pipeline_seconds(args, entry)} for entry in ("export", "compile")]
    print(markdown_table(rows, ["entry", "seconds"]))

    from compiler.compile import default_cost, make_backend
    from compiler.timing import interleaved_ms
    from egraph import EGraph
    from egraph.rules import load_rules

    model, idx = build(config, args.seq)
    with torch.no_grad():
        expected = model(idx)
        extracted = EGraph.from_fx(torch.export.export(model, (idx,)), example_inputs=(idx,)
                                   ).saturate(load_rules("all")).extract(default_cost((idx,)))
        compiled = torch.compile(model, backend=make_backend())
        ways = {"eager": lambda: model(idx), "egraph backend": lambda: compiled(idx),
                "from_fx extract": lambda: extracted(idx)}
        errors = {name: (run() - expected).abs().max().item() for name, run in ways.items()}
        times = interleaved_ms(ways, args.repeat)
    timed = [{"program": name, "ms": ms, "x eager": times["eager"] / ms,
              "max abs diff from eager": errors[name]} for name, ms in times.items()]
    attention = [line.strip() for line in extracted.code.splitlines() if "attention" in line]
    body = (f"{args.layers} layers, sequence {args.seq}, softmax {args.softmax}, "
            f"{args.threads} threads, medians of {args.repeat} interleaved rounds.\n\n"
            + markdown_table(rows, ["entry", "seconds"]) + "\n\n"
            + markdown_table(timed, ["program", "ms", "x eager", "max abs diff from eager"])
            + "\n\nThe attention extracted:\n\n```python\n"
            + (attention[0].split(";")[0] if attention else "none") + "\n```\n")
    print(body)
    write_results("nanogpt", "A nanoGPT decoder written plainly", body, out=args.out)


if __name__ == "__main__":
    main()
