"""A part of the model that `forward` never runs gets no gradient: under DDP the Accelerator needs
`find_unused_parameters=True` (accelify.analyses.unused_parameters). Parts without parameters, containers whose
every key runs, parameters read as tensors and parts handed to another part do not count.
fixtures/idle_submodule runs it on two processes."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{forward}


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 4)), batch_size=4)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _unused(init: str, forward: str) -> bool:
    result = convert_source(SCRIPT.format(init=init, forward=forward), "train.py")
    assert result.changed, result.findings
    return "find_unused_parameters=True" in result.output


@pytest.mark.parametrize("init, forward", [
    # built, never run
    ("        self.a = nn.Linear(4, 4)\n        self.b = nn.Linear(4, 4)", "        return self.a(x)"),
    # a backbone of which only a piece runs: its other pieces (a classifier head) get no gradient
    ("        self.backbone = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n        self.fc = nn.Linear(4, 4)\n"
     "        self.trunk = Trunk()", "        return self.trunk.a(x)"),
    # a dict of parts with a key no forward reads
    ("        self.parts = nn.ModuleDict(dict(a=nn.Linear(4, 4), b=nn.Linear(4, 4)))", "        return self.parts.a(x)"),
])
def test_a_part_forward_never_runs_needs_find_unused_parameters(init: str, forward: str) -> None:
    if "Trunk()" in init:
        init = init.replace("        self.backbone = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n", "")
        script = SCRIPT.replace("class Net(", "class Trunk(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                "        self.a = nn.Linear(4, 4)\n        self.fc = nn.Linear(4, 4)\n\n"
                                "    def forward(self, x):\n        return self.fc(self.a(x))\n\n\nclass Net(")
        result = convert_source(script.format(init=init, forward=forward), "train.py")
        assert "find_unused_parameters=True" in result.output
        return
    assert _unused(init, forward)


@pytest.mark.parametrize("init, forward", [
    ("        self.a = nn.Linear(4, 4)\n        self.drop = nn.Dropout(0.1)", "        return self.a(x)"),  # no parameters
    ("        self.parts = nn.ModuleDict(dict(a=nn.Linear(4, 4), b=nn.Linear(4, 4)))",
     "        return self.parts.b(self.parts['a'](x))"),  # every key runs
    ("        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])",
     "        for block in self.blocks:\n            x = block(x)\n        return x"),
    ("        self.a = nn.Linear(4, 4)\n        self.start = nn.Parameter(torch.zeros(4))",
     "        return self.a(x) + self.start.expand(x.shape)"),  # a parameter is read as a tensor
    ("        self.a = nn.Linear(4, 4)\n        self.b = nn.Linear(4, 4)\n        self.seq = nn.Sequential(self.a, self.b)",
     "        return self.seq(x)"),  # handed to another part
    ("        self.layer1 = nn.Linear(4, 4)\n        self.layer2 = nn.Linear(4, 4)",
     "        for i in (1, 2):\n            x = getattr(self, f'layer{i}')(x)\n        return x"),  # reached by name
])
def test_parts_that_all_run_need_nothing(init: str, forward: str) -> None:
    assert not _unused(init, forward)
