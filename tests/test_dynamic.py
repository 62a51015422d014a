"""Sizes: dynamic shapes in the torch.compile backend, emitted modules on other batch sizes,
the backend's registration, and example inputs that do not fit the model."""

import copy
import io
import logging
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from backends.sizes import SizeMismatch
from compiler.compile import hinted_inputs, make_backend
from egraph import AstSize, EGraph, rewrite
from egraph.dims import Size
from egraph.examples.zoo import build
from egraph.rules import load_rules
from egraph.term import literal
from frontends.fx import InputMismatch

# -- models ---------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A transformer block written as nanoGPT writes it (causal self-attention)."""

    def __init__(self, n_embd=16, n_head=2, block_size=16):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def attn(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class HFAttention(nn.Module):
    """Head split as Hugging Face writes it (``view(*x.shape[:-1], nh, hd)``)."""

    def __init__(self, hidden=16, n_head=2):
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.n_head, self.head_dim = n_head, hidden // n_head

    def forward(self, x):
        input_shape = x.shape[:-1]
        q = self.q_proj(x).view(*input_shape, self.n_head, self.head_dim).transpose(1, 2)
        att = torch.softmax(q @ q.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        y = (att @ q).transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.o_proj(y)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, idx):
        return F.log_softmax(self.head(self.emb(idx)), dim=-1)


def _input(name, batch, length):
    if name == "mlp":
        return torch.randn(batch, 8)
    if name == "embed":
        return torch.randint(0, 10, (batch, length))
    return torch.randn(batch, length, 16)


MAKERS = {"mlp": MLP, "block": Block, "hf": HFAttention, "embed": Embed}


def _check_train_step(model, reference, compiled, x):
    out, expected = compiled(x), reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    model.zero_grad()
    reference.zero_grad()


# -- 1. the compile backend with dynamic shapes -----------------------------------------------


@pytest.mark.parametrize("name", list(MAKERS))
def test_dynamic_true_compiles_once_and_trains_like_eager(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MAKERS[name]()
    reference = copy.deepcopy(model)
    backend = make_backend(rules=load_rules("all"), validate="raise", iter_limit=4)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch, length in [(2, 5), (3, 7), (5, 6)]:  # (sizes 0 and 1 are specialised)
        _check_train_step(model, reference, compiled, _input(name, batch, length))
    # one graph of each kind (run under autograd, or aot_autograd's forward and backward)
    # serves every size: nothing was specialised
    assert len({key[0] for key in backend.cache}) == len(backend.cache)
    for key, fn in backend.cache.items():
        hash(key)
        assert "'s" in repr(key[-1])  # symbolic sizes count by their expression
        report = fn.module.meta["egraph_report"]
        assert report.validation.ok and not report.fell_back


def test_automatic_dynamic_after_a_batch_change():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    backend = make_backend()
    compiled = torch.compile(model, backend=backend)
    for batch, length in [(2, 5), (3, 5), (4, 5)]:
        _check_train_step(model, reference, compiled, _input("block", batch, length))
    # a static compile, then one recompile with a dynamic batch (each a graph autograd
    # runs as emitted)
    assert len(backend.cache) == 2
    for batch, length in [(5, 7), (2, 6)]:
        _check_train_step(model, reference, compiled, _input("block", batch, length))
    assert len(backend.cache) == 3  # and one more once the length changes too


def test_a_size_met_again_gets_the_rewrites_of_a_static_compile(monkeypatch):
    """Dynamo recompiles for a second sequence length with symbolic sizes; the analysis
    carries them as expressions, so the attention's fusion fires there too. A size met a
    second time gets its own program, compiled from the graph at that size (sizes are
    constants there, and rules that need a size's value apply): the rewrites of the
    first, static compile, with eager's outputs and gradients; past ``SPECIALISED_SIZES``
    sizes the symbolic program serves."""
    import compiler.specialise

    monkeypatch.setattr(compiler.specialise, "SPECIALISED_SIZES", 2)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    for length in (5, 7, 7, 6, 6, 4, 4, 7):
        _check_train_step(model, reference, compiled, _input("block", 2, length))
    static, general, *specialised = backend.reports
    assert "sdpa-causal-checked" in static.extraction.used
    assert "sdpa-causal-checked" in general.extraction.used
    assert [r.name.split("=")[-1] for r in specialised] == ["7", "6"]  # (4: past the limit)
    for report in specialised:
        assert report.extraction.used == static.extraction.used
        assert report.extraction.validation.ok and not report.extraction.fell_back


class _Positions(nn.Module):
    """BERT's embeddings: positions read from a buffer sliced to the sequence length."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(50, 16), nn.Embedding(64, 16)
        self.register_buffer("position_ids", torch.arange(64)[None], persistent=False)

    def forward(self, ids):
        return self.tokens(ids) + self.positions(self.position_ids[:, :ids.shape[1]])


def test_a_program_specialised_for_a_size_folds_what_that_size_makes_constant():
    """At the size a specialised program is for, dynamo's size input is the example's
    number, which the guards hold: the positions a buffer sliced to that length gives are
    folded once, as in a static compile, not sliced and looked up on every call."""
    torch._dynamo.reset()
    model = _Positions().eval()
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for length in (5, 7, 7, 7):
            ids = torch.randint(0, 50, (2, length))
            torch.testing.assert_close(compiled(ids), model(ids))
        torch._dynamo.reset()
        static = make_backend(validate="raise")
        torch.compile(copy.deepcopy(model), backend=static, dynamic=False)(ids)
    specialised = backend.reports[-1]
    assert specialised.name.endswith("=7")
    assert specialised.extraction.nodes_after == static.reports[0].extraction.nodes_after
    assert specialised.extraction.cost_after == static.reports[0].extraction.cost_after


class _UpdatedInPlace(nn.Module):
    def forward(self, x):
        h = x * 2
        h.add_(1)  # its result unused: h is read by name
        B, T, C = h.shape
        return h.view(B * T, C).sum(-1) + T


def test_a_program_specialised_for_a_size_keeps_in_place_updates():
    torch._dynamo.reset()
    model = _UpdatedInPlace()
    backend = make_backend(validate="raise")
    compiled = torch.compile(model, backend=backend)
    for length in (5, 7, 7, 7):
        x = torch.randn(2, length, 4)
        torch.testing.assert_close(compiled(x), model(x))
    assert [r.name.split("=")[-1] for r in backend.reports[2:]] == ["7"]


def _aot_graphs(model, x):
    """The forward graphs (and example inputs) aot_autograd hands a backend, dynamic."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return make_boxed_func(gm)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=keep), dynamic=True)(x)
    return graphs


def test_symint_inputs_stay_symbolic_scalars_the_program_reads():
    model = Block()
    (gm, example_inputs), = _aot_graphs(model, torch.randn(2, 5, 16))
    symbolic = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.SymInt)]
    assert symbolic
    eg = EGraph.from_fx(gm, hinted_inputs(example_inputs), observe=False)
    for i in symbolic:
        cid = eg.fx.input_classes[i]
        meta = eg.data(cid)
        assert meta.kind == "scalar" and isinstance(meta.value, Size) and meta.from_size
        assert all(n.op == "input" for n in eg.nodes(cid))  # never unioned with a literal
    opt = eg.extract(AstSize())
    names = [eg.fx.inputs[i] for i in symbolic]
    assert any(f"({names[0]}, " in line for line in opt.code.splitlines()
               if "reshape" in line)  # the batch is read from the SymInt input
    # the same module serves another batch size: SymInts 3 and 7 with tensors to match
    (gm_other, other), = _aot_graphs(model, torch.randn(3, 7, 16))
    assert gm_other.code == gm.code
    inputs = hinted_inputs(other)
    assert [x for x in inputs if type(x) is int][:2] == [3, 7]
    torch.testing.assert_close(opt(*inputs), gm(*inputs))


def test_hinted_inputs_are_real_values_of_the_hinted_sizes():
    (gm, example_inputs), = _aot_graphs(MLP(), torch.randn(3, 8))
    inputs = hinted_inputs(example_inputs)
    assert any(isinstance(x, torch.SymInt) for x in example_inputs)
    for fake, real in zip(example_inputs, inputs):
        if isinstance(fake, torch.SymInt):
            assert real == 3 and type(real) is int
        else:
            assert type(real) is torch.Tensor and real.dtype == fake.dtype
            assert real.shape == tuple(3 if isinstance(s, torch.SymInt) else s
                                       for s in fake.shape)


# -- 2. emitted modules on other batch sizes ----------------------------------------------------


class Spellings(nn.Module):
    """Sizes spelled the ways real code spells them."""

    def __init__(self):
        super().__init__()
        self.nh = 2

    def forward(self, x):
        B, T, C = x.size()
        a = x.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        b = x.view(x.shape[0], T, self.nh, -1).transpose(1, 2)
        c = x.view(x.shape[:-1] + (self.nh, x.size(-1) // self.nh)).transpose(1, 2)
        flat = x.reshape(x.size(0), -1)
        wide = x[:, :1].expand(x.shape[0], T, x.size(-1))
        mask = torch.ones((T, T)).tril() + torch.arange(T)
        zeros = torch.zeros((x.size(0), 1, 3)) + torch.full((1, T, 1), 2.0)
        return a + b + c, flat, wide + x, mask, zeros


@pytest.mark.parametrize("rules", [False, True])
def test_emitted_module_runs_on_other_sizes_for_every_spelling(rules):
    model = Spellings()
    eg = EGraph.from_fx(model, (torch.randn(2, 3, 4),))
    if rules:
        eg.saturate(load_rules("all"), iter_limit=6, node_limit=20_000)
    opt = eg.extract(AstSize(), validate="raise")
    for shape in [(1, 3, 4), (4, 5, 6), (3, 2, 8)]:
        x = torch.randn(shape)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want)
    assert "try:" not in opt.code  # no literal sizes held: nothing to explain


@pytest.mark.parametrize("name", ["gpt_block", "gpt", "naive_transformer"])
def test_zoo_transformers_run_on_other_batch_and_sequence_lengths(name):
    model, (x,) = build(name)
    eg = EGraph.from_fx(model, (x,)).saturate(load_rules("all"), iter_limit=6,
                                               node_limit=50_000)
    opt = eg.extract(AstSize())
    assert not opt.meta["egraph_report"].fell_back
    for batch, length in [(1, 16), (4, 16), (3, 8)]:
        y = (torch.randint(0, 512, (batch, length)) if not x.is_floating_point()
             else torch.randn(batch, length, x.shape[-1]))
        with torch.no_grad():
            torch.testing.assert_close(opt(y), model(y), rtol=1e-4, atol=1e-4)


def test_demo_still_fuses_and_runs_on_other_batch_sizes():
    model, inputs = build("naive_transformer")
    eg = EGraph.from_fx(model, inputs).saturate(load_rules("all"), iter_limit=8,
                                                 node_limit=100_000, time_limit=60.0)
    opt = eg.extract(AstSize())
    called = {getattr(n.target, "__name__", "") for n in opt.graph.nodes}
    assert {"layer_norm", "scaled_dot_product_attention", "gelu"} <= called
    for batch in (1, 4):
        y = torch.randn(batch, 16, 64)
        with torch.no_grad():
            torch.testing.assert_close(opt(y), model(y), rtol=1e-4, atol=1e-4)


def test_sizes_keep_their_values_for_the_analysis_but_not_as_literals():
    gm = torch.fx.symbolic_trace(lambda x: x.view(x.size(0), 2, -1) * x.size(-1))
    eg = EGraph.from_fx(gm, (torch.randn(3, 8),))
    sizes = [c for c in eg.classes() if any(n.op == "size" for n in eg.nodes(c))]
    assert {eg.data(c).value for c in sizes} == {3, 8}
    for c in sizes:
        assert eg.data(c).from_size
        assert not any(n.op != "size" for n in eg.nodes(c))  # no literal in the class
    # the same operation still hashes the same
    gm2 = torch.fx.symbolic_trace(lambda x: x.view(x.size(0), 2, -1) + x.view(x.size(0), 2, -1))
    eg2 = EGraph.from_fx(gm2, (torch.randn(3, 8),))
    assert sum(1 for c in eg2.classes() for n in eg2.nodes(c) if n.op == "reshape") == 1


def test_an_export_program_with_dynamic_dims_reads_its_sizes():
    model = HFAttention()
    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}}
    program = torch.export.export(model, (torch.randn(2, 5, 16),), dynamic_shapes=dims)
    opt = EGraph.from_fx(program).extract(AstSize())
    assert "sym_size" not in opt.code and ".size(0)" in opt.code
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(opt(x), model(x))


class _BranchOnSizes(nn.Module):
    """A branch on sizes, taken once at export (as models that pick a path by sequence
    length do): other sizes would take the other branch in eager."""

    def forward(self, x, y):
        if x.shape[0] > y.shape[0]:
            return x.sum(0) * 2 + y.sum()
        return x.sum(0) * 3 - y.sum()


_EXPORTS = {
    "static": None,
    "bounded": {"x": {0: torch.export.Dim("n", min=3, max=16)}, "y": None},
    "related": {"x": {0: torch.export.Dim.AUTO}, "y": {0: torch.export.Dim.AUTO}},
}


@pytest.mark.parametrize("shapes", list(_EXPORTS))
@pytest.mark.parametrize("unlifted", [False, True], ids=["program", "module"])
def test_a_module_emitted_from_an_export_refuses_inputs_the_export_does_not_cover(
        shapes, unlifted):
    model = _BranchOnSizes()
    program = torch.export.export(model, (torch.randn(5, 4), torch.randn(2)),
                                  dynamic_shapes=_EXPORTS[shapes])
    source = program.module() if unlifted else program
    opt = EGraph.from_fx(source).saturate(load_rules("all")).extract(AstSize())
    covered = (torch.randn(5, 4), torch.randn(2))
    if shapes != "static":
        covered = (torch.randn(7, 4), torch.randn(2))
    torch.testing.assert_close(opt(*covered), model(*covered))
    # the other branch in eager: the exported program does not apply, so neither may ours
    other = (torch.randn(1, 4), torch.randn(2))
    with pytest.raises(SizeMismatch) as info:
        opt(*other)
    assert "x.size()[0]" in str(info.value) and "(1, 4)" in str(info.value)
    with pytest.raises(AssertionError):
        program.module()(*other)  # as torch's own module refuses them
    with pytest.raises(SizeMismatch, match=r"x.dim\(\) == 2"):  # before reading its sizes
        opt(torch.randn(5, 4, 1), torch.randn(2))
    if shapes == "related":  # a relation export's tracer assumed, not a size of its own
        with pytest.raises(SizeMismatch, match=r"x.size\(\)\[0\] > y.size\(\)\[0\]"):
            opt(torch.randn(3, 4), torch.randn(4))


@st.composite
def _exports(draw):
    """A program branching on its sizes, exported with each size static, a bounded or
    an automatic ``Dim``, or one ``Dim`` for both inputs, and the sizes of a later call."""
    n, m = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    kinds = ("static", "bounded", "auto")
    kind_x = draw(st.sampled_from(kinds))
    kind_y = draw(st.sampled_from(kinds + (("shared",) if kind_x == "bounded" else ())))
    if kind_y == "shared":
        m = n
    low, high = draw(st.integers(2, n)), draw(st.integers(n + 1, 9))
    bounded = torch.export.Dim("n", min=low, max=high)
    spec = {"static": None, "bounded": bounded, "auto": torch.export.Dim.AUTO,
            "shared": bounded}
    shapes = {"x": None if kind_x == "static" else {0: spec[kind_x]},
              "y": None if kind_y == "static" else {0: spec[kind_y]}}
    call = (draw(st.integers(1, 10)), 4), (draw(st.integers(1, 10)),)
    return (n, m), shapes, call


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_exports(), st.booleans())
def test_a_module_emitted_from_an_export_refuses_exactly_what_torchs_module_refuses(
        export, unlifted):
    (n, m), shapes, (x_shape, y_shape) = export
    model = _BranchOnSizes()
    try:
        program = torch.export.export(model, (torch.randn(n, 4), torch.randn(m)),
                                      dynamic_shapes=shapes)
    except Exception:  # noqa: BLE001 - a Dim the branch contradicts: torch refuses it
        reject()
    source = program.module() if unlifted else program
    opt = EGraph.from_fx(source).saturate(load_rules("all")).extract(AstSize())
    x, y = torch.randn(x_shape), torch.randn(y_shape)
    try:
        want = program.module()(x, y)
    except AssertionError:  # torch's guard
        with pytest.raises(SizeMismatch):
            opt(x, y)
        return
    torch.testing.assert_close(opt(x, y), want)


def test_a_module_emitted_from_an_unlifted_export_can_be_saved(saved_and_loaded):
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    unlifted = torch.export.export(model, (x,)).module()
    with pytest.raises(Exception, match="pickle"):
        torch.save(unlifted, io.BytesIO())  # torch's check of the inputs cannot be pickled
    opt = EGraph.from_fx(unlifted).saturate(load_rules("all")).extract(AstSize())
    loaded = saved_and_loaded(opt)
    torch.testing.assert_close(loaded(x), model(x))
    with pytest.raises(SizeMismatch):
        loaded(torch.randn(2, 4))  # the loaded module still checks its inputs


class _Structured(nn.Module):
    def forward(self, d, scale: float = 2.0):
        return d["a"].relu() * scale + d["b"][0] * d["b"][1]


@pytest.mark.parametrize("unlifted", [False, True], ids=["program", "module"])
def test_a_module_emitted_from_an_export_of_structured_inputs_takes_them_as_the_source_does(
        unlifted, saved_and_loaded):
    a, b, c = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    model = _Structured()
    program = torch.export.export(model, ({"a": a, "b": [b, c]},))
    source, examples = (program.module(), ({"a": a, "b": [b, c]},)) if unlifted else (
        program, None)  # (the program's own examples, or the user's, as the module takes them)
    opt = EGraph.from_fx(source, examples).saturate(load_rules("all")).extract(AstSize())
    assert opt.meta["egraph_report"].validation.ok  # validated on the examples' leaves
    x = {"a": torch.randn(3, 4), "b": [torch.randn(3, 4), torch.randn(3, 4)]}
    torch.testing.assert_close(opt(x), model(x))
    torch.testing.assert_close(saved_and_loaded(opt)(x), model(x))
    with pytest.raises(SizeMismatch, match="d_a"):
        opt({"a": torch.randn(2, 4), "b": [torch.randn(2, 4), torch.randn(2, 4)]})
    # a program validation refuses falls back to one that takes them too
    eg = EGraph.from_fx(source, examples).saturate([rewrite("wrong", "(relu ?x)", "?x")])
    with pytest.warns(UserWarning, match="returning the original"):
        fallback = eg.extract(AstSize())
    torch.testing.assert_close(fallback(x), model(x))


def test_an_unlifted_export_by_keywords_is_validated_on_examples_given_in_order():
    """torch's module of a program exported with keywords refuses positional calls
    (``model(input_ids=..., attention_mask=None)``, as transformers models are called):
    validation runs its graph on the examples, so it is validated, not refused."""

    class Masked(nn.Module):
        def forward(self, input_ids, attention_mask=None):
            scores = input_ids.softmax(-1)
            return scores if attention_mask is None else scores * attention_mask

    x = torch.randn(2, 5)
    unlifted = torch.export.export(Masked(), (), {"input_ids": x, "attention_mask": None}
                                   ).module()
    opt = EGraph.from_fx(unlifted, (x, None)).saturate(load_rules("all")).extract(AstSize())
    assert opt.meta["egraph_report"].validation.ok
    torch.testing.assert_close(opt(input_ids=x, attention_mask=None), x.softmax(-1))


def _baking_rule():
    """A rule whose right side builds a literal shape from the example's sizes."""
    def bake(egraph, subst):
        first = egraph.data(subst["s"]).value[0]
        rest = math.prod(egraph.data(subst["x"]).shape) // first
        return egraph.add_node("reshape", [subst["x"], egraph.add_node(literal((first, rest)))])

    return rewrite("bake-shape", "(reshape ?x ?s)", bake)


def _counting_rule():
    """A rule that bakes a count: a sum over a broadcast dim as x times its length."""
    def count(egraph, subst):
        length = float(egraph.data(subst["s"]).value[0])
        return egraph.add_node("mul", [subst["x"], egraph.add_node(literal(length))])

    return rewrite("bake-count", "(sum (expand ?x ?s) ?d #bool:true)", count)


def test_a_baked_size_runs_the_source_at_other_sizes_or_fails_with_a_clear_error(
        saved_and_loaded):
    """A target shape a rule baked (``reshape(x, (2, 12))``): validated, the module is
    specialised for that size and runs the source's program at others; unvalidated
    (nothing probed its sizes), it explains torch's error at other sizes by naming the
    input and the size it was built for."""
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x.reshape(x.size(0), -1)))
    before = gm.code
    x, other = torch.randn(2, 3, 4), torch.randn(3, 3, 4)
    opt = EGraph.from_fx(gm, (x,)).saturate([_baking_rule()], iter_limit=2).extract(AstSize())
    assert "(2, 12)" in opt.code and opt.meta["egraph_report"].general
    for module in (opt, copy.deepcopy(opt), saved_and_loaded(opt)):
        torch.testing.assert_close(module(x), gm(x))
        torch.testing.assert_close(module(other), gm(other))
    opt = EGraph.from_fx(gm, (x,)).saturate([_baking_rule()], iter_limit=2).extract(
        AstSize(), validate="off")
    torch.testing.assert_close(opt(x), gm(x))  # the size it was built for still runs
    with pytest.raises(SizeMismatch) as info:
        opt(other)
    message = str(info.value)
    assert "'x'" in message and "(3, 3, 4)" in message and "(2, 3, 4)" in message
    assert isinstance(info.value, RuntimeError)  # what callers catching torch's see
    with pytest.raises(SizeMismatch):
        copy.deepcopy(opt)(torch.randn(4, 3, 4))
    with pytest.raises(SizeMismatch) as loaded:  # saved, the module explains the same
        saved_and_loaded(opt)(other)
    assert str(loaded.value) == message
    assert "reshape to (2, 12)" in message and "invalid for input of size 36" in message
    assert gm.code == before  # the user's graph is untouched


def test_a_number_a_rule_computed_from_a_size_specialises_the_module_for_that_size(
        saved_and_loaded):
    """A rule that bakes the example's size into the program (a sum over a broadcast dim
    as a product with its length) gives a program right at that size only: the module
    runs it there, and at other sizes the source's program, captured with its sizes
    symbolic; it once refused them (7% of the fuzzer's programs refused a second batch
    size the source runs at). Saved and loaded, copied, its state dict the source's."""
    rule = _counting_rule()
    gm = torch.fx.symbolic_trace(lambda x: x[:1].expand(x.size(0), 4).sum(0, keepdim=True))
    opt = EGraph.from_fx(gm, (torch.randn(2, 4),)).saturate([rule], iter_limit=2).extract(
        AstSize())
    report = opt.meta["egraph_report"]
    assert report.rewrites == {"bake-count": 1} and report.built_for == {"x": {0: 2}}
    assert report.general and "specialised for the example's sizes x dim 0 = 2" in str(report)
    assert "egraph_general" not in opt.meta  # captured when first needed, not before
    x, y = torch.randn(2, 4), torch.randn(5, 4)
    for module in (opt, saved_and_loaded(opt), copy.deepcopy(opt)):
        torch.testing.assert_close(module(x), gm(x))
        torch.testing.assert_close(module(y), gm(y))  # not a silently wrong result
    assert list(opt.state_dict()) == list(gm.state_dict())
    assert opt.meta["egraph_general"] is not None
    refusing = EGraph.from_fx(gm, (x,)).saturate([rule], iter_limit=2).extract(
        AstSize(), other_sizes="refuse")
    torch.testing.assert_close(refusing(x), gm(x))
    with pytest.raises(SizeMismatch, match=r"'x' has shape \(5, 4\).*built for \(2, 4\)"):
        refusing(y)  # not a silently wrong result
    # a sum the source computes from the input's size needs no such check
    plain = EGraph.from_fx(gm, (torch.randn(2, 4),)).extract(AstSize())
    assert plain.meta["egraph_report"].built_for == {}
    torch.testing.assert_close(plain(y), gm(y))


def test_a_condition_that_held_only_for_the_example_size_is_caught():
    """Expand to the batch is no expand for a batch of 1: true of the example only. An
    example of batch 1 still gives a module that runs at every batch size."""
    rule = rewrite("drop-expand", "(expand ?x ?s)", "?x",
                   when=lambda eg, s: eg.data(s["x"]).shape == eg.data(s["s"]).value)
    gm = torch.fx.symbolic_trace(lambda x: x[:1].expand(x.size(0), 4).sum(0) + x.sum(0))
    opt = EGraph.from_fx(gm, (torch.randn(1, 4),)).saturate([rule], iter_limit=2).extract(
        AstSize())
    assert "expand" not in opt.code and opt.meta["egraph_report"].built_for == {"x": {0: 1}}
    for rows in (1, 5, 2):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(opt(x), gm(x))


def test_the_general_program_reads_the_modules_state_as_it_is_now():
    """The program a specialised module runs at other sizes reads the module's own
    parameters and buffers: a checkpoint loaded into it, or a buffer replaced, is seen
    at every size."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))
            self.register_buffer("b", torch.randn(4))

        def forward(self, x):
            return x[:1].expand(x.size(0), 4).sum(0, keepdim=True) * self.w + self.b

    rule = _counting_rule()
    model = Scaled()
    opt = EGraph.from_fx(model, (torch.randn(2, 4),)).saturate([rule], iter_limit=2).extract(
        AstSize())
    assert opt.meta["egraph_report"].general
    other = Scaled()
    opt.load_state_dict(other.state_dict())
    opt.b = torch.full((4,), 3.0)
    other.b = torch.full((4,), 3.0)
    for rows in (2, 6):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(opt(x), other(x))
    assert not torch.equal(model.b, other.b)  # the user's model is untouched


def test_dynamic_true_keeps_every_input_size_symbolic():
    """``EGraph.from_fx(..., dynamic=True)``: a shape written with ``-1`` stays so, and
    the program extracted runs at every batch size with no specialisation."""
    def f(x, y):
        return (x * 2 + 0.5).reshape(-1, 2, 3), (y.softmax(-1) * y.shape[0]).sum(0)

    gm = torch.fx.symbolic_trace(f)
    example = (torch.randn(2, 6), torch.randn(3, 5))
    opt = EGraph.from_fx(gm, example, dynamic=True).saturate(load_rules("all")).extract(
        AstSize())
    assert opt.meta["egraph_report"].built_for == {} and "(2, 2, 3)" not in opt.code
    for rows in (2, 7, 11):
        xs = (torch.randn(rows, 6), torch.randn(rows + 1, 5))
        for got, want in zip(opt(*xs), f(*xs)):
            torch.testing.assert_close(got, want)


def test_dynamic_names_the_input_dim_or_range_it_cannot_use():
    from frontends.fx.exported import SizeConstraintError

    gm = torch.fx.symbolic_trace(lambda x: x.reshape(-1, 2, 3))
    with pytest.raises(SizeConstraintError, match=r"names 'y', which is not an input.*: x"):
        EGraph.from_fx(gm, (torch.randn(2, 6),), dynamic={"y": {0: (2, 8)}})
    with pytest.raises(SizeConstraintError, match="dim 2 of input 'x', which has 2 dims"):
        EGraph.from_fx(gm, (torch.randn(2, 6),), dynamic={"x": {2: (2, 8)}})
    with pytest.raises(SizeConstraintError,  # the code fixes dim 1
                       match=r"cannot vary.*input 'x' dim 1 as dynamic but your code "
                             r"specialized it to be a constant \(6\)"):
        EGraph.from_fx(torch.fx.symbolic_trace(lambda x: x.view(x.size(0), 2, 3)),
                       (torch.randn(2, 6),), dynamic={"x": {1: (2, 64)}})
    with pytest.raises(SizeConstraintError, match=r"2 not in range \[8, 64\]"):  # the example
        EGraph.from_fx(gm, (torch.randn(2, 6),), dynamic={"x": {0: (8, 64)}})
    opt = EGraph.from_fx(gm, (torch.randn(2, 6),), dynamic={"x": {0: (2, 64)}}).extract(
        AstSize())
    assert opt(torch.randn(9, 6)).shape == (9, 2, 3)


def test_ingest_leaves_the_users_graph_as_it_was():
    gm = torch.fx.symbolic_trace(lambda x: torch.exp(x).sum(-1))
    metas = {n.name: dict(n.meta) for n in gm.graph.nodes}
    EGraph.from_fx(gm, (torch.randn(3, 4),)).extract(AstSize())
    assert {n.name: dict(n.meta) for n in gm.graph.nodes} == metas


_MISFIT_PROBE = """
import torch
from compiler.sizes import runs_on
from egraph import EGraph

def norm(x, mean, var):
    out = torch.ops.aten._native_batch_norm_legit_functional.default(
        x, None, None, mean, var, True, 0.1, 1e-5)
    return out[0] * 2

stats = (torch.zeros(4), torch.ones(4))
src = EGraph.from_fx(torch.fx.symbolic_trace(norm), (torch.randn(2, 4, 3, 3), *stats)).fx
print(runs_on(src, (torch.randn(2, 4, 3, 3), *stats)),
      runs_on(src, (torch.randn(2, 6, 3, 3), *stats)))
"""


def test_a_size_probe_never_runs_a_kernel_on_sizes_that_do_not_fit_together():
    """The probe of other sizes resizes each input's dims, one by one where the source
    refuses them together: an aot graph's convolution weight alone, its batch norm's
    running statistics left at the old channel count. aten's functional batch norm on
    the CPU reads those past their end and crashed the process (ResNet's forward in
    training, validated). Probes check a batch norm's sizes as its meta kernel does. Run
    in a process of its own: a regression may crash it."""
    result = subprocess.run([sys.executable, "-c", _MISFIT_PROBE], capture_output=True,
                            text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["True", "False"], result.stdout


# -- 3. the backend's registration, in a fresh process ------------------------------------------

_COMPILE = ("m = torch.nn.Linear(4, 4); x = torch.randn(2, 4); "
            "assert torch.allclose(torch.compile(m, backend='egraph')(x), m(x)); ")


@pytest.mark.parametrize("code", [
    "import torch; " + _COMPILE,
    "import torch; import compiler.compile; " + _COMPILE,
    "import torch; " + _COMPILE + "import compiler.compile; torch._dynamo.reset(); " + _COMPILE,
    "import torch; from compiler.compile import egraph_backend; torch._dynamo.list_backends(); "
    + _COMPILE,
    # where no entry point is installed, importing the module registers the name
    "import importlib.metadata as md; orig = md.entry_points; "
    "md.entry_points = lambda **kw: md.EntryPoints(()) "
    "if kw.get('group') == 'torch_dynamo_backends' else orig(**kw); "
    "import torch; import compiler.compile; " + _COMPILE,
], ids=["compile-only", "import-then-compile", "compile-then-import", "listed-first",
        "no-entry-point"])
def test_backend_name_works_in_a_fresh_process_in_any_order(code, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code + "print('ok')"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]
    assert "duplicate name" not in result.stderr


# -- 4. example inputs that do not fit the model ------------------------------------------------


def test_inputs_of_the_wrong_shape_are_refused_clearly(caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InputMismatch) as info:
        EGraph.from_fx(nn.Linear(4, 4), (torch.randn(3, 5),))
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "'input'" in message and "(3, 5)" in message
    assert "linear" in message and "3x5 and 4x4" in message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in capfd.readouterr().err


def test_the_first_op_that_rejects_the_inputs_is_named():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(6, 2))
    with pytest.raises(InputMismatch) as info:
        EGraph.from_fx(model, (torch.randn(3, 4),))
    assert "module '2'" in str(info.value) and "(3, 4)" in str(info.value)
    gm = torch.fx.symbolic_trace(lambda x, y, z: (x @ y, z.exp()))
    with pytest.raises(InputMismatch) as info:
        EGraph.from_fx(gm, (torch.randn(2, 3), torch.randn(4, 5), torch.randn(2)))
    assert "'x'" in str(info.value) and "'y'" in str(info.value)
    assert "'z'" not in str(info.value)  # z does not flow into the matmul
    with pytest.raises(InputMismatch, match="int64|Long"):
        EGraph.from_fx(nn.Embedding(10, 4), (torch.randn(3),))


def test_a_wrong_number_of_inputs_is_refused_clearly():
    with pytest.raises(InputMismatch, match=r"takes 1 input \(input\), but 2 example inputs"):
        EGraph.from_fx(nn.Linear(4, 4), (torch.randn(3, 4), torch.randn(3, 4)))
    with pytest.raises(InputMismatch, match="but 0 example inputs"):
        EGraph.from_fx(nn.Linear(4, 4), ())

    class WithDefault(nn.Module):
        def forward(self, x, scale=2.0):
            return x * scale

    EGraph.from_fx(WithDefault(), (torch.randn(3),))  # defaults may be left out
    with pytest.raises(InputMismatch, match="takes 1 to 2 inputs"):
        EGraph.from_fx(WithDefault(), (torch.randn(3), 2.0, 3.0))


def test_ops_fake_tensors_cannot_run_leave_shapes_unknown_without_error(caplog):
    caplog.set_level(logging.DEBUG)
    gm = torch.fx.symbolic_trace(lambda x: torch.nonzero(x > 0).float().sum() + x)
    opt = EGraph.from_fx(gm, (torch.randn(5),)).extract(AstSize())
    x = torch.randn(5)
    torch.testing.assert_close(opt(x), gm(x))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_size_arithmetic_on_a_symbolic_input_stays_python_arithmetic():
    """At a second sequence length dynamo hands the backend the length as a SymInt input
    (Mixtral's routing computes ``arange(0, T * top_k)`` from it). The product is size
    arithmetic: emitted as ``torch.mul`` it was a tensor, which Inductor's code generation
    refused (a data-dependent ``arange``), so dynamo broke the graph."""
    from compiler.compile import capture

    class Routed(nn.Module):
        def forward(self, x):
            order = torch.arange(0, x.shape[1] * 4).view(1, -1)
            return x.repeat(1, 4) * 2 + order

    model = Routed()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(codegen="inductor"))
    with capture() as seen:
        for length in (6, 9):
            x = torch.randn(2, length)
            torch.testing.assert_close(compiled(x), model(x))
    assert [b.reason for b in seen.graph_breaks] == []
    assert len(seen.reports) == 2  # the second length compiled as a dynamic graph


WHOLE_SHAPES = {
    "zeros(size)": lambda x, y: torch.zeros(y.size()) + y,
    "ones(shape, dtype)": lambda x, y: torch.ones(y.shape, dtype=y.dtype) * y,
    "zeros(*shape)": lambda x, y: torch.zeros(*y.shape) + y,
    "full(size)": lambda x, y: torch.full(y.size(), 2.0) * y,
    "empty(size).fill_": lambda x, y: torch.empty(y.size()).fill_(1.5) + y,
    "new_zeros(size)": lambda x, y: y.new_zeros(y.size()) + y,
    "new_full(size)": lambda x, y: y.new_full(y.size(), 3.0) + y,
    "view(size)": lambda x, y: x.view(y.size()) + 1,
    "view(shape)": lambda x, y: x.view(y.shape) * 2,
    "reshape(*size)": lambda x, y: x.reshape(*y.size()) + 1,
    "view(size[:-1] + (-1,))": lambda x, y: x.view(y.size()[:-1] + (-1,)) + 1,
    "expand(size)": lambda x, y: x[:, :1].expand(y.size()) + y,
    "zeros(size + (4,))": lambda x, y: torch.zeros(y.size() + (4,)) + y.unsqueeze(-1),
    "ones(*size, 4)": lambda x, y: torch.ones(*y.size(), 4) + y.unsqueeze(-1),
}


@pytest.mark.parametrize("spelling", WHOLE_SHAPES)
def test_a_whole_symbolic_size_is_one_shape_value(spelling):
    """Under dynamic shapes ``x.size()`` is one value of unknown rank: a tensor made from
    it (DeBERTa's ``torch.ones(input_shape)``, LayoutLM's ``torch.zeros(input_shape +
    (4,))``) got the shape ``(size,)``, a one-dim shape holding a Size, and the emitted
    program raised on its first call."""
    fn = WHOLE_SHAPES[spelling]
    torch._dynamo.reset()
    backend = make_backend(rules=load_rules("all"), validate="raise", iter_limit=4)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for length in (8, 12):
        x, y = torch.randn(2, length), torch.randn(2, length)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert not any(e.module.meta["egraph_report"].fell_back for e in backend.cache.values())


def _counted_and_masked(x, cache):
    cache.add_(1)                    # an input updated in place: through aot_autograd
    keep = torch.arange(4) <= 2      # constants alone: folded at ingest
    return x * keep + cache.sum()


def test_a_constant_folded_under_aot_autograds_fake_mode_is_a_real_tensor():
    """With symbolic sizes the forward graph aot_autograd hands the backend is ingested
    under its fake mode; a call on constants alone (``torch.arange``, and the comparison
    with it) was folded there into a fake tensor, which the emitted program held as a
    constant: every run raised ("Please convert all Tensors to FakeTensors first") and
    the graph fell back (Falcon-H1's and Nemotron-H's decoding steps)."""
    torch._dynamo.reset()
    backend = make_backend(validate="raise")
    compiled = torch.compile(_counted_and_masked, backend=backend, dynamic=True)
    for rows in (3, 5):
        x, ours, theirs = torch.randn(rows, 4), torch.zeros(2), torch.zeros(2)
        torch.testing.assert_close(compiled(x, ours), _counted_and_masked(x, theirs))
        torch.testing.assert_close(ours, theirs)
    assert [r.name for r in backend.reports] == ["forward 0"]
    assert not backend.reports[0].extraction.fell_back


# -- a size read as its example's value ------------------------------------------------------

_SIZED_SCALARS = {  # spellings of a size used as a number, as model code writes them
    "mean by numel": lambda x: x / x.numel(),
    "unbiased variance": lambda x: (x - x.mean(0)).pow(2).sum(0) / (x.shape[0] - 1),
    "sum over a count": lambda x: x.sum() / (x.shape[0] * x.shape[1] * 900),
    "scaled by the batch": lambda x: x * (0.5 * x.shape[0]),
    "negative count": lambda x: x - x.shape[0] * 900,
}


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic dynamic"])
@pytest.mark.parametrize("name", list(_SIZED_SCALARS))
def test_a_number_made_of_a_symbolic_size_holds_at_every_size_in_training(name, dynamic):
    """``x / x.numel()`` under dynamic shapes was emitted as ``x * 0.0111`` (1 / 90, the
    example's numel): ``div-constant`` computed ``1.0 / n`` in Python, where a float reads
    a symbolic size's example value, and validation, run at the example's sizes alone,
    passed it. Every later batch size got silently wrong outputs and gradients."""
    f = _SIZED_SCALARS[name]
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="egraph", dynamic=dynamic)
    for rows in (3, 5, 7):
        x = torch.randn(rows, 30, dtype=torch.float64, requires_grad=True)
        y = torch.randn(rows, 30, dtype=torch.float64)
        ours = compiled(x)
        (ours * y[: ours.shape[0]] if ours.dim() else ours).sum().backward()
        grad, x.grad = x.grad, None
        theirs = f(x)
        (theirs * y[: theirs.shape[0]] if theirs.dim() else theirs).sum().backward()
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(grad, x.grad)


def test_validation_judges_a_symbolic_program_at_other_sizes_than_its_examples(monkeypatch):
    """A rule that reads a symbolic size as its example's value (here ``div-constant`` as it
    was) makes a program right at the example's sizes and wrong at every other: validation
    runs it at other values of the symbols too, and the source comes back, with the sizes
    that showed it named."""
    import egraph.rules.algebra as algebra

    monkeypatch.setattr(algebra, "number_of", algebra.value_of)  # the old, leaky reading
    f = _SIZED_SCALARS["mean by numel"]
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="egraph", dynamic=True)
    with pytest.warns(UserWarning, match=r"failed validation \(at sizes s\d+=\d+"):
        compiled(torch.randn(3, 30))
    for rows in (4, 6):
        x = torch.randn(rows, 30)
        torch.testing.assert_close(compiled(x), f(x))
    torch._dynamo.reset()


def test_a_shape_written_with_minus_one_runs_at_other_sizes_with_no_rewrite():
    """Seed 58, programs 5029 and 5075: ingest reads ``x.reshape(-1, 6)`` as the example's
    ``(15, 6)``, and with no rewrite in the program nothing probed its sizes, so the module
    refused a second batch size the source runs at."""
    def f(x):
        return x.reshape(-1, 6)

    gm = torch.fx.symbolic_trace(f)
    opt = EGraph.from_fx(gm, (torch.randn(3, 5, 6),)).extract(AstSize())
    assert opt.meta["egraph_report"].general
    for rows in (3, 9, 1):
        x = torch.randn(rows, 5, 6)
        torch.testing.assert_close(opt(x), f(x))


def test_a_program_too_large_to_probe_runs_the_source_at_other_sizes_where_it_holds_shapes(
        monkeypatch):
    """A program with more elements than the probe runs (``compiler.sizes.MAX_PROBED``)
    that holds a literal target shape is specialised for every size of its example and
    runs the source's program at the others."""
    from compiler import sizes

    monkeypatch.setattr(sizes.probe_sizes, "__defaults__", (True, 10))  # max_numel 10
    f = torch.fx.symbolic_trace(lambda x: x.reshape(-1, 6).relu())
    opt = EGraph.from_fx(f, (torch.randn(3, 5, 6),)).extract(AstSize())
    assert opt.meta["egraph_report"].built_for == {"x": {0: 3, 1: 5, 2: 6}}
    for rows in (3, 4):
        x = torch.randn(rows, 5, 6)
        torch.testing.assert_close(opt(x), f(x))


def test_a_source_that_cannot_be_captured_again_is_refused_clearly_at_other_sizes(
        monkeypatch):
    """Where the source cannot be captured with symbolic sizes (torch.export refuses it),
    the specialised module refuses other sizes with the clear error, naming the size it
    was built for, rather than failing inside torch.export or giving wrong results."""
    import compiler.fx

    monkeypatch.setattr(compiler.fx, "general_program", lambda src, fixed: None)

    rule = _counting_rule()
    gm = torch.fx.symbolic_trace(lambda x: x[:1].expand(x.size(0), 4).sum(0, keepdim=True))
    opt = EGraph.from_fx(gm, (torch.randn(2, 4),)).saturate([rule], iter_limit=2).extract(
        AstSize())
    with pytest.raises(SizeMismatch, match=r"'x' has shape \(5, 4\), the module was built "
                                           r"for \(2, 4\)"):
        opt(torch.randn(5, 4))


class _CausalScores(nn.Module):
    """A decoder's mask as transformers builds it at a symbolic length: positions from
    ``arange(T)``, compared, then ``aten.diff`` and ``cumsum`` over them (packed
    sequences), none of it reading the input's values."""

    def forward(self, x):
        t = x.shape[1]
        positions = torch.arange(t)[None, :].expand(x.shape[0], -1)
        kept = positions[:, None, :] <= positions[:, :, None]
        packed = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1).ne(1).cumsum(-1)
        kept = kept & (packed[:, :, None] == packed[:, None, :])
        return (x @ x.transpose(1, 2)).masked_fill(~kept, -1e4).softmax(-1)


def test_what_a_symbolic_program_makes_from_sizes_alone_is_made_once_per_size():
    """The mask is computed when the program first meets a size, kept while the sizes
    stay, and made again for another size (and for the first size again)."""
    x = torch.randn(2, 6, 4)
    batch, length = torch.export.Dim("batch", min=2), torch.export.Dim("length", min=2)
    program = torch.export.export(_CausalScores(), (x,),
                                  dynamic_shapes={"x": {0: batch, 1: length}})
    opt = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(AstSize())
    assert not any(word in opt.code for word in ("arange", "diff", "cumsum"))
    folded = opt.folded_constants
    seen = []
    for shape in ((2, 6, 4), (2, 6, 4), (3, 9, 4), (3, 9, 4), (2, 6, 4)):
        other = torch.randn(shape)
        torch.testing.assert_close(opt(other), _CausalScores()(other))
        seen.append(dict(folded.named_buffers()))
    first, again, other, other_again, back = seen
    assert all(again[k] is first[k] for k in first)  # (kept: not recomputed)
    assert all(other_again[k] is other[k] for k in other)
    assert all(other[k] is not first[k] for k in first if first[k].dim())
    assert all(torch.equal(back[k], first[k]) for k in first)


def test_random_numbers_drawn_at_a_symbolic_size_are_drawn_on_every_call():
    """``torch.rand(T)`` reads only a size, but it is not a value to keep: each call
    draws new numbers, as the source does."""
    class Noise(nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape[1]) + torch.arange(x.shape[1])

    x = torch.randn(2, 5)
    program = torch.export.export(Noise(), (x,), dynamic_shapes={"x": {1: torch.export.Dim(
        "length", min=2)}})
    opt = EGraph.from_fx(program, (x,)).extract(AstSize())
    draws = [opt(x) for _ in range(2)]
    assert not torch.equal(draws[0], draws[1])
    torch.manual_seed(3)
    ours = opt(torch.zeros(2, 7))
    torch.manual_seed(3)
    torch.testing.assert_close(ours, Noise()(torch.zeros(2, 7)))
