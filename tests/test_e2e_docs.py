"""End-to-end: the docs golden (HF "fine-tune in native PyTorch" tutorial) runs
before and after conversion, on one process and on two CPU processes.

`fixtures/docs/before.py` imports `datasets` and `transformers`, which are not
installed (and must not be downloaded). `tests/stubs/` holds tiny deterministic
stand-ins for both (see tests/stubs/README.md); the scripts run unchanged as
subprocesses with `PYTHONPATH=tests/stubs`. The stub model logs every training
loss to `$ACCELIFY_LOSS_LOG.<rank>`, which is what these tests compare.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, STUBS, assert_ok, run_single_process, run_two_cpu_processes, script_env  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402

GOLDEN = FIXTURES / "docs" / "before.py"

# Must match tests/stubs/datasets (SPLIT_SIZES["train"]) and the golden script.
TRAIN_ROWS = 24
BATCH_SIZE = 8
NUM_EPOCHS = 3

# The 2-process run goes through tests/e2e_wrapper.py, which tears the gloo process
# group down cleanly after the script (see the comment there).


@pytest.fixture(scope="module")
def converted_text() -> str:
    result = convert_source(GOLDEN.read_text(encoding="utf-8"), str(GOLDEN))
    assert result.error is None, result.error
    return result.output


def _script_env(loss_log: Path, **extra: str) -> dict[str, str]:
    return script_env(
        PYTHONPATH=os.pathsep.join(p for p in (str(STUBS), os.environ.get("PYTHONPATH", "")) if p),
        ACCELIFY_LOSS_LOG=str(loss_log),
        **extra,
    )


def _losses(loss_log: Path, rank: int) -> list[float]:
    path = Path(f"{loss_log}.{rank}")
    assert path.exists(), f"no loss log for rank {rank} ({path}): the stub model never trained"
    values = []
    for line in path.read_text(encoding="utf-8").splitlines():
        tag, _, loss = line.partition(" loss=")
        assert tag == f"rank={rank}", line
        values.append(float(loss))
    return values


def test_docs_golden_converted_trains_identically(converted_text, tmp_path):
    assert "from accelerate import Accelerator" in converted_text
    assert "accelerator.prepare(" in converted_text
    assert "accelerator.backward(loss)" in converted_text

    original = tmp_path / "before.py"
    converted = tmp_path / "after.py"
    original.write_text(GOLDEN.read_text(encoding="utf-8"), encoding="utf-8")
    converted.write_text(converted_text, encoding="utf-8")

    runs = {}
    for script in (original, converted):
        log = tmp_path / f"{script.stem}.loss"
        assert_ok(run_single_process(script, _script_env(log)))
        assert not list(tmp_path.glob(f"{log.name}.[1-9]*")), "single-process run logged a non-zero rank"
        runs[script.stem] = _losses(log, 0)

    expected_steps = NUM_EPOCHS * math.ceil(TRAIN_ROWS / BATCH_SIZE)
    assert len(runs["before"]) == expected_steps, runs["before"]
    # Same seeded data order and init, one process: Accelerate must not change
    # a single step (no extra/missing steps, no loss scaling, same batches).
    assert runs["after"] == runs["before"]


def test_docs_golden_converted_shards_across_two_cpu_processes(converted_text, tmp_path):
    converted = tmp_path / "after.py"
    converted.write_text(converted_text, encoding="utf-8")
    log = tmp_path / "ddp.loss"

    proc, _ = run_two_cpu_processes(converted, _script_env(log))
    assert_ok(proc)

    # prepare() shards the train loader: each rank gets half the batches
    # (3 batches -> 2 per rank, accelerate pads the odd one out by wrapping).
    steps_per_rank = NUM_EPOCHS * math.ceil(math.ceil(TRAIN_ROWS / BATCH_SIZE) / 2)
    rank0, rank1 = _losses(log, 0), _losses(log, 1)
    assert len(rank0) == steps_per_rank, rank0
    assert len(rank1) == steps_per_rank, rank1
    assert not Path(f"{log}.2").exists()
    # Identical initial weights on both ranks, so differing first-step losses
    # mean the ranks were fed different shards rather than the same batch.
    assert rank0[0] != rank1[0], (rank0, rank1)
