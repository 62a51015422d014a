"""Herbie's rule database in our vocabulary: the general identities Herbie (Panchekha et al.,
PLDI 2015) rewrites with where the error is localised (associativity with subtraction and
division, distributivity over differences, difference of squares and cubes, the flips of
sums and differences, fraction arithmetic, exp/log/pow, trigonometric and hyperbolic
identities). The commutative, associative and distributive laws of sums and products,
``exp(a + b)``, ``log(a b)`` and the stable forms live in ``algebra`` and ``stability``.

NaN behaviour, rule by rule in each description: most are identities wherever both sides are
defined. The flips divide by ``a + b`` (``a - b``), undefined (NaN) where that is zero and
the left side is not; log, pow and sqrt rules are guarded to the signs where both sides are
defined, so a NaN of the left side stays a NaN. Which form is more accurate depends on the
inputs, so the family is not part of ``load_rules("all")``: it multiplies every sum and
difference of a model (flips, fractions), and is meant for :mod:`compiler.herbie`, which
saturates it on one localised formula at a time and measures the candidates.

>>> next(r for r in RULES if r.name == "flip-sub").rewrite
Rewrite('flip-sub', '(sub ?a ?b)' => '(div (sub (mul ?a ?a) (mul ?b ?b)) (add ?a ?b))')
"""

from __future__ import annotations

from egraph.ops import cos, exp, expm1, log, log1p, sin, sqrt, tanh
from egraph.rules.define import AB, ABC, LibraryRule, X, rule, torch
from egraph.rules.guards import ONE_DTYPE, all_of, nonneg, positive, same_dtype
from egraph.term import vars

__all__ = ["RULES"]

# Loaded only by name (its flips and fraction rules multiply every sum of a model: for the accuracy
# search on one localised formula).
LOADED = "by name"
ORDER = 10

a, b, c, d, x = vars("a b c d x")
ABCD = {"a": (4, 8), "b": (4, 8), "c": (4, 8), "d": (4, 8)}
POS_AB = {"a": ((4, 8), "positive"), "b": ((4, 8), "positive")}
ALL_ONE_DTYPE = same_dtype(a, b, c, d)

RULES: list[LibraryRule] = [
    # associativity with subtraction and division (Herbie's associate-*)
    rule("assoc-add-sub", (a + b) - c, a + (b - c), when=ONE_DTYPE,
         example=lambda a, b, c: (a + b) - c, inputs=ABC,
         description="(a + b) - c = a + (b - c); no NaN of its own"),
    rule("assoc-sub-add", (a - b) + c, a - (b - c), when=ONE_DTYPE,
         example=lambda a, b, c: (a - b) + c, inputs=ABC,
         description="(a - b) + c = a - (b - c); no NaN of its own"),
    rule("assoc-sub-sub", (a - b) - c, a - (b + c), when=ONE_DTYPE,
         example=lambda a, b, c: (a - b) - c, inputs=ABC,
         description="(a - b) - c = a - (b + c); no NaN of its own"),
    rule("assoc-sub-rsub", a - (b - c), (a - b) + c, when=ONE_DTYPE,
         example=lambda a, b, c: a - (b - c), inputs=ABC,
         description="a - (b - c) = (a - b) + c; no NaN of its own"),
    rule("assoc-mul-div", a * (b / c), (a * b) / c, when=ONE_DTYPE,
         example=lambda a, b, c: a * (b / c), inputs=ABC,
         description="a (b / c) = (a b) / c; NaN where c = 0 on both sides"),
    rule("assoc-div-mul", (a * b) / c, a * (b / c), when=ONE_DTYPE,
         example=lambda a, b, c: (a * b) / c, inputs=ABC,
         description="(a b) / c = a (b / c); NaN where c = 0 on both sides"),
    rule("assoc-div-div", (a / b) / c, a / (b * c), when=ONE_DTYPE,
         example=lambda a, b, c: (a / b) / c, inputs=ABC,
         description="(a / b) / c = a / (b c); undefined where b or c is 0 on both sides"),
    rule("assoc-div-rdiv", a / (b / c), (a * c) / b, when=ONE_DTYPE,
         example=lambda a, b, c: a / (b / c), inputs=ABC,
         description="a / (b / c) = (a c) / b; undefined where b is 0 on both sides"),
    # distributivity over differences
    rule("distribute-sub", a * (b - c), a * b - a * c, when=ONE_DTYPE,
         example=lambda a, b, c: a * (b - c), inputs=ABC,
         description="a (b - c) = ab - ac; no NaN of its own"),
    rule("factor-sub", a * b - a * c, a * (b - c), when=ONE_DTYPE,
         example=lambda a, b, c: a * b - a * c, inputs=ABC,
         description="ab - ac = a (b - c); no NaN of its own"),
    # difference of squares and cubes, and the flips
    rule("difference-of-squares", a * a - b * b, (a + b) * (a - b),
         example=lambda a, b: a * a - b * b, inputs=AB,
         description="a^2 - b^2 = (a + b)(a - b); no NaN of its own"),
    rule("difference-of-cubes", a * a * a - b * b * b, (a - b) * (a * a + (a * b + b * b)),
         example=lambda a, b: a * a * a - b * b * b, inputs=AB,
         description="a^3 - b^3 = (a - b)(a^2 + ab + b^2); no NaN of its own"),
    rule("flip-sub", a - b, (a * a - b * b) / (a + b), when=same_dtype(a, b),
         example=lambda a, b: a - b, inputs=AB,
         description="a - b = (a^2 - b^2) / (a + b): the cancellation done exactly when a "
                     "and b are roots; NaN where a = -b"),
    rule("flip-add", a + b, (a * a - b * b) / (a - b), when=same_dtype(a, b),
         example=lambda a, b: a + b, inputs=AB,
         description="a + b = (a^2 - b^2) / (a - b); NaN where a = b"),
    rule("flip3-sub", a - b, (a * a * a - b * b * b) / (a * a + (a * b + b * b)),
         when=same_dtype(a, b), example=lambda a, b: a - b, inputs=AB,
         description="a - b = (a^3 - b^3) / (a^2 + ab + b^2): for cube roots; NaN where "
                     "a = b = 0"),
    rule("flip3-add", a + b, (a * a * a + b * b * b) / (a * a + (b * b - a * b)),
         when=same_dtype(a, b), example=lambda a, b: a + b, inputs=AB,
         description="a + b = (a^3 + b^3) / (a^2 - ab + b^2); NaN where a = b = 0"),
    # fraction arithmetic
    rule("frac-add", a / b + c / d, (a * d + b * c) / (b * d), when=ALL_ONE_DTYPE,
         example=lambda a, b, c, d: a / b + c / d, inputs=ABCD,
         description="a/b + c/d = (ad + bc) / (bd); undefined where b or d is 0 on both "
                     "sides"),
    rule("frac-sub", a / b - c / d, (a * d - b * c) / (b * d), when=ALL_ONE_DTYPE,
         example=lambda a, b, c, d: a / b - c / d, inputs=ABCD,
         description="a/b - c/d = (ad - bc) / (bd); undefined where b or d is 0 on both "
                     "sides"),
    rule("frac-times", (a / b) * (c / d), (a * c) / (b * d), when=ALL_ONE_DTYPE,
         example=lambda a, b, c, d: (a / b) * (c / d), inputs=ABCD,
         description="(a/b)(c/d) = (ac) / (bd); undefined where b or d is 0 on both sides"),
    rule("div-add-split", (a + b) / c, a / c + b / c, when=ONE_DTYPE,
         example=lambda a, b, c: (a + b) / c, inputs=ABC,
         description="(a + b) / c = a/c + b/c; undefined where c = 0 on both sides"),
    rule("div-sub-split", (a - b) / c, a / c - b / c, when=ONE_DTYPE,
         example=lambda a, b, c: (a - b) / c, inputs=ABC,
         description="(a - b) / c = a/c - b/c; undefined where c = 0 on both sides"),
    rule("sub-div-join", a / c - b / c, (a - b) / c, when=ONE_DTYPE,
         example=lambda a, b, c: a / c - b / c, inputs=ABC,
         description="a/c - b/c = (a - b) / c; undefined where c = 0 on both sides"),
    # exp, log and pow
    # Not in "all": on a tensor program the factors only add work, and a cost model that
    # misjudges their range emits exp(a) * exp(-b) where exp(a - b) was finite (inf * 0).
    rule("exp-add", exp(a + b), exp(a) * exp(b), example=lambda a, b: torch.exp(a + b),
         inputs=AB, description="exp(a + b) = exp(a) exp(b); NaN-free where both sides are finite"),
    rule("exp-diff", exp(a - b), exp(a) / exp(b), example=lambda a, b: torch.exp(a - b),
         inputs=AB, description="exp(a - b) = exp(a) / exp(b); no NaN over the reals (the "
                                "right side overflows sooner)"),
    rule("exp-neg", exp(-a), 1 / exp(a), example=lambda a: torch.exp(-a),
         inputs={"a": (4, 8)}, description="exp(-a) = 1 / exp(a); no NaN of its own"),
    rule("log-div", log(a / b), log(a) - log(b), when=all_of(positive(a), positive(b)),
         example=lambda a, b: torch.log(a / b), inputs=POS_AB,
         description="log(a/b) = log a - log b for a, b > 0 (guarded: elsewhere the left "
                     "side may be defined and the right not)"),
    rule("sum-log", log(a) + log(b), log(a * b), when=all_of(positive(a), positive(b)),
         example=lambda a, b: torch.log(a) + torch.log(b), inputs=POS_AB,
         description="log a + log b = log(ab) for a, b > 0 (guarded: a, b < 0 make the "
                     "right side a number where the left is NaN)"),
    rule("log-pow", log(a ** b), b * log(a), when=positive(a),
         example=lambda a, b: torch.log(a ** b), inputs={"a": ((4, 8), "positive"),
                                                         "b": (4, 8)},
         description="log(a^b) = b log a for a > 0 (guarded)"),
    rule("pow-as-exp", a ** b, exp(log(a) * b), when=positive(a),
         example=lambda a, b: a ** b, inputs={"a": ((4, 8), "positive"), "b": (4, 8)},
         description="a^b = exp(b log a) for a > 0 (guarded: a negative base with an "
                     "integer power is defined on the left only)"),
    rule("sqrt-prod", sqrt(a * b), sqrt(a) * sqrt(b), when=all_of(nonneg(a), nonneg(b)),
         example=lambda a, b: torch.sqrt(a * b), inputs=POS_AB,
         description="sqrt(ab) = sqrt(a) sqrt(b) for a, b >= 0 (guarded)"),
    rule("sqrt-div", sqrt(a / b), sqrt(a) / sqrt(b), when=all_of(nonneg(a), positive(b)),
         example=lambda a, b: torch.sqrt(a / b), inputs=POS_AB,
         description="sqrt(a/b) = sqrt(a) / sqrt(b) for a >= 0, b > 0 (guarded)"),
    rule("log1p-expm1", log1p(expm1(x)), x, example=lambda x: torch.log1p(torch.expm1(x)),
         inputs=X, description="log1p(expm1(x)) = x; expm1(x) > -1, so no NaN"),
    rule("expm1-log1p", expm1(log1p(x)), x, when=nonneg(x),
         example=lambda x: torch.expm1(torch.log1p(x)), inputs={"x": ((4, 8), "nonneg")},
         description="expm1(log1p(x)) = x for x >= 0 (guarded: NaN below -1 on the left)"),
    # trigonometric and hyperbolic identities
    rule("sin-sum", sin(a + b), sin(a) * cos(b) + cos(a) * sin(b),
         example=lambda a, b: torch.sin(a + b), inputs=AB,
         description="sin(a + b) = sin a cos b + cos a sin b; no NaN of its own"),
    rule("cos-sum", cos(a + b), cos(a) * cos(b) - sin(a) * sin(b),
         example=lambda a, b: torch.cos(a + b), inputs=AB,
         description="cos(a + b) = cos a cos b - sin a sin b; no NaN of its own"),
    rule("sin-diff", sin(a) - sin(b), 2 * (cos((a + b) / 2) * sin((a - b) / 2)),
         example=lambda a, b: torch.sin(a) - torch.sin(b), inputs=AB,
         description="sin a - sin b = 2 cos((a+b)/2) sin((a-b)/2): the difference without "
                     "cancellation when a ~ b; no NaN of its own"),
    rule("one-minus-cos", 1 - cos(x), 2 * (sin(x / 2) * sin(x / 2)),
         example=lambda x: 1 - torch.cos(x), inputs=X,
         description="1 - cos x = 2 sin^2(x/2) (half angle): no cancellation near 0"),
    rule("sin-square", 1 - cos(x) * cos(x), sin(x) * sin(x),
         example=lambda x: 1 - torch.cos(x) * torch.cos(x), inputs=X,
         description="1 - cos^2 x = sin^2 x; no NaN of its own"),
    rule("cos-square", 1 - sin(x) * sin(x), cos(x) * cos(x),
         example=lambda x: 1 - torch.sin(x) * torch.sin(x), inputs=X,
         description="1 - sin^2 x = cos^2 x; no NaN of its own"),
    rule("sin-neg", sin(-x), -sin(x), example=lambda x: torch.sin(-x), inputs=X,
         description="sin is odd; no NaN of its own"),
    rule("cos-neg", cos(-x), cos(x), example=lambda x: torch.cos(-x), inputs=X,
         description="cos is even; no NaN of its own"),
    rule("tanh-expm1", tanh(x), expm1(2 * x) / (expm1(2 * x) + 2),
         example=lambda x: torch.tanh(x), inputs=X,
         description="tanh x = expm1(2x) / (expm1(2x) + 2): no cancellation near 0; inf/inf "
                     "(NaN) once expm1(2x) overflows (x > 44 in float32)"),
]
