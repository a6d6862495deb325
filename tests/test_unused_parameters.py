"""A prepared model whose forward runs a part under `torch.no_grad()` while that part's parameters
still require grad gets `DistributedDataParallelKwargs(find_unused_parameters=True)`: DDP would wait
for their gradients and fail at the second step (fixtures/frozen_backbone runs on two processes).
A part the file freezes needs nothing."""

from __future__ import annotations

from pathlib import Path

from accelify.core.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "frozen_backbone" / "before.py"
HANDLER = "kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)]"


def convert(source: str) -> str:
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output


def test_a_part_run_without_gradients_needs_find_unused_parameters():
    out = convert(FIXTURE.read_text(encoding="utf-8"))
    assert HANDLER in out and "from accelerate import Accelerator, DistributedDataParallelKwargs" in out
    again = convert_source(out, "train.py")
    assert again.output == out and not again.findings


def test_a_frozen_part_needs_nothing():
    source = FIXTURE.read_text(encoding="utf-8")
    for freeze in ("        for p in self.backbone.parameters():\n            p.requires_grad = False\n",
                   "        self.backbone.requires_grad_(False)\n"):
        frozen = source.replace("        self.head = nn.Linear(16, 3)\n", "        self.head = nn.Linear(16, 3)\n" + freeze)
        assert "DistributedDataParallelKwargs" not in convert(frozen)


def test_a_forward_with_gradients_needs_nothing():
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "        with torch.no_grad():\n            features = self.backbone(x)\n", "        features = self.backbone(x)\n")
    assert "DistributedDataParallelKwargs" not in convert(source)


def test_a_forward_that_detaches_a_computed_value_needs_find_unused_parameters():
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "        with torch.no_grad():\n            features = self.backbone(x)\n",
        "        features = self.backbone(x).cpu().data\n")
    assert HANDLER in convert(source)
    reads_weights = FIXTURE.read_text(encoding="utf-8").replace(
        "        with torch.no_grad():\n            features = self.backbone(x)\n",
        "        features = self.backbone(x) * self.head.weight.data.norm()\n")
    assert "DistributedDataParallelKwargs" not in convert(reads_weights)



STEM = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
{forward}

model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
for (x,) in loader:
    loss = model(x.cuda())[0].sum()
    loss.backward()
    optimizer.step()
"""


def test_a_detached_copy_of_a_value_also_used_whole_needs_nothing():
    """SimSiam's `return p1, p2, z1.detach(), z2.detach()` beside `p1 = self.predictor(z1)`: the encoder still
    gets its gradient through `p1` (the original runs under DDP without find_unused_parameters)."""
    out = convert(STEM.format(forward="        z = self.backbone(x)\n        p = self.head(z)\n"
                                      "        return p, z.detach()\n"))
    assert HANDLER not in out


def test_a_value_replaced_by_its_detached_copy_still_needs_find_unused_parameters():
    out = convert(STEM.format(forward="        x = self.backbone(x)\n        x = x.detach()\n"
                                      "        return self.head(x), x\n"))
    assert HANDLER in out


def test_data_read_in_a_test_cuts_nothing():
    """DCGAN (WGAN's models): `if isinstance(input.data, torch.cuda.FloatTensor) and self.ngpu > 1:` only tests."""
    out = convert(STEM.format(forward="        if isinstance(x.data, torch.cuda.FloatTensor):\n"
                                      "            x = x * 1\n        return self.head(self.backbone(x)), x\n"))
    assert HANDLER not in out
