"""ACC011: outputs are gathered together with every label the metrics read, or not at all."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(make_dataset(), batch_size=8)
val_loader = DataLoader(make_dataset(), batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x, y)
    loss.backward()
    optimizer.step()
total = 0
with torch.no_grad():
    for batch in val_loader:
        x, y = batch
        out = model(x)
        mse = criterion(out, y)
        total += mse.item()
"""


def test_labels_read_through_an_intermediate_value_are_gathered_with_the_outputs() -> None:
    result = convert(SCRIPT)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n        mse = criterion(out, y)\n" in result.output
    assert_stable(result.output)


def test_labels_accelify_cannot_follow_mean_no_gather_and_a_finding() -> None:
    # `y` comes from a call on the batch: gathering `out` alone would pair every process's
    # outputs with this process's labels (a size mismatch with two processes).
    source = SCRIPT.replace("        x, y = batch\n", "        x, y = unpack(batch[0]), unpack(batch[1])\n")
    result = convert(source)
    assert result.output == source  # metrics per shard would be wrong: the whole file stays as it is
    findings = [f for f in result.findings if f.code == "ACC114"]
    assert findings and "derived from the batch" in findings[0].message


def test_parts_of_an_output_object_or_a_batch_dict_are_not_gathered_whole() -> None:
    # `outputs.logits`: gathering `outputs` would fail on a dataclass or namespace output and send
    # every input of a batch dict; accelify refuses rather than gathering whole objects.
    source = SCRIPT.replace("        out = model(x)\n", "        out = model(x)\n        logits = out.logits\n")
    source = source.replace("mse = criterion(out, y)", "mse = criterion(logits, y)")
    assert "out.logits" in source
    result = convert(source)
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC114")
    assert "`out.logits`" in finding.message


def test_an_output_taken_through_a_method_of_the_model_call_is_gathered() -> None:
    source = SCRIPT.replace("        out = model(x)\n", "        out = model(x).squeeze()\n")
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" in convert(source).output


def test_metrics_collected_with_extend_alone_are_gathered() -> None:
    source = SCRIPT.replace("        mse = criterion(out, y)\n        total += mse.item()\n",
                            "        predictions.extend(out.argmax(dim=1).tolist())\n")
    assert "total +=" not in source and ".append(" not in source
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" not in source
    output = convert(source).output
    assert "        out = accelerator.gather_for_metrics(out)\n" in output
