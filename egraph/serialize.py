"""The egraph-serialize JSON format, both ways (extraction-gym's files use it).

::

    {"nodes": {NODE_ID: {"op": str, "children": [NODE_ID, ...], "eclass": CLASS_ID,
                         "cost": float}},
     "root_eclasses": [CLASS_ID, ...],
     "class_data": {CLASS_ID: {...}}}

Children name nodes; a child's class is that node's ``eclass``. Loading validates the
structure and never evaluates anything.

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> _ = eg.add(parse("(+ x 1)"), root=True)
>>> back = EGraph.from_json(eg.to_json())
>>> back.num_classes, back.equiv(back.roots[0], parse("(+ x 1)"))
(3, True)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from egraph.enode import ENode
from egraph.term import SyntaxError_, format_op, parse

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class SerializedFormatError(ValueError):
    """Malformed egraph-serialize JSON; the message names the offending entry."""


def to_json(egraph: EGraph, cost: Callable[[ENode], float] | None = None) -> dict:
    """A JSON-ready dict of ``egraph`` (node ids ``"<class>.<index>"``)."""
    egraph.rebuild()
    nodes: dict[str, dict[str, Any]] = {}
    class_data: dict[str, dict[str, Any]] = {}
    for c in egraph.classes():
        for i, n in enumerate(egraph.class_nodes[c]):
            entry: dict[str, Any] = {
                "op": format_op(n[0]),
                "children": [f"{k}.0" for k in n[1:]],
                "eclass": str(c),
                "cost": float(cost(ENode(n[0], n[1:]))) if cost is not None else 1.0,
            }
            nodes[f"{c}.{i}"] = entry
        value = egraph.data(c)
        if isinstance(value, (int, float, str, bool)):
            class_data[str(c)] = {"data": value}
    out: dict[str, Any] = {
        "nodes": nodes,
        "root_eclasses": [str(r) for r in dict.fromkeys(egraph.roots)],
    }
    if class_data:
        out["class_data"] = class_data
    return out


def _leaf_op(text: str):
    try:
        term = parse(text)
    except SyntaxError_:
        return text
    return term.op if not term.args and term.op is not None else text


def validate(data: Any) -> dict:
    """Check the structure of egraph-serialize data; returns the parsed dict."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise SerializedFormatError(f"not valid JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
        raise SerializedFormatError(
            "egraph-serialize data is an object with a 'nodes' object mapping node ids to "
            "{'op', 'children', 'eclass'}"
        )
    nodes = data["nodes"]
    for nid, node in nodes.items():
        if not isinstance(node, dict):
            raise SerializedFormatError(f"node {nid!r} is not an object")
        if not isinstance(node.get("op"), str):
            raise SerializedFormatError(f"node {nid!r} needs a string 'op'")
        if not isinstance(node.get("eclass"), (str, int)):
            raise SerializedFormatError(f"node {nid!r} needs an 'eclass' id")
        children = node.get("children", [])
        if not isinstance(children, list):
            raise SerializedFormatError(f"node {nid!r}: 'children' must be a list of node ids")
        for ch in children:
            if ch not in nodes:
                raise SerializedFormatError(
                    f"node {nid!r} has child {ch!r}, which is not a node id in 'nodes'"
                )
        c = node.get("cost", 1.0)
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise SerializedFormatError(f"node {nid!r}: 'cost' must be a number, got {c!r}")
    classes = {str(n["eclass"]) for n in nodes.values()}
    roots = data.get("root_eclasses", [])
    if not isinstance(roots, list):
        raise SerializedFormatError("'root_eclasses' must be a list of class ids")
    for r in roots:
        if str(r) not in classes:
            raise SerializedFormatError(f"root class {r!r} has no node in 'nodes'")
    return data


def from_json(data: Any, eg: EGraph) -> EGraph:
    """``eg`` (a new, empty e-graph) filled with the classes and e-nodes of
    egraph-serialize ``data``; ``EGraph.from_json(data)`` is the usual spelling."""
    data = validate(data)
    nodes = data["nodes"]
    first_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for nid, node in nodes.items():
        cls = str(node["eclass"])
        first_of.setdefault(cls, nid)
        members.setdefault(cls, []).append(nid)
    # Classes may be cyclic, so they cannot be added bottom-up: give every class an id
    # first, then fill in its e-nodes.
    class_id: dict[str, int] = {}
    for cls in members:
        class_id[cls] = eg.reserve_class()
    find = eg.find
    for cls, nids in members.items():
        for nid in nids:
            node = nodes[nid]
            kids = tuple(find(class_id[str(nodes[ch]["eclass"])])
                         for ch in node.get("children", []))
            op = node["op"] if kids else _leaf_op(node["op"])
            eg.add_to_class((op, *kids), find(class_id[cls]), "serialized")
    eg.set_roots([find(class_id[str(r)]) for r in data.get("root_eclasses", [])])
    eg.rebuild()
    eg.reanalyse()
    return eg

