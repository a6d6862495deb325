"""accelify.runtime.checks: the emulation of a GPU's device rules on the CPU, the record of each
process's side effects, and the verdicts ``accelify verify`` draws from them.

The device rules are tested in this process with plain torch (``.to("cpu:0")`` is the accelerator's
device); whole runs (Accelerate preparing a model, the tracing hook, verify) in subprocesses."""
from __future__ import annotations

import copy

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from accelify.runtime.checks import (  # noqa: E402
    DeviceMismatch,
    install_device_check,
    is_emulated_device,
    judge_side_effects,
)

DEVICE = "cpu:0"


@pytest.fixture
def check(monkeypatch):
    """The device check on for one test; what ``on_error`` received."""
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", DEVICE)
    errors: list[dict] = []
    mode = install_device_check(errors.append)
    try:
        yield errors
    finally:
        mode.__exit__(None, None, None)


def on_device(tensor) -> bool:
    return tensor.device == torch.device(DEVICE)


def test_the_emulated_device_is_a_cpu_device_with_an_index():
    assert is_emulated_device("cpu:0") and is_emulated_device(torch.device("cpu", 0)) and is_emulated_device(0)
    assert not is_emulated_device("cpu") and not is_emulated_device(torch.device("cpu")) and not is_emulated_device(None)


def test_a_host_input_to_a_placed_model_fails_with_the_users_line_and_name(check):
    model = torch.nn.Linear(4, 2).to(DEVICE)
    x = torch.randn(3, 4)
    with pytest.raises(DeviceMismatch) as raised:
        model(x)  # the line named
    details = raised.value.details
    assert details["file"] == __file__
    assert details["code"] == "model(x)  # the line named"
    assert details["name"] == "x"
    assert "would fail on a GPU" in str(raised.value) and "`x` is on the host" in str(raised.value)
    assert check and check[0]["line"] == details["line"]  # on_error saw it before the raise


def test_a_view_of_a_named_host_tensor_is_named(check):
    model = torch.nn.Linear(4, 2).to(DEVICE)
    sample = torch.randn(4)
    with pytest.raises(DeviceMismatch) as raised:
        model(sample[None])
    assert raised.value.details["name"] == "sample"


def test_placed_tensors_and_what_is_computed_from_them_mix_freely(check):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).to(DEVICE)
    assert all(on_device(p) for p in model.parameters()) and on_device(model[1].running_mean)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(6, 4).to(DEVICE), torch.tensor([0, 1, 0, 1, 1, 0]).to(DEVICE)
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    assert all(on_device(p.grad) for p in model.parameters())
    total = torch.zeros(1, device=x.device)  # the device a placed tensor reports
    total += (model(x).argmax(1) == y).sum()
    assert on_device(total)
    assert 2.0 * loss.item() > 0  # python numbers and .item() are host values, as on a GPU
    assert check == []


def test_a_host_scalar_may_meet_the_device_but_not_the_reverse(check):
    placed = torch.ones(3).to(DEVICE)
    assert on_device(placed * torch.tensor(2.0))  # a 0-dim host tensor: CUDA takes it as a scalar
    with pytest.raises(DeviceMismatch):
        torch.ones(3) * placed.sum()  # a 0-dim tensor on the device with a host vector: CUDA refuses
    with pytest.raises(DeviceMismatch):
        torch.cat([placed, torch.ones(2)])


def test_numpy_of_a_placed_tensor_fails_and_cpu_first_works(check):
    placed = torch.ones(3).to(DEVICE)
    with pytest.raises(DeviceMismatch, match=r"\.numpy\(\)"):
        placed.numpy()
    np = pytest.importorskip("numpy")
    with pytest.raises(DeviceMismatch):
        np.asarray(placed)
    host = placed.cpu()
    assert host is not placed and not on_device(host) and on_device(placed)  # a move copies
    assert host.numpy().tolist() == [1.0, 1.0, 1.0]


def test_moves_copies_and_host_indices_are_allowed(check):
    placed = torch.zeros(4).to(DEVICE)
    placed.copy_(torch.arange(4.0))  # a copy between devices
    assert on_device(placed[torch.tensor([0, 2])])  # host indices into a device tensor
    placed[torch.tensor([1])] = 5.0
    assert on_device(placed.to(torch.float64)) and on_device(torch.ones(2).to(placed))
    # ODE-Net's `self.integration_time.type_as(x)`: on a GPU, a tensor of the CUDA type
    assert on_device(torch.tensor([0, 1]).float().type_as(placed)) and not on_device(placed.type_as(torch.ones(1)))
    with pytest.raises(DeviceMismatch):
        torch.arange(4.0)[torch.tensor([1]).to(DEVICE)]  # device indices into a host tensor


def test_sequence_lengths_stay_on_the_host_as_pack_padded_sequence_requires(check):
    embedded = torch.randn(5, 2, 3).to(DEVICE)
    packed = torch.nn.utils.rnn.pack_padded_sequence(embedded, torch.tensor([5, 3]))
    assert on_device(packed.data)


def test_a_variable_of_a_placed_tensor_is_placed(check):
    from torch.autograd import Variable

    placed = torch.ones(3).to(DEVICE)
    wrapped = Variable(placed)
    assert on_device(wrapped) and not on_device(Variable(torch.ones(3)))
    assert isinstance(placed, Variable)  # old scripts' isinstance checks still hold


def test_a_module_moved_with_to_has_its_parameters_placed_in_place(check):
    model = torch.nn.Linear(2, 2)
    weight = model.weight
    model.to(torch.device(DEVICE))
    assert model.weight is weight and on_device(weight)
    model.cpu()
    assert not on_device(model.weight)
    model(torch.ones(1, 2))  # all on the host again


def test_a_deep_copy_of_a_placed_model_is_on_the_device_and_one_of_a_host_model_is_not(check):
    """An EMA copy, `copy.deepcopy(model)` of a placed model, is on the GPU where the model is (pytorch-ddpm)."""
    model = torch.nn.Linear(2, 2).to(DEVICE)
    copied = copy.deepcopy(model)
    assert on_device(copied.weight) and on_device(copied.bias)
    copied.weight.data.mul_(0.5).add_(model.weight.data)  # an EMA update: both on the device
    assert not on_device(copy.deepcopy(torch.nn.Linear(2, 2)).weight)


def test_cuda_moves_onto_the_device_without_a_gpu_and_a_host_input_still_fails(check):
    """`.cuda()` of a tensor or a module is the accelerator's device, as on a GPU: torch's own `.cuda()` raises
    on this machine (CPU build: "not compiled with CUDA"; CUDA build: "no NVIDIA driver"), so it ran no script
    written for a GPU (SimCLR, PointNet, StyleGAN)."""
    model = torch.nn.Linear(2, 2).cuda()
    x = torch.ones(3, 2).cuda(non_blocking=True)
    assert on_device(model.weight) and on_device(x) and x.is_cuda
    assert not torch.ones(1).is_cuda
    model(x)
    with pytest.raises(DeviceMismatch):
        model(torch.ones(3, 2))


def test_outside_the_check_nothing_is_marked():
    assert not is_emulated_device(torch.ones(2).to(DEVICE).device)


# -------------------------------------------------------------------------------------------------
# side effects


def effect(kind, path, line=1, **extra):
    return {"event": "effect", "kind": kind, "path": path, "file": "/x/train.py", "line": line, "code": "c", **extra}


def test_a_path_written_by_two_processes_is_a_failure_and_one_written_once_is_not():
    ranks = {0: [effect("write", "/x/model.pt", 9)], 1: [effect("write", "/x/model.pt", 9)]}
    assert judge_side_effects(ranks, {}) == ["train.py:9 `c` writes /x/model.pt on every process (ranks 0, 1)"]
    assert judge_side_effects({0: [effect("write", "/x/model.pt")], 1: []}, {}) == []
    assert judge_side_effects({0: ranks[0]}, {}) == []  # one process: nothing to compare
    # a cache of compiled code (numba's, under librosa.load in GCommandsPytorch's loader): no race of the script's
    cache = {r: [effect("write", "/venv/librosa/core/__pycache__/audio.resample-1.py311.nbi", 9)] for r in (0, 1)}
    assert judge_side_effects(cache, {}) == []
    # the process's own kernel entries: absl's `app.run` writes its thread's name to /proc/self/comm
    kernel = {r: [effect("write", "/proc/self/comm", 9), effect("write", "/dev/null", 10)] for r in (0, 1)}
    assert judge_side_effects(kernel, {}) == []


def test_directories_downloads_and_extractions_on_every_process():
    made = {r: [effect("mkdir", "/x/out", exist_ok=False)] for r in (0, 1)}
    assert judge_side_effects(made, {}) == []  # a race fails the run, or the script handles it
    fetched = {r: [effect("download", "http://h/data.zip")] for r in (0, 1)}
    assert "downloads http://h/data.zip" in judge_side_effects(fetched, {})[0]
    unpacked = {r: [effect("extract", "/x/data")] for r in (0, 1)}
    assert "extracts into /x/data" in judge_side_effects(unpacked, {})[0]


def test_a_line_printing_repeatedly_on_another_process_is_a_failure():
    once = {"file": "/x/train.py", "line": 30, "code": "print(x)", "count": 1}
    many = {**once, "line": 31, "count": 8}
    assert judge_side_effects({0: [], 1: []}, {0: [many], 1: [once]}) == []  # rank 0 may; a single line may
    assert judge_side_effects({0: [], 1: []}, {0: [], 1: [many]}) == [
        "train.py:31 `print(x)` prints 8 times on rank 1 (output on every process: print on the main process only)"
    ]


SIDE_EFFECTS_SCRIPT = '''
import os, zipfile, torch
os.makedirs("out", exist_ok=True)
os.makedirs("fresh")
with open("log.txt", "w") as f:
    f.write("x")
torch.save({"w": torch.ones(1)}, "out/model.pt")
with zipfile.ZipFile("a.zip", "w") as z:
    z.writestr("inner.txt", "hi")
zipfile.ZipFile("a.zip").extractall("unpacked")
for i in range(3):
    print("step", i)
print("done")
print("\\nLoading data...")
import sys
for i in range(2):
    sys.stdout.write(f"\\rbatch {i}")
import tempfile  # files of a name no other process has: numba probes its cache directory so
tempfile.TemporaryFile(dir=".").close()
with tempfile.NamedTemporaryFile(dir=".") as f:
    f.write(b"x")
tempfile.TemporaryDirectory(dir=".").cleanup()
'''


def test_the_tracing_hook_records_what_a_script_writes_and_prints(tmp_path):
    (tmp_path / "script.py").write_text(SIDE_EFFECTS_SCRIPT, encoding="utf-8")
    env = {**os.environ, "ACCELIFY_TRACE": str(tmp_path / "t"), "ACCELIFY_CHECKS": "effects"}
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in (tmp_path / "t.0.jsonl").read_text().splitlines()]
    effects = [(e["kind"], os.path.relpath(e["path"], tmp_path) if e["path"] else None, e["line"])
               for e in events if e["event"] == "effect" and e["kind"] != "print"]
    assert effects == [
        ("mkdir", "out", 3), ("mkdir", "fresh", 4), ("write", "log.txt", 5), ("write", "out/model.pt", 7),
        ("write", "a.zip", 8), ("extract", "unpacked", 10),
    ]
    made = [e for e in events if e.get("kind") == "mkdir"]
    assert [e["exist_ok"] for e in made] == [True, False]
    counts = {entry["line"]: entry["count"] for entry in next(e for e in events if e["event"] == "prints")["counts"]}
    # outputs, not lines: a print that starts with a newline is one; a line redrawn with "\\r" is one a call
    assert counts == {12: 3, 13: 1, 14: 1, 17: 2}


DEVICE_SCRIPT = '''
import torch
from accelerate import Accelerator
accelerator = Accelerator()
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    preds, labels = accelerator.gather_for_metrics((model(x).argmax(1), y))
sample = torch.randn(4)
print(model(sample))
'''


def test_a_prepared_run_passes_and_a_host_input_after_it_is_recorded(tmp_path):
    pytest.importorskip("accelerate")
    (tmp_path / "script.py").write_text(DEVICE_SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(ACCELIFY_TRACE=str(tmp_path / "t"), ACCELIFY_CHECKS="device", ACCELERATE_USE_CPU="1")
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "DeviceMismatch" in proc.stderr
    events = [json.loads(line) for line in (tmp_path / "t.0.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("step") == 2  # training itself passed the check
    device = [e for e in events if e["event"] == "device"]
    assert [(d["line"], d["code"], d["name"]) for d in device] == [(16, "print(model(sample))", "sample")]


CPU_SCRIPT = '''
import torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
print(model(torch.randn(3, 4)).shape, accelerator.device)
'''


def test_an_accelerator_on_the_cpu_computes_on_the_host(tmp_path):
    """`Accelerator(cpu=True)` keeps everything on the host: a tensor made by hand meets the prepared
    model there, on a GPU machine too."""
    pytest.importorskip("accelerate")
    (tmp_path / "script.py").write_text(CPU_SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(ACCELIFY_CHECKS="device", ACCELERATE_USE_CPU="1")
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["torch.Size([3,", "2])", "cpu"]


def test_downloads_taken_in_turn_under_main_process_first_are_no_race():
    turn = {0: [effect("extract", "/x/data", in_turn=True)], 1: [effect("extract", "/x/data", in_turn=True)]}
    assert judge_side_effects(turn, {}) == []
    race = {0: [effect("extract", "/x/data")], 1: [effect("extract", "/x/data")]}
    assert judge_side_effects(race, {})  # both at once: a race


TURNS_SCRIPT = '''
import os, zipfile
from accelerate import Accelerator
accelerator = Accelerator()
with zipfile.ZipFile("a.zip", "w") as z:
    z.writestr("inner.txt", "hi")
with accelerator.main_process_first():
    zipfile.ZipFile("a.zip").extractall("inside")
zipfile.ZipFile("a.zip").extractall("outside")
'''


def test_the_hook_marks_what_runs_under_main_process_first(tmp_path):
    pytest.importorskip("accelerate")
    (tmp_path / "script.py").write_text(TURNS_SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(ACCELIFY_TRACE=str(tmp_path / "t"), ACCELIFY_CHECKS="effects", ACCELERATE_USE_CPU="1")
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in (tmp_path / "t.0.jsonl").read_text().splitlines()]
    extracted = {os.path.basename(e["path"]): e.get("in_turn", False) for e in events if e.get("kind") == "extract"}
    assert extracted == {"inside": True, "outside": False}
