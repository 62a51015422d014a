"""The first-order error analysis predicts the error a program makes in its working dtype."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.stability import StabilityRewriter, error_bits
from frontends.fx.error_analysis import rounding_error


def _trace(fn):
    return torch.fx.symbolic_trace(fn)


def _measured(fn, inputs, dtype):
    with torch.no_grad():
        got = fn(*[x.to(dtype) for x in inputs])
        ref = fn(*[x.to(dtype).double() for x in inputs])
    return error_bits(got, ref, dtype), error_bits(got, ref, dtype, "max")


CASES = {
    "log(1 + x), tiny x": (lambda x: torch.log(1 + x), lambda g: torch.rand(64, generator=g)
                           * 1e-5),
    "log1p(x), tiny x": (lambda x: torch.log1p(x), lambda g: torch.rand(64, generator=g) * 1e-5),
    "sqrt difference": (lambda x: torch.sqrt(x + 1) - torch.sqrt(x),
                        lambda g: torch.rand(64, generator=g) * 1e4 + 1e4),
    "exp(x) - 1, small x": (lambda x: torch.exp(x) - 1,
                            lambda g: torch.randn(64, generator=g) * 1e-3),
    "one-pass variance": (lambda x: (x * x).mean(-1) - x.mean(-1) ** 2,
                          lambda g: torch.randn((8, 64), generator=g) + 300.0),
    "naive softmax, overflow": (lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
                                lambda g: torch.randn((4, 16), generator=g) * 60),
    "softmax, large shift": (lambda x: torch.softmax(x, -1),
                             lambda g: torch.randn((4, 16), generator=g) * 30),
    "sigmoid from exp": (lambda x: 1 / (1 + torch.exp(-x)),
                         lambda g: torch.randn(64, generator=g) * 40),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_predicted_error_is_close_to_the_measured_error(name, dtype):
    fn, sample = CASES[name]
    x = sample(torch.Generator().manual_seed(0)).to(dtype)
    predicted = rounding_error(_trace(fn), (x,))
    mean, worst = _measured(fn, (x,), dtype)
    assert predicted.dtype == dtype
    assert abs(predicted.mean_bits - mean) <= 1.5, (predicted.mean_bits, mean)
    assert abs(predicted.worst_bits - worst) <= 3.0, (predicted.worst_bits, worst)


def test_overflow_is_followed_through_later_ops():
    # fp32 exp(100) is inf: 1 / (1 + inf) = 0 misses the true 3.7e-44 by ~5 bits of the
    # smallest normal number's spacing; inf / inf is nan
    x = torch.full((8,), -100.0)
    sigmoid = lambda x: 1 / (1 + torch.exp(-x))  # noqa: E731
    predicted = rounding_error(_trace(sigmoid), (x,)).worst_bits
    assert abs(predicted - _measured(sigmoid, (x,), torch.float32)[1]) < 0.5
    naive = _trace(lambda x: torch.exp(-x) / torch.exp(-x).sum(-1, keepdim=True))
    assert rounding_error(naive, (x,)).worst_bits == 24
    half = rounding_error(_trace(lambda x: torch.exp(x) * 0), (torch.full((4,), 12.0).half(),))
    assert half.worst_bits == 11  # exp overflows fp16 above 11.09, and inf * 0 is nan


def test_exact_ops_add_nothing_and_per_node_bits_locate_the_loss():
    x = torch.linspace(1, 2, 32).reshape(4, 8)
    exact = rounding_error(_trace(lambda x: (-x).reshape(8, 4).t().abs()), (x,))
    assert exact.mean_bits == 0 and exact.worst_bits == 0
    analysis = rounding_error(_trace(lambda x: torch.log(torch.exp(x * 1e-6) - 1)), (x,))
    added = {name: added for name, (_, _, added) in analysis.per_node.items()}
    assert max(added, key=added.get) == "sub"  # the cancellation, not the log or exp
    assert "sub" in str(analysis)


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def test_modules_are_analysed_without_being_changed():
    torch.manual_seed(0)
    model = _MLP().half()
    state = copy.deepcopy(model.state_dict())
    x = torch.randn(16, 32).half()
    predicted = rounding_error(_trace(model), (x,))
    with torch.no_grad():
        got = model(x)
        wide = copy.deepcopy(model).double()
        ref = wide(x.double())
    mean = error_bits(got, ref, torch.float16)
    assert abs(predicted.mean_bits - mean) <= 1.5
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert next(model.parameters()).dtype == torch.float16


def test_float64_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="float32"):
        rounding_error(_trace(lambda x: torch.exp(x)), (torch.ones(3, dtype=torch.float64),))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["exp", "log", "sqrt", "tanh", "sigmoid", "reciprocal"]),
       st.floats(0.01, 50.0), st.integers(0, 2**16))
def test_one_correctly_rounded_op_is_predicted_within_a_bit(name, scale, seed):
    x = torch.rand(64, generator=torch.Generator().manual_seed(seed)) * scale + 0.01
    op = getattr(torch, name)
    predicted = rounding_error(_trace(lambda x: op(x)), (x,))
    mean, worst = _measured(op, (x,), torch.float32)
    assert 0 <= predicted.mean_bits <= 0.6
    assert abs(predicted.mean_bits - mean) <= 1.0 and worst <= 2.0


def test_rewrites_predicted_less_accurate_are_not_applied():
    # Without overflow the naive softmax is the more accurate one: its inputs are exact,
    # while the max-shifted form rounds x - max(x) before the exp.
    naive = lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)  # noqa: E731
    moderate = (torch.randn((8, 16), generator=torch.Generator().manual_seed(0)) * 10,)
    kept = StabilityRewriter().optimize(naive, moderate)
    report = kept.meta["stability_report"]
    assert not report.rewrites and report.rejected
    assert "not applied" in str(report)
    assert report.bits_after <= report.bits_before
    large = (moderate[0] * 10,)
    fixed = StabilityRewriter().optimize(naive, large).meta["stability_report"]
    assert fixed.rewrites and not fixed.rejected and fixed.bits_after < fixed.bits_before


def test_curvature_on_input_ranges():
    naive = lambda x: torch.log(torch.exp(x).sum(-1))  # noqa: E731
    x = torch.zeros((4, 16))
    rewriter = StabilityRewriter()
    assert rewriter.curvature(naive, (x,)).worst < 1
    wide = rewriter.curvature(naive, (x,), ranges={"x": (80.0, 100.0)})
    assert wide.worst == 24 and math.isfinite(wide.risk)
    assert "cost model" in str(wide)


def test_bfloat16_pipeline_fixes_the_one_pass_variance():
    naive = lambda x: (x * x).mean(-1) - x.mean(-1) ** 2  # noqa: E731
    x = torch.randn((8, 64), generator=torch.Generator().manual_seed(0)) + 30.0
    fixed = StabilityRewriter().optimize(naive, (x,), dtype=torch.bfloat16)
    report = fixed.meta["stability_report"]
    assert report.dtype == "bfloat16" and report.rewrites
    assert report.curvature_after < report.curvature_before
    assert report.bits_after + 1 < report.bits_before
    assert fixed(x.bfloat16()).dtype == torch.bfloat16
