"""Where a formula is defined: a candidate must be an identity wherever the formula it
replaces is defined (:func:`narrows_domain`).

sympy's identities hold for positive values (``logcombine``/``expand_log`` with
``force=True``) or on the principal branch (a series writes ``x**(1/n)`` as
``exp(log(x)/n)``), so a candidate can be NaN where the source is a number: at a negative
base with an integer power (Herbie's 2nthrt, sampled over all floats, has ``1/n`` an
integer at every tiny ``n``). The samples may hold few such points or none, so the candidate
is also tried on adversarial points (:func:`probe_points`): signs flipped, and small
integers and their reciprocals."""

from __future__ import annotations

import sympy as sp
import torch

from compiler.herbie.emit import evaluate

__all__ = ["narrows_domain", "probe_points", "undefined_at"]

_SPECIAL = (-3.0, -2.0, -1.0, -0.5, -1 / 3, 1 / 3, 0.5, 1.0, 2.0, 3.0)
"""Values each variable takes at the adversarial points: ``1/n`` an integer, bases
either side of 0 and of 1 (the edges of asin's, acosh's and atanh's domains)."""


def probe_points(env: dict) -> dict:
    """``env``'s points in float64, then with each variable's sign flipped, with all
    flipped, and with each variable set to each of a few small integers and reciprocals
    (the others as sampled, and flipped); of those, the ones inside the box the samples
    span (a variable sampled positive only, as its declared range says, stays positive).

    >>> x, y = sp.symbols("x y", real=True)
    >>> probes = probe_points({x: torch.tensor([-2.0, 4.0]), y: torch.tensor([0.25, 5.0])})
    >>> len(probes[x]), bool((probes[x] < 0).any()), bool((probes[y] < 0).any())
    (36, True, False)
    >>> sorted(set(probes[y].tolist()))
    [0.25, 0.3333333333333333, 0.5, 1.0, 2.0, 3.0, 5.0]
    """
    symbols = list(env)
    base = {s: torch.as_tensor(env[s]).double().reshape(-1) for s in symbols}
    variants = [base, {s: -v for s, v in base.items()}]
    variants += [{**base, s: -base[s]} for s in symbols if len(symbols) > 1]
    for s in symbols:
        for signs in variants[:2]:
            variants += [{**signs, s: torch.full_like(base[s], c)} for c in _SPECIAL]
    probes = {s: torch.cat([v[s] for v in variants]) for s in symbols}
    inside = torch.ones_like(probes[symbols[0]], dtype=torch.bool)
    for s in symbols:
        sampled = base[s][~base[s].isnan()]
        if sampled.numel():
            inside &= (probes[s] >= sampled.min()) & (probes[s] <= sampled.max())
    return {s: v[inside] for s, v in probes.items()}


def undefined_at(expr: sp.Expr, env: dict, memo: dict | None = None) -> torch.Tensor:
    """Where ``expr`` leaves the domain of one of its functions (the log of a negative
    number, a negative base to a power that is not an integer, asin past 1, ...): a bool
    tensor over ``env``'s points. Overflow is not counted (an argument that is NaN
    compares false), nor a Piecewise's NaN branch, which stands for "not here".

    >>> x, n = sp.symbols("x n", real=True)
    >>> env = {x: torch.tensor([-8.0, -8.0, 8.0]), n: torch.tensor([1 / 3, 2.0, 2.0])}
    >>> undefined_at(x ** (1 / n), env).tolist(), undefined_at(sp.exp(sp.log(x) / n), env).tolist()
    ([False, True, False], [True, True, False])
    """
    memo = {} if memo is None else memo
    ref = next(iter(env.values()))
    out = torch.zeros(ref.shape, dtype=torch.bool)

    def value(e):
        return torch.broadcast_to(torch.as_tensor(evaluate(e, env, memo), dtype=ref.dtype),
                                  ref.shape)

    if isinstance(expr, sp.Piecewise):
        remaining = torch.ones_like(out)
        for piece, condition in expr.args:
            holds = remaining if condition is sp.true else remaining & value(
                sp.Piecewise((1, condition), (0, True))).bool()
            if piece is not sp.nan:
                out |= holds & undefined_at(piece, env, memo)
            remaining &= ~holds
        return out
    for a in expr.args:
        if isinstance(a, sp.Expr) and a.free_symbols:
            out |= undefined_at(a, env, memo)
    if isinstance(expr, sp.Pow) and expr.base.free_symbols and not expr.exp.is_Integer:
        negative = value(expr.base) < 0
        if expr.exp.free_symbols:
            power = value(expr.exp)
            negative &= power != torch.round(power)
        out |= negative
    elif expr.func == sp.log:
        out |= value(expr.args[0]) < 0
    elif expr.func in (sp.asin, sp.acos, sp.atanh):
        out |= value(expr.args[0]).abs() > 1
    elif expr.func == sp.acosh:
        out |= value(expr.args[0]) < 1
    return out


def narrows_domain(candidate: sp.Expr, source: sp.Expr, env: dict) -> bool:
    """Whether ``candidate`` is undefined (:func:`undefined_at`) at a point of ``env`` or
    of its :func:`probe_points` where ``source`` is defined: then it is no identity of
    ``source`` there.

    >>> x, y = sp.symbols("x y", real=True)
    >>> env = {x: torch.tensor([-2.0, 3.0]), y: torch.tensor([-5.0, 7.0])}
    >>> narrows_domain(sp.log(x) - sp.log(y), sp.log(x / y), env)
    True
    >>> narrows_domain(sp.log(x / y), sp.log(x) - sp.log(y), env)
    False
    """
    probes = probe_points(env)
    try:
        return bool((undefined_at(candidate, probes) & ~undefined_at(source, probes)).any())
    except (TypeError, ValueError, RuntimeError, ArithmeticError):
        return True  # a candidate that cannot run on the probes is not kept either
