"""Side conditions of library rules, written against the analyses (torch-free).

Every guard reads what the e-graph's analysis proved of a class (:class:`Meta` on graphs
built from FX: ``kind``, ``value``, ``shape``, ``dtype``, ``sign``). On an e-graph without
that analysis nothing is known, so a guarded rule does not fire. Guards compose with
:func:`all_of`; each has a readable ``__name__`` used in reports.

>>> from egraph import EGraph
>>> eg = EGraph()
>>> positive("x")(eg, {"x": eg.add("x")})  # nothing is proven without the tensor analysis
False
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from egraph.signs import NEG, POS, ZERO, describe

Guard = Callable[[Any, Any], bool]


def _meta(egraph, cid: int):
    return egraph.data(cid)


def _named(fn: Guard, name: str, **facts: Any) -> Guard:
    """Name a guard; ``facts`` (var -> fact) let tools read what it assumes, e.g. sympy
    proofs substitute ``("value", 1)`` and assume ``"positive"``."""
    fn.__name__ = name
    fn.facts = facts
    return fn


def value_of(egraph, cid: int) -> Any:
    """The literal or folded scalar value of a class, or None."""
    meta = _meta(egraph, cid)
    if meta is None or getattr(meta, "kind", None) not in ("literal", "scalar"):
        return None
    return meta.value


def sign_of(egraph, cid: int) -> int:
    """The proven sign set of a class (any sign when nothing is proven)."""
    return getattr(_meta(egraph, cid), "sign", NEG | ZERO | POS)


def is_none(egraph, cid: int) -> bool:
    """True when the class is the literal None (an absent optional argument)."""
    meta = _meta(egraph, cid)
    return getattr(meta, "kind", None) == "literal" and meta.value is None


def not_none(var: str) -> Guard:
    """``?var`` is present (not the literal None)."""
    def guard(egraph, subst) -> bool:
        return not is_none(egraph, subst[var])
    return _named(guard, f"{var} is given")


def exact_value_of(egraph, cid: int) -> Any:
    """The exact value of a numeric class (a Fraction, :mod:`egraph.scalars`) where the
    analysis tracks exactness (None for a value known only approximately, such as an
    underflowed ``exp(-1000)``), else its plain value (analyses without exactness)."""
    meta = _meta(egraph, cid)
    if hasattr(meta, "exact"):
        return meta.exact
    return value_of(egraph, cid)


def literal_is(var: str, *values: float) -> Guard:
    """``?var`` is a number exactly equal to one of ``values``: ``1e-12`` is not 0, and
    ``1e-5 * 1e5`` (a folded product that is not exactly 1) is not 1."""
    def guard(egraph, subst) -> bool:
        v = exact_value_of(egraph, subst[var])
        return isinstance(v, (int, float, Fraction)) and not isinstance(v, bool) and any(
            v == target for target in values)
    facts = {var: ("value", values[0])} if len(values) == 1 else {}
    return _named(guard, f"{var} in {values}", **facts)


def literal_near(var: str, target: float, rel: float = 1e-6) -> Guard:
    """``?var`` is a literal within ``rel`` of ``target`` (constants users type rounded)."""
    def guard(egraph, subst) -> bool:
        v = value_of(egraph, subst[var])
        return isinstance(v, (int, float)) and abs(v - target) <= rel * abs(target)
    return _named(guard, f"{var} ~= {target:.6g}", **{var: ("value", target)})


_SIGN_FACTS = {POS: "positive", POS | ZERO: "nonneg", POS | NEG: "nonzero", NEG: "negative"}


def has_sign(var: str, allowed: int) -> Guard:
    """The proven signs of ``?var`` are within ``allowed``."""
    def guard(egraph, subst) -> bool:
        s = sign_of(egraph, subst[var])
        return s != 0 and s & ~allowed == 0
    return _named(guard, f"{var} {describe(allowed)}", **{var: _SIGN_FACTS.get(allowed)})


def positive(var: str) -> Guard:
    """``?var`` is proven > 0."""
    return has_sign(var, POS)


def nonneg(var: str) -> Guard:
    """``?var`` is proven >= 0."""
    return has_sign(var, POS | ZERO)


def nonzero(var: str) -> Guard:
    """``?var`` is proven != 0."""
    return has_sign(var, POS | NEG)


def floating(var: str) -> Guard:
    """``?var`` is a floating-point tensor (so a float literal does not change its dtype)."""
    def guard(egraph, subst) -> bool:
        meta = _meta(egraph, subst[var])
        dtype = getattr(meta, "dtype", None)
        return getattr(meta, "kind", None) == "tensor" and dtype is not None and getattr(
            dtype, "is_floating_point", False)
    return _named(guard, f"{var} is floating")


def single_dim(var: str) -> Guard:
    """``?var`` is a dims literal naming exactly one dim."""
    def guard(egraph, subst) -> bool:
        v = value_of(egraph, subst[var])
        return isinstance(v, tuple) and len(v) == 1
    return _named(guard, f"{var} is one dim")


def same_shape(a: str, b: str) -> Guard:
    """``?a`` and ``?b`` are tensors of the same known shape."""
    def guard(egraph, subst) -> bool:
        ma, mb = _meta(egraph, subst[a]), _meta(egraph, subst[b])
        sa, sb = getattr(ma, "shape", None), getattr(mb, "shape", None)
        return sa is not None and sa == sb
    return _named(guard, f"shape {a} == shape {b}")


def same_dtype(*names: str) -> Guard:
    """The tensors among ``?names`` share one dtype (numbers adopt it): type promotion is
    not associative across dtypes (a 0-dim float32 tensor does not promote a float16 one,
    a full float32 tensor does), so regrouping mixed dtypes could change the result's."""
    def guard(egraph, subst) -> bool:
        dtypes = {getattr(m, "dtype", None) for m in (_meta(egraph, subst[n]) for n in names)
                  if getattr(m, "kind", None) == "tensor"}
        return len(dtypes - {None}) <= 1
    return _named(guard, f"one dtype among {', '.join(names)}")


def rank_is(var: str, *ranks: int) -> Guard:
    """``?var`` is a tensor of one of the given ranks."""
    def guard(egraph, subst) -> bool:
        shape = getattr(_meta(egraph, subst[var]), "shape", None)
        return shape is not None and len(shape) in ranks
    return _named(guard, f"rank {var} in {ranks}")


def distinct(a: str, b: str) -> Guard:
    """``?a`` and ``?b`` are different classes."""
    def guard(egraph, subst) -> bool:
        return egraph.find(subst[a]) != egraph.find(subst[b])
    return _named(guard, f"{a} != {b}")


def all_of(*guards: Guard) -> Guard:
    """Every one of ``guards`` holds."""
    def guard(egraph, subst) -> bool:
        return all(g(egraph, subst) for g in guards)
    facts: dict[str, Any] = {}
    for g in guards:
        facts.update(getattr(g, "facts", {}))
    return _named(guard, " and ".join(g.__name__ for g in guards), **facts)
