"""Rule diagnostics: why a rule does not fire, on plain and FX e-graphs."""

import torch

from egraph import ConstantFolding, EGraph, diagnose, rewrite
from egraph.rules import load_rules

LIBRARY = {r.name: r for r in load_rules("all")}


def _cancel_div():
    return rewrite("cancel-div", "(/ ?a ?a)", "1",
                   when=lambda eg, s: eg.data(s["a"]) not in (None, 0))


def test_sexpr_guard_refusal_names_guard_and_facts():
    d = diagnose(_cancel_div(), "(+ (/ x x) (/ y 3))", analysis=ConstantFolding())
    assert not d.fires and d.stop is None
    [refusal] = d.refusals
    assert refusal.guard == "<lambda>"
    assert refusal.facts == {"a": None}  # x is not a known constant
    text = str(d)
    assert "guard '<lambda>' refused at class" in text and "(/ x x)" in text


def test_sexpr_named_guard_accepts_and_refuses_by_facts():
    def known(eg, s):
        return eg.data(s["a"]) is not None

    r = rewrite("f-twice", "(f ?a ?a)", "(g ?a)", when=known)
    d = diagnose(r, "(h (f 4 4) (f x x))", analysis=ConstantFolding())
    assert [d.egraph.data(s["a"]) for s in d.applies] == [4]
    assert [(x.guard, x.facts) for x in d.refusals] == [("known", {"a": None})]
    assert "1 accepted by the guard" in str(d) and "fires at class" in str(d)


def test_sexpr_subpattern_stop_reports_deepest_match_and_held_ops():
    d = diagnose(rewrite("zero-add", "(+ ?a 0)", "?a"), "(* (+ x 1) 2)")
    assert not d.fires and not d.matches
    stop = d.stop
    assert stop.matched == "(+ ?a _)" and stop.places == 1
    assert str(stop.parent) == "(+ ?a 0)" and stop.position == 2
    assert str(stop.child) == "0"
    assert list(stop.held.values()) == [["1"]]
    assert "stops at child 2 of (+ ?a 0): 0 is not there" in str(d)


def test_sexpr_stop_deep_in_the_pattern():
    d = diagnose(rewrite("r", "(f (g (h ?x)) ?y)", "?y"), "(f (g (k z)) w)")
    assert d.stop.matched == "(f (g _) _)"
    assert str(d.stop.child) == "(h ?x)"
    assert list(d.stop.held.values()) == [["k"]]


def test_sexpr_repeated_variable_bound_elsewhere():
    d = diagnose(rewrite("square", "(* ?a ?a)", "(sq ?a)"), "(* x y)")
    assert str(d.stop.child) == "?a"
    assert "bound to another class" in str(d)


def test_sexpr_root_op_absent():
    d = diagnose(rewrite("r", "(log (* ?a ?b))", "?a"), "(exp x)")
    assert d.stop.parent is None and d.stop.matched is None
    assert "no class holds log with 1 child" in str(d)


def test_multi_pattern_parts_disagree():
    r = rewrite("mp", ["?v = (f ?x)", "?w = (g ?x)"], "?v")
    assert diagnose(r, "(h (f x) (g x))").fires
    d = diagnose(r, "(h (f x) (g y))")
    assert not d.fires and d.stop is None
    assert "not with the same classes for their shared variables" in str(d)


def _fx_egraph(fn, *inputs):
    return EGraph.from_fx(torch.fx.symbolic_trace(fn), inputs)


def test_fx_guard_refusal_shows_the_part_that_refused_and_the_meta():
    # log(x * y) = log(x) + log(y) only for proven positive x and y.
    eg = _fx_egraph(lambda x, y: torch.log(x * y), torch.rand(3), torch.rand(3))
    d = diagnose(LIBRARY["log-mul"], eg)
    assert d.matches and not d.fires
    refusal = d.refusals[0]
    assert refusal.guard == "a > 0"
    assert refusal.facts["a"].kind == "tensor" and refusal.facts["a"].shape == (3,)
    assert "guard 'a > 0' refused" in str(d) and "sign=" in str(d)


def test_fx_subpattern_stop_at_a_literal():
    # log(x + 2) is not log(1 + x): the walk gets as far as (log (add ?x _)), in the
    # spelling with x first, and shows the literal the program holds instead of 1.
    eg = _fx_egraph(lambda x: torch.log(x + 2), torch.rand(3))
    d = diagnose(LIBRARY["log1p"], eg)
    assert not d.matches
    assert d.stop.matched == "(log (add ?x _))"
    assert d.stop.child.op == ("int", 1)
    assert list(d.stop.held.values()) == [["#int:2"]]


def test_fx_subpattern_stop_at_an_op():
    eg = _fx_egraph(lambda x: torch.log(torch.exp(x) * 2), torch.rand(3))
    d = diagnose(LIBRARY["log1p"], eg)
    assert d.stop.matched == "(log _)"
    assert d.stop.child.op == "add"
    assert list(d.stop.held.values()) == [["mul"]]


def test_fx_rule_fires():
    eg = _fx_egraph(lambda x: torch.log(1 + x), torch.rand(3))
    d = diagnose(LIBRARY["log1p"], eg)
    assert d.fires and "fires at class" in str(d)
