"""The errors of the FPCore front end: text that is not FPCore, and FPCore outside the
language this front end covers. Both name the benchmark; a malformed one also the position.

>>> str(UnsupportedFPCore("loops ('while') are not supported", "Newton", (4, 2)))
"FPCore 'Newton', line 4:2: loops ('while') are not supported"
"""

from __future__ import annotations

__all__ = ["FPCoreError", "MalformedFPCore", "Position", "UnsupportedFPCore"]

Position = tuple[int, int]
"""A line and a column, both counted from 1."""


class FPCoreError(ValueError):
    """An FPCore benchmark this front end cannot turn into a program; the message names the
    benchmark, where it is known the position (line:column), and the problem."""

    def __init__(self, problem: str, benchmark: str | None = None,
                 position: Position | None = None):
        self.problem, self.position, self.benchmark = problem, position, benchmark
        super().__init__(self._message())

    def _message(self) -> str:
        where = [f"FPCore {self.benchmark!r}" if self.benchmark else "FPCore"]
        if self.position is not None:
            where.append(f"line {self.position[0]}:{self.position[1]}")
        return ", ".join(where) + f": {self.problem}"

    def named(self, benchmark: str) -> FPCoreError:
        """The same error naming ``benchmark``, when it named none yet.

        >>> str(MalformedFPCore("undefined variable 'y'", position=(2, 9)).named("f"))
        "FPCore 'f', line 2:9: undefined variable 'y'"
        """
        if self.benchmark is None:
            self.benchmark = benchmark
            self.args = (self._message(),)
        return self


class MalformedFPCore(FPCoreError):
    """Text that is not an FPCore program: unbalanced parentheses, an unknown operator, the
    wrong number of arguments, a variable used where it is not bound.

    >>> str(MalformedFPCore("unknown operator 'sqr'", "circle area", (3, 5)))
    "FPCore 'circle area', line 3:5: unknown operator 'sqr'"
    """


class UnsupportedFPCore(FPCoreError):
    """A well-formed FPCore program that uses a construct outside the language covered
    (loops, tensors, an operator torch or the op table lacks); the message says which."""
