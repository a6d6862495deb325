"""Tree surgery without a visitor: children, descendants, replacing a node, rebuilding a tree,
and scheduling the removal of the imports a removed node read."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

import libcst as cst
from libcst.metadata import (
    ScopeProvider,
)

if TYPE_CHECKING:
    from libcst.codemod import CodemodContext

Block = Union[cst.Module, cst.IndentedBlock]
#: (statement, the original statement it comes from, None for an inserted one)
Item = tuple[cst.BaseStatement, Optional[cst.BaseStatement]]

_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(node: cst.CSTNode) -> tuple[str, ...]:
    """The field names of ``node``'s type (cached: ``dataclasses.fields`` is slow)."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node))
    return names


def iter_children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The direct children of ``node``, from its fields (no visitor, no copies)."""
    for name in _fields(node):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    yield item


def descendants(node: cst.CSTNode, skip: tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it (not entering nodes of a type in ``skip``), in no set order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, skip):
            stack.extend(iter_children(current))


def find_path(root: cst.CSTNode, target: cst.CSTNode) -> Optional[list[cst.CSTNode]]:
    """The nodes from ``root`` down to ``target`` (both included), if ``target`` is in ``root``."""
    stack: list[tuple[cst.CSTNode, int]] = [(root, 0)]
    path: list[cst.CSTNode] = []
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        path.append(node)
        if node is target:
            return path
        if isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
            continue  # blocks are not inside expressions
        for child in reversed(list(iter_children(node))):
            stack.append((child, depth + 1))
    return None


def replace_child(parent: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    """``parent`` with its direct child ``old`` replaced by ``new``."""
    for name in _fields(parent):
        value = getattr(parent, name)
        if value is old:
            return parent.with_changes(**{name: new})
        if isinstance(value, (list, tuple)) and any(v is old for v in value):
            return parent.with_changes(**{name: type(value)(new if v is old else v for v in value)})
    raise ValueError("not a child")


def replace_in(root: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """``root`` with the node ``old`` (anywhere in it) replaced by ``new``, rebuilt along its path."""
    path = find_path(root, old)
    if path is None:
        raise ValueError("node not in the tree")
    node = new
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:])):
        node = replace_child(parent, child, node)
    return node  # type: ignore[return-value]


def rebuild_with(root: cst.CSTNode, mapping: dict[int, cst.CSTNode], skip: tuple[type, ...] = ()) -> cst.CSTNode:
    """``root`` with each node whose id is in ``mapping`` replaced; only the nodes on the way to a
    replaced one are rebuilt (``deep_replace`` rebuilds every node).  Nodes of a type in ``skip``
    are not entered."""

    def walk(node: cst.CSTNode) -> cst.CSTNode:
        if id(node) in mapping:
            return mapping[id(node)]
        if isinstance(node, skip):
            return node
        updates: dict[str, Any] = {}
        for name in _fields(node):
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                new = walk(value)
                if new is not value:
                    updates[name] = new
            elif isinstance(value, (list, tuple)) and value and any(isinstance(v, cst.CSTNode) for v in value):
                items = [walk(v) if isinstance(v, cst.CSTNode) else v for v in value]
                if any(a is not b for a, b in zip(items, value)):
                    updates[name] = type(value)(items)
        return node.with_changes(**updates) if updates else node

    return walk(root)


def remove_imports_of(context: "CodemodContext", node: cst.CSTNode) -> None:
    """Schedule the removal (if unused in the end) of every import ``node`` reads.

    What ``RemoveImportsVisitor.remove_unused_import_by_node`` schedules, from the metadata
    resolved once (that helper builds a matcher-decoratable visitor per call, ~20 ms each).
    """
    from libcst.codemod.visitors import RemoveImportsVisitor
    from libcst.helpers import get_absolute_module_from_package_for_import, get_full_name_for_node
    from libcst.metadata import Assignment

    if isinstance(node, (cst.Import, cst.ImportFrom)):
        RemoveImportsVisitor.remove_unused_import_by_node(context, node)
        return
    scopes = context.wrapper._metadata[ScopeProvider] if context.wrapper is not None else {}

    def schedule(local: str, statement: Union[cst.Import, cst.ImportFrom]) -> None:
        names = statement.names
        if isinstance(names, cst.ImportStar):
            return
        module = None
        if isinstance(statement, cst.ImportFrom):
            module = get_absolute_module_from_package_for_import(context.full_package_name, statement)
            if module is None:
                raise ValueError("Cannot look up absolute module from relative import!")
        for alias in names:
            prefix = alias.evaluated_alias if alias.evaluated_alias is not None else alias.evaluated_name
            if local == prefix or local.startswith(f"{prefix}."):
                if module is None:
                    RemoveImportsVisitor.remove_unused_import(context, alias.evaluated_name, asname=alias.evaluated_alias)
                else:
                    RemoveImportsVisitor.remove_unused_import(
                        context, module, obj=alias.evaluated_name, asname=alias.evaluated_alias)

    for current in descendants(node):
        if not isinstance(current, (cst.Name, cst.Attribute)):
            continue
        local = get_full_name_for_node(current)
        scope = scopes.get(current)
        if local is None or scope is None:
            continue
        while True:
            for assignment in scope.assignments[current] or set():
                if isinstance(assignment, Assignment) and isinstance(assignment.node, (cst.Import, cst.ImportFrom)):
                    schedule(local, assignment.node)
            if scope is scope.parent:
                break
            scope = scope.parent
