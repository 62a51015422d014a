"""Logging and progress: what the compiler did, and how far long work has got.

Everything logs under the standard ``egraph`` logger (``egraph.run`` for saturation,
``egraph.compiler`` for the torch pipeline): one INFO line per compiled graph, DEBUG lines
per saturation iteration and per rule. Nothing is printed by default (the library adds a
``NullHandler``, as libraries should). Turn it on for a whole run with the environment
variable ``EGRAPH_LOGS`` (``info`` or ``debug``, in the spirit of ``TORCH_LOGS``), or in
code with :func:`set_logs` or the ``logging`` module itself:

    EGRAPH_LOGS=info python train.py

>>> import logging
>>> set_logs("info")
>>> logging.getLogger("egraph").level == logging.INFO
True
>>> set_logs(None)

Progress bars (tqdm, where it is installed) show for saturation past a couple of seconds,
ILP solves, and benchmark and soak runs; never when the output is not a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["ENV", "PROGRESS_DELAY", "SaturationLog", "logger", "progress", "set_logs"]

logger = logging.getLogger("egraph")
logger.addHandler(logging.NullHandler())

ENV = "EGRAPH_LOGS"
"""The environment variable read when ``egraph`` is imported: ``info``, ``debug`` or
``off``."""

PROGRESS_DELAY = 2.0
"""Seconds before a progress bar appears (short work shows none)."""

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "off": None, "": None}
_handler: logging.Handler | None = None


def set_logs(level: str | int | None, stream: IO[str] | None = None) -> None:
    """Print the ``egraph`` logs at ``level`` (``"info"``, ``"debug"``, a ``logging``
    level, or None / ``"off"`` to stop) to ``stream`` (default: standard error).

    >>> import io
    >>> out = io.StringIO()
    >>> set_logs("debug", out)
    >>> logging.getLogger("egraph.compiler").debug("hello")
    >>> "hello" in out.getvalue()
    True
    >>> set_logs("off")
    """
    global _handler
    if isinstance(level, str):
        key = level.strip().lower()
        if key not in _LEVELS:
            raise ValueError(f"{ENV}={level!r}: use one of info, debug, warning or off")
        level = _LEVELS[key]
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    if level is None:
        logger.setLevel(logging.NOTSET)
        return
    _handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(level)


class _NoBar:
    """What :func:`progress` returns where no bar is shown: the same calls, doing nothing."""

    disable = True

    def __init__(self, iterable: Iterable | None = None):
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self.iterable or ())

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Nothing to advance."""

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Nothing to show."""

    def close(self) -> None:
        """Nothing to close."""


def progress(iterable: Iterable | None = None, *, total: int | float | None = None,
             desc: str = "", unit: str = "it", file: IO[str] | None = None,
             delay: float | None = None) -> Any:
    """A tqdm progress bar over ``iterable`` (or advanced with ``update``), shown only on a
    terminal and only once the work has taken ``delay`` seconds (default
    :data:`PROGRESS_DELAY`); without tqdm installed, the same calls do nothing.

    >>> sum(progress(range(4), desc="counting"))  # not a terminal here: no bar
    6
    """
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are optional
        return _NoBar(iterable)
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False,
                file=file if file is not None else sys.stderr,
                delay=PROGRESS_DELAY if delay is None else delay,
                disable=None)  # None: off where the output is not a terminal


class SaturationLog:
    """What a saturation run says as it goes: a DEBUG line per iteration and per rule that
    matched (the ``egraph.run`` logger) and, past :data:`PROGRESS_DELAY`, a progress bar of
    the iterations.

    >>> from egraph import EGraph, rewrite
    >>> eg = EGraph()
    >>> _ = eg.add("(+ a b)", root=True)
    >>> eg.saturate([rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")]).report.stop_reason
    'saturated'
    """

    def __init__(self, report: Any, iter_limit: int):
        self.report = report
        self.log = logging.getLogger("egraph.run")
        self.bar = progress(total=iter_limit, desc="saturate", unit="iter")
        self.seen = {name: (0, 0) for name in report.rules}
        self.start = time.perf_counter()

    def iteration(self) -> None:
        """Report the iteration just appended to ``report.iterations``."""
        it = self.report.iterations[-1]
        self.bar.update(1)
        self.bar.set_postfix_str(f"{it.nodes} e-nodes")
        if not self.log.isEnabledFor(logging.DEBUG):
            return
        self.log.debug("iteration %d: %d e-nodes, %d e-classes, %d unions; search %.3f s, "
                       "apply %.3f s, rebuild %.3f s", it.index, it.nodes, it.classes,
                       sum(it.applied.values()), it.search_time, it.apply_time,
                       it.rebuild_time)
        for name, stats in self.report.rules.items():
            matches, applied = stats.matches, stats.applied
            before = self.seen[name]
            if (matches, applied) != before:
                self.log.debug("  rule %s: %d matches, %d unions", name,
                               matches - before[0], applied - before[1])
                self.seen[name] = (matches, applied)

    def done(self) -> None:
        """Close the bar and log how the run stopped."""
        self.bar.close()
        r = self.report
        self.log.debug("saturation stopped (%s) after %d iterations: %d e-nodes, "
                       "%d e-classes, %.3f s", r.stop_reason, len(r.iterations), r.nodes,
                       r.classes, time.perf_counter() - self.start)


if os.environ.get(ENV):  # the whole run's logs, set before anything is compiled
    set_logs(os.environ[ENV])
