"""The pipeline's guarantees: never raises on user input, never returns code that does not parse."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

import accelify.core.pipeline as pipeline
from accelify.codemods import AccelifyCodemod
from conftest import FIXTURES, ROOT, convert

TRAIN = (FIXTURES / "docs" / "before.py").read_text()


class _Broken(AccelifyCodemod):
    CODE = "ACC999"

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> cst.BaseSmallStatement:
        return cst.Return()  # a valid tree, but `return` outside a function does not compile


class _Raises(AccelifyCodemod):
    CODE = "ACC998"

    def visit_Module(self, node: cst.Module) -> None:
        raise RuntimeError("boom")


@pytest.mark.parametrize("codemod, message", [(_Broken, "does not parse"), (_Raises, "internal error")])
def test_a_bad_codemod_never_costs_the_file(monkeypatch, codemod, message) -> None:
    monkeypatch.setattr(pipeline, "gather_codemods", lambda: (codemod,))
    result = pipeline.convert_source(TRAIN, "train.py")
    assert result.error is not None and message in result.error
    assert result.output == TRAIN and not result.changed


class _RaisesWithATree(AccelifyCodemod):
    CODE = "ACC997"

    def visit_Module(self, node: cst.Module) -> None:
        raise KeyError(node)  # what a lookup of a node that has no metadata raises


def test_an_internal_error_is_one_short_line(monkeypatch) -> None:
    monkeypatch.setattr(pipeline, "gather_codemods", lambda: (_RaisesWithATree,))
    result = pipeline.convert_source(TRAIN, "train.py")
    assert result.error is not None and result.error.startswith("train.py: internal error, file left unchanged: KeyError(")
    assert "\n" not in result.error and len(result.error) < 300


@pytest.mark.parametrize(
    "source, line",
    [("def f(:\n    pass\n", 1), ("x = 1\ny = (\n", 2), ("import torch\n\n\nclass A:\nreturn 1\n", 5)],
)
def test_syntax_errors_are_reported_with_their_line(source: str, line: int) -> None:
    result = pipeline.convert_source(source, "bad.py")
    assert result.error is not None and result.error.startswith(f"bad.py:{line}:")
    assert result.output == source


def test_null_bytes_are_an_error_not_a_crash() -> None:
    result = pipeline.convert_source("x = 1\0\n", "nul.py")
    assert result.error is not None and result.output == "x = 1\0\n"


def test_findings_and_changes_point_at_original_lines() -> None:
    result = pipeline.convert_source(TRAIN, "train.py")
    lines = TRAIN.splitlines()
    by_code = {c.code: c.line for c in result.changes}
    assert lines[by_code["ACC005"] - 1].strip() == "loss.backward()"
    assert lines[by_code["ACC002"] - 1].startswith("device = torch.device(")


def test_sources_stay_python39_compatible() -> None:
    for folder in ("accelify", "codemods", "runtime"):
        for path in (ROOT / folder).glob("*.py"):
            ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def test_a_selection_never_uses_an_accelerator_a_helper_does_not_receive(root) -> None:
    # Without ACC002, train(args, model, device, ...) keeps its device parameter: its backward
    # must stay as it is (and be reported) rather than name an `accelerator` it cannot see.
    source = (root / "fixtures" / "mnist_functions" / "before.py").read_text()
    result = convert(source, select=frozenset({"ACC001", "ACC005"}))
    train = result.output.split("def train(")[1].split("\ndef ")[0]
    assert "loss.backward()" in train and "accelerator" not in train
    assert "ACC106" in {f.code for f in result.findings}
    compile(result.output, "converted.py", "exec")


def test_a_rewrite_that_reads_an_undefined_name_leaves_the_file_unchanged(root, monkeypatch) -> None:
    # A planning bug that sends `accelerator` where it is not bound (here: forced, by pretending
    # every function reaches it) must end as a reported error, never as a NameError at run time.
    from accelify.analyses.plan import Plan

    monkeypatch.setattr(Plan, "accelerator_in", lambda self, key: self.accelerator)
    source = (root / "fixtures" / "mnist_functions" / "before.py").read_text()
    result = pipeline.convert_source(source, "mnist.py", pipeline.Options(select=frozenset({"ACC001", "ACC005"})))
    assert result.error is not None and "undefined accelerator" in result.error
    assert result.output == source


def test_a_model_handed_back_by_the_call_that_trains_it_is_not_a_new_model() -> None:
    # `model = train(model, ...)` (early-stopping examples): prepare goes before it, nothing is refused
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n\n"
        "def train(model, loader, optimizer):\n"
        "    for x, y in loader:\n        loss = model(x, y)\n        loss.backward()\n        optimizer.step()\n"
        "    return model\n\n\n"
        "loader = DataLoader(make_dataset(), batch_size=8)\nmodel = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel = train(model, loader, optimizer)\n"
    )
    result = convert(source)
    assert not [f for f in result.findings if f.code == "ACC104"]
    assert (
        "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n\nmodel = train(model, loader, optimizer)\n"
        in result.output
    )


def test_a_notebook_line_showing_the_device_goes_with_the_device() -> None:
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "device = torch.device(\"cuda\") if torch.cuda.is_available() else torch.device(\"cpu\")\ndevice\n"
        "loader = DataLoader(make_dataset(), batch_size=8)\nmodel = Net().to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n    loss = model(x.to(device), y.to(device))\n    loss.backward()\n    optimizer.step()\n"
    )
    output = convert(source).output
    assert "\ndevice\n" not in output and "\naccelerator.device\n" not in output


def test_removing_dataparallel_before_a_load_reports_the_module_prefix() -> None:
    source = (
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(make_dataset(), batch_size=8)\nmodel = nn.DataParallel(Net())\n"
        "model.load_state_dict(torch.load(\"old.pt\"))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n    loss = model(x, y)\n    loss.backward()\n    optimizer.step()\n"
    )
    result = convert(source)
    assert "model = Net()\n" in result.output
    finding = next(f for f in result.findings if f.code == "ACC129")
    assert finding.line == 7 and "module." in finding.message


def test_a_download_before_the_accelerator_exists_is_reported_not_wrapped() -> None:
    # The device (where the Accelerator is created) comes after the dataset: no main_process_first there.
    source = (FIXTURES / "download_first" / "before.py").read_text()
    source = source.replace(
        '    device = torch.device("cuda" if use_cuda else "cpu")\n', ""
    ).replace('    train_loader = DataLoader(dataset1, batch_size=64)\n',
              '    train_loader = DataLoader(dataset1, batch_size=64)\n    device = torch.device("cuda" if use_cuda else "cpu")\n')
    result = convert(source)
    assert "main_process_first" not in result.output
    assert "accelerator.backward(loss)" in result.output
    finding = next(f for f in result.findings if f.code == "ACC127")
    assert "download=True" in finding.message


def test_a_finding_is_one_line_even_when_it_quotes_code_over_several():
    from accelify.queries.records import Finding

    finding = Finding("train.py", 3, 1, "ACC126", "`dist.all_reduce(\n        total)` is kept", "drop\n    it")
    assert finding.message == "`dist.all_reduce( total)` is kept" and finding.suggestion == "drop it"
    assert "\n" not in finding.render()
