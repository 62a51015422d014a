"""The index of the latest results: every results document the benchmarks wrote under a
folder, each with its title, its link and its run's stamp, newest first, in one page.

    .venv/bin/python benchmarks/publish.py [FOLDER] [--out FOLDER/index.md]

FOLDER is ``benchmarks/results`` by default (or where ``gpu_rows.sh``'s tables were unpacked);
the page is written, with its own stamp, to ``FOLDER/index.md``. A document without a
stamp (written by hand, or before the benchmarks stamped their results) is listed after
the others as such.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import RESULTS, RunStamp, write_results  # noqa: E402

INDEX = "index.md"


def title_of(text: str) -> str:
    """A document's title: its first Markdown heading (empty where it has none).

    >>> title_of("intro\\n# Operator merging\\n## Table")
    'Operator merging'
    """
    return next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "")


def latest(folder: Path, index_page: Path) -> list[tuple[Path, str, RunStamp | None]]:
    """Every Markdown document under ``folder`` but ``index_page``, with its title and
    stamp: the stamped ones newest first, then those without a stamp by path."""
    found = []
    for path in sorted(folder.rglob("*.md")):
        if path.resolve() != index_page.resolve():
            text = path.read_text()
            found.append((path, title_of(text) or path.stem, RunStamp.from_markdown(text)))
    stamped = sorted((f for f in found if f[2]), key=lambda f: f[2].date, reverse=True)
    return stamped + [f for f in found if f[2] is None]


def index(folder: Path, out: Path) -> str:
    """The index page's body for the documents under ``folder``, its links relative to
    ``out``'s folder."""
    sections = []
    for path, title, stamp in latest(folder, out):
        link = os.path.relpath(path, out.parent)
        sections.append(f"## [{title}]({link})\n\n"
                        + (stamp.markdown() if stamp else "- not stamped"))
    return "\n\n".join(sections) or "No results documents yet."


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the index page (default: FOLDER/{INDEX})")
    args = parser.parse_args(argv)
    out = args.out or args.folder / INDEX
    return write_results(
        "index", "The latest results", index(args.folder, out), out=out,
        argv=None if argv is None else [__file__, *argv])


if __name__ == "__main__":
    main()
