"""Extraction from egraph-serialize JSON: hand-checked cases, properties on small random
e-graphs (cyclic ones included) against brute force, bad input, and a few real files."""

import doctest
import itertools
import json
import math
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import extractors
from egraph.extract import dag, graph, greedy, ilp, serialized
from egraph.extract.graph import Graph
from egraph.extract.greedy import greedy_tree
from egraph.serialize import SerializedFormatError
from extractors import AstDepth, AstSize, Extraction, extract_serialized

GYM = Path(__file__).resolve().parents[2] / "shared" / "data" / "extraction-gym"
METHODS = ("greedy", "dag", "ilp")


def node(op, eclass, cost=1, children=()):
    return {"op": op, "eclass": eclass, "cost": cost, "children": list(children)}


def walk(data, choice, roots):
    """The classes reached from ``roots`` through ``choice`` and the (dag, tree) costs,
    checked independently of the library: raises AssertionError on a cycle or a reached
    class without a choice."""
    nodes = data["nodes"]
    tree: dict[str, float] = {}
    on_path: set[str] = set()

    def visit(c):
        if c in tree:
            return tree[c]
        assert c not in on_path, f"cycle through class {c}"
        assert c in choice, f"class {c} is reached but not chosen"
        on_path.add(c)
        n = nodes[choice[c]]
        assert str(n["eclass"]) == c
        total = n.get("cost", 1.0) + sum(visit(str(nodes[k]["eclass"])) for k in n["children"])
        on_path.discard(c)
        tree[c] = total
        return total

    tree_cost = sum(visit(str(r)) for r in dict.fromkeys(roots))
    dag_cost = sum(nodes[choice[c]].get("cost", 1.0) for c in tree)
    return set(tree), dag_cost, tree_cost


def check(data, e: Extraction, roots=None):
    """``e`` is acyclic, covers exactly the classes reached from the roots, and reports
    its costs right."""
    roots = data["root_eclasses"] if roots is None else roots
    reached, dag_cost, tree_cost = walk(data, e.choice, [str(r) for r in roots])
    assert reached == set(e.choice)
    assert math.isclose(e.dag_cost, dag_cost, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(e.tree_cost, tree_cost, rel_tol=1e-9, abs_tol=1e-12)


def brute_force(data):
    """The minimum DAG cost over every choice of one node per class (None: no acyclic
    answer)."""
    members: dict[str, list[str]] = {}
    for nid, n in data["nodes"].items():
        members.setdefault(str(n["eclass"]), []).append(nid)
    best = None
    for combo in itertools.product(*members.values()):
        try:
            _, cost, _ = walk(data, dict(zip(members, combo)), data["root_eclasses"])
        except AssertionError:
            continue
        best = cost if best is None else min(best, cost)
    return best


# -- hand-checked cases ------------------------------------------------------------------

SHARED = {"nodes": {
    "x": node("x", "x", 5), "y": node("y", "y", 9),
    "fx": node("f", "b", 1, ["x"]), "gx": node("g", "c", 1, ["x"]),
    "sy": node("s", "d", 1, ["y"]),
    "p": node("p", "r", 1, ["fx", "gx"]), "q": node("q", "r", 1, ["sy"])},
    "root_eclasses": ["r"]}


def test_shared_subterm_tree_and_dag_costs_differ():
    greedy = extract_serialized(SHARED, "greedy")
    assert greedy.choice == {"r": "q", "d": "sy", "y": "y"}
    assert (greedy.tree_cost, greedy.dag_cost, greedy.optimal) == (11, 11, None)
    for method in ("dag", "ilp"):
        e = extract_serialized(SHARED, method)
        assert e.choice == {"r": "p", "b": "fx", "c": "gx", "x": "x"}
        assert (e.tree_cost, e.dag_cost, e.method) == (13, 8, method)
        check(SHARED, e)
    assert extract_serialized(SHARED, "ilp").optimal is True


def test_ilp_out_of_time_returns_the_dag_answer_unproven():
    e = extract_serialized(SHARED, "ilp", time_limit=0)
    assert (e.dag_cost, e.optimal) == (8, False)
    check(SHARED, e)


def test_ilp_with_costs_out_of_the_solver_s_range():
    """HiGHS reads costs from 1e15 on as infinite (Curvature prices an ill-conditioned
    program so): nodes dearer than the start are pruned before the model is built, and a
    start that dear comes back unproven, never an error."""
    data = {"nodes": {"x": node("x", "x", 1), "big": node("big", "r", 1e20, ["x"]),
                      "cheap": node("cheap", "r", 3, ["x"])}, "root_eclasses": ["r"]}
    e = extract_serialized(data, "ilp")
    assert (e.choice["r"], e.dag_cost, e.optimal) == ("cheap", 4, True)
    dear = {"nodes": {"x": node("x", "x", 1), "big": node("big", "r", 1e20, ["x"]),
                      "bigger": node("bigger", "r", 3e20, ["x"])}, "root_eclasses": ["r"]}
    e = extract_serialized(dear, "ilp")
    assert (e.choice["r"], e.optimal) == ("big", False)
    check(dear, e)


def test_repeated_child_counts_twice_in_the_tree_cost_only():
    data = {"nodes": {"a": node("a", "c", 2), "f": node("f", "r", 1, ["a", "a"])},
            "root_eclasses": ["r"]}
    for method in METHODS:
        e = extract_serialized(data, method)
        assert (e.dag_cost, e.tree_cost) == (3, 5)


CYCLIC = {"nodes": {
    "loop": node("f", "a", 1, ["g"]),     # the cheap node of a leads back to a through b
    "leaf": node("x", "a", 5),
    "g": node("g", "b", 1, ["loop"]),
    "self": node("h", "b", 0, ["g"])},    # uses its own class: never extractable
    "root_eclasses": ["b"]}


def test_cyclic_class_takes_its_only_acyclic_node():
    for method in METHODS:
        e = extract_serialized(CYCLIC, method)
        assert e.choice == {"b": "g", "a": "leaf"}
        assert (e.dag_cost, e.tree_cost) == (6, 6)
        check(CYCLIC, e)


def test_roots_override_and_duplicate_roots():
    e = extract_serialized(SHARED, "ilp", roots=["b", "c", "b"])
    assert e.choice == {"b": "fx", "c": "gx", "x": "x"}
    assert (e.dag_cost, e.tree_cost) == (7, 12)
    check(SHARED, e, roots=["b", "c"])


def test_subsumed_nodes_are_never_chosen():
    data = {"nodes": {"cheap": {**node("x", "r", 1), "subsumed": True},
                      "dear": node("y", "r", 3)}, "root_eclasses": ["r"]}
    for method in METHODS:
        assert extract_serialized(data, method).choice == {"r": "dear"}


def test_float_costs_and_huge_tree_costs():
    # A chain of 2000 classes, each using the previous twice: the tree cost is 2**2000,
    # exact with integral costs and inf with float ones.
    nodes = {"n0": node("x", "c0", 1)}
    for i in range(1, 2000):
        nodes[f"n{i}"] = node("f", f"c{i}", 1, [f"n{i - 1}", f"n{i - 1}"])
    data = {"nodes": nodes, "root_eclasses": ["c1999"]}
    e = extract_serialized(data, "greedy")
    assert (e.dag_cost, e.tree_cost) == (2000, 2 ** 2000 - 1)
    for n in nodes.values():
        n["cost"] = 1.5
    e = extract_serialized(data, "dag")
    assert (e.dag_cost, e.tree_cost) == (3000.0, math.inf)


@pytest.mark.parametrize("module", [extractors, graph, greedy, dag, ilp, serialized])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_engine_cost_functions_are_reexported():
    from egraph import AstDepth as depth
    from egraph import AstSize as size
    assert (AstSize, AstDepth) == (size, depth)


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    ("{not json", "not valid JSON"),
    ({"nodes": []}, "'nodes' object"),
    ({"nodes": {"a": node("a", "r", 1, ["zz"])}, "root_eclasses": ["r"]}, "'zz'"),
    ({"nodes": {"a": node("a", "r", "3")}, "root_eclasses": ["r"]}, "must be a number"),
    ({"nodes": {"a": node("a", "r", -1)}, "root_eclasses": ["r"]}, "non-negative"),
    ({"nodes": {"a": node("a", "r", float("nan"))}, "root_eclasses": ["r"]}, "finite"),
    ({"nodes": {"a": node("a", "r")}, "root_eclasses": ["q"]}, "root class 'q'"),
    ({"nodes": {"a": node("a", "r")}}, "no root classes"),
])
def test_malformed_data_gets_a_clear_error(data, message):
    with pytest.raises(SerializedFormatError, match=message):
        extract_serialized(data)


def test_root_without_acyclic_term_unknown_method_and_costs_beyond_the_solver():
    data = {"nodes": {"a": node("f", "r", 1, ["a"])}, "root_eclasses": ["r"]}
    with pytest.raises(ValueError, match="no acyclic term"):
        extract_serialized(data, "ilp")
    with pytest.raises(ValueError, match="choose one of"):
        extract_serialized(SHARED, "exact")
    data = {"nodes": {"a": node("a", "r", 10 ** 400)}, "root_eclasses": ["r"]}
    assert extract_serialized(data, "dag").dag_cost == 10 ** 400
    e = extract_serialized(data, "ilp")  # (beyond the solver's range: the start, unproven)
    assert (e.dag_cost, e.optimal) == (10 ** 400, False)


# -- properties on small random e-graphs --------------------------------------------------

@st.composite
def egraphs(draw, integral=True):
    """Up to 5 classes of up to 3 nodes with up to 2 children each, anywhere (so cycles
    and self-loops are common), one or two roots."""
    size = draw(st.integers(1, 5))
    costs = (st.integers(0, 6) if integral
             else st.sampled_from([0.0, 0.25, 1.0, 1.5, 2.75, 4.0]))
    nodes = {}
    for c in range(size):
        for j in range(draw(st.integers(1, 3))):
            kids = draw(st.lists(st.integers(0, size - 1), max_size=2))
            nodes[f"{c}.{j}"] = node(f"op{j}", str(c), draw(costs), [f"{k}.0" for k in kids])
    roots = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=2, unique=True))
    return {"nodes": nodes, "root_eclasses": [str(r) for r in roots]}


def extract_all(data):
    """Every method's answer, or None when brute force finds no acyclic answer (then
    every method must refuse)."""
    if brute_force(data) is None:
        for method in METHODS:
            with pytest.raises(ValueError, match="no acyclic term"):
                extract_serialized(data, method)
        return None
    return {method: extract_serialized(data, method) for method in METHODS}


@settings(max_examples=300, deadline=None)
@given(egraphs())
def test_ilp_matches_brute_force_and_heuristics_are_ordered(data):
    results = extract_all(data)
    if results is None:
        return
    for e in results.values():
        check(data, e)
    greedy, dag, ilp = results["greedy"], results["dag"], results["ilp"]
    assert ilp.optimal is True and ilp.dag_cost == brute_force(data)
    assert ilp.dag_cost <= dag.dag_cost <= greedy.dag_cost
    assert greedy.optimal is None and dag.optimal is None


@settings(max_examples=100, deadline=None)
@given(egraphs(integral=False))
def test_ilp_matches_brute_force_with_float_costs(data):
    results = extract_all(data)
    if results is None:
        return
    ilp = results["ilp"]
    check(data, ilp)
    assert ilp.optimal is True
    assert math.isclose(ilp.dag_cost, brute_force(data), rel_tol=1e-6, abs_tol=1e-9)
    assert ilp.dag_cost <= results["dag"].dag_cost + 1e-9


@settings(max_examples=100, deadline=None)
@given(egraphs())
def test_ilp_without_the_exclusive_user_matrix(data):
    # Large models group users by class only; the answers must stay optimal.
    best = brute_force(data)
    if best is not None:
        with patch.object(ilp, "MAX_EXCLUSIVE_NODES", 0):
            e = extract_serialized(data, "ilp")
        check(data, e)
        assert (e.dag_cost, e.optimal) == (best, True)


@settings(max_examples=100, deadline=None)
@given(egraphs())
def test_ilp_with_the_exclusive_users_of_its_first_round_only(data):
    # Past the deadline the relation stops growing after a round: every bit it holds is
    # true, so the answers stay optimal with the weaker constraints.
    best = brute_force(data)
    if best is not None:
        full = ilp._Model._exclusive

        def first_round(self, users, pairs, parents_first, deadline=math.inf):
            return full(self, users, pairs, parents_first, -math.inf)

        with patch.object(ilp._Model, "_exclusive", first_round):
            e = extract_serialized(data, "ilp")
        check(data, e)
        assert (e.dag_cost, e.optimal) == (best, True)


@settings(max_examples=50, deadline=None)
@given(egraphs())
def test_json_text_gives_the_same_answer(data):
    if brute_force(data) is not None:
        assert extract_serialized(json.dumps(data), "ilp").dag_cost == brute_force(data)


# -- real e-graphs -----------------------------------------------------------------------

@pytest.mark.skipif(not GYM.is_dir(), reason="extraction-gym data not beside the checkout")
@pytest.mark.parametrize("name", ["tensat/vgg_acyclic.json", "tensat/resnet50_acyclic.json",
                                  "egg/math_simplify_factor.json", "egg/lambda_compose.json"])
def test_gym_files(name):
    data = json.loads((GYM / name).read_text())
    results = {method: extract_serialized(data, method) for method in METHODS}
    for e in results.values():
        check(data, e)
    assert results["ilp"].optimal is True
    assert results["ilp"].dag_cost <= results["dag"].dag_cost <= results["greedy"].dag_cost


def test_single_node_chains_fold_into_their_users():
    # "S" is used from two classes that choose, so it stays in the integer program; the
    # chain below it ("Y", used only by S's node) folds into its user.
    data = {"nodes": {
        "p": node("p", "r", 1, ["a1", "c1"]),
        "a1": node("a1", "A", 1, ["s"]), "a2": node("a2", "A", 3),
        "c1": node("c1", "C", 1, ["s"]), "c2": node("c2", "C", 3),
        "s": node("s", "S", 2, ["y"]), "y": node("y", "Y", 1, ["x"]), "x": node("x", "X", 0)},
        "root_eclasses": ["r"]}
    graph = Graph.load(data)
    start, order = greedy_tree(graph)
    model = ilp._Model(graph, start, set(order))
    assert {graph.class_ids[c] for c in model.classes} == {"r", "A", "C", "S"}
    assert {graph.class_ids[c] for c in model.absorbed} == {"Y"}
    e = extract_serialized(data, "ilp")
    check(data, e)
    assert (e.choice["A"], e.choice["C"], e.dag_cost, e.optimal) == ("a1", "c1", 6, True)


@pytest.mark.parametrize("seed", range(40))
def test_the_dag_local_search_keeps_programs_acyclic_and_no_dearer(seed):
    """Random e-graphs of 20 to 60 classes whose nodes mostly use lower classes (layers)
    and sometimes any (cycles): the local search keeps its children-first order of the
    classes in use as it re-chooses them, and prunes its cycle checks by it; its program
    stays acyclic and is never dearer than the one it started from."""
    import random

    rng = random.Random(seed)
    size = rng.randint(20, 60)
    classes = [[(rng.randint(1, 10), () if i == 0 or rng.random() < 0.2 else tuple(
        rng.randrange(size if rng.random() < 0.15 else i) for _ in range(rng.randint(1, 3))))
        for _ in range(rng.randint(1, 3))] for i in range(size)]
    g = Graph.of(classes, roots=[size - 1, rng.randrange(size)])
    safe, _ = greedy_tree(g, {})
    if any(safe[r] < 0 for r in g.roots):
        return
    start = graph.acyclic(g, dag.greedy_dag(g), safe, g.order(safe))
    better = dag.improve(g, start)
    g.order(better)  # (raises on a cycle or a reached class without a choice)
    assert g.dag_cost(better) <= g.dag_cost(start)
