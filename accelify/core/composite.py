"""One analysis, one edit pass.

Metadata is resolved once, on the original tree: scope and qualified names by
LibCST, parents by one light walk, positions and expression contexts only for
the nodes somebody asks about.  Every codemod then sees the *original* nodes
(whose metadata is known) in a single traversal: at each node the codemods'
``visit_*`` run in order on the way down and their ``leave_*`` on the way up,
each handed what the ones before it made of the node.  Statements removed,
replaced or inserted are recorded against the original statements and every
block is rebuilt once, when the traversal leaves it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import libcst as cst
from libcst.metadata import (
    QualifiedNameProvider,
    QualifiedNameSource,
)

from accelify.codemods.base import Shared
from accelify.queries import walk
from accelify.queries.trees import Block, Item

if TYPE_CHECKING:
    from accelify.codemods.base import AccelifyCodemod
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: Names a codemod may act on without an import or a name of the plan in sight (``.to(``,
#: ``.backward()``, ``print``, ``open``, a ``download=`` keyword, ...).
TRIGGERS = frozenset({
    "to", "cuda", "cpu", "module", "backward", "save", "load", "state_dict", "load_state_dict", "save_pretrained",
    "from_pretrained", "print", "open", "download", "scale", "step", "update", "unscale_", "zero_grad", "device",
    "accelerator", "Accelerator", "tqdm", "trange", "makedirs", "mkdir", "exists", "isdir", "seed", "manual_seed",
    "parameters", "named_parameters", "DataParallel", "DistributedDataParallel", "autocast", "GradScaler", "numpy",
})

#: Skip the definitions nothing can change (see :meth:`Composite._inert`); off to compare.
SKIP_INERT = True


def plan_names(plan: object) -> set[str]:
    """Every identifier the plan mentions (objects, devices, helpers, scopes, flags)."""
    out: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, str):
            out.update(_IDENTIFIER.findall(value))
        elif isinstance(value, dict):
            for k, v in value.items():
                collect(k)
                collect(v)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                collect(v)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                collect(getattr(value, f.name))

    for f in dataclasses.fields(plan):  # type: ignore[arg-type]
        if f.name != "findings":
            collect(getattr(plan, f.name))
    return out


class Composite(cst.CSTTransformer):
    """Runs every codemod in one traversal of the original tree."""

    def __init__(self, codemods: Sequence["AccelifyCodemod"], shared: Shared, relevant: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.codemods = list(codemods)
        self.shared = shared
        self._relevant = relevant | TRIGGERS
        self._visitors: dict[type, list[Callable]] = {}
        self._leavers: dict[type, list[tuple["AccelifyCodemod", Callable]]] = {}
        self._editors = [c for c in self.codemods if type(c).edit_body is not _default_edit_body()]

    def _visit_methods(self, cls: type) -> list[Callable]:
        found = self._visitors.get(cls)
        if found is None:
            name = f"visit_{cls.__name__}"
            found = [getattr(c, name) for c in self.codemods if hasattr(c, name)]
            self._visitors[cls] = found
        return found

    def _leave_methods(self, cls: type) -> list[tuple["AccelifyCodemod", Callable]]:
        found = self._leavers.get(cls)
        if found is None:
            name = f"leave_{cls.__name__}"
            found = [(c, getattr(c, name)) for c in self.codemods if hasattr(c, name)]
            self._leavers[cls] = found
        return found

    # no codemod has `visit_<Node>_<attribute>` hooks: skip LibCST's per-field lookups
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.shared.current.append(node)
        for method in self._visit_methods(type(node)):
            method(node)
        return not (SKIP_INERT and isinstance(node, (cst.FunctionDef, cst.ClassDef)) and self._inert(node))

    def _inert(self, node: cst.CSTNode) -> bool:
        """A definition no codemod can change or report on: it reads no import, no name of the plan
        and none of the :data:`TRIGGERS` (a helper of plain Python). Its subtree is not visited."""
        index = walk.active()
        names = index.of_type(node, cst.Name) if index is not None else None
        if names is None:
            return False
        qualified = self.shared.metadata[QualifiedNameProvider]
        for name in names:
            if name.value in self._relevant:  # type: ignore[attr-defined]
                return False
            found = qualified.get(name)
            if found and any(q.source is QualifiedNameSource.IMPORT for q in found):
                return False
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        shared = self.shared
        result: Any = updated_node
        kind = type(original_node)
        statement = isinstance(original_node, cst.BaseStatement)
        leavers = self._leave_methods(kind)
        for i, (_, method) in enumerate(leavers):
            result = method(original_node, result)
            if id(result) in shared.marked:
                shared.removed.add(id(original_node))
            if type(result) is not kind or (statement and id(original_node) in shared.replaced):
                for codemod, _ in leavers[i + 1:]:  # what comes next sees new code, not this node
                    codemod.abandon(original_node)
                break
        if isinstance(original_node, (cst.IndentedBlock, cst.Module)) and type(result) is kind:
            result = self._rebuild_block(original_node, result)
        if statement:
            if isinstance(result, cst.FlattenSentinel):
                made = list(result.nodes)
            elif isinstance(result, cst.RemovalSentinel):
                made = []
            else:
                made = [result]
            shared.results[id(original_node)] = made
        shared.current.pop()
        return result

    # ------------------------------------------------------------------ blocks
    def _rebuild_block(self, original: Block, updated: Block) -> Block:
        shared = self.shared
        from accelify.codemods.base import merge_leading_lines

        items: list[Item] = []
        pending: list[cst.EmptyLine] = []
        changed = False
        for stmt in original.body:
            made = shared.results.get(id(stmt), [stmt])
            if id(stmt) in shared.removed:
                changed = True
                for node in made:
                    pending = merge_leading_lines(pending, node.leading_lines)
                continue
            for node in made:
                if pending:
                    node = node.with_changes(leading_lines=merge_leading_lines(pending, node.leading_lines))
                    pending = []
                items.append((node, stmt))
        leftover = pending if any(line.comment is not None for line in pending) else []
        for codemod in self._editors:
            edited = codemod.edit_body(original, items)
            if edited is not items:
                changed = True
                items = edited
        if not changed:
            for node, origin in items:
                self._record(node, origin)
            return updated
        if not items:
            block = updated.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=leftover)])
            shared.emptied[id(block)] = block
            return block
        for node, origin in items:
            self._record(node, origin)
        return updated.with_changes(body=[node for node, _ in items], footer=[*leftover, *updated.footer])

    def _record(self, node: cst.BaseStatement, origin: Optional[cst.BaseStatement]) -> None:
        if origin is not None:
            self.shared.origin[id(node)] = origin
            self.shared.held.append(node)


def _default_edit_body() -> Callable:
    from accelify.codemods.base import AccelifyCodemod

    return AccelifyCodemod.edit_body
