"""A dataset downloaded by a helper of the file (`train_dst, val_dst = get_dataset(opts)`, DeepLabV3Plus)
is built under `with accelerator.main_process_first():` where the helper is called: every process
would download and extract into the same place at once (the per-process side-effect check saw the
`tar.extractall` on both ranks). `download=opts.download` is a download too."""

from __future__ import annotations

from pathlib import Path

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.data import DataLoader
from torchvision import datasets


def get_dataset(opts):
    train_dst = datasets.VOCSegmentation(root=opts.data_root, download=opts.download)
    val_dst = datasets.VOCSegmentation(root=opts.data_root, download=False)
    return train_dst, val_dst


def main(opts):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_dst, val_dst = get_dataset(opts)
    loader = DataLoader(train_dst, batch_size=8)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""


def test_a_downloading_helper_is_called_by_the_main_process_first():
    result = convert_source(SCRIPT, "train.py")
    assert "    with accelerator.main_process_first():\n        train_dst, val_dst = get_dataset(opts)\n" in result.output
    assert "download=opts.download" in result.output  # the helper itself is left as it is
    assert not [f for f in result.findings if f.code == "ACC127"]  # its download is guarded at the call
    again = convert_source(result.output, "train.py")
    assert again.output == result.output and not again.findings


def test_a_helper_called_where_the_accelerator_cannot_be_yet_is_reported():
    source = SCRIPT.replace("    device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n"
                            "    train_dst, val_dst = get_dataset(opts)\n",
                            "    train_dst, val_dst = get_dataset(opts)\n"
                            "    device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n")
    result = convert_source(source, "train.py")
    [finding] = [f for f in result.findings if f.code == "ACC127"]
    assert finding.message.startswith("`download=opts.download`: every process downloads")


def test_converting_again_never_puts_a_download_before_the_accelerator():
    """Issue 24, 11: converted, the Accelerator exists after the dataset; the second run must not wrap
    the download in `accelerator.main_process_first()` above it (a NameError). On Accelerate now, the file is
    left alone and nothing is said again."""
    source = SCRIPT.replace("    device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n"
                            "    train_dst, val_dst = get_dataset(opts)\n",
                            "    train_dst, val_dst = get_dataset(opts)\n"
                            "    device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n")
    once = convert_source(source, "train.py")
    again = convert_source(once.output, "train.py")
    assert once.changed and "ACC127" in {f.code for f in once.findings}
    assert again.output == once.output and not again.findings


# pytorch/examples' super-resolution shape: the golden fixture's script
FETCHING = (Path(__file__).resolve().parents[1] / "fixtures" / "download_helper" / "before.py").read_text(encoding="utf-8")


def test_a_url_fetched_two_helpers_down_is_fetched_by_the_main_process_first():
    """pytorch/examples' super-resolution: `get_training_set()` calls `download_bsd300()`, which fetches
    and extracts the archive; on two processes both did (the side-effect check saw it)."""
    result = convert_source(FETCHING, "train.py")
    assert "with accelerator.main_process_first():\n    train_set = get_training_set()\n" in result.output
    assert not [f for f in result.findings if f.code == "ACC127"]  # the archive file is the helper's
    assert convert_source(result.output, "train.py").output == result.output
