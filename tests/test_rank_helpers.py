"""The script's own rank helpers (the torchvision references' ``get_rank()``/``get_world_size()``, pasted into DINO
and WZMIAOMIAO's examples) return Accelerate's answers (ACC034); left where ``PartialState()`` could be made too
early or in a DataLoader's worker. Two-process run: fixtures/ddp_rank_helpers_runnable in test_e2e_distributed."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from accelify.core.result import Options
from conftest import assert_stable

HELPERS = '''\
def is_dist_avail_and_initialized():
    if not dist.is_available():
        return False
    if not dist.is_initialized():
        return False
    return True


def get_world_size():
    if not is_dist_avail_and_initialized():
        return 1
    return dist.get_world_size()


def get_rank():
    if not is_dist_avail_and_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0
'''

SCRIPT = '''\
import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


{helpers}

{extra}

def main(args):
    {early}
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)
    model = torch.nn.Linear(4, 1){placed}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * get_world_size())
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x{moved}), y{moved})
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if is_main_process():
        print(loss.item())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    main(parser.parse_args())
'''


def _script(helpers: str = HELPERS, extra: str = "", early: str = "pass", device: bool = False) -> str:
    return SCRIPT.format(helpers=helpers, extra=extra, early=early, placed=".to(args.device)" if device else "",
                         moved=".to(args.device)" if device else "")


def test_the_torchvision_helpers_return_partial_states_answers() -> None:
    result = convert_source(_script(), "train.py")
    assert result.error is None and not result.findings, result.findings
    out = result.output
    assert "def get_rank():\n    return PartialState().process_index\n" in out
    assert "def get_world_size():\n    return PartialState().num_processes\n" in out
    assert "def is_dist_avail_and_initialized():\n    return PartialState().use_distributed\n" in out
    assert "def is_main_process():\n    return get_rank() == 0\n" in out  # asks nothing of torch.distributed
    assert "torch.distributed" not in out and "dist." not in out
    assert "from accelerate import Accelerator, PartialState" in out
    assert [c.code for c in result.changes].count("ACC034") == 3
    assert_stable(out)


@pytest.mark.parametrize("helper, attribute", [
    ("def get_rank():\n    return dist.get_rank() if dist.is_initialized() else 0\n", "process_index"),
    ("def get_rank():\n    if dist.is_available() and dist.is_initialized():\n        return dist.get_rank()\n"
     "    return 0\n", "process_index"),
    ('def get_world_size():\n    """How many processes."""\n    if not dist.is_initialized():\n        return 1\n'
     "    else:\n        return dist.get_world_size()\n", "num_processes"),
    ("def ready():\n    return dist.is_available() and dist.is_initialized()\n", "use_distributed"),
])
def test_the_decision_is_evaluated_not_matched(helper: str, attribute: str) -> None:
    helpers = helper + "\n\ndef get_world_size():\n    return 1\n\n\ndef is_main_process():\n    return True\n" \
        if "get_world_size" not in helper else helper + "\n\ndef is_main_process():\n    return True\n"
    result = convert_source(_script(helpers=helpers), "train.py")
    assert result.error is None
    name = helper.split("(")[0][4:]
    assert f"    return PartialState().{attribute}\n" in result.output
    assert f'"""How many processes."""' in result.output or "How many" not in helper  # a docstring stays
    assert {c.code for c in result.changes if c.code == "ACC034"} == {"ACC034"}, name


@pytest.mark.parametrize("helper", [
    # another answer without a process group than the one process's
    "def get_rank():\n    if not dist.is_initialized():\n        return -1\n    return dist.get_rank()\n",
    # does more than answer
    "def get_rank():\n    if not dist.is_initialized():\n        return 0\n    print('asked')\n    return dist.get_rank()\n",
    # takes a group
    "def get_rank(group=None):\n    if not dist.is_initialized():\n        return 0\n    return dist.get_rank(group)\n",
])
def test_helpers_that_are_not_only_the_decision_are_left(helper: str) -> None:
    helpers = helper + "\n\ndef get_world_size():\n    return 1\n\n\ndef is_main_process():\n    return get_rank() == 0\n"
    result = convert_source(_script(helpers=helpers), "train.py")
    assert helper.splitlines()[1] in result.output
    assert "PartialState().process_index" not in result.output and "ACC034" not in {c.code for c in result.changes}


def test_a_helper_asked_before_the_accelerator_that_takes_cpu_is_left() -> None:
    """``Accelerator(cpu=...)`` after a ``PartialState()`` made without it would not get the CPU: the helpers
    stay when the setup function asks them above its optimizer."""
    early = _script(early='print("rank", get_rank())', device=True)
    result = convert_source(early, "train.py")
    assert "Accelerator(cpu=" in result.output
    assert "return dist.get_rank()" in result.output and "PartialState()" not in result.output
    late = convert_source(_script(device=True).replace("lr=0.1 * get_world_size()", "lr=0.1"), "train.py")
    assert "Accelerator(cpu=" in late.output and "return PartialState().process_index" in late.output


def test_a_helper_a_dataloader_worker_runs_is_left() -> None:
    """A worker started by ``spawn`` shares no state: ``PartialState()`` there would set the processes up again."""
    extra = '''class Shards(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(get_rank()))

'''
    out = convert_source(_script(extra=extra), "train.py").output
    assert "return dist.get_rank()" in out and "PartialState().process_index" not in out


def test_without_acc034_selected_the_helpers_stay() -> None:
    codes = frozenset({"ACC001", "ACC004", "ACC005"})
    out = convert_source(_script(), "train.py", Options(select=codes)).output
    assert "return dist.get_rank()" in out and "PartialState" not in out
