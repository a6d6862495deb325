"""A wandb run is the main process's: `wandb.init(...)` gets `mode=None if accelerator.is_main_process else
"disabled"` (a `mode` given stays the main process's), so the other processes' `run.log(...)` and `wandb.log(...)`
do nothing: one run, not one per process. Where the Accelerator cannot be reached, ACC127 as before.
fixtures/wandb_run is the golden example."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
import wandb

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{create}
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
for step, (x, y) in enumerate(data):
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    wandb.log({{"loss": loss.item()}})
"""


@pytest.mark.parametrize("create, made", [
    ('run = wandb.init(project="demo")',
     'run = wandb.init(project="demo", mode=None if accelerator.is_main_process else "disabled")'),
    ("run = wandb.init(project='demo', mode='offline')",
     "run = wandb.init(project='demo', mode='offline' if accelerator.is_main_process else 'disabled')"),
    ('wandb.init(project="demo", mode="offline" if torch.cuda.is_available() else "online",)',
     'wandb.init(project="demo", mode=("offline" if torch.cuda.is_available() else "online") if '
     'accelerator.is_main_process else "disabled",)'),
])
def test_the_run_is_the_main_processs_and_the_others_are_disabled(create: str, made: str) -> None:
    result = convert_source(SCRIPT.format(create=create), "train.py")
    assert made in result.output, result.output
    assert not [f for f in result.findings if f.code == "ACC127"]
    assert convert_source(result.output, "train.py").output == result.output


UNREACHABLE = """\
import torch
import wandb


def train(model, data):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        wandb.log({"loss": loss.item()})


def main():
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
    train(model, data)


if __name__ == "__main__":
    run = wandb.init(project="demo")
    main()
    run.finish()
"""


def test_a_run_started_where_the_accelerator_cannot_be_reached_is_reported() -> None:
    result = convert_source(UNREACHABLE, "train.py")
    assert result.changed, result.findings
    assert '    run = wandb.init(project="demo")\n' in result.output  # before `main` creates the Accelerator
    assert [f.line for f in result.findings if f.code == "ACC127"] == [22]
