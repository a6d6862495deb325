"""End-to-end: runnable fixture scripts (synthetic data, one printed line per
training step containing "loss") train the same before and after conversion
on one process, and the converted script shards its data across two CPU
processes under torch.distributed.run.

Only fixtures whose before.py is a self-contained runnable training script are
listed; e.g. fixtures/device_other_uses is a conversion fixture, not runnable.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, assert_ok, run_single_process, run_two_cpu_processes, script_env  # noqa: E402

from accelify.pipeline import convert_source  # noqa: E402

RUNNABLE = [
    "mnist_functions", "class_trainer", "gan_two_optimizers", "data_parallel", "teacher_in_main", "two_schedulers",
    "accumulation_runnable", "mnist_accel_flag", "helpers_without_device",
]

# "Train Epoch: 1 [0]\tLoss: ..." (mnist_functions) and "epoch 0 step 0 loss ..." (the others).
_EPOCH = re.compile(r"\bepoch:?\s*(\d+)", re.IGNORECASE)


def loss_lines(stdout: str) -> list[str]:
    # Case-insensitive: mnist_functions prints "Loss:". One line per step even
    # when a line holds several losses (gan_two_optimizers: loss_d and loss_g).
    return [line for line in stdout.splitlines() if "loss" in line.lower()]


def eval_lines(stdout: str) -> list[str]:
    """Evaluation results (mnist_functions) and learning rates after each epoch (two_schedulers)."""
    return [line for line in stdout.splitlines() if line.startswith(("Test set", "after epoch"))]


def steps_per_epoch(lines: list[str]) -> Counter:
    epochs = Counter()
    for line in lines:
        match = _EPOCH.search(line)
        assert match, f"no epoch number in {line!r}"
        epochs[match.group(1)] += 1
    return epochs


@dataclass
class Case:
    name: str
    source: str
    converted: str
    error: object
    workdir: Path


@pytest.fixture(scope="module", params=RUNNABLE)
def case(request, tmp_path_factory) -> Case:
    name = request.param
    before = FIXTURES / name / "before.py"
    source = before.read_text(encoding="utf-8")
    result = convert_source(source, str(before))
    workdir = tmp_path_factory.mktemp(name)
    (workdir / "before.py").write_text(source, encoding="utf-8")
    if result.error is None:
        (workdir / "after.py").write_text(result.output, encoding="utf-8")
    return Case(name, source, result.output, result.error, workdir)


@pytest.fixture(scope="module")
def single_runs(case):
    """`python before.py` and `python after.py`, one process each, CPU only."""
    if case.error is not None:
        pytest.skip(f"{case.name} did not convert: {case.error}")
    env = script_env()
    return {stem: run_single_process(case.workdir / f"{stem}.py", env) for stem in ("before", "after")}


def test_converts(case):
    assert case.error is None, case.error
    assert case.converted != case.source
    assert "prepare(" in case.converted
    assert ".backward(" in case.converted


def test_single_process_same_losses(case, single_runs):
    assert_ok(single_runs["before"])
    assert_ok(single_runs["after"])
    before, after = loss_lines(single_runs["before"].stdout), loss_lines(single_runs["after"].stdout)
    assert before, f"{case.name}/before.py printed no loss lines:\n{single_runs['before'].stdout}"
    # Same seed, same data order, same init, one process: Accelerate must not
    # change a single step (no extra/missing steps, no loss scaling, same
    # batches), so the printed per-step losses match to the last digit.
    assert after == before
    # Evaluation results too (mnist_functions prints one "Test set" line per epoch).
    assert eval_lines(single_runs["after"].stdout) == eval_lines(single_runs["before"].stdout)


def test_two_cpu_processes_shard_the_data(case, single_runs):
    assert_ok(single_runs["before"])
    single = loss_lines(single_runs["before"].stdout)
    assert single, f"{case.name}/before.py printed no loss lines"

    proc, (rank0_out, rank1_out) = run_two_cpu_processes(case.workdir / "after.py", script_env(), rank_stdout=True)
    assert_ok(proc)
    # Each rank's stdout goes to its own file (see e2e.DIST_WRAPPER), so lines
    # can't interleave or be torn mid-line between ranks.
    ranks = [loss_lines(rank0_out), loss_lines(rank1_out)]
    # accelerator.print: every log line appears once, from the main process.
    assert ranks[0], f"the main process printed no loss lines:\n{proc.stdout}"
    assert ranks[1] == [], f"rank 1 printed too:\n{rank1_out}"

    # prepare() shards each epoch's n batches across the 2 ranks. Accelerate's
    # default even_batches=True gives every rank ceil(n / 2) batches (the odd
    # one out is padded by wrapping around to the start of the dataset), so the
    # main process logs ceil(n / 2) steps per epoch; n steps would mean the
    # loader was not sharded (each rank ran the full epoch).
    single_epochs = steps_per_epoch(single)
    expected = Counter({epoch: math.ceil(n / 2) for epoch, n in single_epochs.items()})
    assert steps_per_epoch(ranks[0]) == expected, proc.stdout

    # Evaluation over the sharded loader still sees every sample exactly once
    # (gather_for_metrics; 70 samples in batches of 32 leave an uneven last batch).
    evaluations = eval_lines(rank0_out)
    assert len(evaluations) == len(eval_lines(single_runs["before"].stdout))
    for line in (e for e in evaluations if e.startswith("Test set")):
        seen, total = re.search(r"(\d+) of (\d+)", line).groups()
        assert seen == total, line
    # Learning rates after each epoch are the one-process values: the per-batch scheduler
    # is prepared (stepped once per process), the per-epoch one is not.
    learning_rates = [e for e in evaluations if e.startswith("after epoch")]
    assert learning_rates == [e for e in eval_lines(single_runs["before"].stdout) if e.startswith("after epoch")]

def test_checkpoint_is_the_plain_model_once(tmp_path):
    """mnist_functions saves `model.state_dict()`: converted, two processes write one checkpoint
    whose keys are the plain model's (no DDP `module.` prefix), exactly the original's keys."""
    import torch

    source = (FIXTURES / "mnist_functions" / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "mnist.py").output
    original_dir, converted_dir = tmp_path / "original", tmp_path / "converted"
    original_dir.mkdir()
    converted_dir.mkdir()
    (original_dir / "mnist.py").write_text(source, encoding="utf-8")
    (converted_dir / "mnist.py").write_text(converted, encoding="utf-8")
    assert_ok(run_single_process(original_dir / "mnist.py", script_env()))
    proc, _ = run_two_cpu_processes(converted_dir / "mnist.py", script_env())
    assert_ok(proc)
    original = torch.load(original_dir / "mnist_cnn.pt")
    saved = torch.load(converted_dir / "mnist_cnn.pt")
    assert list(saved) == list(original)
    assert all(saved[k].shape == original[k].shape for k in original)
