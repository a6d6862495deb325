"""ACC026: `if <value of the batch>: continue` before the backward pass is taken by every process
together (set_trigger/check_trigger); a skip on a step counter, or after the backward, is the same
on every process and stays as it is."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
{before}
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{after}
"""


@pytest.mark.parametrize("test", ["torch.isnan(loss)", "bool(loss == 0)", "x.shape[0] < 2", "loss.item() > 10"])
def test_a_skip_on_a_value_of_the_batch_is_taken_together(test) -> None:
    source = SCRIPT.format(before=f"    if {test}:\n        continue  # bad batch", after="")
    result = convert_source(source, "train.py")
    assert (f"    if {test}:\n        accelerator.set_trigger()\n    if accelerator.check_trigger():\n"
            "        continue  # bad batch\n") in result.output
    assert "ACC026" in {c.code for c in result.changes}
    assert convert_source(result.output, "train.py").output == result.output


def test_what_the_skip_does_first_stays_under_its_condition() -> None:
    source = SCRIPT.format(before="    if torch.isnan(loss):\n        print('nan at', step)\n        continue", after="")
    result = convert_source(source, "train.py")
    assert ("    if torch.isnan(loss):\n        accelerator.print('nan at', step)\n        accelerator.set_trigger()\n"
            "    if accelerator.check_trigger():\n        continue\n") in result.output


@pytest.mark.parametrize("before, after", [
    ("    if step < 2:\n        continue", ""),  # a step counter: the same on every process
    ("", "    if torch.isnan(loss):\n        continue"),  # after the backward: nothing to desynchronise
    ("    if torch.isnan(loss):\n        for _ in range(2):\n            continue\n        continue", ""),  # another jump
])
def test_other_skips_stay_as_they_are(before, after) -> None:
    result = convert_source(SCRIPT.format(before=before, after=after), "train.py")
    assert result.changed and "trigger" not in result.output


def test_a_skip_under_another_condition_is_refused() -> None:
    """`check_trigger()` is a collective: under `if step % 2:` (or another per-process test) only some
    processes would reach it. The file is left as it is (ACC137)."""
    source = SCRIPT.format(before="    if x.sum() > 0:\n        if torch.isnan(loss):\n            continue", after="")
    result = convert_source(source, "train.py")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC137"]


def test_a_skip_in_a_try_is_reached_by_every_process() -> None:
    """retinanet: the step is in a `try:` (with `except Exception: continue`): its body runs on every process."""
    source = SCRIPT.format(before="    try:\n        if torch.isnan(loss):\n            continue\n    except Exception:\n        pass",
                           after="")
    result = convert_source(source, "train.py")
    assert result.changed, result.findings
    assert ("        if torch.isnan(loss):\n            accelerator.set_trigger()\n"
            "        if accelerator.check_trigger():\n            continue\n") in result.output
