"""Shared helpers for the end-to-end tests (tests/test_e2e_*.py): run a script
before/after conversion as a subprocess, on one process or on two CPU
processes under `torch.distributed.run`.

Most runs are forked from a zygote (tests/e2e_zygote.py) that imported torch and
accelerate once: a run of a tiny fixture takes ~0.2 s instead of ~5 s, most of it
imports. Two-process runs then are the two workers torchrun would start, with the
environment it gives them (``_rank_env``); runs whose environment a fork cannot give
(PYTHONPATH stubs, a blocked accelerate) and those asked with ``torchrun=True`` run
as real subprocesses under real torchrun (the docs' golden, ``accelify verify``).

A plain module, not a conftest: the test modules import it as `from e2e import
...` (tests/ has no __init__.py, so pytest's default "prepend" import mode puts
tests/ on sys.path). Importing it does not import torch.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelify.runtime.checks import judge_side_effects

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
STUBS = Path(__file__).resolve().parent / "stubs"

SUBPROCESS_TIMEOUT = int(os.environ.get("E2E_TIMEOUT", "240"))

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


_PORTS_GIVEN: set[int] = set()
_PORTS_LOCK = threading.Lock()


def free_port() -> int:
    """A port free now and never handed out before in this session: runs started together
    (thread pools) must not meet at one master port, where their ranks would pair up."""
    with _PORTS_LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _PORTS_GIVEN:
                _PORTS_GIVEN.add(port)
                return port


ZYGOTE = Path(__file__).resolve().parent / "e2e_zygote.py"
# What a forked child of the zygote cannot change, being fixed when an interpreter starts:
# the zygote's own values, and the requests it accepts (see tests/e2e_zygote.py).
_FIXED_AT_START = ("PYTHONHASHSEED", "PYTHONPATH", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


class Zygote:
    """Client of tests/e2e_zygote.py, a fork server that imported torch and accelerate once:
    ``start`` runs ``python e2e_wrapper.py ARGV`` as a forked child of it. Thread-safe (the
    tests start runs from thread pools); one per test session, started on first use."""

    _instance: Zygote | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.base_env = script_env(PYTHONHASHSEED="0", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=self.base_env, cwd=REPO, start_new_session=True,
        )  # fmt: skip
        ready = self.proc.stdout.readline()
        if json.loads(ready or "{}").get("ready") is not True:
            raise RuntimeError(f"the e2e zygote did not start: {ready!r}")
        self.lock = threading.Lock()
        self.tags = itertools.count()
        self.children: dict[int, dict] = {}
        threading.Thread(target=self._read_replies, daemon=True).start()

    @classmethod
    def get(cls) -> Zygote:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
                atexit.register(cls._instance.close)
            return cls._instance

    def accepts(self, env: dict[str, str]) -> bool:
        """Whether a child of the zygote runs as a new interpreter with ``env`` would (an unset
        PYTHONHASHSEED is a random one: the zygote's 0 is one of them)."""
        env = {"PYTHONHASHSEED": self.base_env["PYTHONHASHSEED"], **env}
        return all(env.get(k) == self.base_env.get(k) for k in _FIXED_AT_START)

    def _read_replies(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            child = self.children[message["tag"]]
            if "pid" in message:
                child["pid"] = message["pid"]
                child["started"].set()
            else:
                child["code"] = message["code"]
                child["done"].set()
        for child in list(self.children.values()):  # the zygote is gone: nothing more will end
            child.setdefault("code", -1)
            child["started"].set()
            child["done"].set()

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path, *,
              module: str | None = None, append: bool = False, block: tuple[str, ...] = ()) -> dict:
        """Start ``python e2e_wrapper.py ARGV`` (``python -m MODULE ARGV`` with ``module``) forked
        from the zygote; ``block``: packages that are not installed for it (see e2e_zygote.py)."""
        with self.lock:
            tag = next(self.tags)
            child = self.children[tag] = {"started": threading.Event(), "done": threading.Event()}
            request = {"tag": tag, "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(stdout), "stderr": str(stderr),
                       "module": module, "append": append, "block": list(block)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        child["started"].wait()
        return child

    @staticmethod
    def kill(child: dict, signum: int = signal.SIGKILL) -> None:
        try:
            os.killpg(child["pid"], signum)
        except (KeyError, ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - at interpreter exit: leave nothing behind
            self.proc.kill()


def _run_forked(
    cmd: list[str], cwd: Path, envs: list[dict[str, str]], timeout: float = SUBPROCESS_TIMEOUT,
    block: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run ``e2e_wrapper.py`` with ``cmd``'s last argument (the script) once per env, as children
    of the zygote, together, as torchrun runs its workers: when one fails the others are killed.
    The result reads as the process ``cmd`` would: the first failing exit status (else 0), the
    children's stdout and stderr in order."""
    zygote = Zygote.get()
    outputs = Path(tempfile.mkdtemp(prefix="e2e-outputs-"))  # not in cwd, where the script works
    files = [(outputs / f"{i}.out", outputs / f"{i}.err") for i in range(len(envs))]
    proc = Forked([zygote.start(cmd[-1:], cwd, env, out, err, block=block) for env, (out, err) in zip(envs, files)])
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:  # where each one waits, to its stderr (see e2e_zygote.py), then killed
        timed_out = True
        proc.kill(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        for child in proc.children:
            child["done"].wait(30)
    out = "".join(path.read_text(encoding="utf-8", errors="replace") for path, _ in files)
    err = "".join(path.read_text(encoding="utf-8", errors="replace") for _, path in files)
    shutil.rmtree(outputs, ignore_errors=True)
    if timed_out:
        pytest.fail(f"timed out after {timeout}s: {cmd}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


class Forked:
    """A ``subprocess.Popen`` look-alike for children of the zygote (``_run_forked``, and what
    ``accelify verify`` starts through its ``start`` hook):
    ``python -m MODULE ARGS`` forked from the zygote, or, for ``python -m torch.distributed.run
    --nproc_per_node N ... -m MODULE ARGS``, the N workers torchrun would start with its
    environment (ended together, as torchrun ends its workers when one fails)."""

    def __init__(self, children: list[dict]) -> None:
        self.children = children
        self.pid = children[0]["pid"]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            failed = [c for c in self.children if c["done"].is_set() and c["code"] != 0]
            if failed:
                self.kill()
                for child in self.children:
                    child["done"].wait(30)
                self.returncode = failed[0]["code"]
            elif all(c["done"].is_set() for c in self.children):
                self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("forked", timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self, signum: int = signal.SIGKILL) -> None:
        for child in self.children:
            if not child["done"].is_set():
                Zygote.kill(child, signum)


def start_forked(cmd: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str, *,
                 block: tuple[str, ...] = ()):
    """``accelify.app.verify``'s ``start`` hook for the tests: the command forked from the zygote when
    it is ``python -m MODULE ...`` or torchrun of ``-m MODULE`` and the zygote accepts ``env``;
    otherwise (and never with ``block``) what verify does itself."""
    from accelify.app.verify import start_process

    zygote = Zygote.get()
    if cmd[:2] != [sys.executable, "-m"] or not zygote.accepts(env):
        assert not block, f"cannot run {cmd} without {block}"
        return start_process(cmd, cwd, env, stdout, stderr)
    if cmd[2] == "torch.distributed.run":
        options, module_at = cmd[3:], cmd.index("-m", 3)
        workers = int(options[options.index("--nproc_per_node") + 1])
        port = int(options[options.index("--master_port") + 1])
        argv, module = cmd[module_at + 2:], cmd[module_at + 1]
        envs = [_rank_env(env, rank, workers, port) for rank in range(workers)]
    else:
        argv, module, envs = cmd[3:], cmd[2], [env]
    Path(stdout).write_bytes(b"")
    Path(stderr).write_bytes(b"")
    return Forked([zygote.start(argv, Path(cwd), e, Path(stdout), Path(stderr), module=module, append=True, block=block)
                   for e in envs])


def run_single_process(script: Path, env: dict[str, str], block: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`python script.py` (through the wrapper) in the script's directory: forked from the
    zygote when ``env`` allows it (the same run, without importing torch again). ``block``:
    packages that are not installed for the run (forked runs only)."""
    cmd = [sys.executable, str(WRAPPER), script.name]
    if Zygote.get().accepts(env):
        return _run_forked(cmd, script.parent, [env], block=block)
    assert not block, "block= needs a forked run: see without_accelerate() for a subprocess"
    return run(cmd, script.parent, env)


def _rank_env(env: dict[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun gives each worker (torch/distributed/elastic/agent/server/
    local_elastic_agent.py) when it starts ``world`` of them on this machine."""
    return {
        **env,
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(world), "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False",
    }  # fmt: skip


def run_two_cpu_processes(
    script: Path, env: dict[str, str], *, rank_stdout: bool = False, torchrun: bool = False
) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run `script` (unchanged, through the wrapper) on two CPU processes with
    `python -m torch.distributed.run --nproc_per_node 2`, ACCELERATE_USE_CPU=1,
    in the script's directory.

    With torchrun=False (the default) and an ``env`` the zygote accepts, the two workers are
    forked from the zygote with the environment torchrun gives them (much faster: no
    interpreter imports torch again); torchrun=True runs torchrun itself.

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
    if torchrun or not Zygote.get().accepts(env):
        proc = run(cmd, cwd, env)
    else:  # the two workers torchrun would start, with its environment, forked from the zygote
        port = int(cmd[cmd.index("--master_port") + 1])
        proc = _run_forked(cmd, cwd, [_rank_env(env, rank, 2, port) for rank in (0, 1)])
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


_TEARDOWN_ABORT = "terminate called without an active exception"


@dataclass
class Run:
    """One traced run of a script: the process, and per rank its stdout and its trace."""

    proc: subprocess.CompletedProcess
    stdout: list[str]
    traces: list[dict]
    folder: Path  # where the script ran (what it wrote is there)


def run_traced(script: Path, env: dict[str, str], processes: int = 1, block: tuple[str, ...] = ()) -> Run:
    """Run `script` on one process or two CPU processes with the wrapper's trace on
    (tests/e2e_wrapper.py): what each rank printed and did. Fails the test when the
    run fails or a rank left no trace."""
    trace = script.parent / f"{script.stem}.{processes}p.trace"
    env = {**env, TRACE_VAR: str(trace)}
    for attempt in range(2):
        if processes == 1:
            proc = run_single_process(script, env, block)
            outputs = [proc.stdout]
        else:
            assert processes == 2 and not block
            proc, outputs = run_two_cpu_processes(script, env, rank_stdout=True)
        # gloo's threads can abort a process at interpreter exit, its work done (seen in about 1 of 6
        # runs of an mp.spawn original's workers, with plain python too). The wrapper has every
        # process, spawned workers too, leave without that teardown (1 abort in 16 runs before, 0 in
        # 46 after); should another path still meet it, that is teardown noise: run once more
        if proc.returncode == 0 or _TEARDOWN_ABORT not in proc.stderr or attempt:
            break
    assert_ok(proc)
    traces = []
    for rank in range(processes):
        path = Path(f"{trace}.{rank}.json")
        assert path.exists(), f"rank {rank} left no trace\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        traces.append(json.loads(path.read_text(encoding="utf-8")))
        assert traces[-1]["world"] == processes, f"rank {rank} ran in a world of {traces[-1]['world']}"
    if processes > 1:
        failures = judge_side_effects({rank: t["effects"] for rank, t in enumerate(traces)},
                                      {rank: t["prints"] for rank, t in enumerate(traces)})
        assert not failures, "side effects on every process:\n" + "\n".join(failures)
    return Run(proc, outputs, traces, script.parent)


def golden_fixture_runs(folders, name: str) -> dict[str, Run]:
    """:func:`fixture_runs`, once the conversion of ``fixtures/<name>/before.py`` is checked to be its
    ``after.py`` (what runs as converted is what accelify writes)."""
    from accelify.core.pipeline import convert_source

    source = (FIXTURES / name / "before.py").read_text(encoding="utf-8")
    result = convert_source(source, "before.py")
    assert result.error is None and result.output != source
    assert result.output == (FIXTURES / name / "after.py").read_text(encoding="utf-8")
    return fixture_runs(folders, name)


def fixture_runs(folders, name: str) -> dict[str, Run]:
    """``fixtures/<name>``: its ``before.py`` on one process ("original"), its ``after.py`` on one ("one") and
    on two ("two"), side by side, each traced (``run_traced``) in a folder ``folders.mktemp`` makes."""
    from concurrent.futures import ThreadPoolExecutor

    env = script_env(PYTHONHASHSEED="0")
    scripts = {}
    for run, file in (("original", "before.py"), ("one", "after.py"), ("two", "after.py")):
        scripts[run] = folders.mktemp(run) / "script.py"
        scripts[run].write_text((FIXTURES / name / file).read_text(encoding="utf-8"), encoding="utf-8")
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = {run: pool.submit(run_traced, script, env, 2 if run == "two" else 1) for run, script in scripts.items()}
        return {run: job.result() for run, job in jobs.items()}
