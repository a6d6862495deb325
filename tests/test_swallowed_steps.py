"""ACC151 (a note): a training step inside `try:` whose `except` goes on without raising (RetinaNet's
`except Exception as e: print(e); continue`): an error one process meets alone makes it skip a step the others
take. The file converts; the note says so."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    try:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    {handler}
"""


@pytest.mark.parametrize("handler", [
    "except Exception as e:\n        print(e)\n        continue",
    "except:\n        pass",
    "except (ValueError, RuntimeError):\n        continue",
])
def test_a_step_whose_errors_are_swallowed_is_noted(handler: str) -> None:
    result = convert_source(SCRIPT.format(handler=handler), "train.py")
    assert result.changed
    [note] = [f for f in result.findings if f.code == "ACC151"]
    assert note.line == 15 and "skip a step the others take" in note.message


@pytest.mark.parametrize("handler", [
    "except Exception:\n        raise",  # re-raised: every process stops
    "except StopIteration:\n        break",  # the end of the data, met by every process alike
    "finally:\n        pass",
])
def test_a_step_whose_errors_stop_the_run_is_not(handler: str) -> None:
    result = convert_source(SCRIPT.format(handler=handler), "train.py")
    assert result.changed and "ACC151" not in [f.code for f in result.findings]
