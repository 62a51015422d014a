"""Explanations: why two terms are equal, as a chain of rewrites (egg's proof forest).

Every union is recorded as an edge between the two e-node ids it joined, labelled with its
reason (a rule name, ``constant-fold``, a user union, or congruence). The edges form a
forest; the path between two ids is the proof. A congruence edge is explained by proving
the children equal, so the flattened explanation rewrites one subterm at a time.

>>> from egraph import EGraph, rewrite
>>> eg = EGraph(explanations=True)
>>> _ = eg.add("(* (+ a 0) 2)")
>>> _ = eg.saturate([rewrite("zero-add", "(+ ?x 0)", "?x")])
>>> print(eg.explain("(* (+ a 0) 2)", "(* a 2)"))
(* (+ a 0) 2)
(* a 2)  by zero-add
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egraph.term import Term


class _Congruence:
    """The reason of a union found by rebuilding: the children were already equal."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "congruence"


CONGRUENCE = _Congruence()


@dataclass(frozen=True)
class Step:
    """One rewrite: the whole term after it, the rule's name, and its direction."""

    term: Term
    rule: str | None
    forward: bool = True

    def __str__(self) -> str:
        if self.rule is None:
            return str(self.term)
        arrow = "" if self.forward else " (right to left)"
        return f"{self.term}  by {self.rule}{arrow}"


class Explanation(list):
    """A list of :class:`Step` from the first term to the second; prints one per line."""

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self)

    @property
    def rules(self) -> list[str]:
        """Names of the rules used, in order."""
        return [s.rule for s in self if s.rule is not None]


class ProofForest:
    """The union history of an e-graph, over e-node ids."""

    __slots__ = ("orig", "_next", "_reason", "_forward")

    def __init__(self) -> None:
        self.orig: list[tuple] = []
        self._next: list[int] = []
        self._reason: list[Any] = []
        self._forward: list[bool] = []

    def add_node(self, orig: tuple) -> None:
        """Record a new e-node id with its children as node ids."""
        i = len(self.orig)
        self.orig.append(orig)
        self._next.append(i)
        self._reason.append(None)
        self._forward.append(True)

    def union(self, a: int, b: int, reason: Any) -> None:
        """Record that ``a`` (left side) was made equal to ``b`` (right side)."""
        self._reroot(a)
        self._next[a] = b
        self._reason[a] = reason
        self._forward[a] = True

    def _reroot(self, a: int) -> None:
        """Reverse the path from ``a`` to its tree's root so that ``a`` becomes the root."""
        prev, prev_reason, prev_forward = a, None, True
        cur = a
        while True:
            nxt = self._next[cur]
            reason, forward = self._reason[cur], self._forward[cur]
            self._next[cur] = prev
            self._reason[cur] = prev_reason
            self._forward[cur] = not prev_forward if prev_reason is not None else True
            if nxt == cur:
                break
            prev, prev_reason, prev_forward = cur, reason, forward
            cur = nxt
        self._next[a] = a
        self._reason[a] = None

    def _path(self, a: int, b: int) -> list[tuple[int, int, Any, bool]]:
        """Edges ``(from, to, reason, forward)`` on the forest path from ``a`` to ``b``."""
        up_a = [a]
        while self._next[up_a[-1]] != up_a[-1]:
            up_a.append(self._next[up_a[-1]])
        index_a = {n: i for i, n in enumerate(up_a)}
        up_b = [b]
        while up_b[-1] not in index_a:
            nxt = self._next[up_b[-1]]
            if nxt == up_b[-1]:
                raise ValueError(f"e-nodes {a} and {b} were never made equal")
            up_b.append(nxt)
        meet = up_b[-1]
        edges = []
        for n in up_a[: index_a[meet]]:
            edges.append((n, self._next[n], self._reason[n], self._forward[n]))
        down = []
        for n in up_b[:-1]:
            down.append((self._next[n], n, self._reason[n], not self._forward[n]))
        return edges + down[::-1]

    def term(self, nid: int) -> Term:
        """The term e-node ``nid`` was added as."""
        cache: dict[int, Term] = {}
        stack = [nid]
        while stack:
            n = stack[-1]
            if n in cache:
                stack.pop()
                continue
            missing = [c for c in self.orig[n][1:] if c not in cache]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            node = self.orig[n]
            cache[n] = Term(node[0], tuple(cache[c] for c in node[1:]))
        return cache[nid]

    def explain(self, a: int, b: int) -> Explanation:
        """The flattened proof that e-node ``a`` equals e-node ``b``."""
        steps = Explanation([Step(self.term(a), None)])
        for term, rule, forward in self._flat(a, b, set()):
            steps.append(Step(term, rule, forward))
        return steps

    def _flat(self, a: int, b: int, active: set) -> list[tuple[Term, str, bool]]:
        if a == b:
            return []
        if (a, b) in active:
            raise RecursionError(f"cyclic congruence proof between e-nodes {a} and {b}")
        active.add((a, b))
        out: list[tuple[Term, str, bool]] = []
        for src, dst, reason, forward in self._path(a, b):
            if reason is CONGRUENCE:
                out.extend(self._congruence(src, dst, active))
            else:
                out.append((self.term(dst), str(reason), forward))
        active.discard((a, b))
        return out

    def _congruence(self, src: int, dst: int, active: set) -> list[tuple[Term, str, bool]]:
        node_a, node_b = self.orig[src], self.orig[dst]
        args = [self.term(c) for c in node_a[1:]]
        out = []
        for i, (ca, cb) in enumerate(zip(node_a[1:], node_b[1:])):
            for child_term, rule, forward in self._flat(ca, cb, active):
                args[i] = child_term
                out.append((Term(node_a[0], tuple(args)), rule, forward))
        return out
