"""Command line: the demo, the engine demo, and optimising a user's module.

    python -m compiler                       # the PyTorch demo on the bundled naive transformer
    python -m compiler math                  # the engine alone on egg's math suite
    python -m compiler optimize FILE.py:Class --shape 2,16,64 [--rules all] [--save out.pt]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from compiler.timing import median_seconds
from egraph.moved import moved_names

__getattr__ = moved_names(__name__, {"interleaved_ms": "compiler.timing"})


def optimise_and_report(model, inputs, rules: str = "all", title: str = "model") -> object:
    """Optimise ``model`` with the rule families ``rules`` for the fastest program on the
    inputs' device (:func:`compiler.compile.default_cost`); print what happened."""
    import torch

    from compiler.compile import default_cost
    from egraph import EGraph
    from egraph.rules import load_rules

    cost = default_cost(inputs)
    print(f"== {title}: from_fx -> saturate({rules}) -> extract({cost!r})")
    start = time.perf_counter()
    eg = EGraph.from_fx(model, inputs)
    eg.saturate(load_rules(*rules.split(",")), iter_limit=8, node_limit=100_000,
                time_limit=30.0)
    opt = eg.extract(cost)
    elapsed = time.perf_counter() - start
    report = opt.meta["egraph_report"]
    saturation = eg.report
    print(f"saturation: {saturation.stop_reason} after {len(saturation.iterations)} iterations,"
          f" {saturation.nodes} e-nodes in {saturation.classes} classes")
    print(report)
    fused = sorted({n.target.__name__ for n in opt.graph.nodes if n.op == "call_function"
                    and getattr(n.target, "__name__", "") in (
                        "softmax", "log_softmax", "layer_norm", "rms_norm", "linear", "gelu",
                        "silu", "scaled_dot_product_attention", "logsumexp", "log1p",
                        "expm1", "softplus", "sigmoid")})
    print(f"fused/stable ops in the result: {', '.join(fused) or 'none'}")
    with torch.no_grad():
        out, ref = opt(*inputs), model(*inputs)
        diff = (out - ref).abs().max().item() if isinstance(out, torch.Tensor) else None
        eager = median_seconds(lambda: model(*inputs))
        fast = median_seconds(lambda: opt(*inputs))
    if diff is not None:
        print(f"max |optimised - eager| = {diff:.3g}")
    print(f"pipeline {elapsed:.2f} s; run time eager {eager * 1e3:.2f} ms, optimised "
          f"{fast * 1e3:.2f} ms ({eager / fast:.2f}x)")
    return opt


def demo() -> None:
    """The PyTorch demo on the bundled naive transformer block."""
    from egraph.examples.zoo import build

    model, inputs = build("naive_transformer")
    opt = optimise_and_report(model, inputs, "all", "naive transformer block (CPU)")
    print("\nthe optimised program:")
    print(opt.code)


def math_demo() -> None:
    """The engine alone: egg's math suite, an explanation, a report."""
    from egraph import parse
    from egraph.examples.math import CASES, MathCost, simplify

    print("egg's math suite on the pure-Python engine")
    print(f"{'case':<22}{'proved':>8}{'time s':>9}{'e-nodes':>9}{'classes':>9}  stop")
    total = 0.0
    for case in CASES.values():
        start = time.perf_counter()
        eg = case.run()
        elapsed = time.perf_counter() - start
        total += elapsed
        proved = all(eg.equiv(eg.roots[0], g) for g in case.goals)
        print(f"{case.name:<22}{'yes' if proved else 'NO':>8}{elapsed:>9.4f}"
              f"{eg.hashcons_size:>9}{eg.num_classes:>9}  {eg.report.stop_reason}")
    print(f"total {total:.3f} s\n")
    for text in ["(+ x (+ x (+ x x)))", "(* (+ x 3) (+ x 1))", "(- (* 2 y) (* (- 3 1) y))"]:
        term, cost = simplify(text)
        print(f"simplify {text}  ->  {term}  (size {cost})")
    case = CASES["math_diff_simple2"]
    eg = case.run(explanations=True)
    print(f"\nwhy {case.start} = {case.goals[0]}:")
    print(eg.explain(parse(case.start), case.goals[0]))
    term, cost = eg.extract(MathCost(), root=eg.roots[0])
    print(f"extracted with egg's MathCostFn: {term} (cost {cost})")


def _load_class(spec: str):
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise SystemExit(f"expected path/to/file.py:ClassName, got {spec!r}")
    file = Path(path)
    if not file.exists():
        raise SystemExit(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise SystemExit(f"{path} defines no {name!r}")
    return getattr(module, name)


def optimise_cli(args) -> None:
    """Optimise a user's module class, constructed without arguments, on random inputs."""
    import torch

    cls = _load_class(args.target)
    model = cls().eval()
    dtype = getattr(torch, args.dtype)
    shapes = [tuple(int(d) for d in s.split(",")) for s in args.shape]
    inputs = tuple(torch.randn(s, dtype=dtype) for s in shapes)
    model = model.to(dtype)
    opt = optimise_and_report(model, inputs, args.rules, cls.__name__)
    print(opt.code)
    if args.save:
        torch.save(opt, args.save)
        print(f"saved the optimised GraphModule to {args.save}")


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``python -m compiler --help``)."""
    parser = argparse.ArgumentParser(prog="python -m compiler", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="the PyTorch demo (default)")
    sub.add_parser("math", help="the engine demo on egg's math suite")
    opt = sub.add_parser("optimize", help="optimise FILE.py:ClassName on random inputs")
    opt.add_argument("target", help="path/to/file.py:ClassName (constructed without arguments)")
    opt.add_argument("--shape", action="append", required=True,
                     help="an input shape such as 2,16,64 (repeat for several inputs)")
    opt.add_argument("--rules", default="all", help="rule families, comma-separated")
    opt.add_argument("--dtype", default="float32")
    opt.add_argument("--save", default=None, help="torch.save the result to this path")
    args = parser.parse_args(argv)
    if args.command == "math":
        math_demo()
    elif args.command == "optimize":
        optimise_cli(args)
    else:
        demo()

