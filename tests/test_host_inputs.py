"""ACC024: in a script that placed nothing on a device, a tensor it computed on the host and hands
to the prepared model goes to `accelerator.device` at the call (on a GPU the call would raise:
found by the device check on MorvanZhou's CNN tutorial). Batches of a prepared loader and what is
computed from them are placed already; a script that placed its model itself is left as it is."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

{made}
loader = DataLoader(dataset, batch_size=8)
model = Net()
{place}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    {batch}
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
{use}
"""


def convert(made: str, use: str, place: str = "", batch: str = "pass"):
    source = SCRIPT.format(made=made, use=use, place=place, batch=batch)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output, [c.code for c in result.changes]


def test_a_tensor_computed_on_the_host_goes_to_the_device_at_the_call():
    out, codes = convert("test_x = torch.unsqueeze(test_data.data, dim=1).type(torch.FloatTensor)[:2000] / 255.",
                         "out = model(test_x)\nfirst = model(test_x[:10])")
    assert "out = model(test_x.to(accelerator.device))" in out
    assert "first = model(test_x[:10].to(accelerator.device))" in out
    assert codes.count("ACC024") == 2


def test_batches_and_unknown_values_are_left_alone():
    out, codes = convert("test_x = load_images(path)", "out = model(test_x)\nfor x, y in loader:\n    z = x * 2\n    model(z)")
    assert "out = model(test_x)" in out and "    model(z)" in out
    assert "ACC024" not in codes


def test_a_script_that_placed_its_model_is_left_as_it_is():
    out, codes = convert("test_x = torch.unsqueeze(test_data.data, dim=1).float()", "out = model(test_x)",
                         place="device = torch.device('cuda')\nmodel.to(device)", batch="x, y = x.to(device), y.to(device)")
    assert "ACC024" not in codes


def test_idempotent():
    once, _ = convert("test_x = torch.unsqueeze(test_data.data, dim=1).float()", "out = model(test_x)")
    again = convert_source(once, "train.py")
    assert again.output == once and not again.findings


def test_converting_a_converted_script_that_placed_its_tensors_changes_nothing():
    """Found on yunjey's language model: converted, the script no longer places anything itself (its
    `.to(device)` became the Accelerator's), which must not make its sampled input look like a host
    tensor on the second run."""
    out, _ = convert("", "inp = torch.multinomial(prob, num_samples=1).unsqueeze(1).to(device)\nout = model(inp)",
                     place="device = torch.device('cuda')\nmodel.to(device)", batch="x, y = x.to(device), y.to(device)")
    assert "inp = torch.multinomial(prob, num_samples=1).unsqueeze(1).to(accelerator.device)" in out
    again = convert_source(out, "train.py")
    assert again.output == out


def test_a_batch_taken_before_prepare_goes_to_the_device_and_one_taken_after_does_not():
    """WZMIAOMIAO's LeNet validates on `next(iter(val_loader))` taken before `prepare` (a host batch);
    the CIFAR-10 tutorial's `next(dataiter)` after training comes from the prepared loader."""
    early, codes = convert("val_loader = DataLoader(valset, batch_size=500)\nval_image, val_label = next(iter(val_loader))",
                           "out = model(val_image)\nacc = (out.argmax(1) == val_label).float().mean()")
    # the whole batch goes, labels too: the metric compares them with the model's outputs
    assert ("val_image, val_label = next(iter(val_loader))\n"
            "val_image, val_label = val_image.to(accelerator.device), val_label.to(accelerator.device)\n") in early
    assert "out = model(val_image)\n" in early and "ACC024" in codes
    assert convert_source(early, "train.py").output == early
    late, codes = convert("val_loader = DataLoader(valset, batch_size=500)",
                          "val_image, val_label = next(iter(val_loader))\nout = model(val_image)")
    assert "out = model(val_image)" in late and "ACC024" not in codes
