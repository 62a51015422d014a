"""Research code outside ``transformers``: lucidrains' x-transformers, vit-pytorch and
rotary-embedding-torch, whose attention is written with ``einsum``, an ellipsis, masks
filled with ``-finfo.max`` and rotary tables made under ``autocast(enabled=False)`` (so
torch.compile hands the graph over through aot_autograd, which decomposes each einsum).

    .venv/bin/pip install --no-deps x-transformers vit-pytorch rotary-embedding-torch \
        einops einx frozendict loguru torch-einops-utils
    .venv/bin/python benchmarks/research.py [--models xt_decoder,vit] [--repeat 20] [--train]

(``--no-deps``: their requirements would replace the pinned CPU torch with a CUDA build and
add torchvision, which none of the models run here imports.)

One row per model: torch.export and torch.compile through the backend (outputs judged
against eager, float64 where they differ; as benchmarks/architectures.py), with ``--train``
a training step through the backend (loss and gradients judged), the fused ops
the emitted program calls (``scaled_dot_product_attention`` per attention layer), and
inference time against eager's, interleaved. The table is printed and written to
benchmarks/results/research.md (``--out``)."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler.compile as compile_backend  # noqa: E402
from benchmarks.architectures import SweepTable, fused_calls, sweep_row  # noqa: E402
from benchmarks.models import LIMITS, _error, _inference  # noqa: E402
from compiler.cli import interleaved_ms  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

TOKENS, DIM, DEPTH, HEADS, SEQ, IMAGE = 256, 64, 2, 4, 32, 32


def _tokens() -> tuple[torch.Tensor]:
    return (torch.randint(0, TOKENS, (2, SEQ), generator=torch.Generator().manual_seed(0)),)


def _image() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0)),)


def _x_transformers(layers: str, **extra) -> tuple[nn.Module, tuple]:
    import x_transformers

    attn = getattr(x_transformers, layers)(dim=DIM, depth=DEPTH, heads=HEADS, **extra)
    model = x_transformers.TransformerWrapper(num_tokens=TOKENS, max_seq_len=SEQ * 2,
                                              attn_layers=attn)
    return model, _tokens()


def _vit(file: str, name: str, **config) -> tuple[nn.Module, tuple]:
    """vit-pytorch's ``name`` from its ``file``, loaded alone: the package's ``__init__``
    imports torchvision (for DINO's augmentations), which the model files do not need."""
    import importlib.util

    folder = Path(importlib.util.find_spec("vit_pytorch").origin).parent
    spec = importlib.util.spec_from_file_location(f"vit_pytorch_{file}", folder / f"{file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)(image_size=IMAGE, num_classes=10, **config), _image()


_VIT = dict(patch_size=8, dim=DIM, depth=DEPTH, heads=HEADS, mlp_dim=2 * DIM)


class RotaryAttention(nn.Module):
    """Attention with rotary-embedding-torch's rotation of queries and keys (its tables
    are made with ``einsum('..., f -> ... f')``)."""

    def __init__(self):
        super().__init__()
        from rotary_embedding_torch import RotaryEmbedding

        self.rotary = RotaryEmbedding(dim=DIM // HEADS)
        self.qkv = nn.Linear(DIM, 3 * DIM)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, HEADS, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        q, k = self.rotary.rotate_queries_or_keys(q), self.rotary.rotate_queries_or_keys(k)
        sim = torch.einsum("... i d, ... j d -> ... i j", q, k) * (DIM // HEADS) ** -0.5
        out = torch.einsum("... i j, ... j d -> ... i d", sim.softmax(-1), v)
        return out.transpose(1, 2).reshape(b, n, DIM)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    "xt_decoder": lambda: _x_transformers("Decoder"),
    "xt_decoder_rotary": lambda: _x_transformers("Decoder", rotary_pos_emb=True),
    "xt_encoder": lambda: _x_transformers("Encoder"),
    "xt_encoder_hyper": lambda: _x_transformers("Encoder", num_residual_streams=2),
    "vit": lambda: _vit("vit", "ViT", **_VIT),
    "simple_vit": lambda: _vit("simple_vit", "SimpleViT", **_VIT),
    "cait": lambda: _vit("cait", "CaiT", cls_depth=1, **_VIT),
    "cross_vit": lambda: _vit("cross_vit", "CrossViT", sm_dim=DIM, lg_dim=DIM, sm_patch_size=8,
                              lg_patch_size=16, sm_enc_mlp_dim=2 * DIM, lg_enc_mlp_dim=2 * DIM,
                              lg_enc_depth=1, depth=DEPTH, dropout=0.0, emb_dropout=0.0),
    "rotary_attention": lambda: (RotaryAttention(),
                                 (torch.randn(2, SEQ, DIM,
                                              generator=torch.Generator().manual_seed(0)),)),
}


FUSED = ("scaled_dot_product_attention", "layer_norm", "linear", "gelu", "softmax")
"""The fused library ops counted in the emitted programs."""
_SHORT = {"scaled_dot_product_attention": "sdpa"}


def timed_row(make: Callable[[], tuple[nn.Module, tuple]], rules, repeat: int) -> dict:
    """The fused ops the programs torch.compile runs call, and their time against
    eager's (inference)."""
    model, inputs = make()
    model.eval()
    backend = compile_backend.make_backend(rules=rules, validate="strict", **LIMITS)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        compiled(*inputs)
    calls = fused_calls(backend, FUSED)
    ms = interleaved_ms({"eager": _inference(lambda: model(*inputs)),
                         "ours": _inference(lambda: compiled(*inputs))}, repeat)
    return {"fused": ", ".join(f"{_SHORT.get(op, op)} x{n}" for op, n in calls.items() if n)
            or "-",
            "ours/eager": f"{ms['ours'] / ms['eager']:.2f}",
            "ms eager/ours": f"{ms['eager']:.3f}/{ms['ours']:.3f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--train", action="store_true",
                        help="add a training step through the backend (gradients judged)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/research.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rules = load_rules("all")
    columns = ("compile", "train") if args.train else ("compile",)
    table = SweepTable("model", ("export", *columns, "fused", "ours/eager", "ms eager/ours"))
    for name in args.models.split(","):
        torch.manual_seed(0)
        row = sweep_row(name, MODELS[name], rules, columns)
        if row.get("compile") == "ok":
            try:
                row.update(timed_row(MODELS[name], rules, args.repeat))
            except Exception as exc:  # noqa: BLE001 - a row of the table
                row["fused"] = _error(exc, 80)
        table.add(name, row)
    table.write(args.out, table.summary(len(args.models.split(",")), args.train))


if __name__ == "__main__":
    main()
