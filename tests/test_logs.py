"""Logging under the ``egraph`` logger and progress bars on a terminal."""

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

import egraph.logs
from compiler.compile import make_backend
from egraph import EGraph, rewrite
from egraph.logs import progress

ROOT = Path(__file__).resolve().parents[1]


class FakeTerminal(io.StringIO):
    """What tqdm writes to, standing for a terminal."""

    def isatty(self) -> bool:
        return True


def _commuting():
    eg = EGraph()
    eg.add("(+ a (+ b c))", root=True)
    return eg, [rewrite("comm", "(+ ?x ?y)", "(+ ?y ?x)"),
                rewrite("assoc", "(+ ?x (+ ?y ?z))", "(+ (+ ?x ?y) ?z)")]


def test_nothing_is_printed_by_default(capsys):
    eg, rules = _commuting()
    eg.saturate(rules)
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("egraph").handlers)
    assert capsys.readouterr().err == ""


def test_debug_lines_per_iteration_and_rule(caplog):
    eg, rules = _commuting()
    with caplog.at_level(logging.DEBUG, logger="egraph"):
        eg.saturate(rules)
    lines = [r.getMessage() for r in caplog.records if r.name == "egraph.run"]
    iterations = [m for m in lines if m.startswith("iteration ")]
    assert len(iterations) == len(eg.report.iterations)
    assert any(m.strip().startswith("rule assoc:") for m in lines)
    assert lines[-1].startswith("saturation stopped (saturated)")


def test_one_info_line_per_compiled_graph(caplog):
    backend = make_backend(rules=None)
    f = torch.compile(lambda x: torch.log(1 + torch.exp(x)), backend=backend)
    with caplog.at_level(logging.INFO, logger="egraph"):
        f(torch.randn(8))
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.name for r in infos] == ["egraph.compiler"] * len(backend.reports) == [
        "egraph.compiler"]
    line = infos[0].getMessage()
    assert line.startswith("graph 0: nodes ")
    for part in ("rewrites ", "cost ", "times ingest", "saturate", "validation passed (float64)"):
        assert part in line
    assert "softplus" in line  # the rewrite the emitted program uses


def test_environment_variable_turns_logs_on_for_a_run():
    code = ("import torch, compiler.compile as c\n"
            "torch.compile(lambda x: x * 2, backend=c.make_backend(rules=()))(torch.ones(2))\n")
    env = {**os.environ, "EGRAPH_LOGS": "info"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[egraph.compiler] graph 0: nodes" in out.stderr
    quiet = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "EGRAPH_LOGS"})
    assert "[egraph" not in quiet.stderr


def test_set_logs_rejects_unknown_levels():
    try:
        egraph.logs.set_logs("loud")
    except ValueError as err:
        assert "info, debug" in str(err)
    else:
        raise AssertionError("an unknown level was accepted")


def test_progress_shows_on_a_terminal_only():
    terminal = FakeTerminal()
    assert sum(progress(range(5), desc="soak", file=terminal, delay=0)) == 10
    assert "soak:" in terminal.getvalue() and "/5 [" in terminal.getvalue()  # a drawn bar
    pipe = io.StringIO()
    assert sum(progress(range(5), desc="soak", file=pipe, delay=0)) == 10
    assert pipe.getvalue() == ""


def test_saturation_progress_on_a_terminal(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(egraph.logs, "PROGRESS_DELAY", 0.0)
    eg, rules = _commuting()
    eg.saturate(rules, iter_limit=30)
    assert "saturate" in terminal.getvalue() and "e-nodes" in terminal.getvalue()


def test_ilp_progress_on_a_terminal(monkeypatch):
    from egraph.extract.graph import Graph
    from egraph.extract.greedy import greedy_tree
    from egraph.extract.ilp import solve_ilp

    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(egraph.logs, "PROGRESS_DELAY", 0.0)
    # two ways to make r: p(f x, g x) shares x (cost 8 as a DAG), q(s y) pays for y
    g = Graph.load({"nodes": {
        "x": {"op": "x", "eclass": "x", "cost": 5}, "y": {"op": "y", "eclass": "y", "cost": 9},
        "fx": {"op": "f", "children": ["x"], "eclass": "b"},
        "gx": {"op": "g", "children": ["x"], "eclass": "c"},
        "sy": {"op": "s", "children": ["y"], "eclass": "d"},
        "p": {"op": "p", "children": ["fx", "gx"], "eclass": "r"},
        "q": {"op": "q", "children": ["sy"], "eclass": "r"}},
        "root_eclasses": ["r"]})
    start, order = greedy_tree(g)
    pick, optimal = solve_ilp(g, start, order, time_limit=10)
    assert optimal and g.node_ids[pick[g.roots[0]]] == "p"
    assert "ILP" in terminal.getvalue()
