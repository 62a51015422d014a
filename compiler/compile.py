"""The ``egraph`` torch.compile backend.

``torch.compile(model, backend="egraph")`` works once the package is installed (dynamo
finds the ``torch_dynamo_backends`` entry point and imports this module) or this module is
imported (it registers the name where no entry point does), in either order. Each graph
dynamo hands it goes through ``from_fx -> saturate -> extract`` and comes back as a
validated GraphModule. On the CPU that module runs as it is, in inference and in training,
where autograd differentiates it op by op as it does eager code (checked on the first
call: the gradients must be the source's); a graph that changes grad or autocast mode or a
tensor in place, and every graph on CUDA (our fused kernels have no backward), goes
through aot_autograd, whose forward and backward graphs each go through the pipeline.

The backend keeps a :class:`GraphReport` of every graph it compiled (``backend.reports``)
and logs one INFO line per graph to the ``egraph.compiler`` logger (see :mod:`egraph.logs`);
:func:`capture` collects the reports of a block of code together with dynamo's graph
breaks and their reasons.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
>>> compiled = torch.compile(model, backend=egraph_backend)
>>> x = torch.randn(2, 4)
>>> torch.allclose(compiled(x), model(x))
True
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from compiler.autotune import Autotune
from compiler.bound import Bound, bind_parameters
from compiler.forms import FormChoice, choose_form, training_forms
from compiler.fx import cuda_device
from compiler.options import BackendOptions
from compiler.partition import BudgetedPartition
from compiler.pipeline import (
    GraphReport,
    compile_one,
    default_cost,
    has_symbolic_sizes,
    hinted_inputs,
)
from compiler.signature import signature, sizeless_signature
from compiler.specialise import BySize, size_symbols, specialised
from compiler.validate.inputs import stand_ins
from egraph.moved import moved_names
from frontends.fx.effects import updates_an_alias, updates_inputs
from frontends.fx.kept import attributes_kept

log = logging.getLogger("egraph.compiler")

_MOVED = {"compile_graph": "compiler.pipeline", "SPECIALISED_SIZES": "compiler.specialise",
          "SPECIALISE_AT_CALL": "compiler.specialise"}


__getattr__ = moved_names(__name__, _MOVED)


@dataclass(frozen=True)
class GraphBreak:
    """A graph break dynamo took: its reason (the first line of dynamo's explanation),
    dynamo's whole message, and how many times it happened."""

    reason: str
    message: str
    count: int


@dataclass
class Compilation:
    """What :func:`capture` saw: the :class:`GraphReport` of each graph the egraph
    backends compiled (a graph a backend had compiled before counts again) and dynamo's
    graph breaks."""

    reports: list[GraphReport] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{len(self.reports)} graphs compiled, "
                 f"{sum(b.count for b in self.graph_breaks)} graph breaks"]
        lines += ["  " + str(r) for r in self.reports]
        lines += [f"  graph break x{b.count}: {b.reason}" for b in self.graph_breaks]
        return "\n".join(lines)


_captures: list[Compilation] = []


@contextmanager
def capture() -> Iterator[Compilation]:
    """Collect what the egraph backends compile inside the block, and dynamo's graph
    breaks (from dynamo's counters, as ``torch._dynamo.explain`` reads them).

    >>> def f(x):
    ...     y = torch.sin(x)
    ...     print("a print breaks the graph")
    ...     return torch.cos(y)
    >>> with capture() as seen:
    ...     _ = torch.compile(f, backend=make_backend(rules=()))(torch.randn(3))
    a print breaks the graph
    >>> len(seen.reports), [b.count for b in seen.graph_breaks]
    (2, [1])
    """
    from torch._dynamo.utils import counters

    before = Counter(counters["graph_break"])
    seen = Compilation()
    _captures.append(seen)
    try:
        yield seen
    finally:
        _captures.remove(seen)
        for message, n in counters["graph_break"].items():
            if n > before[message]:
                reason = message.strip().splitlines()[0] if message.strip() else message
                seen.graph_breaks.append(GraphBreak(reason, message, n - before[message]))


_NORM_BACKWARDS = {  # op: positions of its input, its weight and the saved statistics
    torch.ops.aten.native_batch_norm_backward.default: (1, 2, (5, 6)),
    torch.ops.aten.native_layer_norm_backward.default: (1, 5, (3, 4)),
    torch.ops.aten.native_group_norm_backward.default: (1, 4, (2, 3)),
}
_REDUCED = (torch.bfloat16, torch.float16)


def kernel_statistics(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple:
    """The example inputs of an aot backward graph with a norm's saved statistics in the
    dtype torch's CPU kernels give them: for a bfloat16 or float16 input with float32
    parameters (CPU autocast, a half model with float32 norms) the kernels of batch, layer
    and group norm save their mean and inverse deviation in float32, where torch's fake
    functions say the input's dtype. Given as recorded, the backward graph raised on every
    input validation made ("mixed dtype (CPU): expect parameter to have scalar type of
    Float") and fell back, and ingest typed the statistics wrongly.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> mode, aten = FakeTensorMode(), torch.ops.aten
    >>> g = torch.fx.Graph()
    >>> grad, x, w, mean, rstd = (g.placeholder(n) for n in ("grad", "x", "w", "mean", "rstd"))
    >>> _ = g.output(g.call_function(aten.native_layer_norm_backward.default,
    ...     (grad, x, [4], mean, rstd, w, None, [True, True, False])))
    >>> bf16 = mode.from_tensor(torch.ones(2, 4, dtype=torch.bfloat16))
    >>> stats = mode.from_tensor(torch.ones(2, 1, dtype=torch.bfloat16))
    >>> given = (bf16, bf16, mode.from_tensor(torch.ones(4)), stats, stats)
    >>> [x.dtype for x in kernel_statistics(torch.fx.GraphModule({}, g), given)][3:]
    [torch.float32, torch.float32]
    """
    example_inputs = tuple(example_inputs)
    places = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    found: set[int] = set()
    for n in gm.graph.nodes:
        positions = _NORM_BACKWARDS.get(n.target) if n.op == "call_function" else None
        if positions is None:
            continue
        given, weight, statistics = positions
        args = [_detached(a) for a in n.args]
        values = [example_inputs[places[a]] if a in places else a.meta.get("val")
                  if isinstance(a, torch.fx.Node) else a for a in args]
        x, w = values[given], values[weight]
        if isinstance(x, FakeTensor) and x.device.type == "cpu" and x.dtype in _REDUCED and (
                isinstance(w, torch.Tensor) and w.dtype == torch.float32):
            found.update(places[args[i]] for i in statistics
                         if args[i] in places and values[i].dtype in _REDUCED)
    if not found:
        return example_inputs

    def in_float32(x: FakeTensor) -> FakeTensor:
        with x.fake_mode:
            return torch.empty_strided(x.shape, x.stride(), dtype=torch.float32,
                                       device=x.device)

    return tuple(in_float32(x) if i in found else x for i, x in enumerate(example_inputs))


def _detached(arg: Any) -> Any:
    """The node ``arg`` is a chain of ``detach`` calls of (aot graphs detach saved
    statistics before their backward op reads them)."""
    while isinstance(arg, torch.fx.Node) and arg.target is torch.ops.aten.detach.default:
        arg = arg.args[0]
    return arg


def real_values(fake: Sequence[Any], real: Sequence[Any]) -> tuple:
    """The inputs aot_autograd hands the forward compiler (fake tensors), each replaced by
    the real tensor dynamo was called with where the two line up one to one (as many, each
    of the same concrete shape, dtype and device), else unchanged: validation then runs on
    the user's own values, where a rewrite that differs only past an fp16 overflow
    (``x - logsumexp(x)`` against ``log_softmax(x)`` with an inf in ``x``) shows, and not
    only on random ones.

    >>> x = torch.ones(2)
    >>> real_values((torch.empty(2),), (x,))[0] is x, real_values((torch.empty(3),), (x,))[0] is x
    (True, False)
    """
    fake = tuple(fake)
    if len(real) != len(fake):
        return fake
    out = []
    for f, r in zip(fake, real):
        if not isinstance(f, torch.Tensor):
            out.append(f)
            continue
        if (not isinstance(r, torch.Tensor) or has_symbolic_sizes(f) or has_symbolic_sizes(r)
                or tuple(f.shape) != tuple(r.shape) or f.dtype != r.dtype
                or f.device != r.device):
            return fake
        out.append(r)
    return tuple(out)




def default_codegen(example_inputs: Sequence[Any]) -> str:
    """The code generator for a graph on the inputs' device, as measured
    (benchmarks/models.py, benchmarks/GPU.md): ``inductor`` on CUDA, where our graph
    through Inductor ran thirteen corpus models 1.3-2.5x faster than our own emission (an
    H200), with a first call of 3-7 s against Inductor's cold 4 s; ``eager`` on the CPU,
    where Inductor's cold compile takes 4-27 s a model on a 2-core machine against our
    0.1-4 s (there ours + Inductor runs at Inductor's speed, ours alone at 0.6-0.7x
    eager's time).

    >>> default_codegen((torch.randn(2),))
    'eager'
    """
    return "eager" if cuda_device(example_inputs) is None else "inductor"


def default_inductor_options(example_inputs: Sequence[Any]) -> dict:
    """The Inductor config patches the backend compiles an optimised graph with on the
    inputs' device, as measured (benchmarks/models.py): on the CPU Inductor's pattern
    matcher is off, since the e-graph has already chosen each graph's form by cost and
    Inductor's patterns would choose again by spelling alone (its attention patterns
    turned the unfused attention the e-graph chose for T5's encoder, 8 tokens, into
    flash attention: 0.88x and 0.92x Inductor's speed with them in two runs, 0.95x and
    1.02x without; over the 24 corpus models the geometric mean is the same within noise,
    1.04x Inductor's speed either way in runs of thirty rounds, and training steps are
    equal); on CUDA, Inductor's defaults, the pattern matcher on (on an H200, GPT-2,
    Llama and BERT ran at 1.06x, 1.06x and 1.00x Inductor's speed with it, 1.08x, 1.02x
    and 0.99x without: the same within noise, benchmarks/GPU.md).

    >>> default_inductor_options((torch.randn(2),))
    {'pattern_matcher': False}
    """
    return {"pattern_matcher": False} if cuda_device(example_inputs) is None else {}


def make_backend(rules=None, cost=None, validate: str = "strict", codegen: str | None = None,
                 reference: str = "auto", memory: bool = False,
                 inductor_options: dict | None = None, memory_budget: float | None = None,
                 memory_budget_bytes: int | None = None, autotune: bool | Autotune = False,
                 **limits) -> Callable:
    """A torch.compile backend with chosen rules (default: the whole rule library; ``()``
    for none), cost model (default: :func:`default_cost` for the inputs' device), validation
    (``validate`` as in ``extract``; ``reference``: the source in ``"float64"``, in its
    ``"working"`` dtype, or ``"auto"``: float64 unless the model is large) and code
    generation (:data:`compiler.options.CODEGENS`; default: :func:`default_codegen` for the
    inputs' device; ``inductor_options``: Inductor config patches for ``codegen="inductor"``, over
    :func:`default_inductor_options`); ``memory=True`` measures each graph's peak memory;
    ``limits`` bound saturation (``iter_limit``, ``node_limit``, ``time_limit``).
    ``memory_budget`` (a fraction in (0, 1] of what torch's min-cut partitioner saves) or
    ``memory_budget_bytes`` bounds what a training graph saves for its backward: the
    backward recomputes the rest, chosen by :class:`compiler.partition.BudgetedPartition`
    (with ``codegen="inductor"`` too, as Inductor's partitioner); each graph's report says
    what was saved and recomputed (``report.saved``). ``autotune`` (True, or a
    :class:`compiler.autotune.Autotune` of its settings) times the programs the cost model
    is unsure between on each graph's example inputs and keeps the fastest
    (``report.autotune``); the programs are timed as our emission runs them, also where
    Inductor then generates the code.

    Repeated compiles of the same graph (a recompile, a second model with the same
    architecture) hit a cache instead of saturating again. ``backend.cache`` maps each
    graph's signature to its compiled function, whose ``.module`` is the emitted
    GraphModule (with its ``meta["egraph_report"]``); ``backend.reports`` lists the
    :class:`GraphReport` of every graph compiled, in order.

    >>> backend = make_backend(rules=(), validate="raise")
    >>> f = torch.compile(lambda x: torch.exp(x) + torch.exp(x), backend=backend)
    >>> torch.allclose(f(torch.ones(3)), 2 * torch.exp(torch.ones(3)))
    True
    """
    options = BackendOptions.of({
        "rules": rules, "cost": cost, "validate": validate, "codegen": codegen,
        "reference": reference, "memory": memory, "inductor_options": inductor_options,
        "memory_budget": memory_budget, "memory_budget_bytes": memory_budget_bytes,
        "autotune": autotune, **limits})
    if options.rules is None:
        from egraph.rules import load_rules

        options = dataclasses.replace(options, rules=load_rules("all"))
    return _Backend(options)


class _Backend:
    """The backend :func:`make_backend` makes, with its ``options``, ``cache`` and
    ``reports``: each graph dynamo hands it goes to the code generator chosen, and on our
    own emission, to autograd as emitted or to aot_autograd (:meth:`__call__`); each kind
    of graph has its compiler (:meth:`_compiler`)."""

    def __init__(self, options: BackendOptions):
        self.options = options
        self.cache: dict[tuple, Callable] = {}
        # graphs autograd cannot run as emitted (aot's), by signature and at every size
        self.refused: set[tuple] = set()
        self.reports: list[GraphReport] = []
        # the real inputs of the call dynamo compiles for, while it does
        self.calls: list[tuple] = []
        # the values the last forward compiled saves for its backward, on those inputs
        self.saved: dict[str, torch.Tensor] = {}
        # what a training graph saves for its backward, under the budget (None: the
        # partitioners' own choice: aot_autograd's min-cut, Inductor's)
        budget = options.budget
        self.partitions = None if budget is None else (
            BudgetedPartition(budget), BudgetedPartition(budget, fused=True))
        self.decided = [0, 0]  # (each partition's decisions given to a report so far)
        inductor_options = options.inductor_options
        if budget is not None:
            inductor_options = {**(inductor_options or {}),
                                "custom_partitioner_fn": self.partitions[1]}
        # (Inductor runs aot_autograd itself)
        self.through_inductor = self._compiler(
            "graph", _inductor_code(inductor_options), inductor=True)
        self.direct = self._compiler("graph", _autograd_code)
        self.aot = aot_autograd(fw_compiler=self._compiler("forward", _boxed_code),
                                bw_compiler=self._compiler("backward", _boxed_code),
                                **({} if budget is None else
                                   {"partition_fn": self.partitions[0]}))

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        # (compiling runs the graph: recording values, validation; a compiled
        # optimizer.step writes into the parameters and the optimizer's state)
        with attributes_kept(gm):
            return self._dispatch(gm, example_inputs)

    def _dispatch(self, gm: torch.fx.GraphModule, example_inputs):
        """The graph to the code generator chosen, and on our own emission, to autograd
        as emitted or to aot_autograd."""
        chosen = self.options.codegen or default_codegen(example_inputs)
        if chosen == "inductor":
            autocast = torch._C._is_any_autocast_enabled()
            if _updates_shared_storage(gm.graph) or autocast:
                # (traced inside the caller's autocast: its casts become the graph's own)
                gm = functional_graph(gm, example_inputs)
            if not autocast:
                return self.through_inductor(gm, example_inputs)
            # as aot_autograd does: a graph with autocast's casts in it is compiled and
            # run with autocast off, which would cast its rewritten ops once more
            with torch._C._DisableAutocast():
                compiled = self.through_inductor(gm, example_inputs)
            return _Compiled(_autocast_off(compiled), compiled.module)
        # (a budget is kept by a partition of the joint graph: aot_autograd's)
        if differentiable_as_emitted(gm, example_inputs) and not (
                self.partitions and _trains(example_inputs)):
            compiled = self._bound(gm, example_inputs) or self.direct(gm, example_inputs)
            if compiled is not None:
                return compiled
        self.calls.append(tuple(example_inputs))
        try:
            if not (self.partitions and _trains(example_inputs)):
                return self.aot(gm, example_inputs)
            choice = _chosen_form(gm, example_inputs, self.options)
            # (the forward's inputs: the form's own parameters and buffers, lifted first)
            self.calls[-1] = (*_lifted(choice.module), *example_inputs)
            with self.partitions[0].keeping(_parameter_inputs(choice.module, example_inputs),
                                            choice):
                return self.aot(choice.module, example_inputs)
        finally:
            self.calls.pop()

    def _bound(self, gm: torch.fx.GraphModule, example_inputs) -> Callable | None:
        """An inference graph with the model's parameters bound into it
        (:mod:`compiler.bound`), so that what is made of them alone is made once; None
        where the graph is differentiated or takes no parameter."""
        if torch.is_grad_enabled():
            return None
        bound, positions = bind_parameters(gm, example_inputs)
        if not positions:
            return None
        tensors = [example_inputs[i] for i in positions]
        # (another model of the same architecture: the program compiled for the first,
        # with this one's tensors in place of the first's)
        key = ("bound", tuple(positions), *signature(gm, example_inputs))
        if key in self.refused:
            return None
        if key in self.cache:
            compiled = self.cache[key].rebound(tensors)
        else:
            bound_at = set(positions)
            kept = [x for i, x in enumerate(example_inputs) if i not in bound_at]
            program = self._compile("graph", _autograd_code, False, bound, kept)
            if program is None:
                self.refused.add(key)
                return None
            compiled = self.cache[key] = Bound(program, positions, tensors,
                                               lambda: self.direct(gm, example_inputs) or gm)
        for seen in _captures:
            seen.reports.append(compiled.module.meta["egraph_graph"])
        return compiled

    def _compiler(self, kind: str, finish: Callable, inductor: bool = False) -> Callable:
        """The compiler of one kind of graph; ``finish(module, gm, example_inputs)`` makes
        the function dynamo or aot_autograd calls, or None where it cannot be used
        (``inductor``: Inductor generates its code)."""
        def compiler(gm: torch.fx.GraphModule, example_inputs):
            real = False
            if kind == "backward":
                example_inputs = kernel_statistics(gm, example_inputs)
                if self.saved:  # (the output's gradients drawn at random)
                    example_inputs = stand_ins(saved_values(gm, example_inputs, self.saved), gm)
                    real, self.saved = True, {}
            elif kind == "forward":
                self.saved = {}
                if self.calls:
                    example_inputs = real_values(example_inputs, self.calls[-1])
                    real = not any(isinstance(x, FakeTensor) for x in example_inputs)
            # (with grad mode: a graph run as emitted is checked for gradients only there)
            key = (kind, torch.is_grad_enabled(), *signature(gm, example_inputs))
            # (gradients that differ on the user's values at one size: refused at any
            # size, since a recompile's own values may not show it; fuzz seed 58, 3500)
            program = (kind, torch.is_grad_enabled(), *sizeless_signature(gm, example_inputs))
            if key in self.refused or program in self.refused:
                return None
            if key not in self.cache:
                # (aot_autograd's fake mode would intercept ops on the real values)
                with unset_fake_temporarily() if real else nullcontext():
                    if kind == "forward" and real:
                        # (what it saves, on the user's values: the backward's validation
                        # runs on them, where random stand-ins for a mask or an
                        # attention's statistics make both programs' gradients NaN)
                        self.saved = forward_values(gm, example_inputs)
                    compiled = self._compile(kind, finish, inductor, gm, example_inputs)
                if compiled is None:
                    self.refused.update((key, program))
                    return None
                self.cache[key] = compiled
            for seen in _captures:
                seen.reports.append(self.cache[key].module.meta["egraph_graph"])
            return self.cache[key]
        return compiler

    def _compile(self, kind: str, finish: Callable, inductor: bool,
                 gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable | None:
        """A graph not compiled before, through the pipeline and ``finish``; with symbolic
        sizes, specialised for the sizes it is called at (:class:`BySize`)."""
        graph = self.options if self.options.cost is not None else dataclasses.replace(
            self.options, cost=default_cost(example_inputs, fused=inductor))
        name = f"{kind} {sum(r.name.startswith(kind) for r in self.reports)}"
        if inductor and self.partitions and _trains(example_inputs):
            module = self._training_form(gm, example_inputs, graph, name)
        else:  # (Inductor writes the kernels: it is handed torch ops, not ours)
            module = compile_one(gm, example_inputs, graph, target="cpu" if inductor else None,
                                 name=name)
        compiled = finish(module, gm, example_inputs)
        if compiled is None:
            return None
        self._give_decision(module.meta["egraph_graph"])
        if kind == "graph" and not inductor and any(map(has_symbolic_sizes, example_inputs)):
            compiled = BySize(compiled, size_symbols(example_inputs),
                              lambda args, at: self._kept(specialised(
                                  gm, args, finish, self.options, f"{name} at {at}")))
        self.reports.extend(module.meta["egraph_graph"].regions)
        self.reports.append(module.meta["egraph_graph"])
        return compiled

    def _training_form(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                       options: BackendOptions, name: str) -> torch.fx.GraphModule:
        """The form of a training graph Inductor compiles under the budget, chosen with
        what it saves (:mod:`compiler.forms`), with the choice in its ``meta["egraph_form"]``
        for the partition (the source's form: the graph emitted without rewrites)."""
        choice = _chosen_form(gm, example_inputs, options, fused=True)
        module = choice.module
        if module is gm:
            module = compile_one(gm, example_inputs, dataclasses.replace(options, rules=()),
                                 target="cpu", name=name)
        else:
            module.meta["egraph_graph"].name = name
        # (without the module: Inductor's cache key pickles the graph and its meta)
        module.meta["egraph_form"] = dataclasses.replace(choice, module=None)
        return module

    def _give_decision(self, report: GraphReport) -> None:
        """The report of a graph whose joint graph was just partitioned under the budget
        (a forward, or a graph Inductor compiled) gets the partition's decision."""
        for i, partition in enumerate(self.partitions or ()):
            if len(partition.decisions) > self.decided[i]:
                self.decided[i] = len(partition.decisions)
                report.saved = partition.decisions[-1]

    def _kept(self, compiled: Callable | None) -> Callable | None:
        """A program compiled after dynamo's compile (for a size), reported as the others."""
        if compiled is not None:
            self.reports.append(compiled.module.meta["egraph_graph"])
        return compiled


def functional_graph(gm: torch.fx.GraphModule,
                     example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """``gm`` as a graph of functional aten ops, traced on fake copies of its inputs (under
    dynamo's fake mode where there is one: nothing runs): an in-place update of a view
    becomes its ``*_scatter`` into the base, and an update of an input a ``copy_`` into
    it at the end, as aot_autograd's functionalisation makes them. For a graph Inductor
    compiles that updates a value a view shares (``h[:, 0].mul_(3)``, which ingest would
    make out of place under one name only) or an input (``x[:, 0].mul_(2)`` must change the
    caller's ``x``); the other code generator relies on aot_autograd's functionalisation
    for the same graphs.

    >>> def f(x):
    ...     h = x * 2
    ...     h[:, 0].mul_(3)
    ...     return h
    >>> g = functional_graph(torch.fx.symbolic_trace(f), (torch.ones(2, 2),))
    >>> [n.target.__name__ for n in g.graph.nodes if n.op == "call_function"]
    ['mul.Tensor', 'select.int', 'mul.Tensor', 'select_scatter.default', 'select.int']
    >>> g(torch.ones(2, 2))[0]
    tensor([6., 2.])
    """
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes = [x if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor)
                 else mode.from_tensor(x) for x in example_inputs]
        return make_fx(torch.func.functionalize(gm, remove="mutations"))(*fakes)


def _inductor_code(options: Mapping[str, Any] | None) -> Callable:
    """Inductor's code for the emitted module, compiled with ``options`` over
    :func:`default_inductor_options`."""
    def finish(module: torch.fx.GraphModule, gm: torch.fx.GraphModule,
               example_inputs: Sequence[Any]) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        patches = {**default_inductor_options(example_inputs), **(options or {})}
        partition = patches.get("custom_partitioner_fn")
        with partition.keeping(_parameter_inputs(module, example_inputs),
                               module.meta.get("egraph_form")) if isinstance(
                partition, BudgetedPartition) else nullcontext():
            return _Compiled(compile_fx(module, list(example_inputs), config_patches=patches),
                             module)
    return finish


def _chosen_form(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: BackendOptions, fused: bool = False) -> FormChoice:
    """The form of a training graph chosen with what it saves under ``options``' budget
    (:mod:`compiler.forms`), each form's own parameters free to keep; ``fused``: Inductor
    generates the code."""
    return choose_form(training_forms(gm, example_inputs, options, fused=fused),
                       example_inputs, options.budget, fused=fused,
                       kept=lambda module: _parameter_inputs(module, example_inputs))


def forward_values(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> dict[str, Any]:
    """The outputs of an aot forward graph ``gm`` run on real ``inputs`` (the caller's
    random state kept), by the names of the nodes it returns: its backward graph's inputs
    are the saved ones, under the same names.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x.sin(), x.cos()))
    >>> sorted(forward_values(gm, (torch.zeros(2),)).items())
    [('cos', tensor([1., 1.])), ('sin', tensor([0., 0.]))]
    """
    (output,) = gm.graph.find_nodes(op="output")
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else output.args
    names = [a.name if isinstance(a, torch.fx.Node) else None for a in returned]
    cuda = sorted({x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda},
                  key=str)
    with torch.random.fork_rng(devices=cuda), torch.no_grad():
        values = gm(*inputs)
    values = values if isinstance(values, (tuple, list)) else (values,)
    return {n: v for n, v in zip(names, values) if n is not None}


def saved_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 saved: Mapping[str, Any]) -> tuple:
    """A backward graph's example inputs, each placeholder the forward saved under its name
    replaced by the real value in ``saved`` (:func:`forward_values`) where the two agree
    in shape, strides and dtype (the output's gradients stay as given).

    >>> g = torch.fx.Graph()
    >>> saved_tanh, grad = g.placeholder("tanh"), g.placeholder("tangents_1")
    >>> _ = g.output(g.call_function(torch.mul, (saved_tanh, grad)))
    >>> given = (torch.empty(2), torch.empty(2))
    >>> real = saved_values(torch.fx.GraphModule({}, g), given, {"tanh": torch.ones(2)})
    >>> real[0], real[1] is given[1]
    (tensor([1., 1.]), True)
    """
    if not saved:
        return tuple(example_inputs)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    out = []
    for name, x in zip(names, example_inputs):
        value = saved.get(name)
        same = (isinstance(x, torch.Tensor) and isinstance(value, torch.Tensor)
                and not has_symbolic_sizes(x) and value.shape == x.shape
                and value.stride() == x.stride() and value.dtype == x.dtype
                and value.device == x.device)
        out.append(value if same else x)
    return tuple(out)


def _lifted(module: torch.nn.Module) -> list[torch.Tensor]:
    """``module``'s parameters and buffers, as aot_autograd lifts them into the first
    inputs of its joint graph."""
    return [*(p for _, p in module.named_parameters(remove_duplicate=False)),
            *(b for _, b in module.named_buffers(remove_duplicate=False))]


def _parameter_inputs(module: torch.nn.Module, example_inputs: Sequence[Any]) -> list[int]:
    """The places of the parameters among the inputs aot_autograd gives the joint graph of
    ``module`` called on ``example_inputs``: its own parameters and buffers (lifted first),
    then the inputs that are parameters of the model dynamo traced."""
    lifted = len(_lifted(module))
    return [*range(lifted), *(lifted + i for i, x in enumerate(example_inputs) if isinstance(
        x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None))]


def _boxed_code(module: torch.fx.GraphModule, gm: torch.fx.GraphModule,
                example_inputs: Sequence[Any]) -> Callable:
    """The emitted module as aot_autograd calls a compiled graph: boxed, its arguments
    one list that it empties as it starts (:func:`freeing_inputs`), so that a backward
    frees each saved activation after its last use, as Inductor's code does."""
    boxed = freeing_inputs(module) or make_boxed_func(module)
    boxed.module = module
    return boxed


def freeing_inputs(module: torch.fx.GraphModule) -> Callable | None:
    """``module``'s graph as a function of one list of its inputs, which it takes and
    clears as it starts, so that each input is freed after its last use in the graph
    (called with the inputs spread out, its caller would hold them all until it
    returned), a size test before the graph kept; None where the module's code is not
    torch.fx's plain code generation (structured inputs, named Triton kernels).

    >>> gm = torch.fx.symbolic_trace(lambda x, y: (x * 2).sum() + y)
    >>> run = freeing_inputs(gm)
    >>> args = [torch.ones(3), torch.tensor(1.0)]
    >>> run(args), args
    (tensor(7.), [])
    """
    codegen = module.graph._codegen
    if type(codegen) is not torch.fx.graph.CodeGen:
        return None
    graph = copy.deepcopy(module.graph)
    boxed_codegen = torch.fx.graph._BoxedCodeGen()
    boxed_codegen._body_transformer = codegen._body_transformer  # (the size test)
    graph.set_codegen(boxed_codegen)
    boxed = torch.fx.GraphModule(module, graph)
    boxed.meta.update(module.meta)

    def run(args: list) -> Any:
        return boxed.forward(args)

    run._boxed_call = True
    return run


def _autograd_code(module: torch.fx.GraphModule, gm: torch.fx.GraphModule,
                   example_inputs: Sequence[Any]) -> Callable | None:
    """The emitted module itself, differentiated by autograd op by op like eager code
    (no backward graph, none of aot_autograd's runtime wrappers: a small GPT-2's training
    step 0.98x -> 0.81x eager's time on the CPU, BERT 0.94x -> 0.77x); None where autograd
    through it would not give the source's gradients or effects
    (:func:`compiler.validate.validate_autograd`), so the graph goes through aot_autograd
    instead."""
    from compiler.validate import validate_autograd

    # (dynamo guards on grad mode: a graph compiled without grad is never differentiated)
    if torch.is_grad_enabled() and not module.meta["egraph_graph"].fell_back and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        start = time.perf_counter()
        reason = validate_autograd(gm, module, hinted_inputs(example_inputs, gm))
        module.meta["egraph_graph"].times["gradients"] = time.perf_counter() - start
        if reason is not None:
            log.info("%s: through aot_autograd: %s", module.meta["egraph_graph"].name, reason)
            return None
    return _Compiled(module, module)


_STATE_CHANGES = frozenset({torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
                            torch.amp.autocast_mode._exit_autocast})
_TRANSFORMS = "torch._functorch.predispatch"
"""Where dynamo's calls of a functorch transform's levels live (a vmap's entry and exit,
its batch dims: transformers' masks under torch.compile)."""


def differentiable_as_emitted(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether the module emitted for a graph dynamo hands the backend can run as it is,
    differentiated by autograd, rather than through aot_autograd: on the CPU (our fused
    Triton kernels have no backward), where the graph neither changes grad or autocast
    mode nor enters a functorch transform (a vmap run as emitted goes through functorch's
    Python levels on every call, where aot_autograd traces it into plain ops: Mamba's
    forward 1.20x eager's time against 0.93x) nor calls a higher-order op (regions the
    emitted code keeps opaque) nor changes
    an input in place, nor updates a value a view shares (``h[:, 0].mul_(3)``; both left
    to aot_autograd's functionalisation; a change no spelling shows, batch norm's running
    statistics in training, is found on the first call by
    :func:`compiler.validate.validate_autograd`), nor is compiled inside an autocast region
    the caller entered: each op of such a graph takes autocast's dtype when it runs, which
    neither its rewrites nor validation would see (``x @ w.t() + b`` in float32 where
    ``linear`` gives bfloat16; T5's float32 softmax of a bfloat16 product becoming a
    bfloat16 ``scaled_dot_product_attention``), where aot_autograd writes autocast's casts
    into the graph and runs it with autocast off.

    >>> gm = torch.fx.symbolic_trace(lambda x: x.sin())
    >>> differentiable_as_emitted(gm, (torch.randn(2),))
    True
    """
    if cuda_device(example_inputs) is not None or _updates_shared_storage(gm.graph) or (
            torch._C._is_any_autocast_enabled()):
        return False
    return not any(n.op == "call_function" and (
        n.target in _STATE_CHANGES or isinstance(n.target, torch._ops.HigherOrderOperator)
        or getattr(n.target, "__module__", None) == _TRANSFORMS) for n in gm.graph.nodes)


def _updates_shared_storage(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` changes an input in place, or a value a view shares: ingest would
    make the update out of place under one name only, so the graph is made functional
    first (aot_autograd's functionalisation, or :func:`functional_graph` for Inductor)."""
    return updates_an_alias(graph) or updates_inputs(graph)


def _trains(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph is compiled for training: grad is on and an input needs it."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def _autocast_off(run: Callable) -> Callable:
    """``run``, called with autocast off."""
    def call(*args):
        with torch._C._DisableAutocast():
            return run(*args)
    return call


class _Compiled:
    """What runs for a graph the backend compiled (the emitted module itself, or Inductor's
    code for it), and the emitted ``module``."""

    def __init__(self, run: Callable, module: torch.fx.GraphModule):
        self.run, self.module = run, module

    def __call__(self, *args):
        return self.run(*args)


_backends: dict[str, Callable] = {}


def egraph_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   options: dict | None = None):
    """The ``egraph`` backend: aot_autograd around the e-graph pipeline, with the rule
    library, the cost model of the inputs' device and strict validation.
    ``torch.compile(model, backend="egraph", options={...})`` passes ``options`` to
    :func:`make_backend` (``rules``, ``cost``, ``validate``, ``reference``, ``codegen``,
    ``inductor_options``, ``memory``, ``autotune``, limits). ``torch.compile(...,
    mode=...)`` (torch takes a mode or options, not both) is Inductor's mode
    (``"max-autotune"``, ``"reduce-overhead"``, ...): its config patches apply where
    Inductor generates the graph's code (``codegen="inductor"``, the default on CUDA);
    where the code is our own emission, a warning says they change nothing there. A
    ``"max-autotune"`` mode also turns on ``autotune`` (:mod:`compiler.autotune`), with
    either code generator.

    >>> import warnings
    >>> f = torch.compile(torch.cos, backend="egraph", mode="max-autotune")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     out = f(torch.zeros(2))
    >>> out, any("'codegen': 'inductor'" in str(w.message) for w in caught)
    (tensor([1., 1.]), True)
    """
    options = dict(options or {})
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options  # (an unknown mode: torch's error)

        options["inductor_options"] = {**list_mode_options(mode),
                                       **(options.get("inductor_options") or {})}
        if mode.startswith("max-autotune"):
            options.setdefault("autotune", True)
        codegen = options.get("codegen") or default_codegen(example_inputs)
        if codegen != "inductor":
            warnings.warn(
                f"torch.compile's mode={mode!r} sets options of Inductor's code generation, "
                f"and this graph's code is the e-graph's own emission (codegen={codegen!r}, "
                "the default on the CPU), which they do not change; for Inductor's code "
                "with them, pass options={'codegen': 'inductor', 'inductor_options': "
                f"torch._inductor.list_mode_options({mode!r})}} instead of the mode"
                + (" (the mode's autotuning of the e-graph's programs applies either way)"
                   if options.get("autotune") else ""), stacklevel=2)
    key = repr(sorted(options.items(), key=lambda kv: kv[0]))
    backend = _backends.get(key)
    if backend is None:
        backend = _backends[key] = make_backend(**options)
    return backend(gm, example_inputs)


def _register() -> None:
    """Register the name ``egraph`` unless dynamo loads it from the installed entry point
    on first use (registering it here as well would make dynamo's own registration fail
    with a duplicate name) or it is registered already."""
    from importlib.metadata import entry_points

    target = f"{__name__}:{egraph_backend.__name__}"
    if any(ep.name == "egraph" and ep.value == target
           for ep in entry_points(group="torch_dynamo_backends")):
        return
    if "egraph" not in torch._dynamo.list_backends(exclude_tags=()):
        register_backend(name="egraph", compiler_fn=egraph_backend)


_register()
