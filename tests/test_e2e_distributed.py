"""End to end: hand-written DDP scripts (ACC018) and their conversions, on CPU processes.

The original is itself a multi-process script (launched by torchrun, or spawning its own workers
with mp.spawn), so it is compared in two processes with the converted one in two, under torchrun:
the same global evaluation numbers, printed once, every rank training one model on its own shard,
the checkpoint written once with plain keys.  The converted script must also run with a plain
``python script.py`` (one process, no launcher), which a torchrun original cannot.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source
from e2e import FIXTURES, free_port, run_traced, script_env

#: fixture -> how the original starts its processes, and the optimizer steps of each of two processes
#: and of one (64 training samples, 8 a batch, 2 epochs; the no_sync fixture steps every 2 batches)
CASES = {
    "ddp_torchrun_runnable": ("torchrun", 8, 16),
    "ddp_spawn_runnable": ("spawn", 8, 16),
    "ddp_single_gpu_path": ("torchrun", 8, 16),
    "ddp_kwargs_no_sync_runnable": ("torchrun", 4, 8),
    "ddp_local_rank_runnable": ("torchrun", 8, 16),  # --local_rank, the "rank 0 first" barrier pair
    "ddp_trainer_gpu_id_runnable": ("torchrun", 8, 16),  # the tutorial series' Trainer holding gpu_id
    "ddp_module_level_runnable": ("torchrun", 8, 16),  # no functions at all
    "ddp_all_gather_runnable": ("torchrun", 8, 16),  # a training loss all_gathered from every rank
    # the ImageNet example's spawn-or-call launch (ACC027): the batch of a machine divided by its
    # processes, so one process takes batches of 16, two take 8 each
    "ddp_spawn_or_call_runnable": ("spawn", 8, 8),
    # Barlow Twins' counted world size (ACC028) and its own optimizer with `def step(self)` (ACC029):
    # the batch of all the processes divided by their number, 8 each on two, 16 on one
    "ddp_counted_world_size_runnable": ("spawn", 8, 8),
    # the torchvision references' `init_distributed_mode(args)` (ACC030) and VICReg's gathering autograd
    # function (accelerate.utils' gather/reduce, PartialState): the batch of all the processes, divided
    "ddp_setup_helper_runnable": ("torchrun", 8, 8),
    # MoCo's batch shuffle in the model: `dist.broadcast` (accelerate.utils' broadcast) and a rank read
    # where no Accelerator is reached (PartialState)
    "ddp_broadcast_runnable": ("torchrun", 8, 16),
    # the old Hugging Face examples' two paths: `--local_rank -1` without a launcher, a process group with one
    "ddp_two_path_runnable": ("torchrun", 8, 16),
    # WZMIAOMIAO's `Process` per rank, started and joined in loops (mp.spawn by hand)
    "ddp_process_loop_runnable": ("spawn", 8, 16),
    # WZMIAOMIAO's launched example: counts summed by a helper of the file, divided by the sampler's total_size
    "ddp_helper_reduced_runnable": ("torchrun", 8, 16),
    # the torchvision references' rank helpers (ACC034): `get_rank()`/`get_world_size()` of the file, asking
    # torch.distributed when a group exists, return PartialState's answers
    "ddp_rank_helpers_runnable": ("torchrun", 8, 16),
    # PyTorch's examples since torch.accelerator: `get_default_backend_for_device`, `set_device_index`, the backend
    # printed (`accelerator.state.backend`)
    "ddp_accelerator_api_runnable": ("torchrun", 8, 16),
}
_EVAL = re.compile(r"^eval_\w+ \S+$", re.M)


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(request, tmp_path_factory):
    source = (FIXTURES / request.param / "before.py").read_text(encoding="utf-8")
    result = convert_source(source, "before.py")
    assert result.error is None and result.output != source, result.error
    workdir: Path = tmp_path_factory.mktemp(request.param)
    scripts = {}
    for name, text in (("original", source), ("two", result.output), ("one", result.output)):
        (workdir / name).mkdir()
        scripts[name] = workdir / name / "train.py"
        scripts[name].write_text(text, encoding="utf-8")
    env = script_env(PYTHONHASHSEED="0", SPAWN_PORT=str(free_port()))
    spawn = CASES[request.param][0] == "spawn"  # the original starts its two workers itself
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {
            "original": pool.submit(run_traced, scripts["original"], env, 1 if spawn else 2),
            "two": pool.submit(run_traced, scripts["two"], env, 2),
        }
        out = {name: job.result() for name, job in jobs.items()}
    out["one"] = run_traced(scripts["one"], env, 1)
    out["spawn"] = spawn
    out["name"] = request.param
    out["steps"] = CASES[request.param][1:]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_process_group_plumbing_is_gone(name):
    converted = convert_source((FIXTURES / name / "before.py").read_text(encoding="utf-8"), "x.py").output
    converted = converted.split('"""', 2)[2]  # the code, not the docstring that describes the original
    # `--local_rank` stays an option (torch.distributed.launch passes it), its default the launcher's
    converted = "\n".join(line for line in converted.splitlines() if "add_argument(" not in line)
    for gone in ("init_process_group", "destroy_process_group", "DistributedSampler", "DDP(", "set_device",
                 "LOCAL_RANK", "MASTER_", "dist.", "mp.", "set_epoch", ".module"):
        assert gone not in converted, gone
    assert "accelerator.end_training()" in converted
    # every barrier is a wait_for_everyone(), or one of the two of a "rank 0 first" pair
    original = converted_from(name)
    # (the barrier of a set-up helper goes with it: ACC030)
    original = re.sub(r"\ndef init_distributed_mode\(.*?\n\n\n", "\n", original, flags=re.S)
    barriers = original.count("barrier()")
    assert barriers == converted.count("accelerator.wait_for_everyone()") + 2 * converted.count("main_process_first()")


def converted_from(name):
    return (FIXTURES / name / "before.py").read_text(encoding="utf-8")


def test_two_processes_give_the_original_global_numbers_once(runs):
    original, converted = runs["original"].stdout, runs["two"].stdout
    numbers = _EVAL.findall(original[0])  # (spawned workers write to the parent's stdout)
    assert numbers, f"the original printed no eval lines:\n{original[0]}"
    assert "eval_samples 70" in numbers  # the original's own all-reduce: the whole set
    if runs["name"] == "ddp_all_gather_runnable":
        assert numbers.count("eval_losses_gathered 2") == 2 and "eval_losses_finite True" in numbers
    samples = [line for line in _EVAL.findall(converted[0]) if line.startswith("eval_samples")]
    assert samples == [line for line in numbers if line.startswith("eval_samples")]
    assert _EVAL.findall(converted[1]) == [], "rank 1 printed the evaluation too"
    assert converted[1].strip() == "", f"rank 1 printed:\n{converted[1]}"


def test_two_processes_train_one_model_on_their_own_shards(runs):
    rank0, rank1 = runs["two"].traces
    assert rank0["optimizers"] and len(rank0["optimizers"]) == len(rank1["optimizers"])
    for mine, theirs in zip(rank0["optimizers"], rank1["optimizers"]):
        assert mine["steps"] == theirs["steps"] == runs["steps"][0]
        assert mine["checksum"] == theirs["checksum"], "the ranks ended with different weights"
    train0, train1 = rank0["loaders"][0]["epochs"][0], rank1["loaders"][0]["epochs"][0]
    drawn0, drawn1 = {i for b in train0 for i in b}, {i for b in train1 for i in b}
    assert drawn0 | drawn1 == set(range(64)) and not drawn0 & drawn1, "the training set is not sharded"


def test_the_checkpoint_is_written_once_with_plain_keys(runs):
    rank0, rank1 = runs["two"].traces
    saves = "torch.save(" in converted_from(runs["name"])
    if not runs["original"].traces[0]["saves"] and not saves:  # it saves nothing
        assert rank0["saves"] == rank1["saves"] == []
        return
    if not runs["original"].traces[0]["saves"]:  # a spawned original saves in its workers, which are not traced
        assert {s["file"] for s in rank0["saves"]} == {"model.pt"} and rank1["saves"] == []  # once an epoch
        assert not any(k.startswith("module.") for k in rank0["saves"][-1]["keys"])
        assert rank0["saves"][-1]["checksum"] == rank0["optimizers"][0]["checksum"]
        return
    assert [s["file"] for s in rank0["saves"]] == ["model.pt"] and rank1["saves"] == []
    assert rank0["saves"][0]["keys"] == runs["original"].traces[0]["saves"][0]["keys"] == [
        k for k in rank0["saves"][0]["keys"] if not k.startswith("module.")]
    assert rank0["saves"][0]["checksum"] == rank0["optimizers"][0]["checksum"]


def test_one_process_runs_without_a_launcher(runs):
    out = runs["one"].stdout[0]
    assert _EVAL.findall(out).count("eval_samples 70") == 2, out
    if runs["name"] == "ddp_all_gather_runnable":  # one process: a list of one
        assert _EVAL.findall(out).count("eval_losses_gathered 1") == 2, out
    assert runs["one"].traces[0]["optimizers"][0]["steps"] == runs["steps"][1]  # every batch of both epochs
    if runs["original"].traces[0]["saves"] or "torch.save(" in converted_from(runs["name"]):
        assert runs["one"].traces[0]["saves"][0]["file"] == "model.pt"


def test_a_single_process_path_trains_the_same(tmp_path):
    """``ddp_single_gpu_path`` also runs without a launcher: there the converted script must train
    exactly as the original's own single-process path (same losses, evaluation, weights)."""
    name = "ddp_single_gpu_path"
    source = (FIXTURES / name / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "before.py").output
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "train.py").write_text(source, encoding="utf-8")
    (tmp_path / "b" / "train.py").write_text(converted, encoding="utf-8")
    env = script_env(PYTHONHASHSEED="0")
    with ThreadPoolExecutor(max_workers=2) as pool:
        original, mine = pool.map(lambda d: run_traced(tmp_path / d / "train.py", env, 1), ["a", "b"])
    assert _EVAL.findall(original.stdout[0]) == _EVAL.findall(mine.stdout[0])
    assert original.traces[0]["optimizers"] == mine.traces[0]["optimizers"]
    assert original.traces[0]["loaders"] == mine.traces[0]["loaders"]
