"""`DataParallel` around a module of the script that no optimizer trains (pytorch-ddpm's `if FLAGS.parallel:
trainer = torch.nn.DataParallel(trainer)`, its samplers): it goes with the model's own. Left, under `accelerate
launch` every process would spread that module over every GPU (DataParallel stops on all but the first: the
module is not on `device_ids[0]`)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source
from conftest import assert_stable

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.model(x), y)


def main(parallel=False):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model).to(device)
{wrap}    for x, y in loader:
        loss = trainer(x.to(device), y.to(device)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
{after}

if __name__ == "__main__":
    main()
"""


def test_a_data_parallel_around_a_module_no_optimizer_trains_goes_with_its_if() -> None:
    wrap = "    if parallel:\n        trainer = torch.nn.DataParallel(trainer)\n"
    result = convert_source(SCRIPT.format(wrap=wrap, after=""), "train.py")
    assert result.changed, [f.render() for f in result.findings]
    assert "DataParallel" not in result.output and "if parallel:" not in result.output
    assert_stable(result.output)


def test_its_module_attribute_is_read_through_unwrap_model() -> None:
    wrap = "    trainer = torch.nn.DataParallel(trainer, device_ids=[0])\n"
    after = "    print(trainer.module.model.weight.sum())\n"
    result = convert_source(SCRIPT.format(wrap=wrap, after=after), "train.py")
    assert result.changed, [f.render() for f in result.findings]
    assert "DataParallel" not in result.output
    assert "    accelerator.print(accelerator.unwrap_model(trainer).model.weight.sum())\n" in result.output
    assert_stable(result.output)


def test_a_wrapper_bound_to_another_name_is_left_as_it_is() -> None:
    """`parallel_trainer = DataParallel(trainer)`: the two names differ; which one runs is not followed."""
    wrap = "    parallel_trainer = torch.nn.DataParallel(trainer)\n"
    result = convert_source(SCRIPT.format(wrap=wrap, after=""), "train.py")
    assert "    parallel_trainer = torch.nn.DataParallel(trainer)\n" in result.output
