from __future__ import annotations

import os
from pathlib import Path

import pytest

from accelify.core.pipeline import Options, Result, convert_source

ROOT = Path(__file__).resolve().parent.parent
# What the codemods would refuse in a file an analysis check refused is asked on a plan they have not
# seen in a converted file: in the suite, a failure there is raised, not reported as no refusal.
os.environ.setdefault("ACCELIFY_STRICT", "1")
FIXTURES = ROOT / "fixtures"


def convert(source: str, path: str = "script.py", **options) -> Result:
    result = convert_source(source, path, Options(**options))
    assert result.error is None, result.error
    return result


def assert_stable(output: str) -> None:
    """black's assert_stable: converting converted code changes nothing."""
    again = convert_source(output, "again.py")
    assert again.error is None
    assert again.output == output


@pytest.fixture
def root() -> Path:
    return ROOT


def drain(leader: int) -> bytes:
    """Everything written to a pseudo-terminal whose other end is closed."""
    import os

    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
