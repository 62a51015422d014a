"""The rule library's report: counts per family, each stability and fusion rule with the
PyTorch code it fires on and its conditions, and the soundness run (random instances of
every example of every rule judged against float64, rules proved by sympy, deliberately
wrong rules caught).

    .venv/bin/python benchmarks/rules_report.py [--examples 100]

What it prints is written, stamped with the run (``benchmarks/report.py``), to
benchmarks/results/rules_report.md (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import Transcript, add_out_option, write_results  # noqa: E402
from compiler.soundness import check_rule, mutants, sympy_proof  # noqa: E402
from egraph.egraph import UnsoundMerge  # noqa: E402
from egraph.rules import library  # noqa: E402
from egraph.rules.define import source_of  # noqa: E402


def report(examples: int) -> None:
    """Print the counts per family, the stability and fusion rules (and any that fails)
    with an example each, and the soundness run's totals, ``examples`` random instances
    of each example."""
    rules = library("all")
    spellings = sum(len(r.examples) for r in rules)
    print("rules per family:", dict(Counter(r.family for r in rules)), "total", len(rules),
          f"with {spellings} PyTorch examples (a mirrored spelling such as torch.log(x + 1) "
          "is an example of the rule it fires, not a rule of its own)")
    print()
    print(f"{'rule':<24}{'family':<10}{'sympy':<7}{'fired/examples':>15}  example")
    start = time.perf_counter()
    proved = unsound = 0
    for rule in rules:
        proof = sympy_proof(rule.rewrite)
        proved += proof is True
        for example in rule.examples:
            result = check_rule(rule, examples=examples, example=example)
            unsound += not result.ok
            if rule.family in ("stability", "fusion") or not result.ok:
                mark = {True: "yes", False: "NO", None: "-"}[proof]
                state = "" if result.ok else "  <- " + str(result)
                print(f"{rule.name:<24}{rule.family:<10}{mark:<7}"
                      f"{result.fired:>7}/{result.examples:<7}  {source_of(example)}{state}")
    elapsed = time.perf_counter() - start
    caught = 0
    pairs = mutants()
    for base, mutant in pairs:
        try:
            caught += not check_rule(base, examples=40, rewrite=mutant).ok
        except UnsoundMerge:
            caught += 1
    print()
    print(f"soundness: {len(rules)} rules, {spellings} examples x >= {examples} random "
          f"instances in {elapsed:.0f} s, {unsound} failed; sympy proved {proved} scalar "
          f"rules; mutants caught {caught}/{len(pairs)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100)
    add_out_option(parser, "rules_report")
    args = parser.parse_args()
    with Transcript() as printed:
        report(args.examples)
    write_results("rules_report", "The rule library and its soundness run", printed.block(),
                  out=args.out)


if __name__ == "__main__":
    main()
