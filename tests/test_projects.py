"""A script converted together with the module beside it that trains (issue 28): one program, the edits
put back in each file, a diff per file, all files written or none.

fixtures/projects/<name>/: ``before/`` and ``after/`` (every file, golden), ``entry.txt`` (the script
converted), and for a project left unchanged no ``after/`` but ``findings.txt`` (``file:line CODE``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source
from accelify.core.result import Options
from accelify.core.unit import unit_of
from conftest import FIXTURES

PROJECTS = FIXTURES / "projects"
CONVERTED = sorted(p.name for p in PROJECTS.iterdir() if (p / "after").is_dir())
LEFT = sorted(p.name for p in PROJECTS.iterdir() if not (p / "after").is_dir())


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def copy_of(tmp_path: Path, name: str, which: str = "before") -> Path:
    target = tmp_path / name
    shutil.copytree(PROJECTS / name / which, target)
    return target


def entry_of(name: str) -> str:
    return (PROJECTS / name / "entry.txt").read_text().strip()


def accelify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelify", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("name", CONVERTED)
def test_project_converts_to_golden_files(name: str, tmp_path: Path) -> None:
    folder = copy_of(tmp_path, name)
    entry = folder / entry_of(name)
    result = convert_source(entry.read_bytes().decode(), str(entry))
    assert result.changed and result.error is None and not result.findings
    outputs = {str(entry.relative_to(folder)): result.output}
    for companion in result.companions:
        assert companion.changed and not companion.findings
        outputs[str(Path(companion.path).relative_to(folder))] = companion.output
    golden = files_of(PROJECTS / name / "after")
    before = files_of(PROJECTS / name / "before")
    assert golden.keys() == before.keys()
    for path, text in golden.items():
        # each changed file as golden, byte for byte (newlines included); the others untouched
        assert outputs.get(path, before[path].decode()).encode() == text, path
    # the files the golden changes are the ones converted: the script and the modules it trains in (a module only
    # read, as an optimizer factory is, stays as it was)
    assert {p for p in golden if golden[p] != before[p]} == set(outputs)


@pytest.mark.parametrize("name", CONVERTED)
def test_project_conversion_is_idempotent(name: str, tmp_path: Path) -> None:
    folder = copy_of(tmp_path, name, "after")
    entry = folder / entry_of(name)
    result = convert_source(entry.read_text(), str(entry))
    assert not result.changed and not any(c.changed for c in result.companions)
    assert not result.findings and not result.companions


@pytest.mark.parametrize("name", LEFT)
def test_project_left_unchanged_says_why_in_the_right_file(name: str, tmp_path: Path) -> None:
    folder = copy_of(tmp_path, name)
    entry = folder / entry_of(name)
    result = convert_source(entry.read_text(), str(entry))
    assert not result.changed and not any(c.changed for c in result.companions)
    found = [f"{Path(f.path).relative_to(folder)}:{f.line} {f.code}"
             for item in (result, *result.companions) for f in item.findings]
    assert found == (PROJECTS / name / "findings.txt").read_text().split("\n")[:-1]


def test_the_cli_prints_one_diff_per_file_and_writes_both(tmp_path: Path) -> None:
    folder = copy_of(tmp_path, "functions")
    shown = accelify("convert", "main.py", cwd=folder)
    assert shown.returncode == 0, shown.stderr
    assert "--- a/main.py\n+++ b/main.py" in shown.stdout and "--- a/train.py\n+++ b/train.py" in shown.stdout
    assert "would convert train.py (with main.py)" in shown.stderr
    assert "2 files would be converted" in shown.stderr
    assert files_of(folder) == files_of(PROJECTS / "functions" / "before")  # the diff writes nothing
    checked = accelify("convert", "--check", "main.py", cwd=folder)
    assert checked.returncode == 1
    written = accelify("convert", "--in-place", "main.py", cwd=folder)
    assert written.returncode == 0, written.stderr
    assert files_of(folder) == files_of(PROJECTS / "functions" / "after")


def test_a_directory_converts_the_module_once_with_its_script(tmp_path: Path) -> None:
    folder = copy_of(tmp_path, "functions")
    done = accelify("convert", "--format", "json", ".", cwd=folder)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    changed = sorted(f["path"] for f in report["files"] if f["status"] == "changed")
    assert changed == ["./main.py", "./train.py"]  # each once, with its diff
    assert sorted(f["path"] for f in report["files"]) == ["./main.py", "./model.py", "./train.py"]
    assert all(f["diff"].startswith(f"--- a/{f['path'][2:]}") for f in report["files"] if f["status"] == "changed")
    written = accelify("convert", "-i", ".", cwd=folder)
    assert written.returncode == 0, written.stderr
    assert files_of(folder) == files_of(PROJECTS / "functions" / "after")


@pytest.mark.parametrize("name, said", [("trainer_method_loader", {"./trainer.py": ["ACC123", "ACC125"]}),
                                         ("shared_train", {"./main.py": ["ACC141"], "./train.py": ["ACC125"]}),
                                         ("dataset_prints", {})])
def test_a_directory_names_each_file_once(tmp_path: Path, name: str, said: dict) -> None:
    """A module left unchanged with its script (the script's finding placed in it) and on its own (its own
    finding) is one entry of the report, with both findings; it was two entries, a finding repeated in one. A
    module whose prints the script's conversion changes was named twice too: unchanged (its own outcome), then
    changed (with the script)."""
    folder = copy_of(tmp_path, name)
    done = accelify("convert", "--format", "json", ".", cwd=folder)
    assert done.returncode == 0, done.stderr
    paths = [f["path"] for f in json.loads(done.stdout)["files"]]
    assert len(paths) == len(set(paths)) == len(list(folder.glob("*.py")))
    found = {f["path"]: sorted(x["code"] for x in f["findings"]) for f in json.loads(done.stdout)["files"]
             if f["findings"]}
    assert found == said


def test_output_to_one_file_is_refused_when_two_change(tmp_path: Path) -> None:
    folder = copy_of(tmp_path, "functions")
    done = accelify("convert", "main.py", "-o", "out.py", cwd=folder)
    assert done.returncode == 123
    assert "changes train.py too" in done.stderr
    assert not (folder / "out.py").exists()


def test_in_place_leaves_every_file_when_the_module_is_read_only(tmp_path: Path) -> None:
    """(As root too: accelify does not write a file without a write bit, and puts back what it wrote.)"""
    folder = copy_of(tmp_path, "functions")
    (folder / "main.py").chmod(0o644)
    (folder / "train.py").chmod(0o444)
    done = accelify("convert", "--in-place", "main.py", cwd=folder)
    assert done.returncode == 123, done.stderr
    assert "train.py" in done.stderr
    assert files_of(folder) == files_of(PROJECTS / "functions" / "before")


def test_two_scripts_that_would_change_one_module_differently_leave_it(tmp_path: Path) -> None:
    folder = copy_of(tmp_path, "functions")
    second = (folder / "main.py").read_text().replace("batch_size=8", "batch_size=4").replace(
        "        evaluate(model, device, test_loader)\n", "")
    (folder / "other.py").write_text(second.replace("from train import evaluate, train", "from train import train"))
    done = accelify("convert", ".", cwd=folder)
    # main.py converts train() and evaluate(); other.py only train(): the module would differ
    assert "ACC141" in done.stderr, done.stderr
    assert "0 files would be converted" in done.stderr
    written = accelify("convert", "-i", ".", cwd=folder)
    assert (folder / "train.py").read_bytes() == (PROJECTS / "functions" / "before" / "train.py").read_bytes()
    assert written.returncode == 0


def test_the_module_keeps_its_crlf_newlines() -> None:
    text = (PROJECTS / "package_alias" / "after" / "engine" / "loops.py").read_bytes()
    assert text.count(b"\r\n") == text.count(b"\n") > 10


def test_a_name_bound_by_both_files_keeps_them_apart(tmp_path: Path) -> None:
    """Both files define `log`: one program would mean one of them: no unit, the script alone (ACC135)."""
    folder = copy_of(tmp_path, "functions")
    main = folder / "main.py"
    main.write_text(main.read_text() + "\n\ndef log(x):\n    print(x)\n")
    train = folder / "train.py"
    train.write_text(train.read_text().replace("def unused_helper", "def log(x):\n    return x\n\n\ndef unused_helper")
                     .replace("print(f\"accuracy", "log(f\"accuracy"))
    assert unit_of(main.read_text(), str(main)) is None
    result = convert_source(main.read_text(), str(main))
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]


@pytest.mark.parametrize("name", CONVERTED)
def test_verify_runs_the_converted_script_with_its_converted_modules(name: str, tmp_path: Path) -> None:
    """One process: the same losses as the original; two: each rank its share, no hang, no tensor on the
    wrong device, no file written by both (verify's checks); the project's own files are not written."""
    pytest.importorskip("torch")
    from e2e import script_env, start_forked

    from accelify.app.verify import verify

    folder = copy_of(tmp_path, name)
    result = verify(entry_of(name), cwd=str(folder), processes=2, steps=6, env=script_env(), start=start_forked)
    assert result.exit_code == 0, (result.verdict, result.message)
    assert result.distributed is not None and result.distributed.verdict == "ok", result.distributed.message
    before = files_of(PROJECTS / name / "before")
    assert {p: t for p, t in files_of(folder).items() if p in before} == before


def test_a_notebook_that_trains_in_a_module_is_left_with_acc135(tmp_path: Path) -> None:
    """A notebook's cells are one program already; its modules are not converted with it (yet): the
    notebook is left as it is, and ACC135 says why (converting its cells alone would call `train` wrongly)."""
    folder = copy_of(tmp_path, "functions")
    code = (folder / "main.py").read_text().replace('if __name__ == "__main__":\n    main()\n', "main()\n")
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "train.ipynb").write_text(json.dumps(notebook))
    done = accelify("convert", "train.ipynb", cwd=folder)
    assert done.returncode == 0 and "ACC135" in done.stderr and not done.stdout


def test_a_model_that_trains_itself_is_no_trainer_to_join(tmp_path: Path) -> None:
    """MAML's `Meta(nn.Module)` steps its own optimizer in `forward`: the module does not join the script
    (under DDP such a forward could not train); the script is analysed alone, as before."""
    (tmp_path / "meta.py").write_text(
        "import torch\n\n\nclass Meta(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.net = torch.nn.Linear(2, 1)\n        self.opt = torch.optim.Adam(self.net.parameters())\n\n"
        "    def forward(self, x):\n        loss = self.net(x).sum()\n        self.opt.zero_grad()\n"
        "        loss.backward()\n        self.opt.step()\n        return loss\n")
    main = "import torch\nfrom meta import Meta\n\nif __name__ == \"__main__\":\n    model = Meta()\n    model(torch.randn(4, 2))\n"
    (tmp_path / "main.py").write_text(main)
    assert unit_of(main, str(tmp_path / "main.py")) is None
    result = convert_source(main, str(tmp_path / "main.py"))
    assert not result.changed and not result.companions


def test_a_definition_another_file_uses_too_is_not_changed_for_one_script(tmp_path: Path) -> None:
    """finetune.py calls `train(model, device, ...)` of train.py as well: converted with main.py, `train`
    would take an accelerator and stop placing batches, and finetune.py's call would break. Nothing
    changes; ACC141 names `train` and finetune.py."""
    folder = copy_of(tmp_path, "functions")
    (folder / "finetune.py").write_text("from train import train\n\n\ndef again(model, device, loader, opt):\n"
                                        "    train(model, device, loader, opt, 0)\n")
    main = folder / "main.py"
    result = convert_source(main.read_text(), str(main))
    assert not result.changed and not result.companions
    [finding] = [f for f in result.findings if f.code == "ACC141"]
    assert finding.line == 8 and "`evaluate`, `train` of" in finding.message and "`finetune.py`" in finding.message
    (folder / "finetune.py").write_text("import os\n\nprint(os.getcwd())\n")  # no use: converts
    assert convert_source(main.read_text(), str(main)).changed


def test_a_module_that_reads_a_name_only_the_script_binds_stays_apart(tmp_path: Path) -> None:
    """train.py reads `args`, which it never binds (main.py sets `train.args = args`, or it is a bug): in one
    program `args` would mean the script's; no unit."""
    folder = copy_of(tmp_path, "functions")
    train = folder / "train.py"
    train.write_text(train.read_text().replace("        if batch % 4 == 0:", "        if batch % args.log == 0:"))
    main = folder / "main.py"
    text = main.read_text().replace("    args = parser.parse_args()", "    global args\n    args = parser.parse_args()")
    main.write_text(text)
    assert unit_of(text, str(main)) is None


def test_a_module_the_script_imports_prints_once_unless_made_before_a_cpu_accelerator(tmp_path: Path) -> None:
    """fixtures/projects/dataset_prints: the dataset module's prints inside functions and methods become
    `PartialState().print` (ACC008); its top, `__getitem__` (and what it calls) and `print(..., file=...)` stay. Made before an
    `Accelerator(cpu=...)`, `PartialState()` would set the processes' state up without `cpu=` (Accelerate refuses
    to change it then): such a module is left as it is."""
    folder = copy_of(tmp_path, "dataset_prints")
    data = folder / "data.py"
    data.write_text(data.read_text().replace("import torch\n", "import sys\nimport torch\n\nprint('imported')\n", 1)
                    .replace("        return self.x[index], self.y[index]\n",
                             "        print(index)\n        print(index, file=sys.stderr)\n        return self._pair(index)\n\n"
                                     "    def _pair(self, index):\n        print('pair', index)\n"
                                     "        return self.x[index], self.y[index]\n"))
    entry = folder / "train.py"
    result = convert_source(entry.read_text(), str(entry))
    [module] = result.companions
    assert module.output.count("PartialState().print(") == 2
    assert "\nprint('imported')\n" in module.output and "        print(index)\n" in module.output
    assert "        print('pair', index)\n" in module.output  # called from `__getitem__`: a worker runs it
    assert [c.code for c in module.changes] == ["ACC008", "ACC008"]
    # an Accelerator that takes `cpu=`, with the dataset made before it: the module stays
    cpu = entry.read_text().replace("def main():\n", "def main(cpu=False):\n").replace(
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
        'device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")\n')
    cpu = cpu.replace('    train_set = Points(48, "train")\n', "").replace(
        "    torch.manual_seed(0)\n", '    torch.manual_seed(0)\n    train_set = Points(48, "train")\n')
    left = convert_source(cpu, str(entry))
    assert "cpu=" in left.output and left.changed and not left.companions
    # selected away with ACC008: no module changes
    assert not convert_source(entry.read_text(), str(entry), Options(select=frozenset({"ACC001"}))).companions


SECOND = """\
import argparse

import torch

from data import get_loaders
from model import Regressor


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    train_loader, val_loader = get_loaders(batch_size=8)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model = Regressor().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in train_loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_module_one_script_converts_and_another_needs_as_it_is_leaves_both(tmp_path: Path) -> None:
    """`main.py` makes `data.py`'s dataset print through `PartialState().print`; `second.py` builds its loaders
    with it before its `Accelerator(cpu=...)`, which such a print would make stop on a GPU machine (the state set
    up before it). A directory run leaves the module and both scripts, each finding naming the other."""
    folder = copy_of(tmp_path, "five_modules")
    (folder / "second.py").write_text(SECOND)
    done = accelify("convert", "--format", "json", ".", cwd=folder)
    assert done.returncode == 0, done.stderr
    report = {f["path"]: f for f in json.loads(done.stdout)["files"]}
    assert not [p for p, f in report.items() if f["status"] == "changed"]
    [main] = [f["message"] for f in report["./main.py"]["findings"]]
    [second] = [f["message"] for f in report["./second.py"]["findings"]]
    assert sorted(report) == sorted(f"./{p.name}" for p in folder.glob("*.py"))
    assert "`./data.py` is converted with this script" in main and "`./second.py` uses it" in main
    assert "`data.py` would print through `PartialState().print` once converted with `./main.py`" in second
    written = accelify("convert", "-i", ".", cwd=folder)
    assert written.returncode == 0, written.stderr
    assert files_of(folder) == {**files_of(PROJECTS / "five_modules" / "before"), "second.py": SECOND.encode()}


def test_a_module_a_script_needs_as_it_is_is_still_named(tmp_path: Path) -> None:
    """`second.py` alone in a run with the project's modules: it keeps `data.py` as it is (its loaders built
    before its `Accelerator(cpu=...)`); the report still names `data.py` (it was dropped, as if converted with
    the script: crnn_meijieru's `dataset.py`)."""
    folder = copy_of(tmp_path, "five_modules")
    (folder / "main.py").unlink()
    (folder / "trainer.py").unlink()
    (folder / "second.py").write_text(SECOND)
    done = accelify("convert", "--format", "json", ".", cwd=folder)
    assert done.returncode == 0, done.stderr
    report = {f["path"]: f["status"] for f in json.loads(done.stdout)["files"]}
    assert report == {"./data.py": "unchanged", "./model.py": "unchanged", "./utils.py": "unchanged",
                      "./second.py": "changed"}


def test_a_module_converted_for_one_script_serves_the_next(tmp_path: Path) -> None:
    """Once `main.py` is converted (`data.py` printing through `PartialState().print`), a script using the module
    converts (that print is no code accelify cannot vouch for: it was ACC135), unless it uses the module before an
    `Accelerator(cpu=...)`: left with ACC141."""
    folder = copy_of(tmp_path, "five_modules")
    assert accelify("convert", "-i", "main.py", cwd=folder).returncode == 0
    assert "PartialState().print" in (folder / "data.py").read_text()
    third = SECOND.replace(' and not args.cpu', '')
    (folder / "third.py").write_text(third)
    converted = convert_source(third, str(folder / "third.py"))
    assert converted.changed and not converted.findings, converted.findings
    (folder / "second.py").write_text(SECOND)
    left = convert_source(SECOND, str(folder / "second.py"))
    assert not left.changed and [f.code for f in left.findings] == ["ACC141"]
    assert "`data.py` prints through `PartialState().print`" in left.findings[0].message
    assert "before creating its `Accelerator(cpu=...)`" in left.findings[0].message


LOGGER = '''import sys


class Logger:
    def __init__(self, n_epochs):
        self.n_epochs = n_epochs
        self.batch = 0

    def log(self, losses):
        self.batch += 1
        sys.stdout.write("\\rbatch %d -- " % self.batch)
        self._line(losses)

    def _line(self, losses):
        for name, value in losses.items():
            sys.stdout.write("%s: %.4f | " % (name, value.item()))

    def count(self):
        return self.batch
'''


@pytest.mark.parametrize("extra, wrapped", [("", True), ("    print(logger.count())\n", False)])
def test_an_object_of_a_project_class_used_only_to_print_prints_on_the_main_process(tmp_path: Path, extra: str,
                                                                                     wrapped: bool) -> None:
    """CycleGAN's `logger = Logger(...)` of utils.py, `logger.log({...})` in the loop: its method redraws a progress
    line on every process; as a statement of an object the script uses only that way it goes under the main-process
    check. An object the script also reads (`logger.count()`) is left as it is."""
    (tmp_path / "utils.py").write_text(LOGGER)
    source = (folder := PROJECTS / "dataset_prints" / "before" / "train.py").read_text().replace(
        "from data import Points, summary\n", "from data import Points, summary\nfrom utils import Logger\n").replace(
        "    for epoch in range(2):\n", "    logger = Logger(2)\n    for epoch in range(2):\n").replace(
        "            optimizer.step()\n", "            optimizer.step()\n            logger.log({'loss': loss})\n").replace(
        "    with torch.no_grad():\n", extra + "    with torch.no_grad():\n")
    (tmp_path / "data.py").write_text((folder.parent / "data.py").read_text())
    entry = tmp_path / "train.py"
    entry.write_text(source)
    result = convert_source(source, str(entry))
    assert result.changed
    assert ("            if accelerator.is_main_process:\n                logger.log({'loss': loss})\n" in result.output) \
        is wrapped
