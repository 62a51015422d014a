"""Soundness testing of rules: random instances, float64 references, sympy proofs.

:func:`check_rule` runs a rule's PyTorch example on random inputs (hypothesis chooses the
seeds and value scales): the example is traced, the rule alone is saturated, the program
that uses the rewrite is emitted, and its outputs are compared with the example evaluated
in float64. Inputs come inside the rule's declared domains (declared to the analysis, so
guarded rules fire) and, every other example, from anywhere with nothing declared (a rule
that fires there must still be right: a dropped condition is caught). :func:`sympy_proof`
proves scalar rules symbolically. Imports torch when used.

>>> from egraph.rules import library
>>> log1p = next(r for r in library("stability") if r.name == "log1p")
>>> result = check_rule(log1p, examples=5)
>>> result.ok, result.fired > 0
(True, True)
>>> check_rule(log1p, examples=5, example=log1p.examples[1]).ok  # torch.log(x + 1)
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egraph.ops.table import TABLE, sympy_form
from egraph.rewrite import Rewrite
from egraph.rules import Input, LibraryRule


@dataclass
class SoundnessResult:
    """What :func:`check_rule` found: examples run, firings, and the first failure."""

    rule: str
    examples: int = 0
    fired: int = 0
    fired_outside_domain: int = 0
    worst_error: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.fired > 0

    def __str__(self) -> str:
        state = "sound" if self.ok else "UNSOUND" if self.failures else "NEVER FIRED"
        return (f"{self.rule}: {state} ({self.examples} examples, fired {self.fired}, "
                f"{self.fired_outside_domain} outside its domain)"
                + (f": {self.failures[0]}" if self.failures else ""))


UNDECLARED_DOMAINS = ("any", "bool", "causal", "additive-causal")
"""The input domains never declared to the analysis: any values, and masks whose
causality the analysis observes on the example (a rule's condition may read it only to
choose a form that checks it at run time)."""


def additive_causal(shape: tuple[int, ...], dtype=None):
    """An additive causal mask of ``shape`` (the ``additive-causal`` domain): 0 on and
    below the diagonal of its last two dims, the lowest float of ``dtype`` (default
    float32) above it, as transformers makes it.

    >>> additive_causal((2, 2))
    tensor([[ 0.0000e+00, -3.4028e+38],
            [ 0.0000e+00,  0.0000e+00]])
    """
    import torch

    dtype = dtype or torch.float32
    above = torch.ones(shape[-2:], dtype=torch.bool).triu(1)
    return torch.zeros(shape, dtype=dtype).masked_fill(above, torch.finfo(dtype).min)


def _values(spec: Input, gen, scale: float, dtype, in_domain: bool):
    import torch

    shape, domain = spec.shape, spec.domain if in_domain else "any"
    if spec.domain.startswith("index:"):
        return torch.randint(0, int(spec.domain.split(":")[1]), shape, generator=gen)
    if spec.domain == "causal" and in_domain:
        return torch.ones(shape, dtype=torch.bool).tril()
    if spec.domain in ("bool", "causal"):
        return torch.randint(0, 2, shape, generator=gen).bool()
    if spec.domain == "additive-causal" and in_domain:
        return additive_causal(shape, dtype)
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    if domain == "positive":
        values = torch.exp(base) * scale
    elif domain == "nonneg":
        values = base.abs() * scale
    elif domain == "negative":
        values = -torch.exp(base) * scale
    elif domain == "nonzero":
        values = torch.where(base >= 0, 1.0, -1.0) * (base.abs() + 0.1) * scale
    elif domain == "unit":
        values = torch.rand(shape, generator=gen, dtype=torch.float64)
    else:
        values = base * scale
    return values.to(dtype)


def _newest_choice(egraph) -> dict[int, tuple]:
    """Per class, the most recently added e-node that keeps the program acyclic: the
    program that uses what the rule added."""
    egraph.rebuild()
    memo, find = egraph.hashcons, egraph.find
    choice: dict[int, tuple] = {}
    state: dict[int, int] = {}  # 1: on the current path, 2: done

    def pick(c: int) -> bool:
        c = find(c)
        if state.get(c) == 2:
            return True
        if state.get(c) == 1:
            return False
        state[c] = 1
        for node in sorted(egraph.class_nodes[c], key=lambda n: -memo.get(n, -1)):
            if all(pick(k) for k in node[1:]):
                choice[c] = node
                state[c] = 2
                return True
        del state[c]
        return False

    for root in egraph.roots + [find(e) for e in egraph.fx.effects]:
        if not pick(root):
            raise ValueError("no acyclic program in the root class")
    return choice


def _compare(got: Any, got64: Any, ref: Any, orig: Any, dtype: Any,
             numerics: bool) -> tuple[str | None, float]:
    """Check the rewritten program against the float64 reference ``ref`` of the example.

    Soundness is judged in float64 (``got64``, the rewritten program on float64 inputs):
    where the reference is NaN (undefined over the reals) the rewrite must be NaN too; where
    it is finite the rewrite must be finite and, where the naive program in the working
    dtype (``orig``) is finite, no further from the reference than 4x that program's own
    error plus the dtype's tolerance (so a naive reference that itself cancels does not
    fail a stable form). With ``numerics`` (stability and fusion rules) the rewritten
    program in the working dtype (``got``) must also be no worse than the naive one and
    must not overflow where it does not. Returns (why it fails or None, worst error).
    """
    import torch

    got, got64, ref, orig = (t.to(torch.float64) for t in (got, got64, ref, orig))
    nan_ref = torch.isnan(ref)
    if (nan_ref & ~torch.isnan(got64)).any():
        return "gives a number where the left side is undefined (NaN)", 0.0
    finite = torch.isfinite(ref)
    if (finite & ~torch.isfinite(got64)).any():
        return "is not finite where the left side is", 0.0
    both = finite & torch.isfinite(orig)
    if not both.any():
        return None, 0.0
    tol = 64 * torch.finfo(dtype).eps * (1.0 + float(ref[both].abs().max()))
    err_old = float((orig[both] - ref[both]).abs().max())
    err64 = float((got64[both] - ref[both]).abs().max())
    if err64 > 4 * err_old + tol:
        return f"differs by {err64:.3g} (the naive program's error is {err_old:.3g})", err64
    if numerics:
        if not torch.isfinite(got[both]).all():
            return "overflows where the naive program does not", err64
        err_new = float((got[both] - ref[both]).abs().max())
        if err_new > 4 * err_old + tol:
            return f"error {err_new:.3g} in {dtype} against {err_old:.3g}", err_new
    return None, err64


def check_rule(rule: LibraryRule, examples: int = 100, dtype=None,
               rewrite: Rewrite | None = None,
               example: Callable | None = None) -> SoundnessResult:
    """Run ``rule`` (or ``rewrite``) on random instances of ``example`` (by default the
    rule's own, :attr:`LibraryRule.example`; any of its ``examples`` may be given)."""
    import torch
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from backends.fx import build_module
    from egraph.egraph import EGraph

    dtype = dtype or torch.float32
    rewrite = rewrite or rule.rewrite
    names = list(rule.inputs)
    fn = example or rule.example
    gm = torch.fx.symbolic_trace(fn)
    result = SoundnessResult(rewrite.name)

    def one(seed: int, scale: float, in_domain: bool) -> None:
        gen = torch.Generator().manual_seed(seed)
        inputs = [_values(rule.inputs[n], gen, scale, dtype, in_domain) for n in names]
        domains = {n: rule.inputs[n].domain for n in names
                   if in_domain and rule.inputs[n].domain not in UNDECLARED_DOMAINS
                   and not rule.inputs[n].domain.startswith("index")}
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        eg = EGraph.from_fx(gm, tuple(inputs), domains={placeholders[names.index(n)]: d
                                                        for n, d in domains.items()})
        eg.saturate([rewrite], iter_limit=2, node_limit=5_000, time_limit=30.0)
        result.examples += 1
        if not eg.report.rules[rewrite.name].applied:
            if in_domain:
                result.failures.append(f"did not fire on its example (seed {seed})")
            return
        result.fired += 1
        result.fired_outside_domain += not in_domain
        program = build_module(eg, _newest_choice(eg))
        inputs64 = [x.to(torch.float64) if x.is_floating_point() else x for x in inputs]
        with torch.no_grad():
            got, got64 = program(*inputs), program(*inputs64)
            orig, ref = fn(*inputs), fn(*inputs64)
        why, err = _compare(got, got64, ref, orig, dtype,
                            numerics=rule.family in ("stability", "fusion"))
        result.worst_error = max(result.worst_error, err)
        if why is not None:
            where = "in" if in_domain else "outside"
            result.failures.append(f"{why} {where} its domain (seed {seed}, scale {scale})")

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.01, 1.0, 10.0, 60.0]),
           in_domain=st.booleans())
    def run(seed: int, scale: float, in_domain: bool) -> None:
        if result.failures:
            return
        one(seed, scale, in_domain)

    one(0, 1.0, True)
    run()
    return result


def mutants() -> list[tuple[LibraryRule, Rewrite]]:
    """Deliberately wrong variants of library rules (dropped condition, off-by-sign, wrong
    dim, wrong keepdim, wrong constant), each with the rule whose example exercises it:
    :func:`check_rule` must catch every one."""
    from egraph.ops import (
        amax,
        exp,
        expm1,
        linear,
        log,
        log1p,
        logsumexp,
        mean,
        sigmoid,
        softmax,
        sqrt,
    )
    from egraph.ops import sum as sum_
    from egraph.ops import var as var_
    from egraph.rewrite import rewrite
    from egraph.rules import library
    from egraph.rules.guards import positive
    from egraph.term import vars

    rules = {r.name: r for r in library("all")}
    x, a, b, c, d, k, s, w = vars("x a b c d k s w")

    def wrong(base: str, name: str, lhs, rhs, keep_guard: bool = False):
        return rules[base], rewrite(name, lhs, rhs,
                                    when=rules[base].rewrite.when if keep_guard else None)

    return [
        wrong("exp-log", "exp-log-no-condition", exp(log(x)), x),
        wrong("sqrt-square", "sqrt-square-no-abs", sqrt(x * x), x),
        wrong("log1p", "log1p-wrong-sign", log(1 + x), log1p(-x), keep_guard=True),
        wrong("expm1", "expm1-wrong-sign", exp(x) - 1, -expm1(x), keep_guard=True),
        wrong("softmax", "softmax-wrong-dim", exp(x) / sum_(exp(x), d, True), softmax(x, (0,))),
        wrong("logsumexp", "logsumexp-wrong-keepdim", log(sum_(exp(x), d, k)),
              logsumexp(x, d, True)),
        wrong("var-two-pass", "var-wrong-correction",
              mean(x * x, d, k) - mean(x, d, k) * mean(x, d, k), var_(x, d, 1, k)),
        wrong("sqrt-diff", "sqrt-diff-wrong-sign", sqrt(a) - sqrt(b),
              (b - a) / (sqrt(a) + sqrt(b)), keep_guard=True),
        wrong("log-diff", "log-diff-no-condition", log(a) - log(b), log(a / b)),
        wrong("log-mul", "log-mul-no-condition", log(a * b), log(a) + log(b)),
        wrong("sigmoid", "sigmoid-wrong-sign", 1 / (1 + exp(-x)), sigmoid(-x), keep_guard=True),
        (rules["log-square"], rewrite("log-square-no-abs", log(x * x), 2.0 * log(x),
                                      when=positive(x))),
        wrong("softmax-shift", "softmax-shift-wrong-dim", softmax(x - amax(x, d, True), d),
              softmax(x, (0,))),
        wrong("linear-low-rank", "linear-low-rank-unscaled",
              linear(x, w, b) + linear(linear(x, a, None), c, None) * s,
              linear(x, w + c @ a, b), keep_guard=True),
    ]


# -- sympy ------------------------------------------------------------------------------


def _sympy_ops() -> dict:
    """The ops sympy can express, as builders over sympy expressions: the op table's
    ``sympy`` facts (:func:`egraph.ops.table.sympy_form`)."""
    return {name: sympy_form(name) for name, entry in TABLE.items() if entry.sympy is not None}


def sympy_proof(rewrite: Rewrite) -> bool | None:
    """True if sympy proves ``lhs == rhs`` over the reals under the rule's conditions;
    False if it cannot; None when the rule is not scalar algebra sympy can express.

    >>> from egraph.rules import library
    >>> sympy_proof(next(r for r in library("stability") if r.name == "sqrt-diff").rewrite)
    True
    """
    import sympy as sp

    from egraph.pattern import Pattern
    from egraph.term import Term, Var, is_literal_op, is_number_op

    if rewrite.rhs is None or not isinstance(rewrite.lhs, Pattern):
        return None
    facts = getattr(rewrite.when, "facts", {}) if rewrite.when is not None else {}
    ops = _sympy_ops()
    symbols: dict[str, Any] = {}
    assumptions = {"positive": {"positive": True}, "nonneg": {"nonnegative": True},
                   "nonzero": {"nonzero": True}, "negative": {"negative": True}}

    def convert(t: Term):
        if isinstance(t, Var):
            fact = facts.get(t.name)
            if isinstance(fact, tuple) and fact[0] == "value":
                return sp.nsimplify(fact[1])
            if t.name not in symbols:
                symbols[t.name] = sp.Symbol(t.name, real=True,
                                            **assumptions.get(fact, {}))
            return symbols[t.name]
        if not t.args:
            if is_literal_op(t.op) and isinstance(t.op[1], (int, float)):
                return sp.nsimplify(t.op[1])
            if is_number_op(t.op):
                return sp.nsimplify(t.op)
            raise KeyError(t.op)
        fn = ops[t.op]
        return fn(*[convert(a) for a in t.args])

    try:
        lhs, rhs = convert(rewrite.lhs.term), convert(rewrite.rhs.term)
    except (KeyError, TypeError):
        return None
    difference = lhs - rhs
    for attempt in (sp.simplify, lambda e: sp.simplify(sp.expand_log(e)),
                    lambda e: sp.simplify(e.rewrite(sp.exp)), sp.trigsimp,
                    lambda e: sp.simplify(e.rewrite(sp.erf)),
                    lambda e: sp.simplify(e.rewrite(sp.log))):
        if attempt(difference) == 0:
            return True
    return False
