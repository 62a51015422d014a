"""What torch's allocator hands out while code runs: the most bytes live at once.

On CUDA the caching allocator keeps the figure itself (``torch.cuda.max_memory_allocated``).
On the CPU the profiler's memory events are read: with ``profile_memory=True`` torch's CPU
allocator reports every block it hands out and takes back, whoever asks for it (an op's
result, the temporaries inside an op, the buffers Inductor's generated code allocates
with ``empty_strided_cpu``, a workspace oneDNN takes through torch's allocator). Replayed
in the order they happened, the events give the bytes live after each; the peak is their
maximum. Blocks allocated before the run are not counted, nor are their frees. Memory a
library takes from the system's ``malloc`` behind torch's back (a BLAS's own packing
buffers) is not seen.

The measured peaks of :mod:`compiler.memory` and the workspaces :class:`~extractors.peak.
PeakMemory` measures for the ops whose temporaries have no simple rule both read it.

>>> import torch
>>> allocated_peak(lambda: torch.empty(1000, dtype=torch.float64))
8000
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["allocated_peak"]


def allocated_peak(run: Callable[[], Any], args: tuple = ()) -> int:
    """The peak bytes allocated while ``run()`` runs, beyond what was allocated before,
    on the device of the first CUDA tensor among ``args`` (the CPU where there is none):
    what :func:`compiler.memory.peak_bytes` and :func:`compiler.memory.training_peak_bytes`
    measure.

    >>> allocated_peak(lambda: torch.ones(10, 10).sum())  # the ones, then the sum
    404
    """
    cuda = [a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"]
    if cuda:
        torch.cuda.synchronize(cuda[0])
        torch.cuda.reset_peak_memory_stats(cuda[0])
        base = torch.cuda.memory_allocated(cuda[0])
        out = run()
        torch.cuda.synchronize(cuda[0])
        peak = torch.cuda.max_memory_allocated(cuda[0]) - base
        del out
        return peak
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
        del out  # (inside: the allocator forgets the block's size once it is freed)
    return _running_peak(prof.profiler.kineto_results.experimental_event_tree())


def _running_peak(events: list) -> int:
    """The most bytes live at once among the CPU allocations in the profiler's ``events``
    (a tree), in the order they happened; a free of a block allocated before counts
    nothing."""
    blocks = sorted((e for e in _walk(events) if e.tag.name == "Allocation"
                     and e.extra_fields.device.type == "cpu"),
                    key=lambda e: e.start_time_ns)
    sizes: dict[int, int] = {}
    live = peak = 0
    for event in blocks:
        block = event.extra_fields
        if block.alloc_size > 0:
            live += block.alloc_size - sizes.get(block.ptr, 0)
            sizes[block.ptr] = block.alloc_size
            peak = max(peak, live)
        else:
            live -= sizes.pop(block.ptr, 0)
    return peak


def _walk(events: list) -> Iterator:
    """Every event of the profiler's tree, each before its children."""
    stack = list(reversed(events))
    while stack:
        event = stack.pop()
        yield event
        stack.extend(reversed(event.children))
