"""The records of a conversion, at the bottom so that every layer may make them and a worker
process may read them without importing LibCST: a codemod's ``Change``, an analysis's
``RawFinding`` (line and column, no path yet) and the ``Finding`` the pipeline reports."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass(frozen=True)
class RawFinding:
    """A finding before the pipeline attaches a path: line/column in the analysed text."""

    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""


@dataclass(frozen=True, order=True)
class Change:
    """One rewrite a codemod applied. ``line`` is a line of the *original* file (for a statement
    inserted, that of the statement it follows, or of the one it precedes at the top of a block)."""

    line: int
    code: str
    message: str
    #: In a notebook: the cell (1-based, over all its cells) ``line`` is a line of; else None.
    cell: Optional[int] = field(default=None, compare=False)

    def to_dict(self) -> dict:
        return asdict(self)


_ONE_LINE = re.compile(r"\s*\n\s*")


@dataclass(frozen=True, order=True)
class Finding:
    """A construct accelify recognised but did not rewrite, with what to do instead."""

    path: str
    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""
    #: In a notebook: the cell (1-based, over all its cells) ``line`` is a line of; else None.
    cell: Optional[int] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # one line each: code quoted from a construct that spans lines (`dist.all_reduce(\n  x)`)
        # would otherwise break the text, GitHub and grep-able outputs
        for name in ("message", "suggestion"):
            object.__setattr__(self, name, _ONE_LINE.sub(" ", getattr(self, name)))

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        where = f":cell {self.cell}" if self.cell is not None else ""
        text = f"{self.path}{where}{_position(self.line, self.column, ':{}:{}', ':{}')}: {self.code} {self.message}"
        if self.suggestion:
            text += f" Suggestion: {self.suggestion}"
        return text


def _known(number) -> bool:
    """A line or column that says something: 1-based, so 0 (or None) means unknown."""
    return isinstance(number, int) and number > 0


def _position(line, column, both: str, line_only: str) -> str:
    """``both`` or ``line_only`` formatted with what is known of a position; nothing if no line is."""
    if not _known(line):
        return ""
    return both.format(line, column) if _known(column) else line_only.format(line)
