"""Patterns compiled once to Python code: the e-matching machine and the instantiator.

A :class:`Pattern` wraps a term with ``?variables``. Compiling it generates one Python
function that walks the e-graph's class lists in nested loops (no interpretation per
match) and one that builds the pattern's instance from a match. A match is a tuple
``(root_class, v0, v1, ...)`` of class ids, variables in order of first occurrence.

Search costs what can match, not the sizes of the classes it passes through: a large
class is looked up by operator (the e-graph's per-class op index, as egg keeps a class's
e-nodes sorted by operator), and a sub-pattern that nests further is matched once per
child class and search, its matches shared by every parent of that class (a hash join on
the class id).

>>> from egraph import EGraph, parse
>>> eg = EGraph()
>>> root = eg.add(parse("(+ x (* y 2))"), root=True)
>>> pat = Pattern.of("(+ ?a (* ?b 2))")
>>> [eg.extract_term(m["b"]) for m in pat.search(eg)]
[Term('y')]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from egraph.term import Term, Var, parse

if TYPE_CHECKING:
    from egraph.egraph import EGraph


class Subst(Mapping):
    """The classes a match bound to each pattern variable: ``subst["a"]`` is a class id.

    Guards and dynamic right-hand sides receive one. The root class of the match is
    ``subst.root``.
    """

    __slots__ = ("_index", "_match")

    def __init__(self, index: dict[str, int], match: tuple):
        self._index = index
        self._match = match

    def __getitem__(self, name: str) -> int:
        if name.startswith("?"):
            name = name[1:]
        try:
            return self._match[self._index[name]]
        except KeyError:
            raise KeyError(
                f"no pattern variable ?{name} in this match; bound: "
                + ", ".join("?" + n for n in self._index)
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def root(self) -> int:
        """The class id the pattern's root matched in."""
        return self._match[0]

    def __repr__(self) -> str:
        inner = ", ".join(f"?{n}: {self._match[i]}" for n, i in self._index.items())
        return f"Subst({{{inner}}})"


def _to_term(source: Term | str) -> Term:
    if isinstance(source, Term):
        return source
    if isinstance(source, str):
        return parse(source)
    raise TypeError(
        f"a pattern is an s-expression string or a Term, not {type(source).__name__}"
    )


class _Codegen:
    """Emits the nested-loop source of one pattern's search function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.prelude: list[str] = []
        self.consts: dict[str, Any] = {}
        self.var_slot: dict[str, str] = {}
        self.grounds: list[Term] = []
        self.counter = 0

    def const(self, value: Hashable) -> str:
        name = f"K{len(self.consts)}"
        self.consts[name] = value
        return name

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _is_ground(term: Term) -> bool:
    return not isinstance(term, Var) and all(_is_ground(a) for a in term.args)


def _depth(term: Term) -> int:
    """Height of the pattern, counting variable leaves (the reach of a match)."""
    if isinstance(term, Var) or not term.args:
        return 0
    return 1 + max(_depth(a) for a in term.args)


OP_INDEX_MIN = 8
"""Classes with more e-nodes than this are searched through their op index."""

_COMPILED: dict[Term, Pattern] = {}
_COMPILED_MAX = 4096


class Pattern:
    """A compiled pattern: search an e-graph for it, or instantiate it from a match.

    >>> Pattern.of("(- ?a ?a)").variables
    ['a']
    """

    __slots__ = ("term", "variables", "depth", "root_op", "_search", "_grounds", "_inst")

    def __init__(self, term: Term):
        self.term = term
        self.variables = term.variables()
        self.depth = _depth(term)
        self.root_op = None if isinstance(term, Var) else term.op
        self._search, self._grounds = self._compile_search()
        self._inst: dict[tuple[tuple, bool], Callable] = {}

    @classmethod
    def of(cls, source: Term | str | Pattern) -> Pattern:
        """A pattern from an s-expression, a term, or a pattern (returned as is).

        Compiled patterns are cached by term, so rebuilding a rule set compiles nothing.
        """
        if isinstance(source, Pattern):
            return source
        term = _to_term(source)
        pattern = _COMPILED.get(term)
        if pattern is None:
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
            pattern = _COMPILED[term] = cls(term)
        return pattern

    def __str__(self) -> str:
        return str(self.term)

    def __repr__(self) -> str:
        return f"Pattern({str(self.term)!r})"

    # -- search -------------------------------------------------------------------------

    def _compile_search(self) -> tuple[Callable, list[Term]]:
        g = _Codegen()
        term = self.term
        g.emit(1, "out = []")
        g.emit(1, "append = out.append")
        body_depth = 2
        g.emit(1, "for r in roots:")
        if isinstance(term, Var):
            g.var_slot[term.name] = "r"
        elif _is_ground(term):
            g.grounds.append(term)
            g.emit(2, "if r != G0:")
            g.emit(3, "continue")
        else:
            body_depth = self._emit_node(g, term, "r", 2)
        slots = ", ".join(["r"] + [g.var_slot[v] for v in self.variables])
        g.emit(body_depth, f"append(({slots},))")
        g.emit(body_depth, "if len(out) > limit:")
        g.emit(body_depth + 1, "return out")
        g.emit(1, "return out")
        params = ", ".join(["cnodes", "op_nodes", "roots", "limit"]
                           + [f"G{i}" for i in range(len(g.grounds))])
        source = f"def search({params}):\n" + "\n".join(g.prelude + g.lines) + "\n"
        namespace = dict(g.consts)
        exec(compile(source, f"<pattern {self.term}>", "exec"), namespace)  # noqa: S102
        return namespace["search"], g.grounds

    def _emit_node(self, g: _Codegen, term: Term, cls: str, depth: int) -> int:
        """Loop over ``cls``'s nodes matching ``term``'s operator; returns the body depth.

        A class of more than ``OP_INDEX_MIN`` e-nodes is looked up by operator in the
        e-graph's per-class op index, so the loop visits only the e-nodes that can match.
        """
        node = g.fresh("n")
        found = g.fresh("ns")
        k = g.const(term.op)
        g.emit(depth, f"{found} = cnodes[{cls}]")
        g.emit(depth, f"if len({found}) > {OP_INDEX_MIN}:")
        g.emit(depth + 1, f"{found} = op_nodes({cls}, {k})")
        g.emit(depth, f"for {node} in {found}:")
        g.emit(depth + 1, f"if {node}[0] != {k} or len({node}) != {len(term.args) + 1}:")
        g.emit(depth + 2, "continue")
        depth += 1
        nested: list[tuple[Term, str]] = []
        for i, arg in enumerate(term.args, start=1):
            ref = f"{node}[{i}]"
            if isinstance(arg, Var):
                slot = g.var_slot.get(arg.name)
                if slot is None:
                    slot = g.fresh("v")
                    g.var_slot[arg.name] = slot
                    g.emit(depth, f"{slot} = {ref}")
                else:
                    g.emit(depth, f"if {ref} != {slot}:")
                    g.emit(depth + 1, "continue")
            elif _is_ground(arg):
                gname = f"G{len(g.grounds)}"
                g.grounds.append(arg)
                g.emit(depth, f"if {ref} != {gname}:")
                g.emit(depth + 1, "continue")
            else:
                child = g.fresh("c")
                g.emit(depth, f"{child} = {ref}")
                nested.append((arg, child))
        # A sub-pattern with sub-patterns of its own is a join worth sharing between the
        # parents of its class; its matches are fetched first, so a node with a child
        # that cannot match is dropped before any loop. A one-level sub-pattern is a
        # plain loop over the child's e-nodes with its op (sharing would only copy them).
        fetched = {id(arg): self._emit_submatches(g, arg, child, depth)
                   for arg, child in nested if _depth(arg) > 1}
        for arg, child in nested:
            if id(arg) in fetched:
                depth = self._emit_bind(g, *fetched[id(arg)], depth)
            else:
                depth = self._emit_node(g, arg, child, depth)
        return depth

    def _emit_submatches(self, g: _Codegen, term: Term, cls: str, depth: int
                         ) -> tuple[str, list[str]]:
        """Fetch the matches of sub-pattern ``term`` in class ``cls``, computed once per
        class and search: parents that share a child class share its sub-matches (a hash
        join on the class id), so a search costs its partial matches per distinct class,
        not per parent. Returns the name holding them and the variables they bind."""
        fname, memo = g.fresh("S"), g.fresh("M")
        outer_lines, outer_slots = g.lines, g.var_slot
        g.lines, g.var_slot = [], {}
        body = self._emit_node(g, term, "c", 2)
        names = list(g.var_slot)
        g.emit(body, f"res.append(({', '.join(g.var_slot.values())},))")
        g.prelude += [f"    {memo} = {{}}", f"    def {fname}(c):", "        res = []",
                      *g.lines, "        return res"]
        g.lines, g.var_slot = outer_lines, outer_slots
        found = g.fresh("m")
        g.emit(depth, f"{found} = {memo}.get({cls})")
        g.emit(depth, f"if {found} is None:")
        g.emit(depth + 1, f"{found} = {memo}[{cls}] = {fname}({cls})")
        g.emit(depth, f"if not {found}:")
        g.emit(depth + 1, "continue")
        return found, names

    def _emit_bind(self, g: _Codegen, found: str, names: list[str], depth: int) -> int:
        """Loop over fetched sub-matches, binding new variables and checking bound ones."""
        targets, checks = [], []
        for name in names:
            slot = g.var_slot.get(name)
            if slot is None:
                slot = g.var_slot[name] = g.fresh("v")
                targets.append(slot)
            else:
                targets.append(g.fresh("t"))
                checks.append(f"{targets[-1]} != {slot}")
        g.emit(depth, f"for ({', '.join(targets)},) in {found}:")
        depth += 1
        if checks:
            g.emit(depth, f"if {' or '.join(checks)}:")
            g.emit(depth + 1, "continue")
        return depth

    def search(self, egraph: EGraph, roots=None, limit: int = 1 << 62) -> list[Subst]:
        """All matches as :class:`Subst` objects (roots: class ids to start from)."""
        index = {name: i + 1 for i, name in enumerate(self.variables)}
        return [Subst(index, m) for m in self.search_tuples(egraph, roots, limit)]

    def search_tuples(self, egraph: EGraph, roots=None, limit: int = 1 << 62) -> list[tuple]:
        """All matches as ``(root, v0, v1, ...)`` tuples, at most ``limit + 1`` of them."""
        grounds = []
        for t in self._grounds:
            cid = egraph.lookup(t)
            if cid is None:
                return []
            grounds.append(cid)
        if roots is None:
            roots = egraph.classes_with_op(self.root_op) if self.root_op is not None else (
                egraph.classes()
            )
        return self._search(egraph.class_nodes, egraph.op_nodes, roots, limit, *grounds)

    # -- instantiation ------------------------------------------------------------------

    def instantiator(self, index: dict[str, int], explained: bool) -> Callable:
        """``make(memo, parents, find, add) -> inst``, where ``inst(match)`` adds this
        pattern's instance and returns its class id.

        ``index`` maps each variable to its slot in the match tuple (the left side's
        order). The generated code looks e-nodes up in the hash-cons inline and calls
        ``add`` only for new ones. With ``explained`` the children are passed to ``add``
        as given (the e-graph records which e-node ids a proof goes through).
        """
        key = (tuple(index.items()), explained)
        fn = self._inst.get(key)
        if fn is None:
            fn = self._inst[key] = self._compile_inst(index, explained)
        return fn

    def _compile_inst(self, index: dict[str, int], explained: bool) -> Callable:
        consts: dict[str, Any] = {}
        lines: list[str] = []
        slots: dict[str, str] = {}

        def var(name: str) -> str:
            ref = f"m[{index[name]}]"
            if explained:
                return ref
            if name not in slots:
                slot = slots[name] = f"v{index[name]}"
                lines.append(f"{slot} = {ref}")
                lines.append(f"if P[{slot}] != {slot}: {slot} = find({slot})")
            return slots[name]

        def expr(t: Term) -> str:
            if isinstance(t, Var):
                return var(t.name)
            k = f"K{len(consts)}"
            consts[k] = t.op
            parts = ", ".join([k] + [expr(a) for a in t.args])
            if explained:
                return f"add(({parts},))"
            out = f"i{len(lines)}"
            lines.append(f"n = ({parts},)")
            lines.append(f"{out} = memo.get(n)")
            lines.append(f"if {out} is None: {out} = add(n)")
            lines.append(f"elif P[{out}] != {out}: {out} = find({out})")
            return out

        result = expr(self.term)
        body = "\n".join("        " + line for line in lines + [f"return {result}"])
        source = (
            "def make(memo, P, find, add):\n    def inst(m):\n" + body + "\n    return inst\n"
        )
        namespace = dict(consts)
        exec(compile(source, f"<instantiate {self.term}>", "exec"), namespace)  # noqa: S102
        return namespace["make"]
