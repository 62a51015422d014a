"""torch's convolution by the memory format of its input: ResNet-50's convolution shapes,
each timed with a row-major input, a channels-last input (the weight row-major, as a
model's parameters are), and both channels-last, interleaved in rounds.

    .venv/bin/python benchmarks/conv_layouts.py [--rounds 7] [--calls 20] [--threads 2]

A program that mixes oneDNN's convolutions (which write channels-last) with torch's hands
torch's a channels-last input; this measures what that costs or saves per shape, which a
price of torch's convolution by its FLOPs alone does not see.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = ((64, 56, 64, 1), (64, 56, 64, 3), (128, 28, 128, 3), (256, 14, 256, 3),
          (512, 7, 512, 3), (256, 56, 64, 1), (1024, 14, 256, 1))
"""(input channels, height and width, output channels, kernel size) of ResNet-50's
convolutions at 224 x 224, batch 1."""


def timed(shape: tuple[int, int, int, int], rounds: int, calls: int) -> dict[str, float]:
    """Median milliseconds a call for each input format of one convolution shape."""
    channels, size, out, kernel = shape
    x = torch.randn(1, channels, size, size)
    last = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(out, channels, kernel, kernel), torch.randn(out)
    w_last = w.contiguous(memory_format=torch.channels_last)
    pad = kernel // 2
    variants = {"row-major": lambda: F.conv2d(x, w, b, padding=pad),
                "channels-last input": lambda: F.conv2d(last, w, b, padding=pad),
                "both channels-last": lambda: F.conv2d(last, w_last, b, padding=pad)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for _ in range(rounds):
            for name, call in variants.items():
                call()
                started = time.perf_counter()
                for _ in range(calls):
                    call()
                times[name].append((time.perf_counter() - started) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| in, size, out, kernel | row-major ms | channels-last input ms | both ms |")
    print("|---|---:|---:|---:|")
    for shape in SHAPES:
        ms = timed(shape, args.rounds, args.calls)
        print(f"| {shape} | {ms['row-major']:.3f} | {ms['channels-last input']:.3f} | "
              f"{ms['both channels-last']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
