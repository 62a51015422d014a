"""Engine benchmark: egg's math suite and a growth run, ours against the Rust-backed peers.

Runs, in one process and one run: every case of egg's math suite (the cases each peer can
express) on this engine, on ``snake-egg`` and on ``egglog``, with the same rules, scheduler
and limits; then a growth run that saturates until 1,000,000 e-nodes. Prints a table with
time per case, e-nodes, e-classes and our-time / peer-time ratios, then e-nodes added per
second and bytes of process memory per e-node at the growth run's size.

    .venv/bin/python benchmarks/engine.py [--growth-nodes 1000000] [--repeat 3]

Install the peers with ``bash scripts/setup_env.sh bench``. A peer that is not installed is
reported as missing, not silently skipped.
"""

from __future__ import annotations

import argparse
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
from egraph import EGraph, SimpleScheduler, parse  # noqa: E402
from egraph.examples.math import CASES, rules  # noqa: E402

PEERS = {"snake-egg": snake_egg_math, "egglog": egglog_math}


def run_ours(name: str) -> dict:
    """One case of the math suite on this engine (goals stop the run, as in egg's tests)."""
    case = CASES[name]
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


def fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--growth-nodes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median kept)")
    parser.add_argument("--skip-growth", action="store_true")
    args = parser.parse_args()

    available = {name: mod for name, mod in PEERS.items() if mod.AVAILABLE}
    for name in PEERS:
        if name not in available:
            print(f"peer {name} is not installed: bash scripts/setup_env.sh bench")

    header = f"{'case':<22}{'ours s':>9}{'nodes':>8}{'classes':>8}"
    for name in available:
        header += f"{name + ' s':>14}{'nodes':>8}{'ratio':>7}"
    print(header)
    totals = {"ours": 0.0, **{name: 0.0 for name in available}}
    common_totals = {name: [0.0, 0.0] for name in available}
    unproved = []
    for case in CASES.values():
        ours = median_run(lambda case=case: run_ours(case.name), args.repeat)
        if not ours["proved"]:
            unproved.append(("ours", case.name))
        totals["ours"] += ours["time_s"]
        line = f"{case.name:<22}{ours['time_s']:>9.4f}{ours['nodes']:>8}{ours['classes']:>8}"
        for name, mod in available.items():
            if case.name not in mod.CASES_SUPPORTED:
                line += f"{'n/a':>14}{'':>8}{'':>7}"
                continue
            peer = median_run(lambda mod=mod, case=case: mod.run_case(
                case.start, case.goal_texts, case.iter_limit, case.node_limit,
                case.time_limit), args.repeat)
            if not peer["proved"]:
                unproved.append((name, case.name))
            totals[name] += peer["time_s"]
            common_totals[name][0] += ours["time_s"]
            common_totals[name][1] += peer["time_s"]
            ratio = ours["time_s"] / peer["time_s"] if peer["time_s"] else float("inf")
            line += f"{peer['time_s']:>14.4f}{fmt(peer['nodes']):>8}{ratio:>7.2f}"
        print(line)
    print()
    for name, (ours_t, peer_t) in common_totals.items():
        print(f"math suite, cases {name} can express: ours {ours_t:.3f} s, {name} {peer_t:.3f} s,"
              f" ratio ours/{name} = {ours_t / peer_t:.2f}")
    for who, case in unproved:
        print(f"NOT PROVED: {who} {case}")

    if args.skip_growth:
        return
    print()
    print(f"growth run to {args.growth_nodes:,} e-nodes ({GROWTH_START}; rules "
          f"{', '.join(GROWTH_RULES)}; simple scheduler)")
    ours = _growth_in_subprocess(args.growth_nodes)
    print(f"  ours: {ours['time_s']:.2f} s, {ours['nodes']:,} e-nodes, "
          f"{ours['nodes_per_s']:,.0f} e-nodes/s, {ours['bytes_per_node']:.0f} bytes/e-node "
          f"(process RSS), stop {ours['stop_reason']}")
    for name, mod in available.items():
        peer = mod.run_growth(args.growth_nodes)
        print(f"  {name}: {peer['time_s']:.2f} s, {fmt(peer.get('nodes'), ',')} e-nodes, "
              f"{fmt(peer.get('nodes_per_s'), ',.0f')} e-nodes/s; ratio ours/{name} time per "
              f"e-node = {(ours['time_s'] / ours['nodes']) / (peer['time_s'] / peer['nodes']):.2f}"
              if peer.get("nodes") else f"  {name}: {peer}")


if __name__ == "__main__":
    main()
