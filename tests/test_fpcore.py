"""The FPCore reader: programs, their modules and references, the precondition, bad input,
and Herbie's whole suite read without a crash."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from frontends import fpcore

SUITE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "herbie-bench"
needs_suite = pytest.mark.skipif(not SUITE.is_dir(), reason="Herbie's suite is not there")


def test_program_fields_and_module():
    (p,) = fpcore.parse("""
        (FPCore (x y)
         :name "hypot-ish"
         :precision binary32
         :pre (and (<= 0 x 10) (<= 1e-3 y 1))
         (let* ([a (* x x)] [b (+ a (* y y))]) (sqrt b)))""")
    assert (p.name, p.arguments, p.precision) == ("hypot-ish", ("x", "y"), "binary32")
    assert p.pre.ranges == {"x": (0.0, 10.0), "y": (1e-3, 1.0)} and p.pre.is_ranges
    x, y = torch.tensor([3.0, 0.5]), torch.tensor([1.0, 0.25])
    out = p.module()(x, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.sqrt(x * x + y * y))
    assert p.reference(3.0, 1.0) == pytest.approx(math.sqrt(10), rel=1e-7)


def test_default_precision_is_binary64_and_constants_fold():
    (p,) = fpcore.parse("(FPCore (x) (* x (/ PI 2)))")
    assert p.precision == "binary64"
    gm = p.module()
    assert gm(torch.tensor([2.0], dtype=torch.float64)).item() == math.pi
    assert "1.5707963267948966" in gm.code  # PI / 2 folded exactly, rounded once


def test_racket_exponent_markers_read_as_herbie_reads_them():
    # graphics/pbrt.fpcore writes 0.6931f0 (Racket's single-float marker, a double there)
    (p,) = fpcore.parse("(FPCore (x) (+ x 0.6931f0))")
    assert p.module()(torch.tensor([0.0], dtype=torch.float64)).item() == 0.6931


def test_if_is_where_and_fmax_ignores_nan():
    (p,) = fpcore.parse("(FPCore (x y) (if (< x 0) (fmax x y) (fmin x y)))")
    gm = p.module()
    assert "torch.where" in gm.code and "torch.fmax" in gm.code
    nan = float("nan")
    x = torch.tensor([-1.0, -1.0, 2.0], dtype=torch.float64)
    y = torch.tensor([nan, -3.0, nan], dtype=torch.float64)
    assert gm(x, y).tolist() == [-1.0, -1.0, 2.0]


def test_reference_decides_the_rounding():
    (p,) = fpcore.parse("(FPCore (x) (- (+ x 1) x))")
    assert p.reference(1e300) == 1.0  # float64 itself says 0
    x = torch.tensor([1e300, 3.0], dtype=torch.float64)
    assert p.module()(x).tolist() == [0.0, 1.0]
    assert p.reference(x).tolist() == [1.0, 1.0]
    (q,) = fpcore.parse("(FPCore (x) (sqrt x))")
    assert math.isnan(q.reference(-1.0))  # outside the reals


def test_an_unbounded_input_is_drawn_over_every_float_of_both_signs():
    # an offset past 2^63 ordinals wrapped in int64: every positive draw of an input with
    # no precondition came out as 2.2e-308, and "sqrt times" sampled no point at all
    from compiler.sampling import sample

    (p,) = fpcore.parse("(FPCore (x y) (* (sqrt (- x 1)) y))")
    (x, y), exact = sample(p, 400, seed=0)
    assert bool((x >= 1).all()) and bool(torch.isfinite(exact).all())
    assert x.unique().numel() == 400 and bool((x > 1e200).any() and (x < 1e10).any())
    assert bool((y > 1e-200).any() and (y < -1e-200).any())
    assert 0.3 < float((y > 0).double().mean()) < 0.7


def test_a_sum_that_absorbs_more_bits_than_any_precision_tried_is_not_doubled_for(
        monkeypatch):
    # Hamming's expq2 at x = 1e300: exp(x) - 1 absorbs the 1 past 4,096 bits, so no
    # precision here keeps it; evaluating up to 4,096 bits took 0.2 s a point and left the
    # suite's expq2 unsampled within its time
    from frontends.fpcore import reference

    calls = []
    evaluate = reference.evaluate
    monkeypatch.setattr(reference, "evaluate",
                        lambda e, *a: calls.append(e) or evaluate(e, *a))
    (p,) = fpcore.parse("(FPCore (x) (/ (exp x) (- (exp x) 1)))")
    assert p.reference(1e300) == 1.0 and calls.count(p.body) == 2  # two precisions agree
    (q,) = fpcore.parse("(FPCore (x) (- (+ x 1) x))")
    assert q.reference(1e300) == 1.0 and calls.count(q.body) > 2  # 997 bits: doubled past


def test_a_comparison_no_precision_decides_is_not_guessed():
    # Kahan's Monster (Herbie's numerics/great-debate.fpcore): z is exactly 0 over the
    # reals, so the truth is 1; at every working precision z is a rounding error above 0
    # and the else branch gave 0, scored as the truth
    (monster,) = fpcore.parse("""(FPCore (y) :pre (<= 1 y 9999)
      (let ([Qx (- (fabs (- y (sqrt (+ (* y y) 1)))) (/ 1 (+ y (sqrt (+ (* y y) 1)))))])
        (let ([z (* Qx Qx)]) (if (== z 0) 1 (/ (- (exp z) 1) z)))))""")
    assert all(math.isnan(monster.reference(y)) for y in (1.0, 7.0, 333.0))
    from compiler.sampling import SamplingError, sample
    with pytest.raises(SamplingError, match="comparison no precision decides"):
        sample(monster, 8, seed=0, batches=2)
    # comparisons that precision does decide keep their branch: tiny, exact and close
    (p,) = fpcore.parse("(FPCore (x y) (if (< (- x y) 1e-300) (- x y) (/ x y)))")
    assert p.reference(1.0, 1.0) == 0.0
    assert p.reference(1.0 + 2**-52, 1.0) == 1.0 + 2**-52
    assert p.reference(-3.0, 1e-310) == -3.0 - 1e-310


def test_binary32_fma_and_cbrt_run_through_float64():
    (p,) = fpcore.parse("(FPCore (x y z) :precision binary32 (fma x y z))")
    x = torch.tensor([1 + 2 ** -12], dtype=torch.float32)
    z = torch.tensor([-(1 + 2 ** -11)], dtype=torch.float32)
    # x * x - z: the product's last bit (2^-24) survives only in a fused multiply-add
    assert p.module()(x, x, z).item() == 2.0 ** -24
    (c,) = fpcore.parse("(FPCore (x) :precision binary32 (cbrt x))")
    assert c.module()(torch.tensor([-27.0])).item() == -3.0


def test_calls_of_other_fpcores_are_inlined():
    a, b = fpcore.parse("(FPCore sq (x) (* x x)) (FPCore (y) (+ (sq y) 1))")
    assert b.module()(torch.tensor([3.0], dtype=torch.float64)).item() == 10.0


def test_precondition_predicate_and_disjunction():
    (p,) = fpcore.parse("(FPCore (x y) :pre (and (or (== x 0) (<= 1 x 2)) (< x y)) y)")
    assert p.pre.intervals == {"x": ((0.0, 0.0), (1.0, 2.0))}
    assert not p.pre.is_ranges
    ok = p.pre(torch.tensor([0.0, 1.5, 1.5]), torch.tensor([1.0, 1.0, 2.0]))
    assert ok.tolist() == [True, False, True]


@pytest.mark.parametrize("text, problem, position", [
    ("(FPCore (x) (+ x 1)", "'(' is never closed", (1, 1)),
    ("(FPCore (x) (+ x 1)))", "unexpected ')': nothing is open", (1, 21)),
    ("(FPCore (x)\n  :name \"bad op\"\n  (sqr x))", "unknown operator 'sqr'", (3, 4)),
    ("(FPCore (x) :name \"arity\" (sqrt x x))", "'sqrt' takes 1 argument, got 2", (1, 27)),
    ("(FPCore (x) :name \"free\" (+ x y))", "undefined variable 'y'", (1, 31)),
    ("(FPCore (x) :name \"let\" (let ([a 1]) (+ a b)))", "undefined variable 'b'", (1, 43)),
])
def test_malformed_input_names_benchmark_position_and_problem(text, problem, position):
    with pytest.raises(fpcore.MalformedFPCore) as info:
        fpcore.parse(text)
    err = info.value
    assert (err.problem, err.position) == (problem, position)
    if ":name" in text:
        assert err.benchmark == text.split('"')[1] and err.benchmark in str(err)


@pytest.mark.parametrize("text, construct", [
    ("(FPCore (x) (while (< x 1) ([x x (+ x 1)]) x))", "while"),
    ("(FPCore ((v 2)) (ref v 0))", "tensor"),
    ("(FPCore (x) (tgamma x))", "tgamma"),
    ("(FPCore (x) (cbrt x))", "cbrt in binary64"),
    ("(FPCore (x) :precision binary16 x)", "binary16"),
])
def test_unsupported_constructs_are_refused_with_the_reason(text, construct):
    with pytest.raises(fpcore.UnsupportedFPCore, match=construct):
        fpcore.parse(text)


def test_read_keeps_going_past_a_bad_benchmark():
    found = fpcore.read('(FPCore (x) :name "a" (tgamma x)) (FPCore (x) :name "b" x)')
    assert isinstance(found[0], fpcore.UnsupportedFPCore) and found[0].benchmark == "a"
    assert isinstance(found[1], fpcore.Program) and found[1].name == "b"


def test_writer_round_trip():
    (p,) = fpcore.parse("""(FPCore (x.re eps) :name "w" :pre (< 0 eps 1)
        (let ([a (- (exp x.re) 1)]) (if (> a eps) (/ a eps) (log1p (* a a)))))""")
    text = fpcore.write_program(p)
    (again,) = fpcore.parse(text)
    assert (again.name, again.arguments, again.precision) == (p.name, p.arguments,
                                                              p.precision)
    xs = (torch.linspace(-3, 3, 9, dtype=torch.float64), torch.full((9,), 0.5,
                                                                    dtype=torch.float64))
    torch.testing.assert_close(again.module()(*xs), p.module()(*xs))
    (back,) = fpcore.parse(fpcore.write_module(p.module(), p))
    torch.testing.assert_close(back.module()(*xs), p.module()(*xs))


def test_writer_says_a_sum_with_a_scaled_operand():
    """Emission fuses ``x + z * 0.062`` into ``torch.add(x, z, alpha=0.062)``, which lowers
    to a call inside a call; the writer once refused it (four of the suite sample's fifty
    results, "Kalman filter per P" among them)."""
    (p,) = fpcore.parse("(FPCore (x z) :name \"scaled\" (+ x (* z 0.0625)))")
    gm = torch.fx.symbolic_trace(lambda x, z: torch.add(x, z, alpha=0.0625))
    text = fpcore.write_module(gm, p)
    assert "(* z 0.0625)" in text
    (back,) = fpcore.parse(text)
    xs = (torch.linspace(-3, 3, 9, dtype=torch.float64), torch.linspace(1, 2, 9,
                                                                      dtype=torch.float64))
    torch.testing.assert_close(back.module()(*xs), p.module()(*xs))


@needs_suite
def test_whole_suite_reads_without_a_crash():
    read, refused = 0, []
    for path in sorted(SUITE.rglob("*.fpcore")):
        for item in fpcore.read_file(path):
            if isinstance(item, fpcore.FPCoreError):
                assert item.benchmark and item.problem
                refused.append(item)
            else:
                read += 1
    assert read + len(refused) == 718
    assert read >= 0.9 * 718, [str(e) for e in refused]


def test_a_negative_base_to_a_huge_integer_power_is_infinite_with_the_parity_sign():
    # regression.fpcore's (pow l (exp w)): exp(w) a float past 2^1000, int() of which has
    # more digits than memory; the whole suite's run died on it
    (program,) = fpcore.parse("(FPCore (x y) (pow x y))")
    assert program.reference(-2.0, 1e300) == math.inf
    assert program.reference(-2.0, 2000001.0) == -math.inf
    assert program.reference(-2.0, 2000000.0) == math.inf
    assert program.reference(-0.5, 2000001.0) == 0.0
    from compiler.sampling import train_and_test

    (program,) = fpcore.parse("(FPCore (w l) (* (exp (- w)) (pow l (exp w))))")
    (_, _), (_, exact) = train_and_test(program, 16, 64)
    assert len(exact) == 64


def test_the_remainder_of_a_number_far_past_the_divisor_is_unknown_not_a_crash():
    # regression.fpcore's expfmod, (fmod (exp x) (sqrt (cos x))): exp(x) for x near 1e300
    # lies 2^(1e300) above the divisor, and mpmath's fmod shifted its digits that far
    # ("too many digits in integer"); the whole suite's run lost the benchmark to it
    (program,) = fpcore.parse("(FPCore (x y) (fmod (exp x) y))")
    assert math.isnan(program.reference(1e300, 0.5))
    assert program.reference(math.log(10.0), 3.0) == pytest.approx(1.0)
    (program,) = fpcore.parse("(FPCore (x) (* (fmod (exp x) (sqrt (cos x))) (exp (- x))))")
    from compiler.sampling import train_and_test

    (_, _), (_, exact) = train_and_test(program, 16, 64)
    assert len(exact) == 64


def test_the_modules_exact_value_is_the_fpcore_reference():
    # Herbie's libraries/jmatjs.fpcore, Jmat.Real.erf: near x = 0 the result is the
    # 1e-9 its written coefficients miss 1 by, which their float64 roundings change in
    # the eighth digit; the module's exact value reads them as written, as FPCore does
    from compiler.sampling import sample
    from frontends.fx.exact import exact_outputs

    (program,) = fpcore.parse(
        "(FPCore (x) (let ((x* (fabs x))) (let ((t (/ 1 (+ 1 (* 0.3275911 x*)))))"
        " (let ((p (* t (+ 0.254829592 (* t (+ -0.284496736 (* t (+ 1.421413741"
        " (* t (+ -1.453152027 (* t 1.061405429)))))))))))"
        " (- 1 (* p (exp (- (* x* x*)))))))))")
    (x,), _ = sample(program, 64, seed=1)
    x = torch.cat([x, torch.tensor([0.0, 1e-300, 1e-12], dtype=x.dtype)])
    (graph,) = exact_outputs(program.module(), (x,))
    assert torch.equal(graph, program.reference(x))
