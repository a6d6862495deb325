"""End to end: a training script whose test metric no gather can collect (a top-k across each batch),
converted with its test loader left whole (ACC146), on one and two CPU processes.

One process prints what the original prints. Two processes: rank 0 prints the hit rate of the untrained
model exactly as the original does (the whole test set, each sample once), rank 1 prints nothing, and
each process draws every test batch (the training data is sharded; the evaluation is not).
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import golden_fixture_runs  # noqa: E402

NAME = "eval_whole_set_topk"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def test_one_process_prints_the_same(runs):
    original = runs["original"].stdout[0]
    assert original.count("hit rate") == 3
    assert runs["one"].stdout[0] == original


def test_two_processes_evaluate_the_whole_set_once_printed(runs):
    rank0, rank1 = runs["two"].stdout
    before = runs["original"].stdout[0].splitlines()[0]
    assert before.startswith("before training: hit rate")
    assert rank0.splitlines()[0] == before  # the whole test set, not a shard and not padded
    assert rank0.count("hit rate") == 3
    assert rank1.strip() == ""


def test_two_processes_shard_the_training_data_only(runs):
    for trace in runs["two"].traces:
        sizes = sorted(sum(len(batch) for batch in loader["epochs"][0]) for loader in trace["loaders"])
        # the prepared training loader: half of its 64 samples on each process; the test loader: all 48
        assert sizes == [32, 48], trace["loaders"]
