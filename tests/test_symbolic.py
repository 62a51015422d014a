"""Symbolic sizes (``egraph.dims``): the shape analysis carries torch.compile's and
torch.export's symbolic sizes as expressions, so the rules that need shapes fire on
graphs meant for every size, and nothing that holds for the example's size alone (a
literal of it, an order that only its value decides, a shape that broadcasting guessed
from equal examples) reaches a program."""

from __future__ import annotations

import operator

import pytest
import sympy
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dynamic import Block  # nanoGPT's block: its mask a buffer sliced to the length
from torch.export import Dim

from backends.sizes import SizeMismatch
from compiler.compile import make_backend
from egraph import EGraph
from egraph.dims import Size, SymbolicSize, decide, hints
from egraph.rules import load_rules
from egraph.term import literal
from extractors import Flops

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
       "%": operator.mod}


def _size(hint: int, symbol=S0) -> Size:
    return Size(hint, symbol, {symbol: hint})


# -- the arithmetic of sizes --------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(hint=st.integers(2, 50), other=st.integers(2, 50), k=st.integers(1, 9),
       op=st.sampled_from(sorted(OPS)), reflected=st.booleans())
def test_size_arithmetic_is_the_arithmetic_of_every_size(hint, other, k, op, reflected):
    """``s op k`` is the example's value at the example's size and the right value at
    any other size its expression is evaluated at."""
    fn = OPS[op]
    a, b = (k, _size(hint)) if reflected else (_size(hint), k)
    result = fn(a, b)
    at = (lambda v: fn(k, v)) if reflected else (lambda v: fn(v, k))
    assert int(result) == at(hint)
    value = result.expr.subs(S0, other) if isinstance(result, Size) else result
    assert int(value) == at(other)


@settings(max_examples=200, deadline=None)
@given(ka=st.integers(-3, 3), ca=st.integers(-6, 6), kb=st.integers(-3, 3),
       cb=st.integers(-6, 6), relation=st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
def test_an_order_is_decided_only_where_every_size_agrees(ka, ca, kb, cb, relation):
    """``decide`` answers True or False only when the relation goes that way for every
    size the symbol may take (2 or more); otherwise None."""
    a, b = _size(8) * ka + ca, _size(8) * kb + cb
    decided = decide(a, b, relation)
    compare = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
               ">": operator.gt, ">=": operator.ge}[relation]

    def value(x, v):
        return int(x.expr.subs(S0, v)) if isinstance(x, Size) else x

    truths = {compare(value(a, v), value(b, v)) for v in range(2, 40)}
    if decided is not None:
        assert truths == {decided}


def test_a_size_is_equal_only_to_the_same_expression():
    seq, batch = _size(8), _size(8, S1)
    assert seq == _size(8) and hash(seq) == hash(_size(8))
    assert seq != 8 and seq != batch  # equal examples, different sizes
    assert (2, seq * 4) == (2, _size(8) * 4) and (2, seq * 4) != (2, 32)
    assert hints((2, seq * 4)) == (2, 32)


def test_what_only_the_example_could_answer_raises():
    seq = _size(8)
    for question in (lambda: float(seq), lambda: seq / 2, lambda: seq > 8,
                     lambda: seq ** -1, lambda: literal(seq), lambda: literal((2, seq))):
        with pytest.raises(SymbolicSize):
            question()
    assert seq > 1 and seq >= 2 and not seq < 2  # every dynamic size is 2 or more


# -- the analysis -------------------------------------------------------------------------


def _exported(model, x, dims=None):
    return torch.export.export(model, (x,), dynamic_shapes=(dims,) if dims else None).module()


@pytest.mark.parametrize("dims", ["length", "batch and length"])
def test_a_graph_exported_with_a_dynamic_length_gets_the_rewrites_of_a_static_one(dims):
    torch.manual_seed(0)
    model = Block(n_embd=32, n_head=4, block_size=128).eval()
    x = torch.randn(2, 8, 32)
    dynamic = {1: Dim("T", min=2, max=64)}
    if dims == "batch and length":
        dynamic[0] = Dim("B", min=2, max=16)
    rules = load_rules("all")
    used = []
    for program in (_exported(model, x), _exported(model, x, dynamic)):
        eg = EGraph.from_fx(program, (x,))
        eg.saturate(rules, iter_limit=10, node_limit=20_000)
        out = eg.extract(Flops(), validate="raise")
        used.append(out.meta["egraph_report"].used)
    assert "sdpa-causal-checked" in used[0] and used[1] == used[0]
    with torch.no_grad():
        for shape in [(2, 5, 32), (2, 64, 32)] + (
                [(7, 3, 32)] if dims == "batch and length" else []):
            y = torch.randn(shape)
            torch.testing.assert_close(out(y), model(y), rtol=1e-5, atol=1e-5)


class _FlattenedHeads(nn.Module):
    """Scores over heads flattened into the batch, as DeBERTa and fairseq write them:
    ``(b * h, t, d)`` products with ``-1`` for the flattened size, reshaped back."""

    def forward(self, q, k):
        b, h, t, d = q.shape
        scores = q.reshape(-1, t, d) @ k.reshape(-1, t, d).transpose(1, 2)
        return scores.reshape(b, h, t, t).softmax(-1)


def test_heads_flattened_into_a_symbolic_batch_get_the_rewrites_of_a_static_one():
    """The reshapes around a batched product are seen through at symbolic sizes (a ``-1``
    in a shape is the size the others leave; a transposed shape of sizes is a tuple of
    them, not a literal that would fix the example's), and a product of batches of equal
    symbolic size runs as ``torch.bmm``, as at a static size."""
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    dims = ({0: Dim.AUTO, 2: Dim.AUTO},) * 2
    rules = load_rules("all")
    used, codes = [], []
    for shapes in (None, dims):
        program = torch.export.export(_FlattenedHeads(), (q, k), dynamic_shapes=shapes)
        eg = EGraph.from_fx(program, (q, k)).saturate(rules)
        used.append({name for name, r in eg.report.rules.items() if r.applied})
        out = eg.extract(Flops(), validate="raise")
        codes.append(out.code)
        for shape in [(2, 4, 6, 8), (3, 4, 5, 8)] if shapes else [(2, 4, 6, 8)]:
            a, b = torch.randn(shape), torch.randn(shape)
            torch.testing.assert_close(out(a, b), _FlattenedHeads()(a, b))
    assert {"matmul-batched", "transpose-reshape"} <= used[1] and used[1] == used[0]
    program = torch.export.export(_FlattenedHeads(), (q, k), dynamic_shapes=dims)
    eg = EGraph.from_fx(program, (q, k))  # unsaturated: the 3-d product as written
    assert "torch.bmm(" in eg.extract(Flops()).code


class _PaddedWindows(torch.nn.Module):
    """Swin's stage in form (transformers' ``SwinLayer.maybe_pad``): the hidden states
    padded to a multiple of the window, then projected to queries, keys and values."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        x = torch.nn.functional.pad(x, (0, 0, 0, 2, 0, 2))
        return self.q(x) * self.k(x) + self.v(x)


def test_a_padded_symbolic_batch_keeps_its_shape_and_the_rewrites_after_it():
    """``pad`` of a tensor whose batch is symbolic has a symbolic shape (torch's C++
    kernel, run on fake tensors, reads every size as the example's number, which left
    Swin's padded stages shapeless and unmerged), so the projections after it merge as
    at a static size, and the program runs at other batches."""
    x = torch.randn(2, 6, 6, 16)
    model = _PaddedWindows().eval()
    rules = load_rules("all")
    used = []
    for shapes in (None, ({0: Dim.AUTO},)):
        program = torch.export.export(model, (x,), dynamic_shapes=shapes)
        eg = EGraph.from_fx(program, (x,))
        padded = next(c for c in eg.classes() if any(n.op == "pad" for n in eg.nodes(c)))
        assert eg.data(padded).shape is not None
        eg.saturate(rules)
        used.append({name for name, r in eg.report.rules.items() if r.applied})
        out = eg.extract(Flops(), validate="raise")
        for batch in (2, 5) if shapes else (2,):
            y = torch.randn(batch, 6, 6, 16)
            with torch.no_grad():
                torch.testing.assert_close(out(y), model(y))
    assert used[1] == used[0], used[0] ^ used[1]


def test_broadcasting_two_sizes_of_equal_examples_leaves_the_shape_unknown():
    """``x + y`` for lengths ``s0`` and ``s1`` that are both 8 in the example: its shape
    is ``(s0,)`` only where ``s0 == s1``, which only the example says. The analysis
    leaves it unknown (a rule that built it must not merge it with a class of shape
    ``(s0,)``), while ``cat`` of the two has the shape ``(s0 + s1,)`` for every size."""
    x, y = torch.randn(8), torch.randn(8)
    program = torch.export.export(
        _Cat(), (x, y),
        dynamic_shapes=({0: Dim("m", min=2)}, {0: Dim("n", min=2)})).module()
    eg = EGraph.from_fx(program, (x, y))
    inputs = [eg.find(c) for c in eg.classes() if any(n.op == "input" for n in eg.nodes(c))]
    assert len(inputs) == 2
    root = eg.data(eg.roots[0])
    assert len(root.shape) == 1 and isinstance(root.shape[0], Size)
    assert root.shape[0].expr == sum(eg.data(c).shape[0].expr for c in inputs)
    assert eg.data(eg.add_node("add", inputs)).shape is None


class _Cat(nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y])


class _Positions(nn.Module):
    def forward(self, x):
        return (x * 2) * 3 + torch.arange(x.shape[1])


def test_a_program_of_an_export_specialised_to_a_size_refuses_others_by_name():
    """An ExportedProgram captured for one size refuses others (its guards); the program
    made from it holds constants of that size (``arange(8)`` folded), and refuses them
    too, naming the input and the size the export holds it to, not with a broadcasting
    error."""
    x = torch.randn(2, 8)
    program = torch.export.export(_Positions(), (x,))
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(torch.randn(2, 12))
    eg = EGraph.from_fx(program, (x,)).saturate(load_rules("all"), iter_limit=5)
    out = eg.extract(Flops())
    torch.testing.assert_close(out(x), _Positions()(x))
    with pytest.raises(SizeMismatch, match=r"'x' has shape \(2, 12\).*x.size\(\)\[1\] == 8"):
        out(torch.randn(2, 12))


def test_a_symbolic_integer_of_any_sign_is_a_size_with_no_least_value():
    """An int argument under ``dynamic=True`` is a symbol that may be negative (its range
    has no lower bound): it is carried like a size, with no least value assumed
    (Gemma 3's and Cohere 2's generation crashed at ingest reading that bound)."""
    torch._dynamo.reset()
    backend = make_backend(validate="raise")

    def shifted(x, n):
        return x.roll(n, 1) * n + x.size(1)

    compiled = torch.compile(shifted, backend=backend, dynamic=True)
    for n in (3, -2, 5):
        x = torch.randn(2, 6 + n % 3)
        torch.testing.assert_close(compiled(x, n), shifted(x, n))
    assert backend.reports and not any(r.extraction.fell_back for r in backend.reports)


def test_a_symbolic_size_in_the_shapes_a_module_was_built_for_fits_any_size():
    """An aot backward graph's generator state has a symbolic size (``s96``) beside the
    literal shapes a rewrite baked in: the size check wrote it as a name into the code it
    generated (a NameError in place of the explanation), and would have blamed the state
    for any size. Now it is written as its name in quotes and fits any size."""
    from backends.sizes import explain_sizes_of

    gm = torch.fx.symbolic_trace(lambda x, state: x.reshape(2, 3) + state.sum())
    explain_sizes_of(gm.graph, ["x", "state"], {"x": (2, 3), "state": ("s96",)},
                     ["reshape to (2, 3)"])
    gm.recompile()
    assert gm(torch.ones(2, 3), torch.ones(7)).shape == (2, 3)
    with pytest.raises(SizeMismatch) as raised:
        gm(torch.ones(3, 3), torch.ones(7))
    assert "'x' has shape (3, 3)" in str(raised.value) and "state" not in str(raised.value)


# -- a number made of a size is never its example's value ---------------------------------

_SCALAR_OPS = ["add", "sub", "mul", "div", "pow", "floordiv", "remainder", "sqrt", "exp",
               "log", "abs", "neg", "floor", "ceil"]


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(_SCALAR_OPS), hint=st.integers(2, 4096),
       other=st.one_of(st.integers(-50, 50), st.floats(-1e6, 1e6, allow_nan=False)),
       size_first=st.booleans())
def test_folding_a_symbolic_size_gives_a_size_or_nothing(op, hint, other, size_first):
    """Constant folding over a symbolic size gives a size (its result at every size) or
    no value at all: a float made of one is its example's value (``1.0 / s0`` was
    ``1/hint``, and ``x / x.numel()`` was emitted as ``x * 0.0111``), and its exact value
    is never the example's either."""
    from egraph.scalars import exact_of, fold

    unary = op in ("sqrt", "exp", "log", "abs", "neg", "floor", "ceil")

    def folded(size: Size):
        args = [(exact_of(size), size)] if unary else [
            (exact_of(size), size), (exact_of(other), other)][:: 1 if size_first else -1]
        return fold(op, args)

    (exact, value), (_, elsewhere) = folded(_size(hint)), folded(_size(hint + 1))
    assert exact is None
    assert value is None or isinstance(value, Size) or (  # a size, or a number that
        type(value) is int and value == elsewhere)         # is one at every size


def test_the_shape_of_a_slice_at_a_symbolic_size_is_inferred_once(monkeypatch):
    """Slicing at a symbolic size (a Llama's rotary tables, ``cos[:, :t]``, once per
    layer) infers its shape on fake tensors once: its signature holds the slice in a
    hashable form, so a second ingest of the graph runs no inference."""
    from frontends.fx import analysis

    class Sliced(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.randn(1, 64, 4))

        def forward(self, x):
            t = x.shape[1]
            return x * self.table[:, :t] + x * self.table[:, 1:t + 1]

    x, model = torch.randn(2, 6, 4), Sliced()
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {1: Dim("t", max=60)}})
    first = EGraph.from_fx(program, (x,))
    inferred = []
    infer = analysis._SymbolicShapes.infer
    monkeypatch.setattr(analysis._SymbolicShapes, "infer",
                        lambda self, op, key: inferred.append(op) or infer(self, op, key))
    again = EGraph.from_fx(program, (x,))
    assert not inferred
    for eg in (first, again):
        for other in (torch.randn(2, 9, 4), x):
            torch.testing.assert_close(eg.extract(Flops())(other), model(other))
