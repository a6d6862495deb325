"""A script that moves its model to a device accelify cannot follow (`device = select_device()`, a
helper's `device` parameter) is refused with ACC108, which says so; it was refused before with a
false ACC121 "places nothing on a device" (issue 24's real scripts: ultralytics/mnist, d2l)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

HELPER_DEVICE = """\
import torch

device = torch_utils.select_device()
data = make_batches()
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in data:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""

PARAMETER = """\
import torch


def train(model, data, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(device)
    for x, y in data:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()


train(Net(), make_batches(), torch.device("cuda" if torch.cuda.is_available() else "cpu"))
"""


def test_a_model_moved_to_a_device_chosen_elsewhere_is_refused_with_the_true_reason():
    result = convert_source(HELPER_DEVICE, "train.py")
    assert result.output == HELPER_DEVICE
    [finding] = result.findings
    assert finding.code == "ACC108" and finding.line == 5
    assert "moves its model to `device`, a device accelify cannot follow" in finding.message
    assert "places nothing" not in finding.message


def test_a_model_and_device_handed_to_the_training_function_are_named_as_parameters():
    """The model is handed in too: what blocks first is that `train` builds the optimizer for a model it is
    handed (ACC104, accelify prepares where the optimizer is built); never "places nothing"."""
    result = convert_source(PARAMETER, "train.py")
    assert result.output == PARAMETER
    assert any(f.code == "ACC104" and "built in `train` for `model`, a parameter" in f.message for f in result.findings)
    assert not any("places nothing" in f.message for f in result.findings)
