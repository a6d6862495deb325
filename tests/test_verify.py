"""`accelify verify`'s logic without training anything (accelify/app/verify.py): the comparison of two
loss sequences with and without a tolerance, the verdicts and exit codes of finished runs, the
environment the runs get, the timeout of a hung run, and the tracing hook's import hygiene.
(tests/test_e2e_verify.py runs real scripts.)"""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from accelify.app.verify import (
    EXIT_DIFFERENT,
    EXIT_EQUIVALENT,
    EXIT_RUN_FAILED,
    Run,
    close,
    compare,
    judge,
    judge_distributed,
    run_all,
    run_environment,
)

A = [(0, 1.0), (1, 0.5), (2, 0.25)]


def _run(name="original", losses=A, steps=3, processes=1, **kwargs) -> Run:
    return Run(name, processes=processes, returncode=0, losses=list(losses), steps=[steps] * processes,
               ends=["steps"] * processes, **kwargs)


def test_identical_sequences():
    assert compare(A, list(A)) == ("identical", None)


def test_rtol_zero_is_bit_for_bit():
    nudged = [(0, 1.0), (1, math.nextafter(0.5, 1.0)), (2, 0.25)]
    assert compare(A, nudged) == ("different", 1)
    assert compare(A, nudged, rtol=1e-12) == ("within-rtol", None)


def test_rtol_is_relative_to_the_larger_value():
    assert close(100.0, 101.0, 0.01)
    assert not close(100.0, 102.0, 0.01)
    assert not close(0.0, 1e-30, 0.5) and close(0.0, 1e-30, 1.0)
    assert close(float("nan"), float("nan"), 0.0)
    assert not close(float("nan"), 1.0, 1.0)


def test_first_difference_is_reported_with_its_index():
    changed = [(0, 1.0), (1, 0.5), (2, 0.3)]
    assert compare(A, changed, rtol=0.1) == ("different", 2)
    assert compare(A, changed, rtol=0.2) == ("within-rtol", None)


def test_a_loss_at_another_step_differs():
    assert compare(A, [(0, 1.0), (0, 0.5), (2, 0.25)]) == ("different", 1)


def test_one_sequence_longer():
    assert compare(A, A[:2]) == ("different", 2)
    assert compare(A[:1], A) == ("different", 1)


def test_no_losses():
    assert compare([], []) == ("no-losses", None)


def test_judge_equivalent_and_different():
    same = judge("t.py", 3, 0.0, _run(), _run("converted"))
    assert (same.verdict, same.exit_code, same.equivalent) == ("identical", EXIT_EQUIVALENT, True)
    assert [row.difference for row in same.rows] == [0.0, 0.0, 0.0]

    changed = judge("t.py", 3, 0.0, _run(), _run("converted", losses=[(0, 1.0), (1, 0.5), (2, 0.3)]))
    assert (changed.verdict, changed.exit_code) == ("different", EXIT_DIFFERENT)
    assert changed.first_difference.index == 2 and changed.first_difference.step == 2
    assert "step 2" in changed.message and "0.25" in changed.message and "0.3" in changed.message

    near = judge("t.py", 3, 0.25, _run(), _run("converted", losses=[(0, 1.0), (1, 0.5), (2, 0.3)]))
    assert (near.verdict, near.exit_code) == ("within-rtol", EXIT_EQUIVALENT)


def test_judge_same_losses_but_other_step_count():
    result = judge("t.py", 3, 0.0, _run(steps=3), _run("converted", steps=2))
    assert (result.verdict, result.exit_code) == ("different", EXIT_DIFFERENT)


def test_judge_no_losses_is_not_equivalent():
    result = judge("t.py", 3, 0.0, _run(losses=[]), _run("converted", losses=[]))
    assert (result.verdict, result.exit_code) == ("no-losses", EXIT_DIFFERENT)


def test_judge_an_evaluation_by_what_it_prints():
    """No backward pass (an evaluation or inference script): the printed output is compared."""
    printed = "Test set: accuracy 17/70\nwrote 70 predictions\n"
    same = judge("t.py", 3, 0.0, _run(losses=[], steps=0, stdout=printed), _run("converted", losses=[], steps=0, stdout=printed))
    assert (same.verdict, same.exit_code) == ("same-output", 0) and same.equivalent
    assert "2 lines" in same.message
    other = judge("t.py", 3, 0.0, _run(losses=[], steps=0, stdout=printed),
                  _run("converted", losses=[], steps=0, stdout=printed.replace("17", "9")))
    assert (other.verdict, other.exit_code) == ("different", EXIT_DIFFERENT) and "line 1" in other.message
    shorter = judge("t.py", 3, 0.0, _run(losses=[], steps=0, stdout=printed),
                    _run("converted", losses=[], steps=0, stdout=printed.splitlines()[0]))
    assert shorter.verdict == "different" and "line 2" in shorter.message


def test_judge_failed_run_names_the_side_and_a_gpu():
    original = Run("original", returncode=1, losses=[], steps=[0], ends=["error"], needs_gpu=True,
                   stderr_tail=["AssertionError: Torch not compiled with CUDA enabled"])
    result = judge("t.py", 3, 0.0, original, _run("converted"))
    assert (result.verdict, result.exit_code) == ("failed", EXIT_RUN_FAILED)
    assert "original" in result.message and "needs a GPU" in result.message

    converted = Run("converted", returncode=1, steps=[1], ends=["error"])
    result = judge("t.py", 3, 0.0, _run(), converted)
    assert (result.verdict, result.exit_code) == ("failed", EXIT_RUN_FAILED)
    assert "converted" in result.message and "exit code 1" in result.message and "GPU" not in result.message

    timed_out = Run("converted", returncode=-9, timed_out=True, seconds=5.0)
    result = judge("t.py", 3, 0.0, _run(), timed_out)
    assert result.exit_code == EXIT_RUN_FAILED and "timed out" in result.message


def test_a_run_without_its_end_record_failed():
    # exit code 0, but the hook never recorded an end (or a rank is missing): not ok
    assert not Run("original", returncode=0, steps=[3], ends=[None]).ok
    assert not Run("x", processes=2, returncode=0, steps=[3], ends=["steps"]).ok
    assert Run("x", processes=2, returncode=0, steps=[3, 3], ends=["steps", "steps"]).ok


def test_distributed_verdicts_and_exit_codes():
    ok = judge_distributed(_run("converted x2", processes=2))
    assert ok.verdict == "ok"
    assert judge("t.py", 3, 0.0, _run(), _run("converted"), ok).exit_code == EXIT_EQUIVALENT

    uneven = judge_distributed(Run("converted x2", processes=2, returncode=0, steps=[3, 2], ends=["steps", "finished"]))
    assert uneven.verdict == "uneven-steps" and "rank 1: 2" in uneven.message
    assert judge("t.py", 3, 0.0, _run(), _run("converted"), uneven).exit_code == EXIT_DIFFERENT

    hung = judge_distributed(Run("converted x2", processes=2, returncode=-9, timed_out=True, steps=[3, 2], seconds=9))
    assert hung.verdict == "timeout" and "hang" in hung.message
    assert judge("t.py", 3, 0.0, _run(), _run("converted"), hung).exit_code == EXIT_RUN_FAILED

    crashed = judge_distributed(Run("converted x2", processes=2, returncode=1, steps=[1, 1], ends=["error", "error"]))
    assert crashed.verdict == "failed"
    assert judge("t.py", 3, 0.0, _run(), _run("converted"), crashed).exit_code == EXIT_RUN_FAILED


def test_run_environment_is_cpu_deterministic_and_outside_any_group():
    env = run_environment({"PATH": "/bin", "RANK": "3", "MASTER_PORT": "1", "ACCELERATE_MIXED_PRECISION": "fp16",
                           "CUDA_VISIBLE_DEVICES": "0", "ACCELIFY_LOSS_LOG": "kept"})
    assert "RANK" not in env and "MASTER_PORT" not in env and "ACCELERATE_MIXED_PRECISION" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ACCELERATE_USE_CPU"] == "1"
    assert env["PYTHONHASHSEED"] == "0" and env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"] == "/bin" and env["ACCELIFY_LOSS_LOG"] == "kept"


def test_a_hung_run_is_killed_at_the_timeout(tmp_path):
    run = Run("converted x2", processes=2)
    seen = []
    run_all([(run, [sys.executable, "-c", "import time; time.sleep(60)"])], str(tmp_path), run_environment(),
            steps=3, timeout=1.0, workdir=str(tmp_path), progress=lambda r, state, steps: seen.append(state))
    assert run.timed_out and run.seconds < 30 and not run.ok
    assert seen[0] == "started" and seen[-1] == "done"
    assert judge_distributed(run).verdict == "timeout"


def test_trace_hook_imports_torch_only():
    code = (
        "import sys, accelify.runtime.trace as t\n"
        "t._install(t._Recorder(sys.argv[1], 0, 0))\n"
        "bad = [m for m in ('libcst', 'rich', 'typer', 'accelerate') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "from accelerate import Accelerator\n"
        "assert hasattr(Accelerator.backward, '__wrapped__')\n"  # hooked when accelerate is imported
    )
    pytest.importorskip("accelerate")
    proc = subprocess.run([sys.executable, "-c", code, "/dev/null"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_trace_hook_seeds_the_generators_a_script_leaves_unseeded(tmp_path):
    """wgan (research set) draws its own seed, ``random.randint(1, 10000)``: without a seeded
    ``random`` the original and the conversion train from different seeds on every run; torch's
    CPU generator too is seeded from the operating system (cyclegan seeds nothing)."""
    script = tmp_path / "draw.py"
    script.write_text("import random, numpy, torch\n"
                      "print(random.randint(1, 10000), numpy.random.randint(10000), torch.rand(1).item())\n")
    pytest.importorskip("numpy")
    runs = [subprocess.run([sys.executable, "-m", "accelify.runtime.trace", str(script)], capture_output=True,
                           text=True, cwd=tmp_path) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()


@pytest.mark.parametrize("args, message", [
    (["verify", "missing.py"], "no such file"),
    (["verify", "train.py", "--format", "yaml"], "--format"),
    (["verify", "train.py", "--steps", "0"], "--steps"),
    (["verify", "train.py", "--processes", "0"], "--processes"),
])
def test_verify_usage_errors_exit_2(tmp_path, monkeypatch, args, message):
    from typer.testing import CliRunner

    from accelify.app.cli import app

    (tmp_path / "train.py").write_text("print('never run')\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_verify_a_file_accelify_leaves_alone(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from accelify.app.cli import app

    (tmp_path / "train.py").write_text("print('no training here')\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["verify", "train.py"])
    assert result.exit_code == 0, result.output
    assert "unchanged" in result.output and "nothing to verify" in result.output


def test_trace_hook_holds_the_process_groups_a_script_ends(tmp_path, monkeypatch):
    """The hook keeps an ended group referenced (a gloo teardown deadlock otherwise: see
    ``hold_ended_groups``) and then leaves with os._exit; the group is ended for the script."""
    dist = pytest.importorskip("torch.distributed")
    from accelify.runtime import trace

    monkeypatch.setattr(dist, "destroy_process_group", dist.destroy_process_group)  # restored afterwards
    monkeypatch.setattr(trace, "_ENDED_GROUPS", [])
    assert trace.hold_ended_groups() is trace._ENDED_GROUPS
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    group = dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    assert trace._ENDED_GROUPS == [group]
    exits = []
    monkeypatch.setattr(trace.os, "_exit", exits.append)
    trace._teardown(stopped=False)
    assert exits == [0]


_SPAWNING = '''
import atexit, sys
import torch.multiprocessing as mp


def worker(index, marks, fail):
    atexit.register(lambda: open(f"{marks}.{index}", "w").close())  # runs only through the teardown
    print(f"worker {index} done", flush=True)
    if fail:
        raise RuntimeError("worker failed")


if __name__ == "__main__":
    mp.spawn(worker, nprocs=2, args=(sys.argv[1], sys.argv[2] == "fail"))
'''


@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_trace_hook_has_spawned_workers_leave_without_the_interpreters_teardown(tmp_path, outcome):
    """A worker ``mp.spawn`` starts under the hook leaves with os._exit once it returns (gloo
    aborted now and then in that teardown), and a worker that raises still fails the run."""
    pytest.importorskip("torch")
    (tmp_path / "spawning.py").write_text(_SPAWNING)
    marks = tmp_path / "mark"
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", "spawning.py", str(marks), outcome],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.stdout.count("done") == 2, proc.stderr
    if outcome == "ok":
        assert proc.returncode == 0, proc.stderr
        assert not list(tmp_path.glob("mark.*")), "a worker ran the interpreter's teardown"
    else:
        assert proc.returncode != 0 and "worker failed" in proc.stderr
