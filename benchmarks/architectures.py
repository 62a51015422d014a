"""A sweep over transformers architectures outside the corpus, built generically from
each model type's default config made small, through torch.export (validated, strict),
torch.compile with the backend, and generation with the compiled forward: what a user
who picks any architecture gets.

    .venv/bin/python benchmarks/architectures.py [--types opt,bloom] [--no-compile]
                                                 [--no-generate] [--train]
                                                 [--checkpointing] [--codegen inductor]
                                                 [--attn eager]

One row per architecture: whether torch.export captures it (a failure there is torch's,
not ours), then ours through export (``ok``, a fallback with validation's reason, a wrong
output or a crash of ours) and through torch.compile (the same, with graph breaks
counted; ``sdpa``: the fused attention calls of the programs it runs, which with ``--attn
eager`` are the attentions the rules found), then, for the types with a causal or
text-to-text language-model head, greedy
``generate`` with the key/value cache and the forward compiled with the backend (its
tokens must be eager's), with ``--train`` a training step through the backend (loss and
gradients equal eager's, float64-judged; with ``--checkpointing``, with transformers'
gradient checkpointing on; ``regions``: the region bodies, checkpointed layers, optimised
on their own), nodes before -> after and the pipeline's seconds.
Outputs are compared with eager's (float64-judged where the float32 outputs differ).
The table is printed and written to benchmarks/results/architectures.md (``--out``)."""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler.compile as compile_backend  # noqa: E402
from benchmarks.corpus import Case  # noqa: E402
from benchmarks.models import _check, _error, _wide, run_train  # noqa: E402
from benchmarks.report import add_out_option, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.options import CODEGENS  # noqa: E402
from compiler.validate import float64_copy, float64_reference  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

TEXT = ("bert electra xlm-roberta mpnet funnel squeezebert mobilebert ernie megatron-bert "
        "roformer camembert big_bird xglm opt gpt_neo gpt_neox gptj bloom falcon codegen "
        "stablelm starcoder2 olmo cohere persimmon phi3 qwen3 granite gemma2 mpt biogpt "
        "nemotron glm helium openai-gpt ctrl gpt_bigcode convbert fnet xlnet modernbert "
        "eurobert nomic_bert").split()
# Recent decoders: grouped and sliding-window attention, mixtures of experts, and hybrids
# with state-space (Mamba-2), recurrent or linear-attention layers
RECENT = ("gemma3_text llama4_text gpt_oss exaone4 smollm3 ernie4_5 seed_oss glm4 olmo2 olmo3 "
          "cohere2 arcee apertus vaultgemma hunyuan_v1_dense ministral doge diffllama bitnet "
          "qwen3_moe olmoe granitemoe jetmoe phimoe minimax glm4_moe hunyuan_v1_moe lfm2 "
          "mamba2 falcon_mamba falcon_h1 bamba jamba nemotron_h recurrent_gemma rwkv xlstm "
          "qwen3_next").split()
VISION = ("mobilenet_v1 mobilenet_v2 efficientnet regnet bit poolformer segformer mobilevit "
          "beit deit dinov2 convnextv2 levit cvt focalnet pvt_v2 glpn swiftformer "
          "vit_msn siglip_vision_model dinov3_vit ijepa vit_mae").split()
AUDIO = "wav2vec2 hubert wavlm sew data2vec-audio whisper speech_to_text".split()
SEQ2SEQ = "bart mbart pegasus marian m2m_100 blenderbot-small plbart t5 mt5 umt5".split()
TYPES = TEXT + RECENT + VISION + AUDIO + SEQ2SEQ

# Scalar fields of a default config set small where the config has them (a config keeps
# the lists of hierarchical models: their stages stay as defined).
SMALL = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
             n_embd=64, n_layer=2, n_head=4, d_model=64, ffn_dim=128, num_layers=2,
             num_heads=4, d_ff=128, embedding_size=64, image_size=32, patch_size=8,
             conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, rotary_dim=8,
             head_dim=16, block_size=4, attention_type="original_full", use_cache=False,
             max_window_layers=2, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, num_decoder_layers=2, num_mel_bins=16,
             max_source_positions=16, max_target_positions=64,
             # state-space and linear-attention layers (Mamba-2 hybrids, Qwen3-Next):
             # heads x head size = expand x hidden, groups dividing the heads
             expand=1, mamba_expand=1, mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64,
             mamba_num_heads=4, mamba_head_dim=16, n_mamba_heads=4, mamba_headdim=16,
             n_groups=1, mamba_d_state=16, state_size=16, ssm_state_size=16,
             mamba_chunk_size=8, chunk_size=8, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             # multi-head latent attention (DeepSeek-V2/V3 and kin): the rotary part of a
             # head as head_dim, low-rank queries and keys, a few routed experts
             qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32,
             q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1)
DROPOUTS = ("dropout", "attention_dropout", "hidden_dropout", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
            "activation_dropout", "classifier_dropout", "feat_proj_dropout",
            "hidden_dropout_rate", "drop_path_rate", "layerdrop", "dropout_rate",
            "final_dropout", "encoder_layerdrop", "decoder_layerdrop",
            # training-time augmentation: random like dropout (SpecAugment's time masks)
            "mask_time_prob", "mask_feature_prob")
BATCH, SEQ, IMAGE, SAMPLES = 2, 8, 32, 1600
NEW_TOKENS = 6
LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=60.0)


def small_config(model_type: str):
    """The config of ``model_type`` with its scalar sizes made small and dropout off
    (:data:`SMALL`, :data:`DROPOUTS`), given to the config's constructor so that what it
    derives (layer types, head sizes) follows (field by field where a validator of the
    whole config refuses that); special token ids inside the vocabulary.

    >>> config = small_config("opt")
    >>> config.hidden_size, config.num_hidden_layers, config.dropout
    (64, 2, 0.0)
    """
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    chosen = {}
    for key, value in SMALL.items():
        derived = isinstance(getattr(type(default), key, None), property)
        if not hasattr(default, key) or derived or (key == "hidden_size" and hasattr(
                default, "hidden_sizes")):
            continue
        current = getattr(default, key)
        if isinstance(current, (list, tuple, dict)) == isinstance(value, tuple):
            chosen[key] = list(value) if isinstance(value, tuple) else value
    for key in DROPOUTS:
        if isinstance(getattr(default, key, None), float):
            chosen[key] = 0.0
    for key, small in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2)):
        if isinstance(getattr(default, key, None), int) and getattr(default, key) >= 1000:
            chosen[key] = small
    if "kv_lora_rank" in chosen and "num_attention_heads" in chosen:
        # (latent attention makes every head's keys from the latent: as many as queries)
        chosen["num_key_value_heads"] = chosen["num_attention_heads"]
    if "conv_dim" in chosen:
        chosen["num_feat_extract_layers"] = len(chosen["conv_dim"])
    try:
        return AutoConfig.for_model(model_type, **chosen)
    except Exception:  # noqa: BLE001 - a validator of the whole config: set field by field
        for key, value in chosen.items():
            try:
                setattr(default, key, value)
            except Exception:  # noqa: BLE001, S112 - a field this config derives: keep it
                continue
        return default


class FirstOutput(nn.Module):
    """A transformers model called with keyword inputs, returning its first output."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.names, inputs)))
        return out[0] if not isinstance(out, torch.Tensor) else out


def build(model_type: str, attn: str | None = None
          ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The small model of ``model_type`` (random weights, eval mode) and its inputs (an
    encoder-decoder's: the encoder's input and decoder ids); ``attn``: the attention
    implementation (``"eager"``: attention written out, as the rules must find it;
    default: transformers' choice, sdpa where the model supports it).

    >>> model, inputs = build("bert")
    >>> tuple(model(*inputs).shape)                      # (batch, sequence, hidden)
    (2, 8, 64)
    """
    from transformers import AutoModel

    torch.manual_seed(0)
    config = small_config(model_type)
    chosen = {"attn_implementation": attn} if attn else {}
    model = AutoModel.from_config(config, **chosen).eval()
    name = model.main_input_name
    g = torch.Generator().manual_seed(0)
    vocab = min(getattr(config, "vocab_size", 1000) or 1000, 1000)
    if name == "input_ids":
        x = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
    elif name == "pixel_values":
        x = torch.randn(BATCH, getattr(config, "num_channels", 3), IMAGE, IMAGE, generator=g)
    elif name == "input_values":
        x = torch.randn(BATCH, SAMPLES, generator=g)
    elif name == "input_features":  # log-mel frames: Whisper takes exactly its own count
        mels = getattr(config, "num_mel_bins", 80)
        frames = 2 * getattr(config, "max_source_positions", 32)
        x = torch.randn(BATCH, mels, frames, generator=g)
        if model_type == "speech_to_text":  # (batch, frames, features)
            x = torch.randn(BATCH, 32, config.input_feat_per_channel * config.input_channels,
                            generator=g)
    else:
        raise ValueError(f"{model_type}: no input of kind {name!r} here")
    if not getattr(config, "is_encoder_decoder", False):
        return FirstOutput(model, (name,)), (x,)
    decoder = torch.randint(3, vocab, (BATCH, max(2, SEQ // 2)), generator=g)
    return FirstOutput(model, (name, "decoder_input_ids")), (x, decoder)


def _through_export(model, inputs, rules) -> dict:
    row: dict = {}
    try:
        program = torch.export.export(model, inputs)
    except Exception as exc:  # noqa: BLE001 - torch.export's own failure, reported as such
        return {"export": "torch.export: " + _error(exc, 90)}
    t0 = time.perf_counter()
    try:
        eg = EGraph.from_fx(program, inputs).saturate(rules, **LIMITS)
        opt = eg.extract(default_cost(inputs), validate="strict")
        row["pipeline_s"] = time.perf_counter() - t0
        report = opt.meta["egraph_report"]
        row["nodes"] = f"{report.nodes_before}->{report.nodes_after}"
        # (the exported graph in float64 with every cast widened, as validation judges: a
        # float64 copy of the module keeps what it computes in float32 explicitly)
        wide = float64_reference(eg.fx.module)
        row["exact"] = lambda: wide(inputs) or float64_copy(model)(*_wide(inputs))
        _check(opt(*inputs), model(*inputs), row["exact"])
        row["export"] = ("fallback: " + report.validation.reason) if report.fell_back else "ok"
    except Exception as exc:  # noqa: BLE001 - a row of the table
        row["export"] = _error(exc, 90)
    return row


def _through_compile(model, inputs, rules, codegen: str | None = None,
                     exact: Callable[[], Any] | None = None) -> dict:
    """(``exact``: the outputs in float64, by default a float64 copy's)"""
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           **LIMITS)
    torch._dynamo.reset()
    try:
        with compile_backend.capture() as seen:
            out = torch.compile(model, backend=backend)(*inputs)
        _check(out, model(*inputs), exact or (lambda: float64_copy(model)(*_wide(inputs))))
        return {"compile": _status(backend, seen),
                "sdpa": fused_calls(backend)["scaled_dot_product_attention"]}
    except Exception as exc:  # noqa: BLE001 - a row of the table
        return {"compile": _error(exc, 90)}


def fused_calls(backend, ops: tuple[str, ...] = ("scaled_dot_product_attention",)
                ) -> dict[str, int]:
    """How often the programs ``backend`` compiled call each of ``ops``."""
    code = "\n".join(c.module.code for c in backend.cache.values())
    return {op: len(re.findall(rf"\b{op}\(", code)) for op in ops}


def _status(backend, seen) -> str:
    """``ok``, or the fallbacks' reasons, and the graph breaks of a compiled run."""
    fell = [r.extraction.validation.reason for r in backend.reports
            if r.extraction is not None and r.extraction.fell_back]
    return _summary(fell, len(seen.graph_breaks))


def _summary(fell: list[str], breaks: int) -> str:
    """``ok``, or the reasons of the graphs that fell back, and how many graph breaks."""
    status = ("fallback: " + "; ".join(fell)) if fell else "ok"
    return status + (f" ({breaks} graph breaks)" if breaks else "")


def _through_training(model_type: str, model, inputs, rules, codegen: str | None = None,
                       checkpointing: bool = False) -> dict:
    """A training step through the backend (forward, a loss, backward): the loss and
    every gradient equal eager's, float64-judged (benchmarks/models.py's ``train``); a
    model without parameters (labml's FNet mixing) has nothing to train. With
    ``checkpointing``, transformers' gradient checkpointing is on (non-reentrant), where
    the model supports it."""
    if not any(p.requires_grad for p in model.parameters()):
        return {"train": "no parameters"}
    inner = getattr(model, "model", model)
    if checkpointing:
        if not getattr(inner, "supports_gradient_checkpointing", False):
            return {"train": "no gradient checkpointing"}
        inner.gradient_checkpointing_enable({"use_reentrant": False})
    case = Case(model_type, model, inputs, lambda batch, seq: inputs, "seq")
    try:
        row = run_train(case, rules, codegen)
    except Exception as exc:  # noqa: BLE001 - a row of the table
        return {"train": _error(exc, 90)}
    finally:
        model.eval()
        if checkpointing:
            inner.gradient_checkpointing_disable()
    return {"train": _summary(row.get("fallback_reasons") or [], row.get("breaks", 0)),
            "regions": row.get("regions") or ""}


def _through_generate(model_type: str, rules, codegen: str | None = None) -> dict:
    """Greedy generation of :data:`NEW_TOKENS` tokens after the prompt, with the
    key/value cache, the language model's forward compiled with the backend as
    transformers documents it; the tokens must equal eager's. For the types with a
    causal language-model head, or a text-to-text one (the prompt is the encoder's)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    # (an encoder-decoder's own generation where it has one: BART's decoder alone is a
    # causal language model too)
    if model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        auto, start = AutoModelForSeq2SeqLM, {"decoder_start_token_id": 1}
    elif model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        auto, start = AutoModelForCausalLM, {}
    else:
        return {}
    config = small_config(model_type)
    config.use_cache = True

    def built():
        torch.manual_seed(0)
        return auto.from_config(config).eval()

    ids = torch.randint(3, 1000, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                   pad_token_id=0, **start)
    try:
        expected = built().generate(ids, **options)
    except Exception as exc:  # noqa: BLE001 - transformers' own generation fails here
        return {"generate": "eager generate: " + _error(exc, 80)}
    model = built()
    backend = compile_backend.make_backend(rules=rules, validate="strict", codegen=codegen,
                                           **LIMITS)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend=backend)
    try:
        with compile_backend.capture() as seen:
            tokens = model.generate(ids, **options)
        if not torch.equal(tokens, expected):
            return {"generate": "tokens differ from eager's"}
        return {"generate": _status(backend, seen)}
    except Exception as exc:  # noqa: BLE001 - a row of the table
        return {"generate": _error(exc, 90)}


def sweep_row(name: str, make: Callable[[], tuple[nn.Module, tuple]], rules,
              columns: Collection[str] = ("compile",), codegen: str | None = None,
              checkpointing: bool = False) -> dict:
    """One row of a sweep: ``make()`` builds the model and its inputs (where that or an
    eager call raises: a ``not built`` row), then export and each entry point of
    ``columns`` (``compile``, ``generate``, ``train``; ``checkpointing``: trained with
    gradient checkpointing on). ``class``: the wrapped model's class name."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            model, inputs = make()
            model(*inputs)
        except Exception as exc:  # noqa: BLE001 - not buildable small: say so
            return {"export": "not built: " + _error(exc, 80)}
        row = {"class": type(getattr(model, "model", model)).__name__,
               **_through_export(model, inputs, rules)}
        exact = row.pop("exact", None)
        if "compile" in columns:
            row.update(_through_compile(model, inputs, rules, codegen, exact))
        if "generate" in columns:
            row.update(_through_generate(name, rules, codegen))
    if "train" in columns:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row.update(_through_training(name, model, inputs, rules, codegen, checkpointing))
    return row


class SweepTable:
    """A sweep's markdown table: one row per model, printed as it comes, with the
    ``keys`` of its rows (after the name; then nodes and pipeline seconds), and how many
    rows were built and ``ok`` per entry point."""

    def __init__(self, first: str, keys: tuple[str, ...]):
        self.keys = keys
        titles = [first, *keys, "nodes", "pipeline s"]
        self.lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
        self.counts = dict.fromkeys(("built", "export", "compile", "generate", "train"), 0)

    def add(self, name: str, row: dict) -> None:
        self.counts["built"] += "class" in row
        for entry in ("export", "compile", "generate", "train"):
            self.counts[entry] += row.get(entry) == "ok"
        cells = [name, *(str(row.get(k, "")) for k in self.keys), row.get("nodes", ""),
                 f"{row.get('pipeline_s', float('nan')):.2f}"]
        self.lines.append("| " + " | ".join(cells) + " |")
        print(self.lines[-1], flush=True)

    def summary(self, total: int, train: bool) -> str:
        """How many of ``total`` rows were built and are ``ok`` through each entry point
        (training where ``train`` ran)."""
        counts = self.counts
        return (f"built {counts['built']} of {total}; ok through export {counts['export']}, "
                f"through compile {counts['compile']}"
                + (f", training {counts['train']}" if train else ""))

    def write(self, name: str, title: str, summary: str, out: Path | None) -> None:
        """Print ``summary`` and write the table with it as the results document ``name``
        (:func:`benchmarks.report.write_results`; ``out``: another path)."""
        print(summary)
        write_results(name, title, "\n".join(self.lines + ["", summary]), out=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--train", action="store_true",
                        help="add a training step through the backend (gradients judged)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="train with transformers' gradient checkpointing on")
    parser.add_argument("--codegen", choices=CODEGENS,
                        help="the backend's code generator for the compile, generate and "
                             "train columns (default: the device's)")
    parser.add_argument("--attn", choices=("eager", "sdpa"),
                        help="the attention implementation of the export, compile and train "
                             "columns (eager: written out, as the rules must find it)")
    add_out_option(parser, "architectures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rules = load_rules("all")
    table = SweepTable("architecture", ("export", "compile", "sdpa", "generate", "train",
                                        "regions"))
    generates = 0
    for model_type in args.types.split(","):
        columns = [c for c, asked in (("compile", not args.no_compile),
                                      ("generate", not args.no_generate),
                                      ("train", args.train)) if asked]
        row = sweep_row(model_type, lambda t=model_type: build(t, args.attn), rules, columns,
                        args.codegen, args.checkpointing)
        table.add(model_type, row)
        generates += not row.get("generate", "eager").startswith("eager")
    table.write("architectures", "transformers architectures from their default configs",
                table.summary(len(args.types.split(",")), args.train)
                + f", generating {table.counts['generate']} of {generates}", args.out)


if __name__ == "__main__":
    main()
