"""A corpus at the sizes users run: eleven published architectures, their configs written
out here with random weights (nothing is downloaded).

Each entry copies the numbers of a published config (named in :attr:`RealModel.source`)
into the library's own model class: GPT-2 small, BERT-base, T5-base's encoder, a decoder
shaped like Llama-3.2-1B, Whisper-base's encoder, ViT-B/16, Swin-T, ConvNeXt-T, ResNet-50 and
EfficientNet-B0 at 224x224 (``transformers``' classes, with their ImageNet-1k heads, as
torchvision and timm build them), and Stable Diffusion 1.5's ``UNet2DConditionModel`` at
64x64 latents (``diffusers``). Weights and inputs are seeded; models are in eval mode with
the library's default attention (``sdpa`` where it has one), decoders without a cache.
Sequence models take a batch and a sequence length (:data:`BATCHES`, :data:`SEQUENCES`);
image, audio and latent inputs have the size the config fixes and honour the batch only.

``tiny=True`` keeps each architecture and shrinks its config (one layer or block per
stage, hidden sizes of 16-64, vocabularies of 1000, small images and latents), so that
tests check every builder in seconds; the real sizes are for benchmarks only.

>>> case = build("gpt2", batch=1, seq=16, tiny=True)
>>> tuple(case.model(*case.inputs).shape)               # (batch, sequence, vocabulary)
(1, 16, 1000)
>>> REAL_SIZE["llama"].fields["num_hidden_layers"], REAL_SIZE["llama"].takes_seq
(16, True)

``python benchmarks/real_size.py [--tiny]`` builds every entry at batch 1, sequence 128 and
prints its parameters, inputs and outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus import Case, TensorModel  # noqa: E402

BATCHES = (1, 8)
"""The batch sizes of the corpus's cells."""
SEQUENCES = (128, 512)
"""The sequence lengths of the corpus's cells, for the models that take one."""
SEED = 0

Draw = Callable[[Mapping[str, Any], int, int], tuple[torch.Tensor, ...]]
"""Inputs drawn from a model's config fields, a batch size and a sequence length."""


@dataclass(frozen=True)
class RealModel:
    """One corpus entry: the published config's ``fields`` (keyword arguments of the
    config class, or of a ``diffusers`` model's ``from_config``) and the ``tiny`` ones that
    replace some of them, how to ``make`` the model from the fields, the keyword ``names``
    of its positional inputs and the output ``outputs`` returned, how to ``draw`` inputs,
    and whether it ``takes_seq`` (a sequence length; otherwise the config fixes the
    input's size)."""

    name: str
    source: str
    make: Callable[[Mapping[str, Any]], nn.Module]
    fields: Mapping[str, Any]
    tiny: Mapping[str, Any]
    names: tuple[str, ...]
    outputs: tuple[str, ...]
    draw: Draw
    takes_seq: bool

    def config(self, tiny: bool = False) -> dict[str, Any]:
        """The config fields: the published ones, with :attr:`tiny`'s over them if asked.

        >>> REAL_SIZE["vit"].config(tiny=True)["num_hidden_layers"]
        1
        """
        return {**self.fields, **self.tiny} if tiny else dict(self.fields)


# --- inputs ----------------------------------------------------------------------------

def _generator(batch: int, seq: int) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + 1000 * batch + seq)


def token_ids(fields: Mapping[str, Any], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Token ids over the whole vocabulary but the first three ids (pad, bos and eos in
    most configs)."""
    return (torch.randint(3, fields["vocab_size"], (batch, seq), generator=_generator(batch, seq)),)


def ids_and_mask(fields: Mapping[str, Any], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Token ids and an attention mask; in a batch of several, the last sequence is a
    quarter shorter than the rest (padded), as batches of unequal texts are."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[-1, seq - seq // 4:] = 0
    return token_ids(fields, batch, seq) + (mask,)


def pixels(fields: Mapping[str, Any], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Images of the config's ``image_size`` (the sequence length does not apply)."""
    side = fields["image_size"]
    return (torch.randn(batch, 3, side, side, generator=_generator(batch, 0)),)


def log_mel(fields: Mapping[str, Any], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Log-mel features of Whisper's fixed window: ``2 * max_source_positions`` frames."""
    frames = 2 * fields["max_source_positions"]
    return (torch.randn(batch, fields["num_mel_bins"], frames, generator=_generator(batch, 0)),)


TEXT_TOKENS = 77
"""The length of the encoded prompt a text-conditioned denoiser attends to (CLIP's)."""


def latents_step_text(fields: Mapping[str, Any], batch: int,
                      seq: int) -> tuple[torch.Tensor, ...]:
    """A denoising step's inputs: latents, a timestep per sample (an integer step of a
    1000-step schedule) and the encoded prompt."""
    g = _generator(batch, 0)
    side = fields["sample_size"]
    return (torch.randn(batch, fields["in_channels"], side, side, generator=g),
            torch.randint(0, 1000, (batch,), generator=g),
            torch.randn(batch, TEXT_TOKENS, fields["cross_attention_dim"], generator=g))


# --- models ----------------------------------------------------------------------------

def _transformers(model: str, config: str) -> Callable[[Mapping[str, Any]], nn.Module]:
    """A maker of ``transformers.<model>`` from ``transformers.<config>(**fields)``."""
    def make(fields: Mapping[str, Any]) -> nn.Module:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**fields))
    return make


def _whisper_encoder(fields: Mapping[str, Any]) -> nn.Module:
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    return WhisperEncoder(transformers.WhisperConfig(**fields))


def _unet(fields: Mapping[str, Any]) -> nn.Module:
    import diffusers

    return diffusers.UNet2DConditionModel.from_config(dict(fields))


TEXT_TINY = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=128)
"""The tiny size of a BERT-like config."""
IMAGE_CLASSES = dict(num_labels=1000)
"""An ImageNet-1k classifier head, as torchvision's and timm's image models have."""

_ENTRIES = (
    RealModel(
        "gpt2", "openai-community/gpt2", _transformers("GPT2LMHeadModel", "GPT2Config"),
        dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
             activation_function="gelu_new", layer_norm_epsilon=1e-5, bos_token_id=50256,
             eos_token_id=50256, use_cache=False),
        dict(vocab_size=1000, n_embd=64, n_layer=1, n_head=4, bos_token_id=1, eos_token_id=2),
        ("input_ids",), ("logits",), token_ids, True),
    RealModel(
        "bert", "google-bert/bert-base-uncased", _transformers("BertModel", "BertConfig"),
        dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512,
             type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0),
        TEXT_TINY,
        ("input_ids", "attention_mask"), ("last_hidden_state", "pooler_output"),
        ids_and_mask, True),
    RealModel(
        "t5_encoder", "google-t5/t5-base", _transformers("T5EncoderModel", "T5Config"),
        dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
             relative_attention_num_buckets=32, relative_attention_max_distance=128,
             feed_forward_proj="relu", layer_norm_epsilon=1e-6, use_cache=False),
        dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4),
        ("input_ids",), ("last_hidden_state",), token_ids, True),
    RealModel(
        "llama", "meta-llama/Llama-3.2-1B", _transformers("LlamaForCausalLM", "LlamaConfig"),
        dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
             num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
             rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192),
             tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
             use_cache=False),
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, bos_token_id=1,
             eos_token_id=2),
        ("input_ids",), ("logits",), token_ids, True),
    RealModel(
        "whisper_encoder", "openai/whisper-base", _whisper_encoder,
        dict(vocab_size=51865, num_mel_bins=80, d_model=512, encoder_layers=6,
             encoder_attention_heads=8, encoder_ffn_dim=2048, decoder_layers=6,
             decoder_attention_heads=8, decoder_ffn_dim=2048, max_source_positions=1500,
             max_target_positions=448, activation_function="gelu", use_cache=False),
        dict(d_model=64, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
             max_source_positions=16),
        ("input_features",), ("last_hidden_state",), log_mel, False),
    RealModel(
        "vit", "google/vit-base-patch16-224",
        _transformers("ViTForImageClassification", "ViTConfig"),
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12, image_size=224,
             patch_size=16, qkv_bias=True, **IMAGE_CLASSES),
        dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
             image_size=64),
        ("pixel_values",), ("logits",), pixels, False),
    RealModel(
        "swin", "microsoft/swin-tiny-patch4-window7-224",
        _transformers("SwinForImageClassification", "SwinConfig"),
        dict(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
             num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4.0, qkv_bias=True,
             hidden_act="gelu", layer_norm_eps=1e-5, drop_path_rate=0.1, **IMAGE_CLASSES),
        # (three stages: a stage smaller than its window fails in transformers' sdpa attention)
        dict(embed_dim=16, depths=[2, 1, 1], num_heads=[1, 2, 4], window_size=4, image_size=64),
        ("pixel_values",), ("logits",), pixels, False),
    RealModel(
        "convnext", "facebook/convnext-tiny-224",
        _transformers("ConvNextForImageClassification", "ConvNextConfig"),
        dict(num_stages=4, patch_size=4, hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3],
             hidden_act="gelu", layer_norm_eps=1e-12, layer_scale_init_value=1e-6,
             drop_path_rate=0.0, image_size=224, **IMAGE_CLASSES),
        dict(hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1], image_size=64),
        ("pixel_values",), ("logits",), pixels, False),
    RealModel(
        "resnet50", "microsoft/resnet-50",
        _transformers("ResNetForImageClassification", "ResNetConfig"),
        dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
             layer_type="bottleneck", hidden_act="relu", downsample_in_first_stage=False,
             image_size=224, **IMAGE_CLASSES),  # (the size of the inputs: the model takes any)
        dict(embedding_size=16, hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1],
             image_size=64),
        ("pixel_values",), ("logits",), pixels, False),
    RealModel(
        "efficientnet_b0", "google/efficientnet-b0",
        _transformers("EfficientNetForImageClassification", "EfficientNetConfig"),
        dict(image_size=224, width_coefficient=1.0, depth_coefficient=1.0, depth_divisor=8,
             kernel_sizes=[3, 3, 5, 3, 5, 5, 3], in_channels=[32, 16, 24, 40, 80, 112, 192],
             out_channels=[16, 24, 40, 80, 112, 192, 320], strides=[1, 2, 2, 2, 1, 2, 1],
             num_block_repeats=[1, 2, 2, 3, 3, 4, 1], expand_ratios=[1, 6, 6, 6, 6, 6, 6],
             squeeze_expansion_ratio=0.25, hidden_act="swish", hidden_dim=1280,
             pooling_type="mean", batch_norm_eps=1e-3, dropout_rate=0.2,
             drop_connect_rate=0.2, **IMAGE_CLASSES),
        dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
             hidden_dim=320),  # (the top convolution's width: 1280 scaled by the width)
        ("pixel_values",), ("logits",), pixels, False),
    RealModel(
        "unet_sd", "stable-diffusion-v1-5 (unet/config.json)", _unet,
        dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
             block_out_channels=(320, 640, 1280, 1280),
             down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                               "CrossAttnDownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                             "CrossAttnUpBlock2D"),
             cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32, norm_eps=1e-5,
             act_fn="silu", flip_sin_to_cos=True, freq_shift=0, downsample_padding=1,
             mid_block_scale_factor=1),
        dict(sample_size=16, layers_per_block=1, block_out_channels=(32, 64),
             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
             norm_num_groups=8),
        ("sample", "timestep", "encoder_hidden_states"), ("sample",), latents_step_text,
        False),
)

REAL_SIZE: dict[str, RealModel] = {entry.name: entry for entry in _ENTRIES}
"""The corpus, by name."""
MODELS: tuple[str, ...] = tuple(REAL_SIZE)


def build(name: str, batch: int = 1, seq: int = 128, tiny: bool = False) -> Case:
    """Corpus entry ``name`` (one of :data:`MODELS`) with seeded random weights in eval
    mode, wrapped to take positional tensors and return plain ones, with inputs of
    ``batch`` and ``seq`` (where the model takes a sequence); ``tiny``: the shrunk config
    (:meth:`RealModel.config`).

    >>> case = build("resnet50", batch=2, tiny=True)
    >>> tuple(case.inputs[0].shape), tuple(case.model(*case.inputs).shape)
    ((2, 3, 64, 64), (2, 1000))
    """
    if name not in REAL_SIZE:
        raise KeyError(f"unknown real-size model {name!r}; choose from {', '.join(MODELS)}")
    entry = REAL_SIZE[name]
    fields = entry.config(tiny)
    torch.manual_seed(SEED)
    model = entry.make(fields).eval()

    def make_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        return entry.draw(fields, batch, seq)
    return Case(name, TensorModel(model, entry.names, entry.outputs).eval(),
                make_inputs(batch, seq), make_inputs, "seq" if entry.takes_seq else "batch")


# --- a decode step against a key-value cache -------------------------------------------

DECODERS = ("gpt2", "llama")
"""The entries with a decode step (:func:`decode_step`): causal LMs whose forward takes a
``transformers`` cache."""
CACHED = 512
"""The tokens a decode step's cache holds by default."""


class DecodeStep(nn.Module):
    """One decode step of the causal LM ``model`` against a key-value cache, as a served
    model runs it: positional inputs, the new token ids then each layer's cached keys and
    values; it returns the logits and each layer's keys and values with the new token's
    appended. The ``transformers`` ``DynamicCache`` the model's forward takes is built from
    the cached tensors in each call (the model appends to the cache it is given, so one
    kept across calls would grow at every step)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cache = cache_name(model)

    def forward(self, input_ids: torch.Tensor, *cached: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(list(zip(cached[0::2], cached[1::2])))
        out = self.model(input_ids=input_ids, use_cache=True, **{self.cache: cache})
        return (out.logits, *_flat(getattr(out, self.cache)))


def cache_name(model: nn.Module) -> str:
    """The name a ``transformers`` model's forward takes its cache by, and its output
    returns it by: ``cache`` in recent releases (5.24 has it), ``past_key_values`` in older
    ones."""
    import inspect

    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


def _flat(cache: Any) -> tuple[torch.Tensor, ...]:
    return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


def decode_step(name: str, batch: int = 1, cached: int = CACHED, tiny: bool = False) -> Case:
    """Entry ``name`` (one of :data:`DECODERS`), its weights as :func:`build` makes them,
    as a :class:`DecodeStep`: its inputs are one new token per sequence of ``batch`` and
    the cache a prefill of ``cached`` seeded tokens left (``Case.make_inputs(batch,
    cached)`` prefills again).

    >>> case = decode_step("gpt2", cached=8, tiny=True)
    >>> logits, key, *_ = case.model(*case.inputs)
    >>> tuple(case.inputs[1].shape), tuple(logits.shape), tuple(key.shape)
    ((1, 4, 8, 16), (1, 1, 1000), (1, 4, 9, 16))
    """
    if name not in DECODERS:
        raise KeyError(f"{name!r} has no decode step; choose from {', '.join(DECODERS)}")
    entry = REAL_SIZE[name]
    fields = {**entry.config(tiny), "use_cache": True}
    torch.manual_seed(SEED)
    model = entry.make(fields).eval()

    def make_inputs(batch: int, cached: int) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            out = model(input_ids=token_ids(fields, batch, cached)[0], use_cache=True)
        return token_ids(fields, batch, 1) + _flat(getattr(out, cache_name(model)))
    return Case(f"{name} decode", DecodeStep(model).eval(), make_inputs(batch, cached),
                make_inputs, "seq")


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"
    return "(" + ", ".join(_describe(v) for v in x) + ")"


if __name__ == "__main__":
    tiny = "--tiny" in sys.argv[1:]
    for model_name in MODELS:
        case = build(model_name, tiny=tiny)
        with torch.no_grad():
            result = case.model(*case.inputs)
        params = sum(p.numel() for p in case.model.parameters())
        print(f"{model_name:<16} params {params / 1e6:>8.1f} M  in {_describe(case.inputs):<40} "
              f"out {_describe(result)}", flush=True)
