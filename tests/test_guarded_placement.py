"""A placement that stays, as `.to(accelerator.device)`, loses its `if torch.cuda.is_available():`
guard: the accelerator's device is not always CUDA (MPS, a TPU, `Accelerator(cpu=True)`), and
left under the guard the tensor would stay on the host there while the model is placed
(the device check of accelify.runtime.checks found it in a real VAE script)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8)
model = Net()
if torch.cuda.is_available():
    model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch_idx, data in enumerate(loader):
    img, _ = data
    img = augment(img)  # a helper accelify does not follow: its result may be anywhere
{guarded}
    loss = criterion(model(img), img)
    loss.backward()
    optimizer.step()
"""


def convert(guarded: str) -> str:
    source = SCRIPT.format(guarded=guarded)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output


def test_the_guard_goes_with_the_placement():
    out = convert("    if torch.cuda.is_available():\n        img = img.cuda()")
    assert "    img = img.to(accelerator.device)\n    loss = criterion" in out
    assert "is_available" not in out  # the model's guarded .cuda() went with the placement prepare does


def test_a_guard_with_an_else_or_other_work_stays():
    out = convert("    if torch.cuda.is_available():\n        img = img.cuda()\n        print('on the GPU')")
    assert "    if torch.cuda.is_available():\n        img = img.to(accelerator.device)\n" in out
    out = convert("    if torch.cuda.is_available():\n        img = img.cuda()\n    else:\n        img = img.float()")
    assert "    if torch.cuda.is_available():\n        img = img.to(accelerator.device)\n    else:\n" in out


def test_a_flag_of_the_user_is_not_an_availability_check():
    out = convert("    if args.cuda:\n        img = img.cuda()")
    assert "    if args.cuda:\n        img = img.to(accelerator.device)\n" in out


def test_idempotent():
    once = convert("    if torch.cuda.is_available():\n        img = img.cuda()")
    again = convert_source(once, "train.py")
    assert again.output == once and not again.findings


def test_an_else_that_does_the_same_without_the_placement_goes_too():
    out = convert("    if torch.cuda.is_available():\n        out = encoder(img.cuda())\n    else:\n        out = encoder(img)")
    assert "    out = encoder(img.to(accelerator.device))\n    loss = criterion" in out
    assert "is_available" not in out


def test_tensors_typed_for_cuda_or_the_cpu_are_made_on_the_accelerators_device():
    """The VAE's `reparametrize` (L1aoXingyu/pytorch-beginner): `torch.cuda.FloatTensor` when CUDA is there,
    `torch.FloatTensor` otherwise; the accelerator's device may be neither (the device check found it)."""
    out = convert("    if torch.cuda.is_available():\n        eps = torch.cuda.FloatTensor(img.size()).normal_()\n"
                  "    else:\n        eps = torch.FloatTensor(img.size()).normal_()\n    img = img + eps")
    assert "    eps = torch.FloatTensor(img.size()).to(accelerator.device).normal_()\n    img = img + eps" in out
    assert "torch.cuda" not in out
    out = convert("    if torch.cuda.is_available():\n        eps = torch.cuda.FloatTensor(img.size()).normal_()\n"
                  "    else:\n        eps = torch.FloatTensor(img.size()).uniform_()\n    img = img + eps")
    assert "torch.cuda.FloatTensor" in out  # the branches do different things: left as they are


def test_an_emptied_availability_check_leaves_no_pass() -> None:
    """retinanet: `if torch.cuda.is_available(): model = nn.DataParallel(model).cuda()` with `else: model =
    nn.DataParallel(model)`: both branches go, and so does the statement (it left a bare `pass`)."""
    from accelify.core.pipeline import convert_source

    source = (
        "import torch\n\n\ndef main():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)))\n"
        "    model = torch.nn.Linear(4, 2)\n\n"
        "    if torch.cuda.is_available():\n        model = torch.nn.DataParallel(model).cuda()\n"
        "    else:\n        model = torch.nn.DataParallel(model)\n\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
    )
    result = convert_source(source, "train.py")
    assert result.changed and "pass" not in result.output and "DataParallel" not in result.output
    assert "    model = torch.nn.Linear(4, 2)\n\n    optimizer = " in result.output
