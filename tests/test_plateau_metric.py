"""ACC032: a ReduceLROnPlateau steps on the mean of its value over the processes, and is never prepared (the
wrapper would step it once per process on one value); ACC150 where that mean cannot be taken on every process.
fixtures/plateau_metric runs it on one and two processes."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from conftest import assert_stable

SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = {make}
for epoch in range(3):
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
{step}
"""
PLATEAU = "torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)"


@pytest.mark.parametrize("step, made", [
    ("    scheduler.step(total / len(loader))",
     "    scheduler.step(sum(gather_object([float(total / len(loader))])) / accelerator.num_processes)"),
    ("    scheduler.step(metrics=total)",
     "    scheduler.step(metrics=sum(gather_object([float(total)])) / accelerator.num_processes)"),
    # per batch: stepped on the mean too, and not prepared
    ("        scheduler.step(loss.item())",
     "        scheduler.step(sum(gather_object([float(loss.item())])) / accelerator.num_processes)"),
])
def test_the_value_is_averaged_over_the_processes(step: str, made: str) -> None:
    result = convert_source(SCRIPT.format(make=PLATEAU, step=step), "train.py")
    assert made in result.output, result.output
    assert "from accelerate.utils import gather_object" in result.output
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output
    assert_stable(result.output)


def test_other_schedulers_stepped_with_a_value_are_left_as_they_are() -> None:
    """`StepLR.step(epoch)` (the old epoch argument): not a value it learns from."""
    source = SCRIPT.format(make="torch.optim.lr_scheduler.StepLR(optimizer, 1)", step="    scheduler.step(epoch)")
    result = convert_source(source, "train.py")
    assert result.changed and "    scheduler.step(epoch)\n" in result.output and "gather_object" not in result.output


def test_a_plateau_stepped_by_the_main_process_only_is_refused() -> None:
    source = SCRIPT.format(make=PLATEAU, step="    if dist.get_rank() == 0:\n        scheduler.step(total)").replace(
        "device = torch", 'dist.init_process_group("gloo")\nrank = dist.get_rank()\ndevice = torch', 1)
    result = convert_source(source, "train.py")
    assert not result.changed
    assert "ACC150" in [f.code for f in result.findings], result.findings


def test_a_plateau_of_a_trainer_class_is_averaged_too() -> None:
    source = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = torch.nn.Linear(4, 1).to(self.device)
        self.loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer)

    def train(self):
        for epoch in range(2):
            total = 0.0
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                total += loss.item()
            self.scheduler.step(total)


Trainer().train()
'''
    result = convert_source(source, "train.py")
    assert "self.scheduler.step(sum(gather_object([float(total)])) / self.accelerator.num_processes)" in result.output, \
        result.output
