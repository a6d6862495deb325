"""ACC010/ACC112: mixed precision switched by `enabled=` maps to one Accelerator argument, or stays."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

use_amp = torch.cuda.is_available()
loader = DataLoader(make_dataset(), batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def _left_alone(source: str, reason: str) -> None:
    result = convert(source)
    assert "mixed_precision" not in result.output
    assert "scaler.scale(loss).backward()" in result.output and "torch.autocast(" in result.output
    findings = [f for f in result.findings if f.code == "ACC112"]
    assert len(findings) == 1 and reason in findings[0].message


def test_one_flag_everywhere_becomes_a_conditional_precision() -> None:
    source = SCRIPT.replace("torch.bfloat16", "torch.float16")
    result = convert(source)
    assert 'accelerator = Accelerator(mixed_precision="fp16" if use_amp else "no")' in result.output
    assert "with accelerator.autocast():" in result.output and "GradScaler" not in result.output
    assert not result.findings
    assert_stable(result.output)


def test_flags_that_differ_are_left_alone() -> None:
    _left_alone(SCRIPT.replace('dtype=torch.bfloat16, enabled=use_amp', 'dtype=torch.float16, enabled=other'),
                "different flags")


def test_a_flag_in_some_places_only_is_left_alone() -> None:
    _left_alone(SCRIPT.replace("dtype=torch.bfloat16, enabled=use_amp", "dtype=torch.float16"), "some places only")


def test_a_flag_bound_after_the_device_is_left_alone() -> None:
    source = SCRIPT.replace("torch.bfloat16", "torch.float16").replace("use_amp = torch.cuda.is_available()\n", "")
    source = source.replace("model = Net()\n", "model = Net()\nuse_amp = torch.cuda.is_available()\n")
    _left_alone(source, "not known where the Accelerator is created")


def test_scaler_arguments_accelerate_does_not_take_are_left_alone() -> None:
    _left_alone(SCRIPT.replace('GradScaler("cuda", enabled=use_amp)', "GradScaler(init_scale=1024)"),
                "arguments Accelerate does not take")


def test_without_acc010_the_accelerator_does_not_scale() -> None:
    source = SCRIPT.replace("torch.bfloat16", "torch.float16")
    result = convert(source, select=frozenset({"ACC001", "ACC004"}))
    assert "accelerator = Accelerator()" in result.output
    assert "scaler.scale(loss).backward()" in result.output
