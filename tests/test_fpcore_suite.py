"""A sample of Herbie's suite (FPCore, read in place) through the reader, the search and
the validation, in each benchmark's declared precision, judged against the exact reference:
the CI run of what ``benchmarks/stability/fpbench.py`` does to the whole suite."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from compiler.sampling import SamplingError, errors, sample, train_and_test
from frontends import fpcore

SUITE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "herbie-bench"
pytestmark = pytest.mark.skipif(not SUITE.is_dir(), reason="Herbie's suite is not there")

SAMPLE = 50


def _programs() -> list:
    found = []
    for path in sorted(SUITE.rglob("*.fpcore")) if SUITE.is_dir() else []:
        found += [p for p in fpcore.read_file(path) if isinstance(p, fpcore.Program)
                  and p.arguments]
    return found


def _sample(programs: list) -> list:
    """Every n-th readable benchmark with arguments: files and precisions mixed, the same
    ones on every run."""
    step = max(1, len(programs) // SAMPLE)
    return programs[::step][:SAMPLE]


PROGRAMS = _sample(_programs())


def test_the_sample_is_fifty_benchmarks_of_both_precisions():
    assert len(PROGRAMS) == SAMPLE
    assert len({p.name for p in PROGRAMS}) == SAMPLE


def _through_search(program) -> tuple | None:
    """``(errors before, errors after, FPCore of the result)`` on held-out points, after
    sampling as Herbie samples, saturating with the rule library and extracting by
    Curvature (validated against the source); None where too few points sample."""
    from egraph.egraph import EGraph
    from egraph.rules import load_rules
    from extractors import Curvature

    try:
        (train, _), (test, exact) = train_and_test(program, 16, 32)
    except SamplingError:
        return None
    gm = program.module()
    assert all(x.dtype == program.dtype for x in train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = EGraph.from_fx(gm, train, ranges=program.ranges()).saturate(
            load_rules("all"), iter_limit=2, node_limit=2_000, time_limit=20.0
        ).extract(Curvature())
    assert opt.meta["egraph_report"].validation is not None, program.name
    with torch.no_grad():
        before = errors(gm(*test), exact, program.precision)
        after = errors(opt(*test), exact, program.precision)
    try:
        text = fpcore.write_module(opt, program)
    except fpcore.UnwritableModule:
        text = None
    return before, after, text


# The e-graph entry's known regressions on this sample, all from training on 16 points
# (Herbie trains on 256): the accuracy search's (x * z) / y for (x / y) * z in "fabs
# fraction 1" (3.25 -> 0.05 bits on the training points, none of which overflows x * z; 2
# of the 32 test points do); a regime split in CirclePacking's "place" (4.6 -> 1.3 bits on
# the training points, 3.0 -> 6.2 on the test points); three more non-finite test results
# in d2DELTA-dDelta2, whose mean error drops. Whether the last two show depends on the
# search's time limits. The target is none. (Five more were test points whose
# reference had lost the bits a sum absorbed: frontends/fpcore/reference.py.)
KNOWN_WORSE = 3


def test_fifty_benchmarks_through_reader_search_and_validation():
    """Every benchmark of the sample runs through the search and the validation in its
    declared precision; the result is written back as FPCore and read again; the suite's
    mean error does not rise, and at most :data:`KNOWN_WORSE` benchmarks get worse (mean
    bits up by more than half a bit, or a new non-finite value)."""
    done, worse, written = 0, [], 0
    total_before = total_after = 0.0
    for program in PROGRAMS:
        found = _through_search(program)
        if found is None:
            continue
        before, after, text = found
        done += 1
        total_before += before.mean
        total_after += after.mean
        if after.mean > before.mean + 0.5 or after.nonfinite > before.nonfinite:
            worse.append(program.name)
        if text is not None:
            (again,) = fpcore.parse(text)
            assert again.arguments == program.arguments and again.name == program.name
            written += 1
    assert done >= 45 and written >= done - 2
    assert total_after <= total_before
    assert len(worse) <= KNOWN_WORSE, worse


def test_binary64_programs_are_judged_against_the_reals_not_float64():
    """In a float64 program float64 sees no error; the exact reference does, and the
    accuracy search (localisation included) fixes it."""
    from compiler.stability import StabilityRewriter

    (p,) = fpcore.parse("(FPCore (x) :pre (<= 1 x 1e300) (- (sqrt (+ x 1)) (sqrt x)))")
    train, _ = sample(p, 32, seed=1)
    test, exact = sample(p, 64, seed=2)
    with torch.no_grad():
        wide = p.module()(*test)
    assert errors(wide, wide, "binary64").mean == 0  # float64 against itself: no error
    before = errors(wide, exact, "binary64")
    assert before.mean > 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = StabilityRewriter().optimize(p.module(), train, ranges=p.ranges())
    with torch.no_grad():
        after = errors(fixed(*test), exact, "binary64")
    assert after.mean < 2 and after.nonfinite == 0
    report = fixed.meta["stability_report"]
    assert report.bits_before > 20 > report.bits_after


def test_local_error_of_a_float64_program_is_against_the_reals():
    from frontends.fx.error_analysis import local_error

    gm = torch.fx.symbolic_trace(lambda x: (x + 1) - x)
    x = 10 ** torch.linspace(0, 300, 16, dtype=torch.float64)
    local = local_error(gm, (x,))
    assert local["sub"].mean_bits > 40  # the difference cancels what the sum rounded away
    assert local["add"].mean_bits < 1


def test_an_exact_zero_is_decided_without_running_forever():
    (p,) = fpcore.parse("(FPCore (x y) (- (+ x y) (+ y x)))")
    assert p.reference(1e300, 1e-300) == 0.0
    assert math.isnan(p.reference(math.inf, 1.0))
