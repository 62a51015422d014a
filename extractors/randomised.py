"""Random cost models: seeded node costs for random valid programs, or for programs near
another model's choice (the programs that model ranks close to its own).

>>> import torch
>>> from egraph import EGraph
>>> eg = EGraph.from_fx(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
>>> c = eg.roots[0]
>>> cost = RandomCost(7)
>>> 0 < cost.node_cost(eg, c, eg.class_nodes[c][0]) == RandomCost(7).node_cost(
...     eg, c, eg.class_nodes[c][0]) < 1
True
"""

from __future__ import annotations

import hashlib
import math
import statistics

from extractors.costs import CostModel

__all__ = ["RandomCost"]

_NORMAL = statistics.NormalDist()


class RandomCost(CostModel):
    """Seeded random node costs, for random valid programs: DAG extraction under them
    picks one e-node per class and never a cycle. Each e-node's draw is a hash of the
    seed, its class and itself, so it does not depend on the order costs are asked in (nor
    on ``PYTHONHASHSEED``). Without ``base`` a cost is uniform in (0, 1); with it,
    ``base``'s cost times ``exp(spread * z)``, z a standard normal draw (a program near
    ``base``'s choice, nearer for a smaller ``spread``).

    >>> import torch
    >>> from egraph import EGraph
    >>> from extractors import Flops
    >>> eg = EGraph.from_fx(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> c = eg.roots[0]
    >>> node = eg.class_nodes[c][0]
    >>> near = RandomCost(1, Flops(), spread=0.01).node_cost(eg, c, node)
    >>> abs(near / Flops().node_cost(eg, c, node) - 1) < 0.05
    True
    """

    def __init__(self, seed: int, base: CostModel | None = None, spread: float = 1.0):
        self.seed, self.base, self.spread = seed, base, spread

    def node_cost(self, egraph, cid: int, node: tuple) -> float:
        digest = hashlib.blake2b(repr((self.seed, cid, node)).encode(), digest_size=8)
        u = (int.from_bytes(digest.digest(), "big") + 0.5) / 2.0 ** 64
        if self.base is None:
            return u
        z = _NORMAL.inv_cdf(u)
        return self.base.node_cost(egraph, cid, node) * math.exp(self.spread * z)

    def __repr__(self) -> str:
        return f"RandomCost({self.seed}{'' if self.base is None else f', {self.base!r}'})"
