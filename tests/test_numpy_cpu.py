"""ACC019: in a script that placed nothing on a device, `.numpy()` gets `.cpu()` first (converted,
the batches and the model's outputs are on the accelerator's device: the PyTorch CIFAR-10
tutorial's `imshow` of a test batch would raise on a GPU)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

HEAD = """\
import torch
from torch.utils.data import DataLoader


def imshow(img):
    img = img / 2 + 0.5
    return img.numpy()


loader = DataLoader(dataset, batch_size=8, shuffle=True)
model = Net()
{place}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    {batch}
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
images, labels = next(iter(loader))
imshow(images)
{tail}
"""


def convert(place="", batch="pass", tail=""):
    source = HEAD.format(place=place, batch=batch, tail=tail)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result


def test_a_cpu_script_moves_tensors_back_before_numpy():
    result = convert(tail="preds = model(images).argmax(1).numpy()\nnoise = torch.randn(3).numpy()\n"
                          "done = model(images).detach().cpu().numpy()\n")
    out = result.output
    assert "    return img.cpu().numpy()" in out
    assert "preds = model(images).argmax(1).cpu().numpy()" in out
    assert "noise = torch.randn(3).numpy()" in out  # made on the CPU by the script: stays there
    assert "done = model(images).detach().cpu().numpy()" in out  # already moved
    assert [c.code for c in result.changes].count("ACC019") == 2


def test_a_script_that_placed_its_model_is_left_as_it_is():
    result = convert(place="device = torch.device('cuda')\nmodel.to(device)", batch="x, y = x.to(device), y.to(device)")
    assert "return img.numpy()" in result.output
    assert "ACC019" not in [c.code for c in result.changes]


def test_idempotent():
    once = convert().output
    assert convert_source(once, "train.py").output == once
