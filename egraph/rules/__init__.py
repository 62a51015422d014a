"""The rule library: rules as data, one module per family, each with its soundness example.

Families: ``algebra`` (identities, canonical forms, reassociation), ``stability``
(numerically stable forms of naive formulas), ``fusion`` (fused ops from their pieces) and
``layout`` (transposes, permutes, reshapes). ``load_rules`` composes them:

>>> rules = load_rules("stability", "fusion")
>>> any(r.name == "log1p" for r in rules)
True
>>> sorted(FAMILIES)
['algebra', 'fusion', 'layout', 'stability']

Every rule carries a PyTorch ``example`` (the naive code it fires on) and the ``inputs``
that example takes; the registry refuses a rule without them, and the test suite runs each
through :func:`egraph.testing.check_rule` (random instances, float64 reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egraph.rewrite import Rewrite

FAMILIES = ("algebra", "stability", "fusion", "layout")


@dataclass(frozen=True)
class Input:
    """An example input: a shape, and the domain its values come from (and that is
    declared to the analysis as proven): ``any``, ``positive``, ``nonneg``, ``negative``,
    ``nonzero``, ``unit`` (0..1), ``bool``, or ``index:N`` (integers below N)."""

    shape: tuple[int, ...]
    domain: str = "any"


@dataclass(frozen=True)
class LibraryRule:
    """A registered rule: the rewrite and what users and the soundness tests need."""

    rewrite: Rewrite
    family: str
    description: str
    example: str
    inputs: dict[str, Input] = field(default_factory=dict)
    fires_without_domains: bool = False

    @property
    def name(self) -> str:
        return self.rewrite.name

    @property
    def conditions(self) -> str:
        """The side conditions, readably (empty when unconditional)."""
        guard = self.rewrite.when
        return getattr(guard, "__name__", "") if guard is not None else ""


REGISTRY: dict[str, LibraryRule] = {}


def _as_input(spec: Any) -> Input:
    if isinstance(spec, Input):
        return spec
    if isinstance(spec, tuple) and spec and isinstance(spec[0], tuple):
        return Input(*spec)
    return Input(tuple(spec))


def register(family: str, name: str, lhs, rhs, *, example: str, inputs: dict,
             when=None, description: str = "") -> LibraryRule:
    """Add a rule to the library. ``example`` is a PyTorch expression over the ``inputs``
    (``{"x": (4, 8)}`` or ``{"x": ((4, 8), "positive")}``) on which the rule fires."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
    if name in REGISTRY:
        raise ValueError(f"a rule named {name!r} is already registered")
    if not example or not inputs:
        raise ValueError(
            f"rule {name!r}: every library rule needs a PyTorch example and its inputs, so "
            "that its soundness is tested"
        )
    entry = LibraryRule(Rewrite(name, lhs, rhs, when=when, description=description), family,
                        description, example, {k: _as_input(v) for k, v in inputs.items()})
    REGISTRY[name] = entry
    return entry


def _load_families() -> None:
    from egraph.rules import algebra, fusion, layout, stability  # noqa: F401


def library(*names: str) -> list[LibraryRule]:
    """The registered rules of the named families (``'all'`` for every family)."""
    _load_families()
    wanted: list[str] = []
    for name in names or ("all",):
        if name == "all":
            wanted.extend(FAMILIES)
        elif name in FAMILIES:
            wanted.append(name)
        else:
            raise ValueError(
                f"no rule family {name!r}; choose from {', '.join(FAMILIES)} or 'all'"
            )
    return [r for family in FAMILIES if family in wanted
            for r in REGISTRY.values() if r.family == family]


def load_rules(*names: str) -> list[Rewrite]:
    """The rewrites of the named families, ready for ``EGraph.saturate``.

    >>> len(load_rules("all")) == len(REGISTRY)
    True
    """
    return [r.rewrite for r in library(*names)]
