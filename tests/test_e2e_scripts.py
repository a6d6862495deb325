"""End-to-end: runnable fixture scripts (synthetic data, one printed line per
training step containing "loss") train the same before and after conversion
on one process, and the converted script trains ONE model on two CPU processes
under torch.distributed.run, each process on its own shard.

Every run goes through tests/e2e_wrapper.py, whose trace records what the script
did (optimizer steps and final parameters, the dataset indices each loader drew,
every torch.save): the checks below read that, not only what the script prints,
so a conversion that trains two separate models, feeds both ranks the same data
or saves twice fails even when its printed losses look right.

Only fixtures whose before.py is a self-contained runnable training script are
listed; e.g. fixtures/device_other_uses is a conversion fixture, not runnable.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, Run, run_traced, script_env  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402


@dataclass(frozen=True)
class Expect:
    """What a runnable fixture prints and does, so that no check compares empty lists."""

    #: prefixes of its evaluation lines (counts over the eval set, learning rates per epoch)
    evals: tuple[str, ...] = ()
    #: ... of which those that must not depend on the number of processes (learning rates per epoch);
    #: the others (accuracy of the model trained) differ, but must count every eval sample once
    invariant: tuple[str, ...] = ()
    #: files it saves with torch.save (once each, in one process and in two)
    saves: tuple[str, ...] = ()
    #: ... of which those saved whenever a metric improves (as often in two processes as they improve there)
    repeated_saves: tuple[str, ...] = ()


RUNNABLE = {
    "mnist_functions": Expect(evals=("Test set",), saves=("mnist_cnn.pt",)),
    "class_trainer": Expect(),
    "gan_two_optimizers": Expect(),
    "data_parallel": Expect(evals=("saved",), invariant=("saved",)),
    "teacher_in_main": Expect(),
    "two_schedulers": Expect(evals=("after epoch",), invariant=("after epoch",)),
    "accumulation_runnable": Expect(evals=("after epoch",), invariant=("after epoch",)),
    "mnist_accel_flag": Expect(evals=("Test set",)),
    "helpers_without_device": Expect(evals=("Test set",)),
    "nested_batch_chunks": Expect(),
    "list_metrics": Expect(evals=("Test set",)),
    "reload_for_test": Expect(evals=("Test set",), saves=("model.pth",)),
    "dict_batch_metrics": Expect(evals=("Test set",)),
    "vae_sampling": Expect(saves=("sampled-0.pt", "sampled-1.pt")),
    "autocast_kept": Expect(),
    "best_checkpoint": Expect(evals=("Validation",), saves=("best.pt",), repeated_saves=("best.pt",)),
    "scheduler_sized_before_prepare": Expect(evals=("after epoch",), invariant=("after epoch",)),
    "loaders_from_helper_runnable": Expect(evals=("Test set",)),
    "trainer_receives_objects": Expect(saves=("checkpoint.pt",)),
    "factory_runnable": Expect(saves=("checkpoint.pt",)),
    # the state handed to a helper's torch.save: was written on every process, the model's keys `module.`-prefixed
    "print_helper": Expect(),  # a helper's print ran on every process (verify: "prints 2 times on rank 1")
    "checkpoint_helper_state": Expect(saves=("checkpoint.pth.tar",) * 2, repeated_saves=("checkpoint.pth.tar",)),
    "factory_dict": Expect(),
    "trainer_builds_optimizer": Expect(evals=("Test set", "after epoch"), invariant=("after epoch",)),
    "counters_on_device": Expect(evals=("Test set",)),
    "gather_batch_index": Expect(evals=("Test set",)),
    "progress_bar": Expect(),
    "host_inputs": Expect(),
    "frozen_backbone": Expect(),
    "device_option": Expect(evals=("Test set",), saves=("model.pt",)),
    "config_device": Expect(),
    "settings_file": Expect(),
    "gpu_index_option": Expect(),
    "optimizer_in_train": Expect(evals=("Test set",)),
}

# "Train Epoch: 1 [0]\tLoss: ..." (mnist_functions) and "epoch 0 step 0 loss ..." (the others).
_EPOCH = re.compile(r"\bepoch:?\s*(\d+)", re.IGNORECASE)
# `.backward(` of anything but the accelerator: a backward left unconverted.
_PLAIN_BACKWARD = re.compile(r"(?<!accelerator)\.backward\(")


def loss_lines(stdout: str) -> list[str]:
    # Case-insensitive: mnist_functions prints "Loss:". One line per step even
    # when a line holds several losses (gan_two_optimizers: loss_d and loss_g).
    return [line for line in stdout.splitlines() if "loss" in line.lower()]


def eval_lines(stdout: str, expect: Expect) -> list[str]:
    return [line for line in stdout.splitlines() if expect.evals and line.startswith(expect.evals)]


def steps_per_epoch(lines: list[str]) -> Counter:
    epochs = Counter()
    for line in lines:
        match = _EPOCH.search(line)
        assert match, f"no epoch number in {line!r}"
        epochs[match.group(1)] += 1
    return epochs


@dataclass
class Case:
    name: str
    expect: Expect
    source: str
    converted: str
    error: object
    workdir: Path


@pytest.fixture(scope="module", params=sorted(RUNNABLE))
def case(request, tmp_path_factory) -> Case:
    name = request.param
    before = FIXTURES / name / "before.py"
    source = before.read_text(encoding="utf-8")
    result = convert_source(source, str(before))
    workdir = tmp_path_factory.mktemp(name)
    for stem in ("before", "after", "after2"):
        (workdir / stem).mkdir()
    (workdir / "before" / "train.py").write_text(source, encoding="utf-8")
    if result.error is None:
        (workdir / "after" / "train.py").write_text(result.output, encoding="utf-8")
        (workdir / "after2" / "train.py").write_text(result.output, encoding="utf-8")
    return Case(name, RUNNABLE[name], source, result.output, result.error, workdir)


@pytest.fixture(scope="module")
def runs(case) -> dict[str, Run]:
    """The original and the converted script on one process, and the converted one on two:
    each in its own directory, so that what one saves cannot be read as the other's."""
    if case.error is not None:
        pytest.skip(f"{case.name} did not convert: {case.error}")
    env = script_env()
    # The three runs are independent (each in its own directory): start them together, most of
    # each is importing torch.
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = {
            "before": pool.submit(run_traced, case.workdir / "before" / "train.py", env),
            "after": pool.submit(run_traced, case.workdir / "after" / "train.py", env),
            "two": pool.submit(run_traced, case.workdir / "after2" / "train.py", env, processes=2),
        }
        return {name: job.result() for name, job in jobs.items()}


def test_converts(case):
    assert case.error is None, case.error
    assert case.converted != case.source
    assert "accelerator.prepare(" in case.converted
    assert "accelerator.backward(" in case.converted
    assert not _PLAIN_BACKWARD.search(case.converted), "a backward was left unconverted"


def test_single_process_trains_the_same(case, runs):
    before, after = runs["before"], runs["after"]
    losses = loss_lines(before.stdout[0])
    assert losses, f"{case.name}/before.py printed no loss lines:\n{before.stdout[0]}"
    # Same seed, same data order, same init, one process: Accelerate must not
    # change a single step (no extra/missing steps, no loss scaling, same
    # batches), so the printed per-step losses match to the last digit...
    assert loss_lines(after.stdout[0]) == losses
    evaluations = eval_lines(before.stdout[0], case.expect)
    assert bool(evaluations) == bool(case.expect.evals), f"eval lines {case.expect.evals}: {evaluations}"
    assert eval_lines(after.stdout[0], case.expect) == evaluations
    # ...and so do the steps taken, the final weights and learning rates, the data drawn and the saves.
    original, converted = before.traces[0], after.traces[0]
    assert original["optimizers"], "the original never stepped an optimizer"
    assert converted["optimizers"] == original["optimizers"]
    assert converted["loaders"] == original["loaders"]
    assert converted["saves"] == original["saves"]
    assert sorted(s["file"] for s in original["saves"]) == sorted(case.expect.saves)


def test_two_processes_train_one_model(case, runs):
    """DDP: both ranks step the same number of times and end with the same weights.
    A model left out of `prepare` trains a separate copy per rank on its own shard."""
    rank0, rank1 = runs["two"].traces
    assert rank0["optimizers"], "no optimizer stepped on two processes"
    assert len(rank0["optimizers"]) == len(rank1["optimizers"]) == len(runs["before"].traces[0]["optimizers"])
    for mine, theirs in zip(rank0["optimizers"], rank1["optimizers"]):
        assert mine["steps"] == theirs["steps"]
        assert mine["checksum"] == theirs["checksum"], "the ranks ended with different weights"


def test_two_processes_shard_the_data(case, runs):
    """Each rank draws its own part of every dataset: together all of the one-process
    epoch, overlapping at most by the padding of one batch (Accelerate's even_batches)."""
    single = runs["before"].traces[0]["loaders"]
    rank0, rank1 = (t["loaders"] for t in runs["two"].traces)
    assert len(rank0) == len(rank1) == len(single)
    for alone, mine, theirs in zip(single, rank0, rank1):
        everything = {i for batch in alone["epochs"][0] for i in batch}
        first0 = [i for batch in mine["epochs"][0] for i in batch]
        first1 = [i for batch in theirs["epochs"][0] for i in batch]
        largest = max(len(batch) for batch in alone["epochs"][0])
        assert set(first0) | set(first1) == everything, "the ranks together missed samples"
        assert len(set(first0) & set(first1)) <= largest, "both ranks drew the same samples"

    # The main process logs ceil(n / 2) steps per epoch of n batches (n steps would mean
    # an unsharded loader).
    expected = Counter({e: math.ceil(n / 2) for e, n in steps_per_epoch(loss_lines(runs["before"].stdout[0])).items()})
    assert steps_per_epoch(loss_lines(runs["two"].stdout[0])) == expected


def test_two_processes_log_once_with_global_results(case, runs):
    out0, out1 = runs["two"].stdout
    assert loss_lines(out0), f"the main process printed no loss lines:\n{out0}"
    # accelerator.print / the main-process check: rank 1 prints nothing at all.
    assert out1 == "", f"rank 1 printed:\n{out1}"
    # Evaluation counts every sample once over both processes (gather_for_metrics, an
    # uneven last batch included), and learning rates after each epoch are the
    # one-process ones (a per-batch scheduler is prepared, a per-epoch one is not).
    evaluations, alone = eval_lines(out0, case.expect), eval_lines(runs["before"].stdout[0], case.expect)
    assert len(evaluations) == len(alone)
    for line, single in zip(evaluations, alone):
        if line.startswith(case.expect.invariant):
            assert line == single
        else:
            seen, total = re.search(r"(\d+) of (\d+)", line).groups()
            assert seen == total, line


def test_two_processes_end_with_the_learning_rates_of_one(case, runs):
    single = [o["lr"] for o in runs["before"].traces[0]["optimizers"]]
    for trace in runs["two"].traces:
        assert [o["lr"] for o in trace["optimizers"]] == single


def test_two_processes_save_once_with_plain_keys(case, runs):
    original = {s["file"]: s for s in runs["before"].traces[0]["saves"]}
    saves = runs["two"].traces[0]["saves"]
    assert not runs["two"].traces[1]["saves"], "rank 1 wrote a checkpoint: every process writes it"
    # Each file once (a best-so-far checkpoint as often as the two-process run improves).
    assert {s["file"] for s in saves} == set(original), "a checkpoint was not written"
    assert all(Counter(s["file"] for s in saves)[f] == 1 for f in original if f not in case.expect.repeated_saves)
    final = runs["two"].traces[0]["optimizers"]
    for save in saves:
        assert save.get("keys") == original[save["file"]].get("keys")
        assert not any(k.startswith("module.") for k in save.get("keys", ()))
        # A save of the trained weights (in one process, exactly the final parameters) holds
        # the weights the two processes trained, not a copy of some rank's own.
        alone = runs["before"].traces[0]["optimizers"]
        if any(original[save["file"]].get("checksum") == o["checksum"] for o in alone):
            assert any(save["checksum"] == o["checksum"] for o in final)
