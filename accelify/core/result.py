"""What a conversion takes and gives back: plain records, no LibCST (the command line and its
worker processes import this without paying for the parser)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from accelify.queries.records import Change, Finding


@dataclass(frozen=True)
class Options:
    line_length: int = 88
    #: Run only the codemods with these codes (``None``: all of them).
    select: Optional[frozenset[str]] = None
    #: Report only the findings with these codes (``None``: all of them).
    findings: Optional[frozenset[str]] = None
    #: Where the imports accelify adds come from: ``"accelerate"`` (``from accelerate import
    #: Accelerator``) or ``"runtime"`` (``from accelify.runtime import Accelerator``, which runs
    #: where accelerate is not installed).
    target: str = "accelerate"
    #: Notebooks: wrap the training code in ``def training_function():`` started by
    #: ``notebook_launcher(training_function, num_processes=N)`` (``None``: not done).
    notebook_launcher: Optional[int] = None


#: ``Options.target`` values.
TARGETS = ("accelerate", "runtime")


@dataclass
class Result:
    path: str
    source: str
    output: str
    changes: list[Change] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: Optional[str] = None
    #: A notebook: (cell number, old source, new source) of each rewritten cell, for the diff
    #: (``source``/``output`` are the whole notebook's text); None for a Python file.
    cells: Optional[list[tuple[int, str, str]]] = None
    #: What else was done, or not done, for the user to read (``--notebook-launcher``).
    notes: list[str] = field(default_factory=list)
    #: The modules beside the script converted with it, as one program (:mod:`accelify.core.unit`):
    #: each its own result (its text read as UTF-8, its newlines kept), changed or with findings.
    companions: list["Result"] = field(default_factory=list)
    #: The modules of the project this script needs as they are (real paths): it uses one whose prints another
    #: script's conversion makes ``PartialState().print`` before its ``Accelerator(cpu=...)``
    #: (:mod:`accelify.core.module_output`); a run that would change one for another script leaves both.
    kept: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.error is None and self.output != self.source


def brief(exc: BaseException, limit: int = 200) -> str:
    """``repr(exc)`` on one line, cut to ``limit`` characters: an exception can carry a whole
    syntax tree (``KeyError(Module(...))``), and a message is read on one line."""
    text = " ".join(repr(exc).split())
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


_IGNORE = re.compile(r"#\s*accelify:\s*ignore(?:\[([A-Z0-9, ]+)\])?")


def suppress(findings: list[Finding], source: str, selected: Optional[frozenset[str]]) -> list[Finding]:
    """Drop findings not selected, or silenced by ``# accelify: ignore[ACC104]`` on their line."""
    lines = source.splitlines()
    kept = []
    for finding in findings:
        if selected is not None and finding.code not in selected:
            continue
        line = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        match = _IGNORE.search(line)
        if match and (match.group(1) is None or finding.code in {c.strip() for c in match.group(1).split(",")}):
            continue
        kept.append(finding)
    return kept
