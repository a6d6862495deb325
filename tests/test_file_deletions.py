"""Files removed by the script (pyGAT keeps the best epoch's checkpoint and removes the others) are
removed by the main process: every process removing the same file races, and all but one fail with
FileNotFoundError (seen on two processes)."""

from __future__ import annotations

import accelify.core.pipeline as pipeline

SCRIPT = """\
import glob
import os
import shutil

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
for epoch in range(3):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save(model.state_dict(), f"{epoch}.pkl")
    for file in glob.glob("*.pkl"):
        if int(file.split(".")[0]) < epoch:
            {remove}
"""


def test_a_removed_checkpoint_is_removed_by_the_main_process() -> None:
    for remove in ("os.remove(file)", "os.unlink(file)", "shutil.rmtree(file)"):
        result = pipeline.convert_source(SCRIPT.replace("{remove}", remove), "train.py")
        assert result.changed, result.findings
        lines = result.output.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip() == remove)
        assert lines[at - 1].strip() == "if accelerator.is_main_process:"
        assert pipeline.convert_source(result.output, "train.py").output == result.output
