"""Notebooks (.ipynb): the golden (the docs' example as a notebook), what is kept byte for byte,
IPython syntax, cells accelify cannot read, cell-located findings and the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import FIXTURES

from accelify.notebooks import convert as notebook
from accelify.core.result import Options
from accelify.app.runner import convert_text

BEFORE = FIXTURES / "notebook_docs" / "before.ipynb"
AFTER = FIXTURES / "notebook_docs" / "after.ipynb"
#: The cells (1-based, markdown included) the golden rewrites.
REWRITTEN = {3, 9, 10, 12}


def convert(text: str, path: str = "train.ipynb", **options):
    return convert_text(text, path, Options(**options))


def run(*args: str, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelify", *args], cwd=cwd, input=stdin,
                          capture_output=True, timeout=120)


def make(*cells, indent=1, ensure_ascii=False, newline="\n", final="\n", form="list", sort_keys=True) -> str:
    """A notebook's text: each cell a code cell's source (a str) or ("markdown", text)."""
    out = []
    for i, cell in enumerate(cells):
        kind, text = cell if isinstance(cell, tuple) else ("code", cell)
        source = text.splitlines(keepends=True) if form == "list" else text
        entry = {"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": source}
        if kind == "code":
            entry.update(execution_count=None, outputs=[])
        out.append(entry)
    data = {"cells": out, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + final
    return text.replace("\n", newline)


def sources(text: str) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in json.loads(text)["cells"]]


IMPORTS = "import torch\nfrom torch.utils.data import DataLoader"
DATA = "loader = DataLoader(list(range(8)), batch_size=2)"
MODEL = ("model = torch.nn.Linear(1, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nmodel.to(device)')
LOOP = ("for x in loader:\n    x = x.float().unsqueeze(1).to(device)\n    loss = model(x).pow(2).mean()\n"
        "    loss.backward()\n    optimizer.step()\n    optimizer.zero_grad()")


# --------------------------------------------------------------------------
# the golden


def test_golden_notebook_converts_to_after() -> None:
    result = convert(BEFORE.read_text(encoding="utf-8"), "before.ipynb")
    assert result.error is None and not result.findings
    assert result.output.encode("utf-8") == AFTER.read_bytes()
    changed = [i for i, (old, new) in enumerate(zip(sources(result.source), sources(result.output)), 1) if old != new]
    assert set(changed) == REWRITTEN
    assert [number for number, _, _ in result.cells] == sorted(REWRITTEN)
    cells = sources(result.output)
    assert cells[2] == ("%matplotlib inline\nfrom accelerate import Accelerator\nfrom datasets import load_dataset\n"
                        "from torch.utils.data import DataLoader\nfrom tqdm.auto import tqdm\n"
                        "from transformers import AutoTokenizer\n"
                        "from transformers import AdamW, AutoModelForSequenceClassification, get_scheduler\n\n"
                        "accelerator = Accelerator()")
    assert cells[8].endswith("\n\ntrain_dataloader, eval_dataloader, model, optimizer = accelerator.prepare(\n"
                             "    train_dataloader, eval_dataloader, model, optimizer\n)")
    assert cells[9] == ""  # the device cell: nothing left
    assert cells[11].startswith("%%time\nprogress_bar = tqdm(range(num_training_steps), "
                                "disable=not accelerator.is_local_main_process)\n")
    assert "accelerator.backward(loss)" in cells[11] and ".to(device)" not in cells[11]
    # IPython lines and cells untouched: the shell cell, the help cell, the magic cell, the peek
    before = sources(result.source)
    for number in (2, 6, 13, 14, 15):
        assert cells[number - 1] == before[number - 1]


def test_golden_keeps_everything_but_the_rewritten_sources() -> None:
    before, after = BEFORE.read_text(encoding="utf-8"), AFTER.read_text(encoding="utf-8")
    old, new = json.loads(before), json.loads(after)
    for number in REWRITTEN:
        old["cells"][number - 1].pop("source")
        new["cells"][number - 1].pop("source")
    assert old == new  # outputs (the PNG), execution counts, ids, metadata, attachments, cell order
    # Every byte outside the rewritten sources: the original sources put back into the output,
    # laid out as the file is (nbformat's layout), give the original bytes.
    restored = json.loads(after)
    for number in REWRITTEN:
        restored["cells"][number - 1]["source"] = json.loads(before)["cells"][number - 1]["source"]
    assert json.dumps(restored, indent=1, sort_keys=True, ensure_ascii=False) + "\n" == before
    # and the rewritten list-form sources are laid out as nbformat lays them out
    assert json.dumps(new | {"cells": json.loads(after)["cells"]}, indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n" == after


def test_golden_validates_and_reads_with_nbformat() -> None:
    for path in (BEFORE, AFTER):
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        nbformat.validate(nb)
    nb = nbformat.reads(AFTER.read_text(encoding="utf-8"), as_version=4)
    assert nb.cells[13].outputs[0].data["image/png"] == json.loads(BEFORE.read_text())["cells"][13]["outputs"][0]["data"]["image/png"]


def test_golden_is_idempotent() -> None:
    after = AFTER.read_text(encoding="utf-8")
    again = convert(after, "after.ipynb")
    assert again.error is None and again.output == after and not again.changed


# --------------------------------------------------------------------------
# layout


@pytest.mark.parametrize("layout", [
    dict(),
    dict(indent=2, ensure_ascii=True),
    dict(indent=4, newline="\r\n", final=""),
    dict(indent=None, final=""),
    dict(form="str", sort_keys=False),
])
def test_layout_is_kept_and_only_sources_change(layout: dict) -> None:
    cells = (("markdown", "# Caf\u00e9 \u2013 notes"), IMPORTS, DATA + "  # caf\u00e9", MODEL, LOOP, "")
    text = make(*cells, **layout)
    result = convert(text)
    assert result.error is None and result.changed
    expected_cells = list(sources(result.output))
    # The expected file: the same writer, the new sources. Byte for byte.
    rebuilt = make(*[cells[0]] + expected_cells[1:], **layout)
    assert result.output == rebuilt
    assert expected_cells[1] == ("import torch\nfrom accelerate import Accelerator\nfrom torch.utils.data import "
                                 "DataLoader\n\naccelerator = Accelerator()")
    assert "accelerator.backward(loss)" in expected_cells[4]
    assert expected_cells[2] == cells[2] and expected_cells[5] == ""
    nbformat.validate(nbformat.reads(result.output, as_version=4))


def test_a_list_of_one_string_of_many_lines_stays_one_string() -> None:
    # sphinx-gallery (the PyTorch tutorials' notebooks) writes each source as one string in a list,
    # with indent 2, ASCII escapes and an empty list on two lines
    text = make(IMPORTS, DATA, MODEL, LOOP, "", indent=2, ensure_ascii=True)
    data = json.loads(text)
    for cell in data["cells"]:
        cell["source"] = ["".join(cell["source"])] if cell["source"] else []
    text = json.dumps(data, indent=2, ensure_ascii=True).replace('"source": []', '"source": [\n      ]')
    result = convert(text)
    out = json.loads(result.output)
    loop = out["cells"][3]["source"]
    assert len(loop) == 1 and "accelerator.backward(loss)" in loop[0]
    data["cells"][0]["source"] = out["cells"][0]["source"]
    data["cells"][2]["source"] = out["cells"][2]["source"]
    data["cells"][3]["source"] = loop
    assert result.output == json.dumps(data, indent=2, ensure_ascii=True).replace('"source": []', '"source": [\n      ]')


def test_string_and_list_sources_keep_their_form() -> None:
    text = make(IMPORTS, DATA, MODEL, LOOP)
    data = json.loads(text)
    data["cells"][3]["source"] = LOOP  # one cell written as a string
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    out = json.loads(convert(text).output)
    assert isinstance(out["cells"][3]["source"], str) and "accelerator.backward(loss)" in out["cells"][3]["source"]
    assert isinstance(out["cells"][2]["source"], list)


# --------------------------------------------------------------------------
# IPython syntax


@pytest.mark.parametrize("cell", [
    "%matplotlib inline\nimport torch",
    "!pip install torch \\\n    accelerate\nx = 1",
    "model?\n?model\nmodel.forward??",
    "files = !ls\n%time x = 1\nprint(files)",
    "for f in range(2):\n    !echo {f}\n    print(f)",
    "if True:\n    %time x = 1",
    "%%time\nx = 1\n!nvidia-smi",
    "%%capture out\nmodel?",
])
def test_ipython_lines_are_masked_and_restored_byte_for_byte(cell: str) -> None:
    masked = notebook.mask(cell, "TAG")
    assert masked.text is not None
    compile(masked.text, "<cell>", "exec")
    assert len(masked.text.splitlines()) == len(cell.splitlines())  # lines keep their numbers
    assert notebook.unmask(masked.text, masked.originals) == cell
    # moved one level in (a block wrapped by the conversion), a placeholder keeps its new indentation
    shifted = "".join("    " + line for line in notebook.split_lines(masked.text))
    assert notebook.unmask(shifted, masked.originals) == "".join("    " + line for line in notebook.split_lines(cell))


@pytest.mark.parametrize("cell, reason", [
    ("%%bash\npip install torch", "language"),
    ("%%writefile train.py\nloss.backward()", "language"),
    ("%%sql\nSELECT 1", "magic"),
    ("x = (\n", "syntax"),
    ("print 'python 2'", "syntax"),
])
def test_cells_left_out_of_the_program(cell: str, reason: str) -> None:
    masked = notebook.mask(cell, "TAG")
    assert masked.text is None and masked.reason == reason


def test_a_python_syntax_error_is_not_masked_as_ipython() -> None:
    # `%` starting a continuation line is Python (modulo): the cell compiles, nothing is masked
    cell = "x = (10\n     % 3)\n%time y = 1"
    masked = notebook.mask(cell, "TAG")
    assert masked.text is not None and list(masked.originals.values()) == ["%time y = 1"]


def test_magics_and_shell_lines_survive_a_conversion_that_rewrites_their_cell() -> None:
    loop = ("%%time\nfor x in loader:\n    x = x.float().unsqueeze(1).to(device)\n    !echo step\n"
            "    loss = model(x).pow(2).mean()\n    loss.backward()\n    optimizer.step()\n    optimizer.zero_grad()")
    text = make("%matplotlib inline\n" + IMPORTS + "\n!nvidia-smi", DATA, MODEL, loop, "model?")
    result = convert(text)
    assert result.error is None and result.changed
    cells = sources(result.output)
    assert cells[0].startswith("%matplotlib inline\nimport torch\n") and cells[0].endswith("\naccelerator = Accelerator()\n\n!nvidia-smi")
    assert cells[3].startswith("%%time\nfor x in loader:\n") and "    !echo step\n" in cells[3]
    assert "accelerator.backward(loss)" in cells[3]
    assert cells[4] == "model?"
    assert convert(result.output).output == result.output  # idempotent


# --------------------------------------------------------------------------
# cells accelify cannot read


def test_unparseable_cell_without_training_is_reported_and_the_rest_converted() -> None:
    text = make(IMPORTS, "print 'not python 3'", DATA, MODEL, LOOP)
    result = convert(text)
    assert result.error is None and result.changed
    assert [(f.code, f.cell, f.line) for f in result.findings] == [("ACC140", 2, 1)]
    assert "left as it is; the other cells are converted" in result.findings[0].message
    assert sources(result.output)[1] == "print 'not python 3'"
    assert "accelerator.backward(loss)" in sources(result.output)[4]


def test_ignored_acc140_is_not_reported() -> None:
    text = make(IMPORTS, "print 'not python 3'", DATA, MODEL, LOOP)
    result = convert(text, findings=frozenset({"ACC124"}))
    assert result.changed and not result.findings


def test_unparseable_cell_with_training_leaves_the_notebook_unchanged() -> None:
    broken = LOOP.replace("for x in loader:", "for x in loader")
    text = make(IMPORTS, DATA, MODEL, broken)
    result = convert(text)
    assert result.error is None and not result.changed and result.output == text
    [finding] = result.findings
    assert (finding.code, finding.cell, finding.line) == ("ACC140", 4, 1)
    assert "notebook left unchanged" in finding.message
    assert finding.render().startswith("train.ipynb:cell 4:1:")


def test_a_line_magic_that_runs_training_code_leaves_the_notebook_unchanged() -> None:
    text = make(IMPORTS, DATA, MODEL, "def train():\n" + "\n".join("    " + l for l in LOOP.splitlines()),
                "%time train()\n%timeit loss.backward()")
    result = convert(text)
    assert not result.changed and [(f.code, f.cell, f.line) for f in result.findings] == [("ACC140", 5, 2)]


def test_a_writefile_cell_with_training_is_reported_the_rest_converted() -> None:
    text = make(IMPORTS, DATA, MODEL, LOOP, "%%writefile other.py\nloss.backward()")
    result = convert(text)
    assert result.changed and sources(result.output)[4] == "%%writefile other.py\nloss.backward()"
    assert [(f.code, f.cell) for f in result.findings] == [("ACC140", 5)]
    # a shell cell that does not train is no finding
    assert not convert(make(IMPORTS, DATA, MODEL, LOOP, "%%bash\nls")).findings


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot read notebook"),
    ('{"nbformat": 3, "worksheets": []}', "notebook format 3 is not supported"),
    ('{"cells": [{"cell_type": "code", "source": 3}], "nbformat": 4}', "neither a string nor a list"),
    ('{"cells": [1, 2], "nbformat": 4}', "cannot read notebook"),
    ('{"cells": [{"cell_type": "code"}], "nbformat": 4}', "cell 1 has no source"),
    ("[" * 100000 + "]" * 100000, "cannot read notebook"),
    ("", "cannot read notebook"),
])
def test_a_file_that_is_no_notebook_is_an_error_never_a_traceback(text: str, message: str) -> None:
    result = convert(text)
    assert result.error is not None and message in result.error and result.output == text


# --------------------------------------------------------------------------
# where findings are


HAND_SLICED = ("data = torch.randn(64, 16)\nmodel = torch.nn.Linear(16, 1)\n"
               'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nmodel.to(device)\n'
               "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)")
HAND_LOOP = ("for i in range(0, data.size(0), 32):\n    batch = data[i : i + 32].to(device)\n"
             "    loss = model(batch).pow(2).mean()\n    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()")


def test_findings_name_the_cell_and_the_line_in_it() -> None:
    text = make(("markdown", "# hand-sliced"), "import torch", HAND_SLICED, ("markdown", "train"), "x = 1\n" + HAND_LOOP)
    result = convert(text)
    assert result.changed
    [finding] = result.findings
    assert (finding.code, finding.cell, finding.line) == ("ACC124", 5, 2)
    assert finding.render().startswith("train.ipynb:cell 5:2:")
    # suppression comments work on the cell's line
    silenced = convert(make("import torch", HAND_SLICED, "x = 1\n" + HAND_LOOP.replace(
        "32):", "32):  # accelify: ignore[ACC124]")))
    assert silenced.changed and not silenced.findings


# --------------------------------------------------------------------------
# the command line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.ipynb").write_bytes(BEFORE.read_bytes())
    (tmp_path / "train.py").write_text((FIXTURES / "docs" / "before.py").read_text())
    return tmp_path


def test_cli_diff_is_per_cell(project: Path) -> None:
    proc = run("convert", "train.ipynb", cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("--- train.ipynb (cell 3)\n+++ train.ipynb (cell 3)\n@@ -1,7 +1,9 @@\n %matplotlib inline\n"
                          "-import torch\n+from accelerate import Accelerator\n")
    for number in sorted(REWRITTEN):
        assert f"--- train.ipynb (cell {number})\n+++ train.ipynb (cell {number})\n" in out
    assert "-        loss.backward()\n+        accelerator.backward(loss)\n" in out
    assert '"source"' not in out and "No newline" not in out  # not a diff of the JSON
    assert b"would convert train.ipynb" in proc.stderr
    assert (project / "train.ipynb").read_bytes() == BEFORE.read_bytes()


def test_cli_in_place_check_and_output(project: Path) -> None:
    assert run("convert", "--check", "train.ipynb", cwd=project).returncode == 1
    proc = run("convert", "-o", "out.ipynb", "train.ipynb", cwd=project)
    assert proc.returncode == 0 and (project / "out.ipynb").read_bytes() == AFTER.read_bytes()
    proc = run("convert", "--in-place", "train.ipynb", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert (project / "train.ipynb").read_bytes() == AFTER.read_bytes()
    assert run("convert", "--check", "train.ipynb", cwd=project).returncode == 0
    # standard input: a notebook's JSON is converted as a notebook
    proc = run("convert", "-", "-o", "-", cwd=project, stdin=BEFORE.read_bytes())
    assert proc.returncode == 0 and proc.stdout == AFTER.read_bytes()


def test_cli_directory_includes_notebooks_and_skips_checkpoints(project: Path) -> None:
    checkpoints = project / ".ipynb_checkpoints"
    checkpoints.mkdir()
    (checkpoints / "train-checkpoint.ipynb").write_bytes(BEFORE.read_bytes())
    proc = run("convert", "--check", ".", cwd=project)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "would convert ./train.ipynb" in err and "would convert ./train.py" in err
    assert "checkpoint" not in err and "2 files would be converted" in err


def test_cli_jobs_keep_path_order_with_notebooks(project: Path) -> None:
    for name in ("a.ipynb", "c.ipynb"):
        (project / name).write_bytes(BEFORE.read_bytes())
    (project / "b.py").write_text((FIXTURES / "docs" / "before.py").read_text())
    proc = run("convert", "-j", "2", "--format", "json", "a.ipynb", "b.py", "c.ipynb", "train.ipynb", cwd=project)
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)["files"]
    assert [f["path"] for f in files] == ["a.ipynb", "b.py", "c.ipynb", "train.ipynb"]
    assert all(f["status"] == "changed" for f in files)
    assert files[0]["diff"].startswith("--- a.ipynb (cell 3)\n") and files[1]["diff"].startswith("--- a/b.py\n")


def test_cli_findings_in_text_json_and_github(tmp_path: Path) -> None:
    (tmp_path / "hand.ipynb").write_text(make("import torch", HAND_SLICED, "x = 1\n" + HAND_LOOP), encoding="utf-8")
    text = run("convert", "hand.ipynb", cwd=tmp_path).stderr.decode()
    assert "hand.ipynb:cell 3:2:1: ACC124" in text and "ACC124" in text
    data = json.loads(run("convert", "--format", "json", "hand.ipynb", cwd=tmp_path).stdout)
    [finding] = data["files"][0]["findings"]
    assert (finding["code"], finding["cell"], finding["line"]) == ("ACC124", 3, 2)
    github = run("convert", "--format", "github", "hand.ipynb", cwd=tmp_path).stdout.decode()
    assert github.startswith("::warning file=hand.ipynb,title=accelify ACC124::cell 3, line 2, column 1: ")


@pytest.mark.parametrize("head", [(), (("markdown", "# Training"),)])
def test_cli_json_names_the_cell_a_change_is_in(tmp_path: Path, head: tuple) -> None:
    """Issue 25: the Accelerator inserted after the imports that end cell 1 was reported in cell 2
    (where the statement after it is). Cells count from 1 over all cells, markdown included, in the
    JSON as in the diff's headers and the findings."""
    (tmp_path / "three.ipynb").write_text(make(*head, IMPORTS, DATA + "\n" + MODEL, LOOP), encoding="utf-8")
    proc = run("convert", "--format", "json", "three.ipynb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [entry] = json.loads(proc.stdout)["files"]
    first = len(head) + 1  # the first code cell's number
    changes = {(c["code"], c["cell"], c["line"]) for c in entry["changes"]}
    assert ("ACC001", first, 2) in changes  # after line 2 of its cell, the last import
    assert ("ACC004", first + 1, 3) in changes and ("ACC005", first + 2, 4) in changes
    diffs = dict(re.findall(r"^--- three\.ipynb \(cell (\d+)\)\n(.*?)(?=^--- |\Z)", entry["diff"], re.M | re.S))
    assert sorted(map(int, diffs)) == sorted({cell for _, cell, _ in changes}) == [first, first + 1, first + 2]
    assert "+accelerator = Accelerator()\n" in diffs[str(first)]
    assert "+loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n" in diffs[str(first + 1)]
    assert "+    accelerator.backward(loss)\n" in diffs[str(first + 2)]


def test_cli_broken_notebook_is_an_error_exit_123(tmp_path: Path) -> None:
    (tmp_path / "broken.ipynb").write_text("{not json", encoding="utf-8")
    (tmp_path / "train.ipynb").write_bytes(BEFORE.read_bytes())
    proc = run("convert", "--check", "broken.ipynb", "train.ipynb", cwd=tmp_path)
    assert proc.returncode == 123
    assert b"broken.ipynb: cannot read notebook" in proc.stderr and b"would convert train.ipynb" in proc.stderr


# --------------------------------------------------------------------------
# --notebook-launcher


def test_notebook_launcher_wraps_the_training_code_in_a_function() -> None:
    result = convert(BEFORE.read_text(encoding="utf-8"), "before.ipynb", notebook_launcher=2)
    assert result.error is None and not result.findings
    [note] = result.notes
    assert note == ("training code of cells 6, 7, 9, 11, 12 wrapped in `def training_function():` in cell 6, "
                    "started by `notebook_launcher(training_function, num_processes=2)` in cell 12; cells 7, 9, 11 "
                    "emptied; `accelerator = Accelerator()` moved into it from cell 3")
    cells = sources(result.output)
    assert "from accelerate import Accelerator\nfrom accelerate import notebook_launcher\n" in cells[2]
    assert "accelerator = Accelerator()" not in cells[2]  # created inside the function only
    assert cells[5].startswith("def training_function():\n    accelerator = Accelerator()\n\n"
                               "    train_dataloader = DataLoader(")
    assert "\n    train_dataloader, eval_dataloader, model, optimizer = accelerator.prepare(\n" in cells[5]
    assert "\n            accelerator.backward(loss)\n" in cells[5]
    assert cells[6] == cells[8] == cells[9] == cells[10] == ""
    assert cells[11] == "%%time\nnotebook_launcher(training_function, num_processes=2)"  # the magic times the launch
    assert cells[12] == "model?"  # IPython-only cells stay where they are
    compile(cells[5], "<cell>", "exec")
    nbformat.validate(nbformat.reads(result.output, as_version=4))
    again = convert(result.output, "before.ipynb", notebook_launcher=2)
    assert again.output == result.output and not again.findings
    assert again.notes == ["notebook launcher not added: nothing to convert"]


def test_notebook_launcher_not_added_when_it_cannot_be_done_says_why() -> None:
    loop = "%%time\n" + LOOP
    text = make(IMPORTS, DATA, MODEL, loop, "print(loss)")
    result = convert(text, notebook_launcher=2)
    assert result.changed and "accelerator.backward(loss)" in sources(result.output)[3]  # converted all the same
    assert result.notes == ["notebook launcher not added: cell 4 starts with a cell magic, which cannot go inside "
                            "the training function"]
    assert "notebook_launcher" not in result.output


def test_notebook_launcher_takes_in_the_cells_its_code_needs() -> None:
    # the loader `prepare` takes is built in cell 2 (with `size`, which cell 5 reads): the function
    # starts there, and takes cell 5 in (`size` is the function's now)
    text = make(IMPORTS, DATA + "\nsize = 8", MODEL, LOOP, "print(size)")
    result = convert(text, notebook_launcher=2)
    cells = sources(result.output)
    assert cells[1].startswith("def training_function():\n") and cells[4] == "notebook_launcher(training_function, num_processes=2)"
    namespace: dict = {}
    exec(compile(cells[1], "<cell>", "exec"), namespace)  # defines, reads nothing it lacks
    assert callable(namespace["training_function"])


def test_cli_notebook_launcher_prints_what_it_did(project: Path) -> None:
    proc = run("convert", "--notebook-launcher", "2", "train.ipynb", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "train.ipynb: training code of cells 6, 7, 9, 11, 12 wrapped in `def training_function():`" in proc.stderr.decode()
    assert "+notebook_launcher(training_function, num_processes=2)\n" in proc.stdout.decode()
    assert run("convert", "--notebook-launcher", "2", "--target", "runtime", "train.ipynb", cwd=project).returncode == 2
    assert run("convert", "--notebook-launcher", "0", "train.ipynb", cwd=project).returncode == 2


def test_cli_verify_says_it_takes_scripts_not_notebooks(project: Path) -> None:
    proc = run("verify", "train.ipynb", cwd=project)
    assert proc.returncode == 2 and b"verify runs Python scripts, not notebooks" in proc.stderr


def test_docs_notebook_examples_are_real_runs(project: Path, root: Path) -> None:
    page = (root / "docs" / "notebooks.md").read_text(encoding="utf-8")
    shown = page.split("$ accelify convert train.ipynb\n", 1)[1].split("```", 1)[0]
    assert run("convert", "train.ipynb", cwd=project).stdout.decode() == shown
    note = page.split("$ accelify convert --notebook-launcher 2 train.ipynb\n...\nwould convert train.ipynb\n", 1)[1]
    note = note.split("```", 1)[0]
    assert note in run("convert", "--notebook-launcher", "2", "train.ipynb", cwd=project).stderr.decode()


FRAGMENTS = [IMPORTS, DATA, MODEL, LOOP, "%matplotlib inline", "!pip install torch", "model?", "?model",
             "%%time\nx = 1", "%%bash\nls", "print 'py2'", "x = (", "files = !ls", "%time y = 2", "",
             "for b in loader:\n    break\nb", "    indented = 1", "%%writefile a.py\nloss.backward()",
             "if True:\n    !echo hi", "'''doc\nstring'''", "# only a comment", "x = 1\n\n\n"]


def test_any_mix_of_cells_never_raises_and_keeps_what_it_does_not_rewrite() -> None:
    from hypothesis import HealthCheck, given, settings, strategies as st

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=7), st.sampled_from(["list", "str"]), st.booleans())
    def check(cells: list[str], form: str, training: bool) -> None:
        if training:  # a notebook that trains, with the other cells around its cells
            cells = [IMPORTS, *cells[:2], DATA, MODEL, *cells[2:4], LOOP, *cells[4:]]
        text = make(*cells, form=form)
        result = convert(text)
        assert result.error is None or result.output == text
        after = sources(result.output)
        rewritten = {number for number, _, _ in (result.cells or [])}
        for number, (old, new) in enumerate(zip(cells, after), 1):
            assert new == old or number in rewritten
        data_before, data_after = json.loads(text), json.loads(result.output)
        for cell in data_before["cells"] + data_after["cells"]:
            cell.pop("source")
        assert data_before == data_after
        if result.changed:
            nbformat.validate(nbformat.reads(result.output, as_version=4))
            assert convert(result.output).output == result.output

    check()
