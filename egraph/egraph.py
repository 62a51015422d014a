"""The e-graph: hash-consed e-nodes in e-classes, with egg-style deferred rebuilding.

Every e-node gets a dense integer id when it is first added; that id is also the id of the
class it starts in, so class ids, node ids and union-find entries are one array index.
An e-node is a plain tuple ``(op, child_class, ...)``. Unions only record the merge and
queue the parents of the merged class; :meth:`EGraph.rebuild` restores the hash-cons and
congruence closure in one pass over that worklist (egg's rebuilding).

This module holds the tables and the operations that change them, and the door: the
documented members the engine's passes read the tables through. What needs no more than
the door (adding and looking up terms, saturating, extracting, explaining, exporting) is
:class:`egraph.verbs.Verbs`, which :class:`EGraph` inherits.

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
from egraph.explain import CONGRUENCE, ProofForest
from egraph.unionfind import UnionFind, canonical
from egraph.verbs import Verbs

if TYPE_CHECKING:
    from egraph.analysis import Analysis
    from egraph.run import Report


class UnsoundMerge(ValueError):
    """Raised by an analysis when two classes that cannot be equal are merged."""


class EGraph(Verbs):
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

    # -- inspecting ---------------------------------------------------------------------

    def find(self, cid: int) -> int:
        """The canonical id of the class ``cid`` belongs to."""
        return self._uf.find(cid)

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
    def roots(self) -> list[int]:
        """Canonical ids of the root classes (outputs, or terms added with ``root=True``)."""
        find = self._uf.find
        return [find(r) for r in self._roots]

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
    def proofs(self) -> ProofForest | None:
        """Why classes merged, for :meth:`explain` (None: built without explanations).

        >>> EGraph().proofs is None, EGraph(explanations=True).proofs is not None
        (True, True)
        """
        return self._proofs

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

    def add_root(self, cid: int) -> None:
        """Record class ``cid`` as the next root (see :attr:`roots`).

        >>> eg = EGraph()
        >>> eg.add_root(eg.add("a"))
        >>> eg.roots
        [0]
        """
        self._roots.append(cid)

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
