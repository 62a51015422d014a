"""The documentation runs: every ``python`` block of README.md, CONTRIBUTING.md and
docs/**/*.md is executed, and the names and paths the pages mention exist.

The blocks of one page run in order in one namespace (a later block uses what an earlier
one defined), from the repository root; each block is its own test, named after its page
and number (``docs/guide.md:3``), and a traceback points at the page's own lines. Fences:

- ```` ```python ````: executed;
- ```` ```python gpu ````: executed where CUDA is available, else skipped ("needs a GPU");
- ```` ```python excerpt=PATH ````: an excerpt of the file PATH (relative to the repository),
  checked to be there line for line rather than run (an op table entry, which running
  would declare a second time);
- ```` ```console ````, ```` ```bash ````, ```` ```text ````, ```` ```diff ````: shown, not run.

Where a block of a page fails, that block's test fails; the page's later blocks fail
naming it. Run under pytest-xdist, a worker that gets a later block first runs the page's
earlier blocks itself.
"""

from __future__ import annotations

import importlib
import linecache
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
KINDS = ("python", "console", "bash", "text", "diff")
"""The fence languages a page may use (see the module docstring)."""

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*(.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page (relative to the repository), its number among the
    page's ``python`` blocks (1-based; 0 for others), the line of its first code line, its
    language, flags and code."""

    page: str
    number: int
    line: int
    language: str
    flags: tuple[str, ...]
    code: str

    @property
    def gpu(self) -> bool:
        return "gpu" in self.flags

    @property
    def excerpt(self) -> str | None:
        return next((f.partition("=")[2] for f in self.flags if f.startswith("excerpt=")),
                    None)

    def __str__(self) -> str:
        return f"{self.page}:{self.number}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    page = path.relative_to(ROOT).as_posix()
    blocks, lines, number, i = [], path.read_text().splitlines(), 0, 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        i += 1
        if not opening or (opening.group(1)[0] == "`" and "`" in opening.group(2)):
            continue  # a backtick fence's info string holds no backtick (CommonMark)
        fence, (language, *flags) = opening.group(1), opening.group(2).split() or [""]
        start, body = i, []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if language == "python":
            number += 1
        blocks.append(Block(page, number if language == "python" else 0, start + 1,
                            language, tuple(flags), "\n".join(body) + "\n"))
    return blocks


BLOCKS = {path.relative_to(ROOT).as_posix(): fenced_blocks(path) for path in PAGES}
PYTHON = [b for blocks in BLOCKS.values() for b in blocks if b.language == "python"]


@dataclass
class _Page:
    """One page's namespace in this process, and what became of each block run in it."""

    namespace: dict = field(default_factory=dict)
    ran: int = 0  # the page's python blocks run so far, in order
    failed: Block | None = None


_PAGES: dict[str, _Page] = {}


def _skipped(block: Block) -> bool:
    return block.excerpt is not None or (block.gpu and not torch.cuda.is_available())


def _as_python(page: str) -> list[str]:
    """The page as Python: its ``python`` blocks at their own lines, every other line blank.
    Given to ``linecache`` under the page's name, it is the source that tracebacks show and
    that ``inspect`` reads (a rule's ``example_code`` is its lambda's text)."""
    lines = ["\n"] * len((ROOT / page).read_text().splitlines())
    for b in BLOCKS[page]:
        if b.language == "python" and b.excerpt is None:
            for i, line in enumerate(b.code.splitlines()):
                lines[b.line - 1 + i] = line + "\n"
    return lines


def _run(block: Block, page: _Page) -> None:
    lines = _as_python(block.page)
    linecache.cache[block.page] = (sum(map(len, lines)), None, lines, block.page)
    code = compile("\n" * (block.line - 1) + block.code, block.page, "exec")
    try:
        exec(code, page.namespace)  # noqa: S102 - running the docs is this test's purpose
    except BaseException:
        page.failed = block
        raise


def _run_through(block: Block) -> None:
    """Run ``block`` after the page's earlier blocks not yet run in this process."""
    page = _PAGES.setdefault(block.page, _Page({"__name__": "__docs__"}))
    order = [b for b in BLOCKS[block.page] if b.language == "python"]
    if page.ran >= block.number:  # run already, as an earlier block of a later test
        if page.failed is block:
            pytest.fail(f"{block} failed when a later block's test ran it first")
        return
    for earlier in order[page.ran:block.number]:
        if page.failed is not None:
            pytest.fail(f"{block} needs {page.failed}, which failed")
        page.ran += 1
        if _skipped(earlier):
            continue
        if earlier is block:
            _run(block, page)
        else:
            try:
                _run(earlier, page)
            except Exception:  # noqa: BLE001 - reported as the failure of the block that needs it
                pytest.fail(f"{block} needs {earlier}, which failed:\n"
                            f"{traceback.format_exc()}")


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_doc_block_runs(block: Block, monkeypatch):
    monkeypatch.chdir(ROOT)
    if block.excerpt is not None:
        source = [line.rstrip() for line in (ROOT / block.excerpt).read_text().splitlines()]
        lines = [line.rstrip() for line in block.code.splitlines()]
        assert any(source[i:i + len(lines)] == lines for i in range(len(source))), (
            f"{block} is not an excerpt of {block.excerpt} (line {block.line}): update it")
        return
    if block.gpu and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    _run_through(block)


def test_every_page_has_python_blocks_and_every_fence_a_known_language():
    for page, blocks in BLOCKS.items():
        for b in blocks:
            assert b.language in KINDS, (
                f"{page}, line {b.line}: a fence says {b.language or 'nothing'!r}; use one "
                f"of {', '.join(KINDS)} (python runs, the others are shown)")
            assert not set(b.flags) - {"gpu"} or b.excerpt, f"{page}:{b.line}: {b.flags}"
    for page in ("README.md", "docs/guide.md", "docs/extending.md"):
        assert any(b.language == "python" for b in BLOCKS[page]), page


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail to docs/"


MOVED = {"egraph/testing.py", "egraph/stability.py"}
"""Paths of the past that the guide's "where things moved" names."""

_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
_PATH = re.compile(r"`((?:egraph|frontends|extractors|backends|compiler|tests|benchmarks|"
                   r"scripts|docs|\.ci)/[\w./-]*|[\w-]+\.(?:md|toml))`")
_NAME = re.compile(r"`((?:egraph|frontends|extractors|backends|compiler)(?:\.\w+)+)[`(]")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", page.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_links_and_paths_the_pages_mention_exist():
    """Relative links inside the repository (and the headings they point at), and every
    `path/of/a/file` in backquotes (benchmarks/results/ is written by the benchmarks, so
    it need not exist)."""
    missing = []
    for page_path in PAGES:
        text = page_path.read_text()
        page = page_path.relative_to(ROOT).as_posix()
        for target, anchor in _LINK.findall(text):
            if "://" in target:
                continue
            resolved = (page_path.parent / target).resolve() if target else page_path
            if not resolved.is_relative_to(ROOT):
                continue
            if not resolved.exists():
                missing.append(f"{page}: link {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                missing.append(f"{page}: link {target}#{anchor} (no such heading)")
        for path in _PATH.findall(text):
            if (not path.startswith("benchmarks/results") and path not in MOVED
                    and not (ROOT / path).exists()):
                missing.append(f"{page}: path {path}")
    assert not missing, "\n".join(missing)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_dotted_names_the_pages_mention_exist():
    """Every `package.module.name` of ours in backquotes resolves
    (`compiler.compile.make_backend`: the module imports and has the name)."""
    missing = [f"{p.relative_to(ROOT)}: {name}" for p in PAGES
               for name in sorted(set(_NAME.findall(p.read_text()))) if not _resolves(name)]
    assert not missing, "\n".join(missing)
