"""The op table: every op declares every fact its kind needs (or says why not), every
spelling resolves to a torch callable, the sets the analyses, cost models, fusion planner
and kernels use are the table's, and its exactness decisions hold in both analyses."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import egraph.ops
from backends.triton.templates import POINTWISE, ROW_OPS, attributes_of
from egraph import EGraph
from egraph.ops import Op
from egraph.ops.table import ERRORS, KINDS, TABLE, interval_of, names, sympy_form
from extractors import Curvature, Flops
from extractors.fusion import LIBRARY, VIEWS
from frontends.fx.error_analysis import rounding_error
from frontends.fx.vocabulary import (
    METHODS,
    MODULES,
    OPERATORS_BY_NAME,
    SPECS,
    SPELLINGS,
    lower,
    resolve,
)

TENSOR_KINDS = ("pointwise", "reduction", "library", "view", "creation")


def _missing(entry, fact: str) -> bool:
    """True when ``entry`` lacks ``fact`` without saying why."""
    return fact not in entry.why


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_op_has_the_facts_its_kind_needs(name):
    e = TABLE[name]
    assert e.kind in KINDS and e.error in ERRORS
    assert set(e.attributes) <= set(e.params), "an attribute that is not a parameter"
    assert e.exact == (e.error == "exact"), "exactness and the error rule disagree"
    assert e.impl is not None or not _missing(e, "impl")
    if e.kind in ("pointwise", "reduction") or (e.kind == "library" and not e.exact):
        assert callable(e.flops) or e.flops > 0 or not _missing(e, "flops"), (
            "an op that computes needs its FLOPs")
    if e.kind in ("view", "leaf", "shape"):
        assert e.flops == 0
    if e.kind in ("pointwise", "reduction", "library", "creation"):
        assert e.triton is not None or not _missing(e, "triton")
    if e.kind in TENSOR_KINDS:
        assert e.interval is not None or not _missing(e, "interval")
    if e.kind not in ("leaf", "shape", "opaque"):
        assert e.spellings or e.modules or not _missing(e, "spellings")
    assert set(e.why) <= {"impl", "flops", "triton", "interval", "spellings", "error"}


def test_every_spelling_implementation_and_module_resolves_to_torch():
    for e in TABLE.values():
        if e.impl is not None:
            assert callable(resolve(e.impl)), e.impl
        for target, _ in e.spellings:
            if not target.startswith("ops."):  # another library's: below
                assert callable(resolve(target)), target
        for m in e.modules:
            assert issubclass(resolve(m.cls), torch.nn.Module), m.cls


def test_another_librarys_operators_are_matched_by_name_once_it_has_loaded():
    pytest.importorskip("transformers.integrations.moe")
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma, which dynamo's
    # graphs call; which test loads it first depends on the order the tests run in)

    spelled = [t for e in TABLE.values() for t, _ in e.spellings if t.startswith("ops.")]
    assert spelled
    for target in spelled:
        operator = resolve(target)
        assert str(operator) == target.removeprefix("ops."), target
        assert lower(operator, ("x", "w", "offs"), {})[0] in TABLE


def test_the_front_end_and_emitters_use_the_tables_sets():
    assert set(SPECS) == {n for n, e in TABLE.items() if e.impl}
    targets = {t for e in TABLE.values() for t, _ in e.spellings}
    assert {resolve(t) for t in targets if not t.startswith(("Tensor.", "ops."))} == set(
        SPELLINGS)
    assert {t.removeprefix("ops.") for t in targets if t.startswith("ops.")} == set(
        OPERATORS_BY_NAME)
    assert {t.removeprefix("Tensor.") for t in targets if t.startswith("Tensor.")} == set(
        METHODS)
    assert {name for name, _ in MODULES.values()} == {
        n for n, e in TABLE.items() if e.modules}
    assert VIEWS == names(kind="view")
    assert LIBRARY == names(kind="library") | names(kind="opaque")
    assert set(POINTWISE) == {n for n, e in TABLE.items()
                              if e.kind == "pointwise" and e.triton}
    assert set(ROW_OPS) == {n for n, e in TABLE.items() if e.kind == "reduction" and e.triton}
    assert all(attributes_of(n) == TABLE[n].attributes for n in POINTWISE)


def test_op_constructors_come_from_the_table():
    from egraph.ops import add, log1p

    assert str(log1p(add(1, 2))) == "(log1p (add #int:1 #int:2))"
    assert Op("mul").commutative and not Op("sub").commutative
    with pytest.raises(AttributeError, match="did you mean 'layer_norm'"):
        egraph.ops.layer_nrom  # noqa: B018
    with pytest.raises(TypeError, match="softmax takes 2 arguments"):
        egraph.ops.softmax(1)


def _graph(fn, *inputs):
    return torch.fx.symbolic_trace(fn), inputs


# Ops that move, select or convert values without rounding: the error analysis and the
# curvature cost both treat them as exact (the two used to disagree on these).
EXACT_PROGRAMS = {
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "gather": lambda a, b: torch.gather(a, 0, torch.zeros_like(a, dtype=torch.long)),
    "tril": lambda a, b: torch.tril(a.reshape(4, 4)),
    "to": lambda a, b: a.double(),
    "min_dim": lambda a, b: torch.min(a.reshape(4, 4), 1)[0],
    "max_dim": lambda a, b: torch.max(a.reshape(4, 4), 1)[0],
}


@pytest.mark.parametrize("name", sorted(EXACT_PROGRAMS))
def test_exact_ops_add_no_rounding_error(name):
    assert TABLE[name].exact
    a, b = torch.rand(16) + 1, torch.rand(16)
    analysis = rounding_error(torch.fx.symbolic_trace(EXACT_PROGRAMS[name]), (a, b))
    assert analysis.worst_bits == 0


def test_curvature_charges_no_cancellation_between_exact_operands():
    """cat of inputs is exact, so cat(a) - cat(b) costs one rounding however much
    cancels, as a - b does."""
    a = torch.full((8,), 1.0) + torch.rand(8) * 1e-6
    b = torch.full((8,), 1.0)
    for fn in (lambda a, b: a - b, lambda a, b: torch.cat([a, a]) - torch.cat([b, b])):
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (a, b))
        assert Curvature.to_bits(Curvature().program_cost(eg)) < 1


def test_flops_follow_the_table():
    x = torch.randn(8, 16)
    for fn, expected in [(lambda x: torch.sigmoid(x), 4 * 128),
                         (lambda x: x.softmax(-1), 5 * 128),
                         (lambda x: x.sum(-1), 128),
                         (lambda x: x.t().reshape(-1), 0)]:
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
        assert math.isclose(Flops().program_cost(eg), expected, abs_tol=1e-3)


# -- a new op end to end: torch.logit is one entry of the table --------------------------

LOGIT_SPELLINGS = {
    "torch.logit": lambda x: torch.logit(x) * 2,
    "torch.special.logit": lambda x: torch.special.logit(x) * 2,
    "Tensor.logit": lambda x: x.logit() * 2,
}


def _logit_input():
    return torch.linspace(0.05, 0.95, 24).reshape(4, 6)


def _ops(eg) -> set:
    return {n.op for c in eg.classes() for n in eg.nodes(c)}


@pytest.mark.parametrize("spelling", sorted(LOGIT_SPELLINGS))
def test_logit_from_every_spelling_saturates_extracts_and_matches_eager(spelling):
    from egraph.rules import load_rules

    fn, x = LOGIT_SPELLINGS[spelling], _logit_input()
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
    assert "logit" in _ops(eg) and "opaque" not in _ops(eg)
    opt = eg.saturate(load_rules("all"), iter_limit=5, node_limit=5_000).extract(Flops())
    torch.testing.assert_close(opt(x), fn(x))
    assert "logit" in opt.code


def test_logit_from_an_aten_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = _logit_input()
    gm = make_fx(lambda x: torch.logit(x) * 2)(x)
    assert torch.ops.aten.logit.default in {n.target for n in gm.graph.nodes}
    eg = EGraph.from_fx(gm, (x,))
    assert "logit" in _ops(eg)
    torch.testing.assert_close(eg.extract(Flops())(x), torch.logit(x) * 2)


def test_logit_cost_range_and_rounding_error():
    x = _logit_input()
    gm = torch.fx.symbolic_trace(lambda x: torch.logit(x))
    eg = EGraph.from_fx(gm, (x,))
    assert math.isclose(Flops().program_cost(eg), 3 * x.numel(), abs_tol=1e-3)
    meta = eg.data(eg.roots[0])
    lo, hi = float(torch.logit(x).min()), float(torch.logit(x).max())
    assert meta.lo == pytest.approx(lo) and meta.hi == pytest.approx(hi)
    analysis = rounding_error(gm, (x,))
    assert [op for op, _, _ in analysis.per_node.values()] == ["logit"]
    assert 0 < analysis.worst_bits < 3  # logit rounds once; no cancellation here


def test_logit_runs_as_a_generated_triton_kernel(monkeypatch):
    pytest.importorskip("triton")
    from backends.fx import build_module
    from backends.triton import FusedKernel
    from egraph.extract import source_program

    def refuse(self, *args):
        raise AssertionError("the fused region ran its eager ops instead of the kernel")

    monkeypatch.setattr(FusedKernel, "eager", refuse)
    x = _logit_input()
    fn = LOGIT_SPELLINGS["torch.logit"]
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
    module = build_module(eg, source_program(eg), target="cuda")
    assert "fused_logit_mul" in module.code
    torch.testing.assert_close(module(x), fn(x))


def test_cat_and_split_dims_are_normalised_so_each_spelling_hashes_alike():
    """``cat(.., -1)`` and ``cat(.., 1)`` of matrices, ``split(.., -1)`` and ``split(.., 1)``
    are one e-node each, so the concat and split rules bind one dim literal."""
    def fn(a, b):
        return (torch.cat([a, b], -1), torch.cat([a, b], 1),
                torch.split(a, [1, 2], -1)[0], torch.split(a, [1, 2], 1)[0])

    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.randn(4, 3), torch.randn(4, 5)))
    first, second, third, fourth = eg.roots
    assert first == second and third == fourth


class _Pairs(torch.nn.Module):
    """var_mean and max over a dim return pairs; a cast to another tensor's dtype."""

    def forward(self, x):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        top = x.max(-1, keepdim=True).values
        return (var + mean + top).to(x.dtype)


@pytest.mark.parametrize("capture", ["symbolic_trace", "export"])
def test_var_mean_max_values_and_dtype_casts_ingest_as_table_ops(capture):
    """``var_mean`` is the pair (var, mean), ``.values`` picks max_dim's first item and
    ``x.to(y.dtype)`` is a cast to a literal dtype, from FX and from aten."""
    x = torch.randn(4, 6)
    model = _Pairs()
    source = (torch.fx.symbolic_trace(model) if capture == "symbolic_trace"
              else torch.export.export(model, (x,)))
    eg = EGraph.from_fx(source, (x,))
    assert {"var", "mean", "max_dim", "getitem", "to"} <= _ops(eg)
    torch.testing.assert_close(eg.extract(Flops())(x), model(x))


HYPERBOLIC_AND_TANGENT = {
    "tan": (lambda x: torch.tan(x) * 2, lambda x: x.tan() + 1),
    "atan": (lambda x: torch.atan(x) * 2, lambda x: x.atan() + 1),
    "sinh": (lambda x: torch.sinh(x) * 2, lambda x: x.sinh() + 1),
    "cosh": (lambda x: torch.cosh(x) * 2, lambda x: x.cosh() + 1),
}


@pytest.mark.parametrize("name", sorted(HYPERBOLIC_AND_TANGENT))
def test_tan_atan_sinh_cosh_are_table_ops_with_ranges_and_kernels(name, monkeypatch):
    """Each from its function and method spelling is an op of the e-graph, not opaque;
    its value range is what it can take; where it has a Triton template, the generated
    kernel agrees with eager (sinh near 0 too, where exp(x) - exp(-x) cancels)."""
    from backends.fx import build_module
    from egraph.extract import source_program

    x = torch.cat([torch.linspace(-1.2, 1.2, 21), torch.tensor([1e-6, -3e-7, 0.0])])
    for fn in HYPERBOLIC_AND_TANGENT[name]:
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
        assert name in _ops(eg) and "opaque" not in _ops(eg)
        torch.testing.assert_close(eg.extract(Flops())(x), fn(x))
    lo, hi = interval_of(name, [(-1.0, 2.0)], [], None)
    assert {"atan": (math.atan(-1.0), math.atan(2.0)), "sinh": (math.sinh(-1.0), math.sinh(2.0)),
            "cosh": (1.0, math.cosh(2.0)), "tan": (-math.inf, math.inf)}[name] == (lo, hi)
    if TABLE[name].triton is None or importlib.util.find_spec("triton") is None:
        return
    eg = EGraph.from_fx(torch.fx.symbolic_trace(HYPERBOLIC_AND_TANGENT[name][0]), (x,))
    module = build_module(eg, source_program(eg), target="cuda")
    assert module.meta.get("triton_kernels"), module.code
    torch.testing.assert_close(module(x), HYPERBOLIC_AND_TANGENT[name][0](x), rtol=2e-6,
                               atol=0)


DOMAIN_SHIFT = {"acosh": 1.0}  # ops whose domain lies outside (0.1, 0.9): the points moved in


@pytest.mark.parametrize("name", sorted(n for n, e in TABLE.items() if e.sympy is not None))
def test_an_ops_sympy_form_is_the_op(name):
    """Each op's ``sympy`` fact (what the soundness proofs and the accuracy search read)
    computes what its torch implementation does, at points inside its domain."""
    import sympy

    from frontends.fx.vocabulary import SPECS

    entry = TABLE[name]
    gen = torch.Generator().manual_seed(0)
    points = torch.rand(16, generator=gen, dtype=torch.float64) * 0.8 + 0.1  # (0.1, 0.9)
    points = points + DOMAIN_SHIFT.get(name, 0.0)
    others = {"y": points.flip(0) + 0.5, "beta": 2.0, "threshold": 20.0}
    args = [points] + [others[p] for p in entry.params[1:]]
    want = SPECS[name].run(args)
    symbols = [sympy.Symbol(p) for p in entry.params]
    formula = sympy.lambdify(symbols, sympy_form(name)(*symbols), "math")
    got = torch.tensor([formula(*[float(a[i]) if isinstance(a, torch.Tensor) else a
                                  for a in args]) for i in range(len(points))],
                       dtype=torch.float64)
    torch.testing.assert_close(got, want.expand_as(got).to(torch.float64))


def test_an_op_added_with_a_sympy_fact_reaches_the_proofs_and_the_accuracy_search():
    """``logit`` (added the documented way, one table entry) is scalar algebra to the
    soundness proofs and to the accuracy search through its ``sympy`` fact."""
    import sympy

    from compiler.herbie import to_sympy
    from compiler.soundness import sympy_proof
    from egraph import rewrite

    assert sympy_proof(rewrite("sigmoid-logit", "(sigmoid (logit ?x))", "?x")) is True
    assert sympy_proof(rewrite("wrong-logit", "(logit ?x)", "(log ?x)")) is False
    gm = torch.fx.symbolic_trace(lambda p: torch.logit(p))
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    builder, args = to_sympy(call)
    assert builder(sympy.Symbol("p")) == sympy.log(sympy.Symbol("p") / (1 - sympy.Symbol("p")))


# The ops FPCore programs need (Herbie's suite uses each): the function and method spellings,
# and what they compute, where the NaN rules matter (fmax and fmin ignore a NaN operand).
FPCORE_OPS = {
    "asin": (lambda x: torch.asin(x) * 2, lambda x: x.arcsin() + 1),
    "acos": (lambda x: torch.acos(x) * 2, lambda x: x.acos() + 1),
    "asinh": (lambda x: torch.asinh(x) * 2, lambda x: x.asinh() + 1),
    "acosh": (lambda x: torch.acosh(x + 2) * 2, lambda x: (x + 2).acosh() + 1),
    "atanh": (lambda x: torch.atanh(x) * 2, lambda x: x.atanh() + 1),
    "erfc": (lambda x: torch.erfc(x) * 2, lambda x: torch.special.erfc(x) + 1),
    "log2": (lambda x: torch.log2(x + 2) * 2, lambda x: (x + 2).log2() + 1),
    "fmod": (lambda x: torch.fmod(x * 7, 2.5), lambda x: (x * 7).fmod(x + 2)),
    "copysign": (lambda x: torch.copysign(x + 2, x), lambda x: (x + 2).copysign(-1.0)),
    "fmax": (lambda x: torch.fmax(x, 0.5 - x), lambda x: x.fmax(torch.zeros_like(x))),
    "fmin": (lambda x: torch.fmin(x, 0.5 - x), lambda x: x.fmin(torch.zeros_like(x))),
}


@pytest.mark.parametrize("name", sorted(FPCORE_OPS))
def test_fpcores_ops_are_table_ops_that_saturate_extract_and_match_eager(name):
    from egraph.rules import load_rules

    x = torch.linspace(-0.9, 0.9, 19)
    for fn in FPCORE_OPS[name]:
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,))
        assert name in _ops(eg) and "opaque" not in _ops(eg)
        opt = eg.saturate(load_rules("all"), iter_limit=4, node_limit=5_000).extract(Flops())
        torch.testing.assert_close(opt(x), fn(x))
        if name != "fmod":  # a remainder's jumps amplify its operand's rounding
            assert rounding_error(torch.fx.symbolic_trace(fn), (x,)).worst_bits < 4


def test_fmax_and_fmin_ignore_nan_where_maximum_propagates_it():
    nan = float("nan")
    x, y = torch.tensor([nan, 1.0, nan]), torch.tensor([2.0, nan, nan])
    fmax = EGraph.from_fx(torch.fx.symbolic_trace(lambda x, y: torch.fmax(x, y)), (x, y))
    out = fmax.extract(Flops())(x, y)
    assert out[:2].tolist() == [2.0, 1.0] and math.isnan(out[2])
    fmin = EGraph.from_fx(torch.fx.symbolic_trace(lambda x, y: torch.fmin(x, y)), (x, y))
    assert fmin.extract(Flops())(x, y)[:2].tolist() == [2.0, 1.0]
    assert TABLE["fmax"].impl == "torch.fmax" and TABLE["maximum"].impl == "torch.maximum"


def test_fpcores_ops_reach_the_proofs_and_the_accuracy_search():
    import sympy

    from compiler.herbie import to_sympy
    from compiler.soundness import sympy_proof
    from egraph import rewrite

    assert sympy_proof(rewrite("erfc-erf", "(erfc ?x)", "(sub 1 (erf ?x))")) is True
    assert sympy_proof(rewrite("asinh-log", "(asinh ?x)",
                               "(log (add ?x (sqrt (add (mul ?x ?x) 1))))")) is True
    assert sympy_proof(rewrite("wrong", "(acos ?x)", "(asin ?x)")) is False
    gm = torch.fx.symbolic_trace(lambda x: torch.erfc(x))
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    builder, _ = to_sympy(call)
    assert builder(sympy.Symbol("x")) == sympy.erfc(sympy.Symbol("x"))
    x = sympy.Symbol("x")
    assert sympy.simplify(sympy_form("log2")(8)) == 3 and sympy_form("fmod")(-7, 2) == -1
    assert sympy_form("copysign")(3, -1) == -3 and sympy_form("fmax")(x, x) == x
