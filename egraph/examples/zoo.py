"""A zoo of real architectures, written as PyTorch users write them (imports torch).

Used by the test suite, the pipeline benchmark and the demo. ``NaiveTransformer`` is the
bundled example: a transformer block written naively (manual softmax, manual layer norm,
duplicated subexpressions), the kind of code the optimiser exists for.

>>> model, inputs = build("mlp")
>>> model(*inputs).shape
torch.Size([8, 10])
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear - GELU - Dropout - Linear - GELU - Linear."""

    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.drop(F.gelu(self.fc1(x)))
        x = F.gelu(self.fc2(x))
        return self.head(x)


class ConvNet(nn.Module):
    """Two conv + BatchNorm + ReLU stages, global average pooling, a linear head."""

    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels * 2, 3, padding=1, stride=2)
        self.bn2 = nn.BatchNorm2d(channels * 2)
        self.head = nn.Linear(channels * 2, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


class ResidualBlock(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn plus the identity, then relu."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class CausalSelfAttention(nn.Module):
    """GPT-2 style attention with the mask and softmax written out by hand."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.ones_like(att, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    """A pre-norm GPT decoder block."""

    def __init__(self, d: int = 64, n_head: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` GPT blocks, a final norm and LM head."""

    def __init__(self, vocab: int = 512, d: int = 64, n_head: int = 4, n_layer: int = 2,
                 block: int = 32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([GPTBlock(d, n_head) for _ in range(n_layer)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Encoder(nn.Module):
    """A transformer encoder layer around nn.MultiheadAttention (batch first)."""

    def __init__(self, d: int = 32, n_head: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, n_head, batch_first=True)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.ln1(x + a)
        return self.ln2(x + self.ff(x))


class NaiveTransformer(nn.Module):
    """A transformer block written naively, as a first draft often is.

    Softmax as ``exp / sum(exp)`` (no max shift), layer norm as ``(x - mean) /
    sqrt(E[x^2] - E[x]^2 + eps)``, GELU from its tanh pieces, the scaling factor computed
    from the shape, and the same layer norm computed three times.
    """

    def __init__(self, d: int = 64, hidden: int = 128):
        super().__init__()
        self.wq = nn.Linear(d, d)
        self.wk = nn.Linear(d, d)
        self.wv = nn.Linear(d, d)
        self.wo = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def layer_norm(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + 1e-5) * self.gamma + self.beta

    def softmax(self, s):
        e = torch.exp(s)
        return e / e.sum(-1, keepdim=True)

    def forward(self, x):
        q = self.wq(self.layer_norm(x))
        k = self.wk(self.layer_norm(x))
        v = self.wv(self.layer_norm(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.size(-1))
        x = x + self.wo(self.softmax(scores) @ v)
        up = self.fc1(self.layer_norm(x))
        gelu = 0.5 * up * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (up + 0.044715 * up**3)))
        return x + self.fc2(gelu)


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple]:
    """A model of the zoo in eval mode and example inputs for it."""
    torch.manual_seed(seed)
    makers = {
        "mlp": lambda: (MLP(), (torch.randn(8, 32),)),
        "cnn": lambda: (ConvNet(), (torch.randn(2, 3, 16, 16),)),
        "residual": lambda: (ResidualBlock(), (torch.randn(2, 8, 8, 8),)),
        "gpt_block": lambda: (GPTBlock(), (torch.randn(2, 16, 64),)),
        "encoder": lambda: (Encoder(), (torch.randn(2, 10, 32),)),
        "naive_transformer": lambda: (NaiveTransformer(), (torch.randn(2, 16, 64),)),
        "gpt": lambda: (GPT(), (torch.randint(0, 512, (2, 16)),)),
        "gpt2_small": lambda: (GPT(vocab=50257, d=768, n_head=12, n_layer=12, block=128),
                               (torch.randint(0, 50257, (1, 64)),)),
    }
    if name not in makers:
        raise KeyError(f"no model {name!r} in the zoo; choose from {', '.join(makers)}")
    model, inputs = makers[name]()
    model.eval()
    return model, inputs


MODELS = ("mlp", "cnn", "residual", "gpt_block", "encoder", "naive_transformer", "gpt")
"""The zoo's small models (gpt2_small is the benchmark's 12-layer, d=768 model)."""
