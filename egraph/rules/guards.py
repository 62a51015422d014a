"""Side conditions of library rules, written against the analyses (torch-free).

Every guard reads what the e-graph's analysis proved of a class (:class:`Meta` on graphs
built from FX: ``kind``, ``value``, ``shape``, ``dtype``, ``sign``). On an e-graph without
that analysis nothing is known, so a guarded rule does not fire. Guards compose with
:func:`all_of`; each has a readable ``__name__`` used in reports.

Guards name the pattern variables they read, as the variables themselves or by name:

>>> from egraph import EGraph, vars
>>> (x,) = vars("x")
>>> positive(x).__name__, positive("x").__name__
('x > 0', 'x > 0')
>>> eg = EGraph()
>>> positive(x)(eg, {"x": eg.add("x")})  # nothing is proven without the tensor analysis
False
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from egraph.dims import Size
from egraph.signs import NEG, POS, ZERO, describe
from egraph.term import Var, literal

Guard = Callable[[Any, Any], bool]
Variable = Var | str
"""A pattern variable, or its name."""


def _name(var: Variable) -> str:
    return var.name if isinstance(var, Var) else var.lstrip("?")


def _meta(egraph, cid: int):
    return egraph.data(cid)


def named(name: str) -> Callable[[Callable], Callable]:
    """Give a guard (or a rule's right side) the name reports and refusals print, where
    it is defined.

    >>> @named("x is wide")
    ... def wide(egraph, subst):
    ...     return True
    >>> wide.__name__
    'x is wide'
    """
    def name_it(fn: Callable) -> Callable:
        fn.__name__ = name
        return fn
    return name_it


def shape_of(egraph, cid: int) -> tuple | None:
    """The shape the analysis proved of a class, or None (not a tensor, not known)."""
    return getattr(egraph.data(cid), "shape", None)


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


def reshape_gives(target: Any, shape: tuple | None) -> bool:
    """Whether reshaping a tensor of ``shape``'s elements to the literal ``target`` gives
    ``shape``: the same sizes, one of which may be written -1 (torch infers it from the
    others), as symbolic programs write the size that is the rest.

    >>> reshape_gives((-1, 4, 8), (6, 4, 8)), reshape_gives((6, 4, 8), (6, 4, 8))
    (True, True)
    >>> reshape_gives((-1, -1, 8), (6, 4, 8)), reshape_gives((-1, 8), (6, 4, 8))
    (False, False)
    """
    if not isinstance(target, tuple) or shape is None or len(target) != len(shape):
        return False
    inferred = [i for i, t in enumerate(target) if type(t) is int and t == -1]
    return len(inferred) <= 1 and all(
        t == n for i, (t, n) in enumerate(zip(target, shape)) if i not in inferred)


def reordered_shape(egraph, cid: int, order: tuple[int, ...]) -> int | None:
    """A class for the shape ``cid`` with its items taken in ``order``: a literal for a
    literal shape, a ``tuple`` of the same item classes for a shape of symbolic sizes (a
    literal would fix their example's values), or None where ``cid`` is neither.

    >>> from egraph import EGraph
    >>> from egraph.term import literal
    >>> eg = EGraph()
    >>> b, t, d = (eg.add_node(literal(n)) for n in (2, 3, 4))
    >>> swapped = reordered_shape(eg, eg.add_node("tuple", [b, t, d]), (0, 2, 1))
    >>> eg.find(swapped) == eg.find(eg.add_node("tuple", [b, d, t]))
    True
    """
    for node in egraph.nodes(cid):
        if node.op == "tuple" and all(i < len(node.children) for i in order):
            return egraph.add_node("tuple", [node.children[i] for i in order])
    value = value_of(egraph, cid)
    if not isinstance(value, tuple) or any(isinstance(v, Size) for v in value):
        return None
    return egraph.add_node(literal(tuple(value[i] for i in order)))


def dim_of(egraph, cid: int, rank: int) -> int | None:
    """A dim literal of a rank-``rank`` tensor as a non-negative int (a one-element tuple
    counts), or None: not a literal dim of that rank (cat's dim is kept as written).

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> dim_of(eg, eg.add("-1"), 2) is None  # no tensor analysis: nothing is known
    True
    """
    value = value_of(egraph, cid)
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if type(value) is not int or not -rank <= value < rank:
        return None
    return value % rank


def literal_is(var: Variable, value: Any) -> Guard:
    """The literal ``var`` is ``value``.

    >>> literal_is("g", 1).__name__
    'g == 1'
    """
    @named(f"{_name(var)} == {value!r}")
    def guard(egraph, subst) -> bool:
        return value_of(egraph, subst[_name(var)]) == value
    return guard


def number_of(egraph, cid: int) -> int | float | None:
    """The value of a class that is one number at every size: a literal or folded int or
    float, or None (unknown, a bool, or a symbolic size: Python's float arithmetic on a
    :class:`~egraph.dims.Size` reads the example's value, so a rule that computes a new
    number from one would bake that size into the program).

    >>> from egraph import EGraph, parse
    >>> eg = EGraph()
    >>> number_of(eg, eg.add(parse("2"))) is None  # no tensor analysis: nothing is known
    True
    """
    v = value_of(egraph, cid)
    if isinstance(v, (bool, Size)) or not isinstance(v, (int, float)):
        return None
    return v


def sign_of(egraph, cid: int) -> int:
    """The proven sign set of a class (any sign when nothing is proven)."""
    return getattr(_meta(egraph, cid), "sign", NEG | ZERO | POS)


def is_none(egraph, cid: int) -> bool:
    """True when the class is the literal None (an absent optional argument)."""
    meta = _meta(egraph, cid)
    return getattr(meta, "kind", None) == "literal" and meta.value is None


def not_none(var: Variable) -> Guard:
    """``?var`` is present (not the literal None)."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        return not is_none(egraph, subst[var])
    return _named(guard, f"{var} is given")


def literal_near(var: Variable, target: float, rel: float = 1e-6) -> Guard:
    """``?var`` is a literal within ``rel`` of ``target`` (constants users type rounded)."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        v = number_of(egraph, subst[var])
        return v is not None and abs(v - target) <= rel * abs(target)
    return _named(guard, f"{var} ~= {target:.6g}", **{var: ("value", target)})


_SIGN_FACTS = {POS: "positive", POS | ZERO: "nonneg", POS | NEG: "nonzero", NEG: "negative"}


def has_sign(var: Variable, allowed: int) -> Guard:
    """The proven signs of ``?var`` are within ``allowed``."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        s = sign_of(egraph, subst[var])
        return s != 0 and s & ~allowed == 0
    return _named(guard, f"{var} {describe(allowed)}", **{var: _SIGN_FACTS.get(allowed)})


def positive(var: Variable) -> Guard:
    """``?var`` is proven > 0."""
    return has_sign(var, POS)


def nonneg(var: Variable) -> Guard:
    """``?var`` is proven >= 0."""
    return has_sign(var, POS | ZERO)


def nonzero(var: Variable) -> Guard:
    """``?var`` is proven != 0."""
    return has_sign(var, POS | NEG)


def finite(var: Variable) -> Guard:
    """``?var`` is proven finite: no inf or NaN, whatever the inputs hold (an integer
    tensor, a number, tanh of one, an input declared in a domain). A rule whose right
    side drops an operand needs it: ``x - x`` is NaN where x is inf, never 0.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> finite("x")(eg, {"x": eg.add("x")})  # nothing is proven without the tensor analysis
    False
    """
    var = _name(var)

    def guard(egraph, subst) -> bool:
        return bool(getattr(_meta(egraph, subst[var]), "finite", False))
    return _named(guard, f"{var} is finite")  # (sympy's real symbols are finite)


def floating(var: Variable) -> Guard:
    """``?var`` is a floating-point tensor (so a float literal does not change its dtype)."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        meta = _meta(egraph, subst[var])
        dtype = getattr(meta, "dtype", None)
        return getattr(meta, "kind", None) == "tensor" and dtype is not None and getattr(
            dtype, "is_floating_point", False)
    return _named(guard, f"{var} is floating")


def _tensor_of(var: Variable, dtype: str, label: str) -> Guard:
    """``?var`` is a tensor of ``dtype`` (its name, ``torch.bool``), named ``var label``."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        meta = _meta(egraph, subst[var])
        return getattr(meta, "kind", None) == "tensor" and str(
            getattr(meta, "dtype", "")) == dtype
    return _named(guard, f"{var} {label}")


def single_precision(var: Variable) -> Guard:
    """``?var`` is a float32 tensor.

    >>> single_precision("x").__name__
    'x is float32'
    """
    return _tensor_of(var, "torch.float32", "is float32")


def tensor(var: Variable) -> Guard:
    """``?var`` is a tensor (not a literal number).

    >>> tensor("b").__name__
    'b is a tensor'
    """
    var = _name(var)

    def guard(egraph, subst) -> bool:
        return getattr(_meta(egraph, subst[var]), "kind", None) == "tensor"
    return _named(guard, f"{var} is a tensor")


def boolean(var: Variable) -> Guard:
    """``?var`` is a bool tensor (a mask).

    >>> boolean("m").__name__
    'm is a bool tensor'
    """
    return _tensor_of(var, "torch.bool", "is a bool tensor")


def scalar(var: Variable) -> Guard:
    """``?var`` is a literal number (or one folded from literals), not a bool.

    >>> from egraph import EGraph, parse
    >>> eg = EGraph()
    >>> scalar("s")(eg, {"s": eg.add(parse("2"))})  # no tensor analysis: nothing is known
    False
    """
    var = _name(var)

    def guard(egraph, subst) -> bool:
        v = value_of(egraph, subst[var])
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return _named(guard, f"{var} is a scalar literal")


def single_dim(var: Variable) -> Guard:
    """``?var`` is a dims literal naming exactly one dim."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        v = value_of(egraph, subst[var])
        return isinstance(v, tuple) and len(v) == 1
    return _named(guard, f"{var} is one dim")


def same_shape(a: Variable, b: Variable) -> Guard:
    """``?a`` and ``?b`` are tensors of the same known shape."""
    a, b = _name(a), _name(b)

    def guard(egraph, subst) -> bool:
        ma, mb = _meta(egraph, subst[a]), _meta(egraph, subst[b])
        sa, sb = getattr(ma, "shape", None), getattr(mb, "shape", None)
        return sa is not None and sa == sb
    return _named(guard, f"shape {a} == shape {b}")


def same_dtype(*names: Variable) -> Guard:
    """The tensors among ``?names`` share one dtype (numbers adopt it): type promotion is
    not associative across dtypes (a 0-dim float32 tensor does not promote a float16 one,
    a full float32 tensor does), so regrouping mixed dtypes could change the result's."""
    names = tuple(map(_name, names))

    def guard(egraph, subst) -> bool:
        # a loop, not a set of dtypes: the assoc rules ask this of every match
        first = None
        for n in names:
            meta = _meta(egraph, subst[n])
            if getattr(meta, "kind", None) != "tensor":
                continue
            dtype = getattr(meta, "dtype", None)
            if dtype is None:
                continue
            if first is None:
                first = dtype
            elif dtype != first:
                return False
        return True
    return _named(guard, f"one dtype among {', '.join(names)}")


def rank_is(var: Variable, *ranks: int) -> Guard:
    """``?var`` is a tensor of one of the given ranks."""
    var = _name(var)

    def guard(egraph, subst) -> bool:
        shape = getattr(_meta(egraph, subst[var]), "shape", None)
        return shape is not None and len(shape) in ranks
    return _named(guard, f"rank {var} in {ranks}")


_LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
            "float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}
"""The largest finite value of each floating dtype, by name."""

_SMALLEST = {"float16": 6.103515625e-05, "bfloat16": 1.1754943508222875e-38,
             "float32": 1.1754943508222875e-38, "float64": 2.2250738585072014e-308}
"""The smallest normal value of each floating dtype, by name: below it digits are lost."""


def product_in_range(x: Variable, y: Variable | tuple[Variable, ...], *tensors: Variable
                     ) -> Guard:
    """Where the magnitudes of ``?x`` and ``?y`` are known (a number's; a tensor's from
    its proven or observed range), their product is finite in the dtype of the tensors
    among ``?tensors``, and not all below its normal range. A regrouping that folds
    ``1e12 * 1e27`` into one constant multiplies by ``inf`` in float32, where the source's
    chain overflowed only for large inputs; in float16, ``(d * rsqrt(v + 1e-12)) * 1e6``
    regrouped as ``d * (rsqrt(v + 1e-12) * 1e6)`` overflows where the source's small
    ``d`` kept it finite, and ``(x * 1e8) * x`` regrouped as ``(x * x) * 1e8`` with ``x``
    near 1e-3 rounds ``x * x`` to a subnormal of a few bits, where the source's product
    was normal. An unknown magnitude leaves the regrouping allowed. ``?y`` may be a
    tuple of variables: the product with their sum (``factor``'s ``a * (b + c)``, whose
    sum may be larger than either term).

    >>> from egraph import EGraph
    >>> guard = product_in_range("x", "y", "t")
    >>> eg = EGraph()
    >>> guard(eg, {"x": eg.add("2"), "y": eg.add("3"), "t": eg.add("t")})  # nothing known
    True
    """
    x, summed = _name(x), tuple(map(_name, y if isinstance(y, tuple) else (y,)))
    names = tuple(map(_name, tensors))

    def guard(egraph, subst) -> bool:
        a = _magnitude(egraph, subst[x])
        terms = [_magnitude(egraph, subst[t]) for t in summed]
        if a is None or None in terms:
            return True
        b = sum(terms)
        for n in names:
            meta = _meta(egraph, subst[n])
            if getattr(meta, "kind", None) == "tensor":
                dtype = str(getattr(meta, "dtype", "")).removeprefix("torch.")
                largest, smallest = _LARGEST.get(dtype), _SMALLEST.get(dtype)
                return largest is None or (a * b <= largest and (
                    a * b == 0 or a * b >= smallest))
        return True
    return _named(guard, f"{x} * ({' + '.join(summed)}) is finite and normal in the dtype "
                  f"of {', '.join(names)}")


def _magnitude(egraph, cid: int) -> float | None:
    """The largest absolute value of a class: a number's own, a tensor's or scalar's
    from the finite bounds of its range, None where unknown."""
    v = value_of(egraph, cid)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return abs(float(v))
    meta = _meta(egraph, cid)
    lo, hi = getattr(meta, "lo", None), getattr(meta, "hi", None)
    if getattr(meta, "kind", None) not in ("tensor", "scalar") or lo is None or hi is None:
        return None
    bound = max(abs(lo), abs(hi))
    return bound if math.isfinite(bound) else None


def chain_length(egraph, cid: int, op: str, limit: int) -> int:
    """The most operands class ``cid`` is spelled with as a chain of ``op`` (cycles
    aside), counted up to ``limit`` (``limit + 1``: more). An e-node of another op is
    one operand, so ``linear(x, w, b)``, also spelled ``x @ w.T + b``, is two operands
    of ``+``. Guards read it to keep reassociation to short chains: all the groupings
    of an n-operand sum are 2^n - 1 classes. Safe inside guards: it never rebuilds.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> chain_length(eg, eg.add("(+ (+ x y) (+ z w))"), "+", 10)
    4
    >>> chain_length(eg, eg.add("(+ (+ x y) (+ z w))"), "+", 2)
    3
    """
    find = egraph.union_find.find
    cnodes = egraph.class_nodes
    active: set[int] = set()
    over = limit + 1

    def length(c: int, budget: int) -> int | None:
        """The length of class ``c``, ``over`` once it exceeds ``budget``, None where
        ``c`` is being measured already (an e-node through it is a cycle: ``x * 1`` in
        the class of ``x`` spells nothing longer)."""
        if c in active:
            return None
        active.add(c)
        best = 1
        for node in cnodes[c]:
            if node[0] != op:
                continue
            total, rest = 0, len(node) - 1
            for child in node[1:]:
                rest -= 1
                size = length(find(child), budget - total - rest)
                if size is None:
                    break
                total += size
                if total + rest > budget:
                    active.discard(c)
                    return over
            else:
                best = max(best, total)
        active.discard(c)
        return best

    return length(find(cid), limit)


def short_chain(op: str, limit: int, *names: Variable) -> Guard:
    """``?names`` joined by ``op`` make a chain of at most ``limit`` operands
    (:func:`chain_length`): a reassociation that creates their group keeps
    to short chains, so a long sum (a residual stream of n blocks) gets O(n) new classes,
    not the 2^n - 1 of all its groupings.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> guard = short_chain("+", 3, "a", "b")
    >>> guard(eg, {"a": eg.add("(+ x y)"), "b": eg.add("z")})
    True
    >>> guard(eg, {"a": eg.add("(+ x y)"), "b": eg.add("(+ z w)")})
    False
    """
    names = tuple(map(_name, names))

    def guard(egraph, subst) -> bool:
        budget = limit - len(names)  # every operand counts at least once
        for n in names:
            extra = chain_length(egraph, subst[n], op, budget + 1) - 1
            budget -= extra
            if budget < 0:
                return False
        return True
    return _named(guard, f"{f' {op} '.join(names)} has at most {limit} operands")


def distinct(a: Variable, b: Variable) -> Guard:
    """``?a`` and ``?b`` are different classes."""
    a, b = _name(a), _name(b)

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
    named = _named(guard, " and ".join(g.__name__ for g in guards), **facts)
    named.parts = guards  # egraph.diagnose names the part that refused
    return named


ONE_DTYPE = same_dtype("a", "b", "c")
"""The guard rule families share: ``?a``, ``?b`` and ``?c`` have one dtype."""
