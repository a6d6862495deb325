"""A device at the GPU index an option picks (codesearch_deepcs: `torch.device(f"cuda:{args.gpu_id}"
if torch.cuda.is_available() else "cpu")`) becomes `accelerator.device`, the GPU the launcher gives
each process, with ACC136 saying the option no longer picks one; refused (ACC102) when the option
also picks a GPU elsewhere."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--gpu", type=int, default=0)
args = parser.parse_args()
{bind}
device = {device}
{other}
model = nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
for x, y in data:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def convert(device: str, other: str = "", bind: str = ""):
    return convert_source(SCRIPT.format(device=device, other=other, bind=bind), "train.py")


@pytest.mark.parametrize("device, bind", [
    ('torch.device(f"cuda:{args.gpu}" if torch.cuda.is_available() else "cpu")', ""),
    ('f"cuda:{args.gpu}" if torch.cuda.is_available() else "cpu"', ""),
    ('torch.device("cuda:{}".format(args.gpu) if torch.cuda.is_available() else "cpu")', ""),
    ('torch.device("cuda:%d" % args.gpu if torch.cuda.is_available() else "cpu")', ""),
    ('torch.device("cuda", args.gpu)', ""),
    ('torch.device(f"cuda:{gpu}" if torch.cuda.is_available() else "cpu")', "gpu = args.gpu"),
])
def test_the_gpu_an_option_picks_becomes_the_accelerators_device(device, bind) -> None:
    result = convert(device, "print(f'training on gpu {args.gpu}')", bind)
    assert result.changed, result.findings
    assert "device" not in result.output.replace("accelerator.device", "").replace("parser", "")
    assert "model = nn.Linear(4, 2)\n" in result.output
    [note] = result.findings
    assert note.code == "ACC136" and "`args.gpu` no longer picks one" in note.message
    assert "CUDA_VISIBLE_DEVICES" in note.suggestion
    assert convert_source(result.output, "train.py").output == result.output


@pytest.mark.parametrize("other", ["torch.cuda.set_device(args.gpu)", "ids = [args.gpu]"])
def test_an_option_that_also_picks_a_gpu_elsewhere_is_refused(other) -> None:
    result = convert('torch.device(f"cuda:{args.gpu}" if torch.cuda.is_available() else "cpu")', other)
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC102" and f"(`{other}`)" in finding.message


def test_a_bound_index_that_also_picks_a_gpu_elsewhere_is_refused() -> None:
    result = convert('torch.device(f"cuda:{gpu}" if torch.cuda.is_available() else "cpu")',
                     "torch.cuda.set_device(gpu)", "gpu = args.gpu")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC102"] and "(`torch.cuda.set_device(gpu)`)" in result.findings[0].message


def test_an_index_that_is_not_named_as_a_gpu_is_still_refused() -> None:
    """`f"cuda:{args.n}"`: not said to be a GPU index; accelify does not guess (ACC102, as before)."""
    text = SCRIPT.format(device='torch.device(f"cuda:{args.n}" if torch.cuda.is_available() else "cpu")',
                         other="", bind="").replace('"--gpu"', '"--n"')
    result = convert_source(text, "train.py")
    assert not result.changed and [f.code for f in result.findings] == ["ACC102"]


def test_a_file_left_unchanged_does_not_say_the_device_is_now_the_accelerators() -> None:
    """codesearch_deepcs: refused for its checkpoints, it also printed ACC136's "it is now
    `accelerator.device`" about a file left as it was."""
    body = SCRIPT.format(device='torch.device(f"cuda:{args.gpu}" if torch.cuda.is_available() else "cpu")',
                         other="", bind="")
    head, loop = body.split("args = parser.parse_args()\n")
    text = (head + "\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n\n\ndef main():\n"
            "    args = parser.parse_args()\n" + "".join("    " + line + "\n" for line in loop.strip("\n").splitlines())
            + "    save(model, 'm.pt')\n\n\nmain()\n")
    result = convert_source(text, "train.py")
    assert not result.changed and result.findings, result.output
    assert "ACC136" not in {f.code for f in result.findings}
