"""A per-batch scheduler in a loop bounded by iterations (not by passes over the data) is not
prepared: the loop runs as many iterations on N processes as on one, and a prepared scheduler
would step N times per iteration (fixtures/iteration_bounded_poly runs it end to end)."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: (1 - it / total_itrs) ** 0.9)
loader = DataLoader(dataset, batch_size=8)
cur_itrs = 0
{loop}
"""

BODY = """\
        cur_itrs += 1
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
"""


def prepared(loop: str) -> str:
    source = SCRIPT.format(loop=loop)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output


@pytest.mark.parametrize("loop", [
    "while cur_itrs < total_itrs:\n    for x, y in loader:\n" + BODY,
    "for epoch in range(100):\n    for x, y in loader:\n" + BODY + "        if cur_itrs >= total_itrs:\n            break\n",
    "for epoch in range(100):\n    for i, (x, y) in enumerate(loader):\n" + BODY.replace("        cur_itrs += 1\n", "")
    + "        if i == max_steps:\n            return\n",
])
def test_a_loop_bounded_by_iterations_keeps_its_scheduler_out_of_prepare(loop):
    out = prepared(loop)
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in out


@pytest.mark.parametrize("loop", [
    "for epoch in range(3):\n    for x, y in loader:\n" + BODY,
    "for epoch in range(3):\n    for x, y in loader:\n" + BODY + "        if args.dry_run:\n            break\n",
    # an optional bound, off by default (Hugging Face's examples, JointBERT): the epochs bound the loop
    "for epoch in range(3):\n    for x, y in loader:\n" + BODY
    + "        if 0 < args.max_steps < cur_itrs:\n            break\n",
    "for epoch in range(3):\n    for x, y in loader:\n" + BODY
    + "        if args.max_steps > 0 and cur_itrs > args.max_steps:\n            break\n",
])
def test_a_loop_over_the_data_prepares_its_per_batch_scheduler(loop):
    out = prepared(loop)
    assert "loader, model, optimizer, scheduler = accelerator.prepare(\n    loader, model, optimizer, scheduler\n)" in out
