"""Rewrite rules: a name, a left side, a right side and an optional guard.

The left side is a pattern (or a multi-pattern: several ``?v = pattern`` conjuncts that
share variables). The right side is a pattern, a multi-pattern of ``?v = pattern`` /
``?v = ?w`` equations, or a Python callable ``(egraph, subst)`` returning a class id, a
term to add, or None to skip (a dynamic rewrite). The guard ``when(egraph, subst)`` must be
true for the rewrite to apply.

>>> r = rewrite("cancel-sub", "(- ?a ?a)", "0")
>>> r
Rewrite('cancel-sub', '(- ?a ?a)' => '0')
>>> rewrite("bad", "(+ ?a 0)", "?b")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: rule 'bad': the right side uses ?b, which the left side does not bind; ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from egraph.pattern import Pattern, Subst
from egraph.term import Term, parse

if TYPE_CHECKING:
    from egraph.egraph import EGraph

Guard = Callable[["EGraph", Subst], bool]
Applier = Callable[["EGraph", Subst], Any]


def _parse_equation(text: str | tuple, rule: str) -> tuple[str, Term]:
    """``"?v = (f ?x)"`` (or ``("v", term)``) as ``(name, term)``."""
    if isinstance(text, tuple):
        name, term = text
        return name.lstrip("?"), term if isinstance(term, Term) else parse(term)
    left, sep, right = text.partition("=")
    left = left.strip()
    if not sep or not left.startswith("?"):
        raise ValueError(
            f"rule {rule!r}: multi-pattern parts are written '?v = (pattern)', got {text!r}"
        )
    return left[1:], parse(right)


class MultiPattern:
    """Conjunctive patterns ``?v1 = p1, ?v2 = p2, ...`` joined on shared variables."""

    def __init__(self, parts: Sequence[tuple[str, Term]]):
        self.parts = [(name, Pattern.of(term)) for name, term in parts]
        order: dict[str, None] = {}
        for name, pat in self.parts:
            order.setdefault(name, None)
            for v in pat.variables:
                order.setdefault(v, None)
        self.variables = list(order)
        self.depth = max(p.depth for _, p in self.parts)

    def __str__(self) -> str:
        return ", ".join(f"?{n} = {p}" for n, p in self.parts)

    def search_tuples(self, egraph: EGraph, roots=None, limit: int = 1 << 62) -> list[tuple]:
        """Matches as ``(root, v0, v1, ...)``: the root is the first part's class."""
        rows: list[dict[str, int]] = [{}]
        for name, pat in self.parts:
            found = pat.search_tuples(egraph)
            new_rows = []
            for row in rows:
                for m in found:
                    binding = {name: m[0]}
                    binding.update(zip(pat.variables, m[1:]))
                    if all(row.get(k, v) == v for k, v in binding.items()):
                        new_rows.append({**row, **binding})
            rows = new_rows
            if not rows:
                return []
        first = self.parts[0][0]
        out = [tuple([row[first]] + [row[v] for v in self.variables]) for row in rows]
        return out[: limit + 1]


class Rewrite:
    """A named rewrite rule; build it with :func:`rewrite`.

    ``search`` finds matches as tuples, ``apply`` adds right sides and unions them.
    """

    def __init__(self, name: str, lhs, rhs, when: Guard | None = None, description: str = ""):
        if not isinstance(name, str) or not name:
            raise ValueError("a rewrite needs a non-empty name")
        self.name = name
        self.when = when
        self.description = description
        if isinstance(lhs, (list, tuple)) and not isinstance(lhs, Term):
            self.lhs: Pattern | MultiPattern = MultiPattern(
                [_parse_equation(p, name) for p in lhs]
            )
        else:
            self.lhs = Pattern.of(lhs)
        self.variables = list(self.lhs.variables)
        self._index = {v: i + 1 for i, v in enumerate(self.variables)}
        bound = set(self.variables)
        self.rhs_equations: list[tuple[str, Pattern]] | None = None
        self.rhs: Pattern | None = None
        self.applier: Applier | None = None
        if callable(rhs) and not isinstance(rhs, Term):
            self.applier = rhs
        elif isinstance(rhs, (list, tuple)) and not isinstance(rhs, Term):
            eqs = [_parse_equation(p, name) for p in rhs]
            self.rhs_equations = []
            for target, term in eqs:
                pat = Pattern.of(term)
                self._check_bound(pat.variables, bound)
                self.rhs_equations.append((target, pat))
                bound.add(target)
        else:
            self.rhs = Pattern.of(rhs)
            self._check_bound(self.rhs.variables, bound)

    def _check_bound(self, used: list[str], bound: set[str]) -> None:
        for v in used:
            if v not in bound:
                raise ValueError(
                    f"rule {self.name!r}: the right side uses ?{v}, which the left side does "
                    "not bind; bind it on the left or compute it with a dynamic right side "
                    "(a callable)"
                )

    def __repr__(self) -> str:
        if self.applier is not None:
            right = getattr(self.applier, "__name__", "<callable>")
        elif self.rhs_equations is not None:
            right = ", ".join(f"?{t} = {p}" for t, p in self.rhs_equations)
        else:
            right = str(self.rhs)
        return f"Rewrite({self.name!r}, {str(self.lhs)!r} => {right!r})"

    @property
    def depth(self) -> int:
        """How many parent steps above a changed class a new match can be rooted."""
        return self.lhs.depth

    @property
    def root_op(self):
        """The operator every match's root class holds (None: any class)."""
        return getattr(self.lhs, "root_op", None)

    def subst(self, match: tuple) -> Subst:
        """The :class:`Subst` of a match tuple."""
        return Subst(self._index, match)

    def search(self, egraph: EGraph, roots=None, limit: int = 1 << 62) -> list[tuple]:
        """Matches as ``(root, v0, v1, ...)`` tuples (at most ``limit + 1``)."""
        return self.lhs.search_tuples(egraph, roots, limit)

    def apply(self, egraph: EGraph, matches: list[tuple], node_limit: int = 1 << 62,
              deadline: float | None = None, clock: Callable[[], float] | None = None
              ) -> tuple[int, bool]:
        """Apply the right side to every match; returns (unions that merged, completed).

        Stops early (completed False) once the hash-cons exceeds ``node_limit`` or the
        ``deadline`` (checked every 256 matches) passes.
        """
        explained = egraph.explanations
        bind = egraph._bind_instantiator
        name = self.name
        index = self._index
        union = egraph._union
        memo = egraph._memo
        if self.rhs is not None and self.when is None and not explained:
            # The common case, kept tight: no guard, no proof recording.
            inst = bind(self.rhs.instantiator(index, False))
            P = egraph._uf.parents
            find = egraph._uf.find
            merged = 0
            for count, m in enumerate(matches):
                target = inst(m)
                root = m[0]
                if P[root] != root:
                    root = find(root)
                if root != target and union(root, target, name):
                    merged += 1
                if len(memo) > node_limit:
                    return merged, False
                if deadline is not None and not count & 255 and clock() > deadline:
                    return merged, False
            return merged, True
        guard = self.when
        inst = bind(self.rhs.instantiator(index, explained)) if self.rhs is not None else None
        lhs_inst = None
        if explained and isinstance(self.lhs, Pattern):
            lhs_inst = bind(self.lhs.instantiator(index, True))
        merged = 0
        for count, m in enumerate(matches):
            subst = Subst(index, m)
            if guard is not None and not self._guarded(guard, egraph, subst):
                continue
            if inst is not None:
                target = inst(m)
            elif self.applier is not None:
                target = self._dynamic(egraph, subst)
                if target is None:
                    continue
            else:
                merged += self._apply_equations(egraph, m)
                continue
            source = lhs_inst(m) if lhs_inst is not None else m[0]
            if union(source, target, name):
                merged += 1
            if len(memo) > node_limit:
                return merged, False
            if deadline is not None and not count & 255 and clock() > deadline:
                return merged, False
        return merged, True

    def _guarded(self, guard: Guard, egraph: EGraph, subst: Subst) -> bool:
        try:
            return bool(guard(egraph, subst))
        except Exception as err:
            err.add_note(f"in the guard of rule {self.name!r} at {subst}")
            raise

    def _dynamic(self, egraph: EGraph, subst: Subst) -> int | None:
        try:
            result = self.applier(egraph, subst)
        except Exception as err:
            err.add_note(f"in the right side of rule {self.name!r} at {subst}")
            raise
        if result is None:
            return None
        if isinstance(result, Term):
            return egraph.add(result)
        if isinstance(result, int) and not isinstance(result, bool):
            return result
        raise TypeError(
            f"the right side of rule {self.name!r} returned {type(result).__name__}: "
            "return a class id, a Term, or None to skip"
        )

    def _apply_equations(self, egraph: EGraph, match: tuple) -> int:
        bound = dict(zip(self.variables, match[1:]))
        explained = egraph.explanations
        merged = 0
        for target, pat in self.rhs_equations:
            index = {v: i + 1 for i, v in enumerate(bound)}
            row = (match[0], *bound.values())
            cid = egraph._bind_instantiator(pat.instantiator(index, explained))(row)
            if target in bound:
                merged += egraph._union(bound[target], cid, self.name)
            else:
                bound[target] = cid
        return merged


def rewrite(name: str, lhs, rhs, when: Guard | None = None, description: str = "") -> Rewrite:
    """A rewrite rule ``lhs => rhs`` (guarded by ``when(egraph, subst)`` if given).

    >>> rewrite("comm-add", "(+ ?a ?b)", "(+ ?b ?a)")
    Rewrite('comm-add', '(+ ?a ?b)' => '(+ ?b ?a)')
    """
    return Rewrite(name, lhs, rhs, when=when, description=description)


def birewrite(name: str, lhs, rhs, when: Guard | None = None,
              description: str = "") -> list[Rewrite]:
    """Both directions: ``name`` rewrites lhs to rhs, ``name-rev`` rhs to lhs.

    >>> [r.name for r in birewrite("assoc", "(+ ?a (+ ?b ?c))", "(+ (+ ?a ?b) ?c)")]
    ['assoc', 'assoc-rev']
    """
    return [
        Rewrite(name, lhs, rhs, when=when, description=description),
        Rewrite(name + "-rev", rhs, lhs, when=when, description=description),
    ]
