"""End to end: a training function that builds its own loaders and optimizer for the model it is handed,
called again after an out-of-memory error (Milesial's U-Net), converted, on one and two CPU processes.

The model is prepared inside `train_model` with its loaders and optimizer (accelify.analyses.handed); before,
the file was left unchanged (ACC104, "builds a DataLoader too").
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import golden_fixture_runs  # noqa: E402


NAME = "train_function_own_loaders"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def test_one_process_trains_and_validates_as_the_original(runs):
    original = runs["original"].stdout[0]
    assert original.count("validation accuracy") == 2
    assert runs["one"].stdout[0] == original


def test_two_processes_validate_over_the_whole_set_and_print_once(runs):
    rank0, rank1 = runs["two"].stdout
    lines = rank0.strip().splitlines()
    assert len(lines) == 2 and all("over 30 samples" in line for line in lines), rank0  # gathered, not a shard
    assert rank1.strip() == ""
