"""Same input and limits give the same e-graph whatever PYTHONHASHSEED is."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
from egraph import AstSize
from egraph.examples.math import CASES
for name in ("integ_part2", "math_simplify_root", "diff_power_harder"):
    eg = CASES[name].run()
    sizes = [(i.nodes, i.classes) for i in eg.report.iterations]
    print(name, sizes, eg.extract(AstSize(), root=eg.roots[0]))
"""


def test_saturation_is_independent_of_the_hash_seed():
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                             text=True, check=True)
        outputs.add(out.stdout)
    assert len(outputs) == 1, outputs
