"""Scale: a decoder shaped like Llama-2-7B (hidden 4096, 32 heads, 11008 intermediate,
vocabulary 32000) through ingest, saturation and extraction at 1 to 32 layers, its weights
on the meta device (no 28 GB of values: nothing runs, validation is off).

    .venv/bin/python benchmarks/scale.py [--layers 1,2,4,8,16,32] [--seq 128] [--profile]

Each layer count is built from ``transformers``' ``LlamaConfig`` under
``torch.device("meta")``, exported with torch.export at batch 1 and sequence ``--seq``,
then timed stage by stage: ``EGraph.from_fx`` (ingest), ``saturate(load_rules("all"))``
under the ``egraph`` backend's default limits (:class:`compiler.options.BackendOptions`)
and ``extract(default_cost(inputs), validate="off")``. Per layer count it prints the
seconds of each stage, the e-graph's size, why saturation stopped, the rules the backoff
scheduler banned for matching too often (a banned rule fires on no layer in those
iterations) and the rewrites the extracted program uses per layer: where saturation is cut
short at more layers, fewer rewrites per layer reach the program. The growth is the
least-squares seconds per layer of each stage, and the marginal seconds per layer between
consecutive counts (constant where growth is linear). ``--profile`` runs the largest count
once more under cProfile (export left out) and prints the functions that take the most
time.

>>> rows = [measure(n, seq=8, tiny=True) for n in (1, 2)]
>>> [r.layers for r in rows], all(r.total > 0 for r in rows), rows[0].stop in STOPS
([1, 2], True, True)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus import TensorModel  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.options import BackendOptions  # noqa: E402
from compiler.pipeline import default_cost  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402

LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                 hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, use_cache=False)
"""meta-llama/Llama-2-7b-hf's config, as ``transformers.LlamaConfig`` fields."""
TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=4)
"""The fields a tiny copy replaces (the architecture kept), for tests."""
LAYERS = (1, 2, 4, 8, 16, 32)
STOPS = ("saturated", "iter_limit", "node_limit", "time_limit")
STAGES = ("ingest", "saturate", "extract")


def build(layers: int, batch: int = 1, seq: int = 128,
          tiny: bool = False) -> tuple[TensorModel, tuple[torch.Tensor, ...]]:
    """The Llama-2-7B-shaped causal LM with ``layers`` decoder layers on the meta device
    (positional token ids in, logits out), in eval mode, and meta token ids of ``batch``
    by ``seq``; ``tiny``: :data:`TINY`'s sizes.

    >>> model, (ids,) = build(2, seq=8, tiny=True)
    >>> {p.device.type for p in model.parameters()}, tuple(ids.shape), ids.device.type
    ({'meta'}, (1, 8), 'meta')
    """
    import transformers

    fields = {**LLAMA2_7B, **(TINY if tiny else {}), "num_hidden_layers": layers}
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    ids = torch.empty(batch, seq, dtype=torch.long, device="meta")
    return TensorModel(model, ("input_ids",), ("logits",)).eval(), (ids,)


@dataclass
class Stages:
    """One layer count's run: seconds of export and of each of :data:`STAGES`, the
    saturated e-graph's classes and nodes, why saturation stopped (:data:`STOPS`), the
    rules the scheduler ``banned`` at least once, the rewrites the extracted program
    ``used`` (rule: times), and whether its extraction was proven ``optimal`` (the exact
    solver has a time limit: past it, the DAG heuristic's program is kept)."""

    layers: int
    export: float
    ingest: float
    saturate: float
    extract: float
    classes: int
    nodes: int
    stop: str
    banned: tuple[str, ...] = ()
    used: dict[str, int] = field(default_factory=dict)
    optimal: bool | None = None

    @property
    def total(self) -> float:
        """Ingest, saturation and extraction (export is torch's)."""
        return self.ingest + self.saturate + self.extract


def exported(layers: int, seq: int = 128, tiny: bool = False
             ) -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, ...], float]:
    """The program torch.export captures of :func:`build`'s model, its inputs, and the
    seconds export took."""
    model, inputs = build(layers, seq=seq, tiny=tiny)
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(model, inputs)
    return program, inputs, time.perf_counter() - start


def stages(program: torch.export.ExportedProgram, inputs: tuple[torch.Tensor, ...]
           ) -> tuple[EGraph, torch.fx.GraphModule, tuple[float, float, float]]:
    """Ingest, saturate and extract ``program`` as :func:`measure` does: the e-graph, the
    program extracted and the seconds of each stage."""
    rules = load_rules("all")
    with torch.no_grad():
        t0 = time.perf_counter()
        eg = EGraph.from_fx(program, inputs)
        t1 = time.perf_counter()
        eg.saturate(rules, **BackendOptions().limits)
        t2 = time.perf_counter()
        opt = eg.extract(default_cost(inputs), validate="off")
        t3 = time.perf_counter()
    return eg, opt, (t1 - t0, t2 - t1, t3 - t2)


def measure(layers: int, seq: int = 128, tiny: bool = False) -> Stages:
    """Build, export and time the pipeline's stages at ``layers`` layers (:func:`build`)."""
    program, inputs, export = exported(layers, seq, tiny)
    eg, opt, seconds = stages(program, inputs)
    report, extracted = eg.report, opt.meta["egraph_report"]
    return Stages(layers, export, *seconds, eg.num_classes, eg.num_nodes,
                  report.stop_reason or "", tuple(sorted(
                      name for name, stats in report.rules.items() if stats.skipped)),
                  dict(extracted.used), extracted.optimal)


def per_layer(rows: Sequence[Stages], stage: str) -> float:
    """The least-squares slope of ``stage``'s seconds (or ``"total"``) over the layer
    count: its seconds per layer.

    >>> rows = [Stages(n, 0, 0.1 + 0.2 * n, 0, 0, 0, 0, "") for n in (1, 2, 4)]
    >>> round(per_layer(rows, "ingest"), 6)
    0.2
    """
    xs = [r.layers for r in rows]
    ys = [getattr(r, stage) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else 0.0


def table(rows: Sequence[Stages]) -> str:
    """Seconds per stage and layer count, the marginal seconds per added layer, the
    e-graph's size, the stop reason, the rules banned, the rewrites used per layer and
    whether the extraction was proven optimal."""
    out, previous = [], None
    for r in rows:
        marginal = ((r.total - previous.total) / (r.layers - previous.layers)
                    if previous else None)
        out.append({
            "layers": r.layers, "export s": f"{r.export:.2f}",
            **{f"{s} s": f"{getattr(r, s):.2f}" for s in STAGES},
            "total s": f"{r.total:.2f}",
            "s per added layer": f"{marginal:.3f}" if marginal is not None else "-",
            "classes": r.classes, "nodes": r.nodes, "stop": r.stop,
            "rules banned": ", ".join(r.banned) or "none",
            "rewrites used per layer": f"{sum(r.used.values()) / r.layers:.1f}",
            "proven optimal": {True: "yes", False: "no"}.get(r.optimal, "-")})
        previous = r
    return markdown_table(out, list(out[0]))


def growth(rows: Sequence[Stages]) -> str:
    """Each stage's least-squares seconds per layer."""
    return ", ".join(f"{stage} {per_layer(rows, stage):.3f}"
                     for stage in ("export", *STAGES, "total"))


def profile(layers: int, seq: int, tiny: bool = False, top: int = 20) -> str:
    """The ``top`` functions by own time in one run of the stages (export not included)
    at ``layers`` layers."""
    program, inputs, _ = exported(layers, seq, tiny)
    profiler = cProfile.Profile()
    profiler.enable()
    stages(program, inputs)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)))
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--tiny", action="store_true", help="a check of the script")
    parser.add_argument("--profile", action="store_true")
    add_out_option(parser, "scale")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    counts = [int(n) for n in args.layers.split(",") if n]
    measure(1, args.seq, tiny=True)  # (one-time costs: imports, torch.export's set-up)
    rows = []
    for layers in counts:
        rows.append(measure(layers, args.seq, args.tiny))
        print(f"{layers:>3} layers: " + ", ".join(
            f"{s} {getattr(rows[-1], s):.2f} s" for s in ("export", *STAGES)), flush=True)
    document = (
        f"A Llama-2-7B-shaped decoder (`transformers` {transformers.__version__} "
        f"LlamaForCausalLM{', tiny sizes' if args.tiny else ''}) on the meta device, "
        f"exported at batch 1, sequence {args.seq}; saturation under the backend's default "
        f"limits {BackendOptions().limits}; extraction under `default_cost`, validation "
        "off. Total = ingest + saturate + extract (export is torch's, shown apart).\n\n"
        + table(rows) + f"\n\nSeconds per layer (least squares): {growth(rows)}\n")
    used = rows[-1].used
    document += ("\nRewrites used at the largest count: "
                 + (", ".join(f"{k} x{v}" for k, v in sorted(used.items())) or "none") + "\n")
    if args.profile:
        document += ("\nProfile of the largest count (own time):\n\n```text\n"
                     + profile(counts[-1], args.seq, args.tiny) + "```\n")
    print(document)
    return write_results("scale", "Scale: a Llama-2-7B-shaped graph, 1 to 32 layers", document,
                         out=args.out, argv=None if argv is None else [__file__, *argv])


if __name__ == "__main__":
    main()
