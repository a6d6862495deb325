"""What a loader function of another module runs of the project is read too (issue 28: "a loader built by
`utils.get_data(args)` is 'not a DataLoader'"): the dataset class it builds, the project classes that class
derives from, the functions they call. Code that places, downloads or writes anywhere in that reach keeps the
file unchanged (ACC135); code that only computes makes the loader one to prepare."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source

MAIN = """\
import torch

from data import get_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = get_loader(8)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

DATA = """\
import os

import torch
from torch.utils.data import DataLoader, Dataset


def read_rows(n):
    return torch.randn(n, 4)


class Base(Dataset):
    def __len__(self):
        return len(self.x)


class Rows(Base):
    def __init__(self, n):
        self.x = read_rows(n)
        self.y = self.x.sum(1, keepdim=True)
        {init}

    def __getitem__(self, i):
        {item}
        return self.x[i], self.y[i]


def get_loader(batch_size):
    return DataLoader(Rows(32), batch_size=batch_size, shuffle=True)
"""


def convert(tmp_path: Path, init: str = "pass", item: str = "pass", base_extra: str = ""):
    (tmp_path / "data.py").write_text(DATA.replace("{init}", init).replace("{item}", item).replace(
        "        return len(self.x)\n", "        return len(self.x)\n" + base_extra))
    main = tmp_path / "main.py"
    main.write_text(MAIN)
    return convert_source(MAIN, str(main))


def test_a_dataset_class_that_only_computes_makes_the_loader_one_to_prepare(tmp_path: Path) -> None:
    result = convert(tmp_path, init='print(f"{len(self.x)} rows")')
    assert result.changed and not result.findings, result.findings
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output


@pytest.mark.parametrize("init, item, base_extra, said", [
    ("pass", "self.x = self.x.cuda()", "", "`Rows(32)`, whose code runs `self.x.cuda()`"),
    ("torch.save(self.x, 'cache.pt')", "pass", "", "`Rows(32)`, which writes a file on every process "
                                                   "(`torch.save(self.x, 'cache.pt')`)"),
    ("os.makedirs('cache')", "pass", "", "whose code runs `os.makedirs('cache')`"),
    ("pass", "pass", "\n    def fetch(self):\n        torch.hub.download_url_to_file('u', 'f')\n",
     "`Rows(32)`, whose base class `Base` runs `torch.hub.download_url_to_file('u', 'f')`"),
    ("self.helper = lambda: 0\n        def inner():\n            return 0", "pass", "",
     "which defines a function or class inside its code"),
])
def test_project_code_the_loader_function_runs_that_is_unsafe_keeps_the_file_and_is_named(
        tmp_path: Path, init: str, item: str, base_extra: str, said: str) -> None:
    result = convert(tmp_path, init=init, item=item, base_extra=base_extra)
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC135"]
    message = result.findings[0].message
    assert "`get_loader(8)`, a function of `data` which runs `Rows(32)`" in message and said in message, message


def test_a_function_that_calls_itself_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATA.replace("{init}", "pass").replace("{item}", "pass").replace(
        "def read_rows(n):\n    return torch.randn(n, 4)",
        "def read_rows(n):\n    return torch.randn(n, 4) if n < 64 else read_rows(n // 2)"))
    main = tmp_path / "main.py"
    main.write_text(MAIN)
    result = convert_source(MAIN, str(main))
    assert result.changed and not result.findings


@pytest.mark.parametrize("item, converts", [("pass", True), ("self.x = self.x.cuda()", False)])
def test_a_dataset_class_a_package_re_exports_is_read_where_it_is_defined(
        tmp_path: Path, item: str, converts: bool) -> None:
    """`from data import Rows` in the loader's module, `data/__init__.py` taking it `from .rows import Rows`: the
    class is read in `data/rows.py` (the reading had named the module and the level in the wrong order: an internal
    error)."""
    package = tmp_path / "data"
    package.mkdir()
    (package / "__init__.py").write_text("from .rows import Rows\n")
    rows = DATA.replace("{init}", "pass").replace("{item}", item)
    (package / "rows.py").write_text(rows.split("\n\ndef get_loader")[0] + "\n")
    (tmp_path / "loaders.py").write_text("from torch.utils.data import DataLoader\n\nfrom data import Rows\n\n\n"
                                         "def get_loader(batch_size):\n"
                                         "    return DataLoader(Rows(32), batch_size=batch_size, shuffle=True)\n")
    source = MAIN.replace("from data import get_loader", "from loaders import get_loader")
    main = tmp_path / "main.py"
    main.write_text(source)
    result = convert_source(source, str(main))
    assert result.error is None
    if converts:
        assert result.changed and not result.findings, result.findings
    else:
        assert not result.changed and [f.code for f in result.findings] == ["ACC135"]
        assert "runs `Rows(32)`, whose code runs `self.x.cuda()`" in result.findings[0].message
