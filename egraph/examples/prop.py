"""egg's propositional-logic suite: rules, constant folding over booleans, and the proofs.

A port of egg's ``tests/prop.rs``. Implication folds as ``(not a) or b`` (egg's test
folds it as ``a or not b``, a slip no test exercises; we keep the logic right).

>>> eg = prove("(-> x y)", ["(-> (~ y) (~ x))"], contrapositive_rules())
>>> eg.report.stop_reason
'goal'
"""

from __future__ import annotations

from egraph.analysis import ConstantFolding
from egraph.egraph import EGraph
from egraph.rewrite import Rewrite, rewrite
from egraph.term import parse

_BOOL = {"true": True, "false": False}


def analysis() -> ConstantFolding:
    """Fold ``& | ~ ->`` over the leaves ``true`` and ``false`` (no pruning, as in egg)."""
    return ConstantFolding(
        ops={
            "&": lambda a, b: a and b,
            "|": lambda a, b: a or b,
            "~": lambda a: not a,
            "->": lambda a, b: (not a) or b,
        },
        prune=False,
        constant_of=lambda op: _BOOL.get(op) if type(op) is str else None,
        leaf_of=lambda value: "true" if value else "false",
    )


_RULES = {
    "def_imply": ("(-> ?a ?b)", "(| (~ ?a) ?b)"),
    "double_neg": ("(~ (~ ?a))", "?a"),
    "assoc_or": ("(| ?a (| ?b ?c))", "(| (| ?a ?b) ?c)"),
    "dist_and_or": ("(& ?a (| ?b ?c))", "(| (& ?a ?b) (& ?a ?c))"),
    "dist_or_and": ("(| ?a (& ?b ?c))", "(& (| ?a ?b) (| ?a ?c))"),
    "comm_or": ("(| ?a ?b)", "(| ?b ?a)"),
    "comm_and": ("(& ?a ?b)", "(& ?b ?a)"),
    "lem": ("(| ?a (~ ?a))", "true"),
    "or_true": ("(| ?a true)", "true"),
    "and_true": ("(& ?a true)", "?a"),
    "contrapositive": ("(-> ?a ?b)", "(-> (~ ?b) (~ ?a))"),
    "lem_imply": ("(& (-> ?a ?b) (-> (~ ?a) ?c))", "(| ?b ?c)"),
}
_FLIPPED = {"def_imply_flip": "def_imply", "double_neg_flip": "double_neg"}


def rule(name: str) -> Rewrite:
    """One of egg's propositional rules by name (``*_flip`` names run right to left)."""
    if name in _FLIPPED:
        lhs, rhs = _RULES[_FLIPPED[name]]
        return rewrite(name, rhs, lhs)
    lhs, rhs = _RULES[name]
    return rewrite(name, lhs, rhs)


def contrapositive_rules() -> list[Rewrite]:
    """The rules egg's ``prove_contrapositive`` uses."""
    return [rule(n) for n in ("def_imply", "def_imply_flip", "double_neg_flip", "comm_or")]


def chain_rules() -> list[Rewrite]:
    """The rules egg's ``prove_chain`` uses."""
    return contrapositive_rules() + [rule("comm_and"), rule("lem_imply")]


def prove(start: str, goals: list[str], rules: list[Rewrite]) -> EGraph:
    """Saturate ``start`` under egg's prop limits (20 iterations, 5,000 nodes)."""
    eg = EGraph(analysis=analysis())
    root = eg.add(parse(start), root=True)
    return eg.saturate(rules, iter_limit=20, node_limit=5_000,
                       goals=[(root, parse(g)) for g in goals])
