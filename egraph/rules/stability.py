"""Numerical stability: naive formulas to the forms that do not overflow or cancel.

Each rule is an identity over the reals under its side conditions (proven signs); the right
side keeps the left side's shape and dtype. Which form wins is the cost model's choice (the
curvature cost prefers these).

>>> next(r for r in RULES if r.name == "log1p").rewrite
Rewrite('log1p', '(log (add #int:1 ?x))' => '(log1p ?x)')
"""

from __future__ import annotations

import math

from egraph.ops import (
    abs,
    acosh,
    amax,
    asinh,
    clamp,
    cos,
    cosh,
    erf,
    erfc,
    exp,
    expm1,
    gather,
    hypot,
    log,
    log1p,
    log_softmax,
    logaddexp,
    logsigmoid,
    logsumexp,
    mean,
    ones_like,
    rsqrt,
    sigmoid,
    sin,
    softmax,
    softplus,
    sqrt,
    sum,
    tanh,
    var,
    where,
)
from egraph.rules.define import AB, LibraryRule, X, rule, torch
from egraph.rules.guards import (
    all_of,
    finite,
    floating,
    named,
    nonzero,
    positive,
    same_shape,
    value_of,
)
from egraph.term import vars

__all__ = ["RULES"]

LOADED = "all"
ORDER = 1

a, b, x, y, d, i, k = vars("a b x y d i k")
POS_AB = {"a": ((4, 8), "positive"), "b": ((4, 8), "positive")}
BOTH_POSITIVE = all_of(positive(a), positive(b))


@named("gather dim == softmax dim")
def _gather_dim_matches(egraph, subst) -> bool:
    dims, dim = value_of(egraph, subst["d"]), value_of(egraph, subst["i"])
    return isinstance(dims, tuple) and len(dims) == 1 and dims[0] == dim


CENTERED = x - mean(x, d, True)
# The 2-norm scaled by max|x| (keepdim, clamped away from 0 so that x = 0 divides by 1e-30).
_SCALED = x / clamp(amax(abs(x), d, True), 1e-30, None)

RULES: list[LibraryRule] = [
    rule("log-exp", log(exp(x)), x, example=lambda x: torch.log(torch.exp(x)), inputs=X,
         description="log(exp(x)) = x; exp overflows above 88 in fp32"),
    rule("exp-log", exp(log(x)), x, when=positive(x), example=lambda x: torch.exp(torch.log(x)),
         inputs={"x": ((4, 8), "positive")}, description="exp(log(x)) = x for x > 0"),
    rule("sqrt-square", sqrt(x * x), abs(x), example=lambda x: torch.sqrt(x * x), inputs=X,
         description="sqrt(x*x) = |x| without overflow of x*x"),
    rule("div-self", x / x, ones_like(x), when=all_of(nonzero(x), finite(x)),
         example=lambda x: x / x,
         inputs={"x": ((4, 8), "nonzero")},
         description="x / x = 1 for x != 0 (keeps x's shape and dtype)"),
    rule("log1p", log(1 + x), log1p(x), when=floating(x),
         example=(lambda x: torch.log(1 + x), lambda x: torch.log(x + 1)),
         inputs={"x": ((4, 8), "unit")},
         description="log(1 + x) loses x below fp eps; log1p(x) does not"),
    rule("erfc", 1 - erf(x), erfc(x), when=floating(x),
         example=lambda x: 1 - torch.erf(x), inputs=X,
         description="1 - erf(x) cancels where erf(x) nears 1 (x past 1); erfc(x) does not"),
    rule("expm1", exp(x) - 1, expm1(x), when=floating(x), example=lambda x: torch.exp(x) - 1,
         inputs=X, description="exp(x) - 1 cancels for small x"),
    rule("logsumexp", log(sum(exp(x), d, k)), logsumexp(x, d, k),
         example=lambda x: torch.log(torch.exp(x).sum(-1)), inputs=X,
         description="log(sum(exp(x))) overflows; logsumexp shifts by the max"),
    rule("softmax-shift", softmax(x - amax(x, d, True), d), softmax(x, d),
         example=lambda x: torch.softmax(x - x.amax(-1, keepdim=True), -1), inputs=X,
         description="softmax is invariant to the max shift (it shifts internally)"),
    rule("log-softmax", log(softmax(x, d)), log_softmax(x, d),
         example=lambda x: torch.log(torch.softmax(x, -1)), inputs=X,
         description="log(softmax(x)) underflows to -inf; log_softmax does not"),
    rule("log-gather-softmax", log(gather(softmax(x, d), i, y)),
         gather(log_softmax(x, d), i, y), when=_gather_dim_matches,
         example=lambda x, y: -torch.log(torch.softmax(x, -1).gather(-1, y)),
         inputs={"x": (4, 8), "y": ((4, 1), "index:8")},
         description="cross-entropy from probabilities: -log(softmax(x)[y]) on logits"),
    rule("sigmoid", 1 / (1 + exp(-x)), sigmoid(x), when=floating(x),
         example=lambda x: 1 / (1 + torch.exp(-x)), inputs=X,
         description="1/(1+exp(-x)) overflows for x << 0"),
    rule("logsigmoid", log(sigmoid(x)), logsigmoid(x),
         example=lambda x: torch.log(torch.sigmoid(x)), inputs=X,
         description="log(sigmoid(x)) underflows for x << 0"),
    rule("softplus", log(1 + exp(x)), softplus(x, 1.0, 20.0), when=floating(x),
         example=lambda x: torch.log(1 + torch.exp(x)), inputs=X,
         description="log(1 + exp(x)) overflows for x > 88"),
    rule("softplus-log1p", log1p(exp(x)), softplus(x, 1.0, 20.0),
         example=lambda x: torch.log1p(torch.exp(x)), inputs=X,
         description="log1p(exp(x)) = softplus(x)"),
    rule("log1mexp", log(1 - exp(-x)),
         where(x < math.log(2), log(-expm1(-x)), log1p(-exp(-x))), when=positive(x),
         example=lambda x: torch.log(1 - torch.exp(-x)), inputs={"x": ((4, 8), "positive")},
         description="log(1 - exp(-x)) for x > 0: the two-branch form (Maechler 2012)"),
    rule("scaled-norm", sqrt(sum(x * x, d, k)),
         amax(abs(x), d, k) * sum(_SCALED * _SCALED, d, k) ** 0.5, when=floating(x),
         example=lambda x: torch.sqrt((x * x).sum(-1)), inputs=X,
         description="the 2-norm scaled by max|x|, so x*x cannot overflow or underflow"),
    # Powers in one canonical form (x**2, pow(x, 2), square are x*x; x**-0.5 is rsqrt):
    # the variance, norm and softmax rules below are written over these forms, so the
    # powers belong with them (the stability rewriter loads this family alone).
    rule("pow-two", x ** 2, x * x, when=floating(x), example=lambda x: x ** 2, inputs=X,
         description="x^2 = x x"),
    rule("pow-one", x ** 1, x, when=floating(x), example=lambda x: x ** 1, inputs=X,
         description="x^1 = x"),
    rule("pow-three", x * x * x, x ** 3, when=floating(x),
         example=(lambda x: x * x * x, lambda x: x * (x * x)), inputs=X,
         description="x x x = x^3"),
    rule("pow-half", x ** 0.5, sqrt(x), when=floating(x), example=lambda x: x ** 0.5,
         inputs={"x": ((4, 8), "nonneg")}, description="x^0.5 is sqrt(x)"),
    rule("pow-minus-half", x ** -0.5, rsqrt(x), when=floating(x),
         example=lambda x: torch.pow(x, -0.5), inputs={"x": ((4, 8), "positive")},
         description="x^-0.5 is rsqrt(x)"),
    rule("pow-minus-one", x ** -1, 1 / x, when=floating(x), example=lambda x: x ** -1,
         inputs={"x": ((4, 8), "nonzero")}, description="x^-1 is 1 / x"),
    # Variance, written once with x*x.
    rule("var-two-pass", mean(x * x, d, k) - mean(x, d, k) * mean(x, d, k), var(x, d, 0, k),
         example=lambda x: (x * x).mean(-1) - x.mean(-1) * x.mean(-1), inputs=X,
         description="E[x^2] - E[x]^2 cancels catastrophically; var is two-pass"),
    rule("var-centered", mean(CENTERED * CENTERED, d, k), var(x, d, 0, k),
         example=lambda x: ((x - x.mean(-1, keepdim=True)) * (x - x.mean(-1, keepdim=True)))
         .mean(-1, keepdim=True), inputs=X,
         description="the mean square of the centred values is the (population) variance"),
    rule("sqrt-diff", sqrt(a) - sqrt(b), (a - b) / (sqrt(a) + sqrt(b)), when=BOTH_POSITIVE,
         example=lambda a, b: torch.sqrt(a) - torch.sqrt(b), inputs=POS_AB,
         description="sqrt(a) - sqrt(b) cancels when a ~ b"),
    rule("recip-diff", 1 / a - 1 / b, (b - a) / (a * b), when=all_of(nonzero(a), nonzero(b)),
         example=lambda a, b: 1 / a - 1 / b, inputs=POS_AB,
         description="1/a - 1/b cancels when a ~ b"),
    rule("log-diff", log(a) - log(b), log(a / b), when=BOTH_POSITIVE,
         example=lambda a, b: torch.log(a) - torch.log(b), inputs=POS_AB,
         description="log(a) - log(b) cancels when a ~ b"),
    rule("log-ratio", log(a / b), log1p((a - b) / b), when=BOTH_POSITIVE,
         example=lambda a, b: torch.log(a / b), inputs=POS_AB,
         description="log(a/b) near a ~ b: log1p of the relative difference"),
    rule("cos-diff", cos(a) - cos(b), -2.0 * (sin((a + b) / 2.0) * sin((a - b) / 2.0)),
         when=all_of(floating(a), floating(b)),
         example=lambda a, b: torch.cos(a) - torch.cos(b), inputs=AB,
         description="cos(a) - cos(b) cancels when a ~ b; the product form does not"),
    rule("exp-ratio", exp(a) / exp(b), exp(a - b),
         example=lambda a, b: torch.exp(a) / torch.exp(b), inputs=AB,
         description="exp(a)/exp(b) overflows first"),
    rule("one-minus-sigmoid", 1 - sigmoid(x), sigmoid(-x), when=floating(x),
         example=lambda x: 1 - torch.sigmoid(x), inputs=X,
         description="1 - sigmoid(x) cancels for x >> 0"),
    rule("log-one-minus-sigmoid", log(1 - sigmoid(x)), logsigmoid(-x), when=floating(x),
         example=lambda x: torch.log(1 - torch.sigmoid(x)), inputs=X,
         description="log(1 - sigmoid(x)) = logsigmoid(-x)"),
    rule("tanh-from-exp", (exp(x) - exp(-x)) / (exp(x) + exp(-x)), tanh(x),
         example=lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)),
         inputs=X, description="tanh from exponentials overflows for |x| > 88"),
    rule("logaddexp", log(exp(a) + exp(b)), logaddexp(a, b),
         example=lambda a, b: torch.log(torch.exp(a) + torch.exp(b)), inputs=AB,
         description="log(exp(a) + exp(b)) overflows; logaddexp shifts by the max"),
    rule("log-cosh", log(cosh(x)), logaddexp(x, -x) - math.log(2), when=floating(x),
         description="cosh overflows for |x| > 89 in float32 though log(cosh(x)) is about "
                     "|x|: logaddexp(x, -x) - log 2 (Keras' LogCosh loss) does not"),
    rule("hypot", sqrt(a * a + b * b), hypot(a, b),
         example=lambda a, b: torch.sqrt(a * a + b * b), inputs=AB,
         description="sqrt(a^2 + b^2) overflows; hypot scales"),
    rule("log-square", log(x * x), 2.0 * log(abs(x)), when=nonzero(x),
         example=lambda x: torch.log(x * x), inputs={"x": ((4, 8), "nonzero")},
         description="log(x^2) = 2 log|x| without overflow of x^2"),
    # the inverse hyperbolic functions from their logarithms (Herbie's *-def rules, read
    # towards the function)
    rule("asinh", log(x + sqrt(x * x + 1)), asinh(x), when=floating(x),
         example=lambda x: torch.log(x + torch.sqrt(x * x + 1)), inputs=X,
         description="asinh x = log(x + sqrt(x^2 + 1)): the logarithm cancels for x < 0, "
                     "loses x near 0 and overflows x^2 for |x| > 1.8e19 in float32; NaN "
                     "only for a NaN x on both sides"),
    rule("asinh-abs", log(abs(x) + sqrt(x * x + 1)), asinh(abs(x)), when=floating(x),
         example=lambda x: torch.log(torch.abs(x) + torch.sqrt(x * x + 1)), inputs=X,
         description="asinh |x| = log(|x| + sqrt(x^2 + 1)): as asinh, for the magnitude "
                     "(libraries' copysign(log(|x| + ...), x))"),
    rule("acosh", log(x + sqrt(x * x - 1)), acosh(x), when=all_of(floating(x), positive(x)),
         example=lambda x: torch.log(x + torch.sqrt(x * x - 1)),
         inputs={"x": ((4, 8), "positive")},
         description="acosh x = log(x + sqrt(x^2 - 1)) for x >= 1 (x^2 overflows past "
                     "1.8e19 in float32); both NaN in (0, 1); guarded positive, since for "
                     "x <= -1 both are NaN only in floating point"),
    rule("add-sub-cancel", (a + b) - a, b, when=same_shape(a, b),
         example=(lambda a, b: (a + b) - a, lambda a, b: (a + b) - b), inputs=AB,
         description="(a + b) - a = b: no cancellation of a large a (same shapes, so b alone "
                     "keeps the result's shape)"),
]
