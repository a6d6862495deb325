"""An evaluation that adds up per-batch mean losses and divides by the number of samples
(`test_loss += criterion(output, target).item()`, then `/= len(test_loader.dataset)`) is not gathered:
over gathered batches each mean covers every process's samples and the loop runs 1/N as many
times, so the printed loss would be 1/N of the one-process value. Its loader is left whole instead
(ACC146: every process evaluates the whole set, the loss is the one-process value). Sums, or means
divided by the number of batches, are gathered."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
test_loader = DataLoader(test_set, batch_size=16)
model = Net().to(device)
criterion = {criterion}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in train_loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
test_loss = 0
with torch.no_grad():
    for data, target in test_loader:
        data, target = data.to(device), target.to(device)
        output = model(data)
        test_loss += {loss}.item()
test_loss /= {divisor}
print(test_loss)
"""


def convert(criterion="nn.CrossEntropyLoss()", loss="criterion(output, target)", divisor="len(test_loader.dataset)"):
    source = SCRIPT.format(criterion=criterion, loss=loss, divisor=divisor)
    return source, convert_source(source, "train.py")


@pytest.mark.parametrize("criterion, loss", [
    ("nn.CrossEntropyLoss()", "criterion(output, target)"),
    ("nn.NLLLoss(reduction='mean')", "criterion(output, target)"),
    ("nn.CrossEntropyLoss()", "F.nll_loss(output, target)"),
])
def test_batch_means_divided_by_the_number_of_samples_are_evaluated_whole(criterion, loss):
    source, result = convert(criterion, loss)
    assert result.output != source and "gather_for_metrics" not in result.output
    assert "accelerator.prepare(train_loader, model, optimizer)" in result.output
    [finding] = [f for f in result.findings if f.code == "ACC146"]
    assert "(`test_loss` adds up per-batch means" in finding.message
    assert "1/N of the one-process value" in finding.message


@pytest.mark.parametrize("criterion, loss, divisor", [
    ("nn.CrossEntropyLoss(reduction='sum')", "criterion(output, target)", "len(test_loader.dataset)"),
    ("nn.CrossEntropyLoss()", "F.nll_loss(output, target, reduction='sum')", "len(test_loader.dataset)"),
    ("nn.CrossEntropyLoss(size_average=False)", "criterion(output, target)", "len(test_loader.dataset)"),
    ("nn.CrossEntropyLoss()", "criterion(output, target)", "len(test_loader)"),  # the mean of the batch means
])
def test_sums_and_means_over_batches_convert(criterion, loss, divisor):
    source, result = convert(criterion, loss, divisor)
    assert result.output != source, result.findings
    assert "output, target = accelerator.gather_for_metrics((output, target))" in result.output


def test_a_loss_bound_first_and_then_added_is_followed():
    source = SCRIPT.format(criterion="nn.CrossEntropyLoss()", loss="criterion(output, target)",
                           divisor="len(test_loader.dataset)")
    source = source.replace("        test_loss += criterion(output, target).item()\n",
                            "        loss = criterion(output, target)\n        test_loss += loss.item()\n")
    result = convert_source(source, "train.py")
    assert [f.code for f in result.findings] == ["ACC146"] and "gather_for_metrics" not in result.output
