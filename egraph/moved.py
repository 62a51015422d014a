"""Names that moved to another module, still found at their old path for one release.

A module whose names moved gives them back through a module-level ``__getattr__`` (PEP
562) that warns, naming the new path:

>>> import warnings
>>> __getattr__ = moved_names("old.place", {"sqrt": "math"})
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     root = __getattr__("sqrt")
>>> root(4.0), str(caught[0].message)
(2.0, 'old.place.sqrt moved to math.sqrt')
>>> __getattr__("cbrt")
Traceback (most recent call last):
...
AttributeError: module 'old.place' has no attribute 'cbrt'
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` (its ``__name__``) for the names ``moved`` (name ->
    the module it moved to): each found there, with a DeprecationWarning."""
    def __getattr__(name: str) -> Any:
        new = moved.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {new}.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
