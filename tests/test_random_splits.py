"""A data split drawn at random without a seed (ACC149): one process splits once; under `accelerate launch`
every process would draw a split of its own, train on shards of different training sets and validate on samples
the others train on. Seeded (a generator of its own, or a seed of the generator it draws from), it converts."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset, random_split
{seed}
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
{split}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
loader = DataLoader(train_set, batch_size=8, shuffle=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

RANDOM_SPLIT = "train_set, val_set = random_split(data, [48, 16])"
SKLEARN = "train_idx, val_idx = train_test_split(np.arange(64), test_size=0.25)\ntrain_set = torch.utils.data.Subset(data, train_idx)"


@pytest.mark.parametrize("split, seed, hint", [
    (RANDOM_SPLIT, "", "generator=torch.Generator().manual_seed(0)"),
    (SKLEARN, "", "random_state=0"),
    # torch's seed does not seed NumPy's generator, which scikit-learn draws from
    (SKLEARN, "torch.manual_seed(0)", "np.random.seed(0)"),
])
def test_an_unseeded_split_is_refused_where_it_is(split: str, seed: str, hint: str) -> None:
    source = SCRIPT.format(seed=seed, split=split)
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = [f for f in result.findings if f.code == "ACC149"]
    assert "split" in source.splitlines()[finding.line - 1]
    assert hint in finding.suggestion


@pytest.mark.parametrize("split, seed", [
    (RANDOM_SPLIT.replace("16])", "16], generator=torch.Generator().manual_seed(0))"), ""),
    (RANDOM_SPLIT.replace("16])", "16], torch.Generator().manual_seed(0))"), ""),
    (RANDOM_SPLIT, "torch.manual_seed(0)"),
    (SKLEARN.replace("0.25)", "0.25, random_state=0)"), ""),
    (SKLEARN, "np.random.seed(0)"),
])
def test_a_seeded_split_converts(split: str, seed: str) -> None:
    result = convert_source(SCRIPT.format(seed=seed, split=split), "train.py")
    assert result.changed and not [f for f in result.findings if f.code == "ACC149"]


def test_every_blocker_is_named_beside_the_split() -> None:
    """The split is one blocker among others: each gets its finding."""
    source = SCRIPT.format(seed="", split=RANDOM_SPLIT).replace(
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")', 'device = torch.device("cpu")')
    codes = [f.code for f in convert_source(source, "train.py").findings]
    assert "ACC149" in codes and "ACC102" in codes
