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
