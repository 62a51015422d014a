"""Ops with integer and index arguments map their arguments in the right order from every
spelling (torch function, method, module, aten overload) and every entry point (symbolic
trace, torch.export, torch.compile)."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.sizes import is_input_check
from compiler.compile import default_cost, make_backend
from egraph import AstSize, EGraph
from egraph.rules import load_rules
from extractors import Flops
from frontends.fx.vocabulary import METHODS, SPELLINGS, lower

aten = torch.ops.aten
RULES = load_rules("all")

# Names a lowering may give a schema's positional argument.
_ALIASES = {"self": {"input", "x", "tensor"}, "other": {"other"}, "mat2": {"other"},
            "exponent": {"other"}, "axis0": {"dim0"}, "axis1": {"dim1"},
            "split_size": {"split_size_or_sections"},
            "split_sizes": {"split_size_or_sections"}}


def _schemas(target) -> list:
    """The aten schemas a spelling calls: an overload's own, or every overload of the aten
    op a torch function or Tensor method of that name binds (``torch.batch_norm``)."""
    if isinstance(target, torch._ops.OpOverload):
        return [target._schema]
    name = getattr(target, "__name__", None)
    if name and getattr(torch, name, None) is target:
        return list(torch._C._jit_get_schemas_for_operator(f"aten::{name}"))
    return []


def _misplaced(fn, schema) -> list[str]:
    """How ``fn``'s positional parameters fail to line up with ``schema``'s."""
    sig = inspect.signature(fn).parameters.values()
    params = [p.name for p in sig if p.kind is p.POSITIONAL_OR_KEYWORD]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in sig)
    wrong = []
    for i, name in enumerate(a.name for a in schema.arguments if not a.kwarg_only):
        if i >= len(params):
            if not variadic:
                wrong.append(f"no parameter for {name!r}")
        elif params[i] != name and params[i] not in _ALIASES.get(name, ()) and (
                params[i] != "third"):
            wrong.append(f"{name!r} lands on {params[i]!r}")
    return wrong


def test_every_spelling_takes_the_schema_arguments_in_order():
    """A lowering whose positional parameters do not line up with the aten schema's
    silently swaps arguments: aten.embedding takes the weight first, aten._softmax's third
    argument is half_to_float, ``torch.batch_norm`` takes the weight where
    ``F.batch_norm`` takes the running mean (NaN), and ``torch.softmax``'s third argument
    is the dtype where ``F.softmax``'s is ``_stacklevel`` (float64 silently dropped). A
    torch function or method agrees with one of its overloads."""
    spellings = [(target, fn, target) for target, fn in SPELLINGS.items()] + [
        (f"Tensor.{name}", fn, getattr(torch, name, None)) for name, fn in METHODS.items()]
    wrong = []
    for label, fn, target in spellings:
        mismatches = [_misplaced(fn, schema) for schema in _schemas(target)]
        if mismatches and all(mismatches):
            wrong.append(f"{label}: {'; '.join(mismatches[0])}")
    assert not wrong, "\n".join(wrong)


def test_aten_embedding_and_softmax_lowerings():
    assert lower(aten.embedding.default, ("w", "i"), {}) == ("embedding", ["i", "w", None])
    assert lower(aten.embedding.default, ("w", "i", 0), {}) == ("embedding", ["i", "w", 0])
    assert lower(torch.embedding, ("w", "i"), {}) == ("embedding", ["i", "w", None])
    assert lower(F.embedding, ("i", "w"), {"padding_idx": 3}) == ("embedding", ["i", "w", 3])
    assert lower(aten._softmax.default, ("x", -1, True), {}) == (
        "softmax", [("to", ["x", torch.float32]), -1])
    assert lower(aten._softmax.default, ("x", -1, False), {}) == ("softmax", ["x", -1])
    assert lower(aten.softmax.int, ("x", 1, torch.float64), {}) == (
        "softmax", [("to", ["x", torch.float64]), 1])


@pytest.mark.parametrize("fn", [
    lambda x, w, b, m, v: torch.batch_norm(x, w, b, m, v, False, 0.1, 1e-5, False),
    lambda x, w, b, m, v: torch.softmax(x, -1, torch.float64) * w[:, None],
    lambda x, w, b, m, v: x.log_softmax(1, torch.float64) + b[:, None],
], ids=["torch.batch_norm", "torch.softmax-dtype", "Tensor.log_softmax-dtype"])
def test_torch_spellings_whose_order_differs_from_the_functional(fn):
    x = torch.randn(2, 4, 3)
    w, b, m, v = torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5
    eg = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x, w, b, m, v))
    opt = eg.extract(Flops(), validate="off")  # what is built, not validation's fallback
    expected = fn(x, w, b, m, v)
    assert opt(x, w, b, m, v).dtype == expected.dtype
    torch.testing.assert_close(opt(x, w, b, m, v), expected)


def test_an_exported_convolution_and_batch_norm_fold():
    """torch.export spells them ``aten.conv2d.default`` and ``aten.batch_norm.default``
    (a transformers ResNet): both were opaque, so no rule saw a ResNet's convolutions."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)).eval()
    for bn in (model[1], model[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 10, 10)
    eg = EGraph.from_fx(torch.export.export(model, (x,)), (x,)).saturate(RULES)
    opt = eg.extract(Flops())
    report = opt.meta["egraph_report"]
    assert report.rewrites.get("conv-bn") == 2 and not report.fell_back, str(report)
    # the folded weights and biases are computed once, not per call: views and
    # zeros_like of parameters fold with what is made of them
    calls = {getattr(n.target, "__name__", n.target) for n in opt.graph.nodes
             if n.op in ("call_function", "call_method", "call_module")
             and not is_input_check(n)}
    assert calls == {"conv2d", "relu", "folded_constants"}, calls
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x))


class Embeddings(nn.Module):
    """Every spelling of an embedding lookup, with and without padding rows."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(20, 8, padding_idx=0)
        self.pos = nn.Embedding(16, 8)
        self.extra = nn.Parameter(torch.randn(20, 8))

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        h = self.tok(ids) + self.pos(positions)
        h = h + F.embedding(ids, self.extra, padding_idx=-1)
        return h + torch.embedding(self.extra, ids)


class Indexing(nn.Module):
    """gather, tensor indexing, masked_fill and where with integer and bool arguments."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, ids, mask):
        h = self.proj(x)
        g = torch.gather(h, 2, ids.unsqueeze(-1).expand(-1, -1, 3) % 8)
        g = g + h.gather(-1, (ids % 8).unsqueeze(-1))
        picked = h[:, ids[0] % h.shape[1]]
        h = h.masked_fill(~mask.unsqueeze(-1), 0.0)
        h = torch.where(mask.unsqueeze(-1), h, -h)
        flat = h.view(h.size(0), -1)
        return g, picked, flat[:, :5], ids * 3 + 1, (ids * 7) // 2, ids % 3


class HalfSoftmax(nn.Module):
    """Softmax with a dtype argument (aten's half_to_float and dtype overloads)."""

    def forward(self, x):
        return F.softmax(x, dim=-1, dtype=torch.float32), x.float().log_softmax(-1)


class Slicing(nn.Module):
    """Slices with negative dims, selects, advanced indexing with whole dims, dropout in
    eval, a move to the input's own device, masks combined with ``&`` and ``|``, ``where``
    with a scalar, clamp, flatten, chunk, split, ``type_as`` and ``type``: each an aten
    call of its own in an export graph (``slice.Tensor``, ``select.int``, ``index.Tensor``,
    ``dropout``, ``to.device``, ``__and__``, ``where.ScalarOther``, ``type_as``...)."""

    def forward(self, x, ids, mask):
        h = F.dropout(x, 0.1, self.training)
        tail = h[..., 2:7:2] + h[:, -1:, :3]
        row = h[:, 1, :4] * h[0, :, 5].unsqueeze(0)
        picked = h[:, ids[0] % 4]
        keep = mask.to(x.device) & (h[..., 0] > 0) | mask[:, :1]
        h = torch.where(keep.unsqueeze(-1), h, -1.0).clamp(-0.5, 2.0)
        a, b = h.chunk(2, dim=-1)
        c, d = torch.split(h.flatten(1), [12, 20], dim=1)
        share = keep.type_as(x).sum(-1)
        return tail, row.type(torch.float64), picked, F.softplus(a) * b, (
            c.sum(-1) + d.sum(-1) + share)


def _inputs(name):
    ids = torch.tensor([[3, 0, 7, 19], [1, 2, 0, 5]])
    if name == "embeddings":
        return Embeddings(), (ids,)
    mask = torch.tensor([[True, False, True, True], [False, True, True, True]])
    if name == "indexing":
        return Indexing(), (torch.randn(2, 4, 8), ids, mask)
    if name == "slicing":
        return Slicing(), (torch.randn(2, 4, 8), ids, mask)
    return HalfSoftmax(), (torch.randn(2, 4, 8).half(),)


def _check(got, want):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("model", ["embeddings", "indexing", "slicing", "half softmax"])
@pytest.mark.parametrize("entry", ["symbolic_trace", "export", "compile"])
def test_integer_and_index_arguments_through_every_entry_point(model, entry):
    module, xs = _inputs(model)
    module.eval()
    want = module(*xs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a validation fallback is a failure
        if entry == "symbolic_trace":
            opt = EGraph.from_fx(module, xs).saturate(RULES, iter_limit=5).extract(
                Flops(), validate="raise")
        elif entry == "export":
            program = torch.export.export(module, xs)
            opt = EGraph.from_fx(program).saturate(RULES, iter_limit=5).extract(
                Flops(), validate="raise")
        else:
            torch._dynamo.reset()
            opt = torch.compile(module, backend=make_backend(rules=RULES, validate="raise"))
        _check(opt(*xs), want)


def test_exported_slices_moves_masks_and_eval_dropout_are_the_tables_ops():
    """Each was an opaque aten call in export graphs (and eval dropout an effect, which
    orders what comes after it): now all are table ops the rules see, and none remains."""
    module, xs = _inputs("slicing")
    program = torch.export.export(module.eval(), xs)
    eg = EGraph.from_fx(program, xs)
    assert not any(o.op == "call_function" and "_assert" not in str(o.target)
                   for o in eg.fx.opaque.values()), list(eg.fx.opaque)
    opt = eg.extract(Flops(), validate="raise")
    _check(opt(*xs), module(*xs))


def test_exported_in_place_updates_of_intermediates_are_functional_ops():
    """torch.export keeps ``h += y``, ``h.div_(3)`` and ``relu_`` on intermediates as
    ``aten.add_``, ``aten.div_`` and ``aten.relu_``: each is its functional twin with the
    name rebound, so rules see them and an update of a constant folds with it."""
    class Updates(nn.Module):
        def forward(self, x, y):
            h = x * 2
            h += y
            h.div_(3)
            steps = torch.arange(x.shape[-1])
            steps += 1
            return h.relu_() + steps

    xs = (torch.randn(2, 4), torch.randn(2, 4))
    program = torch.export.export(Updates(), xs)
    assert sum(str(n.target).endswith("_.Tensor") for n in program.graph.nodes) == 3
    eg = EGraph.from_fx(program, xs)
    assert not eg.fx.opaque
    opt = eg.extract(Flops(), validate="raise")
    assert "arange" not in opt.code
    for _ in range(2):
        torch.testing.assert_close(opt(*xs), Updates()(*xs))


@pytest.mark.parametrize("entry", ["symbolic_trace", "compile"])
def test_padding_rows_get_no_gradient(entry):
    """padding_idx changes only gradients: the emitted module must keep it."""
    module, (ids,) = _inputs("embeddings")
    if entry == "symbolic_trace":
        opt = EGraph.from_fx(module, (ids,)).extract(Flops())
        assert "padding_idx" in opt.code
    else:
        torch._dynamo.reset()
        opt = torch.compile(module, backend=make_backend())
    opt(ids).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    module(ids).sum().backward()
    for name, p in module.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
    assert torch.count_nonzero(module.tok.weight.grad[0]) == 0


def test_compile_validates_index_inputs_it_never_saw():
    """Inside torch.compile the backend sees fake integer inputs; generated indices that
    the source cannot take (1 into a dim of size 1) are replaced, not a crash (found by
    the fuzzer)."""
    def pick(x0, i0):
        v1 = x0.reshape(x0.shape[0], 2, -1)
        m = v1.amax(-1, keepdim=True)
        return torch.gather(m + torch.log(torch.exp(v1 - m).sum(-1, keepdim=True)), -1, i0)

    x, i = torch.randn(2, 16) * 100, torch.zeros(2, 2, 1, dtype=torch.long)
    torch._dynamo.reset()
    compiled = torch.compile(pick, backend=make_backend(rules=RULES, validate="raise"))
    torch.testing.assert_close(compiled(x, i), pick(x, i))


def test_creation_ops_keep_the_device_they_were_made_on():
    """``torch.arange(n, device=x.device)`` and ``torch.ones(n, device=...)`` make their
    tensor where the source did: on a GPU the program must not make it on the CPU (a
    GPT-2 position index did, and the emitted program mixed devices)."""

    class Positions(nn.Module):
        def forward(self, x):
            n = x.shape[-1]
            return x + torch.arange(n, device=x.device) + torch.ones(n, device="cpu")

    x = torch.randn(3, 5)
    traced = EGraph.from_fx(torch.fx.symbolic_trace(Positions()), (x,))
    opt = traced.saturate(load_rules("all")).extract(Flops(), validate="raise")
    # the literal device: ``ones(n)``, made from the size alone, is computed once per size
    made = [kids for op, kids in opt.folded_constants.recipes.values() if op == "full"]
    assert made and all(torch.device("cpu") in kids for kids in made)
    assert "torch.arange" in opt.code and "device = getattr" in opt.code  # the traced x.device
    backend = make_backend(validate="raise", codegen="inductor")
    torch.testing.assert_close(torch.compile(Positions(), backend=backend)(x), Positions()(x))
    graph = next(iter(backend.cache.values())).module.graph
    made = [n for n in graph.nodes if n.target in (torch.arange, torch.full)]
    assert all(n.kwargs["device"] == torch.device("cpu") for n in made)


def test_a_move_to_another_device_stays_the_sources_call():
    """The e-graph does not track devices: ``_to_copy`` to a device other than the one its
    operand is recorded on is kept as it is, not modelled as the identity (which would
    leave the tensor where it was); a move to the operand's own device moves nothing."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def moved(x):
        return torch.ops.aten._to_copy.default(x, device="cpu") * 2

    x = torch.randn(3)
    here = EGraph.from_fx(make_fx(moved)(x), (x,)).extract(Flops(), validate="raise")
    assert "_to_copy" not in here.code
    torch.testing.assert_close(here(x), x * 2)
    elsewhere = make_fx(moved)(x)
    next(iter(elsewhere.graph.nodes)).meta["val"] = torch.empty(3, device="meta")
    opt = EGraph.from_fx(elsewhere, (x,)).extract(Flops(), validate="raise")
    assert "_to_copy" in opt.code


def test_device_literals_print_and_parse():
    from egraph.term import parse, to_sexpr

    term = parse("(f #device:cuda:0 #dtype:float16)")
    assert term.args[0].op == ("device", "cuda:0")
    assert parse(to_sexpr(term)) == term and "#device:cuda:0" in to_sexpr(term)


EINSUMS = [("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("b h i j, b h j d -> b h i d", [(2, 3, 4, 6), (2, 3, 6, 5)]),
           ("i,j->ij", [(4,), (5,)]), ("ij,jk", [(3, 4), (4, 5)]), ("bij->bji", [(2, 3, 4)]),
           ("ij->", [(3, 4)]), ("bi,bi->b", [(3, 4), (3, 4)]), ("ij,ij->ij", [(3, 4), (3, 4)]),
           ("bnd,de->bne", [(2, 3, 4), (4, 5)]), ("ijk,k->ij", [(2, 3, 4), (4,)]),
           ("ij,kj->ik", [(3, 4), (5, 4)]), ("ij,jk->ki", [(3, 4), (4, 5)]),
           ("i,i->", [(4,), (4,)]), ("bij,bjk->bik", [(2, 3, 4), (1, 4, 5)]),
           ("xi,yi->xyi", [(2, 3), (4, 3)]), ("bhij,jd->bhid", [(2, 3, 4, 5), (5, 6)]),
           ("ijk,jl->il", [(2, 3, 4), (3, 5)]),
           # an ellipsis, written as letters from the ranks (research code's attention
           # and rotary tables), broadcast right-aligned as einsum does
           ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
           ("... i d, ... j d -> ... i j", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("..., f -> ... f", [(7,), (4,)]), ("...ij->...ji", [(2, 3, 4)]),
           ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]), ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]),
           ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]), ("b...,b...->b...", [(2, 3), (2, 3)]),
           # several letters flattened into one dim (sizes known): sequence-first attention
           # (labml's 'ibhd,jbhd->ijbh'), Transformer-XL's relative scores, two contracted
           # letters, an outer product of matrices
           ("ibhd,jbhd->ijbh", [(5, 2, 3, 4), (6, 2, 3, 4)]),
           ("ijbh,jbhd->ibhd", [(5, 6, 2, 3), (6, 2, 3, 4)]),
           ("ibhd,jhd->ijbh", [(5, 2, 3, 4), (6, 3, 4)]),
           ("bijk,bkl->bijl", [(2, 3, 4, 5), (2, 5, 6)]),
           ("bijk,bjkl->bil", [(2, 3, 4, 5), (2, 4, 5, 6)]), ("ab,cd->abcd", [(2, 3), (4, 5)]),
           # kept as the source's call: a diagonal, a sum over an ellipsis (einsum
           # broadcasts it first)
           ("ii->i", [(3, 3)]), ("...ij,...jk->ik", [(2, 3, 4), (2, 4, 5)])]


class _WithoutEinsum(AstSize):
    """Term size, with einsum's call priced out: extraction takes the ops the rule
    ``einsum-product`` and ``einsum-sum`` added to its class, where there are any."""

    def __call__(self, enode, child_costs):
        return super().__call__(enode, child_costs) + (10**6 if enode.op == "einsum" else 0)


@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_lowers_to_the_ops_it_is_made_of(equation, shapes):
    """``torch.einsum`` (research code's attention, rotary tables) has the permutes,
    matmul, mul, sums and reshapes it is made of in its class, which compute what einsum
    computes (validation off); equations the rule does not plan keep only the call."""
    xs = [torch.randn(s) for s in shapes]
    if len(xs) == 1:
        gm = torch.fx.symbolic_trace(lambda a: torch.einsum(equation, a))
    else:
        gm = torch.fx.symbolic_trace(lambda a, b: torch.einsum(equation, a, b))
    opt = EGraph.from_fx(gm, tuple(xs)).saturate(load_rules("all")).extract(
        _WithoutEinsum(), validate="off")
    expected = torch.einsum(equation, *xs)
    assert opt(*xs).shape == expected.shape
    torch.testing.assert_close(opt(*xs), expected, rtol=1e-5, atol=1e-5)
    kept = equation in ("ii->i", "...ij,...jk->ik")
    assert ("einsum" in opt.code) == kept


@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ibhd,jhd->ijbh", [(5, 2, 3, 4), (6, 3, 4)]),
    ("bjm,bijm->bij", [(2, 10, 16), (2, 32, 10, 16)])])
def test_an_einsum_runs_as_the_cost_model_prices_it(equation, shapes):
    """On the CPU torch.einsum costs two launches more than the matmul it makes (it plans
    the equation and calls the views and bmm itself): the CPU's cost runs the ops it is
    made of. Where a cost model prices both alike (FLOPs), the source's one call stays."""
    xs = tuple(torch.randn(s) for s in shapes)
    gm = torch.fx.symbolic_trace(lambda a, b: torch.einsum(equation, a, b))
    eg = EGraph.from_fx(gm, xs).saturate(load_rules("all"))
    on_cpu, alike = eg.extract(default_cost(xs)), eg.extract(Flops())
    assert "einsum(" not in on_cpu.code and ("matmul(" in on_cpu.code or "bmm(" in on_cpu.code)
    assert alike.code.count("torch.") == alike.code.count("einsum(") == 1, alike.code
    for opt in (on_cpu, alike):
        torch.testing.assert_close(opt(*xs), torch.einsum(equation, *xs))


@pytest.mark.parametrize("equation, shapes", [
    ("ijnm,bin->bijm", [(32, 10, 8, 16), (2, 32, 8)]),
    ("bin,ijnm->bijm", [(2, 32, 8), (32, 10, 8, 16)])])
def test_flattened_einsum_ends_in_its_output_last_letter(equation, shapes):
    """Capsule routing's 'ijnm,bin->bijm': the matmul's columns are the operand whose
    letter ends the output, so the result's last dim is the product's own last (laid out
    (i, j m, b), every later use of the result copied it: 1.17 times eager's time)."""
    from egraph.ops.einsum_plan import plan

    planned = plan(equation, ("a", "b"), shapes)
    last = len(equation.split("->")[1]) - 1
    assert planned[0] == "permute" and planned[1][1][-1] == last
    xs = tuple(torch.randn(s) for s in shapes)
    gm = torch.fx.symbolic_trace(lambda a, b: torch.einsum(equation, a, b))
    opt = EGraph.from_fx(gm, xs).saturate(load_rules("all")).extract(_WithoutEinsum())
    torch.testing.assert_close(opt(*xs), torch.einsum(equation, *xs), rtol=1e-5, atol=1e-5)


def test_einsum_letters_to_flatten_of_unknown_sizes_stay_the_call():
    """Flattening several letters into one dim needs their sizes: where they vary
    (torch.export with a dynamic dim), the einsum stays the source's call, and runs at
    other sizes."""
    class Relative(torch.nn.Module):
        def forward(self, q, p):
            return torch.einsum("ibhd,jhd->ijbh", q, p)

    q, p = torch.randn(5, 2, 3, 4), torch.randn(6, 3, 4)
    ep = torch.export.export(Relative(), (q, p), dynamic_shapes=(
        {0: torch.export.Dim("i", min=2)}, {0: torch.export.Dim("j", min=2)}))
    opt = EGraph.from_fx(ep, (q, p)).saturate(load_rules("all")).extract(_WithoutEinsum())
    assert "einsum" in opt.code
    q, p = torch.randn(7, 2, 3, 4), torch.randn(9, 3, 4)
    torch.testing.assert_close(opt(q, p), torch.einsum("ibhd,jhd->ijbh", q, p))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_einsum_lowering_equals_einsum_on_random_equations(data):
    """Random two-operand equations (letters free in one operand, shared, batch or
    contracted, in any order, some of size 1): the ops einsum-product plans compute
    einsum's result."""
    letters = data.draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=6,
                                 unique=True))
    sizes = {c: data.draw(st.integers(1, 4)) for c in letters}
    ta = "".join(data.draw(st.permutations([c for c in letters if data.draw(st.booleans())])))
    tb = "".join(data.draw(st.permutations([c for c in letters if data.draw(st.booleans())])))
    used = sorted(set(ta + tb))
    out = "".join(data.draw(st.permutations([c for c in used if data.draw(st.booleans())])))
    equation = f"{ta},{tb}->{out}"
    xs = (torch.randn([sizes[c] for c in ta]), torch.randn([sizes[c] for c in tb]))
    gm = torch.fx.symbolic_trace(lambda a, b: torch.einsum(equation, a, b))
    opt = EGraph.from_fx(gm, xs).saturate(load_rules("all")).extract(_WithoutEinsum(),
                                                                     validate="off")
    assert "einsum" not in opt.code
    torch.testing.assert_close(opt(*xs), torch.einsum(equation, *xs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spelling", [
    lambda acc, a, b: torch.baddbmm(acc, a, b, beta=0, alpha=0.25),
    lambda acc, a, b: acc.baddbmm(a, b, beta=0.0),
    lambda acc, a, b: torch.addmm(acc[0], a[0], b[0], beta=0),
    lambda acc, a, b: torch.baddbmm(acc, a, b, beta=0.5, alpha=2.0)])
def test_addmm_and_baddbmm_read_their_input_only_where_beta_is_not_zero(spelling):
    """torch does not read ``input`` where beta is 0 (GPT-2's upcast attention passes an
    uninitialised ``torch.empty``): its NaN must not reach the result as ``0 * NaN``."""
    acc = torch.full((2, 3, 5), float("nan"))
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    expected = spelling(acc, a, b)
    gm = torch.fx.symbolic_trace(spelling)
    opt = EGraph.from_fx(gm, (acc, a, b)).saturate(load_rules("all")).extract(
        AstSize(), validate="off")
    assert "baddbmm" not in opt.code and "addmm" not in opt.code  # (lowered: matmul, add)
    torch.testing.assert_close(opt(acc, a, b), expected, equal_nan=True)


class _ScaledUpdates(nn.Module):
    """Adam's spellings: ``addcmul_`` and ``addcdiv_`` with a ``value`` (dynamo writes each
    as ``prims.fma`` and a ``copy_``) and their out-of-place forms."""

    def forward(self, s, g, d):
        s.mul_(0.9).addcmul_(g, g, value=0.1)
        t = torch.addcmul(d, g, s, value=-2.0) + g.addcdiv(s, d.abs() + 1)
        return s.addcdiv_(g, d.abs() + 1, value=0.5) * t


_SCALED_TARGETS = ("fma", "addcmul", "addcdiv")


@pytest.mark.parametrize("entry", ["symbolic_trace", "export", "compile"])
def test_addcmul_addcdiv_and_dynamos_fma_are_the_tables_arithmetic(entry):
    """``prims.fma`` (dynamo's spelling of ``addcmul_`` with a value) ran as a Python call
    ten times slower than its two ops; ``addcmul`` and ``addcdiv`` were opaque to the
    rules. Each is now ``add`` of a product (or quotient); only the in-place calls on the
    input stay calls (a symbolic trace's), and the input is updated as eager updates it."""
    def inputs():
        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(4, 5, generator=gen) for _ in range(3))

    xs_eager = inputs()
    expected = _ScaledUpdates()(*xs_eager)
    xs, graphs = inputs(), []
    if entry == "compile":
        torch._dynamo.reset()
        backend = make_backend(validate="raise")

        def spy(gm, example_inputs):
            graphs.append(gm)
            return backend(gm, example_inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = torch.compile(_ScaledUpdates(), backend=spy)(*xs)
        assert not backend.reports[0].fell_back
    else:
        graphs.append(torch.fx.symbolic_trace(_ScaledUpdates()) if entry == "symbolic_trace"
                      else torch.export.export(_ScaledUpdates(), inputs()))
        got = EGraph.from_fx(graphs[0], inputs()).extract(default_cost(xs),
                                                          validate="raise")(*xs)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(xs[0], xs_eager[0])
    targets = [str(getattr(o.target, "__name__", o.target))
               for o in EGraph.from_fx(graphs[0], inputs()).fx.opaque.values()]
    # (an overload prints as "prims.fma.default", a function or method as its name)
    assert not {t.split(".")[-2] if "." in t else t for t in targets} & set(_SCALED_TARGETS)


def _newton_schulz(x):
    """torch.optim.Muon's orthogonalisation step, in bfloat16 as Muon runs it."""
    a, b, c = 3.4445, -4.7750, 2.0315
    gram = x @ x.t()
    polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)
    return torch.addmm(x, polynomial, x, beta=a)


def test_scaled_matrix_products_and_sums_are_emitted_as_addmm_with_alpha_and_beta():
    """``addmm(c, a, b, beta=s, alpha=t)`` is lowered to a product, two scalings and a
    sum; emitted as those four bfloat16 ops it rounded four times where torch's one call
    rounds once (a compiled Muon step ended 3e-3 from eager's). The emission is torch's
    call again, equal to eager bit for bit."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).bfloat16()
    gm = torch.fx.symbolic_trace(_newton_schulz)
    opt = EGraph.from_fx(gm, (x,)).saturate(RULES).extract(AstSize(), validate="raise")
    assert opt.code.count("torch.addmm(") == 2 and "alpha = 2.0315" in opt.code
    assert torch.equal(opt(x), _newton_schulz(x))


@pytest.mark.parametrize("fn, fused", [
    # transformers' NewGELUActivation (GPT-2)
    (lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3.0)))), True),
    (lambda x: x.long() + x.long() * 3, True),
    (lambda x: x.long() + x.long() * 0.5, False),  # promoted: no integer alpha of 0.5
])
def test_a_sum_with_a_scaled_term_is_one_add_with_alpha(fn, fused):
    """``x + y * s`` runs as ``torch.add(x, y, alpha=s)``: one pass, no tensor for the
    product; not where the scale promotes an integer ``y`` (torch refuses a floating
    alpha for integer tensors)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 3
    opt = EGraph.from_fx(torch.fx.symbolic_trace(fn), (x,)).extract(AstSize(),
                                                                     validate="raise")
    assert ("alpha = " in opt.code) == fused
    torch.testing.assert_close(opt(x), fn(x))
