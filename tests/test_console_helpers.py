"""ACC023: a call of a console-only helper of the file (a home-made progress bar writing to
sys.stdout) goes under `if accelerator.is_local_main_process:`; helpers that compute something
are left alone. fixtures/progress_bar runs end to end (rank 1 prints nothing)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import sys

import torch
from torch.utils.data import DataLoader


{helper}


loader = DataLoader(dataset, batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch_idx, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    {call}
"""


def convert(helper: str, call: str = "report(batch_idx, len(loader))"):
    source = SCRIPT.format(helper=helper, call=call)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output, [c.code for c in result.changes]


BAR = "def report(current, total):\n    sys.stdout.write('\\r%d/%d' % (current + 1, total))\n    sys.stdout.flush()"


def test_a_progress_bar_draws_on_the_local_main_process():
    out, codes = convert(BAR)
    assert "    if accelerator.is_local_main_process:\n        report(batch_idx, len(loader))\n" in out
    assert "ACC023" in codes
    assert "    sys.stdout.write('\\r%d/%d' % (current + 1, total))" in out  # the helper itself is kept


def test_helpers_that_compute_are_left_alone():
    returns = "def report(current, total):\n    sys.stdout.write('.')\n    return current / total"
    uses_torch = "def report(current, total):\n    sys.stdout.write(str(torch.cuda.memory_allocated()))"
    uses_model = "def report(current, total):\n    sys.stdout.write(str(model.training))"
    for helper in (returns, uses_torch, uses_model):
        out, codes = convert(helper)
        assert "ACC023" not in codes and "    report(batch_idx, len(loader))\n" in out


def test_a_call_already_on_the_main_process_is_left_alone():
    out, codes = convert(BAR, call="if batch_idx == 0:\n        pass\n    if accelerator.is_main_process:\n        report(0, 1)")
    assert "ACC023" not in codes


def test_idempotent():
    once, _ = convert(BAR)
    again = convert_source(once, "train.py")
    assert again.output == once and not again.findings


METER = '''class ProgressMeter(object):
    def __init__(self, num_batches, prefix=""):
        self.num_batches = num_batches
        self.prefix = prefix

    def display(self, batch):
        entries = [self.prefix + str(batch), str(self.num_batches)]
        print("\\t".join(entries))


progress = ProgressMeter(len(loader), prefix="Epoch: ")'''


def test_a_method_that_only_prints_draws_on_the_local_main_process():
    """The ImageNet example's `progress.display(i)` (MoCo, SimSiam, tczhangzhi): `ProgressMeter.display` prints
    the meters and changes nothing; every process printed them (the side-effect check of the DDP set saw it)."""
    output, codes = convert(METER, "progress.display(batch_idx)")
    assert "    if accelerator.is_local_main_process:\n        progress.display(batch_idx)\n" in output and "ACC023" in codes
    assert convert_source(output, "again.py").output == output  # converted again: nothing changes
    changing = METER.replace('        print("\\t".join(entries))', '        print("\\t".join(entries))\n        self.prefix = ""')
    output, _ = convert(changing, "progress.display(batch_idx)")
    assert "is_local_main_process:\n        progress.display" not in output  # it changes the object: every process
