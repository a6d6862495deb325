"""Unified diffs from the standard library's difflib, coloured with rich on a terminal."""

from __future__ import annotations

import difflib
import os
from typing import TextIO

_NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(old: str, new: str, path: str) -> str:
    """A diff ``git apply`` and ``patch -p1`` accept; empty when nothing changed."""
    if old == new:
        return ""
    label = header_path(path) if path != "<stdin>" else "stdin"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{label}", f"b/{label}", n=3
    )
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:  # the last line of a file without a final newline
            out.append(line + "\n" + _NO_NEWLINE)
    return "".join(out)


def header_path(path: str) -> str:
    """``path`` as a diff header names it after ``a/`` and ``b/``: normalised, as ``git diff`` names
    files (``./train.py`` and ``sub/../train.py`` are ``train.py``; ``git apply`` refuses ``./``
    and ``..`` in a path), with ``/`` between its parts. A path outside the current directory
    (absolute, or climbing out of it with ``..``) is its absolute path without the leading ``/``:
    ``git apply`` or ``patch -p1`` run from ``/`` applies it."""
    normal = os.path.normpath(path)
    if normal == os.pardir or normal.startswith(os.pardir + os.sep):
        normal = os.path.abspath(normal)
    if os.path.isabs(normal):
        normal = os.path.splitdrive(normal)[1].lstrip("/" + os.sep)
    return normal.replace(os.sep, "/")


def notebook_diff(cells: "list[tuple[int, str, str]]", path: str) -> str:
    """One unified diff per rewritten cell of a notebook, headed ``--- train.ipynb (cell 5)`` as
    nbdime names cells; not a diff of the JSON (whose lines are quoted strings)."""
    label = os.path.normpath(path) if path != "<stdin>" else "stdin"  # ./train.ipynb: train.ipynb
    out = []
    for number, old, new in cells:
        name = f"{label} (cell {number})"
        # A cell has no end of file: its last line is compared as a line (no "No newline" marks).
        old_lines = [line if line.endswith("\n") else line + "\n" for line in old.splitlines(keepends=True)]
        new_lines = [line if line.endswith("\n") else line + "\n" for line in new.splitlines(keepends=True)]
        out += difflib.unified_diff(old_lines, new_lines, name, name, n=3)
    return "".join(out)


_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"), ("\\", "dim"))


def print_diff(diff: str, stream: TextIO, color: bool) -> None:
    if not color:
        stream.write(diff)
        return
    from rich.console import Console  # only for colour: rich costs more than the rest of a plain run
    from rich.text import Text

    console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True, emoji=False)
    for line in diff.splitlines():
        style = next((s for prefix, s in _STYLES if line.startswith(prefix)), "")
        console.print(Text(line, style=style))
