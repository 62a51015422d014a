"""Measured memory: the peak bytes a program allocates while it runs.

On CUDA the caching allocator's own figure (``torch.cuda.max_memory_allocated`` above what
was allocated before the run). On the CPU, where torch keeps no such statistic, every
tensor storage an operation creates is counted from its creation until the last tensor
that uses it is freed (a dispatch mode sees each op; views share their base's storage).
Inputs and parameters, allocated before the run, are not counted: the same convention as
the :class:`~extractors.costs.PeakMemory` estimate, which this figure checks.

>>> import torch
>>> x = torch.randn(256, 256)                   # 256 KiB
>>> peak_bytes(lambda x: (x.exp() * 2).sum(), x)  # exp(x) and the product, 256 KiB each
524288
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode

from frontends.fx.effects import sees_rng_replays

__all__ = ["peak_bytes", "saved_bytes"]


@sees_rng_replays
class _LiveStorages(TorchDispatchMode):
    """Counts the bytes of the storages the ops create, while a tensor holds them."""

    def __init__(self) -> None:
        super().__init__()
        # storage address -> weak refs of the tensors using it (a list: weak refs to live
        # tensors compare by the tensors' ==), and how many of them are alive
        self.holders: dict[int, list[weakref.ref]] = {}
        self.alive: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.known: set[int] = set()  # storages that existed before the run
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = set()
        fx.node.map_aggregate((args, kwargs or {}), lambda a: before.add(_address(a))
                              if isinstance(a, torch.Tensor) else None)
        out = func(*args, **(kwargs or {}))
        found: list[torch.Tensor] = []
        fx.node.map_aggregate(out, lambda a: found.append(a)
                              if isinstance(a, torch.Tensor) else None)
        for t in found:
            key = _address(t)
            if key in self.holders:
                self.holders[key].append(weakref.ref(t, self._dropper(key)))
                self.alive[key] += 1
            elif key not in before and key not in self.known and key:
                size = t.untyped_storage().nbytes()
                self.holders[key] = [weakref.ref(t, self._dropper(key))]
                self.alive[key] = 1
                self.sizes[key] = size
                self.live += size
                self.peak = max(self.peak, self.live)
        # pre-existing storages (inputs, parameters); a freed intermediate's address may be
        # reused by a new storage, which then counts
        self.known.update(before - self.holders.keys())
        return out

    def _dropper(self, key: int) -> Callable[[weakref.ref], None]:
        def drop(ref: weakref.ref) -> None:
            if key not in self.alive:
                return
            self.alive[key] -= 1
            if not self.alive[key]:
                del self.holders[key], self.alive[key]
                self.live -= self.sizes.pop(key)
        return drop


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def peak_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """The peak bytes allocated while ``fn(*args)`` runs without autograd, beyond what
    was allocated before (its outputs included, as they are live at the end)."""
    cuda = [a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"]
    with torch.no_grad():
        if cuda:
            torch.cuda.synchronize(cuda[0])
            torch.cuda.reset_peak_memory_stats(cuda[0])
            base = torch.cuda.memory_allocated(cuda[0])
            out = fn(*args)
            torch.cuda.synchronize(cuda[0])
            peak = torch.cuda.max_memory_allocated(cuda[0]) - base
            del out
            return peak
        with _LiveStorages() as mode:
            out = fn(*args)
        del out
        return mode.peak


def saved_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """The bytes of activations autograd keeps for the backward pass of ``fn(*args)``: the
    storages of the tensors saved for backward (each once, views and repeats counted with
    their storage), not counting the inputs' and parameters' own, which exist anyway.
    Saved-tensor hooks see what every graph saves, compiled ones (aot_autograd's forward,
    Inductor's) included, so the figure compares a training step across backends. The
    forward runs with grad enabled; its output is dropped (nothing is backpropagated).

    >>> w = torch.randn(64, 64, requires_grad=True)
    >>> x = torch.randn(8, 64)
    >>> saved_bytes(lambda x: (x @ w).tanh().sum(), x)  # tanh keeps its output
    2048
    """
    given = {_address(a) for a in args if isinstance(a, torch.Tensor)}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _address(t)
        if key and key not in given and not isinstance(t, torch.nn.Parameter) and not (
                t.is_leaf and t.requires_grad):
            kept[key] = t.untyped_storage().nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    del out
    return sum(kept.values())

