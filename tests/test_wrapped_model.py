"""ACC120: the model's own attributes after `prepare` are reported (DDP does not forward them)."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import torch
from torch.utils.data import DataLoader


def evaluate(model, loader):
    for batch in loader:
        out = model.generate(batch, max_length=model.config.max_length)
        print(out)


loader = DataLoader(make_dataset(), batch_size=8)
model = Net()
model.config.dropout = 0.1
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    model.train()
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
model.eval()
evaluate(model, loader)
print(model.config.name)
"""

TRAINER = """\
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model):
        self.model = model
        self.model.config.dropout = 0.1
        self.loader = DataLoader(make_dataset(), batch_size=8)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self):
        self.model.train()
        for x, y in self.loader:
            loss = self.model.compute_loss(x, y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
"""


def _reported(source: str) -> list[tuple[int, str]]:
    """(line, `model.attr`) of each ACC120 finding."""
    return [(f.line, f.message.split("`")[1]) for f in convert(source).findings if f.code == "ACC120"]


def test_attributes_after_prepare_are_read_through_unwrap_model_and_the_module_api_is_not() -> None:
    # With two processes the wrapper raises AttributeError on `model.generate`/`model.config`;
    # model.train()/eval()/parameters() exist on the wrapper; model.config before prepare is the plain model's.
    result = convert(SCRIPT)
    assert _reported(SCRIPT) == []
    assert (
        "        out = accelerator.unwrap_model(model).generate(batch, "
        "max_length=accelerator.unwrap_model(model).config.max_length)\n"
    ) in result.output
    assert "accelerator.print(accelerator.unwrap_model(model).config.name)\n" in result.output
    assert "\nmodel.config.dropout = 0.1\n" in result.output
    assert "model.train()\n" in result.output and "\nmodel.eval()\n" in result.output
    assert_stable(result.output)


def test_a_method_of_the_model_called_in_the_training_step_is_refused() -> None:
    # Run around its DDP wrapper there, the model would skip the gradient synchronisation.
    source = SCRIPT.replace("    loss = model(x, y)\n", "    loss = model.compute_loss(x, y)\n")
    assert _reported(source) == [(17, "model.compute_loss")]
    finding = next(f for f in convert(source).findings if f.code == "ACC120")
    assert "training step" in finding.message
    assert "accelerator.unwrap_model(model).compute_loss" in finding.suggestion
    assert convert(source).output == source


def test_a_method_called_under_no_grad_in_the_training_loop_is_unwrapped() -> None:
    source = SCRIPT.replace("    optimizer.zero_grad()\n", "    optimizer.zero_grad()\n    with torch.no_grad():\n        sample = model.decode(z)\n")
    output = convert(source).output
    assert "        sample = accelerator.unwrap_model(model).decode(z)\n" in output


def test_class_trainer_methods_after_init_are_reported() -> None:
    assert _reported(TRAINER) == [(15, "self.model.compute_loss")]


def test_an_unwrapped_model_is_not_reported() -> None:
    source = SCRIPT.replace("print(model.config.name)", "print(accelerator.unwrap_model(model).config.name)")
    assert (23, "model.config") not in _reported(source)


def test_moving_a_method_result_to_the_cpu_is_not_moving_the_model() -> None:
    source = SCRIPT.replace("print(model.config.name)", "sample = model(z).cpu()\nmodel.cpu()")
    source = source.replace("model.generate(", "accelerator.unwrap_model(model).generate(")
    source = source.replace("model.config.max_length", "accelerator.unwrap_model(model).config.max_length")
    assert _reported(source) == []
    findings = convert(source).findings
    moved = [f.line for f in findings if f.code == "ACC108"]
    assert moved == [24]  # `model.cpu()`, not `model(z).cpu()` (a tensor) on line 23


def test_a_model_moved_to_the_cpu_and_back_keeps_the_way_back() -> None:
    source = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(make_dataset(), batch_size=8)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = model(x.to(device), y.to(device))
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        model.eval().cpu()
        export(model)
        model.to(device).train()
"""
    result = convert(source)
    assert "model = Net()\n" in result.output  # the first placement goes: prepare places the model
    assert "        model.to(accelerator.device).train()\n" in result.output  # the way back stays
    assert [f.code for f in result.findings] == ["ACC108"]


def test_a_helper_that_calls_the_models_own_method_takes_the_accelerator() -> None:
    """codesearch_deepcs: `validate(valid_set, model, ...)` runs `model.code_encoding(...)` under
    `torch.no_grad()`: the helper gets the accelerator and reads the plain model through
    `accelerator.unwrap_model(model)` (it was ACC120, "this code cannot reach the Accelerator")."""
    from accelify.core.pipeline import convert_source

    source = '''\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 2)

    def encode(self, x):
        return self.enc(x)

    def forward(self, x):
        return self.enc(x)


def validate(model, data):
    with torch.no_grad():
        return model.encode(data).sum().item()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(validate(model, torch.randn(3, 4).to(device)))


if __name__ == "__main__":
    main()
'''
    result = convert_source(source, "train.py")
    assert result.changed, result.findings
    assert "def validate(accelerator, model, data):" in result.output
    assert "return accelerator.unwrap_model(model).encode(data).sum().item()" in result.output
    assert "validate(accelerator, model, torch.randn(3, 4).to(accelerator.device))" in result.output


PARAM_GROUPS_OF_THE_WRAPPER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Siam(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.predictor = nn.Linear(4, 4)

    def forward(self, x):
        return self.predictor(self.encoder(x))


model = Siam().cuda()
model = nn.DataParallel(model)
optim_params = [{'params': model.module.encoder.parameters(), 'fix_lr': False},
                {'params': model.module.predictor.parameters(), 'fix_lr': True}]
optimizer = torch.optim.SGD(optim_params, 0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
for (x,) in loader:
    loss = model(x.cuda()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(model.module.encoder.weight.sum())
"""


def test_parameter_groups_of_the_unwrapped_model_are_the_models_when_converted_again() -> None:
    """SimSiam's parameter groups `model.module.encoder.parameters()`, read after the wrapper (which the conversion
    removes) and before `prepare`, become `accelerator.unwrap_model(model).encoder.parameters()` (the model
    itself there). Converted again, that optimizer was taken for one training a model of another scope (ACC107):
    the converted script was refused with a false reason."""
    out = convert(PARAM_GROUPS_OF_THE_WRAPPER).output
    assert "optim_params = [{'params': accelerator.unwrap_model(model).encoder.parameters(), 'fix_lr': False},\n" in out
    assert "print(accelerator.unwrap_model(model).encoder.weight.sum())" in out
    assert_stable(out)
    from accelify.core.pipeline import convert_source

    assert convert_source(out, "again.py").findings == []
