"""The reference a validation judges by, and how far it may be off. In ``"float64"`` mode
the source run in float64 (:func:`float64_reference`, on a :func:`float64_copy`, through
:class:`Float64Interpreter`); in ``"working"`` mode the source itself in its working dtype
(the float64 run only a second opinion); a program that draws random numbers is judged
against the source under the same seed. Monte Carlo arithmetic measures both the reference
and the source: :func:`reference_spread`, what float64 cannot resolve, and
:func:`rounding_samples`, results the source's own rounding could as well have given."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from compiler.validate.judging import all_finite
from compiler.validate.runs import flat_outputs
from compiler.validate.state import State
from egraph.ops.table import TABLE
from egraph.signs import POS
from frontends.fx.effects import is_in_place, updates_inputs
from frontends.fx.exported import ExportedModule, deep_copy
from frontends.fx.kept import attributes_kept, state_kept

__all__ = ["EXACT_LIMIT", "FLOAT64_LIMIT", "REFERENCES", "Float64Interpreter", "exact_reference",
           "float64_copy", "float64_reference", "reference_mode", "reference_spread",
           "rounding_samples", "to_float64", "works_in_float64"]


def to_float64(x: Any) -> Any:
    """``x`` widened where it is a floating (float64) or complex (complex128) tensor.

    >>> to_float64(torch.ones(1)).dtype, to_float64(torch.ones(1, dtype=torch.int8)).dtype
    (torch.float64, torch.int8)
    """
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        return x.to(torch.complex128 if x.is_complex() else torch.float64)
    return x


REFERENCES = ("auto", "float64", "working")
"""Validation modes: the source in float64 as the reference, or the source in its working
dtype (no float64 copy of the model: half the memory, for large models); ``"auto"`` (the
default) is float64 up to :data:`FLOAT64_LIMIT` elements of parameters and inputs, the
working dtype beyond."""

FLOAT64_LIMIT = 1 << 24
"""Above this many elements of parameters and inputs (16.8 million: a 134 MB float64 copy,
GPT-2 small has 124 million), ``reference="auto"`` validates in the working dtype: the
float64 copy and run would cost more than the rest of the pipeline."""



def reference_mode(reference: str, numel: int) -> str:
    """The mode, ``"float64"`` or ``"working"``, that ``reference`` (one of
    :data:`REFERENCES`) names for a program of ``numel`` elements of parameters and inputs.

    >>> reference_mode("auto", 1000), reference_mode("auto", FLOAT64_LIMIT + 1)
    ('float64', 'working')
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference={reference!r}: use one of "
                         f"{', '.join(map(repr, REFERENCES))}")
    if reference == "auto":
        return "working" if numel > FLOAT64_LIMIT else "float64"
    return reference


_EXACT_OPS = frozenset(name for name, entry in TABLE.items()
                       if entry.error == "exact" or entry.kind == "view") | {
    "getitem", "clone", "contiguous", "detach", "alias", "to", "_to_copy", "type_as", "slice",
    "select", "index", "index_select", "view", "unsqueeze", "squeeze", "flatten", "expand",
    "permute", "transpose", "t", "embedding", "gather", "cat", "stack", "masked_fill",
    "floor", "ceil", "round", "trunc", "sign", "max", "min"}
"""Ops whose result is one of their operands' values, or a selection of them, with no
rounding: a Monte Carlo run of the reference leaves them alone."""


_POSITIVE_OPS = frozenset(
    part for name, entry in TABLE.items() if entry.sign == POS
    for part in (name, *(target.split(".")[1] if target.startswith("aten.")
                         else target.rsplit(".", 1)[-1] for target, _ in entry.spellings)))
"""Ops (by every name a graph calls them) whose result is positive on finite operands in
exact arithmetic (``exp``, ``sigmoid``, ``softmax``): a 0 they give is an underflow."""


def _op_name(n: fx.Node, root: nn.Module) -> str:
    """What ``n`` calls, by name: a module call by its module's type (``nn.Embedding``
    selects rows, exactly, as ``F.embedding`` does)."""
    if n.op == "call_module":
        return type(root.get_submodule(n.target)).__name__.lower()
    if isinstance(n.target, str):
        return n.target
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target._opname
    return getattr(n.target, "__name__", "")


class Float64Interpreter(fx.Interpreter):
    """Runs a graph with every floating value in float64: dtype arguments that name a
    floating dtype become float64 and dtype assertions are skipped, so graphs with explicit
    casts and checks (torch.export's ``_assert_tensor_metadata``, ``to(float32)``) still
    give a float64 reference. The regions of higher-order ops (``wrap_with_autocast``,
    ``wrap_with_set_grad_enabled``) are interpreted the same way, without autocast: the
    reference is the exact computation, not a lower-precision one.

    With ``rounding`` (a generator), each inexact function call's result is moved by a few
    roundings, up or down at random per element: a Monte Carlo sample of float64's own
    error (:func:`reference_spread`), wide rather than exact.

    >>> graph = fx.symbolic_trace(lambda x: x.float() * 3)
    >>> Float64Interpreter(graph).run(torch.ones(1, dtype=torch.float16)).dtype
    torch.float64
    """

    _ASSERTS = {torch.ops.aten._assert_tensor_metadata.default}

    def __init__(self, module: fx.GraphModule, rounding: torch.Generator | None = None):
        super().__init__(module)
        self.rounding = rounding

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "call_function" and n.target in self._ASSERTS:
            return None
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
            args, _ = self.fetch_args_kwargs_from_env(n)
            body = next((i for i, a in enumerate(args) if isinstance(a, fx.GraphModule)), None)
            if body is not None:
                return Float64Interpreter(args[body], self.rounding).run(*args[body + 1:])
        out = super().run_node(n)
        if isinstance(out, torch.Tensor) and out.dtype not in (torch.float64,
                                                                torch.complex128):
            # once, where it is made (``torch.zeros(3)`` in the default dtype): promoted on
            # each read instead, ``y[1] = v`` would write into a copy and be lost
            out = to_float64(out)
        if (self.rounding is not None
                and n.op in ("call_function", "call_method", "call_module")
                and isinstance(out, torch.Tensor) and out.dtype == torch.float64
                and (name := _op_name(n, self.module)) not in _EXACT_OPS):
            # k roundings, 1 <= |k| <= 16 at random: two equal values (log(x + 1) and
            # log(x) where float64 cannot tell x + 1 from x) almost never move alike
            k = torch.randint(1, 17, out.shape, generator=self.rounding, dtype=torch.float64)
            sign = torch.randint(0, 2, out.shape, generator=self.rounding) * 2 - 1
            if name in _POSITIVE_OPS and self._underflowed(n, out):
                # A 0 of an op that is positive in truth on finite operands (exp(-800),
                # a softmax of a row 1e9 apart) is an underflow: its rounding error is
                # up to the smallest subnormal, as much as the value (the log of it is
                # -inf in float64 and finite in truth: float64 cannot tell it)
                out = torch.where(out == 0, k.to(out.device) * math.ulp(0.0), out)
            out = _moved(out, self, n, k.mul_(sign))
        return out

    def _underflowed(self, n: fx.Node, out: torch.Tensor) -> bool:
        operands = [v for v in map(self.env.get, n.all_input_nodes)
                    if isinstance(v, torch.Tensor) and v.is_floating_point()]
        return bool((out == 0).any()) and all(all_finite(v) for v in operands)

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple, dict]:
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        return _promote_all(args), _promote_all(kwargs)


class _RoundingInterpreter(fx.Interpreter):
    """Runs a graph in its own dtypes with each inexact op's result moved by a random
    fraction of a rounding of its dtype (up to one, either way, per element): a sample of
    the rounding errors the program could as well have made (Monte Carlo arithmetic)."""

    def __init__(self, module: fx.GraphModule, rounding: torch.Generator):
        super().__init__(module)
        self.rounding = rounding

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if (n.op in ("call_function", "call_method", "call_module")
                and isinstance(out, torch.Tensor) and out.is_floating_point()
                and _op_name(n, self.module) not in _EXACT_OPS):
            fraction = torch.rand(out.shape, generator=self.rounding, dtype=torch.float64)
            out = _moved(out, self, n, fraction.mul_(2).sub_(1))
        return out


def _moved(out: torch.Tensor, interpreter: fx.Interpreter, n: fx.Node,
           roundings: torch.Tensor) -> torch.Tensor:
    """``out``, the result of ``n``, moved by ``roundings`` (per element) of its dtype."""
    factor = (1 + roundings * torch.finfo(out.dtype).eps).to(out.device)
    operands = [v for v in map(interpreter.env.get, n.all_input_nodes)
                if isinstance(v, torch.Tensor)]
    if any(out is a for a in operands):
        called = (interpreter.module.get_submodule(n.target) if n.op == "call_module"
                  else None)
        if not is_in_place(n, called):
            # the operand itself, unrounded (dropout in eval, ``x.to`` its own dtype):
            # moving it would write into the caller's tensor
            return out
        # an update in place (``a = b.mul_(m)``): every name of that tensor sees its
        # rounding, and a later update through one of them; a copy would keep ``a`` at this
        # value and the spread would cover the whole update
        return out.copy_(out * factor)
    if _shares_memory(out, operands):  # a view selects values, exactly
        return out
    return (out * factor).to(out.dtype)


def rounding_samples(graph: fx.GraphModule, xs: tuple, samples: int = 4,
                     rounding: torch.Generator | None = None) -> list[list]:
    """The flat outputs of ``samples`` runs of ``graph`` on ``xs`` in its own dtypes, each
    inexact op's result moved by up to one rounding at random (:class:`_RoundingInterpreter`):
    results the program could as well have given, so its error is the worst of theirs. An
    output that cancels to rounding noise (the mean of a layer norm's output, a log-sum-exp
    of log-probabilities: 0 in truth) is as likely to be any value within their spread as
    the one the source happened to round to. [] where the graph cannot run so. The graph
    is run on a copy (its state untouched) and the inputs are left as they are.

    >>> g = fx.symbolic_trace(lambda x: (x + 1) - 1)
    >>> runs = rounding_samples(g, (torch.tensor([1e-3]),), samples=8)
    >>> len(runs), any(float(run[0][0]) != 1e-3 for run in runs)
    (8, True)
    """
    rounding = rounding if rounding is not None else torch.Generator().manual_seed(0)
    writes = updates_inputs(graph.graph)
    runs = []
    try:
        copied = deep_copy(graph)
        for _ in range(samples):
            given = [x.clone() if writes and isinstance(x, torch.Tensor) else x for x in xs]
            with torch.no_grad(), state_kept(), attributes_kept(copied):
                runs.append(flat_outputs(_RoundingInterpreter(copied, rounding).run(*given)))
    except Exception:  # noqa: BLE001 - no samples where the graph cannot be run so
        return []
    return runs


def _shares_memory(tensor: torch.Tensor, others: Iterable[torch.Tensor]) -> bool:
    storage = tensor.untyped_storage().data_ptr()
    return any(o.untyped_storage().data_ptr() == storage for o in others)


def _promote_all(x: Any) -> Any:
    """:func:`_promote` on every value in a call's arguments. torch's named results are
    kept as they are (``x.max(dim=1)``, whose ``.values`` the next call reads: fx's
    ``map_aggregate`` would make a plain tuple of it); the run made them in float64."""
    if type(x).__module__ == "torch.return_types":
        return x
    if isinstance(x, (tuple, list)):
        items = [_promote_all(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return type(x)({k: _promote_all(v) for k, v in x.items()})
    if isinstance(x, slice):
        return slice(_promote_all(x.start), _promote_all(x.stop), _promote_all(x.step))
    return _promote(x)


def _promote(x: Any) -> Any:
    if isinstance(x, torch.dtype) and (x.is_floating_point or x.is_complex):
        return torch.complex128 if x.is_complex else torch.float64
    return to_float64(x)


def float64_reference(original: nn.Module, effects: bool = False):
    """A function from inputs to the flat float64 outputs of ``original`` (None where the
    program cannot run in float64): a graph run by :class:`Float64Interpreter` (explicit
    casts and dtype checks would stop its own forward halfway, and a computation written
    in float32 is widened too), any other module promoted to float64. With ``effects``
    every call starts from the copy's first state (a buffer the program changes in place,
    as the source's is before each of its runs).

    >>> graph = torch.fx.symbolic_trace(lambda x: (x.float() * 3).sum())
    >>> float64_reference(graph)((torch.ones(2, dtype=torch.float16),))[0].dtype
    torch.float64
    """
    wide = float64_copy(original)
    first = State(wide.buffers()) if effects and isinstance(wide, nn.Module) else None

    def run(xs: tuple) -> list | None:
        wide_xs = [to_float64(x) for x in xs]
        if first is not None:
            first.restore()
            # (an input to_float64 kept, an integer counter, must not change the caller's)
            wide_xs = [w.clone() if w is x and isinstance(x, torch.Tensor) else w
                       for w, x in zip(wide_xs, xs)]
        xs = wide_xs
        try:
            with state_kept():
                if isinstance(wide, ExportedModule):
                    return flat_outputs(Float64Interpreter(wide.graph_module).run(
                        *wide.graph_inputs(tuple(xs))))
                if isinstance(wide, fx.GraphModule):
                    return flat_outputs(Float64Interpreter(wide).run(*xs))
                return flat_outputs(wide(*xs))
        except Exception:  # noqa: BLE001 - a program that cannot run in float64
            return None

    return run


EXACT_LIMIT = 1 << 12
"""Up to this many elements of inputs, a graph that works in float64 is judged against its
value over the reals (:func:`exact_reference`), not against itself: an mpmath evaluation
costs tens of microseconds an element and op, a few hundred milliseconds for an FPCore
benchmark's sample."""


def works_in_float64(graph: fx.GraphModule, inputs: tuple) -> bool:
    """Whether ``graph`` computes in float64: every tensor it is given or holds is float64
    (no integer or lower-precision input, whose promotion would hide the working dtype).

    >>> g = torch.fx.symbolic_trace(lambda x: x * 2)
    >>> wide = torch.ones(2, dtype=torch.float64)
    >>> works_in_float64(g, (wide,)), works_in_float64(g, (torch.ones(2),))
    (True, False)
    """
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    tensors += list(graph.parameters()) + list(graph.buffers())
    return bool(tensors) and all(t.dtype == torch.float64 for t in tensors)


def exact_reference(graph: fx.GraphModule):
    """A function from inputs to the flat outputs of ``graph`` over the reals
    (:class:`frontends.fx.exact.ExactInterpreter`), each rounded to the nearest float64:
    the reference for a program that works in float64, whose error float64 cannot show
    (Herbie judges binary64 formulas the same way). None where the graph cannot be run so
    or an output is not a float64 tensor.

    >>> g = torch.fx.symbolic_trace(lambda x: (x + 1) - x)
    >>> x = torch.tensor([1e300], dtype=torch.float64)
    >>> g(x).item(), exact_reference(g)((x,))[0].item()
    (0.0, 1.0)
    """
    import numpy as np
    from mpmath import mpf

    from frontends.fx.exact import ExactInterpreter, rounded

    def run(xs: tuple) -> list | None:
        try:
            with torch.no_grad(), state_kept():
                out = flat_outputs(ExactInterpreter(graph).run(*xs))
        except Exception:  # noqa: BLE001 - an op the interpreter cannot take: float64 then
            return None
        if not all(isinstance(v, mpf) or (isinstance(v, np.ndarray) and v.dtype == object)
                   for v in out):
            return None
        return [rounded(v) for v in out]

    return run


def reference_spread(graph: fx.GraphModule, xs: tuple, reference: list,
                     samples: int = 4) -> list:
    """Per output, how far float64 itself may be from the exact value: twice the largest
    distance of ``samples`` Monte Carlo runs of ``graph`` in float64 (each inexact op's
    result moved by up to 16 roundings at random) from the ``reference`` outputs (a few
    samples underestimate the spread: ``sin(x + eps) - sin(x)`` at x = 1.7e28 is 0 in
    float64 and anywhere in [-2, 2] in truth); None for an output it cannot tell.

    >>> g = fx.symbolic_trace(lambda x: torch.log(x + 1) - torch.log(x))
    >>> x = torch.tensor([1e20], dtype=torch.float64)
    >>> ref = [g(x)]                       # 0 in float64; the exact value is 1e-20
    >>> spread = reference_spread(g, (x,), ref)[0]
    >>> bool(spread[0] > 1e-20)
    True
    """
    wide = float64_copy(graph)
    xs = [to_float64(x) for x in xs]
    writes = updates_inputs(graph.graph)
    spread: list = [None] * len(reference)
    for seed in range(samples):
        gen = torch.Generator().manual_seed(seed)
        # (each run from the same inputs and state: a graph that updates a buffer or an
        # input in place would otherwise run each sample on what the last one left)
        given = [x.clone() if writes and isinstance(x, torch.Tensor) else x for x in xs]
        try:
            with state_kept(), attributes_kept(wide):
                runs = flat_outputs(Float64Interpreter(wide, gen).run(*given))
        except Exception:  # noqa: BLE001 - no spread where the graph cannot run so
            return [None] * len(reference)
        for i, (run, ref) in enumerate(zip(runs, reference)):
            if not (isinstance(run, torch.Tensor) and isinstance(ref, torch.Tensor)
                    and run.is_floating_point() and run.shape == ref.shape):
                continue
            ref = ref.to(run.device)
            # where a run and the reference disagree on finiteness (exp(x) - 1 is 0 in
            # float64 at x = -3e-19 and not in a perturbed run), float64 cannot tell the
            # value at all: an infinite spread
            same = (run == ref) | (torch.isnan(run) & torch.isnan(ref))
            apart = ((run - ref).abs() * 2).nan_to_num_(nan=math.inf, posinf=math.inf)
            distance = torch.where(same, 0.0, apart)
            spread[i] = distance if spread[i] is None else torch.maximum(spread[i], distance)
    return spread


def float64_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its floating parameters and buffers in float64, each
    converted once (a deep copy followed by ``.to(float64)`` would copy a large model's
    weights twice); tied weights stay tied, the mode (train or eval) is kept, and
    ``module`` is left as it was: the reference that validation, and a benchmark judging
    code generated after validation, compare with.

    >>> wide = float64_copy(nn.Linear(2, 2))
    >>> wide.weight.dtype, wide.training
    (torch.float64, True)
    """
    memo: dict[int, Any] = {}
    if isinstance(module, ExportedModule):  # its graph and program hold no state to widen
        memo[id(module.graph_module)] = module.graph_module
        memo[id(module.program)] = module.program
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in memo and tensor.is_floating_point():
            wide = tensor.detach().to(torch.float64)
            memo[id(tensor)] = (nn.Parameter(wide, tensor.requires_grad)
                                if isinstance(tensor, nn.Parameter) else wide)
    return deep_copy(module, memo).to(torch.float64)
