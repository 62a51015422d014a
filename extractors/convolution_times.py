"""torch's CPU convolution timed per shape over a row-major and a channels-last input, and
oneDNN's (:func:`frontends.fx.kernels.onednn_conv2d`), on demand, on this machine, and
cached beside its calibrated profile.

A curve of FLOPs a second cannot say what a convolution's input format costs: it depends
on the shape, both ways. Over EfficientNet-B0's convolutions at batch 1 on one CPU, a
channels-last input ran its depthwise ones at 0.61x their row-major time and its 1 x 1
ones at 0.86x; over ResNet-50's, its 1 x 1 ones at 1.24x. So the price of running a
program's convolutions channels-last (:meth:`extractors.costs.Roofline.channels_last_convolutions`)
reads each convolution's own two times. Nor can one curve price a shape's kernels
against each other: at EfficientNet-B0's sizes it priced the depthwise convolutions at a
sixth of their time and those of its squeeze-and-excite blocks (1 x 1 over one pixel) at
seven times theirs. So each of the program's convolutions, torch's and oneDNN's, is
priced at its own time (:meth:`extractors.costs.Roofline.node_cost`).

A shape is a :data:`ConvolutionKey`. :func:`convolution_times` times the shapes it has not
seen, interleaving the three calls, and keeps the least of each (torch's with the weight
as the program holds it, row-major, so that a channels-last time includes torch's
reordering of a 3 x 3 weight on every call; oneDNN's with its weight packed, over a
channels-last input, as it runs in a chain). The times are saved in
:func:`~extractors.calibration.cache_dir` under the profile's
:func:`~extractors.calibration.profile_key`: a machine measures a shape once, and the same
cache gives the same program. ``EGRAPH_CALIBRATION=builtin`` or a
profile's path measures nothing (:func:`measured_convolutions` is then None): the shipped
and the borrowed profiles hold no such times.

>>> key = ((1, 8, 12, 12), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1), 8)  # depthwise
>>> row_major, channels_last, onednn = convolution_times([key], cache=False)[key]
>>> row_major > 0 and channels_last > 0 and onednn > 0
True
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from extractors.calibration import ENV, cache_dir, profile_key, write_json

__all__ = ["ConvolutionKey", "convolution_times", "measured_convolutions"]

ConvolutionKey = tuple
"""``(input shape, weight shape, stride, padding, dilation, groups)`` of a float32
``conv2d``, each a tuple of ints but the groups (an int). A bias is left out: both formats
add it alike, and one key for a convolution with and without it (a folded batch norm's
bias) gives the two programs one measurement, not two that differ by their noise."""

CALLS = 7
"""The most timed calls of each kernel per shape (fewer where the calls are slow:
:data:`SECONDS`)."""
SECONDS = 0.05
"""After this many seconds of timed calls of one shape, no more are made (at least three
of each kernel are: the least of two once timed a 3 ms convolution at 7 ms)."""

_measured: dict[str, dict[str, tuple[float, float, float]]] = {}


def _path(threads: int) -> Path:
    return cache_dir() / f"{profile_key(threads)}-convolutions.json"


def convolution_times(keys: Iterable[ConvolutionKey], threads: int | None = None,
                      cache: bool = True) -> dict[ConvolutionKey, tuple[float, float, float]]:
    """Seconds of one call of each shape in ``keys``, ``(torch's conv2d over a row-major
    input, torch's over a channels-last input, oneDNN's)`` (oneDNN's infinite where torch
    has no oneDNN; torch's own call where oneDNN does not run the shape), at ``threads``
    intra-op threads (None: torch's count): read from the cache (``cache``) or measured
    now, and saved."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    threads = threads or torch.get_num_threads()
    path = _path(threads) if cache else None
    known = _measured.get(str(path))
    if known is None:  # (read once a process: every e-node's price asks)
        known = _measured[str(path)] = _read(path) if path else {}
    wanted = {repr(k): k for k in keys}
    missing = [k for text, k in wanted.items() if text not in known]
    if missing:
        # (first use may come inside a compile, under its fake tensor mode: see calibrate)
        with _disable_current_modes(), torch.no_grad():
            for key in missing:
                known[repr(key)] = _time(key)
        if path is not None:
            _write(path, known)
    return {k: known[text] for text, k in wanted.items()}


def measured_convolutions() -> Callable | None:
    """:func:`convolution_times` where the CPU profile is this machine's calibration
    (``EGRAPH_CALIBRATION`` unset or ``auto``), else None."""
    return convolution_times if (os.environ.get(ENV) or "auto") == "auto" else None


def _time(key: ConvolutionKey) -> tuple[float, float, float]:
    import torch

    from frontends.fx.kernels import ONEDNN, onednn_conv2d

    x_shape, w_shape, stride, padding, dilation, groups = key
    x = torch.randn(x_shape)
    w = torch.randn(w_shape)
    b = torch.randn(w_shape[0])
    inputs = (x, x.contiguous(memory_format=torch.channels_last))
    calls = [lambda x=x: torch.conv2d(x, w, b, stride, padding, dilation, groups)
             for x in inputs]
    if ONEDNN:
        calls.append(lambda: onednn_conv2d(inputs[1], w, b, stride, padding, dilation,
                                           groups))
    for call in calls:  # (twice: the first call of a shape sets up its kernel, or packs)
        call()
        call()
    least = [float("inf")] * 3
    spent = 0.0
    for i in range(CALLS):
        for j, call in enumerate(calls):
            start = time.perf_counter()
            call()
            took = time.perf_counter() - start
            least[j] = min(least[j], took)
            spent += took
        if i >= 2 and spent > SECONDS:
            break
    return least[0], least[1], least[2]


def _read(path: Path) -> dict[str, tuple[float, float, float]]:
    try:
        return {k: tuple(v) for k, v in json.loads(path.read_text()).items()
                if len(v) == 3}  # (an entry of another form: measured again)
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # (none yet, or damaged: measured again)


def _write(path: Path, known: dict[str, tuple[float, float, float]]) -> None:
    try:
        write_json(path, known)
    except OSError:
        pass  # (a read-only cache: measured again in the next process)
