"""The project's other modules, read (never imported, never edited) for the functions a script calls
from them (issue 28, a first slice): a DataLoader built and returned by `utils.get_data(args)` is
prepared as one built in the script; a function of the project that writes files is called by the
main process. What such a function does that accelify cannot vouch for (places tensors, downloads,
calls other functions of the project) keeps ACC135."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source

TRAIN = """\
import torch
{imports}

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{build}
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in train_loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{after}
"""

UTILS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_data(batch_size):
    dataset = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return loader


def get_loaders(batch_size):
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    return DataLoader(data, batch_size=batch_size), DataLoader(data, batch_size=batch_size)


def save_samples(tensor, path):
    torch.save(tensor.detach().cpu(), path)


def placed_data(batch_size):
    return DataLoader(TensorDataset(torch.randn(8, 4).cuda(), torch.randn(8, 2)), batch_size=batch_size)


def downloaded_data(batch_size):
    import torchvision
    return DataLoader(torchvision.datasets.MNIST("data", download=True), batch_size=batch_size)


def fetched_data(batch_size):
    import urllib.request
    urllib.request.urlretrieve("https://example.com/data.pt", "data.pt")
    return DataLoader(torch.load("data.pt"), batch_size=batch_size)


def made_dir_data(batch_size):
    import os
    os.makedirs("cache")
    return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=batch_size)
"""


def project(tmp_path: Path, imports: str, build: str, after: str = "", utils: str = UTILS):
    (tmp_path / "utils.py").write_text(utils, encoding="utf-8")
    train = tmp_path / "train.py"
    text = TRAIN.format(imports=imports, build=build, after=after)
    train.write_text(text, encoding="utf-8")
    return text, convert_source(text, str(train))


@pytest.mark.parametrize("imports, build", [
    ("from utils import get_data", "train_loader = get_data(2)"),
    ("import utils", "train_loader = utils.get_data(2)"),
    ("from utils import *", "train_loader = get_data(2)"),
    ("from utils import get_loaders", "train_loader, test_loader = get_loaders(2)"),
])
def test_a_loader_built_by_a_function_of_the_project_is_prepared(tmp_path, imports, build) -> None:
    text, result = project(tmp_path, imports, build)
    assert result.changed, result.findings
    prepared = result.output.split("= accelerator.prepare(")[1].split(")")[0].split(",")
    assert [p.strip() for p in prepared if p.strip()][:1] == ["train_loader"]
    assert not [f for f in result.findings if f.code == "ACC135"]
    assert (tmp_path / "utils.py").read_text(encoding="utf-8") == UTILS  # read, never edited
    assert convert_source(result.output, str(tmp_path / "train.py")).output == result.output


@pytest.mark.parametrize("build, runs", [
    ("train_loader = placed_data(2)", "runs `torch.randn(8, 4).cuda()`"),
    ("train_loader = downloaded_data(2)", "runs `torchvision.datasets.MNIST"),
    ("train_loader = fetched_data(2)", "runs `urllib.request.urlretrieve("),
    ("train_loader = made_dir_data(2)", 'runs `os.makedirs("cache")`'),
])
def test_a_loader_function_accelify_cannot_vouch_for_keeps_acc135(tmp_path, build, runs) -> None:
    text, result = project(tmp_path, "from utils import placed_data, downloaded_data, fetched_data, made_dir_data",
                           build)
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC135"]
    assert runs in result.findings[0].message  # what the function does that accelify cannot vouch for


def test_without_the_module_on_disk_the_loader_is_unknown(tmp_path) -> None:
    text = TRAIN.format(imports="from utils import get_data", build="train_loader = get_data(2)", after="")
    result = convert_source(text, str(tmp_path / "train.py"))  # no such file, no utils.py beside it
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]


def test_a_function_of_the_project_that_writes_is_called_by_the_main_process(tmp_path) -> None:
    text, result = project(tmp_path, "from utils import get_data, save_samples", "train_loader = get_data(2)",
                           after='save_samples(model.weight, "weight.pt")')
    assert result.changed, result.findings
    assert ('if accelerator.is_main_process:\n    save_samples(accelerator.unwrap_model(model).weight, "weight.pt")'
            in result.output)


PROGRESS = """
import sys
import time

last_time = time.time()


def format_time(seconds):
    return "%dms" % int(seconds * 1000)


def progress_bar(current, total, msg=None):
    global last_time
    step = time.time() - last_time
    last_time = time.time()
    parts = [" %d/%d" % (current + 1, total), " | Step: " + format_time(step)]
    if msg:
        parts.append(" | " + msg)
    sys.stdout.write("".join(parts))
    sys.stdout.write("\\r" if current < total - 1 else "\\n")
    sys.stdout.flush()


def progress_and_seed(current, total):
    print(current, total)
    import torch
    torch.manual_seed(current)
"""


def test_a_function_of_the_project_that_only_prints_is_called_by_the_main_process(tmp_path) -> None:
    """kuangliu's `progress_bar` (copied by many research repositories): `sys.stdout.write` on every process."""
    text, result = project(tmp_path, "from utils import get_data, progress_bar", "train_loader = get_data(2)",
                           after="progress_bar(0, 1, 'done')", utils=UTILS + PROGRESS)
    assert result.changed, result.findings
    assert "if accelerator.is_main_process:\n    progress_bar(0, 1, 'done')" in result.output


def test_a_function_that_prints_and_does_more_is_no_console_function(tmp_path) -> None:
    """(It also seeds torch's generator: run by the main process only, the others would draw differently.)"""
    text, result = project(tmp_path, "from utils import get_data, progress_and_seed", "train_loader = get_data(2)",
                           after="progress_and_seed(0, 1)", utils=UTILS + PROGRESS)
    assert result.changed and "progress_and_seed(0, 1)" in result.output
    assert "is_main_process:\n    progress_and_seed" not in result.output


MAIN = """\
import argparse

from solver import Solver
{more}


def main(args):
    {body}


if __name__ == "__main__":
    main(argparse.ArgumentParser().parse_args())
"""

SOLVER = """\
import torch


class Solver:
    def __init__(self, args):
        self.net = torch.nn.Linear(4, 2)
        self.optim = torch.optim.Adam(self.net.parameters())

    def train(self):
        loss = self.net(torch.randn(2, 4)).sum()
        loss.backward()
        self.optim.step()


class Model(torch.nn.Module):
    pass
"""


def test_a_script_whose_training_runs_in_a_module_beside_it_is_analysed_with_it(tmp_path) -> None:
    """betavae, unet: `net = Solver(args); net.train()`: the script and solver.py are one program; what
    blocks it is reported where it is, in solver.py (here: random data on the CPU, ACC121)."""
    from accelify.app.runner import convert_python
    from accelify.core.result import Options

    (tmp_path / "solver.py").write_text(SOLVER, encoding="utf-8")
    text = MAIN.format(more="", body="net = Solver(args)\n    net.train()")
    (tmp_path / "main.py").write_text(text, encoding="utf-8")
    for result in (convert_source(text, str(tmp_path / "main.py")), convert_python(text, str(tmp_path / "main.py"),
                                                                                   Options())):
        assert not result.changed and result.findings == []
        [companion] = result.companions
        assert companion.path == str(tmp_path / "solver.py") and not companion.changed
        assert [(f.code, f.line) for f in companion.findings] == [("ACC121", 7)]


def test_a_script_whose_training_module_cannot_join_it_says_so(tmp_path) -> None:
    """The module's `log` (which its training calls) and the script's own `log` would be one name in one
    program: ACC135, as before."""
    from accelify.app.runner import convert_python
    from accelify.core.result import Options

    solver = SOLVER.replace("        self.optim.step()\n", "        self.optim.step()\n        log(loss)\n")
    (tmp_path / "solver.py").write_text(solver + "\n\ndef log(x):\n    print(x)\n", encoding="utf-8")
    text = MAIN.format(more="", body="net = Solver(args)\n    net.train()") + "\n\ndef log(x):\n    pass\n"
    (tmp_path / "main.py").write_text(text, encoding="utf-8")
    for result in (convert_source(text, str(tmp_path / "main.py")), convert_python(text, str(tmp_path / "main.py"),
                                                                                   Options())):
        assert not result.changed and not result.companions
        [finding] = result.findings
        assert (finding.code, finding.line) == ("ACC135", 3)
        assert "it runs `Solver` of `solver`, a module beside it that trains" in finding.message
        assert "`accelify convert solver.py`" in finding.suggestion


@pytest.mark.parametrize("more, body", [
    ("from solver import Model", "print(Model())"),  # a class of that module that does not train
    ("", "print(Solver)"),  # imported, never run
])
def test_a_script_that_runs_nothing_that_trains_stays_silent(tmp_path, more, body) -> None:
    (tmp_path / "solver.py").write_text(SOLVER, encoding="utf-8")
    text = MAIN.format(more=more, body=body).replace("from solver import Solver\n", "from solver import Solver\n")
    (tmp_path / "main.py").write_text(text, encoding="utf-8")
    result = convert_source(text, str(tmp_path / "main.py"))
    assert not result.changed and result.findings == []


def test_a_module_used_as_module_dot_function_is_named_when_it_cannot_join(tmp_path) -> None:
    """`import solver` ... `solver.Solver(args).train()`: ACC135 names it when the two cannot be one program
    (here both define `log`, which the module's training calls)."""
    solver = SOLVER.replace("        self.optim.step()\n", "        self.optim.step()\n        log(loss)\n")
    (tmp_path / "solver.py").write_text(solver + "\n\ndef log(x):\n    print(x)\n", encoding="utf-8")
    text = MAIN.format(more="", body="net = solver.Solver(args)\n    net.train()").replace(
        "from solver import Solver", "import solver") + "\n\ndef log(x):\n    pass\n"
    (tmp_path / "main.py").write_text(text, encoding="utf-8")
    result = convert_source(text, str(tmp_path / "main.py"))
    assert not result.changed and not result.companions
    [finding] = result.findings
    assert (finding.code, finding.line) == ("ACC135", 3)
    assert "it runs `Solver` of `solver`" in finding.message


EVAL_MODULE = """\
import torch
from optimizers import get_optimizer


def main(args):
    classifier = torch.nn.Linear(4, 2)
    optimizer = get_optimizer(args.name, classifier)
    for x in range(2):
        loss = classifier(torch.randn(2, 4)).sum()
        loss.backward()
        optimizer.step()
"""

OPTIMIZERS = """\
import torch


def get_optimizer(name, model):
    if name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return optimizer
"""

ENTRY_WITH_EVAL = """\
import torch
from optimizers import get_optimizer
from linear_eval import main as linear_eval


def main(args):
    model = torch.nn.Linear(4, 2)
    optimizer = get_optimizer(args.name, model)
    for x in range(2):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        optimizer.step()
    linear_eval(args)


if __name__ == "__main__":
    main(None)
"""


def test_every_function_that_trains_without_a_known_optimizer_is_named(tmp_path) -> None:
    """SimSiam (PatrickHua): `main.py` and the `linear_eval.py` it runs each train through an optimizer
    accelify does not recognise; only the first backward of the merged program was named, in
    `linear_eval.py`, and `main.py` looked refused for nothing of its own."""
    (tmp_path / "linear_eval.py").write_text(EVAL_MODULE, encoding="utf-8")
    # a factory accelify cannot read: it moves the model itself
    (tmp_path / "optimizers.py").write_text(OPTIMIZERS.replace("    if name ==", "    model.cuda()\n    if name ==", 1),
                                            encoding="utf-8")
    (tmp_path / "main.py").write_text(ENTRY_WITH_EVAL, encoding="utf-8")
    result = convert_source(ENTRY_WITH_EVAL, str(tmp_path / "main.py"))
    assert not result.changed
    assert [(f.code, f.line) for f in result.findings] == [("ACC125", 8)]
    [companion] = result.companions
    assert [(f.code, f.line) for f in companion.findings] == [("ACC125", 7)]
    assert all("`get_optimizer` builds the optimizer in `optimizers`" in f.message and "runs `model.cuda()`" in f.message
               for f in (*result.findings, *companion.findings))


FACTORY_ENTRY = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
from optimizers import get_optimizer

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
model = torch.nn.Linear(4, 2).to(device)
optimizer = get_optimizer({args})
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("factory, args", [
    # SimSiam's: parameter groups from `named_parameters()`, one optimizer per choice, an else that raises
    (OPTIMIZERS, '"sgd", model'),
    (OPTIMIZERS, 'name="sgd", model=model'),
    # returned directly, wrapping an optimizer (LARC around SGD)
    ("import torch\nfrom larc import LARC\n\n\ndef build_optimizer(cfg, net):\n"
     "    return LARC(torch.optim.SGD(net.parameters(), lr=cfg), trust_coefficient=0.001)\n", "0.1, model"),
])
def test_an_optimizer_factory_of_the_project_trains_the_model_it_is_handed(tmp_path, factory, args) -> None:
    (tmp_path / "optimizers.py").write_text(factory, encoding="utf-8")
    text = FACTORY_ENTRY.format(args=args)
    if "build_optimizer" in factory:
        text = text.replace("get_optimizer", "build_optimizer")
    (tmp_path / "train.py").write_text(text, encoding="utf-8")
    result = convert_source(text, str(tmp_path / "train.py"))
    assert result.changed and not result.findings, result.findings
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output
    assert "accelerator.backward(loss)" in result.output


@pytest.mark.parametrize("factory, why", [
    # it moves the model itself
    ("import torch\n\n\ndef get_optimizer(name, model):\n    model.cuda()\n"
     "    return torch.optim.SGD(model.parameters(), lr=0.1)\n", "runs `model.cuda()`"),
    # it returns something else too
    ("import torch\n\n\ndef get_optimizer(name, model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "    return opt, torch.optim.lr_scheduler.StepLR(opt, 1)\n", "does not return an optimizer"),
    # it builds the optimizer over parameters it was not handed
    ("import torch\nHEAD = torch.nn.Linear(2, 2)\n\n\ndef get_optimizer(name, model):\n"
     "    return torch.optim.SGD(HEAD.parameters(), lr=0.1)\n", "does not return an optimizer"),
])
def test_an_optimizer_factory_accelify_cannot_read_is_named(tmp_path, factory, why) -> None:
    (tmp_path / "optimizers.py").write_text(factory, encoding="utf-8")
    (tmp_path / "train.py").write_text(FACTORY_ENTRY.format(args='"sgd", model'), encoding="utf-8")
    result = convert_source(FACTORY_ENTRY.format(args='"sgd", model'), str(tmp_path / "train.py"))
    assert not result.changed
    [finding] = result.findings
    assert (finding.code, finding.line) == ("ACC125", 8)
    assert "`get_optimizer` builds the optimizer in `optimizers`" in finding.message and why in finding.message


def test_an_optimizer_factory_handed_a_model_by_expression_is_not_followed(tmp_path) -> None:
    """`get_optimizer("sgd", nets["main"])`: what it trains is no name accelify can prepare."""
    (tmp_path / "optimizers.py").write_text(OPTIMIZERS, encoding="utf-8")
    text = FACTORY_ENTRY.format(args='"sgd", nets["main"]').replace(
        "model = torch.nn.Linear(4, 2).to(device)\n", "model = torch.nn.Linear(4, 2).to(device)\nnets = {'main': model}\n")
    (tmp_path / "train.py").write_text(text, encoding="utf-8")
    result = convert_source(text, str(tmp_path / "train.py"))
    assert not result.changed and [f.code for f in result.findings] == ["ACC125"]


def test_a_function_a_package_takes_from_its_module_is_read_there(tmp_path) -> None:
    """SimSiam: `from tools import AverageMeter, knn_monitor`, where `tools/__init__.py` takes them from its
    modules. The kNN monitor, handed the model and two loaders, places batches itself and computes over the
    whole memory bank: it was not read at all (a function the package only imports), so the loaders were
    prepared and handed to it, each process's bank a shard beside the whole set's labels. Read where it is
    defined, it is named (ACC135); it cannot join the script here, the import also naming a class of another
    of the package's modules."""
    project = Path(__file__).parent.parent / "fixtures" / "projects" / "package_reexport" / "before"
    (tmp_path / "tools").mkdir()
    for name in ("__init__.py", "knn_monitor.py", "meters.py"):
        (tmp_path / "tools" / name).write_text((project / "tools" / name).read_text(), encoding="utf-8")
    text = (project / "main.py").read_text().replace(
        "from tools import knn_monitor\nfrom tools.meters import AverageMeter\n", "from tools import AverageMeter, knn_monitor\n")
    (tmp_path / "main.py").write_text(text, encoding="utf-8")
    result = convert_source(text, str(tmp_path / "main.py"))
    assert not result.changed and not result.companions
    [finding] = result.findings
    assert finding.code == "ACC135" and "a function of `tools.knn_monitor` that runs `net(data.to(device))`" in finding.message
