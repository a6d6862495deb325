"""End-to-end: `accelify convert --target runtime` output runs where accelerate is not installed
(accelerate blocked in the subprocess, tests/e2e.py's ``without_accelerate``) and trains exactly
as the original script: the docs golden (through the stubs of tests/stubs/, its losses logged by the
stub model) and a runnable fixture with gradient accumulation (its printed losses and learning
rates, and the wrapper's trace: optimizer steps, final weights, data drawn)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from e2e import FIXTURES, STUBS, assert_ok, run_single_process, run_traced, script_env, without_accelerate  # noqa: E402

from accelify.core.pipeline import Options, convert_source  # noqa: E402
from test_e2e_scripts import RUNNABLE  # noqa: E402

# An import of accelerate (not accelify.runtime) left in the converted code.
_ACCELERATE_IMPORT = re.compile(r"^\s*(from\s+accelerate\b|import\s+accelerate\b)", re.MULTILINE)


def _convert(path: Path) -> str:
    result = convert_source(path.read_text(encoding="utf-8"), str(path), Options(target="runtime"))
    assert result.error is None, result.error
    assert "from accelify.runtime import Accelerator" in result.output
    assert not _ACCELERATE_IMPORT.search(result.output), result.output
    again = convert_source(result.output, str(path), Options(target="runtime"))
    assert again.error is None and again.output == result.output  # idempotent
    return result.output


def _losses(log: Path) -> list[str]:
    path = Path(f"{log}.0")
    assert path.exists(), f"no loss log ({path}): the stub model never trained"
    return path.read_text(encoding="utf-8").splitlines()


def test_docs_golden_runs_without_accelerate(tmp_path):
    golden = FIXTURES / "docs" / "before.py"
    original = tmp_path / "before.py"
    converted = tmp_path / "after.py"
    original.write_text(golden.read_text(encoding="utf-8"), encoding="utf-8")
    converted.write_text(_convert(golden), encoding="utf-8")
    losses = {}
    for script in (original, converted):
        log = tmp_path / f"{script.stem}.loss"
        env = script_env(
            PYTHONPATH=os.pathsep.join(p for p in (str(STUBS), os.environ.get("PYTHONPATH", "")) if p),
            ACCELIFY_LOSS_LOG=str(log),
        )
        proc = run_single_process(script, without_accelerate(env, tmp_path / "blocker"))
        assert_ok(proc)
        losses[script.stem] = _losses(log)
    assert len(losses["before"]) == 9  # 3 epochs of 3 batches
    assert losses["after"] == losses["before"]


def test_accumulation_runs_without_accelerate(tmp_path):
    """Hand-written accumulation (4 batches, a step at the end of each epoch, a per-step
    scheduler) against `Accelerator(gradient_accumulation_steps=4)` + `accumulate()`: the same
    losses, learning rates, optimizer steps, final weights and batches."""
    fixture = FIXTURES / "accumulation_runnable" / "before.py"
    converted = _convert(fixture)
    assert "gradient_accumulation_steps=" in converted and "accelerator.accumulate(" in converted
    for stem, text in (("before", fixture.read_text(encoding="utf-8")), ("after", converted)):
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "train.py").write_text(text, encoding="utf-8")
    env = without_accelerate(script_env(), tmp_path / "blocker")
    before = run_traced(tmp_path / "before" / "train.py", env)
    after = run_traced(tmp_path / "after" / "train.py", env)
    lines = before.stdout[0].splitlines()
    assert sum("loss" in line for line in lines) == 3 * 14 and sum("lr" in line for line in lines) == 3
    assert after.stdout[0] == before.stdout[0]
    original, runtime = before.traces[0], after.traces[0]
    assert original["optimizers"] and original["optimizers"][0]["steps"] == 3 * 4
    assert runtime["optimizers"] == original["optimizers"]
    assert runtime["loaders"] == original["loaders"]


def test_runtime_output_under_a_launcher_asks_for_accelerate(tmp_path):
    """Started as one of several processes without accelerate, the converted script stops at
    once with the error that says how to install it (no training on two copies of the data)."""
    fixture = FIXTURES / "accumulation_runnable" / "before.py"
    script = tmp_path / "train.py"
    script.write_text(_convert(fixture), encoding="utf-8")
    env = without_accelerate(script_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0"), tmp_path / "blocker")
    proc = run_single_process(script, env)
    assert proc.returncode != 0
    assert "RuntimeError" in proc.stderr and "pip install accelerate" in proc.stderr
    assert "loss" not in proc.stdout


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_every_runnable_fixture_trains_the_same_under_the_stand_in_and_under_accelerate(tmp_path, name):
    """`--target runtime` output of every runnable fixture, once with accelify.runtime's single-
    process stand-in (accelerate not installed: blocked in the forked run) and once on
    accelerate: the same printed losses and evaluations, optimizer steps, final weights,
    batches and saves as each other and as the original."""
    fixture = FIXTURES / name / "before.py"
    converted = _convert(fixture)
    runs = {}
    for stem, text, block in (("before", fixture.read_text(encoding="utf-8"), ()), ("stand_in", converted, ("accelerate",)),
                              ("accelerate", converted, ())):
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "train.py").write_text(text, encoding="utf-8")
        runs[stem] = run_traced(tmp_path / stem / "train.py", script_env(), block=block)
    assert runs["stand_in"].traces[0]["accelerate_imported"] is False
    assert runs["accelerate"].traces[0]["accelerate_imported"] is True
    original = runs["before"]
    assert "loss" in original.stdout[0].lower() and original.traces[0]["optimizers"]
    for stem in ("stand_in", "accelerate"):
        assert runs[stem].stdout[0] == original.stdout[0], stem
        for key in ("optimizers", "loaders", "saves"):
            assert runs[stem].traces[0][key] == original.traces[0][key], (stem, key)
