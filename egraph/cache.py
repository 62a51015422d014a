"""Caches of what was computed from an e-graph, valid while the e-graph does not change.

A guard or cost model that derives something per class (a run of merged weights, a node's
cost) keeps it in a ``weakref.WeakKeyDictionary`` keyed by the e-graph and reads it through
:func:`current_cache`, which empties it whenever :attr:`EGraph.version` moved on.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from egraph.egraph import EGraph

__all__ = ["current_cache"]


def current_cache(store: weakref.WeakKeyDictionary, egraph: EGraph) -> dict:
    """The cache ``store`` keeps for ``egraph``, emptied whenever the e-graph changed since
    it was filled (:attr:`EGraph.version`: a new e-node or a merge); a dead e-graph's
    cache goes with it.

    >>> from egraph import EGraph
    >>> store = weakref.WeakKeyDictionary()
    >>> eg = EGraph()
    >>> current_cache(store, eg)["seen"] = 1
    >>> current_cache(store, eg), (eg.add("a") is not None) and current_cache(store, eg)
    ({'seen': 1}, {})
    """
    version = egraph.version
    seen = store.get(egraph)
    if seen is None or seen[0] != version:
        seen = store[egraph] = (version, {})
    return seen[1]
