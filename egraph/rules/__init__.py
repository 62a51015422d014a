"""The rule library: rules as Python term patterns, one plain list per family.

Families: ``algebra`` (identities, canonical forms, reassociation), ``stability``
(numerically stable forms of naive formulas), ``fusion`` (fused ops from their pieces),
``layout`` (transposes, permutes, reshapes) and ``kernels`` (other library kernels for an
op, chosen by measured speed). Each family module holds ``RULES``, a list of
:func:`~egraph.rules.define.rule` entries that read like the identities they state:

    rule("log1p", log(1 + x), log1p(x), when=floating(x),
         example=lambda x: torch.log(1 + x), inputs={"x": ((4, 8), "unit")})

``load_rules`` composes the families:

>>> rules = load_rules("stability", "fusion")
>>> any(r.name == "log1p" for r in rules)
True
>>> sorted(FAMILIES)
['algebra', 'fusion', 'kernels', 'layout', 'stability']

A family is a module of this package holding ``RULES``, ``LOADED`` (``'all'``: loaded by
``load_rules('all')``; ``'by name'``: only when named) and ``ORDER`` (its place in
``load_rules('all')``; then by name): a new family is one new module, found when the package
is imported.

Every rule carries PyTorch examples (callables over its ``inputs``) on which it fires; the
test suite runs each through :func:`compiler.soundness.check_rule` (random instances,
float64 reference). A rule of your own is one ``rule(...)`` line in a family's list, or a
list of your own passed to ``saturate`` next to ``load_rules(...)``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

from egraph.rewrite import Rewrite
from egraph.rules.define import Input, LibraryRule, rule

__all__ = ["FAMILIES", "OPT_IN", "Input", "LibraryRule", "library", "load_rules", "rule"]


def _family_modules() -> list:
    """The modules of this package that are rule families (they hold ``RULES``), in their
    ``ORDER``: a new family is a new module, found here."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "RULES"):
            if getattr(module, "LOADED", None) not in ("all", "by name"):
                raise ValueError(f"rule family {info.name!r}: set LOADED = 'all' (loaded by "
                                 "load_rules('all')) or 'by name' in its module")
            found.append(module)
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def _named(loaded: str) -> dict[str, list[LibraryRule]]:
    return {m.__name__.rpartition(".")[2]: [replace(r, family=m.__name__.rpartition(".")[2])
                                            for r in m.RULES]
            for m in _family_modules() if m.LOADED == loaded}


FAMILIES: dict[str, list[LibraryRule]] = _named("all")
"""Each family's rules, in order, with their family set: the modules with ``LOADED = 'all'``."""

OPT_IN: dict[str, list[LibraryRule]] = _named("by name")
"""Families loaded only by name, not by ``'all'`` (``LOADED = 'by name'``): ``herbie``
(Herbie's rule database, for the accuracy search on one localised formula; its flips and
fraction rules multiply every sum of a model) and ``tensat`` (TASO's axioms as TENSAT uses
them; they distribute every matmul and concatenation, more than doubling saturation time;
its operator merging is in ``layout``)."""


def _check_unique() -> None:
    seen: set[str] = set()
    for rules in (*FAMILIES.values(), *OPT_IN.values()):
        for r in rules:
            if r.name in seen:
                raise ValueError(f"two library rules are named {r.name!r}; rename one")
            seen.add(r.name)


_check_unique()


def library(*names: str) -> list[LibraryRule]:
    """The library rules of the named families (``'all'`` for every family).

    >>> {r.name: r for r in library("all")}["log1p"].family
    'stability'
    """
    wanted: set[str] = set()
    for name in names or ("all",):
        if name == "all":
            wanted.update(FAMILIES)
        elif name in FAMILIES or name in OPT_IN:
            wanted.add(name)
        else:
            raise ValueError(f"no rule family {name!r}; choose from "
                             f"{', '.join([*FAMILIES, *OPT_IN])} or 'all'")
    return [r for family, rules in {**FAMILIES, **OPT_IN}.items() if family in wanted
            for r in rules]


def load_rules(*names: str) -> list[Rewrite]:
    """The rewrites of the named families, ready for ``EGraph.saturate``.

    >>> len(load_rules("all")) == sum(len(rules) for rules in FAMILIES.values())
    True
    """
    return [r.rewrite for r in library(*names)]
