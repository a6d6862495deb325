"""Every before/after pair in fixtures/, every no-op fixture, and a second pass over each."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, assert_stable, convert

PAIRS = sorted(p.parent.name for p in FIXTURES.glob("*/before.py"))
NOOPS = sorted(p.name for p in (FIXTURES / "noop").glob("*.py"))


@pytest.mark.parametrize("name", PAIRS)
def test_fixture_converts_to_golden(name: str, file_regression) -> None:
    before = (FIXTURES / name / "before.py").read_bytes().decode()
    result = convert(before, f"{name}.py")
    assert result.changed
    golden = FIXTURES / name / "after.py"
    file_regression.check(result.output, fullpath=golden, newline="")
    # pytest-regressions compares lines: a lost CRLF or final newline would not show there.
    assert golden.read_bytes() == result.output.encode()
    # findings.txt, when present, lists the finding codes the conversion must report; else none.
    expected = FIXTURES / name / "findings.txt"
    codes = expected.read_text().split() if expected.exists() else []
    assert [f.code for f in result.findings] == codes


@pytest.mark.parametrize("name", PAIRS)
def test_fixture_is_idempotent(name: str) -> None:
    assert_stable((FIXTURES / name / "after.py").read_bytes().decode())


@pytest.mark.parametrize("name", NOOPS)
def test_noop_fixture_is_byte_identical(name: str) -> None:
    source = (FIXTURES / "noop" / name).read_bytes().decode()
    result = convert(source, name)
    assert result.output == source
    assert not result.changes
    # A first line `# expect-findings: ACC102 ...` names the findings the file must produce.
    first = source.splitlines()[0]
    expected = first.split(":", 1)[1].split() if first.startswith("# expect-findings:") else []
    assert [f.code for f in result.findings] == expected
    for finding in result.findings:
        assert finding.path == name and finding.line > 1 and finding.suggestion


def test_fixture_sets_are_not_empty() -> None:
    assert len(PAIRS) >= 10 and len(NOOPS) >= 5


@pytest.mark.parametrize("name", PAIRS)
def test_the_accelerator_exists_before_it_is_used(name: str) -> None:
    """In each block that creates ``accelerator = Accelerator(...)``, no statement before it reads
    ``accelerator`` (a NameError when the script runs)."""
    import ast

    tree = ast.parse((FIXTURES / name / "after.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        creation = next((i for i, stmt in enumerate(body) if isinstance(stmt, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "accelerator" for t in stmt.targets)
                         and isinstance(stmt.value, ast.Call) and getattr(stmt.value.func, "id", "") == "Accelerator"),
                        None)
        if creation is None:
            continue
        for stmt in body[:creation]:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                continue
            reads = [n for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == "accelerator"]
            assert not reads, f"line {stmt.lineno} reads `accelerator` before line {body[creation].lineno} creates it"
