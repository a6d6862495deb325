"""Shared helpers for the end-to-end tests (tests/test_e2e_*.py): run a script
before/after conversion as a subprocess, on one process or on two CPU
processes under `torch.distributed.run`.

A plain module, not a conftest: the test modules import it as `from e2e import
...` (tests/ has no __init__.py, so pytest's default "prepend" import mode puts
tests/ on sys.path). Importing it does not import torch.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
STUBS = Path(__file__).resolve().parent / "stubs"

SUBPROCESS_TIMEOUT = 240

# Env vars that would change how Accelerate / torch.distributed set themselves up.
DIST_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
)

# Set by run_two_cpu_processes(): the wrapper sends each rank's stdout to
# f"{$E2E_RANK_STDOUT}.{rank}" instead of the shared pipe.
RANK_STDOUT_VAR = "E2E_RANK_STDOUT"
# Set by run_traced(): the wrapper writes what the script did to f"{$E2E_TRACE}.{rank}.json".
TRACE_VAR = "E2E_TRACE"

# Every run goes through this wrapper (see its docstring): it records what the script did
# and, under torch.distributed.run, tears the process group down cleanly after the script.
WRAPPER = Path(__file__).resolve().parent / "e2e_wrapper.py"


def script_env(**extra: str) -> dict[str, str]:
    """This process's environment for a training-script subprocess: CPU only,
    one OMP thread, and nothing inherited that would make Accelerate or
    torch.distributed (or the stubs/e2e wrapper) behave differently."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in DIST_VARS
        and not k.startswith("ACCELERATE_")
        and not k.startswith("ACCELIFY_")
        and k not in (RANK_STDOUT_VAR, TRACE_VAR)
    }
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def without_accelerate(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` for a subprocess in which ``import accelerate`` (and ``accelerate.utils``) raises
    ModuleNotFoundError, as where it is not installed: ``folder`` gets an ``accelerate.py`` that
    raises it and goes first on PYTHONPATH, before site-packages."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "accelerate.py").write_text(
        'raise ModuleNotFoundError("No module named \'accelerate\' (blocked by the test)", name="accelerate")\n',
        encoding="utf-8",
    )
    path = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path}


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = SUBPROCESS_TIMEOUT) -> subprocess.CompletedProcess:
    # Own session so a timeout kills the whole tree (torchrun + its workers).
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"timed out after {timeout}s: {cmd}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"{proc.args} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single_process(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python script.py` (through the wrapper) in the script's directory."""
    return run([sys.executable, str(WRAPPER), script.name], script.parent, env)


def run_two_cpu_processes(
    script: Path, env: dict[str, str], *, rank_stdout: bool = False
) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run `script` (unchanged, through the wrapper) on two CPU processes with
    `python -m torch.distributed.run --nproc_per_node 2`, ACCELERATE_USE_CPU=1,
    in the script's directory.

    Returns the torchrun process and, with rank_stdout=True, the stdout of
    rank 0 and rank 1, each captured in its own file (None otherwise); those
    are then also appended, in rank order, to the returned process's stdout.
    """
    cwd = script.parent
    env = {**env, "ACCELERATE_USE_CPU": "1"}
    prefix = cwd / f"{script.stem}.stdout"
    if rank_stdout:
        env[RANK_STDOUT_VAR] = str(prefix)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()),
        str(WRAPPER), script.name,
    ]  # fmt: skip
    proc = run(cmd, cwd, env)
    if not rank_stdout:
        return proc, None
    outputs = []
    for rank in (0, 1):
        path = Path(f"{prefix}.{rank}")
        outputs.append(path.read_text(encoding="utf-8") if path.exists() else "")
    # Ranks' output (in rank order) after torchrun's own, so assert_ok(proc)
    # shows what each rank printed.
    proc.stdout += "".join(f"--- rank {rank} stdout ---\n{out}" for rank, out in enumerate(outputs))
    assert not Path(f"{prefix}.2").exists(), "a third rank ran"
    return proc, outputs


@dataclass
class Run:
    """One traced run of a script: the process, and per rank its stdout and its trace."""

    proc: subprocess.CompletedProcess
    stdout: list[str]
    traces: list[dict]


def run_traced(script: Path, env: dict[str, str], processes: int = 1) -> Run:
    """Run `script` on one process or two CPU processes with the wrapper's trace on
    (tests/e2e_wrapper.py): what each rank printed and did. Fails the test when the
    run fails or a rank left no trace."""
    trace = script.parent / f"{script.stem}.{processes}p.trace"
    env = {**env, TRACE_VAR: str(trace)}
    if processes == 1:
        proc = run_single_process(script, env)
        outputs = [proc.stdout]
    else:
        assert processes == 2
        proc, outputs = run_two_cpu_processes(script, env, rank_stdout=True)
    assert_ok(proc)
    traces = []
    for rank in range(processes):
        path = Path(f"{trace}.{rank}.json")
        assert path.exists(), f"rank {rank} left no trace\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        traces.append(json.loads(path.read_text(encoding="utf-8")))
        assert traces[-1]["world"] == processes, f"rank {rank} ran in a world of {traces[-1]['world']}"
    return Run(proc, outputs, traces)
