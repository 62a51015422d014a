"""From sympy back to torch: a candidate formula evaluated with torch on sample points
(:func:`evaluate`), the piecewise program of its regimes run (:func:`run_program`) and
emitted into the graph in place of the formula (:func:`emit_program`). ``exp(u) - 1``
runs as ``expm1(u)``, ``log(1 + u)`` as ``log1p(u)`` and ``sqrt(a^2 + 4 b^2)`` as
``hypot(a, 2 b)``.

>>> import torch
>>> x = sp.Symbol("x", real=True)
>>> evaluate(sp.exp(x) - 1, {x: torch.tensor([1e-10])})
tensor([1.0000e-10])
"""

from __future__ import annotations

import math

import sympy as sp
import torch
import torch.fx as fx

from compiler.herbie.localise import Formula
from compiler.regimes import Regimes, select

__all__ = ["TorchFunction", "emit_program", "evaluate", "finite_or", "program_text",
           "run_program"]


class TorchFunction(sp.Function):
    """A sympy function whose value :func:`evaluate` computes with torch ops: a subclass
    defines ``torch_value(values)``, its arguments' values (tensors, fx proxies or
    numbers) to its own (:mod:`compiler.herbie.scaling`'s exact scalings)."""

    def torch_value(self, values: list):
        raise NotImplementedError


def finite_or(first, fallback):
    """``first`` where it is a finite number, else ``fallback`` (tensors, or fx proxies;
    ``v - v == 0`` holds exactly for the finite ``v``, and FPCore can say it).

    >>> finite_or(torch.tensor([1.0, float("inf")]), torch.tensor([2.0, 3.0]))
    tensor([1., 3.])
    """
    return torch.where(first - first == 0, first, fallback)

_TORCH = {sp.exp: torch.exp, sp.log: torch.log, sp.sin: torch.sin, sp.cos: torch.cos,
          sp.tan: torch.tan, sp.atan: torch.atan, sp.sinh: torch.sinh, sp.cosh: torch.cosh,
          sp.tanh: torch.tanh, sp.asin: torch.asin, sp.acos: torch.acos,
          sp.asinh: torch.asinh, sp.acosh: torch.acosh, sp.atanh: torch.atanh,
          sp.Abs: torch.abs, sp.sign: torch.sign, sp.erf: torch.erf, sp.erfc: torch.erfc}


def evaluate(expr: sp.Expr, env: dict, memo: dict | None = None):
    """``expr`` computed with torch on ``env`` (symbol -> tensor, or fx proxy: then the
    calls are recorded in its graph). ``exp(u) - 1`` runs as ``expm1(u)``, ``log(1 + u)``
    as ``log1p(u)``, the root of a sum of squares as ``hypot`` (no square overflows). See
    the module's example.

    >>> import torch
    >>> x = sp.Symbol("x", real=True)
    >>> evaluate(sp.log(1 + x), {x: torch.tensor([1e-10])})
    tensor([1.0000e-10])
    """
    memo = {} if memo is None else memo
    value = _walk(expr, env, memo)
    if isinstance(value, (int, float)):  # a constant, over the leaves' broadcast shape
        leaves = [torch.as_tensor(v) if isinstance(v, (int, float)) else v
                  for v in env.values()]
        ref = leaves[0] if len(leaves) == 1 else torch.broadcast_tensors(*leaves)[0]
        return torch.full_like(ref, float(value))
    return value


def _walk(e: sp.Expr, env: dict, memo: dict):
    if e in memo:
        return memo[e]
    if e in env:
        return env[e]
    if e.is_Number or e.is_NumberSymbol:
        if not e.is_finite or not e.is_real:
            raise ValueError(f"{e} is not a finite real")
        return float(e)
    if isinstance(e, sp.Add):
        value = _add(e, env, memo)
    elif isinstance(e, sp.Mul):
        value = _mul(e, env, memo)
    elif isinstance(e, sp.Pow):
        value = _pow(e.base, e.exp, env, memo)
    elif isinstance(e, sp.UnevaluatedExpr):  # a grouping kept as written
        value = _walk(e.args[0], env, memo)
    elif e.func == sp.log and isinstance(e.args[0], sp.Add) and 1 in e.args[0].args:
        value = torch.log1p(_walk(e.args[0] - 1, env, memo))
    elif e.func in _TORCH:
        value = _TORCH[e.func](_tensor(_walk(e.args[0], env, memo), env))
    elif isinstance(e, TorchFunction):
        value = e.torch_value([_walk(a, env, memo) for a in e.args])
    elif isinstance(e, sp.Piecewise):
        *pieces, (value, _) = e.args
        value = math.nan if value is sp.nan else _walk(value, env, memo)
        for piece, condition in reversed(pieces):
            value = torch.where(_condition(condition, env, memo),
                                _tensor(_walk(piece, env, memo), env), _tensor(value, env))
    else:
        raise ValueError(f"no torch for {e.func}")
    memo[e] = value
    return value


def _condition(c: sp.Basic, env: dict, memo: dict):
    """A comparison of a Piecewise branch (the side of a series at infinity)."""
    compare = {sp.StrictGreaterThan: lambda a, b: a > b, sp.StrictLessThan: lambda a, b: a < b}
    if type(c) not in compare:
        raise ValueError(f"no torch for the condition {c}")
    return compare[type(c)](_tensor(_walk(c.lhs, env, memo), env), _walk(c.rhs, env, memo))


def _tensor(value, env):
    if isinstance(value, (int, float)):
        return torch.full_like(next(iter(env.values())), float(value))
    return value


def _add(e: sp.Add, env: dict, memo: dict):
    constant, terms = e.as_coeff_add()
    terms = list(terms)
    for i, t in enumerate(terms):  # c*exp(u) - c  ->  c*expm1(u)
        coeff, rest = t.as_coeff_Mul()
        if constant != 0 and rest.func == sp.exp and coeff == -constant:
            fused = torch.expm1(_tensor(_walk(rest.args[0], env, memo), env))
            terms[i] = None
            constant = sp.Integer(0)
            value = fused if coeff == 1 else -fused if coeff == -1 else fused * float(coeff)
            break
    else:
        value = None
    pos = [t for t in terms if t is not None and not t.could_extract_minus_sign()]
    neg = [-t for t in terms if t is not None and t.could_extract_minus_sign()]
    for t in pos:
        v = _walk(t, env, memo)
        value = v if value is None else value + v
    if constant != 0:
        value = float(constant) if value is None else value + float(constant)
    for t in neg:
        v = _walk(t, env, memo)
        value = -v if value is None else value - v
    return value


def _mul(e: sp.Mul, env: dict, memo: dict):
    coeff, factors = e.as_coeff_mul()
    num, den = [], []
    for f in factors:
        if isinstance(f, sp.Pow) and f.exp.is_Number and f.exp < 0:
            den.append(f.base ** -f.exp)
        else:
            num.append(f)
    value = None
    for f in num:
        v = _walk(f, env, memo)
        value = v if value is None else value * v
    if value is None:
        value = float(coeff)
        coeff = sp.Integer(1)
    for f in den:
        value = value / _walk(f, env, memo)
    if coeff == -1:
        return -value
    return value if coeff == 1 else value * float(coeff)


def _pow(base: sp.Expr, exp: sp.Expr, env: dict, memo: dict):
    if exp == 1:
        return _walk(base, env, memo)
    if exp == sp.Rational(1, 2):
        legs = _hypot_legs(base)
        if legs is None:
            return torch.sqrt(_tensor(_walk(base, env, memo), env))
        value = _tensor(_walk(legs[0], env, memo), env)
        for leg in legs[1:]:
            value = torch.hypot(value, _tensor(_walk(leg, env, memo), env))
        return value
    if exp.is_Integer and 1 < exp <= 4:
        b = _walk(base, env, memo)
        value = b
        for _ in range(int(exp) - 1):
            value = value * b
        return value
    if exp.is_Number and exp < 0:
        return 1.0 / _pow(base, -exp, env, memo)
    b = _walk(base, env, memo)
    x = _walk(exp, env, memo)
    if isinstance(b, (int, float)) and isinstance(x, (int, float)):
        value = float(b) ** float(x)
        if isinstance(value, complex):
            raise ValueError(f"{base}**{exp} is not real")
        return value
    return torch.pow(b, x)


def _hypot_legs(e: sp.Expr) -> list[sp.Expr] | None:
    """The legs of a sum of two or more squares, ``c * u^2`` with ``c > 0`` as
    ``sqrt(c) * u`` (``(p - r)**2 + 4*q**2`` has legs ``p - r`` and ``2*q``); None for any
    other expression. The root of the sum is their ``hypot``, which squares none of them.

    >>> p, q, r = sp.symbols("p q r", real=True)
    >>> _hypot_legs(4 * q ** 2 + (p - r) ** 2)
    [p - r, 2*q]
    """
    if not isinstance(e, sp.Add):
        return None
    legs = []
    for term in e.args:
        coeff, rest = term.as_coeff_Mul()
        factors = sp.Mul.make_args(rest)
        if not (coeff.is_positive and all(
                isinstance(f, sp.Pow) and f.exp.is_Integer and f.exp > 0 and f.exp % 2 == 0
                for f in factors)):
            return None
        scale = sp.sqrt(coeff)
        scale = scale if scale.is_Rational else sp.Float(float(scale))
        legs.append(scale * sp.Mul(*(f.base ** (f.exp // 2) for f in factors)))
    return legs


def run_program(regimes: Regimes, exprs: list[sp.Expr], key: sp.Symbol, env: dict):
    """The piecewise program of ``regimes`` (branching on ``key``) over the candidates
    ``exprs``, computed on ``env`` as :func:`evaluate` computes one.

    >>> import torch
    >>> x = sp.Symbol("x", real=True)
    >>> regimes = Regimes(0, [0.0], [0, 1], 0.0)
    >>> run_program(regimes, [-x, x], x, {x: torch.tensor([-2.0, 3.0])})
    tensor([2., 3.])
    """
    memo: dict = {}
    return select(regimes, [lambda e=e: evaluate(e, env, memo) for e in exprs], env[key],
                  torch.where)


def program_text(regimes: Regimes, exprs: list[sp.Expr], key: sp.Symbol) -> str:
    """The chosen program in words (sympy syntax with the fused ``expm1`` and ``log1p``,
    branches on ``key``).

    >>> x = sp.Symbol("x", real=True)
    >>> program_text(Regimes(0, [0.0], [0, 1], 0.0), [-x, sp.exp(x) - 1], x)
    '-x if x < 0; else expm1(x)'
    """
    if not regimes.thresholds:
        return str(_fused(exprs[regimes.candidates[0]]))
    parts = [f"{_fused(exprs[c])} if {key} < {t:.6g}"
             for c, t in zip(regimes.candidates, regimes.thresholds)]
    return "; ".join(parts) + f"; else {_fused(exprs[regimes.candidates[-1]])}"


_EXPM1, _LOG1P = sp.Function("expm1"), sp.Function("log1p")
_HYPOT = sp.Function("hypot")


def _fused(e: sp.Expr) -> sp.Expr:
    """``e`` as :func:`evaluate` runs it: ``c*exp(u) - c`` as ``c*expm1(u)``, ``log(1 + u)``
    as ``log1p(u)``, the root of a sum of squares as ``hypot`` (for display)."""
    if not e.args:
        return e
    args = [_fused(a) for a in e.args]
    if isinstance(e, sp.Pow) and e.exp == sp.Rational(1, 2) and _hypot_legs(e.base):
        return _HYPOT(*(_fused(leg) for leg in _hypot_legs(e.base)))
    if e.func == sp.log and isinstance(e.args[0], sp.Add) and 1 in e.args[0].args:
        return _LOG1P(_fused(e.args[0] - 1))
    if isinstance(e, sp.Add):
        constant, terms = e.as_coeff_add()
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            if constant != 0 and rest.func == sp.exp and coeff == -constant:
                others = [_fused(o) for o in terms if o is not t]
                return sp.Add(coeff * _EXPM1(_fused(rest.args[0])), *others, evaluate=False)
    return e.func(*args)


def emit_program(gm: fx.GraphModule, unit: Formula, regimes: Regimes, exprs: list[sp.Expr],
                 numbers: set[sp.Symbol] = frozenset()) -> None:
    """Replace the unit's value in ``gm`` by the chosen (piecewise) program, guarded: where
    the program is not a finite number and the formula as written is, the formula's value
    is used (a branch chosen on some inputs can overflow on combinations the samples
    missed: ``exp(2*eps*x)`` at ``x = 4e17`` in Hamming's section 6.1, where the formula
    underflows to an exact 0), so the program is never non-finite where its source was
    not. The leaves ``numbers`` hold Python numbers when the program runs (``3 * 0.1``
    folded by Python): the program takes them as 0-d tensors, which torch's functions
    accept and which broadcast and promote as the number would.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) - 1)
    >>> x = sp.Symbol("x", real=True)
    >>> place = [n for n in gm.graph.nodes if n.op == "placeholder"]
    >>> sub = [n for n in gm.graph.nodes if n.op == "call_function"][-1]
    >>> formula = Formula(sub, sp.exp(x) - 1, place, [x], [], [], {})
    >>> emit_program(gm, formula, Regimes(0, [], [0], 0.0), [sp.exp(x) - 1])
    >>> _ = gm.recompile()
    >>> "expm1" in gm.code, gm(torch.tensor([1e-10, 1e4]))
    (True, tensor([1.0000e-10,        inf]))
    """
    small = fx.Graph()
    tracer = fx.proxy.GraphAppendingTracer(small)
    proxies = {s: fx.Proxy(small.placeholder(s.name), tracer) for s in unit.symbols}
    for s in numbers:
        proxies[s] = torch.as_tensor(proxies[s])
    written = fx.Proxy(small.placeholder("written"), tracer)
    key = unit.symbols[regimes.variable]
    out = run_program(regimes, exprs, key, proxies)
    if isinstance(out, fx.Proxy):
        out = finite_or(out, finite_or(written, out))
    small.output(out.node if isinstance(out, fx.Proxy) else out)
    mapping = {p.node: leaf for p, leaf in zip(proxies.values(), unit.leaves)}
    mapping[written.node] = unit.root
    before = set(gm.graph.nodes)
    with gm.graph.inserting_before(unit.root.next):
        new = gm.graph.graph_copy(small, mapping)
    added = set(gm.graph.nodes) - before
    unit.root.replace_all_uses_with(new, delete_user_cb=lambda user: user not in added)
