"""End to end: an evaluation loop whose model runs inside `with torch.no_grad():` in the loop body (SimSiam's
linear evaluation), converted, on one and two CPU processes.

The gather goes inside the `with`, after the predictions exist. (It went before the `with`, at the top of the loop,
handed `classifier(feature)` of the previous batch's features: the first test batch was scored with the last
training batch's outputs.)
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import golden_fixture_runs  # noqa: E402


NAME = "eval_no_grad_in_loop"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def test_one_process_prints_the_same_accuracy(runs):
    original = runs["original"].stdout[0]
    assert original.startswith("accuracy ") and "over 42 samples" in original
    assert runs["one"].stdout[0] == original


def test_two_processes_score_the_whole_test_set_once(runs):
    rank0, rank1 = runs["two"].stdout
    assert rank0.strip().endswith("over 42 samples"), rank0  # every test sample once, not a shard, not padded
    assert rank1.strip() == ""
