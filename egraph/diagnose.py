"""Why a rule does (not) fire: where its left side matches, where it stops matching, and
which guard refuses a match, with the facts the guard saw.

The first thing to try when a rule does not fire. Give it a rule and an e-graph (or a
term, added to a fresh e-graph); the answer prints readably:

>>> from egraph import ConstantFolding, rewrite
>>> print(diagnose(rewrite("zero-add", "(+ ?a 0)", "?a"), "(* (+ x 1) 2)"))
rule 'zero-add' (+ ?a 0) => ?a: no match
  (+ ?a _) matches 1 place (class 2 = (+ x 1))
  stops at child 2 of (+ ?a 0): 0 is not there; class 1 holds: 1

A match that a guard refuses names the guard and the analysis data of the bound classes:

>>> cancel = rewrite("cancel-div", "(/ ?a ?a)", "1",
...                  when=lambda eg, s: eg.data(s["a"]) not in (None, 0))
>>> d = diagnose(cancel, "(/ x x)", analysis=ConstantFolding())
>>> d.fires, d.refusals[0].guard, d.refusals[0].facts
(False, '<lambda>', {'a': None})

The e-graph is searched as it is: to ask about the state after saturation, pass the
saturated e-graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egraph.analysis import Analysis
from egraph.egraph import EGraph
from egraph.pattern import Pattern, Subst
from egraph.rewrite import MultiPattern, Rewrite
from egraph.term import Term, Var, format_op, parse

__all__ = ["Diagnosis", "PatternStop", "Refusal", "diagnose"]

_SHOWN = 3
"""How many places, refusals and classes the printed answer lists."""

_TERM_CHARS = 72


@dataclass(frozen=True)
class PatternStop:
    """Where the left side stops matching.

    ``matched`` is the deepest part of the pattern that still matches (the parts not yet
    required written ``_``), ``places`` how many matches it has, ``roots`` a few classes
    it matches in. ``parent`` is the sub-pattern whose child ``position`` (1-based),
    ``child``, is not found; ``held`` maps the classes where it was looked for to the ops
    they hold. When ``parent`` is None, the pattern's root op itself is nowhere (``held``:
    the root classes of the e-graph and their ops).

    >>> from egraph import rewrite
    >>> stop = diagnose(rewrite("r", "(f (g ?x))", "?x"), "(f (h y))").stop
    >>> stop.matched, str(stop.child), stop.held
    ('(f _)', '(g ?x)', {1: ['h']})
    """

    matched: str | None
    places: int
    roots: tuple[int, ...]
    parent: Term | None
    position: int | None
    child: Term
    held: dict[int, list[str]]


@dataclass(frozen=True)
class Refusal:
    """A match that the rule's guard refused: the guard (its ``__name__``; for guards made
    with ``all_of``, the first part that refused), the facts it saw (each bound variable's
    analysis data) and, when the guard raised, the error.

    >>> from egraph import rewrite
    >>> r = rewrite("r", "(+ ?a ?a)", "(* 2 ?a)", when=lambda eg, s: False)
    >>> diagnose(r, "(+ x x)").refusals[0].facts
    {'a': None}
    """

    where: Subst
    guard: str
    facts: dict[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """The answer of :func:`diagnose`; ``str()`` of it reads as a short report.

    ``matches``: every match of the left side; ``applies``: those the guard accepts (all of
    them without a guard); ``refusals``: the others, with why; ``stop``: where the left
    side stops matching when it matches nowhere (None for a multi-pattern whose parts
    each match, but not with the same classes for their shared variables).

    >>> from egraph import rewrite
    >>> diagnose(rewrite("r", "(+ ?a 0)", "?a"), "(+ x 0)").fires
    True
    """

    rule: Rewrite
    matches: list[Subst]
    applies: list[Subst]
    refusals: list[Refusal] = field(default_factory=list)
    stop: PatternStop | None = None
    egraph: EGraph | None = field(default=None, repr=False)

    @property
    def fires(self) -> bool:
        """True when at least one match passes the guard."""
        return bool(self.applies)

    def __str__(self) -> str:
        head = f"rule {self.rule.name!r} {_rule_text(self.rule)}"
        if not self.matches:
            if self.stop is None:
                return (f"{head}: no match\n  its parts match separately, but not with the "
                        "same classes for their shared variables")
            return "\n".join([head + ": no match", *_stop_lines(self.stop, self.egraph)])
        lines = [head + f": {_count(len(self.matches), 'match', 'matches')}, "
                 f"{len(self.applies)} accepted by the guard"
                 if self.rule.when is not None else
                 head + f": {_count(len(self.matches), 'match', 'matches')}"]
        for s in self.applies[:_SHOWN]:
            lines.append(f"  fires at {_place(self.egraph, s.root)} with {_bindings(s)}")
        for r in self.refusals[:_SHOWN]:
            why = f"raised {r.error}" if r.error else "refused"
            lines.append(f"  guard {r.guard!r} {why} at {_place(self.egraph, r.where.root)}")
            for name, data in r.facts.items():
                lines.append(f"    ?{name} = class {r.where[name]}: {data!r}")
        if len(self.refusals) > _SHOWN:
            lines.append(f"  ... {len(self.refusals) - _SHOWN} more refusals")
        return "\n".join(lines)


def diagnose(rule: Rewrite, where: EGraph | Term | str, *,
             analysis: Analysis | None = None) -> Diagnosis:
    """Whether and where ``rule``'s left side matches in ``where`` (an e-graph, or a term
    or s-expression added to a fresh e-graph with ``analysis``), and why not.

    >>> from egraph import rewrite
    >>> d = diagnose(rewrite("mul-one", "(* ?a 1)", "?a"), "(* y 1)")
    >>> d.fires, [dict(s) for s in d.matches]
    (True, [{'a': 0}])
    """
    if isinstance(where, EGraph):
        egraph = where
    else:
        egraph = EGraph(analysis=analysis)
        egraph.add(parse(where) if isinstance(where, str) else where, root=True)
    egraph.rebuild()
    matches = [rule.subst(m) for m in rule.search(egraph)]
    if not matches:
        return Diagnosis(rule, [], [], stop=_where_it_stops(egraph, rule), egraph=egraph)
    if rule.when is None:
        return Diagnosis(rule, matches, list(matches), egraph=egraph)
    applies, refusals = [], []
    for subst in matches:
        refusal = _refusal(rule.when, egraph, subst)
        if refusal is None:
            applies.append(subst)
        else:
            refusals.append(refusal)
    return Diagnosis(rule, matches, applies, refusals, egraph=egraph)


# -- guards ------------------------------------------------------------------------------

def _refusal(guard: Callable, egraph: EGraph, subst: Subst) -> Refusal | None:
    """None when ``guard`` accepts ``subst``; else the (innermost) part that refused."""
    facts = {name: egraph.data(cid) for name, cid in subst.items()}
    try:
        if guard(egraph, subst):
            return None
    except Exception as err:  # noqa: BLE001 - a guard that raises refuses: the reason
        return Refusal(subst, _guard_name(guard), facts, f"{type(err).__name__}: {err}")
    for part in getattr(guard, "parts", ()):
        inner = _refusal(part, egraph, subst)
        if inner is not None:
            return inner
    return Refusal(subst, _guard_name(guard), facts)


def _guard_name(guard: Callable) -> str:
    return getattr(guard, "__name__", None) or repr(guard)


# -- patterns ----------------------------------------------------------------------------

def _where_it_stops(egraph: EGraph, rule: Rewrite) -> PatternStop | None:
    """The stop of the spelling (or multi-pattern part) that gets furthest."""
    lhs = rule.lhs
    if isinstance(lhs, MultiPattern):
        failing = [p for _, p in lhs.parts if not p.search_tuples(egraph, limit=0)]
        return _walk(egraph, failing[0].term)[1] if failing else None
    walks = [_walk(egraph, p.term) for p in rule.variants]
    return max(walks, key=lambda w: w[0])[1]


def _walk(egraph: EGraph, pattern: Term) -> tuple[int, PatternStop]:
    """Require the pattern one node at a time, top-down, children in order, until the
    pattern stops matching; returns how many steps matched and where it stopped."""
    taken = set(pattern.variables())
    names = (f"_h{i}" for i in range(1 << 30))
    fresh = (name for name in names if name not in taken)

    def opened(t: Term) -> tuple[Term, list[str]]:
        """``t`` with its children left open (fresh variables) and their names."""
        if isinstance(t, Var) or not t.args:
            return t, []
        holes = [next(fresh) for _ in t.args]
        return Term(t.op, tuple(Var(h) for h in holes)), holes

    if isinstance(pattern, Var):
        return 0, PatternStop(None, 0, (), None, None, pattern, {})
    partial, holes = opened(pattern)
    found = Pattern.of(partial).search(egraph)
    if not found:
        held = {r: _ops(egraph, r) for r in egraph.roots[:_SHOWN]}
        return 0, PatternStop(None, 0, (), None, None, pattern, held)
    # Open sub-patterns still to require, in pre-order: (hole, sub-pattern, parent, index).
    pending = [(h, a, pattern, i) for i, (h, a) in enumerate(zip(holes, pattern.args), 1)]
    steps = 1
    while pending:
        hole, sub, parent, position = pending.pop(0)
        node, inner = opened(sub)
        candidate = _fill(partial, hole, node)
        matches = Pattern.of(candidate).search(egraph)
        if not matches:
            classes = list(dict.fromkeys(s[hole] for s in found))
            return steps, PatternStop(
                _show_partial(partial), len(found),
                tuple(dict.fromkeys(s.root for s in found))[:_SHOWN], parent, position, sub,
                {c: _ops(egraph, c) for c in classes[:_SHOWN]})
        partial, found, steps = candidate, matches, steps + 1
        pending[:0] = [(h, a, sub, i) for i, (h, a) in enumerate(zip(inner, sub.args), 1)]
    raise AssertionError(f"{pattern} matches as a whole but was reported not to")


def _fill(term: Term, hole: str, value: Term) -> Term:
    if isinstance(term, Var):
        return value if term.name == hole else term
    if not term.args:
        return term
    return Term(term.op, tuple(_fill(a, hole, value) for a in term.args))


def _show_partial(term: Term) -> str:
    return re.sub(r"\?_h\d+", "_", str(term))


def _ops(egraph: EGraph, cid: int) -> list[str]:
    return sorted({format_op(n.op) for n in egraph.nodes(cid)})


# -- printing ----------------------------------------------------------------------------

def _rule_text(rule: Rewrite) -> str:
    text = repr(rule)
    return text[text.index(", ") + 2:-1].replace("'", "")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _place(egraph: EGraph | None, cid: int) -> str:
    term = str(egraph.extract_term(cid)) if egraph is not None else "?"
    if len(term) > _TERM_CHARS:
        term = term[:_TERM_CHARS - 3] + "..."
    return f"class {cid} = {term}"


def _bindings(subst: Subst) -> str:
    return ", ".join(f"?{name} = class {cid}" for name, cid in subst.items()) or "nothing"


def _stop_lines(stop: PatternStop, egraph: EGraph | None) -> list[str]:
    if stop.parent is None:
        if isinstance(stop.child, Var):
            return ["  the e-graph is empty"]
        line = (f"  no class holds {format_op(stop.child.op)} with "
                f"{_count(len(stop.child.args), 'child', 'children')}")
        if stop.held:
            line += " (the roots: " + "; ".join(
                f"class {c} holds: {', '.join(ops)}" for c, ops in stop.held.items()) + ")"
        return [line]
    places = ", ".join(_place(egraph, r) for r in stop.roots)
    lines = [f"  {stop.matched} matches {_count(stop.places, 'place', 'places')} ({places})"]
    held = "; ".join(f"class {c} holds: {', '.join(ops)}" for c, ops in stop.held.items())
    if isinstance(stop.child, Var):
        lines.append(f"  stops at child {stop.position} of {stop.parent}: {stop.child} is "
                     f"bound to another class there ({held})")
    else:
        lines.append(f"  stops at child {stop.position} of {stop.parent}: "
                     f"{format_op(stop.child.op)} is not there; {held}")
    return lines
