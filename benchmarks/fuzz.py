"""The pipeline fuzzer's soak: many seeded random programs through the whole pipeline.

    .venv/bin/python benchmarks/fuzz.py --n 10000 --seed 0 [--compile-every 10]
                                        [--export-every 10] [--train-every 10]
                                        [--half bfloat16]

Program ``i`` of seed ``s`` is ``tests/fuzzer.program(s, i, half)`` (reproducible); each goes
through ``EGraph.from_fx -> saturate(load_rules("all")) -> extract`` under every cost model
(strict validation), every ``--compile-every``-th also through ``torch.compile`` with the
``egraph`` backend, every ``--export-every``-th also through ``torch.export`` with the batch
size dynamic (a symbolic graph, judged at both batch sizes), every ``--train-every``-th
(in float32) also through training steps under ``torch.compile`` at three batch sizes in
turn, with ``dynamic=False``, ``None`` and ``True`` (paths ``train[static]``,
``train[automatic]``, ``train[dynamic]``: the outputs and the gradients of the inputs and
parameters judged), and every result is judged on fresh inputs against the source
evaluated in float64 (see ``tests/fuzzer.py``). Prints a progress line every ``--progress``
programs, each failing program with its source and errors, the counts per category, the
distinct kinds of failure with the smallest program that still shows each (a slice of the
failing one), and the total time; writes the counts and the kinds, stamped with the run
(``benchmarks/report.py``), to ``benchmarks/results/fuzz.md`` (``--out``).

Outcome categories: ``ok``; ``fallback`` (validation refused the optimised program and
the original came back, with the reason); ``clear-refusal`` (a documented clear error,
such as an emitted module asked to run on a batch size other than the one it was built
for); ``wrong`` (a result worse than the source's own against float64, elementwise, or
not finite where the source is; an output that shares the caller's input where the
source's is a new tensor, or is not contiguous where the source's is; a gradient worse
than the source's); ``crash`` (an exception: ingest, saturate, extract, run, compile, a
training step or its backward); ``invalid`` (the generated program itself does not run: a
fuzzer bug).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import fuzzer  # noqa: E402
import torch  # noqa: E402

from benchmarks.report import RunStamp, add_out_option, write_results  # noqa: E402
from egraph.logs import progress  # noqa: E402


def _failure_lines(result: fuzzer.Result) -> list[str]:
    """Each distinct failure of one program once, with the paths that showed it."""
    seen: dict[tuple, list] = {}
    for o in result.failures:
        seen.setdefault(o.key() + (o.error if o.category == "wrong" else "",), []).append(o)
    lines = []
    for group in seen.values():
        o = group[0]
        paths = sorted({g.path or "-" for g in group})
        wheres = sorted({g.where for g in group})
        lines.append(f"  {o.category.upper()} at {', '.join(wheres)} [{', '.join(paths)}]")
        lines += ["    " + line for line in o.error.splitlines()]
        if o.rewrites:
            lines.append("    rewrites: " + ", ".join(o.rewrites))
    return lines


def _kinds_report(summary: dict, shrunk: dict) -> list[str]:
    lines = []
    order = {"crash": 0, "wrong": 0, "invalid": 0, "fallback": 1, "clear-refusal": 2}
    kinds = sorted(summary["kinds"].items(), key=lambda kv: (order[kv[0][0]], -len(kv[1])))
    for n, (key, hits) in enumerate(kinds, 1):
        category, where, kind, msg = key
        programs = sorted({r.program.index for r, _ in hits})
        r, o, prog = shrunk.get(key, (*hits[0], hits[0][0].program))
        lines.append(f"### {n}. {category} at {where}: {kind} ({len(hits)} checks, "
                     f"{len(programs)} programs)")
        lines.append("")
        if msg:
            lines.append(f"    {msg}")
        lines.append(f"programs: {', '.join(map(str, programs[:20]))}"
                     f"{' ...' if len(programs) > 20 else ''}")
        if category == "clear-refusal":
            lines.append("")
            continue
        if prog is not r.program and prog.source != r.program.source:
            lines.append(f"(cut down from {r.program.label}, {len(r.program.stmts)} "
                         "statements)")
        lines += ["", "```python", prog.describe().rstrip(), "```", "",
                  f"{o.path or '-'} at {o.where}:", "", "```"]
        lines += o.error.splitlines()
        if o.rewrites:
            lines.append("rewrites: " + ", ".join(o.rewrites))
        lines.append("```")
        if o.code:
            lines += ["", "emitted:", "", "```python", o.code.strip(), "```"]
        lines.append("")
    return lines


def _worker_init() -> None:
    """A worker of ``--jobs``: one torch thread (the workers share the cores), the rules
    loaded once."""
    torch.set_num_threads(1)
    fuzzer.rules()


def _check_one(job: tuple) -> fuzzer.Result:
    """Program ``index`` of ``seed`` through :func:`fuzzer.check`, with the paths its index
    selects."""
    seed, index, half, compile_every, export_every, train_every, limits = job
    return fuzzer.check(fuzzer.program(seed, index, half), limits=limits,
                        torch_compile=compile_every > 0 and index % compile_every == 0,
                        torch_export=export_every > 0 and index % export_every == 0,
                        torch_train=train_every > 0 and index % train_every == 0)


def _checked_in_workers(work: list[tuple], jobs: int) -> Iterator[fuzzer.Result]:
    """:func:`_check_one` of each job in ``jobs`` worker processes, the results in the
    jobs' order, a few jobs ahead of the one awaited. A worker that dies (a segfault in a
    kernel, the memory exhausted) takes no result with it unseen: the jobs it left
    pending run again one at a time in fresh workers, and the one whose worker dies again
    is a crash."""
    pending: dict[int, Any] = {}
    pool = _pool(jobs)
    ahead = 4 * jobs
    try:
        for at in range(len(work)):
            for k in range(at, min(at + ahead, len(work))):
                if k not in pending:
                    pending[k] = pool.submit(_check_one, work[k])
            try:
                result = pending.pop(at).result()
            except BrokenProcessPool:
                pool.shutdown(cancel_futures=True)
                result = _alone(work[at])
                pending.clear()  # (the others ran in the broken pool: again, in a new one)
                pool = _pool(jobs)
            yield result
    finally:
        pool.shutdown(cancel_futures=True)


def _pool(jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init)


def _alone(job: tuple) -> fuzzer.Result:
    """``job`` in a worker of its own: its result, or a crash where the worker dies."""
    with _pool(1) as alone:
        try:
            return alone.submit(_check_one, job).result()
        except BrokenProcessPool as e:
            seed, index, half = job[:3]
            result = fuzzer.Result(fuzzer.program(seed, index, half))
            result.outcomes.append(fuzzer.Outcome(
                "crash", "worker", "-", f"the process checking the program died ({e})",
                "WorkerDied"))
            return result


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="programs to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first program index")
    ap.add_argument("--compile-every", type=int, default=10,
                    help="every k-th program also through torch.compile (0: never)")
    ap.add_argument("--export-every", type=int, default=10,
                    help="every k-th program also through torch.export with a dynamic batch "
                         "(0: never)")
    ap.add_argument("--train-every", type=int, default=10,
                    help="every k-th program also through training steps under torch.compile "
                         "at three batch sizes, static, automatic dynamic and dynamic (0: never)")
    ap.add_argument("--half", choices=("float16", "bfloat16"), default="float16",
                    help="the low-precision dtype of a fifth of the programs "
                         "(fuzzer.program(seed, i, half))")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes, one program each at a time (one torch thread "
                         "each when more than one; a worker that dies is a crash of its "
                         "program, and the run goes on)")
    ap.add_argument("--iter-limit", type=int, default=fuzzer.LIMITS["iter_limit"],
                    help="saturation iterations per program")
    ap.add_argument("--node-limit", type=int, default=fuzzer.LIMITS["node_limit"],
                    help="saturation e-nodes per program")
    ap.add_argument("--progress", type=int, default=100, help="a progress line every N")
    ap.add_argument("--no-shrink", action="store_true",
                    help="do not cut failing programs down to a minimal slice")
    add_out_option(ap, "fuzz")
    return ap


def _shrunk(summary: dict, limits: dict) -> dict:
    """Each kind of wrong result, crash and fallback in ``summary``: its smallest
    program, cut down further while it still shows the kind, and the cut-down
    program's own outcome."""
    shrunk: dict = {}
    for key, hits in summary["kinds"].items():
        if key[0] in ("wrong", "crash", "fallback"):
            r, o = min(hits, key=lambda h: (len(h[0].program.stmts),
                                            len(h[0].program.source)))
            costs = [c for c in fuzzer.cost_models() if c[0] == o.path]
            compile_it = o.path.startswith("torch.compile")
            export_it = o.path.startswith("export[")
            train_it = o.path.startswith("train[")
            small = fuzzer.shrink(r.program, o, costs=costs, limits=limits,
                                  torch_compile=compile_it, torch_export=export_it,
                                  torch_train=train_it)
            # the cut-down program's own failure (its error and emitted code)
            again = fuzzer.check(small, costs=costs, limits=limits,
                                 torch_compile=compile_it, torch_export=export_it,
                                 torch_train=train_it)
            o = next((o2 for o2 in again.outcomes if o2.key() == key), o)
            shrunk[key] = (r, o, small)
    return shrunk


def _document(args: argparse.Namespace, results: list, summary: dict, shrunk: dict,
              limits: dict, total: float) -> str:
    """The results document's body: the run, the counts per category, the fallback
    reasons and the distinct kinds."""

    def ran(prefix: str) -> int:
        return sum(1 for r in results for o in r.outcomes if o.path.startswith(prefix)
                   and o.category in ("ok", "fallback", "wrong"))

    lines = [
        f"{len(results)} programs (seed {args.seed}, programs {args.start}.."
        f"{args.start + args.n - 1}), "
        + (f"1 in {args.compile_every} also through torch.compile; " if args.compile_every
           else "none through torch.compile; ")
        + (f"1 in {args.export_every} also through torch.export with a dynamic batch; "
           if args.export_every else "")
        + (f"1 in {args.train_every} (float32 ones) also through training steps under "
           "torch.compile at three batch sizes (static, automatic dynamic, dynamic); "
           if args.train_every else "")
        + f"{total:.1f}s in all, {total / max(len(results), 1):.3f}s per "
        f"program; saturation limits "
        f"{limits}.", "",
        "Per program (its worst outcome) and per check (one extraction under one cost "
        "model, one torch.compile run, or one training mode, judged on fresh inputs):", "",
        "| category | programs | checks |", "|---|---:|---:|",
    ]
    lines += [f"| {c} | {summary['per_program'][c]} | {summary['per_check'][c]} |"
              for c in fuzzer.CATEGORIES]
    lines += ["", f"Cost models: {', '.join(n for n, _ in fuzzer.cost_models())}; "
              f"torch.compile checks that ran: {ran('torch.compile')}; training checks that "
              f"ran: {ran('train[')}.", ""]
    if summary["fallback_reasons"]:
        lines += ["## Fallback reasons", "", "| checks | reason |", "|---:|---|"]
        for reason, count in sorted(summary["fallback_reasons"].items(),
                                    key=lambda kv: -kv[1]):
            lines.append(f"| {count} | {reason.replace('|', '/')} |")
        lines.append("")
    lines += ["## Distinct kinds (failures, then fallbacks and clear refusals)", "",
              "Each with the smallest program of the kind, cut down further while it still "
              "shows the same kind (slices to one output, statements bypassed).", ""]
    kinds = _kinds_report(summary, shrunk)
    lines += kinds or ["None.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    limits = {**fuzzer.LIMITS, "iter_limit": args.iter_limit, "node_limit": args.node_limit}
    command = None if argv is None else [__file__, *argv]
    print(f"{RunStamp.now(command).markdown()}\n- limits: {limits}\n- cost models: "
          f"{', '.join(n for n, _ in fuzzer.cost_models())}", flush=True)
    fuzzer.rules()  # load once, outside the timings
    results: list[fuzzer.Result] = []
    t0 = time.perf_counter()
    work = [(args.seed, i, args.half, args.compile_every, args.export_every, args.train_every,
             limits) for i in range(args.start, args.start + args.n)]
    checked = map(_check_one, work) if args.jobs == 1 else _checked_in_workers(work, args.jobs)
    for result in progress(checked, total=args.n, desc="soak", unit="program"):
        prog = result.program
        results.append(result)
        if result.failures:
            print(f"\n=== {result.worst.upper()}: {prog.label} "
                  f"({result.seconds:.2f}s)", flush=True)
            print(prog.describe().rstrip())
            print("\n".join(_failure_lines(result)), flush=True)
        elif result.worst == "fallback":
            o = next(o for o in result.outcomes if o.category == "fallback")
            print(f"--- fallback: {prog.label} [{o.path}] {o.error[:300]}", flush=True)
        done = len(results)
        if done % args.progress == 0 or done == args.n:
            counts = fuzzer.summarize(results)["per_program"]
            elapsed = time.perf_counter() - t0
            print(f"[{done:>6}/{args.n}] {elapsed:7.1f}s  {elapsed / done:.3f}s/program  "
                  + "  ".join(f"{c}={counts[c]}" for c in fuzzer.CATEGORIES), flush=True)
    total = time.perf_counter() - t0
    summary = fuzzer.summarize(results)
    shrunk = {} if args.no_shrink else _shrunk(summary, limits)
    text = _document(args, results, summary, shrunk, limits, total)
    print("\n" + text + "\n")
    write_results("fuzz", "Pipeline fuzzer", text, out=args.out, argv=command)
    print(f"total {total:.1f}s ({total / max(len(results), 1):.3f}s per program)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
