"""Real architectures from ``transformers`` through every entry point of the pipeline.

The corpus (``benchmarks/corpus.py``) builds small randomly initialised models (2 layers,
hidden 64, vocabulary 1000) from configs: nothing is downloaded. For each one:

- torch.export -> ``EGraph.from_fx`` -> ``saturate(load_rules("all"))`` ->
  ``extract(Flops(), validate="raise")``: the outputs equal eager's, no fallback;
- ``torch.compile`` with the e-graph backend (``validate="raise"``): inference equals eager,
  then a second sequence length (or batch) through the same compiled model;
- a training step for some: the loss and every parameter's gradient equal eager's;
- greedy ``generate`` for some, with the forward compiled and the key/value cache on (a
  dynamic cache, or a static one updated in place): the tokens equal eager's.

The whole module is skipped when transformers is not installed.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.corpus import FIXED_ATTENTION, MODELS, build, build_generation  # noqa: E402
from compiler.compile import default_cost, make_backend  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.dims import is_symbolic  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors import Flops  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
# Rewrites may reassociate float arithmetic (validation judges that against float64): the
# comparison with eager allows float32 rounding noise, far below any wrong rewrite's error.
TOL = dict(rtol=1e-4, atol=1e-5)
TRAINED = ("gpt2", "bert", "llama", "mixtral", "convnext", "unet2d_cond", "flux")
# attention through torch's scaled_dot_product_attention: every model through torch.export
# (cheap), one through torch.compile
SDPA_COMPILED = ("llama",)


@pytest.fixture(scope="module")
def rules():
    return load_rules("all")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny: one intra-op thread runs them as fast, and no parallel op
    stalls waiting for a core that another process holds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _flat(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _assert_no_fallback(backend) -> None:
    assert backend.cache, "the backend compiled no graph"
    for entry in backend.cache.values():
        report = entry.module.meta["egraph_report"]
        assert not report.fell_back, str(report)
        assert report.validation is None or report.validation.ok, str(report)


@pytest.mark.parametrize("name, attn", [(name, attn) for name in MODELS
                                        for attn in ("eager", "sdpa")
                                        if attn == "eager" or name not in FIXED_ATTENTION])
def test_export_pipeline(name, attn, rules):
    case = build(name, attn)
    program = torch.export.export(case.model, case.inputs)
    eg = EGraph.from_fx(program, case.inputs).saturate(rules, **LIMITS)
    opt = eg.extract(Flops(), validate="raise")
    report = opt.meta["egraph_report"]
    assert not report.fell_back, str(report)
    assert report.validation is not None and report.validation.ok, str(report)
    with torch.no_grad():
        got, want = opt(*case.inputs), case.model(*case.inputs)
    assert type(got) is type(want)  # (the model's output class: users read its fields)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "t5", "bart", "vit"])
def test_export_with_a_dynamic_size_gets_the_static_rewrites(name, rules):
    """torch.export with the size that varies dynamic (``Dim.AUTO``: export finds which
    sizes are one) gives a graph of symbolic sizes; the analysis carries them, so the
    program gets the fusions a static export gets (attention, linear merges, layer
    norms), and runs at the second size."""
    case = build(name)
    model = case.model.eval()
    dim = 1 if case.varies == "seq" else 0
    dynamic = (tuple({dim: torch.export.Dim.AUTO} if x.dim() > dim else None
                     for x in case.inputs),)
    used = []
    for shapes in (None, dynamic):
        program = torch.export.export(model, case.inputs, dynamic_shapes=shapes)
        eg = EGraph.from_fx(program, case.inputs).saturate(rules, **LIMITS)
        opt = eg.extract(default_cost(case.inputs), validate="raise")
        used.append(set(opt.meta["egraph_report"].used))
    assert any(is_symbolic(eg.data(c).shape) for c in eg.fx.input_classes
               if eg.data(c).kind == "tensor")
    # A decoder's causal mask is a constant in the static graph, read as causal there; the
    # symbolic graph builds it from its sizes, observed causal at the example's and
    # checked at run time (that attention takes a grouped query's unrepeated heads).
    checked = "sdpa-causal-additive-checked"
    from_constants = {"sdpa-causal-additive": checked, "sdpa-grouped-query": checked}
    fusions = {from_constants.get(r, r) for r in used[0]
               if r.startswith(("sdpa", "linear", "layer-norm", "split"))}
    assert fusions and fusions <= used[1]  # (the rest are cost choices on the two graphs)
    second = case.second_inputs()
    with torch.no_grad():
        torch.testing.assert_close(opt(*second), model(*second), **TOL)


def _compiled_inference(name: str, attn: str, rules) -> None:
    case = build(name, attn)
    backend = make_backend(rules=rules, validate="raise", **LIMITS)
    compiled = torch.compile(case.model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*case.inputs), case.model(*case.inputs), **TOL)
        first = len(backend.cache)
        second = case.second_inputs()
        torch.testing.assert_close(compiled(*second), case.model(*second), **TOL)
    assert len(backend.cache) >= first
    _assert_no_fallback(backend)


@pytest.mark.parametrize("name", MODELS)
def test_compile_inference(name, rules):
    _compiled_inference(name, "eager", rules)


@pytest.mark.parametrize("name", SDPA_COMPILED)
def test_compile_inference_sdpa(name, rules):
    _compiled_inference(name, "sdpa", rules)


# Llama's sdpa path calls sdpa with enable_gqa when it decodes from the cache; its eager path
# repeats the key heads (which the rules turn into enable_gqa); a static cache is updated in
# place; T5 decodes with cross-attention to the encoder's states.
GENERATED = [("llama", "sdpa", "dynamic"), ("llama", "eager", "static"),
             ("gpt2", "eager", "dynamic"), ("t5", "sdpa", "dynamic")]


@pytest.mark.parametrize("name, attn, cache", GENERATED)
def test_cached_generation_through_compile(name, attn, cache, rules):
    """transformers' recipe: ``model.forward = torch.compile(model.forward, ...)``, then
    ``generate``. The prompt's and each step's graphs are optimised, none falls back."""
    expected = build_generation(name, attn, cache=cache)()
    generation = build_generation(name, attn, cache=cache)
    backend = make_backend(rules=rules, validate="raise", **LIMITS)
    generation.model.forward = torch.compile(generation.model.forward, backend=backend)
    assert torch.equal(generation(), expected)
    _assert_no_fallback(backend)


def test_the_generate_benchmark_times_the_program_it_checked(rules):
    """benchmarks/models.py's generate entry checks the tokens against eager's, and the
    call it hands over for timing is that compiled generation, not a recompiled one."""
    from benchmarks.models import TIMED, run_generate

    row = run_generate(build_generation("gpt2"), rules)
    assert row["graphs"] >= 2 and row["fallbacks"] == 0 and row["pipeline_s"] > 0
    compiled = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert torch.equal(row[TIMED](), build_generation("gpt2")())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled


def _loss(out) -> torch.Tensor:
    return sum(o.square().mean() for o in _flat(out))


@pytest.mark.parametrize("name", TRAINED)
def test_compile_training_step(name, rules):
    case = build(name)
    model = case.model.train()     # every dropout probability is 0: deterministic
    backend = make_backend(rules=rules, validate="raise", **LIMITS)
    compiled = torch.compile(model, backend=backend)
    loss = _loss(compiled(*case.inputs))
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    expected = _loss(model(*case.inputs))
    expected.backward()
    torch.testing.assert_close(loss, expected, **TOL)
    eager_grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == eager_grads.keys()
    for key, grad in eager_grads.items():
        torch.testing.assert_close(grads[key], grad, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    _assert_no_fallback(backend)
    # each graph ran as emitted under autograd, or its backward went through the backend
    kinds = Counter(key[0] for key in backend.cache)
    assert kinds["graph"] + kinds["backward"] >= 1 and kinds["forward"] == kinds["backward"]


AUTOCAST_TRAINED = ("bert", "t5_encoder", "resnet", "mixtral")
"""Models whose training step under CPU autocast fell back or lost accuracy: BERT (casts
aot_autograd saves apart, returned as one tensor), T5 (its float32 softmax rewritten into a
bfloat16 sdpa), ResNet (batch norm's float32 statistics typed bfloat16), Mixtral."""


@pytest.mark.parametrize("name", AUTOCAST_TRAINED)
def test_compile_training_step_under_autocast(name, rules):
    """A training step inside ``torch.autocast("cpu", dtype=torch.bfloat16)``, as
    mixed-precision training on the CPU is written: no fallback, and the loss and
    gradients of eager's own autocast step (the same bfloat16 kernels)."""
    case = build(name)
    model = case.model.train()
    backend = make_backend(rules=rules, validate="raise", **LIMITS)
    compiled = torch.compile(model, backend=backend)
    steps = []
    for run in (compiled, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = sum((o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum()
                       for o in _flat(run(*case.inputs)))
        loss.backward()
        steps.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                                      if p.grad is not None}))
        model.zero_grad(set_to_none=True)
    (loss, grads), (want, want_grads) = steps
    torch.testing.assert_close(loss, want, rtol=1e-3, atol=1e-3)
    assert grads.keys() == want_grads.keys()
    for key, grad in want_grads.items():
        assert (grads[key] - grad).norm() <= 1e-2 * grad.norm() + 1e-6, key
    _assert_no_fallback(backend)


def test_a_training_step_with_dropout_draws_eagers_masks(rules):
    """Under one seed, a training step of GPT-2 with its dropouts on gives eager's loss
    and gradients through the backend: the random calls stay the source's, in its order
    and with its shapes, so they draw the same masks (Inductor draws its own)."""
    import transformers

    config = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2,
                                     n_head=4, resid_pdrop=0.1, embd_pdrop=0.1,
                                     attn_pdrop=0.1)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).train()
    ids = torch.randint(3, 1000, (2, 8), generator=torch.Generator().manual_seed(0))

    def step(forward):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = forward(ids).last_hidden_state.square().mean()
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    backend = make_backend(rules=rules, validate="strict", **LIMITS)
    loss, grads = step(torch.compile(model, backend=backend))
    eager_loss, eager_grads = step(model)
    torch.testing.assert_close(loss, eager_loss, **TOL)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(grads[key], grad, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    _assert_no_fallback(backend)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_a_training_step_with_activation_checkpointing_replays_eagers_masks(name, rules):
    """A training step with transformers' gradient checkpointing on, dropouts on: the aot
    graphs replay each checkpointed random op from a saved generator state
    (``run_and_save_rng_state``, ``run_with_rng_state``). Ingest read the backward graph's
    state input as data ("Invalid mt19937 state": the model crashed), and validation's
    runs of the forward raised on the higher-order call (every step fell back). Under one
    seed the loss and gradients are eager's, with no fallback."""
    import transformers

    if name == "bert":
        config = transformers.BertConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4)
        model_class = transformers.BertModel
    else:
        config = transformers.LlamaConfig(vocab_size=1000, hidden_size=64,
                                          intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          attention_dropout=0.1, use_cache=False)
        model_class = transformers.LlamaModel
    torch.manual_seed(0)
    model = model_class(config).train()
    model.gradient_checkpointing_enable()
    ids = torch.randint(3, 1000, (2, 16), generator=torch.Generator().manual_seed(0))

    def step(forward):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = sum(out.square().mean() for out in forward(input_ids=ids).values())
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                               if p.grad is not None}

    backend = make_backend(rules=rules, validate="strict", **LIMITS)
    loss, grads = step(torch.compile(model, backend=backend))
    eager_loss, eager_grads = step(model)
    torch.testing.assert_close(loss, eager_loss, **TOL)
    assert grads.keys() == eager_grads.keys()
    for key, grad in eager_grads.items():
        torch.testing.assert_close(grads[key], grad, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    _assert_no_fallback(backend)
    assert any(n.target is torch.ops.higher_order.run_with_rng_state
               for entry in backend.cache.values() for n in entry.module.graph.nodes)


def test_a_channels_last_checkpointed_unet_trains_with_eagers_gradients(rules):
    """diffusers' UNet in channels-last with gradient checkpointing: the backward graph
    takes a generator state (a symbolic size), channels-last activations and 1x1
    convolution weights whose strides decide the layout of what it ``view``s. Validation's
    stand-ins were contiguous (the crash: "Expected X.is_contiguous", then a NameError
    from the size check) or had the 1x1 weights' other strides (the source raised on every
    input set, and the step fell back)."""
    case = build("unet2d")
    model = case.model.train().to(memory_format=torch.channels_last)
    next(m for m in model.modules() if hasattr(m, "enable_gradient_checkpointing")
         ).enable_gradient_checkpointing()
    inputs = (case.inputs[0].to(memory_format=torch.channels_last), *case.inputs[1:])
    backend = make_backend(rules=rules, validate="raise", **LIMITS)
    steps = []
    for forward in (torch.compile(model, backend=backend), model):
        model.zero_grad(set_to_none=True)
        loss = _loss(forward(*inputs))
        loss.backward()
        steps.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                                      if p.grad is not None}))
    (loss, grads), (want, want_grads) = steps
    torch.testing.assert_close(loss, want, **TOL)
    for key, grad in want_grads.items():
        torch.testing.assert_close(grads[key], grad, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    _assert_no_fallback(backend)


def test_a_training_step_with_random_ops_is_not_refused_for_rounding(rules):
    """Swin's stochastic depth draws random numbers in training, so validation compares
    with the source under the same seed, in float32: its fused linears differ from the
    source by rounding at elements near zero (2.8e-5 relative), within float32's
    tolerance normwise; judged element by element against that float32 source, they were
    refused."""
    import transformers

    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16,
                                     depths=[2, 1], num_heads=[2, 4], window_size=4,
                                     hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, drop_path_rate=0.1)
    torch.manual_seed(0)
    model = transformers.SwinModel(config).train()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    backend = make_backend(rules=rules, validate="strict", **LIMITS)
    compiled = torch.compile(model, backend=backend)
    torch.manual_seed(1)
    loss = compiled(x).last_hidden_state.square().mean()
    loss.backward()
    _assert_no_fallback(backend)
