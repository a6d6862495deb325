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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

import libcst as cst

from accelify import walk
from libcst.metadata import (
    CodePosition,
    CodeRange,
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
    ScopeProvider,
)

if TYPE_CHECKING:
    from libcst.codemod import CodemodContext
    from accelify.codemods.base import AccelifyCodemod

Block = Union[cst.Module, cst.IndentedBlock]
#: (statement, the original statement it comes from, None for an inserted one)
Item = tuple[cst.BaseStatement, Optional[cst.BaseStatement]]

_FIELDS: dict[type, tuple[str, ...]] = {}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


class LazyPositions:
    """``PositionProvider`` for the nodes asked about: the top-level statement holding a node
    is measured on its own (a module of that one statement) and shifted to its line."""

    def __init__(self, module: cst.Module, parents: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self._module = module
        self._parents = parents
        self._starts: Optional[dict[int, int]] = None
        self._measured: dict[int, Any] = {}

    def _top(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        parents = self._parents
        while True:
            parent = parents.get(node)
            if parent is None:
                return None
            if parent is self._module:
                return node
            node = parent

    def _start_lines(self) -> dict[int, int]:
        if self._starts is None:
            module = self._module
            line = 1 + sum(module.code_for_node(e).count("\n") for e in module.header)
            starts = {}
            for stmt in module.body:
                starts[id(stmt)] = line
                line += module.code_for_node(stmt).count("\n")
            self._starts = starts
        return self._starts

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        top = self._top(node)
        if top is None or not isinstance(top, cst.BaseStatement):
            return default
        measured = self._measured.get(id(top))
        if measured is None:
            one = self._module.with_changes(body=[top], header=[], footer=[], has_trailing_newline=True)
            measured = MetadataWrapper(one, unsafe_skip_copy=True).resolve(PositionProvider)
            self._measured[id(top)] = measured
        found = measured.get(node)
        if found is None:
            return default
        shift = self._start_lines()[id(top)] - 1
        return CodeRange(CodePosition(found.start.line + shift, found.start.column),
                         CodePosition(found.end.line + shift, found.end.column))

    def __getitem__(self, node: cst.CSTNode) -> Any:
        found = self.get(node)
        if found is None:
            raise KeyError(node)
        return found

    def __contains__(self, node: object) -> bool:
        return isinstance(node, cst.CSTNode) and self.get(node) is not None


_TARGET_OWNERS = (
    (cst.AssignTarget, "target"), (cst.AnnAssign, "target"), (cst.AugAssign, "target"), (cst.For, "target"),
    (cst.CompFor, "target"), (cst.AsName, "name"), (cst.NamedExpr, "target"),
)


class LazyExpressionContext:
    """``ExpressionContextProvider`` for ``Name`` and ``Attribute`` nodes, from the scope analysis
    (a name read is an access) and the node's place (an assignment or ``del`` target)."""

    def __init__(self, parents: dict[cst.CSTNode, cst.CSTNode], accesses: set[int]) -> None:
        self._parents = parents
        self._accesses = accesses

    def _target(self, node: cst.CSTNode) -> Optional[ExpressionContext]:
        child, parent = node, self._parents.get(node)
        while isinstance(parent, (cst.Tuple, cst.List, cst.StarredElement, cst.Element)):
            child, parent = parent, self._parents.get(parent)
        if isinstance(parent, cst.Del) and parent.target is child:
            return ExpressionContext.DEL
        for owner, field in _TARGET_OWNERS:
            if isinstance(parent, owner) and getattr(parent, field) is child:
                return ExpressionContext.STORE
        return None

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        if not isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
            return default
        target = self._target(node)
        if target is not None:
            return target
        if isinstance(node, cst.Name):
            return ExpressionContext.LOAD if id(node) in self._accesses else default
        return ExpressionContext.LOAD

    def __getitem__(self, node: cst.CSTNode) -> Any:
        found = self.get(node)
        if found is None:
            raise KeyError(node)
        return found


class LazyQualifiedNames:
    """``QualifiedNameProvider`` without its traversal of the whole tree: the names of a node
    are asked of its scope when first wanted, as that provider's own lazy values do; a node of
    the tree with no scope has none, and a node not of the tree is not a key."""

    def __init__(self, scopes: dict[cst.CSTNode, Any], index: walk.Index) -> None:
        self._scopes = scopes
        self._index = index
        self._known: dict[cst.CSTNode, Any] = {}

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        found = self._known.get(node)
        if found is not None:
            return found
        scope = self._scopes.get(node)
        if scope:
            found = scope.get_qualified_names_for(node)
        elif self._index.holds(node):
            found = set()
        else:
            return default
        self._known[node] = found
        return found

    def __getitem__(self, node: cst.CSTNode) -> Any:
        found = self.get(node, _MISSING)
        if found is _MISSING:
            raise KeyError(node)
        return found


_MISSING = object()


def _scopes(module: cst.Module, wrapper: MetadataWrapper) -> Any:
    """``ScopeProvider``'s metadata: its own traversal and that of the expression contexts it
    reads, run directly. Through the wrapper each would be wrapped in one more (batched) walk
    of the whole tree that does nothing else; a LibCST that works otherwise gets the wrapper."""
    contexts, scopes = ExpressionContextProvider(), ScopeProvider()
    if not all(hasattr(p, "_computed") and hasattr(p, "visit_Module") for p in (contexts, scopes)):
        return wrapper.resolve(ScopeProvider)
    contexts.visit_Module(module)
    scopes.metadata = {ExpressionContextProvider: contexts._computed}
    scopes.visit_Module(module)
    scopes.metadata = {}
    return scopes._computed


def resolve(module: cst.Module) -> MetadataWrapper:
    """A wrapper over ``module`` itself (no copy) with every provider accelify reads."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    wrapper._metadata[ScopeProvider] = _scopes(module, wrapper)  # type: ignore[assignment]
    index = walk.build(module)
    wrapper._metadata[QualifiedNameProvider] = LazyQualifiedNames(  # type: ignore[assignment]
        wrapper._metadata[ScopeProvider], index)
    walk.activate(index)  # the pipeline deactivates it when the file is done
    parents = index.parents
    accesses: set[int] = set()
    for scope in set(wrapper._metadata[ScopeProvider].values()):
        if scope is not None:
            accesses.update(id(a.node) for a in scope.accesses)
    wrapper._metadata[ParentNodeProvider] = parents  # type: ignore[assignment]
    wrapper._metadata[PositionProvider] = LazyPositions(module, parents)  # type: ignore[assignment]
    wrapper._metadata[ExpressionContextProvider] = LazyExpressionContext(parents, accesses)  # type: ignore[assignment]
    return wrapper


class Shared:
    """What the codemods of one run share: the edits recorded against original statements."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.module = wrapper.module
        self.metadata = wrapper._metadata
        self.removed: set[int] = set()  # original statements that go
        self.marked: dict[int, cst.CSTNode] = {}  # nodes handed to remove() (held: ids stay unique)
        self.replaced: set[int] = set()  # original statements a codemod replaced with new code
        self.emptied: dict[int, cst.CSTNode] = {}  # blocks left with a `pass` only
        self.results: dict[int, list[cst.BaseStatement]] = {}  # original statement -> what it became
        self.origin: dict[int, cst.BaseStatement] = {}  # id(statement of the new tree) -> original
        self.held: list[cst.CSTNode] = []  # nodes whose ids are keys above
        self.current: list[cst.CSTNode] = []  # original nodes being visited, innermost last
        self.codemods: dict[str, "AccelifyCodemod"] = {}
        #: ids of `accelerator` names written where they do not decide where the Accelerator goes
        self.quiet_uses: set[int] = set()
        #: decisions codemods ask of one another, computed once on first request
        self.vanishing: Optional[frozenset[int]] = None  # see AccelifyCodemod.vanishing
        self.device_creation: Optional[tuple[Optional[cst.BaseStatement]]] = None  # see RemoveDevice.creation_site

    def codemod(self, code: str) -> Optional["AccelifyCodemod"]:
        """The codemod with ``code`` in this run, if it runs."""
        return self.codemods.get(code)

    def origin_of(self, stmt: cst.CSTNode) -> Optional[cst.BaseStatement]:
        return self.origin.get(id(stmt))


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
