"""Candidates for a formula: rewrites where the error was localised and at the whole
(:data:`REWRITES`, :func:`candidates`, with the series of :mod:`compiler.series`), and the
rule library's forms of the formula cut out of the graph (:func:`rule_candidates`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import sympy as sp
import torch
import torch.fx as fx
from sympy.simplify.fu import TR2, TR9, TR2i

from compiler.herbie.domain import narrows_domain
from compiler.herbie.emit import evaluate
from compiler.herbie.localise import Formula, sympy_number, to_sympy
from compiler.herbie.measure import error_in_bits
from compiler.herbie.scaling import scaled, scaled_products
from compiler.series import SeriesTimeout, series_candidates, time_limit

__all__ = ["REWRITES", "candidates", "formula_of", "rule_candidates"]

def _flip(e: sp.Expr) -> list[sp.Expr]:
    """``a - b = (a^2 - b^2) / (a + b) = (a^3 - b^3) / (a^2 + ab + b^2)``."""
    if not isinstance(e, sp.Add):
        return []
    neg = [t for t in e.args if t.could_extract_minus_sign()]
    pos = [t for t in e.args if not t.could_extract_minus_sign()]
    if not pos or not neg:
        return []
    a, b = sp.Add(*pos), -sp.Add(*neg)
    out = []
    for num, den in ((a ** 2 - b ** 2, a + b), (a ** 3 - b ** 3, a ** 2 + a * b + b ** 2)):
        out += [num / den, sp.expand(num) / den]
    return out


def _fractions(e: sp.Expr) -> list[sp.Expr]:
    """One fraction with its numerator expanded (the cancellation done exactly), and
    sympy's cancel and factor."""
    n, d = sp.fraction(sp.together(e))
    return [sp.expand(n) / d, sp.factor(sp.expand(n)) / d, sp.cancel(e)]


def _half_angle(e: sp.Expr) -> list[sp.Expr]:
    """``cos u = 1 - 2 sin^2(u/2)``, ``sin u = 2 sin(u/2) cos(u/2)``, then fractions."""
    if not e.has(sp.cos, sp.sin):
        return []
    halved = e.replace(sp.cos, lambda u: 1 - 2 * sp.sin(u / 2) ** 2)
    both = halved.replace(sp.sin, lambda u: 2 * sp.sin(u / 2) * sp.cos(u / 2)) if e.has(
        sp.sin) else halved
    return [halved, sp.cancel(sp.together(halved)), sp.cancel(sp.together(both))]


def _trig(e: sp.Expr) -> list[sp.Expr]:
    """Sum to product, tangent as sine over cosine and back, the addition formulas."""
    if not e.has(sp.sin, sp.cos, sp.tan):
        return []
    expanded = sp.expand_trig(e)
    return [TR9(e), TR2(e), TR2i(e), expanded, sp.together(expanded),
            TR9(sp.together(TR2(e)))]


def _logs(e: sp.Expr) -> list[sp.Expr]:
    """``log a - log b = log(a/b)``, ``log(a/b) = log a - log b``, and ``log u`` as
    ``log1p(u - 1)`` with ``u - 1`` in one fraction."""
    if not e.has(sp.log):
        return []
    combined = sp.logcombine(e, force=True)
    out = [combined, sp.expand_log(e, force=True)]
    for f in (e, combined):
        out.append(f.replace(sp.log, lambda u: sp.log(1 + sp.cancel(sp.together(u - 1)))))
    return out


def _exps(e: sp.Expr) -> list[sp.Expr]:
    """``exp(k u) = exp(u)^k`` then cancel; numerator and denominator divided by
    ``exp(u)``."""
    if not e.has(sp.exp):
        return []
    t = sp.Dummy("t")
    out = []
    for u in sorted({a.args[0] for a in e.atoms(sp.exp)}, key=sp.default_sort_key):
        k, rest = u.as_coeff_Mul()
        if k.is_Integer and abs(k) > 1:
            powers = e.replace(
                lambda a, rest=rest: a.func == sp.exp and (a.args[0] / rest).is_Integer,
                lambda a, rest=rest: t ** (a.args[0] / rest))
            out.append(sp.cancel(powers).subs(t, sp.exp(rest)))
        n, d = sp.fraction(sp.together(e))
        if d != 1:
            out.append(sp.expand(n * sp.exp(-u)) / sp.expand(d * sp.exp(-u)))
    return out


def _factor_lists(e: sp.Mul) -> tuple[sp.Expr, list[sp.Expr], list[sp.Expr]]:
    """A product's coefficient, and its factors over and under the line, a small integer
    power as that many factors: ``2*x*y**2/z`` is ``(2, [x, y, y], [z])``."""
    coeff, factors = e.as_coeff_mul()
    over: list[sp.Expr] = []
    under: list[sp.Expr] = []
    for f in factors:
        if isinstance(f, sp.Pow) and f.exp.is_Integer and 0 < abs(f.exp) <= 4:
            (over if f.exp > 0 else under).extend([f.base] * abs(int(f.exp)))
        else:
            over.append(f)
    return coeff, over, under


def _grouped(coeff: sp.Expr, group: sp.Expr, over: list[sp.Expr], under: list[sp.Expr],
             ) -> sp.Expr:
    """``coeff * group * prod(over) / prod(under)``, ``group`` computed first."""
    return sp.Mul(coeff, sp.UnevaluatedExpr(group), *over, *(1 / u for u in under))


def _without(items: list[sp.Expr], *taken: sp.Expr) -> list[sp.Expr]:
    rest = list(items)
    for t in taken:
        rest.remove(t)
    return rest


def _reassociate(e: sp.Expr, most: int = 16) -> list[sp.Expr]:
    """A product and quotient in other orders, so that no step overflows or underflows
    where the result does not (over the whole range of a float, ``y*y`` overflows where
    ``x/(y*y)`` does not): ``x/(y*y)`` as ``(x/y)/y``, ``2*x*y/(x - y)`` as
    ``(2*x/(x - y))*y`` and ``2*x/((x - y)/y)``, and every factor over the line against
    every factor under it, then one alternating chain. sympy keeps a product flat, so each
    grouping is held in an ``UnevaluatedExpr``, which :func:`evaluate` computes as written.

    >>> x, y = sp.symbols("x y", real=True)
    >>> [str(c) for c in _reassociate(x / y ** 2)]
    ['(x/y)/y']
    """
    if not isinstance(e, sp.Mul):
        return []
    coeff, over, under = _factor_lists(e)
    if len(over) + len(under) < 3:
        return []
    out: list[sp.Expr] = []
    for a in dict.fromkeys(over):
        for d in dict.fromkeys(under):
            out.append(_grouped(coeff, a / d, _without(over, a), _without(under, d)))
            if len(over) > 1:  # the rest over (d / a)
                out.append(_grouped(coeff, 1 / sp.UnevaluatedExpr(d / a), _without(over, a),
                                    _without(under, d)))
    if len(over) > 2 or (len(over) == 2 and under):
        for i, a in enumerate(over):
            for b in over[i + 1:]:
                out.append(_grouped(coeff, a * b, _without(over, a, b), under))
    if over and under:
        chain: sp.Expr = over[0]
        rest_over, rest_under = over[1:], list(under)
        while rest_over or rest_under:
            if rest_under:
                chain = sp.UnevaluatedExpr(chain / rest_under.pop(0))
            if rest_over:
                chain = sp.UnevaluatedExpr(chain * rest_over.pop(0))
        out.append(coeff * chain)
    return list({str(c): c for c in out}.values())[:most]


def _simplify(e: sp.Expr) -> list[sp.Expr]:
    return [sp.simplify(e)]


REWRITES: dict[str, Callable[[sp.Expr], list[sp.Expr]]] = {
    "flip": _flip, "fractions": _fractions, "half-angle": _half_angle, "trig": _trig,
    "logs": _logs, "exps": _exps, "simplify": _simplify, "reassociate": _reassociate,
}
"""The rewrite strategies applied where the error is: each maps a sympy expression to
equal expressions (identities wherever both sides are defined)."""


def candidates(expr: sp.Expr, symbols: list[sp.Symbol], hot: list[sp.Expr], env: dict,
               exact: torch.Tensor, dtype: torch.dtype, deadline: float,
               rounds: int = 2, keep: int = 3, domain: dict | None = None,
               series: bool = True) -> list[tuple[str, sp.Expr]]:
    """``(label, expression)`` candidates for ``expr``: every :data:`REWRITES` strategy at
    each localised subexpression ``hot``, at each sum and at the whole (then again, on the
    sums inside the ``keep`` most accurate candidates so far, ``rounds`` times in all;
    each product inside them reassociated in place), the formula and those candidates on
    inputs scaled by powers of two where they, or their products, are homogeneous
    (:mod:`compiler.herbie.scaling`), and the series expansions (unless ``series`` is
    False: identities alone). A candidate
    undefined where ``expr`` is defined, at the points of
    ``domain`` (default ``env``) and around them
    (:func:`~compiler.herbie.domain.narrows_domain`), is left out: no identity of it.

    >>> import torch
    >>> x = sp.Symbol("x", real=True)
    >>> e = 1 / (x + 1) - 1 / x
    >>> xs = 10 ** torch.linspace(1, 30, 50)
    >>> env, exact = {x: xs}, -1 / (xs.double() * (xs.double() + 1))
    >>> found = candidates(e, [x], [e], env, exact, torch.float32, time.perf_counter() + 30)
    >>> any(str(c) == "-1/(x*(x + 1))" for _, c in found)
    True
    """
    seen = {expr}
    found: list[tuple[str, sp.Expr]] = []

    def add(label: str, c: sp.Expr) -> None:
        if c in seen or not isinstance(c, sp.Expr) or _undefined(c):
            return
        seen.add(c)
        if narrows_domain(c, expr, env if domain is None else domain):
            return
        found.append((label, c))

    # the sums of the formula are places too: the error of a quadratic root is localised
    # at its sqrt, and the rewrite that removes it flips the sum around the sqrt
    sites = [(expr, [*hot, *(a for a in sp.preorder_traversal(expr) if isinstance(a, sp.Add))])]
    for _ in range(rounds):
        for base, places in sites:
            for place in dict.fromkeys([*places, base]):
                for name, rewrite in REWRITES.items():
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return found
                    try:
                        with time_limit(min(left, 2.0)):
                            results = rewrite(place)
                    except (SeriesTimeout, Exception):  # noqa: BLE001 - sympy gave up
                        continue
                    for r in results:
                        add(name, base.xreplace({place: r}) if place != base else r)
            # a product inside a sum overflows alone: (y - x)*(z - t)/(a - t) in linMap's
            # x + (y - x)*(z - t)/(a - t) is reassociated where it is
            for place in dict.fromkeys(a for a in sp.preorder_traversal(base)
                                       if isinstance(a, sp.Mul) and a != base):
                for r in _reassociate(place, most=4):
                    add("reassociate", base.xreplace({place: r}))
        scored = []
        for label, c in found:
            try:
                bits = error_in_bits(evaluate(c, env), exact, dtype)
                scored.append((float(bits.mean()), label, c))
            except (TypeError, ValueError, RuntimeError, ArithmeticError):
                continue
        scored.sort(key=lambda s: s[0])
        sites = [(c, [a for a in sp.preorder_traversal(c) if isinstance(a, sp.Add)])
                 for _, _, c in scored[:keep]]
    # the formula and the best candidates, each on its inputs scaled near 1 by powers of
    # two where it is homogeneous: what overflows in a step but not in the result no longer
    # does (compiler.herbie.scaling)
    for base, _ in [(expr, None), *sites]:
        for scale in (scaled, scaled_products):
            if time.perf_counter() > deadline:
                return found
            s = scale(base, symbols, dtype)
            if s is not None:
                add("scaling", s)
    if series:
        left = deadline - time.perf_counter()
        for label, c in series_candidates(expr, symbols, seconds=min(max(left, 0.0), 6.0)):
            add(label, c)
    return found


def _undefined(e: sp.Expr) -> bool:
    """Whether ``e`` holds an infinity, a complex unit or a NaN other than the NaN branch
    of a one-sided series (``Piecewise((1/x, x > 0), (nan, True))``, see
    :func:`compiler.series.series_candidates`), which stands for "not here"."""
    if isinstance(e, sp.Piecewise):
        return any(value is not sp.nan and _undefined(value) for value, _ in e.args)
    if e in (sp.zoo, sp.nan, sp.I, sp.oo, -sp.oo):
        return True
    return any(_undefined(a) for a in e.args)


def rule_candidates(gm: fx.GraphModule, unit: Formula, samples: list[torch.Tensor],
                    deadline: float, families: tuple[str, ...] = ("herbie", "stability"),
                    iter_limit: int = 2, node_limit: int = 2_000,
                    domain: dict | None = None) -> list[tuple[str, sp.Expr]]:
    """Candidates from the rule library, localised: the formula alone (its leaves as
    inputs, the sample points as example inputs) in an FX e-graph, saturated with
    ``families`` (Herbie's database, :mod:`egraph.rules.herbie`, and the stable forms) within
    small limits; then, for the formula's value and for each localised op, every e-node of
    its class with the rest of the program the smallest (AstSize) one, each as a sympy
    expression ``("rule <applied rules>", expr)``, less those undefined where the formula
    is defined (on ``domain``, default the ``samples``, as in :func:`candidates`).

    >>> from compiler.herbie.localise import formulas
    >>> gm = fx.symbolic_trace(lambda x: torch.log(x + 1))
    >>> formula, = formulas(gm, {"add", "log"}, {"log"})
    >>> found = rule_candidates(gm, formula, [torch.rand(8)], time.perf_counter() + 30)
    >>> any("log1p" in str(expr) or "log(x + 1)" == str(expr) for _, expr in found)
    True
    """
    from backends.fx import build_module
    from egraph.egraph import EGraph
    from egraph.extract import AstSize, best_nodes
    from egraph.extract.program import is_acyclic
    from egraph.rules import load_rules

    left = deadline - time.perf_counter()
    if left <= 0:
        return []
    inside = set(unit.nodes)
    closed = inside | set(unit.leaves)
    if any(a not in closed for n in unit.nodes for a in n.all_input_nodes):
        # The formula's nodes read a value its expression does not name (the condition of
        # a where): the formula cannot be cut out of the graph alone.
        return []
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for leaf, symbol in zip(unit.leaves, unit.symbols):
        env[leaf] = graph.placeholder(symbol.name)
    for n in gm.graph.nodes:
        if n in inside:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[unit.root])
    eg = EGraph.from_fx(fx.GraphModule(gm, graph), tuple(samples))
    eg.saturate(load_rules(*families), iter_limit=iter_limit, node_limit=node_limit,
                time_limit=min(left, 5.0))
    applied = ", ".join(sorted(name for name, r in eg.report.rules.items() if r.applied))
    base = {c: v[1] for c, v in best_nodes(eg, AstSize()).items()}
    hot = {env[n].name for n in inside if any(n.name == h for h in _hot_names(unit))}
    targets = [eg.find(eg.roots[0])] + [eg.find(c) for c, name in eg.fx.origins.items()
                                        if name in hot]
    points = dict(zip(unit.symbols, samples)) if domain is None else domain
    out: list[tuple[str, sp.Expr]] = []
    for c in dict.fromkeys(targets):
        for node in eg.nodes(c):
            if time.perf_counter() > deadline:
                return out
            choice = {**base, c: (node.op, *node.children)}
            if not is_acyclic(eg, choice, [eg.roots[0]]):
                continue
            try:
                expr = formula_of(build_module(eg, choice))
            except (ValueError, TypeError, RuntimeError, KeyError, RecursionError):
                continue  # a choice that cycles back into its class, or leaves sympy's reach
            if expr is not None and not narrows_domain(expr, unit.expr, points):
                out.append((f"rules ({applied})", expr))
    return out


def _hot_names(unit: Formula) -> set[str]:
    return {n.name for n in unit.nodes if unit.node_exprs.get(n) in unit.hot}


def formula_of(gm: fx.GraphModule) -> sp.Expr | None:
    """The output of an elementwise GraphModule as a sympy expression over its
    placeholders, or None when an op is not elementwise algebra sympy can express.

    >>> formula_of(fx.symbolic_trace(lambda x: torch.exp(x) - 1))
    exp(x) - 1
    """
    values: dict[fx.Node, sp.Expr] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            values[n] = sp.Symbol(n.name, real=True)
        elif n.op == "output":
            result = n.args[0]
            return values.get(result) if isinstance(result, fx.Node) else None
        else:
            found = to_sympy(n)
            if found is None:
                return None
            builder, args = found
            parts = [values[a] if isinstance(a, fx.Node) else sympy_number(a) for a in args]
            if any(p is None for p in parts):
                return None
            values[n] = builder(*parts)
    return None
