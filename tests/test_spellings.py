"""Ops with integer and index arguments map their arguments in the right order from every
spelling (torch function, method, module, aten overload) and every entry point (symbolic
trace, torch.export, torch.compile)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compiler.compile import make_backend
from egraph import EGraph
from egraph.rules import load_rules
from extractors import Flops
from frontends.fx.vocabulary import SPELLINGS, lower

aten = torch.ops.aten
RULES = load_rules("all")

# Names a lowering may give a schema's positional argument.
_ALIASES = {"self": {"input", "x", "tensor"}, "other": {"other"}, "mat2": {"other"},
            "exponent": {"other"}}


def test_every_aten_spelling_takes_the_schema_arguments_in_order():
    """A lowering whose positional parameters do not line up with the aten schema's
    (aten.embedding takes the weight first; aten._softmax's third argument is
    half_to_float) silently swaps arguments."""
    wrong = []
    for target, fn in SPELLINGS.items():
        if not isinstance(target, torch._ops.OpOverload):
            continue
        schema = [a.name for a in target._schema.arguments if not a.kwarg_only]
        sig = inspect.signature(fn).parameters.values()
        params = [p.name for p in sig if p.kind is p.POSITIONAL_OR_KEYWORD]
        variadic = any(p.kind is p.VAR_POSITIONAL for p in sig)
        for i, name in enumerate(schema):
            if i >= len(params):
                if not variadic:
                    wrong.append(f"{target}: no parameter for {name!r}")
                continue
            if params[i] != name and params[i] not in _ALIASES.get(name, ()) and not (
                    params[i] == "third"):
                wrong.append(f"{target}: {name!r} lands on {params[i]!r}")
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


def _inputs(name):
    ids = torch.tensor([[3, 0, 7, 19], [1, 2, 0, 5]])
    if name == "embeddings":
        return Embeddings(), (ids,)
    if name == "indexing":
        mask = torch.tensor([[True, False, True, True], [False, True, True, True]])
        return Indexing(), (torch.randn(2, 4, 8), ids, mask)
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


@pytest.mark.parametrize("model", ["embeddings", "indexing", "half softmax"])
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
    code = traced.saturate(load_rules("all")).extract(Flops(), validate="raise").code
    assert "device = device(type='cpu')" in code  # the literal device
    assert "torch.arange" in code and "device = getattr" in code  # the traced x.device
    backend = make_backend(validate="raise", codegen="inductor")
    torch.testing.assert_close(torch.compile(Positions(), backend=backend)(x), Positions()(x))
    graph = next(iter(backend.cache.values())).module.graph
    made = [n for n in graph.nodes if n.target in (torch.arange, torch.full)]
    assert all(n.kwargs["device"] == torch.device("cpu") for n in made)


def test_a_move_to_another_device_stays_the_sources_call():
    """The e-graph does not track devices: ``_to_copy`` to a device is kept as it is, not
    modelled as the identity (which would leave the tensor where it was)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.aten._to_copy.default(x, device="cpu") * 2)(
        torch.randn(3))
    opt = EGraph.from_fx(gm, (torch.randn(3),)).extract(Flops(), validate="raise")
    assert "_to_copy" in opt.code


def test_device_literals_print_and_parse():
    from egraph.term import parse, to_sexpr

    term = parse("(f #device:cuda:0 #dtype:float16)")
    assert term.args[0].op == ("device", "cuda:0")
    assert parse(to_sexpr(term)) == term and "#device:cuda:0" in to_sexpr(term)
