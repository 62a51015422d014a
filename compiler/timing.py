"""Timing programs against each other: wall-clock medians of interleaved rounds.

Every round calls each function once, in its own seeded shuffled order: a call leaves the
caches and the allocator in a state that slows or speeds the next one (in one fixed order
the program called after an eager model's forward ran 10 % slower, whichever it was), and
the machine's drift falls on all alike. The benchmarks and the backend's autotuning
(:mod:`compiler.autotune`) time with these.

>>> times = interleaved_times({"a": lambda: None, "b": lambda: None}, rounds=3)
>>> sorted(times), [len(ts) for ts in times.values()]
(['a', 'b'], [3, 3])
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

__all__ = ["interleaved_ms", "interleaved_times", "median_seconds", "twin_gap"]


def median_seconds(fn: Callable[[], Any], repeat: int = 20) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls, after one warm-up call.

    >>> median_seconds(lambda: None, repeat=3) < 1.0
    True
    """
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def twin_gap(times: Mapping[Hashable, list[float]], twins: tuple[Hashable, Hashable]
             ) -> float:
    """How far apart, relatively, the medians of two copies of one program are: the
    spread a difference between two programs must beat to mean anything.

    >>> twin_gap({"a": [1.0, 2.0, 3.0], "b": [2.2]}, ("a", "b"))
    0.1
    """
    a, b = (statistics.median(times[k]) for k in twins)
    return round(abs(a - b) / min(a, b), 12) if min(a, b) > 0 else 0.0


def interleaved_times(fns: Mapping[Hashable, Callable[[], Any]], rounds: int, *,
                      twins: tuple[Hashable, Hashable] | None = None, spread: float = 0.01,
                      min_rounds: int = 5, seed: int = 0, warm: bool = True,
                      seconds: float = float("inf")) -> dict[Hashable, list[float]]:
    """Seconds of every call of each function over ``rounds`` interleaved rounds (each
    calls every function once, in an order shuffled with ``seed``), after a warm-up round
    (unless ``warm`` is False: the caller has called each already). With ``twins`` (the
    keys of two copies of one program) rounds stop early, after at least ``min_rounds``,
    once the twins' medians are within ``spread`` of each other (:func:`twin_gap`), and
    once the rounds have taken ``seconds`` in all.

    >>> times = interleaved_times({"a": lambda: None, "b": lambda: None}, rounds=9,
    ...                           twins=("a", "b"), spread=10.0, min_rounds=2)
    >>> [len(ts) for ts in times.values()]
    [2, 2]
    >>> [len(ts) for ts in interleaved_times({"a": lambda: None}, 9, min_rounds=3,
    ...                                      seconds=0.0).values()]
    [3]
    """
    if warm:
        for fn in fns.values():
            fn()
    times: dict[Hashable, list[float]] = {key: [] for key in fns}
    order = list(fns)
    shuffle = random.Random(seed).shuffle
    began = time.perf_counter()
    for done in range(1, max(rounds, 1) + 1):
        shuffle(order)
        for key in order:
            start = time.perf_counter()
            fns[key]()
            times[key].append(time.perf_counter() - start)
        if done >= min_rounds and (time.perf_counter() - began > seconds or (
                twins is not None and twin_gap(times, twins) < spread)):
            break
    return times


def interleaved_ms(fns: Mapping[Hashable, Callable[[], Any]], repeat: int
                   ) -> dict[Hashable, float]:
    """Median milliseconds of each function over ``repeat`` interleaved rounds
    (:func:`interleaved_times`), after a warm-up round; a function that raises is left
    out.

    >>> sorted(interleaved_ms({"a": lambda: None, "b": lambda: 1 / 0}, 3))
    ['a']
    """
    working = {}
    for key, fn in fns.items():
        try:
            fn()
            working[key] = fn
        except Exception:  # noqa: BLE001 - its row already says why it failed
            continue
    times = interleaved_times(working, repeat, warm=False)
    return {key: statistics.median(ts) * 1e3 for key, ts in times.items()}

