"""A program of an e-graph: one chosen e-node per class, from the roots down.

A *choice* maps canonical class ids to the e-node tuple ``(op, child class, ...)`` chosen
for that class. :func:`program_roots` says which classes every program computes,
:func:`program_order` lists the classes a choice reaches in evaluation order, and
:func:`source_program` is the program the e-graph was built from.

Two attributes, when an e-graph has them, extend what the engine knows of a program (an
e-graph built from PyTorch has both): ``effects``, classes every program must compute
besides the roots (side effects, such as in-place calls kept in order), and ``initial``,
the e-nodes each class held when the e-graph was built (``{class: [e-node, ...]}``).

>>> from egraph import EGraph
>>> eg = EGraph()
>>> root = eg.add("(* (+ x 1) (+ x 1))", root=True)
>>> choice = {c: eg.class_nodes[c][0] for c in eg.classes()}
>>> [choice[c][0] for c in program_order(eg, choice)]
['x', 1, '+', '*']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from egraph.enode import ENode

if TYPE_CHECKING:
    from egraph.egraph import EGraph


def program_roots(egraph: EGraph) -> list[int]:
    """The canonical classes every program of ``egraph`` computes: its roots in order, then
    its ``effects`` (once each).

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> a = eg.add("(f x)", root=True)
    >>> program_roots(eg) == [a]
    True
    """
    find = egraph.find
    classes = [*egraph.roots, *getattr(egraph, "effects", ())]
    return list(dict.fromkeys(find(c) for c in classes))


def program_order(egraph: EGraph, choice: dict[int, Any],
                  roots: list[int] | None = None) -> list[int]:
    """The classes ``choice`` reaches from ``roots`` (default: :func:`program_roots`), each
    after the classes its e-node reads: the order the program runs in.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> root = eg.add("(g (f x))", root=True)
    >>> choice = {c: eg.class_nodes[c][0] for c in eg.classes()}
    >>> [eg.nodes(c)[0].op for c in program_order(eg, choice)]
    ['x', 'f', 'g']
    """
    find = egraph.find
    if roots is None:
        roots = program_roots(egraph)
    order: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[int, bool]] = [(find(r), False) for r in reversed(roots)]
    while stack:
        c, done = stack.pop()
        if done:
            order.append(c)
            continue
        if c in seen:
            continue
        seen.add(c)
        stack.append((c, True))
        stack.extend((find(k), False) for k in reversed(choice[c][1:]))
    return order


def items_taken(egraph: EGraph, choice: dict[int, Any], cid: int,
                readers: Any) -> list[int]:
    """The classes among ``readers`` that take an item of class ``cid``'s tuple (a
    multi-output call's, by a literal index: ``getitem``). A program takes them as soon
    as the call returns (:func:`items_at_once`): a tuple held until its last item is
    taken keeps every item alive.

    >>> import torch
    >>> from egraph import EGraph
    >>> norm = lambda x: torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: (norm(x)[0] * 2, norm(x)[2])),
    ...                     (torch.randn(3, 4),))
    >>> choice = source_program(eg)
    >>> call = next(c for c in choice if getattr(eg.data(c), "kind", None) == "tuple")
    >>> [choice[c][0] for c in items_taken(eg, choice, call, choice)]
    ['getitem', 'getitem']
    """
    if getattr(egraph.data(cid), "kind", None) != "tuple":
        return []
    find = egraph.find
    return [r for r in readers if choice[r][0] == "getitem" and find(choice[r][1]) == cid
            and all(len(choice.get(find(k), ())) == 1 for k in choice[r][2:])]


def items_at_once(egraph: EGraph, choice: dict[int, Any], order: list[int]) -> list[int]:
    """``order`` (:func:`program_order`) with the items taken of each multi-output call
    (:func:`items_taken`) moved to right after it, their literal indices with them: the
    order emission runs a program in.

    >>> import torch
    >>> from egraph import EGraph
    >>> norm = lambda x: torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: (norm(x)[0].exp(), norm(x)[2])),
    ...                     (torch.randn(3, 4),))
    >>> choice = source_program(eg)
    >>> order = items_at_once(eg, choice, program_order(eg, choice))
    >>> [choice[c][0] for c in order if len(choice[c]) > 1]
    ['input', 'opaque', 'getitem', 'getitem', 'exp']
    """
    find = egraph.find
    readers: dict[int, list[int]] = {}
    for c in order:
        if choice[c][0] == "getitem":
            readers.setdefault(find(choice[c][1]), []).append(c)
    moved: list[int] = []
    placed: set[int] = set()
    for c in order:
        if c in placed:
            continue
        taken = items_taken(egraph, choice, c, readers.get(c, ()))
        for k in [c, *(find(k) for r in taken for k in choice[r][2:]), *taken]:
            if k not in placed:
                placed.add(k)
                moved.append(k)
    return moved


def is_acyclic(egraph: EGraph, choice: dict[int, tuple], roots: list[int]) -> bool:
    """Whether the program ``choice`` makes from ``roots`` is a DAG that ``choice`` covers:
    an e-node chosen for a class may read that class again through the others' choices.

    >>> from egraph import EGraph
    >>> eg = EGraph()
    >>> x, fx = eg.add("x"), eg.add("(f x)")
    >>> is_acyclic(eg, {x: ("x",), fx: ("f", x)}, [fx])
    True
    >>> _ = eg.union(x, fx); _ = eg.rebuild()
    >>> r = eg.find(x)
    >>> is_acyclic(eg, {r: ("f", r)}, [r]), is_acyclic(eg, {}, [r])
    (False, False)
    """
    find = egraph.find
    state: dict[int, int] = {}  # 1: on the path, 2: done
    stack: list[tuple[int, bool]] = [(find(r), False) for r in roots]
    while stack:
        c, leaving = stack.pop()
        if leaving:
            state[c] = 2
            continue
        if state.get(c) == 2:
            continue
        if state.get(c) == 1 or c not in choice:
            return False
        state[c] = 1
        stack.append((c, True))
        for k in choice[c][1:]:
            k = find(k)
            if state.get(k) == 1:
                return False
            if state.get(k) != 2:
                stack.append((k, False))
    return True


def source_program(egraph: EGraph, cost: Any = None) -> dict[int, tuple]:
    """The program ``egraph`` was built from, as a choice: each class's e-node among those
    it had when built (``egraph.initial``), canonical after any saturation.

    Where a class holds several of them (the front end shared two equal subterms, an
    analysis folded a constant, saturation merged two source classes), the cheapest under
    ``cost`` is taken (default :class:`~egraph.extract.AstSize`), so the program is
    acyclic. The first e-node of each class is not the source after saturation: a union
    appends the other class's e-nodes, and either may come first.

    >>> import torch
    >>> from egraph import EGraph, rewrite
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2), (torch.randn(3),))
    >>> _ = eg.saturate([rewrite("double", "(mul ?a 2)", "(add ?a ?a)")])
    >>> sorted(n[0] for n in source_program(eg).values() if isinstance(n[0], str))
    ['exp', 'input', 'mul']
    """
    from egraph.extract.tree import AstSize, best_nodes

    initial = getattr(egraph, "initial", None)
    if initial is None:
        raise ValueError("this e-graph records no source program (no `initial` e-nodes): "
                         "build it with EGraph.from_fx, or pass the choice explicitly")
    if cost is None:
        cost = AstSize()
    return {c: v[1] for c, v in best_nodes(egraph, cost, nodes_of=initial).items()}


def node_costs(egraph: EGraph, cost: Any) -> Callable[[int, tuple], Any]:
    """``(class, e-node) -> cost`` of one e-node alone under ``cost``: a cost model's
    ``node_cost``, or a callable ``(enode, child_costs)`` given zero child costs.

    >>> from egraph import EGraph, AstSize
    >>> eg = EGraph()
    >>> root = eg.add("(f x)", root=True)
    >>> node_costs(eg, AstSize())(root, ("f", 0))
    1
    """
    if hasattr(cost, "node_cost"):
        return lambda cid, node: cost.node_cost(egraph, cid, node)
    return lambda cid, node: cost(ENode(node[0], node[1:]), [0] * (len(node) - 1))


def dag_cost(egraph: EGraph, cost: Any, choice: dict[int, tuple]) -> Any:
    """The cost of the program ``choice`` with each chosen e-node reached from the roots
    counted once: ``cost.program_cost`` where the model defines it (whole-program costs
    such as fusion-aware time), else the sum of :func:`node_costs`.

    >>> from egraph import EGraph, AstSize
    >>> eg = EGraph()
    >>> root = eg.add("(+ (* x y) (* x y))", root=True)
    >>> dag_cost(eg, AstSize(), {c: eg.class_nodes[c][0] for c in eg.classes()})  # tree: 7
    4
    """
    if hasattr(cost, "program_cost"):
        return cost.program_cost(egraph, choice)
    one = node_costs(egraph, cost)
    total: Any = 0
    for c in program_order(egraph, choice):
        total = total + one(c, choice[c])
    return total
