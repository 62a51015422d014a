"""FPCore's surface syntax: s-expressions read with the position of every atom and list.

FPCore (FPBench's exchange format) is written in s-expressions: ``( ... )`` or ``[ ... ]``
lists, symbols, numbers, ``"strings"`` and ``:keywords``; ``;`` starts a comment that runs
to the end of the line, ``#|...|#`` a block comment and ``#;`` comments out the next
datum. :func:`read` turns a text into :class:`Atom` and :class:`List` values that know
where they stand, so every later error can name the line and column of the problem.

>>> forms = read('(FPCore (x) :name "one" (+ x 1))')
>>> forms[0].items[3].text, forms[0].items[4].items[0].position
('"one"', (1, 26))
"""

from __future__ import annotations

from dataclasses import dataclass

from frontends.fpcore.errors import MalformedFPCore, Position

__all__ = ["Atom", "List", "read"]


@dataclass(frozen=True)
class Atom:
    """A symbol, number, string or keyword, as written, and where it starts."""

    text: str
    position: Position

    @property
    def is_string(self) -> bool:
        """Whether it is a ``"string"``."""
        return self.text.startswith('"')

    @property
    def string(self) -> str:
        """The string's contents (escapes resolved).

        >>> Atom('"a \\\\"b\\\\""', (1, 1)).string
        'a "b"'
        """
        body = self.text[1:-1]
        out, escaped = [], False
        for ch in body:
            if escaped or ch != "\\":
                out.append(ch)
                escaped = False
            else:
                escaped = True
        return "".join(out)


@dataclass(frozen=True)
class List:
    """A parenthesised list and where its opening bracket stands."""

    items: tuple[Atom | List, ...]
    position: Position


_CLOSE = {"(": ")", "[": "]"}


def read(text: str) -> list[Atom | List]:
    """Every top-level datum of ``text``, in order; :class:`MalformedFPCore` (with the
    position) for unbalanced brackets or an unterminated string.

    >>> read("(a [b 1.5]) ; note")[0].items[1].items[1].text
    '1.5'
    >>> read("(a (b)")
    Traceback (most recent call last):
    ...
    frontends.fpcore.errors.MalformedFPCore: FPCore, line 1:1: '(' is never closed
    """
    reader = _Reader(text)
    forms = []
    while True:
        datum = reader.datum()
        if datum is None:
            return forms
        if datum is not _COMMENTED:
            forms.append(datum)


_COMMENTED = Atom("", (0, 0))  # what a datum commented out with #; reads as


class _Reader:
    def __init__(self, text: str):
        self.text, self.at, self.line, self.column = text, 0, 1, 1

    def _advance(self, count: int = 1) -> None:
        for ch in self.text[self.at:self.at + count]:
            if ch == "\n":
                self.line, self.column = self.line + 1, 1
            else:
                self.column += 1
        self.at += count

    def _skip_blank(self) -> None:
        text = self.text
        while self.at < len(text):
            ch = text[self.at]
            if ch.isspace():
                self._advance()
            elif ch == ";":
                end = text.find("\n", self.at)
                self._advance((len(text) if end < 0 else end) - self.at)
            elif text.startswith("#|", self.at):
                start = (self.line, self.column)
                end = text.find("|#", self.at)
                if end < 0:
                    raise MalformedFPCore("'#|' comment is never closed", position=start)
                self._advance(end + 2 - self.at)
            else:
                return

    def datum(self) -> Atom | List | None:
        """The next datum, :data:`_COMMENTED` for one after ``#;``, None at the end."""
        self._skip_blank()
        if self.at >= len(self.text):
            return None
        start = (self.line, self.column)
        ch = self.text[self.at]
        if self.text.startswith("#;", self.at):
            self._advance(2)
            if self.datum() is None:
                raise MalformedFPCore("'#;' comments out nothing", position=start)
            return _COMMENTED
        if ch in _CLOSE:
            self._advance()
            items = []
            while True:
                self._skip_blank()
                if self.at >= len(self.text):
                    raise MalformedFPCore(f"{ch!r} is never closed", position=start)
                if self.text[self.at] in ")]":
                    if self.text[self.at] != _CLOSE[ch]:
                        raise MalformedFPCore(
                            f"{ch!r} at {start[0]}:{start[1]} is closed by "
                            f"{self.text[self.at]!r}", position=(self.line, self.column))
                    self._advance()
                    return List(tuple(items), start)
                item = self.datum()
                if item is not _COMMENTED:
                    items.append(item)
        if ch in ")]":
            raise MalformedFPCore(f"unexpected {ch!r}: nothing is open", position=start)
        if ch == '"':
            end, escaped = self.at + 1, False
            while end < len(self.text) and (escaped or self.text[end] != '"'):
                escaped = not escaped and self.text[end] == "\\"
                end += 1
            if end >= len(self.text):
                raise MalformedFPCore("string is never closed", position=start)
            atom = Atom(self.text[self.at:end + 1], start)
            self._advance(end + 1 - self.at)
            return atom
        end = self.at
        while end < len(self.text) and not (self.text[end].isspace()
                                            or self.text[end] in "()[];\""):
            end += 1
        atom = Atom(self.text[self.at:end], start)
        self._advance(end - self.at)
        return atom
