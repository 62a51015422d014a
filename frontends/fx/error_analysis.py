"""First-order rounding-error analysis of an FX graph on sample inputs.

Every op that rounds its result adds its own rounding error to the value it produces (the
rounding of the exact result to the working dtype; a float32 sum or matrix product also
rounds its partial sums); every op passes on the errors already in its inputs, scaled by
its derivative. Rounding errors are independent, so their variances add. Both are tracked
per element, forward through the graph, on values computed in float64:

    var(v) = Σ_inputs (∂v/∂x_i)² · var(x_i)  +  rounding(v)²

The products of squared Jacobians with variances are exact for elementwise ops (one
forward-mode derivative, ``torch.func.jvp``, squared), sums and means, and matrix products
and convolutions (the op applied to the squares of its other operands); for ops that mix
their inputs (softmax, normalisations, attention) they are estimated with random-sign
probes. A value past the dtype's largest finite number overflows: later ops see an
infinity there, and whatever they make of it (``1 / inf = 0``, ``inf / inf = nan``) is
computed, not guessed. Graph inputs, parameters and literals are exact, as are ops that
only move, select or negate values.

The result, per output element, is the expected error in bits of the working precision,
``log2(1 + err / ulp(out))`` (clipped to the mantissa width; every bit where the program
overflows to inf or nan): the scale of Herbie's error measure
(``compiler.stability.error_bits``), which is what lets it predict the error a rewrite
removes. Per node, the bits accumulated there say where precision is lost.

>>> import torch
>>> naive = torch.fx.symbolic_trace(lambda a, b: torch.sqrt(a) - torch.sqrt(b))
>>> a = torch.full((4,), 1e6)
>>> analysis = rounding_error(naive, (a, a + 1))
>>> round(analysis.mean_bits)  # sqrt(1e6 + 1) - sqrt(1e6) cancels ~20 bits
18
>>> stable = torch.fx.symbolic_trace(lambda a, b: (a - b) / (torch.sqrt(a) + torch.sqrt(b)))
>>> round(rounding_error(stable, (a, a + 1)).mean_bits, 1)
0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from egraph.ops.table import TABLE
from frontends.fx.exported import deep_copy
from frontends.fx.vocabulary import lower, module_op

# How each op is treated (the op table's ``error`` rule), and the torch calls the vocabulary
# does not model that the analysis still recognises by name.
_RULES = {name: entry.error for name, entry in TABLE.items()}
_RULES.update({"addmm": "multilinear", "std": "mixing",
               "norm": "mixing", "MultiheadAttention": "mixing"})
_EXACT = {n for n, r in _RULES.items() if r == "exact"}
_MULTILINEAR = {n for n, r in _RULES.items() if r == "multilinear"}
_SUMMING = {n for n, r in _RULES.items() if r == "summing"} | _MULTILINEAR
_MIXING = {n for n, r in _RULES.items() if r == "mixing"}
_PROBES = 8


@dataclass
class RoundingError:
    """The result of :func:`rounding_error`: error bounds in bits of ``dtype``.

    ``mean_bits`` averages over every output element, ``worst_bits`` is the largest;
    ``per_node`` maps each node name to ``(op, bits accumulated there, bits it added)``.
    """

    dtype: torch.dtype
    mean_bits: float
    worst_bits: float
    per_node: dict[str, tuple[str, float, float]] = field(default_factory=dict)

    def __str__(self) -> str:
        rows = [f"{name:<24}{op:<16}{bits:6.1f}{added:+7.1f}"
                for name, (op, bits, added) in self.per_node.items() if added > 0.05]
        return "\n".join([f"{'node':<24}{'op':<16}{'bits':>6}{'added':>7}", *rows,
                          f"{'outputs: mean':<40}{self.mean_bits:6.2f}",
                          f"{'outputs: worst':<40}{self.worst_bits:6.2f}"])


def rounding_error(gm: fx.GraphModule, example_inputs, dtype: torch.dtype | None = None
                   ) -> RoundingError:
    """First-order error bounds of ``gm`` run in ``dtype`` (default: the dtype of the
    first floating input) on ``example_inputs`` (see the module docstring).

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.log(1 + x))
    >>> x = torch.full((8,), 1e-5)
    >>> rounding_error(gm, (x,)).worst_bits > 10  # 1 + 1e-5 rounds away most of x
    True
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.log1p(x))
    >>> rounding_error(gm, (x,)).worst_bits < 1
    True
    """
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    if dtype is None:
        dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)
                      and x.is_floating_point()), torch.float32)
    if dtype == torch.float64:
        raise ValueError("rounding_error measures a working precision below float64 "
                         "(the reference it computes in); pass dtype=torch.float32, "
                         "float16 or bfloat16")
    wide = deep_copy(gm).to(torch.float64)
    tracer = _ErrorTracer(wide, dtype)
    with torch.random.fork_rng(), torch.no_grad():
        out = tracer.run(*[x.detach().to(torch.float64) if isinstance(x, torch.Tensor)
                           and x.is_floating_point() else x for x in inputs])
    bits = []
    output = next(n for n in wide.graph.nodes if n.op == "output")
    errors = tree_flatten(tracer.error_of(output.args[0]))[0]
    for value, err in zip(tree_flatten(out)[0], errors):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            b = tracer.bits(value, err)
            bits.append(b[torch.isfinite(value)])
    flat = torch.cat([b.reshape(-1) for b in bits]) if bits else torch.zeros(1)
    if not flat.numel():
        flat = torch.zeros(1)
    return RoundingError(dtype, float(flat.mean()), float(flat.max()), tracer.per_node)


@dataclass
class LocalError:
    """The error one op adds by itself (:func:`local_error`): ``mean_bits`` and
    ``worst_bits`` over the elements of its result, in bits of the working precision."""

    op: str
    mean_bits: float
    worst_bits: float


def local_error(gm: fx.GraphModule, example_inputs, dtype: torch.dtype | None = None
                ) -> dict[str, LocalError]:
    """Herbie's local error of every floating call in ``gm``: the op run in ``dtype`` on
    its exact arguments rounded to ``dtype``, against the op on the exact arguments (float64
    throughout the graph), per node name. Error that arrives with the arguments does not
    count, so the ops that score high are where precision is lost (a subtraction that
    cancels, an ``exp`` that overflows), and rewriting can concentrate there. A float64
    program is judged against the reals (:mod:`frontends.fx.exact`, mpmath): its exact
    arguments are real numbers, rounded to float64.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.sqrt(x + 1) - torch.sqrt(x))
    >>> errors = local_error(gm, (torch.full((4,), 1e6),))
    >>> max(errors, key=lambda name: errors[name].mean_bits)  # the cancelling subtraction
    'sub'
    >>> round(errors["sqrt"].mean_bits)  # a correctly rounded sqrt adds no error
    0
    """
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    if dtype is None:
        dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)
                      and x.is_floating_point()), torch.float32)
    if dtype == torch.float64:
        return _local_error_against_reals(gm, inputs)
    wide = deep_copy(gm).to(torch.float64)
    tracer = _LocalTracer(wide, dtype)
    with torch.random.fork_rng(), torch.no_grad():
        tracer.run(*[x.detach().to(torch.float64) if _floating(x) else x for x in inputs])
    return tracer.local


def _local_error_against_reals(gm: fx.GraphModule, inputs) -> dict[str, LocalError]:
    """:func:`local_error` of a float64 program: each op run in float64 on its exact
    arguments rounded, against its exact result rounded (mpmath)."""
    import numpy as np

    from frontends.fx.exact import ExactInterpreter, rounded

    exact = ExactInterpreter(gm)
    with torch.random.fork_rng(), torch.no_grad():
        exact.run(*inputs)
    measure = _ErrorTracer(gm, torch.float64)

    def as_float(a):
        value = exact.values.get(a.name) if isinstance(a, fx.Node) else a
        if isinstance(value, np.ndarray):
            return rounded(value) if value.dtype == object else torch.from_numpy(value)
        return float(value) if type(value).__name__ == "mpf" else value

    local: dict[str, LocalError] = {}
    for n in gm.graph.nodes:
        value = exact.values.get(n.name)
        if n.op not in ("call_function", "call_method") or not (
                isinstance(value, np.ndarray) and value.dtype == object and value.size):
            continue
        args, kwargs = fx.node.map_aggregate((n.args, n.kwargs), as_float)
        try:
            with torch.no_grad():
                got = (getattr(args[0], n.target)(*args[1:], **kwargs)
                       if n.op == "call_method" else n.target(*args, **kwargs))
        except Exception:  # noqa: BLE001 - an op float64 does not run: no verdict
            continue
        truth = rounded(value)
        if not _floating(got) or got.shape != truth.shape:
            continue
        err = torch.where(torch.isfinite(got), (got.to(torch.float64) - truth).abs(), math.inf)
        bits = measure.bits(truth, err)[torch.isfinite(truth)]
        if bits.numel():
            local[n.name] = LocalError(measure._op_name(n), float(bits.mean()),
                                       float(bits.max()))
    return local


class _LocalTracer(fx.Interpreter):
    """Runs a float64 copy of the graph; each call is also run in the working dtype on its
    float64 arguments rounded, and the two results compared."""

    def __init__(self, gm: fx.GraphModule, dtype: torch.dtype):
        super().__init__(gm)
        self.dtype = dtype
        self.measure = _ErrorTracer(gm, dtype)
        self.local: dict[str, LocalError] = {}

    def run_node(self, n: fx.Node):
        value = super().run_node(n)
        if n.op in ("call_function", "call_method") and _floating(value) and value.numel():
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            narrow = fx.node.map_aggregate(
                (args, kwargs), lambda a: a.to(self.dtype) if _floating(a) else a)
            try:
                if n.op == "call_method":
                    got = getattr(narrow[0][0], n.target)(*narrow[0][1:], **narrow[1])
                else:
                    got = n.target(*narrow[0], **narrow[1])
            except Exception:  # noqa: BLE001 - an op the dtype does not support: no verdict
                return value
            if _floating(got) and got.shape == value.shape:
                got = got.to(torch.float64)
                err = torch.where(torch.isfinite(got), (got - value).abs(), math.inf)
                bits = self.measure.bits(value, err)[torch.isfinite(value)]
                if bits.numel():
                    self.local[n.name] = LocalError(self.measure._op_name(n),
                                                    float(bits.mean()), float(bits.max()))
        return value


class _ErrorTracer(fx.Interpreter):
    """Runs a float64 copy of the graph and keeps, per tensor, the standard deviation of
    its error in the working dtype (``inf`` where that dtype overflows)."""

    def __init__(self, gm: fx.GraphModule, dtype: torch.dtype):
        super().__init__(gm)
        info = torch.finfo(dtype)
        self.dtype = dtype
        self.mantissa = round(-math.log2(info.eps)) + 1  # with the hidden bit
        self.half_ulp = 2.0 ** -self.mantissa
        self.largest, self.tiny = float(info.max), float(info.tiny)
        self.errors: dict[str, object] = {}
        self.per_node: dict[str, tuple[str, float, float]] = {}
        self.probes = torch.Generator().manual_seed(0)

    def bits(self, value: torch.Tensor, err: torch.Tensor | None) -> torch.Tensor:
        """Per element error in bits of the working precision."""
        if err is None:
            return torch.zeros_like(value)
        ulp = value.abs().clamp(min=self.tiny) * (2.0 * self.half_ulp)
        b = torch.log2(1 + err / ulp).nan_to_num(nan=float(self.mantissa))
        return b.clamp(max=float(self.mantissa))

    def error_of(self, arg):
        return fx.node.map_aggregate(
            arg, lambda a: self.errors.get(a.name) if isinstance(a, fx.Node) else None)

    def run_node(self, n: fx.Node):
        value = super().run_node(n)
        if n.op in ("call_function", "call_method", "call_module"):
            op = self._op_name(n)
            self.errors[n.name] = self._error(n, op, value)
            self._record(n, op, value)
        return value

    def _op_name(self, n: fx.Node) -> str:
        if n.op == "call_module":
            module = self.fetch_attr(n.target)
            found = module_op(module)
            return found[0] if found is not None else type(module).__name__
        lowered = lower(n.target, n.args, n.kwargs, method=n.op == "call_method")
        if lowered is not None:
            return lowered[0]
        return getattr(n.target, "__name__", str(n.target))

    def _error(self, n: fx.Node, op: str, value):
        leaves, spec = tree_flatten(value)
        if not any(_floating(v) for v in leaves):
            return None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        flat_args, arg_spec = tree_flatten((args, kwargs))
        flat_errs = tree_flatten(self.error_of((n.args, n.kwargs)))[0]
        call = self._caller(n, arg_spec)
        variance = self._propagated(op, call, flat_args, flat_errs, leaves)
        rounding = self._rounding(n, op, call, flat_args, leaves)
        overflowed = self._with_infinities(call, flat_args, flat_errs, leaves)
        errors = []
        for v, var, r, (bad, absorbed) in zip(leaves, variance, rounding, overflowed):
            if not _floating(v):
                errors.append(None)
                continue
            err = torch.sqrt(var + r * r) + absorbed
            bad = bad | (torch.isfinite(v) & (v.abs() > self.largest))
            errors.append(torch.where(bad, math.inf, err))
        return tree_unflatten(errors, spec)

    def _caller(self, n: fx.Node, arg_spec):
        """The node's computation as a function of its flattened arguments; matrix
        products and convolutions may have their parameters replaced (``weights``)."""
        module = self.fetch_attr(n.target) if n.op == "call_module" else None

        def call(values, weights=None):
            args, kwargs = tree_unflatten(list(values), arg_spec)
            if module is not None:
                if weights is None:
                    return module(*args, **kwargs)
                params = {k: weights(p) for k, p in module.named_parameters(recurse=False)}
                return torch.func.functional_call(module, params, args, kwargs)
            if n.op == "call_method":
                return getattr(args[0], n.target)(*args[1:], **kwargs)
            return n.target(*args, **kwargs)

        return call

    def _propagated(self, op, call, flat_args, flat_errs, leaves) -> list:
        """``Σ_i (∂v/∂x_i)² var(x_i)`` per output leaf (zeros where nothing propagates)."""
        total = [torch.zeros_like(v) if _floating(v) else None for v in leaves]
        for i, (x, err) in enumerate(zip(flat_args, flat_errs)):
            if not _floating(x) or err is None:
                continue
            sigma = torch.where(torch.isfinite(err), err, 0.0)
            if not bool((sigma != 0).any()):
                continue
            for j, t in enumerate(self._squared_jacobian(op, call, flat_args, i, sigma)):
                if t is not None and total[j] is not None:
                    total[j] = total[j] + t.nan_to_num(nan=math.inf)
        return total

    def _squared_jacobian(self, op, call, flat_args, i, sigma) -> list:
        """``J_i² · sigma²`` for each output leaf of the op (see the module docstring)."""
        def along(direction, values=flat_args, weights=None):
            def f(t):
                return call(values[:i] + [t] + values[i + 1:], weights)
            try:
                _, tangent = torch.func.jvp(f, (flat_args[i],), (direction,))
            except Exception:  # noqa: BLE001 - an op without forward AD: see below
                return None
            return [t if _floating(t) else None for t in tree_flatten(tangent)[0]]

        if op in _MULTILINEAR:
            squares = [a * a if _floating(a) else a for a in flat_args]
            result = along(sigma * sigma, squares, lambda p: p * p)
        elif op in ("sum", "mean"):
            result = along(sigma * sigma)
            if result is not None and op == "mean":
                result = [t * t.numel() / flat_args[i].numel() for t in result]
        elif op in _MIXING:
            result = None
            for _ in range(_PROBES):
                signs = torch.randint(0, 2, sigma.shape, generator=self.probes) * 2 - 1
                probe = along(sigma * signs.to(sigma.dtype))
                if probe is None:
                    break
                squared = [t * t / _PROBES for t in probe]
                result = squared if result is None else [a + b for a, b in zip(result,
                                                                                squared)]
        else:
            result = along(sigma)
            result = None if result is None else [t * t for t in result]
        if result is None:  # no forward derivative: relative errors pass through
            relative = float((sigma / flat_args[i].abs().clamp(min=self.tiny)).max())
            return [(t.abs() * relative) ** 2 if _floating(t) else None
                    for t in tree_flatten(call(flat_args))[0]]
        return result

    def _rounding(self, n, op, call, flat_args, leaves) -> list:
        """The op's own rounding error: for an op that rounds its result once, the
        rounding of the exact result to the dtype (zero where the dtype represents it);
        for sums and matrix products in fp32, whose partial sums round too, also the
        standard deviation ``ulp / (2 sqrt 3)`` of ``sqrt(log2 n)`` times the root sum of
        squares of the ``n`` terms (pairwise summation). A float32 softmax also rounds
        ``x - max(x)`` before its ``exp``, which turns that rounding into a relative error
        of the result. float16 and bfloat16 reductions and softmaxes compute in float32 and
        round once."""
        if op in _EXACT:
            return [0.0] * len(leaves)
        out = []
        for v in leaves:
            if not _floating(v):
                out.append(None)
                continue
            err = self._rounded(v)
            if op == "softmax" and self.dtype == torch.float32:
                x = flat_args[0]
                shift = x - x.amax(self._softmax_dim(n), keepdim=True)
                err = torch.sqrt(err * err + (v * self._rounded(shift)) ** 2)
            out.append(err)
        if op in _SUMMING and len(out) == 1 and self.dtype == torch.float32:
            squares = call([a * a if _floating(a) else a for a in flat_args], lambda p: p * p)
            terms = call([torch.ones_like(a) if _floating(a) else a for a in flat_args],
                         torch.ones_like)
            variance = squares * torch.log2(terms.clamp(min=2.0)) * (self.half_ulp ** 2 / 3)
            out[0] = torch.sqrt(out[0] ** 2 + variance)
        return out

    def _rounded(self, v: torch.Tensor) -> torch.Tensor:
        """The rounding error of storing ``v`` in the working dtype."""
        return (v.to(self.dtype).to(v.dtype) - v).abs()

    def _softmax_dim(self, n: fx.Node) -> int:
        if n.op == "call_module":
            return self.fetch_attr(n.target).dim
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return lower(n.target, args, kwargs, method=n.op == "call_method")[1][1]

    def _with_infinities(self, call, flat_args, flat_errs, leaves) -> list:
        """Where inputs overflowed, run the op on infinities there: ``(non-finite,
        absorbed error)`` per output leaf, e.g. ``1 / (1 + inf) = 0`` is finite and off
        by the true value, ``inf / inf`` is nan."""
        none = [(torch.zeros_like(v, dtype=torch.bool), 0.0) if _floating(v) else (None, 0.0)
                for v in leaves]
        if not any(_floating(x) and e is not None and bool(torch.isinf(e).any())
                   for x, e in zip(flat_args, flat_errs)):
            return none
        saturated = [torch.where(torch.isinf(e), torch.copysign(torch.full_like(x, math.inf),
                                                                 x), x)
                     if _floating(x) and e is not None else x
                     for x, e in zip(flat_args, flat_errs)]
        try:
            got = tree_flatten(call(saturated))[0]
        except Exception:  # noqa: BLE001 - an op refusing infinities fails in the dtype too
            return [(torch.ones_like(v, dtype=torch.bool), 0.0) if _floating(v) else
                    (None, 0.0) for v in leaves]
        out = []
        for v, g in zip(leaves, got):
            if not _floating(v):
                out.append((None, 0.0))
                continue
            bad = ~torch.isfinite(g) & torch.isfinite(v)
            out.append((bad, torch.where(bad, 0.0, (g - v).abs())))
        return out

    def _record(self, n, op, value) -> None:
        errors = self.errors.get(n.name)
        leaves = [(v, e) for v, e in zip(tree_flatten(value)[0], tree_flatten(errors)[0])
                  if _floating(v) and e is not None and v.numel()]
        if not leaves:
            return
        bits = max(float(self.bits(v, e).mean()) for v, e in leaves)
        before = [self.per_node[a.name][1] for a in n.all_input_nodes
                  if a.name in self.per_node]
        self.per_node[n.name] = (op, bits, bits - max(before, default=0.0))


def _floating(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()
