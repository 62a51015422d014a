"""Herbie's whole benchmark suite (FPCore) through both entry points, in declared precision.

Every ``(FPCore ...)`` of every file under the suite folder (Herbie's ``bench/``, read in
place from ``../shared/data/herbie-bench``) is read with :mod:`frontends.fpcore`, sampled as
Herbie samples (:mod:`compiler.sampling`: uniform over the float bit patterns inside
``:pre``'s bounds, rejection for the rest; training points for the search, separate test
points for the verdict), and run in its declared precision (binary64 unless it says
binary32) through

- ``egraph``: ``EGraph.from_fx(gm, train, ranges=...).saturate(load_rules("all"))
  .extract(Curvature())``;
- ``rewriter``: ``StabilityRewriter().optimize(gm, train, ranges=...)``;

with the precondition's bounds declared to both as ``ranges``, as Herbie is given them.
Error is Herbie's (bits between the result and the correctly rounded exact value, mpmath),
mean and worst over the test points. Where a benchmark gives an ``:alt`` (a known better
form) that reads, it is measured on the same points.

    .venv/bin/python benchmarks/stability/fpbench.py [--suite PATH] [--only TEXT]
        [--files GLOB] [--every N] [--limit N] [--train 256] [--test 1024] [--jobs 1]
        [--time-limit 60] [--out benchmarks/results/fpbench.md]

writes ``fpbench.md`` (the per-benchmark table, the per-file and suite summaries against
the issue's targets, the command, date and machine), ``fpbench.json`` (every row, with the
rewritten programs as FPCore), ``fpbench.fpcore`` (the rewritten programs) and the plot of
bits before against after (``fpbench.png``/``.svg``) beside it. Benchmarks run in parallel
over ``--jobs`` processes, each within ``--time-limit`` seconds: sampling at most a quarter
of them, then each entry point a share of what is left, its saturation and search
bounded within it (an entry point that has not answered by the end of its share leaves
the program as it was, and the row says so).

Herbie's published per-benchmark figures (its nightly reports) are not reachable from
this machine: the table has no Herbie column; :data:`benchmarks.stability.hamming.
HERBIE_BINARY64` holds the few recorded by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.report import add_out_option, markdown_table, results_path, write_results  # noqa: E402
from benchmarks.stability.hamming import improved  # noqa: E402

__all__ = ["ENTRIES", "JUDGING", "SUITE", "benchmarks", "improved", "main", "run_benchmark",
           "summarise", "worse"]

SUITE = ROOT.parent / "shared" / "data" / "herbie-bench"
"""Herbie's ``bench/`` folder, read in place."""
ENTRIES = ("egraph", "rewriter")
"""The two entry points, as the rows name them."""


def benchmarks(suite: Path = SUITE, files: str = "**/*.fpcore") -> list[tuple[str, int]]:
    """Every benchmark of the suite as ``(file relative to the suite, index in the file)``,
    in file order.

    >>> len(benchmarks()) if SUITE.is_dir() else 718
    718
    """
    from frontends import fpcore

    found = []
    for path in sorted(suite.glob(files)):
        count = len(fpcore.read_file(path))
        found += [(path.relative_to(suite).as_posix(), i) for i in range(count)]
    return found


JUDGING = 2.0
"""Seconds of a benchmark's limit kept for judging the results and writing them."""


class _OutOfTime(BaseException):
    """The time limit: not an Exception, so the engine's guards against failing ops
    (``except Exception``) let it through."""


def _alarm(signum, frame):
    raise _OutOfTime


def _run_entry(entry: str, gm, train, ranges, seconds: float):
    """One entry point within about ``seconds``: saturation an eighth of them and the
    accuracy search 70% (the e-graph), or each 40% (the rewriter, whose limit bounds
    both; saturation takes far less on a formula), the rest for validation."""
    from compiler.stability import StabilityRewriter
    from egraph.egraph import EGraph
    from egraph.rules import load_rules
    from extractors import Curvature

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if entry == "egraph":
            return EGraph.from_fx(gm, train, ranges=ranges).saturate(
                load_rules("all"), iter_limit=8, node_limit=20_000,
                time_limit=max(0.5, seconds / 8)).extract(
                    Curvature(), time_limit=max(1.0, 0.7 * seconds))
        return StabilityRewriter(time_limit=max(1.0, 0.4 * seconds)).optimize(
            gm, train, ranges=ranges)


def run_benchmark(suite: Path, file: str, index: int, train: int = 256, test: int = 1024,
                  seconds: float = 60.0) -> dict:
    """One benchmark through both entry points (see the module docstring): its row.

    >>> row = run_benchmark(SUITE, "tutorial.fpcore", 0, train=32, test=64, seconds=30
    ...                     ) if SUITE.is_dir() else {"ran": True}
    >>> row["ran"]
    True
    """
    from compiler.sampling import SamplingError, errors, train_and_test
    from frontends import fpcore

    start = time.perf_counter()
    item = fpcore.read_file(suite / file)[index]
    row: dict = {"file": file, "index": index, "parsed": False, "ran": False, "reason": ""}
    if isinstance(item, fpcore.FPCoreError):
        row.update(benchmark=item.benchmark or f"#{index + 1}", reason=item.problem)
        return row
    program = item
    row.update(benchmark=program.name, parsed=True, precision=program.precision,
               arguments=len(program.arguments))
    torch.manual_seed(0)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds / 4))
    try:
        (xs, _), (tests, exact) = train_and_test(program, train, test)
    except SamplingError as err:
        row["reason"] = f"not sampled: {err}"
        return row
    except _OutOfTime:
        row["reason"] = f"not sampled within {seconds / 4:.0f} s (the exact reference)"
        return row
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    gm = program.module()
    with torch.no_grad():
        source = errors(gm(*tests), exact, program.precision)
    row.update(ran=True, bits_before=source.mean, worst_before=source.worst,
               nonfinite_before=source.nonfinite)
    deadline = start + seconds - JUDGING
    for k, entry in enumerate(ENTRIES):  # (each shares what is left of the deadline)
        share = (deadline - time.perf_counter()) / (len(ENTRIES) - k)
        row.update(_entry(entry, program, gm, xs, tests, exact, share))
    alt = next((a for a in program.alternatives if not isinstance(a, fpcore.FPCoreError)),
               None)
    if alt is not None:
        try:
            with torch.no_grad():
                row["bits_alt"] = errors(program.with_body(alt).module()(*tests), exact,
                                         program.precision).mean
        except Exception:  # noqa: BLE001 - an alternative that does not run has no figure
            pass
    row["seconds"] = time.perf_counter() - start
    return row


def _entry(entry: str, program, gm, train, tests, exact, seconds: float) -> dict:
    """One entry point on one benchmark, within ``seconds``: the row's columns of that
    entry (error after, non-finite results, time, what went wrong, the program as FPCore).
    """
    from compiler.sampling import errors
    from frontends import fpcore

    began = time.perf_counter()
    result, note = gm, ""
    if program.arguments:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
        try:
            result = _run_entry(entry, gm, train, program.ranges(), seconds)
        except _OutOfTime:
            note = "out of time: the program as it was"
        except Exception as err:  # noqa: BLE001 - a failure is a row, not a crash
            note = f"failed ({type(err).__name__}: {str(err)[:120]}): the program as it was"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    with torch.no_grad():
        after = errors(result(*tests), exact, program.precision)
    try:
        rewritten = fpcore.write_module(result, program)
    except (fpcore.UnwritableModule, KeyError, ValueError) as err:
        rewritten = f"; not written as FPCore: {err}"
    return {f"bits_{entry}": after.mean, f"worst_{entry}": after.worst,
            f"nonfinite_{entry}": after.nonfinite,
            f"seconds_{entry}": time.perf_counter() - began, f"note_{entry}": note,
            f"fpcore_{entry}": rewritten}


def worse(row: dict, entry: str) -> bool:
    """Mean bits up by more than 0.5, or a new non-finite result where the truth is finite.

    >>> worse({"bits_before": 1.0, "nonfinite_before": 0, "bits_rewriter": 1.2,
    ...        "nonfinite_rewriter": 1}, "rewriter")
    True
    """
    return (row[f"bits_{entry}"] > row["bits_before"] + 0.5
            or row[f"nonfinite_{entry}"] > row["nonfinite_before"])


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def summarise(rows: list[dict]) -> dict:
    """The suite's figures against the issue's targets.

    >>> s = summarise([{"parsed": True, "ran": True, "bits_before": 4.0, "nonfinite_before": 0,
    ...                 **{f"{k}_{e}": v for e in ENTRIES for k, v in (
    ...                     ("bits", 1.0), ("nonfinite", 0), ("seconds", 2.0))}}])
    >>> s["ran"], s["improved_egraph"], s["drop_rewriter"]
    (1, 1, 0.75)
    """
    ran = [r for r in rows if r["ran"]]
    hard = [r for r in ran if r["bits_before"] >= 2]
    out = {"benchmarks": len(rows), "parsed": sum(r["parsed"] for r in rows), "ran": len(ran),
           "crashed": sum(r.get("reason", "").startswith("crashed") for r in rows),
           "hard": len(hard), "bits_before": _mean(r["bits_before"] for r in ran),
           "most_seconds": max((r.get("seconds", 0.0) for r in ran), default=0.0),
           "seconds": sum(r.get("seconds", 0.0) for r in rows)}
    with_alt = [r for r in ran if r.get("bits_alt") is not None
                and not math.isnan(r["bits_alt"])]
    out["alt"], out["bits_alt"] = len(with_alt), _mean(r["bits_alt"] for r in with_alt)
    out["bits_before_alt"] = _mean(r["bits_before"] for r in with_alt)
    for e in ENTRIES:
        out[f"bits_{e}"] = _mean(r[f"bits_{e}"] for r in ran)
        out[f"improved_{e}"] = sum(improved(r, e) for r in hard)
        out[f"worse_{e}"] = sum(worse(r, e) for r in ran)
        out[f"drop_{e}"] = (1 - out[f"bits_{e}"] / out["bits_before"]
                            if out["bits_before"] else 0.0)
        out[f"bits_{e}_alt"] = _mean(r[f"bits_{e}"] for r in with_alt)
        out[f"as_alt_{e}"] = sum(r[f"bits_{e}"] <= r["bits_alt"] + 0.5 for r in with_alt)
    return out


def _targets(s: dict) -> str:
    def share(k, n):
        return f"{k} of {n} ({100 * k / n:.0f}%)" if n else "0 of 0"

    lines = [f"- parsed and ran: {share(s['ran'], s['benchmarks'])} (target 90%); "
             f"parsed {s['parsed']}; crashed {s['crashed']} (target 0)",
             f"- with at least 2 bits of mean error before: {s['hard']}"]
    for e in ENTRIES:
        lines.append(f"- {e}: improved by >= 1 bit {share(s[f'improved_{e}'], s['hard'])} "
                     f"(target 75%); worse {s[f'worse_{e}']} (target 0); suite mean "
                     f"{s['bits_before']:.2f} -> {s[f'bits_{e}']:.2f} bits, a drop of "
                     f"{100 * s[f'drop_{e}']:.0f}% (target 60%)")
    if s["alt"]:
        lines.append(
            f"- the {s['alt']} that give an `:alt` (a known better form, the target "
            f"Herbie's developers set): source {s['bits_before_alt']:.2f}, alt "
            f"{s['bits_alt']:.2f}, " + ", ".join(
                f"{e} {s[f'bits_{e}_alt']:.2f} bits (within 0.5 bits of the alt or better "
                f"on {s[f'as_alt_{e}']})" for e in ENTRIES))
    lines.append(f"- time: longest benchmark {s['most_seconds']:.1f} s (target 60 s); "
                 f"all benchmarks {s['seconds'] / 60:.1f} min of process time")
    return "\n".join(lines)


_COLUMNS = ["benchmark", "file", "precision", "bits_before", "bits_egraph", "bits_rewriter",
            "bits_alt", "worst_before", "worst_egraph", "worst_rewriter", "nonfinite",
            "seconds", "reason"]


def _table_row(r: dict) -> dict:
    nonfinite = (f"{r['nonfinite_before']}/{r['nonfinite_egraph']}/{r['nonfinite_rewriter']}"
                 if r["ran"] else "")
    notes = "; ".join(f"{e}: {r[f'note_{e}']}" for e in ENTRIES if r.get(f"note_{e}"))
    return {**{c: r.get(c, "") for c in _COLUMNS}, "benchmark": r["benchmark"].replace(
        "|", "/"), "nonfinite": nonfinite, "reason": (r["reason"] or notes).replace("|", "/")}


def report(rows: list[dict], out: Path | None) -> Path:
    """Write the results document, the rows, the rewritten programs and the plot."""
    path = Path(out) if out is not None else results_path("fpbench")
    path.parent.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[dict]] = {}
    for r in rows:
        files.setdefault(r["file"], []).append(r)
    per_file = []
    for name, group in files.items():
        s = summarise(group)
        per_file.append({"file": name, "benchmarks": s["benchmarks"], "ran": s["ran"],
                         "bits_before": s["bits_before"], "bits_egraph": s["bits_egraph"],
                         "bits_rewriter": s["bits_rewriter"], "hard": s["hard"],
                         "improved_egraph": s["improved_egraph"],
                         "improved_rewriter": s["improved_rewriter"],
                         "worse_egraph": s["worse_egraph"],
                         "worse_rewriter": s["worse_rewriter"]})
    suite = summarise(rows)
    body = "\n\n".join([
        "## The suite against the issue's targets", _targets(suite),
        "## Per file", markdown_table(per_file, list(per_file[0]) if per_file else ["file"],
                                      ".2f"),
        "## Per benchmark (bits of error on the test points; non-finite before/egraph/"
        "rewriter; the rewritten programs are in fpbench.fpcore and fpbench.json)",
        markdown_table([_table_row(r) for r in rows], _COLUMNS, ".2f"),
        "Herbie's published per-benchmark figures (its nightly reports) are not reachable "
        "from this machine, so they are not compared here."])
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    programs = [f"; {r['file']}: {r['benchmark']} ({e})\n{r[f'fpcore_{e}']}\n"
                for r in rows if r["ran"] for e in ENTRIES]
    path.with_suffix(".fpcore").write_text("\n".join(programs))
    plots = _plot(rows, path)
    return write_results("fpbench", "Herbie's suite (FPCore) through both entry points",
                         body, out=path, plots=plots)


def _plot(rows: list[dict], path: Path) -> list[Path]:
    try:
        from compiler import charts
    except ImportError:
        return []
    ran = [r for r in rows if r["ran"]]
    if not ran:
        return []
    axes = charts.panels(len(ENTRIES), size=(5.0, 5.0))
    for ax, e in zip(axes, ENTRIES):
        before = [r["bits_before"] for r in ran]
        ax.scatter(before, [r[f"bits_{e}"] for r in ran], s=10, alpha=0.5)
        top = max(max(before), 1.0)
        ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
        ax.set_xlabel("mean bits of error before")
        ax.set_ylabel(f"after ({e})")
        ax.set_title(f"{e}: {len(ran)} benchmarks")
    return charts.save(axes[0].figure, path.with_suffix(".png"), path.with_suffix(".svg"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--only", default="", help="benchmarks whose file or name has this")
    parser.add_argument("--files", default="**/*.fpcore", help="a glob under the suite")
    parser.add_argument("--limit", type=int, default=0, help="at most this many benchmarks")
    parser.add_argument("--every", type=int, default=1,
                        help="every n-th benchmark of the suite: a sample across its files")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--test", type=int, default=1024)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0)
    add_out_option(parser, "fpbench")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = [b for b in benchmarks(args.suite, args.files) if args.only in b[0]]
    chosen = chosen[:: args.every]
    chosen = chosen[: args.limit] if args.limit else chosen
    work = [(args.suite, f, i, args.train, args.test, args.time_limit) for f, i in chosen]
    rows = []
    # multiprocessing's pool, not concurrent.futures': a ProcessPoolExecutor with
    # max_tasks_per_child never replaces the worker that retires while tasks are queued
    # (CPython gh-115634, Python 3.11 to 3.13), and the run hangs after 20 benchmarks
    with multiprocessing.Pool(args.jobs, maxtasksperchild=20) as pool:
        for row in pool.imap(_run, work):
            rows.append(row)
            shown = (f"{row['bits_before']:6.2f} -> {row['bits_egraph']:6.2f} / "
                     f"{row['bits_rewriter']:6.2f}" if row["ran"] else row["reason"][:60])
            print(f"[{len(rows)}/{len(work)}] {row['file']}: {row['benchmark'][:50]}: {shown}",
                  flush=True)
    report(rows, args.out)
    print(_targets(summarise(rows)))


def _run(job) -> dict:
    """:func:`run_benchmark`, or a row that names the exception where it raised (the
    suite goes on, and the summary counts it)."""
    torch.set_num_threads(1)
    try:
        return run_benchmark(*job)
    except Exception as error:  # noqa: BLE001 - one benchmark's crash is its row, not the run's
        _, file, index, *_ = job
        return {"file": file, "index": index, "parsed": False, "ran": False,
                "benchmark": f"#{index + 1}", "reason": f"crashed: {type(error).__name__}: "
                                                        f"{str(error)[:200]}"}


if __name__ == "__main__":
    main()
