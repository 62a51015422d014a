"""The packages are layered along the data flow, with no import cycle.

The engine (``egraph``) is at the bottom and torch-free; above it the front end
(``frontends``), the cost models (``extractors``), the emitters (``backends``) and, at the
top, the torch pipeline (``compiler``). Every import counts, including those inside
functions; the one exception is ``EGraph.from_fx``, which reaches up to the pipeline lazily.
No private name is imported from another module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("egraph", "frontends", "extractors", "backends", "compiler")
# The layers, bottom to top: a module may import only its own layer and those below.
LAYERS = {"egraph": 0, "frontends": 1, "extractors": 2, "backends": 3, "compiler": 4}
# The one upward import: the FX entry point of the engine builds the pipeline's e-graph.
FROM_FX = ("egraph.verbs", "compiler.fx")


def _modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the packages that ``name`` (a module or a name in one) denotes."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(modules: dict[str, Path]) -> dict[str, list[tuple[str, str, int]]]:
    """Each module's imports of the packages: (imported module, imported name, line).

    ``from a.b import c`` imports module ``a.b.c`` when that is a module, else the name
    ``c`` of ``a.b``. An edge goes to the module named, not to the packages above it (a
    package's ``__init__`` may re-export its modules' names).
    """
    graph: dict[str, list[tuple[str, str, int]]] = {}
    for module, path in modules.items():
        edges = []
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        # Imports for type checkers only never run.
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [(alias.name, "") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [(f"{base}.{alias.name}", alias.name) for alias in node.names]
                targets = [(t if t in modules else base, n) for t, n in targets]
            else:
                continue
            for target, name in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != module:
                    edges.append((resolved, name, node.lineno))
        graph[module] = edges
    return graph


def _components(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = {stack.pop()}
            while v not in members:
                members.add(stack.pop())
            if len(members) > 1:
                out.append(frozenset(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes, or None."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if colour.get(succ) == 1:
                return stack[stack.index(succ) :] + [succ]
            if succ not in colour and (found := visit(succ)):
                return found
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if node not in colour and (found := visit(node)):
            return found
    return None


def _module_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        module: {target for target, _, _ in edges if (module, target) != FROM_FX}
        for module, edges in imports(modules).items()
    }


def test_no_cycle_among_modules():
    """Not even inside a package: the engine's facade methods import the modules that
    work on an e-graph lazily, and those never import ``egraph.egraph`` back (``ENode``
    lives in ``egraph.enode``); rule families are plain lists; the Triton planner, code
    generator and launcher share ``backends.triton.spec``."""
    assert [sorted(c) for c in _components(_module_graph())] == []


def test_no_cycle_among_packages():
    packages: dict[str, set[str]] = {}
    for module, targets in _module_graph().items():
        top = module.split(".")[0]
        packages.setdefault(top, set()).update(t.split(".")[0] for t in targets)
    assert _cycle({p: ts - {p} for p, ts in packages.items()}) is None


def test_layers_point_down():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in _module_graph().items()
        for target in targets
        if LAYERS[target.split(".")[0]] > LAYERS[module.split(".")[0]]
    )
    assert upward == []
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_no_private_name_imported_across_modules():
    modules = _modules()
    private = sorted(
        f"{module}:{line} imports {name} from {target}"
        for module, edges in imports(modules).items()
        for target, name, line in edges
        if name.startswith("_") and not name.startswith("__")
    )
    assert private == []


def test_import_egraph_imports_no_torch():
    code = "import sys, egraph, egraph.rules; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


def test_the_graph_sees_imports_inside_functions():
    # A lazy import is still an edge: the from_fx entry is found, then excused.
    edges = imports(_modules())[FROM_FX[0]]
    assert any(target == FROM_FX[1] for target, _, _ in edges)
