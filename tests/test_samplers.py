"""ACC130: a DataLoader with a sampler of its own is prepared, unless the script reads the sampler back
(the Udacity CIFAR-10 notebook's `valid_loss / len(valid_loader.sampler)`: after `prepare` that is
the whole dataset's length, another number even in one process)."""

from __future__ import annotations

import textwrap

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, WeightedRandomSampler

{sampler}
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
total = 0.0
for x, y in loader:
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total += loss.item() * x.size(0)
{after}
"""


def convert(sampler: str, after: str = ""):
    source = SCRIPT.format(sampler=textwrap.dedent(sampler).strip(), after=after)
    return source, convert_source(source, "train.py")


@pytest.mark.parametrize("sampler", [
    "sampler = SubsetRandomSampler(list(range(80)))",
    "sampler = WeightedRandomSampler(weights, num_samples=80)",
    "sampler = SubsetRandomSampler(list(range(80)), generator=torch.Generator().manual_seed(0))",
])
def test_a_loader_with_its_own_sampler_converts(sampler):
    """prepare() keeps a sampler with a `generator` attribute in step on every process (it seeds and
    synchronises it; checked on two processes: disjoint shards, all of the subset)."""
    source, result = convert(sampler)
    assert result.output != source and not result.findings, result.findings
    assert "accelerator.prepare(" in result.output and "sampler=sampler" in result.output


def test_reading_the_sampler_back_refuses_the_file():
    source, result = convert(
        "sampler = SubsetRandomSampler(list(range(80)), generator=torch.Generator().manual_seed(0))",
        "print(total / len(loader.sampler))",
    )
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC130"]
    assert "`loader.sampler`" in result.findings[0].message and "`sampler`" in result.findings[0].suggestion
    assert "len(" in result.findings[0].message


def test_a_loader_without_a_sampler_may_read_its_dataset():
    source = SCRIPT.replace("loader = DataLoader(dataset, batch_size=8, sampler=sampler)",
                            "loader = DataLoader(dataset, batch_size=8, shuffle=True)").format(
        sampler="", after="print(total / len(loader.dataset))")
    result = convert_source(source, "train.py")
    assert result.output != source and not result.findings, result.findings
