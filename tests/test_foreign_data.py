"""Training data from a function of another module (ACC135): whether it is a DataLoader to shard is
unknown, so the file is left unchanged with that reason, not a claim about the data it cannot see."""

from __future__ import annotations

import pytest

import accelify.core.pipeline as pipeline

BODY = """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = {source}
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    idx = torch.randint(0, 4, (2,))
"""


def run(imports: str, source: str):
    text = "import torch\n" + imports + BODY.format(source=source)
    return text, pipeline.convert_source(text, "train.py")


@pytest.mark.parametrize("imports, module", [
    ("from utils import get_data\n", "`utils`"),
    ("from .data import get_data\n", "`.data`"),
    ("from utils import *\n", "a module imported with `*` (`utils`)"),
])
def test_a_loader_from_another_module_is_a_true_refusal(imports, module) -> None:
    text, result = run(imports, "get_data(batch_size=2)")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC135"]
    assert f"`get_data(batch_size=2)`, a function of {module}" in result.findings[0].message


def test_through_a_name_and_a_progress_bar() -> None:
    text = ("import torch\nfrom tqdm import tqdm\nfrom utils import get_data\n"
            + BODY.format(source="tqdm(data)").replace("loader = tqdm(data)", "data = get_data()\nloader = tqdm(data)"))
    result = pipeline.convert_source(text, "train.py")
    assert [f.code for f in result.findings] == ["ACC135"]


def test_a_loader_built_in_this_file_or_by_a_known_package_is_not_foreign() -> None:
    _, here = run("from torch.utils.data import DataLoader, TensorDataset\n",
                  "DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)")
    assert here.changed and "ACC135" not in {f.code for f in here.findings}
    _, listed = run("import itertools\n", "itertools.islice([(torch.randn(2, 4), torch.randn(2, 2))] * 3, 2)")
    assert "ACC135" not in {f.code for f in listed.findings}


def test_a_placement_helper_of_another_module_is_named_not_called_no_placement() -> None:
    text = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom utils import cuda\n"
            "model = cuda(torch.nn.Linear(4, 2), True)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
            "for x, y in loader:\n    loss = ((model(cuda(x, True)) - cuda(y, True)) ** 2).mean()\n"
            "    loss.backward()\n    opt.step()\n")
    result = pipeline.convert_source(text, "train.py")
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]
    assert "through `cuda`, a function of `utils`" in result.findings[0].message
    assert "places nothing" not in result.findings[0].message


def test_a_model_chosen_per_option_with_an_else_that_raises_is_bound_on_every_path() -> None:
    """makemore: `if args.type == ...: model = ... elif ...: ... else: raise ValueError(...)`."""
    text = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nkind = 'a'\n"
            "if kind == 'a':\n    model = torch.nn.Linear(4, 2)\nelif kind == 'b':\n    model = torch.nn.Linear(4, 2, bias=False)\n"
            "else:\n    raise ValueError(kind)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
            "for x, y in loader:\n    loss = ((model(x) - y) ** 2).mean()\n    loss.backward()\n    opt.step()\n")
    result = pipeline.convert_source(text, "train.py")
    assert result.changed and "ACC104" not in {f.code for f in result.findings}
    # `else: pass`: `model.parameters()` right after still reads it whatever ran (the original's own
    # NameError there), so `prepare` after it reads nothing new: converted (tests/test_model_methods.py)
    passed = pipeline.convert_source(text.replace("    raise ValueError(kind)\n", "    pass\n"), "train.py")
    assert passed.changed
    # nothing reads it before `prepare` would: it may not exist there
    unread = text.replace("    raise ValueError(kind)\n", "    pass\n").replace(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", "").replace(
        "    model = torch.nn.Linear(4, 2)\n", "    model = torch.nn.Linear(4, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    unbound = pipeline.convert_source(unread, "train.py")
    assert not unbound.changed and "ACC104" in [f.code for f in unbound.findings]


def test_data_unpacked_beside_other_names_is_still_the_loader() -> None:
    """`total, bar = 0.0, tqdm(loader)` (SimCLR's train): the loop draws from the prepared loader."""
    text = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom tqdm import tqdm\n"
            "model = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
            "def train(net, data_loader, optimizer):\n    total, bar = 0.0, tqdm(data_loader)\n"
            "    for x, y in bar:\n        loss = ((net(x) - y) ** 2).mean()\n        loss.backward()\n"
            "        optimizer.step()\n        total += loss.item()\n    return total\ntrain(model, loader, opt)\n")
    result = pipeline.convert_source(text, "train.py")
    assert result.changed and "ACC124" not in {f.code for f in result.findings}


def test_objects_handed_to_a_trainer_of_another_module_are_a_true_refusal() -> None:
    """BYOL's main.py builds the networks and the optimizer and hands them to `BYOLTrainer` from
    trainer.py, which holds the loop: converting main.py alone would be half a conversion."""
    text = ("import torch\nfrom trainer import BYOLTrainer\nfrom utils import make_scheduler\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "net = torch.nn.Linear(4, 2).to(device)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
            "sched = make_scheduler(opt)\ntrainer = BYOLTrainer(net, optimizer=opt, device=device)\ntrainer.train()\n")
    result = pipeline.convert_source(text, "main.py")
    assert not result.changed and [(f.code, f.line) for f in result.findings] == [("ACC135", 8)]
    assert "handed to `BYOLTrainer`, of `trainer`" in result.findings[0].message
    # a scheduler factory that only takes the optimizer is not where training happens
    alone = pipeline.convert_source(text.replace("trainer = BYOLTrainer(net, optimizer=opt, device=device)\n"
                                                 "trainer.train()\n", ""), "main.py")
    assert "handed to `make_scheduler`" not in " ".join(f.message for f in alone.findings)


def test_an_optimizer_chosen_by_every_allowed_choice_is_bound_on_every_path() -> None:
    """DINO: `if args.optimizer == "adamw": ... elif ... == "sgd": ... elif ... == "lars":` with
    `choices=['adamw', 'sgd', 'lars']`: argparse allows nothing else (was a false ACC104)."""
    text = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "parser = argparse.ArgumentParser()\n"
            "parser.add_argument('--optimizer', default='adamw', choices=['adamw', 'sgd'])\n"
            "args = parser.parse_args()\nmodel = torch.nn.Linear(4, 2)\n"
            "if args.optimizer == 'adamw':\n    opt = torch.optim.AdamW(model.parameters())\n"
            "elif args.optimizer == 'sgd':\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
            "for x, y in loader:\n    loss = ((model(x) - y) ** 2).mean()\n    loss.backward()\n    opt.step()\n")
    result = pipeline.convert_source(text, "train.py")
    assert result.changed and "ACC104" not in {f.code for f in result.findings}
    wider = pipeline.convert_source(text.replace("choices=['adamw', 'sgd']", "choices=['adamw', 'sgd', 'lars']"),
                                    "train.py")
    assert not wider.changed and [f.code for f in wider.findings] == ["ACC104"]


def test_processes_managed_by_a_module_of_the_project_are_a_true_refusal() -> None:
    """rosinality's vq-vae-2: `import distributed as dist` (its own module), `dist.launch(main, ...)`,
    `dist.all_gather(...)`: converted beside it, two processes hung."""
    text = ("import torch\nimport distributed as dist\nfrom functools import reduce\n"
            "from torch.utils.data import DataLoader, TensorDataset\n\n\ndef main():\n"
            "    model = torch.nn.Linear(4, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
            "    for x, y in loader:\n        loss = ((model(x) - y) ** 2).mean()\n        loss.backward()\n"
            "        opt.step()\n        total = dist.all_gather(loss.item())\n\n\n"
            "if __name__ == '__main__':\n    dist.launch(main, 2, 1, 0, 'auto')\n")
    result = pipeline.convert_source(text, "train.py")
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]
    assert "manages its processes through `distributed`" in result.findings[0].message
    plain = text.replace("        total = dist.all_gather(loss.item())\n", "        total = reduce(max, [1, 2])\n").replace(
        "    dist.launch(main, 2, 1, 0, 'auto')\n", "    main()\n").replace("import distributed as dist\n", "")
    assert pipeline.convert_source(plain, "train.py").changed  # functools.reduce is no collective


def test_an_optimizer_through_a_star_imported_torch_says_so() -> None:
    """DeepLab: `torch` comes only from `from modeling.deeplab import *`, so `torch.optim.SGD` is no
    PyTorch optimizer accelify can recognise: the finding says why (was "builds no optimizer")."""
    text = ("from modeling.deeplab import *\n\n\ndef run(model, loader):\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x, y in loader:\n"
            "        loss = model(x, y)\n        loss.backward()\n        optimizer.step()\n")
    result = pipeline.convert_source(text, "train.py")
    assert not result.changed and [(f.code, f.line) for f in result.findings] == [("ACC125", 5)]
    message = result.findings[0].message
    assert "`torch.optim.SGD` reads `torch`" in message and "`from modeling.deeplab import *`" in message
