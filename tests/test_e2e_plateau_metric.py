"""End to end: a ReduceLROnPlateau stepped on the epoch's mean training loss, converted (ACC032), on one and
two CPU processes. Each process keeps its learning rates in a file of its own.

Handed each process's own mean (of its shard), the two processes lowered their learning rates at different
epochs (0.1 0.1 0.1 0.05 ... on one, 0.1 0.1 0.05 0.05 ... on the other, with this fixture): the one model
trained with two learning rates. Stepped on the mean over the processes, they agree.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import golden_fixture_runs  # noqa: E402

NAME = "plateau_metric"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def _rates(folder: Path) -> list[str]:
    return sorted(p.read_text(encoding="utf-8") for p in folder.glob("lr_*.txt"))


def test_one_process_steps_as_the_original(runs):
    original, one = runs["original"], runs["one"]
    assert original.stdout[0].count("epoch") == 6 and one.stdout[0] == original.stdout[0]
    assert _rates(one.folder) == _rates(original.folder)


def test_two_processes_lower_the_learning_rate_at_the_same_epochs(runs):
    first, second = _rates(runs["two"].folder)
    assert first == second and len(set(first.split())) > 1, (first, second)  # lowered, and alike
