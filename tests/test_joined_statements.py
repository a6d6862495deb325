"""Statements joined on one line (``a; b``, ``if cond: stmt``): converted one statement at a time, the
lines the conversion leaves alone kept as written (accelify.core.joined)."""

from __future__ import annotations

from conftest import assert_stable, convert

HEAD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
"""


def test_a_joined_backward_and_step_are_converted_one_by_one() -> None:
    source = HEAD + """\
lr = 0.1; momentum = 0.9  # untouched: kept as written
for x, y in loader:
    x = x.to(device); y = y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
"""
    result = convert(source)
    assert result.error is None and result.changed
    out = result.output
    assert "lr = 0.1; momentum = 0.9  # untouched: kept as written\n" in out
    assert ".to(device)" not in out
    assert "loss.backward()" not in out
    assert "    optimizer.zero_grad()\n    accelerator.backward(loss)\n    optimizer.step()\n" in out
    assert_stable(out)
    assert convert(out).output == out  # converted again: nothing changes


def test_a_scaler_on_one_line_is_converted_not_an_internal_error() -> None:
    source = HEAD + """\
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    with torch.autocast("cuda"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
"""
    result = convert(source)
    assert result.error is None, result.error
    assert "scaler" not in result.output
    assert "    accelerator.backward(loss)\n    optimizer.step()\n" in result.output
    assert_stable(result.output)


def test_a_body_on_its_headers_line_is_removed_with_its_header() -> None:
    source = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

use_cuda = torch.cuda.is_available()
model = torch.nn.Linear(4, 2)
if use_cuda: model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
for x, y in loader:
    if use_cuda: x, y = x.cuda(), y.cuda()
    if x is None: continue
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""
    result = convert(source)
    assert result.error is None and result.changed
    out = result.output
    assert "if use_cuda:" not in out  # not `if use_cuda: model` nor `if use_cuda: x, y = x, y`
    assert "    if x is None: continue\n" in out
    assert_stable(out)
    assert convert(out).output == out


def test_hand_written_ddp_on_joined_lines_converts_without_a_false_finding() -> None:
    source = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["LOCAL_RANK"]); dist.init_process_group("gloo"); torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(4, 2).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 4).cuda(rank)
        loss = model(x).sum(); optimizer.zero_grad(); loss.backward(); optimizer.step()
    if rank == 0: torch.save(model.module.state_dict(), "m.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
    result = convert(source)
    assert result.error is None and result.changed, result.findings
    assert "ACC126" not in {f.code for f in result.findings}  # was: "init_process_group(...) is used as a value"
    out = result.output
    assert "dist." not in out and "set_device" not in out and "DDP" not in out
    assert "accelerator.unwrap_model(model).state_dict()" in out
    assert_stable(out)
    assert convert(out).output == out


def test_changes_name_the_line_as_written() -> None:
    source = HEAD + """\
for x, y in loader:
    x = x.to(device); loss = model(x).sum(); loss.backward(); optimizer.step()
"""
    result = convert(source)
    lines = source.splitlines()
    backward = [c for c in result.changes if c.code == "ACC005"]
    assert backward and all("loss.backward()" in lines[c.line - 1] for c in backward)
    placements = [c.line for c in result.changes if c.code == "ACC003"]
    assert len(lines) in placements  # the batch's `.to(device)`, on the joined line


def test_a_refusal_on_a_joined_line_points_at_the_statement() -> None:
    source = HEAD + """\
import torch.distributed as dist
for x, y in loader:
    loss = model(x.to(device)).sum(); loss.backward(); optimizer.step(); dist.all_to_all([], [])
"""
    result = convert(source)
    assert result.output == source  # refused: left whole
    found = [f for f in result.findings if f.code == "ACC126"]
    assert found, result.findings
    line = source.splitlines()[found[0].line - 1]
    assert line[found[0].column - 1:].startswith("dist.all_to_all")


def test_crlf_and_untouched_joined_lines_keep_their_bytes() -> None:
    source = (HEAD + """\
a = 1; b = 2
for x, y in loader:
    loss = model(x.to(device)).sum(); loss.backward()
    optimizer.step()
""").replace("\n", "\r\n")
    result = convert(source)
    assert result.error is None and result.changed
    out = result.output
    assert "\r\na = 1; b = 2\r\n" in out
    assert "\n" not in out.replace("\r\n", "")
    assert "    loss = model(x).sum()\r\n    accelerator.backward(loss)\r\n" in out
