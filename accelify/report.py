"""Records produced by a conversion: the changes made and the findings left for a human."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Change:
    """One rewrite a codemod applied. ``line`` is a line of the *original* file."""

    line: int
    code: str
    message: str

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

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        text = f"{self.path}:{self.line}:{self.column}: {self.code} {self.message}"
        if self.suggestion:
            text += f" Suggestion: {self.suggestion}"
        return text
