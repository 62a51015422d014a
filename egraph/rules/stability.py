"""Numerical stability: naive formulas to the forms that do not overflow or cancel.

Each rule is an identity over the reals under its side conditions (proven signs, literal
values); the right side keeps the left side's shape and dtype. Which form wins is the cost
model's choice (the curvature cost prefers these).
"""

from __future__ import annotations

from egraph.rules import register
from egraph.rules.guards import (
    all_of,
    floating,
    literal_is,
    nonzero,
    positive,
    same_shape,
    value_of,
)

ONE = literal_is("one", 1)


def _stable(name, lhs, rhs, example, inputs, when=None, description=""):
    register("stability", name, lhs, rhs, example=example, inputs=inputs, when=when,
             description=description)


def _gather_dim_matches(egraph, subst) -> bool:
    dims, dim = value_of(egraph, subst["d"]), value_of(egraph, subst["i"])
    return isinstance(dims, tuple) and len(dims) == 1 and dims[0] == dim


_gather_dim_matches.__name__ = "gather dim == softmax dim"

X = {"x": (4, 8)}
AB = {"a": (4, 8), "b": (4, 8)}
POS_AB = {"a": ((4, 8), "positive"), "b": ((4, 8), "positive")}

_stable("log-exp", "(log (exp ?x))", "?x", "torch.log(torch.exp(x))", X,
        description="log(exp(x)) = x; exp overflows above 88 in fp32")
_stable("exp-log", "(exp (log ?x))", "?x", "torch.exp(torch.log(x))",
        {"x": ((4, 8), "positive")}, when=positive("x"), description="exp(log(x)) = x for x > 0")
_stable("sqrt-square", "(sqrt (mul ?x ?x))", "(abs ?x)", "torch.sqrt(x * x)", X,
        description="sqrt(x*x) = |x| without overflow of x*x")
_stable("div-self", "(div ?x ?x)", "(ones_like ?x)", "x / x", {"x": ((4, 8), "nonzero")},
        when=nonzero("x"), description="x / x = 1 for x != 0 (keeps x's shape and dtype)")
_stable("log1p", "(log (add ?one ?x))", "(log1p ?x)", "torch.log(1 + x)",
        {"x": ((4, 8), "unit")}, when=all_of(ONE, floating("x")),
        description="log(1 + x) loses x below fp eps; log1p(x) does not")
_stable("log1p-right", "(log (add ?x ?one))", "(log1p ?x)", "torch.log(x + 1)",
        {"x": ((4, 8), "unit")}, when=all_of(ONE, floating("x")),
        description="log(x + 1) = log1p(x)")
_stable("expm1", "(sub (exp ?x) ?one)", "(expm1 ?x)", "torch.exp(x) - 1", X,
        when=all_of(ONE, floating("x")), description="exp(x) - 1 cancels for small x")
_stable("logsumexp", "(log (sum (exp ?x) ?d ?k))", "(logsumexp ?x ?d ?k)",
        "torch.log(torch.exp(x).sum(-1))", X,
        description="log(sum(exp(x))) overflows; logsumexp shifts by the max")
_stable("softmax-shift", "(softmax (sub ?x (amax ?x ?d #bool:true)) ?d)", "(softmax ?x ?d)",
        "torch.softmax(x - x.amax(-1, keepdim=True), -1)", X,
        description="softmax is invariant to the max shift (it shifts internally)")
_stable("log-softmax", "(log (softmax ?x ?d))", "(log_softmax ?x ?d)",
        "torch.log(torch.softmax(x, -1))", X,
        description="log(softmax(x)) underflows to -inf; log_softmax does not")
_stable("log-gather-softmax", "(log (gather (softmax ?x ?d) ?i ?y))",
        "(gather (log_softmax ?x ?d) ?i ?y)",
        "-torch.log(torch.softmax(x, -1).gather(-1, y))",
        {"x": (4, 8), "y": ((4, 1), "index:8")}, when=_gather_dim_matches,
        description="cross-entropy from probabilities: -log(softmax(x)[y]) on logits")
_stable("sigmoid", "(div ?one (add ?one2 (exp (neg ?x))))", "(sigmoid ?x)",
        "1 / (1 + torch.exp(-x))", X,
        when=all_of(ONE, literal_is("one2", 1), floating("x")),
        description="1/(1+exp(-x)) overflows for x << 0")
_stable("logsigmoid", "(log (sigmoid ?x))", "(logsigmoid ?x)",
        "torch.log(torch.sigmoid(x))", X, description="log(sigmoid(x)) underflows for x << 0")
_stable("softplus", "(log (add ?one (exp ?x)))", "(softplus ?x #float:1.0 #float:20.0)",
        "torch.log(1 + torch.exp(x))", X, when=all_of(ONE, floating("x")),
        description="log(1 + exp(x)) overflows for x > 88")
_stable("softplus-log1p", "(log1p (exp ?x))", "(softplus ?x #float:1.0 #float:20.0)",
        "torch.log1p(torch.exp(x))", X, description="log1p(exp(x)) = softplus(x)")
_stable("log1mexp", "(log (sub ?one (exp (neg ?x))))",
        "(where (lt ?x #float:0.6931471805599453) (log (neg (expm1 (neg ?x)))) "
        "(log1p (neg (exp (neg ?x)))))",
        "torch.log(1 - torch.exp(-x))", {"x": ((4, 8), "positive")},
        when=all_of(ONE, positive("x")),
        description="log(1 - exp(-x)) for x > 0: the two-branch form (Maechler 2012)")
_stable("scaled-norm", "(sqrt (sum (mul ?x ?x) ?d ?k))",
        "(mul (amax (abs ?x) ?d ?k) (pow (sum (mul "
        "(div ?x (clamp (amax (abs ?x) ?d #bool:true) #float:1e-30 #none)) "
        "(div ?x (clamp (amax (abs ?x) ?d #bool:true) #float:1e-30 #none))) ?d ?k) "
        "#float:0.5))",
        "torch.sqrt((x * x).sum(-1))", X, when=floating("x"),
        description="the 2-norm scaled by max|x|, so x*x cannot overflow or underflow")
_stable("var-two-pass", "(sub (mean (mul ?x ?x) ?d ?k) (mul (mean ?x ?d ?k) (mean ?x ?d ?k)))",
        "(var ?x ?d #int:0 ?k)", "(x * x).mean(-1) - x.mean(-1) * x.mean(-1)", X,
        description="E[x^2] - E[x]^2 cancels catastrophically; var is two-pass")
_stable("var-two-pass-pow",
        "(sub (mean (pow ?x ?two) ?d ?k) (pow (mean ?x ?d ?k) ?two2))",
        "(var ?x ?d #int:0 ?k)", "(x ** 2).mean(-1) - x.mean(-1) ** 2", X,
        when=all_of(literal_is("two", 2), literal_is("two2", 2)),
        description="E[x^2] - E[x]^2 written with powers")
_stable("var-two-pass-mixed",
        "(sub (mean (mul ?x ?x) ?d ?k) (pow (mean ?x ?d ?k) ?two))",
        "(var ?x ?d #int:0 ?k)", "(x * x).mean(-1) - x.mean(-1) ** 2", X,
        when=literal_is("two", 2), description="E[x*x] - E[x]**2, the two spellings mixed")
_stable("sqrt-diff", "(sub (sqrt ?a) (sqrt ?b))",
        "(div (sub ?a ?b) (add (sqrt ?a) (sqrt ?b)))", "torch.sqrt(a) - torch.sqrt(b)",
        POS_AB, when=all_of(positive("a"), positive("b")),
        description="sqrt(a) - sqrt(b) cancels when a ~ b")
_stable("recip-diff", "(sub (div ?one ?a) (div ?one2 ?b))", "(div (sub ?b ?a) (mul ?a ?b))",
        "1 / a - 1 / b", POS_AB,
        when=all_of(ONE, literal_is("one2", 1), nonzero("a"), nonzero("b")),
        description="1/a - 1/b cancels when a ~ b")
_stable("log-diff", "(sub (log ?a) (log ?b))", "(log (div ?a ?b))",
        "torch.log(a) - torch.log(b)", POS_AB, when=all_of(positive("a"), positive("b")),
        description="log(a) - log(b) cancels when a ~ b")
_stable("log-ratio", "(log (div ?a ?b))", "(log1p (div (sub ?a ?b) ?b))",
        "torch.log(a / b)", POS_AB, when=all_of(positive("a"), positive("b")),
        description="log(a/b) near a ~ b: log1p of the relative difference")
_stable("cos-diff", "(sub (cos ?a) (cos ?b))",
        "(mul #float:-2.0 (mul (sin (div (add ?a ?b) #float:2.0)) "
        "(sin (div (sub ?a ?b) #float:2.0))))",
        "torch.cos(a) - torch.cos(b)", AB, when=all_of(floating("a"), floating("b")),
        description="cos(a) - cos(b) cancels when a ~ b; the product form does not")
_stable("exp-ratio", "(div (exp ?a) (exp ?b))", "(exp (sub ?a ?b))",
        "torch.exp(a) / torch.exp(b)", AB, description="exp(a)/exp(b) overflows first")
_stable("one-minus-sigmoid", "(sub ?one (sigmoid ?x))", "(sigmoid (neg ?x))",
        "1 - torch.sigmoid(x)", X, when=all_of(ONE, floating("x")),
        description="1 - sigmoid(x) cancels for x >> 0")
_stable("log-one-minus-sigmoid", "(log (sub ?one (sigmoid ?x)))", "(logsigmoid (neg ?x))",
        "torch.log(1 - torch.sigmoid(x))", X, when=all_of(ONE, floating("x")),
        description="log(1 - sigmoid(x)) = logsigmoid(-x)")
_stable("tanh-from-exp", "(div (sub (exp ?x) (exp (neg ?x))) (add (exp ?x) (exp (neg ?x))))",
        "(tanh ?x)", "(torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))", X,
        description="tanh from exponentials overflows for |x| > 88")
_stable("logaddexp", "(log (add (exp ?a) (exp ?b)))", "(logaddexp ?a ?b)",
        "torch.log(torch.exp(a) + torch.exp(b))", AB,
        description="log(exp(a) + exp(b)) overflows; logaddexp shifts by the max")
_stable("hypot", "(sqrt (add (mul ?a ?a) (mul ?b ?b)))", "(hypot ?a ?b)",
        "torch.sqrt(a * a + b * b)", AB, description="sqrt(a^2 + b^2) overflows; hypot scales")
_stable("log-square", "(log (mul ?x ?x))", "(mul #float:2.0 (log (abs ?x)))",
        "torch.log(x * x)", {"x": ((4, 8), "nonzero")}, when=nonzero("x"),
        description="log(x^2) = 2 log|x| without overflow of x^2")
_stable("add-sub-cancel", "(sub (add ?a ?b) ?a)", "?b", "(a + b) - a", AB,
        when=same_shape("a", "b"),
        description="(a + b) - a = b: no cancellation of a large a (same shapes, so b alone "
                    "keeps the result's shape)")
_stable("add-sub-cancel-right", "(sub (add ?a ?b) ?b)", "?a", "(a + b) - b", AB,
        when=same_shape("a", "b"), description="(a + b) - b = a")
