"""Records produced by a conversion: the changes made and the findings left for a human."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Optional, TextIO


_ONE_LINE = re.compile(r"\s*\n\s*")


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


def report_json(results, diffs: dict, summary: str, stream: TextIO) -> None:
    """One JSON document for tools: every file's status, changes, findings and diff."""
    import json

    files = []
    for result in results:
        status = "error" if result.error else ("changed" if result.changed else "unchanged")
        files.append(
            {
                "path": result.path,
                "status": status,
                "error": result.error,
                "changes": [c.to_dict() for c in result.changes],
                "findings": [f.to_dict() for f in result.findings],
                "diff": diffs.get(result.path, ""),
                "notes": list(getattr(result, "notes", [])),
            }
        )
    json.dump({"files": files, "summary": summary}, stream, indent=2)
    stream.write("\n")


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def _error_position(path: str, error: str) -> tuple[Optional[int], Optional[int], str]:
    """``PATH:LINE:COL: message`` (or ``PATH:LINE: ...``, ``PATH: ...``) split into its line, its
    column and the message without the path, which an annotation names on its own."""
    if not error.startswith(path + ":"):
        return None, None, error
    rest = error[len(path) + 1:]
    if rest.startswith("cell "):  # a notebook's cell: its lines are no lines of the .ipynb file
        return None, None, rest
    found = re.match(r"(\d+)(?::(\d+))?: ", rest)
    if found is None:
        return None, None, rest.lstrip()
    column = found.group(2)
    return int(found.group(1)), int(column) if column else None, rest[found.end():]


def report_github(results, stream: TextIO) -> None:
    """GitHub Actions workflow commands: an annotation per finding, an error per unreadable file."""
    for result in results:
        if result.error:
            line, column, message = _error_position(result.path, result.error)
            position = _position(line, column, ",line={},col={}", ",line={}")
            stream.write(f"::error file={_escape(result.path, True)}{position},title=accelify::{_escape(message)}\n")
        for f in result.findings:
            message = f.message + (f" Suggestion: {f.suggestion}" if f.suggestion else "")
            position = _position(f.line, f.column, ",line={},col={}", ",line={}")
            if f.cell is not None:  # a line of a cell is no line of the .ipynb file: named in the message
                message = f"cell {f.cell}{_position(f.line, f.column, ', line {}, column {}', ', line {}')}: {message}"
                position = ""
            stream.write(
                f"::warning file={_escape(f.path, True)}{position},"
                f"title={_escape('accelify ' + f.code, True)}::{_escape(message)}\n"
            )
