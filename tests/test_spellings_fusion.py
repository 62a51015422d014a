"""Every spelling reaches the fused form: the ways people write a variance, a layer norm, an
RMS norm, a softmax, attention, GELU and SiLU (several copied in form from transformers,
timm and nanoGPT) each become the one fused op by saturation with the whole library, under
the pipeline's default limits, and the program extracted from the e-graph computes what the
spelling computes."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.naive_suite import ManualSoftmaxCausal, NanoGPTCausal
from compiler.compile import default_cost, make_backend
from compiler.pipeline import compile_graph
from egraph import EGraph, Pattern
from egraph.rules import load_rules
from extractors import Roofline
from extractors.hardware import HARDWARE

RULES = load_rules("all")
# compile_graph's defaults: what the torch.compile backend saturates with.
LIMITS = {"iter_limit": 10, "node_limit": 50_000, "time_limit": 10.0}
EPS = 1e-5


def _rows():
    return (torch.randn(4, 6, 32),)


# -- variance: E[(x - mean)^2] over the last dim, population (correction 0) ------------------

def var_two_pass(x):
    """E[x^2] - E[x]^2, the cancelling form the stability rules replace."""
    return (x * x).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2


def var_centered(x):
    return ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)


def var_method(x):
    return x.var(-1, keepdim=True, unbiased=False)


def var_mean_tuple(x):
    var, _ = torch.var_mean(x, -1, keepdim=True, unbiased=False)
    return var


def var_sum_over_n(x):
    xc = x - x.mean(-1, keepdim=True)
    return torch.square(xc).sum(-1, keepdim=True) / x.shape[-1]


# -- layer norm over the last dim, with and without the affine -------------------------------

class IssueLayerNorm(nn.Module):
    """The issue's spelling: the centred value shared, its square as ``xc * xc``."""

    def __init__(self, n=32):
        super().__init__()
        self.g, self.b = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n))

    def forward(self, x):
        xc = x - x.mean(-1, keepdim=True)
        return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + EPS) * self.g + self.b


class TimmLayerNorm(nn.Module):
    """timm's and transformers' ConvNeXt LayerNorm (channels_last branch written out):
    ``u = x.mean``, ``s = (x - u).pow(2).mean``, ``weight * x + bias``."""

    def __init__(self, n=32):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n))

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + EPS)
        return self.weight * x + self.bias


def layer_norm_var_mean_rsqrt(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + EPS)


def layer_norm_two_pass(x):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / (torch.mean(x ** 2, -1, keepdim=True) - mean * mean + EPS).sqrt()


def layer_norm_reciprocal(x):
    inv = 1.0 / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + EPS)
    return (x - x.mean(-1, keepdim=True)) * inv


# -- RMS norm ------------------------------------------------------------------------------

class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, as written (the casts to float32 and back included)."""

    def __init__(self, hidden_size=32, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rms_div_sqrt(x):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def rms_pow_half(x):
    return x * (x.square().mean(-1, keepdim=True) + 1e-6) ** -0.5


def rms_reciprocal(x):
    return x * (1 / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6))


# -- softmax over the last dim -------------------------------------------------------------

def softmax_naive(x):
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def softmax_amax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def softmax_max_values(x):
    e = (x - x.max(dim=-1, keepdim=True).values).exp()
    return e / torch.sum(e, dim=-1, keepdim=True)


def softmax_max_index(x):
    e = torch.exp(x - torch.max(x, -1, keepdim=True)[0])
    return e * (1.0 / e.sum(-1, keepdim=True))


def softmax_logsumexp(x):
    return torch.exp(x - torch.logsumexp(x, -1, keepdim=True))


# -- attention -> scaled_dot_product_attention ---------------------------------------------

T, HS = 64, 32


class IssueAttention(ManualSoftmaxCausal):
    """The issue's spelling: a bool causal mask, ``masked_fill(~mask, -inf)`` and a manual
    max-shifted softmax (the naive suite's, at this file's sequence length)."""

    def __init__(self):
        super().__init__(T)


def hf_eager_attention(q, k, v, attention_mask):
    """transformers' eager_attention_forward: the scale multiplied in, an additive mask,
    softmax in float32 and back to the query's dtype."""
    scaling = q.shape[-1] ** -0.5
    attn_weights = torch.matmul(q, k.transpose(2, 3)) * scaling
    causal_mask = attention_mask[:, :, :, : k.shape[-2]]
    attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)


def padding_where_scaled_query(q, k, v, keep):
    """The scale on the query, a padding mask through ``torch.where``."""
    scores = (q * HS ** -0.5) @ k.transpose(-1, -2)
    scores = torch.where(keep, scores, float("-inf"))
    return scores.softmax(-1) @ v


def additive_big_negative(q, k, v, keep):
    """A padding mask as an additive -1e9 bias made from a 0/1 float mask."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HS)
    scores = scores + (1.0 - keep) * -1e9
    return torch.softmax(scores, dim=-1) @ v


def triu_in_graph(q, k, v):
    """The causal mask built in the program with triu, the scale after the mask."""
    scores = q @ k.transpose(-2, -1)
    mask = torch.triu(torch.ones_like(scores, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf")) * HS ** -0.5
    return torch.softmax(scores, -1) @ v


def annotated_transformer_attention(q, k, v):
    """The Annotated Transformer's: the kept entries from ``triu(...) == 0``, the scores
    filled with -1e9 where they are not kept."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    size = q.size(-2)
    mask = torch.triu(torch.ones(1, size, size), diagonal=1).type(torch.uint8) == 0
    scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(scores.softmax(dim=-1), v)


def x_transformers_attention(q, k, v):
    """x-transformers' Attend without flash: einsum, the causal mask ``triu(j - i + 1)``
    filled with ``-finfo.max`` (of float32 here: symbolic tracing cannot read a dtype),
    softmax in float32."""
    sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * HS ** -0.5
    i, j = sim.shape[-2:]
    causal_mask = torch.ones((i, j), dtype=torch.bool, device=q.device).triu(j - i + 1)
    sim = sim.masked_fill(causal_mask, -torch.finfo(torch.float32).max)
    attn = F.softmax(sim, dim=-1, dtype=torch.float32).type(torch.float32)
    return torch.einsum("b h i j, b h j d -> b h i d", attn, v)


def padding_filled_big_negative(q, k, v, keep):
    """A padding mask through ``masked_fill(mask == 0, -1e9)``."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HS)
    return torch.softmax(scores.masked_fill(keep == 0, -1e9), dim=-1) @ v


def fairseq_bmm_attention(q, k, v):
    """fairseq's MultiheadAttention: heads flattened into the batch, the query scaled
    first, ``bmm``, softmax in float32 and back."""
    b, h, t, d = q.shape
    q, k, v = (x.reshape(b * h, t, d) for x in (q * d ** -0.5, k, v))
    weights = F.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1, dtype=torch.float32)
    return torch.bmm(weights.type_as(q), v).view(b, h, t, d)


def xglm_bmm_floored_attention(q, k, v, attention_mask):
    """XGLM's attention (older BART's and OPT's too): heads flattened into the batch for
    ``bmm``, the scores viewed per head to add the mask, floored at finfo.min with
    ``torch.max``, viewed back, softmax, ``bmm``."""
    b, h, t, d = q.shape
    q, k, v = (x.reshape(b * h, t, d) for x in (q * d ** -0.5, k, v))
    weights = torch.bmm(q, k.transpose(1, 2)).view(b, h, t, t) + attention_mask
    weights = torch.max(weights, torch.full((), torch.finfo(torch.float32).min,
                                            dtype=weights.dtype))
    weights = F.softmax(weights.view(b * h, t, t), dim=-1)
    return torch.bmm(weights, v).view(b, h, t, d)


class GPTNeoAttention(nn.Module):
    """GPT-Neo's ``_attn``: no scale, the causal buffer applied with ``torch.where`` and a
    finfo.min tensor, then the additive attention mask, softmax, back to v's dtype."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", _causal_keep().view(1, 1, T, T), persistent=False)

    def forward(self, q, k, v, attention_mask):
        weights = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2))
        q_len, k_len = q.size(-2), k.size(-2)
        causal = self.bias[:, :, k_len - q_len: k_len, :k_len]
        fill = torch.tensor(torch.finfo(torch.float32).min, dtype=weights.dtype)
        weights = torch.where(causal, weights, fill) + attention_mask
        return torch.matmul(F.softmax(weights, dim=-1).to(v.dtype), v)


def meta_llama_attention(q, k, v, mask):
    """Meta's reference Llama: an additive causal mask of -inf above the diagonal, softmax
    of the scores in float and back to the query's type."""
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HS)
    scores = F.softmax((scores + mask).float(), dim=-1).type_as(q)
    return torch.matmul(scores, v)


_ALIBI_SLOPES = torch.tensor([2.0 ** -(8 * (i + 1) / 4) for i in range(4)])


def bloom_baddbmm_attention(q, k, v, keep):
    """BLOOM's: heads flattened into the batch, the ALiBi bias added by ``baddbmm`` with
    the scale as its alpha, an additive padding mask, then ``bmm``."""
    b, h, t, d = q.shape
    alibi = (_ALIBI_SLOPES[:, None] * torch.arange(t)[None, :]).repeat(b, 1)[:, None, :]
    scores = alibi.baddbmm(batch1=q.reshape(b * h, t, d),
                           batch2=k.reshape(b * h, t, d).transpose(-1, -2),
                           beta=1.0, alpha=1 / math.sqrt(d))
    weights = scores.view(b, h, t, t) + (1.0 - keep) * torch.finfo(torch.float32).min
    probs = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(probs.view(b * h, t, t), v.reshape(b * h, t, d)).view(b, h, t, d)


def einsum_attention(q, k, v):
    """Attention as vit-pytorch and other research code write it: einsum contractions
    (dynamo keeps ``torch.einsum`` as one call) and a scale after the scores."""
    dots = torch.einsum("b h i d, b h j d -> b h i j", q, k) * HS ** -0.5
    return torch.einsum("b h i j, b h j d -> b h i d", dots.softmax(dim=-1), v)


def ellipsis_einsum_attention(q, k, v):
    """The same with an ellipsis for the batch and head dims (x-transformers and other
    lucidrains code), the scale on the query first."""
    sim = torch.einsum("... i d, ... j d -> ... i j", q * HS ** -0.5, k)
    return torch.einsum("... i j, ... j d -> ... i d", sim.softmax(dim=-1), v)


def sequence_first_attention(q, k, v, keep):
    """Sequence-first attention as labml's annotated implementations write it: (i, b, h,
    d) heads, scores ``'ijbh'`` normalised over ``j`` at dim 1 (``nn.Softmax(dim=1)``), a
    (i, j, b) mask given a heads dim, filled with -inf."""
    scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * HS ** -0.5
    scores = scores.masked_fill(keep.unsqueeze(-1) == 0, float("-inf"))
    return torch.einsum("ijbh,jbhd->ibhd", torch.softmax(scores, dim=1), v)


def sequence_first_alibi_attention(q, k, v, keep, bias):
    """labml's ALiBi: a (i, j, h) bias added to the sequence-first scores, then the mask."""
    scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * HS ** -0.5 + bias[:, :, None, :]
    scores = scores.masked_fill(keep.unsqueeze(-1) == 0, float("-inf"))
    return torch.einsum("ijbh,jbhd->ibhd", torch.softmax(scores, dim=1), v)


def heads_last_attention(q, k, v):
    """Scores laid out (b, i, j, h), normalised over dim 2 (labml's DDPM U-Net)."""
    attn = torch.einsum("bihd,bjhd->bijh", q, k) * HS ** -0.5
    return torch.einsum("bijh,bjhd->bihd", attn.softmax(dim=2), v)


def _rotary(x):
    """A rotary embedding over positions, rotating the halves of the head dim."""
    angles = torch.arange(x.shape[-2])[:, None] * 0.5 ** torch.arange(x.shape[-1] // 2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    first, second = x.chunk(2, -1)
    return x * cos + torch.cat([-second, first], -1) * sin


def local_attention_fills(q, k, v, keep):
    """lucidrains' local-attention: the scale on the query before its rotary embedding,
    so the scores carry none; the causal mask, then the padding mask, each filled with
    -finfo.max."""
    q, k = _rotary(q * HS ** -0.5), _rotary(k)
    sim = torch.einsum("b h i d, b h j d -> b h i j", q, k)
    fill = -torch.finfo(torch.float32).max
    sim = sim.masked_fill(~_causal_keep(), fill).masked_fill(~keep.bool(), fill)
    return torch.einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)


def _sequence_first():
    return tuple(torch.randn(T, 2, 4, HS) for _ in range(3))


def permuted_key_attention(q, k, v):
    """The key transposed by a permute (``rearrange(k, 'b h n d -> b h d n')``)."""
    return torch.softmax(q @ k.permute(0, 1, 3, 2) / math.sqrt(HS), -1) @ v


# -- GELU and SiLU -------------------------------------------------------------------------

def gelu_hf_python(x):
    """transformers' GELUActivation(use_gelu_python=True)."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_erf_times(x):
    return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))


def gelu_nanogpt(x):
    """nanoGPT's (and transformers' NewGELUActivation) tanh approximation."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_tanh_cube(x):
    return x * 0.5 * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


def gelu_fast(x):
    """transformers' FastGELUActivation: sqrt(2/pi) rounded to 0.7978845608, and the cube
    factored as x * (1 + 0.044715 x x)."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def silu_product(x):
    return torch.sigmoid(x) * x


def silu_division(x):
    return x / (1 + torch.exp(-x))


def silu_reciprocal(x):
    return x * (1.0 / (1.0 + torch.exp(-x)))


def silu_swiglu(x, y):
    """The SwiGLU gate of a Llama MLP with SiLU written out."""
    return (x * torch.sigmoid(x)) * y


# -- the table: fused op, spellings, inputs ------------------------------------------------

def _causal_keep():
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


def _qkv():
    return tuple(torch.randn(2, 4, T, HS) for _ in range(3))


def _padding():
    keep = torch.ones(2, 1, 1, T)
    keep[0, ..., -3:] = 0
    return keep


def _additive_padding():
    return torch.zeros(2, 1, 1, T).masked_fill(_padding() == 0, torch.finfo(torch.float32).min)


def _additive_causal():
    return torch.zeros(2, 1, T, T).masked_fill(~_causal_keep(), torch.finfo(torch.float32).min)


CASES = {
    "var": [(f, _rows) for f in (var_two_pass, var_centered, var_method, var_mean_tuple,
                                 var_sum_over_n)],
    "layer_norm": [(IssueLayerNorm, _rows), (TimmLayerNorm, _rows),
                   (layer_norm_var_mean_rsqrt, _rows), (layer_norm_two_pass, _rows),
                   (layer_norm_reciprocal, _rows)],
    "rms_norm": [(LlamaRMSNorm, _rows), (rms_div_sqrt, _rows), (rms_pow_half, _rows),
                 (rms_reciprocal, _rows)],
    "softmax": [(f, _rows) for f in (softmax_naive, softmax_amax, softmax_max_values,
                                     softmax_max_index, softmax_logsumexp)],
    "scaled_dot_product_attention": [
        (NanoGPTCausal, _qkv), (IssueAttention, _qkv),
        (hf_eager_attention, lambda: (*_qkv(), _additive_causal())),
        (padding_where_scaled_query, lambda: (*_qkv(), _padding().bool())),
        (additive_big_negative, lambda: (*_qkv(), _padding())),
        (annotated_transformer_attention, _qkv), (x_transformers_attention, _qkv),
        (padding_filled_big_negative, lambda: (*_qkv(), _padding())),
        (bloom_baddbmm_attention, lambda: (*_qkv(), _padding())),
        (fairseq_bmm_attention, _qkv),
        (xglm_bmm_floored_attention, lambda: (*_qkv(), _additive_padding())),
        (GPTNeoAttention, lambda: (*_qkv(), _additive_padding())),
        (meta_llama_attention, lambda: (*_qkv(), torch.full((T, T), float("-inf")).triu(1))),
        (triu_in_graph, _qkv), (einsum_attention, _qkv), (ellipsis_einsum_attention, _qkv),
        (permuted_key_attention, _qkv),
        (sequence_first_attention, lambda: (*_sequence_first(), _causal_keep()[..., None])),
        (heads_last_attention, lambda: tuple(x.transpose(1, 2) for x in _qkv())),
        (local_attention_fills, lambda: (*_qkv(), _padding())),
        (sequence_first_alibi_attention,
         lambda: (*_sequence_first(), _causal_keep()[..., None], torch.randn(T, T, 4)))],
    "gelu": [(f, _rows) for f in (gelu_hf_python, gelu_erf_times, gelu_nanogpt,
                                  gelu_tanh_cube, gelu_fast)],
    "silu": [(silu_product, _rows), (silu_division, _rows), (silu_reciprocal, _rows),
             (silu_swiglu, lambda: (*_rows(), *_rows()))],
}
# How the fused op reads in emitted code, where its name alone would match other words.
_NEEDLE = {"var": ("torch.var(",),
           # (a causal buffer mask: attention that runs causal sdpa while a check at run
           # time finds the mask causal, frontends.fx.kernels.masked_attention)
           "scaled_dot_product_attention": ("scaled_dot_product_attention",
                                            "masked_attention")}


def _calls_fused(fused: str, code: str) -> bool:
    """Whether emitted ``code`` calls the fused op (or a form of it, :data:`_NEEDLE`)."""
    return any(needle in code for needle in _NEEDLE.get(fused, (fused,)))
SPELLINGS = [(fused, spelling, inputs) for fused, spellings in CASES.items()
             for spelling, inputs in spellings]


def _cost(fused: str, inputs):
    """The pipeline's default cost, except for an op this CPU runs as several kernels (its
    torch runs rms_norm as the formula written out, so it saves nothing there): that one is
    judged on a GPU's profile, where it is one kernel."""
    if HARDWARE["cpu"].kernels_and_passes(fused) != (1, 1):
        return Roofline("H100", fused=False)
    return default_cost(inputs)


def _module(spelling):
    return spelling() if isinstance(spelling, type) else spelling


def _id(case) -> str:
    return getattr(case, "__name__", "") if callable(case) else str(case)


@pytest.mark.parametrize("fused, spelling, make_inputs", SPELLINGS, ids=_id)
def test_every_spelling_reaches_the_fused_op(fused, spelling, make_inputs):
    """Traced with torch.fx, saturated with the whole library under the pipeline's limits:
    the extracted program calls the fused op and computes what the spelling computes."""
    torch.manual_seed(0)
    model, inputs = _module(spelling), make_inputs()
    gm = _trace(model)
    compiled = compile_graph(gm, inputs, RULES, cost=_cost(fused, inputs), validate="raise",
                             **LIMITS)
    assert _calls_fused(fused, compiled.code), f"{_id(spelling)}:\n{compiled.code}"
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


def _trace(model) -> torch.fx.GraphModule:
    """symbolic_trace, with buffers as graph values so that nanoGPT's ``bias[:, :, :t, :t]``
    slices by the traced size."""
    if not isinstance(model, nn.Module):
        return torch.fx.symbolic_trace(model)
    tracer = torch.fx.Tracer()
    tracer.proxy_buffer_attributes = True
    return torch.fx.GraphModule(model, tracer.trace(model))


@pytest.mark.parametrize("fused, spelling, make_inputs",
                         [next(c for c in SPELLINGS if c[0] == fused) for fused in CASES],
                         ids=lambda c: _id(c))
def test_a_spelling_exported_with_torch_export_reaches_the_fused_op(fused, spelling,
                                                                    make_inputs):
    """The same through torch.export's aten graph."""
    torch.manual_seed(0)
    model, inputs = _module(spelling), make_inputs()
    exported = torch.export.export(model if isinstance(model, nn.Module) else _Wrap(model),
                                   inputs)
    eg = EGraph.from_fx(exported, inputs).saturate(RULES, **LIMITS)
    compiled = eg.extract(_cost(fused, inputs), validate="raise")
    assert _calls_fused(fused, compiled.code), f"{_id(spelling)} (exported)"
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fill", [-1e9, -torch.finfo(torch.float32).max, float("-inf")])
def test_a_fill_that_drops_keys_is_sdpa_and_a_row_with_every_key_dropped_is_kept(fill):
    """Scores filled with -1e9 or finfo.min where a padding mask drops a key are sdpa's
    bool mask; a sequence whose every key is padded keeps the source's meaning: the
    uniform average of v for a finite fill, NaN for -inf. A causal mask is sdpa's
    ``is_causal`` whatever the fill (no row is all masked)."""
    def padded(q, k, v, keep):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(HS)
        return torch.softmax(scores.masked_fill(keep == 0, fill), dim=-1) @ v

    q, k, v = _qkv()
    keep = _padding()
    keep[1] = 0
    opt = compile_graph(torch.fx.symbolic_trace(padded), (q, k, v, keep), RULES,
                        validate="raise", **LIMITS)
    assert "scaled_dot_product_attention" in opt.code
    expected = padded(q, k, v, keep)
    torch.testing.assert_close(opt(q, k, v, keep), expected, equal_nan=True)
    assert expected[1].isnan().all() if fill == float("-inf") else expected[1].isfinite().all()

    causal = compile_graph(torch.fx.symbolic_trace(_CausalFill(fill)), (q, k, v), RULES,
                           validate="raise", **LIMITS)
    assert "is_causal = True" in causal.code and "where" not in causal.code
    torch.testing.assert_close(causal(q, k, v), _CausalFill(fill)(q, k, v))


@pytest.mark.parametrize("fill", [-3.4028234663852886e38, float("-inf")])
def test_a_bias_before_the_fill_is_sdpa_and_keeps_a_row_with_every_key_dropped(fill):
    """MPT's spelling: an ALiBi bias added to the scores, then ``masked_fill`` where the
    mask drops a key; the second sequence has every key dropped."""
    def biased(q, k, v, bias, dropped):
        scores = torch.matmul(q, k.transpose(-1, -2)) * HS ** -0.5 + bias
        return F.softmax(scores.masked_fill(dropped, fill).float(), dim=-1) @ v

    q, k, v = _qkv()
    bias = -torch.arange(T, dtype=torch.float32).flip(0) * torch.tensor([0.5, 0.25, 0.125,
                                                                         0.0625])[:, None]
    dropped = _padding() == 0
    dropped[1] = True
    inputs = (q, k, v, bias[None, :, None, :], dropped)
    opt = compile_graph(torch.fx.symbolic_trace(biased), inputs, RULES, validate="raise",
                        **LIMITS)
    assert "scaled_dot_product_attention" in opt.code
    torch.testing.assert_close(opt(*inputs), biased(*inputs), equal_nan=True)


@pytest.mark.parametrize("spelling", [xglm_bmm_floored_attention, GPTNeoAttention],
                         ids=_id)
@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, float("-inf")])
def test_a_floored_or_filled_then_masked_attention_keeps_a_row_with_every_key_dropped(
        spelling, fill):
    """XGLM's floor at finfo.min and GPT-Neo's causal fill before the additive mask: each
    is sdpa with one additive mask that keeps the source's meaning where a sequence has
    every key padded (a uniform average, or NaN where the source's row is all -inf), with
    the padding mask given as finfo.min or as -inf."""
    model = _module(spelling)
    q, k, v = _qkv()
    dropped = _padding() == 0
    dropped[1] = True
    mask = torch.zeros(2, 1, 1, T).masked_fill(dropped, fill)
    inputs = (q, k, v, mask)
    opt = compile_graph(_trace(model), inputs, RULES, validate="raise", **LIMITS)
    assert "scaled_dot_product_attention" in opt.code
    expected = model(*inputs)
    torch.testing.assert_close(opt(*inputs), expected, equal_nan=True)
    assert expected[0].isfinite().all()


class _CausalFill(nn.Module):
    def __init__(self, fill: float):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * HS ** -0.5
        mask = torch.ones((q.size(-2), q.size(-2)), dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(mask, self.fill), -1) @ v


def gpt2_v4_mask_value(q, k, v):
    """transformers 4.x GPT-2 (and GPT-Neo, GPT-J, CodeGen): the fill a float tensor of no
    dims, ``torch.full([], finfo.min)``, through ``torch.where``."""
    w = q @ k.transpose(-1, -2) / math.sqrt(HS)
    mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
    return torch.softmax(torch.where(_causal_keep(), w, mask_value), -1) @ v


def tensor_fill_where(q, k, v):
    w = q @ k.transpose(-1, -2) / math.sqrt(HS)
    return torch.softmax(torch.where(_causal_keep(), w, torch.tensor(-1e9)), -1) @ v


def tensor_fill_masked(q, k, v):
    w = q @ k.transpose(-1, -2) / math.sqrt(HS)
    w = w.masked_fill(~_causal_keep(), torch.tensor(torch.finfo(w.dtype).min))
    return torch.softmax(w, -1) @ v


@pytest.mark.parametrize("spelling", [gpt2_v4_mask_value, tensor_fill_where,
                                      tensor_fill_masked], ids=lambda f: f.__name__)
def test_a_fill_given_as_a_tensor_of_no_dims_reaches_causal_sdpa(spelling):
    """Through torch.compile, where the fill arrives as a tensor made in the graph."""
    report, _ = _compiled_attention(spelling)
    assert "sdpa-causal" in report.extraction.used


def _compiled_attention(spelling) -> tuple:
    """``spelling`` of attention through torch.compile (static, validation raising) on
    :func:`_qkv` inputs, its output checked against eager's: the graph's report and the
    emitted module."""
    inputs = _qkv()
    backend = make_backend(validate="raise")
    with torch.no_grad():
        got = torch.compile(spelling, backend=backend, dynamic=False)(*inputs)
    torch.testing.assert_close(got, spelling(*inputs), rtol=1e-4, atol=1e-5)
    (report,) = backend.reports
    return report, next(iter(backend.cache.values())).module


class SequenceFirstCausal(nn.Module):
    """labml's autoregressive attention: sequence-first heads and a causal mask made in the
    forward (``subsequent_mask``), (i, j, 1), given a heads dim."""

    def forward(self, q, k, v):
        mask = torch.tril(torch.ones(q.shape[0], k.shape[0])).to(torch.bool).unsqueeze(-1)
        return sequence_first_attention(q, k, v, mask)


@pytest.mark.parametrize("spelling, make_inputs", [
    (tensor_fill_where, _qkv), (tensor_fill_masked, _qkv),
    (SequenceFirstCausal, _sequence_first)], ids=lambda f: getattr(f, "__name__", ""))
def test_constants_torch_export_lifts_reach_causal_sdpa(spelling, make_inputs):
    """torch.export lifts ``torch.tensor(-1e9)`` and a mask made from a tensor it captured
    to inputs of the program: they are the program's constants, and the rules read them
    (the fill as a number, the mask as causal)."""
    model, inputs = _module(spelling), make_inputs()
    program = torch.export.export(model if isinstance(model, nn.Module) else _Wrap(model),
                                  inputs)
    compiled = EGraph.from_fx(program, inputs).saturate(RULES, **LIMITS).extract(
        default_cost(inputs), validate="raise")
    assert "is_causal = True" in compiled.code, compiled.code
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


def test_a_fill_too_small_to_drop_a_key_stays_written_out():
    """-1e4 in float32 leaves a masked key a weight of exp(-1e4 - score), which is not 0
    for scores near -1e4: not sdpa's mask."""
    q, k, v = _qkv()
    opt = compile_graph(torch.fx.symbolic_trace(_CausalFill(-1e4)), (q, k, v), RULES,
                        validate="raise", **LIMITS)
    assert "scaled_dot_product_attention" not in opt.code


class DetrSelfAttention(nn.Module):
    """DETR's encoder layer calls ``nn.MultiheadAttention`` with the module's default,
    ``need_weights=True``, and keeps only the output; WavLM's also views the weights."""

    def __init__(self, dropout: float = 0.0, weights: bool = False):
        super().__init__()
        self.attn, self.weights = nn.MultiheadAttention(16, 4, dropout=dropout), weights

    def forward(self, src, pos):
        out, weights = self.attn(src + pos, src + pos, value=src)
        # (WavLM's view of the weights per head, which its caller drops)
        per_head = weights[:, None].broadcast_to(weights.shape[:1] + (4,) + weights.shape[1:])
        return (out, per_head) if self.weights else out


def _asked_for_weights(backend) -> list[bool]:
    import inspect

    asked = []
    for compiled in backend.cache.values():
        for node in compiled.module.graph.nodes:
            if node.target is F.multi_head_attention_forward:
                bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
                bound.apply_defaults()
                asked.append(bound.arguments["need_weights"])
    return asked


@pytest.mark.parametrize("dropout, training, weights, asked", [
    (0.1, False, False, False), (0.0, True, False, False),
    (0.1, True, False, True), (0.0, False, True, True)])
def test_multihead_attention_weights_no_one_reads_are_not_computed(dropout, training,
                                                                   weights, asked):
    """Through torch.compile, where the graph reads only the output of
    ``nn.MultiheadAttention``, it is called with ``need_weights=False`` (torch then runs
    sdpa rather than the scores written out and averaged): in eval mode, or training
    without dropout. Kept asked where the weights are read, or where dropout draws its
    random numbers in training (the two paths draw them differently)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = DetrSelfAttention(dropout, weights).train(training)
    src, pos = torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    backend = make_backend(validate="raise")
    torch.manual_seed(1)
    got = torch.compile(model, backend=backend)(src, pos)
    assert _asked_for_weights(backend) == [asked]
    if not (training and dropout):
        torch.testing.assert_close(got, model(src, pos), rtol=1e-4, atol=1e-5)


def test_attention_through_torch_compile_reaches_sdpa():
    """Through dynamo and aot_autograd a batched matmul arrives as reshape, bmm, reshape and
    the buffer as an input: nanoGPT's attention still becomes one fused call (its causal
    buffer: causal sdpa while a check at run time finds the mask causal)."""
    model, inputs = NanoGPTCausal(), _qkv()
    backend = make_backend(validate="raise")
    with torch.no_grad():
        got = torch.compile(model, backend=backend, dynamic=False)(*inputs)
    (compiled,) = backend.cache.values()
    assert _calls_fused("scaled_dot_product_attention", compiled.module.code)
    torch.testing.assert_close(got, model(*inputs), rtol=1e-4, atol=1e-5)


class _RotaryEinsumAttention(nn.Module):
    """x-transformers' decoder attention, which torch.compile hands over through
    aot_autograd (its rotary table is made under ``autocast(enabled=False)``): there
    each einsum arrives decomposed into unsqueezes, permutes that move unit dims,
    views and bmm."""

    def forward(self, q, k, v):
        with torch.autocast("cpu", enabled=False):
            t = torch.arange(q.shape[-2], dtype=torch.float32)
            freqs = torch.einsum("i , j -> i j", t, 1.0 / 10000 ** (torch.arange(0, HS, 2) / HS))
        freqs = torch.cat((freqs, freqs), dim=-1)
        q = q * freqs.cos() + torch.cat((-q[..., HS // 2:], q[..., :HS // 2]), -1) * freqs.sin()
        return x_transformers_attention(q, k, v)


def test_einsum_attention_through_aot_autograd_reaches_sdpa():
    model, inputs = _RotaryEinsumAttention(), _qkv()
    backend = make_backend(validate="raise")
    with torch.no_grad():
        got = torch.compile(model, backend=backend, dynamic=False)(*inputs)
    (report,) = backend.reports
    assert report.name == "forward 0" and "sdpa-causal" in report.extraction.used
    torch.testing.assert_close(got, model(*inputs), rtol=1e-4, atol=1e-5)


# -- grouped-query attention: key and value heads repeated for the query's groups ----------

def repeat_kv(hidden, n_rep):
    """transformers' repeat_kv (Llama, Mistral, Qwen2, Gemma)."""
    batch, heads, slen, head_dim = hidden.shape
    hidden = hidden[:, :, None, :, :].expand(batch, heads, n_rep, slen, head_dim)
    return hidden.reshape(batch, heads * n_rep, slen, head_dim)


def repeat_kv_flatten(hidden, n_rep):
    """The same with unsqueeze and flatten."""
    batch, heads, slen, head_dim = hidden.shape
    return hidden.unsqueeze(2).expand(batch, heads, n_rep, slen, head_dim).flatten(1, 2)


def grouped_eager_attention(q, k, v, mask):
    """Llama's eager attention on grouped heads: repeat_kv, then hf_eager_attention."""
    return hf_eager_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), mask)


def grouped_sdpa_attention(q, k, v, mask):
    """transformers' sdpa attention where it repeats the heads itself (a mask is given)."""
    return F.scaled_dot_product_attention(q, repeat_kv_flatten(k, 2), repeat_kv_flatten(v, 2),
                                          attn_mask=mask)


def tiled_heads_attention(q, k, v, mask):
    """Heads tiled (h % groups shares a key head), not grouped: no enable_gqa form."""
    def tile(x):
        b, h, t, d = x.shape
        return x[:, None].expand(b, 2, h, t, d).reshape(b, 2 * h, t, d)
    return F.scaled_dot_product_attention(q, tile(k), tile(v), attn_mask=mask)


def _grouped_qkv():
    q, k, v = _qkv()
    return q, k[:, :2], v[:, :2], _additive_causal()


@pytest.mark.parametrize("spelling", [grouped_eager_attention, grouped_sdpa_attention],
                         ids=_id)
def test_repeated_key_heads_become_sdpa_with_enable_gqa(spelling):
    """Llama's repeat_kv copies each key and value head for its group of query heads;
    sdpa's enable_gqa reads them in place (1.8-20x faster on this CPU at Llama's sizes),
    and so does the attention that checks a mask causal at run time (the example's
    additive mask is the causal one: its last argument is ``gqa``)."""
    torch.manual_seed(0)
    inputs = _grouped_qkv()
    compiled = compile_graph(_trace(spelling), inputs, RULES,
                             cost=Roofline("H100", fused=False), validate="raise", **LIMITS)
    code = compiled.code
    grouped = "enable_gqa = True" in code or re.search(r"masked_attention\(.*, True\)", code)
    assert grouped and ".expand(" not in code, code
    torch.testing.assert_close(compiled(*inputs), spelling(*inputs), rtol=1e-4, atol=1e-5)


def test_tiled_key_heads_are_not_taken_for_groups():
    torch.manual_seed(0)
    inputs = _grouped_qkv()
    compiled = compile_graph(_trace(tiled_heads_attention), inputs, RULES,
                             cost=Roofline("H100", fused=False), validate="raise", **LIMITS)
    assert "enable_gqa = True" not in compiled.code
    torch.testing.assert_close(compiled(*inputs), tiled_heads_attention(*inputs), rtol=1e-4,
                               atol=1e-5)


class GroupedAttention(nn.Module):
    """Attention over ``kv`` key heads shared by groups of ``groups`` query heads, heads
    repeated in one of the spellings of real code, the scores masked or not."""

    def __init__(self, groups: int, flat: bool, mask: str):
        super().__init__()
        self.groups, self.flat, self.mask = groups, flat, mask

    def forward(self, q, k, v):
        repeat = repeat_kv_flatten if self.flat else repeat_kv
        k, v = repeat(k, self.groups), repeat(v, self.groups)
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if self.mask == "causal":
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1),
                                        float("-inf"))
        return torch.softmax(scores, -1) @ v


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(2, 4), st.integers(1, 9),
       st.sampled_from([4, 8]), st.booleans(), st.sampled_from(["none", "causal"]))
def test_grouped_heads_of_any_size_reach_enable_gqa(batch, kv, groups, length, dim, flat,
                                                    mask):
    """Any batch, key heads, group size, length and head size: the repeated heads become
    sdpa's enable_gqa, with eager's values (validated, and compared here)."""
    torch.manual_seed(0)
    model = GroupedAttention(groups, flat, mask)
    q = torch.randn(batch, kv * groups, length, dim)
    k, v = torch.randn(batch, kv, length, dim), torch.randn(batch, kv, length, dim)
    compiled = compile_graph(_trace(model), (q, k, v), RULES,
                             cost=Roofline("H100", fused=False), validate="raise", **LIMITS)
    assert "enable_gqa = True" in compiled.code, compiled.code
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([xglm_bmm_floored_attention, GPTNeoAttention, hf_eager_attention]),
       st.sampled_from([torch.finfo(torch.float32).min, float("-inf")]),
       st.integers(1, 3), st.integers(33, 64), st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       st.integers(0, 2 ** 16))
def test_masked_attention_spellings_keep_the_sources_values_under_any_padding(
        spelling, fill, batch, length, dropped, seed):
    """The spellings whose masks the sdpa rules rewrite (XGLM's floor, GPT-Neo's fill
    before the additive mask, transformers' additive mask), at any batch and length,
    with keys padded at random (a share of 1.0: every key of every row): the program calls
    sdpa and keeps the source's values, NaN for NaN (validated, and compared here). From
    33 keys on, where the CPU's cost model prefers sdpa to the few ops it saves."""
    model = _module(spelling)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, 4, length, HS, generator=g) for _ in range(3))
    padded = torch.rand(batch, 1, 1, length, generator=g) < dropped
    inputs = (q, k, v, torch.zeros(batch, 1, 1, length).masked_fill(padded, fill))
    compiled = compile_graph(_trace(model), inputs, RULES, validate="raise", **LIMITS)
    assert "scaled_dot_product_attention" in compiled.code, compiled.code
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5,
                               equal_nan=True)


def test_a_users_grouped_query_sdpa_keeps_its_groups():
    """Cached decoding in transformers calls sdpa with enable_gqa=True (four query heads,
    two key heads): the call keeps it through ingest and emission."""
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    q, k, v, _ = _grouped_qkv()
    compiled = compile_graph(torch.fx.symbolic_trace(attend), (q, k, v), RULES,
                             validate="raise", **LIMITS)
    assert "enable_gqa = True" in compiled.code
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), rtol=1e-4, atol=1e-5)


class _Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_the_four_powers_are_one_class():
    """x*x, x**2, pow(x, 2) and square are one value, so a rule written with x*x matches
    every one of them."""
    def four(x):
        return x * x, x ** 2, torch.pow(x, 2), torch.square(x)

    eg = EGraph.from_fx(torch.fx.symbolic_trace(four), _rows()).saturate(RULES, **LIMITS)
    assert len({eg.find(r) for r in eg.roots}) == 1
    assert Pattern.of("(mul ?x ?x)").search(eg)


def _make_causal_mask(batch: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """transformers 4.3x's ``_make_causal_mask`` (BART, OPT, Llama before the cache
    rewrite): ``finfo.min`` everywhere, set to 0 on and below the diagonal in place,
    expanded to the batch."""
    mask = torch.full((length, length), torch.finfo(dtype).min)
    mask_cond = torch.arange(mask.size(-1))
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    return mask.to(dtype)[None, None, :, :].expand(batch, 1, length, length)


def additive_causal(q, k, v):
    w = q @ k.transpose(-1, -2) / math.sqrt(HS)
    return torch.softmax(w + _make_causal_mask(q.shape[0], q.shape[2], w.dtype), -1) @ v


def additive_causal_infinite(q, k, v):
    """The same mask with -inf above the diagonal (x-transformers, some decoders)."""
    w = q @ k.transpose(-1, -2) / math.sqrt(HS)
    above = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1)
    return torch.softmax(w + torch.zeros_like(w[:1, :1]).masked_fill(above, float("-inf")),
                         -1) @ v


@pytest.mark.parametrize("spelling", [additive_causal, additive_causal_infinite],
                         ids=lambda f: f.__name__)
def test_a_constant_additive_causal_mask_is_sdpa_that_reads_no_mask(spelling):
    """A causal mask made of constants and added to the scores (transformers' decoders at
    a fixed length) folds to a constant at ingest, and the constant is read as 0 below a
    dropping fill: sdpa with ``is_causal=True``, which reads no mask and skips the
    entries above the diagonal (1.5-1.8x faster on the CPU at 12 heads of 128 or 512)."""
    report, module = _compiled_attention(spelling)
    assert "sdpa-causal-additive" in report.extraction.used
    assert "is_causal = True" in module.code and "attn_mask = None" in module.code


def test_an_additive_mask_that_is_not_causal_stays_a_mask():
    """A mask that is 0 below the diagonal but keeps one entry above it (a sliding window
    would differ the other way) is not causal: it stays sdpa's float mask."""
    def almost_causal(q, k, v):
        w = q @ k.transpose(-1, -2) / math.sqrt(HS)
        mask = _make_causal_mask(q.shape[0], q.shape[2], w.dtype).clone()
        mask[..., 0, 1] = 0.0
        return torch.softmax(w + mask, -1) @ v

    _, module = _compiled_attention(almost_causal)
    assert "is_causal = True" not in module.code
