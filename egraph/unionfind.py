"""Union-find over dense integer ids, with path halving, and e-nodes made canonical by it.

The parent array is a plain list so the e-graph's hot loops can read it directly.

>>> uf = UnionFind()
>>> a, b, c = uf.make_set(), uf.make_set(), uf.make_set()
>>> uf.union(a, b)
0
>>> uf.find(b) == uf.find(a), uf.find(c) == uf.find(a)
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable


class UnionFind:
    """Disjoint sets of ids ``0..n-1``; ``union(root, other)`` keeps ``root`` as the leader."""

    __slots__ = ("parents",)

    def __init__(self) -> None:
        self.parents: list[int] = []

    def __len__(self) -> int:
        return len(self.parents)

    def make_set(self) -> int:
        """A new singleton set; returns its id."""
        i = len(self.parents)
        self.parents.append(i)
        return i

    def find(self, i: int) -> int:
        """The leader of ``i``'s set, halving the path on the way."""
        parents = self.parents
        while True:
            p = parents[i]
            if p == i:
                return i
            gp = parents[p]
            parents[i] = gp
            i = gp

    def union(self, root: int, other: int) -> int:
        """Make the leader ``root`` the leader of ``other``'s leader; returns ``root``."""
        self.parents[self.find(other)] = root
        return root

    def is_leader(self, i: int) -> bool:
        """True when ``i`` leads its set."""
        return self.parents[i] == i


def canonical(node: tuple, P: list[int], find: Callable[[int], int]) -> tuple:
    """``node`` with canonical children; ``node`` itself when nothing changed.

    ``P`` is the union-find's parent list: a child that is its own parent is canonical
    without a call to ``find``. Specialised by arity: this is the hot path of rebuilding.

    >>> uf = UnionFind()
    >>> a, b = uf.make_set(), uf.make_set()
    >>> _ = uf.union(a, b)
    >>> canonical(("f", b), uf.parents, uf.find), canonical(("f", a), uf.parents, uf.find)
    (('f', 0), ('f', 0))
    """
    n = len(node)
    if n == 3:
        a = node[1]
        b = node[2]
        if P[a] == a and P[b] == b:
            return node
        return (node[0], find(a), find(b))
    if n == 2:
        a = node[1]
        return node if P[a] == a else (node[0], find(a))
    if n == 1:
        return node
    kids = node[1:]
    if all(P[c] == c for c in kids):
        return node
    return (node[0], *[find(c) for c in kids])
