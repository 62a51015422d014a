"""A corpus of real architectures from ``transformers`` and ``diffusers``, small and randomly
initialised.

Every entry builds the library's own model class from a small config (2 layers, hidden size
64, vocabulary 1000, 32x32 images in 8x8 patches; 16x16 latents for the denoisers and the
autoencoder of :data:`DIFFUSION`): nothing is downloaded. Weights and inputs
are seeded, so a build is the same in every run. Models are in eval mode with every dropout
probability at 0 (so ``model.train()`` gives a deterministic training graph too), decoders
have ``use_cache=False`` (torch.export cannot return a ``DynamicCache``), and attention is
``"eager"`` unless ``attn="sdpa"`` is asked for.

Each model is wrapped in a small ``nn.Module`` that takes its inputs as positional tensors
and returns plain tensors (one tensor, or a tuple for several outputs), so torch.export,
``EGraph.from_fx`` and torch.compile all see tensors in and tensors out.

>>> import torch
>>> from benchmarks.corpus import MODELS, build
>>> case = build("gpt2")
>>> out = case.model(*case.inputs)
>>> tuple(out.shape)                                    # (batch, sequence, vocabulary)
(2, 8, 1000)
>>> tuple(case.model(*case.second_inputs()).shape)      # a second sequence length
(2, 12, 1000)
>>> tuple(case.model(*case.third_inputs()).shape)       # another batch and length
(5, 16, 1000)
>>> "llama" in MODELS and "whisper_encoder" in MODELS and "unet2d_cond" in MODELS
True

``python benchmarks/corpus.py`` builds every entry and prints its inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

VOCAB = 1000
HIDDEN = 64
HEADS = 4
FFN = 128
LAYERS = 2
POSITIONS = 64
IMAGE = 32
PATCH = 8
BATCH = 2
SEQ = 8
SEQ2 = 12       # the second sequence length
BATCH2 = 3      # the second batch size, for models whose sequence length is fixed
SEQ3 = 16       # the third size: another sequence length and another batch size at once
BATCH3 = 5
SEED = 0


class TensorModel(nn.Module):
    """A transformers model taking positional tensors and returning plain tensors.

    ``names`` are the keyword names of the positional inputs; ``outputs`` the attributes of
    the model output to return (one: a tensor, several: a tuple of tensors).
    """

    def __init__(self, model: nn.Module, names: tuple[str, ...], outputs: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.outputs = tuple(outputs)

    def forward(self, *inputs: torch.Tensor):
        out = self.model(**dict(zip(self.names, inputs)))
        values = tuple(getattr(out, name) for name in self.outputs)
        return values[0] if len(values) == 1 else values


@dataclass
class Case:
    """One built corpus entry: the wrapped model, its example inputs, and the inputs for
    other sizes (``make_inputs(batch, seq)``; sequence models honour ``seq``, image and
    audio models have a fixed sequence length and honour ``batch`` only)."""

    name: str
    model: TensorModel
    inputs: tuple[torch.Tensor, ...]
    make_inputs: Callable[[int, int], tuple[torch.Tensor, ...]]
    varies: str                       # "seq" or "batch": what second_inputs() changes

    def second_inputs(self) -> tuple[torch.Tensor, ...]:
        """Inputs of a second size: another sequence length (or batch size where the
        sequence length is fixed by the architecture)."""
        if self.varies == "seq":
            return self.make_inputs(BATCH, SEQ2)
        return self.make_inputs(BATCH2, SEQ)

    def third_inputs(self) -> tuple[torch.Tensor, ...]:
        """Inputs of a third size: another batch size, and another sequence length where
        the model takes one (both differ from the first and second sizes')."""
        return self.make_inputs(BATCH3, SEQ3 if self.varies == "seq" else SEQ)


# --- inputs ----------------------------------------------------------------------------

def _generator(batch: int, seq: int) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + 1000 * batch + seq)


def _ids(batch: int, seq: int, g: torch.Generator, low: int = 3) -> torch.Tensor:
    """Token ids avoiding the special ids 0-2 (pad, bos, eos in most configs)."""
    return torch.randint(low, VOCAB, (batch, seq), generator=g)


def _mask(batch: int, seq: int) -> torch.Tensor:
    """An attention mask with padding: the last row has its last quarter padded."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[-1, seq - max(1, seq // 4):] = 0
    return mask


def ids_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    return (_ids(batch, seq, _generator(batch, seq)),)


def ids_mask_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    return (_ids(batch, seq, _generator(batch, seq)), _mask(batch, seq))


def seq2seq_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Encoder ids and decoder ids (the decoder half as long, at least 2 tokens)."""
    g = _generator(batch, seq)
    return _ids(batch, seq, g), _ids(batch, max(2, seq // 2), g)


def clip_text_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    """Ids ending in the end-of-text token (id 2), which CLIP's pooler looks for."""
    ids = _ids(batch, seq, _generator(batch, seq))
    ids[:, -1] = 2
    return (ids,)


def image_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    g = _generator(batch, 0)
    return (torch.randn(batch, 3, IMAGE, IMAGE, generator=g),)


WHISPER_MELS = 16
WHISPER_POSITIONS = 16      # the encoder takes exactly 2 * max_source_positions frames


def audio_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    g = _generator(batch, 0)
    return (torch.randn(batch, WHISPER_MELS, 2 * WHISPER_POSITIONS, generator=g),)


# --- configs ---------------------------------------------------------------------------

def _decoder_only(config_cls, **extra):
    """Llama-family config: 2 layers, hidden 64, 4 heads (2 key/value heads), no cache."""
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=2, max_position_embeddings=POSITIONS,
                  attention_dropout=0.0, use_cache=False, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    fields.update(extra)
    return config_cls(**fields)


def _gpt2(t):
    config = t.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=HIDDEN,
                          n_layer=LAYERS, n_head=HEADS, n_inner=FFN, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                          bos_token_id=1, eos_token_id=2)
    return t.GPT2LMHeadModel, config, ("input_ids",), ("logits",), ids_inputs, "seq"


def _bert_fields():
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, intermediate_size=FFN,
                max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, classifier_dropout=0.0)


def _bert(t):
    config = t.BertConfig(**_bert_fields())
    return (t.BertModel, config, ("input_ids", "attention_mask"),
            ("last_hidden_state", "pooler_output"), ids_mask_inputs, "seq")


def _roberta(t):
    config = t.RobertaConfig(**_bert_fields(), pad_token_id=1)
    return (t.RobertaModel, config, ("input_ids", "attention_mask"), ("last_hidden_state",),
            ids_mask_inputs, "seq")


def _distilbert(t):
    config = t.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                hidden_dim=FFN, max_position_embeddings=POSITIONS,
                                dropout=0.0, attention_dropout=0.0)
    return (t.DistilBertModel, config, ("input_ids", "attention_mask"), ("last_hidden_state",),
            ids_mask_inputs, "seq")


def _albert(t):
    fields = _bert_fields()
    fields.pop("classifier_dropout")
    config = t.AlbertConfig(**fields, embedding_size=32, classifier_dropout_prob=0.0)
    return (t.AlbertModel, config, ("input_ids", "attention_mask"), ("last_hidden_state",),
            ids_mask_inputs, "seq")


def _deberta_v2(t):
    """Disentangled attention (relative positions in both directions); no mask given, so
    the model makes its own from the input's size."""
    fields = _bert_fields()
    fields.pop("classifier_dropout")
    config = t.DebertaV2Config(**fields, relative_attention=True, position_buckets=16,
                               max_relative_positions=POSITIONS,
                               pos_att_type=["p2c", "c2p"])
    return t.DebertaV2Model, config, ("input_ids",), ("last_hidden_state",), ids_inputs, "seq"


def _t5_config(t):
    return t.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
                      num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS,
                      relative_attention_num_buckets=8, relative_attention_max_distance=32,
                      dropout_rate=0.0, use_cache=False, decoder_start_token_id=0)


def _t5_encoder(t):
    return (t.T5EncoderModel, _t5_config(t), ("input_ids",), ("last_hidden_state",),
            ids_inputs, "seq")


def _t5(t):
    return (t.T5ForConditionalGeneration, _t5_config(t), ("input_ids", "decoder_input_ids"),
            ("logits",), seq2seq_inputs, "seq")


def _bart(t):
    config = t.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS,
                          decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                          decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                          decoder_ffn_dim=FFN, max_position_embeddings=POSITIONS,
                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          use_cache=False)
    return (t.BartModel, config, ("input_ids", "decoder_input_ids"), ("last_hidden_state",),
            seq2seq_inputs, "seq")


def _llama(t):
    return (t.LlamaForCausalLM, _decoder_only(t.LlamaConfig), ("input_ids",), ("logits",),
            ids_inputs, "seq")


def _mistral(t):
    return (t.MistralModel, _decoder_only(t.MistralConfig, sliding_window=None),
            ("input_ids",), ("last_hidden_state",), ids_inputs, "seq")


def _qwen2(t):
    return (t.Qwen2Model, _decoder_only(t.Qwen2Config), ("input_ids",),
            ("last_hidden_state",), ids_inputs, "seq")


def _gemma(t):
    return (t.GemmaModel, _decoder_only(t.GemmaConfig, head_dim=HIDDEN // HEADS),
            ("input_ids",), ("last_hidden_state",), ids_inputs, "seq")


def _phi(t):
    config = _decoder_only(t.PhiConfig, num_key_value_heads=HEADS, resid_pdrop=0.0,
                           embd_pdrop=0.0)
    return t.PhiModel, config, ("input_ids",), ("last_hidden_state",), ids_inputs, "seq"


def _mixtral(t):
    config = _decoder_only(t.MixtralConfig, num_local_experts=4, num_experts_per_tok=2,
                           router_jitter_noise=0.0)
    return t.MixtralModel, config, ("input_ids",), ("last_hidden_state",), ids_inputs, "seq"


def _qwen2_moe(t):
    config = _decoder_only(t.Qwen2MoeConfig, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, shared_expert_intermediate_size=64)
    return t.Qwen2MoeModel, config, ("input_ids",), ("last_hidden_state",), ids_inputs, "seq"


def _vit(t):
    config = t.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=FFN, image_size=IMAGE,
                         patch_size=PATCH, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    return (t.ViTModel, config, ("pixel_values",), ("last_hidden_state", "pooler_output"),
            image_inputs, "batch")


def _clip_text(t):
    config = t.CLIPTextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                              projection_dim=HIDDEN, num_hidden_layers=LAYERS,
                              num_attention_heads=HEADS, max_position_embeddings=POSITIONS,
                              attention_dropout=0.0, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2)
    return (t.CLIPTextModel, config, ("input_ids",), ("last_hidden_state", "pooler_output"),
            clip_text_inputs, "seq")


def _clip_vision(t):
    config = t.CLIPVisionConfig(hidden_size=HIDDEN, intermediate_size=FFN,
                                projection_dim=HIDDEN, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, image_size=IMAGE,
                                patch_size=PATCH, attention_dropout=0.0)
    return (t.CLIPVisionModel, config, ("pixel_values",), ("last_hidden_state", "pooler_output"),
            image_inputs, "batch")


def _resnet(t):
    """Convolutions, batch norm (eval: folded statistics), max pooling in the stem and
    adaptive average pooling in the pooler."""
    config = t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                            layer_type="bottleneck")
    return (t.ResNetModel, config, ("pixel_values",), ("last_hidden_state", "pooler_output"),
            image_inputs, "batch")


def _convnext(t):
    """Depthwise 7x7 convolutions, channels-last layer norm, a layer-scale multiply."""
    config = t.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                              image_size=IMAGE, drop_path_rate=0.0)
    return (t.ConvNextModel, config, ("pixel_values",), ("last_hidden_state", "pooler_output"),
            image_inputs, "batch")


def _swin(t):
    """Shifted-window attention (the first stage's second block shifts): rolls, window
    partitions by view and permute, a relative position bias gathered by index, a
    patch-merging concatenation."""
    config = t.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[2, 1],
                          num_heads=[2, 4], window_size=4, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return (t.SwinModel, config, ("pixel_values",), ("last_hidden_state", "pooler_output"),
            image_inputs, "batch")


def _mamba(t):
    """A state-space model: no attention; under torch.compile transformers builds its
    masks with ``torch.vmap``."""
    config = t.MambaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           state_size=8, expand=2, use_cache=False, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2)
    return (t.MambaModel, config, ("input_ids",), ("last_hidden_state",), ids_inputs, "seq")


def _whisper_encoder(t):
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = t.WhisperConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS,
                             decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                             decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                             decoder_ffn_dim=FFN, num_mel_bins=WHISPER_MELS,
                             max_source_positions=WHISPER_POSITIONS,
                             max_target_positions=POSITIONS, dropout=0.0,
                             attention_dropout=0.0, activation_dropout=0.0, use_cache=False,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             decoder_start_token_id=1)
    return (WhisperEncoder, config, ("input_features",), ("last_hidden_state",), audio_inputs,
            "batch")


# --- diffusers: denoisers and autoencoders of image generation -------------------------
# (their models take keyword sizes, not a config object: ``from_config`` of a dict)

LATENT = 16     # latent images are 16x16 (8x8 for the patchified transformers)


def latent_inputs(channels: int, size: int, *extra: Callable):
    """Inputs of a denoiser: a latent image of ``channels`` x ``size`` x ``size``, a
    timestep per sample (integer steps of a 1000-step schedule), then ``extra`` inputs, each
    drawn by ``extra(batch, g)``."""
    def drawn(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        g = _generator(batch, 0)
        latents = torch.randn(batch, channels, size, size, generator=g)
        steps = torch.randint(0, 1000, (batch,), generator=g)
        return (latents, steps, *(make(batch, g) for make in extra))
    return drawn


def _text_states(width: int, tokens: int = 7) -> Callable:
    """Encoded text, as a text encoder hands it to a conditioned denoiser."""
    return lambda batch, g: torch.randn(batch, tokens, width, generator=g)


def _diffusers(cls_name: str, fields: dict, names, drawn) -> tuple:
    import diffusers

    def model(config: dict) -> nn.Module:
        built = getattr(diffusers, cls_name).from_config(config)
        for module in built.modules():  # class-label dropout (DiT's): a draw in training
            if isinstance(module, diffusers.models.embeddings.LabelEmbedding):
                module.dropout_prob = 0.0
        return built
    return model, fields, tuple(names), ("sample",), drawn, "batch"


def _unet2d(t):
    """DDPM's denoiser: residual blocks with group norm and SiLU, a self-attention block
    at the lower resolution, a sinusoidal timestep embedding, nearest upsampling."""
    fields = dict(sample_size=LATENT, in_channels=3, out_channels=3, layers_per_block=1,
                  block_out_channels=(32, 64), norm_num_groups=8, attention_head_dim=8,
                  down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                  up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    return _diffusers("UNet2DModel", fields, ("sample", "timestep"), latent_inputs(3, LATENT))


def _unet2d_cond(t):
    """Stable Diffusion's denoiser: transformer blocks with self- and cross-attention to
    encoded text, GEGLU feed-forward, skip connections across the U."""
    fields = dict(sample_size=LATENT, in_channels=4, out_channels=4, layers_per_block=1,
                  block_out_channels=(32, 64), norm_num_groups=8, attention_head_dim=8,
                  cross_attention_dim=32,
                  down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    return _diffusers("UNet2DConditionModel", fields,
                      ("sample", "timestep", "encoder_hidden_states"),
                      latent_inputs(4, LATENT, _text_states(32)))


def _vae(t):
    """Stable Diffusion's autoencoder: encode an image to a latent distribution, decode
    its mode (``sample_posterior`` is off: no draw)."""
    fields = dict(in_channels=3, out_channels=3, block_out_channels=(32, 64),
                  down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                  norm_num_groups=8, sample_size=LATENT)

    def drawn(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, 3, LATENT, LATENT, generator=_generator(batch, 0)),)
    return _diffusers("AutoencoderKL", fields, ("sample",), drawn)


def _dit(t):
    """Diffusion transformer: patchified latents, adaptive layer norm from the timestep and
    class label."""
    fields = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                  out_channels=8, num_layers=LAYERS, sample_size=LATENT // 2, patch_size=2,
                  num_embeds_ada_norm=10)
    labels = lambda batch, g: torch.randint(0, 10, (batch,), generator=g)  # noqa: E731
    return _diffusers("DiTTransformer2DModel", fields,
                      ("hidden_states", "timestep", "class_labels"),
                      latent_inputs(4, LATENT // 2, labels))


def _sd3(t):
    """Stable Diffusion 3's joint transformer: image and text tokens attend together,
    modulated by the timestep and a pooled text embedding."""
    fields = dict(sample_size=LATENT // 2, patch_size=2, in_channels=4, out_channels=4,
                  num_layers=LAYERS, attention_head_dim=8, num_attention_heads=4,
                  joint_attention_dim=32, caption_projection_dim=32,
                  pooled_projection_dim=16, pos_embed_max_size=16)
    drawn = latent_inputs(4, LATENT // 2, _text_states(32),
                          lambda batch, g: torch.randn(batch, 16, generator=g))

    def ordered(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        latents, steps, text, pooled = drawn(batch, seq)
        return latents, text, pooled, steps
    return _diffusers("SD3Transformer2DModel", fields,
                      ("hidden_states", "encoder_hidden_states", "pooled_projections",
                       "timestep"), ordered)


def _flux(t):
    """Flux's transformer: double-stream then single-stream blocks, rotary embeddings from
    3-axis position ids, a timestep in [0, 1)."""
    fields = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                  pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    side, tokens = 4, 7

    def drawn(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        g = _generator(batch, 0)
        grid = torch.zeros(side, side, 3)
        grid[..., 1] = torch.arange(side)[:, None]
        grid[..., 2] = torch.arange(side)[None, :]
        return (torch.randn(batch, side * side, 16, generator=g),
                torch.randn(batch, tokens, 32, generator=g),
                torch.randn(batch, 32, generator=g), torch.rand(batch, generator=g),
                grid.reshape(-1, 3), torch.zeros(tokens, 3))
    return _diffusers("FluxTransformer2DModel", fields,
                      ("hidden_states", "encoder_hidden_states", "pooled_projections",
                       "timestep", "img_ids", "txt_ids"), drawn)


_SPECS: dict[str, Callable] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "roberta": _roberta,
    "distilbert": _distilbert,
    "albert": _albert,
    "deberta_v2": _deberta_v2,
    "t5_encoder": _t5_encoder,
    "t5": _t5,
    "bart": _bart,
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "gemma": _gemma,
    "phi": _phi,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "vit": _vit,
    "clip_text": _clip_text,
    "clip_vision": _clip_vision,
    "resnet": _resnet,
    "convnext": _convnext,
    "swin": _swin,
    "whisper_encoder": _whisper_encoder,
    "mamba": _mamba,
    "unet2d": _unet2d,
    "unet2d_cond": _unet2d_cond,
    "vae": _vae,
    "dit": _dit,
    "sd3": _sd3,
    "flux": _flux,
}

MODELS: tuple[str, ...] = tuple(_SPECS)
DIFFUSION: frozenset[str] = frozenset({"unet2d", "unet2d_cond", "vae", "dit", "sd3", "flux"})
"""Corpus models from ``diffusers`` (the rest are from ``transformers``)."""
FIXED_ATTENTION: frozenset[str] = frozenset({"resnet", "convnext", "deberta_v2", "mamba"}
                                            | DIFFUSION)
"""Corpus models whose attention cannot be chosen: they have none (ResNet, ConvNeXt, Mamba) or
only their own (DeBERTa-v2's disentangled attention has no sdpa form; diffusers' models
keep their attention processors, sdpa). transformers refuses an implementation for them,
and :func:`build` leaves theirs unset (the same model under either ``attn``)."""
ATTENTION = ("eager", "sdpa")


def _gpt2_small(t):
    """GPT-2 small's shape (12 layers, hidden 768, 12 heads) with the vocabulary padded to
    50304, for the pipeline's time on a full-sized decoder."""
    config = t.GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12,
                          n_head=12, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          use_cache=False, bos_token_id=1, eos_token_id=2)
    return t.GPT2LMHeadModel, config, ("input_ids",), ("logits",), ids_inputs, "seq"


LARGE: dict[str, tuple[Callable, int, int]] = {"gpt2_small": (_gpt2_small, 1, 128)}
"""Full-sized models, outside :data:`MODELS` (tests never build them): name -> (config,
batch, sequence length)."""


def build(name: str, attn: str = "eager", device: str = "cpu",
          dtype: torch.dtype | None = None) -> Case:
    """Build corpus entry ``name`` (one of :data:`MODELS`, or of :data:`LARGE`) with
    attention implementation ``attn`` ("eager" or "sdpa"): the wrapped model in eval mode,
    seeded weights, example inputs of batch 2 and sequence length 8 (a large model's own
    batch and sequence length), model and inputs on ``device`` (the same weights and
    inputs on every device: they are drawn on the CPU); with ``dtype``, the model and its
    floating inputs in that dtype (``model.to(torch.bfloat16)``, as users run on CPUs)."""
    if name in LARGE:
        spec, batch, seq = LARGE[name]
    elif name in _SPECS:
        spec, batch, seq = _SPECS[name], BATCH, SEQ
    else:
        raise KeyError(f"unknown corpus model {name!r}; choose from "
                       f"{', '.join(MODELS + tuple(LARGE))}")
    if attn not in ATTENTION:
        raise ValueError(f"attn={attn!r}: use one of {ATTENTION}")
    import transformers

    model_cls, config, names, outputs, drawn, varies = spec(transformers)

    def make_inputs(batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        return tuple(x.to(device, dtype) if dtype is not None and x.is_floating_point()
                     else x.to(device) for x in drawn(batch, seq))
    if name not in FIXED_ATTENTION:
        config._attn_implementation = attn
    torch.manual_seed(SEED)
    model = model_cls(config)
    model.eval()
    wrapped = TensorModel(model, names, outputs).to(device, dtype).eval()
    label = name if attn == "eager" else f"{name}@{attn}"
    return Case(label, wrapped, make_inputs(batch, seq), make_inputs, varies)


GENERATES: tuple[str, ...] = ("gpt2", "llama", "mistral", "qwen2", "gemma", "phi", "mixtral",
                              "qwen2_moe", "t5", "bart")
"""Corpus models that generate text (decoders, and encoder-decoders): :func:`build_generation`
builds each with its language-model head."""
CACHES = ("dynamic", "static")
NEW_TOKENS = 6


@dataclass
class Generation:
    """A corpus model as users run a language model: greedy ``model.generate`` with its
    key/value cache, ``NEW_TOKENS`` new tokens after a prompt of batch 2 and length 8.
    ``torch.compile(generation.model.forward, ...)`` in place of the forward is how
    transformers documents compiling it."""

    name: str
    model: nn.Module
    ids: torch.Tensor
    options: dict
    spec: tuple                       # build_generation's arguments

    def __call__(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model.generate(self.ids, **self.options)

    def fresh(self) -> Generation:
        """The same model built again (equal weights), with its own uncompiled forward."""
        return build_generation(*self.spec)


def build_generation(name: str, attn: str = "eager", device: str = "cpu",
                     cache: str = "dynamic") -> Generation:
    """Corpus entry ``name`` (one of :data:`GENERATES`) with its language-model head and
    ``use_cache`` on (the same seeded weights on every build), for greedy generation with a
    ``"dynamic"`` cache (keys and values concatenated each step) or a ``"static"`` one
    (preallocated, updated in place: transformers' recipe for torch.compile).

    >>> generation = build_generation("llama")
    >>> tuple(generation().shape)                      # the prompt and 6 new tokens
    (2, 14)
    """
    if name not in GENERATES:
        raise KeyError(f"corpus model {name!r} does not generate; choose from "
                       f"{', '.join(GENERATES)}")
    if cache not in CACHES:
        raise ValueError(f"cache={cache!r}: use one of {CACHES}")
    import transformers

    config = _SPECS[name](transformers)[1]
    config.use_cache = True
    config._attn_implementation = attn
    seq2seq = config.is_encoder_decoder
    auto = (transformers.AutoModelForSeq2SeqLM if seq2seq
            else transformers.AutoModelForCausalLM)
    torch.manual_seed(SEED)
    model = auto.from_config(config).to(device).eval()
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                   pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    return Generation(f"{name}@{attn}" if attn != "eager" else name, model,
                      ids_inputs(BATCH, SEQ)[0].to(device), options, (name, attn, device, cache))


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"
    return "(" + ", ".join(_describe(v) for v in x) + ")"


if __name__ == "__main__":
    for model_name in MODELS:
        case = build(model_name)
        with torch.no_grad():
            result = case.model(*case.inputs)
        params = sum(p.numel() for p in case.model.parameters())
        print(f"{model_name:<16} params {params:>8}  in {_describe(case.inputs):<40} "
              f"out {_describe(result)}")
