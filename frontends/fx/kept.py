"""Kept state: a run of a graph at compile time (recording values, validation) leaves the
caller's global state as it was, however it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["state_kept"]


@contextmanager
def state_kept() -> Iterator[None]:
    """Leave the global state that a graph's calls change as it was, however a run of the
    graph ends: dynamo's graphs hold a vmap's entry and exit (``_vmap_increment_nesting``,
    transformers' masks) and grad mode's changes as calls, and a run stopped between the
    two (an op that raises on the values given) would leave the vmap level on for every
    later tensor op of the process.

    >>> with state_kept():
    ...     level = torch._C._functorch._vmap_increment_nesting(2, "error")
    >>> torch._C._functorch.maybe_current_level() is None
    True
    """
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

    functorch = torch._C._functorch
    level, grad = functorch.maybe_current_level(), torch.is_grad_enabled()
    try:
        yield
    finally:
        while (current := functorch.maybe_current_level()) is not None and (
                level is None or current > level):
            kind = retrieve_current_functorch_interpreter().key().name.lower()
            getattr(functorch, f"_{'func' if kind == 'functionalize' else kind}"
                               "_decrement_nesting")()
        torch.set_grad_enabled(grad)

