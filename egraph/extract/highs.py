"""HiGHS (``highspy``) as the ILP extractor uses it: one mixed-integer program of columns
and sparse rows, solved quietly, from a warm start, under a deadline, its progress shown.

:mod:`egraph.extract.ilp` formulates the program; this module only hands it to the solver.
"""

from __future__ import annotations

import time

import numpy as np

from egraph.logs import progress

__all__ = ["Rows", "solve_mip"]


class Rows:
    """Constraint rows ``lower <= sum(value * column) <= upper`` in compressed sparse row
    form, added one at a time.

    >>> rows = Rows()
    >>> rows.add([0, 2], [1.0, -1.0], 0.0, 0.0)
    >>> rows.starts, rows.index, rows.value
    ([0, 2], [0, 2], [1.0, -1.0])
    """

    def __init__(self):
        self.starts = [0]
        self.index: list[int] = []
        self.value: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, cols, values, lower: float, upper: float) -> None:
        """Append the row ``lower <= sum(values[i] * cols[i]) <= upper``."""
        self.index.extend(cols)
        self.value.extend(values)
        self.starts.append(len(self.index))
        self.lower.append(lower)
        self.upper.append(upper)


def solve_mip(col_cost: np.ndarray, col_lower: np.ndarray, col_upper: np.ndarray,
              num_integer: int, rows: Rows, warm: np.ndarray | None, deadline: float,
              rel_gap: float, integral_costs: bool) -> tuple[list[float] | None, bool]:
    """``(column values, proven optimal?)`` of minimising ``col_cost`` over the columns
    (the first ``num_integer`` integer, the rest continuous) within their bounds and
    ``rows``, from the ``warm`` column values if given, until ``deadline``
    (``time.perf_counter()``); the values are None where HiGHS found no solution.
    ``integral_costs``: every answer's cost is an integer, so a gap under 1 is optimal.

    >>> rows = Rows()
    >>> rows.add([0, 1], [1.0, 1.0], 1.0, 2.0)  # pick at least one of two
    >>> values, optimal = solve_mip(np.array([3.0, 2.0]), np.zeros(2), np.ones(2), 2, rows,
    ...                             None, time.perf_counter() + 10, 1e-6, True)
    >>> [round(v) for v in values], optimal
    ([0, 1], True)
    """
    import highspy

    num_cols = len(col_cost)
    lp = highspy.HighsLp()
    lp.num_col_ = num_cols
    lp.col_cost_ = col_cost
    lp.col_lower_ = col_lower
    lp.col_upper_ = col_upper
    lp.integrality_ = ([highspy.HighsVarType.kInteger] * num_integer
                       + [highspy.HighsVarType.kContinuous] * (num_cols - num_integer))
    lp.num_row_ = len(rows.lower)
    lp.row_lower_ = np.array(rows.lower)
    lp.row_upper_ = np.array(rows.upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(rows.starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(rows.index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(rows.value)

    h = _silent_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if integral_costs:
        h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
    # HiGHS 1.15's symmetry handling has pruned the optimum of tensat's bert (tiny
    # float costs, many restarts) while reporting optimality; it is not needed here.
    h.setOptionValue("mip_detect_symmetry", False)
    h.passModel(lp)
    if warm is not None:
        solution = highspy.HighsSolution()
        solution.col_value = warm
        solution.value_valid = True
        h.setSolution(solution)
    seconds = max(deadline - time.perf_counter(), 0.01)
    h.setOptionValue("time_limit", seconds)
    with progress(total=round(seconds, 1), desc="ILP", unit="s") as bar:
        _follow(h, bar)
        h.run()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    if h.getInfo().primal_solution_status != 2:
        return None, False
    return h.getSolution().col_value, optimal


def _follow(h, bar) -> None:
    """Advance ``bar`` with the solver's running time and show its gap, where the bar is
    shown (the callback is a Python call per solver step)."""
    if bar.disable:
        return
    import highspy

    def step(kind, message, data_out, data_in, user) -> None:
        bar.update(min(data_out.running_time, bar.total) - bar.n)
        bar.set_postfix_str(f"gap {data_out.mip_gap:.2%}", refresh=False)

    h.setCallback(step, None)
    h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)


_BANNER_PRINTED = False
"""Whether this process has made its first ``highspy.Highs()`` (and so had its banner)."""


def _silent_highs(highspy):
    """A ``highspy.Highs()``: its C++ constructor prints a copyright banner to the process's
    standard output the first time, before any option can turn output off, in the middle
    of a user's program output; the descriptor is pointed at /dev/null while the first
    one is made (later ones print nothing)."""
    import os
    import sys

    global _BANNER_PRINTED
    if _BANNER_PRINTED:
        return highspy.Highs()
    _BANNER_PRINTED = True
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to protect
        return highspy.Highs()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
