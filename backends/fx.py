"""Emission: the extracted program becomes a new torch.fx.GraphModule.

The chosen DAG is walked in dependency order and each chosen e-node becomes one FX node
calling an ordinary torch function, so ``print(gm.code)`` reads like hand-written code.
The signature (placeholders, in order), the output structure and the parameters (same
state_dict keys, same tensors) are those of the source; opaque calls are replayed as they
were, in their original order. The source module is never mutated.

>>> import torch
>>> from egraph import EGraph, AstSize
>>> gm = torch.fx.symbolic_trace(lambda x: torch.exp(x) + torch.exp(x))
>>> opt = EGraph.from_fx(gm, (torch.randn(3),)).extract(AstSize())
>>> print(opt.code.strip().splitlines()[-2].strip())
add = torch.add(exp, exp);  exp = None
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn

from backends.sizes import explain_sizes, probe_sizes, require_sizes
from egraph.extract import best_nodes
from egraph.term import is_literal_op
from frontends.fx.analysis import SCALAR_OPS, literal_value
from frontends.fx.ingest import SHAPE_PARAMS, FxSource, SubmoduleRef, _Ref
from frontends.fx.vocabulary import SPECS

if TYPE_CHECKING:
    from backends.triton.regions import Fusion
    from backends.validate import Validation
    from egraph.egraph import EGraph
    from extractors.costs import Roofline

TARGETS = ("cpu", "cuda")
"""What emission targets: ``cpu`` (eager torch ops), ``cuda`` (fusion regions as Triton
kernels, which run as eager torch ops on CPU tensors)."""


@dataclass
class ExtractionReport:
    """What ``extract`` did to an FX program; ``print(report)`` reads as a summary."""

    cost_before: Any
    cost_after: Any
    method: str
    rewrites: dict[str, int] = field(default_factory=dict)
    optimal: bool | None = None
    validation: Validation | None = None
    fell_back: bool = False
    times: dict[str, float] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    kernels: list[str] = field(default_factory=list)
    built_for: dict[str, dict[int, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [
            f"cost {self.cost_before} -> {self.cost_after} ({self.method}"
            + (", proven optimal" if self.optimal else "") + ")",
            f"graph nodes {self.nodes_before} -> {self.nodes_after}",
        ]
        if self.rewrites:
            lines.append("rewrites applied: " + ", ".join(
                f"{name} x{n}" for name, n in sorted(self.rewrites.items())))
        else:
            lines.append("rewrites applied: none")
        if self.validation is not None:
            lines.append(str(self.validation))
        if self.kernels:
            lines.append("fused kernels: " + ", ".join(self.kernels))
        if self.fell_back:
            lines.append("validation failed: the original program was returned")
        if self.built_for:
            lines.append("runs only on inputs of the example's sizes: " + ", ".join(
                f"{name} dim {d} = {n}" for name, dims in self.built_for.items()
                for d, n in dims.items()) + " (a rewrite computed with them)")
        lines.append("times: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                           for k, v in self.times.items()))
        return "\n".join(lines)


class _Emitter:
    def __init__(self, egraph: EGraph, choice: dict[int, tuple], fusions: list[Fusion] = ()):
        self.eg = egraph
        self.src: FxSource = egraph.fx
        self.choice = choice
        self.graph = fx.Graph()
        self.values: dict[int, Any] = {}
        self.attrs: dict[str, fx.Node] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.submodules: set[str] = set()  # regions of higher-order ops, replayed as is
        self.find = egraph.find
        # class -> the fused kernel call that computes it (CUDA targets)
        self.fused = {c: f for f in fusions for c in f.members}
        # literal target shapes the program holds (``reshape to (2, 16, 4, 16)``)
        self.baked: list[str] = []

    def run(self) -> fx.Graph:
        src = self.src
        for name, cid in zip(src.inputs, src.input_classes):
            self.values[self.find(cid)] = self.graph.placeholder(name)
        for effect in src.effects:
            self.value(effect)
        out = fx.node.map_aggregate(src.output, lambda a: self.value(a.cid)
                                    if isinstance(a, _Ref) else a)
        self.graph.output(out)
        return self.graph

    def value(self, cid: int) -> Any:
        """The FX node or Python value of class ``cid``, emitting its sub-DAG first."""
        root = self.find(cid)
        stack = [root]
        while stack:
            c = stack[-1]
            if c in self.values:
                stack.pop()
                continue
            fusion = self.fused.get(c)
            if fusion is not None:
                missing = [k for k in fusion.inputs if self.find(k) not in self.values]
                if missing:
                    stack.extend(reversed(missing))
                    continue
                stack.pop()
                self.call_kernel(fusion)
                continue
            node = self.choice[c]
            missing = [k for k in map(self.find, node[1:]) if k not in self.values]
            if missing:
                stack.extend(reversed(missing))
                continue
            stack.pop()
            self.values[c] = self.emit(node, self.eg.data(c))
        return self.values[root]

    def emit(self, node: tuple, meta: Any) -> Any:
        op = node[0]
        kids = [self.values[self.find(k)] for k in node[1:]]
        if meta is not None and meta.kind == "scalar" and op in SCALAR_OPS:
            # shape arithmetic on Python numbers: operator/math, not torch
            return self.graph.call_function(SCALAR_OPS[op], tuple(kids))
        if is_literal_op(op):
            return literal_value(op)
        if op == "tuple":
            return tuple(kids)
        if op == "slice":
            return slice(*kids)
        if op == "input":
            raise KeyError(f"input {kids[0]!r} is not a placeholder of the source graph")
        if op == "param":
            return self.attr(kids[0])
        if op == "const":
            self.constants[kids[0]] = self.src.constants[kids[0]]
            return self.attr(kids[0])
        if op == "opaque":
            return self.replay(kids[0])
        spec = SPECS[op]
        if op in ("add", "mul") and isinstance(kids[0], (int, float)) and isinstance(
                kids[1], fx.Node):
            # tensor first: torch.mul(3e12, half_tensor) rounds 3e12 to float16 (inf) before
            # multiplying, torch.mul(half_tensor, 3e12) computes in float32 as x * 3e12 does
            kids = [kids[1], kids[0]]
        if op in SHAPE_PARAMS:
            shape = kids[SHAPE_PARAMS[op]]
            if isinstance(shape, tuple) and all(type(d) is int for d in shape):
                self.baked.append(f"{op} to {shape}")
        args, kwargs = spec.arguments(kids)
        if isinstance(spec.impl, str):
            return self.graph.call_method(spec.impl, args, kwargs)
        return self.graph.call_function(spec.impl, args, kwargs)

    def call_kernel(self, fusion: Fusion) -> None:
        """One call of a fused kernel; its outputs become the values of their classes."""
        args = tuple(self.values[self.find(k)] for k in fusion.inputs)
        names = [self.choice[c][0] for c in fusion.outputs]
        if len(names) == 1:
            self.values[fusion.outputs[0]] = self.graph.create_node(
                "call_function", fusion.kernel, args, name=names[0])
            return
        call = self.graph.create_node("call_function", fusion.kernel, args,
                                      name=fusion.kernel.spec.name)
        for i, (c, name) in enumerate(zip(fusion.outputs, names)):
            self.values[c] = self.graph.create_node("call_function", operator.getitem,
                                                    (call, i), name=name)

    def attr(self, name: str) -> fx.Node:
        node = self.attrs.get(name)
        if node is None:
            node = self.attrs[name] = self.graph.get_attr(name)
        return node

    def replay(self, token: str) -> fx.Node:
        call = self.src.opaque[token]

        def resolve(a):
            if isinstance(a, SubmoduleRef):
                self.submodules.add(a.target)
                return self.attr(a.target)
            return self.values[self.find(a.cid)] if isinstance(a, _Ref) else a

        args = fx.node.map_aggregate(call.args, resolve)
        kwargs = fx.node.map_aggregate(call.kwargs, resolve)
        return self.graph.create_node(call.op, call.target, args, kwargs)


def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The module that holds ``path``'s last part (created empty where missing) and it."""
    *parents, leaf = path.split(".")
    module = root
    for part in parents:
        child = getattr(module, part, None)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


def _set_path(root: nn.Module, path: str, value: torch.Tensor, buffer: bool) -> None:
    module, leaf = _owner(root, path)
    if hasattr(module, leaf):
        return
    if isinstance(value, nn.Parameter):
        module.register_parameter(leaf, value)
    elif buffer:
        module.register_buffer(leaf, value)
    else:
        setattr(module, leaf, value)


def build_module(egraph: EGraph, choice: dict[int, tuple], target: str = "cpu",
                 judge: Roofline | None = None) -> fx.GraphModule:
    """The GraphModule of a choice (class -> chosen e-node) over an e-graph from FX.

    ``target="cuda"`` emits the fusion regions as Triton kernel calls
    (:mod:`backends.triton`): those ``judge`` (a Roofline model) says pay, or every region
    that lowers when no judge is given; their kernels are in ``gm.meta["triton_kernels"]``.

    >>> from egraph import EGraph
    >>> from backends.triton.regions import source_choice
    >>> eg = EGraph.from_fx(torch.fx.symbolic_trace(lambda x: torch.exp(x) * 2),
    ...                     (torch.randn(3),))
    >>> print(build_module(eg, source_choice(eg)).code.strip().splitlines()[-2].strip())
    mul = torch.mul(exp, 2);  exp = None
    >>> list(build_module(eg, source_choice(eg), target="cuda").meta["triton_kernels"])
    ... # doctest: +ELLIPSIS
    ['fused_exp_mul_...']
    """
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: use one of {', '.join(map(repr, TARGETS))}")
    fusions: list[Fusion] = []
    if target == "cuda":
        from backends.triton.regions import plan

        fusions = plan(egraph, choice, judge)
    emitter = _Emitter(egraph, choice, fusions)
    graph = emitter.run()
    if fusions:
        from backends.triton.emit import KernelNames

        graph.set_codegen(KernelNames())
    src = egraph.fx
    if emitter.baked:
        explain_sizes(graph, egraph, emitter.baked)
    holder = nn.Module()
    for name in emitter.attrs:
        if name in emitter.submodules:
            owner, leaf = _owner(holder, name)
            owner.add_module(leaf, src.graph_module.get_submodule(name))
        elif name in emitter.constants:
            _set_path(holder, name, emitter.constants[name], buffer=True)
        else:
            _set_path(holder, name, _fetch(src.module, name), buffer=True)
    for call in src.opaque.values():
        if call.op == "call_module" and any(
                n.op == "call_module" and n.target == call.target for n in graph.nodes):
            owner, leaf = _owner(holder, call.target)
            owner.add_module(leaf, src.module.get_submodule(call.target))
    graph.lint()
    gm = fx.GraphModule(holder, graph, class_name=type(src.module).__name__ + "Optimized")
    # Every parameter and buffer of the source, used or not, so checkpoints still load;
    # folded constants are not state.
    for name, value in src.module.state_dict(keep_vars=True).items():
        _set_path(gm, name, value, buffer=not isinstance(value, nn.Parameter))
    for name, value in emitter.constants.items():
        gm.register_buffer(name, value, persistent=False)
    if fusions:
        gm.meta["triton_kernels"] = {f.kernel.__name__: f.kernel for f in fusions}
    return gm


def _fetch(module: nn.Module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _source_choice(egraph: EGraph, cost) -> dict[int, tuple]:
    """The source program's own e-nodes (the cheapest where CSE merged two)."""
    return {c: v[1] for c, v in best_nodes(egraph, cost, nodes_of=egraph.fx.initial).items()}


def extract_module(egraph: EGraph, cost, method: str = "greedy", validate: str = "strict",
                   target: str | None = None, time_limit: float = 60.0) -> fx.GraphModule:
    """Extract the best program under ``cost``, emit it, validate it, and report."""
    import warnings

    from backends.validate import ValidationError, validate_module

    if validate not in ("strict", "raise", "off"):
        raise ValueError(f"validate={validate!r}: use 'strict', 'raise' or 'off'")
    if method not in ("greedy", "dag", "ilp"):
        raise ValueError(f"method={method!r}: use 'greedy', 'dag' or 'ilp'")
    if target is None:
        target = _device_target(egraph.fx.example_inputs)
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: use one of {', '.join(map(repr, TARGETS))} "
                         "(None: the device of the example inputs)")
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    roots = [egraph.find(r) for r in egraph.roots] + [egraph.find(e) for e in egraph.fx.effects]
    optimal = None
    if method == "greedy":
        choice = best_nodes(egraph, cost, prefer=egraph.fx.initial)
        missing = [r for r in roots if r not in choice]
        if missing:
            raise ValueError(f"classes {missing} have no finite program under {cost!r}")
        picked = {c: v[1] for c, v in choice.items()}
    else:
        from extractors.methods import choose

        picked, dag_cost, optimal = choose(egraph, cost, method, roots, time_limit)
    if method != "greedy" and getattr(cost, "local", True):
        cost_after = dag_cost
        cost_before = cost.program_cost(egraph, _source_choice(egraph, cost))
    elif getattr(cost, "local", True):
        cost_after = sum_cost(choice, roots)
        before = best_nodes(egraph, cost, nodes_of=egraph.fx.initial)
        cost_before = sum_cost(before, roots)
    else:
        # a whole-program cost: the proxy's choice, improved under the exact cost
        from extractors.local_search import improve

        picked = improve(egraph, picked, cost)
        cost_after = cost.program_cost(egraph, picked)
        cost_before = cost.program_cost(egraph, _source_choice(egraph, cost))
    times["extract"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    judge = None
    if target == "cuda":
        from extractors.costs import Roofline

        judge = cost if isinstance(cost, Roofline) else Roofline()
    gm = build_module(egraph, picked, target, judge)
    times["emit"] = time.perf_counter() - t1
    rewrites = {}
    if egraph.report is not None:
        rewrites = {name: s.applied for name, s in egraph.report.rules.items() if s.applied}
    report = ExtractionReport(
        cost_before=cost_before, cost_after=cost_after, method=method, rewrites=rewrites,
        optimal=optimal, times=times, nodes_before=_count(egraph.fx.graph_module),
        nodes_after=_count(gm), kernels=list(gm.meta.get("triton_kernels", ())),
    )
    if validate != "off" and egraph.fx.example_inputs is not None:
        t2 = time.perf_counter()
        result = validate_module(egraph.fx, gm)
        report.times["validate"] = time.perf_counter() - t2
        report.validation = result
        if not result.ok:
            why = (f"{result.reason}; rewrites involved: "
                   + (", ".join(sorted(rewrites)) or "none (emission itself)"))
            if validate == "raise":
                raise ValidationError(why)
            warnings.warn(f"egraph: the optimised program failed validation ({why}); "
                          "returning the original", stacklevel=3)
            report.fell_back = True
            gm = _original_module(egraph.fx)
        else:
            t3 = time.perf_counter()
            report.built_for = probe_sizes(egraph, picked, roots, gm, bool(rewrites))
            if report.built_for:
                require_sizes(gm, report.built_for, egraph.fx)
            report.times["sizes"] = time.perf_counter() - t3
    gm.meta["egraph_report"] = report
    if egraph.report is not None:
        egraph.report.extraction = {"method": method, "cost": cost_after,
                                    "optimal": optimal, "time": round(times["extract"], 6)}
    return gm


def _device_target(example_inputs) -> str:
    """``cuda`` when an example input lives on a CUDA device, ``cpu`` otherwise."""
    found: list[Any] = []
    fx.node.map_aggregate(tuple(example_inputs or ()), found.append)
    cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in found)
    return "cuda" if cuda else "cpu"


def _original_module(src: FxSource) -> fx.GraphModule:
    """The source program with the emitted module's signature (the user's inputs)."""
    gm = src.graph_module
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if placeholders != list(src.inputs) and isinstance(src.module, fx.GraphModule):
        return src.module  # a torch.export program's graph takes its parameters as inputs
    return fx.GraphModule(src.module if isinstance(src.module, nn.Module) else gm, gm.graph)


def _count(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr"))


def sum_cost(choice: dict[int, tuple[Any, tuple]], roots: list[int]):
    """Total tree cost of the roots (each root's best cost, added once per root class)."""
    total = None
    for r in dict.fromkeys(roots):
        c = choice[r][0]
        total = c if total is None else total + c
    return total
