"""Running the programs a validation compares: seeded alike, without grad, side by side
in two threads where a large program has cores to spare; a source that draws random
numbers records its draws (:class:`Draws`) for a float64 run to replay, and allocations of
whatever the memory held are filled (:class:`FilledBlanks`) so that runs agree on what a
program leaves unwritten."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from frontends.fx.effects import UNINITIALISED, sees_rng_replays
from frontends.fx.kept import state_kept

__all__ = ["SIDE_BY_SIDE_NUMEL", "Draws", "FilledBlanks", "flat_outputs", "run_new",
           "run_source", "seed_torch", "side_by_side"]


def flat_outputs(out: Any) -> list[Any]:
    """A program's outputs as a flat list, nested tuples, lists and dicts taken apart.

    >>> flat_outputs((1, [2, {"a": 3}]))
    [1, 2, 3]
    """
    leaves: list[Any] = []
    fx.node.map_aggregate(out, leaves.append)
    return leaves


SIDE_BY_SIDE_NUMEL = 1 << 20
"""Programs with at least this many elements of inputs and parameters run the source and
the new program side by side, in two worker threads, where the CPU has cores to spare
(twice torch's intra-op threads): each pass is then long enough that the two threads
seldom wait for the GIL (torch releases it inside every op), and the pair takes the time of
about one pass (the 12-layer GPT-2-sized decoder on one thread each: 1.25-1.5 s -> 0.7-1.0
s). Both run in workers: the thread that compiles under torch.compile dispatches ops
through Python (aot_autograd's Python dispatcher), holding the GIL, so a pass there and
one in a worker took as long as the two in turn."""


def side_by_side(original: nn.Module, inputs: tuple, numel: int) -> bool:
    """Whether validation runs the source and the new program side by side
    (:data:`SIDE_BY_SIDE_NUMEL`): on the CPU, with two idle cores per intra-op thread
    count. Where torch already uses every core, two passes at once only contend.

    >>> side_by_side(nn.Linear(2, 2), (torch.randn(1, 2),), numel=8)
    False
    """
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if isinstance(original, nn.Module):
        tensors += list(original.parameters()) + list(original.buffers())
    return (numel >= SIDE_BY_SIDE_NUMEL and 2 * torch.get_num_threads() <= _cores()
            and all(t.device.type == "cpu" for t in tensors))


def _cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _silent(program: Any) -> Any:
    """``program`` to be called where it may raise on inputs it cannot take: a graph
    module's own ``forward`` (its ``__call__`` prints a traceback of the generated code to
    stderr before it raises, noise for an exception that is caught), any other as it is.

    >>> g = fx.symbolic_trace(lambda x: x + 1)
    >>> _silent(g)(torch.ones(1))
    tensor([2.])
    """
    if isinstance(program, fx.GraphModule) and not (
            program._forward_hooks or program._forward_pre_hooks):
        return program.forward
    return program


def seed_torch() -> None:
    """``torch.manual_seed(0)`` on the devices a validation can run on: the CPU's
    generator and, once CUDA is in use, CUDA's. ``torch.manual_seed`` itself queues a
    seeding for each accelerator not yet initialised, with a formatted stack each (3 ms a
    call on a machine without one: a fifth of a small program's pipeline, which seeds
    every run of its validation).

    >>> seed_torch(); first = torch.rand(1)
    >>> seed_torch(); bool(torch.rand(1) == first)
    True
    """
    torch.default_generator.manual_seed(0)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(0)


def _seeded(generators: Sequence[torch.Generator]) -> None:
    """Seed torch's generator and ``generators`` as every run of a validation starts."""
    seed_torch()
    for generator in generators:
        generator.manual_seed(0)


def run_new(new: fx.GraphModule, xs: tuple,
            generators: Sequence[torch.Generator] = ()) -> list:
    """The new program's flat outputs on ``xs``, under the source's seed; grad mode is
    per thread, so it is turned off here for a run in a worker thread too.

    >>> run_new(fx.symbolic_trace(lambda x: (x, x + 1)), (torch.zeros(1),))
    [tensor([0.]), tensor([1.])]
    """
    _seeded(generators)
    with torch.no_grad(), state_kept():
        return flat_outputs(_silent(new)(*xs))


def run_source(original: nn.Module, xs: tuple, generators: Sequence[torch.Generator] = (),
               drawn: list | None = None) -> tuple[tuple, list | None]:
    """The source's flat outputs on ``xs`` (without grad, in any thread); where it raises
    on them, on ``xs`` with its integer tensors zeroed (index 0 is valid in any dim); None
    where it raises on both. ``drawn``: filled with the random ops' results
    (:class:`Draws`).

    >>> rows = fx.symbolic_trace(lambda i, t: t[i])
    >>> xs, out = run_source(rows, (torch.tensor([5]), torch.ones(2)))
    >>> xs[0], out
    (tensor([0]), [tensor([1.])])
    """
    for attempt in (xs, tuple(torch.zeros_like(x) if isinstance(x, torch.Tensor) and not (
            x.is_floating_point() or x.dtype == torch.bool) else x for x in xs)):
        _seeded(generators)
        if drawn is not None:
            drawn.clear()
        try:
            with torch.no_grad(), state_kept(), (
                    nullcontext() if drawn is None else Draws(drawn)):
                return attempt, flat_outputs(_silent(original)(*attempt))
        except Exception:  # noqa: BLE001 - values the source cannot take: try the next
            continue
    return xs, None


@sees_rng_replays
class FilledBlanks(TorchDispatchMode):
    """Allocations of whatever the memory held (``empty_like``) filled with NaN (zero
    for integers and booleans), so that runs agree on the elements a program leaves
    unwritten.

    >>> with FilledBlanks():
    ...     blank = torch.empty(2)
    >>> blank
    tensor([nan, nan])
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in UNINITIALISED and isinstance(out, torch.Tensor):
            out.fill_(math.nan if out.is_floating_point() or out.is_complex() else 0)
        return out


@sees_rng_replays
class Draws(TorchDispatchMode):
    """The results of the random ops run under it, in order, recorded into ``drawn``; or
    with ``replay``, the ones recorded there handed back in turn, in the dtype the run
    asks for. A float64 run of a program that draws random numbers then sees its
    working-dtype run's draws, where under one seed float64 draws others. A replay that
    does not fit (another op, another shape) raises, which leaves that run without a
    reference.

    >>> drawn = []
    >>> with Draws(drawn):
    ...     first = torch.rand(3)
    >>> with Draws(drawn, replay=True):
    ...     again = torch.rand(3, dtype=torch.float64)
    >>> torch.equal(again, first.double())
    True
    """

    def __init__(self, drawn: list, replay: bool = False):
        super().__init__()
        self.drawn, self.replaying, self.at = drawn, replay, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return out
        if not self.replaying:
            self.drawn.append((func, [t.clone() for t in _tensors(out)]))
            return out
        if self.at == len(self.drawn) or self.drawn[self.at][0] is not func:
            raise RuntimeError(f"the replayed run draws otherwise ({func})")
        recorded = self.drawn[self.at][1]
        self.at += 1
        if func is torch.ops.aten.native_dropout.default and args[2:3] != (False,):
            # (its output is the input's values through the mask: kept in this dtype)
            out[1].copy_(recorded[1])
            out[0].copy_(args[0] * out[1] / (1 - args[1]))
            return out
        for made, was in zip(_tensors(out), recorded, strict=True):
            if made.shape != was.shape:
                raise RuntimeError(f"the replayed run draws another shape ({func})")
            made.copy_(was)
        return out


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in flat_outputs(out) if isinstance(t, torch.Tensor)]
