"""A function that builds the optimizer for a model handed in (`def train(model, loader, device):
optimizer = Adam(model.parameters())`, called by `main()`, which builds the model and the loader): the
most common shape of research code left. accelify prepares where the optimizer is built and does not
prepare objects handed in yet: ACC104 says that, not a false "places nothing" (ACC121)."""

from __future__ import annotations

from pathlib import Path

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def train(model, train_loader, device, epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 2).to(device)
    x = torch.randn(32, 4)
    train_loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4, shuffle=True)
    train(model, train_loader, device, 2)


if __name__ == "__main__":
    main()
"""


def test_an_optimizer_built_for_a_model_handed_in_is_refused_truly() -> None:
    result = convert_source(SCRIPT, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert (finding.code, finding.line) == ("ACC104", 7)
    assert "built in `train` for `model`, a parameter" in finding.message


def test_in_a_module_beside_the_script_it_is_named_as_the_user_wrote_it(tmp_path: Path) -> None:
    """`import engine` ... `engine.train(...)`: the program's own name for `train` never reaches the user."""
    head, _, rest = SCRIPT.partition("\n\ndef main():")
    (tmp_path / "engine.py").write_text(head + "\n")
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nimport engine\n\n\ndef main():" + \
        rest.replace("    train(model,", "    engine.train(model,")
    (tmp_path / "main.py").write_text(script)
    result = convert_source(script, str(tmp_path / "main.py"))
    assert not result.changed
    [companion] = result.companions
    [finding] = companion.findings
    assert finding.code == "ACC104" and "built in `train` for `model`" in finding.message
    assert "accelify_masked" not in finding.message + finding.suggestion
