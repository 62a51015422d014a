"""Local search: improve an extracted program under a cost that is not a sum over e-nodes.

Starting from the proxy's choice, each class of the program tries its other e-nodes (those
that keep the program acyclic, their new sub-programs filled from the proxy's choice); a
change is kept when the exact program cost drops. Rounds repeat until nothing improves or
the evaluation budget is spent. This is how fusion boundaries and peak memory, which depend
on the whole program, are optimised.

>>> import torch
>>> from egraph import EGraph
>>> from extractors.costs import Roofline
>>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2), (torch.randn(4),))
>>> from egraph.extract import source_program
>>> choice = source_program(eg)
>>> improve(eg, choice, Roofline("H100")) == choice  # nothing else to choose
True
"""

from __future__ import annotations

from typing import Any

from egraph.extract.program import is_acyclic, program_order, program_roots
from egraph.extract.tree import cheaper


def improve(egraph, choice: dict[int, tuple], cost, budget: int = 2000,
            rounds: int = 3) -> dict[int, tuple]:
    """A choice at least as good as ``choice`` under ``cost.program_cost``."""
    find = egraph.find
    cnodes = egraph.class_nodes
    best = dict(choice)
    roots = program_roots(egraph)
    best_cost: Any = cost.program_cost(egraph, best)
    evaluations = 0
    for _ in range(rounds):
        improved = False
        order = program_order(egraph, best, roots)
        for c in order:
            for alt in cnodes[c]:
                if alt == best[c] or evaluations >= budget:
                    continue
                if any(find(k) not in best for k in alt[1:]):
                    continue
                trial = dict(best)
                trial[c] = alt
                if not is_acyclic(egraph, trial, roots):
                    continue
                evaluations += 1
                value = cost.program_cost(egraph, trial)
                if cheaper(value, best_cost):
                    best, best_cost, improved = trial, value, True
        if not improved or evaluations >= budget:
            break
    return best
