"""A file of the run's settings written before training (`json.dump(vars(args), f)`, wgan's
`generator_config.json`) is the same on every process: it is written by the main process. So is a
log whose block only writes to it (mixup-cifar10's CSV of the epochs' metrics): rank 0's values, as
`accelerator.print` shows them, once, rather than every process into the same file. A file read back,
named per process, or whose block does more than write stays as it is, with ACC127."""

from __future__ import annotations

import pytest

import accelify.core.pipeline as pipeline

SCRIPT = """\
import argparse
import json
import os
import random
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="run")
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
{before}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
{write}
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def convert(write: str, before: str = ""):
    return pipeline.convert_source(SCRIPT.format(write=write, before=before), "train.py")


def guarded(result, line: str) -> bool:
    lines = result.output.splitlines()
    at = next(i for i, text in enumerate(lines) if text.strip() == line)
    return lines[at - 1].strip() == "if accelerator.is_main_process:"


@pytest.mark.parametrize("write, before", [
    ('with open(os.path.join(args.out, "args.json"), "w") as f:\n    json.dump(vars(args), f, indent=2)', ""),
    ('with open("config.json", "w") as f:\n    f.write(json.dumps(config) + "\\n")',
     'hidden = int(args.lr * 10)\nconfig = {"hidden": hidden, "lr": args.lr, "name": f"run-{hidden}"}'),
    ('with open("args.txt", "w") as f:\n    for k, v in sorted(vars(args).items()):\n        print(k, v, file=f)', ""),
    # an option the file sets from other settings
    ('with open("args.json", "w") as f:\n    json.dump(vars(args), f)', 'args.out = os.path.join("runs", args.out)'),
])
def test_a_settings_file_is_written_by_the_main_process(write, before) -> None:
    result = convert(write, before)
    assert result.changed and not [f for f in result.findings if f.code == "ACC127"], result.findings
    assert guarded(result, write.splitlines()[0])
    assert pipeline.convert_source(result.output, "train.py").output == result.output  # idempotent


@pytest.mark.parametrize("write, before", [
    # each process draws its own seed into the options it writes
    ('with open("args.json", "w") as f:\n    json.dump(vars(args), f)', "args.seed = random.randint(0, 100)"),
    ('with open("seed.txt", "w") as f:\n    f.write(str(seed))', "seed = random.randint(0, 100)"),
    ('with open("started.txt", "w") as f:\n    f.write(str(time.time()))', ""),
    # what the model holds is no setting
    ('with open("weights.txt", "w") as f:\n    f.write(str(model.weight.tolist()))', ""),
    ('with open("log.txt", "w") as f:\n    f.write(str(args.lr))\n    f.write(str(loss))', "loss = 0.0\nloss += 1"),
    # a list filled with what each process computes (fixtures/main_process_files: the loss history)
    ('with open("history.txt", "w") as f:\n    f.write(str(history))', "history = []\nhistory.append(random.random())"),
    ('with open("history.txt", "w") as f:\n    f.write(str(history))', "history = {}\nhistory['a'] = random.random()"),
    # an option changed in place
    ('with open("args.json", "w") as f:\n    json.dump(vars(args), f)', "args.lr *= 2"),
    ('with open("args.json", "w") as f:\n    json.dump(vars(args), f)', 'setattr(args, "lr", random.random())'),
])
def test_a_log_that_may_differ_between_processes_is_written_by_rank_0(write, before) -> None:
    result = convert(write, before)
    assert result.changed and not [f for f in result.findings if f.code == "ACC127"], result.findings
    assert guarded(result, write.splitlines()[0])
    assert pipeline.convert_source(result.output, "train.py").output == result.output  # idempotent


def test_a_csv_log_appended_every_epoch_is_written_by_rank_0() -> None:
    """mixup-cifar10: the header once, then a row per epoch (`csv.writer(f).writerow(...)`)."""
    text = SCRIPT.format(write="", before="").replace("for x, y in loader:\n", (
        'if not os.path.exists("log.csv"):\n    with open("log.csv", "w") as logfile:\n'
        '        csv.writer(logfile).writerow(["epoch", "loss"])\n'
        "for epoch in range(2):\n  for x, y in loader:\n")).replace("    x, y = x.to", "    x, y = x.to")
    text = text.replace("\n    x, y = x.to(device), y.to(device)\n    loss = ((model(x) - y) ** 2).mean()\n    opt.zero_grad()"
                        "\n    loss.backward()\n    opt.step()\n",
                        "\n    x, y = x.to(device), y.to(device)\n    loss = ((model(x) - y) ** 2).mean()\n    opt.zero_grad()"
                        "\n    loss.backward()\n    opt.step()\n  with open(\"log.csv\", \"a\") as logfile:\n"
                        "    logwriter = csv.writer(logfile, delimiter=\",\")\n    logwriter.writerow([epoch, loss.item()])\n")
    text = "import csv\n" + text
    result = pipeline.convert_source(text, "train.py")
    assert result.changed and not [f for f in result.findings if f.code == "ACC127"], result.findings
    assert guarded(result, 'with open("log.csv", "w") as logfile:')
    assert guarded(result, 'with open("log.csv", "a") as logfile:')


@pytest.mark.parametrize("write, before", [
    # read back by the script: the other processes would not find it
    ('with open("cache.txt", "w") as f:\n    f.write(str(args.lr))\nwith open("cache.txt") as f:\n    lr = float(f.read())', ""),
    # named per process: each process its own file
    ('with open(f"log_{rank}.txt", "w") as f:\n    f.write(str(args.lr))', "rank = random.randint(0, 9)"),
    # the block does more than write
    ('with open("log.txt", "w") as f:\n    f.write(str(args.lr))\n    args.lr = 0.5', ""),
])
def test_a_file_read_back_or_per_process_is_left_with_acc127(write, before) -> None:
    result = convert(write, before)
    assert result.changed
    assert not guarded(result, write.splitlines()[0])
    assert any(f.code == "ACC127" and "mode 'w'" in f.message for f in result.findings), result.findings


def test_a_settings_file_written_in_the_training_loop_is_left_with_acc127() -> None:
    result = convert("", "")
    text = SCRIPT.format(write="", before="").replace(
        "    opt.step()\n", '    opt.step()\n    with open("args.json", "w") as f:\n        json.dump(vars(args), f)\n')
    result = pipeline.convert_source(text, "train.py")
    assert any(f.code == "ACC127" for f in result.findings)
    assert "is_main_process" not in result.output.split("opt.step()")[1]


def test_a_write_into_a_file_opened_per_process_stays_on_every_process() -> None:
    """build-nanoGPT's synthetic shards (the validation set's patch, an atomic write as real code does it):
    `with open(f"{path}.part-{os.getpid()}", "wb") as f: np.save(f, array)` then `os.replace(...)`. Every process
    writes its own temporary file; guarding `np.save(f, ...)` alone left the other processes to rename an empty
    file over the shard (rank 1 read "No data left in file")."""
    write = ('tmp = os.path.join(args.out, f".part-{os.getpid()}")\nwith open(tmp, "wb") as f:\n'
             '    np.save(f, np.zeros(4))\nos.replace(tmp, os.path.join(args.out, "shard.npy"))')
    result = pipeline.convert_source("import numpy as np\n" + SCRIPT.format(write=write, before=""), "train.py")
    assert result.changed
    assert not guarded(result, "np.save(f, np.zeros(4))")
    # one file every process opens: guarded alone, the write would leave the file the others truncate empty
    shared = write.replace('f".part-{os.getpid()}"', '".part"')
    result = pipeline.convert_source("import numpy as np\n" + SCRIPT.format(write=shared, before=""), "train.py")
    assert not guarded(result, "np.save(f, np.zeros(4))")
