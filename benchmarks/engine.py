"""Engine benchmark: egg's math suite and a growth run, ours against the Rust-backed peers.

Runs, in one process and one run: every case of egg's math suite (the cases each peer can
express) on this engine, on ``snake-egg`` and on ``egglog``, with the same rules, scheduler
and limits; then a growth run that saturates until 1,000,000 e-nodes. Prints a table with
time per case, e-nodes, e-classes and our-time / peer-time ratios, then e-nodes added per
second and bytes of process memory per e-node at the growth run's size.

    .venv/bin/python benchmarks/engine.py [--growth-nodes 1000000] [--repeat 3]

``--search-scaling`` instead times one nested pattern, ``(f (h ?x))``, on e-graphs whose
child classes hold from 1 to 10,000 e-nodes of other operators around the one ``h`` it
needs, then with more and more matches: search time should follow the matches, not the
class sizes. ``--lambda`` times egg's lambda-calculus suite against egg's time limits.

Install the peers with ``bash scripts/setup_env.sh bench``. A peer that is not installed is
reported as missing, not silently skipped.

What it prints is written, stamped with the run (``benchmarks/report.py``), to
benchmarks/results/engine.md (``engine_search_scaling.md`` with ``--search-scaling``,
``engine_lambda.md`` with ``--lambda``; ``--out``: another path).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peers import egglog_math, snake_egg_math  # noqa: E402
from benchmarks.peers.math_cases import GROWTH_ITER_LIMIT, GROWTH_RULES, GROWTH_START  # noqa: E402
from benchmarks.report import Transcript, add_out_option, write_results  # noqa: E402
from egraph import EGraph, Pattern, SimpleScheduler, parse  # noqa: E402
from egraph.examples import lambda_calc  # noqa: E402
from egraph.examples.math import CASES, rules  # noqa: E402

PEERS = {"snake-egg": snake_egg_math, "egglog": egglog_math}


def run_ours(name: str, stop_at_goals: bool) -> dict:
    """One case of the math suite on this engine, stopping at the goals or at the limits."""
    case = dataclasses.replace(CASES[name], stop_at_goals=stop_at_goals)
    start = time.perf_counter()
    eg = case.run()
    elapsed = time.perf_counter() - start
    proved = all(eg.equiv(eg.roots[0], g) for g in case.goals)
    return {"time_s": elapsed, "nodes": eg.hashcons_size, "classes": eg.num_classes,
            "proved": proved, "stop_reason": eg.report.stop_reason}


def median_run(fn, repeat: int) -> dict:
    """The run with the median time of ``repeat`` runs (sizes are the same each time)."""
    results = sorted((fn() for _ in range(repeat)), key=lambda r: r["time_s"])
    return results[len(results) // 2]


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def growth_ours(target: int) -> dict:
    """Saturate the growth workload until ``target`` e-nodes; time and process memory."""
    chosen = [r for r in rules() if r.name in GROWTH_RULES]
    gc.collect()
    eg = EGraph()
    eg.add(parse(GROWTH_START), root=True)
    before = eg.hashcons_size
    start = time.perf_counter()
    eg.saturate(chosen, iter_limit=GROWTH_ITER_LIMIT, node_limit=target, time_limit=600.0,
                scheduler=SimpleScheduler())
    elapsed = time.perf_counter() - start
    gc.collect()
    nodes = eg.hashcons_size
    return {"time_s": elapsed, "nodes": nodes, "classes": eg.num_classes,
            "nodes_per_s": (nodes - before) / elapsed, "bytes_per_node": rss_bytes() / nodes,
            "stop_reason": eg.report.stop_reason}


def _growth_in_subprocess(target: int) -> dict:
    """The growth run in a fresh interpreter, so its memory figure is its own."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); "
        f"from benchmarks.engine import growth_ours; print(json.dumps(growth_ours({target})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def large_class_egraph(parents: int, class_size: int, hits: int) -> EGraph:
    """``parents`` e-nodes ``(f c)``, each child class ``c`` holding ``class_size`` leaves
    and ``hits`` e-nodes ``(h leaf)``: ``(f (h ?x))`` has ``parents * hits`` matches."""
    eg = EGraph()
    for p in range(parents):
        child = eg.add(f"(h x{p}_0)")
        for j in range(1, hits):
            eg.union(child, eg.add(f"(h x{p}_{j})"))
        for j in range(class_size - hits):
            eg.union(child, eg.add(f"s{p}_{j}"))
        eg.add_node("f", [child])
    eg.rebuild()
    return eg


def search_scaling(repeat: int) -> None:
    """Time ``(f (h ?x))`` as class sizes grow (matches fixed), then as matches grow."""
    pattern = Pattern.of("(f (h ?x))")

    def timed(eg: EGraph, cold: bool) -> tuple[float, int]:
        times = []
        for _ in range(repeat):
            if cold:  # as after a rebuild that changed every class: the index is rebuilt
                eg.compact()
            start = time.perf_counter()
            found = pattern.search_tuples(eg)
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2], len(found)

    parents = 200
    print(f"search (f (h ?x)): {parents} parents, median of {repeat}; 'first' is the first "
          "search after every class changed (the op index is built inside its time)")
    print(f"{'child class e-nodes':>20}{'matches':>10}{'search ms':>11}{'us/match':>10}"
          f"{'first ms':>10}")
    for size, hits in ((1, 1), (10, 1), (100, 1), (1_000, 1), (10_000, 1),
                       (10_000, 10), (10_000, 100), (10_000, 1_000)):
        eg = large_class_egraph(parents, size, hits)
        gc.collect()  # the collector's pass over the new e-graph is not the search's
        first, _ = timed(eg, cold=True)
        elapsed, found = timed(eg, cold=False)
        print(f"{size:>20,}{found:>10,}{elapsed * 1e3:>11.3f}{elapsed * 1e6 / found:>10.2f}"
              f"{first * 1e3:>10.2f}")


def lambda_suite(repeat: int) -> None:
    """egg's lambda suite: time per case against egg's time limit, and whether it proved
    what egg proves (the three capture/scoping cases must stay unproven)."""
    print(f"{'case':<28}{'s (median of ' + str(repeat) + ')':>18}{'egg limit s':>12}  ok")
    for case in lambda_calc.CASES.values():
        runs = []
        for _ in range(repeat):
            start = time.perf_counter()
            eg = case.run(time_limit=600.0)
            runs.append((time.perf_counter() - start, eg))
        elapsed, eg = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        ok = lambda_calc.proved(eg, case) == case.proves
        print(f"{case.name:<28}{elapsed:>18.3f}{case.time_limit:>12.1f}  {'y' if ok else 'n'}")


def fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def against_peers(repeat: int, growth_nodes: int | None) -> None:
    """egg's math suite on this engine and on each installed peer, then (unless
    ``growth_nodes`` is None) the growth run to that many e-nodes."""
    available = {name: mod for name, mod in PEERS.items() if mod.AVAILABLE}
    for name in PEERS:
        if name not in available:
            print(f"peer {name} is not installed: bash scripts/setup_env.sh bench")
    # egglog stops once the goals are proven, as egg's tests do; snake-egg cannot (its run()
    # has no hooks), so it is compared with our engine running to the same limits.
    stops = {"egglog": True, "snake-egg": False}
    print(f"{'case':<22}{'ours->goal s':>13}{'ours->limit s':>14}"
          + "".join(f"{name + ' s':>14}{'ratio':>7}" for name in available)
          + f"{'  proved (ours/' + '/'.join(available) + ')'}")
    sums: dict[str, list[float]] = {name: [0.0, 0.0] for name in available}
    for case in CASES.values():
        ours = {flag: median_run(lambda c=case.name, f=flag: run_ours(c, f), repeat)
                for flag in (True, False)}
        line = (f"{case.name:<22}{ours[True]['time_s']:>13.4f}{ours[False]['time_s']:>14.4f}")
        proved = ["y" if ours[True]["proved"] else "n"]
        for name, mod in available.items():
            if case.name not in mod.CASES_SUPPORTED:
                line += f"{'n/a':>14}{'':>7}"
                proved.append("-")
                continue
            peer = median_run(lambda mod=mod, case=case: mod.run_case(
                case.start, case.goal_texts, case.iter_limit, case.node_limit,
                case.time_limit, add_goals_first=case.add_goals_first), repeat)
            mine = ours[stops[name]]["time_s"]
            sums[name][0] += mine
            sums[name][1] += peer["time_s"]
            line += f"{peer['time_s']:>14.4f}{mine / peer['time_s']:>7.2f}"
            proved.append("y" if peer["proved"] else "n")
        print(line + "  " + "/".join(proved))
    print()
    for name, (mine, theirs) in sums.items():
        how = "stopping at the goals" if stops[name] else "running to the limits"
        print(f"math suite, {how}: ours {mine:.3f} s, {name} {theirs:.3f} s, "
              f"ratio ours/{name} = {mine / theirs:.2f}")

    if growth_nodes is None:
        return
    print()
    print(f"growth run to {growth_nodes:,} e-nodes ({GROWTH_START}; rules "
          f"{', '.join(GROWTH_RULES)}; simple scheduler)")
    ours = _growth_in_subprocess(growth_nodes)
    print(f"  ours: {ours['time_s']:.2f} s, {ours['nodes']:,} e-nodes, "
          f"{ours['nodes_per_s']:,.0f} e-nodes/s, {ours['bytes_per_node']:.0f} bytes/e-node "
          f"(process RSS), stop {ours['stop_reason']}")
    for name, mod in available.items():
        peer = mod.run_growth(growth_nodes)
        print(f"  {name}: {peer['time_s']:.2f} s, {fmt(peer.get('nodes'), ',')} e-nodes, "
              f"{fmt(peer.get('nodes_per_s'), ',.0f')} e-nodes/s; ratio ours/{name} time per "
              f"e-node = {(ours['time_s'] / ours['nodes']) / (peer['time_s'] / peer['nodes']):.2f}"
              if peer.get("nodes") else f"  {name}: {peer}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--growth-nodes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median kept)")
    parser.add_argument("--skip-growth", action="store_true")
    parser.add_argument("--search-scaling", action="store_true",
                        help="only the nested-pattern search on large classes")
    parser.add_argument("--lambda", dest="lambda_suite", action="store_true",
                        help="only egg's lambda-calculus suite")
    add_out_option(parser, "engine")
    args = parser.parse_args()
    with Transcript() as printed:
        if args.search_scaling:
            name, title = "engine_search_scaling", "Engine: a nested pattern on large classes"
            search_scaling(args.repeat)
        elif args.lambda_suite:
            name, title = "engine_lambda", "Engine: egg's lambda-calculus suite"
            lambda_suite(args.repeat)
        else:
            name, title = "engine", "Engine: egg's math suite and a growth run, against peers"
            against_peers(args.repeat, None if args.skip_growth else args.growth_nodes)
    write_results(name, title, printed.block(), out=args.out)


if __name__ == "__main__":
    main()
