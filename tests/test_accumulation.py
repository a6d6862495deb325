"""ACC013/ACC117: hand-written gradient accumulation is rewritten only when Accelerate's is the
same update; every other form is kept, dividing once, and reported with its reason."""

from __future__ import annotations

import pytest

from conftest import assert_stable, convert

HEADER = """\
import torch
from torch.utils.data import DataLoader

N = 4
loader = DataLoader(make_dataset(), batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

CONVERTIBLE_LOOP = """\
for i, (x, y) in enumerate(loader):
    loss = model(x, y)
    loss = loss / N
    loss.backward()
    if (i + 1) % N == 0 or (i + 1) == len(loader):
        optimizer.step()
        optimizer.zero_grad()
"""


def _kept(source: str, reason: str) -> None:
    result = convert(source)
    assert "accumulate(" not in result.output
    assert "gradient_accumulation_steps" not in result.output
    divisions = [line for line in source.splitlines() if "loss = loss /" in line or "loss /=" in line]
    assert divisions and all(line in result.output for line in divisions)  # still divides, once
    findings = [f for f in result.findings if f.code == "ACC117"]
    assert len(findings) == 1, result.findings
    assert reason in findings[0].message
    assert "accelerator.accumulate" in findings[0].suggestion


def test_the_provable_form_is_rewritten() -> None:
    result = convert(HEADER + CONVERTIBLE_LOOP)
    assert "accelerator = Accelerator(gradient_accumulation_steps=N)" in result.output
    assert "    with accelerator.accumulate(model):\n        loss = model(x, y)\n        accelerator.backward(loss)\n" in result.output
    assert "/ N" not in result.output and "% N" not in result.output
    assert not [f for f in result.findings if f.code == "ACC117"]
    assert_stable(result.output)


@pytest.mark.parametrize(
    "header, test",
    [
        ("enumerate(loader, start=1)", "i % N == 0 or i == len(loader)"),
        ("enumerate(loader, 1)", "len(loader) == i or (i % N) == 0"),
        ("enumerate(loader)", "i == len(loader) - 1 or (1 + i) % N == 0"),
    ],
)
def test_equivalent_spellings_are_rewritten(header: str, test: str) -> None:
    loop = CONVERTIBLE_LOOP.replace("enumerate(loader)", header).replace(
        "(i + 1) % N == 0 or (i + 1) == len(loader)", test
    )
    result = convert(HEADER + loop)
    assert "gradient_accumulation_steps=N" in result.output and "accelerator.accumulate(model)" in result.output
    assert "% N" not in result.output


@pytest.mark.parametrize(
    "loop, reason",
    [
        (CONVERTIBLE_LOOP.replace(" or (i + 1) == len(loader)", ""), "carried into the next epoch"),
        (CONVERTIBLE_LOOP.replace("    loss.backward()\n", "    loss.backward()\n    print(loss.item())\n"),
         "used beyond `.backward()`"),
        (CONVERTIBLE_LOOP.replace("loss = loss / N", "loss = loss / 2"), "something other than the N"),
        (CONVERTIBLE_LOOP.replace("enumerate(loader)", "enumerate(loader, start=2)"), "does not count its batches"),
        # counted from 1, `i + 1` is the next batch's number: not Accelerate's schedule
        (CONVERTIBLE_LOOP.replace("enumerate(loader)", "enumerate(loader, 1)"), "not under"),
        (CONVERTIBLE_LOOP.replace("    loss.backward()\n", "    loss.backward()\n    optimizer.zero_grad()\n"),
         "outside the `% N` branch"),
        (CONVERTIBLE_LOOP.replace("(i + 1) == len(loader)", "(i + 1) == len(other_loader)"),
         "another dataloader"),
        (CONVERTIBLE_LOOP + "\nfor x, y in loader:\n    model(x, y).backward()\n", "more than once"),
    ],
)
def test_other_forms_are_kept_and_reported(loop: str, reason: str) -> None:
    _kept(HEADER + loop, reason)


def test_the_n_must_be_known_where_the_accelerator_is_created() -> None:
    source = """\
import torch
from torch.utils.data import DataLoader


def train(args, model, device, loader, optimizer):
    for i, (x, y) in enumerate(loader):
        loss = model(x.to(device), y.to(device))
        loss = loss / args.accumulation
        loss.backward()
        if (i + 1) % args.accumulation == 0 or (i + 1) == len(loader):
            optimizer.step()
            optimizer.zero_grad()


def main(args):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(make_dataset(), batch_size=8)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(args, model, device, loader, optimizer)


if __name__ == "__main__":
    main(parse_args())
"""
    result = convert(source)
    assert "accelerator.backward(loss)" in result.output  # the rest of the migration happens
    finding = [f for f in result.findings if f.code == "ACC117"]
    assert finding and "not known where the Accelerator is created" in finding[0].message
    assert "loss = loss / args.accumulation" in result.output


def test_a_one_cycle_scheduler_is_not_accumulated() -> None:
    header = HEADER + "scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=100)\n"
    loop = CONVERTIBLE_LOOP.replace("        optimizer.zero_grad()\n", "        scheduler.step()\n        optimizer.zero_grad()\n")
    _kept(header + loop, "OneCycleLR")


def test_an_optimizer_wrapper_is_reported_and_blocks_accumulation() -> None:
    source = HEADER.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "base = torch.optim.SGD(model.parameters(), lr=0.1)\noptimizer = Lookahead(base, k=5)\n",
    ) + CONVERTIBLE_LOOP
    result = convert(source)
    assert [f.code for f in result.findings if f.code == "ACC118"] == ["ACC118"]
    assert "Lookahead" not in result.output.split("prepare(")[1].split(")")[0]  # not taken for a scheduler
    _kept(source, "wrapped")


def test_a_branch_that_does_more_than_step_keeps_its_if_on_sync_gradients() -> None:
    loop = CONVERTIBLE_LOOP.replace("        optimizer.zero_grad()\n", "        optimizer.zero_grad()\n        model.zero_grad()\n")
    result = convert(HEADER + loop)
    assert "        if accelerator.sync_gradients:\n            optimizer.step()\n" in result.output
    assert "model.zero_grad()" in result.output


def test_without_acc013_the_accelerator_does_not_divide() -> None:
    # gradient_accumulation_steps with the division kept would divide the loss twice.
    result = convert(HEADER + CONVERTIBLE_LOOP, select=frozenset({"ACC001", "ACC004", "ACC005"}))
    assert "accelerator = Accelerator()" in result.output
    assert "loss = loss / N" in result.output and "accelerator.backward(loss)" in result.output
