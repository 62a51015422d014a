"""Layout: transposes, permutes, reshapes and expands that cancel or compose."""

from __future__ import annotations

from egraph.rules import register
from egraph.rules.guards import value_of
from egraph.term import literal


def _lay(name, lhs, rhs, example, inputs, when=None, description=""):
    register("layout", name, lhs, rhs, example=example, inputs=inputs, when=when,
             description=description)


def _shape(egraph, cid):
    return getattr(egraph.data(cid), "shape", None)


def _shape_is(var: str, target: str):
    def guard(egraph, subst) -> bool:
        shape = _shape(egraph, subst[var])
        return shape is not None and shape == value_of(egraph, subst[target])
    guard.__name__ = f"shape {var} == {target}"
    return guard


def _compose(egraph, subst):
    p, q = value_of(egraph, subst["p"]), value_of(egraph, subst["q"])
    if not isinstance(p, tuple) or not isinstance(q, tuple) or len(p) != len(q):
        return None
    composed = tuple(p[i] for i in q)
    if composed == tuple(range(len(composed))):
        return subst["x"]
    return egraph.add_node("permute", [subst["x"], egraph.add_node(literal(composed))])


def _last_two_equal_rank(egraph, subst) -> bool:
    sa, sb = _shape(egraph, subst["a"]), _shape(egraph, subst["b"])
    if sa is None or sb is None or len(sa) != len(sb) or len(sa) < 2:
        return False
    r = len(sa)
    return {value_of(egraph, subst["i"]), value_of(egraph, subst["j"])} == {r - 2, r - 1}


_last_two_equal_rank.__name__ = "transpose of the last two dims, equal ranks"

_lay("transpose-transpose", "(transpose (transpose ?x ?a ?b) ?a ?b)", "?x",
     "x.transpose(0, 1).transpose(0, 1)", {"x": (4, 8)})
_lay("permute-permute", "(permute (permute ?x ?p) ?q)", _compose,
     "x.permute(2, 0, 1).permute(1, 2, 0)", {"x": (2, 3, 4)},
     description="two permutes compose into one (or none)")
_lay("reshape-reshape", "(reshape (reshape ?x ?s1) ?s2)", "(reshape ?x ?s2)",
     "x.reshape(8, 4).reshape(2, 16)", {"x": (4, 8)})
_lay("reshape-noop", "(reshape ?x ?s)", "?x", "x.reshape(4, 8)", {"x": (4, 8)},
     when=_shape_is("x", "s"))
_lay("expand-noop", "(expand ?x ?s)", "?x", "x.expand(4, 8)", {"x": (4, 8)},
     when=_shape_is("x", "s"))
_lay("squeeze-unsqueeze", "(squeeze (unsqueeze ?x ?d) ?d)", "?x", "x.unsqueeze(1).squeeze(1)",
     {"x": (4, 8)})
_lay("transpose-matmul", "(transpose (matmul ?a ?b) ?i ?j)",
     "(matmul (transpose ?b ?i ?j) (transpose ?a ?i ?j))", "(a @ b).transpose(-2, -1)",
     {"a": (2, 4, 8), "b": (2, 8, 3)}, when=_last_two_equal_rank,
     description="(AB)^T = B^T A^T")
