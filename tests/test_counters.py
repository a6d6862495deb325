"""ACC021: in a script that placed nothing on a device, a tensor it makes by hand and adds to in a
loop over a prepared DataLoader is made on the accelerator's device (converted, what it adds up
comes from the prepared model and loader: on a GPU a CPU counter += a CUDA tensor raises).
fixtures/counters_on_device is the golden and runs end to end with the device check on."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8)
model = Net()
{place}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    {batch}
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
{counters}
with torch.no_grad():
    for x, y in loader:
        {batch}
        pred = model(x).argmax(1)
{adds}
print(correct)
"""


def convert(counters: str, adds: str, place: str = "", batch: str = "pass") -> tuple[str, list[str]]:
    adds = "\n".join("        " + line for line in adds.splitlines())
    source = SCRIPT.format(counters=counters, adds=adds, place=place, batch=batch)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output, [c.code for c in result.changes]


def test_a_counter_of_what_the_model_computes_is_made_on_the_device():
    out, codes = convert("correct = torch.zeros(1)\ncounts = torch.tensor([0, 0]).long()",
                         "correct += (pred == y).sum()\ncounts[0] += (pred == y).sum()")
    assert "correct = torch.zeros(1, device=accelerator.device)" in out
    assert "counts = torch.tensor([0, 0], device=accelerator.device).long()" in out
    assert codes.count("ACC021") == 2


def test_what_is_added_from_the_host_or_as_numbers_keeps_its_counter_on_the_host():
    out, codes = convert("correct = torch.zeros(3)\nseen = torch.zeros(1)",
                         "correct += torch.bincount(pred.cpu(), minlength=3)\nseen += y.size(0)\nseen += 1")
    assert "correct = torch.zeros(3)\n" in out and "seen = torch.zeros(1)\n" in out
    assert "ACC021" not in codes


def test_one_host_add_anywhere_keeps_the_counter_on_the_host():
    out, codes = convert("correct = torch.zeros(1)", "correct += (pred == y).sum()\ncorrect += torch.ones(1)")
    assert "correct = torch.zeros(1)\n" in out and "ACC021" not in codes


def test_a_counter_bound_twice_is_left_alone():
    out, codes = convert("correct = torch.zeros(1)\nif flag:\n    correct = torch.ones(1)", "correct += (pred == y).sum()")
    assert "ACC021" not in codes


def test_a_script_that_placed_its_model_is_left_as_it_is():
    out, codes = convert("correct = torch.zeros(1, device=device)", "correct += (pred == y).sum()",
                         place="device = torch.device('cuda')\nmodel.to(device)", batch="x, y = x.to(device), y.to(device)")
    assert "ACC021" not in codes
    assert "correct = torch.zeros(1, device=accelerator.device)" in out  # the device codemod's rewrite


def test_idempotent():
    once, _ = convert("correct = torch.zeros(1)", "correct += (pred == y).sum()")
    again = convert_source(once, "train.py")
    assert again.output == once and again.findings == []
