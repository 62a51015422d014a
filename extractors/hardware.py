"""Hardware profiles for the roofline cost model, as data.

Peaks are dense throughputs from the vendors' datasheets (tensor cores for fp16/bf16
matrix products, CUDA cores for fp32); the CPU profile was measured on the project's 2-core
CI machine with ``python -m extractors.hardware`` (fp32 1024x1024 matmul, a 128 MiB copy,
a tiny add). Adding a profile is one entry in :data:`HARDWARE`.

>>> HARDWARE["H100"].peak_flops("matmul", None) > HARDWARE["A100"].peak_flops("matmul", None)
True
"""

from __future__ import annotations

from dataclasses import dataclass

_MATRIX_OPS = {"matmul", "linear", "conv1d", "conv2d", "sdpa"}


@dataclass(frozen=True)
class Hardware:
    """Peak throughputs (FLOP/s), memory bandwidth (bytes/s) and per-kernel overhead (s)."""

    name: str
    matrix_fp32: float
    matrix_half: float
    vector_fp32: float
    bandwidth: float
    launch_overhead: float

    def peak_flops(self, op: str, dtype) -> float:
        """The peak that bounds ``op`` at ``dtype`` (matrix units for half precision)."""
        half = dtype is not None and getattr(dtype, "itemsize", 4) == 2
        if op in _MATRIX_OPS:
            return self.matrix_half if half else self.matrix_fp32
        return self.vector_fp32 * (2 if half else 1)


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 SXM5: 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 3.35 TB/s HBM3.
    "H100": Hardware("H100", 67e12, 989e12, 67e12, 3.35e12, 4e-6),
    # NVIDIA H200 SXM: the H100's compute with 4.8 TB/s HBM3e.
    "H200": Hardware("H200", 67e12, 989e12, 67e12, 4.8e12, 4e-6),
    # NVIDIA A100 SXM4 80GB: 312 TFLOP/s bf16 dense, 19.5 TFLOP/s fp32, 2.04 TB/s HBM2e.
    "A100": Hardware("A100", 19.5e12, 312e12, 19.5e12, 2.04e12, 5e-6),
    # The 2-core CI machine (measured): 48.8 GFLOP/s fp32 matmul, 12.2 GFLOP/s elementwise
    # in cache, 6.1 GB/s copy, 2.5 us per op.
    "cpu": Hardware("cpu", 48.8e9, 48.8e9, 12.2e9, 6.1e9, 2.5e-6),
}


def measure_cpu() -> Hardware:
    """Measure this machine's profile (fp32 matmul, copy bandwidth, per-op overhead)."""
    import time

    import torch

    def median(fn, n: int = 7) -> float:
        fn()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return sorted(times)[n // 2]

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    matmul = 2 * 1024**3 / median(lambda: a @ b)
    x = torch.randn(32 * 1024 * 1024)
    y = torch.empty_like(x)
    bandwidth = 2 * x.numel() * 4 / median(lambda: y.copy_(x))
    cached = torch.randn(256 * 1024)  # stays in cache: compute-bound
    vector = cached.numel() / median(lambda: cached.mul_(1.0), 31)
    z = torch.randn(64)
    overhead = median(lambda: torch.add(z, z), 101)
    return Hardware("cpu", matmul, matmul, vector, bandwidth, overhead)


if __name__ == "__main__":
    print(measure_cpu())
