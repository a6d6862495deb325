"""Metadata resolved once per file: scopes by LibCST, parents and qualified names from one
light walk, positions and expression contexts only for the nodes somebody asks about."""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst
from libcst.metadata import (
    CodePosition,
    CodeRange,
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from accelify.queries import walk


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
