"""Inference at the sizes users run: the real-size corpus (benchmarks/real_size.py) through
eager, the ``egraph`` backend, Inductor, Inductor with freezing and ours + Inductor, in
one run.

    .venv/bin/python benchmarks/speed.py [--models gpt2,resnet50] [--batch 1,8]
                                         [--seq 128,512] [--rounds 9] [--threads 2]
                                         [--entries egraph,inductor,freezing,ours+inductor,export]
                                         [--decode] [--tiny]

Entry points, each compiled on the cell's model and called once (its first call's seconds),
its outputs compared with eager's, then timed:

- ``egraph``: ``torch.compile(model, backend="egraph")``, the backend's defaults;
- ``inductor``: ``torch.compile(model)``, Inductor's defaults (no freezing);
- ``freezing``: ``torch.compile(model, options={"freezing": True})``: parameters folded
  as constants, the strongest stock CPU inference path;
- ``ours+inductor``: ``torch.compile(model, backend="egraph", options={"codegen":
  "inductor"})``: our optimised graph handed to Inductor's code generation;
- ``export`` (only when asked for): torch.export, then ``EGraph.from_fx`` ->
  ``saturate(load_rules("all"))`` -> ``extract(default_cost(inputs))`` under the backend's
  saturation limits, validation strict.

A cell is a model at one batch size and one sequence length (image, audio and latent models
take the size their config fixes, so they have one cell per batch). ``--decode`` makes each
cell a decode step of a causal LM instead (:data:`benchmarks.real_size.DECODERS`: GPT-2
small and the Llama-shaped decoder, :func:`benchmarks.real_size.decode_step`): one new
token per sequence against a cache of ``--seq`` tokens (512 by default) that a prefill
left, the ``transformers`` cache object built from it in the step; its outputs are the
logits and the updated keys and values. In each cell, eager and
every entry point are timed in interleaved rounds (each round calls every one once, in a
shuffled order; :func:`compiler.timing.interleaved_ms`), medians in ms, under
``torch.no_grad``, with ``--threads`` intra-op threads (2 by default: all the cores of the
machine the targets are set on). Inductor compiles with a fresh cache directory and its
caches off, so its first calls are cold; the process has compiled a small function through
every entry point first, so no first call pays the imports. Outputs are compared with
eager's (normwise, :data:`CLOSE`); geometric means are over the cells of each batch size
and sequence length where every entry point's outputs agree.

The tables (speed, first calls, checks) are printed and written to
benchmarks/results/speed.md (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A cold compile means no Inductor cache from an earlier run.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import real_size  # noqa: E402
from benchmarks.corpus import Case  # noqa: E402
from benchmarks.report import add_out_option, markdown_table, write_results  # noqa: E402
from compiler.compile import capture, default_cost  # noqa: E402 - registers backend="egraph"
from compiler.options import BackendOptions  # noqa: E402
from compiler.timing import interleaved_ms  # noqa: E402
from compiler.validate.judging import relative_errors  # noqa: E402
from egraph import EGraph  # noqa: E402
from egraph.rules import load_rules  # noqa: E402
from extractors.hardware import RATE_KINDS, Hardware  # noqa: E402


def _export_pipeline(model: torch.nn.Module, inputs: tuple) -> Callable:
    program = torch.export.export(model, inputs)
    eg = EGraph.from_fx(program, inputs).saturate(load_rules("all"), **BackendOptions().limits)
    return eg.extract(default_cost(inputs), validate="strict")


COMPILERS: dict[str, Callable[[torch.nn.Module, tuple], Callable]] = {
    "egraph": lambda model, inputs: torch.compile(model, backend="egraph"),
    "inductor": lambda model, inputs: torch.compile(model),
    "freezing": lambda model, inputs: torch.compile(model, options={"freezing": True}),
    "ours+inductor": lambda model, inputs: torch.compile(
        model, backend="egraph", options={"codegen": "inductor"}),
    "export": _export_pipeline,
}
"""Each entry point: the program it makes of a model (called on the example inputs)."""
ENTRIES = tuple(COMPILERS)
DEFAULT_ENTRIES = ("egraph", "inductor", "freezing", "ours+inductor")
"""The entry points of the issue's table (``export`` is asked for)."""
TITLES = {"egraph": '`backend="egraph"`', "inductor": "Inductor",
          "freezing": "Inductor + freezing", "ours+inductor": "ours + Inductor",
          "export": "export -> from_fx"}
AGAINST_INDUCTOR = ("egraph", "ours+inductor", "export")
"""The entry points whose speed is also given over Inductor's."""
CLOSE = 1e-4
"""The normwise difference from eager's outputs (``max |ours - eager| / max |eager|``)
past which an entry point's outputs are marked as differing."""


@dataclass
class Entry:
    """One entry point on one cell: its first call's seconds, the largest normwise
    difference of its outputs from eager's, what the egraph backends compiled (graphs,
    graph breaks, fallbacks to the source, and the rules whose rewrites the emitted
    programs ``used``, with how often) and its median ms; ``error`` when it raised."""

    first_s: float | None = None
    difference: float | None = None
    graphs: int = 0
    breaks: int = 0
    fallbacks: list[str] = field(default_factory=list)
    used: Counter[str] = field(default_factory=Counter)
    ms: float | None = None
    error: str = ""

    @property
    def agrees(self) -> bool:
        """It ran and its outputs agree with eager's (within :data:`CLOSE`)."""
        return not self.error and self.difference is not None and self.difference <= CLOSE

    @property
    def ok(self) -> bool:
        """It agrees with eager and kept every optimised program (no fallback)."""
        return self.agrees and not self.fallbacks


@dataclass
class Cell:
    """One model at one size, with eager's median ms and each entry point's result."""

    model: str
    batch: int
    seq: int | None
    decode: bool = False  # (a decode step: one token against a cache of ``seq``)
    eager_ms: float | None = None
    matrix_flops: float | None = None  # (eager's products, convolutions and attention)
    entries: dict[str, Entry] = field(default_factory=dict)
    error: str = ""

    def speedup(self, entry: str, over: str = "eager") -> float | None:
        """Eager's (or entry ``over``'s) time over ``entry``'s, where both agree with
        eager: above 1 is faster. (A program that fell back to its source is timed as the
        user gets it.)"""
        base = self.eager_ms if over == "eager" else (
            self.entries[over].ms if self.entries[over].agrees else None)
        ms = self.entries[entry].ms
        return base / ms if base and ms and self.entries[entry].agrees else None


def _outputs(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _difference(got: Any, want: Any) -> float:
    return max(relative_errors(g, w)[1] for g, w in zip(_outputs(got), _outputs(want),
                                                        strict=True))


def _error(exc: BaseException, width: int = 160) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _compiled(entry: str, model: torch.nn.Module, inputs: tuple, want: Any,
              result: Entry) -> Callable[[], Any]:
    """``model`` through ``entry``, called once (timed) and checked against ``want``."""
    uncached = torch._inductor.config.patch(fx_graph_cache=False, force_disable_caches=True)
    with capture() as seen, uncached:
        start = time.perf_counter()
        program = COMPILERS[entry](model, inputs)
        out = program(*inputs)
        result.first_s = time.perf_counter() - start
    result.difference = _difference(out, want)
    result.graphs = len(seen.reports)
    result.breaks = sum(b.count for b in seen.graph_breaks)
    result.fallbacks = [r.fallback_reason for r in seen.reports if r.fell_back]
    reports = [r.extraction for r in seen.reports]
    if entry == "export":
        reports = [program.meta["egraph_report"]]
        result.graphs = 1
        result.fallbacks = [r.validation.reason for r in reports if r.fell_back]
    for report in reports:
        result.used.update(report.used)
    return lambda: program(*inputs)


def run_cell(name: str, batch: int, seq: int | None, entries: Sequence[str], rounds: int,
             tiny: bool = False, decode: bool = False) -> Cell:
    """Build ``name`` at ``batch`` and ``seq`` (``decode``: its decode step against a
    cache of ``seq`` tokens), compile it through every entry point, then time eager and
    each in ``rounds`` interleaved rounds (under ``torch.no_grad``); the models and
    programs are freed before it returns.

    >>> cell = run_cell("bert", 1, 16, ["egraph"], rounds=1, tiny=True)
    >>> cell.entries["egraph"].ok, cell.entries["egraph"].graphs >= 1, cell.eager_ms > 0
    (True, True, True)
    """
    cell = Cell(name, batch, seq, decode)
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            case = (real_size.decode_step(name, batch, seq or real_size.CACHED, tiny) if decode
                    else real_size.build(name, batch, seq or 0, tiny))
            _time_cell(cell, case, entries, rounds)
        except Exception as exc:  # noqa: BLE001 - a row of the table
            cell.error = _error(exc)
    torch._dynamo.reset()
    gc.collect()
    return cell


def _time_cell(cell: Cell, case: Case, entries: Sequence[str], rounds: int) -> None:
    model, inputs = case.model, case.inputs
    with FlopCounterMode(display=False) as counted:
        want = model(*inputs)
    cell.matrix_flops = float(counted.get_total_flops())
    timed: dict[str, Callable[[], Any]] = {"eager": lambda: model(*inputs)}
    for entry in entries:
        result = cell.entries[entry] = Entry()
        try:
            timed[entry] = _compiled(entry, model, inputs, want, result)
        except Exception as exc:  # noqa: BLE001 - a row of the table
            result.error = _error(exc)
    ms = interleaved_ms(timed, rounds)
    cell.eager_ms = ms.get("eager")
    for entry, result in cell.entries.items():
        result.ms = ms.get(entry)


def warm_up(entries: Sequence[str]) -> None:
    """Compile a small module through every entry point once: the imports and the
    one-time set-up of dynamo, Inductor and the pipeline are then paid before any cell."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    inputs = (torch.randn(2, 8),)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in entries:
            torch._dynamo.reset()
            COMPILERS[entry](model, inputs)(*inputs)
    torch._dynamo.reset()


# --- tables ----------------------------------------------------------------------------

def _geomean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def _size(cell: Cell) -> str:
    if cell.decode:
        return f"{cell.batch} x 1 + {cell.seq} cached"
    return f"{cell.batch} x {cell.seq}" if cell.seq else f"{cell.batch}"


def _timed(cell: Cell, entry: str) -> str:
    result = cell.entries.get(entry)
    if result is None:
        return ""
    if result.error or result.ms is None or not cell.eager_ms:
        return "error" if result.error else "-"
    notes = ("" if result.agrees else ", differs") + (", fell back" if result.fallbacks else "")
    return f"{result.ms:.1f} ({cell.eager_ms / result.ms:.2f}x{notes})"


def speed_table(cells: Sequence[Cell], entries: Sequence[str]) -> str:
    """Median ms per cell: eager's, and each entry point's with its speedup over eager,
    marked where its outputs differ from eager's or a graph fell back to its source
    (``error`` where it raised)."""
    rows = [{"model": c.model, "batch x seq": _size(c),
             "eager ms": f"{c.eager_ms:.1f}" if c.eager_ms else c.error or "-",
             **{TITLES[e]: _timed(c, e) for e in entries}} for c in cells]
    return markdown_table(rows, ["model", "batch x seq", "eager ms",
                                 *(TITLES[e] for e in entries)])


def _groups(cells: Sequence[Cell]) -> dict[tuple[int, int | None], list[Cell]]:
    """The cells of each batch size and sequence length, the fixed-size models in every
    sequence length of their batch (the geometric means' corpora)."""
    sizes = {(c.batch, c.seq) for c in cells if c.seq}
    sizes |= {(c.batch, None) for c in cells if all(b != c.batch for b, _ in sizes)}
    return {(b, s): [c for c in cells if c.batch == b and c.seq in (s, None)]
            for b, s in sorted(sizes, key=lambda size: (size[0], size[1] or 0))}


def geomean_table(cells: Sequence[Cell], entries: Sequence[str]) -> str:
    """Per batch size and sequence length: each entry point's geometric-mean speedup over
    eager and, for ours, over Inductor, over the cells where every entry point's outputs
    agree with eager's."""
    versus = [e for e in AGAINST_INDUCTOR if e in entries] if "inductor" in entries else []
    columns = ["batch x seq", "models", *(TITLES[e] for e in entries),
               *(f"{TITLES[e]} / Inductor" for e in versus)]
    rows = []
    for (batch, seq), group in _groups(cells).items():
        ok = [c for c in group if c.eager_ms and all(c.speedup(e) for e in entries)]
        label = _size(group[0]) if all(c.decode for c in group) else (
            f"{batch} x {seq}" if seq else f"{batch}")
        row: dict[str, object] = {"batch x seq": label,
                                  "models": f"{len(ok)}/{len(group)}"}
        for e in entries:
            mean = _geomean([c.speedup(e) for c in ok])
            row[TITLES[e]] = f"{mean:.2f}x" if mean else "-"
        for e in versus:
            mean = _geomean([c.speedup(e, over="inductor") for c in ok])
            row[f"{TITLES[e]} / Inductor"] = f"{mean:.2f}x" if mean else "-"
        rows.append(row)
    return markdown_table(rows, columns)


MATRIX_KINDS = frozenset(RATE_KINDS.values()) - {"attention"}
"""The calibration's curves of products and convolutions (the kinds of
``extractors.hardware.RATE_KINDS`` but attention's; ``kind:rows``, their few-rows
curves)."""


def matrix_peak(hardware: Hardware) -> float:
    """The fastest a product or a convolution ran in ``hardware``'s calibration (any
    kernel, any size), in FLOP/s; its nominal matrix peak where that is higher (a profile
    without curves).

    >>> from extractors.hardware import HARDWARE
    >>> matrix_peak(HARDWARE["cpu"]) == HARDWARE["cpu"].matrix_fp32
    True
    """
    measured = [rate for kind, curve in hardware.rates
                if kind.split(":")[0] in MATRIX_KINDS for _, rate in curve]
    return max([hardware.matrix_fp32, *measured])


def limit_table(cells: Sequence[Cell], entries: Sequence[str], peak: float) -> str:
    """The physical limit per cell: the model's matrix FLOPs (products, convolutions and
    attention, counted by ``torch.utils.flop_counter`` over eager's forward) over eager's
    and each entry point's time, as a fraction of ``peak`` (:func:`matrix_peak`)."""
    def reached(cell: Cell, ms: float | None, agrees: bool = True) -> str:
        return f"{cell.matrix_flops / (ms / 1e3) / peak:.0%}" if (
            ms and cell.matrix_flops and agrees) else "-"
    rows = [{"model": c.model, "batch x seq": _size(c),
             "GFLOP": f"{(c.matrix_flops or 0) / 1e9:.1f}",
             "eager": reached(c, c.eager_ms),
             **{TITLES[e]: reached(c, c.entries[e].ms, c.entries[e].agrees)
                for e in entries if e in c.entries}} for c in cells]
    return markdown_table(rows, ["model", "batch x seq", "GFLOP", "eager",
                                 *(TITLES[e] for e in entries)])


def first_call_table(cells: Sequence[Cell], entries: Sequence[str]) -> str:
    """The first call's seconds per cell and entry point (compile included), and their
    geometric mean over the cells where its outputs agree with eager's."""
    def seconds(result: Entry | None) -> str:
        return f"{result.first_s:.1f}" if result and result.first_s is not None else "-"
    rows = [{"model": c.model, "batch x seq": _size(c),
             **{TITLES[e]: seconds(c.entries.get(e)) for e in entries}} for c in cells]
    means = {TITLES[e]: _geomean([c.entries[e].first_s for c in cells if e in c.entries
                                  and c.entries[e].agrees]) for e in entries}
    rows.append({"model": "geomean", "batch x seq": "",
                 **{k: f"{v:.1f}" if v else "-" for k, v in means.items()}})
    return markdown_table(rows, ["model", "batch x seq", *(TITLES[e] for e in entries)])


def checks_section(cells: Sequence[Cell], entries: Sequence[str]) -> str:
    """Per cell and entry point: the normwise difference from eager, the graphs the egraph
    backends compiled, dynamo's graph breaks, the rewrites the emitted programs use, and
    each error or fallback with its reason."""
    lines = []
    for c in cells:
        if c.error:
            lines.append(f"- {c.model} {_size(c)}: build failed: {c.error}")
        for e in entries:
            r = c.entries.get(e)
            if r is None:
                continue
            if r.error:
                lines.append(f"- {c.model} {_size(c)} {e}: {r.error}")
                continue
            status = "ok" if r.ok else "FAILED"
            used = ", ".join(f"{rule} x{n}" for rule, n in sorted(r.used.items())) or "none"
            lines.append(f"- {c.model} {_size(c)} {e}: {status}, difference "
                         f"{r.difference:.1e}, {r.graphs} graphs, {r.breaks} breaks"
                         + (f", rewrites used: {used}" if r.graphs else "")
                         + "".join(f"; fell back: {f}" for f in r.fallbacks))
    return "\n".join(lines)


def _about(args: argparse.Namespace, total: float) -> str:
    import diffusers
    import transformers

    size = "tiny configs (one layer a stage, hidden 16-64)" if args.tiny else (
        "their published configs")
    step = (" Each cell is a decode step (`--decode`): one new token per sequence against "
            "a key-value cache a prefill of seeded tokens left, the `transformers` "
            "`DynamicCache` built from its tensors in the step; outputs are the logits and "
            "the updated keys and values." if args.decode else "")
    return (
        f"The real-size corpus (benchmarks/real_size.py: {', '.join(real_size.MODELS)}) "
        f"built from {size} with random weights, `transformers` "
        f"{transformers.__version__}, `diffusers` {diffusers.__version__}, in eval mode "
        f"under `torch.no_grad`.{step} Run times are medians of "
        f"{args.rounds} interleaved rounds after a warm-up round, with {args.threads} "
        f"torch threads; `x`: eager's time over the entry point's (above 1 is faster). An "
        "entry point whose outputs differ from eager's by more than "
        f"{CLOSE:g} normwise is marked `differs` and left out of the geometric means; one "
        "that kept a graph's source (validation refused our program) is marked `fell back` "
        "and timed as it runs. First "
        "calls are cold for Inductor (its caches off) and include dynamo, aot_autograd, "
        f"our pipeline and Inductor's code generation. The run took {total:.0f} s.\n\n")


def _sizes(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, from: {', '.join(real_size.MODELS)} "
                        "(all of them by default)")
    parser.add_argument("--entries", default=",".join(DEFAULT_ENTRIES),
                        help=f"comma-separated, from: {', '.join(ENTRIES)}")
    parser.add_argument("--batch", default="1", help="batch sizes, comma-separated "
                        f"(the corpus's: {','.join(map(str, real_size.BATCHES))})")
    parser.add_argument("--seq", default=None, help="sequence lengths, comma-separated "
                        f"(the corpus's: {','.join(map(str, real_size.SEQUENCES))}; 128 by "
                        f"default), or with --decode the cached lengths ({real_size.CACHED})")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per median")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--decode", action="store_true",
                        help="a decode step against a key-value cache, for the models in "
                        f"{', '.join(real_size.DECODERS)} (all of them by default)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny configs (a check of the script, not a measurement)")
    add_out_option(parser, "speed")
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    parser = _parser()
    args = parser.parse_args(argv)
    models = args.models or ",".join(real_size.DECODERS if args.decode else real_size.MODELS)
    names = [n for n in models.split(",") if n]
    entries = [e for e in args.entries.split(",") if e]
    unknown = ([n for n in names if n not in (real_size.DECODERS if args.decode
                                              else real_size.MODELS)]
               + [e for e in entries if e not in COMPILERS])
    if unknown:
        parser.error(f"unknown model or entry point: {', '.join(unknown)}"
                     + (f" (a decode step is of {', '.join(real_size.DECODERS)})"
                        if args.decode else ""))
    torch.set_num_threads(args.threads)
    # every cell compiles the same classes' forwards through each entry point: dynamo keeps
    # one cache per code object, and past its limit it would run the rest uncompiled
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    import transformers

    transformers.logging.set_verbosity_error()
    start = time.perf_counter()
    warm_up(entries)
    cells = []
    for name in names:
        seqs = (_sizes(args.seq or str(real_size.CACHED if args.decode else 128))
                if real_size.REAL_SIZE[name].takes_seq else [None])
        for batch in _sizes(args.batch):
            for seq in seqs:
                cell = run_cell(name, batch, seq, entries, args.rounds, args.tiny, args.decode)
                cells.append(cell)
                print(f"{name:<16} {_size(cell):<10} eager {cell.eager_ms or 0:8.1f} ms  "
                      + "  ".join(f"{e} {_timed(cell, e)}" for e in entries), flush=True)
    total = time.perf_counter() - start
    peak = matrix_peak(default_cost((torch.zeros(1),)).hardware)  # (the cells run on the CPU)
    document = (_about(args, total)
                + "Median ms (speedup over eager):\n\n" + speed_table(cells, entries)
                + "\n\nGeometric means of the speedups:\n\n" + geomean_table(cells, entries)
                + f"\n\nThe physical limit: each program's matrix FLOPs a second, as a "
                f"fraction of the fastest this machine's calibration ran a product or a "
                f"convolution ({peak / 1e9:.0f} GFLOP/s):\n\n"
                + limit_table(cells, entries, peak)
                + "\n\nFirst call, seconds:\n\n" + first_call_table(cells, entries)
                + "\n\nChecks:\n\n" + checks_section(cells, entries) + "\n")
    print()
    print(document)
    return write_results("speed", "Inference at real sizes: eager, ours, Inductor", document,
                         out=args.out, argv=None if argv is None else [__file__, *argv])


if __name__ == "__main__":
    main()
