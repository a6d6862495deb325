"""End to end: a data prefetcher made from the prepared loader each epoch (NVIDIA's `DataPrefetcher`, drawn with
`prefetcher.next()` in a `while` loop), converted, on one and two CPU processes.

It draws the process's shard: two processes take half the steps each. (accelify converted it before too, but
reported ACC124, "every process trains on all of it": false, the loader it wraps is prepared.)
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, golden_fixture_runs  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402

NAME = "prefetcher"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return golden_fixture_runs(tmp_path_factory, NAME)


def test_nothing_false_is_reported() -> None:
    result = convert_source((FIXTURES / NAME / "before.py").read_text(encoding="utf-8"), "before.py")
    assert result.changed and not result.findings


def test_one_process_trains_as_the_original(runs):
    original = runs["original"].stdout[0]
    assert [line.split()[1] for line in original.splitlines()] == ["8", "8"]
    assert runs["one"].stdout[0] == original


def test_two_processes_each_draw_half_of_the_batches(runs):
    rank0, rank1 = runs["two"].stdout
    assert [line.split()[1] for line in rank0.splitlines()] == ["4", "4"], rank0
    assert rank1.strip() == ""
