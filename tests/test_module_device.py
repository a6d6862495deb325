"""A device chosen once at the module's top for a script that trains in a function (pytorch-ddpm, NeRF):
each read becomes the process's device where it runs (ACC031). It was refused (ACC108) before."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from conftest import assert_stable

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

{top}


def sample(model):
    return model(torch.ones(2, 4).to(device))


def train():
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(sample(model))


if __name__ == "__main__":
    train()
"""


@pytest.mark.parametrize("choice", ["torch.device('cuda:0')", "'cuda' if torch.cuda.is_available() else 'cpu'",
                                    "torch.device('cuda' if torch.cuda.is_available() else 'cpu')"])
def test_a_device_chosen_at_the_top_is_each_processs_own_where_it_is_read(choice: str) -> None:
    result = convert_source(SCRIPT.format(top=f"device = {choice}"), "train.py")
    assert result.changed, [f.render() for f in result.findings]
    assert "device = " not in result.output  # the line at the top goes: nothing there reads it
    assert "    return model(torch.ones(2, 4).to(PartialState().device))\n" in result.output  # no Accelerator here
    assert "    model = torch.nn.Linear(4, 1).to(accelerator.device)\n" in result.output
    assert "from accelerate import Accelerator, PartialState\n" in result.output
    assert not [f for f in result.findings if f.code == "ACC108"]
    assert_stable(result.output)


def test_a_device_read_at_the_top_too_keeps_its_line() -> None:
    result = convert_source(SCRIPT.format(top="device = torch.device('cuda:0')\nprint(device)"), "train.py")
    assert result.changed
    assert "device = torch.device('cuda:0')\nprint(device)\n" in result.output
    assert ".to(accelerator.device)" in result.output
    assert_stable(result.output)


@pytest.mark.parametrize("top", [
    # a flag of the script chooses the CPU: the Accelerator's `cpu=`, not a device of the process
    "import sys\nuse_cuda = '--cpu' not in sys.argv\ndevice = torch.device('cuda' if use_cuda else 'cpu')",
    # the CPU on purpose
    "device = torch.device('cpu')",
    # two choices at the top: which one trains is not for accelify to guess
    "device = torch.device('cuda:0')\nother = torch.device('cuda:1')",
])
def test_a_top_device_that_is_not_the_one_automatic_choice_is_not_rewritten(top: str) -> None:
    result = convert_source(SCRIPT.format(top=top), "train.py")
    assert "PartialState" not in result.output
    if result.changed:  # (the CPU on purpose: placements left to it, as before)
        assert "device = torch.device(" in result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from e2e import fixture_runs

    return fixture_runs(tmp_path_factory, "module_device")


def test_the_fixture_trains_the_same_in_one_process_and_in_two_on_each_processs_device(runs) -> None:
    """run_traced runs with the GPU device emulation: a tensor left on a device of the module's choosing would
    meet the prepared model on another (DeviceMismatch); two processes draw halves of the data."""
    original = runs["original"].stdout[0]
    assert original.count("samples") == 2
    assert runs["one"].stdout[0] == original
    rank0, rank1 = runs["two"].stdout
    assert rank0.count("samples") == 2 and rank1.strip() == ""
    for trace in runs["two"].traces:
        assert [sum(len(b) for b in loader["epochs"][0]) for loader in trace["loaders"]] == [32]


def test_a_top_device_read_as_a_string_is_not_rewritten() -> None:
    """`torch.autocast(device_type=device)` and `device == "cuda"` read the string: `accelerator.device` is a
    `torch.device`, which neither takes nor equals it. Such a file keeps its refusal."""
    top = "device = 'cuda' if torch.cuda.is_available() else 'cpu'"
    source = SCRIPT.format(top=top).replace(
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n",
        "        with torch.autocast(device_type=device, enabled=device == 'cuda'):\n"
        "            loss = torch.nn.functional.mse_loss(model(x), y)\n")
    result = convert_source(source, "train.py")
    assert "PartialState" not in result.output and "accelerator.device" not in result.output
