"""Shapes of nanoGPT and the scripts written after it: an optimizer from the model's own
`configure_optimizers`, a device setting the launch overrides, a device chosen as Accelerate chooses
it (`"cpu"`, then `"cuda"` / `"mps"` when available), a model bound in an `if`/`elif` without `else`."""

from __future__ import annotations

from accelify.core.pipeline import convert_source
from conftest import convert

MODEL = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def configure_optimizers(self, lr, device_type):
        use_fused = device_type == "cuda"
        optimizer = torch.optim.AdamW(self.parameters(), lr=lr, fused=use_fused)
        return optimizer


'''

TRAIN = '''device = "cuda" if torch.cuda.is_available() else "cpu"
device_type = "cuda" if "cuda" in device else "cpu"
loader = DataLoader(dataset, batch_size=8)
model = Net()
model.to(device)
optimizer = model.configure_optimizers(1e-3, device_type)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
'''


def test_the_optimizer_of_the_models_own_method_is_prepared_with_the_model():
    out = convert(MODEL + TRAIN).output
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in out \
        or "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in out
    # the method compares a device type with "cuda": it is handed one, not a torch.device
    assert "optimizer = model.configure_optimizers(1e-3, accelerator.device.type)" in out
    method = out.split("def configure_optimizers")[1].split("return optimizer")[0]
    assert "accelerator" not in method  # the one in the method is not another optimizer to prepare


def test_an_optimizer_from_a_method_called_on_something_else_than_a_model_of_its_class_is_not_taken():
    source = MODEL + TRAIN.replace("optimizer = model.configure_optimizers(1e-3, device_type)",
                                   "wrapped = Wrapper(model)\n"
                                   "optimizer = wrapped.configure_optimizers(1e-3, device_type)")
    result = convert(source)
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC107"]


def test_a_method_called_twice_is_not_taken():
    source = MODEL + TRAIN + "optimizer2 = model.configure_optimizers(1e-4, device_type)\n"
    result = convert(source)
    assert result.output == source and [f.code for f in result.findings] == ["ACC107"]


def test_a_device_setting_no_longer_chooses_the_device():
    """nanoGPT: `device = 'cuda'` is a setting (`--device=cpu` overrides it) and `device_type` follows it:
    the Accelerator chooses now (no `cpu=` flag reading the setting it replaced), and ACC144 says so."""
    source = MODEL + TRAIN.replace('device = "cuda" if torch.cuda.is_available() else "cpu"', "device = 'cuda'")
    result = convert(source)
    assert "accelerator = Accelerator()" in result.output
    assert "accelerator.device.type)" in result.output and "in device" not in result.output
    assert [f.code for f in result.findings] == ["ACC144"]
    assert "`device` setting" in result.findings[0].message and "--cpu" in result.findings[0].suggestion


def test_a_device_chosen_as_accelerate_chooses_it_goes_with_its_checks():
    chain = ('device = "cpu"\n'
             'if torch.cuda.is_available():\n'
             '    device = "cuda"\n'
             'elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():\n'
             '    device = "mps"\n'
             'print(f"using device: {device}")\n')
    source = MODEL + TRAIN.replace('device = "cuda" if torch.cuda.is_available() else "cpu"\n', chain)
    result = convert(source)
    out = result.output
    assert "is_available()" not in out and "pass" not in out
    assert 'print(f"using device: {accelerator.device}")' in out
    assert "accelerator = Accelerator()" in out and not result.findings


def test_a_chain_with_an_else_of_its_own_is_not_that_choice():
    chain = ('device = "cpu"\n'
             'if torch.cuda.is_available():\n'
             '    device = "cuda"\n'
             'else:\n'
             '    device = "cpu"\n')
    source = MODEL + TRAIN.replace('device = "cuda" if torch.cuda.is_available() else "cpu"\n', chain)
    assert convert(source).output == source


def test_a_model_bound_in_an_if_elif_without_else_that_the_script_reads_right_after():
    """nanoGPT's `init_from`: `scratch`, `resume` or a GPT-2 name, no `else`; `model.to(device)` after it
    reads `model` whatever branch ran, so `prepare` after it reads nothing the original did not."""
    bound = ('if init_from == "scratch":\n'
             '    model = Net()\n'
             'elif init_from == "resume":\n'
             '    model = Net()\n'
             '    model.load_state_dict(torch.load("ckpt.pt"))\n')
    source = MODEL + TRAIN.replace("model = Net()\n", bound)
    assert "accelerator.prepare(" in convert(source).output
    unread = ('import torch\nfrom torch.utils.data import DataLoader\n\n'
              'loader = DataLoader(dataset, batch_size=8)\n'
              'if init_from == "scratch":\n'
              '    model = Net()\n'
              '    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n'
              'for x, y in loader:\n'
              '    loss = criterion(model(x), y)\n'
              '    loss.backward()\n'
              '    optimizer.step()\n')
    result = convert(unread)  # nothing reads `model` before `prepare` would: it may not exist there
    assert result.output == unread and [f.code for f in result.findings] == ["ACC104"]


def test_random_batches_seeded_per_process_are_said_to_be_each_process_own():
    from conftest import FIXTURES

    source = (FIXTURES / "ddp_nanogpt_runnable" / "before.py").read_text(encoding="utf-8")
    note = next(f for f in convert(source).findings if f.code == "ACC124")
    assert "seed of each process's own (`torch.manual_seed(1337 + seed_offset)`)" in note.message
    assert "every process trains on all of it" not in note.message


def test_a_loop_over_the_loader_before_the_last_training_object_is_refused():
    """An evaluation before training, the optimizer built after it: `prepare` goes after the optimizer, so
    that loop would run on the unprepared loader in every process (and its batches on the CPU beside a
    model on the accelerator). It was converted so, with a `gather_for_metrics` that counted N times."""
    source = ('import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n\n'
              'device = "cuda" if torch.cuda.is_available() else "cpu"\n'
              'model = nn.Linear(4, 2).to(device)\n'
              'loader = DataLoader(data, batch_size=8)\n'
              'hits = 0\n'
              'for x, y in loader:\n'
              '    hits += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()\n'
              'optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n'
              'for x, y in loader:\n'
              '    loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))\n'
              '    loss.backward()\n'
              '    optimizer.step()\n')
    result = convert(source)
    assert result.output == source
    assert [(f.code, f.line) for f in result.findings] == [("ACC104", 9)]
    moved = source.replace("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", "")
    moved = moved.replace("hits = 0\n", "hits = 0\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    assert "accelerator.prepare(" in convert(moved).output  # built before the first loop: converted


def test_an_optimizer_from_the_unwrapped_alias_of_the_model_trains_the_model():
    """build-nanoGPT: `raw_model = model.module if ddp else model`, then `raw_model.configure_optimizers(...)`:
    the optimizer trains `model`, which is prepared (not the alias, which stays the plain model)."""
    source = MODEL + TRAIN.replace("optimizer = model.configure_optimizers(1e-3, device_type)",
                                   "raw_model = model.module if ddp else model\n"
                                   "optimizer = raw_model.configure_optimizers(1e-3, device_type)")
    out = convert(source).output
    assert "accelerator.prepare(" in out and "raw_model, optimizer" not in out
    assert ", model, optimizer" in out or "model, optimizer," in out


def test_the_model_unwrapped_by_the_accelerator_is_the_model():
    """build-nanoGPT converted: `raw_model = accelerator.unwrap_model(model)` before `prepare`, then
    `raw_model.configure_optimizers(...)`: converted again, that was an optimizer built in a method of another
    scope (ACC107), the converted script refused with a false reason."""
    body = "".join("    " + line if line.strip() else line for line in TRAIN.replace(
        "optimizer = model.configure_optimizers(1e-3, device_type)",
        "raw_model = accelerator.unwrap_model(model)\noptimizer = raw_model.configure_optimizers(1e-3, device_type)",
    ).splitlines(keepends=True) if not line.startswith(("import", "from")))
    source = ("from accelerate import Accelerator\n" + MODEL + "\n\ndef main():\n    accelerator = Accelerator()\n"
              + body)
    result = convert_source(source, "train.py")
    assert "ACC107" not in {f.code for f in result.findings}, result.findings
