"""The one-pass engine: metadata resolved once, one traversal, and the cheap stand-ins for
LibCST's providers giving LibCST's answers."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.metadata import (
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from libcst.metadata.scope_provider import ScopeVisitor

from accelify.core import composite, metadata, pipeline
from accelify.queries import trees, walk
from accelify.codemods import CODEMODS
from accelify.core.symbols import read_anywhere, undefined_names

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "fixtures").glob("*/before.py"))
SAMPLE = [p for p in SOURCES if p.parent.name in ("mnist_functions", "trainer_builds_optimizer", "dict_batch_metrics",
                                                   "device_if_elif_else", "gan_two_optimizers", "amp_fp16")]


def test_every_codemod_runs_after_what_it_reads() -> None:
    order = [c.CODE for c in CODEMODS]
    for codemod in CODEMODS:
        for code in codemod.AFTER:
            assert code in order, f"{codemod.CODE} reads unknown {code}"
            if code != "ACC008":  # ACC001 places the Accelerator after the pass, when ACC008 is done
                assert order.index(code) < order.index(codemod.CODE), f"{codemod.CODE} must run after {code}"


def test_metadata_is_resolved_once_and_the_tree_walked_once(monkeypatch) -> None:
    source = (ROOT / "fixtures" / "mnist_functions" / "before.py").read_text()
    scopes = []
    real_infer = ScopeVisitor.infer_accesses  # runs once at the end of every scope analysis

    def infer_accesses(self):
        scopes.append(self)
        return real_infer(self)

    monkeypatch.setattr(ScopeVisitor, "infer_accesses", infer_accesses)
    passes = []
    real_visit = composite.Composite.on_visit

    def on_visit(self, node):
        if isinstance(node, cst.Module):
            passes.append(node)
        return real_visit(self, node)

    monkeypatch.setattr(composite.Composite, "on_visit", on_visit)
    result = pipeline.convert_source(source, "mnist.py")
    assert result.changed and result.error is None
    assert len(scopes) == 1  # no import left to remove: LibCST's import visitor never resolves again
    assert len(passes) == 1


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: p.parent.name)
def test_positions_parents_and_contexts_are_libcsts(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    ours = metadata.resolve(module)
    try:
        theirs = MetadataWrapper(module, unsafe_skip_copy=True)
        positions = theirs.resolve(PositionProvider)
        parents = theirs.resolve(ParentNodeProvider)
        contexts = theirs.resolve(ExpressionContextProvider)
        lazy_positions = ours._metadata[PositionProvider]
        lazy_contexts = ours._metadata[ExpressionContextProvider]
        checked = 0
        for node in walk.active().order:  # type: ignore[union-attr]
            if node in positions and node is not module:  # (the module itself: nobody asks)
                assert lazy_positions.get(node) == positions[node], node
                checked += 1
            assert ours._metadata[ParentNodeProvider].get(node) is parents.get(node)
            if isinstance(node, (cst.Name, cst.Attribute)) and not _in_import(node, parents):
                expected = contexts.get(node)
                got = lazy_contexts.get(node)
                # LOAD is what accelify asks about: it must agree exactly there
                assert (got == ExpressionContext.LOAD) == (expected == ExpressionContext.LOAD), cst.Module([]).code_for_node(node)
        assert checked > 100
    finally:
        walk.activate(None)


SCOPES_SAMPLE = """\
import torch as T
from torch import device as dev, nn
import torch.nn.parallel as par

class Net(nn.Module):
    size = 4
    def forward(self, x, *args, k=size, **kw):
        return [T.relu(y) for y in x if (z := y)]

def outer():
    model = Net()
    def inner():
        nonlocal model
        global g
        g = lambda q: par.DistributedDataParallel(q)
        return model.to(dev("cpu"))
    return inner

try:
    import apex
except ImportError:
    apex = None
del apex
print(f"{T.__version__!r}", *(a for a in range(3)))
"""


@pytest.mark.parametrize("source", [SCOPES_SAMPLE, *(p.read_text() for p in SAMPLE)],
                         ids=["sample", *(p.parent.name for p in SAMPLE)])
def test_scopes_and_qualified_names_are_libcsts(source: str) -> None:
    """Scopes come from LibCST's providers run without the wrapper's extra walks, and qualified
    names are asked of them lazily: every node gets the scope and names LibCST's way gives."""
    module = cst.parse_module(source)
    ours = metadata.resolve(module)
    try:
        theirs = MetadataWrapper(module, unsafe_skip_copy=True)
        scopes = theirs.resolve(ScopeProvider)
        names = theirs.resolve(QualifiedNameProvider)
        our_scopes = ours._metadata[ScopeProvider]
        our_names = ours._metadata[QualifiedNameProvider]
        assert set(our_scopes) == set(scopes)
        checked = 0
        for node in walk.active().order:  # type: ignore[union-attr]
            mine, theirs_ = our_scopes.get(node), scopes.get(node)
            assert type(mine) is type(theirs_)
            if mine is not None:
                assert sorted(a.name for a in mine.assignments) == sorted(a.name for a in theirs_.assignments)
                assert sorted(a.node.value for a in mine.accesses if isinstance(a.node, cst.Name)) == sorted(
                    a.node.value for a in theirs_.accesses if isinstance(a.node, cst.Name))
            expected = names.get(node)
            expected = expected() if callable(expected) else expected
            assert our_names.get(node) == expected, cst.Module([]).code_for_node(node)
            if expected:
                checked += 1
        assert checked > 10
        new = cst.Name("fresh")  # a node not of the tree: no names, as with LibCST
        assert our_names.get(new, "absent") == "absent" == names.get(new, "absent")
        with pytest.raises(KeyError):
            our_names[new]
    finally:
        walk.activate(None)


def _in_import(node: cst.CSTNode, parents) -> bool:
    """(LibCST calls the names of an import statement, a keyword (`f(batch_size=8)`) and an
    attribute's `.attr` loads: they name nothing in a scope, and no codemod asks about them.)"""
    parent = parents.get(node)
    if isinstance(parent, cst.Arg) and parent.keyword is node or isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    while node is not None:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            return True
        node = parents.get(node)
    return False


MATCHERS = [
    m.Call(), m.Name(), m.Attribute(attr=m.Name("to")), m.Call(func=m.Attribute(attr=m.Name("backward"))),
    m.Assign(), m.Name() | m.Attribute(), m.For() | m.While(), m.SimpleStatementLine(body=[m.Expr(m.Call())]),
]


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: p.parent.name)
def test_indexed_findall_is_libcsts(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    walk.activate(walk.build(module))
    try:
        subtrees = [module, *module.body, *m.findall(module, m.For()), *m.findall(module, m.Call())[:20]]
        for tree in subtrees:
            for matcher in MATCHERS:
                fast = walk.findall(tree, matcher)
                slow = m.findall(tree, matcher)
                assert len(fast) == len(slow) and all(a is b for a, b in zip(fast, slow))
        new = cst.parse_expression("f(x)")  # not in the indexed tree: LibCST answers
        assert [type(n) for n in walk.findall(new, m.Name())] == [cst.Name, cst.Name]
    finally:
        walk.activate(None)


def test_undefined_names_are_the_ones_nothing_binds() -> None:
    source = (
        "import os\nfrom m import helper\n\n"
        "def main():\n    acc = 1\n    def inner():\n        return acc + os.sep + missing_inner\n"
        "    print(len(helper), __name__)\n    return inner\n\n"
        "class A:\n    x = undefined_in_class\n\n"
        "def g():\n    global later\n    later = 1\n\n"
        "print(later, accelerator)\n"
    )
    assert undefined_names(source) == {"missing_inner", "undefined_in_class", "accelerator"}
    assert undefined_names("from m import *\nprint(anything)\n") == set()
    assert undefined_names("def f(:\n") == set()


def test_names_read_anywhere() -> None:
    source = "import torch\nimport torch.nn as nn\nfrom x import y\n\ndef f():\n    return nn.Linear(1, 1)\n"
    assert read_anywhere(source) >= {"nn"}
    assert "torch" not in read_anywhere(source) and "y" not in read_anywhere(source)


def test_a_file_that_cannot_train_is_not_parsed_by_libcst(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("LibCST parse of a file with nothing to train")

    monkeypatch.setattr(cst, "parse_module", refuse)
    source = "import os\n\nprint(os.sep)\n"
    result = pipeline.convert_source(source, "plain.py")
    assert result.output == source and result.error is None and not result.findings
    monkeypatch.undo()  # (what CPython rejects is confirmed with LibCST: it knows newer syntax)
    broken = pipeline.convert_source("import os\nx = (\n", "broken.py")
    assert broken.error is not None and broken.error.startswith("broken.py:2:")


def test_replace_in_rebuilds_the_path_only() -> None:
    module = cst.parse_module("def f():\n    if x:\n        a = 1\n    b = 2\n\nc = 3\n")
    block = module.body[0].body.body[0].body  # type: ignore[attr-defined]
    new = trees.replace_in(module, block, block.with_changes(body=[cst.parse_statement("a = 9\n")]))
    assert new.code == "def f():\n    if x:\n        a = 9\n    b = 2\n\nc = 3\n"
    assert new.body[1] is module.body[1]  # untouched statements are the same objects


def test_definitions_nothing_can_change_are_skipped_and_the_result_is_the_same(monkeypatch) -> None:
    """Helpers of plain Python are not walked; the conversion is exactly the one with every node walked."""
    base = (ROOT / "fixtures" / "mnist_functions" / "before.py").read_text()
    plain = "".join(f"\n\ndef helper_{i}(x, y):\n    z = x + y * {i}\n    return [k for k in range(z)]\n" for i in range(30))
    touched = (
        "\n\ndef log_to(path, text):\n    with open(path, \"w\") as f:\n        f.write(text)\n"  # ACC127 finding
        "\n\ndef show(x):\n    print(x)\n"
        "\n\nclass Meter:\n    def add(self, model):\n        return model.fc.weight.sum()\n"  # `model`: a name of the plan
    )
    source = base + plain + touched
    visited: list[str] = []
    real = composite.Composite.on_leave

    def on_leave(self, original, updated):
        if isinstance(original, cst.Name):
            visited.append(original.value)
        return real(self, original, updated)

    monkeypatch.setattr(composite.Composite, "on_leave", on_leave)
    skipped = pipeline.convert_source(source, "train.py")
    assert "helper_3" not in visited and "log_to" in visited and "Meter" in visited and "show" in visited
    monkeypatch.setattr(composite, "SKIP_INERT", False)
    visited.clear()
    walked = pipeline.convert_source(source, "train.py")
    assert "helper_3" in visited
    assert skipped.changed and skipped.error is None
    assert (skipped.output, skipped.findings, skipped.changes) == (walked.output, walked.findings, walked.changes)
    assert "ACC127" in {f.code for f in skipped.findings}


@pytest.mark.parametrize("path", sorted((ROOT / "fixtures" / "noop").glob("*.py")), ids=lambda p: p.stem)
def test_skipping_changes_no_refusal(path: Path, monkeypatch) -> None:
    source = path.read_text()
    first = pipeline.convert_source(source, path.name)
    monkeypatch.setattr(composite, "SKIP_INERT", False)
    second = pipeline.convert_source(source, path.name)
    assert (first.output, first.findings, first.error) == (second.output, second.findings, second.error)


def test_no_change_is_reported_for_code_another_codemod_removes() -> None:
    """`.to(self.device)` on batches goes as a whole (ACC003): ACC002 must not also report turning its
    `self.device` into `self.accelerator.device` (both run in one pass over the same nodes)."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, data):\n"
        "        self.device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n"
        "        self.model = model.to(self.device)\n"
        "        self.loader = DataLoader(data, batch_size=4)\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n"
        "    def train(self):\n"
        "        for batch in self.loader:\n"
        "            batch = tuple(t.to(self.device) for t in batch)\n"
        "            loss = self.model(*batch).sum()\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n"
    )
    result = pipeline.convert_source(source, "trainer.py")
    assert result.changed and result.error is None, result.findings
    line = source.splitlines().index("            batch = tuple(t.to(self.device) for t in batch)") + 1
    assert [c.code for c in result.changes if c.line == line] == ["ACC003"]
    assert "self.device" not in result.output


def test_libcsts_import_visitors_look_for_decorated_methods_once(monkeypatch) -> None:
    """pipeline remembers, per LibCST visitor class, that it has no decorated methods; a class
    of anyone else is still looked at on every instance, and its decorators still work."""
    import libcst.matchers._visitors as visitors
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, GatherImportsVisitor

    import builtins

    walks: list[type] = []
    real_dir = builtins.dir
    monkeypatch.setattr(visitors, "dir", lambda obj: walks.append(type(obj)) or real_dir(obj), raising=False)
    AddImportsVisitor(CodemodContext())
    GatherImportsVisitor(CodemodContext())
    walks.clear()
    AddImportsVisitor(CodemodContext())
    GatherImportsVisitor(CodemodContext())
    assert walks == []

    class Names(m.MatcherDecoratableVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        @m.visit(m.Name())
        def name(self, node: cst.Name) -> None:
            self.seen.append(node.value)

    for _ in range(2):
        walks.clear()
        visitor = Names()
        cst.parse_module("a = b\n").visit(visitor)
        assert visitor.seen == ["a", "b"] and Names in walks
