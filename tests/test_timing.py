"""compiler.timing: interleaved rounds, and the reference that divides out a drifting
machine's speed."""

import statistics

from compiler import timing


class _DriftingMachine:
    """A fake clock on which every call of unit work takes longer than the one before,
    as on a shared machine slowing down under a neighbour's load."""

    def __init__(self, drift: float):
        self.now, self.calls, self.drift = 0.0, 0, drift

    def clock(self) -> float:
        return self.now

    def work(self, units: float):
        def run():
            self.now += units * (1.0 + self.drift * self.calls)
            self.calls += 1
        return run


def test_a_reference_divides_out_the_machines_drift(monkeypatch):
    machine = _DriftingMachine(drift=0.05)
    monkeypatch.setattr(timing.time, "perf_counter", machine.clock)
    fns = {"a": machine.work(1.0), "copy of a": machine.work(1.0), "double": machine.work(2.0)}
    plain = timing.interleaved_times(fns, rounds=5, seed=0)
    assert timing.twin_gap(plain, ("a", "copy of a")) > 0.02  # the drift shows
    fns["reference"] = machine.work(1.0)
    bracketed = timing.interleaved_times(fns, rounds=5, seed=0, reference="reference")
    assert timing.twin_gap(bracketed, ("a", "copy of a")) < 1e-9
    ratio = statistics.median(bracketed["double"]) / statistics.median(bracketed["a"])
    assert abs(ratio - 2.0) < 1e-9


def test_twins_stop_the_rounds_once_they_agree():
    times = timing.interleaved_times({"a": lambda: None, "b": lambda: None}, rounds=50,
                                     twins=("a", "b"), spread=10.0, min_rounds=4)
    assert [len(ts) for ts in times.values()] == [4, 4]
