"""Graphviz dot text of an e-graph: one dashed cluster per class, edges to child classes.

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> _ = eg.add(parse("(+ x 1)"))
>>> print(eg.to_dot().splitlines()[0])
digraph egraph {
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from egraph.term import format_op

if TYPE_CHECKING:
    from egraph.egraph import EGraph


def to_dot(egraph: EGraph) -> str:
    """The dot source; render with ``dot -Tsvg``."""
    egraph.rebuild()
    lines = ["digraph egraph {", "  compound=true;", "  clusterrank=local;"]
    edges = []
    for c in egraph.classes():
        lines.append(f"  subgraph cluster_{c} {{")
        lines.append(f'    style=dashed; label="{c}";')
        for i, n in enumerate(egraph.class_nodes[c]):
            lines.append(f"    n{c}_{i} [label={json.dumps(format_op(n[0]))}];")
            for k, child in enumerate(n[1:]):
                label = f' [lhead=cluster_{child}, label="{k}"]' if len(n) > 2 else (
                    f" [lhead=cluster_{child}]"
                )
                edges.append(f"  n{c}_{i} -> n{child}_0{label};")
        lines.append("  }")
    lines.extend(edges)
    lines.append("}")
    return "\n".join(lines)
