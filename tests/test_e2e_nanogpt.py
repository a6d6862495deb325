"""End to end: a nanoGPT-shaped script (fixtures/ddp_nanogpt_runnable): the optimizer from the model's own
`configure_optimizers`, `ddp` from the launcher's RANK, random batches drawn per process, gradient
accumulation with `require_backward_grad_sync`. Converted, it trains exactly as the original on two
processes (the same draws, the same losses), and as the original's own single-process path on one."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from accelify.core.pipeline import convert_source
from e2e import FIXTURES, run_traced, script_env

_LINES = re.compile(r"^(?:eval_loss|step) .*$", re.M)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = (FIXTURES / "ddp_nanogpt_runnable" / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "before.py").output
    assert converted != source
    work = tmp_path_factory.mktemp("nanogpt")
    scripts = {}
    for name, text in (("original", source), ("two", converted), ("one", converted), ("alone", source)):
        (work / name).mkdir()
        scripts[name] = work / name / "train.py"
        scripts[name].write_text(text, encoding="utf-8")
    env = script_env(PYTHONHASHSEED="0")
    with ThreadPoolExecutor(max_workers=2) as pool:
        two = {name: pool.submit(run_traced, scripts[name], env, 2) for name in ("original", "two")}
        out = {name: job.result() for name, job in two.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        one = {name: pool.submit(run_traced, scripts[name], env, 1) for name in ("one", "alone")}
        out.update({name: job.result() for name, job in one.items()})
    return out


def test_two_processes_train_exactly_as_the_original(runs):
    original, converted = runs["original"].stdout, runs["two"].stdout
    lines = _LINES.findall(original[0])
    assert len(lines) == 8  # two evaluations, six steps, printed by the master process
    assert _LINES.findall(converted[0]) == lines
    assert _LINES.findall(converted[1]) == [] and converted[1].strip() == "", converted[1]


def test_each_process_draws_its_own_batches_and_the_weights_agree(runs):
    rank0, rank1 = runs["two"].traces
    assert rank0["optimizers"][0]["steps"] == rank1["optimizers"][0]["steps"] == 6
    assert rank0["optimizers"][0]["checksum"] == rank1["optimizers"][0]["checksum"]
    assert runs["two"].traces[0]["optimizers"] == runs["original"].traces[0]["optimizers"]


def test_one_process_trains_as_the_original_single_process_path(runs):
    assert _LINES.findall(runs["one"].stdout[0]) == _LINES.findall(runs["alone"].stdout[0])
    assert runs["one"].traces[0]["optimizers"] == runs["alone"].traces[0]["optimizers"]


def test_the_checkpoint_is_written_once(runs):
    rank0, rank1 = runs["two"].traces
    assert [s["file"] for s in rank0["saves"]] == ["model.pt"] and rank1["saves"] == []
    assert not any(k.startswith("module.") for k in rank0["saves"][0]["keys"])
