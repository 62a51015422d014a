"""Random programs that read and update an input and a parameter in place, through views,
in every order: each entry point gives the source's outputs and leaves the input and the
parameter as the source does (reads before an update see the old values, reads after it
and reads of a view taken before it see the new ones)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compiler.compile import make_backend
from egraph import AstSize, EGraph

READS = {
    "scale": lambda t: t * 2.0,
    "sum": lambda t: t.sum(0),
    "exp": lambda t: torch.exp(t),
    "clone": lambda t: t.clone(),
}
WRITES = {
    "add_": lambda t, x: t.add_(1.5),
    "mul_": lambda t, x: t.mul_(-0.5),
    "clamp_": lambda t, x: t.clamp_(-0.4, 0.6),
    "copy_": lambda t, x: t.copy_(torch.ones_like(t) * x.mean()),
    "addcmul_": lambda t, x: t.addcmul_(t, t, value=0.25),
    "setitem": lambda t, x: t.__setitem__(0, x.mean() * 3),
    "masked_fill_": lambda t, x: t.masked_fill_(t > 0.2, -2.0),
    # Adam's spelling: an update of what an update returned (the same tensor)
    "chained": lambda t, x: t.mul_(0.9).addcmul_(t, torch.ones_like(t) * x.mean(), value=0.1),
    "chained_copy": lambda t, x: t.mul_(0.5).copy_(t * x.mean() + 1),
}
VIEWS = {"whole": lambda t: t, "t": lambda t: t.t(), "row": lambda t: t[0]}



def programs(tensors=("p", "x", "b", "h")):
    """Lists of steps over ``tensors``: the input ``x``, the parameter ``p``, the buffer
    ``b`` (a symbolic trace runs what reads a buffer alone once, when it traces), and
    ``h``, a tensor the program makes (``x * 2 + 0.5``)."""
    return st.lists(st.one_of(
        st.tuples(st.just("read"), st.sampled_from([*tensors, "view", "written"]),
                  st.sampled_from(list(VIEWS)), st.sampled_from(list(READS))),
        st.tuples(st.just("write"), st.sampled_from(tensors),
                  st.sampled_from(list(VIEWS)), st.sampled_from(list(WRITES))),
        st.tuples(st.just("view"), st.sampled_from(tensors),
                  st.sampled_from(["t", "row"]), st.just("")),
    ), min_size=2, max_size=10).filter(lambda s: any(k == "read" for k, *_ in s))


class Steps(nn.Module):
    """Runs ``steps`` on its input ``x``, its parameter ``p`` (updated without grad), its
    buffer ``b`` and ``h = x * 2 + 0.5`` (all 2 x 3): reads append an output, writes
    update in place, ``view`` keeps a view for later reads; a read of ``"written"`` reads
    what the first write returned (``a = p.mul_(m)``: ``p`` itself, or a view of it,
    which later writes change too)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.p = nn.Parameter(torch.linspace(-1, 1, 6).reshape(2, 3), requires_grad=False)
        self.register_buffer("b", torch.linspace(0.5, -0.5, 6).reshape(2, 3))

    def forward(self, x):
        outs, views, written = [], [], None
        h = x * 2.0 + 0.5
        for kind, what, view, op in self.steps:
            if kind == "read" and what in ("view", "written"):
                kept = views[-1] if what == "view" and views else written
                if kept is not None:
                    outs.append(READS[op](kept))
                continue
            target = VIEWS[view]({"p": self.p, "b": self.b, "x": x, "h": h}[what])
            if kind == "read":
                outs.append(READS[op](target))
            elif kind == "write":
                result = WRITES[op](target, x)
                # (a write by index returns None: a symbolic trace's proxy stands for it)
                written = result if written is None and op != "setitem" else written
            else:
                views.append(target)
        return tuple(outs)


def _inputs():
    return torch.tensor([[0.3, -0.7, 1.1], [0.9, -0.2, 0.5]])


def _check(run, steps):
    """``run(model, x)`` gives the optimised program's outputs on a fresh model and input:
    they, the input and the parameter afterwards equal eager's."""
    eager, mine = Steps(steps), Steps(steps)
    theirs_x, my_x = _inputs(), _inputs()
    want = eager(theirs_x)
    got = run(mine, my_x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(my_x, theirs_x)
    torch.testing.assert_close(mine.p, eager.p)
    torch.testing.assert_close(mine.b, eager.b)


_SETTINGS = dict(max_examples=25, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@settings(**_SETTINGS)
@given(programs())
def test_exported_programs_that_update_in_place_keep_the_sources_reads_and_writes(steps):
    def run(model, x):
        program = torch.export.export(model, (_inputs(),))
        return EGraph.from_fx(program, (_inputs(),)).extract(AstSize(), validate="raise")(x)
    _check(run, steps)


@settings(**_SETTINGS)
@given(programs())
def test_compiled_programs_that_update_in_place_keep_the_sources_reads_and_writes(steps):
    def run(model, x):
        torch._dynamo.reset()
        backend = make_backend(validate="raise")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.compile(model, backend=backend)(x)
    _check(run, steps)


@settings(**_SETTINGS)
@given(programs(("p", "x", "h")))
# (an update of what an update of a value the program made returned: every name of that
# tensor sees it, as Adadelta's ``delta.div_(std).mul_(grad)`` changes ``delta``)
@example([("write", "h", "whole", "chained"), ("read", "h", "whole", "scale")])
@example([("write", "h", "whole", "mul_"), ("write", "h", "whole", "add_"),
          ("read", "written", "whole", "scale")])
def test_traced_programs_that_update_in_place_keep_the_sources_reads_and_writes(steps):
    def run(model, x):
        opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (_inputs(),)).extract(
            AstSize(), validate="raise")
        return opt(x)
    _check(run, steps)


def test_a_parameter_written_by_index_is_read_as_updated():
    """``p[0] = v`` returns nothing: a later read of ``p`` (a new ``self.p`` in a symbolic
    trace) read that nothing."""
    steps = [("write", "p", "whole", "setitem"), ("read", "p", "whole", "scale")]

    def run(model, x):
        opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (_inputs(),)).extract(
            AstSize(), validate="raise")
        return opt(x)
    _check(run, steps)


@pytest.mark.parametrize("validate", ["off", "raise"])
def test_a_read_between_two_updates_of_a_parameter_sees_the_first(validate):
    steps = [("write", "p", "whole", "add_"), ("read", "p", "t", "scale"),
             ("write", "p", "row", "mul_"), ("read", "p", "whole", "sum")]
    def run(model, x):
        opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (_inputs(),)).extract(
            AstSize(), validate=validate)
        return opt(x)
    _check(run, steps)


def _moved_reads(graph: torch.fx.Graph) -> list[torch.fx.Graph]:
    """Copies of ``graph`` with one call that updates nothing moved as late as it can go
    (just before its first user) or as early (just after its last operand): the two ways
    an emission can misplace a read of a tensor that is updated in place."""
    from frontends.fx.effects import is_in_place

    mutants = []
    for index, node in enumerate(graph.nodes):
        if node.op not in ("call_function", "call_method") or is_in_place(node):
            continue
        for late in (True, False):
            copied = torch.fx.Graph()
            copied.output(copied.graph_copy(graph, {}))
            moved = list(copied.nodes)[index]
            order = {n: i for i, n in enumerate(copied.nodes)}
            if late:
                users = [u for u in moved.users if u.op != "output"]
                if users:
                    min(users, key=order.get).prepend(moved)
            else:
                operands = moved.all_input_nodes
                if operands:
                    max(operands, key=order.get).append(moved)
            mutants.append(copied)
    return mutants


def _differs(graph: torch.fx.Graph, steps) -> bool:
    """Whether ``graph`` run on a fresh model and input gives other outputs, or leaves
    the input or the parameter otherwise, than the source."""
    eager, mutant = Steps(steps), torch.fx.GraphModule(Steps(steps), graph)
    theirs_x, my_x = _inputs(), _inputs()
    want, got = eager(theirs_x), mutant(my_x)
    pairs = [*zip(got, want), (my_x, theirs_x)]
    if hasattr(mutant, "p"):  # (a graph that never reads p does not hold it)
        pairs.append((mutant.p, eager.p))
    return any(not torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in pairs)


@settings(**_SETTINGS)
@given(programs(("p", "x", "h")))
@example([("write", "p", "whole", "mul_"), ("write", "p", "whole", "add_"),
          ("read", "written", "whole", "scale")])
def test_validation_refuses_every_program_with_a_read_moved_across_an_update(steps):
    """Validation's own soundness on the programs above: every reordering of one read
    that changes what the program computes or leaves is refused. (Its Monte Carlo
    reference once rounded ``a = b.mul_(m)`` into a copy of ``b``; the spread then covered
    a read moved before a later update of ``b``, and such a program passed.)"""
    from compiler.validate import validate_module

    traced = torch.fx.symbolic_trace(Steps(steps))
    src = EGraph.from_fx(traced, (_inputs(),)).fx
    for graph in _moved_reads(traced.graph):
        if _differs(graph, steps):
            result = validate_module(src, torch.fx.GraphModule(traced, graph))
            assert not result.ok, graph.python_code("self").src


@pytest.mark.parametrize("foreach", [False, True])
def test_an_update_in_place_is_emitted_in_place(foreach):
    """A compiled ``Adam.step``: dynamo writes the state's update
    ``v.mul_(b2).addcmul_(g, g, value=1 - b2)`` as ``v.copy_(fma(g * g, 1 - b2, v))``
    (``foreach=False``); it is emitted as ``addcmul_`` again: one pass over ``v`` where
    the copy made three and two new tensors. With ``foreach=True`` dynamo writes
    ``_foreach_lerp_(m, g, w)`` as ``m.addcmul_(full_like(g - m, w), g - m)``, emitted as
    ``m.lerp_(g, w)`` again. Parameters and states end as eager's."""
    import compiler.compile as compile_module

    def model_and_step():
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1, foreach=foreach)
        return model, optimizer

    emitted, original = [], compile_module.compile_one

    def keep(*args, **kwargs):
        emitted.append(original(*args, **kwargs))
        return emitted[-1]

    (eager, eager_opt), (mine, my_opt) = model_and_step(), model_and_step()
    torch._dynamo.reset()
    compile_module.compile_one = keep
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = torch.compile(my_opt.step, backend=make_backend(validate="raise"))
            for _ in range(3):
                step()
                eager_opt.step()
    finally:
        compile_module.compile_one = original
    for a, b in zip(mine.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(my_opt.state[a][key], eager_opt.state[b][key])
    code = emitted[0].code
    assert code.count(".addcmul_(") == 2 and "copy_" not in code and "fma" not in code
    assert code.count(".lerp_(") == 2 and "full_like" not in code


@pytest.mark.parametrize("case", ["overlapping view", "promoted"])
def test_an_update_that_cannot_be_in_place_stays_a_copy(case):
    """``x.copy_(x + x.t())`` reads ``x`` through another view as it writes it (an in-place
    add refuses that); ``n.copy_(n * 0.5)`` of an integer ``n`` computes in floating point
    and truncates in the copy (``n.mul_(0.5)`` refuses to): neither is the in-place op."""
    class Updates(nn.Module):
        def forward(self, x, n):
            if case == "overlapping view":
                x.copy_(x + x.t())
            else:
                n.copy_(n * 0.5)
            return x * 1, n * 1

    def inputs():
        return torch.randn(3, 3, generator=torch.Generator().manual_seed(0)), torch.arange(5)

    want, given = inputs(), inputs()
    expected = Updates()(*want)
    program = torch.export.export(Updates(), inputs())
    got = EGraph.from_fx(program, inputs()).extract(AstSize(), validate="raise")(*given)
    for a, b in zip((*got, *given), (*expected, *want)):
        torch.testing.assert_close(a, b)


class _FusedAcrossAnUpdate(nn.Module):
    """Reads that an emission pass fuses into one later call (``addmm``, ``add`` with
    ``alpha``, an update in place), with an update of what they read in between."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling
        gen = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 3, generator=gen), requires_grad=False)
        self.register_buffer("b", torch.randn(3, 3, generator=gen))

    def forward(self, x):
        if self.spelling == "addmm":
            m = x @ self.w
            self.w.add_(1.0)
            return m + x
        # (of the input: an expression of parameters alone is folded, not fused)
        if self.spelling == "alpha":
            s = x * 0.5
            x.add_(1.0)
            return self.w + s
        v = self.b + x
        x.add_(1.0)
        self.b.copy_(v)
        return x * 2  # (a symbolic trace would record a read of b alone as a constant)


@pytest.mark.parametrize("spelling", ["addmm", "alpha", "copy"])
def test_a_fused_emission_reads_what_its_source_read_before_an_update(spelling):
    """``m = x @ w; w.add_(1); m + x`` was emitted as ``w.add_(1); addmm(x, x, w)``: the
    product moved past the update and read the new ``w`` (a wrong result with validation
    off, a fallback with it on). Each fusion now stays where no write lies between."""
    def given():
        return torch.randn(3, 3, generator=torch.Generator().manual_seed(1))

    eager, mine = _FusedAcrossAnUpdate(spelling), _FusedAcrossAnUpdate(spelling)
    x_eager, x = given(), given()
    want = eager(x_eager)
    opt = EGraph.from_fx(torch.fx.symbolic_trace(mine), (given(),)).extract(
        AstSize(), validate="off")
    torch.testing.assert_close(opt(x), want)
    torch.testing.assert_close(x, x_eager)
    # (a traced module holds only the attributes its graph reads)
    held = "b" if spelling == "copy" else "w"
    torch.testing.assert_close(getattr(opt, held), getattr(eager, held))


class _Cache(nn.Module):
    """A key cache written in place at a position, then read (a decoder's static cache)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(4, 3))
        self.proj = nn.Linear(3, 3)

    def forward(self, x, pos):
        k = self.k.index_copy_(0, pos, self.proj(x))
        return (k * 2).sum(0) + k.sum(0)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_compiling_a_module_that_writes_its_buffer_leaves_the_buffer_as_it_was(mode):
    """``from_fx`` -> ``saturate`` -> ``extract`` runs the program at compile time
    (recording, validation, the probe of other sizes): the caller's buffer is as it was
    after it, and the program then writes it as the source does. Under
    ``torch.inference_mode`` too, where the buffer is an inference tensor (no version
    counter to tell whether a run wrote it)."""
    from egraph.rules import load_rules

    with getattr(torch, mode)():
        torch.manual_seed(0)
        model, twin = _Cache(), _Cache()
        twin.load_state_dict(model.state_dict())
        x, pos = torch.randn(1, 3), torch.tensor([1])
        opt = EGraph.from_fx(torch.fx.symbolic_trace(model), (x, pos)).saturate(
            load_rules("all")).extract(AstSize())
        assert not opt.meta["egraph_report"].fell_back
        assert torch.equal(model.k, torch.zeros(4, 3))
        for given in ((x, pos), (torch.randn(1, 3), torch.tensor([3]))):
            torch.testing.assert_close(opt(*given), twin(*given))
            assert torch.equal(model.k, twin.k)
