"""A rule's default example: the PyTorch program its left side spells."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from compiler.soundness import check_rule
from egraph import vars
from egraph.ops import exp, log, masked_fill, sigmoid, softmax, sum
from egraph.ops.table import TABLE
from egraph.rewrite import MultiPattern
from egraph.rules import library
from egraph.rules.define import rule
from egraph.rules.guards import positive
from egraph.rules.pattern_program import pattern_program, write_pattern
from egraph.term import Term, Var, parse

x, y, m, d = vars("x y m d")


def test_a_rule_without_an_example_is_checked_on_the_program_its_left_side_spells():
    r = rule("sigmoid-of-neg", sigmoid(-x), 1 - sigmoid(x))
    assert r.example_code == "torch.sigmoid(torch.neg(x))"
    assert list(r.inputs) == ["x"] and r.inputs["x"].shape == (4, 8)
    result = check_rule(r, examples=10)
    assert result.ok and result.fired > 0, result


def test_a_wrong_rule_without_an_example_is_caught_on_its_spelled_program():
    r = rule("sigmoid-of-neg-wrong", sigmoid(-x), sigmoid(x))
    assert not check_rule(r, examples=10).ok


def test_declared_inputs_give_the_spelled_program_its_domain():
    r = rule("exp-log", exp(log(x)), x, when=positive(x), inputs={"x": ((4, 8), "positive")})
    assert r.inputs["x"].domain == "positive"
    assert check_rule(r, examples=10).ok
    # (unguarded, the rule is caught where the left side is undefined)
    assert not check_rule(rule("exp-log", exp(log(x)), x), examples=10).ok


@pytest.mark.parametrize("pattern, code", [
    (parse("(to ?x #dtype:float16)"), "x.to(torch.float16)"),
    (masked_fill(x, m, float("-inf")), "torch.masked_fill(x, m, float('-inf'))"),
    (sum(x, (1,), True), "torch.sum(x, dim=(1,), keepdim=True)"),
])
def test_methods_indexing_special_floats_and_attributes_are_written_as_python(pattern, code):
    assert write_pattern(pattern)[1] == code
    program = pattern_program(pattern, {"torch": torch})
    assert inspect.getsource(program).strip().endswith(code)


def test_a_left_side_no_program_spells_asks_for_an_example():
    with pytest.raises(ValueError, match=r"rule 'softmax-dim'.*attribute 'dim'.*give the rule "
                                         r"an example"):
        rule("softmax-dim", softmax(x, d), softmax(x, d))
    without = next(n for n, spec in TABLE.items() if spec.impl is None and spec.params)
    with pytest.raises(ValueError, match=f"{without} has no torch callable"):
        write_pattern(Term(without, tuple(Var(f"v{i}") for i in TABLE[without].params)))


def _spelled_library_rules():
    """Library rules whose left side spells a program over the inputs they declare (a
    variable standing for a number, ``x / ?s``, is no input of theirs)."""
    for r in library("all"):
        if isinstance(r.rewrite.lhs, MultiPattern):
            continue
        try:
            parameters, _ = write_pattern(r.rewrite.lhs.term)
        except ValueError:
            continue
        if set(parameters) <= set(r.inputs):
            yield r


SPELLED = list(_spelled_library_rules())


def test_most_library_rules_spell_their_left_side():
    assert len(SPELLED) >= 50


@pytest.mark.parametrize("r", SPELLED, ids=lambda r: r.name)
def test_the_program_a_library_rule_spells_fires_it_soundly(r):
    """The op table's torch callables, read back by ingest, are the op the rule matches:
    the table and the vocabulary agree on every op a library rule's left side uses."""
    program = pattern_program(r.rewrite.lhs.term, {"torch": torch})
    parameters = list(inspect.signature(program).parameters)
    spelled = dataclasses.replace(r, examples=(program,),
                                  inputs={p: r.inputs[p] for p in parameters})
    result = check_rule(spelled, examples=4)
    assert result.ok and result.fired > 0, result
