"""This machine's CPU profile, measured where the compiler runs, once, and cached.

The shipped ``HARDWARE["cpu"]`` was measured on one machine at one thread. The default
cost model on the CPU (:func:`compiler.pipeline.default_cost`) and the budgeted
partition's estimates read :func:`cpu_profile` instead: :func:`calibrate`'s measurement of
this machine at the intra-op thread count torch runs with, which adds throughput curves of
matrix products, convolutions and attention at sizes from tiny to large (a product of
128 x 64 x 64 runs at a tenth of the peak a product of 1024 x 1024 x 1024 reaches) to
:func:`extractors.hardware.measure_cpu`'s bandwidths, per-call overhead and times per
element.

The cache: one JSON file per machine and thread count in :func:`cache_dir`
(``$EGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/egraph-torch``, else
``~/.cache/egraph-torch``), named by :func:`profile_key`: a hash of the CPU's model, its
core count, the thread count, torch's version and :data:`CALIBRATION_VERSION`. A change
to any of them measures anew; deleting the file does too (``python -m
extractors.calibration`` measures, saves and prints the profile). The same inputs and the
same cache give the same program. ``$EGRAPH_CALIBRATION`` chooses: ``auto`` (the
default: the cached calibration, measured on first use, 1-3 s, unless other work keeps the
machine busy then: :func:`busy_machine`), ``builtin`` (the shipped
profile, what the test suite uses so that its programs do not depend on the machine), or
the path of a profile file (:func:`save_profile`), to use one machine's profile on another.

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "this-machine.json"
>>> save_profile(calibrate(threads=1, repeat=3), path)  # measures, about 2 s
>>> cpu_profile(calibration=str(path)).name, cpu_profile(calibration="builtin").name
('cpu (calibrated, 1 thread)', 'cpu')
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from extractors.hardware import FEW_ROWS, HARDWARE, Hardware, measure_cpu

__all__ = ["ALLOCATOR_SETTINGS", "CALIBRATION_VERSION", "ENV", "MOST_FLOPS", "busy_machine",
           "cache_dir", "calibrate", "cpu_profile", "implausible", "load_profile", "profile_key",
           "save_profile", "write_json"]

CALIBRATION_VERSION = 15
"""Raised whenever :func:`calibrate` measures something new or differently, so that every
cached profile is measured again."""

ENV = "EGRAPH_CALIBRATION"
"""The environment variable that chooses the CPU profile: ``auto``, ``builtin`` or a path
(see the module's docstring)."""

MATMUL_SHAPES = ((16, 64, 64), (128, 64, 128), (64, 256, 256), (128, 768, 768),
                 (128, 768, 3072), (512, 1024, 1024), (1024, 1024, 1024))
"""``(m, k, n)`` of the fp32 products timed for the ``matmul`` curve: from a tiny
model's projection to a large square product, through a small model's MLP and GPT-2
small's projections at 128 tokens. Products by a few rows, which memory bounds, have a
curve of their own (:data:`FEW_ROWS_SHAPES`): a one-row point in this one (GPT-2's 1 x 768
x 2304, 8 GFLOP/s) priced every product of a few MFLOP near it, a small model's 128 x 64 x
64 among them, seven times over."""

FEW_ROWS_SHAPES = ((1, 256, 256), (1, 768, 2304), (1, 2048, 8192))
"""``(m, k, n)`` of the one-row fp32 products timed for the few-rows curves
(``matmul:rows``, :data:`extractors.hardware.FEW_ROWS`): a decode step's projections,
from a small model's to a Llama-1B-sized MLP's (64 MiB of weights)."""

CONV_SHAPES = ((16, 14, 16, 3, 1), (64, 56, 256, 1, 1), (64, 56, 64, 3, 1),
               (256, 14, 256, 3, 1), (3, 224, 64, 7, 2))
"""``(in channels, height = width, out channels, kernel, stride)`` of the batch-1 fp32
convolutions timed for the ``conv`` curve: a tiny one and ResNet-50's kinds (its 1 x 1
and 3 x 3 stages, its 7 x 7 stem)."""

ATTENTION_SHAPES = ((1, 4, 8, 16), (1, 12, 128, 64), (1, 12, 512, 64))
"""``(batch, heads, tokens, head size)`` of the ``sdpa`` calls timed for the
``attention`` curve."""

ALLOCATOR_SETTINGS = ("LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_MAX_",
                      "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_CONF",
                      "TCMALLOC_RELEASE_RATE", "THP_MEM_ALLOC_ENABLE")
"""The environment variables that choose or tune the memory allocator (a preloaded
jemalloc or tcmalloc, glibc's malloc settings, torch's huge pages): part of
:func:`profile_key`, since they decide what a fresh large result costs
(:data:`extractors.hardware.FRESH_MAPPING_BYTES`): with ``MALLOC_MMAP_MAX_=0`` and
``MALLOC_TRIM_THRESHOLD_`` large, glibc keeps such blocks, and a fill of 154 MiB that took
50 ms took 4.9 on one CPU."""

_profiles: dict[tuple[str, int, str], Hardware] = {}


def calibrate(threads: int | None = None, repeat: int = 9) -> Hardware:
    """Measure this machine's CPU profile on ``threads`` intra-op threads (None: torch's
    current count): :func:`~extractors.hardware.measure_cpu`'s peaks, bandwidths, overhead
    and times per element, and the throughput curves (``Hardware.rates``) of
    :data:`MATMUL_SHAPES` and :data:`FEW_ROWS_SHAPES` (a curve each: through torch's
    matmul, and through oneDNN's inner product and
    MKL's packed product where torch has them: :func:`frontends.fx.kernels.onednn_linear`,
    :func:`~frontends.fx.kernels.mkl_linear`), :data:`CONV_SHAPES`
    (through torch's conv2d and :func:`frontends.fx.kernels.onednn_conv2d`) and
    :data:`ATTENTION_SHAPES`, each the
    least of ``repeat`` calls less the per-call overhead, the kernels of one shape timed
    side by side (:func:`_curves`).

    >>> hw = calibrate(threads=1, repeat=3)
    >>> [kind for kind, _ in hw.rates]  # (the libraries' kernels where torch has them)
    ... # doctest: +NORMALIZE_WHITESPACE
    ['matmul', 'onednn_linear', 'mkl_linear', 'matmul:rows', 'onednn_linear:rows',
     'mkl_linear:rows', 'conv', 'onednn_conv', 'attention']
    >>> [len(curve) for _, curve in hw.rates]  # ResNet's 3 x 3 stages: one point
    [7, 7, 7, 3, 3, 3, 4, 4, 3]
    """
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    threads = threads or torch.get_num_threads()
    # (first use may come inside a compile, under its fake tensor mode, where every op
    # takes no time: the modes are set aside, and autograd, while measuring)
    with _disable_current_modes(), torch.no_grad():
        measured = measure_cpu(threads)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            rates = _curves(repeat, measured.launch_overhead)
        finally:
            torch.set_num_threads(before)
    peak = max(rate for _, rate in rates[0][1])
    return replace(measured, name=f"cpu (calibrated, {threads} thread"
                   f"{'s' if threads > 1 else ''})", matrix_fp32=max(peak, measured.matrix_fp32),
                   matrix_half=max(peak, measured.matrix_half), rates=rates)


def _curves(repeat: int, overhead: float) -> tuple[tuple[str, tuple], ...]:
    """``(kind, curve)`` of each kind of :data:`_RATE_MEASURES` that has calls here, a
    curve being ``(flops, flop_per_second)`` in increasing FLOPs (the fastest kept where
    two calls do the same work). Each call's time is the least of ``repeat``, less the
    per-call overhead, timed in rounds that take every kernel's call at the same place of
    its shapes in turn: the kernels of one shape are timed side by side, so that a slower
    minute of a shared machine slows them alike and their order stays the machine's (timed
    one curve after the other, torch's product of 1024^3 measured 150-230 GFLOP/s in four
    calibrations of one machine). Each timed call follows an untimed call of its own: a
    round's first shape, the smallest, would otherwise follow the last round's largest,
    and a 16 x 64 x 64 product timed right after a 1024^3 one took 81 us against 8 us
    after its own kind (one thread), which priced every small projection ten times
    over."""
    import time

    calls = {kind: list(measure()) for kind, measure in _RATE_MEASURES.items()}
    calls = {kind: kind_calls for kind, kind_calls in calls.items() if kind_calls}
    for kind_calls in calls.values():
        for _, call in kind_calls:  # (twice: a weight seen twice is packed)
            call()
            call()
    seconds = {(kind, i): float("inf") for kind, kind_calls in calls.items()
               for i in range(len(kind_calls))}
    for _ in range(repeat):
        for i in range(max(map(len, calls.values()))):
            for kind, kind_calls in calls.items():
                if i < len(kind_calls):
                    call = kind_calls[i][1]
                    call()  # (in place: see the docstring)
                    start = time.perf_counter()
                    call()
                    seconds[kind, i] = min(seconds[kind, i], time.perf_counter() - start)
    curves = []
    for kind, kind_calls in calls.items():
        points: dict[float, float] = {}
        for i, (flops, _) in enumerate(kind_calls):
            rate = flops / max(seconds[kind, i] - overhead, 1e-9)
            points[flops] = max(points.get(flops, 0.0), rate)
        curves.append((kind, tuple(sorted(points.items()))))
    return tuple(curves)


def _matmuls(shapes=MATMUL_SHAPES):
    import torch

    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        yield 2.0 * m * k * n, lambda a=a, b=b: torch.matmul(a, b)


def _linears(kernel: str, shapes=MATMUL_SHAPES):
    """The calls of ``frontends.fx.kernels.<kernel>`` at ``shapes`` (``(m, k, n)``), a
    weight of ``n x k`` each; none where torch lacks the library."""
    import torch

    from frontends.fx import kernels

    if not (kernels.ONEDNN if kernel.startswith("onednn") else kernels.MKL):
        return  # (no curve: the kernel is never chosen)
    linear = getattr(kernels, kernel)
    for m, k, n in shapes:
        x, w = torch.randn(m, k), torch.randn(n, k)
        yield 2.0 * m * k * n, lambda x=x, w=w: linear(x, w)


def _convolutions(conv2d=None):
    import torch

    conv2d = conv2d or torch.nn.functional.conv2d
    for channels, size, out, kernel, stride in CONV_SHAPES:
        x = torch.randn(1, channels, size, size)
        w = torch.randn(out, channels, kernel, kernel)
        side = (size + 2 * (kernel // 2) - kernel) // stride + 1
        flops = 2.0 * out * side * side * channels * kernel * kernel
        yield flops, lambda x=x, w=w, s=stride, p=kernel // 2: conv2d(x, w, stride=s, padding=p)


def _onednn_convolutions():
    from frontends.fx.kernels import ONEDNN, onednn_conv2d

    if ONEDNN:
        yield from _convolutions(onednn_conv2d)


def _attentions():
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    for shape in ATTENTION_SHAPES:
        q = torch.randn(*shape)
        batch, heads, tokens, size = shape
        yield 4.0 * batch * heads * tokens * tokens * size, lambda q=q: sdpa(q, q, q)


_RATE_MEASURES = {"matmul": _matmuls,
                  "onednn_linear": functools.partial(_linears, "onednn_linear"),
                  "mkl_linear": functools.partial(_linears, "mkl_linear"),
                  "matmul" + FEW_ROWS: functools.partial(_matmuls, FEW_ROWS_SHAPES),
                  "onednn_linear" + FEW_ROWS: functools.partial(_linears, "onednn_linear",
                                                                shapes=FEW_ROWS_SHAPES),
                  "mkl_linear" + FEW_ROWS: functools.partial(_linears, "mkl_linear",
                                                             shapes=FEW_ROWS_SHAPES),
                  "conv": _convolutions, "onednn_conv": _onednn_convolutions,
                  "attention": _attentions}


MOST_FLOPS = 1e14
"""More FLOP/s, bytes/s or elements/s than any CPU reaches: a measurement above it timed
something other than the work (a tensor without data)."""


def implausible(profile: Hardware) -> str | None:
    """What in a measured ``profile`` no CPU could do (a rate above :data:`MOST_FLOPS`, or
    one not positive), or None.

    >>> implausible(HARDWARE["cpu"]) is None
    True
    >>> implausible(replace(HARDWARE["cpu"], rates=(("matmul", ((1e9, 1e18),)),)))
    'matmul at 1e+18 per second'
    """
    rates = [("matrix products", profile.matrix_fp32), ("vector ops", profile.vector_fp32),
             ("bandwidth", profile.bandwidth), ("cache bandwidth", profile.cache_bandwidth),
             *((kind, rate) for kind, curve in profile.rates for _, rate in curve)]
    for what, rate in rates:
        if not 0 < rate <= MOST_FLOPS:
            return f"{what} at {rate:.3g} per second"
    return None


def busy_machine(threads: int, load: float | None = None) -> str | None:
    """Why this machine is too busy to calibrate on at ``threads`` threads, or None: by
    the load average of the last minute (``load``, None: the system's), other processes
    want more than half a core beyond the cores the calibration leaves them (this process
    counted as one).

    >>> cores = os.cpu_count()
    >>> busy_machine(2, load=1.2) if cores == 2 else None  # this process alone
    >>> busy_machine(2, load=3.4) if cores == 2 else "the load average is 3.4 on 2 cores"
    'the load average is 3.4 on 2 cores'
    """
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # (no load average on this platform)
            return None
    cores = os.cpu_count() or 1
    if load - 1 > max(cores - threads, 0) + 0.5:
        return f"the load average is {load:.1f} on {cores} cores"
    return None


def cache_dir() -> Path:
    """Where calibrated profiles are kept: ``$EGRAPH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/egraph-torch``, else ``~/.cache/egraph-torch``.

    >>> cache_dir().is_absolute()
    True
    """
    explicit = os.environ.get("EGRAPH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "egraph-torch"


def profile_key(threads: int) -> str:
    """The name of this machine's cached profile at ``threads`` threads: a hash of what
    makes a measurement stale (the CPU's model and core count, the thread count, torch's
    version, :data:`CALIBRATION_VERSION`, and the memory allocator's settings,
    :data:`ALLOCATOR_SETTINGS`).

    >>> profile_key(2) != profile_key(1)
    True
    """
    import torch

    allocator = tuple(os.environ.get(name, "") for name in ALLOCATOR_SETTINGS)
    facts = (_cpu_model(), os.cpu_count(), threads, torch.__version__, CALIBRATION_VERSION,
             *((allocator,) if any(allocator) else ()))
    digest = hashlib.sha256(repr(facts).encode()).hexdigest()[:16]
    return f"cpu-{threads}t-{digest}"


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def save_profile(profile: Hardware, path: str | os.PathLike) -> None:
    """Write ``profile`` as JSON to ``path`` (atomically: a reader never sees half a
    file), for :func:`load_profile` or ``$EGRAPH_CALIBRATION``.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "cpu.json"
    >>> save_profile(HARDWARE["cpu"], path)
    >>> load_profile(path) == HARDWARE["cpu"]
    True
    """
    write_json(path, {"version": CALIBRATION_VERSION, **asdict(profile)})


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as JSON to ``path``, atomically (a reader, another process among
    them, never sees half a file), making its folder where it is missing; an OSError
    where it cannot be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(value, indent=1))
    scratch.replace(path)


def load_profile(path: str | os.PathLike) -> Hardware:
    """The profile :func:`save_profile` wrote to ``path``; a ValueError naming the file
    where it is not one (of another :data:`CALIBRATION_VERSION`, or damaged)."""
    try:
        fields = json.loads(Path(path).read_text())
        if fields.pop("version", None) != CALIBRATION_VERSION:
            raise ValueError(f"written by calibration version other than "
                             f"{CALIBRATION_VERSION}")
        return Hardware(**{key: _tuples(value) for key, value in fields.items()})
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"{path} is not a hardware profile this version reads ({error}); "
                         f"delete it to measure again, or set {ENV}=builtin") from error


def _tuples(value):
    """JSON's lists as the tuples a frozen profile holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def cpu_profile(threads: int | None = None, calibration: str | None = None) -> Hardware:
    """The CPU profile the default cost model prices with, at ``threads`` intra-op threads
    (None: torch's current count), as ``calibration`` (None: ``$EGRAPH_CALIBRATION``,
    default ``auto``) chooses: ``auto``, this machine's cached calibration, measured and
    saved on first use; ``builtin``, the shipped ``HARDWARE["cpu"]``; otherwise the path
    of a profile file. Kept in the process once read.
    """
    import torch

    calibration = calibration or os.environ.get(ENV) or "auto"
    if calibration == "builtin":
        return HARDWARE["cpu"]
    threads = threads or torch.get_num_threads()
    key = (calibration, threads, str(cache_dir()))
    profile = _profiles.get(key)
    if profile is None:
        if calibration == "auto":
            path = cache_dir() / f"{profile_key(threads)}.json"
            profile = _cached_or_measured(path, threads)
        else:
            profile = load_profile(calibration)
        profile = _profiles[key] = profile
    return profile


def _cached_or_measured(path: Path, threads: int) -> Hardware:
    if path.exists():
        try:
            return load_profile(path)
        except ValueError as error:
            warnings.warn(f"measuring the CPU profile again: {error}", stacklevel=3)
    busy = busy_machine(threads)
    if busy:
        warnings.warn(f"not calibrating the CPU now: {busy}, and a measurement beside other "
                      f"work would price every op as slow as the load makes it; pricing "
                      f"with the shipped profile (run python -m extractors.calibration on a "
                      f"quiet machine, or set {ENV}=builtin)", stacklevel=3)
        return HARDWARE["cpu"]
    profile = calibrate(threads)
    doubt = implausible(profile)
    if doubt:
        warnings.warn(f"the CPU's calibration measured {doubt}; pricing with the shipped "
                      f"profile, and measuring again in the next process", stacklevel=3)
        return HARDWARE["cpu"]
    try:
        save_profile(profile, path)
    except OSError as error:  # a read-only home: measured again in the next process
        warnings.warn(f"the calibrated CPU profile could not be cached at {path} "
                      f"({error}); set EGRAPH_CACHE_DIR to a writable folder", stacklevel=3)
    return profile


if __name__ == "__main__":
    import argparse

    import torch

    parser = argparse.ArgumentParser(
        prog="python -m extractors.calibration",
        description="Measure this machine's CPU profile and save it where the default cost "
                    "model reads it (the cache of cpu_profile).")
    parser.add_argument("threads", nargs="?", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads to measure at (default: torch's count)")
    threads = parser.parse_args().threads
    target = cache_dir() / f"{profile_key(threads)}.json"
    measured = calibrate(threads)
    save_profile(measured, target)
    print(f"{measured.name}, saved to {target}")
    for kind, curve in measured.rates:
        print(kind, ", ".join(f"{f:.2g} FLOP at {r / 1e9:.1f} GFLOP/s" for f, r in curve))
    print(f"bandwidth {measured.bandwidth / 1e9:.1f} GB/s, in cache "
          f"{measured.cache_bandwidth / 1e9:.1f}; overhead {measured.launch_overhead * 1e6:.2f} us")
