"""End-to-end runs of conversions whose shape the generic runnable-fixture tests
(tests/test_e2e_scripts.py, epoch by epoch over the loader) do not fit. Every run goes through
tests/e2e_wrapper.py with the device check and, on two processes, the side-effect check on."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, run_traced, script_env  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402


def _prepare(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    source = (FIXTURES / name / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "train.py")
    assert converted.error is None and converted.output != source
    paths = []
    for stem, text in (("before", source), ("after", converted.output), ("two", converted.output)):
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "train.py").write_text(text, encoding="utf-8")
        paths.append(tmp_path / stem / "train.py")
    return paths[0], paths[1], paths[2]


def test_an_iteration_bounded_schedule_is_the_one_process_schedule(tmp_path):
    """fixtures/iteration_bounded_poly: `while True` over the loader until `cur_itrs >= total_itrs`,
    a poly schedule stepped per iteration. Not prepared, the scheduler steps once per iteration on
    N processes too; prepared, it would step twice per iteration on two and take `(1 - 12/10) ** 0.9`."""
    before, after, two = _prepare(tmp_path, "iteration_bounded_poly")
    env = script_env()
    original, converted, distributed = (run_traced(before, env), run_traced(after, env),
                                        run_traced(two, env, processes=2))
    assert converted.stdout == original.stdout  # one process: every loss and the final lr
    final = [line for line in original.stdout[0].splitlines() if line.startswith("after training")]
    assert final and final[0] != "after training: lr 0.000000"
    assert [line for line in distributed.stdout[0].splitlines() if line.startswith("after training")] == final
    assert distributed.stdout[1] == ""
    # as many optimizer steps on each process as in one: the loop counts iterations, not data
    steps = [[o["steps"] for o in trace["optimizers"]] for trace in distributed.traces]
    assert steps == [[6], [6]] == [[o["steps"] for o in original.traces[0]["optimizers"]]] * 2


def test_an_iterator_made_before_prepare_draws_each_process_its_shard(tmp_path):
    """fixtures/iterator_before_prepare (ODE-Net): `data_gen = inf_generator(loader)` before the model. Moved to
    just after `prepare`, it wraps the prepared loader: one process trains on the original's batches, and each
    of two draws half of the data (left where it was, each would draw all of it)."""
    before, after, two = _prepare(tmp_path, "iterator_before_prepare")
    env = script_env()
    original, converted, distributed = (run_traced(before, env), run_traced(after, env),
                                        run_traced(two, env, processes=2))
    assert converted.stdout == original.stdout  # one process: the same batches, the same losses
    seen = lambda out: [int(i) for line in out.splitlines() if line.startswith("itr ")  # noqa: E731
                        for i in line.split("seen [")[1].split("]")[0].split(", ")]
    assert sorted(set(seen(original.stdout[0]))) == list(range(16))
    main = seen(distributed.stdout[0])
    # 8 batches of 4: four epochs of the first process's half (8 ids each, reshuffled every epoch); left
    # unprepared, its first four batches would be an epoch of all 16 ids
    epochs = [main[i:i + 8] for i in range(0, 32, 8)]
    assert len(main) == 32 and all(len(set(epoch)) == 8 for epoch in epochs)
    assert sorted(main[:16]) != list(range(16))
