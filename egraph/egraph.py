"""The e-graph: hash-consed e-nodes in e-classes, with egg-style deferred rebuilding.

Every e-node gets a dense integer id when it is first added; that id is also the id of the
class it starts in, so class ids, node ids and union-find entries are one array index.
An e-node is a plain tuple ``(op, child_class, ...)``. Unions only record the merge and
queue the parents of the merged class; :meth:`EGraph.rebuild` restores the hash-cons and
congruence closure in one pass over that worklist (egg's rebuilding).

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> a = eg.add(parse("(f x)"))
>>> b = eg.add(parse("(f y)"))
>>> _ = eg.union(eg.add(parse("x")), eg.add(parse("y")))
>>> eg.rebuild()
1
>>> eg.equiv(a, b)
True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from egraph.enode import ENode
from egraph.explain import CONGRUENCE, Explanation, ProofForest
from egraph.gcpause import gc_paused
from egraph.term import Term, Var, parse
from egraph.unionfind import UnionFind, canonical

if TYPE_CHECKING:
    from egraph.analysis import Analysis
    from egraph.run import Report


def _absent(node: tuple) -> None:
    """The ``add`` of a look-up-only instantiator: a missing e-node stays missing."""
    return None


class UnsoundMerge(ValueError):
    """Raised by an analysis when two classes that cannot be equal are merged."""


def _as_term(value: Term | str) -> Term:
    if isinstance(value, str):
        return parse(value)
    if isinstance(value, Term):
        return value
    raise TypeError(f"expected a Term or an s-expression string, got {type(value).__name__}")


class EGraph:
    """An e-graph of terms, with an optional analysis and optional explanations.

    >>> from egraph import EGraph, ConstantFolding, parse, rewrite, AstSize
    >>> eg = EGraph(analysis=ConstantFolding())
    >>> a = eg.add(parse("(* (+ x 0) (- 3 1))"), root=True)
    >>> _ = eg.saturate([rewrite("zero-add", "(+ ?a 0)", "?a")])
    >>> eg.extract(AstSize(), root=a)
    (Term('(* x 2)'), 3)
    """

    def __init__(self, analysis: Analysis | None = None, explanations: bool = False):
        self.analysis = analysis
        self._uf = UnionFind()
        self._memo: dict[tuple, int] = {}
        self._node: list[tuple] = []
        self._cnodes: list[list[tuple] | None] = []
        # Per large class, its e-nodes with each operator a matcher asked for (built on the
        # first ask, dropped when the class changes): a pattern's child lookup then costs
        # the e-nodes with the op it needs, not the size of the class.
        self._opidx: dict[int, dict[Hashable, list[tuple]]] = {}
        self._parents: list[list[int] | None] = []
        self._data: list[Any] = []
        # Per operator, the ids of the e-nodes with it (their classes once found): a list,
        # five times smaller than a set, made canonical and unique when it is read.
        self._by_op: dict[Hashable, list[int]] = {}
        self._op_classes: dict[Hashable, tuple[tuple[int, int], frozenset[int]]] = {}
        self._pending: list[int] = []
        self._analysis_pending: list[int] = []
        self._dirty: set[int] = set()
        self._grew: set[int] = set()
        self._log: list[int] = []
        self._roots: list[int] = []
        self._num_classes = 0
        self._proofs: ProofForest | None = ProofForest() if explanations else None
        self.report: Report | None = None
        # (first id, end id, rule name) of the e-nodes each rewrite application added
        self.origins: list[tuple[int, int, str]] = []
        self.fx: Any = None  # for an e-graph built from FX: what emission needs of the source

    # -- adding -------------------------------------------------------------------------

    @property
    def explanations(self) -> bool:
        """Whether unions are recorded for :meth:`explain` (set at construction)."""
        return self._proofs is not None

    def add(self, term: Term | str, root: bool = False) -> int:
        """Add a ground term; returns its class id. ``root=True`` records it in :attr:`roots`.

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
            self._roots.append(cid)
        return cid

    def add_node(self, op: Hashable, children: Iterable[int] = ()) -> int:
        """Add one e-node ``op(children...)`` over existing class ids; returns its class id."""
        if self._proofs is not None:
            return self.add_explained((op, *children))
        find = self._uf.find
        return self.add_canonical((op, *[find(c) for c in children]))

    def _new_node(self, node: tuple, orig: tuple | None = None) -> int:
        nodes = self._node
        nid = len(nodes)
        nodes.append(node)
        self._uf.parents.append(nid)
        self._cnodes.append([node])
        parents = self._parents
        parents.append(None)
        self._data.append(None)
        self._memo[node] = nid
        if len(node) > 1:
            for c in node[1:]:
                plist = parents[c]
                if plist is None:
                    parents[c] = [nid]
                else:
                    plist.append(nid)
        found = self._by_op.get(node[0])
        if found is None:
            self._by_op[node[0]] = [nid]
        else:
            found.append(nid)
        self._num_classes += 1
        if self._proofs is not None:
            self._proofs.add_node(orig if orig is not None else node)
        analysis = self.analysis
        if analysis is not None:
            self._data[nid] = analysis.make(self, node)
            analysis.modify(self, nid)
        return nid

    # -- merging ------------------------------------------------------------------------

    def union(self, a: int, b: int, reason: Any = "union") -> bool:
        """Assert that classes ``a`` and ``b`` are equal; True if they were not already.

        The merge is recorded at once; call :meth:`rebuild` (saturation does) before
        relying on congruence. ``reason`` is what a proof says merged them (a rule's name;
        congruence when rebuilding). The rules' hot loop calls this directly.

        >>> eg = EGraph()
        >>> a, b = eg.add("a"), eg.add("b")
        >>> eg.union(a, b), eg.union(a, b), eg.find(b) == eg.find(a)
        (True, False, True)
        """
        uf = self._uf
        ra, rb = uf.find(a), uf.find(b)
        if ra == rb:
            return False
        if self._proofs is not None:
            self._proofs.union(a, b, reason)
        parents = self._parents
        pa, pb = parents[ra], parents[rb]
        if (len(pa) if pa else 0) < (len(pb) if pb else 0):
            ra, rb = rb, ra
            pa, pb = pb, pa
        analysis = self.analysis
        if analysis is not None:
            da, db = self._data[ra], self._data[rb]
            try:
                merged = analysis.merge(da, db)
            except UnsoundMerge as err:
                raise UnsoundMerge(f"{err} (merging by {reason})") from None
            # As in egg: re-make the parents of whichever side's value changed.
            if pa and merged is not da and merged != da:
                self._analysis_pending.extend(pa)
            if pb and merged is not db and merged != db:
                self._analysis_pending.extend(pb)
            self._data[ra] = merged
            self._data[rb] = None
        uf.parents[rb] = ra
        self._num_classes -= 1
        if pb:
            self._pending.extend(pb)
            if pa is None:
                parents[ra] = pb
            else:
                pa.extend(pb)
            parents[rb] = None
            self._grew.add(ra)
        cnodes = self._cnodes
        kept, absorbed = cnodes[ra], cnodes[rb]
        if len(kept) < 8:
            # Most classes stay small: an exact-size list, where extend would leave up
            # to 6 spare slots in each (rebuild keeps a list whose e-nodes are canonical).
            cnodes[ra] = kept + absorbed
        else:
            kept.extend(absorbed)
        cnodes[rb] = None
        opidx = self._opidx
        if opidx:
            opidx.pop(ra, None)
            opidx.pop(rb, None)
        self._dirty.add(ra)
        self._log.append(ra)
        if analysis is not None:
            analysis.modify(self, ra)
        return True

    def rebuild(self) -> int:
        """Restore the hash-cons and congruence after unions; returns the repairs made."""
        uf = self._uf
        find = uf.find
        P = uf.parents
        memo = self._memo
        nodes = self._node
        pending = self._pending
        apending = self._analysis_pending
        dirty = self._dirty
        repairs = 0
        while pending or apending:
            while pending:
                nid = pending.pop()
                old = nodes[nid]
                new = canonical(old, P, find)
                if new is not old and memo.get(old) == nid:
                    del memo[old]
                other = memo.setdefault(new, nid)
                if other != nid:
                    if new is not old:
                        shared = nodes[other]
                        nodes[nid] = shared if shared == new else new
                    if find(other) != find(nid):
                        repairs += 1
                        self.union(other, nid, CONGRUENCE)
                elif new is not old:
                    nodes[nid] = new
                dirty.add(nid)
            analysis = self.analysis
            while apending:
                batch = list(dict.fromkeys(apending))
                apending.clear()
                for nid in batch:
                    c = find(nid)
                    old_data = self._data[c]
                    node = canonical(nodes[nid], P, find)
                    merged = analysis.merge(old_data, analysis.make(self, node))
                    if merged is not old_data and merged != old_data:
                        self._data[c] = merged
                        if self._parents[c]:
                            apending.extend(self._parents[c])
                        self._log.append(c)
                        analysis.modify(self, c)
        if dirty:
            self._repair_classes(find)
        return repairs

    def _repair_classes(self, find: Callable[[int], int]) -> None:
        P = self._uf.parents
        cnodes = self._cnodes
        memo = self._memo
        nodes = self._node
        opidx = self._opidx
        for c in {find(c) for c in self._dirty}:
            if opidx:
                opidx.pop(c, None)
            ns = cnodes[c]
            # Two equal e-nodes in one list were made equal by canonicalising one of
            # them, so a list whose e-nodes are all canonical has no duplicates either.
            for n in ns:
                if canonical(n, P, find) is not n:
                    break
            else:
                continue
            unique: dict[tuple, None] = {}
            for n in ns:
                t = canonical(n, P, find)
                if t is not n:
                    # Share the hash-cons key's tuple instead of keeping a second copy.
                    nid = memo.get(t)
                    if nid is not None and nodes[nid] == t:
                        t = nodes[nid]
                unique[t] = None
            cnodes[c] = list(unique)
        for c in {find(c) for c in self._grew}:
            plist = self._parents[c]
            if plist and len(plist) > 1:
                unique: dict[tuple, int] = {}
                for p in plist:
                    key = canonical(nodes[p], P, find)
                    if key not in unique:
                        unique[key] = memo.get(key, p)
                self._parents[c] = list(unique.values())
        self._dirty.clear()
        self._grew.clear()

    @property
    def is_clean(self) -> bool:
        """True when no union awaits :meth:`rebuild`."""
        return not (self._pending or self._analysis_pending or self._dirty)

    def _clean(self) -> None:
        if not self.is_clean:
            self.rebuild()

    # -- inspecting ---------------------------------------------------------------------

    def find(self, cid: int) -> int:
        """The canonical id of the class ``cid`` belongs to."""
        return self._uf.find(cid)

    def classes(self) -> list[int]:
        """The canonical class ids, in creation order."""
        self._clean()
        return [i for i, ns in enumerate(self._cnodes) if ns is not None]

    def nodes(self, cid: int) -> list[ENode]:
        """The e-nodes of class ``cid``, children as canonical ids.

        Safe inside guards and analyses: it never rebuilds.

        >>> eg = EGraph()
        >>> [str(n) for n in eg.nodes(eg.add("(+ x 1)"))]
        ['(+ #0 #1)']
        """
        find = self._uf.find
        return [ENode(n[0], tuple(find(c) for c in n[1:])) for n in self._cnodes[find(cid)]]

    def data(self, cid: int) -> Any:
        """The analysis data of class ``cid`` (None without an analysis); never rebuilds."""
        return self._data[self._uf.find(cid)]

    def set_data(self, cid: int, value: Any) -> None:
        """Replace the analysis data of class ``cid`` (for an analysis's ``modify``)."""
        c = self._uf.find(cid)
        self._data[c] = value
        self._log.append(c)

    def retain_nodes(self, cid: int, keep: Callable[[ENode], bool]) -> None:
        """Drop the e-nodes of class ``cid`` for which ``keep`` is false (egg's pruning)."""
        c = self._uf.find(cid)
        self.set_nodes(c, [n for n in self._cnodes[c] if keep(ENode(n[0], n[1:]))])

    def classes_with_op(self, op: Hashable) -> frozenset[int]:
        """Canonical ids of the classes holding an e-node with operator ``op`` (kept
        until the e-graph next grows or merges: the rules of one search ask for the same
        few operators)."""
        stamp = self.version
        cached = self._op_classes.get(op)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        found = self._by_op.get(op)
        if not found:
            return frozenset()
        find = self._uf.find
        canonical = frozenset([find(c) for c in found])
        if len(canonical) < len(found):
            self._by_op[op] = list(canonical)
        self._op_classes[op] = (stamp, canonical)
        return canonical

    def has_op(self, op: Hashable) -> bool:
        """True when some e-node has operator ``op`` (an index lookup: a rule whose left
        side needs an operator the e-graph lacks is not searched).

        >>> eg = EGraph()
        >>> _ = eg.add("(exp x)")
        >>> eg.has_op("exp"), eg.has_op("log")
        (True, False)
        """
        return bool(self._by_op.get(op))

    def ops(self) -> list[Hashable]:
        """Every operator that occurs in the e-graph."""
        return list(self._by_op)

    def parents(self, cid: int) -> list[int]:
        """Canonical ids of the classes with an e-node that uses class ``cid``."""
        self._clean()
        find = self._uf.find
        plist = self._parents[find(cid)] or ()
        return list(dict.fromkeys(find(p) for p in plist))

    @property
    def version(self) -> tuple[int, int]:
        """Changes whenever the e-graph gains an e-node or merges two classes, and never
        comes back: the key under which a cache of what was computed from it stays valid.

        >>> eg = EGraph()
        >>> a, b = eg.add("a"), eg.add("b")
        >>> before = eg.version
        >>> _ = eg.union(a, b)
        >>> eg.version != before
        True
        """
        return (len(self._node), self._num_classes)

    @property
    def num_classes(self) -> int:
        """Number of e-classes."""
        return self._num_classes

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
        return len(self._node)

    def created_node(self, nid: int) -> tuple:
        """The ``nid``-th e-node ever added, canonical now: ``(op, *child class ids)``."""
        node = self._node[nid]
        find = self.find
        return (node[0], *[find(c) for c in node[1:]])

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

    @property
    def num_nodes(self) -> int:
        """Number of e-nodes in the classes (after rebuilding; pruned nodes not counted)."""
        self._clean()
        return sum(len(ns) for ns in self._cnodes if ns is not None)

    @property
    def hashcons_size(self) -> int:
        """Number of distinct e-nodes ever hash-consed (what node limits count, as in egg)."""
        return len(self._memo)

    @property
    def roots(self) -> list[int]:
        """Canonical ids of the root classes (outputs, or terms added with ``root=True``)."""
        find = self._uf.find
        return [find(r) for r in self._roots]

    def lookup(self, term: Term | str) -> int | None:
        """The class of a ground term if every part of it is in the e-graph, else None."""
        term = _as_term(term)
        self._clean()
        find = self._uf.find
        memo = self._memo
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

        >>> eg = EGraph()
        >>> eg.equiv("x", "y")
        False
        """
        self._clean()
        ca, cb = self.class_of(a), self.class_of(b)
        return ca is not None and ca == cb

    def extract_term(self, cid: int) -> Term:
        """The smallest term of class ``cid`` (AstSize, greedy)."""
        from egraph.extract import AstSize

        return self.extract(AstSize(), root=cid)[0]

    # -- the door -----------------------------------------------------------------------
    # What the engine's own passes use, no other module reading a private field: the
    # tables (analyses, matchers, extraction and the run loop bind one once and index it in
    # their hot loops; shared, not copied, and read-only outside this class: changed only
    # through the methods here and above), the change log (the run loop), adding and
    # binding instantiators (rules, analyses), and filling classes (serialisation, ingest).

    @property
    def class_nodes(self) -> list[list[tuple] | None]:
        """Per class id, the class's e-nodes ``(op, *child class ids)``; None at an id
        that is not canonical. Canonical after :meth:`rebuild`. Read-only.

        >>> eg = EGraph()
        >>> eg.class_nodes[eg.add("(f x)")]
        [('f', 0)]
        """
        return self._cnodes

    @property
    def class_data(self) -> list[Any]:
        """Per class id, the analysis data (at canonical ids; None without an analysis).
        Read-only: :meth:`set_data` replaces a class's data.

        >>> from egraph import ConstantFolding
        >>> eg = EGraph(analysis=ConstantFolding())
        >>> eg.class_data[eg.add("(+ 1 2)")]
        3
        """
        return self._data

    @property
    def union_find(self) -> UnionFind:
        """The union-find over class ids: ``find`` and the ``parents`` list (an id that
        is its own parent is canonical), for hot loops to bind. Read-only.

        >>> eg = EGraph()
        >>> a, b = eg.add("a"), eg.add("b")
        >>> _ = eg.union(a, b)
        >>> uf = eg.union_find
        >>> uf.find(b) == a, uf.parents[a] == a
        (True, True)
        """
        return self._uf

    @property
    def hashcons(self) -> dict[tuple, int]:
        """Each distinct e-node ever added (canonical after :meth:`rebuild`) -> the id it
        was created with; its size is what node limits count. Read-only.

        >>> eg = EGraph()
        >>> _ = eg.add("(f x)")
        >>> eg.hashcons
        {('x',): 0, ('f', 0): 1}
        """
        return self._memo

    @property
    def created_nodes(self) -> list[tuple]:
        """Every e-node by creation id, as last canonicalised (a child may be stale until
        :meth:`rebuild`; :meth:`created_node` gives one canonical now). Read-only.

        >>> eg = EGraph()
        >>> _ = eg.add("(f x)")
        >>> eg.created_nodes
        [('x',), ('f', 0)]
        """
        return self._node

    @property
    def node_parents(self) -> list[list[int] | None]:
        """Per canonical class id, the creation ids of the e-nodes that use it as a child
        (None: none); :meth:`parents` gives their classes. Read-only.

        >>> eg = EGraph()
        >>> x = eg.add("x")
        >>> f = eg.add_node("f", [x])
        >>> eg.node_parents[x], eg.node_parents[f]
        ([1], None)
        """
        return self._parents

    @property
    def change_log(self) -> list[int]:
        """The classes that merged or whose analysis data changed, in order, since the
        last :meth:`forget_changes` or :meth:`compact` (the run loop searches each rule
        where the e-graph changed since its last search). Read-only.

        >>> eg = EGraph()
        >>> a, b = eg.add("a"), eg.add("b")
        >>> _ = eg.union(a, b)
        >>> eg.change_log
        [0]
        """
        return self._log

    def forget_changes(self, count: int) -> None:
        """Drop the first ``count`` entries of :attr:`change_log` (the run loop drops
        what every rule has searched past).

        >>> eg = EGraph()
        >>> _ = eg.union(eg.add("a"), eg.add("b"))
        >>> eg.forget_changes(1)
        >>> eg.change_log
        []
        """
        del self._log[:count]

    def compact(self) -> None:
        """Drop what only a running saturation needs: the change log, the per-class op
        index. (Merged entries of the per-op lists go when :meth:`classes_with_op` next
        reads them: a pass over every op here cost a transient set per op.)

        >>> eg = EGraph()
        >>> _ = eg.union(eg.add("a"), eg.add("b"))
        >>> eg.compact()
        >>> eg.change_log
        []
        """
        self._log.clear()
        self._opidx.clear()

    def add_canonical(self, node: tuple) -> int:
        """Add the e-node ``node`` whose children are canonical class ids; returns its
        class id. The hot path of adding (:meth:`add_node` canonicalises first); not for
        an e-graph with explanations (:meth:`add_explained`).

        >>> eg = EGraph()
        >>> eg.add_canonical(("f", eg.add("x"))) == eg.add("(f x)")
        True
        """
        memo = self._memo
        nid = memo.get(node)
        if nid is not None:
            return self._uf.find(nid)
        if self.analysis is None:
            return self._new_node(node)
        # A union made by an analysis while this term was being built can leave a child
        # stale; re-canonicalise before creating anything.
        find = self._uf.find
        canon = canonical(node, self._uf.parents, find)
        if canon != node:
            nid = memo.get(canon)
            if nid is not None:
                return find(nid)
        return find(self._new_node(canon))

    def add_explained(self, orig: tuple) -> int:
        """Add the e-node ``orig`` whose children are e-node ids, kept as given so that
        a proof goes through exactly them; returns its id (an e-graph with explanations
        only). The same e-node over other members of the children's classes is a new
        id, congruent to the first.

        >>> eg = EGraph(explanations=True)
        >>> a, b = eg.add("a"), eg.add("b")
        >>> _ = eg.union(a, b)
        >>> fa, fb = eg.add_explained(("f", a)), eg.add_explained(("f", b))
        >>> fa != fb, eg.find(fa) == eg.find(fb)
        (True, True)
        """
        find = self._uf.find
        node = (orig[0], *[find(c) for c in orig[1:]])
        existing = self._memo.get(node)
        proofs = self._proofs
        if existing is None:
            return self._new_node(node, orig)
        if proofs.orig[existing] == orig:
            return existing
        # The same e-node reached through other representatives: a new id, congruent to it.
        nid = len(self._node)
        self._uf.parents.append(find(existing))
        self._node.append(node)
        self._cnodes.append(None)
        self._parents.append(None)
        self._data.append(None)
        proofs.add_node(orig)
        proofs.union(nid, existing, CONGRUENCE)
        return nid

    def bind_instantiator(self, make: Callable) -> Callable[[tuple], int]:
        """Bind a compiled instantiator (:meth:`Pattern.instantiator`) to this e-graph:
        a function from a match to the class id of the instance, added where missing.

        >>> from egraph import Pattern
        >>> eg = EGraph()
        >>> x = eg.add("x")
        >>> inst = eg.bind_instantiator(Pattern.of("(f ?a)").instantiator({"a": 1}, False))
        >>> inst((x, x)) == eg.add("(f x)")
        True
        """
        if self._proofs is not None:
            add = self.add_explained
        elif self.analysis is None:
            # The instantiator has looked the canonical e-node up already, and with no
            # analysis nothing can union while it builds: a miss is a new e-node.
            add = self._new_node
        else:
            add = self.add_canonical
        return make(self._memo, self._uf.parents, self._uf.find, add)

    def bind_lookup(self, make: Callable) -> Callable[[tuple], int | None]:
        """Bind a compiled instantiator to look its instance up without adding anything:
        the class id, or None where an e-node of it is not in the e-graph yet.

        >>> from egraph import Pattern
        >>> eg = EGraph()
        >>> x = eg.add("x")
        >>> look = eg.bind_lookup(Pattern.of("(f ?a)").instantiator({"a": 1}, False))
        >>> look((x, x)), eg.num_classes
        (None, 1)
        """
        return make(self._memo, self._uf.parents, self._uf.find, _absent)

    def op_nodes(self, c: int, op: Hashable) -> list[tuple]:
        """The e-nodes of canonical class ``c`` with operator ``op``, cached until the class
        changes; the generated matchers call it for large classes. One pass per class and
        operator a pattern asks for, however many parents and patterns ask.

        >>> eg = EGraph()
        >>> c = eg.add("(f x)")
        >>> _ = eg.union(c, eg.add("(g x)"))
        >>> _ = eg.rebuild()
        >>> eg.op_nodes(eg.find(c), "g")
        [('g', 0)]
        """
        index = self._opidx.get(c)
        if index is None:
            index = self._opidx[c] = {}
        found = index.get(op)
        if found is None:
            found = index[op] = [n for n in self._cnodes[c] if n[0] == op]
        return found

    def set_nodes(self, c: int, nodes: list[tuple]) -> None:
        """Replace the e-node list of canonical class ``c`` with ``nodes``, some of its
        own (pruning; :meth:`retain_nodes` takes a predicate instead).

        >>> eg = EGraph()
        >>> c = eg.add("(f x)")
        >>> _ = eg.union(c, eg.add("y"))
        >>> c = eg.find(c)
        >>> eg.set_nodes(c, [n for n in eg.class_nodes[c] if len(n) == 1])
        >>> eg.class_nodes[c]
        [('y',)]
        """
        self._cnodes[c] = nodes
        self._opidx.pop(c, None)

    def class_of(self, value: int | Term | str) -> int | None:
        """The canonical class of an id, or of a term looked up (never added): None for
        a term not in the e-graph.

        >>> eg = EGraph()
        >>> a = eg.add("(f x)")
        >>> eg.class_of("(f x)") == eg.class_of(a), eg.class_of("(f y)")
        (True, None)
        """
        if isinstance(value, int) and not isinstance(value, bool):
            return self._uf.find(value)
        return self.lookup(value)

    def set_roots(self, ids: Iterable[int]) -> None:
        """Make ``ids`` the root classes, in order (a builder's outputs; see :attr:`roots`).

        >>> eg = EGraph()
        >>> a, b = eg.add("a"), eg.add("b")
        >>> eg.set_roots([b, a])
        >>> eg.roots
        [1, 0]
        """
        self._roots = list(ids)

    def reserve_class(self) -> int:
        """A new class with no e-nodes yet, for a builder that must name classes before
        it fills them (a serialized e-graph's classes may be cyclic); fill it with
        :meth:`add_to_class`.

        >>> eg = EGraph()
        >>> c = eg.reserve_class()
        >>> eg.class_nodes[c], eg.num_classes
        ([], 1)
        """
        cid = len(self._node)
        self._uf.parents.append(cid)
        self._node.append(("<reserved>",))
        self._cnodes.append([])
        self._parents.append(None)
        self._data.append(None)
        self._num_classes += 1
        if self._proofs is not None:
            self._proofs.add_node(("<reserved>",))
        return cid

    def add_to_class(self, node: tuple, cid: int, reason: Any = "union") -> int:
        """Put the e-node ``node`` (children canonical class ids) into class ``cid``; an
        identical e-node already present merges its class with ``cid``. ``reason`` is the
        merge's, for proofs. Returns the merged class's id.

        >>> eg = EGraph()
        >>> c = eg.reserve_class()
        >>> c = eg.add_to_class(("x",), c)
        >>> eg.class_nodes[c], eg.lookup("x") == c
        ([('x',)], True)
        """
        existing = self._memo.get(node)
        if existing is not None:
            self.union(existing, cid, reason)
        else:
            self.union(cid, self._new_node(node), reason)
        return self._uf.find(cid)

    def reanalyse(self) -> None:
        """Make every e-node's analysis data again, merge it into its class's and
        rebuild: for classes filled before their children's data was known (loading a
        serialized e-graph). Nothing without an analysis.

        >>> from egraph import ConstantFolding
        >>> eg = EGraph(analysis=ConstantFolding())
        >>> c = eg.add("(+ 1 2)")
        >>> eg.set_data(c, None)
        >>> eg.reanalyse()
        >>> eg.data(c)
        3
        """
        if self.analysis is None:
            return
        self._analysis_pending.extend(range(len(self._node)))
        self.rebuild()

    # -- the big verbs ------------------------------------------------------------------

    def saturate(self, rules, iter_limit: int = 30, node_limit: int = 10_000,
                 time_limit: float = 5.0, scheduler=None, goals=None,
                 incremental: bool = True) -> EGraph:
        """Apply ``rules`` until nothing changes or a limit is hit; returns ``self``.

        What happened is in :attr:`report` (stop reason, per-iteration sizes and times,
        per-rule counts). ``goals``: pairs of terms or ids; stop once each pair is equal (a
        side written as a pattern, with ``?vars``, holds once it matches in the other's class).
        ``incremental``: search each rule only where the e-graph changed since its last
        search (off: search everything every iteration).

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
        """
        from egraph.extract import extract

        with gc_paused():
            return extract(self, cost, root=root, **options)

    def pareto(self, cost_a, cost_b, root: int | None = None, **options) -> list:
        """The non-dominated programs under two costs, with both costs each
        (``extractors.pareto``): terms on a plain e-graph, GraphModules from FX."""
        from egraph.extract.pareto import pareto

        return pareto(self, cost_a, cost_b, root=root, **options)

    def explain(self, a: int | Term | str, b: int | Term | str) -> Explanation:
        """The chain of rewrites that proves ``a`` equal to ``b``.

        Needs ``EGraph(explanations=True)``; terms are added (with their own ids) so the
        proof starts and ends at exactly those terms.

        >>> from egraph import rewrite
        >>> eg = EGraph(explanations=True)
        >>> _ = eg.add("(+ a b)")
        >>> _ = eg.saturate([rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)")])
        >>> print(eg.explain("(+ a b)", "(+ b a)"))
        (+ a b)
        (+ b a)  by comm
        """
        if self._proofs is None:
            raise ValueError(
                "this e-graph records no explanations: build it with EGraph(explanations=True)"
            )
        ia = a if isinstance(a, int) else self.add(a)
        ib = b if isinstance(b, int) else self.add(b)
        self._clean()
        if self._uf.find(ia) != self._uf.find(ib):
            raise ValueError(f"cannot explain: {a} and {b} are not equal in this e-graph")
        return self._proofs.explain(ia, ib)

    # -- export -------------------------------------------------------------------------

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
