"""Value ranges: the input domains and ranges a user declares (proven facts for the rules'
conditions, promises for validation's inputs), and the ranges and sensitivities observed
on the example inputs (they inform the curvature cost, never rules).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from egraph.signs import ANY, NEG, NONNEG, NONPOS, NONZERO, POS
from frontends.fx.analysis import Meta
from frontends.fx.effects import updates_inputs
from frontends.fx.exported import deep_copy
from frontends.fx.kept import attributes_kept, state_kept
from frontends.fx.observed import observed_range

__all__ = ["DOMAINS", "declare", "observe_ranges", "observing"]

DOMAINS = {"any": ANY, "finite": ANY, "positive": POS, "nonneg": NONNEG, "negative": NEG,
           "nonpos": NONPOS, "nonzero": NONZERO, "unit": NONNEG}
"""Input domains a user can declare, as their signs; they are proven facts for the rules'
conditions. Every domain but ``any`` is a set of numbers: it also promises finite values
(no inf, no NaN), which rules that drop an operand need (``x - x -> 0``)."""


_MAX_OBSERVED = 1 << 22
"""Graphs with more input and parameter elements are not run to observe ranges."""

def observing(gm: fx.GraphModule, example_inputs, observe: bool | None) -> bool | None:
    """Whether ingest observes ranges on the example inputs: ``observe`` where it is given
    (or where there are no example inputs), else whether the inputs and parameters of
    ``gm`` hold at most :data:`_MAX_OBSERVED` elements.

    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    >>> observing(gm, (torch.ones(4),), None), observing(gm, (torch.ones(1 << 22),), None)
    (True, False)
    """
    if observe is not None or example_inputs is None:
        return observe
    numel = sum(x.numel() for x in example_inputs if isinstance(x, torch.Tensor))
    numel += sum(p.numel() for p in gm.parameters())
    return numel <= _MAX_OBSERVED


def declare(metas: dict[str, Meta], gm: fx.GraphModule, domains: dict[str, str] | None,
            ranges: dict[str, tuple[float, float]] | None) -> None:
    """Write the declared ``domains`` (see :data:`DOMAINS`) and value ``ranges`` of inputs
    of ``gm`` into their ``metas``; a name that is no input, an unknown domain or an empty
    range is a ValueError.

    >>> gm = fx.symbolic_trace(lambda x: x.log())
    >>> metas = {}
    >>> declare(metas, gm, {"x": "positive"}, {"x": (1.0, 2.0)})
    >>> metas["x"].sign == POS, metas["x"].lo, metas["x"].finite
    (True, 1.0, True)
    """
    inputs = {n.name for n in gm.graph.nodes if n.op == "placeholder"}
    for name, domain in (domains or {}).items():
        if domain not in DOMAINS:
            raise ValueError(f"unknown domain {domain!r} for input {name!r}; "
                             f"choose from {', '.join(DOMAINS)}")
        if name not in inputs:
            raise ValueError(f"domains names {name!r}, which is not an input of the graph")
        meta = metas.get(name, Meta("tensor"))
        metas[name] = meta._replace(sign=DOMAINS[domain], finite=domain != "any")
    for name, (lo, hi) in (ranges or {}).items():
        if name not in inputs:
            raise ValueError(f"ranges names {name!r}, which is not an input of the graph")
        if not lo <= hi:
            raise ValueError(f"the range of {name!r} must have lo <= hi, got {(lo, hi)}")
        meta = metas.get(name, Meta("tensor"))
        metas[name] = meta._replace(lo=float(lo), hi=float(hi))


class _RangeRecorder(fx.Interpreter):
    """Runs the graph on real example inputs and keeps each tensor's observed range, and
    the tensors themselves for the sensitivity pass."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.ranges: dict[str, dict] = {}
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.ranges[n.name] = observed_range(result.detach())
            self.ranges[n.name]["contiguous"] = result.is_contiguous()
            if result.requires_grad and n.op != "output":
                result.retain_grad()
                self.values[n.name] = result
        return result


def observe_ranges(gm: fx.GraphModule, example_inputs) -> dict[str, dict]:
    """The value range of every tensor of ``gm`` on ``example_inputs`` (run as given), and
    its relative sensitivity ``sens``: ``max |d L / d v * v|`` with ``L = sum(out / |out|)``
    over the outputs, i.e. how much a relative error in that value moves the outputs,
    measured in float64 so that overflow in the working dtype does not hide it (one run,
    one float64 forward and backward; the caller's RNG state is left as it was). Empty
    when the graph cannot run on them."""
    if not example_inputs or not all(not isinstance(x, torch.Tensor) or (
            x.device.type != "meta" and type(x) is torch.Tensor) for x in example_inputs):
        return {}
    recorder = _RangeRecorder(gm)
    if updates_inputs(gm.graph):  # (on copies: the caller's stay as they are)
        example_inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x
                          for x in example_inputs]
    try:
        with torch.random.fork_rng(), torch.no_grad(), state_kept(), attributes_kept(gm):
            recorder.run(*example_inputs)
    except Exception:  # noqa: BLE001 - ranges are an optional refinement of the costs
        return {}
    ranges = recorder.ranges
    for name, sens in _sensitivities(gm, example_inputs).items():
        if name in ranges:
            ranges[name]["sens"] = sens
    return ranges


def _sensitivities(gm: fx.GraphModule, example_inputs) -> dict[str, float]:
    wide = deep_copy(gm).to(torch.float64)
    recorder = _RangeRecorder(wide)
    inputs = [x.detach().to(torch.float64).requires_grad_(True)
              if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in example_inputs]
    try:
        with torch.random.fork_rng(), torch.enable_grad(), state_kept():
            out = recorder.run(*inputs)
            leaves = [o for o in _tensors(out) if o.is_floating_point() and o.requires_grad]
            if not leaves:
                return {}
            loss = sum((o * (o.sign() / (o.abs() + 1e-300)).detach()).nan_to_num().sum()
                       for o in leaves)
            loss.backward()
    except Exception:  # noqa: BLE001 - sensitivities are an optional refinement
        return {}
    out: dict[str, float] = {}
    for name, value in recorder.values.items():
        if value.grad is not None and value.numel():
            product = value.grad * value.detach()
            if torch.isfinite(product).all():
                out[name] = float(product.abs().max())
    return out


def _tensors(out) -> list:
    leaves: list = []
    fx.node.map_aggregate(out, lambda a: leaves.append(a) if isinstance(a, torch.Tensor)
                          else None)
    return leaves

