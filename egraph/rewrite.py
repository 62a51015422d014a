"""Rewrite rules: a name, a left side, a right side and an optional guard.

The left side is a pattern (or a multi-pattern: several ``?v = pattern`` conjuncts that
share variables), written as an s-expression or as a term built with :mod:`egraph.ops` and
Python operators (``log(1 + x)``).

How a left side matches, beyond its literal spelling (egg's own op names, ``+`` and
``*``, are left as written, so rule sets ported from egg keep their meaning):

- the canonical commutative ops (:data:`COMMUTATIVE_OPS`: ``add``, ``mul``, ...) match
  both operand orders, so ``log(1 + x)`` also matches ``log(x + 1)``;
- a number that is an operand of a pointwise op (:data:`NUMBER_OPERANDS`: arithmetic,
  comparisons, ``where``, ``clamp``, ...) matches that number whether the program holds it
  as an int or a float literal: ``1 + x`` matches ``#int:1`` and ``#float:1.0``; ``0.5``
  matches only the float. Attributes (dims, keepdim, shapes, ``softplus``'s beta) match as
  written.

Each such left side is expanded once, when the rule is made, into its variants (one
compiled pattern each, compiled when a search first needs it); their matches are reported
in the rule's variable order. A left side whose commutative ops nest deeply (more than
eight variants) is matched by trying both operand orders at each commutative e-node
instead. Where the right side writes a number that the left side matched, it takes the
kind the program used (``(x + 1) * 2 => x * 2 + 2`` keeps an int tensor int).

The right side is a pattern, a multi-pattern of ``?v = pattern`` / ``?v = ?w`` equations,
or a Python callable ``(egraph, subst)`` returning a class id, a term to add, or None to
skip (a dynamic rewrite). The guard ``when(egraph, subst)`` must be true for the rewrite to
apply.

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

from egraph.dims import SymbolicSize
from egraph.ops.table import TABLE
from egraph.pattern import Pattern, Subst
from egraph.term import Term, Var, parse, walk

if TYPE_CHECKING:
    from egraph.egraph import EGraph

Guard = Callable[["EGraph", Subst], bool]
Applier = Callable[["EGraph", Subst], Any]

_COMPILE_AT_MOST = 8
"""Left sides with more variants than this are matched by :class:`_CommutativeSearch`."""

COMMUTATIVE_OPS = frozenset(name for name, entry in TABLE.items() if entry.commutative)
"""Canonical ops whose two operands commute (the op table's ``commutative``): a pattern
matches them in either order."""

NUMBER_OPERANDS: dict[str, frozenset[int]] = {
    name: frozenset(i for i, p in enumerate(entry.params, start=1) if p in entry.operands)
    for name, entry in TABLE.items() if entry.kind == "pointwise"
}
"""Per pointwise op of the table, the argument positions (from 1) of its operands, where a
program may hold a number as an int or a float; attributes (``softplus``'s beta, ``gelu``'s
approximation) are not among them."""


def _number_kinds(term: Term) -> list[Term]:
    """The literals a number operand of a pointwise op stands for."""
    tag, value = term.op
    if value != value or abs(value) == float("inf"):
        return [term]
    if tag == "int":
        # A float literal is the same number only where the float holds the int exactly.
        return [term, Term(("float", float(value)))] if float(value) == value else [term]
    if value.is_integer():
        return [term, Term(("int", int(value)))]
    return [term]


def _is_number(term: Term) -> bool:
    return not term.args and type(term.op) is tuple and term.op[0] in ("int", "float")


def match_variants(term: Term) -> list[Term]:
    """Every spelling a pattern stands for: commutative operands in both orders, numbers as
    int and float literals (the pattern itself first, no repeats).

    >>> from egraph.term import vars
    >>> (x,) = vars("x")
    >>> [str(v) for v in match_variants(1 + x)]
    ['(add #int:1 ?x)', '(add ?x #int:1)', '(add #float:1.0 ?x)', '(add ?x #float:1.0)']
    """
    if isinstance(term, Var) or not term.args:
        return [term]
    numbers = NUMBER_OPERANDS.get(term.op, ())
    options = [_number_kinds(a) if i in numbers and _is_number(a) else match_variants(a)
               for i, a in enumerate(term.args, start=1)]
    combos: list[tuple] = [()]
    for choice in options:
        combos = [c + (a,) for c in combos for a in choice]
    out: dict[Term, None] = {}
    for args in combos:
        out.setdefault(Term(term.op, args), None)
        if term.op in COMMUTATIVE_OPS and len(args) == 2:
            out.setdefault(Term(term.op, args[::-1]), None)
    return list(out)


def _number_leaves(term: Term) -> dict[float, list[str]]:
    """Value -> tags of the numbers that are operands of pointwise ops."""
    found: dict[float, list[str]] = {}
    stack = [term]
    while stack:
        t = stack.pop()
        numbers = NUMBER_OPERANDS.get(t.op, ())
        for i, a in enumerate(t.args, start=1):
            if i in numbers and _is_number(a):
                found.setdefault(a.op[1], []).append(a.op[0])
            stack.append(a)
    return found


def _retag(term: Term, kinds: dict[float, str]) -> Term:
    """``term`` with its number operands of value ``v`` tagged ``kinds[v]``."""
    if not term.args:
        return term
    args = []
    numbers = NUMBER_OPERANDS.get(term.op, ())
    for i, a in enumerate(term.args, start=1):
        if i in numbers and _is_number(a) and a.op[1] in kinds:
            tag = kinds[a.op[1]]
            args.append(Term((tag, int(a.op[1]) if tag == "int" else float(a.op[1]))))
        else:
            args.append(_retag(a, kinds))
    return Term(term.op, tuple(args))


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


class _CommutativeSearch:
    """Matches a left side whose commutative ops nest (gelu's formula has 256 spellings)
    by trying both operand orders at each commutative e-node, instead of compiling every
    spelling; the subterms free of commutative ops are compiled patterns (one per kind of
    number). Results for a subterm at a class are computed once per search."""

    def __init__(self, term: Term):
        self.term = term
        self.variables = term.variables()
        self._flat: dict[int, list[Pattern]] = {}
        self._kinds: dict[int, list[Term]] = {}
        stack = [term]
        while stack:
            t = stack.pop()
            if isinstance(t, Var) or not t.args:
                continue
            if any(u.op in COMMUTATIVE_OPS for u in walk(t) if u.args):
                numbers = NUMBER_OPERANDS.get(t.op, ())
                for i, a in enumerate(t.args, start=1):
                    if i in numbers and _is_number(a):
                        self._kinds[id(a)] = _number_kinds(a)
                    else:
                        stack.append(a)
            else:
                self._flat[id(t)] = [Pattern.of(v) for v in match_variants(t)]

    def search(self, egraph: EGraph, roots, limit: int) -> list[tuple]:
        possible: dict[int, set[int] | None] = {}
        top = self._possible(self.term, egraph, possible)
        if roots is None:
            roots = egraph.classes_with_op(self.term.op) if top is None else top
        elif top is not None:
            roots = [r for r in roots if egraph.find(r) in top]
        memo: dict[tuple[int, int], list[dict[str, int]]] = {}
        out: dict[tuple, None] = {}
        for r in roots:
            for binding in self._match(self.term, r, egraph, memo, possible):
                out.setdefault((r, *[binding[v] for v in self.variables]), None)
            if len(out) > limit:
                break
        return list(out)

    def _possible(self, t: Term, egraph: EGraph, out: dict) -> set[int] | None:
        """The classes that may match subterm ``t`` (None: any), found upwards from its
        numbers through the e-graph's parent index: a class can match ``c * y`` only if
        it holds a ``*`` e-node over ``c``'s class. GELU's formula has five numbers, each
        the child of a few e-nodes, so a search visits those instead of every product."""
        if isinstance(t, Var) or id(t) in self._flat:
            return None
        if not t.args or id(t) in self._kinds:
            found = {egraph.find(c) for c in map(egraph.lookup, self._kinds.get(id(t), [t]))
                     if c is not None}
        else:
            found = None
            find, parents, nodes = egraph.find, egraph.node_parents, egraph.created_nodes
            for arg in t.args:
                below = self._possible(arg, egraph, out)
                if below is None:
                    continue
                above = {find(n) for c in below for n in parents[c] or ()
                         if nodes[n][0] == t.op}
                found = above if found is None else found & above
        out[id(t)] = found
        return found

    def _match(self, t: Term, cls: int, egraph: EGraph, memo: dict,
               possible: dict[int, set[int] | None]) -> list[dict[str, int]]:
        if isinstance(t, Var):
            return [{t.name: cls}]
        key = (id(t), cls)
        found = memo.get(key)
        if found is not None:
            return found
        found = []
        where = possible.get(id(t))
        if where is not None and cls not in where:
            pass
        elif not t.args or id(t) in self._kinds:
            kinds = self._kinds.get(id(t), [t])
            if any(egraph.lookup(k) == cls for k in kinds):
                found.append({})
        elif id(t) in self._flat:
            for pattern in self._flat[id(t)]:
                found += [dict(zip(pattern.variables, m[1:]))
                          for m in pattern.search_tuples(egraph, [cls])]
        else:
            arity = len(t.args) + 1
            for node in egraph.class_nodes[cls]:
                if node[0] != t.op or len(node) != arity:
                    continue
                kids = node[1:]
                orders = [kids]
                if t.op in COMMUTATIVE_OPS and arity == 3 and kids[0] != kids[1]:
                    orders.append(kids[::-1])
                for order in orders:
                    partial: list[dict[str, int]] = [{}]
                    for arg, child in zip(t.args, order):
                        partial = [{**p, **q}
                                   for q in self._match(arg, child, egraph, memo, possible)
                                   for p in partial
                                   if all(p.get(k, v) == v for k, v in q.items())]
                        if not partial:
                            break
                    found += partial
        memo[key] = found
        return found


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
        bound: set[str] = set()
        for name, pat in self.parts:
            # A hash join on the variables bound by earlier parts: linear in the matches
            # (two linears of one input, among thousands, meet in one bucket).
            names = list(dict.fromkeys((name, *pat.variables)))
            shared = [v for v in names if v in bound]
            buckets: dict[tuple, list[dict[str, int]]] = {}
            for m in pat.search_tuples(egraph):
                binding = {name: m[0]}
                binding.update(zip(pat.variables, m[1:]))
                buckets.setdefault(tuple([binding[v] for v in shared]), []).append(binding)
            rows = [{**row, **binding} for row in rows
                    for binding in buckets.get(tuple([row[v] for v in shared]), ())]
            bound.update(names)
            if not rows:
                return []
        first = self.parts[0][0]
        out = [tuple([row[first]] + [row[v] for v in self.variables]) for row in rows]
        return out[: limit + 1]


class Rewrite:
    """A named rewrite rule; build it with :func:`rewrite`.

    ``search`` finds matches as tuples, ``apply`` adds right sides and unions them.
    """

    def __init__(self, name: str, lhs, rhs, when: Guard | None = None, description: str = "",
                 variants: bool = True):
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
        lefts = ([p.term for _, p in self.lhs.parts] if isinstance(self.lhs, MultiPattern)
                 else [self.lhs.term])
        # Every operator the left side needs (literal leaves aside).
        self._operators = tuple({t.op: None for left in lefts for t in walk(left)
                                 if not isinstance(t, Var) and t.args})
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
        self._expand(variants)

    def _expand(self, variants: bool) -> None:
        """The left side's variants (see the module docstring) and the right side each
        variant instantiates (None: the same right side for all). Variants are compiled
        on first use, and only once the numbers they spell occur in the searched e-graph,
        so a rule costs nothing for the int and float spellings a program never holds."""
        self._variants: list[Term] = []
        self._compiled: dict[int, tuple[Pattern, tuple[int, ...]]] = {}
        self._numbers: list[frozenset[Term]] = []
        self._all_numbers: frozenset[Term] = frozenset()
        self._rhs_variants: list[Pattern] | None = None
        self._nested: _CommutativeSearch | None = None
        if not variants or not isinstance(self.lhs, Pattern):
            return
        terms = match_variants(self.lhs.term)
        if len(terms) == 1:
            return
        self._variants = terms
        self._numbers = [frozenset(t for t in walk(term) if _is_number(t)) for term in terms]
        self._all_numbers = frozenset().union(*self._numbers)
        if len(terms) > _COMPILE_AT_MOST:
            self._nested = _CommutativeSearch(self.lhs.term)
        written = _number_leaves(self.rhs.term) if self.rhs is not None else {}
        if not written:
            return
        rights = []
        for term in terms:
            matched = _number_leaves(term)
            kinds = {v: "float" if "float" in tags else "int" for v, tags in matched.items()
                     if v in written and float(v).is_integer()}
            rights.append(Pattern.of(_retag(self.rhs.term, kinds)))
        if any(p.term != self.rhs.term for p in rights):
            self._rhs_variants = rights

    def _variant(self, which: int) -> tuple[Pattern, tuple[int, ...]]:
        """The compiled variant ``which``, and the positions that put its matches in the
        rule's variable order."""
        found = self._compiled.get(which)
        if found is None:
            pattern = Pattern.of(self._variants[which])
            slots = (0, *(pattern.variables.index(v) + 1 for v in self.variables))
            found = self._compiled[which] = (pattern, slots)
        return found

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

    @property
    def variants(self) -> list[Pattern]:
        """The compiled spellings the left side matches (itself alone when it has none).

        >>> len(rewrite("log1p-egg", "(log (+ 1 ?x))", "(log1p ?x)").variants)
        1
        >>> len(rewrite("log1p", "(log (add #int:1 ?x))", "(log1p ?x)").variants)
        4
        """
        if not self._variants:
            return [self.lhs]
        return [self._variant(i)[0] for i in range(len(self._variants))]

    def search(self, egraph: EGraph, roots=None, limit: int = 1 << 62) -> list[tuple]:
        """Matches as ``(root, v0, v1, ...)`` tuples (at most ``limit + 1``).

        A left side with variants adds one trailing item to each match: which variant
        found it (the first that did, so a match is reported once).
        """
        if not all(map(egraph.has_op, self._operators)):
            return []
        if not self._variants:
            return self.lhs.search_tuples(egraph, roots, limit)
        # Which variant matched matters only to a proof or a right side that writes a
        # number of the left side; otherwise nested commutative ops are searched as one.
        if self._nested is not None and not egraph.explanations and not self._rhs_variants:
            return [(*m, 0) for m in self._nested.search(egraph, roots, limit)][: limit + 1]
        present = {t for t in self._all_numbers if egraph.lookup(t) is not None}
        seen: dict[tuple, int] = {}
        for which, numbers in enumerate(self._numbers):
            if not present.issuperset(numbers):
                continue
            pattern, slots = self._variant(which)
            found = pattern.search_tuples(egraph, roots, limit)
            if which:
                found = [tuple([m[i] for i in slots]) for m in found]
            for m in found:
                seen.setdefault(m, which)
            if len(seen) > limit:
                break
        return [(*m, which) for m, which in seen.items()][: limit + 1]

    def apply(self, egraph: EGraph, matches: list[tuple], node_limit: int = 1 << 62,
              deadline: float | None = None, clock: Callable[[], float] | None = None
              ) -> tuple[int, bool]:
        """Apply the right side to every match; returns (unions that merged, completed).

        Stops early (completed False) once the hash-cons exceeds ``node_limit`` or the
        ``deadline`` (checked every 256 matches) passes.
        """
        explained = egraph.explanations
        bind = egraph.bind_instantiator
        name = self.name
        index = self._index
        union = egraph.union
        memo = egraph.hashcons
        if (self.rhs is not None and self.when is None and not explained
                and self._rhs_variants is None):
            # The common case, kept tight: no guard, no proof recording.
            inst = bind(self.rhs.instantiator(index, False))
            uf = egraph.union_find
            P, find = uf.parents, uf.find
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
        # One instantiator per left-side variant where the right side or the proof needs
        # to know which variant matched (the match's trailing item says).
        rights = self._rhs_variants or ([self.rhs] if self.rhs is not None else [])
        insts = [bind(p.instantiator(index, explained)) for p in rights]
        lhs_insts = None
        if explained and isinstance(self.lhs, Pattern):
            lhs_insts = [bind(p.instantiator(index, True)) for p in self.variants]
        which = len(self._variants) > 1
        # A guard can cost more than the match (a walk of the e-graph): where the right
        # side is already in the match's class, there is nothing to guard.
        present = ([egraph.bind_lookup(p.instantiator(index, False)) for p in rights]
                   if guard is not None and insts and not explained else None)
        find = egraph.find
        merged = 0
        for count, m in enumerate(matches):
            subst = Subst(index, m)
            variant = m[-1] if which else 0
            right = variant if len(rights) > 1 else 0
            if guard is not None:
                if present is not None:
                    found = present[right](m)
                    if found is not None and find(found) == find(m[0]):
                        continue
                if not self._guarded(guard, egraph, subst):
                    continue
            if insts:
                target = insts[right](m)
            elif self.applier is not None:
                target = self._dynamic(egraph, subst)
                if target is None:
                    continue
            else:
                merged += self._apply_equations(egraph, m)
                continue
            source = lhs_insts[variant](m) if lhs_insts is not None else m[0]
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
        except SymbolicSize:  # true or false only for some input sizes: not for all
            return False
        except Exception as err:
            err.add_note(f"in the guard of rule {self.name!r} at {subst}")
            raise

    def _dynamic(self, egraph: EGraph, subst: Subst) -> int | None:
        try:
            result = self.applier(egraph, subst)
        except SymbolicSize:  # a right side that holds for the example's size only
            return None
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
            cid = egraph.bind_instantiator(pat.instantiator(index, explained))(row)
            if target in bound:
                merged += egraph.union(bound[target], cid, self.name)
            else:
                bound[target] = cid
        return merged


def rewrite(name: str, lhs, rhs, when: Guard | None = None, description: str = "",
            variants: bool = True) -> Rewrite:
    """A rewrite rule ``lhs => rhs`` (guarded by ``when(egraph, subst)`` if given).

    ``variants=False`` matches the left side only as written (no other operand order or
    kind of number): for the commutative and associative laws themselves, whose other
    spellings the laws generate anyway, so matching them too only repeats work.

    >>> rewrite("comm-add", "(+ ?a ?b)", "(+ ?b ?a)")
    Rewrite('comm-add', '(+ ?a ?b)' => '(+ ?b ?a)')
    """
    return Rewrite(name, lhs, rhs, when=when, description=description, variants=variants)


def birewrite(name: str, lhs, rhs, when: Guard | None = None,
              description: str = "", variants: bool = True) -> list[Rewrite]:
    """Both directions: ``name`` rewrites lhs to rhs, ``name-rev`` rhs to lhs.

    >>> [r.name for r in birewrite("assoc", "(+ ?a (+ ?b ?c))", "(+ (+ ?a ?b) ?c)")]
    ['assoc', 'assoc-rev']
    """
    return [
        Rewrite(name, lhs, rhs, when=when, description=description, variants=variants),
        Rewrite(name + "-rev", rhs, lhs, when=when, description=description, variants=variants),
    ]
