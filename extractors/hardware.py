"""Hardware profiles for the roofline cost model, as data.

Peaks are dense throughputs from the vendors' datasheets (tensor cores for fp16/bf16
matrix products, CUDA cores for fp32); the CPU profile was measured on the project's 2-core
CI machine with ``python -m extractors.hardware`` (fp32 1024x1024 matmul, a 128 MiB copy,
a tiny add), and what merging matrix products that share an input saves with
``python -m extractors.hardware merged`` (:func:`measure_merged_gemm`). Adding a profile is
one entry in :data:`HARDWARE`.

>>> HARDWARE["H100"].peak_flops("matmul", None) > HARDWARE["A100"].peak_flops("matmul", None)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_MATRIX_OPS = {"matmul", "addmm", "einsum", "linear", "onednn_linear", "onednn_linear_gelu",
               "mkl_linear", "conv1d", "conv2d", "onednn_conv2d", "onednn_conv2d_relu", "sdpa",
               "masked_attention"}

RATE_KINDS = {"matmul": "matmul", "addmm": "matmul", "einsum": "matmul", "linear": "matmul",
              "onednn_linear": "onednn_linear", "onednn_linear_gelu": "onednn_linear",
              "mkl_linear": "mkl_linear",
              "conv1d": "conv", "conv2d": "conv",
              "onednn_conv2d": "onednn_conv", "onednn_conv2d_relu": "onednn_conv",
              "sdpa": "attention", "masked_attention": "attention"}
"""The measured throughput curve (``Hardware.rates``) each matrix op is priced by."""

FEW_ROWS = ":rows"
"""The suffix of a kind's second curve, of products by a few rows (``matmul:rows``): a
one-row product by GPT-2's 768 x 2304 weights, a decode step's, runs where memory bounds
it, at 8 GFLOP/s where the same FLOPs in 128 rows run at 90, and the kernels differ there
as they do not in the compute curve (oneDNN's inner product took it in 68 us against torch's
108 on one CPU)."""

FEW_ROWS_INTENSITY = 2.0
"""FLOPs per byte moved below which a matrix op is priced by its kind's few-rows curve,
where the profile has one: a product by one to three rows of a large weight."""

MEASURED_ONLY = frozenset({"onednn_linear", "onednn_linear_gelu", "mkl_linear",
                           "onednn_conv2d", "onednn_conv2d_relu"})
"""Kernels priced only by a measured curve: their speed against torch's own kernel for
the op varies too much between machines and sizes for a peak to stand for it (oneDNN's
inner product: 2.5x faster than torch's linear on one CPU at GPT-2's sizes, 3x slower on
a tiny model's; MKL's packed product: 1.2-1.3x faster on another CPU, no faster on the
first). A profile without their curve prices them infinite, so that extraction
never chooses them there."""

OWN_EMISSION_ONLY = frozenset({"onednn_conv2d", "onednn_conv2d_relu", "onednn_linear_gelu",
                               "mkl_linear"})
"""Kernels whose measured speed holds only in our own emission: oneDNN's convolution and
MKL's product pack their weight once there, while under Inductor they pack nothing (its
generated code reuses its buffers with no new version), and the post-op kernels are their
plain calls under a tracer (Inductor fuses the post-ops itself). The fused cost model,
which prices the programs Inductor generates, prices them infinite."""

ROW_MAJOR_OPERAND = frozenset({"onednn_linear", "onednn_linear_gelu", "mkl_linear"})
"""Kernels that copy a transposed first operand (the input; a transposed weight they read
as it is) to row-major before they run, where torch's products read it in place (BLAS
takes a transposed operand as it is): a weight's gradient, ``g.t() @ x``, through
oneDNN's inner product copied the 512 x 50304 output gradient of GPT-2's tied ``lm_head``
in 76 ms on one CPU, and then ran 288 ms against 226 for torch's ``mm``; MKL's packed
product computes on a row-major input too. :class:`~extractors.costs.Roofline` charges
the copy (``transposed_copy``, :func:`measure_cpu`)."""

MERGED_SHAPES = (
    (32, 64, (64, 64, 64)),       # the bundled demo's Q, K, V projections
    (16, 64, (64, 32, 32)),       # the corpus Llama's Q, K, V (two key/value heads)
    (16, 64, (128, 128)),         # the corpus Llama's gate and up projections
    (64, 768, (768, 768, 768)),   # GPT-2 small's Q, K, V at 64 tokens
    (128, 768, (3072, 3072)),     # a SwiGLU MLP of width 768 at 128 tokens
)
"""(rows, inner size, output widths) of the matrix products that share an input and are
timed separately and merged by :func:`measure_merged_gemm`."""

# Merged matrix products on the CPU (python -m extractors.hardware merged: torch.matmul in
# fp32 on one thread, separate and merged timed alternately, medians of 101 pairs, two runs
# under the shared machine's load): separate vs merged, in microseconds, 8.5-8.8 vs 5.4-5.6
# (demo QKV), 5.7-5.8 vs 2.9 (Llama QKV), 5.8-6.1 vs 4.3-4.5 (gate and up): each product
# merged away saves 1.4-1.6 us, the per-op overhead, and nothing more; the large shapes
# (GPT-2 QKV, SwiGLU 768) are compute-bound and gain nothing (1345 vs 1346 us). So on the
# CPU a merged GEMM is faster by the launches it saves and the shared input read once,
# which is what the roofline charges (launch_overhead, bytes_moved); no size-dependent
# efficiency term is needed.


FRESH_MAPPING_BYTES = 32 << 20
"""The size from which a tensor the CPU allocates is a fresh mapping from the operating
system, whose pages fault in (and are zeroed) as the kernel first writes them: glibc's
malloc maps every block of at least this size (its largest mmap threshold) anew and
unmaps it when freed. On one CPU writing a fresh 154 MiB result took 0.28-0.33 ns a byte
more than writing it into a buffer (a fill: 50 ms against 6.6), where below 32 MiB the
two took the same time; an allocator that keeps such blocks measures no difference
(``fresh_mapping``, :func:`measure_cpu`)."""

CACHE_BYTES = 16 << 20
"""What a CPU kernel may move and still run from cache in the shipped profile: half the CI
machine's 32 MiB L3. A calibrated profile takes one core's private cache instead
(:func:`private_cache_bytes`)."""


def private_cache_bytes(system: str = "/sys/devices/system/cpu/cpu0/cache") -> float | None:
    """The largest cache of one core that no other core shares (its L2 on most CPUs), in
    bytes, as Linux describes it under ``system``; None where it does not.

    Between the kernel that writes a value and the one that reads it, a model's other
    kernels stream their weights and activations through the shared cache: profiled
    node by node inside real-size programs (GPT-2 small, Whisper-base's encoder,
    ConvNeXt-T on a 2-core AMD EPYC, 1 MiB private and 32 MiB shared), pointwise ops
    moving 1 to 32 MiB ran at 45-110 GB/s, near the 50 GB/s of a copy from memory and far
    from the 219 GB/s of a 4 MiB copy repeated in place.

    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for i, (level, size, cpus) in enumerate([(1, "48K", "0"), (2, "1024K", "0"),
    ...                                          (3, "32768K", "0-1")]):
    ...     (root / f"index{i}").mkdir()
    ...     for name, text in (("level", level), ("size", size), ("shared_cpu_list", cpus)):
    ...         _ = (root / f"index{i}" / name).write_text(str(text))
    >>> private_cache_bytes(str(root)) == 1 << 20, private_cache_bytes(str(root / "none"))
    (True, None)
    """
    from pathlib import Path

    try:  # (a core's hardware threads share its private caches)
        core = (Path(system).parent / "topology" / "thread_siblings_list").read_text().strip()
    except OSError:
        core = "0"
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best = None
    for index in sorted(Path(system).glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if shared == core and size:
            nbytes = float(size[:-1]) * units[size[-1]] if size[-1] in units else float(size)
            if best is None or level > best[0]:
                best = (level, nbytes)
    return best[1] if best else None


@dataclass(frozen=True)
class Hardware:
    """Peak throughputs (FLOP/s), memory bandwidth (bytes/s) and per-kernel overhead (s).

    ``composite``: ``(op, kernels, passes)`` for the ops this device's torch runs as
    several kernels rather than one (on the CPU, ``rms_norm`` is pow, sum, div, add,
    rsqrt and two muls): each call pays ``kernels`` overheads and moves its bytes
    ``passes`` times (:meth:`kernels_and_passes`).

    ``cache_bytes`` and ``cache_bandwidth``: a kernel that moves at most that many bytes
    runs from cache, at that bandwidth (:meth:`moving`; 0: every byte goes to memory).
    ``element_seconds``: ``(op, seconds)`` per element for the ops whose compute the FLOP
    peak misprices (on the CPU a tanh is a polynomial of dozens of instructions, an add
    one): :meth:`element_time`, which the roofline takes where it exceeds the FLOPs at
    peak; ``op:variant`` names one form of an op that has several (``gelu:tanh``, GELU's
    tanh approximation, three times the cost of its erf form). ``measured_ops``: the ops
    named there; ``mixed_layout`` there is the time an elementwise op over operands of
    two memory formats (channels-last and contiguous) takes per element beyond the same
    op over one format (5-11x an add's time on one CPU), ``conv_weight_layout`` the time
    per weight element torch's convolution over a channels-last input spends permuting a
    row-major weight, ``transposed_copy`` the time per element of copying a transposed
    matrix to row-major (:data:`ROW_MAJOR_OPERAND`), ``fresh_mapping`` the time per byte
    of a fresh result's page faults (:meth:`fresh_time`). ``extern_seconds``: ``(op,
    seconds)``, the fixed cost of a library op's
    call beyond a launch, where generated code (Inductor's) calls it as an external kernel
    (:meth:`extern_time`): the fused cost model's alternative is then a few generated
    kernels, not eager's op-by-op dispatch, which the per-op model prices at one launch
    each and so as far below its real cost at small sizes as this setup is.
    ``call_seconds``: ``(op, seconds)``, the fixed cost of one eager call of ``op``
    beyond a launch (its Python wrapper, its checks, the small tensors it makes; on one
    CPU 3.7 us for a batch norm, 6.8 for the erf GELU, nothing for an add), which own
    emission pays per call whatever the size (:meth:`call_time`; ``op:variant`` as for
    ``element_seconds``).

    ``rates``: ``(kind, ((flops, flop_per_second), ...))``, a measured throughput curve
    per kind of matrix op (:data:`RATE_KINDS`: ``matmul``, ``onednn_linear``, ``conv``,
    ``onednn_conv``, ``attention``) in
    single precision, points in increasing FLOPs: a small product runs far below the peak
    (:meth:`compute_time` interpolates; a calibrated profile has them,
    :mod:`extractors.calibration`); and a second curve of products by a few rows for the
    linear kinds (``matmul:rows``, :data:`FEW_ROWS`).

    >>> [HARDWARE[name].kernels_and_passes("rms_norm") for name in ("cpu", "H100")]
    [(7, 4), (1, 1)]
    >>> cpu = HARDWARE["cpu"]
    >>> [round(cpu.moving(n) * cpu.bandwidth / n, 2) for n in (1 << 30, 1 << 20)]  # DRAM, cache
    [1.0, 0.25]
    >>> cpu.element_time("tanh", 1e6) > 1e6 / cpu.vector_fp32, cpu.element_time("add", 1e6)
    (True, 0.0)
    >>> cpu.element_time("gelu", 1e6, "tanh") > cpu.element_time("gelu", 1e6, "none")
    True
    """

    name: str
    matrix_fp32: float
    matrix_half: float
    vector_fp32: float
    bandwidth: float
    launch_overhead: float
    composite: tuple[tuple[str, int, int], ...] = ()
    cache_bytes: float = 0.0
    cache_bandwidth: float = 0.0
    element_seconds: tuple[tuple[str, float], ...] = ()
    extern_seconds: tuple[tuple[str, float], ...] = ()
    call_seconds: tuple[tuple[str, float], ...] = ()
    rates: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "_rates", dict(self.rates))
        object.__setattr__(self, "_per_element", dict(self.element_seconds))
        object.__setattr__(self, "_extern", dict(self.extern_seconds))
        object.__setattr__(self, "_per_call", dict(self.call_seconds))
        object.__setattr__(self, "measured_ops",
                           frozenset(op.split(":")[0] for op, _ in self.element_seconds))

    def moving(self, nbytes: float) -> float:
        """Seconds one kernel takes to read and write ``nbytes``: from cache where they
        fit in ``cache_bytes``, from memory otherwise."""
        if self.cache_bytes and nbytes <= self.cache_bytes:
            return nbytes / self.cache_bandwidth
        return nbytes / self.bandwidth

    def fresh_time(self, nbytes: float) -> float:
        """Seconds the pages of a fresh result of ``nbytes`` take to fault in: the
        profile's ``fresh_mapping`` time per byte from :data:`FRESH_MAPPING_BYTES`, 0
        below it or where not measured.

        >>> hw = Hardware("cpu", 1e9, 1e9, 1e9, 1e9, 0.0,
        ...               element_seconds=(("fresh_mapping", 3e-10),))
        >>> hw.fresh_time(1 << 20), round(hw.fresh_time(100 << 20) * 1e3, 1)
        (0.0, 31.5)
        """
        return self.element_time("fresh_mapping", nbytes) if nbytes >= FRESH_MAPPING_BYTES else 0.0

    def element_time(self, op: str, elements: float, variant: str | None = None) -> float:
        """Seconds ``op`` (in its form ``variant``, where measured) takes over
        ``elements`` elements at its measured time per element (``element_seconds``); 0
        for an op that has none."""
        return elements * _of_form(self._per_element, op, variant)

    def extern_time(self, op: str) -> float:
        """The fixed seconds of one call of ``op`` as an external kernel of generated code,
        beyond a launch (``extern_seconds``; 0 for most ops).

        >>> HARDWARE["cpu"].extern_time("sdpa") > HARDWARE["cpu"].launch_overhead
        True
        """
        return self._extern.get(op, 0.0)

    def call_time(self, op: str, variant: str | None = None) -> float:
        """The fixed seconds of one eager call of ``op`` (in its form ``variant``, where
        measured) beyond a launch (``call_seconds``; 0 where not measured).

        >>> hw = Hardware("cpu", 1e9, 1e9, 1e9, 1e9, 1e-6,
        ...               call_seconds=(("batch_norm", 4e-6), ("gelu", 7e-6), ("gelu:tanh", 0.0)))
        >>> hw.call_time("batch_norm"), hw.call_time("gelu", "tanh"), hw.call_time("add")
        (4e-06, 0.0, 0.0)
        """
        return _of_form(self._per_call, op, variant)

    def kernels_and_passes(self, op: str) -> tuple[int, int]:
        """How many kernels one call of ``op`` runs, and how many times it moves its
        bytes: ``(1, 1)`` unless the op is one of this device's composites."""
        for name, kernels, passes in self.composite:
            if name == op:
                return kernels, passes
        return 1, 1

    def compute_time(self, op: str, flops: float, dtype, moved: float = 0.0) -> float:
        """Seconds ``op`` computes ``flops`` at ``dtype``: at the throughput its kind's
        measured curve gives for that much work (``rates``: interpolated between the
        points in log-log, held at the ends), or at the peak where there is no curve (half
        precision, ops other than matrix ops, or a datasheet profile); infinite for a
        kernel of :data:`MEASURED_ONLY` without its curve. Below the curve's first point a
        call takes that point's time, not its throughput: what the smallest call measured
        took is the kernel's fixed cost (oneDNN's inner product took 19 us for 1e5 FLOPs
        and 14-17 us for a 2 x 16 x 16 product on one CPU, not 0.3). An op that moves ``moved``
        bytes for fewer than :data:`FEW_ROWS_INTENSITY` FLOPs each is priced by its
        kind's few-rows curve (:data:`FEW_ROWS`) where the profile has one.

        >>> hw = Hardware("two-point", 1e9, 1e9, 1e9, 1e9, 0.0,
        ...               rates=(("matmul", ((1e4, 1e8), (1e8, 1e9))),
        ...                      ("matmul:rows", ((1e6, 2e8),))))
        >>> [round(hw.compute_time("linear", f, None) * 1e3, 3) for f in (1e3, 1e6, 1e9)]
        [0.1, 3.162, 1000.0]
        >>> round(hw.compute_time("linear", 1e6, None, moved=2e6) * 1e3, 3)  # one row
        5.0
        >>> hw.compute_time("add", 1e6, None), hw.compute_time("onednn_linear", 1e6, None)
        (0.001, inf)
        """
        kind = RATE_KINDS.get(op)
        curve = self._rates.get(kind)
        if curve and flops < FEW_ROWS_INTENSITY * moved:
            curve = self._rates.get(kind + FEW_ROWS, curve)
        half = dtype is not None and getattr(dtype, "itemsize", 4) == 2
        if op in MEASURED_ONLY and (not curve or half):
            return math.inf
        if not curve or half or flops <= 0:
            return flops / self.peak_flops(op, dtype)
        least, rate = curve[0]
        if flops < least:
            return least / rate
        return flops / _interpolated(curve, flops)

    def peak_flops(self, op: str, dtype) -> float:
        """The peak that bounds ``op`` at ``dtype`` (matrix units for half precision)."""
        half = dtype is not None and getattr(dtype, "itemsize", 4) == 2
        if op in _MATRIX_OPS:
            return self.matrix_half if half else self.matrix_fp32
        return self.vector_fp32 * (2 if half else 1)


def _interpolated(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """``curve``'s value at ``x``, linear in log-log between its points, constant beyond
    its ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    return curve[-1][1]


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 SXM5: 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 3.35 TB/s HBM3.
    "H100": Hardware("H100", 67e12, 989e12, 67e12, 3.35e12, 4e-6),
    # NVIDIA H200 SXM: the H100's compute with 4.8 TB/s HBM3e.
    "H200": Hardware("H200", 67e12, 989e12, 67e12, 4.8e12, 4e-6),
    # NVIDIA A100 SXM4 80GB: 312 TFLOP/s bf16 dense, 19.5 TFLOP/s fp32, 2.04 TB/s HBM2e.
    "A100": Hardware("A100", 19.5e12, 312e12, 19.5e12, 2.04e12, 5e-6),
    # NVIDIA T4 (the GPU of many free notebooks): 65 TFLOP/s fp16 on tensor cores, 8.1
    # TFLOP/s fp32 (Turing has no TF32), 320 GB/s GDDR6. (bfloat16 has no tensor cores
    # there: the half peak flatters it.)
    "T4": Hardware("T4", 8.1e12, 65e12, 8.1e12, 320e9, 5e-6),
    # The 2-core CI machine (measured): 48.8 GFLOP/s fp32 matmul, 12.2 GFLOP/s elementwise
    # in cache, 11.1 GB/s copy of 128 MiB (6.1 in an earlier round, 10.4-12.1 in three runs
    # of this one), 2.5 us per op (merged matrix products: see above).
    "cpu": Hardware("cpu", 48.8e9, 48.8e9, 12.2e9, 11.1e9, 2.5e-6, composite=(
        ("rms_norm", 7, 4), ("logsumexp", 10, 4), ("einsum", 3, 1)), cache_bytes=CACHE_BYTES,
        cache_bandwidth=44.8e9, element_seconds=(
            ("exp", 1.09e-9), ("log", 1.35e-9), ("tanh", 3.93e-9), ("sigmoid", 1.20e-9),
            ("silu", 1.34e-9), ("gelu", 1.31e-9), ("gelu:tanh", 4.07e-9), ("erf", 1.66e-9),
            ("softplus", 4.08e-9),
            ("sin", 1.73e-9), ("cos", 2.23e-9), ("log1p", 2.22e-9), ("expm1", 2.32e-9),
            ("sqrt", 0.52e-9), ("rsqrt", 0.37e-9), ("reciprocal", 0.18e-9), ("div", 0.19e-9),
            ("softmax", 1.14e-9), ("log_softmax", 1.09e-9), ("logsumexp", 1.57e-9)),
        extern_seconds=(("sdpa", 10e-6), ("masked_attention", 10e-6))),
}
# The CPU's cache and element times (python -m extractors.hardware, one thread, three runs
# under the shared machine's changing load): a 4 MiB copy at 45-57 GB/s against 10-12 GB/s
# for 128 MiB; per element on 256K elements, 0.15-0.19 ns for div and reciprocal (what an
# add costs from cache) against 3.3-4.2 ns for tanh and 3.7-4.1 ns for the tanh GELU, 1.0-1.4
# ns for exp: the FLOP peak (12.2 GFLOP/s, one op an element) prices all of them at 0.08 ns.
# The middle run's figures are the profile's (logsumexp's, per input element, and the erf
# GELU's, measured later at 1.45 and 0.32 times exp's and the tanh GELU's time, scaled to
# this run's).
# The CPU's composites (torch 2.13, fp32, one thread; the profiler lists their kernels):
# rms_norm at (2, 32, 128), (2, 128, 768) and (8, 512, 1024) takes 23.6, 137 and 6,992 us
# against 25.6, 128 and 8,194 us for the same formula written out, and 3.4 times one
# multiply at the largest size, so the fused op saves nothing on the CPU; where its
# formula's reciprocal is kept for the backward pass, it computes everything twice (the
# corpus Llama's training step: 5.97 ms with it, 5.44 ms without). logsumexp takes 26.8,
# 294 and 8,949 us against 16.0, 241 and 5,465 us for log(sum(exp(x))): its max shift
# costs two passes more (it stays the choice where accuracy is the objective).
# torch.einsum plans its equation and calls permutes, reshapes and bmm itself: at
# (2, 4, 8, 16) 'bhid,bhjd->bhij' takes 12.7 us against 6.1 us for the matmul of a
# transposed view, capsule routing's 'bjm,bijm->bij' at (2, 10, 16), (2, 32, 10, 16) 21.0
# us against 17.5 us for its unsqueeze, permutes, matmul and squeeze (each view 0.7-0.8
# us): two launches more than the matmul it makes.
# sdpa (the flash kernel for the CPU, one call) takes 12.5 us at (2, 4, 8, 16), where its
# arithmetic takes 0.1 us: 10 us of setup beyond a launch. Eager's five ops written out take
# 19.4 us there (sdpa stays the choice); in Inductor's code (two bmm and one fused softmax
# kernel) 22.9 us against 26.0 us for sdpa, and 1.27 ms against 1.31 ms at (2, 12, 128,
# 64), each with torch.compile's 10-20 us per call; at (4, 12, 512, 64) sdpa's 39.5 ms beat
# 63.6 ms, the score matrix's traffic then outweighing its setup. In the corpus BERT's
# forward through Inductor, each sdpa call took 15 us of the step's 200.


ELEMENT_OPS = ("exp", "log", "tanh", "sigmoid", "silu", "gelu", "gelu:tanh", "erf",
               "softplus", "sin",
               "cos", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "div", "softmax",
               "log_softmax", "logsumexp", "masked_fill")
"""The ops whose time per element :func:`measure_cpu` measures (the ``element_seconds``
of a profile): the transcendental ones, an add-like op (div) beside them, and
``masked_fill``, whose CPU kernel branches on every element: 10 times a multiply's time
with a causal mask, 30 with a random one (it is timed with a causal pattern, as attention
masks are)."""


def _of_form(seconds: dict[str, float], op: str, variant: str | None) -> float:
    """``op``'s entry of ``seconds`` in its form ``variant`` (``op:variant``) where there is
    one, else the op's own, else 0."""
    if variant is not None and f"{op}:{variant}" in seconds:
        return seconds[f"{op}:{variant}"]
    return seconds.get(op, 0.0)


CALL_OPS = ("batch_norm", "layer_norm", "rms_norm", "softmax", "log_softmax", "mean", "sum",
            "amax", "var", "max_pool2d", "avg_pool2d", "pad", "embedding", "gelu",
            "gelu:tanh", "cat", "gather", "cumsum", "masked_fill", "number_operand")
"""The ops whose fixed cost per eager call :func:`measure_cpu` measures (the
``call_seconds`` of a profile): a call on a tiny operand, less an add's, where the op's
wrapper or kernel does more per call than an add's (a batch norm computes its scale and
shift per channel first, a mean divides by a count it makes a tensor of, the erf GELU
sets up a vectorised kernel). ``number_operand``: what a Python number costs an
elementwise call where a tensor would not (torch makes a 0-dim tensor of it and casts
it, or emission makes one with ``new_tensor``): ``x * 2.0`` against ``x + y``, 4.3 us
against 1.9 on one CPU."""


def least_seconds(call, n: int = 7) -> float:
    """The least of ``n`` timed calls of ``call`` after one untimed: load from other
    processes only ever adds time, so on a shared machine the least is the closest to the
    machine's own speed (a median measured beside a busy job once priced an exp at 30 ns
    an element, 30 times its time).

    >>> 0 < least_seconds(lambda: sum(range(100)), 3) < 1
    True
    """
    import time

    call()
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu(threads: int = 1) -> Hardware:
    """Measure this machine's profile on ``threads`` threads: fp32 matmul, memory and
    cache bandwidth (copies of 128 MiB and of half the private cache,
    :func:`private_cache_bytes`), per-op overhead, the time per
    element of :data:`ELEMENT_OPS` on 256K elements (1 MiB, in cache), what a sum over
    two memory formats adds per element (``mixed_layout``), what a convolution over a
    channels-last input adds per element of a row-major weight (``conv_weight_layout``),
    what copying a transposed matrix to row-major takes per element (``transposed_copy``),
    what a fresh result's pages take to fault in per byte (``fresh_mapping``),
    sdpa's setup (a call on a tiny attention, less a launch) and the fixed cost of a call
    of each of :data:`CALL_OPS` (``call_seconds``); each the least of several calls
    (:func:`least_seconds`)."""
    import torch
    import torch.nn.functional as functional

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    matmul = 2 * 1024**3 / least_seconds(lambda: a @ b)
    x = torch.randn(32 * 1024 * 1024)
    y = torch.empty_like(x)
    bandwidth = 2 * x.numel() * 4 / least_seconds(lambda: y.copy_(x))
    z = torch.randn(64)
    overhead = least_seconds(lambda: torch.add(z, z), 101)
    cache_bytes = private_cache_bytes() or CACHE_BYTES
    # (a copy inside the cache it prices: source and destination take half of it)
    small = torch.randn(int(cache_bytes) // 16)
    into = torch.empty_like(small)
    cache_bandwidth = 2 * small.numel() * 4 / max(
        least_seconds(lambda: into.copy_(small), 31) - overhead, 1e-9)
    cached = torch.randn(256 * 1024)  # stays in cache: compute-bound
    vector = cached.numel() / least_seconds(lambda: cached.mul_(1.0), 31)
    kernels = _element_kernels(torch)
    positive = torch.rand(256, 1024) + 0.5  # in every op's domain
    element_seconds = tuple(
        (op, (least_seconds(lambda fn=kernels[op]: fn(positive), 31) - overhead) / positive.numel())
        for op in ELEMENT_OPS)
    # an elementwise op over operands of two memory formats (a oneDNN convolution's
    # channels-last output beside a contiguous one), at a ResNet stage's size, both orders
    plain, other = torch.randn(1, 256, 56, 56), torch.randn(1, 256, 56, 56)
    last = other.contiguous(memory_format=torch.channels_last)
    one_format = least_seconds(lambda: plain + other, 31)
    mixed = (least_seconds(lambda: plain + last, 31) + least_seconds(lambda: last + plain, 31)) / 2
    element_seconds += (("mixed_layout", max(mixed - one_format, 0.0) / plain.numel()),)
    # torch's convolution over a channels-last input permutes a row-major weight each call
    # into a new buffer (ResNet-50's last stage, 512 channels, 3 x 3): per weight element,
    # less the same convolution with the weight channels-last; calls timed four in a row,
    # as a model makes them (the least single call missed most of what a fresh buffer
    # costs: 1.0 ms against 3.8 a call in a row on one CPU)
    image = torch.randn(1, 512, 7, 7).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(512, 512, 3, 3)
    weight_last = weight.contiguous(memory_format=torch.channels_last)
    permuting, permuted = (least_seconds(lambda w=w: [functional.conv2d(image, w, padding=1)
                                                        for _ in range(4)], 7) / 4
                           for w in (weight, weight_last))
    element_seconds += (("conv_weight_layout", max(permuting - permuted, 0.0) / weight.numel()),)
    # a transposed matrix copied to row-major (ROW_MAJOR_OPERAND), larger than the caches:
    # strided reads, 3 ns an element against 1.1 for a plain copy on one CPU
    rows = torch.randn(2048, 4096)
    element_seconds += (("transposed_copy",
                         least_seconds(lambda: rows.t().contiguous(), 5) / rows.numel()),)
    # a result of FRESH_MAPPING_BYTES or more: a fill of a fresh block less one into a
    # block kept, per byte (0 where the allocator keeps large blocks)
    large = 2 * FRESH_MAPPING_BYTES // 4
    kept = torch.empty(large)
    fresh = least_seconds(lambda: torch.empty(large).fill_(0.0), 5)
    element_seconds += (("fresh_mapping",
                         max(fresh - least_seconds(lambda: kept.fill_(0.0), 5), 0.0)
                         / (4 * large)),)
    q = torch.randn(2, 4, 8, 16)  # arithmetic of 0.1 us: the call's setup alone
    attention = least_seconds(lambda: functional.scaled_dot_product_attention(q, q, q), 101)
    calls = _call_kernels(torch)
    call_seconds = tuple((op, max(least_seconds(calls[op], 101) - overhead, 0.0))
                         for op in CALL_OPS)
    torch.set_num_threads(before)
    return Hardware("cpu", matmul, matmul, vector, bandwidth, overhead,
                    cache_bytes=cache_bytes, cache_bandwidth=cache_bandwidth,
                    element_seconds=element_seconds,
                    extern_seconds=tuple((op, max(attention - overhead, 0.0))
                                         for op in ("sdpa", "masked_attention")),
                    call_seconds=call_seconds)


def _call_kernels(torch) -> dict:
    """The torch call :func:`measure_cpu` times for each of :data:`CALL_OPS`, on operands
    of 64 elements (an image of 8 channels of 4 x 4 for the image ops)."""
    functional = torch.nn.functional
    rows, image = torch.randn(4, 16), torch.randn(1, 8, 4, 4)
    channel, row = torch.randn(8), torch.randn(16)
    index, above = torch.tensor([1, 2]), torch.ones(4, 16, dtype=torch.bool).triu(1)
    return {"batch_norm": lambda: functional.batch_norm(image, channel, channel, channel,
                                                         channel, False, 0.1, 1e-5),
            "layer_norm": lambda: functional.layer_norm(rows, (16,), row, row),
            "rms_norm": lambda: functional.rms_norm(rows, (16,), row),
            "softmax": lambda: torch.softmax(rows, -1),
            "log_softmax": lambda: torch.log_softmax(rows, -1),
            "mean": lambda: torch.mean(rows, -1), "sum": lambda: torch.sum(rows, -1),
            "amax": lambda: torch.amax(rows, -1), "var": lambda: torch.var(rows, -1),
            "max_pool2d": lambda: functional.max_pool2d(image, 2),
            "avg_pool2d": lambda: functional.avg_pool2d(image, 2),
            "pad": lambda: functional.pad(image, (1, 1, 1, 1)),
            "embedding": lambda: functional.embedding(index, rows),
            "gelu": lambda: functional.gelu(rows),
            "gelu:tanh": lambda: functional.gelu(rows, approximate="tanh"),
            "cat": lambda: torch.cat([rows, rows], 1),
            "gather": lambda: torch.gather(rows, 1, index.view(2, 1)),
            "cumsum": lambda: torch.cumsum(rows, -1),
            "masked_fill": lambda: rows.masked_fill(above, float("-inf")),
            "number_operand": lambda: torch.mul(rows, 2.0)}


def _element_kernels(torch) -> dict:
    """The torch call :func:`measure_cpu` times for each of :data:`ELEMENT_OPS` (GELU in
    both forms; softmaxes and logsumexp over rows of 1024, timed per input element;
    masked_fill above the diagonal of its (256, 1024) input)."""
    functional = torch.nn.functional
    above = torch.ones(256, 1024, dtype=torch.bool).triu(1)  # a causal mask's pattern
    return {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
            "silu": functional.silu, "gelu": functional.gelu,
            "gelu:tanh": lambda x: functional.gelu(x, approximate="tanh"),
            "erf": torch.erf, "softplus": functional.softplus, "sin": torch.sin,
            "cos": torch.cos, "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt,
            "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
            "div": lambda x: torch.div(x, x), "softmax": lambda x: torch.softmax(x, -1),
            "log_softmax": lambda x: torch.log_softmax(x, -1),
            "logsumexp": lambda x: torch.logsumexp(x, -1),
            "masked_fill": lambda x: x.masked_fill(above, float("-inf"))}


def measure_merged_gemm(shapes=MERGED_SHAPES, repeat: int = 101,
                        threads: int = 1) -> list[tuple[float, float]]:
    """Per ``(rows, inner, widths)``: the median seconds of the separate products
    ``x @ w_i`` and of the one merged product ``x @ cat(w_i)`` (fp32, torch.matmul), timed
    alternately so that both see the same load on a shared machine, on ``threads`` threads
    (one: on a loaded 2-core machine a second thread's spin-waits stall for milliseconds).

    >>> separate, merged = measure_merged_gemm([(4, 8, (8, 8))], repeat=3)[0]
    >>> separate > 0 and merged > 0
    True
    """
    import statistics
    import time

    import torch

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    out = []
    for rows, inner, widths in shapes:
        x = torch.randn(rows, inner)
        ws = [torch.randn(inner, n) for n in widths]
        merged = torch.cat(ws, 1)

        def separate(x=x, ws=ws):
            return [torch.matmul(x, w) for w in ws]

        def one(x=x, merged=merged):
            return torch.matmul(x, merged)

        separate(), one()
        pairs = [(timed(separate), timed(one)) for _ in range(repeat)]
        out.append((statistics.median(p[0] for p in pairs),
                    statistics.median(p[1] for p in pairs)))
    torch.set_num_threads(before)
    return out


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["merged"]:
        for (rows, inner, widths), (sep, one) in zip(MERGED_SHAPES, measure_merged_gemm()):
            saved = (sep - one) / (len(widths) - 1)
            print(f"{rows}x{inner} @ {widths}: separate {sep * 1e6:.1f} us, merged "
                  f"{one * 1e6:.1f} us, {saved * 1e6:.1f} us per product saved")
    else:
        profile = measure_cpu()
        print(profile)
        for op, seconds in profile.element_seconds:
            print(f"{op:12} {seconds * 1e9:6.2f} ns per element")
