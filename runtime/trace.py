"""The tracing hook of ``accelify verify``: run a training script and record its losses.

usage: python -m accelify.runtime.trace SCRIPT [ARGS...]   (also as torchrun's ``-m`` entry point)

The script runs unchanged, as ``python SCRIPT ARGS`` would run it (``runpy``, ``__main__``,
``sys.argv``, ``sys.path[0]`` its folder), with a few hooks on torch. Nothing of the user's is
edited and no ``sitecustomize`` is shadowed: the hook is this module, started in its place.

Environment:

- ``ACCELIFY_TRACE``: a path prefix. Rank ``r`` (``$RANK``, 0 without a launcher) appends JSON lines
  to ``{prefix}.{r}.jsonl`` as it goes (so a run killed for hanging still tells how far it got):
  ``{"event": "start", "rank", "world", "pid", "hook"}``, ``{"event": "loss", "step", "value"}``
  for every backward pass, ``{"event": "step", "steps"}`` after every optimizer step and
  ``{"event": "end", "reason", "steps", "world", "error"}`` when the script ends.
- ``ACCELIFY_CHECKS``: the checks of ``accelify.runtime.checks`` to run, comma-separated:
  ``device`` (the emulation of a GPU's device rules: a mismatch is recorded as
  ``{"event": "device", "file", "line", "code", "name", "op", "message"}`` and raised, as CUDA
  would) and ``effects`` (files written, directories made, archives extracted, URLs downloaded:
  ``{"event": "effect", "kind", "path", "file", "line", "code"}``, the first print of each line of
  code too, and ``{"event": "prints", "counts": [...]}`` when the script ends). ``accelify verify``
  runs both.
- ``ACCELIFY_READ_AHEAD``: set (``accelify verify`` sets it for a second run of the original when the first
  one's losses differ), every ``torch.utils.data.DataLoader`` reads the next batch before it hands out the
  current one, as Accelerate's prepared DataLoader does (``DataLoaderShard.__iter__``, which looks one batch
  ahead to know the last one): the random draws of loading (augmentations, an iterator's base seed) then come
  in the same order as in a converted script, around the training step's own draws (dropout, noise).
- ``ACCELIFY_TRACE_STEPS``: after that many optimizer steps (0 or unset: no limit) the process
  ends cleanly: the step hook raises ``StepLimitReached`` (a ``SystemExit(0)``, which no
  ``except Exception`` catches), the end is recorded, and under a process group every rank (they
  all reach the same step) meets a barrier, destroys the group and leaves with ``os._exit(0)``
  (gloo's threads were seen to abort in the interpreter's own teardown).

What is recorded as a loss: the value that is differentiated, once per backward pass,
as a float of the detached tensor (a sequence of tensors: the sum of their values):

- ``Tensor.backward`` and ``torch.autograd.backward`` (the first calls the second: recorded once);
- ``Accelerator.backward(loss)``, hooked when accelerate is imported: recorded as
  ``loss / gradient_accumulation_steps``, the value Accelerate differentiates, and the torch
  backward it calls inside is not recorded again. A hand-accumulating original divides its loss
  before ``loss.backward()``: both sides record the divided loss, which is what is comparable.

Each loss carries ``step``: the number of optimizer steps taken before it (several backward
passes share a step under gradient accumulation). Optimizer steps are counted with torch's global
optimizer step hooks, so any ``torch.optim.Optimizer`` counts (Accelerate's prepared optimizer
steps its inner optimizer only on accumulation boundaries: those are the steps counted).

Determinism: one torch thread, ``torch.use_deterministic_algorithms(True, warn_only=True)``, and the
global generators of ``random``, NumPy and torch seeded with 0 before the script starts (all three
are seeded from the operating system otherwise: a script that seeds nothing, or draws its own seed
with ``random.randint(1, 10000)``, would train differently on every run, original and conversion
alike). A script that seeds them
itself overrides this, as it would on its own.

This module depends on torch only (never libcst, rich or typer). Importing it runs nothing.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from accelify.runtime.checks import after_import

TRACE_VAR = "ACCELIFY_TRACE"
STEPS_VAR = "ACCELIFY_TRACE_STEPS"
CHECKS_VAR = "ACCELIFY_CHECKS"
READ_AHEAD_VAR = "ACCELIFY_READ_AHEAD"


class StepLimitReached(SystemExit):
    """Raised from the optimizer step hook once the step limit is reached: a clean exit (code 0)."""

    def __init__(self) -> None:
        super().__init__(0)


class _Recorder:
    def __init__(self, path: str, limit: int, rank: int) -> None:
        self.pid = os.getpid()
        self.limit = limit
        self.rank = rank
        self.steps = 0
        self.depth = 0  # > 0 inside a backward already recorded
        self.ended = False
        self.effects = None  # accelify.runtime.checks.SideEffects, when that check runs
        self.out = open(path, "a", encoding="utf-8")

    def write(self, **event) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker
            return
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def loss(self, value) -> None:
        self.write(event="loss", step=self.steps, value=value)

    def step(self) -> None:
        if os.getpid() != self.pid:
            return
        self.steps += 1
        self.write(event="step", steps=self.steps)
        if self.limit and self.steps >= self.limit:
            raise StepLimitReached()

    def end(self, reason: str, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if self.effects is not None:
            self.write(event="prints", counts=self.effects.summary())
        self.write(event="end", reason=reason, steps=self.steps, world=_world(), error=error)


def _world() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:  # pragma: no cover - a broken torch.distributed: the launcher's word
        pass
    return int(os.environ.get("WORLD_SIZE", "1"))


def _value(tensors) -> float:
    import torch

    if torch.is_tensor(tensors):
        tensors = [tensors]
    total = 0.0
    for tensor in tensors:
        if torch.is_tensor(tensor):
            total += float(tensor.detach().double().sum())
    return total


def _seed_host_generators() -> None:
    """Seed the global generators of ``random``, torch and (when installed) NumPy."""
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return
    numpy.random.seed(0)


def _install(recorder: _Recorder) -> None:
    import torch
    import torch.autograd
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
    except Exception:  # pragma: no cover - older torch
        pass

    def recorded(function, value_of):
        def wrapper(*args, **kwargs):
            if recorder.depth:
                return function(*args, **kwargs)
            recorder.loss(value_of(*args, **kwargs))
            recorder.depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                recorder.depth -= 1

        wrapper.__wrapped__ = function
        wrapper.__name__ = getattr(function, "__name__", "backward")
        wrapper.__doc__ = getattr(function, "__doc__", None)
        return wrapper

    torch.Tensor.backward = recorded(torch.Tensor.backward, lambda self, *a, **k: _value(self))
    torch.autograd.backward = recorded(
        torch.autograd.backward, lambda tensors=None, *a, **k: _value(tensors if tensors is not None else k.get("tensors"))
    )

    def accelerator_loss(self, loss, *args, **kwargs):
        return _value(loss) / getattr(self, "gradient_accumulation_steps", 1)

    def patch_accelerate(module) -> None:
        cls = getattr(module, "Accelerator", None)
        if cls is not None and not hasattr(cls.backward, "__wrapped__"):
            cls.backward = recorded(cls.backward, accelerator_loss)

    after_import("accelerate.accelerator", patch_accelerate)

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: recorder.step())
    hold_ended_groups()


#: Process groups the script ended, kept referenced until the process leaves (see below).
_ENDED_GROUPS: list = []


def hold_ended_groups() -> list:
    """Keep every process group the script ends (``destroy_process_group()``,
    ``accelerator.end_training()``) referenced here, and return that list; ``_teardown`` then leaves
    with ``os._exit`` (so does the tests' e2e wrapper, which uses this too).

    With gloo, torch can deadlock when the last reference to an ended group is a DDP model's
    reducer freed with the GIL held (the script's ``main()`` returning): the group's destructor
    joins its worker thread, which waits for the GIL to free the tensors of a finished
    all_gather. Seen in about 1 of 20 two-process runs of a converted script; held here, the group
    is never destroyed while the GIL is held."""
    import torch.distributed as dist

    if not dist.is_available():
        return _ENDED_GROUPS
    destroy = dist.destroy_process_group

    def destroy_process_group(group=None, *args, **kwargs):
        if dist.is_initialized():
            _ENDED_GROUPS.append(group if group is not None else dist.distributed_c10d._get_default_group())
        return destroy(group, *args, **kwargs)

    destroy_process_group.__wrapped__ = destroy
    dist.destroy_process_group = destroy_process_group
    return _ENDED_GROUPS


class _LeavesWhenDone:
    """A worker function for ``torch.multiprocessing`` that leaves its process with ``os._exit(0)``
    once the function returns, its ended groups held (``hold_ended_groups``). Picklable: the
    spawned process imports this module and the wrapped function as ``spawn`` would."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args) -> None:
        hold_ended_groups()
        self.fn(*args)  # an exception still goes to torch's worker wrapper and exits non-zero
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def leave_spawned_workers_cleanly() -> None:
    """Have the workers ``torch.multiprocessing.spawn`` / ``start_processes`` starts leave as this
    module's processes do: a worker that returns leaves with ``os._exit(0)``, not through the
    interpreter's teardown, where gloo's threads were seen to abort it now and then ("terminate
    called without an active exception", about 1 run in 6 of an ``mp.spawn`` script's two workers),
    and the parent's ``join`` then fails the run. The worker's own work is untouched."""
    try:
        import torch.multiprocessing.spawn  # noqa: F401  (the module: the package's `spawn` is the function)
    except ImportError:
        return
    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    start = spawn_module.start_processes
    if getattr(start, "__wrapped__", None) is not None:
        return
    # by its importable name: under `python -m accelify.runtime.trace` this module is __main__
    from accelify.runtime.trace import _LeavesWhenDone as leaves_when_done

    def start_processes(fn, *args, **kwargs):
        return start(leaves_when_done(fn), *args, **kwargs)

    start_processes.__wrapped__ = start
    spawn_module.start_processes = start_processes  # what spawn() calls
    import torch.multiprocessing as multiprocessing

    if multiprocessing.start_processes is start:  # the same function, re-exported
        multiprocessing.start_processes = start_processes


def _install_checks(names: str, recorder: _Recorder | None) -> None:
    """Install the checks ``names`` lists (see ``ACCELIFY_CHECKS``), recording to ``recorder``."""
    from accelify.runtime import checks

    wanted = {name.strip() for name in names.split(",") if name.strip()}
    if "effects" in wanted and recorder is not None:
        recorder.effects = checks.install_side_effects(lambda event: recorder.write(**event))
    if "device" in wanted:
        checks.install_device_check(None if recorder is None else lambda details: recorder.write(event="device", **details))


def _read_ahead() -> None:
    """Every DataLoader reads one batch ahead of the one it hands out (see ``ACCELIFY_READ_AHEAD``)."""
    from torch.utils.data import DataLoader

    plain = DataLoader.__iter__

    def ahead(self):
        batches = plain(self)
        try:
            current = next(batches)
        except StopIteration:
            return
        for following in batches:
            yield current
            current = following
        yield current

    DataLoader.__iter__ = ahead  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m accelify.runtime.trace SCRIPT [ARGS...]\n")
        raise SystemExit(2)
    script = argv[0]
    rank = int(os.environ.get("RANK", "0"))
    prefix = os.environ.get(TRACE_VAR)
    recorder = None
    if prefix:
        recorder = _Recorder(f"{prefix}.{rank}.jsonl", int(os.environ.get(STEPS_VAR, "0") or 0), rank)
        recorder.write(event="start", rank=rank, world=int(os.environ.get("WORLD_SIZE", "1")), pid=recorder.pid,
                       hook=os.path.abspath(__file__))
        _install(recorder)
    _install_checks(os.environ.get(CHECKS_VAR, ""), recorder)
    if os.environ.get(READ_AHEAD_VAR):
        _read_ahead()
    _seed_host_generators()
    leave_spawned_workers_cleanly()

    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would have it
    stopped = False
    try:
        runpy.run_path(script, run_name="__main__")
    except StepLimitReached:
        stopped = True
        if recorder is not None:
            recorder.end("steps")
    except SystemExit as exc:
        if recorder is not None:
            code = exc.code
            recorder.end("finished" if code in (None, 0) else "exit", None if code in (None, 0) else f"exit({code!r})")
        raise
    except BaseException as exc:
        if recorder is not None:
            recorder.end("error", f"{type(exc).__name__}: {exc}"[:500])
        raise
    else:
        if recorder is not None:
            recorder.end("finished")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    _teardown(stopped)


def _teardown(stopped: bool) -> None:
    """Leave cleanly. In a process group: a barrier, the group destroyed, ``os._exit(0)``."""
    dist = sys.modules.get("torch.distributed")
    running = dist is not None and dist.is_available() and dist.is_initialized()
    if running:
        dist.barrier()
        dist.destroy_process_group()
    if running or _ENDED_GROUPS:  # the groups are held: leave without destroying them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if stopped:
        raise SystemExit(0)


if __name__ == "__main__":
    main()
