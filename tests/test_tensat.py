"""TENSAT's graph substitutions: every TASO axiom TENSAT uses, written as a pair of PyTorch
functions, is proven by saturation (the pair is traced into one e-graph, saturated with the
library and the ``tensat`` family, and the two outputs share an e-class); every rule of the
family is sound on random instances of its examples (the merging rules, in the layout family,
are checked with the library in test_rules.py); merged projections are chosen by the
cost model, emitted on weights concatenated once, and stay exact when trained."""

import inspect
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compiler.soundness import check_rule
from egraph import EGraph
from egraph.rules import library, load_rules
from extractors import Roofline

RULES = load_rules("all", "tensat")
LIMITS = dict(iter_limit=6, node_limit=30_000, time_limit=60.0)
M, N = (4, 8), (8, 6)
IMG, KERNEL = (2, 4, 6, 6), (5, 4, 3, 3)


def conv(x, w):
    return F.conv2d(x, w, padding=1)


# (TASO/TENSAT axiom, left side, right side, input shapes[, the other op sharing an input]);
# a multi-pattern axiom needs its second op in the program, as it is in a model.
AXIOMS = [
    ("ewadd-is-associative", lambda x, y, z: x + (y + z), lambda x, y, z: (x + y) + z,
     [M, M, M]),
    ("ewadd-is-commutative", lambda x, y: x + y, lambda x, y: y + x, [M, M]),
    ("ewmul-is-associative", lambda x, y, z: x * (y * z), lambda x, y, z: (x * y) * z,
     [M, M, M]),
    ("ewmul-is-commutative", lambda x, y: x * y, lambda x, y: y * x, [M, M]),
    ("distributivity-0", lambda x, y, z: (x + y) * z, lambda x, y, z: x * z + y * z,
     [M, M, M]),
    ("smul-is-associative", lambda x: (x * 2.0) * 3.0, lambda x: x * (2.0 * 3.0), [M]),
    ("distributivity-1", lambda x, y: (x + y) * 3.0, lambda x, y: x * 3.0 + y * 3.0, [M, M]),
    ("operator-commutativity-0", lambda x, y: (x * y) * 3.0, lambda x, y: x * (y * 3.0),
     [M, M]),
    ("transpose-is-its-own-inverse", lambda x: x.t().t(), lambda x: x, [M]),
    ("operator-commutativity-1", lambda x, y: (x + y).t(), lambda x, y: x.t() + y.t(),
     [M, M]),
    ("operator-commutativity-2", lambda x, y: (x * y).t(), lambda x, y: x.t() * y.t(),
     [M, M]),
    ("operator-commutativity-3", lambda x: x.t() * 3.0, lambda x: (x * 3.0).t(), [M]),
    ("matmul-is-associative", lambda x, y, z: x @ (y @ z), lambda x, y, z: (x @ y) @ z,
     [(4, 8), (8, 5), (5, 3)]),
    ("matmul-is-linear-0", lambda x, y: (x @ y) * 3.0, lambda x, y: x @ (y * 3.0), [M, N]),
    ("matmul-is-linear-1", lambda x, y, z: x @ (y + z), lambda x, y, z: x @ y + x @ z,
     [M, N, N]),
    ("matmul-and-transpose", lambda x, y: (x @ y).t(), lambda x, y: y.t() @ x.t(), [M, N]),
    ("conv-is-bilinear-0", lambda x, w: conv(x * 0.5, w), lambda x, w: conv(x, w * 0.5),
     [IMG, KERNEL]),
    ("conv-is-bilinear-1", lambda x, w: conv(x, w) * 0.5, lambda x, w: conv(x * 0.5, w),
     [IMG, KERNEL]),
    ("conv-is-bilinear-2", lambda x, w, v: conv(x, w + v),
     lambda x, w, v: conv(x, w) + conv(x, v), [IMG, KERNEL, KERNEL]),
    ("conv-is-bilinear-3", lambda x, y, w: conv(x + y, w),
     lambda x, y, w: conv(x, w) + conv(y, w), [IMG, IMG, KERNEL]),
    ("conv-with-2-applies-relu", lambda x: torch.relu(x.t()), lambda x: torch.relu(x).t(),
     [M]),
    # TASO's Iewmul is a tensor of ones no program holds; programs multiply by 1.
    ("ewmul-identity", lambda x: x * 1.0, lambda x: x, [M]),
    ("split-definition-0", lambda x, y: torch.split(torch.cat([x, y], 1), [8, 3], 1)[0],
     lambda x, y: x, [M, (4, 3)]),
    ("split-definition-1", lambda x, y: torch.split(torch.cat([x, y], 1), [8, 3], 1)[1],
     lambda x, y: y, [M, (4, 3)]),
    ("geometry-of-concatenation",
     lambda x, y, z, w: torch.cat([torch.cat([x, y], 1), torch.cat([z, w], 1)], 0),
     lambda x, y, z, w: torch.cat([torch.cat([x, z], 0), torch.cat([y, w], 0)], 1),
     [(4, 8), (4, 3), (2, 8), (2, 3)]),
    ("operator-commutativity-5", lambda x, y: torch.cat([x * 2.0, y * 2.0], 0),
     lambda x, y: torch.cat([x, y], 0) * 2.0, [M, (2, 8)]),
    ("operator-commutativity-6", lambda x, y, z, w: torch.cat([x + y, z + w], 0),
     lambda x, y, z, w: torch.cat([x, z], 0) + torch.cat([y, w], 0), [M, M, (2, 8), (2, 8)]),
    ("operator-commutativity-7", lambda x, y, z, w: torch.cat([x * y, z * w], 0),
     lambda x, y, z, w: torch.cat([x, z], 0) * torch.cat([y, w], 0), [M, M, (2, 8), (2, 8)]),
    ("operator-commutativity-8", lambda x, y: torch.cat([torch.relu(x), torch.relu(y)], 1),
     lambda x, y: torch.relu(torch.cat([x, y], 1)), [M, (4, 3)]),
    ("concatenation-and-transpose", lambda x, y: torch.cat([x.t(), y.t()], 1),
     lambda x, y: torch.cat([x, y], 0).t(), [M, M]),
    ("concatenation-and-matrix-mul.-0", lambda x, y, z: torch.cat([x @ y, x @ z], 1),
     lambda x, y, z: x @ torch.cat([y, z], 1), [M, N, (8, 3)]),
    ("concatenation-and-matrix-mul.-1",
     lambda x, z, y, w: torch.cat([x, z], 1) @ torch.cat([y, w], 0),
     lambda x, z, y, w: x @ y + z @ w, [(4, 3), (4, 5), (3, 6), (5, 6)]),
    ("concatenation-and-conv.-0", lambda x, y, w: torch.cat([conv(x, w), conv(y, w)], 0),
     lambda x, y, w: conv(torch.cat([x, y], 0), w), [IMG, (3, 4, 6, 6), KERNEL]),
    ("concatenation-and-conv.-1", lambda x, w, v: torch.cat([conv(x, w), conv(x, v)], 1),
     lambda x, w, v: conv(x, torch.cat([w, v], 0)), [IMG, KERNEL, (3, 4, 3, 3)]),
    ("concatenation-and-conv.-2",
     lambda x, z, y, w: conv(torch.cat([x, z], 1), torch.cat([y, w], 1)),
     lambda x, z, y, w: conv(x, y) + conv(z, w),
     [IMG, (2, 3, 6, 6), KERNEL, (5, 3, 3, 3)]),
    # concatenation and pooling (TASO's three, and the average over the batch)
    ("concatenation-and-pooling-0",
     lambda x, y: torch.cat([F.avg_pool2d(x, 2), F.avg_pool2d(y, 2)], 1),
     lambda x, y: F.avg_pool2d(torch.cat([x, y], 1), 2), [IMG, (2, 3, 6, 6)]),
    ("concatenation-and-pooling-1",
     lambda x, y: torch.cat([F.max_pool2d(x, 3, 2, 1), F.max_pool2d(y, 3, 2, 1)], 0),
     lambda x, y: F.max_pool2d(torch.cat([x, y], 0), 3, 2, 1), [IMG, (3, 4, 6, 6)]),
    ("concatenation-and-pooling-2",
     lambda x, y: torch.cat([torch.max_pool2d(x, 2), torch.max_pool2d(y, [2, 2])], 1),
     lambda x, y: F.max_pool2d(torch.cat([x, y], 1), 2), [IMG, IMG]),
    ("concatenation-and-average-pooling-over-the-batch",
     lambda x, y: torch.cat([F.avg_pool2d(x, 3, 1, 1), F.avg_pool2d(y, 3, 1, 1)], 0),
     lambda x, y: F.avg_pool2d(torch.cat([x, y], 0), 3, 1, 1), [IMG, IMG]),
    # multi-pattern: operator merging
    ("merge-matmuls-sharing-an-input", lambda x, a, b: x @ a,
     lambda x, a, b: torch.split(x @ torch.cat([a, b], 1), [6, 3], 1)[0],
     [M, N, (8, 3)], lambda x, a, b: x @ b),
    ("merge-matmuls-sharing-a-matrix", lambda a, b, w: a @ w,
     lambda a, b, w: torch.split(torch.cat([a, b], 0) @ w, [4, 3], 0)[0],
     [M, (3, 8), N], lambda a, b, w: b @ w),
    ("merge-convs-sharing-an-input", lambda x, w, v: conv(x, w),
     lambda x, w, v: torch.split(conv(x, torch.cat([w, v], 0)), [5, 3], 1)[0],
     [IMG, KERNEL, (3, 4, 3, 3)], lambda x, w, v: conv(x, v)),
    # TASO's enlarge: a kernel padded with zeros to the size of another conv's on the
    # same input, then merged with it (an inception block's 1x1 and 3x3 branches)
    ("enlarge-kernel", lambda x, w, v: F.conv2d(x, w),
     lambda x, w, v: conv(x, F.pad(w, (1, 1, 1, 1))), [IMG, (5, 4, 1, 1), KERNEL],
     lambda x, w, v: conv(x, v)),
    ("merge-convs-of-two-kernel-sizes", lambda x, w, v: F.conv2d(x, w),
     lambda x, w, v: torch.split(conv(x, torch.cat([v, F.pad(w, (1, 1, 1, 1))], 0)),
                                 [3, 5], 1)[1],
     [IMG, (5, 4, 1, 1), (3, 4, 3, 3)], lambda x, w, v: conv(x, v)),
    ("merge-convs-sharing-a-kernel", lambda x, y, w: conv(y, w),
     lambda x, y, w: torch.split(conv(torch.cat([x, y], 0), w), [2, 3], 0)[1],
     [IMG, (3, 4, 6, 6), KERNEL], lambda x, y, w: conv(x, w)),
    ("merge-linears-sharing-an-input", lambda x, w, b, v, c: F.linear(x, v, c),
     lambda x, w, b, v, c: torch.split(
         F.linear(x, torch.cat([w, v], 0), torch.cat([b, c], 0)), [6, 3], -1)[1],
     [(2, 4, 8), (6, 8), (6,), (3, 8), (3,)], lambda x, w, b, v, c: F.linear(x, w, b)),
]


def _traced(case):
    _, left, right, shapes, *context = case
    names = ", ".join(inspect.signature(left).parameters)
    # symbolic_trace needs named parameters, so the pair is one function of the same ones
    scope = {"fns": (left, right, *context)}
    exec(f"def program({names}):\n    return tuple(f({names}) for f in fns)", scope)  # noqa: S102
    gm = torch.fx.symbolic_trace(scope["program"])
    torch.manual_seed(0)
    return EGraph.from_fx(gm, tuple(torch.randn(s) for s in shapes))


@pytest.mark.parametrize("case", AXIOMS, ids=[c[0] for c in AXIOMS])
def test_axiom_is_proven_by_saturation(case):
    eg = _traced(case)
    left, right = eg.roots[:2]
    assert not eg.equiv(left, right), "ingest alone equates the two sides: nothing is tested"
    eg.saturate(RULES, **LIMITS)
    assert eg.equiv(left, right), f"{case[0]} not proven ({eg.report.stop_reason})"


TENSAT = library("tensat")
CASES = [(r, fn) for r in TENSAT for fn in r.examples]


@pytest.mark.parametrize("case", CASES, ids=[
    r.name if r.examples.index(fn) == 0 else f"{r.name}[{r.examples.index(fn) + 1}]"
    for r, fn in CASES])
def test_rule_is_sound_on_random_instances(case):
    rule, fn = case
    result = check_rule(rule, examples=25, example=fn)
    assert result.ok, str(result)


class Projections(nn.Module):
    """Q, K and V projections of one input, as transformer blocks write them."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d // 2)

    def forward(self, x):
        return (self.q(x) * self.k(x))[..., : self.v.out_features] + self.v(x)


def _linears(gm) -> int:
    return sum(1 for n in gm.graph.nodes if getattr(n.target, "__name__", "") == "linear")


def _merged():
    torch.manual_seed(0)
    model, x = Projections().eval(), torch.randn(2, 16, 64)
    eg = EGraph.from_fx(model, (x,)).saturate(load_rules("layout"), **LIMITS)
    return model, x, eg.extract(Roofline("cpu", fused=False), method="ilp")


def test_projections_of_one_input_become_one_linear_on_weights_concatenated_once():
    model, x, opt = _merged()
    assert _linears(opt) == 1
    folded = {n.target for n in opt.graph.nodes if n.op == "get_attr"
              and n.target.startswith("folded_constants.")}
    assert folded, "the concatenated weights are not folded"
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x))
        first = {name: opt.get_buffer(name) for name in folded}
        opt(x)
        assert all(opt.get_buffer(name) is value for name, value in first.items()), \
            "recomputed per call"
        model.k.weight.add_(1.0)  # an in-place update of a source parameter
        torch.testing.assert_close(opt(x), model(x))
    assert set(opt.state_dict()) == set(model.state_dict())


def test_merged_projections_train_like_the_source():
    model, x, opt = _merged()
    opt(x).square().mean().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().mean().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, msg=k)


def test_the_roofline_prefers_the_merged_program():
    """One launch and one read of the shared input instead of three."""
    model, x, opt = _merged()
    report = opt.meta["egraph_report"]
    assert report.cost_after < report.cost_before


def test_the_default_extraction_merges_the_demos_three_projections():
    """The bundled transformer's Q, K and V projections pay as one linear only when all
    three take it: the DAG heuristic, switching one class at a time, kept two of them
    merged and K apart; the default extraction solves small e-graphs exactly. The merged
    output is cut by one split (pairwise merging nests two: ``split-split``)."""
    from compiler.compile import default_cost
    from egraph.examples.zoo import build

    model, inputs = build("naive_transformer")
    eg = EGraph.from_fx(model, inputs).saturate(load_rules("all"), iter_limit=8,
                                                  node_limit=100_000, time_limit=30.0)
    opt = eg.extract(default_cost(inputs))
    report = opt.meta["egraph_report"]
    assert report.method in ("dag", "ilp") and report.optimal is not False
    splits = [n for n in opt.graph.nodes if n.op == "call_function" and "split" in str(n.target)]
    assert len(splits) == 1 and list(splits[0].args[1]) == [64, 64, 64]
    widths = [operator.attrgetter(n.args[1].target)(opt).shape[0] for n in opt.graph.nodes
              if getattr(n.target, "__name__", "") == "linear"]
    assert 3 * 64 in widths and _linears(opt) == 4
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), model(*inputs))


class _FiveProjections(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.projections = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(5))

    def forward(self, x):
        out = self.projections[0](x)
        for projection in self.projections[1:]:
            out = out * projection(x)
        return out


def test_linears_of_one_input_merge_in_contiguous_runs():
    """Five linears of one input merge as each contiguous run of them, in the order of
    their weights: 4 + 3 + 2 + 1 = 10 merged linears. Every subset (26) made the e-graph
    run away where LoRA's adapters sit beside the projections; the run of all five, the
    one that pays, is among them."""
    model, x = _FiveProjections().eval(), torch.randn(4, 32)
    eg = EGraph.from_fx(model, (x,)).saturate(load_rules("layout"), **LIMITS)
    merged = {eg.find(n.children[1]) for cid in eg.classes() for n in eg.nodes(cid)
              if n.op == "linear" and any(m.op == "cat" for m in eg.nodes(n.children[1]))}
    assert len(merged) == 10
    opt = eg.extract(Roofline("cpu", fused=False), method="ilp")
    assert _linears(opt) == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x))


class _Inception(nn.Module):
    """An inception block's 1x1 and 3x3 branches on one input, as torchvision writes them."""

    def __init__(self):
        super().__init__()
        self.branch1x1 = nn.Conv2d(16, 8, kernel_size=1)
        self.branch3x3 = nn.Conv2d(16, 8, kernel_size=3, padding=1)

    def forward(self, x):
        return torch.cat([F.relu(self.branch1x1(x)), F.relu(self.branch3x3(x))], 1)


def test_an_inception_blocks_branches_merge_where_the_cost_model_says_it_pays():
    """TASO's enlarge pads the 1x1 kernel to 3x3 so the two branches are one conv. That
    is nine times the 1x1 branch's FLOPs: on this CPU at 8x16x28x28 the profile keeps the
    two convs, the H100 profile, paying per launch, takes the one conv; both are exact
    and emit the padded, concatenated kernel once, folded."""
    model = _Inception().eval()
    x = torch.randn(8, 16, 28, 28)
    eg = EGraph.from_fx(model, (x,)).saturate(load_rules("all"), **LIMITS)
    convs = {}
    for hardware in ("cpu", "H100"):
        opt = eg.extract(Roofline(hardware))
        convs[hardware] = sum(getattr(n.target, "__name__", "") == "conv2d"
                              for n in opt.graph.nodes)
        with torch.no_grad():
            torch.testing.assert_close(opt(x), model(x))
    assert convs == {"cpu": 2, "H100": 1}
    assert any(n.op == "get_attr" and n.target.startswith("folded_constants.")
               for n in opt.graph.nodes), "the enlarged kernel is padded per call"


class _LoraLinear(nn.Module):
    """peft's LoRA layer, as its ``Linear.forward`` computes an unmerged adapter:
    ``result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``."""

    def __init__(self, width: int = 32, rank: int = 4, alpha: int = 8):
        super().__init__()
        self.base_layer = nn.Linear(width, width)
        self.lora_A = nn.Linear(width, rank, bias=False)
        self.lora_B = nn.Linear(rank, width, bias=False)
        self.lora_dropout = nn.Identity()
        self.scaling = alpha / rank
        nn.init.normal_(self.lora_B.weight, std=0.02)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class _LoraBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.v = _LoraLinear(), _LoraLinear()

    def forward(self, x):
        return torch.tanh(self.q(x)) * self.v(x)


def test_a_low_rank_adapter_folds_into_its_weight():
    """peft's unmerged LoRA adapters, exported for inference: each ``W x + s B(A x)`` is
    one linear of ``W + s B A``, made once of the weights (``linear-low-rank``), then the
    two projections of one input merge: one linear instead of six. Updating an adapter in
    place is seen on the next call."""
    from compiler.compile import default_cost

    torch.manual_seed(0)
    model, x = _LoraBlock().eval(), torch.randn(2, 8, 32)
    program = torch.export.export(model, (x,))
    eg = EGraph.from_fx(program, (x,)).saturate(load_rules("all"), **LIMITS)
    opt = eg.extract(default_cost((x,)), validate="strict")
    assert "linear-low-rank" in opt.meta["egraph_report"].used
    assert sum(getattr(n.target, "__name__", "") == "linear" for n in opt.graph.nodes) == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x))
        model.v.lora_B.weight.add_(0.1)
        torch.testing.assert_close(opt(x), model(x))
