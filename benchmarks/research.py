"""Research code outside ``transformers``: lucidrains' x-transformers (17 configurations of
its attention layers: rotary, ALiBi, relative and dynamic position biases, talking heads,
grouped keys, query-key norms, macaron and sandwich norms, token shifts, residual
attention, ...), vit-pytorch (40 models of its zoo: CaiT, CrossViT, LeViT, MaxViT, NesT,
PiT, CvT, LookViT, register tokens, patch dropout, hyper-connections, ...),
rotary-embedding-torch, perceiver-pytorch, conformer, mlp-mixer-pytorch, local-attention,
performer-pytorch (FAVOR+ random features), nystrom-attention (a Moore-Penrose iteration),
g-mlp-pytorch, lambda-networks, linear-attention-transformer and vector-quantize-pytorch
(a codebook moved by an average of its inputs in training),
whose attention is written with ``einsum``, an ellipsis, masks filled with ``-finfo.max``
and rotary tables made under ``autocast(enabled=False)`` (so torch.compile hands the graph
over through aot_autograd, which decomposes each einsum); labml's annotated implementations
(sequence-first attention normalised over dim 1, Transformer-XL's relative scores, ALiBi,
RoPE, Primer, AFT, gMLP, FNet, the DDPM U-Net, capsule routing); torch.nn's own
Transformer layers, and DETR's encoder layer (``nn.MultiheadAttention`` asked for the
weights it drops); PyTorch Geometric's graph convolutions (GCN, GAT, GATv2, GraphSAGE,
GIN, GraphConv, TransformerConv, EdgeConv, ChebConv), whose messages are gathered with
``index_select`` and summed into new tensors of zeros with ``scatter_add_``, and whose
self-loops make a graph break (an edge count that depends on the data); kornia's image
functions (SSIM on channels-last images, colour jitter and Lab conversion, Canny's edges,
Harris corners, SIFT and HardNet descriptors: pointwise formulas with constants of every
magnitude, separable depthwise convolutions, asserts on the input's range); normflows'
flows (rational-quadratic splines, whose masks break the graph and whose log-densities
are updated in place, a float64 Gaussian mixture, RealNVP, MAF); mambapy's Mamba
(a selective scan, parallel and sequential).

    .venv/bin/pip install --no-deps x-transformers vit-pytorch rotary-embedding-torch \
        einops einx frozendict loguru torch-einops-utils perceiver-pytorch conformer \
        mlp-mixer-pytorch local-attention hyper-connections labml==0.4.168 labml-nn \
        torch_geometric xxhash kornia kornia_rs normflows mambapy performer-pytorch \
        nystrom-attention g-mlp-pytorch lambda-networks linear-attention-transformer \
        linformer axial-positional-embedding product-key-memory vector-quantize-pytorch
    .venv/bin/python benchmarks/research.py [--models xt_decoder,vit] [--repeat 20] [--train]

(``--no-deps``: their requirements would replace the pinned CPU torch with a CUDA build and
add torchvision, which none of the models run here imports; labml-nn's attention logs
through ``labml.tracker.debug``, which labml 0.5 no longer has.)

One row per model: torch.export and torch.compile through the backend (outputs judged
against eager, float64 where they differ; as benchmarks/architectures.py), with ``--train``
a training step through the backend (loss and gradients judged), the fused ops
the emitted program calls (``scaled_dot_product_attention`` per attention layer), and
inference time against eager's and dynamo's alone, interleaved. The table is printed and written to
benchmarks/results/research.md (``--out``). labml's attention keeps its softmax weights
(``self.attn``) as an output of the compiled graph, so through torch.compile it stays
written out; torch.export's program has no such output.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler.compile as compile_backend  # noqa: E402
from benchmarks.architectures import SweepTable, fused_calls, sweep_row  # noqa: E402
from benchmarks.models import LIMITS, _error, _inference  # noqa: E402
from benchmarks.report import add_out_option  # noqa: E402
from compiler.timing import interleaved_ms  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

TOKENS, DIM, DEPTH, HEADS, SEQ, IMAGE = 256, 64, 2, 4, 32, 32


def _tokens() -> tuple[torch.Tensor]:
    return (torch.randint(0, TOKENS, (2, SEQ), generator=torch.Generator().manual_seed(0)),)


def _image(size: int = IMAGE) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)),)


def _x_transformers(layers: str, **extra) -> tuple[nn.Module, tuple]:
    import x_transformers

    attn = getattr(x_transformers, layers)(dim=DIM, depth=DEPTH, heads=HEADS, **extra)
    model = x_transformers.TransformerWrapper(num_tokens=TOKENS, max_seq_len=SEQ * 2,
                                              attn_layers=attn)
    return model, _tokens()


def _vit(file: str, name: str, image: int = IMAGE, **config) -> tuple[nn.Module, tuple]:
    """vit-pytorch's ``name`` from its ``file``, loaded alone: the package's ``__init__``
    imports torchvision (for DINO's augmentations), which the model files do not need."""
    import importlib.util

    folder = Path(importlib.util.find_spec("vit_pytorch").origin).parent
    spec = importlib.util.spec_from_file_location(f"vit_pytorch_{file}", folder / f"{file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = getattr(module, name)
    sized = {"image_size": image} if "image_size" in inspect.signature(model).parameters else {}
    return model(num_classes=10, **sized, **config), _image(image)


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


def _library(name: str) -> Any:
    """A library's ``module:attribute``, imported when its row is built."""
    import importlib

    path, attr = name.split(":")
    return getattr(importlib.import_module(path), attr)


def _random(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


class Keywords(nn.Module):
    """A module whose forward takes keyword arguments only (labml's), called with
    positional inputs named ``names``, and ``fixed`` keyword arguments."""

    def __init__(self, module: nn.Module, names: tuple[str, ...], **fixed):
        super().__init__()
        self.module, self.names, self.fixed = module, names, fixed

    def forward(self, *inputs):
        return self.module(**dict(zip(self.names, inputs)), **self.fixed)


def _labml_attention(name: str, causal: bool = True, **config) -> tuple[nn.Module, tuple]:
    """labml's ``name`` attention (``module:Class``) on sequence-first inputs, self-attention,
    with the causal mask its autoregressive models make (``subsequent_mask``: (i, j, 1))."""
    module = _library(name)(heads=HEADS, d_model=DIM, **config)
    x = _random(SEQ, 2, DIM)
    mask = torch.tril(torch.ones(SEQ, SEQ)).to(torch.bool).unsqueeze(-1) if causal else None
    return Keywords(module, ("query", "key", "value"), mask=mask), (x, x, x)


def _labml_ddpm_unet() -> tuple[nn.Module, tuple]:
    from labml_nn.diffusion.ddpm.unet import UNet

    return (UNet(image_channels=3, n_channels=32, ch_mults=(1, 2), is_attn=(False, True),
                 n_blocks=1), (_random(2, 3, 16, 16), torch.tensor([3.0, 50.0])))


def _labml(name: str, inputs: Callable[[], tuple], names: tuple[str, ...] = (), *args,
           **fixed) -> tuple[nn.Module, tuple]:
    """labml's ``name`` (``module:Class``) built with ``args``, called with ``inputs()``
    (by keyword where ``names`` names them)."""
    module = _library(name)(*args)
    return (Keywords(module, names, **fixed) if names else module), inputs()


def _pictures(*shape: int, count: int = 1) -> tuple[torch.Tensor, ...]:
    """``count`` images with values in [0, 1], as kornia's functions expect them."""
    g = torch.Generator().manual_seed(0)
    return tuple(torch.rand(*shape, generator=g) for _ in range(count))


class Function(nn.Module):
    """A library function as a module: ``fn(*inputs, **fixed)``."""

    def __init__(self, fn: Callable, **fixed):
        super().__init__()
        self.fn, self.fixed = fn, fixed

    def forward(self, *inputs):
        return self.fn(*inputs, **self.fixed)


def _kornia(name: str, inputs: tuple, **fixed) -> tuple[nn.Module, tuple]:
    """kornia's ``name`` (``module:function``, or a module class, built with ``fixed``)."""
    target = _library(name)
    if isinstance(target, type):
        return target(**fixed), inputs
    return Function(target, **fixed), inputs


def _colour_jitter(x: torch.Tensor) -> torch.Tensor:
    """kornia's ``ColorJiggle`` with its factors drawn, then ImageNet's normalisation."""
    from kornia import enhance

    x = enhance.adjust_brightness(x, 0.1)
    x = enhance.adjust_contrast(x, 1.2)
    x = enhance.adjust_saturation(x, 1.3)
    x = enhance.adjust_hue(x, 0.1)
    return enhance.normalize(x, torch.tensor([0.485, 0.456, 0.406]),
                             torch.tensor([0.229, 0.224, 0.225]))


class LogDensity(nn.Module):
    """A normflows model's ``log_prob``."""

    def __init__(self, flow: nn.Module):
        super().__init__()
        self.flow = flow

    def forward(self, x):
        return self.flow.log_prob(x)


def _normflows(flows: Callable, base: Callable | None = None, dim: int = 2
               ) -> tuple[nn.Module, tuple]:
    """normflows' ``NormalizingFlow`` of ``flows(nf)`` over ``base(nf)`` (a diagonal
    Gaussian by default), as its log-density of 256 points."""
    import normflows as nf

    q0 = base(nf) if base else nf.distributions.base.DiagGaussian(dim)
    model = LogDensity(nf.NormalizingFlow(q0, flows(nf)))
    return model, (_random(256, dim) * 0.5,)


def _mamba(**config) -> tuple[nn.Module, tuple]:
    from mambapy.mamba import Mamba, MambaConfig

    return Mamba(MambaConfig(d_model=DIM, n_layers=DEPTH, **config)), (_random(2, SEQ, DIM),)


def _sequence() -> tuple[torch.Tensor, ...]:
    x = _random(SEQ, 2, DIM)
    return (x, x, x)


class TorchTransformer(nn.Module):
    """torch.nn.Transformer, one encoder and one decoder layer, with a causal target."""

    def __init__(self):
        super().__init__()
        self.model = nn.Transformer(DIM, HEADS, 1, 1, 2 * DIM, dropout=0.0, batch_first=True)

    def forward(self, source, target):
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        return self.model(source, target, tgt_mask=mask, tgt_is_causal=True)


class DetrEncoderLayer(nn.Module):
    """DETR's encoder layer (``forward_post`` of its models/transformer.py) at its own
    sizes (hidden 256, 8 heads, feed-forward 2048) on a 20 x 20 feature map: it calls
    ``nn.MultiheadAttention`` with the module's default ``need_weights=True`` and keeps
    only the output."""

    def __init__(self, width: int = 256, heads: int = 8, hidden: int = 2048):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(width, heads, dropout=0.1)
        self.linear1, self.linear2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, src, pos):
        q = k = src + pos
        src = self.norm1(src + self.dropout(self.self_attn(q, k, value=src)[0]))
        return self.norm2(src + self.dropout(self.linear2(self.dropout(
            torch.relu(self.linear1(src))))))


class TwoConvolutions(nn.Module):
    """Two of PyG's graph convolutions with a ReLU between, as its examples stack them."""

    def __init__(self, first: nn.Module, second: nn.Module):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, edge_index):
        return self.second(self.first(x, edge_index).relu(), edge_index)


NODES, EDGES = 500, 4000


def _pyg(build: Callable[[int, int], nn.Module]) -> tuple[nn.Module, tuple]:
    """Two of PyG's convolutions, ``build(in, out)`` (``DIM`` -> ``DIM`` -> 16 features),
    on a random graph of :data:`NODES` nodes and :data:`EDGES` edges."""
    edges = torch.randint(0, NODES, (2, EDGES), generator=torch.Generator().manual_seed(0))
    return TwoConvolutions(build(DIM, DIM), build(DIM, 16)), (_random(NODES, DIM), edges)


def _pyg_conv(name: str) -> type:
    return _library(f"torch_geometric.nn:{name}")


def _mlp(width: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, out), nn.ReLU(), nn.Linear(out, out))


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    "xt_decoder": lambda: _x_transformers("Decoder"),
    "xt_decoder_rotary": lambda: _x_transformers("Decoder", rotary_pos_emb=True),
    "xt_encoder": lambda: _x_transformers("Encoder"),
    "xt_encoder_hyper": lambda: _x_transformers("Encoder", num_residual_streams=2),
    **{f"xt_{name}": lambda layers=layers, extra=extra: _x_transformers(layers, **extra)
       for name, (layers, extra) in {
           "glu_rmsnorm": ("Decoder", dict(rotary_pos_emb=True, ff_glu=True, use_rmsnorm=True)),
           "alibi": ("Decoder", dict(alibi_pos_bias=True, alibi_num_heads=2)),
           "flash": ("Decoder", dict(attn_flash=True)),
           "rel_pos_bias": ("Decoder", dict(rel_pos_bias=True)),
           "dynamic_pos_bias": ("Decoder", dict(dynamic_pos_bias=True)),
           "talking_heads": ("Decoder", dict(attn_pre_talking_heads=True,
                                             attn_post_talking_heads=True)),
           "qk_norm": ("Decoder", dict(attn_qk_norm=True, attn_qk_norm_dim_scale=True)),
           "grouped_kv": ("Decoder", dict(attn_kv_heads=2)),
           "sandwich_swish": ("Decoder", dict(sandwich_norm=True, ff_swish=True)),
           "scalenorm_gated": ("Encoder", dict(use_scalenorm=True, attn_gate_values=True)),
           "macaron_shift": ("Decoder", dict(macaron=True, shift_tokens=1)),
           "residual_attn": ("Decoder", dict(residual_attn=True)),
           "simple_rmsnorm": ("Decoder", dict(use_simple_rmsnorm=True)),
       }.items()},
    "vit": lambda: _vit("vit", "ViT", **_VIT),
    "simple_vit": lambda: _vit("simple_vit", "SimpleViT", **_VIT),
    "cait": lambda: _vit("cait", "CaiT", cls_depth=1, **_VIT),
    "cross_vit": lambda: _vit("cross_vit", "CrossViT", sm_dim=DIM, lg_dim=DIM, sm_patch_size=8,
                              lg_patch_size=16, sm_enc_mlp_dim=2 * DIM, lg_enc_mlp_dim=2 * DIM,
                              lg_enc_depth=1, depth=DEPTH, dropout=0.0, emb_dropout=0.0),
    # vit-pytorch's zoo, each file's model with the common configuration
    **{f"vit_{file}": lambda file=file, name=name: _vit(file, name, **_VIT)
       for file, name in (
           ("simple_vit_with_qk_norm", "SimpleViT"), ("simple_flash_attn_vit", "SimpleViT"),
           ("simple_vit_with_register_tokens", "SimpleViT"),
           ("simple_vit_with_relative_proj_pos_bias", "SimpleViT"),
           ("simple_vit_with_patch_dropout", "SimpleViT"),
           ("simple_vit_with_specialized_cls", "SimpleViT"),
           ("simple_vit_with_value_residual", "SimpleViT"),
           ("simple_vit_orthog_residual_update", "SimpleViT"),
           ("attn_residual_with_dca_simple_vit", "SimpleViT"),
           ("simple_vit_attn_residual", "SimpleViTAttnResidual"),
           ("simple_vit_with_sparse_gating", "SimpleViTWithSparseGating"),
           ("simple_uvit", "SimpleUViT"), ("deepvit", "DeepViT"), ("parallel_vit", "ViT"),
           ("rvt", "RvT"), ("normalized_vit", "nViT"), ("mp3", "ViT"),
           ("vit_for_small_dataset", "ViT"), ("vit_with_patch_merger", "ViT"),
           ("learnable_memory_vit", "ViT"), ("jumbo_vit", "JumboViT"), ("jet_vit", "JetViT"),
           ("vat", "ViT"), ("vit_5", "ViT"), ("vit_detpool", "ViTDetPool"),
           ("vit_with_decorr", "ViT"), ("vit_with_keel_post_ln", "ViT"),
           ("vit_with_patch_dropout", "ViT"))},
    "vit_fft": lambda: _vit("simple_vit_with_fft", "SimpleViT", freq_patch_size=8, **_VIT),
    "vit_hyper_connections": lambda: _vit("simple_vit_with_hyper_connections", "SimpleViT",
                                          num_residual_streams=2, **_VIT),
    "pit": lambda: _vit("pit", "PiT", **{**_VIT, "patch_size": 4, "depth": (1, 1)}),
    "nest": lambda: _vit("nest", "NesT", patch_size=4, dim=DIM, heads=HEADS,
                         num_hierarchies=2, block_repeats=(1, 1)),
    "levit": lambda: _vit("levit", "LeViT", image=64, mlp_mult=2, stages=3,
                          dim=(32, 48, 64), depth=1, heads=(2, 3, 4)),
    "look_vit": lambda: _vit("look_vit", "LookViT", image=64, highres_patch_size=4,
                             **{k: v for k, v in _VIT.items() if k != "mlp_dim"}),
    "max_vit": lambda: _vit("max_vit_with_registers", "MaxViT", depth=(1, 1),
                            dim_conv_stem=32, window_size=2, dim=DIM, dim_head=16),
    "cvt": lambda: _vit("cvt", "CvT"),
    "rotary_attention": lambda: (RotaryAttention(), (_random(2, SEQ, DIM),)),
    "perceiver": lambda: (__import__("perceiver_pytorch").Perceiver(
        input_channels=3, input_axis=2, num_freq_bands=6, max_freq=10.0, depth=DEPTH,
        num_latents=16, latent_dim=DIM, cross_heads=1, latent_heads=HEADS, cross_dim_head=16,
        latent_dim_head=16, num_classes=10, attn_dropout=0.0, ff_dropout=0.0),
        (_random(2, 16, 16, 3),)),
    "conformer": lambda: (__import__("conformer").ConformerBlock(
        dim=DIM, dim_head=16, heads=HEADS, ff_mult=2, conv_expansion_factor=2,
        conv_kernel_size=7), (_random(2, SEQ, DIM),)),
    "mlp_mixer": lambda: (__import__("mlp_mixer_pytorch").MLPMixer(
        image_size=IMAGE, channels=3, patch_size=8, dim=DIM, depth=DEPTH, num_classes=10),
        _image()),
    "local_transformer": lambda: (__import__("local_attention").LocalTransformer(
        num_tokens=TOKENS, max_seq_len=SEQ * 2, dim=DIM, depth=DEPTH, causal=True,
        local_attn_window_size=16), _tokens()),
    "labml_mha": lambda: _labml_attention("labml_nn.transformers.mha:MultiHeadAttention",
                                          dropout_prob=0.0),
    "labml_rope": lambda: _labml_attention(
        "labml_nn.transformers.rope:RotaryPEMultiHeadAttention", rope_percentage=0.5),
    "labml_alibi": lambda: _labml_attention(
        "labml_nn.transformers.alibi:AlibiMultiHeadAttention", dropout_prob=0.0),
    "labml_primer": lambda: _labml_attention(
        "labml_nn.transformers.primer_ez:MultiDConvHeadAttention", dropout_prob=0.0),
    "labml_xl": lambda: _labml_attention(
        "labml_nn.transformers.xl.relative_mha:RelativeMultiHeadAttention", causal=False,
        dropout_prob=0.0),
    "labml_aft": lambda: _labml("labml_nn.transformers.aft:AFTLocal", _sequence,
                                ("query", "key", "value"), DIM, SEQ, 8,
                                mask=torch.tril(torch.ones(SEQ, SEQ)).bool().unsqueeze(-1)),
    "labml_gmlp": lambda: _labml("labml_nn.transformers.gmlp:GMLPBlock",
                                 lambda: (_random(SEQ, 2, DIM),), ("x",), DIM, 2 * DIM, SEQ),
    "labml_fnet": lambda: _labml("labml_nn.transformers.fnet:FNetMix", _sequence),
    "labml_ddpm_unet": _labml_ddpm_unet,
    "labml_capsules": lambda: _labml("labml_nn.capsule_networks:Router",
                                     lambda: (_random(2, 32, 8),), (), 32, 10, 8, 16, 3),
    "torch_encoder": lambda: (nn.TransformerEncoder(
        nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM, dropout=0.0, batch_first=True), DEPTH,
        enable_nested_tensor=False), (_random(2, SEQ, DIM),)),
    "detr_encoder": lambda: (DetrEncoderLayer(), (_random(400, 2, 256), _random(400, 2, 256))),
    "torch_transformer": lambda: (TorchTransformer(),
                                  (_random(2, SEQ, DIM), _random(2, SEQ // 2, DIM))),
}
MODELS.update({
    "pyg_gcn": lambda: _pyg(lambda w, o: _pyg_conv("GCNConv")(w, o)),
    "pyg_gat": lambda: _pyg(lambda w, o: _pyg_conv("GATConv")(w, o // HEADS, heads=HEADS)),
    "pyg_gatv2": lambda: _pyg(lambda w, o: _pyg_conv("GATv2Conv")(w, o // HEADS, heads=HEADS)),
    "pyg_sage": lambda: _pyg(lambda w, o: _pyg_conv("SAGEConv")(w, o)),
    "pyg_gin": lambda: _pyg(lambda w, o: _pyg_conv("GINConv")(_mlp(w, o))),
    "pyg_graphconv": lambda: _pyg(lambda w, o: _pyg_conv("GraphConv")(w, o)),
    "pyg_transformer": lambda: _pyg(
        lambda w, o: _pyg_conv("TransformerConv")(w, o // HEADS, heads=HEADS)),
    "pyg_edgeconv": lambda: _pyg(lambda w, o: _pyg_conv("EdgeConv")(_mlp(2 * w, o))),
    "pyg_cheb": lambda: _pyg(lambda w, o: _pyg_conv("ChebConv")(w, o, K=3)),
    "kornia_ssim": lambda: _kornia("kornia.losses:ssim_loss", _pictures(4, 3, 64, 64, count=2),
                                   window_size=11),
    "kornia_jitter": lambda: (Function(_colour_jitter), _pictures(4, 3, 64, 64)),
    "kornia_lab": lambda: _kornia("kornia.color:rgb_to_lab", _pictures(4, 3, 64, 64)),
    "kornia_canny": lambda: _kornia("kornia.filters:canny", _pictures(2, 3, 64, 64)),
    "kornia_harris": lambda: _kornia("kornia.feature:harris_response",
                                     _pictures(4, 1, 64, 64), k=0.04),
    "kornia_sift": lambda: _kornia("kornia.feature:SIFTDescriptor", _pictures(16, 1, 32, 32),
                                   patch_size=32),
    "kornia_hardnet": lambda: _kornia("kornia.feature:HardNet", _pictures(16, 1, 32, 32),
                                      pretrained=False),
    "normflows_spline": lambda: _normflows(lambda nf: [
        nf.flows.AutoregressiveRationalQuadraticSpline(2, 1, 16) for _ in range(2)]),
    "normflows_mixture": lambda: _normflows(
        lambda nf: [nf.flows.AffineCouplingBlock(nf.nets.MLP([1, 16, 2])),
                    nf.flows.Permute(2, mode="swap")],
        lambda nf: nf.distributions.base.GaussianMixture(3, 2)),
    "normflows_realnvp": lambda: _normflows(lambda nf: [
        f for _ in range(4) for f in (nf.flows.AffineCouplingBlock(nf.nets.MLP([2, 32, 4])),
                                      nf.flows.Permute(4, mode="swap"))], dim=4),
    "normflows_maf": lambda: _normflows(lambda nf: [
        f for _ in range(2) for f in (nf.flows.MaskedAffineAutoregressive(2, 16, num_blocks=2),
                                      nf.flows.Permute(2))]),
    "performer_lm": lambda: (_library("performer_pytorch:PerformerLM")(
        num_tokens=TOKENS, max_seq_len=SEQ, dim=DIM, depth=DEPTH, heads=HEADS, dim_head=16,
        causal=False, nb_features=32, auto_check_redraw=False), _tokens()),
    "performer_generalized": lambda: (_library("performer_pytorch:PerformerLM")(
        num_tokens=TOKENS, max_seq_len=SEQ, dim=DIM, depth=DEPTH, heads=HEADS, dim_head=16,
        nb_features=32, generalized_attention=True, use_scalenorm=True,
        auto_check_redraw=False), _tokens()),
    "nystromformer": lambda: (_library("nystrom_attention:Nystromformer")(
        dim=DIM, depth=DEPTH, dim_head=16, heads=HEADS, num_landmarks=8,
        attn_values_residual_conv_kernel=5), (_random(2, SEQ, DIM),)),
    "gmlp_lm": lambda: (_library("g_mlp_pytorch:gMLP")(
        num_tokens=TOKENS, dim=DIM, depth=DEPTH, seq_len=SEQ, attn_dim=16, causal=True),
        _tokens()),
    "lambda_layer": lambda: (_library("lambda_networks:LambdaLayer")(
        32, dim_out=32, r=7, dim_k=16, heads=4, dim_u=1), (_random(2, 32, 16, 16),)),
    "linear_attention_lm": lambda: (_library(
        "linear_attention_transformer:LinearAttentionTransformerLM")(
        num_tokens=TOKENS, dim=DIM, depth=DEPTH, max_seq_len=SEQ, heads=HEADS, dim_head=16,
        causal=True, n_local_attn_heads=2, local_attn_window_size=8), _tokens()),
    # (in eval mode: in training each call moves its codebook, so two calls differ)
    "vector_quantize": lambda: (_library("vector_quantize_pytorch:VectorQuantize")(
        dim=DIM, codebook_size=128, codebook_dim=16, heads=2, use_cosine_sim=True).eval(),
        (_random(2, SEQ, DIM),)),
    "mamba": lambda: _mamba(d_state=8),
    "mamba_sequential": lambda: _mamba(d_state=8, pscan=False),
})


FUSED = ("scaled_dot_product_attention", "layer_norm", "linear", "gelu", "softmax")
"""The fused library ops counted in the emitted programs."""
_SHORT = {"scaled_dot_product_attention": "sdpa"}


def timed_row(make: Callable[[], tuple[nn.Module, tuple]], rules, repeat: int) -> dict:
    """The fused ops the programs torch.compile runs call, and their time against
    eager's and against dynamo's alone (``backend="eager"``: the same graphs run as
    captured, so the ratio is what the rewrites change, without dynamo's guards and
    calls, which dominate a model of a few microseconds), in inference."""
    model, inputs = make()
    model.eval()
    backend = compile_backend.make_backend(rules=rules, validate="strict", **LIMITS)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    captured = torch.compile(model, backend="eager")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        compiled(*inputs)
        captured(*inputs)
    calls = fused_calls(backend, FUSED)
    ms = interleaved_ms({"eager": _inference(lambda: model(*inputs)),
                         "dynamo": _inference(lambda: captured(*inputs)),
                         "ours": _inference(lambda: compiled(*inputs))}, repeat)
    return {"fused": ", ".join(f"{_SHORT.get(op, op)} x{n}" for op, n in calls.items() if n)
            or "-",
            "ours/eager": f"{ms['ours'] / ms['eager']:.2f}",
            "ours/dynamo": f"{ms['ours'] / ms['dynamo']:.2f}",
            "ms eager/dynamo/ours": f"{ms['eager']:.3f}/{ms['dynamo']:.3f}/{ms['ours']:.3f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--train", action="store_true",
                        help="add a training step through the backend (gradients judged)")
    add_out_option(parser, "research")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rules = load_rules("all")
    columns = ("compile", "train") if args.train else ("compile",)
    table = SweepTable("model", ("export", *columns, "fused", "ours/eager", "ours/dynamo",
                                 "ms eager/dynamo/ours"))
    ratios: dict[str, list[float]] = {"ours/eager": [], "ours/dynamo": []}
    for name in args.models.split(","):
        torch.manual_seed(0)
        row = sweep_row(name, MODELS[name], rules, columns)
        if str(row.get("compile", "")).startswith("ok"):  # (graph breaks are dynamo's)
            try:
                row.update(timed_row(MODELS[name], rules, args.repeat))
                for key, values in ratios.items():
                    values.append(float(row[key]))
            except Exception as exc:  # noqa: BLE001 - a row of the table
                row["fused"] = _error(exc, 80)
        table.add(name, row)
    means = "; ".join(f"{key} {statistics.geometric_mean(values):.2f} in geometric mean"
                      for key, values in ratios.items() if values)
    table.write("research", "Research models outside transformers",
                table.summary(len(args.models.split(",")), args.train)
                + (f"; {means}" if means else ""), args.out)


if __name__ == "__main__":
    main()
