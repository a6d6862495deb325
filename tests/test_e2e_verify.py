"""End-to-end: `accelify verify` (a subprocess, `python -m accelify verify ... --format json`) over
runnable fixtures and examples/train.py: the original and the converted copy run on the CPU
through the tracing hook (accelify.runtime.trace, this checkout's) and pass the same losses to
backward; a converted copy that changes the learning rate is reported as different at the first
step it trains with it; a script with arguments gets them (`-- --epochs 1`); an original that
needs a GPU is reported as such; the converted copy is removed afterwards."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, REPO, STUBS, run, script_env, start_forked  # noqa: E402
from test_e2e_scripts import RUNNABLE  # noqa: E402

from accelify.core.pipeline import convert_source  # noqa: E402
from accelify.app.verify import verify  # noqa: E402


def _verify(folder: Path, *args: str, env: dict[str, str] | None = None, expect: int = 0, cli: bool = False) -> dict:
    """``accelify verify --format json ARGS`` in ``folder``: its JSON result. With ``cli``, the command itself;
    else the same ``verify`` call in this process, its runs forked from the tests' zygote (no torch import for
    each: the CLI's own path is tested with ``cli``)."""
    env = env or script_env()
    before = sorted(p.name for p in folder.iterdir())
    if cli:
        proc = run([sys.executable, "-m", "accelify", "verify", "--format", "json", *args], folder, env)
        assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        result = json.loads(proc.stdout)
    else:
        path, options = args[0], dict(zip(args[1::2], args[2::2]))
        converted = env.pop("ACCELIFY_VERIFY_CONVERTED", None)
        outcome = verify(path, steps=int(options.pop("--steps", 20)), processes=int(options.pop("--processes", 1)),
                         cwd=str(folder), env=env, start=start_forked,
                         converted_source=Path(converted).read_text(encoding="utf-8") if converted else None)
        assert not options, options
        assert outcome.exit_code == expect, (outcome.exit_code, outcome.verdict, outcome.message)
        result = json.loads(json.dumps(outcome.to_dict()))
    # the converted copy is gone (files the script itself writes aside)
    assert not [p.name for p in folder.iterdir() if p.name.startswith("_accelify_verify_")]
    assert set(before) <= {p.name for p in folder.iterdir()}
    for side in ("original", "converted"):
        if result[side] is not None and result[side]["hook"] is not None:
            assert Path(result[side]["hook"]).resolve() == (REPO / "runtime" / "trace.py").resolve()
    return result


def _fixture(tmp_path: Path, name: str) -> Path:
    shutil.copy(FIXTURES / name / "before.py", tmp_path / "train.py")
    return tmp_path


@pytest.mark.parametrize(
    "name, steps, losses_per_step",
    [
        ("docs", 4, 1),  # the docs golden, through tests/stubs (transformers, datasets)
        ("accumulation_runnable", 3, 4),  # hand-written accumulation -> accelerator.accumulate
        ("factory_runnable", 4, 1),  # objects from a factory, a trainer class handed them
    ],
)
def test_fixtures_verify_as_identical(tmp_path, name, steps, losses_per_step):
    env = script_env()
    if name == "docs":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), env.get("PYTHONPATH", "")) if p)
    result = _verify(_fixture(tmp_path, name), "train.py", "--steps", str(steps), env=env)
    assert result["verdict"] == "identical", result["message"]
    assert result["exit_code"] == 0
    assert result["original"]["steps"] == result["converted"]["steps"] == [steps]
    assert result["original"]["ends"] == ["steps"]  # stopped by the hook, not finished
    rows = result["rows"]
    assert len(rows) == steps * losses_per_step
    assert [row["step"] for row in rows] == [i // losses_per_step for i in range(len(rows))]
    assert all(row["difference"] == 0 for row in rows)


def test_a_changed_learning_rate_is_reported_at_its_step(tmp_path):
    folder = _fixture(tmp_path, "accumulation_runnable")
    converted = convert_source((folder / "train.py").read_text(encoding="utf-8"), "train.py").output
    assert "lr=0.1" in converted
    broken = tmp_path / "broken.txt"
    broken.write_text(converted.replace("lr=0.1", "lr=0.2"), encoding="utf-8")
    env = {**script_env(), "ACCELIFY_VERIFY_CONVERTED": str(broken)}
    result = _verify(folder, "train.py", "--steps", "3", env=env, expect=1)
    assert result["verdict"] == "different"
    first = result["first_difference"]
    # the 4 losses of step 0 are computed before any update: the same; the first update differs
    assert (first["index"], first["step"]) == (4, 1), result["message"]
    assert first["original"] != first["converted"]
    assert all(row["difference"] == 0 for row in result["rows"][:4])
    assert "step 1" in result["message"]


def test_examples_train_on_one_and_two_processes_as_the_docs_show(tmp_path):
    """docs/verify.md's `accelify verify examples/train.py --steps 6 --processes 2`: its table is this run's."""
    shutil.copy(REPO / "examples" / "train.py", tmp_path / "train.py")
    result = _verify(tmp_path, "train.py", "--steps", "6", "--processes", "2")
    assert result["verdict"] == "identical" and len(result["rows"]) == 6
    distributed = result["distributed"]
    assert distributed["verdict"] == "ok", distributed["message"]
    assert distributed["run"]["steps"] == [6, 6] and distributed["run"]["ends"] == ["steps", "steps"]
    assert all(row["distributed"] is not None for row in result["rows"])
    # each rank trains on its own half of a batch: not the one-process losses
    assert [row["distributed"] for row in result["rows"]] != [row["original"] for row in result["rows"]]
    page = (REPO / "docs" / "verify.md").read_text(encoding="utf-8")
    assert "$ accelify verify examples/train.py --steps 6 --processes 2\n" in page
    # the page's table, row by row: the one-process losses as printed; rank 0's on two processes up to float
    # rounding (6e-8 apart between runs on a loaded machine: the two processes' reductions are not bitwise fixed)
    table = {int(m[1]): m.groups()[1:] for m in re.finditer(
        r"│\s*(\d+)\s*│\s*(\S+)\s*│\s*(\S+)\s*│\s*(\S+)\s*│\s*(\S+)\s*│", page)}
    for row in result["rows"]:
        original, converted, difference, distributed = table[row["step"]]
        assert (original, converted, difference) == (f"{row['original']:.8g}", f"{row['converted']:.8g}", "0"), row
        assert abs(float(distributed) - row["distributed"]) <= 1e-6 * abs(row["distributed"]), (distributed, row)


def test_script_arguments_after_double_dash_and_text_output(tmp_path):
    folder = _fixture(tmp_path, "mnist_functions")
    # 128 samples in batches of 64: 2 steps an epoch; --epochs 1 ends both runs after 2 steps
    args = ["--", "--epochs", "1", "--batch-size", "64", "--no-save-model"]
    proc = run([sys.executable, "-m", "accelify", "verify", "train.py", "--steps", "20", *args], folder, script_env())
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "step" in proc.stdout and "original" in proc.stdout and "difference" in proc.stdout
    assert "identical: the same 2 losses over 2 optimizer steps, bit for bit" in proc.stdout
    assert not (folder / "mnist_cnn.pt").exists()  # --no-save-model reached both runs
    # not a terminal: plain progress lines on stderr
    assert "original: started" in proc.stderr
    assert "original: ok after" in proc.stderr and "converted: ok after" in proc.stderr
    assert not [p.name for p in folder.iterdir() if p.name.startswith("_accelify_verify_")]


def _placed_with_cuda(first_line: str) -> str:
    """A script written for a GPU: the model and the batches placed with `.cuda()`, after ``first_line``."""
    return (
        "import torch\n"
        "from torch import nn\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "\n"
        f"{first_line}\n"
        "loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)\n"
        "model = nn.Linear(4, 1).cuda()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    x, y = x.cuda(), y.cuda()\n"
        "    loss = nn.functional.mse_loss(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )


def test_an_original_that_needs_a_gpu(tmp_path):
    """`torch.cuda.set_device(0)` needs a CUDA driver (the conversion removes it); `.cuda()` alone runs on the
    emulated device (the next test)."""
    (tmp_path / "train.py").write_text(_placed_with_cuda("torch.cuda.set_device(0)"), encoding="utf-8")
    result = _verify(tmp_path, "train.py", "--steps", "2", expect=3, cli=True)
    assert result["verdict"] == "failed"
    assert "original" in result["message"] and "needs a GPU" in result["message"]
    assert result["original"]["returncode"] == 1 and result["original"]["stderr_tail"]
    assert result["converted"]["state"] == "ok"


def test_an_original_placed_with_cuda_runs_on_the_emulated_device(tmp_path):
    """`.cuda()` of the model and the batches, as a script written for a GPU has it: the emulation places them
    on the accelerator's device, as `.to("cuda")` (torch's own `.cuda()` raises without a driver), so the
    original and the conversion are compared."""
    (tmp_path / "train.py").write_text(_placed_with_cuda("torch.manual_seed(0)"), encoding="utf-8")
    result = _verify(tmp_path, "train.py", "--steps", "2", expect=0)
    assert result["verdict"] == "identical", result["message"]
    assert result["original"]["state"] == "ok" and result["converted"]["state"] == "ok"


# Every runnable fixture of tests/test_e2e_scripts.py, and the DDP fixture whose original also runs
# in one process without a launcher. The runs are forked from the tests' zygote (verify's `start`
# hook, tests/e2e.py): the same commands, without importing torch again for each.
_EVERY = sorted([*RUNNABLE, "ddp_single_gpu_path"])


@pytest.mark.parametrize("name", _EVERY)
def test_every_runnable_fixture_verifies_as_identical_and_runs_on_two_processes(tmp_path, name):
    folder = _fixture(tmp_path, name)
    result = verify("train.py", steps=4, processes=2, cwd=str(folder), env=script_env(), start=start_forked)
    assert result.verdict == "identical", result.message
    assert result.exit_code == 0
    assert result.original.steps == result.converted.steps and result.original.steps[0] > 0
    assert result.original.losses and len(result.rows) == len(result.original.losses)
    assert result.distributed.verdict == "ok", result.distributed.message
    ranks = result.distributed.run.steps
    assert len(ranks) == 2 and ranks[0] == ranks[1] > 0
    assert not [p.name for p in folder.iterdir() if p.name.startswith("_accelify_verify_")]


def test_a_torchrun_original_is_reported_as_needing_a_launcher(tmp_path):
    """A DDP original that reads RANK/WORLD_SIZE cannot run in one process: verify says so (not
    "needs a GPU"), exits 3, and still runs the converted script in one process and in two."""
    folder = _fixture(tmp_path, "ddp_torchrun_runnable")
    result = verify("train.py", steps=4, processes=2, cwd=str(folder), env=script_env(), start=start_forked)
    assert (result.verdict, result.exit_code) == ("failed", 3)
    assert result.original.needs_launcher and not result.original.needs_gpu
    assert "needs a launcher" in result.message and "--processes N" in result.message
    assert result.converted.ok and result.converted.steps == [4]
    assert result.distributed.verdict == "ok" and result.distributed.run.steps == [4, 4]


def test_an_evaluation_script_verifies_by_its_printed_output(tmp_path):
    """fixtures/batch_predictions (issue 13): no backward pass, so verify compares what the original
    and the converted script print; two processes end cleanly."""
    folder = _fixture(tmp_path, "batch_predictions")
    proc = run([sys.executable, "-c", "import torch; from torch import nn; torch.manual_seed(1); torch.save("
                "{'model': nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).state_dict()}, 'classifier.pt')"],
               folder, script_env())
    assert proc.returncode == 0, proc.stderr
    result = verify("train.py", processes=2, cwd=str(folder), env=script_env(), start=start_forked)
    assert (result.verdict, result.exit_code) == ("same-output", 0), result.message
    assert "wrote 45 predictions" in result.original.stdout
    assert result.distributed.verdict == "ok", result.distributed.message


def test_a_host_tensor_fed_to_the_prepared_model_would_fail_on_a_gpu(tmp_path):
    """verify runs every script with the device check (accelify.runtime.checks): a prediction on a
    tensor left on the host after training is reported with its line, though the CPU run works."""
    folder = tmp_path
    shutil.copy(REPO / "examples" / "train.py", folder / "train.py")
    converted = convert_source((folder / "train.py").read_text(encoding="utf-8"), "train.py").output
    broken = tmp_path / "broken.txt"
    text = converted.rstrip("\n") + "\nsample = features[0]\nprint(model(sample[None]))\n"
    broken.write_text(text, encoding="utf-8")
    line = text.splitlines().index("print(model(sample[None]))") + 1
    env = {**script_env(), "ACCELIFY_VERIFY_CONVERTED": str(broken)}
    result = _verify(folder, "train.py", "--steps", "100", env=env, expect=1)
    assert result["verdict"] == "would-fail-on-gpu"
    assert result["message"].startswith(f"train.py (converted):{line} `print(model(sample[None]))`: `sample` is on the host")
    assert result["converted"]["device_error"]["line"] == line
    assert result["original"]["device_error"] is None  # the original placed nothing on the emulated device


def test_a_file_written_by_every_process_is_reported(tmp_path):
    folder = tmp_path
    shutil.copy(REPO / "examples" / "train.py", folder / "train.py")
    converted = convert_source((folder / "train.py").read_text(encoding="utf-8"), "train.py").output
    broken = tmp_path / "broken.txt"
    text = converted.rstrip("\n") + '\nwith open("log.txt", "w") as log:\n    log.write("done")\n'
    broken.write_text(text, encoding="utf-8")
    line = text.splitlines().index('with open("log.txt", "w") as log:') + 1
    env = {**script_env(), "ACCELIFY_VERIFY_CONVERTED": str(broken)}
    result = _verify(folder, "train.py", "--steps", "100", "--processes", "2", env=env, expect=1)
    assert result["verdict"] == "identical"  # one process: the same losses
    distributed = result["distributed"]
    assert distributed["verdict"] == "side-effects"
    assert distributed["side_effects"] == [
        f'train.py (converted):{line} `with open("log.txt", "w") as log:` writes {folder / "log.txt"} '
        "on every process (ranks 0, 1)"
    ]


def test_a_skip_taken_together_keeps_the_processes_in_step(tmp_path):
    """fixtures/synced_skip: one batch of outliers is skipped before its backward. Converted, the skip
    is taken by every process together (ACC026): one process trains as the original, two take the
    same number of steps. With the skip left per process (the trigger lines undone), the process
    whose shard holds the outliers takes one step fewer: verify reports it."""
    folder = _fixture(tmp_path, "synced_skip")
    result = verify("train.py", steps=100, processes=2, cwd=str(folder), env=script_env(), start=start_forked)
    assert result.verdict == "identical", result.message
    assert result.original.steps == [22]  # 2 epochs of 12 batches, one skipped in each
    assert result.distributed.verdict == "ok", result.distributed.message
    assert result.distributed.run.steps == [10, 10]
    converted = convert_source((folder / "train.py").read_text(encoding="utf-8"), "train.py").output
    per_process = converted.replace("accelerator.set_trigger()\n            if accelerator.check_trigger():\n"
                                    "                continue", "continue")
    assert per_process != converted
    # the gradient all-reduces no longer pair up: the run hangs (killed at the timeout) or ends unevenly
    result = verify("train.py", steps=100, processes=2, cwd=str(folder), env=script_env(), start=start_forked,
                    converted_source=per_process, timeout=10)
    assert result.distributed.verdict in ("timeout", "uneven-steps", "failed"), result.distributed.message


def test_a_stop_taken_together_keeps_the_processes_in_step(tmp_path):
    """fixtures/synced_skip with `break` for `continue`: each epoch stops at the batch of outliers. Converted,
    every process stops there together (ACC026); left per process, the process whose shard holds the
    outliers stops and the other trains on: verify reports it."""
    folder = tmp_path
    text = (FIXTURES / "synced_skip" / "before.py").read_text(encoding="utf-8")
    text = text.replace("continue  # skip the outliers", "break  # stop at the outliers")
    (folder / "train.py").write_text(text, encoding="utf-8")
    result = verify("train.py", steps=100, processes=2, cwd=str(folder), env=script_env(), start=start_forked)
    assert result.verdict == "identical", result.message
    assert result.original.steps == [10]  # 2 epochs, 5 batches before the outliers in each
    assert result.distributed.verdict == "ok", result.distributed.message
    assert result.distributed.run.steps == [4, 4]
    converted = convert_source(text, "train.py").output
    per_process = converted.replace("accelerator.set_trigger()\n            if accelerator.check_trigger():\n"
                                    "                break", "break")
    assert per_process != converted
    result = verify("train.py", steps=100, processes=2, cwd=str(folder), env=script_env(), start=start_forked,
                    converted_source=per_process, timeout=10)
    assert result.distributed.verdict in ("timeout", "uneven-steps", "failed"), result.distributed.message


READ_AHEAD = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        x = torch.full((4,), float(i)) / 32
        return x + 0.1 * torch.rand(4), torch.tensor([float(i % 2)])


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Noisy(), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_difference_that_is_only_the_read_ahead_is_told_apart(tmp_path):
    """The dataset draws its noise from the global generator as batches are loaded, dropout as the model trains:
    a prepared DataLoader loads the next batch before handing out the current one, so the noise of the second
    batch is drawn before the first step's dropout, and the losses differ from the first. Run with its loaders reading ahead, the original
    has the converted script's losses: `identical-read-ahead`. A real change (another learning rate) stays
    `different`."""
    (tmp_path / "train.py").write_text(READ_AHEAD, encoding="utf-8")
    result = verify("train.py", steps=6, cwd=str(tmp_path), env=script_env(), start=start_forked)
    assert (result.verdict, result.exit_code) == ("identical-read-ahead", 0), result.message
    assert result.equivalent and result.first_difference is not None
    assert "reading one batch ahead" in result.message
    converted = convert_source(READ_AHEAD, "train.py").output
    broken = converted.replace("lr=0.1", "lr=0.2")
    assert broken != converted
    result = verify("train.py", steps=6, cwd=str(tmp_path), env=script_env(), start=start_forked,
                    converted_source=broken)
    assert (result.verdict, result.exit_code) == ("different", 1), result.message


def test_each_run_makes_its_outputs_in_a_folder_of_its_own(tmp_path):
    """The runs go side by side: what one makes at the top of the folder (`./outputs`) the others do not see
    (pytorch-ddpm's `os.makedirs(logdir + "/sample")` without `exist_ok` failed in whichever run came second;
    a checkpoint one run wrote would be another's to resume from), a path up from it (`../shared.txt`) is the
    same file as from the folder, and the user's folder is left as it was."""
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "shared.txt").write_text("up", encoding="utf-8")
    shutil.copy(REPO / "examples" / "train.py", project / "train.py")
    source = (project / "train.py").read_text(encoding="utf-8")
    converted = convert_source(source, "train.py").output
    reads_up = 'assert open("../shared.txt").read() == "up"\n'
    # the original looks for the folder after the others have had the time to make theirs
    (project / "train.py").write_text(
        'import os, time\ntime.sleep(5)\nassert not os.path.exists("outputs"), "another run\'s outputs"\n'
        'os.makedirs("outputs")\n' + reads_up + source, encoding="utf-8")
    made = 'import os\nos.makedirs("outputs", exist_ok=True)\n' + reads_up + converted
    result = verify("train.py", steps=3, processes=2, cwd=str(project), env=script_env(), start=start_forked,
                    converted_source=made)
    assert result.original.ok and result.verdict == "identical", result.message
    assert result.distributed.verdict == "ok", result.distributed.message
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "shared.txt"]  # the runs' folders are gone
