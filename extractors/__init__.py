"""Cost models: what "best" means for a tensor program.

:class:`CostModel` is the protocol (:mod:`extractors.costs` says what a model gives and
shows a user's own); the models: ``AstSize`` and ``AstDepth`` (the engine's tree costs),
:class:`Flops`, :class:`Memory`, :class:`PeakMemory`, :class:`Curvature`,
:class:`Roofline` (hardware profiles in :data:`HARDWARE`), :class:`RandomCost` (seeded
random programs, or programs near another model's choice), combined with ``+``, ``*`` and
:class:`Lexicographic`; the fusion regions they charge are in :mod:`extractors.fusion`.
``eg.extract(cost, method="greedy" | "dag" | "ilp")`` and ``eg.pareto(cost_a, cost_b)``
use them. How a program is found lives in the engine (:mod:`egraph.extract`);
:func:`extract_serialized` (extraction from the egraph-serialize JSON format, nodes
carrying their costs) and :func:`pareto` are re-exported from there.

>>> from extractors import extract_serialized
>>> data = {"nodes": {"x": {"op": "x", "eclass": "x", "cost": 1},
...                   "f": {"op": "f", "children": ["x", "x"], "eclass": "r", "cost": 1}},
...         "root_eclasses": ["r"]}
>>> e = extract_serialized(data, method="ilp")
>>> e.dag_cost, e.tree_cost, e.optimal
(2, 3, True)
"""

from egraph.extract import AstDepth, AstSize
from egraph.extract.pareto import pareto
from egraph.extract.serialized import Extraction, extract_serialized
from extractors.costs import (
    CostModel,
    Flops,
    Lexicographic,
    Memory,
    Roofline,
)
from extractors.curvature import Curvature
from extractors.hardware import HARDWARE, Hardware
from extractors.peak import PeakMemory
from extractors.randomised import RandomCost

__all__ = [
    "HARDWARE",
    "AstDepth",
    "AstSize",
    "CostModel",
    "Curvature",
    "Extraction",
    "Flops",
    "Hardware",
    "Lexicographic",
    "Memory",
    "PeakMemory",
    "RandomCost",
    "Roofline",
    "extract_serialized",
    "pareto",
]
