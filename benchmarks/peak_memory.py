"""Peak memory, estimated and measured: PeakMemory against the allocator on the corpus.

    .venv/bin/python benchmarks/peak_memory.py [--models gpt2,bert] [--quick] [--out PATH]

Per corpus model (``benchmarks/corpus.py``, inference on its example inputs): torch.export ->
``EGraph.from_fx`` -> ``saturate(load_rules("all"))`` -> ``extract(default_cost(inputs))``,
the program the backend's default cost picks. Columns: the
:class:`~extractors.peak.PeakMemory` estimate of the extracted program (the choice
:func:`compiler.fx.choose_program` makes, which extraction emits), the peak measured
while the emitted program runs (:func:`compiler.memory.peak_bytes`: every block torch's
allocator hands out, after a first call has computed its folded values), their ratio, and
whether the estimate is within :data:`TOLERANCE` of the measurement. Inputs and parameters
are counted by neither. ``--quick`` runs :data:`QUICK` with a shorter saturation (the
test's run). Written to benchmarks/results/peak_memory.md (``--out``).

``--train`` adds a training step (forward, the mean square of the outputs, backward) per
model: aot_autograd's forward and backward graphs each through the same pipeline, each
graph's estimate against the measured peak of its emitted program (the graph run on its
own: its inputs, saved activations among them, not counted), and the whole step's
measured peak (:func:`compiler.memory.training_peak_bytes`: activations, temporaries and
gradients) for eager, ``torch.compile(backend="egraph")``, Inductor and the pipeline's
programs, each compiling the loss with the model; for the pipeline's, the whole step's
estimate from its graphs' (:func:`step_estimate`) against that measurement.
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler.compile  # noqa: E402,F401  (registers the "egraph" backend)
from benchmarks import corpus  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.compile import default_cost  # noqa: E402
from compiler.fx import channels_last_convolutions, choose_program  # noqa: E402
from compiler.memory import peak_bytes, training_peak_bytes  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors.peak import peak_of  # noqa: E402

LIMITS = dict(iter_limit=10, node_limit=50_000, time_limit=120.0)
QUICK_LIMITS = dict(iter_limit=3, node_limit=20_000, time_limit=30.0)
QUICK = ("gpt2", "bert")
"""The models of ``--quick``: small, and their peaks set by different things (GPT-2's
logits; BERT's attention and feed-forward values)."""
TOLERANCE = 0.15
"""How far the estimate may be from the measured peak (a fraction of it)."""
COLUMNS = ["model", "estimate KiB", "measured KiB", "estimate / measured", "within 15%"]
STEP_COLUMNS = ["model", "eager KiB", "egraph KiB", "Inductor KiB", "pipeline KiB",
                "pipeline estimate KiB", "estimate / measured"]


def estimated_peak(egraph: EGraph, cost) -> float:
    """PeakMemory's estimate of the program ``extract`` emits under ``cost``: its choice,
    with the convolutions emission converts to channels-last."""
    choice = choose_program(egraph, cost)[0]
    return float(peak_of(egraph, choice, channels_last_convolutions(egraph, cost, choice)))


def row_of(name: str, limits: dict) -> dict:
    """Model ``name``'s estimated and measured peak of the extracted program."""
    case = corpus.build(name)
    model, inputs = case.model.eval(), case.inputs
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, inputs)
        eg = EGraph.from_fx(program, inputs).saturate(load_rules("all"), **limits)
        cost = default_cost(inputs)
        estimate = estimated_peak(eg, cost)
        emitted = eg.extract(cost, validate="strict")
        emitted(*inputs)  # (the first call computes the folded values)
    fell_back = emitted.meta["egraph_report"].fell_back
    return _compared(name + (" (fell back)" if fell_back else ""), estimate,
                     peak_bytes(emitted, *inputs))


def training_rows(name: str, limits: dict) -> tuple[list[dict], dict]:
    """Model ``name``'s training step: a row per graph aot_autograd makes of it (the
    estimate of the extracted program against the measured peak of the emitted one), and
    the step's measured peak for eager, the egraph backend, Inductor and the pipeline's
    programs, with the pipeline's whole-step estimate (:func:`step_estimate`)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from compiler.pipeline import hinted_inputs

    rows: list[dict] = []
    estimates: dict[str, float] = {}
    aliases: set[str] = set()

    def through_pipeline(graph: str):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list):
            if graph == "forward":
                aliases.update(parameter_aliases(gm))
            else:
                estimates["held"] = held_bytes(gm, example_inputs, aliases)
            with unset_fake_temporarily():
                inputs = [x.detach() if isinstance(x, torch.Tensor) else x
                          for x in hinted_inputs(example_inputs, gm)]
                eg = EGraph.from_fx(gm, inputs).saturate(load_rules("all"), **limits)
                cost = default_cost(inputs)
                estimate = estimated_peak(eg, cost)
                estimates[graph] = estimate
                emitted = eg.extract(cost, validate="strict")
                emitted(*inputs)
                rows.append(_compared(f"{name} {graph}", estimate,
                                      peak_bytes(emitted, *inputs)))
            return emitted
        return compile_graph

    torch._dynamo.reset()  # (every corpus model's forward is one code object to dynamo)
    case = corpus.build(name)
    model = case.model.train()
    pipeline = aot_autograd(fw_compiler=through_pipeline("forward"),
                            bw_compiler=through_pipeline("backward"))
    steps = {"eager": _Loss(model),
             "egraph": torch.compile(_Loss(copy.deepcopy(model)), backend="egraph"),
             "Inductor": torch.compile(_Loss(copy.deepcopy(model))),
             "pipeline": torch.compile(_Loss(copy.deepcopy(model)), backend=pipeline)}
    measured: dict[str, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for system, loss in steps.items():
            loss(*case.inputs).backward()  # (compiles)
            for parameter in loss.parameters():
                parameter.grad = None
            measured[system] = training_peak_bytes(loss, *case.inputs)
    estimate = step_estimate(estimates["forward"], estimates["backward"], estimates["held"])
    peaks = {"model": name, **{f"{system} KiB": f"{b / 1024:.1f}"
                               for system, b in measured.items()},
             "pipeline estimate KiB": f"{estimate / 1024:.1f}",
             "estimate / measured": f"{estimate / measured['pipeline']:.3f}",
             "step ratio": estimate / measured["pipeline"]}
    return rows, peaks


def parameter_aliases(forward: torch.fx.GraphModule) -> set[str]:
    """The names of a forward graph's outputs that share an input's storage (a saved
    transposed weight): the backward graph takes them under the same names."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage(node: torch.fx.Node):
        value = node.meta.get("val")
        return StorageWeakRef(value.untyped_storage()) if isinstance(
            value, torch.Tensor) else None

    inputs = {storage(n) for n in forward.graph.find_nodes(op="placeholder")} - {None}
    outputs = torch.fx.node.map_arg(forward.graph.output_node().args, lambda n: n)
    found: set[str] = set()
    torch.fx.node.map_arg(outputs, lambda n: found.add(n.name) if storage(n) in inputs
                          else None)
    return found


def held_bytes(backward: torch.fx.GraphModule, example_inputs: list,
               aliases: set[str]) -> int:
    """The bytes of a backward graph's inputs that the step allocated: the activations
    the forward saved and the gradients of its outputs, each storage once; not the
    parameters and inputs aot_autograd passes as ``primals_*`` nor the saved views of
    them (``aliases``: :func:`parameter_aliases`), which exist anyway. The emitted
    backward holds them all until it returns (it is called with its arguments unpacked)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    names = [n.name for n in backward.graph.find_nodes(op="placeholder")]
    held: dict = {}
    for name, x in zip(names, example_inputs):
        if (isinstance(x, torch.Tensor) and not name.startswith("primals")
                and name not in aliases):
            held[StorageWeakRef(x.untyped_storage())] = x.untyped_storage().nbytes()
    return sum(held.values())


def step_estimate(forward: float, backward: float, held: float) -> float:
    """A training step's peak from its graphs' estimates: the forward's peak (its outputs,
    the saved activations among them, alive at its end), or the backward's on top of
    what it is handed and holds until it returns (``held``: :func:`held_bytes`),
    whichever is higher.

    >>> step_estimate(forward=100, backward=40, held=80)
    120
    """
    return max(forward, held + backward)


class _Loss(torch.nn.Module):
    """``inputs -> the mean square of every floating tensor the model returns``, as a
    module, so that the loss compiles with the model and its parameters are the model's."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        outputs = torch.utils._pytree.tree_leaves(self.model(*inputs))
        return sum(o.square().mean() for o in outputs
                   if isinstance(o, torch.Tensor) and o.is_floating_point())


def _compared(name: str, estimate: float, measured: int) -> dict:
    ratio = estimate / measured
    return {"model": name, "estimate KiB": f"{estimate / 1024:.1f}",
            "measured KiB": f"{measured / 1024:.1f}", "estimate / measured": f"{ratio:.3f}",
            "ratio": ratio, "within 15%": "yes" if abs(ratio - 1) <= TOLERANCE else "no"}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated corpus models (default: all of them)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(QUICK)} with a shorter saturation")
    parser.add_argument("--train", action="store_true",
                        help="also a training step per model (see the module docstring)")
    add_out_option(parser, "peak_memory")
    args = parser.parse_args(argv)
    names = (args.models.split(",") if args.models
             else list(QUICK) if args.quick else list(corpus.MODELS))
    limits = QUICK_LIMITS if args.quick else LIMITS
    rows = []
    for name in names:
        rows.append(row_of(name, limits))
        print(markdown_table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
    within = sum(r["within 15%"] == "yes" for r in rows)
    body = (markdown_table(rows, COLUMNS)
            + f"\n\n{within} of {len(rows)} models within 15% of the measured peak.\n")
    if args.train:
        graphs, steps = [], []
        for name in names:
            found, peaks = training_rows(name, limits)
            graphs += found
            steps.append(peaks)
            print(markdown_table(found, COLUMNS), markdown_table(steps[-1:], STEP_COLUMNS),
                  sep="\n", flush=True)
        body += ("\n## Training step: each graph aot_autograd makes\n\n"
                 + markdown_table(graphs, COLUMNS)
                 + "\n\n## Training step: the measured peak of the whole step\n\n"
                 + markdown_table(steps, STEP_COLUMNS) + "\n")
    write_results("peak_memory", "Peak memory: the PeakMemory estimate against the measured "
                  "peak of the emitted program", body, out=args.out,
                  argv=None if argv is None else [__file__, *argv])
    return rows


if __name__ == "__main__":
    main()
