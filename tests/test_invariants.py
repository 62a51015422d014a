"""Invariants of the engine as properties over random terms, unions and rule runs."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from egraph import AstSize, ConstantFolding, EGraph, Pattern, parse, rewrite
from egraph.examples.math import rules as math_rules
from egraph.term import Term, Var

LEAVES = [Term(s) for s in ("x", "y", "z")] + [Term(n) for n in (0, 1, 2)]
OPS = {"+": 2, "*": 2, "-": 2, "f": 1, "g": 2}


def terms(max_leaves=12):
    return st.recursive(
        st.sampled_from(LEAVES),
        lambda kids: st.one_of(
            st.tuples(st.sampled_from([o for o, a in OPS.items() if a == 1]), kids).map(
                lambda t: Term(t[0], (t[1],))),
            st.tuples(st.sampled_from([o for o, a in OPS.items() if a == 2]), kids, kids).map(
                lambda t: Term(t[0], (t[1], t[2]))),
        ),
        max_leaves=max_leaves,
    )


def canonical(node: tuple, find) -> tuple:
    return (node[0], *[find(c) for c in node[1:]])


def check_invariants(eg: EGraph) -> None:
    eg.rebuild()
    find = eg.find
    seen = {}
    for c in eg.classes():
        assert find(c) == c
        nodes = eg.class_nodes[c]
        assert len(set(nodes)) == len(nodes), "duplicate e-nodes in a class"
        for n in nodes:
            assert canonical(n, find) == n, "non-canonical e-node after rebuild"
            # congruence closure: one class per canonical e-node
            assert seen.setdefault(n, c) == c, "congruent e-nodes in two classes"
            assert find(eg.hashcons[n]) == c, "hash-cons points to the wrong class"
    for key in eg.hashcons:
        assert canonical(key, find) == key, "stale key in the hash-cons"


@settings(max_examples=60, deadline=None)
@given(st.lists(terms(), min_size=1, max_size=6), st.lists(st.tuples(st.integers(0, 50),
                                                                  st.integers(0, 50)),
                                                        max_size=8))
def test_rebuild_restores_canonical_congruence_closed_hashcons(ts, pairs):
    eg = EGraph()
    ids = [eg.add(t) for t in ts]
    n = eg.num_created
    for a, b in pairs:
        eg.union(a % n, b % n)
    eg.rebuild()
    check_invariants(eg)
    for t, i in zip(ts, ids):
        assert eg.lookup(t) == eg.find(i)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=40))
def test_union_find_is_idempotent_and_consistent(pairs):
    eg = EGraph()
    ids = [eg.add(Term(f"v{i}")) for i in range(31)]
    for a, b in pairs:
        eg.union(ids[a], ids[b])
    for i in ids:
        assert eg.find(eg.find(i)) == eg.find(i)
    for a, b in pairs:
        assert eg.find(ids[a]) == eg.find(ids[b])
    assert eg.num_classes == len({eg.find(i) for i in ids})


@settings(max_examples=40, deadline=None)
@given(terms(max_leaves=8))
def test_saturation_keeps_invariants_and_extraction_stays_in_the_class(t):
    eg = EGraph(analysis=ConstantFolding())
    root = eg.add(t, root=True)
    eg.saturate(math_rules(), iter_limit=4, node_limit=3_000)
    check_invariants(eg)
    term, cost = eg.extract(AstSize(), root=root)
    assert eg.lookup(term) == eg.find(root)
    assert cost == sum(1 for _ in _subterms(term))
    assert cost <= sum(1 for _ in _subterms(t))


def _subterms(t):
    stack = [t]
    while stack:
        s = stack.pop()
        yield s
        stack.extend(s.args)


@settings(max_examples=40, deadline=None)
@given(st.lists(terms(), min_size=1, max_size=4))
def test_json_round_trip_preserves_the_egraph(ts):
    eg = EGraph()
    roots = [eg.add(t, root=True) for t in ts]
    eg.saturate([rewrite("comm", "(+ ?a ?b)", "(+ ?b ?a)"),
                 rewrite("zero", "(* ?a 0)", "0")], iter_limit=3)
    data = json.loads(json.dumps(eg.to_json()))
    back = EGraph.from_json(data)
    check_invariants(back)
    assert back.num_classes == eg.num_classes
    assert back.num_nodes == eg.num_nodes
    assert len(roots) == len(ts)
    for t in ts:
        assert back.find(back.lookup(t)) in back.roots
    assert len(back.roots) == len(dict.fromkeys(eg.roots))
    # the same terms are equal in both
    for a in ts:
        for b in ts:
            assert back.equiv(a, b) == eg.equiv(a, b)


@settings(max_examples=40, deadline=None)
@given(terms())
def test_print_parse_round_trip(t):
    assert parse(str(t)) == t


PATTERNS = ["(+ ?a ?b)", "(+ (* ?a ?b) (* ?a ?c))", "(g (f ?a) (+ ?a ?b))", "(f (f (f ?a)))",
            "(- ?a (+ ?a 0))", "(g (+ ?a ?b) (+ ?b ?a))", "(* (f ?a) ?a)"]


def _reference_matches(eg: EGraph, pattern: Term, cid: int, bound: dict) -> list[dict]:
    """Every binding under which ``pattern`` matches class ``cid``, by plain recursion
    over the public e-node lists (no index, no sharing)."""
    if isinstance(pattern, Var):
        if pattern.name in bound:
            return [bound] if bound[pattern.name] == cid else []
        return [{**bound, pattern.name: cid}]
    out = []
    for node in eg.nodes(cid):
        if node.op != pattern.op or len(node.children) != len(pattern.args):
            continue
        partial = [bound]
        for arg, child in zip(pattern.args, node.children):
            partial = [b2 for b in partial for b2 in _reference_matches(eg, arg, child, b)]
        out.extend(partial)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(terms(), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80)), min_size=10, max_size=60))
def test_search_finds_exactly_the_matches_of_a_plain_recursive_matcher(ts, pairs):
    # Unions over many distinct e-nodes make classes larger than the op index threshold;
    # shared child classes exercise the per-class sharing of sub-pattern matches.
    eg = EGraph()
    for t in ts:
        eg.add(t)
    for i in range(12):
        eg.add(f"(f (+ x{i} {i}))")
    n = eg.num_created
    for a, b in pairs:
        eg.union(a % n, b % n)
    eg.rebuild()
    for text in PATTERNS:
        pat = Pattern.of(text)
        found = sorted(tuple(m.values()) + (m.root,) for m in pat.search(eg))
        expected = sorted(
            tuple(b[v] for v in pat.variables) + (c,)
            for c in eg.classes() for b in _reference_matches(eg, pat.term, c, {})
        )
        assert found == expected, text
