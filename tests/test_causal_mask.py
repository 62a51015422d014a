"""A causal mask held in a buffer (nanoGPT's ``bias``): attention that runs as causal sdpa
while the mask is the causal one, checked at run time, and as written otherwise."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from frontends.fx.kernels import masked_attention


def _written(q, k, v, dropped, scale):
    return torch.softmax((q @ k.transpose(-2, -1) * scale).masked_fill(dropped, -torch.inf),
                         -1) @ v


@pytest.fixture
def causal_calls(monkeypatch):
    """The ``is_causal`` of every sdpa call made while the test runs."""
    calls: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def _qkv(t=16, s=None):
    torch.manual_seed(0)
    return (torch.randn(2, 3, t, 8), torch.randn(2, 3, s or t, 8), torch.randn(2, 3, s or t, 8))


def test_masked_attention_runs_causal_sdpa_on_the_causal_mask_and_sdpa_under_any_other(
        causal_calls):
    q, k, v = _qkv()
    above = torch.ones(1, 1, 16, 16, dtype=torch.bool).triu(1)
    torch.testing.assert_close(masked_attention(q, k, v, above, 0.3),
                               _written(q, k, v, above, 0.3))
    window = above | torch.ones(16, 16, dtype=torch.bool).tril(-4)  # a sliding window
    torch.testing.assert_close(masked_attention(q, k, v, window, 0.3),
                               _written(q, k, v, window, 0.3))
    assert causal_calls == [True, False]


def test_masked_attention_keeps_the_written_nan_of_a_row_with_nothing_kept():
    q, k, v = _qkv()
    dropped = torch.ones(16, 16, dtype=torch.bool).triu(1)
    dropped[3] = True
    got = masked_attention(q, k, v, dropped, 0.3)
    assert got[:, :, 3].isnan().all() and not got[:, :, 4].isnan().any()
    torch.testing.assert_close(got, _written(q, k, v, dropped, 0.3), equal_nan=True)


def test_masked_attention_sees_a_mask_changed_in_place_after_its_check(causal_calls):
    q, k, v = _qkv()
    dropped = torch.ones(16, 16, dtype=torch.bool).triu(1)
    masked_attention(q, k, v, dropped, 0.3)
    masked_attention(q, k, v, dropped, 0.3)  # (remembered: checked once)
    dropped[5, 2] = True
    torch.testing.assert_close(masked_attention(q, k, v, dropped, 0.3),
                               _written(q, k, v, dropped, 0.3))
    assert causal_calls == [True, True, False]


def test_masked_attention_with_more_keys_than_queries_is_causal_at_the_top_left(causal_calls):
    q, k, v = _qkv(t=4, s=16)
    top_left = torch.ones(4, 16, dtype=torch.bool).triu(1)
    torch.testing.assert_close(masked_attention(q, k, v, top_left, 0.3),
                               _written(q, k, v, top_left, 0.3))
    lower_right = torch.ones(4, 16, dtype=torch.bool).triu(13)  # a cache's last four rows
    torch.testing.assert_close(masked_attention(q, k, v, lower_right, 0.3),
                               _written(q, k, v, lower_right, 0.3))
    assert causal_calls == [True, False]


def test_masked_attention_checks_inference_tensors_every_call(causal_calls):
    q, k, v = _qkv()
    with torch.inference_mode():
        dropped = torch.ones(16, 16, dtype=torch.bool).triu(1)
        masked_attention(q, k, v, dropped, 0.3)
        dropped[5, 2] = True  # (an inference tensor keeps no version counter)
        torch.testing.assert_close(masked_attention(q, k, v, dropped, 0.3),
                                   _written(q, k, v, dropped, 0.3))
    assert causal_calls == [True, False]


def test_masked_attention_is_the_general_form_under_a_tracer():
    q, k, v = _qkv()
    dropped = torch.ones(16, 16, dtype=torch.bool).triu(1)
    traced = torch.fx.experimental.proxy_tensor.make_fx(
        lambda q, k, v, m, s: masked_attention(q, k, v, m, s))(q, k, v, dropped, 0.3)
    calls = [n for n in traced.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert calls and all(not n.kwargs.get("is_causal", False) for n in calls)
    dropped[5, 2] = True
    torch.testing.assert_close(traced(q, k, v, dropped, 0.3), _written(q, k, v, dropped, 0.3))


def test_masked_attention_gradients_are_the_written_forms():
    q, k, v = (t.requires_grad_() for t in _qkv())
    dropped = torch.ones(16, 16, dtype=torch.bool).triu(1)
    grads = torch.autograd.grad(masked_attention(q, k, v, dropped, 0.3).sum(), (q, k, v))
    expected = torch.autograd.grad(_written(q, k, v, dropped, 0.3).sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


# -- nanoGPT's decoder, at small sizes ---------------------------------------------------------

def _decoder(softmax="manual", block=16, layers=2):
    from benchmarks.nanogpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=block, vocab_size=64, n_layer=layers, n_head=2,
                         n_embd=16, softmax=softmax)).eval()


def test_ingest_observes_the_causal_buffer_of_an_exported_decoder_and_of_a_dynamo_graph():
    from egraph import EGraph

    model, idx = _decoder(), torch.randint(0, 64, (1, 16))
    eg = EGraph.from_fx(torch.export.export(model, (idx,)), example_inputs=(idx,))
    observed = {eg.data(c).triangle for c in eg.classes_with_op("param")}
    assert observed == {None, "tril"}

    seen = []

    def backend(gm, inputs):
        eg = EGraph.from_fx(gm, inputs)
        seen.extend(eg.data(c).triangle for c in eg.classes_with_op("input"))
        return gm

    with torch.no_grad():
        torch.compile(model, backend=backend)(idx)
    assert seen.count("tril") == 2 and set(seen) == {None, "tril"}


class BufferAttention(torch.nn.Module):
    """nanoGPT's attention over given q, k, v: ``bias[:, :, offset:offset + T, :T]``."""

    def __init__(self, bias: torch.Tensor, offset: int = 0):
        super().__init__()
        self.register_buffer("bias", bias)
        self.offset = offset

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, self.offset:self.offset + t, :t] == 0,
                              float("-inf"))
        return F.softmax(att, dim=-1) @ v


def _extracted(model, inputs):
    from compiler.compile import default_cost
    from egraph import EGraph
    from egraph.rules import load_rules

    eg = EGraph.from_fx(torch.export.export(model, inputs), example_inputs=inputs)
    eg.saturate(load_rules("all"))
    module = eg.extract(default_cost(inputs), validate="raise")
    fired = getattr(eg.report.rules.get("sdpa-causal-checked"), "applied", 0)
    return module, fired


@pytest.mark.parametrize("softmax", ["manual", "F"])
def test_the_decoders_attention_becomes_causal_sdpa_with_eagers_result(softmax, causal_calls):
    model, idx = _decoder(softmax), torch.randint(0, 64, (1, 16))
    module, fired = _extracted(model, (idx,))
    assert fired > 0
    code = module.code
    assert code.count("masked_attention(") == 2 and "scaled_dot_product_attention" not in code
    causal_calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(module(idx), model(idx))
    assert causal_calls == [True, True]


def _tril(size=16):
    return torch.ones(size, size).tril().view(1, 1, size, size)


@pytest.mark.parametrize("bias, offset", [
    (_tril() - torch.ones(16, 16).tril(-4), 0),  # a sliding window, not causal
    (torch.ones(1, 1, 16, 16).triu(), 0),       # the mirror image
    (_tril(32), 4),                              # rows 4..19 of it: the offset form
], ids=["window", "upper", "offset"])
def test_a_mask_that_is_not_the_causal_one_does_not_fire(bias, offset):
    q, k, v = _qkv()
    model = BufferAttention(bias, offset)
    module, fired = _extracted(model, (q, k, v))
    assert fired == 0 and "masked_attention" not in module.code
    with torch.no_grad():
        torch.testing.assert_close(module(q, k, v), model(q, k, v))


def test_the_extracted_program_follows_a_buffer_changed_after_extraction(causal_calls):
    q, k, v = _qkv()
    model = BufferAttention(_tril())
    module, fired = _extracted(model, (q, k, v))
    assert fired > 0
    window = _tril() - torch.ones(16, 16).tril(-4)
    with torch.no_grad():
        module.get_buffer("bias").copy_(window)
        model.bias.copy_(window)
        causal_calls.clear()
        torch.testing.assert_close(module(q, k, v), model(q, k, v))
    assert causal_calls == [False]


def test_torch_compile_follows_a_buffer_changed_after_compiling(causal_calls):
    from compiler.compile import capture, make_backend

    model, idx = _decoder(), torch.randint(0, 64, (1, 16))
    with torch.no_grad(), capture() as seen:
        compiled = torch.compile(model, backend=make_backend())
        torch.testing.assert_close(compiled(idx), model(idx))
        assert "sdpa-causal-checked" in str(seen)
        causal_calls.clear()
        compiled(idx)
        assert causal_calls == [True, True]
        for block in model.transformer.h:
            block.attn.bias[..., 9, 3] = 0.0  # a user's edit of the buffer, in place
        causal_calls.clear()
        torch.testing.assert_close(compiled(idx), model(idx))
        assert causal_calls == [False, False]


# -- transformers' decoders exported with symbolic sizes: the mask is made from the sizes --

def _symbolic(model, example):
    """``model`` through torch.export with every dim of its inputs a ``Dim.AUTO`` (export
    keeps a dim of one at one), ingest, the library and extraction."""
    from compiler.compile import default_cost
    from egraph import EGraph
    from egraph.rules import load_rules

    shapes = tuple({d: torch.export.Dim.AUTO for d in range(x.dim())} for x in example)
    if any(p.kind is p.VAR_POSITIONAL
           for p in inspect.signature(model.forward).parameters.values()):
        shapes = (shapes,)  # (the corpus's models take their inputs as ``*inputs``)
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=shapes)
    eg = EGraph.from_fx(program, example)
    eg.saturate(load_rules("all"), iter_limit=10, node_limit=50_000, time_limit=120.0)
    return eg.extract(default_cost(example), validate="raise")


def _agrees(module, model, inputs):
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch", [2, 1])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_symbolic_decoders_mask_made_from_its_sizes_runs_causal_attention(
        name, batch, causal_calls):
    pytest.importorskip("transformers")
    from benchmarks.corpus import build

    case = build(name)
    model = case.model.eval()
    module = _symbolic(model, case.make_inputs(batch, 8))
    code = module.code
    assert code.count("masked_attention(") == 2 and "scaled_dot_product_attention" not in code
    sizes = [(batch, 8), (batch, 12), (batch, 16)] + ([(5, 16)] if batch > 1 else [])
    for size in sizes:
        causal_calls.clear()
        _agrees(module, model, case.make_inputs(*size))
        assert causal_calls == [True, True], size


def _mistral(window: int):
    """A two-layer Mistral whose attention sees the last ``window`` positions, with
    eager attention, taking token ids."""
    transformers = pytest.importorskip("transformers")
    from benchmarks.corpus import TensorModel

    config = transformers.MistralConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        sliding_window=window, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    return TensorModel(transformers.MistralForCausalLM(config), ("input_ids",),
                       ("logits",)).eval()


def _ids(batch, seq):
    return (torch.randint(3, 100, (batch, seq), generator=torch.Generator().manual_seed(seq)),)


def test_a_symbolic_sliding_window_keeps_its_mask(causal_calls):
    model = _mistral(window=4)
    module = _symbolic(model, _ids(2, 8))
    assert "masked_attention" not in module.code
    for seq in (8, 12):
        _agrees(module, model, _ids(2, seq))
    assert True not in causal_calls


def test_a_window_wider_than_the_example_is_checked_at_every_size(causal_calls):
    # causal at the example's 8 positions, a window from 13 on: the check at run time
    # sees it there
    model = _mistral(window=12)
    module = _symbolic(model, _ids(2, 8))
    assert module.code.count("masked_attention(") == 2
    for seq, causal in ((8, True), (20, False), (12, True)):
        causal_calls.clear()
        _agrees(module, model, _ids(2, seq))
        assert causal_calls == [causal, causal], seq


def test_a_padding_mask_combined_in_keeps_the_mask(causal_calls):
    # the example's padding mask keeps every token, so the combined mask is causal there;
    # it is read from an input, never observed, and padding later is followed
    pytest.importorskip("transformers")
    from benchmarks.corpus import TensorModel, build, ids_mask_inputs

    model = TensorModel(build("gpt2").model.model, ("input_ids", "attention_mask"),
                        ("logits",)).eval()
    ids, _ = ids_mask_inputs(2, 8)
    module = _symbolic(model, (ids, torch.ones(2, 8, dtype=torch.long)))
    assert "masked_attention" not in module.code
    _agrees(module, model, ids_mask_inputs(3, 12))
    assert True not in causal_calls


class SizedMaskAttention(torch.nn.Module):
    """Attention over given q, k, v whose additive mask is made from the sequence length,
    as transformers makes it: 0 where ``keep(row, col)``, the lowest float elsewhere; the
    scores scaled by ``scale`` (None: not scaled, as where the scale went on the query)."""

    def __init__(self, keep, scale=0.3):
        super().__init__()
        self.keep = keep
        self.scale = scale

    def forward(self, q, k, v):
        t = torch.arange(q.size(-2))
        mask = torch.where(self.keep(t[:, None], t[None, :]), 0.0, torch.finfo(q.dtype).min)
        scores = q @ k.transpose(-2, -1)
        scores = scores if self.scale is None else scores * self.scale
        return torch.softmax(scores + mask, -1) @ v


def _below(i, j):
    return j <= i


@pytest.mark.parametrize("keep, scale, causal", [
    (_below, 0.3, True),
    (_below, None, True),
    (lambda i, j: _below(i, j) & (j > i - 4), 0.3, False),  # a sliding window
    (lambda i, j: j >= i, 0.3, False),                      # the mirror image
    (lambda i, j: j <= i + 4, 0.3, False),  # rows 4.. of a larger one: the offset form
], ids=["causal", "causal-unscaled", "window", "upper", "offset"])
def test_a_mask_made_from_the_sizes_runs_causal_attention_only_where_it_is_causal(
        keep, scale, causal, causal_calls):
    model = SizedMaskAttention(keep, scale)
    module = _symbolic(model, _qkv(t=16))
    assert ("masked_attention(" in module.code) == causal
    for t in (16, 20):
        causal_calls.clear()
        _agrees(module, model, _qkv(t=t))
        assert causal_calls == ([True] if causal else []), t
