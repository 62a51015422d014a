"""The rule library: every rule is sound on random instances of each of its examples
(float64 reference), scalar rules are proved by sympy, deliberately wrong rules are caught,
and the naive PyTorch code of each stability and fusion rule reaches its stable or fused
form with the full library."""

import os
from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.soundness import additive_causal, check_rule, mutants, sympy_proof
from egraph import AstSize, EGraph, Pattern, vars
from egraph.egraph import UnsoundMerge
from egraph.ops import exp, log, log1p, softmax
from egraph.rules import FAMILIES, library, load_rules, rule
from egraph.rules.guards import floating
from egraph.term import Term

# CI runs 100 random instances per rule; EGRAPH_SOAK=N multiplies that.
EXAMPLES = 100 * int(os.environ.get("EGRAPH_SOAK", "1"))
RULES = library("all")
# Every example of every rule: the first is the rule's own, the others spellings the
# matcher covers without a rule of their own (a mirrored operand order, an int literal).
EXAMPLE_CASES = [(r, fn) for r in RULES for fn in r.examples]


def _case_id(case) -> str:
    rule_, fn = case
    n = rule_.examples.index(fn)
    return rule_.name if n == 0 else f"{rule_.name}[{n + 1}]"


def test_families_load_and_compose():
    all_rules = load_rules("all")
    parts = sum((load_rules(f) for f in ("algebra", "stability", "fusion", "layout",
                                         "kernels")), [])
    assert [r.name for r in all_rules] == [r.name for r in parts]
    assert len(load_rules("stability")) >= 25
    with pytest.raises(ValueError, match="no rule family"):
        load_rules("speed")


def test_a_family_is_a_module_of_the_package_found_when_it_is_imported(tmp_path):
    """A new family is one module: written beside the others, it is loaded by name or by
    'all' as its LOADED says, after the families of a smaller ORDER."""
    import subprocess
    import sys
    from pathlib import Path

    import egraph.rules

    package = tmp_path / "egraph"
    (package / "rules").mkdir(parents=True)
    source = Path(egraph.rules.__file__).parent
    for path in source.glob("*.py"):
        (package / "rules" / path.name).write_text(path.read_text())
    (package / "rules" / "odd.py").write_text(
        "from egraph.ops import tanh\nfrom egraph.rules.define import rule\n"
        "from egraph.term import vars\n(x,) = vars('x')\nLOADED = 'all'\nORDER = 4\n"
        "RULES = [rule('tanh-neg', tanh(-x), -tanh(x))]\n")
    check = (f"import egraph.rules as r; assert r.__file__.startswith({str(tmp_path)!r}); "
             "assert list(r.FAMILIES)[-1] == 'odd' and r.FAMILIES['odd'][0].family == 'odd'; "
             "assert r.load_rules('all')[-1].name == 'tanh-neg'; print('ok')")
    # (the copied package is found first; the rest of egraph comes from the tree)
    bootstrap = f"import egraph; egraph.__path__.insert(0, {str(package)!r}); "
    done = subprocess.run([sys.executable, "-c", bootstrap + check], capture_output=True,
                          text=True, cwd=Path(egraph.rules.__file__).parents[2])
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_families_are_plain_lists_with_unique_names():
    assert all(isinstance(rules, list) for rules in FAMILIES.values())
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.family for r in RULES} == set(FAMILIES)


def test_the_library_is_written_as_python_term_patterns_without_literal_guards():
    for r in RULES:
        assert all(callable(fn) for fn in r.examples), r.name
        assert "?one" not in str(r.rewrite.lhs) and "?two" not in str(r.rewrite.lhs), r.name


def test_a_rule_without_a_soundness_example_cannot_be_made():
    """A rule is made only with an example to run: its own, or the program its left side
    spells (tests/test_rule_examples.py)."""
    x, d = vars("x d")
    with pytest.raises(ValueError, match="attribute 'dim'.*give the rule an example"):
        rule("unchecked", softmax(x, d), x)
    with pytest.raises(ValueError, match="needs a PyTorch example"):
        rule("unchecked", log(exp(x)), x, example=lambda x: x, inputs={})
    with pytest.raises(ValueError, match=r"takes \(a\) but the inputs declare \(x\)"):
        rule("mismatched", log(exp(x)), x, example=lambda a: a, inputs={"x": (4,)})


def test_an_unknown_op_is_an_error_naming_the_nearest_one():
    (x,) = vars("x")
    with pytest.raises(ValueError, match="'layer_nrom' in the op table; did you mean 'layer_norm'"):
        rule("typo", Term("layer_nrom", (x,)), x, example=lambda x: x, inputs={"x": (4,)})
    with pytest.raises(ValueError, match="rule 'typo': no op 'lg' in the op table"):
        rule("typo", "(lg (exp ?x))", "?x", example=lambda x: x, inputs={"x": (4,)})


def test_a_number_matches_int_and_float_literals_and_commutative_ops_both_orders():
    """One rule written ``log(1 + x)`` fires on every spelling a program holds."""
    (x,) = vars("x")
    log1p_rule = rule("log1p", log(1 + x), log1p(x), when=floating(x),
                      example=lambda x: torch.log(1 + x), inputs={"x": (4,)}).rewrite
    spellings = [lambda x: torch.log(1 + x), lambda x: torch.log(x + 1),
                 lambda x: torch.log(1.0 + x), lambda x: torch.log(x + 1.0)]
    for fn in spellings:
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.rand(4),))
        eg.saturate([log1p_rule], iter_limit=2)
        assert eg.report.rules["log1p"].applied == 1
    near_miss = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.log(x + 1.5)),
                               (torch.rand(4),))
    assert not log1p_rule.search(near_miss)


def test_a_deeply_commutative_rule_fires_on_every_operand_order():
    """gelu-tanh has 256 spellings (six commutative ops, two numbers of either kind)."""
    import math

    gelu = {r.name: r for r in RULES}["gelu-tanh"].rewrite
    c = math.sqrt(2 / math.pi)
    spellings = [
        lambda x: 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x ** 3))),
        lambda x: (torch.tanh((0.044715 * x ** 3.0 + x) * c) + 1) * (x * 0.5),
        lambda x: x * 0.5 * (1 + torch.tanh(c * (x ** 3 * 0.044715 + x))),
    ]
    for fn in spellings:
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (torch.rand(4),))
        eg.saturate([gelu], iter_limit=2)
        assert eg.report.rules["gelu-tanh"].applied == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=7, max_size=7), st.sampled_from([0.5, 0.6]))
def test_nested_commutative_search_finds_what_the_compiled_spellings_find(flips, half):
    """The search that walks nested commutative ops from the formula's numbers upwards
    finds exactly the matches of the 256 compiled spellings, on programs that hold the
    formula in any operand order, near misses (0.6 for 0.5) and products of 0.5 that
    are not GELU."""
    import math

    gelu = {r.name: r for r in RULES}["gelu-tanh"].rewrite
    comm = [r.rewrite for r in RULES if r.name in ("comm-add", "comm-mul")]
    c = math.sqrt(2 / math.pi)

    def order(flip, a, b):
        return (b, a) if flip else (a, b)

    def program(x, y):
        cube = torch.mul(*order(flips[0], 0.044715, x ** 3))
        inner = torch.mul(*order(flips[1], c, torch.add(*order(flips[2], x, cube))))
        one = torch.add(*order(flips[3], 1.0, torch.tanh(inner)))
        scaled = torch.mul(*order(flips[4], half, x))
        return torch.mul(*order(flips[5], scaled, one)) + torch.mul(*order(flips[6], 0.5, y))

    eg = EGraph.from_fx(torch.fx.symbolic_trace(program), (torch.rand(4), torch.rand(4)))
    eg.saturate(comm, iter_limit=3)
    nested = {m[:-1] for m in gelu.search(eg)}
    with patch.object(gelu, "_nested", None):
        compiled = {m[:-1] for m in gelu.search(eg)}
    assert nested == compiled
    assert bool(nested) == (half == 0.5)


def test_a_right_side_number_keeps_the_kind_the_program_used():
    """``(x + 1) * 2 => x * 2 + 2`` on an int tensor stays int (a float 2.0 would make the
    result a float tensor)."""
    (x,) = vars("x")
    r = rule("expand", (x + 1) * 2, x * 2 + 2, example=lambda x: (x + 1) * 2,
             inputs={"x": (4,)}).rewrite
    for dtype, fn in [(torch.int64, lambda x: (x + 1) * 2),
                      (torch.float32, lambda x: (x + 1.0) * 2.0)]:
        xs = torch.arange(4, dtype=dtype)
        eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (xs,))
        eg.saturate([r], iter_limit=2)
        assert eg.report.rules["expand"].applied == 1
        written = "#int:2" if dtype == torch.int64 else "#float:2.0"
        assert Pattern.of(f"(add (mul ?x {written}) {written})").search(eg)


@pytest.mark.parametrize("case", EXAMPLE_CASES, ids=_case_id)
def test_rule_is_sound_on_random_instances(case):
    rule_, example = case
    result = check_rule(rule_, examples=EXAMPLES, example=example)
    assert result.ok, str(result)
    assert result.examples >= EXAMPLES


SCALAR_RULES = [r for r in RULES if sympy_proof(r.rewrite) is not None]


@pytest.mark.parametrize("rule", SCALAR_RULES, ids=lambda r: r.name)
def test_scalar_rule_is_proved_by_sympy(rule):
    assert sympy_proof(rule.rewrite) is True


@pytest.mark.parametrize("base, mutant", list(mutants()), ids=lambda v: getattr(v, "name", ""))
def test_deliberately_wrong_rules_are_caught(base, mutant):
    try:
        result = check_rule(base, examples=40, rewrite=mutant)
    except UnsoundMerge:
        return  # the analysis refused the merge (a shape or sign that cannot be equal)
    assert not result.ok, f"{mutant.name} was not caught: {result}"


PYTORCH_RULES = [r for r in RULES if r.family in ("stability", "fusion")]


def _initial_matches(rule, eg):
    return [eg.find(m[0]) for m in rule.rewrite.search(eg)]


@pytest.mark.parametrize("rule", PYTORCH_RULES, ids=lambda r: r.name)
def test_naive_pytorch_code_reaches_the_stable_or_fused_form(rule):
    """The rule's naive example, traced and saturated with the whole library, holds the
    rule's right side in the class its left side matched."""
    names = list(rule.inputs)
    fn = rule.example
    inputs = []
    for n in names:
        spec = rule.inputs[n]
        if spec.domain.startswith("index:"):
            inputs.append(torch.randint(0, int(spec.domain[6:]), spec.shape))
        elif spec.domain == "bool":
            inputs.append(torch.rand(spec.shape) > 0.5)
        elif spec.domain == "causal":
            inputs.append(torch.ones(spec.shape, dtype=torch.bool).tril())
        elif spec.domain == "additive-causal":
            inputs.append(additive_causal(spec.shape))
        else:
            inputs.append(torch.rand(spec.shape) + 0.5)
    gm = torch.fx.symbolic_trace(fn)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    domains = {placeholders[i]: rule.inputs[n].domain for i, n in enumerate(names)
               if rule.inputs[n].domain in ("finite", "positive", "nonneg", "nonzero",
                                              "unit")}
    eg = EGraph.from_fx(gm, tuple(inputs), domains=domains)
    targets = _initial_matches(rule, eg)
    assert targets, f"{rule.name}: the left side does not match the traced example"
    eg.saturate(load_rules("all"), iter_limit=4, node_limit=20_000, time_limit=20.0)
    if rule.rewrite.rhs is not None and rule.rewrite.rhs.root_op is not None:
        found = {eg.find(m[0]) for m in Pattern.of(rule.rewrite.rhs.term).search_tuples(eg)}
        # right sides with ?vars match anywhere; they must land in a matched class
        assert any(eg.find(t) in found for t in targets), rule.name
    else:
        assert eg.report.rules[rule.name].applied > 0, rule.name


def test_same_dtype_guard_refuses_mixed_tensor_dtypes_and_ignores_numbers():
    from egraph.rules.guards import same_dtype

    def program(a, b, c):
        return a + b + c * 2.0

    eg = EGraph.from_fx(torch.fx.symbolic_trace(program),
                        (torch.rand(3), torch.rand(3).half(), torch.rand(3)))
    a, b, c = sorted(eg.classes_with_op("input"))  # made in the placeholders' order
    two = next(cid for cid in eg.classes() if str(eg.nodes(cid)[0]) == "#float:2.0")
    guard = same_dtype("a", "b", "n")
    assert guard(eg, {"a": a, "b": c, "n": two})
    assert not guard(eg, {"a": a, "b": b, "n": two})


def _drops_an_operand(x, ids):
    positions = ids.float()  # integers made floats: finite, whatever the inputs hold
    return (x - x, x * 0.0, x / x, positions - positions, torch.tanh(positions) * 0.0)


@given(st.lists(st.sampled_from([1.5, -2.0, 0.0, float("inf"), float("-inf"), float("nan")]),
                min_size=4, max_size=4))
@settings(max_examples=25, deadline=None)
def test_rules_that_drop_an_operand_keep_inf_and_nan(values):
    """``x - x``, ``x * 0`` and ``x / x`` are NaN where x is inf or NaN, so sub-self,
    zero-mul and div-self fire only on values proven finite (integers made floats, tanh
    of them, inputs declared in a domain), never on a float input, with validation off."""
    x, ids = torch.tensor(values), torch.arange(4)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_drops_an_operand), (x.abs() + 1, ids)
                         ).saturate(load_rules("all")).extract(AstSize(), validate="off")
    for ours, eager in zip(opt(x, ids), _drops_an_operand(x, ids)):
        torch.testing.assert_close(ours, eager, equal_nan=True)
    assert opt.code.count("torch.zeros_like(") == 2


def test_a_declared_domain_promises_finite_values():
    f = lambda x: x - x  # noqa: E731
    gm = torch.fx.symbolic_trace(f)
    free = EGraph.from_fx(gm, (torch.randn(3),)).saturate(load_rules("all"))
    declared = EGraph.from_fx(gm, (torch.randn(3),), domains={"x": "finite"}).saturate(
        load_rules("all"))
    assert "zeros_like" in declared.extract(AstSize()).code
    assert "zeros_like" not in free.extract(AstSize()).code
