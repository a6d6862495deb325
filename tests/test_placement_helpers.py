"""A helper of the script that places what it is handed (`def cuda(tensor, use_cuda): return tensor.cuda()
if use_cuda else tensor`, BetaVAE's utils) takes the accelerator and places on `accelerator.device`:
left as `.cuda()`, the batches would go to CUDA whatever the launch (each process's own GPU, which
Accelerate makes the current one), not to `accelerator.device`: apart from the model with `cpu=True`, on MPS
or a TPU (a CPU run cannot show it; it was converted with ACC109, a report)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def cuda(tensor, uses_cuda):
    return tensor.cuda() if uses_cuda else tensor


def main():
    use_cuda = torch.cuda.is_available()
    model = cuda(torch.nn.Linear(4, 2), use_cuda)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4, shuffle=True)
    for epoch in range(2):
        for xb, yb in loader:
            xb, yb = cuda(xb, use_cuda), cuda(yb, use_cuda)
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_placement_helper_places_on_the_accelerators_device() -> None:
    result = convert_source(SCRIPT, "train.py")
    assert result.changed and not [f for f in result.findings if f.code == "ACC109"], result.findings
    assert "def cuda(accelerator, tensor, uses_cuda):\n    return tensor.to(accelerator.device) if uses_cuda else tensor" \
        in result.output
    assert "xb, yb = cuda(accelerator, xb, use_cuda), cuda(accelerator, yb, use_cuda)" in result.output
    assert ".cuda()" not in result.output
    assert convert_source(result.output, "train.py").output == result.output


def _passed_around(placement: str) -> str:
    """SCRIPT with its helper `def cuda(tensor): return <placement>` handed to `map`, not called."""
    return SCRIPT.replace("def cuda(tensor, uses_cuda):\n    return tensor.cuda() if uses_cuda else tensor",
                          f"def cuda(tensor):\n    return {placement}").replace(
        "    model = cuda(torch.nn.Linear(4, 2), use_cuda)", "    model = torch.nn.Linear(4, 2)").replace(
        "xb, yb = cuda(xb, use_cuda), cuda(yb, use_cuda)", "xb, yb = map(cuda, (xb, yb))")


def test_a_placement_helper_that_cannot_be_handed_the_accelerator_is_refused() -> None:
    """`map(cuda, batch)`: the helper is passed around, not called, so it cannot take a new parameter; its
    `.cuda()` left as it is places on CUDA, not on `accelerator.device`: the file is left unchanged (ACC109), and
    the finding says so. It said "the first GPU", which is false: Accelerate makes each process's own GPU the
    current one, where a plain `.cuda()` goes."""
    source = _passed_around("tensor.cuda()")
    result = convert_source(source, "train.py")
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC109"]
    message = result.findings[0].message
    assert "first GPU" not in message and "places on CUDA (each process's own GPU" in message
    assert "not on `accelerator.device`" in message


def test_a_placement_on_one_gpu_index_says_that_gpu() -> None:
    source = _passed_around("tensor.cuda(0)")
    result = convert_source(source, "train.py")
    assert result.output == source
    assert "every process would put these tensors on `0`" in result.findings[0].message
