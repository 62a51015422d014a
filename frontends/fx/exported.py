"""A torch.export program as a module that runs its graph as exported.

``ExportedProgram.module()`` unlifts the program: it rewrites the graph to read parameters
as attributes, adds a check of the inputs and recompiles the code four times, 0.28 s for
GPT-2 small. Ingest reads the exported graph itself, so the source program it validates
against and emits from need not be unlifted: :class:`ExportedModule` holds the program's
parameters, buffers and constants at their names (the same tensors, not copies) and calls
the exported graph with them and the user's inputs, checking the inputs' static sizes as
the unlifted module does.

>>> import torch
>>> program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
>>> module = ExportedModule(program)
>>> module.weight is program.state_dict["weight"]
True
>>> torch.equal(module(torch.ones(4, 3)), program.module()(torch.ones(4, 3)))
True
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import logging
import math
import warnings
from collections.abc import Callable
from functools import reduce
from typing import Any, NamedTuple

import sympy
import torch
import torch.nn as nn
from torch.export._unlift import GuardsFn
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import TreeSpec, tree_unflatten

__all__ = ["ExportedModule", "InputGuards", "SizeConstraintError", "attribute_at", "deep_copy",
           "argument_names", "export_dynamic", "input_guards",
           "input_structure", "is_input_guards", "named_shape", "owner_of", "pytree_info",
           "written_targets"]


_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION,
              OutputKind.USER_INPUT_MUTATION)


def written_targets(signature) -> list[str | None]:
    """Per output of an export program's graph: the buffer, parameter (updated in place
    under ``no_grad``) or input whose new value it is, or None for an output the user
    gets. By position: one value may be the new value of two tensors, or also an output.

    >>> class Count(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("n", torch.zeros(()))
    ...     def forward(self, x):
    ...         self.n.add_(1)
    ...         return x + self.n
    >>> program = torch.export.export(Count(), (torch.ones(2),)).run_decompositions({})
    >>> written_targets(program.graph_signature)
    ['n', None]
    """
    return [spec.target if spec.kind in _MUTATIONS else None
            for spec in signature.output_specs]


class ExportedModule(nn.Module):
    """``program`` as a module: inputs flat, in order; outputs in the program's structure.

    Parameters stay parameters, buffers stay buffers (persistent or not, as exported) and
    tensor constants are plain attributes, as in ``ExportedProgram.module()``, so its
    ``state_dict`` is the program's. ``program`` is the ExportedProgram, ``graph_module``
    its graph.

    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).eval()
    >>> module = ExportedModule(torch.export.export(model, (torch.randn(4, 3),)))
    >>> sorted(module.state_dict()) == sorted(model.state_dict())
    True
    """

    def __init__(self, program: torch.export.ExportedProgram):
        super().__init__()
        state, constants = program.state_dict, program.constants
        slots: list[str | None] = []  # per graph input: the attribute it reads, or None
        for spec in program.graph_signature.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                slots.append(None)
                continue
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER,
                                 InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
                raise NotImplementedError(
                    f"the exported program takes a {spec.kind.name} input ({spec.arg.name}); "
                    "export without effect tokens, or compile the model with "
                    "torch.compile(model, backend='egraph')")
            target = spec.target
            value = state[target] if target in state else constants[target]
            owner, leaf = owner_of(self, target)
            if spec.kind == InputKind.PARAMETER:
                owner.register_parameter(leaf, value)
            elif spec.kind == InputKind.BUFFER:
                owner.register_buffer(leaf, value, persistent=bool(spec.persistent))
            else:
                setattr(owner, leaf, value)
            slots.append(target)
        # Kept out of the module tree: neither holds state of its own.
        object.__setattr__(self, "graph_module", program.graph_module)
        object.__setattr__(self, "program", program)
        self._slots, self._guards = slots, input_guards(program)
        self._out_spec = program.call_spec.out_spec
        self._mutations = sum(t is not None for t in written_targets(program.graph_signature))

    def graph_inputs(self, args: tuple) -> list[Any]:
        """The exported graph's inputs: this module's state where the graph reads it, the
        user's ``args`` (checked against the conditions the export holds them to:
        :func:`input_guards`) elsewhere."""
        wanted = self._slots.count(None)
        if len(args) != wanted:
            raise TypeError(f"the exported program takes {wanted} inputs, got {len(args)}")
        broken = self._guards.broken(args)
        if broken is not None:
            raise ValueError(f"{self._guards.describe(args)}; the program was exported for "
                             f"inputs where {broken}")
        users = iter(args)
        return [next(users) if slot is None else attribute_at(self, slot)
                for slot in self._slots]

    def forward(self, *args: Any) -> Any:
        flat = self.graph_module(*self.graph_inputs(args))
        return tree_unflatten(list(flat)[self._mutations:], self._out_spec)


def deep_copy(module: nn.Module, memo: dict[int, Any] | None = None) -> nn.Module:
    """``copy.deepcopy(module, memo)``, without the FutureWarning torch gives on each copy
    of a pytree spec (its own copy checks ``isinstance(spec, LeafSpec)``, which it has
    deprecated): exported modules and their code generation hold specs.

    >>> gm = torch.export.export(torch.nn.ReLU(), (torch.ones(2),)).module()
    >>> deep_copy(gm)(-torch.ones(2))
    tensor([0., 0.])
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
        return copy.deepcopy(module, memo)


def attribute_at(root: nn.Module, path: str) -> Any:
    """The attribute a dotted ``path`` names under ``root`` (``"h.0.attn.weight"``).

    >>> attribute_at(nn.Sequential(nn.Linear(2, 3)), "0.weight").shape
    torch.Size([3, 2])
    """
    return reduce(getattr, path.split("."), root)


def owner_of(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The module that holds ``path``'s last part (created empty where missing) and it.

    >>> root = nn.Module()
    >>> owner, leaf = owner_of(root, "a.b.c")
    >>> owner is root.a.b, leaf
    (True, 'c')
    """
    *parents, leaf = path.split(".")
    module = root
    for part in parents:
        child = getattr(module, part, None)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


# -- the input contract of an exported program ------------------------------------------------


class InputGuards(NamedTuple):
    """What an exported program holds its user inputs to: ``conditions``, Python
    expressions over ``names`` (one per user input, in order)."""

    names: tuple[str, ...]
    conditions: tuple[str, ...]

    def broken(self, inputs: tuple) -> str | None:
        """The first condition ``inputs`` (one per name) break, or None.

        >>> guards = InputGuards(("x",), ("x.size()[0] == 3", "x.dim() == 1"))
        >>> guards.broken((torch.ones(3),)), guards.broken((torch.ones(2),))
        (None, 'x.size()[0] == 3')
        """
        if not self.conditions or _holds(
                self.names, " and ".join(f"({c})" for c in self.conditions), inputs):
            return None
        return next(c for c in self.conditions if not _holds(self.names, c, inputs))

    def describe(self, inputs: tuple) -> str:
        """The inputs as a message names them: ``input 'x' has shape (2, 3)``."""
        return ", ".join(named_shape(name, x) for name, x in zip(self.names, inputs))


def named_shape(name: str, value: Any) -> str:
    """An input as an error message names it.

    >>> named_shape("x", torch.ones(2, 3)), named_shape("n", 4)
    ("input 'x' has shape (2, 3)", "input 'n' is 4")
    """
    if isinstance(value, torch.Tensor):
        return f"input {name!r} has shape {tuple(value.shape)}"
    return f"input {name!r} is {value!r}"


def _holds(names: tuple[str, ...], condition: str, inputs: tuple) -> bool:
    """Whether ``condition`` holds of ``inputs`` (not where it cannot be evaluated on
    them: a number where a tensor was exported)."""
    try:
        return bool(_condition(names, condition)(*inputs))
    except Exception:  # noqa: BLE001 - e.g. ``n.size()`` of an int: broken
        return False


@functools.lru_cache(maxsize=256)
def _condition(names: tuple[str, ...], condition: str) -> Callable[..., bool]:
    """``condition`` over ``names`` as a function of the inputs, compiled once (in the
    namespace of torch's own guard code: ``FloorDiv``, ``math``)."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    namespace = {**SYMPY_INTERP, "math": math, "inf": math.inf}
    return eval(f"lambda {', '.join(names)}: {condition}", namespace)  # noqa: S307


def input_guards(source: torch.export.ExportedProgram | torch.fx.GraphModule
                 ) -> InputGuards | None:
    """The conditions a torch.export program holds its user inputs to, as Python
    expressions over the inputs' names: a size export made static (``x.size()[0] == 3``),
    the range of a dynamic one (``x.size()[0] <= 64``), dims that share a symbol or derive
    from one (``y.size()[0] == 4*x.size()[0]``) and the relations its tracer assumed
    (``x.size()[0] > y.size()[0]``, a branch taken). ``source`` is the ExportedProgram or
    its unlifted ``module()``; any other graph holds no such contract: None.

    A program runs correctly only where these hold (a branch on a size was taken once, at
    export): torch's ``module()`` asserts them, and so must a program emitted from it.

    >>> program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    >>> input_guards(program).conditions
    ('input.dim() == 2', 'input.size()[0] == 4', 'input.size()[1] == 3')
    """
    if isinstance(source, torch.export.ExportedProgram):
        placeholders = [n for n, spec in zip(source.graph.find_nodes(op="placeholder"),
                                            source.graph_signature.input_specs)
                        if spec.kind == InputKind.USER_INPUT]
        names = [n.name for n in placeholders]
        ranges, traced = source.range_constraints, _guards_over_names(source._guards_code,
                                                                      names)
    elif isinstance(getattr(source, "_guards_fn", None), GuardsFn):
        placeholders = list(source.graph.find_nodes(op="placeholder"))
        names = [str(n.target) for n in placeholders]  # (the messages' names: forward's)
        ranges, traced = _ranges(source, placeholders), _asserted(source._guards_fn)
    else:
        return None
    guards = _size_guards([(name, n.meta.get("val")) for name, n in zip(names, placeholders)],
                          ranges)
    readable = (_readable(g, names) for g in guards + traced)
    return InputGuards(tuple(names), tuple(dict.fromkeys(g for g in readable if g)))


def input_structure(source: torch.export.ExportedProgram | torch.fx.GraphModule
                    ) -> tuple[list[str], TreeSpec] | None:
    """The names of the arguments of ``source``'s forward and how its graph's flat
    inputs are their leaves, where an argument is a structure (``forward(self, d)`` with
    ``d = {"a": x, "b": [y, z]}``, its graph taking ``d_a, d_b_0, d_b_1``), else None:
    what a module emitted from it takes, as torch's unlifted module does.

    >>> class Pair(torch.nn.Module):
    ...     def forward(self, d):
    ...         return d["a"] + d["b"]
    >>> program = torch.export.export(Pair(), ({"a": torch.ones(2), "b": torch.ones(2)},))
    >>> input_structure(program)[0]
    ['d']
    >>> input_structure(torch.export.export(torch.nn.ReLU(), (torch.ones(2),))) is None
    True
    """
    if isinstance(source, torch.export.ExportedProgram):
        spec = source.call_spec.in_spec
        signature = source.module_call_graph[0].signature
        names = list(signature.forward_arg_names or ()) if signature else []
    else:
        info = pytree_info(source)
        if info is None or info.in_spec is None:
            return None
        spec, names = info.in_spec, list(info.orig_args)
    if spec is None or not _nested(spec):
        return None
    if not names:  # (as torch names them where the program does not record them)
        args, kwargs = spec.children()
        names = [f"arg_{i}" for i in range(args.num_children)] + list(kwargs.context)
    return names, spec


def pytree_info(module: nn.Module | None):
    """How ``module``'s code flattens its arguments into its graph's inputs and rebuilds
    its results from the graph's outputs (fx's ``PyTreeInfo``: ``orig_args``, ``in_spec``,
    ``out_spec``), where it is a GraphModule that does so, as torch's unlifted module
    does; else None.

    >>> program = torch.export.export(torch.nn.ReLU(), (torch.ones(2),))
    >>> pytree_info(program.module()).orig_args
    ['input']
    >>> pytree_info(program.graph_module) is None
    True
    """
    if not isinstance(module, torch.fx.GraphModule):
        return None
    return getattr(module.graph._codegen, "pytree_info", None)


def _nested(spec: TreeSpec) -> bool:
    """Whether an ``(args, kwargs)`` spec holds an argument that is not a leaf."""
    if spec.type is not tuple or spec.num_children != 2:
        return True
    return any(not leaf.is_leaf() for part in spec.children() for leaf in part.children())


def is_input_guards(module: nn.Module | None) -> bool:
    """Whether ``module`` is the check of the inputs that ``ExportedProgram.module()``
    calls first (its conditions are :func:`input_guards`).

    >>> gm = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),)).module()
    >>> is_input_guards(gm.get_submodule("_guards_fn"))
    True
    """
    return isinstance(module, GuardsFn)


def _ranges(module: torch.fx.GraphModule, placeholders: list[torch.fx.Node]) -> dict:
    """The ranges of the size symbols of an unlifted export module: its own record, or,
    where a pass rebuilt the module without it (PT2E quantisation's ``convert_pt2e``), the
    shape environment its inputs' recorded values were made in."""
    if hasattr(module, "range_constraints"):
        return module.range_constraints
    for node in placeholders:
        value = node.meta.get("val")
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for n in sizes:
            if isinstance(n, torch.SymInt):
                return dict(n.node.shape_env.var_to_range)
    return {}


def _size_guards(inputs: list[tuple[str, Any]], ranges: dict) -> list[str]:
    """The guards of the recorded values of the inputs (``[(name, value)]``): static sizes
    and integers equal, a symbol's first size its range, later sizes of one symbol equal
    to the first, derived sizes their expression (as torch's own unlifted module checks)."""
    sources: dict[sympy.Expr, str] = {}
    guards: list[str] = []
    derived: list[tuple[str, sympy.Expr]] = []

    def size(source: str, value: Any) -> None:
        if isinstance(value, int):
            guards.append(f"{source} == {value}")
            return
        expr = value.node.expr
        if expr in sources:
            guards.append(f"{source} == {sources[expr]}")
        elif isinstance(expr, sympy.Symbol):
            sources[expr] = source
            guards.extend(_range_guards(source, ranges.get(expr)))
        else:
            derived.append((source, expr))

    for name, value in inputs:
        if isinstance(value, torch.Tensor):
            guards.append(f"{name}.dim() == {value.dim()}")  # (first: then its sizes)
            for dim, n in enumerate(value.shape):
                size(f"{name}.size()[{dim}]", n)
        elif isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
            size(name, value)
    for source, expr in derived:
        if expr.free_symbols <= sources.keys():
            named = expr.xreplace({s: sympy.Symbol(sources[s]) for s in expr.free_symbols})
            guards.append(f"{source} == {named}")
            guards.extend(_range_guards(source, ranges.get(expr)))
    return guards


def _range_guards(source: str, bounds: Any) -> list[str]:
    """The bounds of a dynamic size that torch's module checks (a lower bound of 2 is
    export's default, which it does not check: sizes 0 and 1 run as traced)."""
    if bounds is None:
        return []
    out = []
    if isinstance(bounds.lower, sympy.Integer) and int(bounds.lower) > 2:
        out.append(f"{source} >= {int(bounds.lower)}")
    if isinstance(bounds.upper, sympy.Integer):  # (not torch's int_oo)
        out.append(f"{source} <= {int(bounds.upper)}")
    return out


def _guards_over_names(code: list[str], names: list[str]) -> list[str]:
    """torch.export's traced guards (``L['x'].size()[0] > L['y'].size()[0]``) over the
    input names."""
    out = []
    for guard in code:
        for name in names:
            guard = guard.replace(f"L[{name!r}]", name)
        out.append(guard)
    return out


def _asserted(guards: nn.Module) -> list[str]:
    """The conditions an unlifted module's ``_guards_fn`` asserts, read from its messages
    (``Guard failed: x.size()[0] == 3``: torch writes them over the inputs' names)."""
    pending, seen, out = [guards.forward], set(), []
    while pending:  # (torch wraps the generated function for dynamo: look inside)
        fn = pending.pop()
        if id(fn) in seen or not callable(fn):
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            out += [c.removeprefix(_FAILED) for c in code.co_consts
                    if isinstance(c, str) and c.startswith(_FAILED)]
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # (an empty cell)
                pending.append(cell.cell_contents)
    return out


def _readable(guard: str, names: list[str]) -> str | None:
    """``guard`` written plainly, where it reads no name but the inputs' and those of
    torch's guard code; else None (a guard over a nested input, ``L['z']['k']``, cannot
    be checked by name)."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    try:
        tree = ast.parse(guard, mode="eval")
    except SyntaxError:
        return None
    known = {*names, *SYMPY_INTERP, "math", "inf"}
    if any(n.id not in known for n in ast.walk(tree) if isinstance(n, ast.Name)):
        return None
    return ast.unparse(tree)


_FAILED = "Guard failed: "


class SizeConstraintError(ValueError):
    """Sizes asked to vary that the program cannot let vary (a range the source rejects,
    a dim its code fixes), or a ``dynamic=`` that names no input or dim of the program."""


def argument_names(module: nn.Module) -> list[str]:
    """The names of ``module``'s positional arguments (a GraphModule's placeholders).

    >>> argument_names(torch.nn.Linear(2, 2))
    ['input']
    """
    if isinstance(module, torch.fx.GraphModule):
        return [str(n.target).lstrip("*") for n in module.graph.nodes if n.op == "placeholder"]
    import inspect

    return [p.name for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def export_dynamic(module: nn.Module, example_inputs: tuple,
                   dynamic: bool | dict[str, dict[int, tuple[int, int | None]]]
                   ) -> torch.export.ExportedProgram:
    """``module`` exported with symbolic sizes: every dim of every tensor input
    (``dynamic=True``: ``Dim.AUTO``, so torch.export keeps static what the program fixes,
    and sizes 0 and 1 as dynamo does), or the dims a mapping names
    (``{input: {dim: (low, high)}}``, ``high`` None for no bound), which must vary.

    >>> m = torch.nn.Linear(4, 2)
    >>> program = export_dynamic(m, (torch.randn(3, 4),), {"input": {0: (2, 64)}})
    >>> program.module()(torch.randn(9, 4)).shape
    torch.Size([9, 2])
    >>> export_dynamic(m, (torch.randn(3, 4),), {"x": {0: (2, 64)}})
    Traceback (most recent call last):
    ...
    frontends.fx.exported.SizeConstraintError: dynamic= names 'x', which is not an input ...
    """
    from torch.export import Dim

    names = argument_names(module)
    if dynamic is True:
        shapes = [{d: Dim.AUTO for d in range(x.dim())} if isinstance(x, torch.Tensor)
                  else None for x in example_inputs]
    else:
        shapes = [None] * len(example_inputs)
        for name, dims in dynamic.items():
            if name not in names[:len(example_inputs)]:
                raise SizeConstraintError(
                    f"dynamic= names {name!r}, which is not an input of the program "
                    f"(its inputs: {', '.join(names[:len(example_inputs)])})")
            i = names.index(name)
            x = example_inputs[i]
            rank = x.dim() if isinstance(x, torch.Tensor) else 0
            spec = {}
            for dim, (low, high) in dims.items():
                if not -rank <= dim < rank:
                    raise SizeConstraintError(
                        f"dynamic= names dim {dim} of input {name!r}, which has {rank} dims")
                spec[dim % rank] = Dim(f"{name}_{dim % rank}", min=low,
                                       max=high if high is not None else int(2**62))
            shapes[i] = spec
    # (torch.export logs a warning for each size of 0 or 1 that Dim.AUTO keeps static:
    # the convention this function documents, not a problem to report)
    quiet = logging.getLogger("torch._export.non_strict_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return torch.export.export(module, tuple(example_inputs), dynamic_shapes=tuple(shapes))
    except Exception as err:
        if "Constraint" not in type(err).__name__ and type(err).__name__ != "UserError":
            raise
        lines = str(err).strip().splitlines() or [type(err).__name__]
        reasons = [line.strip()[2:] for line in lines if line.strip().startswith("- ")]
        why = " ".join(reasons or lines[:1])
        for name, dims in (dynamic.items() if isinstance(dynamic, dict) else ()):
            for dim in dims:  # (our Dims' names, as the user's inputs and dims)
                rank = example_inputs[names.index(name)].dim()
                why = why.replace(f"{name}_{dim % rank}", f"input {name!r} dim {dim % rank}")
        raise SizeConstraintError(
            f"the sizes dynamic= asks to vary cannot vary in this program: {why} "
            "(torch.export's verdict; leave those dims out of dynamic=, or give a range "
            "the program accepts)") from err
    finally:
        quiet.setLevel(level)
