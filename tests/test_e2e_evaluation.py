"""End to end: evaluation and batch-inference scripts (issue 13) converted, on CPU processes.

Each fixture loads a checkpoint the test writes first (a tiny model, fixed seed), runs the model
over a DataLoader (or over a list, split between the processes) and prints or writes its results.
The converted script must print the same lines and write the same files, byte for byte, in one
process as the original, and in two processes (torchrun's environment, gloo) the same global
numbers, printed once (rank 1 prints nothing) and every file written once, with every sample of
the dataset drawn by one of the two processes.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, run_single_process, run_traced, script_env  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402

#: fixture -> (the code that writes the checkpoint it loads (the same keys as its model), the files it
#: writes, its dataset size)
CASES = {
    "evaluate_checkpoint": (
        "net = nn.ModuleDict({'fc1': nn.Linear(8, 16), 'fc2': nn.Linear(16, 4)})\n"
        "torch.save(net.state_dict(), 'checkpoint.pt')\n",
        (), 70,
    ),
    "batch_predictions": (
        "net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))\n"
        "torch.save({'model': net.state_dict(), 'epoch': 3}, 'classifier.pt')\n",
        ("predictions.csv",), 45,
    ),
    "extract_features": (
        "net = nn.ModuleDict({'body': nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 5))})\n"
        "torch.save(net.state_dict(), 'encoder.pt')\n",
        ("features.pt",), 50,
    ),
    "generate_prompts": (  # no DataLoader: a list of prompts split between the processes
        "net = nn.ModuleDict({'embed': nn.Embedding(28, 24), 'rnn': nn.GRU(24, 24, batch_first=True),\n"
        "                     'head': nn.Linear(24, 28)})\n"
        "torch.save(net.state_dict(), 'charlm.pt')\n",
        ("completions.txt",), None,
    ),
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(request, tmp_path_factory):
    name = request.param
    make, files, size = CASES[name]
    source = (FIXTURES / name / "before.py").read_text(encoding="utf-8")
    result = convert_source(source, "before.py")
    assert result.error is None and result.output != source, result.error
    workdir: Path = tmp_path_factory.mktemp(name)
    env = script_env(PYTHONHASHSEED="0")
    scripts = {}
    for run, text in (("original", source), ("one", result.output), ("two", result.output)):
        (workdir / run).mkdir()
        (workdir / run / "make_checkpoint.py").write_text(
            "import torch\nfrom torch import nn\ntorch.manual_seed(1)\n" + make, encoding="utf-8")
        proc = run_single_process(workdir / run / "make_checkpoint.py", env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        scripts[run] = workdir / run / "script.py"
        scripts[run].write_text(text, encoding="utf-8")
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = {run: pool.submit(run_traced, script, env, 2 if run == "two" else 1) for run, script in scripts.items()}
        out = {run: job.result() for run, job in jobs.items()}
    return {"name": name, "files": files, "size": size, "dirs": {r: s.parent for r, s in scripts.items()}, **out}


def test_one_process_prints_and_writes_the_same(runs):
    original, one = runs["original"].stdout[0], runs["one"].stdout[0]
    assert original.strip(), "the original printed nothing"
    assert one == original
    for file in runs["files"]:
        assert _digest(runs["dirs"]["one"] / file) == _digest(runs["dirs"]["original"] / file), file


def test_two_processes_print_the_global_numbers_once(runs):
    rank0, rank1 = runs["two"].stdout
    assert rank0 == runs["original"].stdout[0], "rank 0 did not print the original's numbers"
    assert rank1.strip() == "", f"rank 1 printed:\n{rank1}"


def _same_file(a: Path, b: Path) -> bool:
    """The same bytes; for a saved tensor, the same shape and values up to float rounding (each process runs its
    own batches: a matrix product over 8 rows is not bitwise the one over 16 on every BLAS)."""
    if _digest(a) == _digest(b):
        return True
    if a.suffix != ".pt":
        return False
    import torch

    x, y = torch.load(a), torch.load(b)
    return isinstance(x, torch.Tensor) and x.shape == y.shape and torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_two_processes_write_each_file_once_the_same(runs):
    for file in runs["files"]:
        assert _same_file(runs["dirs"]["two"] / file, runs["dirs"]["original"] / file), file
    saves0, saves1 = (trace["saves"] for trace in runs["two"].traces)
    assert saves1 == [], "rank 1 saved too"
    assert [s["file"] for s in saves0] == [s["file"] for s in runs["original"].traces[0]["saves"]]


def test_two_processes_each_run_their_own_shard(runs):
    if runs["size"] is None:  # a list split between the processes: no loader to trace
        assert [t["loaders"] for t in runs["two"].traces] == [[], []]
        return
    drawn = []
    for trace in runs["two"].traces:
        (loader,) = trace["loaders"]
        drawn.append([i for batch in loader["epochs"][0] for i in batch])
    assert set(drawn[0]) | set(drawn[1]) == set(range(runs["size"])), "a sample was evaluated by no process"
    # each process draws half the batches (the last, uneven batch padded with samples from the start)
    assert abs(len(drawn[0]) - len(drawn[1])) <= 1 and len(drawn[0]) < runs["size"], "the data is not sharded"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_model_is_prepared_for_evaluation_only(name):
    converted = convert_source((FIXTURES / name / "before.py").read_text(encoding="utf-8"), "x.py").output
    assert converted.count("prepare_model(") == 1 and "evaluation_mode=True" in converted
    assert "backward" not in converted and "optimizer" not in converted
    again = convert_source(converted, "x.py")
    assert again.output == converted and not again.findings, "converting the converted script changed it"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_runtime_stand_in_evaluates_the_same(tmp_path, name):
    """`--target runtime` output with accelerate blocked (accelify.runtime's single-process stand-in:
    `prepare_model`, `split_between_processes`, `gather_object`, `gather_for_metrics`): the original's
    output and files."""
    from accelify.core.pipeline import Options

    make, files, _ = CASES[name]
    source = (FIXTURES / name / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "before.py", Options(target="runtime")).output
    assert "from accelify.runtime import" in converted and "accelerate" not in converted.replace("accelerator", "")
    env = script_env(PYTHONHASHSEED="0")
    runs = {}
    for stem, text, block in (("original", source, ()), ("stand_in", converted, ("accelerate",))):
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "make_checkpoint.py").write_text(
            "import torch\nfrom torch import nn\ntorch.manual_seed(1)\n" + make, encoding="utf-8")
        assert run_single_process(tmp_path / stem / "make_checkpoint.py", env).returncode == 0
        (tmp_path / stem / "script.py").write_text(text, encoding="utf-8")
        runs[stem] = run_traced(tmp_path / stem / "script.py", env, block=block)
    assert runs["stand_in"].traces[0]["accelerate_imported"] is False
    assert runs["stand_in"].stdout[0] == runs["original"].stdout[0]
    for file in files:
        assert _digest(tmp_path / "stand_in" / file) == _digest(tmp_path / "original" / file), file


def test_a_torchrun_evaluation_gives_its_global_numbers_once_in_one_and_two_processes(tmp_path):
    """fixtures/ddp_evaluate_runnable: the original's all-reduced counts over a DistributedSampler
    (72 samples: no padding) against the converted script's gathered ones: the same lines from rank 0
    of the original on two processes, of the converted on two (rank 1 silent) and on one."""
    source = (FIXTURES / "ddp_evaluate_runnable" / "before.py").read_text(encoding="utf-8")
    converted = convert_source(source, "before.py").output
    assert "all_reduce" not in converted and "accelerator.reduce" not in converted  # gathered instead
    env = script_env(PYTHONHASHSEED="0")
    runs = {}
    for stem, text, processes in (("original", source, 2), ("two", converted, 2), ("one", converted, 1)):
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "make_checkpoint.py").write_text(
            "import torch\nfrom torch import nn\ntorch.manual_seed(1)\n"
            "torch.save(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).state_dict(), 'checkpoint.pt')\n",
            encoding="utf-8")
        assert run_single_process(tmp_path / stem / "make_checkpoint.py", env).returncode == 0
        (tmp_path / stem / "script.py").write_text(text, encoding="utf-8")
        runs[stem] = run_traced(tmp_path / stem / "script.py", env, processes)
    lines = runs["original"].stdout[0]
    assert "eval_samples 72" in lines and runs["original"].stdout[1].strip() == ""
    assert runs["two"].stdout == [lines, ""]
    assert runs["one"].stdout == [lines]
