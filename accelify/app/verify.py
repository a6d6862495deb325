"""``accelify verify``: run a script and its conversion on the CPU and compare their losses.

``verify(path, ...)`` converts the script in memory, writes the converted copy next to the original
under a temporary name (so relative paths, imports of sibling modules and data files behave as for
the original) and removes it afterwards, then runs, as subprocesses on the CPU with deterministic
settings, the original and the converted copy (and, with ``processes`` > 1, the converted copy under
``torch.distributed.run`` with that many gloo processes), each through the tracing hook of
``accelify.runtime.trace``, which records every loss passed to a backward pass and ends the run
after ``steps`` optimizer steps. It returns a ``Verification``; printing it is the CLI's business
(this module imports neither rich nor torch).

Verdicts (``Verification.verdict``) and exit codes:

- ``identical`` (0): the same losses, bit for bit, at the same steps;
- ``within-rtol`` (0): every pair within ``rtol`` (relative to the larger of the two);
- ``identical-read-ahead`` (0): the losses differ, and the original run again with its DataLoaders reading
  one batch ahead, as Accelerate's prepared DataLoader does, has the converted script's losses (bit for bit,
  or within ``rtol``): loading and training draw from the global random generator in another order, and
  nothing else differs;
- ``different`` (1): the first differing loss (its index and step, both values), or one side
  recorded more losses or took more optimizer steps than the other;
- ``same-output`` (0): neither run passed a loss to backward (an evaluation or inference script)
  and both printed the same lines;
- ``no-losses`` (1): neither run passed a loss to backward nor printed anything: nothing proves
  them equivalent (with different printed output the verdict is ``different``);
- ``failed`` (3): a run failed (its exit code and last stderr lines; ``needs_gpu`` when the
  failure is about CUDA, ``needs_launcher`` when the script reads what torchrun sets: a DDP
  original, whose conversion runs in one process and is still checked with ``processes``) or
  timed out;
- ``would-fail-on-gpu`` (1): the converted run broke a GPU's device rule (accelify.runtime.checks:
  every run emulates the accelerator's device on the CPU): a tensor on the host met one on the
  device, or ``.numpy()`` of a tensor on the device; the message names the line;
- ``unchanged`` (0): accelify leaves the file as it is (findings say why): nothing to verify.

The multi-process run has its own verdict (``Verification.distributed.verdict``): ``ok`` (every
rank ended cleanly after the same number of optimizer steps), ``uneven-steps`` (exit 1),
``would-fail-on-gpu`` (exit 1), ``side-effects`` (exit 1: a file written by several processes, a
download or an extraction on every process, a line printed repeatedly on a process other than
the first; each named with its line),
``failed`` or ``timeout`` (exit 3). It never decides equality with the one-process losses (each
rank trains on its own shard); rank 0's losses are shown.

Test hooks: ``converted_source`` (or, from the command line, ``$ACCELIFY_VERIFY_CONVERTED`` naming a
file) replaces accelify's conversion, so a test can verify a deliberately broken copy; ``start``
replaces how the runs' commands are started (the tests fork them from a process that imported
torch once).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from accelify.runtime.checks import judge_side_effects

#: Test hook: a file whose text is used instead of accelify's conversion.
CONVERTED_OVERRIDE_VAR = "ACCELIFY_VERIFY_CONVERTED"

EXIT_EQUIVALENT, EXIT_DIFFERENT, EXIT_RUN_FAILED = 0, 1, 3

DEFAULT_STEPS = 20
DEFAULT_TIMEOUT = 600.0

# Environment variables that would make a run take part in someone else's process group or
# set Accelerate up otherwise than on the CPU.
_DIST_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
)

# A failure that is about CUDA: the original needs a GPU.
_NEEDS_GPU = re.compile(
    r"Torch not compiled with CUDA enabled|No CUDA GPUs are available|Found no NVIDIA driver|"
    r"no CUDA-capable device|CUDA driver|CUDA error|cuda runtime error|"
    r"Attempting to deserialize object on a CUDA device|NCCL|[/\\]torch[/\\]cuda[/\\]",
    re.IGNORECASE,
)

# A failure that is about a missing launcher: the script reads what torchrun gives each process.
_NEEDS_LAUNCHER = re.compile(
    r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) expected, but not set|"
    r"KeyError: '(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'"
)

STDERR_TAIL = 15


@dataclass
class Run:
    """One run: the original, the converted copy, or the converted copy on N processes."""

    name: str
    processes: int = 1
    returncode: Optional[int] = None
    timed_out: bool = False
    seconds: float = 0.0
    #: rank 0's losses, in order: (optimizer steps taken before it, value)
    losses: list[tuple[int, float]] = field(default_factory=list)
    #: optimizer steps each rank took (ranks that left no record are missing)
    steps: list[int] = field(default_factory=list)
    #: how each rank ended (``steps``, ``finished``, ``exit``, ``error``; None: no end recorded)
    ends: list[Optional[str]] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    needs_gpu: bool = False
    #: it failed reading what a launcher (torchrun) sets: RANK, WORLD_SIZE, MASTER_ADDR...
    needs_launcher: bool = False
    #: the file of the tracing hook that ran (rank 0's), None if it never started
    hook: Optional[str] = None
    #: what it printed (under a launcher, every rank's and the launcher's lines together)
    stdout: str = ""
    #: the first operation that would fail on a GPU (accelify.runtime.checks' device check), if any
    device_error: Optional[dict] = None
    #: per rank: the files written, directories made, archives extracted, URLs downloaded
    effects: dict[int, list[dict]] = field(default_factory=dict)
    #: per rank: how many times each line of code printed (file, line, code, count)
    prints: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out and self.returncode == 0 and len(self.ends) == self.processes
            and all(end in ("steps", "finished") for end in self.ends)
        )

    @property
    def state(self) -> str:
        if self.timed_out:
            return "timeout"
        return "ok" if self.ok else "failed"


@dataclass
class Row:
    index: int  # position of the loss in the sequence (0-based)
    step: int  # optimizer steps taken before it
    original: Optional[float]
    converted: Optional[float]
    distributed: Optional[float] = None  # rank 0 of the multi-process run

    @property
    def difference(self) -> Optional[float]:
        if self.original is None or self.converted is None:
            return None
        return self.converted - self.original


@dataclass
class Distributed:
    processes: int
    run: Run
    verdict: str  # ok | uneven-steps | side-effects | would-fail-on-gpu | failed | timeout
    message: str
    #: what the processes did that only several processes get wrong (see checks.judge_side_effects)
    side_effects: list[str] = field(default_factory=list)


@dataclass
class Verification:
    path: str
    steps: int
    rtol: float
    verdict: str
    message: str
    exit_code: int
    rows: list[Row] = field(default_factory=list)
    first_difference: Optional[Row] = None
    original: Optional[Run] = None
    converted: Optional[Run] = None
    distributed: Optional[Distributed] = None
    findings: list[str] = field(default_factory=list)

    @property
    def equivalent(self) -> bool:
        return self.verdict in ("identical", "within-rtol", "same-output", "identical-read-ahead")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["rows"] = [{**asdict(row), "difference": row.difference} for row in self.rows]
        data["first_difference"] = (
            None if self.first_difference is None
            else {**asdict(self.first_difference), "difference": self.first_difference.difference}
        )
        for name in ("original", "converted"):
            run = getattr(self, name)
            if run is not None:
                data[name]["state"] = run.state
        if self.distributed is not None:
            data["distributed"]["run"]["state"] = self.distributed.run.state
        return data


class VerifyError(Exception):
    """The script cannot be verified at all (unreadable, does not parse): the message says why."""


# ---------------------------------------------------------------------------------------------
# comparison (pure)


def close(a: float, b: float, rtol: float) -> bool:
    """``a`` and ``b`` equal (rtol 0: bit for bit, NaN equal to NaN) or within ``rtol`` of the larger."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if rtol <= 0 or math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def compare(original: list[tuple[int, float]], converted: list[tuple[int, float]], rtol: float = 0.0
            ) -> tuple[str, Optional[int]]:
    """(verdict, index of the first differing loss) of two loss sequences of ``(step, value)``.

    Verdicts: ``identical``, ``within-rtol``, ``different`` (a value differs, a loss falls at
    another step, or one sequence is longer: the index is where), ``no-losses``.
    """
    if not original and not converted:
        return "no-losses", None
    exact = True
    for index, ((step_a, a), (step_b, b)) in enumerate(zip(original, converted)):
        if step_a != step_b or not close(a, b, rtol):
            return "different", index
        exact = exact and (a == b or (math.isnan(a) and math.isnan(b)))
    if len(original) != len(converted):
        return "different", min(len(original), len(converted))
    return ("identical" if exact else "within-rtol"), None


def rows_of(original: list[tuple[int, float]], converted: list[tuple[int, float]],
            distributed: Optional[list[tuple[int, float]]] = None) -> list[Row]:
    distributed = distributed or []
    rows = []
    for index in range(max(len(original), len(converted), len(distributed))):
        a = original[index] if index < len(original) else None
        b = converted[index] if index < len(converted) else None
        d = distributed[index] if index < len(distributed) else None
        step = (a or b or d)[0]
        rows.append(Row(index, step, a and a[1], b and b[1], d and d[1]))
    return rows


def judge(path: str, steps: int, rtol: float, original: Run, converted: Run,
          distributed: Optional[Distributed] = None) -> Verification:
    """The verdict on finished runs."""
    rows = rows_of(original.losses, converted.losses, distributed.run.losses if distributed else None)
    result = Verification(path, steps, rtol, "", "", EXIT_EQUIVALENT, rows, original=original,
                          converted=converted, distributed=distributed)
    if converted.device_error is not None:
        result.verdict, result.exit_code = "would-fail-on-gpu", EXIT_DIFFERENT
        result.message = converted.device_error["message"]
        return result
    failed = [run for run in (original, converted) if not run.ok]
    if failed:
        run = failed[0]
        result.verdict, result.exit_code = "failed", EXIT_RUN_FAILED
        result.message = describe_failure(run)
        return result
    verdict, index = compare(original.losses, converted.losses, rtol)
    result.verdict = verdict
    if verdict == "different":
        result.exit_code = EXIT_DIFFERENT
        row = rows[index]
        result.first_difference = row
        if row.original is None or row.converted is None:
            longer = "original" if row.converted is None else "converted"
            result.message = (f"the {longer} script passed more losses to backward: "
                              f"{len(original.losses)} against {len(converted.losses)} (from loss {index + 1}, step {row.step})")
        elif original.losses[index][0] != converted.losses[index][0]:
            result.message = (f"loss {index + 1} comes after {original.losses[index][0]} optimizer steps in the "
                              f"original, {converted.losses[index][0]} in the converted script")
        else:
            result.message = (f"first difference at step {row.step} (loss {index + 1} of {len(rows)}): "
                              f"original {row.original!r}, converted {row.converted!r}")
    elif verdict == "no-losses" and original.steps == converted.steps and original.stdout.strip():
        # an evaluation or inference script: what it prints is what it computes
        same, first = _same_output(original.stdout, converted.stdout)
        if same:
            result.verdict = "same-output"
            lines = len(original.stdout.splitlines())
            result.message = (f"no backward pass (an evaluation or inference script): the same printed output, "
                              f"{lines} line{'s' if lines != 1 else ''}")
        else:
            result.verdict, result.exit_code = "different", EXIT_DIFFERENT
            result.message = f"no backward pass; the printed output differs from line {first + 1}"
    elif verdict == "no-losses":
        result.exit_code = EXIT_DIFFERENT
        result.message = "neither run passed a loss to backward: nothing to compare"
    elif original.steps != converted.steps:
        result.verdict, result.exit_code = "different", EXIT_DIFFERENT
        result.message = (f"the same losses, but {original.steps[0]} optimizer steps in the original and "
                          f"{converted.steps[0]} in the converted script")
    else:
        count = len(original.losses)
        steps_taken = original.steps[0]
        what = "bit for bit" if verdict == "identical" else f"within a relative {rtol:g}"
        result.message = f"the same {count} losses over {steps_taken} optimizer steps, {what}"
    if result.exit_code == EXIT_EQUIVALENT:
        result.exit_code = _distributed_exit(distributed)
    return result


def _distributed_exit(distributed: Optional[Distributed]) -> int:
    """The exit code of runs found equivalent in one process, after the multi-process run's verdict."""
    if distributed is None or distributed.verdict == "ok":
        return EXIT_EQUIVALENT
    return EXIT_RUN_FAILED if distributed.verdict in ("failed", "timeout") else EXIT_DIFFERENT


def _same_output(a: str, b: str) -> tuple[bool, int]:
    """(the same lines, index of the first that differs)."""
    left, right = a.splitlines(), b.splitlines()
    for index, (x, y) in enumerate(zip(left, right)):
        if x != y:
            return False, index
    return len(left) == len(right), min(len(left), len(right))


def judge_distributed(run: Run) -> Distributed:
    if run.device_error is not None:
        return Distributed(run.processes, run, "would-fail-on-gpu", run.device_error["message"])
    if run.timed_out:
        reached = ", ".join(f"rank {rank}: {steps}" for rank, steps in enumerate(run.steps)) or "no rank started"
        return Distributed(run.processes, run, "timeout", f"timed out after {run.seconds:.0f} s (optimizer steps {reached}): a hang?")
    if len(set(run.steps)) > 1:
        reached = ", ".join(f"rank {rank}: {steps}" for rank, steps in enumerate(run.steps))
        return Distributed(run.processes, run, "uneven-steps", f"the ranks took different numbers of optimizer steps ({reached})")
    if not run.ok:
        return Distributed(run.processes, run, "failed", describe_failure(run))
    failures = judge_side_effects(run.effects, run.prints)
    if failures:
        return Distributed(run.processes, run, "side-effects", "; ".join(failures), failures)
    return Distributed(run.processes, run, "ok",
                       f"every rank took {run.steps[0]} optimizer steps and ended cleanly")


def describe_failure(run: Run) -> str:
    if run.timed_out:
        return f"the {run.name} run timed out after {run.seconds:.0f} s (a hang?)"
    if run.needs_launcher:
        head = (f"the {run.name} script needs a launcher (it reads the variables torchrun sets; exit code "
                f"{run.returncode}): verify compares the two in one process, which it cannot run; "
                "--processes N still checks the converted script on N processes")
    elif run.needs_gpu:
        head = f"the {run.name} script needs a GPU (it failed on a CUDA call, exit code {run.returncode})"
    elif run.returncode == 0:
        head = f"the {run.name} run ended without its trace (exit code 0, ranks recorded: {len(run.ends)} of {run.processes})"
    else:
        head = f"the {run.name} run failed with exit code {run.returncode}"
    return head


# ---------------------------------------------------------------------------------------------
# running


def run_environment(base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of every run: CPU only, deterministic, outside any process group."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k not in _DIST_VARS and not k.startswith("ACCELERATE_")}
    env.update(
        CUDA_VISIBLE_DEVICES="",
        ACCELERATE_USE_CPU="1",
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        CUBLAS_WORKSPACE_CONFIG=":4096:8",
        ACCELIFY_CHECKS="device,effects",
    )
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Process:
    run: Run
    popen: subprocess.Popen
    trace: str  # prefix of the rank files
    stderr_path: str
    started: float
    last_steps: int = -1
    stdout_path: str = ""


def _read_checks(run: Run, prefix: str) -> None:
    """Fill in what the checks of accelify.runtime.checks recorded, rank by rank."""
    for rank in range(run.processes):
        path = f"{prefix}.{rank}.jsonl"
        if not os.path.exists(path):
            continue
        effects: list[dict] = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind = event.get("event")
                if kind == "device" and run.device_error is None:
                    run.device_error = {**event, "rank": rank}
                elif kind == "effect":
                    effects.append(event)
                elif kind == "prints":
                    run.prints[rank] = event.get("counts", [])
        run.effects[rank] = effects


def _read_trace(prefix: str, processes: int) -> tuple[list[tuple[int, float]], list[int], list[Optional[str]], Optional[str]]:
    """(rank 0's losses, optimizer steps so far of each rank with a record, how each ended, rank 0's hook file)."""
    hook = None
    losses: list[tuple[int, float]] = []
    steps: list[int] = []
    ends: list[Optional[str]] = []
    for rank in range(processes):
        path = f"{prefix}.{rank}.jsonl"
        if not os.path.exists(path):
            continue
        taken, end = 0, None
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:  # a line being written
                    continue
                kind = event.get("event")
                if kind == "start" and rank == 0:
                    hook = event.get("hook")
                elif kind == "loss" and rank == 0:
                    losses.append((int(event["step"]), float(event["value"])))
                elif kind == "step":
                    taken = int(event["steps"])
                elif kind == "end":
                    end = event.get("reason")
                    taken = int(event.get("steps", taken))
        steps.append(taken)
        ends.append(end)
    return losses, steps, ends, hook


ProgressCallback = Callable[[Run, str, int], None]  # (run, state: started|running|done, steps so far)

#: How a run is started: ``(cmd, cwd, env, stdout path, stderr path)`` -> a ``subprocess.Popen``, or
#: an object with its ``pid`` (leader of its own process group), ``poll()``, ``wait()``, ``kill()``.
Starter = Callable[[list[str], str, dict[str, str], str, str], subprocess.Popen]


def start_process(cmd: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str) -> subprocess.Popen:
    """The default ``Starter``: a subprocess in its own session (a timeout kills all it started)."""
    with open(stderr, "wb") as err, open(stdout, "wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)


def run_all(jobs: list[tuple[Run, list[str]]], cwd: str, env: dict[str, str], steps: int, timeout: float,
            workdir: str, progress: Optional[ProgressCallback] = None, start: Starter = start_process) -> None:
    """Start every job at once and wait for all; fills in each ``Run``. Each job runs in a folder of its own
    that mirrors ``cwd``, beside it (``_private_folder``): what a run makes at the top of it (``./logs``, ``./checkpoints``)
    is its own, so runs side by side neither collide (``os.makedirs("logs/samples")`` without ``exist_ok``
    failed in whichever came second) nor read each other's outputs (a checkpoint to resume from)."""
    processes: list[_Process] = []
    folders: dict[int, str] = {}
    try:
        for number, (run, cmd) in enumerate(jobs):
            trace = os.path.join(workdir, f"run{number}")
            stderr_path = os.path.join(workdir, f"run{number}.stderr")
            run_env = {**env, "ACCELIFY_TRACE": trace, "ACCELIFY_TRACE_STEPS": str(steps)}
            stdout_path = os.path.join(workdir, f"run{number}.stdout")
            folder = _private_folder(cwd, number)
            if folder is not None:
                folders[id(run)] = folder
            popen = start(cmd, folder or cwd, run_env, stdout_path, stderr_path)
            processes.append(_Process(run, popen, trace, stderr_path, time.monotonic(), stdout_path=stdout_path))
            if progress:
                progress(run, "started", 0)
        pending = list(processes)
        try:
            _wait(pending, timeout, progress)
        except BaseException:  # Ctrl-C, or a bug of ours: no run outlives verify
            for proc in pending:
                _kill(proc.popen)
                proc.popen.wait()
            raise
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)  # its links only, never what they point to
    for run, _ in jobs:
        if id(run) in folders:
            _name_converted_copy(run, folders[id(run)], os.path.abspath(cwd))  # the paths as the user knows them


def _private_folder(cwd: str, number: int) -> Optional[str]:
    """A folder beside ``cwd`` (so that ``../data`` means from it what it means from ``cwd``) with a symbolic link
    to every entry of ``cwd``: the script, its modules and its data read as from ``cwd``; what a run creates at the
    top is its own. None where it cannot be made (a parent folder this user cannot write): the run goes in ``cwd``."""
    here = os.path.abspath(cwd)
    folder = os.path.join(os.path.dirname(here), f".accelify-verify-{secrets.token_hex(4)}-run{number}")
    try:
        os.mkdir(folder)
        for entry in os.listdir(here):
            os.symlink(os.path.join(here, entry), os.path.join(folder, entry))
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


def _wait(pending: list[_Process], timeout: float, progress: Optional[ProgressCallback]) -> None:
    while pending:
        time.sleep(0.1)
        for proc in list(pending):
            elapsed = time.monotonic() - proc.started
            code = proc.popen.poll()
            if code is None and elapsed > timeout:
                _kill(proc.popen)
                proc.run.timed_out = True
                code = proc.popen.wait()
            if code is None:
                if progress:
                    now = _read_trace(proc.trace, proc.run.processes)[1]
                    taken = now[0] if now else 0
                    if taken != proc.last_steps:
                        proc.last_steps = taken
                        progress(proc.run, "running", taken)
                continue
            pending.remove(proc)
            run = proc.run
            run.returncode = code
            run.seconds = time.monotonic() - proc.started
            run.losses, run.steps, run.ends, run.hook = _read_trace(proc.trace, run.processes)
            _read_checks(run, proc.trace)
            with open(proc.stderr_path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
            run.stderr_tail = lines[-STDERR_TAIL:]
            if os.path.exists(proc.stdout_path):
                with open(proc.stdout_path, encoding="utf-8", errors="replace") as handle:
                    run.stdout = handle.read()
            run.needs_launcher = not run.ok and any(_NEEDS_LAUNCHER.search(line) for line in lines[-60:])
            run.needs_gpu = not run.ok and not run.needs_launcher and any(_NEEDS_GPU.search(line) for line in lines[-60:])
            if progress:
                progress(run, "done", run.steps[0] if run.steps else 0)


def _kill(popen: subprocess.Popen) -> None:
    if not isinstance(popen, subprocess.Popen):  # a Starter's own handle: it knows what to kill
        popen.kill()
        return
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        popen.kill()


def _name_converted_copy(run: Run, copy: str, shown: str) -> None:
    """The checks name the converted copy's temporary file: name it as the user knows it."""

    def renamed(record: dict) -> dict:
        return {key: value.replace(copy, shown) if isinstance(value, str) else value for key, value in record.items()}

    if run.device_error is not None:
        run.device_error = renamed(run.device_error)
    run.effects = {rank: [renamed(event) for event in events] for rank, events in run.effects.items()}
    run.prints = {rank: [renamed(entry) for entry in entries] for rank, entries in run.prints.items()}


def convert_for_verify(path: str, text: str) -> tuple[str, list[str], bool]:
    """(converted text, findings rendered, whether accelify changes the file)."""
    converted, findings, changed, _ = convert_project_for_verify(path, text)
    return converted, findings, changed


def convert_project_for_verify(path: str, text: str) -> tuple[str, list[str], bool, dict[str, str]]:
    """(converted text, findings rendered, whether accelify changes the file, {path: converted text} of
    the modules beside it converted with it)."""
    from accelify.core.pipeline import convert_source

    result = convert_source(text, path)
    if result.error is not None:
        raise VerifyError(result.error)
    findings = [finding.render() for item in (result, *result.companions) for finding in item.findings]
    companions = {c.path: c.output for c in result.companions if c.changed}
    return result.output, findings, result.output != text, companions


def _project_copy(script: Path, converted: str, encoding: str, companions: dict[str, str]) -> Path:
    """A folder that mirrors the script's (a symbolic link per file and folder) with the converted
    script and modules in it as real files: run from there, the script imports the converted modules."""
    root = script.parent
    overlay = Path(tempfile.mkdtemp(prefix="accelify-verify-project-"))
    replaced = {script.resolve(): (converted, encoding)}
    replaced.update({Path(p).resolve(): (text, "utf-8") for p, text in companions.items()})

    def mirror(source: Path, target: Path) -> None:
        for entry in sorted(source.iterdir()):
            into = target / entry.name
            real = entry.resolve()
            if real in replaced:
                text, how = replaced[real]
                into.write_bytes(text.encode(how))
            elif entry.is_dir() and not entry.is_symlink() and any(r.is_relative_to(real) for r in replaced):
                into.mkdir()
                mirror(entry, into)
            else:
                into.symlink_to(real)

    mirror(root, overlay)
    return overlay


def verify(
    path: str,
    *,
    steps: int = DEFAULT_STEPS,
    processes: int = 1,
    rtol: float = 0.0,
    args: Optional[list[str]] = None,
    timeout: float = DEFAULT_TIMEOUT,
    converted_source: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[str] = None,
    progress: Optional[ProgressCallback] = None,
    start: Starter = start_process,
) -> Verification:
    """Convert ``path``, run the original and the converted copy, compare (see the module doc)."""
    from accelify.app.files import SourceError, read_source

    args = list(args or [])
    cwd = cwd or os.getcwd()
    script = Path(cwd, path)
    try:
        source = read_source(str(script))
    except SourceError as exc:
        raise VerifyError(str(exc)) from exc
    if converted_source is None and os.environ.get(CONVERTED_OVERRIDE_VAR):
        converted_source = Path(os.environ[CONVERTED_OVERRIDE_VAR]).read_text(encoding="utf-8")
    companions: dict[str, str] = {}
    if converted_source is None:
        converted_source, findings, changed, companions = convert_project_for_verify(
            os.path.relpath(script), source.text)
    else:
        findings, changed = [], True
    if not changed:
        return Verification(path, steps, rtol, "unchanged",
                            "accelify leaves this file as it is: nothing to verify", EXIT_EQUIVALENT, findings=findings)

    overlay: Optional[Path] = None
    if companions:
        # converted with modules beside it: the copy runs in a mirror of its folder that holds them
        try:
            overlay = _project_copy(script, converted_source, source.encoding, companions)
        except OSError as exc:
            raise VerifyError(f"{path}: cannot make the converted copy of its folder: {exc.strerror or exc}") from exc
        copy = overlay / script.name
        copy_arg = str(copy)
    else:
        # The converted copy sits next to the original, under a name no one uses, and goes afterwards.
        copy = script.with_name(f"_accelify_verify_{script.stem}_{secrets.token_hex(4)}.py")
        try:
            copy.write_text(converted_source, encoding=source.encoding)
        except OSError as exc:
            raise VerifyError(f"{path}: cannot write the converted copy next to it: {exc.strerror or exc}") from exc
        # Both are started as the original would be (`python train.py` from here): the path as given.
        copy_arg = os.path.join(os.path.dirname(path), copy.name)
    workdir = tempfile.mkdtemp(prefix="accelify-verify-")
    try:
        run_env = run_environment(env)
        hook = [sys.executable, "-m", "accelify.runtime.trace"]
        original = Run("original")
        converted = Run("converted")
        jobs = [(original, [*hook, path, *args]), (converted, [*hook, copy_arg, *args])]
        multi = None
        if processes > 1:
            multi = Run(f"converted x{processes}", processes=processes)
            jobs.append((multi, [
                sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                "-m", "accelify.runtime.trace", copy_arg, *args,
            ]))  # fmt: skip
        run_all(jobs, cwd, run_env, steps, timeout, workdir, progress, start)
    finally:
        if overlay is not None:
            shutil.rmtree(overlay, ignore_errors=True)
        else:
            copy.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    for run in (converted, multi):
        if run is not None:
            if overlay is not None:
                _name_converted_copy(run, str(overlay), f"(converted) {script.parent}")
            else:
                _name_converted_copy(run, copy.name, f"{script.name} (converted)")
    result = judge(path, steps, rtol, original, converted, judge_distributed(multi) if multi else None)
    result.findings = findings
    if result.verdict == "different" and result.first_difference is not None:
        _read_ahead(result, path, args, cwd, run_env, steps, timeout, progress, start)
    return result


def _read_ahead(result: Verification, path: str, args: list[str], cwd: str, env: dict[str, str], steps: int,
                timeout: float, progress: Optional[ProgressCallback], start: Starter) -> None:
    """The losses differ: run the original again with its DataLoaders reading one batch ahead, as a prepared
    DataLoader does (``accelify.runtime.trace``, ``ACCELIFY_READ_AHEAD``). The same losses as the conversion's
    then: the verdict is ``identical-read-ahead`` (the global random generator was drawn in another order,
    Accelerate's own, and nothing else differed); else the first verdict stands."""
    ahead = Run("original, reading ahead")
    workdir = tempfile.mkdtemp(prefix="accelify-verify-")
    try:
        run_all([(ahead, [sys.executable, "-m", "accelify.runtime.trace", path, *args])], cwd,
                {**env, "ACCELIFY_READ_AHEAD": "1"}, steps, timeout, workdir, progress, start)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    converted = result.converted
    if converted is None or not ahead.ok or ahead.steps != converted.steps:
        return
    verdict, _ = compare(ahead.losses, converted.losses, result.rtol)
    if verdict not in ("identical", "within-rtol"):
        return
    what = "bit for bit" if verdict == "identical" else f"within a relative {result.rtol:g}"
    result.message = (f"the same {len(ahead.losses)} losses over {ahead.steps[0]} optimizer steps, {what}, as the original "
                      "run with its DataLoaders reading one batch ahead, as Accelerate's prepared DataLoader does "
                      f"(as it is written: {result.message}); the random draws of loading and of training come in "
                      "another order, nothing else differs")
    result.verdict = "identical-read-ahead"
    result.exit_code = _distributed_exit(result.distributed)
