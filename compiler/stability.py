"""Numerical stability end to end: find and fix unstable formulas, explain, measure.

:class:`StabilityRewriter` traces a module or function, saturates it with the stability and
fusion rules, extracts the program with the least curvature (then the fewest FLOPs), keeps
each rewrite that the first-order error analysis of the sample inputs
(:func:`frontends.fx.error_analysis.rounding_error`) predicts to be no less accurate, and
reports every rewrite: where in the model it applied, the expression before and after, the
curvature (predicted error, in bits of the working precision) before and after, and the
error before and after measured against a float64 reference on the sample inputs, in the
working dtype (fp32, fp16 or bf16). Imports torch.

>>> import torch
>>> from compiler.stability import StabilityRewriter
>>> naive = lambda x: torch.log(torch.exp(x).sum(-1))
>>> rewriter = StabilityRewriter()
>>> fixed = rewriter.optimize(naive, (torch.linspace(-100, 100, 64).reshape(4, 16),))
>>> print(rewriter.diff(naive, fixed).splitlines()[0])  # doctest: +ELLIPSIS
log(sum(exp(x), dims=(1,))) -> logsumexp(x, dims=(1,))  at log  [curvature 6.2 -> 0.1 bits]
>>> report = fixed.meta["stability_report"]
>>> report.error_after < report.error_before
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from egraph.extract import best_nodes, program_order, program_roots, source_program
from egraph.term import format_op, is_literal_op

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@", "pow": "**"}


def _describe(egraph, choice: dict[int, tuple], cid: int, depth: int = 4) -> str:
    """A readable expression for class ``cid`` under ``choice`` (leaves by name)."""
    find = egraph.find
    node = choice.get(find(cid))
    if node is None:
        return "?"
    op = node[0]
    if is_literal_op(op):
        value = op[1]
        return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(
            value, str) else str(value)
    if op in ("input", "param", "const"):
        return str(egraph.class_nodes[find(node[1])][0][0][1])
    if depth == 0:
        return "..."
    kids = [_describe(egraph, choice, k, depth - 1) for k in node[1:]]
    if op in _INFIX and len(kids) == 2:
        return f"({kids[0]} {_INFIX[op]} {kids[1]})"
    if op == "neg":
        return f"-{kids[0]}"
    meta = [egraph.data(k) for k in node[1:]]
    args = []
    for k, m in zip(kids, meta):
        if m is not None and m.kind == "literal" and isinstance(m.value, tuple) and op in (
                "sum", "mean", "amax", "logsumexp", "softmax", "log_softmax", "var"):
            args.append(f"dims={m.value}")
        elif m is not None and m.kind == "literal" and m.value is None:
            continue
        elif m is not None and m.kind == "literal" and isinstance(m.value, bool):
            continue
        else:
            args.append(k)
    return f"{format_op(op)}({', '.join(args)})"


@dataclass
class Rewrite:
    """One place where the program changed: the program's curvature (predicted mean error
    in bits, :func:`~frontends.fx.error_analysis.rounding_error`) without and with this
    rewrite alone."""

    location: str
    before: str
    after: str
    curvature_before: float
    curvature_after: float

    def __str__(self) -> str:
        return (f"{self.before} -> {self.after}  at {self.location}  [curvature "
                f"{self.curvature_before:.1f} -> {self.curvature_after:.1f} bits]")


@dataclass
class StabilityReport:
    """What :meth:`StabilityRewriter.optimize` changed and what it bought: curvature is
    the predicted mean error in bits (first-order analysis on the sample inputs), error the
    measured one (max relative, and mean/worst bits, against float64); risk the bits at
    risk by the extraction's :class:`~extractors.costs.Curvature` cost model; ``accuracy_refused``
    why validation refused the accuracy search's program (it is then not used)."""

    rewrites: list[Rewrite]
    curvature_before: float
    curvature_after: float
    error_before: float
    error_after: float
    dtype: str
    bits_before: float = 0.0
    bits_after: float = 0.0
    worst_bits_before: float = 0.0
    worst_bits_after: float = 0.0
    rejected: list[Rewrite] = field(default_factory=list)
    risk_before: float = 0.0
    risk_after: float = 0.0
    accuracy_refused: str | None = None

    @property
    def reference(self) -> str:
        """What the errors are measured against: float64, or for a float64 program the
        reals (:mod:`frontends.fx.exact`)."""
        return "the reals" if self.dtype == "float64" else "float64"

    def __str__(self) -> str:
        lines = [str(r) for r in self.rewrites] or ["no rewrite: the program is already stable"]
        lines += [f"not applied (predicted less accurate): {r}" for r in self.rejected]
        if self.accuracy_refused:
            lines.append(f"the accuracy search's program was not kept: {self.accuracy_refused}")
        lines.append(
            f"total curvature {self.curvature_before:.1f} -> {self.curvature_after:.1f} bits; "
            f"max relative error in {self.dtype} vs {self.reference} {self.error_before:.3g} -> "
            f"{self.error_after:.3g}; mean error {self.bits_before:.2f} -> "
            f"{self.bits_after:.2f} bits")
        return "\n".join(lines)

    def chart(self) -> Figure:
        """The report as a matplotlib figure (:mod:`compiler.charts`; needs the ``plot``
        extra): the predicted error (curvature, bits) of the program without and with each
        rewrite and with all of them, next to the error measured against float64 (mean and
        worst element, bits of the working dtype), before and after. Save it with
        :func:`compiler.charts.save` (PNG or SVG).

        >>> report = StabilityReport([Rewrite("log", "log((1 + x))", "log1p(x)", 3.2, 0.1)],
        ...                          3.2, 0.1, 1e-3, 1e-7, "float32", 2.1, 0.1, 9.0, 0.5)
        >>> [ax.get_title() for ax in report.chart().axes]
        ['predicted error (curvature) per rewrite', 'measured error in float32 vs float64']
        """
        from compiler import charts

        curvature, measured = charts.panels(2, size=(6.0, 1.6 + 0.5 * len(self.rewrites)))
        charts.before_after_bars(
            [r.location for r in self.rewrites] + ["all rewrites"],
            [r.curvature_before for r in self.rewrites] + [self.curvature_before],
            [r.curvature_after for r in self.rewrites] + [self.curvature_after],
            title="predicted error (curvature) per rewrite", unit="bits (mean)",
            ax=curvature)
        charts.before_after_bars(
            ["mean", "worst element"], [self.bits_before, self.worst_bits_before],
            [self.bits_after, self.worst_bits_after],
            title=f"measured error in {self.dtype} vs {self.reference}",
            unit=f"bits of {self.dtype}",
            ax=measured)
        fig = curvature.figure
        fig.suptitle(f"max relative error {self.error_before:.3g} -> {self.error_after:.3g}")
        return fig

    def to_svg(self, path: str | None = None) -> str:
        """:meth:`chart` as SVG text, written to ``path`` when given.

        >>> report = StabilityReport([], 0.2, 0.2, 1e-7, 1e-7, "float32")
        >>> "max relative error 1e-07 -&gt; 1e-07" in report.to_svg()  # XML escapes ">"
        True
        """
        from compiler import charts

        fig = self.chart()
        if path is not None:
            charts.save(fig, path)
        return charts.svg_text(fig)


@dataclass
class CurvatureReport:
    """Total and per-node curvature of a program on sample inputs.

    ``total`` and ``worst``: the predicted error of the outputs in bits of the working
    precision (mean over output elements, and largest), from the first-order error
    analysis; ``per_node``: ``(node, op, bits accumulated there, bits it added, bits at
    risk by the Curvature cost model)`` so the two can be compared; ``risk``: the cost
    model's total.
    """

    total: float
    worst: float
    per_node: list[tuple[str, str, float, float, float]]
    risk: float

    def __str__(self) -> str:
        head = f"{'node':<24}{'op':<16}{'bits':>6}{'added':>7}{'risk':>7}"
        lines = [f"{name:<24}{op:<16}{bits:6.1f}{added:+7.1f}{risk:7.1f}"
                 for name, op, bits, added, risk in self.per_node if added > 0.05 or risk > 1]
        return "\n".join([head, *lines, f"{'total (mean)':<40}{self.total:6.2f}",
                          f"{'worst element':<40}{self.worst:6.2f}",
                          f"{'cost model, bits at risk':<40}{self.risk:6.1f}"])

    def __float__(self) -> float:
        return self.total


def error_bits(got, ref, dtype, reduce: str = "mean") -> float:
    """Error in bits of ``dtype``'s precision: ``log2(1 + |got - ref| / ulp(ref))`` per
    element (Herbie's measure, with ulp the spacing of ``dtype`` at ``ref``), averaged
    (``reduce="mean"``) or worst (``"max"``); a non-finite result where the reference is
    finite costs every bit."""
    import torch

    got = got.to(torch.float64)
    ref = ref.to(torch.float64)
    bits = round(-math.log2(torch.finfo(dtype).eps)) + 1  # mantissa bits with the hidden one
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    tiny = torch.finfo(dtype).tiny
    ulp = torch.clamp(ref.abs(), min=tiny) * 2.0 ** (1 - bits)
    err = torch.log2(1 + (got - ref).abs() / ulp)
    err = torch.where(torch.isfinite(got), err.clamp(max=float(bits)), torch.tensor(
        float(bits), dtype=torch.float64))
    return float(err[finite].mean() if reduce == "mean" else err[finite].max())


def max_relative_error(got, ref) -> float:
    """Largest ``|got - ref| / (|ref| + tiny)`` where the reference is finite (inf when the
    result is not finite there)."""
    import torch

    got = got.to(torch.float64)
    ref = ref.to(torch.float64)
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    if not torch.isfinite(got[finite]).all():
        return math.inf
    return float(((got - ref).abs() / (ref.abs() + 1e-30))[finite].max())


class StabilityRewriter:
    """Rewrite models and functions for numerical stability (see the module docstring).

    ``rules``: rule families for ``load_rules`` (default stability and fusion); ``cost``:
    the extraction cost (default ``Lexicographic(Curvature(), Flops())``: stability first,
    then speed); ``limits``: saturation limits (``time_limit`` bounds Herbie's search
    too); ``accuracy``: then run Herbie's search (:mod:`compiler.herbie`: error localised
    on the samples, rewrites, series, regimes) on the elementwise formulas of the
    extracted program.
    """

    def __init__(self, rules: str = "stability,fusion", cost=None, iter_limit: int = 8,
                 node_limit: int = 50_000, time_limit: float = 30.0, accuracy: bool = True):
        from extractors.costs import Flops, Lexicographic
        from extractors.curvature import Curvature

        self.families = rules.split(",")
        self.accuracy = accuracy
        self.cost = cost if cost is not None else Lexicographic(Curvature(), Flops())
        self.limits = {"iter_limit": iter_limit, "node_limit": node_limit,
                       "time_limit": time_limit}

    def _trace(self, model):
        import torch

        if isinstance(model, torch.nn.Module):
            return model
        return torch.fx.symbolic_trace(model)

    def _graph(self, model, sample_inputs, ranges=None, domains=None, dtype=None):
        from egraph.egraph import EGraph

        model, inputs = _cast(self._trace(model), sample_inputs, dtype)
        gm = _as_graph_module(model)
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        ranges = _by_name(ranges, names)
        domains = _by_name(domains, names)
        eg = EGraph.from_fx(model, inputs, domains=domains, ranges=ranges, observe=True)
        return eg, model, gm, inputs

    def curvature(self, model, sample_inputs, ranges=None, dtype=None) -> CurvatureReport:
        """Total and per-node curvature of ``model`` on ``sample_inputs``, their values
        outside ``ranges`` (input name -> (lo, hi)) replaced by ones drawn inside, every
        binade alike.

        >>> import torch
        >>> x = torch.linspace(-100, 100, 64).reshape(4, 16)
        >>> naive = lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
        >>> report = StabilityRewriter().curvature(naive, (x,))
        >>> report.worst  # exp overflows fp32 above 88.7: inf / inf loses every bit
        24.0
        >>> stable = StabilityRewriter().curvature(lambda x: torch.softmax(x, -1), (x,))
        >>> round(stable.total), round(stable.worst)  # x - max(x) rounds before the exp
        (1, 4)
        """
        from extractors.curvature import Curvature
        from frontends.fx.error_analysis import rounding_error

        eg, _, gm, inputs = self._graph(model, sample_inputs, ranges, None, dtype)
        analysis = rounding_error(gm, _within(inputs, ranges, gm))
        cost = Curvature()
        choice = source_program(eg)
        risk = {name: cost.bits(eg, eg.find(c), choice[eg.find(c)])
                for c, name in eg.fx.origins.items() if eg.find(c) in choice}
        per_node = [(name, op, bits, added, risk.get(name, 0.0))
                    for name, (op, bits, added) in analysis.per_node.items()]
        return CurvatureReport(analysis.mean_bits, analysis.worst_bits, per_node,
                               Curvature.to_bits(cost.program_cost(eg, choice)))

    def optimize(self, model, sample_inputs, ranges=None, domains=None, dtype=None):
        """The rewritten GraphModule; its ``meta["stability_report"]`` says what changed.

        ``dtype`` (``torch.float16`` / ``torch.bfloat16``) casts the model and inputs first,
        so costs see the dtype's range and errors are measured in it. A rewrite the
        extraction chose is kept only if the first-order error analysis on the sample
        inputs predicts the program with it no less accurate than without it (mean and
        worst element); the others are listed in the report's ``rejected``.
        """
        import torch

        from backends.fx import build_module
        from egraph.rules import load_rules
        from extractors.curvature import Curvature

        eg, model, gm, inputs = self._graph(model, sample_inputs, ranges, domains, dtype)
        eg.saturate(load_rules(*self.families), **self.limits)
        opt = eg.extract(self.cost)
        report = opt.meta["egraph_report"]
        source = source_program(eg)
        chosen = source if report.fell_back else _chosen(eg, self.cost)
        samples = _within(inputs, ranges, gm)
        predict = _Predictor(eg, samples)
        before = predict(source)
        kept, rejected = [], []
        for region, rewrite in _rewrites(eg, source, chosen):
            alone = predict({**source, **{c: chosen[c] for c in region}})
            if before is None or alone is None:  # nothing to judge by: keep the rewrite
                kept.append((region, rewrite))
                continue
            rewrite.curvature_before, rewrite.curvature_after = (before.mean_bits,
                                                                 alone.mean_bits)
            if (alone.mean_bits <= before.mean_bits + _TOLERANCE
                    and alone.worst_bits <= before.worst_bits + 5 * _TOLERANCE):
                kept.append((region, rewrite))
            else:
                rejected.append(rewrite)
        final = dict(source)
        for region, _ in kept:
            final.update({c: chosen[c] for c in region})
        if rejected:
            opt_meta = opt.meta
            opt = build_module(eg, final)
            opt.meta.update(opt_meta)
        after = predict(final)
        refused = None
        if self.accuracy:
            opt, after, refused = self._herbie(eg, opt, samples, kept, after)
        dtype_used = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)
                           and x.is_floating_point()), torch.float32)
        with torch.no_grad():
            ref = _reference(model, gm, inputs, dtype_used)
            got_before = _flat(model(*inputs))
            got_after = _flat(opt(*inputs))
        nan = math.nan
        opt.meta["stability_report"] = StabilityReport(
            [r for _, r in kept], before.mean_bits if before else nan,
            after.mean_bits if after else nan,
            max(max_relative_error(b, r) for b, r in zip(got_before, ref)),
            max(max_relative_error(a, r) for a, r in zip(got_after, ref)),
            str(dtype_used).removeprefix("torch."),
            sum(error_bits(b, r, dtype_used) for b, r in zip(got_before, ref)) / len(ref),
            sum(error_bits(a, r, dtype_used) for a, r in zip(got_after, ref)) / len(ref),
            max(error_bits(b, r, dtype_used, "max") for b, r in zip(got_before, ref)),
            max(error_bits(a, r, dtype_used, "max") for a, r in zip(got_after, ref)),
            rejected,
            Curvature.to_bits(Curvature().program_cost(eg, source)),
            Curvature.to_bits(Curvature().program_cost(eg, final)),
            refused,
        )
        opt.meta["stability_egraph"] = eg
        return opt

    def _herbie(self, eg, opt, samples, kept: list, after):
        """Herbie's search (:func:`compiler.herbie.improve_validated`) on the extracted
        program's elementwise formulas, kept where it validates against the source; each
        formula it replaces is one more rewrite, and the predicted error after is the
        analysis of the final program."""
        from compiler.herbie import improve_validated
        from frontends.fx.error_analysis import rounding_error

        better, accuracy = improve_validated(eg.fx, opt, samples,
                                             time_limit_s=self.limits["time_limit"])
        found = [] if accuracy.refused else accuracy.improvements
        if not found:
            return opt, after, accuracy.refused
        try:
            final = rounding_error(better, samples)
        except Exception:  # noqa: BLE001 - a program the analysis cannot run is not judged
            final = None
        for imp in found:
            kept.append((set(), Rewrite(
                imp.location, imp.before, imp.after,
                after.mean_bits if after is not None else math.nan,
                final.mean_bits if final is not None else math.nan)))
        return better, final if final is not None else after, None

    def diff(self, before, after) -> str:
        """The rewrites that turned ``before`` into ``after`` (an ``optimize`` result),
        one per line."""
        report = getattr(after, "meta", {}).get("stability_report")
        if report is None:
            raise ValueError("diff(before, after) needs `after` from StabilityRewriter.optimize")
        return "\n".join(str(r) for r in report.rewrites) or "no rewrite"


# Bits of predicted error a rewrite may add to the mean (five times that to the worst
# element) and still count as no less accurate: the probes that estimate the error of
# softmax-like ops are random.
_TOLERANCE = 0.05


class _Predictor:
    """The first-order error analysis of a choice over the e-graph, on fixed samples."""

    def __init__(self, eg, samples):
        self.eg, self.samples = eg, samples

    def __call__(self, choice):
        from backends.fx import build_module
        from frontends.fx.error_analysis import rounding_error

        try:
            return rounding_error(build_module(self.eg, choice), self.samples)
        except Exception:  # noqa: BLE001 - a program the analysis cannot run is not judged
            return None


def _reference(model, gm, inputs, dtype) -> list:
    """The outputs' reference: ``model`` in float64, or for a float64 program its exact
    values (:mod:`frontends.fx.exact`): float64 cannot judge itself."""
    import torch

    if dtype == torch.float64:
        from frontends.fx.exact import exact_outputs

        try:
            return exact_outputs(gm, inputs)
        except Exception:  # noqa: BLE001 - a graph the reals cannot run: float64 judges
            pass
    return _flat(_float64(model)(*[_as64(x) for x in inputs]))


def _as_graph_module(model):
    import torch

    if isinstance(model, torch.fx.GraphModule):
        return model
    return torch.fx.symbolic_trace(model)


def _within(inputs, ranges, gm) -> tuple:
    """The sample inputs, each value outside its input's declared range (``ranges``: input
    name -> (lo, hi)) replaced by one drawn inside it, every binade alike (seeded)."""
    import torch

    from compiler.ordinals import within

    if not ranges:
        return inputs
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    ranges = _by_name(ranges, names)
    gen = torch.Generator().manual_seed(0)
    return tuple(within(x, *ranges[name], gen)
                 if name in ranges and isinstance(x, torch.Tensor) else x
                 for name, x in zip(names, inputs))


def _by_name(spec, names: list[str]) -> dict | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return spec
    return {names[0]: spec}


def _cast(model, inputs, dtype):
    import copy

    import torch

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if dtype is None:
        return model, inputs
    model = copy.deepcopy(model).to(dtype)
    return model, tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                        else x for x in inputs)


def _float64(model):
    import copy

    import torch

    ref = copy.deepcopy(model)
    if isinstance(ref, torch.nn.Module):
        ref = ref.to(torch.float64)
    return ref


def _as64(x):
    import torch

    return x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _flat(out) -> list:
    import torch
    import torch.fx as fx

    leaves: list = []
    fx.node.map_aggregate(out, lambda a: leaves.append(a) if isinstance(a, torch.Tensor)
                          else None)
    return leaves


def _chosen(eg, cost) -> dict[int, tuple]:
    """The choice greedy extraction makes under ``cost`` (deterministic, as in extract)."""
    return {c: v[1] for c, v in best_nodes(eg, cost).items()}


def _rewrites(eg, source: dict[int, tuple], chosen: dict[int, tuple]
              ) -> list[tuple[set[int], Rewrite]]:
    """Maximal regions of the chosen program whose e-nodes differ from the source's, each
    with its description (curvatures are filled in by the caller)."""
    find = eg.find
    order, roots = program_order(eg, chosen), program_roots(eg)
    changed = {c for c in order if chosen[c] != source.get(c)}
    parents: dict[int, set[int]] = {}
    for c in order:
        for k in chosen[c][1:]:
            parents.setdefault(find(k), set()).add(c)
    tops = [c for c in order if c in changed and (c in roots or not parents.get(c, set())
                                                   & changed)]
    return [(_region(eg, chosen, top, changed),
             Rewrite(eg.fx.location(top, find) or f"class {top}",
                     _describe(eg, source, top), _describe(eg, chosen, top),
                     math.nan, math.nan))
            for top in reversed(tops)]


def _region(eg, choice: dict[int, tuple], top: int, changed: set[int]) -> set[int]:
    find = eg.find
    region, stack = set(), [top]
    while stack:
        c = find(stack.pop())
        if c in region or c not in choice or c not in changed:
            continue
        region.add(c)
        stack.extend(choice[c][1:])
    return region
