"""egg's propositional suite."""

from egraph import EGraph, parse
from egraph.examples.prop import analysis, chain_rules, contrapositive_rules, prove


def test_prove_contrapositive():
    goals = ["(-> x y)", "(| (~ x) y)", "(| (~ x) (~ (~ y)))", "(| (~ (~ y)) (~ x))",
             "(-> (~ y) (~ x))"]
    eg = prove("(-> x y)", goals, contrapositive_rules())
    for g in goals:
        assert eg.equiv(eg.roots[0], g), g


def test_prove_chain():
    goals = ["(& (-> x y) (-> y z))", "(& (-> (~ y) (~ x)) (-> y z))",
             "(& (-> y z)         (-> (~ y) (~ x)))", "(| z (~ x))", "(| (~ x) z)", "(-> x z)"]
    eg = prove("(& (-> x y) (-> y z))", goals, chain_rules())
    for g in goals:
        assert eg.equiv(eg.roots[0], g), g


def test_const_fold():
    eg = EGraph(analysis=analysis())
    start = eg.add(parse("(| (& false true) (& true false))"))
    eg.rebuild()
    assert eg.equiv(start, "false")
    assert eg.data(start) is False


def test_implication_folds_as_logic_says():
    eg = EGraph(analysis=analysis())
    assert eg.data(eg.add("(-> false true)")) is True
    assert eg.data(eg.add("(-> true false)")) is False
