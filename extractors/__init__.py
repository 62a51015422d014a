"""Extraction: what "best" means (cost models) and how it is found (algorithms).

Cost models: ``AstSize`` and ``AstDepth`` (the engine's tree costs), :class:`Flops`,
:class:`Memory`, :class:`PeakMemory`, :class:`Curvature`, :class:`Roofline` (hardware
profiles in :data:`HARDWARE`), combined with ``+``, ``*`` and :class:`Lexicographic`.
``eg.extract(cost, method="greedy" | "dag" | "ilp")`` and ``eg.pareto(cost_a, cost_b)``
use them. :func:`extract_serialized`
extracts from e-graphs in the egraph-serialize JSON format (nodes carry their costs) by
tree-cost greedy, DAG-aware greedy or optimal ILP, returning an :class:`Extraction`.

>>> from extractors import extract_serialized
>>> data = {"nodes": {"x": {"op": "x", "eclass": "x", "cost": 1},
...                   "f": {"op": "f", "children": ["x", "x"], "eclass": "r", "cost": 1}},
...         "root_eclasses": ["r"]}
>>> e = extract_serialized(data, method="ilp")
>>> e.dag_cost, e.tree_cost, e.optimal
(2, 3, True)
"""

from egraph.extract import AstDepth, AstSize
from extractors.costs import (
    CostModel,
    Curvature,
    Flops,
    Lexicographic,
    Memory,
    PeakMemory,
    Roofline,
)
from extractors.hardware import HARDWARE, Hardware
from extractors.pareto import pareto
from extractors.serialized import Extraction, extract_serialized

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
    "Roofline",
    "extract_serialized",
    "pareto",
]
