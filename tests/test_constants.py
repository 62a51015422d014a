"""Float constants are exact values: folding never gives one class two floats, a literal is
zero only when it is zero, and validation judges each output at its own magnitude."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from compiler.validate import ValidationError, relative_error
from egraph import EGraph, rewrite
from egraph.rules import load_rules
from egraph.scalars import fold, representable
from extractors import AstSize, Flops

RULES = load_rules("all")

PROGRAMS = {
    "scale and unscale": lambda x: (x * 1e-5 + 1) * 1e5,
    "two inexact factors": lambda x: x * 0.1 * 3,
    "exp minus one": lambda x: torch.exp(x * 0.3) - 1,
    "tiny term": lambda x: x * 1e-12 + x,
    "tiny factor": lambda x: x * 1e-9,
    "third": lambda x: x + 1 / 3,
    "positive times tiny": lambda x: torch.exp(x) * 1e-12,
    "products of tenths": lambda x: x * 0.1 * 0.2 * 0.3 + x * 1e-7 * 1e7,
    "huge and tiny": lambda x: x * 1e12 * 1e-12 - x * 1e-12 * 1e12,
    "cancelling constants": lambda x: x + 1e16 - 1e16 + 1,
}


def _optimise(fn, x, cost=None):
    gm = torch.fx.symbolic_trace(fn)
    eg = EGraph.from_fx(gm, (x,)).saturate(RULES, iter_limit=8, node_limit=5000)
    return eg.extract(cost or AstSize(), validate="raise")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_float_constants_saturate_and_stay_correct(name):
    fn = PROGRAMS[name]
    x = torch.randn(4, 8)
    for cost in (AstSize(), Flops()):
        opt = _optimise(fn, x, cost)
        y = torch.randn(4, 8)
        ref = fn(y.double())
        assert relative_error(opt(y), ref) <= 2 * relative_error(fn(y), ref) + 1e-5


def test_a_tiny_literal_is_not_zero():
    x = torch.randn(4, 8)
    for fn in (PROGRAMS["tiny term"], PROGRAMS["tiny factor"]):
        opt = _optimise(fn, x)
        assert "zeros_like" not in opt.code
        assert torch.equal(opt(x), fn(x))


def test_a_folded_product_near_one_is_not_one():
    """(x * 1e-5) * 1e5 reassociated is x * (1e-5 * 1e5): not exactly 1, so not x."""
    exact, approx = fold("mul", [(Fraction(1e-5), 1e-5), (Fraction(1e5), 1e5)])
    assert exact != 1 and not representable(exact)
    x = torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(lambda x: x * 1e-5 * 1e5)
    eg = EGraph.from_fx(gm, (x,)).saturate(RULES, iter_limit=8, node_limit=5000)
    assert not eg.equiv(eg.roots[0], eg.fx.input_classes[0])


def _scaled_by(c: float):
    return lambda x: x * c


def test_validation_judges_a_scaled_result_at_its_own_scale():
    """A wrong rule turning x * c into zeros is caught however small c is."""
    # As written only: matched the other way round ?x binds the scalar (the next test).
    bad = rewrite("drop-small-factor", "(mul ?x ?c)", "(zeros_like ?x)", variants=False)
    x = torch.randn(4, 8)
    for c in (1e-3, 1e-9, 1e-20):
        gm = torch.fx.symbolic_trace(_scaled_by(c))
        with pytest.raises(ValidationError, match="relative error"):
            EGraph.from_fx(gm, (x,)).saturate([bad]).extract(Flops(), validate="raise")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = EGraph.from_fx(gm, (x,)).saturate([bad]).extract(Flops())
        assert any("drop-small-factor" in str(w.message) for w in caught)
        assert opt.meta["egraph_report"].fell_back
        assert torch.equal(opt(x), x * c)


def test_a_rewrite_that_makes_an_ill_typed_program_is_refused_not_raised():
    """Matched in both operand orders, ``x * c -> zeros_like(x)`` also binds ?x to the
    scalar c, and the program it makes raises (zeros_like of a float). Validation refuses
    it with the reason; the default mode falls back to the original."""
    bad = rewrite("drop-factor", "(mul ?x ?c)", "(zeros_like ?x)")
    x = torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(_scaled_by(1e-3))
    with pytest.raises(ValidationError, match="raises where the original runs|relative error"):
        EGraph.from_fx(gm, (x,)).saturate([bad]).extract(AstSize(), validate="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = EGraph.from_fx(gm, (x,)).saturate([bad]).extract(AstSize())
    assert opt.meta["egraph_report"].fell_back
    assert torch.equal(opt(x), x * 1e-3)


def test_relative_error_floors_at_the_smallest_normal():
    ref = torch.tensor([0.0, 1e-30, 1.0], dtype=torch.float64)
    assert relative_error(ref.float(), ref) < torch.finfo(torch.float32).eps  # rounding only
    got = torch.tensor([0.0, 2e-30, 1.0])
    assert relative_error(got, ref) == pytest.approx(1.0, rel=1e-6)
    below_normal = torch.tensor([1e-40], dtype=torch.float64)  # subnormal in float32
    assert relative_error(torch.tensor([0.0]), below_normal) < 1e-2
    assert relative_error(torch.tensor([float("inf")]), torch.tensor([1.0])) == math.inf


_MAGNITUDES = st.sampled_from([1e-12, 1e-9, 1e-5, 1e-3, 0.1, 1 / 3, 0.7978845608, 1.0, 3.0,
                               7.0, 1e3, 1e5, 1e9, 1e12])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["mul", "add", "sub", "div"]), _MAGNITUDES),
                min_size=2, max_size=5))
# (regrouped into x * 1e39, an inf in float32, where the source overflowed only for x > 0.34)
@example(steps=[("mul", 1e3), ("mul", 1e12), ("mul", 1e12), ("mul", 1e12)])
def test_random_constant_chains_never_crash_and_validate(steps):
    """Chains like ((x * c1 + c2) / c3 - c4) through every rule: no crash, and the result
    is no worse than the source against float64."""
    def fn(x):
        for op, c in steps:
            x = {"mul": x * c, "add": x + c, "sub": x - c, "div": x / c}[op]
        return x

    x = torch.rand(3, 5) + 0.5
    _optimise(fn, x, Flops())


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False).filter(bool), min_size=3, max_size=3))
def test_exact_folding_is_associative(values):
    a, b, c = ((Fraction(v), v) for v in values)
    left = fold("mul", [fold("mul", [a, b]), c])
    right = fold("mul", [a, fold("mul", [b, c])])
    assert left[0] == right[0]
    left = fold("add", [fold("add", [a, b]), c])
    right = fold("add", [a, fold("add", [b, c])])
    assert left[0] == right[0]


class _CastingBlock(torch.nn.Module):
    """Explicit casts, as real models write them (Llama's RMS norm upcasts to float32):
    torch.export records them with dtype assertions."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x).to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        return (h * torch.rsqrt(variance + 1e-6)).to(x.dtype) * 0.1 * 3


def test_export_programs_validate_against_float64_and_fall_back_with_their_signature():
    x = torch.randn(2, 4, 8)
    program = torch.export.export(_CastingBlock(), (x,))
    opt = EGraph.from_fx(program).saturate(RULES, iter_limit=6).extract(Flops(),
                                                                         validate="raise")
    assert opt.meta["egraph_report"].validation.reference == "float64"
    assert opt.meta["egraph_report"].validation.error_before > 0  # a real reference
    bad = rewrite("drop-small-factor", "(mul ?x ?c)", "(zeros_like ?x)", variants=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fallback = EGraph.from_fx(program).saturate([bad]).extract(Flops())
    assert fallback.meta["egraph_report"].fell_back
    torch.testing.assert_close(fallback(x), program.module()(x))


def test_an_underflowed_constant_proves_no_sign():
    """exp(-1000) folds to 0.0 in floating point, but it is positive: it must neither
    contradict exp's proven sign nor count as the literal 0 (found by the fuzzer)."""
    def shifted_logsumexp(x0):
        v0 = x0 - 1e3
        m = v0.amax(1, keepdim=True)
        return m + torch.log(torch.exp(v0 - m).sum(1, keepdim=True))

    x = torch.randn(2, 4, 16) * 3
    gm = torch.fx.symbolic_trace(shifted_logsumexp)
    eg = EGraph.from_fx(gm, (x,)).saturate(RULES, iter_limit=4, node_limit=3000)
    opt = eg.extract(Flops(), validate="raise")
    torch.testing.assert_close(opt(x), shifted_logsumexp(x))


def test_a_float_sum_is_not_reassociated_for_nothing():
    """(x0 - x1) + 2 x2 and (2 x2 - x1) + x0 fuse into one kernel alike, so extraction keeps
    the source's order: reassociated, it loses bits where x0 and x1 cancel (found by the
    fuzzer under Roofline)."""
    from extractors import Roofline

    def f(x0, x1, x2):
        return torch.add(x0 - x1, x2, alpha=2)

    xs = tuple(torch.randn(4) for _ in range(3))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(f), xs).saturate(RULES, iter_limit=4,
                                                                 node_limit=3000)
    for cost in (Roofline("H100"), Flops(), AstSize()):
        opt = eg.extract(cost, validate="raise")
        cancelling = (torch.tensor([0.75]), torch.tensor([0.7499]), torch.tensor([1e-5]))
        assert torch.equal(opt(*cancelling), f(*cancelling)), cost


def test_an_overflowing_constant_is_emitted_as_inf_not_an_error():
    """logsumexp rules split exp(x + 1e3) into exp(x) * exp(1e3): computed in Python,
    exp(1000) overflows; the emitted program gets inf as torch would (found by the soak)."""
    from egraph.scalars import FLOAT_OPS

    assert FLOAT_OPS["exp"](1000.0) == math.inf and FLOAT_OPS["log"](0.0) == -math.inf
    assert math.isnan(FLOAT_OPS["sqrt"](-1.0))

    def shifted(x0):
        v7 = x0 + 1e3
        v8 = v7.amax(0, keepdim=True)
        return v8 + torch.log(torch.exp(v7 - v8).sum(0, keepdim=True))

    x = torch.rand(3, 6) + 0.1
    eg = EGraph.from_fx(torch.fx.symbolic_trace(shifted), (x,)).saturate(
        RULES, iter_limit=4, node_limit=3000)
    from extractors import Curvature, Lexicographic, Memory

    for cost in (Curvature(), Flops() + 1e-3 * Memory(), Lexicographic(Curvature(), Flops())):
        opt = eg.extract(cost)
        torch.testing.assert_close(opt(x), shifted(x))


def test_a_half_tensor_times_a_large_constant_keeps_the_sources_rounding():
    """relu(x) / (1/3) * 1e12 * 1e-12 in float16: reassociated to 3e12 * relu(x), the
    scalar-first call rounds 3e12 to float16 inf and 0 * inf is NaN; emitted tensor first
    it computes as the source does (found by the soak)."""
    def program(x0):
        return torch.sqrt((x0.relu().div(1 / 3) * 1e12 * 1e-12).abs())

    x = (torch.rand(3, 6) * 0.45 + 0.05).half()
    opt = _optimise(program, x)
    y = torch.randn(3, 6).half()
    assert torch.equal(opt(y).isnan(), program(y).isnan())


def test_mixed_dtypes_are_not_regrouped():
    """a * (b * c) with a float16 tensor, b an int64 tensor and c a float: b * c is float32
    and a * (b * c) float32, but (a * b) * c stays float16 (found by the soak)."""
    def program(x0, i0):
        v1 = x0 * (i0 - i0)
        return v1 * 0.3 + v1 * 1e-8

    x, i = torch.randn(2, 4).half(), torch.randint(-8, 8, (2, 4))
    gm = torch.fx.symbolic_trace(program)
    opt = EGraph.from_fx(gm, (x, i)).saturate(RULES, iter_limit=4, node_limit=3000).extract(
        Flops(), validate="raise")
    assert opt(x, i).dtype == program(x, i).dtype


def test_a_half_product_is_not_regrouped_into_an_overflow():
    """A float16 layer norm divided by 1e-6: regrouped as d * (rsqrt(v + 1e-12) * 1e6),
    the new product overflows (rsqrt is up to 1e6 there) where the source's small d kept
    it finite, and validation fell back (found by the fuzzer, seed 31337). The regrouping
    is refused by the ranges of its factors (in float32 it stays allowed)."""
    def program(x1):
        v0 = x1.mean(-1, keepdim=True)
        v1 = ((x1 - v0) ** 2).mean(-1, keepdim=True)
        return ((x1 - v0) / torch.sqrt(v1 + 1e-12)).div(1e-6)

    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1)).half()
    gm = torch.fx.symbolic_trace(program)
    opt = EGraph.from_fx(gm, (x,)).saturate(RULES, iter_limit=4, node_limit=3000).extract(
        Flops(), validate="raise")
    y = torch.randn(5, 6).half() * 1e-2
    assert torch.equal(opt(y).isinf(), program(y).isinf())


def test_a_half_product_is_not_regrouped_into_subnormals_nor_factored_into_an_overflow():
    """``(x / 1e-8) * x`` doubled, in float16 with x near 1e-3 (fuzzer, seed 99, program
    298): ``assoc-mul`` made ``(x * x) * 2e8``, whose ``x * x`` is a subnormal of a few
    bits (error 0.31 where the source's was 0.003), and ``factor`` made
    ``x * ((x + x) * 1e8)``, whose sum times 1e8 overflows where the source's products
    did not. Both fell back; the ranges of the factors now refuse both regroupings."""
    def program(x0):
        v1 = torch.mul(x0.div(1e-8), x0)
        return torch.add(v1, v1)

    x = (torch.randn(2, 4, generator=torch.Generator().manual_seed(0)) * 1e-3).half()
    opt = EGraph.from_fx(torch.fx.symbolic_trace(program), (x,)).saturate(RULES).extract(
        AstSize(), validate="raise")
    assert opt.meta["egraph_report"].validation.ok


def test_validation_refuses_an_overflow_turned_into_nan():
    """a * (b - c) overflowing to inf is not a * b - a * c = inf - inf = NaN."""
    from compiler.validate.judging import overflow_changed

    ref = torch.tensor([1e5], dtype=torch.float64)
    source = torch.tensor([float("inf")], dtype=torch.float16)
    assert overflow_changed(torch.tensor([float("nan")]).half(), source, ref)
    assert not overflow_changed(torch.tensor([float("inf")]).half(), source, ref)
    assert not overflow_changed(torch.tensor([1e4]).half(), source, ref)
    past_range = torch.tensor([1e5, -1e5], dtype=torch.float64)  # float16 holds 65504
    nan = torch.full((2,), float("nan")).half()
    assert not overflow_changed(torch.tensor([float("inf"), -float("inf")]).half(), nan,
                                 past_range)
    assert overflow_changed(torch.tensor([-float("inf"), float("inf")]).half(), nan,
                             past_range)


def test_a_softmax_whose_float16_source_gives_nan_is_kept_where_it_gives_the_exact_inf():
    """The fuzzer's float16 program (seed 8675309, program 3): ``exp(x) / exp(x).sum()``
    overflows to ``inf / inf = NaN`` in the source; the fused softmax is finite, and a
    product scaled by 1e6 then overflows to inf, which is the float64 result (up to 9e6)
    in float16. Validation took NaN -> inf for a changed overflow and fell back."""
    def program(x0):
        v0 = torch.exp(x0) / torch.exp(x0).sum(-3, keepdim=True)
        v1 = v0 / 1e-3
        return v1 @ v1.transpose(-1, -2)

    x = (torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0)) * 100).half()
    opt = EGraph.from_fx(torch.fx.symbolic_trace(program), (x,)).saturate(RULES).extract(
        AstSize(), validate="raise")
    assert "softmax" in opt.code and opt.meta["egraph_report"].validation.ok
    exact = program(x.double()).half()
    got = opt(x)
    assert torch.equal(torch.isinf(got), torch.isinf(exact)) and not got.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_number_a_torch_function_refuses_is_emitted_as_a_tensor(dtype):
    """``sqrt(x * x + c * c)`` with ``c`` a Python number becomes ``hypot(x, c)``, and
    ``torch.hypot`` (like ``maximum`` and ``atan2``) raises TypeError on a number: the
    extracted program failed and validation fell back (seen in the fuzzer's soaks). The
    number is now passed as a 0-d tensor of the operand's dtype."""
    import operator

    from extractors.curvature import Curvature

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    total = graph.call_function(torch.add, (graph.call_function(torch.mul, (x, x)),
                                            graph.call_function(operator.mul, (2.0, 2.0))))
    graph.output(graph.call_function(torch.sqrt, (total,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    xs = torch.randn(16, generator=torch.Generator().manual_seed(0)).to(dtype) * 1e3
    opt = EGraph.from_fx(gm, (xs,)).saturate(RULES, iter_limit=4, node_limit=3000).extract(
        Curvature())
    report = opt.meta["egraph_report"]
    assert "hypot" in report.used and report.validation.ok and not report.fell_back
    wide = xs * 10  # past float16's range for x * x, not for hypot
    got = opt(wide)
    assert got.dtype == dtype and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.double(), torch.hypot(wide.double(), torch.tensor(2.0)),
                               rtol=1e-3, atol=0)
