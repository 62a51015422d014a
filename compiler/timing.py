"""Timing programs against each other: wall-clock medians of interleaved rounds.

Every round calls each function once, in its own seeded shuffled order: a call leaves the
caches and the allocator in a state that slows or speeds the next one (in one fixed order
the program called after an eager model's forward ran 10 % slower, whichever it was), and
the machine's drift falls on all alike. The benchmarks and the backend's autotuning
(:mod:`compiler.autotune`) time with these.

A shared machine drifts faster than a round of many long programs: ResNet-50's program
timed four times a round ran at 60 ms for a few seconds, then at 78 ms for ten, then at
60 again. Over a round of 25 programs that drift falls on some programs and not others, and
the medians of a program and its exact copy came out 14% apart. With a ``reference``,
:func:`interleaved_times` brackets every other call between two calls of the reference
and divides out the reference's local speed: the same copies then agree within 1%.

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
                      seconds: float = float("inf"), reference: Hashable | None = None
                      ) -> dict[Hashable, list[float]]:
    """Seconds of every call of each function over ``rounds`` interleaved rounds (each
    calls every function once, in an order shuffled with ``seed``), after a warm-up round
    (unless ``warm`` is False: the caller has called each already). With ``twins`` (the
    keys of two copies of one program) rounds stop early, after at least ``min_rounds``,
    once the twins' medians are within ``spread`` of each other (:func:`twin_gap`), and
    once the rounds have taken ``seconds`` in all.

    With ``reference`` (a key of ``fns``), each other call runs between two calls of the
    reference, and its seconds are corrected for the machine's drift: scaled by the
    reference's median over the mean of the two calls around it. The reference's own
    seconds are its calls as timed.

    >>> times = interleaved_times({"a": lambda: None, "b": lambda: None}, rounds=9,
    ...                           twins=("a", "b"), spread=10.0, min_rounds=2)
    >>> [len(ts) for ts in times.values()]
    [2, 2]
    >>> [len(ts) for ts in interleaved_times({"a": lambda: None}, 9, min_rounds=3,
    ...                                      seconds=0.0).values()]
    [3]
    >>> bracketed = interleaved_times({"r": lambda: None, "a": lambda: None}, 4,
    ...                               reference="r")
    >>> [len(bracketed["r"]), len(bracketed["a"])]
    [8, 4]
    """
    if warm:
        for fn in fns.values():
            fn()
    raw: dict[Hashable, list[float]] = {key: [] for key in fns}
    local: dict[Hashable, list[float]] = {key: [] for key in fns}  # the reference around
    order = [key for key in fns if key != reference]
    shuffle = random.Random(seed).shuffle

    def call(key: Hashable) -> float:
        start = time.perf_counter()
        fns[key]()
        return time.perf_counter() - start

    def corrected() -> dict[Hashable, list[float]]:
        if reference is None:
            return raw
        scale = statistics.median(raw[reference])
        return {key: ts if key == reference else
                [t * scale / r if r > 0 else t for t, r in zip(ts, local[key])]
                for key, ts in raw.items()}

    began = time.perf_counter()
    for done in range(1, max(rounds, 1) + 1):
        shuffle(order)
        if reference is not None:
            before = call(reference)
            raw[reference].append(before)
        for key in order:
            raw[key].append(call(key))
            if reference is not None:
                after = call(reference)
                raw[reference].append(after)
                local[key].append((before + after) / 2)
                before = after
        if done >= min_rounds and (time.perf_counter() - began > seconds or (
                twins is not None and twin_gap(corrected(), twins) < spread)):
            break
    return corrected()


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

