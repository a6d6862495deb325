"""ACC134: training data that is no DataLoader and is drawn at random without a seed is refused:
converted, every process would draw its own batches (each step averages N different batches, an
epoch is N passes), not the one-process training. Seeded, every process draws the same batches,
as one process does: converted, with the ACC124 note."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import random

import numpy as np
import torch

{seed}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = load_pairs()
model = torch.nn.Linear(8, 3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    {shuffle}
    for x, y in data:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("shuffle", ["random.shuffle(data)", "order = np.random.permutation(len(data))",
                                     "order = torch.randperm(len(data))"])
def test_an_unseeded_shuffle_of_hand_made_data_is_refused(shuffle):
    source = SCRIPT.format(seed="", shuffle=shuffle)
    result = convert_source(source, "train.py")
    assert result.output == source
    [finding] = result.findings
    assert finding.code == "ACC134" and f"(`{shuffle.split(' = ')[-1]}`)" in finding.message
    assert "torch.manual_seed(0)" in finding.suggestion


@pytest.mark.parametrize("seed", ["torch.manual_seed(0)", "random.seed(1)", "np.random.seed(2)"])
def test_a_seeded_shuffle_converts_with_the_note(seed):
    source = SCRIPT.format(seed=seed, shuffle="random.shuffle(data)")
    result = convert_source(source, "train.py")
    assert result.output != source
    assert [f.code for f in result.findings] == ["ACC124"]
