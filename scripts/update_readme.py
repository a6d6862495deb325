"""Regenerate README.md's codemod list from the codemods' own docstrings.

    python scripts/update_readme.py

tests/test_codemods.py fails when README.md and the docstrings disagree.
"""

from __future__ import annotations

import re
from pathlib import Path

from accelify.codemods import by_code

START, END = "<!-- codemods:start -->", "<!-- codemods:end -->"
FSTART, FEND = "<!-- findings:start -->", "<!-- findings:end -->"


def render() -> str:
    parts = []
    for code, cls in by_code().items():
        before, after = cls.example()
        parts.append(
            f"### {code} `{cls.NAME}`\n\n{cls.DESCRIPTION}\n\n"
            f"Before:\n\n```python\n{before}```\n\nAfter:\n\n```python\n{after}```\n"
        )
    return "\n".join(parts)


def render_findings() -> str:
    from accelify.output.findings import FINDINGS

    rows = "".join(f"| {code} | {text} |\n" for code, text in FINDINGS.items())
    return "| code | when, and what accelify does |\n|---|---|\n" + rows


def main() -> None:
    path = Path(__file__).resolve().parent.parent / "README.md"
    text = path.read_text()
    text = re.sub(f"{START}.*?{END}", lambda _: f"{START}\n{render()}{END}", text, flags=re.S)
    text = re.sub(f"{FSTART}.*?{FEND}", lambda _: f"{FSTART}\n{render_findings()}{FEND}", text, flags=re.S)
    path.write_text(text)


if __name__ == "__main__":
    main()
