"""Python's cyclic garbage collector paused for the length of a pipeline phase.

Ingest, saturation and extraction allocate hundreds of thousands of small containers (the
e-nodes' tuples, the class maps, FX nodes) that survive until the phase ends. Every time
enough of them survive, the cyclic collector scans the whole heap, the modules of torch and
of the user's model included: 0.4 s of a 12-layer decoder's pipeline, for almost no garbage
(what a phase drops is freed by reference counting as usual). A paused phase leaves the
few cycles it made to the first collection after it. The collector is left alone where the
caller has turned it off, and a nested phase does not turn it back on early.

>>> import gc
>>> @gc_paused
... def phase():
...     return gc.isenabled()
>>> phase(), gc.isenabled()
(False, True)
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

__all__ = ["gc_paused"]

F = TypeVar("F", bound=Callable)


def gc_paused(phase: F) -> F:
    """``phase`` run with the cyclic garbage collector off (see the module docstring)."""

    @functools.wraps(phase)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return phase(*args, **kwargs)
        gc.disable()
        try:
            return phase(*args, **kwargs)
        finally:
            gc.enable()

    return paused  # type: ignore[return-value]
