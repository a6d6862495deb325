"""End to end: a model with a part its `forward` never runs (MKDCNet's `self.s3`), converted, on one and two CPU
processes. Without `find_unused_parameters=True` DistributedDataParallel stopped at the second step on two
processes ("Expected to have finished reduction in the prior iteration"); the one-process run was fine.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import golden_fixture_runs  # noqa: E402

NAME = "idle_submodule"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def test_one_process_trains_as_the_original(runs):
    original = runs["original"].stdout[0]
    assert original.count("epoch") == 2 and runs["one"].stdout[0] == original


def test_two_processes_train_every_epoch(runs):
    rank0, rank1 = runs["two"].stdout
    assert rank0.count("epoch") == 2 and rank1.strip() == ""
