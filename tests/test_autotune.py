"""Autotuning (compiler.autotune): the cost model's choice against the few programs it
cannot tell from it, timed on the example inputs. The clock is injected where a test
needs one program to be the faster: no assertion here reads a wall clock."""

import warnings

import pytest
import torch

from backends.fx import build_module
from compiler.autotune import DECISIONS, MODEL, TWIN, Autotune, Candidates, autotune, run_key
from compiler.compile import capture, make_backend
from compiler.fx import choose_program
from compiler.options import BackendOptions
from egraph import EGraph
from egraph.extract import best_nodes, program_order, program_roots, source_program
from egraph.extract.program import is_acyclic
from egraph.rules import load_rules
from extractors import Flops


def softplus_twice(x):
    return torch.log(1 + torch.exp(x)) * 2


@pytest.fixture(autouse=True)
def fresh_decisions():
    DECISIONS.clear()
    yield
    DECISIONS.clear()


def saturated(shape=(64,)):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(softplus_twice), (x,))
    return eg.saturate(load_rules("all"), iter_limit=3), x


def fake_timer(fastest=None, calls=None):
    """Milliseconds by label: 1 for ``fastest`` (the first label that is not the model's
    choice where ``fastest`` is "other"), 2 for every other; ``calls`` counts the calls."""
    def timer(fns):
        if calls is not None:
            calls.append(list(fns))
        target = next(k for k in fns if k not in (MODEL, TWIN)) if fastest == "other" \
            else fastest
        return {k: 1.0 if k == target else 2.0 for k in fns}
    return timer


def test_autotune_picks_among_valid_candidates_and_returns_eagers_outputs():
    eg, x = saturated()
    module = eg.extract(Flops(), autotune=True)
    tuned = module.meta["egraph_report"].autotune
    assert tuned.timed == len(tuned.candidates) >= 2
    labels = [p.found_by[0] for p in tuned.candidates]
    assert labels[0] == MODEL and tuned.chosen.split(", ")[0] in labels
    assert all(p.ms > 0 for p in tuned.candidates)
    assert module.code in {p.code for p in tuned.candidates}
    torch.testing.assert_close(module(x), softplus_twice(x))
    for program in tuned.candidates:
        torch.testing.assert_close(program.module(x), softplus_twice(x))


def test_the_faster_program_is_kept():
    eg, x = saturated()
    module = eg.extract(Flops(), autotune=Autotune(timer=fake_timer("other")))
    tuned = module.meta["egraph_report"].autotune
    other = tuned.candidates[1]
    assert tuned.chosen == ", ".join(other.found_by) and tuned.chosen_ms == 1.0
    assert tuned.model_ms == 2.0
    assert module.code == other.code != tuned.candidates[0].code
    torch.testing.assert_close(module(x), softplus_twice(x))


def test_a_tie_keeps_the_models_choice():
    eg, _ = saturated()
    plain = eg.extract(Flops())
    module = eg.extract(Flops(), autotune=Autotune(timer=fake_timer(None)))
    tuned = module.meta["egraph_report"].autotune
    assert tuned.timed >= 2 and tuned.chosen == ", ".join(tuned.candidates[0].found_by)
    assert module.code == plain.code


@pytest.mark.parametrize("other, kept", [(1.9, MODEL), (1.5, "other")])
def test_a_gain_within_the_models_two_timings_keeps_its_choice(other, kept):
    eg, _ = saturated()

    def timer(fns):
        return {k: {MODEL: 2.0, TWIN: 2.2}.get(k, other) for k in fns}

    tuned = eg.extract(Flops(), autotune=Autotune(timer=timer)).meta["egraph_report"].autotune
    assert tuned.spread_ms == pytest.approx(0.2)
    first = tuned.chosen.split(", ")[0]
    assert (first == MODEL) == (kept == MODEL)


def test_the_decision_is_remembered_for_the_same_graph_and_inputs():
    calls = []
    eg, _ = saturated()
    first = eg.extract(Flops(), autotune=Autotune(timer=fake_timer("other", calls)))
    again, _ = saturated()
    second = again.extract(Flops(), autotune=Autotune(timer=fake_timer(MODEL, calls)))
    assert len(calls) == 1  # the second was not timed: the first decision holds
    assert second.meta["egraph_report"].autotune.cached
    assert second.code == first.code
    other, _ = saturated(shape=(32,))  # other inputs: timed again
    other.extract(Flops(), autotune=Autotune(timer=fake_timer(MODEL, calls)))
    assert len(calls) == 2


def test_a_program_that_fails_validation_is_never_timed_nor_kept():
    eg, x = saturated()
    roots = program_roots(eg)
    picked = choose_program(eg, Flops(), roots=roots)[0]
    wrong = torch.fx.symbolic_trace(lambda x: torch.exp(x) * 3)

    def build(choice):
        from backends.fx import build_module
        return build_module(eg, choice) if choice == picked else wrong

    def choose(cost):
        return choose_program(eg, cost, roots=roots)[0]

    kept, tuned = autotune(eg, Flops(), picked, choose, Autotune(timer=fake_timer("other")),
                           build)
    assert kept == picked and tuned.timed == 0
    assert tuned.left_out and all(why.startswith("validation") for _, why in tuned.left_out)


def test_autotune_is_off_by_default():
    assert BackendOptions().autotune is False
    eg, _ = saturated()
    assert eg.extract(Flops()).meta["egraph_report"].autotune is None
    with capture() as seen:
        torch.compile(softplus_twice, backend=make_backend(rules=()))(torch.randn(8))
    assert seen.reports and all(r.autotune is None for r in seen.reports)


def test_the_backend_option_and_max_autotune_turn_it_on():
    torch._dynamo.reset()
    with capture() as seen:
        backend = make_backend(iter_limit=3, autotune=Autotune(timer=fake_timer("other")))
        torch.compile(softplus_twice, backend=backend)(torch.randn(8))
    tuned = [r.autotune for r in seen.reports]
    assert tuned and all(t is not None for t in tuned)
    assert any(t.timed >= 2 and t.chosen != MODEL for t in tuned)
    assert "programs timed" in str(seen.reports[-1])
    torch._dynamo.reset()
    with capture() as seen, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the mode's Inductor options: not our emission's)
        torch.compile(softplus_twice, backend="egraph", mode="max-autotune")(torch.randn(8))
    assert seen.reports and all(r.autotune is not None for r in seen.reports)
    torch._dynamo.reset()


@pytest.mark.parametrize("value, error, words", [
    ("yes", TypeError, "autotune='yes': use True, False"),
    (1, TypeError, "autotune=1: use True, False"),
])
def test_a_bad_option_value_says_what_to_pass(value, error, words):
    with pytest.raises(error, match=words):
        BackendOptions.of({"autotune": value})
    with pytest.raises(error, match=words):
        saturated()[0].extract(Flops(), autotune=value)


@pytest.mark.parametrize("settings, words", [
    ({"programs": 1}, "programs=1"), ({"margin": -0.1}, "margin=-0.1"),
    ({"rounds": 0}, "rounds=0"), ({"timer": "clock"}, "timer='clock'"),
])
def test_bad_settings_say_which(settings, words):
    with pytest.raises((TypeError, ValueError), match=words):
        Autotune(**settings)


def test_autotune_needs_inputs_to_time_on():
    eg = EGraph()
    eg.add("(+ a b)", root=True)
    with pytest.raises(ValueError, match="EGraph.from_fx"):
        eg.extract(Flops(), autotune=True)
    with pytest.raises(ValueError, match="autotune and memory_budget"):
        saturated()[0].extract(Flops(), autotune=True, memory_budget=1e9)


def test_a_timer_that_leaves_a_program_out_is_an_error():
    eg, _ = saturated()
    with pytest.raises(ValueError, match="no time for"):
        eg.extract(Flops(), autotune=Autotune(timer=lambda fns: {MODEL: 1.0}))


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Parameter(torch.randn(4)) for _ in range(3))

    def forward(self, x):
        return x * (self.a * self.b + self.a * self.c)


def test_programs_that_fold_one_constant_by_other_recipes_are_one_program():
    # a*b + a*c and a*(b + c) fold to the same scale; only the count of folded values
    # (and so their names in the code) differs: timing both would time one program twice
    eg = EGraph.from_fx(torch.fx.symbolic_trace(_Scaled()), (torch.randn(4),))
    eg.saturate(load_rules("all"), iter_limit=4)
    source = source_program(eg)
    scale = next(c for c in eg.classes()
                 if any(n[0] == "add" for n in eg.class_nodes[c])
                 and any(n[0] == "mul" for n in eg.class_nodes[c])
                 and any(n[0] == "add" and all(k in source for k in n[1:])
                         for n in eg.class_nodes[c]))
    factored = next(n for n in eg.class_nodes[scale] if n[0] == "mul"
                    and any(eg.class_nodes[k][0][0] == "add" for k in n[1:]))
    inner = next(k for k in factored[1:] if eg.class_nodes[k][0][0] == "add")
    other = {**source, scale: factored, inner: eg.class_nodes[inner][0]}
    one, two = build_module(eg, source), build_module(eg, other)
    assert one.code != two.code and run_key(one) == run_key(two)
    found = Candidates(eg)
    assert found.offer("source", source) is found.offer("factored", other)
    assert len(found.programs) == 1 and found.programs[0].found_by == ["source", "factored"]
    x = torch.randn(4)
    torch.testing.assert_close(two(x), one(x))


class _ScaledSoftplus(_Scaled):
    def forward(self, x):
        return torch.log(1 + torch.exp(x)) * (self.a * self.b + self.a * self.c)


def test_programs_of_one_egraph_share_the_constants_they_fold_alike():
    # autotuning and the cost-model harness hold many programs of one model at once: each
    # folding its own copy of the same merged weights would hold a 1B-parameter model's
    # weights two dozen times over
    eg = EGraph.from_fx(torch.fx.symbolic_trace(_ScaledSoftplus()), (torch.randn(4),))
    eg.saturate(load_rules("all"), iter_limit=3)
    source, roots = source_program(eg), program_roots(eg)
    filler = {c: v[1] for c, v in best_nodes(eg, Flops()).items()}
    found = Candidates(eg)
    first = found.offer("source", source)
    for c in program_order(eg, source):
        for alt in eg.class_nodes[c]:
            trial = {**filler, **source, c: alt}
            if alt != source[c] and is_acyclic(eg, trial, roots):
                found.offer(f"{alt[0]} in {c}", trial)
    held = {t.data_ptr() for t in first.module.folded_constants.buffers()}
    sharing = [p for p in found.programs[1:] if hasattr(p.module, "folded_constants")
               and {t.data_ptr() for t in p.module.folded_constants.buffers()} == held]
    assert held and sharing
    x = torch.randn(4)
    for program in found.programs[1:]:
        torch.testing.assert_close(program.module(x), first.module(x))
