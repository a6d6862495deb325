"""ACC009: the barrier before a save is never placed where only some processes get."""

from __future__ import annotations

from conftest import FIXTURES, convert


def test_no_barrier_under_a_per_process_decision() -> None:
    output = convert((FIXTURES / "save_best" / "before.py").read_text()).output
    best, last = output.split('"best.pt")')[0], output.split('"best.pt")')[1]
    # `if acc > best:` is decided from this process's shard: a barrier there would hang the others
    assert "wait_for_everyone" not in best.split("if acc > best:")[1]
    # `if epoch == 2:` is the same on every process: the barrier stays
    assert "if epoch == 2:\n            accelerator.wait_for_everyone()\n" in last
