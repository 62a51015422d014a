"""Measured memory: the peak bytes a program allocates while it runs.

Every allocation counts (:mod:`extractors.allocator`: on CUDA the caching allocator's
figure; on the CPU each block torch's allocator hands out and takes back, an op's result,
its temporaries, the buffers Inductor's code allocates outside the dispatcher). Blocks
allocated before the run (inputs, parameters) are not counted: the convention of the
:class:`~extractors.peak.PeakMemory` estimate, which this figure checks. Below: exp(x)
and the product, 256 KiB each, and the number 2, which becomes a float64 tensor and then a
float32 copy of it (12 bytes).

>>> import torch
>>> x = torch.randn(256, 256)
>>> peak_bytes(lambda x: (x.exp() * 2).sum(), x)
524300
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from extractors.allocator import allocated_peak

__all__ = ["peak_bytes", "saved_bytes", "training_peak_bytes"]


def peak_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """The peak bytes allocated while ``fn(*args)`` runs without autograd, beyond what
    was allocated before (its outputs included, as they are live at the end). Every
    allocation counts: outputs, temporaries inside ops, a compiled program's buffers, the
    small tensors a Python number becomes. A compiled function compiles on its first
    call: measure a later one.

    >>> x = torch.randn(1024)                          # 4 KiB
    >>> def chain(x):
    ...     a = x.exp()
    ...     b = a.tanh()
    ...     del a                                      # freed before c is made
    ...     return b.sigmoid()
    >>> peak_bytes(chain, x)                           # two 4 KiB tensors at most
    8192
    """
    with torch.no_grad():
        return allocated_peak(lambda: fn(*args), args)


def training_peak_bytes(loss: Callable[..., torch.Tensor], *args: Any) -> int:
    """The peak bytes allocated by one training step: ``loss(*args)`` with autograd on,
    then its backward, beyond what was allocated before. Parameters and inputs are not
    counted; the activations kept for the backward, the backward's temporaries and the
    gradients are (a gradient is allocated whether it lands in an empty ``.grad`` or is
    added into one already there).

    >>> w = torch.nn.Parameter(torch.randn(64, 64))    # 16 KiB
    >>> x = torch.randn(64, 64)
    >>> training_peak_bytes(lambda x: (x @ w).tanh().sum(), x)
    32776

    tanh keeps its output (16 KiB) for the backward, which computes the gradient through
    tanh (16 KiB) before it frees it, then w's gradient from that; the loss and the
    gradient it starts from are 4 bytes each.
    """
    def step() -> None:
        loss(*args).backward()

    with torch.enable_grad():
        return allocated_peak(step, args)


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def saved_bytes(fn: Callable[..., Any], *args: Any,
                parameters: Iterable[torch.Tensor] = ()) -> int:
    """The bytes of activations autograd keeps for the backward pass of ``fn(*args)``: the
    storages of the tensors saved for backward (each once, views and repeats counted with
    their storage), not counting the inputs' and parameters' own (nor a view's of them),
    which exist anyway: pass the model's ``parameters`` too, so that a view of one that a
    compiled graph saves (a transposed weight, which aot_autograd hands back detached) is
    not counted either.
    Saved-tensor hooks see what every graph saves, compiled ones (aot_autograd's forward,
    Inductor's) included, so the figure compares a training step across backends. The
    forward runs with grad enabled; its output is dropped (nothing is backpropagated).

    >>> w = torch.randn(64, 64, requires_grad=True)
    >>> x = torch.randn(8, 64)
    >>> saved_bytes(lambda x: (x @ w).tanh().sum(), x)  # tanh keeps its output
    2048
    """
    given = {_address(a) for a in (*args, *parameters) if isinstance(a, torch.Tensor)}
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

