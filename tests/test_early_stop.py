"""ACC119: leaving the training loop on a per-process value is reported; rank-consistent exits are not."""

from __future__ import annotations

from conftest import convert

SCRIPT = """\
import torch
from torch.utils.data import DataLoader


def evaluate(model, loader):
    total = 0.0
    for x, y in loader:
        output = model(x)
        total += (output.argmax(1) == y).float().sum().item()
    return total / len(loader.dataset)


def main(args):
    train_loader = DataLoader(make_dataset(), batch_size=8)
    val_loader = DataLoader(make_dataset(), batch_size=8)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    best, bad_epochs, step = float("inf"), 0, 0
    for epoch in range(args.epochs):
        for x, y in train_loader:
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step >= args.max_steps:
                break
            if loss.item() < 1e-4:
                break
        val_loss = evaluate(model, val_loader)
        if val_loss < best:
            best, bad_epochs = val_loss, 0
        else:
            bad_epochs += 1
            if bad_epochs >= args.patience:
                break


if __name__ == "__main__":
    main(parse_args())
"""


def _early_stops(source: str) -> list:
    return [f for f in convert(source).findings if f.code == "ACC119"]


PER_PROCESS = SCRIPT.replace("        val_loss = evaluate(model, val_loader)\n", "        val_loss = loss.item()\n")


def test_per_process_values_are_reported_and_counters_are_not() -> None:
    findings = _early_stops(PER_PROCESS)
    lines = PER_PROCESS.splitlines()
    # the loss test leaves the loop on every process together (ACC026, below); the patience test on the
    # last batch's loss, under an `else:` only some processes reach, is reported; the step counter is the
    # same everywhere
    assert [lines[f.line - 1].strip() for f in findings] == ["break"]
    assert [f.line for f in findings] == [36]
    assert "`bad_epochs`" in findings[0].message
    assert "accelerator.set_trigger()" in findings[0].suggestion
    assert "accelerator.check_trigger()" in findings[0].suggestion


def test_a_stop_every_pass_reaches_is_taken_together() -> None:
    """`if loss.item() < 1e-4: break` in the batch loop: `set_trigger()` where it holds, `if
    accelerator.check_trigger(): break` on every process (ACC026), so all stop at the same step."""
    output = convert(SCRIPT).output
    assert ("            if loss.item() < 1e-4:\n                accelerator.set_trigger()\n"
            "            if accelerator.check_trigger():\n                break\n") in output
    assert "            if step >= args.max_steps:\n                break\n" in output  # a counter: as it was


def test_a_gathered_value_is_the_same_everywhere() -> None:
    source = SCRIPT.replace(
        "        val_loss = evaluate(model, val_loader)\n",
        "        val_loss = accelerator.gather(evaluate(model, val_loader)).mean().item()\n",
    ).replace("            if loss.item() < 1e-4:\n                break\n", "")
    source = source.replace("    model = Net()\n", "    accelerator = Accelerator()\n    model = Net()\n")
    source = "from accelerate import Accelerator\n" + source
    assert "accelerator.backward(loss)" in convert(source).output
    assert _early_stops(source) == []
    # `evaluate` gathers its metrics itself once converted (accelify.analyses.gathers): the same everywhere too
    assert _early_stops(source.replace("accelerator.gather(evaluate(model, val_loader)).mean().item()",
                                       "evaluate(model, val_loader)")) == []
    # the last training batch's loss instead: each process's own, reported
    assert len(_early_stops(source.replace("accelerator.gather(evaluate(model, val_loader)).mean().item()",
                                           "loss.item()"))) == 1


def test_the_trigger_pattern_is_not_reported() -> None:
    source = SCRIPT.replace(
        "            if loss.item() < 1e-4:\n                break\n",
        "            if loss.item() < 1e-4:\n                accelerator.set_trigger()\n"
        "            if accelerator.check_trigger():\n                break\n",
    ).replace("            if bad_epochs >= args.patience:\n                break\n", "")
    assert _early_stops(source) == []


def test_a_loop_that_does_not_train_is_not_reported() -> None:
    source = PER_PROCESS + "\n\ndef search(items):\n    for item in items:\n        if item.score() > 0:\n            break\n"
    assert len(_early_stops(source)) == 1  # the patience test only (the loss test is taken together)
