"""Regime inference (Herbie's regimes): split an input's range so that each piece runs the
candidate program that is most accurate there.

Given the error of every candidate at every sample point and the value of each input at those
points, :func:`infer_regimes` finds, for each input, the best split of its sorted values into
at most ``max_regimes`` intervals (dynamic programming over split positions, each interval
taking the candidate with the least total error on its points, each split paying
``split_cost`` bits), and keeps the input whose split is best. :func:`select` evaluates the
result as nested ``torch.where`` calls, so the same code computes values and, on
``torch.fx`` proxies, emits the branches into a graph.

>>> import numpy as np
>>> errors = np.array([[0., 0., 9., 9.],     # candidate 0: good for small x
...                    [9., 9., 0., 0.]])    # candidate 1: good for large x
>>> keys = [np.array([1e-8, 1e-6, 1e6, 1e8])]
>>> regimes = infer_regimes(errors, keys, min_points=1)
>>> regimes.candidates, regimes.thresholds
([0, 1], [1.0])
>>> regimes.mean_error
0.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Regimes", "between", "infer_regimes", "select"]


@dataclass
class Regimes:
    """The chosen split: input ``variable`` (an index into the keys), the ``thresholds``
    between intervals (increasing) and the ``candidates`` used on each interval (one more
    than thresholds); ``mean_error`` is the mean error per point on the samples, without
    the split costs."""

    variable: int
    thresholds: list[float]
    candidates: list[int]
    mean_error: float

    def __str__(self) -> str:
        if not self.thresholds:
            return f"candidate {self.candidates[0]} everywhere"
        parts = [f"candidate {c} below {t:.3g}" for c, t in zip(self.candidates,
                                                                 self.thresholds)]
        return f"on input {self.variable}: " + ", ".join(parts) + (
            f", candidate {self.candidates[-1]} above")


def infer_regimes(errors: np.ndarray, keys: Sequence[np.ndarray], max_regimes: int = 4,
                  split_cost: float | None = None, min_points: int = 4) -> Regimes:
    """The best split of one input's range among ``keys`` (see the module docstring).

    ``errors``: (candidates, points) bits of error; ``keys``: per input, its value at each
    point. A split must gain ``split_cost`` bits in total (default: a quarter of a bit per
    point, at least one bit), and each interval holds at least ``min_points`` points, so
    that a single noisy point cannot buy a branch.
    """
    errors = np.nan_to_num(np.asarray(errors, dtype=np.float64), nan=64.0, posinf=64.0)
    count, points = errors.shape
    if split_cost is None:
        split_cost = max(1.0, 0.25 * points)
    single = errors.sum(1)
    best = Regimes(0, [], [int(single.argmin())], float(single.min()) / points)
    best_total = float(single.min())
    for variable, key in enumerate(keys):
        key = np.asarray(key, dtype=np.float64)
        if not np.isfinite(key).all() or len(np.unique(key)) < 2:
            continue
        found = _split(errors, key, max_regimes, split_cost, min_points)
        if found is not None and found[0] < best_total - 1e-9:
            total, thresholds, candidates = found
            best_total = total
            sum_error = total - split_cost * len(thresholds)
            best = Regimes(variable, thresholds, candidates, sum_error / points)
    return best


def _split(errors: np.ndarray, key: np.ndarray, max_regimes: int, split_cost: float,
           min_points: int):
    """(total cost, thresholds, candidates) of the best split of ``key``'s sorted range."""
    order = np.argsort(key, kind="stable")
    key = key[order]
    prefix = np.concatenate([np.zeros((errors.shape[0], 1)), np.cumsum(errors[:, order], 1)],
                            1)
    points = len(key)
    # A split can fall only between two different values (position i: before point i).
    cuts = [i for i in range(min_points, points - min_points + 1) if key[i - 1] < key[i]]
    positions = [0, *cuts, points]
    index = {p: k for k, p in enumerate(positions)}
    inf = math.inf
    # cost[r][p]: the least cost of covering points [0, p) with r + 1 intervals.
    cost = [{p: inf for p in positions} for _ in range(max_regimes)]
    back: list[dict[int, tuple[int, int]]] = [{} for _ in range(max_regimes)]
    for p in positions[1:]:
        seg = prefix[:, p] - prefix[:, 0]
        cost[0][p] = float(seg.min())
        back[0][p] = (0, int(seg.argmin()))
    for r in range(1, max_regimes):
        for p in positions[1:]:
            for q in positions[1:index[p]]:
                if p - q < min_points or cost[r - 1][q] == inf:
                    continue
                seg = prefix[:, p] - prefix[:, q]
                c = cost[r - 1][q] + float(seg.min()) + split_cost
                if c < cost[r][p]:
                    cost[r][p] = c
                    back[r][p] = (q, int(seg.argmin()))
    r = min(range(max_regimes), key=lambda k: cost[k][points])
    if cost[r][points] == inf:
        return None
    total = cost[r][points]
    candidates, starts, p = [], [], points
    for level in range(r, -1, -1):
        q, c = back[level][p]
        candidates.append(c)
        starts.append(q)
        p = q
    candidates.reverse()
    starts.reverse()
    _center_ties(prefix, starts, candidates, positions, min_points)
    thresholds = [between(key[s - 1], key[s]) for s in starts[1:]]
    return total, thresholds, candidates


TIE_BITS = 1.0
"""Bits per point moved within which two positions of a split are equally good
(:func:`_center_ties`): less than the samples can tell apart (see
:data:`compiler.herbie.MIN_GAIN_BITS`)."""


def _center_ties(prefix: np.ndarray, starts: list[int], candidates: list[int],
                 positions: list[int], min_points: int) -> None:
    """Move each split to the middle of the run of positions that cost the same (within
    :data:`TIE_BITS` per point): where two candidates are equally accurate on the samples between
    them (a leading-order series and the exact rewrite it approximates), the first
    position of the run hands the series the most range, the middle hedges between the
    two."""
    points = positions[-1]
    for k in range(1, len(starts)):
        left, right, s = candidates[k - 1], candidates[k], starts[k]
        lo = starts[k - 1] + min_points
        hi = (starts[k + 1] if k + 1 < len(starts) else points) - min_points
        # what the left candidate costs more than the right one on the points before p
        excess = prefix[left] - prefix[right]
        allowed = [p for p in positions if lo <= p <= hi]
        i = j = allowed.index(s)

        def tied(p: int, excess=excess, s=s) -> bool:
            return float(excess[p] - excess[s]) <= TIE_BITS * abs(p - s)

        while i > 0 and tied(allowed[i - 1]):
            i -= 1
        while j + 1 < len(allowed) and tied(allowed[j + 1]):
            j += 1
        starts[k] = allowed[(i + j) // 2]


def between(lo: float, hi: float) -> float:
    """A threshold between two neighbouring sample values: their geometric mean when they
    share a sign (sample values span many binades), else 0.

    >>> between(1.0, 4.0), between(-2.0, 3.0)
    (2.0, 0.0)
    """
    if lo > 0 and hi > 0:
        return math.sqrt(lo) * math.sqrt(hi)
    if lo < 0 and hi < 0:
        return -math.sqrt(-lo) * math.sqrt(-hi)
    return 0.0 if lo < 0 <= hi or lo <= 0 < hi else (lo + hi) / 2


def select(regimes: Regimes, branches: Sequence[Callable[[], object]], key, where: Callable):
    """The value of the piecewise program: ``where(key < t, branch, rest)`` nested over
    the thresholds, each branch computed by calling ``branches[candidate]``; ``where`` is
    ``torch.where`` (on tensors or on fx proxies).

    >>> import torch
    >>> r = Regimes(0, [0.0], [0, 1], 0.0)
    >>> x = torch.tensor([-2.0, 3.0])
    >>> select(r, [lambda: -x, lambda: x * 10], x, torch.where).tolist()
    [2.0, 30.0]
    """
    value = branches[regimes.candidates[-1]]()
    for threshold, candidate in zip(reversed(regimes.thresholds),
                                    reversed(regimes.candidates[:-1])):
        value = where(key < threshold, branches[candidate](), value)
    return value
