"""The form of a training graph chosen together with what it saves (compiler/forms.py):
the e-graph's equivalent programs as alternatives of the partition under a budget."""

from __future__ import annotations

import copy

import pytest
import torch
from test_partition import _decisions, _model, _step, _train

from compiler.compile import make_backend
from compiler.forms import choose_form
from compiler.partition import MemoryBudget, UnmetMemoryBudget


def _traced(f) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(f)


def test_a_form_that_saves_less_meets_a_budget_its_source_cannot():
    """``(x @ w).sum()`` needs all of ``x`` for ``w``'s gradient; ``x.sum(0) @ w`` one row
    of it. The budget is half what the source's min-cut partition saves: the source
    cannot meet it, the other form can, and is chosen."""
    forms = {"source": _traced(lambda x, w: ((x @ w).sum(),)),
             "summed": _traced(lambda x, w: ((x.sum(0) @ w).sum(),))}
    inputs = (torch.randn(64, 32), torch.randn(32, 16, requires_grad=True))
    choice = choose_form(forms, inputs, MemoryBudget(fraction=0.5))
    assert (choice.name, choice.module) == ("summed", forms["summed"])
    assert (choice.min_cut_bytes, choice.budget_bytes) == (64 * 32 * 4, 64 * 32 * 2)
    source, summed = choice.trials
    assert source.seconds is None and source.least_bytes == 64 * 32 * 4
    assert summed.seconds is not None and summed.saved_bytes <= choice.budget_bytes
    with pytest.raises(UnmetMemoryBudget, match="no partition of the 2 forms") as unmet:
        choose_form(forms, inputs, MemoryBudget(bytes=64))
    assert unmet.value.least_bytes == 32 * 4  # (the summed row, the least of the two)


def test_of_the_forms_that_meet_the_budget_the_fastest_is_kept():
    """A softmax written out (its backward reads the exponentials and their sum) against
    torch's (its backward reads its output): both meet the budget; the estimate of each
    partitioned forward and backward, recomputation included, chooses."""
    def written(x, w):
        s = x @ w
        e = (s - s.amax(-1, keepdim=True)).exp()
        return ((e / e.sum(-1, keepdim=True)).tanh().sum(),)

    forms = {"source": _traced(written),
             "softmax": _traced(lambda x, w: (torch.softmax(x @ w, -1).tanh().sum(),))}
    inputs = (torch.randn(64, 32), torch.randn(32, 256, requires_grad=True))
    for fraction in (1.0, 0.5):
        choice = choose_form(forms, inputs, MemoryBudget(fraction=fraction))
        fastest = min(choice.trials, key=lambda trial: trial.seconds)
        assert choice.name == fastest.name == "softmax"
        assert all(t.saved_bytes <= choice.budget_bytes for t in choice.trials)


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_nanogpts_attention_trains_fused_under_a_budget(codegen):
    """Two nanoGPT blocks (their attention written out over a ``tril`` buffer): under a
    budget the backend trains the e-graph's form with the fused causal attention, which
    saves a row statistic where the source saves each head's T x T probabilities; the
    step saves less than the source's min-cut partition and no more than the budget, with
    eager's gradients."""
    model = _model()
    x = torch.randn(4, 32, 64)
    expected, _ = _train(model, None, x)
    with torch._inductor.config.patch(force_disable_caches=True):
        backend = make_backend(memory_budget=1.0, codegen=codegen)
        grads, saved = _train(model, backend, x)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    (decision,) = _decisions(backend)
    form = decision.form
    assert form.name != "source", form
    source = next(t for t in form.trials if t.name == "source")
    chosen = next(t for t in form.trials if t.name == form.name)
    assert chosen.seconds < source.seconds and chosen.saved_bytes < source.saved_bytes
    assert decision.min_cut_bytes == form.min_cut_bytes >= source.saved_bytes
    assert saved <= decision.budget_bytes
    probabilities = 4 * 4 * 32 * 32 * 4  # (batch, heads, T, T, float32)
    assert probabilities not in decision.saved.values(), decision.saved


def test_the_report_names_the_form_and_its_rivals():
    model = _model()
    x = torch.randn(4, 32, 64)
    torch._dynamo.reset()
    backend = make_backend(memory_budget=0.5)
    _step(torch.compile(copy.deepcopy(model), backend=backend), x).backward()
    (decision,) = _decisions(backend)
    text = str(decision)
    assert f"form {decision.form.name!r} of {len(decision.form.trials)}" in text
    assert "source: saves" in text


def test_the_backward_is_validated_on_what_the_forward_saved(monkeypatch):
    """An aot backward graph reads what its forward saved: drawn at random, a layer norm's
    saved deviation or an attention's row statistics overflow the recomputation, both
    programs' gradients are NaN, and the backward's program was refused (nanoGPT's
    decoder at GPT-2's width). Its validation runs on the values the forward saved on the
    user's inputs: the block's input itself among them, as the user passed it."""
    import compiler.compile

    seen = {}
    compile_one = compiler.compile.compile_one

    def recording(gm, example_inputs, options, target=None, name="graph"):
        seen[name] = example_inputs
        return compile_one(gm, example_inputs, options, target, name)

    monkeypatch.setattr(compiler.compile, "compile_one", recording)
    model = _model()
    x = torch.randn(4, 32, 64)
    torch._dynamo.reset()
    backend = make_backend(memory_budget=0.5)
    _step(torch.compile(copy.deepcopy(model), backend=backend), x).backward()
    backward = seen["backward 0"]
    assert not any(isinstance(v, torch._subclasses.FakeTensor) for v in backward)
    assert any(isinstance(v, torch.Tensor) and v.shape == x.shape and torch.equal(v, x)
               for v in backward)
