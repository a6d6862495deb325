"""Shapes met in real scripts this session (docs/real-scripts.md, Part I, twenty-first session): a device chosen
from a name bound to "cuda" (resnet1d), a device string handed to a library that wants a string (torchsummary),
a model wrapped under a condition after a chain that binds it (ViT-CIFAR), a training function reached through a
dict (TransUNet)."""

from __future__ import annotations

from pathlib import Path

from accelify.core.pipeline import convert_source
from accelify.core.project import training_elsewhere

LOOP = """\
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
HEAD = "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"


def test_a_device_chosen_from_a_name_bound_to_cuda_is_the_automatic_one() -> None:
    source = HEAD + "from torchsummary import summary\n\n" + (
        'device_str = "cuda"\ndevice = torch.device(device_str if torch.cuda.is_available() else "cpu")\n'
        "model = nn.Linear(4, 1).to(device)\nsummary(model, (4,), device=device_str)\n") + LOOP
    result = convert_source(source, "train.py")
    assert result.changed, result.findings
    # torchsummary checks `device.lower() in ["cuda", "cpu"]`: it gets the device's type, a string
    assert "summary(model, (4,), device=accelerator.device.type)" in result.output


def test_a_model_wrapped_under_a_condition_after_a_chain_without_else_converts() -> None:
    """The chain binds the model or leaves it unbound; `if ...: model = nn.DataParallel(model)` reads it, so the
    optimizer line after it reads a model the original needed bound there too."""
    source = HEAD + (
        "import sys\narch = sys.argv[1] if len(sys.argv) > 1 else 'small'\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
        "if arch == 'small':\n    model = nn.Linear(4, 1)\nelif arch == 'big':\n    model = nn.Sequential(nn.Linear(4, 1))\n"
        "if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\nmodel.to(device)\n") + LOOP
    result = convert_source(source, "train.py")
    assert result.changed, result.findings
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output


def test_a_training_function_reached_through_a_dict_is_named(tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(
        "def trainer_synapse(args, model, snapshot_path):\n    loss = model(args).sum()\n    loss.backward()\n")
    script = ("from trainer import trainer_synapse\n\nif __name__ == '__main__':\n"
              "    trainer = {'Synapse': trainer_synapse}\n    trainer['Synapse'](1, None, 'out')\n")
    (tmp_path / "train.py").write_text(script)
    [finding] = training_elsewhere(script, str(tmp_path / "train.py"))
    assert finding.code == "ACC135" and "trainer_synapse" in finding.message


def test_an_evaluation_whose_model_runs_in_branches_says_so() -> None:
    """UNet++'s `validate`: `if config['deep_supervision']: outputs = model(input) ... else: output = model(input)`;
    the refusal named no model call at all ("no `output = model(...)` line") before."""
    source = HEAD + (
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nmodel = nn.Linear(4, 1).to(device)\n'
        "deep = False\n") + LOOP + (
        "test_loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
        "total = 0.0\nwith torch.no_grad():\n    for x, y in test_loader:\n        x, y = x.to(device), y.to(device)\n"
        "        if deep:\n            output = model(x)[0]\n        else:\n            output = model(x)\n"
        "        total += ((output - y) ** 2).sum().item()\nprint(total)\n")
    result = convert_source(source, "train.py")
    messages = [f.message for f in result.findings if f.code in ("ACC114", "ACC146")]
    assert messages and all("no `output = model(...)` line" not in msg for msg in messages), result.findings
    assert any("if deep:" in msg for msg in messages), messages
