"""The project's names, resolved with LibCST's `FullRepoManager` and `FullyQualifiedNameProvider` (issue 28),
the script's folder as the repository's root; and the project's modules read once for every script of a folder
a run converts, read again when one of them changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from libcst.metadata import FullRepoManager, FullyQualifiedNameProvider, MetadataWrapper

import libcst as cst
import libcst.matchers as m
from accelify.analyses.foreign import Foreign
from accelify.core.pipeline import convert_source
from accelify.core.project import ProjectSources

MAIN = """\
import torch

{imports}

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

ROWS = """\
import torch
from torch.utils.data import Dataset


class Rows(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 4){placed}
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
"""

LOADERS = """\
from torch.utils.data import DataLoader

{imports}


def get_loader(batch_size):
    return DataLoader(Rows(32), batch_size=batch_size, shuffle=True)
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def nested_project(root: Path, placed: str = "") -> Path:
    """`lib/data/loaders.py` builds `Rows`, which it takes two levels up: `from ..datasets import Rows`."""
    write(root, {
        "lib/__init__.py": "",
        "lib/data/__init__.py": "",
        "lib/datasets.py": ROWS.format(placed=placed),
        "lib/data/loaders.py": LOADERS.format(imports="from ..datasets import Rows"),
        "main.py": MAIN.format(imports="from lib.data.loaders import get_loader"),
    })
    return root / "main.py"


def test_module_names_are_libcsts_fully_qualified_names_from_the_scripts_folder(tmp_path: Path) -> None:
    main = nested_project(tmp_path)
    foreign = Foreign(ProjectSources(str(main)))
    module, meta = foreign._module("lib.data.loaders")
    [rows] = [c.func for c in m.findall(module, m.Call(func=m.Name("Rows")))]
    assert meta.fully_qualified(rows) == {"lib.datasets.Rows"}
    # ... the names LibCST's own provider gives, run the documented way
    manager = FullRepoManager(str(tmp_path), [str(tmp_path / "lib/data/loaders.py")], {FullyQualifiedNameProvider})
    wrapper = MetadataWrapper(cst.parse_module((tmp_path / "lib/data/loaders.py").read_text()),
                              cache=manager.get_cache_for_path(str(tmp_path / "lib/data/loaders.py")))
    names = wrapper.resolve(FullyQualifiedNameProvider)
    assert {q.name for node, qs in names.items() if isinstance(node, cst.Call) for q in qs} == {
        "lib.datasets.Rows", "torch.utils.data.DataLoader"}
    assert foreign.definition("lib.data.loaders.get_loader") == ("lib.data.loaders", "get_loader")
    assert foreign.definition("lib.datasets.Rows") == ("lib.datasets", "Rows")
    assert foreign.definition("lib.data.loaders.Rows") == ("lib.datasets", "Rows")  # the module's import, followed
    assert foreign.definition("lib.data.loaders.DataLoader") is None  # torch's, not the project's
    assert foreign.definition("lib.datasets.Rows.__getitem__") is None  # a method is no module-level definition


@pytest.mark.parametrize("placed, converts", [("", True), (".cuda()", False)])
def test_a_dataset_class_taken_two_levels_up_is_read(tmp_path: Path, placed: str, converts: bool) -> None:
    """`from ..datasets import Rows` in `lib/data/loaders.py`: the home-made resolver read only one level of a
    relative import, so the class was taken for no project code at all, never read: a `.cuda()` in it was
    converted without a word."""
    main = nested_project(tmp_path, placed)
    result = convert_source(main.read_text(), str(main))
    assert result.error is None
    if converts:
        assert result.changed and not result.findings, result.findings
        assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output
    else:
        assert not result.changed and [f.code for f in result.findings] == ["ACC135"]
        assert "a function of `lib.data.loaders` which runs `Rows(32)`, whose code runs `torch.randn(n, 4).cuda()`" \
            in result.findings[0].message, result.findings[0].message


def test_a_package_that_re_exports_a_re_export_is_followed_to_the_definition(tmp_path: Path) -> None:
    """`from data import get_loader`: `data/__init__.py` takes it `from .loaders import get_loader`, and
    `data/loaders.py` builds `Rows` of `data/rows.py`."""
    write(tmp_path, {
        "data/__init__.py": "from .loaders import get_loader\n",
        "data/rows.py": ROWS.format(placed=".cuda()"),
        "data/loaders.py": LOADERS.format(imports="from data.rows import Rows"),
        "main.py": MAIN.format(imports="from data import get_loader"),
    })
    result = convert_source((tmp_path / "main.py").read_text(), str(tmp_path / "main.py"))
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]
    assert "whose code runs `torch.randn(n, 4).cuda()`" in result.findings[0].message


def test_one_reading_of_the_modules_serves_every_script_of_a_folder(tmp_path: Path) -> None:
    nested_project(tmp_path)
    (tmp_path / "other.py").write_text((tmp_path / "main.py").read_text())
    first = ProjectSources.of(str(tmp_path / "main.py"))
    assert convert_source((tmp_path / "main.py").read_text(), str(tmp_path / "main.py")).changed
    parsed = Foreign.of(first)._modules["lib.data.loaders"]
    second = ProjectSources.of(str(tmp_path / "other.py"))
    assert second is first and Foreign.of(second)._modules["lib.data.loaders"] is parsed
    assert convert_source((tmp_path / "other.py").read_text(), str(tmp_path / "other.py")).changed
    assert Foreign.of(second)._modules["lib.data.loaders"] is parsed  # not parsed again


def test_a_module_changed_between_two_scripts_is_read_again(tmp_path: Path) -> None:
    """A module written by an earlier conversion of the run (or by anyone) is not answered from the memo."""
    main = nested_project(tmp_path)
    (tmp_path / "other.py").write_text(main.read_text())
    assert convert_source(main.read_text(), str(main)).changed
    (tmp_path / "lib/datasets.py").write_text(ROWS.format(placed=".cuda()  # now placed"))
    result = convert_source((tmp_path / "other.py").read_text(), str(tmp_path / "other.py"))
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]


def test_a_modules_prints_are_converted_once_for_every_script_of_the_folder(tmp_path: Path, monkeypatch) -> None:
    """Two scripts importing `data.py`, whose dataset prints: the module's conversion (ACC008) is made once, with
    the parse the reading of its loader function made, and is the same file for both."""
    import accelify.core.module_output as module_output

    write(tmp_path, {
        "data.py": LOADERS.format(imports="from rows import Rows") + "\n\ndef describe(loader):\n"
                   "    print(len(loader.dataset))\n",
        "rows.py": ROWS.format(placed=""),
        "main.py": MAIN.format(imports="from data import get_loader"),
        "other.py": MAIN.format(imports="from data import get_loader"),
    })
    calls = []
    real = module_output.module_prints

    def counted(source, target="accelerate", wrapper=None):
        calls.append(wrapper is not None)
        return real(source, target, wrapper)

    monkeypatch.setattr(module_output, "module_prints", counted)
    results = [convert_source((tmp_path / n).read_text(), str(tmp_path / n)) for n in ("main.py", "other.py")]
    assert [[c.path for c in r.companions] for r in results] == [[str(tmp_path / "data.py")]] * 2
    assert results[0].companions[0].output == results[1].companions[0].output
    assert "    PartialState().print(len(loader.dataset))" in results[0].companions[0].output
    assert calls == [True]  # once, on the parse the loader function's reading made


LEARNER = """\
import torch
from torch import nn


class Learner(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=0.01)

    def forward(self, x, y):
        loss = ((self.net(x) - y) ** 2).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return loss.item()


def main():
    pass


if __name__ == "__main__":
    main()
"""

EPISODES = """\
import numpy as np
import torch

from learner import Learner

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
learner = Learner().to(device)
for step in range(4):
    x = torch.from_numpy(np.random.randn(8, 4).astype("float32")).to(device)
    print(learner(x, x.sum(1, keepdim=True)))
"""


def test_a_module_another_file_uses_is_not_converted_alone(tmp_path: Path) -> None:
    """MAML's `meta.py`: its class trains itself (its own optimizer and backward), its `__main__` does nothing,
    and `omniglot_train.py` builds it. Converted alone (as `accelify convert DIR` did), the class made its own
    Accelerator under a script left unconverted (which then moves it with `.to(device)`: on N processes every
    rank's wrapped model onto one device). Left with ACC141 naming that script; with no user, converted."""
    write(tmp_path, {"learner.py": LEARNER, "episodes.py": EPISODES})
    left = convert_source(LEARNER, str(tmp_path / "learner.py"))
    assert not left.changed and [f.code for f in left.findings] == ["ACC141"]
    assert "`Learner` would change with this file's conversion, and `episodes.py` uses it" in left.findings[0].message
    (tmp_path / "episodes.py").unlink()
    alone = convert_source(LEARNER, str(tmp_path / "learner.py"))
    assert alone.changed and "self.accelerator.backward(loss)" in alone.output
