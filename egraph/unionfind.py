"""Union-find over dense integer ids, with path halving.

The parent array is a plain list so the e-graph's hot loops can read it directly.

>>> uf = UnionFind()
>>> a, b, c = uf.make_set(), uf.make_set(), uf.make_set()
>>> uf.union(a, b)
0
>>> uf.find(b) == uf.find(a), uf.find(c) == uf.find(a)
(True, False)
"""

from __future__ import annotations


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
