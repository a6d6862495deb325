"""A DataLoader built under a condition and never read (retinanet's `dataloader_val`, built only with
`--csv_val`) is no object to prepare: the file converts (it was refused, ACC104 "bound only under a
condition"). One that is read stays an object to prepare, and stays refused when conditional."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import sys

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
loader = torch.utils.data.DataLoader(data, batch_size=2)
if len(sys.argv) > 1:
    val_loader = torch.utils.data.DataLoader(data, batch_size=2)
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{after}
"""


def test_an_unread_conditional_loader_is_not_prepared() -> None:
    result = convert_source(SCRIPT.format(after=""), "train.py")
    assert result.changed, result.findings
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output
    assert "    val_loader = torch.utils.data.DataLoader(data, batch_size=2)\n" in result.output


def test_a_conditional_loader_that_is_read_is_still_refused() -> None:
    result = convert_source(SCRIPT.format(after="for x, y in val_loader:\n    print(model(x.to(device)).sum())"),
                            "train.py")
    assert not result.changed
    assert any(f.code == "ACC104" and "`val_loader` is bound only under a condition" in f.message
               for f in result.findings)
