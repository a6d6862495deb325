"""Runs a training script for the end-to-end tests and records what it did (see tests/e2e.py).

usage: python e2e_wrapper.py SCRIPT [ARGS...]   (also as torchrun's entry point)

The script runs unchanged through ``runpy``. With ``$E2E_TRACE`` set to a path prefix, a few
hooks watch it, and ``{prefix}.{rank}.json`` receives, when it ends:

- ``optimizers``: for every optimizer that stepped (in the order of its first step), the number
  of steps, a checksum of its parameters after the last step (sum and sum of absolute values, in
  float64) and its learning rates: ranks that really train one model end with equal checksums;
- ``loaders``: for every dataset a DataLoader drew from (in the order of its first batch), the
  indices drawn, one list per pass over it: a prepared loader gives each rank its own shard;
- ``saves``: every ``torch.save`` (``accelerator.save`` goes through it): the file name, the keys
  when it saved a dict, and a checksum of the tensors it saved;
- ``accelerate_imported``: whether the run imported accelerate;
- ``world`` (the size of the process group, at the end or when the script ended it) and ``rank``;
- ``effects`` and ``prints``: the files it wrote, directories it made, archives it extracted, URLs
  it downloaded and how often each line of code printed (``accelify.runtime.checks``).

Every run, traced or not, emulates a GPU's device rules (``accelify.runtime.checks``): a host
tensor meeting one on the accelerator's device, or ``.numpy()`` of one on the device, fails the
run with the line that did it, as it would fail on a GPU.

With ``$E2E_RANK_STDOUT`` set, file descriptor 1 of each rank goes to ``{prefix}.{rank}``, so the
ranks' prints can neither interleave nor be confused with each other.

In a process group (torchrun), the script is followed by a barrier and the group's teardown, and
the process leaves with ``os._exit``: a converted script that does not end with
``accelerator.end_training()`` leaves gloo alive at interpreter exit, where it was seen to abort
now and then ("terminate called without an active exception"): teardown noise, not a conversion
bug. An exception from the script still gives a non-zero exit. The workers an ``mp.spawn`` original
starts leave the same way once their function returns
(``accelify.runtime.trace.leave_spawned_workers_cleanly``).

Importing this file runs nothing: it is a script.
"""
import json
import os
import runpy
import sys

_open = open  # the wrapper's own files are not the script's side effects


def _checksum(tensors):
    total = absolute = 0.0
    for tensor in tensors:
        data = tensor.detach().double()
        total += float(data.sum())
        absolute += float(data.abs().sum())
    return [total, absolute]


def _install_trace(ended):
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader

    optimizers = []  # (optimizer, step count), in order of first step
    loaders = {}  # id(dataset) -> {"dataset_len", "epochs"}, in order of first batch
    saves = []

    def after_step(optimizer, args, kwargs):
        for entry in optimizers:
            if entry[0] is optimizer:
                entry[1] += 1
                return
        optimizers.append([optimizer, 1])

    register_optimizer_step_post_hook(after_step)

    base_iter = dataloader._BaseDataLoaderIter
    original_init, original_next_index = base_iter.__init__, base_iter._next_index

    def init(self, loader):
        original_init(self, loader)
        dataset = self._dataset
        try:
            length = len(dataset)
        except TypeError:
            length = None
        entry = loaders.setdefault(id(dataset), {"dataset_len": length, "epochs": [], "keep": dataset})
        entry["epochs"].append([])
        self._e2e_epoch = entry["epochs"][-1]

    def next_index(self):
        index = original_next_index(self)
        epoch = getattr(self, "_e2e_epoch", None)
        if epoch is not None:
            epoch.append([int(i) for i in index] if isinstance(index, (list, tuple)) else [int(index)])
        return index

    base_iter.__init__, base_iter._next_index = init, next_index

    original_save = torch.save

    def save(obj, f, *args, **kwargs):
        record = {"file": os.path.basename(str(f)) if isinstance(f, (str, os.PathLike)) else None}
        if isinstance(obj, dict):
            record["keys"] = [str(k) for k in obj]
            record["checksum"] = _checksum(v for v in obj.values() if torch.is_tensor(v) and v.is_floating_point())
        saves.append(record)
        return original_save(obj, f, *args, **kwargs)

    torch.save = save

    def report():
        return {
            "ended_world": max((group.size() for group in ended), default=None),
            "optimizers": [
                {
                    "steps": count,
                    "checksum": _checksum(p for group in opt.param_groups for p in group["params"]),
                    "lr": [float(group["lr"]) for group in opt.param_groups],
                }
                for opt, count in optimizers
            ],
            "loaders": [{"dataset_len": e["dataset_len"], "epochs": e["epochs"]} for e in loaders.values()],
            "saves": saves,
            "accelerate_imported": "accelerate" in sys.modules,
        }

    return report


def main():
    rank = int(os.environ.get("RANK", "0"))
    prefix = os.environ.get("E2E_RANK_STDOUT")
    if prefix:
        sys.stdout.flush()
        fd = os.open(f"{prefix}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.close(fd)
    # Groups the script ends stay referenced, and the process leaves with os._exit: a gloo teardown
    # deadlock in torch otherwise (see accelify.runtime.trace.hold_ended_groups).
    from accelify.runtime.trace import hold_ended_groups, leave_spawned_workers_cleanly

    ended = hold_ended_groups()
    leave_spawned_workers_cleanly()  # an mp.spawn original's workers leave as this process does
    trace = os.environ.get("E2E_TRACE")
    report = _install_trace(ended) if trace else None
    # Every run emulates a GPU's device rules, and a traced one records its side effects
    # (accelify.runtime.checks): what a CPU run cannot show otherwise.
    from accelify.runtime import checks

    effects = []
    recorder = checks.install_side_effects(effects.append) if trace else None
    checks.install_device_check()

    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would have it
    distributed = None
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        import torch.distributed as dist

        running = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size() if running else 1
        if report is not None:
            found = report()
            found["effects"], found["prints"] = effects, recorder.summary()
            world = max(world, found.pop("ended_world") or 1)
            with _open(f"{trace}.{rank}.json", "w", encoding="utf-8") as out:
                json.dump({"world": world, "rank": rank, **found}, out)
        if running:
            dist.barrier()
            dist.destroy_process_group()
        distributed = bool(ended)
    if distributed:
        # The script ran to its end and its process group is ended (and held, see
        # hold_ended_groups): leave without the interpreter's teardown, where gloo's
        # threads were also seen to abort ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
