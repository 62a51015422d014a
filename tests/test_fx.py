"""PyTorch in and out: from_fx -> extract gives a working GraphModule on real models."""

import collections
import copy
import io
import operator
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from backends.sizes import SizeMismatch
from compiler.validate import ValidationError
from egraph import AstDepth, AstSize, EGraph, UnsoundMerge, rewrite
from egraph.examples.zoo import MODELS, build
from egraph.rules import load_rules
from frontends.fx import UntraceableModel


def _grads(model, inputs, fn):
    model.zero_grad()
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    (out.float().pow(2).sum() if isinstance(out, torch.Tensor) else sum(
        o.float().pow(2).sum() for o in out)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, [x.grad for x in xs]


@pytest.mark.parametrize("name", MODELS)
def test_round_trip_without_rules_keeps_outputs_and_gradients(name):
    model, inputs = build(name)
    before = copy.deepcopy(model.state_dict())
    opt = EGraph.from_fx(model, inputs).extract(AstSize())
    assert isinstance(opt, torch.fx.GraphModule)
    assert opt.meta["egraph_report"].validation.ok
    out_a, grads_a, xg_a = _grads(model, inputs, model)
    out_b, grads_b, xg_b = _grads(model, inputs, opt)
    torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for k in grads_a:
        torch.testing.assert_close(grads_b[k], grads_a[k], rtol=1e-4, atol=1e-5)
    for a, b in zip(xg_a, xg_b):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # the user's module is untouched; checkpoints load into the optimised one
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert set(opt.state_dict()) == set(model.state_dict())
    opt.load_state_dict(model.state_dict())


def test_duplicated_subexpressions_are_computed_once_and_dead_code_goes():
    def f(x):
        unused = torch.sin(x) * 3  # noqa: F841 - dead code on purpose
        return torch.exp(x) + torch.exp(x) * x.exp()

    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(5),)).extract(AstSize())
    code = opt.code
    assert code.count("torch.exp(") == 1
    assert "sin" not in code
    x = torch.randn(5)
    torch.testing.assert_close(opt(x), f(x))


def test_shape_arithmetic_stays_python_arithmetic_on_the_input_size():
    def f(x):
        return x.sum(-1, keepdim=True) / x.size(-1) ** 0.5

    gm = torch.fx.symbolic_trace(f)
    eg = EGraph.from_fx(gm, (torch.randn(3, 16),))
    # the analysis knows the value (guards and costs use it) ...
    assert any(getattr(eg.data(c), "value", None) == 4.0 for c in eg.classes())
    opt = eg.extract(AstSize())
    # ... but the program recomputes it from the input with Python arithmetic, no torch op
    assert "torch.pow" not in opt.code and "size ** 0.5" in opt.code
    x = torch.randn(3, 9)
    torch.testing.assert_close(opt(x), f(x))


def _last_dim(x: torch.Tensor) -> int:
    return x.dim() - 1


def test_a_rank_read_is_a_literal_and_a_dim_computed_at_run_time_is_passed_on():
    """``x.dim()`` and ``x.ndim`` in a symbolic trace are the rank, the same at every
    size: a literal, so ``softmax(x, dim=x.dim() - 1)`` is a softmax over the last dim,
    open to rules. A dim an opaque call computes is given to the op as computed (a
    softmax's dim, held as a 1-tuple where known, had crashed emission)."""
    def by_rank(x):
        return F.softmax(x, dim=x.dim() - 1) + x.log_softmax(x.ndim - 1)

    x = torch.randn(3, 8)
    eg = EGraph.from_fx(torch.fx.symbolic_trace(by_rank), (x,))
    dims = [eg.data(n[2]) for c in eg.classes() for n in eg.class_nodes[c]
            if n[0] in ("softmax", "log_softmax")]
    assert [(d.kind, d.value) for d in dims] == [("literal", (1,))] * 2
    opt = eg.extract(AstSize())
    assert "dim()" not in opt.code and "ndim" not in opt.code, opt.code
    for shape in ((3, 8), (5, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), by_rank(x))

    graph = torch.fx.Graph()
    x_node = graph.placeholder("x")
    dim = graph.call_function(_last_dim, (x_node,))
    graph.output(graph.call_method("softmax", (x_node, dim)))
    computed = torch.fx.GraphModule(nn.Module(), graph)
    opt = EGraph.from_fx(computed, (x,)).extract(AstSize())
    for shape in ((3, 8), (2, 4, 5)):
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), x.softmax(-1))


def test_constant_subgraph_folds():
    class M(nn.Module):
        def forward(self, x):
            steps = torch.arange(0, 6, dtype=torch.float32)
            return x + steps * 2

    eg = EGraph.from_fx(M(), (torch.randn(2, 6),))
    opt = eg.extract(AstSize())
    assert "arange" not in opt.code and "mul" not in opt.code
    x = torch.randn(2, 6)
    torch.testing.assert_close(opt(x), M()(x))


def _arange_from_size(opt: torch.fx.GraphModule) -> bool:
    """Whether ``opt`` computes an ``arange`` from its inputs' sizes: in its code, or as a
    folded value remade when a size it reads changes."""
    folded = getattr(opt, "folded_constants", None)
    return "arange" in opt.code or folded is not None and folded.sized and any(
        op == "arange" for op, _ in folded.recipes.values())


def test_a_subgraph_made_from_the_input_size_is_not_a_constant():
    class M(nn.Module):
        def forward(self, x):
            steps = torch.arange(0, x.size(-1), dtype=torch.float32)
            return x + steps * 2

    opt = EGraph.from_fx(M(), (torch.randn(2, 6),)).extract(AstSize())
    assert _arange_from_size(opt) and not opt.state_dict()
    for shape in ((3, 7), (2, 6), (1, 4)):
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), M()(x))


def test_dropout_in_training_is_never_merged_or_dropped():
    def f(x):
        return F.dropout(x, 0.5, training=True) + F.dropout(x, 0.5, training=True)

    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(100),)).extract(AstSize())
    assert opt.code.count("functional.dropout(") == 2
    torch.manual_seed(1)
    a = opt(torch.ones(100))
    torch.manual_seed(1)
    b = f(torch.ones(100))
    torch.testing.assert_close(a, b)
    assert opt.meta["egraph_report"].validation.reference == "same-seed original"


def test_effects_are_kept_in_order_even_when_unused():
    def f(x):
        torch.rand_like(x)  # unused, but it advances the RNG: it must stay
        return x * torch.rand_like(x)

    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(3),)).extract(AstSize())
    assert opt.code.count("torch.rand_like(") == 2
    torch.manual_seed(3)
    a = opt(torch.ones(3))
    torch.manual_seed(3)
    torch.testing.assert_close(a, f(torch.ones(3)))


def test_an_in_place_update_is_found_past_inputs_that_are_not_tensors():
    """dynamo records a size as an input's value (a SymInt): comparing its missing storage
    with the updated tensor's crashed the compile backend on every graph that updates an
    input after a size input (a dynamic-shape program, several transformers models)."""
    from frontends.fx.effects import updates_an_input

    graph = torch.fx.Graph()
    size, x, y = graph.placeholder("size"), graph.placeholder("x"), graph.placeholder("y")
    size.meta["example_value"] = 4
    x.meta["example_value"], y.meta["example_value"] = torch.randn(4), torch.randn(4)
    updated = graph.call_method("add_", (y, x))
    local = graph.call_method("add_", (graph.call_function(torch.mul, (x, 2)), 1))
    local.args[0].meta["example_value"] = torch.randn(4)
    graph.output((updated, local))
    assert [updates_an_input(n) for n in (updated, local)] == [True, False]


def _torch_functions(x, w):
    unused = F.interpolate(x, scale_factor=2.0)  # noqa: F841 - dead code on purpose
    up = F.interpolate(x, scale_factor=2.0) + F.interpolate(x, scale_factor=2.0)
    values = torch.sort(w, dim=-1).values + torch.sort(w, dim=-1).values
    norms = torch.linalg.vector_norm(w, dim=-1) + torch.linalg.vector_norm(w, dim=-1)
    noisy = F.gumbel_softmax(w, tau=1.0) + F.gumbel_softmax(w, tau=1.0)  # random draws
    return up, values, norms, noisy


@pytest.mark.parametrize("entry", ["symbolic_trace", "torch.compile"])
def test_torch_functions_without_an_aten_namesake_are_shared_when_functional(entry):
    """``F.interpolate`` (diffusers' upsampling) has no aten op of its name: whether it is
    functional is read from the aten ops it dispatches to, so equal calls are computed
    once and an unused one goes; ``F.gumbel_softmax`` draws random numbers and stays.
    ``torch.sort``'s namesake has TorchScript list overloads that sort in place, which do
    not make it an effect."""
    from compiler.compile import make_backend

    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 5)
    if entry == "symbolic_trace":
        opt = EGraph.from_fx(torch.fx.symbolic_trace(_torch_functions), (x, w)).extract(
            AstSize())
        code = opt.code
    else:
        backend = make_backend(rules=(), validate="raise")
        torch._dynamo.reset()
        torch.compile(_torch_functions, backend=backend)(x, w)
        (entry,) = backend.cache.values()
        code = entry.module.code
    assert code.count("interpolate(") == 1 and code.count("sort(") == 1
    assert code.count("linalg_vector_norm(") == 1 and code.count("gumbel_softmax(") == 2


def test_dropout_in_eval_and_inplace_ops_are_functionalised():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.3)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = x * 2
            y.add_(1)
            z = self.relu(y)
            return self.drop(z) + y

    model = M().eval()
    opt = EGraph.from_fx(model, (torch.randn(4),)).extract(AstSize())
    assert "dropout" not in opt.code and ".add_(" not in opt.code
    x = torch.randn(4)
    torch.testing.assert_close(opt(x), model(x))


def test_in_place_update_of_an_input_is_kept_as_the_sources_call():
    """``x.add_(1)`` on an input (dynamo's graphs spell BatchNorm's step counter so): the
    caller's tensor changes as in eager code, and later reads see the update. It was
    refused, which crashed every BatchNorm model's training step through Inductor."""
    def f(x, n):
        n.add_(1)
        return x * 2 + n

    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(3), torch.zeros(3)),
                         ).extract(AstSize(), validate="raise")
    x, n = torch.randn(3), torch.zeros(3, dtype=torch.int64)
    torch.testing.assert_close(opt(x, n), x * 2 + 1)
    assert n.tolist() == [1, 1, 1]


class _ReadThenOverwrite(nn.Module):
    """Reads its buffer, overwrites it, reads it again (by a new ``self.b``, as a symbolic
    trace records it): the shape of Rprop's step, which reads its previous gradients and
    then copies the new ones over them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.full((3,), 2.0))

    def forward(self, x, y):
        m = torch.mul(x, self.b)
        self.b.copy_(y)
        m.sign_()
        return m + self.b


def test_a_read_of_a_buffer_before_its_update_in_place_sees_the_old_values():
    """The program computed ``x * b`` lazily, after ``b.copy_(y)``, and read the second
    ``self.b`` as the old buffer: a wrong result that validation passed (its float64
    spread ran the graph four times, each from the buffer the last run left)."""
    x, y = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([-5.0, 6.0, 7.0])
    for validate in ("off", "raise"):
        model, eager = _ReadThenOverwrite(), _ReadThenOverwrite()
        opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (x, y)).extract(
            AstSize(), validate=validate)
        torch.testing.assert_close(opt(x, y), eager(x, y))
        torch.testing.assert_close(opt.b, eager.b)
        torch.testing.assert_close(opt(y, x), eager(y, x))  # the second call reads y


class _UpdatedTwice(nn.Module):
    """Returns what its first update of a buffer returned, after a second update through
    another read of the buffer: the returned tensor is the buffer, so it sees both."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(3))

    def forward(self, x):
        a = self.b.mul_(x.mean())
        self.b.add_(x)
        return a * 1


def test_what_an_update_of_a_buffer_returned_sees_a_later_update_by_another_read():
    """``a = self.b.mul_(m)`` is the buffer's tensor: a later ``self.b.add_(x)`` (a
    second get_attr in a symbolic trace) changes ``a`` too. ``a`` kept the first update's
    value, a wrong result that validation passed."""
    x = torch.tensor([0.5, -1.0, 2.0])
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_UpdatedTwice()), (x,)).extract(AstSize())
    eager = _UpdatedTwice()
    torch.testing.assert_close(opt(x), eager(x))
    torch.testing.assert_close(opt.b, eager.b)


def test_validation_refuses_a_program_that_reads_an_updated_buffer_too_early():
    """The wrong program above passed validation: the Monte Carlo runs of the float64
    reference rounded ``b.mul_(m)``'s result into a copy, so ``a`` missed the second
    update in every run, and that "spread" of float64 covered the whole error."""
    from compiler.validate import validate_module

    x = torch.tensor([0.5, -1.0, 2.0])
    src = EGraph.from_fx(torch.fx.symbolic_trace(_UpdatedTwice()), (x,)).fx

    class Early(nn.Module):  # the old emission: ``a * 1`` before the second update
        def __init__(self):
            super().__init__()
            self.b = src.graph_module.b

        def forward(self, x):
            a = self.b.mul_(x.mean())
            out = a * 1
            self.b.add_(x)
            return out

    result = validate_module(src, Early())
    assert not result.ok and "error" in result.reason


def test_validation_refuses_a_program_that_reads_a_buffer_after_overwriting_it():
    from compiler.validate import validate_module

    # (y of both signs: with y > 0 everywhere the late read gives the same signs, and
    # validation's random inputs keep the signs ingest observed)
    x, y = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([-0.3, 0.7, -1.2])
    src = EGraph.from_fx(torch.fx.symbolic_trace(_ReadThenOverwrite()), (x, y)).fx

    class Late(nn.Module):  # the old emission: the read after the update
        def __init__(self):
            super().__init__()
            self.b = src.graph_module.b

        def forward(self, x, y):
            self.b.copy_(y)
            return torch.sign(x * self.b) + self.b

    result = validate_module(src, Late())
    assert not result.ok and "error" in result.reason


class _ViewThenOverwrite(nn.Module):
    """Sums a view of its parameter before and after overwriting the parameter in place:
    the view sees the new values (as a BatchNorm-like statistic read through ``.t()``)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.arange(9.0).reshape(3, 3), requires_grad=False)

    def forward(self, y):
        v = self.w.t()
        before = v.sum(0)
        self.w.copy_(y)
        return before + v.sum(0) + self.w.sum()


@pytest.mark.parametrize("capture", ["symbolic_trace", "export"])
def test_a_view_of_a_parameter_read_after_its_update_sees_the_new_values(capture):
    """Emitting the reads of the old values first must not move a read of a view that
    comes after the update: such a program is ingested as torch.export's functional
    program, whose write into the parameter (``parameters_to_mutate``) crashed ingest
    and which validation judged from a parameter the source had already overwritten."""
    y = torch.randn(3, 3)
    model, eager = _ViewThenOverwrite(), _ViewThenOverwrite()
    source = (torch.fx.symbolic_trace(model) if capture == "symbolic_trace"
              else torch.export.export(model, (y,)))
    opt = EGraph.from_fx(source, (y,)).extract(AstSize(), validate="raise")
    torch.testing.assert_close(opt(y), eager(y))
    torch.testing.assert_close(opt.w, eager.w)


def _foreach_step(a, b, g, h, scalars):
    torch._foreach_mul_([a, b], 0.5)
    torch._foreach_addcdiv_([a, b], [g, h], [g + 1, h + 1], scalars)  # a value per tensor
    torch._foreach_maximum_([a, b], -0.25)
    roots = torch._foreach_sqrt(torch._foreach_abs([g, h]))
    norms = torch._foreach_norm([a, b])
    return roots[0] + norms[1], roots[1] * norms[0]


def test_foreach_calls_are_split_per_tensor_and_update_their_inputs():
    """Optimizers' ``foreach=True`` spelling: updates of lists of inputs in place, and
    results read by index. Each becomes one call per tensor: the inputs change as in
    eager code, and the results equal eager's."""
    def inputs():
        torch.manual_seed(0)
        return (torch.randn(3), torch.randn(2, 2), torch.rand(3) + 1, torch.rand(2, 2) + 1,
                torch.tensor([0.5, -2.0]))

    opt = EGraph.from_fx(torch.fx.symbolic_trace(_foreach_step), inputs()).extract(
        AstSize(), validate="raise")
    assert "_foreach_" not in opt.code
    ours, theirs = inputs(), inputs()
    torch.testing.assert_close(opt(*ours), _foreach_step(*theirs))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_data_dependent_control_flow_gets_a_clear_error():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(UntraceableModel, match="torch.export.export"):
        EGraph.from_fx(Branchy(), (torch.randn(3),))


def test_unsupported_op_round_trips_as_opaque():
    def f(x):
        return torch.special.bessel_j0(x) + torch.cumprod(x, 0)

    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(6),)).extract(AstSize())
    x = torch.randn(6)
    torch.testing.assert_close(opt(x), f(x))
    assert "bessel_j0" in opt.code and "cumprod" in opt.code


def test_binary_max_min_and_one_sided_clamps_are_the_table_ops_in_every_graph():
    """``torch.max(a, b)`` is ``aten.max.other`` in an exported graph, ``torch.max(a)``
    ``aten.max.default``, ``clamp_min`` its own aten op: each is the op the table has
    (maximum, amax, clamp), which the rules read, never an opaque call."""
    class Bounds(nn.Module):
        def forward(self, a, b):
            return f(a, b)

    def f(a, b):
        return (torch.max(a, b) + torch.min(a, b) + torch.max(a) + torch.min(b)
                + a.clamp_min(0.25) + torch.clamp_max(b, 0.5)
                + torch.clamp(a, min=torch.zeros(()), max=b))

    inputs = (torch.randn(4, 6), torch.randn(4, 6))
    for graph in (torch.fx.symbolic_trace(f), torch.export.export(Bounds(), inputs)):
        eg = EGraph.from_fx(graph, inputs)
        ops = {n.op for c in eg.classes() for n in eg.nodes(c)}
        assert "opaque" not in ops and {"maximum", "minimum", "amax", "amin", "clamp"} <= ops
        torch.testing.assert_close(eg.extract(AstSize())(*inputs), f(*inputs))


def test_unsound_rule_merging_different_shapes_raises_naming_the_rule():
    def f(x):
        return x.sum(-1)

    eg = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(3, 4),))
    with pytest.raises(UnsoundMerge, match="drop-sum"):
        eg.saturate([rewrite("drop-sum", "(sum ?x ?d ?k)", "?x")])


@pytest.mark.parametrize("named", [
    lambda x: x.max(dim=1).values,
    lambda x: torch.topk(x, 2, dim=1).values.sum(1),
    lambda x: x.sort(dim=1).indices.float(),
    lambda x: torch.min(x, 1)[0],
], ids=["max-values", "topk-values", "sort-indices", "min-by-index"])
def test_validation_judges_programs_that_read_named_results_in_float64(named):
    """A program that reads ``x.max(dim=1).values`` is judged against float64 (its
    float64 run lost the named result and could not read ``.values``: the float32 source
    was the reference, so a rewrite more accurate than it was refused). From the fuzzer:
    ``(exp(x) - exp(-x)) / (exp(x) + exp(-x))`` on inputs near 1e-3 cancels in float32;
    tanh does not."""

    def program(x):
        return (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)), named(x)

    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(0)) * 1e-3
    eg = EGraph.from_fx(torch.fx.symbolic_trace(program), (x,)).saturate(load_rules("all"))
    opt = eg.extract(AstSize(), validate="raise")
    validation = opt.meta["egraph_report"].validation
    assert validation.reference == "float64"
    assert validation.error_after < validation.error_before  # tanh beats the cancellation
    assert "tanh" in opt.code


def test_validation_falls_back_or_raises_on_a_wrong_rewrite():
    def f(x):
        return torch.exp(x) * 2

    def make():
        eg = EGraph.from_fx(torch.fx.symbolic_trace(f), (torch.randn(8),))
        # deliberately wrong: exp(x) -> x keeps shape and dtype, so only validation sees it
        return eg.saturate([rewrite("wrong", "(exp ?x)", "?x")])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = make().extract(AstSize(), validate="strict")
    assert any("wrong" in str(w.message) for w in caught)
    assert opt.meta["egraph_report"].fell_back
    x = torch.randn(8)
    torch.testing.assert_close(opt(x), f(x))
    with pytest.raises(ValidationError, match="wrong"):
        make().extract(AstSize(), validate="raise")
    trusted = make().extract(AstSize(), validate="off")
    torch.testing.assert_close(trusted(x), x * 2)


def test_report_prints_and_module_saves(saved_and_loaded):
    model, inputs = build("mlp")
    opt = EGraph.from_fx(model, inputs).extract(AstSize())
    text = str(opt.meta["egraph_report"])
    assert "cost" in text and "validation passed" in text
    loaded = saved_and_loaded(opt)
    torch.testing.assert_close(loaded(*inputs), model(*inputs))
    assert str(loaded.meta["egraph_report"]) == text  # what torch.fx's pickling drops
    assert str(saved_and_loaded(loaded).meta["egraph_report"]) == text  # saved again


def test_a_module_the_accuracy_search_rewrote_saves_with_its_report(saved_and_loaded):
    """Under Curvature, the Herbie-style search returns a new module with formulas
    replaced (sqrt(x + 1) - sqrt(x) at x up to 1e30); it too keeps its report when saved."""
    from extractors import Curvature

    naive = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
    x = 10 ** torch.linspace(0, 30, 200)
    opt = EGraph.from_fx(naive, (x,)).saturate(load_rules("all")).extract(Curvature())
    loaded = saved_and_loaded(opt)
    assert str(loaded.meta["egraph_report"]) == str(opt.meta["egraph_report"])
    torch.testing.assert_close(loaded(x), opt(x))


def test_export_program_is_ingested_with_parameter_names():
    model, inputs = build("gpt_block")
    program = torch.export.export(model, inputs)
    opt = EGraph.from_fx(program).extract(AstSize())
    torch.testing.assert_close(opt(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert set(opt.state_dict()) >= set(model.state_dict())


def test_torch_compile_backend_inference_and_training():
    import compiler.compile  # noqa: F401 - registers the "egraph" backend

    torch._dynamo.reset()
    model, inputs = build("gpt_block")
    model.train()
    compiled = torch.compile(model, backend="egraph")
    x = inputs[0].clone().requires_grad_()
    out = compiled(x)
    out.pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    xg = x.grad.clone()
    model.zero_grad()
    x2 = inputs[0].clone().requires_grad_()
    ref = model(x2)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xg, x2.grad, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(compiled(inputs[0]), model(inputs[0]), rtol=1e-5, atol=1e-5)


def test_compile_backend_caches_repeated_graphs():
    from compiler.compile import make_backend

    torch._dynamo.reset()
    calls = []

    def counting_cost(node, kids):
        calls.append(node.op)
        return 1 + sum(kids)

    backend = make_backend(cost=counting_cost)
    a, b = build("mlp")[0], build("mlp", seed=1)[0]
    x = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(a, backend=backend)(x), a(x))
        first = len(calls)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(b, backend=backend)(x), b(x))
    assert first > 0 and len(calls) == first  # the second model's graph came from the cache


def test_the_report_names_the_rewrites_the_emitted_program_owes():
    """``used`` counts the rules whose e-nodes the emitted program holds; ``rewrites``
    everything saturation applied (comm-add fired, but nothing of it is emitted)."""
    from extractors import Curvature

    x = torch.rand(4, 16)
    gm = torch.fx.symbolic_trace(lambda x: torch.log(1 + x) * 2)
    opt = EGraph.from_fx(gm, (x,)).saturate(load_rules("all")).extract(Curvature())
    report = opt.meta["egraph_report"]
    assert report.used == {"log1p": 1}
    assert "comm-add" in report.rewrites and "comm-add" not in report.used
    assert "rewrites in the program: log1p x1" in str(report)


def test_extraction_never_emits_a_program_dearer_than_its_source():
    """Greedy extraction prices trees: var(x) looks cheaper than the mean square of the
    shared centred values, but as the program runs (each value once) it costs more. The
    emitted program is never dearer than the source under the user's cost."""
    from egraph.rules import load_rules
    from extractors import Flops

    def standardise(x):
        xc = x - x.mean(-1, keepdim=True)
        return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)

    x = torch.randn(4, 16)
    gm = torch.fx.symbolic_trace(standardise)
    opt = EGraph.from_fx(gm, (x,)).saturate(load_rules("all")).extract(Flops())
    report = opt.meta["egraph_report"]
    assert report.cost_after <= report.cost_before
    torch.testing.assert_close(opt(x), standardise(x))


def test_an_exported_module_is_ingested_from_its_metadata_without_a_run(monkeypatch):
    """``ExportedProgram.module()`` adds a call of its input guards that carries no
    metadata; ingest still reads every other node's shape from export's metadata instead
    of running the model (on a 12-layer decoder that run cost 0.9 s of ingest)."""
    import frontends.fx.metadata as metadata

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    gm = torch.export.export(model, (x,)).module()

    def no_run(*args):
        raise AssertionError("ingest ran the model")

    monkeypatch.setattr(metadata, "_run_real", no_run)
    eg = EGraph.from_fx(gm, (x,))
    torch.testing.assert_close(eg.extract(AstSize())(x), model(x))


def test_parameters_are_measured_only_where_ranges_are_observed():
    """A parameter's value range informs the curvature cost only; where the model is too
    large to observe (``observe=False``, the default past 4 million elements), its
    weights are not scanned either (GPT-2's embedding alone took 0.3 s)."""
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    ranges = {}
    for observe in (True, False, None):  # None: no example inputs, nothing observed
        eg = (EGraph.from_fx(model) if observe is None else
              EGraph.from_fx(model, (x,), observe=observe))
        weight = next(m for k, m in eg.analysis.leaves.items() if k.startswith("param:")
                      and k.endswith("weight"))
        ranges[observe] = (weight.lo, weight.hi)
    weight = model.weight.detach()
    assert ranges[True] == ranges[None] == (float(weight.min()), float(weight.max()))
    assert ranges[False] == (-float("inf"), float("inf"))


def test_a_parameter_passed_as_an_input_is_measured_as_parameters_are():
    """aot_autograd hands the backend a model's parameters as graph inputs: where ranges
    are not observed, their weights are not scanned (a 12-layer decoder's: 0.37 s of a
    2 s pipeline); the other inputs' ranges are still measured."""
    gm = torch.fx.symbolic_trace(lambda x, w: torch.exp(x @ w))
    x, w = torch.randn(3, 4), nn.Parameter(torch.randn(4, 2))
    for observe in (True, False):
        eg = EGraph.from_fx(gm, (x, w), observe=observe)
        x_meta, w_meta = (eg.data(c) for c in eg.fx.input_classes)
        assert (x_meta.lo, x_meta.hi) == (float(x.min()), float(x.max()))
        measured = (float(w.detach().min()), float(w.detach().max()))
        assert ((w_meta.lo, w_meta.hi) == measured) == observe


def test_an_exported_modules_program_returns_the_structure_the_source_returns():
    """``ExportedProgram.module()``'s code rebuilds its outputs' structure from the
    graph's flat outputs: a tensor, not a 1-tuple; a dict of a tensor and a list. The
    emitted program returns the same."""
    class Structured(nn.Module):
        def forward(self, x):
            return {"a": x.exp(), "b": [x.sin(), x + 1]}

    x = torch.randn(3, 4)
    for model in (nn.Linear(4, 2), Structured()):
        gm = torch.export.export(model, (x,)).module()
        got = EGraph.from_fx(gm, (x,)).extract(AstSize())(x)
        want = model(x)
        assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(
            want)
        torch.testing.assert_close(got, want)


def test_an_output_of_a_class_fx_would_not_rebuild_keeps_its_class_saved_and_loaded():
    """An output structure of a class FX writes back as a plain dict or tuple
    (transformers' ``ModelOutput`` is an ``OrderedDict``; ``torch.return_types``) keeps its
    class in the emitted program, after ``torch.save`` and load too: users read its fields
    by name. FX's own plain dicts stay plain (mutable) dicts."""
    class Named(nn.Module):
        def forward(self, x):
            return collections.OrderedDict(a=x.exp() * 2, b=[x.sum(), x.max(dim=0)])

    x = torch.randn(3, 4)
    want = Named()(x)
    for source in (torch.export.export(Named(), (x,)), torch.fx.symbolic_trace(Named())):
        opt = EGraph.from_fx(source, (x,)).extract(AstSize())
        buffer = io.BytesIO()
        torch.save(opt, buffer)
        buffer.seek(0)
        for module in (opt, torch.load(buffer, weights_only=False)):
            got = module(x)
            assert type(got) is (dict if isinstance(source, torch.fx.GraphModule)
                                 else collections.OrderedDict)
            assert type(got["b"][1]) is torch.return_types.max
            torch.testing.assert_close(dict(got), dict(want))


def test_an_export_module_a_pass_rebuilt_is_ingested_with_its_guards():
    """A pass that rebuilds ``ExportedProgram.module()`` as a new GraphModule (PT2E
    quantisation's ``convert_pt2e``) keeps its guard module but not its
    ``range_constraints``: ingest reads the sizes' ranges from the recorded values, and
    the emitted program still refuses the sizes export did not allow."""
    x = torch.randn(3, 4)
    unlifted = torch.export.export(nn.Linear(4, 2), (x,)).module()
    rebuilt = torch.fx.GraphModule(unlifted, unlifted.graph)
    assert not hasattr(rebuilt, "range_constraints")
    opt = EGraph.from_fx(rebuilt, (x,)).extract(AstSize())
    torch.testing.assert_close(opt(x), unlifted(x))
    with pytest.raises(SizeMismatch, match=r"input 'input' has shape \(5, 4\)"):
        opt(torch.randn(5, 4))


class _State(nn.Module):
    """A parameter, a persistent and a non-persistent buffer, and a tensor constant."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.register_buffer("shift", torch.ones(3), persistent=False)
        self.table = torch.tensor([0.5, -1.0, 3.0])

    def forward(self, x):
        return {"y": self.proj(x).exp() * self.scale + self.shift * self.table,
                "n": x.sum()}


def test_an_export_program_is_ingested_without_unlifting_it(monkeypatch):
    """``from_fx`` reads an ExportedProgram's graph with its state bound by name
    (``ExportedModule``), not through ``ExportedProgram.module()`` (0.28 s for GPT-2
    small); the emitted program keeps the program's state dict, tensors shared, and its
    output structure, and validation runs against the exported graph in float64."""
    from torch.export import ExportedProgram

    model, x = _State(), torch.randn(5, 4)
    program = torch.export.export(model, (x,))
    want = program.module()(x)

    def no_unlift(self):
        raise AssertionError("ingest unlifted the program")

    monkeypatch.setattr(ExportedProgram, "module", no_unlift)
    eg = EGraph.from_fx(program, (x,))
    opt = eg.extract(AstSize())
    report = opt.meta["egraph_report"]
    assert report.validation.ok and report.validation.reference == "float64"
    assert not report.fell_back
    got = opt(x)
    assert got.keys() == want.keys()
    torch.testing.assert_close(got, want)
    assert set(opt.state_dict()) == set(program.state_dict) == {
        "proj.weight", "proj.bias", "scale"}
    assert opt.get_parameter("proj.weight") is program.state_dict["proj.weight"]


def test_an_exported_module_checks_input_sizes_as_export_does():
    from frontends.fx.exported import ExportedModule

    model, x = _State(), torch.randn(5, 4)
    module = ExportedModule(torch.export.export(model, (x,)))
    torch.testing.assert_close(module(x), model(x))
    with pytest.raises(ValueError, match=r"input 'x' has shape \(6, 4\).*exported for inputs "
                       r"where x.size\(\)\[0\] == 5"):
        module(torch.randn(6, 4))
    with pytest.raises(TypeError, match="takes 1 inputs, got 2"):
        module(x, x)
    dim = torch.export.Dim("rows")
    dynamic = ExportedModule(torch.export.export(model, (x,), dynamic_shapes=({0: dim},)))
    torch.testing.assert_close(dynamic(torch.randn(7, 4))["y"].shape, torch.Size([7, 3]))
    bounded = torch.export.Dim("rows", min=3, max=8)
    bounded = ExportedModule(torch.export.export(model, (x,), dynamic_shapes=({0: bounded},)))
    with pytest.raises(ValueError, match=r"where x.size\(\)\[0\] <= 8"):
        bounded(torch.randn(9, 4))  # the range export was told, as torch's module checks


def test_a_failed_export_program_falls_back_to_the_unlifted_source():
    model, x = _State(), torch.randn(5, 4)
    eg = EGraph.from_fx(torch.export.export(model, (x,)), (x,))
    eg.saturate([rewrite("wrong", "(exp ?x)", "?x")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = eg.extract(AstSize(), validate="strict")
    assert opt.meta["egraph_report"].fell_back
    assert isinstance(opt, torch.fx.GraphModule)
    torch.testing.assert_close(opt(x), model(x))


def test_a_fallback_warning_points_at_the_callers_line():
    eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2), (torch.randn(8),))
    eg.saturate([rewrite("wrong", "(exp ?x)", "?x")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eg.extract(AstSize(), validate="strict")
    assert [w.filename for w in caught if "wrong" in str(w.message)] == [__file__]


def test_default_extraction_without_the_solver_keeps_the_dag_answer(monkeypatch):
    """HiGHS is optional (the ``dev`` extra): without it ``method="auto"`` keeps the DAG
    heuristic's answer, unproven, instead of failing a program that extracts fine (a plain
    install on a GPU machine raised ImportError on every model)."""
    import sys

    from compiler.compile import default_cost
    from egraph.rules import load_rules

    x = torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))
    proven = EGraph.from_fx(gm, (x,)).saturate(load_rules("all")).extract(default_cost((x,)))
    monkeypatch.setitem(sys.modules, "highspy", None)  # import highspy now raises
    kept = EGraph.from_fx(gm, (x,)).saturate(load_rules("all")).extract(default_cost((x,)))
    assert proven.meta["egraph_report"].optimal is True
    assert kept.meta["egraph_report"].optimal is None and "softmax" in kept.code
    torch.testing.assert_close(kept(x), torch.softmax(x, -1))


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _through_every_entry(fn, inputs):
    """``fn`` optimised with the rule library, through from_fx and the compile backend."""
    from compiler.compile import make_backend
    from egraph.rules import load_rules

    rules = load_rules("all")
    yield EGraph.from_fx(torch.fx.symbolic_trace(fn), inputs).saturate(rules).extract(AstSize())
    torch._dynamo.reset()
    yield torch.compile(fn, backend=make_backend(rules=rules))


def test_an_output_the_source_made_is_never_the_callers_input():
    """``x * 1``, ``x + 0`` and ``x.clone()`` rewrite to ``x``, but the source returns a new
    tensor: writing into the output must not write into the input. A view stays a view."""
    def f(x):
        return x * 1, (x + 0).reshape(-1), x.clone(), x.view(-1)

    x = torch.randn(2, 3)
    for opt in _through_every_entry(f, (x,)):
        given = x.clone()
        made_once, made_twice, copied, viewed = opt(given)
        assert not any(_shares_storage(o, given) for o in (made_once, made_twice, copied))
        assert _shares_storage(viewed, given)
        made_once.add_(1)
        torch.testing.assert_close(given, x)


def test_an_output_made_of_parameters_alone_is_new_on_every_call():
    """A value of parameters alone is folded into a buffer computed once; handing that
    buffer out would let a caller's write change what every later call returns."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x + 1, self.w * 2, (self.w + 1).reshape(3, 1)

    x = torch.zeros(3)
    opt = EGraph.from_fx(Scaled(), (x,)).extract(AstSize())
    assert "folded_constants" in opt.code
    with torch.no_grad():
        for out in opt(x)[1:]:
            out.add_(100)
        _, doubled, shifted = opt(x)
    torch.testing.assert_close(doubled, torch.full((3,), 2.0))
    torch.testing.assert_close(shifted, torch.full((3, 1), 2.0))


def test_a_saved_and_loaded_module_keeps_its_folded_values_up_to_date(saved_and_loaded):
    """torch.fx traces a loaded module's code again: the folded values' refresh must
    survive it, or a parameter updated in place (or trained) after loading would be read
    through stale folded values, silently."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * (self.w * 2)

    x = torch.ones(3)
    opt = EGraph.from_fx(Scaled(), (x,)).extract(AstSize())
    assert "folded_constants" in opt.code
    loaded = saved_and_loaded(opt)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), torch.full((3,), 2.0))
        loaded.w.add_(1)
        torch.testing.assert_close(loaded(x), torch.full((3,), 4.0))
    loaded(x).sum().backward()
    torch.testing.assert_close(loaded.w.grad, torch.full((3,), 2.0))


def test_an_output_is_contiguous_where_the_source_made_it_contiguous():
    """``x.t().contiguous()`` is ``x.t()`` in value; a caller's ``view`` of the result
    needs the source's layout."""
    def f(x):
        return x.t().contiguous() * 2, (x * 2).t().contiguous(), x.t()

    x = torch.randn(2, 3)
    for opt in _through_every_entry(f, (x,)):
        scaled, flipped, viewed = opt(x)
        assert scaled.is_contiguous() and flipped.is_contiguous()
        torch.testing.assert_close(flipped.view(-1), (x * 2).t().reshape(-1))
        assert not viewed.is_contiguous()  # the source's own view, as it was


def test_a_fused_attention_on_transposed_heads_returns_the_sources_layout():
    """A written-out attention on heads transposed from (B, T, H, D) becomes sdpa, whose
    result follows the query's strides: the source's matmul returned a contiguous tensor,
    so validation, seeing ours strided, makes the output contiguous (a caller's ``view``
    of it would raise otherwise)."""
    from egraph.rules import load_rules
    from extractors import Flops

    def attention(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.softmax(q @ k.transpose(-2, -1) / 4.0, -1) @ v

    xs = tuple(torch.randn(2, 8, 3, 16) for _ in range(3))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(attention), xs).saturate(load_rules("all"))
    opt = eg.extract(Flops())
    assert "scaled_dot_product_attention" in opt.code
    assert opt(*xs).is_contiguous()
    torch.testing.assert_close(opt(*xs).view(2, 3, -1), attention(*xs).view(2, 3, -1))


def test_outputs_that_are_contiguous_anyway_get_no_copy_call():
    """The layout check adds a call only where ours may be strided: not on an item of a
    multi-output op, nor on an elementwise result of a broadcast."""
    def f(x, y):
        values, indices = torch.max(x * 2, dim=1)
        return values, indices, y.expand(3, 4) * x

    x, y = torch.randn(3, 4), torch.randn(4)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (x, y)).extract(AstSize())
    assert "contiguous" not in opt.code and "clone" not in opt.code
    for got, want in zip(opt(x, y), f(x, y)):
        torch.testing.assert_close(got, want)


def test_an_exported_arange_folds_at_a_fixed_size_and_follows_a_dynamic_one():
    """torch.export spells ``torch.arange(n)`` ``aten.arange.default(n)`` (the end alone)
    and ``aten.arange.start``: both are the table's arange, a constant at a fixed size
    (transformers' position ids) and computed from the size where it is dynamic."""
    class Positions(nn.Module):
        def forward(self, x):
            return x * torch.arange(x.shape[-1], dtype=x.dtype) + torch.arange(
                1, x.shape[-1] + 1, dtype=x.dtype)

    x = torch.randn(2, 6)
    fixed = EGraph.from_fx(torch.export.export(Positions(), (x,)), (x,)).extract(AstSize())
    assert "arange" not in fixed.code
    torch.testing.assert_close(fixed(x), Positions()(x))
    n = torch.export.Dim("n", min=2)
    dynamic = torch.export.export(Positions(), (x,), dynamic_shapes={"x": {1: n}})
    opt = EGraph.from_fx(dynamic, (x,)).extract(AstSize())
    assert _arange_from_size(opt)
    for wider in (torch.randn(2, 9), x, torch.randn(2, 3)):
        torch.testing.assert_close(opt(wider), Positions()(wider))


def test_an_in_place_update_of_a_folded_constant_writes_into_a_copy():
    """T5's ``relative_buckets += ...`` stays ``aten.add_`` in an exported graph; once its
    ``arange`` folds into a constant, the update must not write into that constant (the
    source makes a new tensor on every call), or every later call sees it shifted."""
    class Shifted(nn.Module):
        def forward(self, x):
            steps = torch.arange(x.shape[-1])
            steps += 1
            return x + steps

    x = torch.zeros(2, 4)
    program = torch.export.export(Shifted(), (x,))
    assert any("add_" in str(n.target) for n in program.graph.nodes)
    opt = EGraph.from_fx(program, (x,)).extract(AstSize())
    for _ in range(3):
        torch.testing.assert_close(opt(x), Shifted()(x))


class _PackedCausalMask(nn.Module):
    """The causal mask as transformers 5 builds it from position ids (spelled in the form
    of its masking utilities): ``diff`` and ``cumsum`` find packed sequences, advanced
    indexing and ``new_ones`` combine the rules. None of it depends on the input's values.
    ``size``: the batch and length fixed (as dynamo specialises them), else the input's."""

    def __init__(self, size: tuple[int, int] | None = None):
        super().__init__()
        self.size = size

    def forward(self, x):
        b, t = self.size or (x.shape[0], x.shape[-1])
        positions = torch.arange(t).unsqueeze(0).expand(b, -1)
        first = positions[:, :1] - 1
        packed = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
        batch = torch.arange(b)[:, None, None]
        q = torch.arange(t)[None, :, None]
        kv = torch.arange(t)[None, None, :]
        mask = q.new_ones((), dtype=torch.bool)
        mask = mask & (positions[batch, kv] <= positions[batch, q])
        mask = mask & (packed[batch, q] == packed[batch, kv])
        return x.unsqueeze(1).masked_fill(~mask, -1e4)


def test_a_mask_made_from_positions_alone_folds_into_a_constant():
    """Calls the vocabulary does not model (``torch.diff``, ``cumsum``, ``new_ones``,
    ``aten.index``) on constants run once at ingest, through symbolic tracing and through
    torch.export alike, so no call rebuilds the mask; at a dynamic size it is computed once
    per size (folded from the input's size), and follows the size."""
    x = torch.randn(2, 6)
    want = _PackedCausalMask()(x)
    traced = EGraph.from_fx(_PackedCausalMask((2, 6)), (x,)).extract(AstSize())
    exported = EGraph.from_fx(torch.export.export(_PackedCausalMask(), (x,)), (x,))
    exported = exported.extract(AstSize())
    for opt in (traced, exported):
        assert not any(word in opt.code for word in ("diff", "cumsum", "new_ones", "index"))
        torch.testing.assert_close(opt(x), want)
    n = torch.export.Dim("n", min=2)
    dynamic = torch.export.export(_PackedCausalMask(), (x,), dynamic_shapes={"x": {1: n}})
    opt = EGraph.from_fx(dynamic, (x,)).extract(AstSize())
    assert not any(word in opt.code for word in ("diff", "cumsum", "new_ones"))
    assert opt.folded_constants.sized and any(
        op == "call" and kids[0] is torch.ops.aten.diff.default
        for op, kids in opt.folded_constants.recipes.values())
    for other in (torch.randn(2, 9), x, torch.randn(2, 4), torch.randn(2, 9)):
        torch.testing.assert_close(opt(other), _PackedCausalMask()(other))


_STEPS_CALLS = []


def _counted_steps(n: int) -> torch.Tensor:
    _STEPS_CALLS.append(n)
    return torch.arange(n) * 2


def test_a_users_own_function_on_constants_is_not_run_at_ingest():
    """Only torch's own calls fold: a function of the user's in a graph may do anything,
    so it runs when the program runs, as in the source."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(operator.add, (x, graph.call_function(_counted_steps,
                                                                           (4,)))))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    x = torch.randn(3, 4)
    opt = EGraph.from_fx(gm, (x,), observe=False).extract(AstSize())
    _STEPS_CALLS.clear()
    torch.testing.assert_close(opt(x), x + torch.arange(4) * 2)
    assert _STEPS_CALLS == [4]


def test_a_random_call_on_constants_is_not_folded():
    """``torch.poisson`` of a constant draws new numbers on every call: it stays a call
    (the aten op it runs is tagged as seeded), never a folded constant."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    ones = graph.call_function(torch.ones, (4,))
    noise = graph.call_function(torch.poisson, (ones,))
    graph.output(graph.call_function(operator.add, (x, noise)))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    x = torch.zeros(3, 4)
    opt = EGraph.from_fx(gm, (x,), observe=False).extract(AstSize())
    assert not torch.equal(opt(x), opt(x))


def test_a_call_of_literals_that_sets_global_state_does_not_run_at_ingest():
    """``torch.set_default_dtype`` is torch's own and its argument a literal, but it
    changes the process, not a tensor: only calls with a constant tensor among their
    arguments run at ingest."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.set_default_dtype, (torch.float64,))
    y = graph.call_function(operator.add, (x, 1))
    graph.output(y)
    x.meta["val"], y.meta["val"] = torch.randn(3), torch.randn(3)  # as dynamo records them
    gm = torch.fx.GraphModule(nn.Module(), graph)
    try:
        opt = EGraph.from_fx(gm, (torch.randn(3),), observe=False).extract(
            AstSize(), validate="off")
        assert torch.get_default_dtype() == torch.float32
        assert "set_default_dtype" in opt.code
    finally:
        torch.set_default_dtype(torch.float32)


def test_an_update_seen_through_a_view():
    """Ingest makes in-place updates of intermediates out of place but does not replay
    views: a view taken before an update of its base (``b = a[:2]; a.add_(1)``) or an
    update through a view (``h[:, :2].mul_(3)``) would read stale values. Through
    torch.export the program is made functional first (``slice_scatter``) and stays
    optimised; from a traced module validation catches it and the program falls back
    to the source, so the caller still gets the source's results."""
    class Aliased(nn.Module):
        def forward(self, x):
            a = torch.arange(x.shape[-1]) * 1.0
            b = a[:2]
            a.add_(1)
            h = x * 2
            h[:, :2].mul_(3)
            return x[:, :2] + b + h[:, 1:3]

    x = torch.randn(2, 4)
    exported = EGraph.from_fx(torch.export.export(Aliased(), (x,)), (x,)).extract(
        AstSize(), validate="raise")
    torch.testing.assert_close(exported(x), Aliased()(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = EGraph.from_fx(Aliased(), (x,)).extract(AstSize())
    torch.testing.assert_close(traced(x), Aliased()(x))


def test_an_exported_update_of_the_input_and_a_buffer_stays_an_effect():
    """torch.export keeps ``x.add_(1)`` on the caller's input and ``self.count.add_(1)``
    on a buffer as ``aten.add_``: the caller's tensor and the buffer must change on every
    call, as in eager, so the call stays the source's (an update of an intermediate is
    made out of place instead)."""
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            x.add_(1)
            self.count.add_(1)
            return x * 2 + self.count

    x = torch.randn(3)
    example = x.clone()
    opt = EGraph.from_fx(torch.export.export(Counting(), (x.clone(),)), (example,)).extract(
        AstSize())
    torch.testing.assert_close(example, x)  # validation's runs left the caller's example
    # each program ran from the caller's state: the count did not run ahead of the
    # source's between them, which made every such program fall back
    assert not opt.meta["egraph_report"].fell_back
    eager = Counting()
    for _ in range(2):
        mine, theirs = x.clone(), x.clone()
        torch.testing.assert_close(opt(mine), eager(theirs))
        torch.testing.assert_close(mine, theirs)


def test_an_exported_program_that_gives_one_value_to_an_input_and_a_buffer_writes_both():
    """``n.add_(1); n.mul_(3); self.c.copy_(n)``: the functional program returns one value
    as the new input and the new buffer. Its outputs were told apart by node name, so both
    writes went to the input and the buffer kept its old value (validation refused it)."""
    class Stepping(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.ones(3))
            self.register_buffer("c", torch.ones(3))

        def forward(self, x, n):
            self.b.add_(x)
            m = self.b * 2
            self.b.mul_(x)
            k = self.b.sum() + m
            n.add_(1)
            r = n * k
            n.mul_(3)
            self.c.copy_(n)
            return r + self.c

    x, n = torch.randn(3), torch.randn(3)
    opt = EGraph.from_fx(torch.export.export(Stepping(), (x, n.clone())), (x, n.clone())
                         ).extract(AstSize(), validate="raise")
    eager, mine, theirs = Stepping(), n.clone(), n.clone()
    torch.testing.assert_close(opt(x, mine), eager(x, theirs))
    torch.testing.assert_close(mine, theirs)
    torch.testing.assert_close(opt.b, eager.b)
    torch.testing.assert_close(opt.c, eager.c)


def test_validation_with_effects_and_an_expanded_constant_does_not_crash():
    """A program with an effect (a counter buffer) whose emitted module holds a constant
    expanded to its use (stride 0, as GPT-OSS's folded attention shapes): validation
    restores the caller's state afterwards and skipped no tensor it could write, but
    copying into the expanded constant crashed ("more than one element of the written-to
    tensor refers to a single memory location"); it is left out, as nothing can write it."""
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            sink = torch.arange(4.0).reshape(1, 4, 1, 1).expand(x.shape[0], 4, x.shape[2], 1)
            return torch.cat([x, sink], -1) + self.count

    x = torch.randn(2, 4, 8, 3)
    program = torch.export.export(Counting(), (x,))
    opt = EGraph.from_fx(program, (x,)).extract(AstSize(), validate="raise")
    assert program.state_dict["count"] == 0  # validation's runs are not calls
    eager = Counting()
    for _ in range(2):
        torch.testing.assert_close(opt(x), eager(x))
    assert program.state_dict["count"] == eager.count == 2


class _Counted(nn.Module):
    """Counts its calls in a buffer by ``step``; the output does not read the count."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(self.step)
        return x * 2


def test_validation_refuses_a_program_whose_updates_differ():
    """Each program runs from the same state and the buffers and inputs they change in
    place are compared afterwards: a program counting by 2 where the source counts by 1
    is refused, though every output is equal; the caller's count is left at 0."""
    from compiler.validate import validate_module

    x = torch.randn(3)
    source = _Counted(1)
    src = EGraph.from_fx(torch.export.export(source, (x,)), (x,)).fx
    counted = src.graph_module if src.module is None else src.module
    assert validate_module(src, counted).ok
    twice = _Counted(2)
    twice.count = counted.count  # the same buffer, changed by another step
    refused = validate_module(src, twice)
    assert not refused.ok and "holds other values" in refused.reason
    assert counted.count.item() == 0


def test_validation_writes_only_into_what_a_run_changed():
    """Validation gives back the caller's values by writing only into the tensors a run
    changed: a write bumps a tensor's version, and autograd refuses a backward through
    a tensor saved before it. Every example input was written back, and JetMoE's
    training step through torch.compile failed ("modified by an inplace operation")."""
    from compiler.validate import validate_module

    x = torch.randn(3)
    src = EGraph.from_fx(torch.export.export(_Counted(1), (x,)), (x,)).fx
    counted = src.graph_module if src.module is None else src.module
    version = x._version
    assert validate_module(src, counted).ok
    assert x._version == version and counted.count.item() == 0


def test_validation_leaves_batch_norms_running_statistics_as_they_were():
    """An exported BatchNorm in training updates its running statistics on every call;
    validation's runs of the source and of ours must not count as calls."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 4)
    program = torch.export.export(model, (x,))
    opt = EGraph.from_fx(program, (x,)).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    for _ in range(2):
        torch.testing.assert_close(opt(x), eager(x))
    state = program.state_dict
    torch.testing.assert_close(state["1.running_mean"], eager[1].running_mean)
    assert state["1.num_batches_tracked"] == eager[1].num_batches_tracked == 2


def _written_with_out(a, b):
    c = torch.zeros_like(a)
    torch.add(a, b, out=c)
    wide = torch.zeros(a.shape, dtype=torch.float64)
    torch.mul(c, b, out=wide)          # out= of another dtype: the values are cast to it
    return c * 2, wide


def test_a_result_written_with_out_is_what_later_reads_see():
    """``torch.add(a, b, out=c)`` fills ``c``: the optimised program, unvalidated, reads
    the sum from ``c`` afterwards (the ``out=`` was dropped before, and ``c`` stayed
    zeros: a silent wrong result with validation off)."""
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_written_with_out), (a, b)).extract(
        AstSize(), validate="off")
    for got, expected in zip(opt(a, b), _written_with_out(a, b)):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)


def _into_a_view(a):
    c = torch.zeros_like(a)
    torch.sum(a, 0, out=c[0])
    return c


def _into_the_input(a):
    torch.exp(a, out=a)
    return a + 1


@pytest.mark.parametrize("program, why", [(_into_a_view, "share storage"),
                                          (_into_the_input, "graph input")])
def test_out_into_a_view_or_an_input_is_refused_with_the_fix(program, why):
    gm = torch.fx.symbolic_trace(program)
    with pytest.raises(UntraceableModel, match=f"{why}.*assign its result instead"):
        EGraph.from_fx(gm, (torch.randn(3, 4),))


def _through_a_flat_view(x):
    h = x * 2
    h.view(-1).add_(1)
    return h


def _into_a_column(x):
    h = x * 2
    h[:, 0].mul_(3)
    return h


def _view_read_after_its_base_changed(x):
    h = x.exp()
    row = h[0]
    h.mul_(2)
    return row + 1


def _through_an_unsqueezed_view(x):
    h = x + 1
    h.unsqueeze(0).relu_()
    return h * 2


def _copied_into_a_narrowed_clone(x):
    h = x.clone()
    h.narrow(1, 0, 2).copy_(torch.ones(3, 2))
    return h


class _ScaledFirstColumn(nn.Module):
    """transformers-style: a projection whose first column is rescaled in place."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        h[..., :1].mul_(0.5)
        return torch.tanh(h)


@pytest.mark.parametrize("program", [
    _through_a_flat_view, _into_a_column, _view_read_after_its_base_changed,
    _through_an_unsqueezed_view, _copied_into_a_narrowed_clone, _ScaledFirstColumn()],
    ids=lambda p: getattr(p, "__name__", type(p).__name__))
def test_updates_seen_through_views_keep_eager_values(program):
    """An in-place update of a view of an intermediate changes its base, and one of a
    base changes its views. Ingest made the update out of place and rebound only the name
    it was called on: the base (or the view) kept its old values, a wrong result with
    validation off, a fallback with it on; and an in-place copy into a view of a clone,
    whose clone the rules drop, wrote into the caller's input. A traced module with such
    an update is now ingested as torch.export's functional program, and torch.compile
    sends its graph through aot_autograd's functionalisation."""
    x = torch.randn(3, 4)
    expected, given = program(x.clone()), x.clone()
    module = program if isinstance(program, nn.Module) else None
    traced = torch.fx.symbolic_trace(module or program)
    opt = EGraph.from_fx(module or traced, (given,)).extract(AstSize(), validate="off")
    torch.testing.assert_close(opt(given), expected)
    torch.testing.assert_close(given, x)  # the caller's input is left as it was
    from compiler.compile import make_backend

    # (with Inductor's code generation: the graph is functionalised before ingest)
    for codegen in ("eager", "inductor"):
        torch._dynamo.reset()
        backend = make_backend(validate="strict", codegen=codegen)
        torch.testing.assert_close(torch.compile(program, backend=backend)(given), expected)
        torch.testing.assert_close(given, x)
        assert not any(r.extraction.fell_back for r in backend.reports
                       if r.extraction is not None)


def test_a_graph_of_no_tensor_compiles_to_itself():
    """Dynamo hands a backend graphs that compute nothing (``return ()``: M2M100 in
    training, where layer drop skipped a layer's code); extraction had no root to start
    from and raised, so the compile failed."""
    from compiler.compile import make_backend

    empty = torch.fx.symbolic_trace(lambda: ())
    opt = EGraph.from_fx(empty, ()).extract(AstSize(), validate="raise")
    assert opt() == () and not opt.meta["egraph_report"].fell_back
    assert make_backend(validate="raise")(empty, [])() == ()


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_batch_norm_training_steps_update_running_statistics_as_eager(codegen):
    """BatchNorm in training through torch.compile: dynamo's graph updates the step
    counter in place (``num_batches_tracked.add_(1)``) and ``F.batch_norm`` updates the
    running statistics with no mark in its schema. With Inductor's code generation the
    counter's update was refused (every CNN's training step crashed), and the float64
    reference wrote into the caller's counter, so validation then judged the statistics
    changed differently (a fallback). Two steps: outputs, gradients and every buffer as
    eager's, no fallback."""
    import copy

    from compiler.compile import make_backend

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)).train()
    ours, eager = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    backend = make_backend(validate="strict", codegen=codegen)
    compiled = torch.compile(ours, backend=backend)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8)
        out, expected = compiled(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        out.square().mean().backward()
        expected.square().mean().backward()
    for (name, a), b in zip(ours.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    for (name, a), b in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert backend.reports and not any(
        r.extraction.fell_back for r in backend.reports if r.extraction is not None)


def _into_zeros(x):
    y = torch.zeros(3, 4)
    y[1] = x[0]
    return y


def _grid_ids(x):
    """Flux- and HiDream-style position ids: a grid written into a tensor of zeros."""
    ids = torch.zeros(3, 4, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(3)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(4)[None, :]
    return x + ids.sum(-1)


def _masked_write(x):
    y = x * 2
    y[x > 0] = 0.0
    return y + x


def _write_then_shared(x):
    a = x * 2
    a[:, 0] = 1.0
    return a, x * 2  # the same expression, unwritten: must not share the write


_ROWS = torch.tensor([0, 2])


def _index_put_then_shared(x):
    a = x * 2
    a.index_put_((_ROWS,), torch.ones(4))
    return a, x * 2


def _index_fill_then_shared(x):
    a = x * 2
    a.index_fill_(0, _ROWS, 7.0)
    return a + 1, x * 2


def _scatter_then_shared(x):
    a = x * 2
    a.scatter_(1, torch.zeros(3, 1, dtype=torch.long), 5.0)
    return a, x * 2


_TARGETS = torch.tensor([0, 2, 2])


def _scatter_mean(x):
    """PyG's mean aggregation: a sum and a count scattered into new tensors of zeros."""
    index = _TARGETS.view(-1, 1).expand(3, 4)
    total = x.new_zeros((3, 4)).scatter_add_(0, index, x)
    count = x.new_zeros(3).scatter_add_(0, _TARGETS, x.new_ones(3))
    return total / count.clamp(min=1).view(-1, 1)


def _index_add_chain(x):
    """A mixture of experts' combine: each expert's rows added into one tensor of zeros."""
    out = torch.zeros_like(x)
    out.index_add_(0, _TARGETS[:2], x[:2] * 2)
    out.index_add_(0, _TARGETS[2:], x[2:].sin())
    return out


def _two_updates_of_one_zeros(x):
    """Two equal allocations (one class) written differently: each write needs its copy."""
    a = x.new_zeros((3, 4)).index_add_(0, _TARGETS, x)
    b = x.new_zeros((3, 4)).index_add_(0, _TARGETS.flip(0), x)
    return a, b


@pytest.mark.parametrize("program", [
    _into_zeros, _grid_ids, _masked_write, _write_then_shared, _index_put_then_shared,
    _index_fill_then_shared, _scatter_then_shared, _scatter_mean, _index_add_chain,
    _two_updates_of_one_zeros], ids=lambda p: p.__name__)
def test_writes_into_values_the_graph_made(program):
    """``y[i] = v`` into a tensor the graph made (dynamo's ``operator.setitem``) is the
    value ``setitem(y, i, v)``, a new tensor, and later reads of ``y`` read it. It was an
    effect on the value ``y`` had before: with ``torch.zeros`` folded, the program
    returned zeros (HiDream's position ids), and validation passed it. An in-place call
    the vocabulary does not model (``index_put_``, ``scatter_``) updates a copy: it wrote
    into a class that an equal expression shared (wrong with validation off, a fallback
    with it on)."""
    from compiler.compile import make_backend

    x = torch.randn(3, 4)
    expected = program(x)
    # unvalidated (the program itself), validated (no fallback), and under autograd
    for validate, grad in (("off", False), ("strict", False), ("strict", True)):
        torch._dynamo.reset()
        backend = make_backend(validate=validate)
        given = x.clone().requires_grad_(grad)
        torch.testing.assert_close(torch.compile(program, backend=backend)(given), expected)
        assert not any(r.extraction.fell_back for r in backend.reports
                       if r.extraction is not None)


@pytest.mark.parametrize("program, copies", [
    (_scatter_mean, 0), (_index_add_chain, 0), (_two_updates_of_one_zeros, 2),
    (_index_put_then_shared, 1)], ids=lambda p: getattr(p, "__name__", str(p)))
def test_updates_write_into_new_tensors_without_a_copy(program, copies):
    """An in-place update of a new tensor that nothing else reads (PyG's
    ``new_zeros(...).scatter_add_``, a chain of ``index_add_`` into ``zeros_like``) writes
    into it, as the source does: no copy per update. Where the written class is read
    elsewhere (an equal allocation, ``x * 2`` read again), the update writes a copy."""
    from compiler.compile import make_backend

    x = torch.randn(3, 4)
    torch._dynamo.reset()
    backend = make_backend(validate="strict")
    out = torch.compile(program, backend=backend)(x)
    torch.testing.assert_close(out, program(x))
    (compiled,) = backend.cache.values()
    emitted = [n for n in compiled.module.graph.nodes if n.target is torch.clone]
    assert len(emitted) == copies, compiled.module.code


_aten = torch.ops.aten


def _channels_last_into_group_norm(x, w):
    """An aot_autograd forward graph (diffusers' VQModel): a convolution of a permuted
    input made contiguous, then group norm's aten kernel, which reads its input as
    contiguous."""
    p = _aten.permute.default(x, [0, 3, 1, 2])
    c = _aten.clone.default(p, memory_format=torch.contiguous_format)
    y = _aten.convolution.default(c, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return _aten.native_group_norm.default(_aten.view.default(y, [2, 4, 16]), None, None,
                                           2, 4, 16, 2, 1e-6)[0]


def _transposed_into_group_norm_backward(g, x, mean, rstd, w):
    """The backward graph's form: a transposed gradient made contiguous, then group norm's
    backward kernel, which gave other values for the strided one."""
    dy = _aten.clone.default(_aten.transpose.int(g, 1, 2), memory_format=torch.contiguous_format)
    return _aten.native_group_norm_backward.default(dy, x, mean, rstd, w, 2, 4, 8, 2,
                                                    [True, True, True])


def _group_norm_inputs():
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, 8), torch.randn(4)
    _, mean, rstd = _aten.native_group_norm.default(x, w, None, 2, 4, 8, 2, 1e-5)
    return torch.randn(2, 8, 4), x, mean, rstd, w


@pytest.mark.parametrize("program, inputs", [
    (_channels_last_into_group_norm, lambda: (torch.randn(2, 4, 4, 4), torch.randn(4, 4, 1, 1))),
    (_transposed_into_group_norm_backward, _group_norm_inputs)],
    ids=["forward", "backward"])
def test_aten_kernels_get_the_layout_the_source_gave_them(program, inputs):
    """Ingest drops ``clone(memory_format=contiguous_format)`` (it makes a layout, not a
    value), so a functional opaque call got a strided tensor where the source's was
    contiguous: group norm's forward raised and its backward computed other values
    (diffusers' VQModel, UNet3D and SVD training steps fell back). Such an argument is now
    made contiguous where it may not be."""
    xs = inputs()
    expected = program(*xs)
    for validate in ("off", "raise"):
        opt = EGraph.from_fx(torch.fx.symbolic_trace(program), xs).extract(
            AstSize(), validate=validate)
        for got, want in zip(_tuple(opt(*xs)), _tuple(expected)):
            torch.testing.assert_close(got, want)


def _tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


class _ComplexRotary(nn.Module):
    """QwenImage's and Lumina2's rotary embedding: complex frequencies held as a plain
    attribute, which dynamo lifts to a graph input."""

    def __init__(self):
        super().__init__()
        self.freqs = torch.polar(torch.ones(4, 2), torch.randn(4, 2))

    def forward(self, x):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * self.freqs).flatten(-2)


def test_a_complex_graph_input_is_validated_not_a_crash():
    """Validation and the check of other sizes drew random inputs for a complex tensor
    as for integers (``int(x.min())``), which raised out of torch.compile."""
    from compiler.compile import make_backend

    model, x = _ComplexRotary(), torch.randn(2, 4, 4)
    torch._dynamo.reset()
    backend = make_backend(validate="strict")
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
    assert backend.reports and not any(r.extraction.fell_back for r in backend.reports)


def test_a_complex_output_is_judged_on_both_parts_not_a_crash():
    """Ingest raised on a complex scalar (``x * (1 + 2j)``, audio models' ``exp(1j *
    phase)``: it now stays the source's call); validation took a complex output's real
    part alone (a wrong imaginary part passed) and divided by zero where the reference
    was all zeros (``a - a``)."""
    from compiler.validate import relative_errors
    from egraph.rules import load_rules

    def f(x):
        a = x.to(torch.complex64) * (1 + 2j)
        return a - a, a * 2

    x = torch.randn(3)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(f), (x,)).saturate(load_rules("all")).extract(
        AstSize(), validate="raise")
    for ours, eager in zip(opt(x), f(x)):
        torch.testing.assert_close(ours, eager)
    assert not opt.meta["egraph_report"].fell_back
    got, ref = torch.tensor([1 + 2j]), torch.tensor([1 + 1j], dtype=torch.complex128)
    assert relative_errors(got, ref) == (1.0, 1.0)  # the imaginary part's error counts


def _doubles_a_column_of_its_input(x):
    v = x[:, 0]
    v.mul_(2)
    return v + 1


def _adds_through_a_transpose_of_its_input(x):
    x.t().add_(1)
    return x * 1


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
@pytest.mark.parametrize("program", [_doubles_a_column_of_its_input,
                                     _adds_through_a_transpose_of_its_input],
                         ids=lambda p: p.__name__)
def test_an_update_of_an_inputs_view_changes_the_callers_input_once(program, codegen):
    """Through Inductor's code generation, ingest made the update out of place (the
    caller's input never changed), and observing value ranges ran the graph on the
    caller's own tensors: on the first call the input was updated twice and the output
    was wrong. Such graphs are now functionalised first, and ranges are observed on
    copies of inputs a graph writes into."""
    from compiler.compile import make_backend

    x = torch.randn(3, 4)
    given, expected_input = x.clone(), x.clone()
    expected = program(expected_input)
    torch._dynamo.reset()
    backend = make_backend(validate="strict", codegen=codegen)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(program, backend=backend)(given), expected)
    torch.testing.assert_close(given, expected_input)
    assert not any(r.extraction.fell_back for r in backend.reports if r.extraction is not None)


def test_measuring_memory_leaves_the_callers_inputs_as_one_call_does():
    """``make_backend(memory=True)`` ran the source and the optimised program on the
    caller's own tensors to measure their peaks: an input updated in place was updated
    three times by the first call."""
    from compiler.compile import make_backend

    def counts(x):
        x.add_(1)
        return x * 2

    x = torch.zeros(3)
    torch._dynamo.reset()
    backend = make_backend(memory=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(counts, backend=backend)(x), torch.full((3,), 2.0))
    torch.testing.assert_close(x, torch.ones(3))
    assert backend.reports[0].memory["source"] > 0


class _Exported(nn.Module):
    def __init__(self, program):
        super().__init__()
        self.program = program

    def forward(self, x):
        return self.program(x)


@pytest.mark.parametrize("program", [_doubles_a_column_of_its_input,
                                     _adds_through_a_transpose_of_its_input],
                         ids=lambda p: p.__name__)
def test_an_exported_update_of_an_inputs_view_is_written_back(program):
    """torch.export keeps ``x.t().add_(1)`` as an in-place call on a view of the input:
    ingest made it out of place, so the caller's input never changed and later reads of
    ``x`` read the old values (a wrong output that validation passed, since the source
    had changed the very input the optimised program then read). The program is now
    ingested functional, its new input values written back at the end."""
    x = torch.randn(3, 4)
    expected_input = x.clone()
    expected = program(expected_input)
    exported = torch.export.export(_Exported(program), (x.clone(),))
    for validate in ("off", "raise"):
        example, given = x.clone(), x.clone()
        opt = EGraph.from_fx(exported, (example,)).extract(AstSize(), validate=validate)
        torch.testing.assert_close(opt(given), expected)
        torch.testing.assert_close(given, expected_input)
        torch.testing.assert_close(example, x)  # the example inputs are left as they were


def _scaled(x, scale=2.0):
    return (x * scale) * 3.0


def test_an_input_with_a_default_keeps_it():
    """``def f(x, scale=2.0)``, traced and given ``(x,)``: the emitted forward dropped the
    default, so validation's call without ``scale`` raised and every rewrite fell back."""
    x = torch.randn(4)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_scaled), (x,)).saturate(
        load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(x), _scaled(x))
    torch.testing.assert_close(opt(x, 0.5), _scaled(x, 0.5))


def _positive_scale(x, p):
    torch._assert(p > 0, "p must be positive")
    return x * p + 1.0


def test_a_number_passed_as_an_input_is_computed_on_as_a_python_number():
    """A float input compared in Python (``p > 0``) was emitted as ``torch.gt(p, 0)``,
    which takes no two floats: the optimised program raised and fell back."""
    x = torch.randn(4)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_positive_scale), (x, 0.5)).saturate(
        load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(x, 0.25), _positive_scale(x, 0.25))
    with pytest.raises(AssertionError, match="p must be positive"):
        opt(x, -1.0)


class _OptionalMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask=None, scale: float = 0.5):
        scores = self.proj(x) * scale
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)
        return torch.softmax(scores, -1)


def test_a_module_given_fewer_inputs_than_it_takes_runs_with_their_defaults():
    """``EGraph.from_fx(model, (x,))`` for ``forward(self, x, mask=None, scale=0.5)``
    means ``model(x)``: torch.fx traced the ``mask is not None`` branch with a proxy and
    ingest refused the examples ("masked_fill() received ... NoneType"). The left-out
    arguments are traced as their defaults (torch.fx's ``concrete_args``), and one given as
    None as None; passing another value is refused by torch.fx's own check. Given, the
    mask is an input."""
    model = _OptionalMask().eval()
    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g) > 0.5
    opt = _kept(model, (x,))
    torch.testing.assert_close(opt(x), model(x))
    with pytest.raises(AssertionError, match="mask has been specialized"):
        opt(x, mask)
    torch.testing.assert_close(_kept(model, (x, None))(x, None), model(x))
    torch.testing.assert_close(_kept(model, (x, mask))(x, mask), model(x, mask))


def _kept(model: nn.Module, examples: tuple) -> torch.fx.GraphModule:
    """``model`` through the pipeline on ``examples`` under AstSize, with no fallback."""
    opt = EGraph.from_fx(model, examples).saturate(load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    return opt


_HALF, _NO_SHIFT = torch.tensor(0.5), torch.zeros(8)


class _TensorDefault(nn.Module):
    def forward(self, x, scale=_HALF, *, shift=_NO_SHIFT):
        return torch.softmax(x * scale + shift, -1)


def test_arguments_defaulting_to_tensors_are_inputs_when_given_and_constants_when_not():
    """``forward(self, x, scale=torch.tensor(0.5))``: the code torch.fx writes cannot
    spell a tensor default, so tracing failed whatever the examples gave ("name
    '_tensor_constant0' is not defined"), reported as untraceable control flow. Given, the
    argument is an input; left out, its default is a constant of the module, and passing
    another value is refused by name."""
    model = _TensorDefault()
    x, scale = torch.randn(2, 8), torch.tensor(3.0)
    left = _kept(model, (x,))
    torch.testing.assert_close(left(x), model(x))
    with pytest.raises(AssertionError, match="scale was traced as its default tensor"):
        left(x, scale)
    given = _kept(model, (x, scale))
    torch.testing.assert_close(given(x, scale), model(x, scale))
    torch.testing.assert_close(given(x, scale * 2), model(x, scale * 2))


class _KeywordOnly(nn.Module):
    def forward(self, x, *, causal=False, temperature=1.0):
        scores = x @ x.transpose(-1, -2) / temperature
        if causal:
            scores = scores.masked_fill(
                torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1)


def test_keyword_only_arguments_run_with_their_defaults():
    """Keyword-only flags (``causal=False``) are traced as their defaults too, and their
    specialisation checks compare Python bools in Python."""
    x = torch.randn(2, 4, 8)
    opt = EGraph.from_fx(_KeywordOnly(), (x,)).saturate(load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(x), _KeywordOnly()(x))


def _doubled_scaled_mean(x):
    v = torch.log_softmax(x, -2).mean() * 0.1 * 3
    doubled = v + v
    return torch.sqrt(doubled * doubled + 1.0)


@pytest.mark.parametrize("cost", [AstSize(), AstDepth()])
def test_a_sum_of_a_scaled_product_with_itself_is_emitted(cost):
    """``v + v`` with ``v = y * s``: emission's ``add(x, y, alpha=s)`` fusion took the
    product as the scaled term and as the other, then erased it while the fused sum still
    read it, and extraction crashed (fuzzer, seed 99, program 168)."""
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0)) * 3
    opt = EGraph.from_fx(torch.fx.symbolic_trace(_doubled_scaled_mean), (x,)).saturate(
        load_rules("all")).extract(cost)
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(x), _doubled_scaled_mean(x))


class _PlainDefaults(nn.Module):
    def forward(self, x, n: int = 2, flag=True, name="a"):
        return x * n + (1.0 if flag and name == "a" else 2.0)


def test_number_flag_and_name_defaults_are_traced_as_their_values():
    """An int, a bool and a str left out: each specialised, and torch.fx's check of each
    (``name_1 == 'a'``) compared in Python, not with ``torch.eq``."""
    x = torch.randn(2, 3)
    opt = EGraph.from_fx(_PlainDefaults(), (x,)).saturate(load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(x), _PlainDefaults()(x))


class _Stars(nn.Module):
    def forward(self, *xs):
        return xs[0] * 2 + xs[-1]


class _ScaledCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, scale, *xs, flag=False):
        return self.proj(torch.cat(xs, 0)) * (scale if not flag else 1.0)


@pytest.mark.parametrize("model, count, traced", [
    (_Stars(), 2, False), (_Stars(), 2, True), (_Stars(), 3, False), (_Stars(), 3, True),
    (_ScaledCat(), 3, False)])
def test_a_forward_taking_star_inputs_takes_one_input_per_example(model, count, traced):
    """``forward(self, *xs)``: ingest bound the star input to the first example and the
    emitted forward took one argument, so every rewrite fell back. The examples' count is
    specialised, as torch.export does (read by index or whole, ``torch.cat(xs)``), with a
    keyword-only flag after them traced as its default."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 3, generator=g) for _ in range(count)]
    inputs = ((torch.tensor(2.0), *xs) if isinstance(model, _ScaledCat) else tuple(xs))
    source = torch.fx.symbolic_trace(model) if traced else model
    opt = EGraph.from_fx(source, inputs).saturate(load_rules("all")).extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    torch.testing.assert_close(opt(*inputs), source(*inputs))


def test_weights_folded_from_inference_tensors_are_read_as_they_are_now():
    """A model built and exported under ``torch.inference_mode`` has inference tensors for
    weights, which keep no version counter. The projections merged into one (their
    weights concatenated once, then kept) are computed from them again at each call, so
    an update in place is seen, not a crash."""
    from compiler.compile import default_cost
    from egraph.rules import load_rules

    class Projections(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.q(x) * self.k(x)

    with torch.inference_mode():
        model, x = Projections(), torch.randn(4, 8)
        program = torch.export.export(model, (x,))
        opt = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(
            default_cost((x,)))
        report = opt.meta["egraph_report"]
        assert "linear-merge" in report.used and not report.fell_back
        torch.testing.assert_close(opt(x), model(x))
        model.k.weight.mul_(2)
        torch.testing.assert_close(opt(x), model(x))


def test_a_view_that_keeps_contiguity_needs_no_copy_at_the_output():
    """A slice of the first dim (``x[:1]``) or a split along it is contiguous: a value made
    from it is returned as it is, without a ``.contiguous()`` call; a transposed one is
    not, and the output keeps the source's layout."""
    class Views(nn.Module):
        def forward(self, x):
            head, tail = x.split([1, 3])
            return torch.sqrt(x) + x[:1] * 2, head * tail.sum(0), x.t() * 2

    x = torch.rand(4, 5) + 1
    opt = EGraph.from_fx(torch.fx.symbolic_trace(Views()), (x,)).extract(AstSize())
    assert "contiguous" not in opt.code
    for got, want in zip(opt(x), Views()(x)):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_an_elementwise_value_of_split_pieces_is_returned_without_a_copy():
    """A piece of a split along the last dim (a merged projection's query and gate) is
    strided, but its dims keep row-major order, so an elementwise op of it makes a
    contiguous tensor (Qwen2-MoE's output had a needless ``.contiguous()``); a gather
    ``x[index]`` is contiguous too. A piece returned as it is, and an elementwise op of a
    transposed value, keep the source's layout."""
    class Pieces(nn.Module):
        def forward(self, x, index):
            q, gate = x.split([4, 4], -1)
            return (q * torch.sigmoid(gate), x[index] * 2, gate,
                    x.transpose(0, 1) * 2, x[:, ::2] + 1)

    x, index = torch.randn(3, 8), torch.tensor([2, 0])
    opt = EGraph.from_fx(torch.fx.symbolic_trace(Pieces()), (x, index)).extract(AstSize())
    assert opt.code.count("contiguous") == 0, opt.code
    for got, want in zip(opt(x, index), Pieces()(x, index)):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_a_product_of_a_strided_value_is_returned_without_a_copy():
    """A linear layer of a strided value (BERT's pooler: ``tanh(linear(h[:, 0]))``) gives
    a new contiguous tensor: the output needs no ``.contiguous()`` call."""
    class Pooler(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(8, 8)

        def forward(self, h):
            return torch.tanh(self.dense(h[:, 0])), h.transpose(1, 2) @ h

    model, h = Pooler(), torch.randn(2, 5, 8)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (h,)).extract(AstSize())
    assert "contiguous" not in opt.code
    for got, want in zip(opt(h), model(h)):
        torch.testing.assert_close(got, want)
        assert got.is_contiguous()


def test_emitted_calls_name_their_class():
    """Each call of an emitted module names the class whose value it computes
    (``backends.fx.EMITTED_CLASS``), a call the peephole passes fused from two (``x @ w +
    b`` as ``addmm``, ``y + 0.5 * z`` as ``add`` with ``alpha``) the class of its result:
    what a profile of the program attributes each call's time to."""
    from backends.fx import EMITTED_CLASS, build_module
    from egraph.extract import source_program

    def f(x, w, b, z):
        return x @ w + b, x + 0.5 * z

    inputs = (torch.randn(4, 3), torch.randn(3, 5), torch.randn(5), torch.randn(4, 3))
    eg = EGraph.from_fx(torch.fx.symbolic_trace(f), inputs)
    gm = build_module(eg, source_program(eg))
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert [n.target for n in calls] == [torch.addmm, torch.add]
    assert [n.meta[EMITTED_CLASS] for n in calls] == [eg.find(r) for r in eg.roots]
