"""``python -m egraph``: the engine demo on egg's math suite (the bundled example).

Proves every case of egg's math suite, simplifies a few expressions, explains one proof and
prints the saturation report of the largest case.
"""

from __future__ import annotations

import time

from egraph import parse
from egraph.examples.math import CASES, MathCost, simplify


def main() -> None:
    print("egg's math suite on the pure-Python engine")
    print(f"{'case':<22}{'proved':>8}{'time s':>9}{'e-nodes':>9}{'classes':>9}  stop")
    total = 0.0
    for case in CASES.values():
        start = time.perf_counter()
        eg = case.run()
        elapsed = time.perf_counter() - start
        total += elapsed
        proved = all(eg.equiv(eg.roots[0], g) for g in case.goals)
        print(f"{case.name:<22}{'yes' if proved else 'NO':>8}{elapsed:>9.4f}"
              f"{eg.hashcons_size:>9}{eg.num_classes:>9}  {eg.report.stop_reason}")
    print(f"total {total:.3f} s\n")

    for text in ["(+ x (+ x (+ x x)))", "(* (+ x 3) (+ x 1))", "(- (* 2 y) (* (- 3 1) y))"]:
        term, cost = simplify(text)
        print(f"simplify {text}  ->  {term}  (size {cost})")

    case = CASES["math_diff_simple2"]
    eg = case.run(explanations=True)
    print(f"\nwhy {case.start} = {case.goals[0]}:")
    print(eg.explain(parse(case.start), case.goals[0]))
    term, cost = eg.extract(MathCost(), root=eg.roots[0])
    print(f"extracted with egg's MathCostFn: {term} (cost {cost})")

    eg = CASES["integ_part2"].run()
    print("\nsaturation report of integ_part2:")
    print(eg.report)


if __name__ == "__main__":
    main()
