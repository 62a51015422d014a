"""Programs that draw random numbers: every spelling torch's schemas tag as random is
judged against the source under one seed (never against a float64 run, whose draws are
other numbers), and a generator the model holds is drawn from as the source draws from
it, without compiling moving it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compiler.validate import validate_module
from egraph import AstSize, EGraph
from egraph.rules import load_rules
from extractors import Flops
from frontends.fx.effects import draws_random
from frontends.fx.kept import generators_kept, generators_of

SPELLINGS = {
    "normal": lambda x, k: x + k * torch.normal(0.0, 1.0, size=x.shape),
    "normal_of_means": lambda x, k: x + k * (torch.normal(x, 0.1) - x),
    "uniform_": lambda x, k: x + k * torch.empty_like(x).uniform_(-1, 1),
    "normal_": lambda x, k: x + k * x.new_empty(x.shape).normal_(),
    "exponential_": lambda x, k: x + k * torch.empty_like(x).exponential_(),
    "randint": lambda x, k: x + k * torch.randint(0, 5, x.shape),
    "randperm": lambda x, k: x * 2 + k * x[:, torch.randperm(x.shape[1])],
    "poisson": lambda x, k: x + k * torch.poisson(x.abs()),
    "multinomial": lambda x, k: x + k * torch.multinomial(x.softmax(-1), 6).float(),
}


class _Spelled(nn.Module):
    def __init__(self, spelling, k=1.0):
        super().__init__()
        self.spelling, self.k = spelling, k

    def forward(self, x):
        return self.spelling(x, self.k)


@pytest.mark.parametrize("name", SPELLINGS)
def test_a_program_that_draws_other_numbers_is_refused(name):
    """A float64 run draws other numbers than the source's float32 one, so judged against
    it the source's own error is large and any program within it passed: a program
    whose noise is 1.5 times the source's passed validation."""
    x = torch.randn(4, 6)
    program = torch.export.export(_Spelled(SPELLINGS[name]), (x,)).module()
    src = EGraph.from_fx(program, (x,)).fx
    assert src.random
    assert validate_module(src, _Spelled(SPELLINGS[name])).ok
    louder = validate_module(src, _Spelled(SPELLINGS[name], 1.5))
    assert not louder.ok and "error" in louder.reason


@pytest.mark.parametrize("name", SPELLINGS)
def test_each_random_spelling_draws_as_the_source(name):
    x = torch.randn(4, 6)
    model = _Spelled(SPELLINGS[name])
    program = torch.export.export(model, (x,)).module()
    opt = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(
        Flops(), validate="raise")
    torch.manual_seed(3)
    expected = model(x)
    torch.manual_seed(3)
    torch.testing.assert_close(opt(x), expected)


def test_draws_random_reads_the_schemas():
    assert draws_random(torch.randperm) and draws_random(torch.poisson)
    assert draws_random("bernoulli_", method=True) and draws_random("random_", method=True)
    # (attention draws only with dropout_p, dropout only in training: told apart by ingest)
    assert not draws_random(torch.nn.functional.scaled_dot_product_attention)
    assert not draws_random(torch.ops.aten.native_dropout.default)
    assert draws_random(torch.ops.aten.randint.low_generator)
    assert not draws_random(torch.exp) and not draws_random("add_", method=True)
    assert not draws_random(torch.ops.aten.empty_like.default) and not draws_random(print)


class _Noisy(nn.Module):
    """Noise from a generator of its own (``torch.randn(..., generator=self.gen)``)."""

    def __init__(self):
        super().__init__()
        self.gen = torch.Generator().manual_seed(1)

    def forward(self, x):
        return x * 2 + torch.randn(x.shape, generator=self.gen) * 0.5 + torch.rand(
            x.shape, generator=self.gen)


def _captured(model, route, x):
    if route == "exported_program":
        return torch.export.export(model, (x,))
    if route == "export":
        return torch.export.export(model, (x,)).module()
    return torch.fx.symbolic_trace(model)


@pytest.mark.parametrize("route", ["exported_program", "export", "symbolic_trace"])
def test_a_generator_the_model_holds_is_drawn_from_in_turn(route):
    """torch.export lifts the generator to an input of its program and to an attribute of
    the program's module, symbolic_trace to an attribute: ingest refused each ("cannot
    make a literal of Generator"; the program "takes 2 inputs")."""
    x = torch.randn(5)
    model = _Noisy()
    program = _captured(model, route, x)
    # (torch.export holds a copy of the model's generator)
    (held,) = ([v for v in program.constants.values() if isinstance(v, torch.Generator)]
               if route == "exported_program" else generators_of(program))
    before = held.get_state()
    opt = EGraph.from_fx(program, (x,)).saturate(load_rules("all")).extract(
        Flops(), validate="raise")
    assert torch.equal(held.get_state(), before), "compiling drew from the model's generator"
    twin = _Noisy()
    for _ in range(3):  # each call draws the next numbers, as the source's calls do
        torch.testing.assert_close(opt(x), twin(x))


def test_a_generator_the_model_holds_through_torch_compile():
    x = torch.randn(5)
    model, twin = _Noisy(), _Noisy()
    compiled = torch.compile(model, backend="egraph")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), twin(x))


def test_generators_kept_gives_the_states_back():
    model = _Noisy()
    program = torch.fx.symbolic_trace(model)
    with generators_kept(program) as held:
        first = program(torch.zeros(3))
    assert held == [model.gen]
    torch.testing.assert_close(program(torch.zeros(3)), first)


def _noisy_cancellation(x):
    """Draws a mask, then adds a difference float32 rounds to about 1e-8 of x, amplified
    a million times: the source in float32 is off by about 1e-2, in float64 by 1e-11."""
    mask = torch.empty_like(x).bernoulli_(0.5)
    return x * mask + ((x * 0.1) * 3 - x * 0.3) * 1e6


def test_a_random_program_the_working_dtype_source_cannot_judge_is_judged_in_float64():
    """Where the float32 source is itself off (a deep network with batch statistics of
    few elements in training, timm's EfficientNet with stochastic depth), the program is
    judged against the source in float64 that draws the float32 run's numbers: it was
    refused outright, since float64 draws others."""
    x = torch.randn(64)
    src = EGraph.from_fx(torch.fx.symbolic_trace(_noisy_cancellation), (x,)).fx
    assert src.random

    def exact(x):
        return x * torch.empty_like(x).bernoulli_(0.5)

    def wrong_mask(x):
        return x * (1 - torch.empty_like(x).bernoulli_(0.5))

    judged = validate_module(src, _Spelled(lambda x, k: exact(x)))
    assert judged.ok and "float64" in judged.reference
    assert not validate_module(src, _Spelled(lambda x, k: wrong_mask(x))).ok


class _DropoutOfAClone(nn.Module):
    """Dropout of a value the source made contiguous (ingest drops the ``contiguous``)."""

    def forward(self, x):
        return F.dropout(torch.exp(x.t().contiguous()), 0.5, training=True)


@pytest.mark.parametrize("trace", ["symbolic", "export"])
def test_a_random_op_is_given_its_operand_in_the_sources_layout(trace):
    """A random op draws in its operand's memory order: given ``exp(x.t())`` strided, where
    the source's operand was contiguous, dropout kept other elements than eager's and
    validation refused the program. Its operand is made contiguous as the source's was,
    and the masks are eager's."""
    model, x = _DropoutOfAClone(), torch.randn(4, 6)
    source = (torch.fx.symbolic_trace(model) if trace == "symbolic"
              else torch.export.export(model, (x,)))
    opt = EGraph.from_fx(source, (x,)).extract(AstSize(), validate="raise")
    torch.manual_seed(3)
    got = opt(x)
    torch.manual_seed(3)
    assert torch.equal(got, model(x))
