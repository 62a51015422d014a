"""FPCore in: FPBench's benchmarks (Herbie's suite among them) as torch programs.

``parse(text)`` and ``load(path)`` return the programs of an FPCore text or file, in file
order (:class:`Program`: ``.name``, ``.arguments``, ``.precision``, ``.pre``, ``.module()``,
``.reference(*values)``); a benchmark that cannot be one raises :class:`MalformedFPCore`
(not FPCore: the benchmark, the position and the problem) or :class:`UnsupportedFPCore`
(outside the language covered: the construct and the benchmark). ``read(text)`` and
``read_file(path)`` give every benchmark's program or error, so a suite can be run whole.
``write_module`` writes a rewritten program back as FPCore.

>>> from frontends import fpcore
>>> (p,) = fpcore.parse('(FPCore (x) :name "expm1" :pre (< -1 x 1) (- (exp x) 1))')
>>> p.name, p.arguments, p.precision, p.pre.ranges
('expm1', ('x',), 'binary64', {'x': (-1.0, 1.0)})
>>> try:
...     fpcore.parse("(FPCore (x) (while (< x 1) ([x 0 (+ x 1)]) x))")
... except fpcore.UnsupportedFPCore as err:
...     print(err)
FPCore '#1', line 1:14: loops ('while') are not supported: a tensor program has no loop
"""

from __future__ import annotations

from pathlib import Path

from frontends.fpcore.errors import FPCoreError, MalformedFPCore, UnsupportedFPCore
from frontends.fpcore.precondition import Precondition
from frontends.fpcore.program import Program
from frontends.fpcore.reader import read_programs
from frontends.fpcore.writer import UnwritableModule, write_module, write_program

__all__ = ["FPCoreError", "MalformedFPCore", "Precondition", "Program", "UnsupportedFPCore",
           "UnwritableModule", "load", "parse", "read", "read_file", "write_module",
           "write_program"]


def read(text: str) -> list[Program | FPCoreError]:
    """Every benchmark of ``text``, in order: its program or the error that says why it is
    none. Text that is not s-expressions (an unbalanced parenthesis) raises
    :class:`MalformedFPCore`.

    >>> [type(p).__name__ for p in read("(FPCore (x) x) (FPCore (x) (f x))")]
    ['Program', 'MalformedFPCore']
    """
    return read_programs(text)


def parse(text: str) -> list[Program]:
    """The programs of ``text``, in order; the first benchmark that is not one raises."""
    programs = read(text)
    for p in programs:
        if isinstance(p, FPCoreError):
            raise p
    return programs


def read_file(path: str | Path) -> list[Program | FPCoreError]:
    """:func:`read` of a file; errors name the file too."""
    try:
        return read(Path(path).read_text())
    except MalformedFPCore as err:
        raise err.named(str(path)) from None


def load(path: str | Path) -> list[Program]:
    """:func:`parse` of a file."""
    return parse(Path(path).read_text())
