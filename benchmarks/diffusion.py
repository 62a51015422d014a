"""A sweep over diffusers model classes outside the corpus, each built small with random
weights, through torch.export (validated, strict), torch.compile with the backend and, with
``--train``, a training step through the backend: what a user who picks any of diffusers'
transformers, UNets, autoencoders or adapters gets.

    .venv/bin/python benchmarks/diffusion.py [--models wan,sana] [--train]
                                             [--codegen inductor]

One row per model (the corpus's UNet2DModel, UNet2DConditionModel, AutoencoderKL,
DiTTransformer2DModel, SD3Transformer2DModel and FluxTransformer2DModel are not repeated):
the diffusers class; ``export``, whether torch.export captures the model (a failure there is
torch's, not ours, and says ``torch.export:``) and then ours through the exported program
(``ok``, a fallback with validation's reason, a wrong output or a crash of ours);
``compile``, the same through torch.compile, with graph breaks counted; ``train``, with
``--train``, a forward, a loss and backward through the backend (loss and gradients equal
eager's, float64-judged); ``nodes``, the exported graph's nodes before -> after the
e-graph; ``pipeline s``, the seconds of the pipeline on the exported graph (ingest, saturation,
extraction, validation).
A model that does not build or run eagerly is a ``not built`` row.
Outputs are compared with eager's (float64-judged where the float32 outputs differ).
The table is printed and written to benchmarks/results/diffusion.md (``--out``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.architectures import SweepTable, sweep_row  # noqa: E402
from benchmarks.report import add_out_option  # noqa: E402
from compiler.options import CODEGENS  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

BATCH = 2
Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class Bound(nn.Module):
    """A diffusers model called with positional tensors as its keyword inputs ``names``,
    with the non-tensor keyword arguments ``fixed`` bound; ``pair`` = (a, b, into) packs
    inputs ``a`` and ``b`` into one tuple argument ``into`` (a rotary embedding's (cos,
    sin)). Returns the first output (a list of tensors as a tuple) or, with ``flatten``,
    every output flattened into one tuple (ControlNet's residuals, an adapter's features).
    """

    def __init__(self, model: nn.Module, names: tuple[str, ...], fixed: dict | None = None,
                 pair: tuple[str, str, str] | None = None, flatten: bool = False):
        super().__init__()
        self.model, self.names = model, names
        self.fixed = {"return_dict": False} if fixed is None else fixed
        self.pair, self.flatten = pair, flatten

    def forward(self, *inputs: torch.Tensor):
        kwargs = dict(zip(self.names, inputs))
        if self.pair is not None:
            a, b, into = self.pair
            kwargs[into] = (kwargs.pop(a), kwargs.pop(b))
        out = self.model(**kwargs, **self.fixed)
        if isinstance(out, torch.Tensor):
            return out
        if self.flatten:
            return tuple(t for o in out for t in (o if isinstance(o, (list, tuple)) else [o]))
        return tuple(out[0]) if isinstance(out[0], list) else out[0]


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _steps(g: torch.Generator) -> torch.Tensor:
    """Integer diffusion timesteps, one per batch entry."""
    return torch.randint(0, 1000, (BATCH,), generator=g)


def _pixart(g: torch.Generator) -> Built:
    """PixArt-alpha: a DiT with adaLN-single (one timestep modulation shared by every block)
    and cross-attention to caption features."""
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2,
        in_channels=4, cross_attention_dim=16, out_channels=8, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=8, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6, use_additional_conditions=False,
        caption_channels=16)
    fixed = dict(added_cond_kwargs={"aspect_ratio": None, "resolution": None},
                 return_dict=False)
    return (Bound(model, ("hidden_states", "timestep", "encoder_hidden_states"), fixed),
            (_randn(g, 2, 4, 8, 8), _steps(g), _randn(g, 2, 8, 16)))


def _hunyuan_dit(g: torch.Generator) -> Built:
    """Hunyuan-DiT: CLIP and T5 text states with their masks, image-size and style
    conditioning, 2D rotary embeddings and long skip connections between blocks."""
    from diffusers import HunyuanDiT2DModel
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    model = HunyuanDiT2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8,
        pooled_projection_dim=4, hidden_size=16, text_len=4, text_len_t5=4,
        activation_fn="gelu-approximate")
    cos, sin = get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4), use_real=True)
    names = ("hidden_states", "timestep", "encoder_hidden_states", "text_embedding_mask",
             "encoder_hidden_states_t5", "text_embedding_mask_t5", "image_meta_size", "style",
             "cos", "sin")
    meta = torch.tensor([[1024.0, 1024.0, 16.0, 16.0, 0.0, 0.0]] * BATCH)
    inputs = (_randn(g, 2, 4, 8, 8), _steps(g).float(), _randn(g, 2, 4, 8), torch.ones(2, 4),
              _randn(g, 2, 4, 8), torch.ones(2, 4), meta, torch.zeros(2, dtype=torch.long),
              cos.float(), sin.float())
    return Bound(model, names, pair=("cos", "sin", "image_rotary_emb")), inputs


def _lumina2(g: torch.Generator) -> Built:
    """Lumina-Image 2.0: a single-stream transformer with refiner layers for the noise and
    the caption tokens, grouped-query attention and rotary embeddings over three axes."""
    from diffusers import Lumina2Transformer2DModel

    model = Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=1,
        num_refiner_layers=1, num_attention_heads=3, num_kv_heads=1, multiple_of=2,
        ffn_dim_multiplier=None, norm_eps=1e-5, scaling_factor=1.0, axes_dim_rope=(4, 2, 2),
        axes_lens=(128, 128, 128), cap_feat_dim=16)
    names = ("hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask")
    return Bound(model, names), (_randn(g, 2, 4, 8, 8), torch.rand(BATCH, generator=g),
                                 _randn(g, 2, 8, 16), torch.ones(2, 8, dtype=torch.bool))


def _sana(g: torch.Generator) -> Built:
    """Sana: linear (ReLU-kernel) self-attention and a gated convolutional feed-forward
    (GLUMBConv, a depthwise convolution between the projections)."""
    from diffusers import SanaTransformer2DModel

    model = SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=4,
        num_attention_heads=2, num_cross_attention_heads=2, cross_attention_head_dim=4,
        cross_attention_dim=8, caption_channels=8, sample_size=8)
    return (Bound(model, ("hidden_states", "encoder_hidden_states", "timestep")),
            (_randn(g, 2, 4, 8, 8), _randn(g, 2, 8, 8), _steps(g)))


def _auraflow(g: torch.Generator) -> Built:
    """AuraFlow: joint-attention (MMDiT) blocks then single-stream blocks, register tokens
    and a learned positional embedding cropped to the latent."""
    from diffusers import AuraFlowTransformer2DModel

    model = AuraFlowTransformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=32, out_channels=4, pos_embed_max_size=64)
    return (Bound(model, ("hidden_states", "encoder_hidden_states", "timestep")),
            (_randn(g, 2, 4, 8, 8), _randn(g, 2, 8, 32), _steps(g)))


def _cogvideox(g: torch.Generator) -> Built:
    """CogVideoX: text and 3D-patched video tokens in one sequence, with an adaptive layer
    norm per modality (expert norms)."""
    from diffusers import CogVideoXTransformer3DModel

    model = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        time_embed_dim=2, text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=8)
    return (Bound(model, ("hidden_states", "encoder_hidden_states", "timestep")),
            (_randn(g, 2, 2, 4, 8, 8), _randn(g, 2, 8, 8), _steps(g)))


def _ltx_video(g: torch.Generator) -> Built:
    """LTX-Video: a video transformer over a flat token sequence, rotary embeddings from
    frame, height and width, queries and keys RMS-normed across heads."""
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, qk_norm="rms_norm_across_heads",
        caption_channels=16)
    names = ("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask")
    fixed = dict(num_frames=2, height=8, width=8, return_dict=False)
    return Bound(model, names, fixed), (_randn(g, 2, 2 * 8 * 8, 4), _randn(g, 2, 8, 16),
                                        _steps(g), torch.ones(2, 8, dtype=torch.bool))


def _wan(g: torch.Generator) -> Built:
    """Wan's video transformer: 3D patches, rotary embeddings over frames, height and
    width, a sinusoidal timestep embedding projected to per-block modulation."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    return (Bound(model, ("hidden_states", "timestep", "encoder_hidden_states")),
            (_randn(g, 2, 4, 2, 8, 8), _steps(g), _randn(g, 2, 12, 16)))


def _mochi(g: torch.Generator) -> Built:
    """Mochi: an asymmetric joint-attention video transformer (a narrower text stream),
    SwiGLU feed-forwards and a masked text sequence."""
    from diffusers import MochiTransformer3DModel

    model = MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        pooled_projection_dim=16, in_channels=4, out_channels=None, qk_norm="rms_norm",
        text_embed_dim=16, time_embed_dim=4, activation_fn="swiglu", max_sequence_length=16)
    names = ("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask")
    return Bound(model, names), (_randn(g, 2, 4, 2, 8, 8), _randn(g, 2, 16, 16), _steps(g),
                                 torch.ones(2, 16, dtype=torch.bool))


def _qwenimage(g: torch.Generator) -> Built:
    """Qwen-Image: a dual-stream MMDiT over packed latent tokens, with multimodal rotary
    embeddings over frame, height and width (MSRoPE) and a text mask."""
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False,
        axes_dims_rope=(8, 4, 4))
    names = ("hidden_states", "encoder_hidden_states", "encoder_hidden_states_mask",
             "timestep")
    fixed = dict(img_shapes=[(1, 4, 4)] * BATCH, return_dict=False)
    return Bound(model, names, fixed), (_randn(g, 2, 16, 16), _randn(g, 2, 8, 16),
                                        torch.ones(2, 8, dtype=torch.long),
                                        torch.tensor([1.0, 0.5]))


def _hidream(g: torch.Generator) -> Built:
    """HiDream-I1: dual- then single-stream blocks with a mixture-of-experts feed-forward,
    conditioned on T5 states and on the states of each Llama-3 layer."""
    from diffusers import HiDreamImageTransformer2DModel

    model = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8,
        num_routed_experts=2, num_activated_experts=2, axes_dims_rope=(4, 2, 2),
        max_resolution=(16, 16), llama_layers=(0, 1), force_inference_output=True)
    names = ("hidden_states", "timesteps", "encoder_hidden_states_t5",
             "encoder_hidden_states_llama3", "pooled_embeds")
    return Bound(model, names), (_randn(g, 2, 4, 16, 16), _steps(g), _randn(g, 2, 8, 8),
                                 _randn(g, 2, 2, 8, 4), _randn(g, 2, 8))


def _cogview4(g: torch.Generator) -> Built:
    """CogView4: a transformer with 2D rotary embeddings, conditioned on the original size,
    the target size and the crop coordinates (SDXL-style micro-conditioning)."""
    from diffusers import CogView4Transformer2DModel

    model = CogView4Transformer2DModel(
        patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=4,
        out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4)
    size = torch.tensor([[64, 64]] * BATCH)
    names = ("hidden_states", "encoder_hidden_states", "timestep", "original_size",
             "target_size", "crop_coords")
    return Bound(model, names), (_randn(g, 2, 4, 8, 8), _randn(g, 2, 8, 8), _steps(g), size,
                                 size.clone(), torch.zeros(2, 2, dtype=torch.long))


def _stable_audio(g: torch.Generator) -> Built:
    """Stable Audio's DiT: a 1D latent sequence with rotary embeddings on part of each
    head, global conditioning prepended as a token, grouped-query cross-attention."""
    from diffusers import StableAudioDiTModel
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    model = StableAudioDiTModel(
        sample_size=16, in_channels=3, num_layers=1, attention_head_dim=4,
        num_attention_heads=2, num_key_value_attention_heads=2, out_channels=3,
        cross_attention_dim=4, time_proj_dim=8, global_states_input_dim=8,
        cross_attention_input_dim=4)
    cos, sin = get_1d_rotary_pos_embed(2, 16 + 1, use_real=True, repeat_interleave_real=False)
    names = ("hidden_states", "timestep", "encoder_hidden_states", "global_hidden_states",
             "cos", "sin")
    inputs = (_randn(g, 2, 3, 16), torch.tensor([10.0, 500.0]), _randn(g, 2, 6, 4),
              _randn(g, 2, 1, 8), cos.float(), sin.float())
    return Bound(model, names, pair=("cos", "sin", "rotary_embedding")), inputs


def _unet3d(g: torch.Generator) -> Built:
    """The text-to-video UNet (ModelScope): per-frame 2D convolutions and spatial attention,
    temporal convolutions and temporal attention across frames."""
    from diffusers import UNet3DConditionModel

    model = UNet3DConditionModel(
        block_out_channels=(4, 8), norm_num_groups=4,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=8,
        attention_head_dim=2, out_channels=4, in_channels=4, layers_per_block=1,
        sample_size=8)
    return (Bound(model, ("sample", "timestep", "encoder_hidden_states")),
            (_randn(g, 2, 4, 2, 8, 8), _steps(g), _randn(g, 2, 4, 8)))


def _unet_svd(g: torch.Generator) -> Built:
    """Stable Video Diffusion's UNet: spatio-temporal resnets and transformers mixing the
    spatial and temporal paths, conditioned on added time ids (fps, motion, noise)."""
    from diffusers import UNetSpatioTemporalConditionModel

    model = UNetSpatioTemporalConditionModel(
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=32, num_attention_heads=(4, 8), out_channels=4, in_channels=4,
        layers_per_block=1, sample_size=8, projection_class_embeddings_input_dim=3 * 8,
        addition_time_embed_dim=8, num_frames=2)
    time_ids = torch.tensor([[6.0, 127.0, 0.02]] * BATCH)
    names = ("sample", "timestep", "encoder_hidden_states", "added_time_ids")
    return Bound(model, names), (_randn(g, 2, 2, 4, 8, 8), torch.tensor([10.0, 10.0]),
                                 _randn(g, 2, 1, 32), time_ids)


def _unet1d(g: torch.Generator) -> Built:
    """Dance Diffusion's 1D UNet: Fourier timestep features appended as input channels,
    attention at the lowest resolutions."""
    from diffusers import UNet1DModel

    model = UNet1DModel(
        sample_size=64, in_channels=2, out_channels=2, extra_in_channels=16,
        time_embedding_type="fourier", time_embedding_dim=16, flip_sin_to_cos=True,
        use_timestep_embedding=False,
        down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
        up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"),
        mid_block_type="UNetMidBlock1D", block_out_channels=(32, 32, 64))
    return Bound(model, ("sample", "timestep")), (_randn(g, 2, 2, 64),
                                                  torch.tensor([0.3, 0.7]))


def _unet1d_rl(g: torch.Generator) -> Built:
    """The 1D UNet of diffusion planning (Diffuser): residual temporal blocks over a
    trajectory, a positional timestep embedding and a convolutional output block."""
    from diffusers import UNet1DModel

    model = UNet1DModel(
        block_out_channels=(8, 8, 16, 16), in_channels=14, out_channels=14,
        time_embedding_type="positional", use_timestep_embedding=True, flip_sin_to_cos=False,
        freq_shift=1.0, out_block_type="OutConv1DBlock", mid_block_type="MidResTemporalBlock1D",
        down_block_types=("DownResnetBlock1D",) * 4, up_block_types=("UpResnetBlock1D",) * 3,
        act_fn="swish")
    return Bound(model, ("sample", "timestep")), (_randn(g, 2, 14, 16),
                                                  torch.tensor([10, 10]))


def _controlnet(g: torch.Generator) -> Built:
    """ControlNet: a copy of a UNet's encoder with a conditioning-image embedding,
    returning every down-block residual and the mid-block residual."""
    from diffusers import ControlNetModel

    model = ControlNetModel(
        block_out_channels=(4, 8), layers_per_block=1, in_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), cross_attention_dim=8,
        attention_head_dim=2, norm_num_groups=4, conditioning_embedding_out_channels=(8, 16))
    names = ("sample", "timestep", "encoder_hidden_states", "controlnet_cond")
    return Bound(model, names, flatten=True), (_randn(g, 2, 4, 8, 8), _steps(g),
                                               _randn(g, 2, 4, 8), _randn(g, 2, 3, 16, 16))


def _t2i_adapter(g: torch.Generator) -> Built:
    """T2I-Adapter: a small convolutional network (pixel-unshuffle, residual blocks)
    mapping a condition image to features at every scale of a UNet."""
    from diffusers import T2IAdapter

    model = T2IAdapter(in_channels=3, channels=[16, 32], num_res_blocks=1, downscale_factor=2,
                       adapter_type="full_adapter")
    return Bound(model, ("x",), fixed={}, flatten=True), (_randn(g, 2, 3, 16, 16),)


def _autoencoder_tiny(g: torch.Generator) -> Built:
    """TAESD, the tiny autoencoder: plain convolutional blocks, the latents quantized to
    bytes between encoder and decoder."""
    from diffusers import AutoencoderTiny

    model = AutoencoderTiny(
        in_channels=3, out_channels=3, encoder_block_out_channels=(16, 16),
        decoder_block_out_channels=(16, 16), num_encoder_blocks=(1, 1),
        num_decoder_blocks=(1, 1))
    return Bound(model, ("sample",)), (_randn(g, 2, 3, 16, 16),)


def _vq_model(g: torch.Generator) -> Built:
    """The VQ-GAN autoencoder (VQModel): each latent replaced by its nearest codebook
    entry (a distance matrix and an argmin)."""
    from diffusers import VQModel

    model = VQModel(
        block_out_channels=(8, 16), norm_num_groups=8, in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=3, num_vq_embeddings=16, sample_size=16)
    return Bound(model, ("sample",)), (_randn(g, 2, 3, 16, 16),)


def _autoencoder_kl_wan(g: torch.Generator) -> Built:
    """Wan's video VAE: causal 3D convolutions run chunk by chunk over the frames with a
    cache of the past frames, temporal downsampling."""
    from diffusers import AutoencoderKLWan

    model = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                             temperal_downsample=[False, True, True])
    return Bound(model, ("sample",)), (_randn(g, 1, 3, 5, 16, 16),)


def _autoencoder_kl_cogvideox(g: torch.Generator) -> Built:
    """CogVideoX's video VAE: causal 3D convolutions with temporal compression and group
    norms conditioned on the latent in the decoder (spatial norms)."""
    from diffusers import AutoencoderKLCogVideoX

    model = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
        latent_channels=4, layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4)
    return Bound(model, ("sample",)), (_randn(g, 1, 3, 5, 16, 16),)


def _autoencoder_oobleck(g: torch.Generator) -> Built:
    """Stable Audio's Oobleck VAE: a 1D convolutional waveform autoencoder with Snake
    activations and weight-normed, dilated convolutions."""
    from diffusers import AutoencoderOobleck

    model = AutoencoderOobleck(
        encoder_hidden_size=12, decoder_channels=12, decoder_input_channels=6, audio_channels=2,
        downsampling_ratios=[2, 4], channel_multiples=[1, 2])
    return (Bound(model, ("sample",), dict(sample_posterior=False, return_dict=False)),
            (_randn(g, 2, 2, 24),))


def _prior(g: torch.Generator) -> Built:
    """The unCLIP prior (PriorTransformer): a causally masked transformer over text,
    timestep and image-embedding tokens, predicting a CLIP image embedding."""
    from diffusers import PriorTransformer

    model = PriorTransformer(num_attention_heads=2, attention_head_dim=4, num_layers=2,
                             embedding_dim=8, num_embeddings=7, additional_embeddings=4)
    names = ("hidden_states", "timestep", "proj_embedding", "encoder_hidden_states")
    return Bound(model, names), (_randn(g, 2, 8), torch.tensor([2, 7]), _randn(g, 2, 8),
                                 _randn(g, 2, 7, 8))


def _autoencoder_dc(g: torch.Generator) -> Built:
    """The deep compression autoencoder (DC-AE): residual blocks and EfficientViT blocks
    with ReLU linear attention over multi-scale aggregated tokens."""
    from diffusers import AutoencoderDC

    model = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1],
        downsample_block_type="conv", upsample_block_type="interpolate",
        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)
    return Bound(model, ("sample",)), (_randn(g, 2, 3, 16, 16),)


def _chroma(g: torch.Generator) -> Built:
    """Chroma: Flux's dual- and single-stream blocks, their modulation computed by one
    shared approximator network instead of an AdaLN layer per block."""
    from diffusers import ChromaTransformer2DModel

    model = ChromaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8),
        approximator_num_channels=16, approximator_hidden_dim=32, approximator_layers=1)
    side, tokens = 4, 8
    grid = torch.zeros(side, side, 3)  # image token ids: (0, row, column)
    grid[..., 1] = torch.arange(side)[:, None]
    grid[..., 2] = torch.arange(side)[None, :]
    names = ("hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids")
    return Bound(model, names), (_randn(g, 2, side * side, 4), _randn(g, 2, tokens, 32),
                                 torch.tensor([0.3, 0.8]), grid.reshape(-1, 3),
                                 torch.zeros(tokens, 3))


BUILDERS: dict[str, Callable[[torch.Generator], Built]] = {
    "pixart": _pixart, "hunyuan_dit": _hunyuan_dit, "lumina2": _lumina2, "sana": _sana,
    "auraflow": _auraflow, "cogvideox": _cogvideox, "ltx_video": _ltx_video, "wan": _wan,
    "mochi": _mochi, "qwenimage": _qwenimage, "hidream": _hidream, "cogview4": _cogview4,
    "stable_audio": _stable_audio, "unet3d": _unet3d, "unet_svd": _unet_svd,
    "unet1d": _unet1d, "unet1d_rl": _unet1d_rl, "controlnet": _controlnet,
    "t2i_adapter": _t2i_adapter, "autoencoder_tiny": _autoencoder_tiny,
    "vq_model": _vq_model, "autoencoder_kl_wan": _autoencoder_kl_wan,
    "autoencoder_kl_cogvideox": _autoencoder_kl_cogvideox,
    "autoencoder_oobleck": _autoencoder_oobleck, "prior": _prior,
    "autoencoder_dc": _autoencoder_dc, "chroma": _chroma,
}


def build(name: str) -> Built:
    """The small model ``name`` of :data:`BUILDERS` (seeded random weights, eval mode,
    every dropout probability 0) and its inputs (drawn from a seeded generator).

    >>> model, inputs = build("sana")
    >>> tuple(model(*inputs).shape)                      # (batch, channels, height, width)
    (2, 4, 8, 8)
    """
    torch.manual_seed(0)
    model, inputs = BUILDERS[name](torch.Generator().manual_seed(0))
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.eval(), inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BUILDERS),
                        help="comma-separated names of BUILDERS (default: all)")
    parser.add_argument("--train", action="store_true",
                        help="add a training step through the backend (gradients judged)")
    parser.add_argument("--codegen", choices=CODEGENS,
                        help="the backend's code generator for the compile and train "
                             "columns (default: the device's)")
    add_out_option(parser, "diffusion")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rules = load_rules("all")
    names = args.models.split(",")
    table = SweepTable("model", ("class", "export", "compile", "train"))
    for name in names:
        table.add(name, sweep_row(name, lambda n=name: build(n), rules,
                                  ("compile", "train") if args.train else ("compile",),
                                  args.codegen))
    table.write("diffusion", "diffusers models outside the corpus",
                table.summary(len(names), args.train), args.out)


if __name__ == "__main__":
    main()
