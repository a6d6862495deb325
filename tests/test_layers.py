"""The house keeps its layers: every import of the package, read from the source (imports inside
functions count; only those under ``if TYPE_CHECKING:`` do not), goes to the module's own layer
or a lower one, and no modules import one another in a circle.

Layers, bottom to top: CST queries, analyses (and the plan), codemods, core, notebooks, output,
the command line. The runtime package is for converted scripts: it imports only itself, and only
the command line (``verify``) reads it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
#: where each subpackage of ``accelify`` lives in the repository
PACKAGES = {"accelify": REPO / "accelify", "accelify.codemods": REPO / "codemods", "accelify.runtime": REPO / "runtime"}
LAYERS = ("queries", "analyses", "codemods", "core", "notebooks", "output", "app")


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if package == "accelify" and parts[0] in ("codemods", "runtime"):
                continue  # not where they live
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _typing_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, package: str) -> Iterator[tuple[str, str]]:
    """``(module, name)`` for every name an import statement takes (``("", module)`` for ``import
    module``), relative imports made absolute from ``package``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _typing_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (("", alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            yield from ((base, alias.name) for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. ``from pkg import sub`` reads the
    submodule ``pkg.sub``; ``from pkg import name`` reads ``pkg``."""
    known = modules()
    out: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for base, imported in _imported(ast.parse(path.read_text(encoding="utf-8")), package):
            target = f"{base}.{imported}" if base else imported
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        out[name] = targets
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    if module in ("accelify", "accelify.__main__"):
        return "root"
    return parts[1]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions_and_not_typing_ones(tmp_path: Path) -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from accelify.core import pipeline\n"
        "def f():\n    from accelify.queries.walk import findall\nfrom . import sibling\n"
    )
    seen = set(_imported(tree, "accelify.analyses"))
    assert ("accelify.queries.walk", "findall") in seen and ("accelify.analyses", "sibling") in seen
    assert ("accelify.core", "pipeline") not in seen


def test_every_module_is_in_a_layer() -> None:
    assert {layer(m) for m in modules()} <= set(LAYERS) | {"root", "runtime"}


def test_no_module_imports_from_a_layer_above_it() -> None:
    upward = []
    for module, targets in graph().items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if there == "root" and target == "accelify":
                continue  # the package root holds the version only
            if "runtime" in (here, there):
                if here not in ("runtime", "app") or there != "runtime":
                    upward.append(f"{module} -> {target}")  # only the command line reads the runtime
                continue
            if here == "root":
                continue
            if LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def test_the_package_root_imports_nothing() -> None:
    assert graph()["accelify"] == set()
