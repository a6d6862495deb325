"""Each codemod alone on its own docstring example; codes and metadata."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelify.codemods import CODEMODS, by_code
from conftest import ROOT, convert


@pytest.mark.parametrize("code", sorted(by_code()))
def test_docstring_example_alone(code: str) -> None:
    before, after = by_code()[code].example()
    assert before.strip() and after.strip() and before != after
    result = convert(before, "example.py", select=frozenset({code}))
    assert result.output == after
    assert {c.code for c in result.changes} == {code}


def test_codes_are_unique_and_stable() -> None:
    codes = [cls.CODE for cls in CODEMODS]
    assert len(set(codes)) == len(codes)
    assert all(re.fullmatch(r"ACC0\d\d", c) for c in codes)
    names = [cls.NAME for cls in CODEMODS]
    assert len(set(names)) == len(names)


def test_one_codemod_per_file() -> None:
    files = {cls.__module__.rsplit(".", 1)[-1] for cls in CODEMODS}
    assert len(files) == len(CODEMODS)
    on_disk = {p.stem for p in (ROOT / "codemods").glob("*.py")} - {"__init__", "base"}
    assert on_disk == files


def test_select_runs_only_the_selected_codemods() -> None:
    before, _ = by_code()["ACC005"].example()
    result = convert(before, select=frozenset({"ACC001"}))
    assert "loss.backward()" in result.output and "accelerator = Accelerator()" in result.output


def _update_docs():
    """scripts/update_docs.py as a module (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts" / "update_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_reference_is_what_update_docs_writes_from_the_code() -> None:
    """docs/rules/ACC0xx.md, the index in docs/codemods.md and the table in docs/findings.md are
    the docstrings and FINDINGS as `accelify rules` shows them: edit one, run the script."""
    update_docs = _update_docs()
    pages = update_docs.pages()
    assert len([p for p in pages if p.parent == Path("docs", "rules")]) == len(by_code())
    for path, text in pages.items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, f"{path} is stale: python scripts/update_docs.py"
    assert update_docs.stale() == [], "pages of codemods that no longer exist: python scripts/update_docs.py"


def test_docs_list_every_codemod_with_its_example() -> None:
    index = (ROOT / "docs" / "codemods.md").read_text(encoding="utf-8")
    for code, cls in by_code().items():
        page = (ROOT / "docs" / "rules" / f"{code}.md").read_text(encoding="utf-8")
        before, after = cls.example()
        assert f"\n# {code} `{cls.NAME}`\n" in page
        assert f"```python\n{before}```" in page and f"```python\n{after}```" in page
        assert f"| [{code}](rules/{code}.md) | `{cls.NAME}` |" in index


def test_docs_list_every_finding_and_every_emitted_code_is_listed() -> None:
    from accelify.output.findings import FINDINGS

    listed = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    for code, text in FINDINGS.items():
        assert f"| {code} | {text} |" in listed
    emitted = set()
    for folder in ("accelify", "codemods"):
        for path in (ROOT / folder).rglob("*.py"):
            emitted |= set(re.findall(r'"(ACC1\d\d)"', path.read_text()))
    assert emitted == set(FINDINGS)


def test_readme_commands_are_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[test]" && python -m pytest'
    assert test_command in readme and test_command in ci
    assert "pip install . && accelify convert examples/train.py" in readme
    assert (ROOT / "examples" / "train.py").exists()
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 123 |"):
        assert code in readme


def test_runtime_package_imports_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys, accelify.runtime; assert 'torch' not in sys.modules; print(accelify.runtime.__doc__ is not None)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr
