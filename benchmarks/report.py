"""What a results file says about its run, and the one way the benchmarks write one.

Every benchmark script writes its results document through :func:`write_results`: its
title, the :class:`RunStamp` of the run (the command as typed, the UTC date and time, the
machine, the software versions, the git commit and whether the tree was dirty), then the
script's tables and the links to its plots. The document lands in
``benchmarks/results/<name>.md`` (git-ignored: each run writes its own) unless the
script's ``--out`` chooses another path; ``benchmarks/publish.py`` gathers the newest
documents into ``benchmarks/results/index.md``.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as folder:  # doctest: +ELLIPSIS
...     path = write_results("demo", "A demo", "| x |\\n|---|\\n| 1 |",
...                          out=Path(folder) / "demo.md")
...     print(path.read_text())
written to .../demo.md
# A demo
<BLANKLINE>
- command: `...`
- date: ... UTC
- machine: ... cores, ... torch thread...
- software: python ..., torch ..., triton ...
- commit: ...
<BLANKLINE>
| x |
|---|
| 1 |
<BLANKLINE>
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
"""Where the results documents land by default (git-ignored)."""

DATE_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
"""How a stamp writes its date and time (UTC), which sorts as text."""


@dataclasses.dataclass(frozen=True)
class RunStamp:
    """What a results document says about the run that wrote it, one Markdown line each.

    >>> stamp = RunStamp.now(["benchmarks/engine.py", "--repeat", "1"])
    >>> stamp.command.endswith("benchmarks/engine.py --repeat 1")
    True
    >>> RunStamp.from_markdown(stamp.markdown()) == stamp
    True
    """

    command: str
    """The command line as typed: the interpreter, the script and its arguments."""
    date: str
    """When the results were written, in UTC (:data:`DATE_FORMAT`)."""
    machine: str
    """The CPU's model, its cores and torch's threads; the GPU's name first on CUDA runs."""
    software: str
    """The versions of python, torch and triton."""
    commit: str
    """The checkout's git commit and whether its tracked files had uncommitted changes."""

    @classmethod
    def now(cls, argv: Sequence[str] | None = None, device: str = "cpu") -> RunStamp:
        """The stamp of this run at this moment: ``argv`` is the script and its arguments
        (``sys.argv`` by default); ``device`` names where the run computed (``"cuda"``
        names the GPU)."""
        return cls(command=typed_command(argv),
                   date=datetime.datetime.now(datetime.UTC).strftime(DATE_FORMAT),
                   machine=machine(device), software=software(), commit=commit())

    def markdown(self) -> str:
        """The stamp as Markdown list items, ``- field: value``, the command quoted."""
        return "\n".join(f"- {field}: {_quoted(field, getattr(self, field))}"
                         for field in _FIELDS)

    @classmethod
    def from_markdown(cls, text: str) -> RunStamp | None:
        """The stamp a document written by :func:`write_results` holds (None where it holds
        none: a file written before the stamp, or by hand)."""
        found = {}
        for line in text.splitlines():
            field, sep, value = line.removeprefix("- ").partition(": ")
            if line.startswith("- ") and sep and field in _FIELDS and field not in found:
                found[field] = value.strip("`") if field == "command" else value
        return cls(**found) if len(found) == len(_FIELDS) else None


_FIELDS = tuple(field.name for field in dataclasses.fields(RunStamp))


def _quoted(field: str, value: str) -> str:
    return f"`{value}`" if field == "command" else value


def typed_command(argv: Sequence[str] | None = None) -> str:
    """The command line of this run as typed from the checkout: the interpreter, then
    ``argv`` (the script and its arguments; ``sys.argv`` by default), the interpreter and
    the script relative to the checkout where they are inside it.

    >>> typed_command([str(ROOT / "benchmarks" / "fuzz.py"), "--n", "10"]).split()[1:]
    ['benchmarks/fuzz.py', '--n', '10']
    """
    argv = sys.argv if argv is None else argv
    python = Path(sys.executable)
    words = [str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else python.name]
    for i, word in enumerate(argv):
        path = Path(word)
        inside = i == 0 and path.is_absolute() and path.is_relative_to(ROOT)
        words.append(str(path.relative_to(ROOT)) if inside else str(word))
    return shlex.join(words)


def cpu_model() -> str:
    """The CPU's model name as the operating system gives it (``platform``'s guess where
    ``/proc/cpuinfo`` is missing)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> str:
    """The machine of this run: the CPU's model, the cores this process may use and
    torch's intra-op threads, after the GPU's name where ``device`` is ``"cuda"``.

    >>> "torch thread" in machine()
    True
    """
    import torch  # (here, not above: the engine's benchmark runs without torch loaded, whose
    # objects would slow the garbage collector under the e-graph by about 5%)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch.get_num_threads()
    cpu = (f"{cpu_model()}, {cores} cores, {threads} torch thread"
           f"{'' if threads == 1 else 's'}")
    if device == "cuda" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} GPU; host {cpu}"
    return cpu


def software() -> str:
    """The versions of python, torch and triton (``not installed`` where it is not)."""
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = "not installed"
    return (f"python {platform.python_version()}, torch {metadata.version('torch')}, "
            f"triton {triton}")


def commit() -> str:
    """The checkout's commit and whether the tracked files had uncommitted changes
    (``unknown`` outside a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head} ({'dirty' if dirty else 'clean'} tree)"


def results_path(name: str) -> Path:
    """Where the results document ``name`` lands by default.

    >>> results_path("fuzz").relative_to(ROOT).as_posix()
    'benchmarks/results/fuzz.md'
    """
    return RESULTS / f"{name}.md"


def add_out_option(parser: argparse.ArgumentParser, name: str) -> None:
    """Give ``parser`` the ``--out`` option every benchmark has: another path for the
    results document ``name`` (None: :func:`results_path`)."""
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the results document (default: "
                             f"{results_path(name).relative_to(ROOT)})")


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str],
                   float_format: str = ".3g") -> str:
    """A Markdown table of ``rows`` with ``columns`` (the keys, as titles), floats in
    ``float_format``.

    >>> print(markdown_table([{"formula": "log1p", "bits": 5.625}], ["formula", "bits"]))
    | formula | bits |
    |---|---|
    | log1p | 5.62 |
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format(r[c], float_format) if isinstance(r[c], float)
                                else str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(name: str, title: str, body: str, *, out: str | Path | None = None,
                  plots: Sequence[Path] = (), device: str = "cpu",
                  argv: Sequence[str] | None = None) -> Path:
    """Write a results document: the ``title``, the run's :class:`RunStamp`, the ``body``
    (the script's tables, in Markdown), then a link to each of ``plots``; to ``out``, or
    to :func:`results_path` of ``name``. Prints where it went and returns the path.
    ``device`` and ``argv`` are :meth:`RunStamp.now`'s."""
    path = Path(out) if out is not None else results_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    links = "".join(f"\n![{plot.stem}]({os.path.relpath(plot, path.parent)})\n"
                    for plot in plots)
    stamp = RunStamp.now(argv, device)
    path.write_text(f"# {title}\n\n{stamp.markdown()}\n\n{body.strip()}\n{links}")
    print(f"written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


class Transcript(io.TextIOBase):
    """What a block of code prints, printed as before and kept: the results of the
    benchmarks whose tables are printed text.

    >>> with Transcript() as printed:
    ...     print("| a | b |")
    | a | b |
    >>> print(printed.block())
    ```text
    | a | b |
    ```
    """

    def __init__(self) -> None:
        self._kept = io.StringIO()
        self._stream = sys.stdout
        self._redirect = contextlib.redirect_stdout(self)

    def __enter__(self) -> Transcript:
        self._stream = sys.stdout
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._redirect.__exit__(*exc)

    def write(self, text: str) -> int:
        self._stream.write(text)
        return self._kept.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def text(self) -> str:
        """Everything printed so far."""
        return self._kept.getvalue()

    def block(self) -> str:
        """:meth:`text` as a Markdown code block (its fixed-width tables kept aligned)."""
        return f"```text\n{self.text().strip(chr(10))}\n```"
