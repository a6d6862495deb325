"""ACC025: a part of the batch the original never moved (`labels.append(y)` beside
`x = x.to(device)`) is collected with `.cpu()`: converted, the prepared loader puts the whole batch
on the device, and the code after the loop expected host tensors (bentrevett's MLP notebook hands
them to `plt.scatter`: the device check found it)."""

from __future__ import annotations

from accelify.codemods.host_batch_parts import HostBatchParts
from accelify.core.pipeline import convert_source

BEFORE, _ = HostBatchParts.example()


def test_a_part_the_original_kept_on_the_host_is_collected_there():
    out = convert_source(BEFORE, "train.py").output
    assert "    labels.append(y.cpu())\n" in out
    again = convert_source(out, "train.py")
    assert again.output == out and not again.findings


def test_parts_the_original_moved_and_batches_it_never_placed_are_left_alone():
    moved = BEFORE.replace("    x = x.to(device)\n    features", "    x, y = x.to(device), y.to(device)\n    features")
    assert "labels.append(y)\n" in convert_source(moved, "train.py").output
    nothing_moved = BEFORE.replace("    x = x.to(device)\n    features.append(model(x).cpu())",
                                   "    features.append(model(x.float()).cpu())")
    assert "labels.append(y)\n" in convert_source(nothing_moved, "train.py").output
