"""The ``egraph`` torch.compile backend's options: one frozen object, checked where the
user passes them (``make_backend(...)``, ``torch.compile(..., options={...})``) and then
handed whole to each graph's compile.

>>> BackendOptions(codegen="inductor", iter_limit=4).limits
{'iter_limit': 4, 'node_limit': 50000, 'time_limit': 10.0}
>>> BackendOptions.of({"memory_budget": 0.5}).budget
MemoryBudget(fraction=0.5, bytes=None)
>>> BackendOptions.of({"memory_limit": 0.5})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: unknown egraph backend option 'memory_limit'; the options are: rules, cost, ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compiler.autotune import Autotune
from compiler.partition import MemoryBudget
from compiler.validate import REFERENCES

CODEGENS = ("eager", "inductor")
"""Who generates the code of the optimised graph: ``eager`` runs it as the ordinary torch
calls we emit (Triton kernels for fusion regions on CUDA), through aot_autograd so the
backward graph is optimised too; ``inductor`` hands the optimised graph to Inductor
(``compile_fx``), so the e-graph's rewrites come on top of Inductor's fusion and code
generation (its compile time too). The default is
:func:`compiler.compile.default_codegen`."""

VALIDATIONS = ("strict", "raise", "off")
"""What a program that fails validation does: fall back to the source with a warning
(``strict``), raise, or go unchecked (``off``)."""

@dataclass(frozen=True)
class BackendOptions:
    """Everything the backend does with each graph: the ``rules`` saturated (None: the
    whole library; ``()`` for none), the ``cost`` model extracted under (None: the
    default for the inputs' device), ``validate`` (:data:`VALIDATIONS`) against the
    ``reference`` (:data:`compiler.validate.REFERENCES`), the ``codegen``
    (:data:`CODEGENS`; None: the default for the inputs' device) with Inductor's config
    patches
    ``inductor_options``, ``memory`` (measure each graph's peak memory), the saturation
    limits, and a training graph's memory budget (:attr:`budget`): ``memory_budget``, a
    fraction in (0, 1] of what torch's min-cut partitioner saves for the backward, or
    ``memory_budget_bytes``; ``autotune`` (True, or a :class:`compiler.autotune.Autotune`
    of its settings): time the programs the cost model is unsure between on the example
    inputs and keep the fastest (off by default; ``mode="max-autotune"`` turns it on).

    >>> BackendOptions(validate="sometimes")
    Traceback (most recent call last):
    ...
    ValueError: validate='sometimes': use one of 'strict', 'raise', 'off'
    """

    rules: Any = None
    cost: Any = None
    validate: str = "strict"
    codegen: str | None = None
    reference: str = "auto"
    memory: bool = False
    inductor_options: Mapping[str, Any] | None = None
    iter_limit: int = 10
    node_limit: int = 50_000
    time_limit: float = 10.0
    memory_budget: float | None = None
    memory_budget_bytes: int | None = None
    autotune: bool | Autotune = False

    def __post_init__(self) -> None:
        for name, allowed in (("validate", VALIDATIONS), ("reference", REFERENCES),
                              ("codegen", (None, *CODEGENS))):
            value = getattr(self, name)
            if value not in allowed:
                choices = ", ".join(repr(a) for a in allowed if a is not None)
                raise ValueError(f"{name}={value!r}: use one of {choices}")
        for name in ("iter_limit", "node_limit", "time_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name}={value!r}: a positive number")
        if self.inductor_options is not None and not isinstance(self.inductor_options,
                                                                 Mapping):
            raise TypeError(f"inductor_options={self.inductor_options!r}: a mapping of "
                            "Inductor config names to values")
        self.budget  # noqa: B018  (checks the budget)
        Autotune.of(self.autotune)  # (checks the setting)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> BackendOptions:
        """The options a mapping names, with a clear error for a name that is not one.

        >>> BackendOptions.of({"validate": "raise"}).validate
        'raise'
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in options if key not in names]
        if unknown:
            raise TypeError(f"unknown egraph backend option {unknown[0]!r}; the options "
                            f"are: {', '.join(names)}")
        return cls(**options)

    @property
    def budget(self) -> MemoryBudget | None:
        """What a training graph may save for its backward (None: no budget: as emitted,
        or as aot_autograd's min-cut partitioner chooses); see
        :class:`compiler.partition.BudgetedPartition`."""
        if self.memory_budget is None and self.memory_budget_bytes is None:
            return None
        return MemoryBudget(self.memory_budget, self.memory_budget_bytes)

    @property
    def limits(self) -> dict[str, Any]:
        """The saturation limits, as ``EGraph.saturate`` takes them."""
        return {"iter_limit": self.iter_limit, "node_limit": self.node_limit,
                "time_limit": self.time_limit}
