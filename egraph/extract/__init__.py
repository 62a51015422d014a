"""Extraction: the best program of an e-graph under a cost, as egg ships its ``Extractor``
and ``LpExtractor``. Torch-free; the cost models of tensor programs are in ``extractors``.

- :mod:`egraph.extract.tree`: greedy bottom-up extraction under a tree cost on a live
  e-graph (:class:`AstSize`, :class:`AstDepth`, :func:`best_nodes`, :func:`build_term`).
- :mod:`egraph.extract.methods`: :func:`extract` (``method="greedy" | "dag" | "ilp"``)
  and :func:`choose`, which hands a live e-graph to the algorithms below.
- Algorithms over an e-graph in the egraph-serialize format (:mod:`egraph.extract.graph`):
  tree-cost greedy (:mod:`~egraph.extract.greedy`), DAG-aware greedy and local search
  (:mod:`~egraph.extract.dag`), optimal ILP on HiGHS (:mod:`~egraph.extract.ilp`), all
  behind :func:`~egraph.extract.serialized.extract_serialized`.
- :mod:`egraph.extract.pareto`: frontiers under two costs; :mod:`egraph.extract.local_search`:
  improving a choice under a whole-program cost; :mod:`egraph.extract.program`: program
  roots, evaluation order and the source program.

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> a = eg.add(parse("(+ (* x 1) 0)"))
>>> _ = eg.union(a, eg.add(parse("x")))
>>> extract(eg, AstSize(), root=a)
(Term('x'), 1)
"""

from egraph.extract.methods import choose, extract
from egraph.extract.program import program_order, program_roots, source_program
from egraph.extract.tree import AstDepth, AstSize, best_nodes, build_term, cheaper

__all__ = [
    "AstDepth",
    "AstSize",
    "best_nodes",
    "build_term",
    "cheaper",
    "choose",
    "extract",
    "program_order",
    "program_roots",
    "source_program",
]
