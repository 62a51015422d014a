"""The rule library: every rule is sound on random instances (float64 reference), scalar
rules are proved by sympy, deliberately wrong rules are caught, and the naive PyTorch code
of each stability and fusion rule reaches its stable or fused form with the full library."""

import os

import pytest
import torch

from egraph import EGraph, Pattern
from egraph.egraph import UnsoundMerge
from egraph.rules import REGISTRY, library, load_rules, register
from compiler.soundness import check_rule, mutants, sympy_proof

# CI runs 100 random instances per rule; EGRAPH_SOAK=N multiplies that.
EXAMPLES = 100 * int(os.environ.get("EGRAPH_SOAK", "1"))
RULES = library("all")


def test_families_load_and_compose():
    all_rules = load_rules("all")
    parts = sum((load_rules(f) for f in ("algebra", "stability", "fusion", "layout")), [])
    assert [r.name for r in all_rules] == [r.name for r in parts]
    assert len(load_rules("stability")) >= 25
    with pytest.raises(ValueError, match="no rule family"):
        load_rules("speed")


def test_a_rule_without_a_soundness_example_cannot_be_registered():
    with pytest.raises(ValueError, match="needs a PyTorch example"):
        register("algebra", "unchecked", "(f ?x)", "?x", example="", inputs={})
    assert "unchecked" not in REGISTRY


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_is_sound_on_random_instances(rule):
    result = check_rule(rule, examples=EXAMPLES)
    assert result.ok, str(result)
    assert result.examples >= EXAMPLES


SCALAR_RULES = [r for r in RULES if sympy_proof(r.rewrite) is not None]


@pytest.mark.parametrize("rule", SCALAR_RULES, ids=lambda r: r.name)
def test_scalar_rule_is_proved_by_sympy(rule):
    assert sympy_proof(rule.rewrite) is True


@pytest.mark.parametrize("base, mutant", list(mutants()), ids=lambda v: getattr(v, "name", ""))
def test_deliberately_wrong_rules_are_caught(base, mutant):
    try:
        result = check_rule(base, examples=40, rewrite=mutant)
    except UnsoundMerge:
        return  # the analysis refused the merge (a shape or sign that cannot be equal)
    assert not result.ok, f"{mutant.name} was not caught: {result}"


PYTORCH_RULES = [r for r in RULES if r.family in ("stability", "fusion")]


def _initial_matches(rule, eg):
    return [eg.find(m[0]) for m in rule.rewrite.search(eg)]


@pytest.mark.parametrize("rule", PYTORCH_RULES, ids=lambda r: r.name)
def test_naive_pytorch_code_reaches_the_stable_or_fused_form(rule):
    """The rule's naive example, traced and saturated with the whole library, holds the
    rule's right side in the class its left side matched."""
    import math

    import torch.nn.functional as F

    names = list(rule.inputs)
    fn = eval(f"lambda {', '.join(names)}: {rule.example}",  # noqa: S307
              {"torch": torch, "F": F, "math": math})
    inputs = []
    for n in names:
        spec = rule.inputs[n]
        if spec.domain.startswith("index:"):
            inputs.append(torch.randint(0, int(spec.domain[6:]), spec.shape))
        else:
            inputs.append(torch.rand(spec.shape) + 0.5)
    gm = torch.fx.symbolic_trace(fn)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    domains = {placeholders[i]: rule.inputs[n].domain for i, n in enumerate(names)
               if rule.inputs[n].domain in ("positive", "nonneg", "nonzero", "unit")}
    eg = EGraph.from_fx(gm, tuple(inputs), domains=domains)
    targets = _initial_matches(rule, eg)
    assert targets, f"{rule.name}: the left side does not match the traced example"
    eg.saturate(load_rules("all"), iter_limit=4, node_limit=20_000, time_limit=20.0)
    if rule.rewrite.rhs is not None and rule.rewrite.rhs.root_op is not None:
        found = {eg.find(m[0]) for m in Pattern.of(rule.rewrite.rhs.term).search_tuples(eg)}
        # right sides with ?vars match anywhere; they must land in a matched class
        assert any(eg.find(t) in found for t in targets), rule.name
    else:
        assert eg.report.rules[rule.name].applied > 0, rule.name
