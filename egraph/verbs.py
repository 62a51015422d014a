"""What is done with an e-graph, written on its door: terms added and looked up,
saturation, extraction, explanations and export, and the reads that need no private table.

:class:`~egraph.egraph.EGraph` holds the tables and the operations that change them
(adding an e-node, merging, rebuilding) and offers the documented door the engine's passes
use; :class:`Verbs`, its base class, uses only that door and hands each big verb to the
module that does the work (:mod:`egraph.run`, :mod:`egraph.extract`, :mod:`egraph.explain`,
:mod:`egraph.serialize`, :mod:`egraph.dot`), as egg keeps ``Runner`` and ``Extractor`` out
of its ``EGraph``.

>>> from egraph import EGraph, rewrite
>>> eg = EGraph()
>>> root = eg.add("(+ a b)", root=True)
>>> eg.saturate([rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")]).equiv(root, "(+ b a)")
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from egraph.enode import ENode
from egraph.explain import Explanation
from egraph.gcpause import gc_paused
from egraph.term import Term, Var, parse

if TYPE_CHECKING:
    from egraph.analysis import Analysis
    from egraph.egraph import EGraph

__all__ = ["Verbs"]


def _absent(node: tuple) -> None:
    """The ``add`` of a look-up-only instantiator: a missing e-node stays missing."""
    return None


def _as_term(value: Term | str) -> Term:
    if isinstance(value, str):
        return parse(value)
    if isinstance(value, Term):
        return value
    raise TypeError(f"expected a Term or an s-expression string, got {type(value).__name__}")


class Verbs:
    """The e-graph's methods that its door suffices for (see the module docstring);
    :class:`~egraph.egraph.EGraph` inherits them."""

    # -- terms in and out -----------------------------------------------------------

    def add(self, term: Term | str, root: bool = False) -> int:
        """Add a ground term; returns its class id. ``root=True`` records it in :attr:`roots`.

        >>> from egraph import EGraph, parse
        >>> eg = EGraph()
        >>> eg.add("(+ 1 x)") == eg.add(parse("(+ 1 x)"))
        True
        """
        term = _as_term(term)
        ids: dict[int, int] = {}
        stack: list[tuple[Term, bool]] = [(term, False)]
        add = self.add_node
        while stack:
            t, expanded = stack.pop()
            key = id(t)
            if key in ids:
                continue
            if isinstance(t, Var):
                raise ValueError(
                    f"cannot add the pattern variable ?{t.name} to an e-graph: add ground terms, "
                    f"or search for patterns with Pattern.of({str(term)!r}).search(egraph)"
                )
            if t.args and not expanded:
                stack.append((t, True))
                stack.extend((a, False) for a in reversed(t.args) if id(a) not in ids)
                continue
            ids[key] = add(t.op, [ids[id(a)] for a in t.args])
        cid = ids[id(term)]
        if root:
            self.add_root(cid)
        return cid

    def lookup(self, term: Term | str) -> int | None:
        """The class of a ground term if every part of it is in the e-graph, else None."""
        term = _as_term(term)
        self.rebuild()
        find = self.union_find.find
        memo = self.hashcons
        ids: dict[int, int] = {}
        stack: list[tuple[Term, bool]] = [(term, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in ids:
                continue
            if isinstance(t, Var):
                return None
            if t.args and not expanded:
                stack.append((t, True))
                stack.extend((a, False) for a in reversed(t.args))
                continue
            nid = memo.get((t.op, *[ids[id(a)] for a in t.args]))
            if nid is None:
                return None
            ids[id(t)] = find(nid)
        return ids[id(term)]

    def equiv(self, a: int | Term | str, b: int | Term | str) -> bool:
        """True when ``a`` and ``b`` (ids or terms, looked up, never added) are equal.

        >>> from egraph import EGraph
        >>> eg = EGraph()
        >>> eg.equiv("x", "y")
        False
        """
        self.rebuild()
        ca, cb = self.class_of(a), self.class_of(b)
        return ca is not None and ca == cb

    def class_of(self, value: int | Term | str) -> int | None:
        """The canonical class of an id, or of a term looked up (never added): None for
        a term not in the e-graph.

        >>> from egraph import EGraph
        >>> eg = EGraph()
        >>> a = eg.add("(f x)")
        >>> eg.class_of("(f x)") == eg.class_of(a), eg.class_of("(f y)")
        (True, None)
        """
        if isinstance(value, int) and not isinstance(value, bool):
            return self.find(value)
        return self.lookup(value)

    def extract_term(self, cid: int) -> Term:
        """The smallest term of class ``cid`` (AstSize, greedy)."""
        from egraph.extract import AstSize

        return self.extract(AstSize(), root=cid)[0]

    # -- reads written on the door --------------------------------------------------

    def classes(self) -> list[int]:
        """The canonical class ids, in creation order."""
        self.rebuild()
        return [i for i, ns in enumerate(self.class_nodes) if ns is not None]

    def parents(self, cid: int) -> list[int]:
        """Canonical ids of the classes with an e-node that uses class ``cid``."""
        self.rebuild()
        find = self.union_find.find
        plist = self.node_parents[find(cid)] or ()
        return list(dict.fromkeys(find(p) for p in plist))

    @property
    def num_nodes(self) -> int:
        """Number of e-nodes in the classes (after rebuilding; pruned nodes not counted)."""
        self.rebuild()
        return sum(len(ns) for ns in self.class_nodes if ns is not None)

    @property
    def num_created(self) -> int:
        """How many e-nodes were ever added, merged ones included; ids are handed out in
        order, so the ids a step created are a range (see :meth:`created_node`).

        >>> from egraph import EGraph, parse
        >>> eg = EGraph()
        >>> _ = eg.add(parse("(+ x 1)"))
        >>> eg.num_created, eg.created_node(2)
        (3, ('+', 0, 1))
        """
        return len(self.created_nodes)

    def created_node(self, nid: int) -> tuple:
        """The ``nid``-th e-node ever added, canonical now: ``(op, *child class ids)``."""
        node = self.created_nodes[nid]
        find = self.find
        return (node[0], *[find(c) for c in node[1:]])

    @property
    def hashcons_size(self) -> int:
        """Number of distinct e-nodes ever hash-consed (what node limits count, as in egg)."""
        return len(self.hashcons)

    def added_by(self) -> dict[tuple, str]:
        """Each e-node a rewrite added (canonical now) and the first rule that added it;
        the e-nodes the e-graph was built with are not in it.

        >>> from egraph import EGraph, parse, rewrite
        >>> eg = EGraph()
        >>> _ = eg.add(parse("(* a 2)"))
        >>> _ = eg.saturate([rewrite("double", "(* ?x 2)", "(+ ?x ?x)")])
        >>> eg.added_by()
        {('+', 0, 0): 'double'}
        """
        origin: dict[tuple, str] = {}
        for first, end, name in self.origins:
            for nid in range(first, end):
                origin.setdefault(self.created_node(nid), name)
        return origin

    def retain_nodes(self, cid: int, keep: Callable[[ENode], bool]) -> None:
        """Drop the e-nodes of class ``cid`` for which ``keep`` is false (egg's pruning)."""
        c = self.find(cid)
        self.set_nodes(c, [n for n in self.class_nodes[c] if keep(ENode(n[0], n[1:]))])

    def bind_lookup(self, make: Callable) -> Callable[[tuple], int | None]:
        """Bind a compiled instantiator to look its instance up without adding anything:
        the class id, or None where an e-node of it is not in the e-graph yet.

        >>> from egraph import EGraph
        >>> from egraph import Pattern
        >>> eg = EGraph()
        >>> x = eg.add("x")
        >>> look = eg.bind_lookup(Pattern.of("(f ?a)").instantiator({"a": 1}, False))
        >>> look((x, x)), eg.num_classes
        (None, 1)
        """
        uf = self.union_find
        return make(self.hashcons, uf.parents, uf.find, _absent)

    # -- the big verbs --------------------------------------------------------------

    def saturate(self, rules, iter_limit: int = 30, node_limit: int = 10_000,
                 time_limit: float = 5.0, scheduler=None, goals=None,
                 incremental: bool = True) -> EGraph:
        """Apply ``rules`` until nothing changes or a limit is hit; returns ``self``.

        What happened is in :attr:`report` (stop reason, per-iteration sizes and times,
        per-rule counts). ``goals``: pairs of terms or ids; stop once each pair is equal (a
        side written as a pattern, with ``?vars``, holds once it matches in the other's class).
        ``incremental``: search each rule only where the e-graph changed since its last
        search (off: search everything every iteration).

        >>> from egraph import EGraph
        >>> from egraph import rewrite
        >>> eg = EGraph()
        >>> _ = eg.add("(+ a b)", root=True)
        >>> eg.saturate([rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")]).report.stop_reason
        'saturated'
        """
        from egraph.run import Runner

        with gc_paused():
            Runner(iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit,
                   scheduler=scheduler, goals=goals, incremental=incremental).run(self, rules)
        return self

    @classmethod
    def from_fx(cls, source, example_inputs=None, domains=None, ranges=None,
                observe=None, dynamic=False) -> EGraph:
        """An e-graph of a torch.fx GraphModule, an nn.Module (traced for you) or a
        torch.export program; roots are the graph outputs in order. ``dynamic=True``
        (or ``{input: {dim: (low, high)}}``) keeps the inputs' sizes symbolic, so the
        program extracted runs at every size (see :func:`frontends.fx.from_fx`).

        >>> from egraph import EGraph
        >>> import torch
        >>> eg = EGraph.from_fx(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> [str(n) for n in eg.nodes(eg.roots[0])]
        ['(linear #1 #3 #5)']
        """
        from compiler.fx import from_fx

        with gc_paused():
            return from_fx(source, example_inputs, domains=domains, ranges=ranges,
                           observe=observe, dynamic=dynamic)

    def extract(self, cost, root: int | None = None, **options):
        """The best program under ``cost``.

        On a plain e-graph: ``(term, cost)`` of ``root`` (default: the first root).
        ``cost`` is a cost model (:class:`~egraph.extract.AstSize`, ...) or any callable
        ``(enode, child_costs) -> cost``. On an e-graph built with :meth:`from_fx`: a
        ``torch.fx.GraphModule`` with the source's signature, validated against the source
        (``validate="strict" | "raise" | "off"``), its report in
        ``gm.meta["egraph_report"]``.

        ``memory_budget=bytes``: the cheapest program whose peak memory fits the budget
        (a DAG heuristic checked by an ILP bound, :mod:`egraph.extract.budget`); the peak
        is measured by ``memory=`` (a model with ``program_cost`` and ``node_cost``),
        ``extractors.PeakMemory`` by default on an e-graph built from FX.

        ``autotune=True``: on an e-graph built from FX, the programs the cost model is
        unsure between are timed on its example inputs and the fastest kept
        (``compiler.autotune``); a plain e-graph has nothing to run them on.

        >>> from egraph import EGraph, AstSize
        >>> eg = EGraph()
        >>> _ = eg.add("(+ a b)", root=True)
        >>> eg.extract(AstSize(), autotune=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: autotune=True times programs on the example inputs of an e-graph built ...
        """
        from egraph.extract import extract

        if options.pop("autotune", False):
            raise ValueError(
                "autotune=True times programs on the example inputs of an e-graph built with "
                "EGraph.from_fx(model, example_inputs); a plain e-graph has none: leave "
                "autotune out")
        with gc_paused():
            budget, memory = options.pop("memory_budget", None), options.pop("memory", None)
            if budget is not None:
                from egraph.extract.budget import extract_within

                return extract_within(self, cost, root, budget, memory, **options)
            return extract(self, cost, root=root, **options)

    def pareto(self, cost_a, cost_b, root: int | None = None, **options) -> list:
        """The non-dominated programs under two costs, with both costs each
        (``extractors.pareto``): terms on a plain e-graph, GraphModules from FX."""
        from egraph.extract.pareto import pareto

        return pareto(self, cost_a, cost_b, root=root, **options)

    @property
    def explanations(self) -> bool:
        """Whether unions are recorded for :meth:`explain` (set at construction)."""
        return self.proofs is not None

    def explain(self, a: int | Term | str, b: int | Term | str) -> Explanation:
        """The chain of rewrites that proves ``a`` equal to ``b``.

        Needs ``EGraph(explanations=True)``; terms are added (with their own ids) so the
        proof starts and ends at exactly those terms.

        >>> from egraph import EGraph
        >>> from egraph import rewrite
        >>> eg = EGraph(explanations=True)
        >>> _ = eg.add("(+ a b)")
        >>> _ = eg.saturate([rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")])
        >>> print(eg.explain("(+ a b)", "(+ b a)"))
        (+ a b)
        (+ b a)  by comm
        """
        if self.proofs is None:
            raise ValueError(
                "this e-graph records no explanations: build it with EGraph(explanations=True)"
            )
        ia = a if isinstance(a, int) else self.add(a)
        ib = b if isinstance(b, int) else self.add(b)
        self.rebuild()
        if self.find(ia) != self.find(ib):
            raise ValueError(f"cannot explain: {a} and {b} are not equal in this e-graph")
        return self.proofs.explain(ia, ib)

    # -- export ---------------------------------------------------------------------

    def to_json(self, cost: Callable[[ENode], float] | None = None) -> dict:
        """The e-graph in the egraph-serialize JSON format (see :mod:`egraph.serialize`)."""
        from egraph.serialize import to_json

        return to_json(self, cost)

    @classmethod
    def from_json(cls, data: dict | str, analysis: Analysis | None = None) -> EGraph:
        """An e-graph from egraph-serialize JSON (a dict or its text); validated."""
        from egraph.serialize import from_json

        return from_json(data, cls(analysis=analysis))

    def to_dot(self) -> str:
        """Graphviz dot text of the e-graph (classes as clusters)."""
        from egraph.dot import to_dot

        return to_dot(self)

    def __repr__(self) -> str:
        return f"EGraph({self.num_classes} classes, {self.hashcons_size} e-nodes)"
