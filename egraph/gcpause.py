"""Python's cyclic garbage collector paused for the length of a pipeline phase.

Ingest, saturation and extraction allocate hundreds of thousands of small containers (the
e-nodes' tuples, the class maps, FX nodes) that survive until the phase ends. Every time
enough of them survive, the cyclic collector scans the whole heap, the modules of torch and
of the user's model included: 0.4 s of a 12-layer decoder's pipeline, for almost no garbage
(what a phase drops is freed by reference counting as usual). A paused phase leaves the
few cycles it made to the first collection after it. The collector is left alone where the
caller has turned it off, and a nested phase does not turn it back on early. A context
manager rather than a decorator: it adds no frame between the caller and the phase, so
the phases' warnings still point at the caller's line.

>>> import gc
>>> with gc_paused():
...     inside = gc.isenabled()
>>> inside, gc.isenabled()
(False, True)
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The block runs with the cyclic garbage collector off (see the module docstring)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
