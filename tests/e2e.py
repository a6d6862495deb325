"""Shared helpers for the end-to-end tests (tests/test_e2e_*.py): run a script
before/after conversion as a subprocess, on one process or on two CPU
processes under `torch.distributed.run`.

A plain module, not a conftest: the test modules import it as `from e2e import
...` (tests/ has no __init__.py, so pytest's default "prepend" import mode puts
tests/ on sys.path). Importing it does not import torch.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
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

# Set by run_two_cpu_processes(): DIST_WRAPPER sends each rank's stdout to
# f"{$E2E_RANK_STDOUT}.{rank}" instead of the shared pipe.
RANK_STDOUT_VAR = "E2E_RANK_STDOUT"

# A converted script that ends right after its training loop calls neither
# `accelerator.wait_for_everyone()` nor `accelerator.end_training()`, so under
# torch.distributed.run the gloo process group is still alive when the
# interpreter exits, and gloo has been seen to abort there now and then
# ("terminate called without an active exception"). That is teardown noise,
# not a conversion bug, so 2-process runs execute the converted file
# *unchanged* via runpy and then shut the process group down cleanly
# (barrier so no rank tears down while a peer is still in a collective, then
# destroy, then os._exit(0) so that no C++ destructor runs at interpreter exit).
# Any exception from the script still propagates (non-zero exit).
#
# When $E2E_RANK_STDOUT is set, file descriptor 1 of each rank is pointed at
# its own file before the script runs, so the ranks' prints can neither
# interleave (Python block-buffers a pipe and may flush mid-line) nor be
# confused with each other. stderr stays on the shared pipe.
DIST_WRAPPER = textwrap.dedent(
    """\
    import os
    import runpy
    import sys

    import torch.distributed as dist

    prefix = os.environ.get("E2E_RANK_STDOUT")
    if prefix:
        sys.stdout.flush()
        fd = os.open(f"{prefix}.{os.environ['RANK']}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.close(fd)

    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    # The script ran to its end and the process group is gone: leave without the
    # interpreter's teardown, where gloo's threads were still seen to abort.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


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
        and k != RANK_STDOUT_VAR
    }
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


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
    """`python script.py` in the script's directory."""
    return run([sys.executable, script.name], script.parent, env)


def run_two_cpu_processes(
    script: Path, env: dict[str, str], *, rank_stdout: bool = False
) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run `script` (unchanged, through DIST_WRAPPER) on two CPU processes with
    `python -m torch.distributed.run --nproc_per_node 2`, ACCELERATE_USE_CPU=1,
    in the script's directory.

    Returns the torchrun process and, with rank_stdout=True, the stdout of
    rank 0 and rank 1, each captured in its own file (None otherwise); those
    are then also appended, in rank order, to the returned process's stdout.
    """
    cwd = script.parent
    wrapper = cwd / "_e2e_run_and_teardown.py"
    wrapper.write_text(DIST_WRAPPER, encoding="utf-8")
    env = {**env, "ACCELERATE_USE_CPU": "1"}
    prefix = cwd / f"{script.stem}.stdout"
    if rank_stdout:
        env[RANK_STDOUT_VAR] = str(prefix)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()),
        wrapper.name, script.name,
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
