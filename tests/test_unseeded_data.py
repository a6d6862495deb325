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


def test_batches_drawn_with_next_from_the_prepared_loader_are_sharded_data():
    """wgan: `data_iter = iter(dataloader)` per epoch, then `next(data_iter)` in a `while` inside:
    the data is the prepared DataLoader's, so no ACC124 (it said "`range(opt.niter)` does not come
    from a DataLoader")."""
    source = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    data_iter = iter(loader)
    i = 0
    while i < len(loader):
        x, y = next(data_iter)
        i += 1
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
    result = convert_source(source, "train.py")
    assert "accelerator.prepare(loader, model, optimizer)" in result.output.replace("\n", " ").replace("  ", "")
    assert result.findings == []
    hand = convert_source(source.replace("next(data_iter)", "next(pairs)").replace(
        "for epoch in range(2):", "pairs = iter([(torch.randn(2, 4), torch.randn(2, 2))] * 4)\nfor epoch in range(2):"),
        "train.py")
    assert [f.code for f in hand.findings] == ["ACC124"]
    assert "the training loop runs over `range(2)`, not over a DataLoader" in hand.findings[0].message


WRAPPED = """\
import torch
{seed}

def infiniteloop(dataloader):
    while True:
        for x, y in iter(dataloader):
            yield x, y


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2, shuffle=True)
{made}
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x, y = next(looper)
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("made", ["looper = infiniteloop(loader)", "looper = iter(loader)"])
def test_an_iterator_made_before_prepare_is_made_after_it(made):
    """`looper = infiniteloop(loader)` before the model holds the loader as it was before `prepare`
    (unsharded, and shuffled differently on every process): the conversion makes it right after `prepare`."""
    result = convert_source(WRAPPED.format(seed="", made=made), "train.py")
    out = result.output
    assert result.changed and not [f.code for f in result.findings]
    assert out.index("loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n" + made) > 0


@pytest.mark.parametrize("made", ["looper = infiniteloop(loader)\nlooper = infiniteloop(loader)",
                                  "looper = infiniteloop(loader, 2)", "looper = make_iterator(loader)",
                                  "looper = iter(loader)\nloader = None"])
def test_an_iterator_made_before_prepare_that_cannot_move_is_refused(made):
    """Made twice, from more than names, by a function that is not a generator of this file (it may do more than
    wrap), or from a loader bound again before `prepare`: `next(looper)` in the loop must not be taken for the
    prepared loader's batches."""
    source = WRAPPED.format(seed="", made=made).replace(
        "def infiniteloop(dataloader):", "def make_iterator(dataloader):\n    return iter(dataloader)\n\n\n"
        "def infiniteloop(dataloader, n=1):")
    result = convert_source(source, "train.py")
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC123"]


def test_a_seeded_iterator_made_before_prepare_is_made_after_it_too():
    source = WRAPPED.format(seed="torch.manual_seed(0)", made="looper = infiniteloop(loader)")
    result = convert_source(source, "train.py")
    assert result.changed and [f.code for f in result.findings] == []


def test_an_iterator_made_before_prepare_and_drawn_with_dunder_next_is_made_after_it():
    """ODE-Net: `data_gen = inf_generator(train_loader)` before the optimizer, `data_gen.__next__()` in the loop."""
    source = WRAPPED.format(seed="", made="looper = infiniteloop(loader)").replace("next(looper)", "looper.__next__()")
    out = convert_source(source, "train.py").output
    assert out.index("accelerator.prepare(loader, model, optimizer)") < out.index("looper = infiniteloop(loader)")


def test_a_draw_from_a_generator_of_its_own_is_the_same_on_every_process():
    """`torch.randint(..., generator=g)` (a dataset's own generator) is no unseeded draw: not ACC134."""
    source = SCRIPT.format(seed="", shuffle="noise = torch.randint(0, 9, (4,), generator=g)").replace(
        "data = load_pairs()\n", "g = torch.Generator()\ndata = load_pairs()\n")
    result = convert_source(source, "train.py")
    assert not any(f.code == "ACC134" for f in result.findings), result.findings
    assert result.changed


FUNCTIONS = """\
import numpy as np
import torch


def batches(data):
    for i in range(0, len(data), 4):
        yield data[i:i + 4]


def sample(model, x):
    return np.random.choice(3, p=model(x).softmax(-1)[0].detach().numpy())


def train(model, data, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(data):
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = load_pairs()
    {shuffle}
    model = torch.nn.Linear(8, 3).to(device)
    train(model, data, device)
    print(sample(model, data[0][0]))


if __name__ == "__main__":
    main()
"""


def test_a_draw_the_training_never_reaches_is_not_its_data():
    """udacity's char-RNN notebook: `np.random.choice` picks the next character when sampling text after
    training; its batches come from a plain generator. ACC134 had named that draw as the training data's."""
    result = convert_source(FUNCTIONS.format(shuffle="pass"), "train.py")
    assert result.changed
    assert "ACC134" not in [f.code for f in result.findings]


@pytest.mark.parametrize("shuffle", ["np.random.shuffle(data)"])
def test_a_draw_in_the_function_that_hands_the_data_down_still_counts(shuffle):
    result = convert_source(FUNCTIONS.format(shuffle=shuffle), "train.py")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC134"] and shuffle in result.findings[0].message
