"""A prepared model's state read by name beside a model that is not prepared (an EMA copy): through the
DistributedDataParallel wrapper every name has `module.` before it, so pairing it with the copy's names fails
on two processes only (pytorch-ddpm's `ema(net_model, ema_model, decay)` raised KeyError there). Such reads go
through `accelerator.unwrap_model(model)`; reads that meet the wrapper's own names stay as they are."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from conftest import assert_stable

HEAD = """\
import copy

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

"""

MAIN = """

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    model = nn.Linear(4, 1).to(device)
    ema_model = copy.deepcopy(model)
{setup}    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
{step}

if __name__ == "__main__":
    main()
"""


def convert(functions: str = "", step: str = "", setup: str = "") -> str:
    source = HEAD + functions + MAIN.format(step=step, setup=setup)
    result = convert_source(source, "train.py")
    assert result.error is None and result.changed, [f.message for f in result.findings]
    assert_stable(result.output)
    return result.output


@pytest.mark.parametrize("reads", [
    "    for key, value in source.state_dict().items():\n        target.state_dict()[key].copy_(value)\n",
    "    names = dict(target.named_parameters())\n"
    "    for name, p in source.named_parameters():\n        names[name].data.mul_(0.5).add_(p.data)\n",
])
def test_a_function_of_the_file_reading_the_model_by_name_is_handed_it_unwrapped(reads: str) -> None:
    output = convert("def ema(source, target):\n" + reads, step="        ema(model, ema_model)\n")
    assert "        ema(accelerator.unwrap_model(model), ema_model)\n" in output
    assert "def ema(source, target):\n" in output  # nothing of the function changes


@pytest.mark.parametrize("uses", [
    "    source(torch.ones(1, 4))\n    print(len(source.state_dict()))\n",  # runs it: through the wrapper
    "    print(sum(p.numel() for p in source.parameters()))\n",  # no name read: the same through the wrapper
    "    keep(source.state_dict())\n    source = None\n",  # bound again
])
def test_a_function_that_runs_the_model_or_reads_no_names_is_handed_the_prepared_model(uses: str) -> None:
    functions = "def keep(state):\n    return state\n\n\ndef ema(source, target):\n" + uses
    output = convert(functions, step="        ema(model, ema_model)\n")
    assert "        ema(model, ema_model)\n" in output


def test_a_state_loaded_into_a_model_not_prepared_is_read_unwrapped() -> None:
    output = convert(step="        ema_model.load_state_dict(model.state_dict())\n"
                          "        ema_model.load_state_dict(copy.deepcopy(model.state_dict()))\n")
    assert "        ema_model.load_state_dict(accelerator.unwrap_model(model).state_dict())\n" in output
    assert "        ema_model.load_state_dict(copy.deepcopy(accelerator.unwrap_model(model).state_dict()))\n" in output


def test_before_prepare_and_into_the_prepared_model_the_state_is_left_as_it_is() -> None:
    # before prepare: the plain model's names; a state of the wrapped model loaded back into it: the same names
    output = convert(setup="    ema_model.load_state_dict(model.state_dict())\n",
                     step="        best = copy.deepcopy(model.state_dict())\n        model.load_state_dict(best)\n")
    setup, _, loop = output.partition("accelerator.prepare(")
    assert "    ema_model.load_state_dict(model.state_dict())\n" in setup
    assert "        best = copy.deepcopy(model.state_dict())\n        model.load_state_dict(best)\n" in loop


def test_a_helper_loading_the_state_into_a_copy_is_handed_the_model_once_unwrapped() -> None:
    """`update(model, ema_model)` in the training function: the model goes in unwrapped at the call, and the
    helper's own `model.state_dict()` is left as it is (not unwrapped a second time)."""
    functions = "def update(model, ema_model):\n    ema_model.load_state_dict(model.state_dict())\n"
    output = convert(functions, step="        update(model, ema_model)\n")
    assert "        update(accelerator.unwrap_model(model), ema_model)\n" in output
    assert "def update(model, ema_model):\n    ema_model.load_state_dict(model.state_dict())\n" in output


def test_a_copy_of_the_prepared_model_is_a_copy_of_the_model_itself() -> None:
    """`best_model = copy.deepcopy(model)` after prepare copied the DistributedDataParallel wrapper: the checkpoint
    `torch.save(best_model.state_dict(), path)` then had `module.` names the original's had not."""
    output = convert(step="        best_model = copy.deepcopy(model)\n        torch.save(best_model.state_dict(), 'best.pt')\n")
    assert "        best_model = copy.deepcopy(accelerator.unwrap_model(model))\n" in output
    assert "    ema_model = copy.deepcopy(model)\n" in output  # before prepare: the plain model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from e2e import fixture_runs

    return fixture_runs(tmp_path_factory, "ema_state_names")


def test_the_fixture_trains_the_same_in_one_process_and_runs_in_two(runs) -> None:
    """On two processes the prepared model is wrapped: before the fix its `module.` names met the EMA copy's
    (KeyError in `ema`, unexpected keys in `load_state_dict`); run_traced fails on a failed run."""
    original = runs["original"].stdout[0]
    assert original.count("ema weight sum") == 2
    assert runs["one"].stdout[0] == original
    rank0, rank1 = runs["two"].stdout
    assert rank0.count("ema weight sum") == 2 and rank1.strip() == ""
    # the copy of the trained model is saved with the model's own names, once (a copy of the wrapper had `module.`)
    saved = {s["file"]: s["keys"] for s in runs["original"].traces[0]["saves"]}
    assert sorted(saved) == ["best.pt", "ema.pt"] and saved["best.pt"] == saved["ema.pt"]
    assert {s["file"]: s["keys"] for s in runs["two"].traces[0]["saves"]} == saved
    assert runs["two"].traces[1]["saves"] == []
