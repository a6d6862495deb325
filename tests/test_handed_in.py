"""A function that builds the optimizer for a model handed in (`def train(model, loader, device):
optimizer = Adam(model.parameters())`, called by `main()`, which builds the model and the loader): the
most common shape of research code left. The model and the loaders are prepared where they are built,
the optimizer in `train` (accelify.analyses.handed), with ACC142 saying what that means for DeepSpeed and
FSDP2; the shapes it does not handle yet are refused with their reason (ACC104), never a false "places
nothing" (ACC121). fixtures/optimizer_in_train runs it on one and two processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source
from conftest import assert_stable

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


def test_the_model_is_prepared_where_it_is_built_and_the_optimizer_where_it_is() -> None:
    result = convert_source(SCRIPT, "train.py")
    assert result.changed and result.error is None
    out = result.output
    train, _, main = out.partition("def main():")
    assert "optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)\n    optimizer = accelerator.prepare(optimizer)\n" in train
    assert "train_loader, model = accelerator.prepare(train_loader, model)" in main
    assert "optimizer" not in main  # prepared once, in `train`
    assert "accelerator.backward(loss)" in train and ".to(device)" not in out
    assert [f.code for f in result.findings] == ["ACC142"]
    assert result.findings[0].line == 7 and "DeepSpeed" in result.findings[0].message
    assert_stable(out)


def test_in_a_module_beside_the_script_it_is_converted_there(tmp_path: Path) -> None:
    """`import engine` ... `engine.train(...)`: the prepare goes into engine.py, where the optimizer is; the
    program's own name for `train` never reaches the user."""
    head, _, rest = SCRIPT.partition("\n\ndef main():")
    (tmp_path / "engine.py").write_text(head + "\n")
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nimport engine\n\n\ndef main():" + \
        rest.replace("    train(model,", "    engine.train(model,")
    (tmp_path / "main.py").write_text(script)
    result = convert_source(script, str(tmp_path / "main.py"))
    assert result.changed
    [companion] = result.companions
    assert "    optimizer = accelerator.prepare(optimizer)\n" in companion.output
    assert "accelerator.prepare(train_loader, model)" in result.output
    [finding] = companion.findings
    assert finding.code == "ACC142" and "prepared in `train`" in finding.message
    assert "accelify_masked" not in finding.message + finding.suggestion


@pytest.mark.parametrize("change, why", [
    # called from two functions: which one builds the model to prepare?
    (("    train(model, train_loader, device, 2)\n",
      "    train(model, train_loader, device, 2)\n\n\ndef again(model, train_loader, device):\n"
      "    train(model, train_loader, device, 1)\n"), "called from more than one place"),
    # a scheduler of its own
    (("    for epoch in range(epochs):\n",
      "    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n    for epoch in range(epochs):\n"),
     "builds a scheduler too"),
    # the model handed in as an expression, not a name of the caller
    (("    train(model, train_loader, device, 2)", "    train(model.float(), train_loader, device, 2)"),
     "not handed one name of `main` for `model`"),
])
def test_what_it_does_not_handle_yet_is_refused_with_its_reason(change: tuple[str, str], why: str) -> None:
    source = SCRIPT.replace(*change)
    assert source != SCRIPT
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC104" and "built in `train` for `model`, a parameter" in finding.message
    assert why in finding.message


def test_a_module_without_a_main_guard_keeps_its_signatures_and_says_so() -> None:
    source = SCRIPT.replace('\n\nif __name__ == "__main__":\n    main()\n', "\n")
    assert source != SCRIPT
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC104" and "cannot be given the accelerator" in finding.message
    assert 'no `if __name__ == "__main__":` guard' in finding.message


def test_converted_again_it_says_nothing_the_first_conversion_did_not() -> None:
    """The converted `train(model, train_loader, accelerator, epochs)` already prepares its optimizer: a second
    conversion said it "cannot be given the accelerator" (ACC104), the name being taken by the accelerator. On
    Accelerate now, the file is left alone and nothing is said again."""
    first = convert_source(SCRIPT, "train.py")
    assert [f.code for f in first.findings] == ["ACC142"]
    again = convert_source(first.output, "train.py")
    assert not again.changed and not again.findings


OWN_LOADER = SCRIPT.replace("def train(model, train_loader, device, epochs):\n", """\
def train(model, device, epochs):
    x = torch.randn(32, 4)
    train_loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4, shuffle=True)
""").replace("""\
    x = torch.randn(32, 4)
    train_loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4, shuffle=True)
    train(model, train_loader, device, 2)
""", "    train(model, device, 2)\n")


def test_a_function_that_builds_its_loaders_prepares_the_model_it_is_handed_with_them() -> None:
    """Milesial's U-Net shape (fixtures/train_function_own_loaders runs it): the function is the setup scope,
    the device it is handed is the caller's automatic device, so its reads go with the batches' moves."""
    assert OWN_LOADER != SCRIPT and "train(model, device, 2)" in OWN_LOADER
    result = convert_source(OWN_LOADER, "train.py")
    assert result.changed and not result.findings
    train, _, main = result.output.partition("def main():")
    assert "    accelerator = Accelerator()\n" in train
    assert "train_loader, model, optimizer = accelerator.prepare(train_loader, model, optimizer)" in train
    assert "accelerator.backward(loss)" in train and "x.to(device)" not in train
    assert "prepare" not in main and "accelerator" not in main
    assert_stable(result.output)


@pytest.mark.parametrize("after, used", [
    ("    torch.save(model.state_dict(), 'model.pt')\n", "torch.save"),
    ("    print(model(torch.randn(2, 4)))\n", "print"),
])
def test_a_model_used_by_the_caller_after_the_function_prepared_it_is_refused(after: str, used: str) -> None:
    source = OWN_LOADER.replace("    train(model, device, 2)\n", "    train(model, device, 2)\n" + after)
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC104" and "used in `main` after `train` has prepared and trained it" in finding.message
    assert used in source.splitlines()[finding.line - 1]


def test_a_loader_handed_in_beside_one_it_builds_is_refused_for_the_handed_one() -> None:
    source = SCRIPT.replace("    for epoch in range(epochs):\n",
                            "    extra = DataLoader(TensorDataset(torch.randn(8, 4), torch.zeros(8).long()), batch_size=4)\n"
                            "    for epoch in range(epochs):\n", 1)
    result = convert_source(source, "train.py")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC123"] and "`train_loader`" in result.findings[0].message


def test_a_method_of_the_model_called_after_the_last_training_is_refused() -> None:
    """`model.use_checkpointing()` before training again is setup for that training; `model.save(...)` after the
    last one would run on every process."""
    source = OWN_LOADER.replace("    train(model, device, 2)\n", "    train(model, device, 2)\n    model.save('out.pt')\n")
    result = convert_source(source, "train.py")
    assert not result.changed and [f.code for f in result.findings] == ["ACC104"]
    retried = OWN_LOADER.replace("    train(model, device, 2)\n",
                                 "    train(model, device, 2)\n    model.eval()\n    train(model, device, 1)\n")
    assert convert_source(retried, "train.py").changed


def test_a_cuda_placement_of_the_handed_model_in_its_caller_stays() -> None:
    """`model = Net().cuda()` in the caller of a function that prepares it: `prepare` moves it to
    `accelerator.device`, so the caller's placement, which cannot reach the Accelerator, stays as written
    (it was ACC109, a placement "left apart from the model")."""
    source = OWN_LOADER.replace("    model = torch.nn.Linear(4, 2).to(device)\n",
                                "    model = torch.nn.Linear(4, 2).cuda()\n")
    assert source != OWN_LOADER
    result = convert_source(source, "train.py")
    assert result.changed and not result.findings, result.findings
    assert "    model = torch.nn.Linear(4, 2).cuda()\n" in result.output
    assert "train_loader, model, optimizer = accelerator.prepare(train_loader, model, optimizer)" in result.output
