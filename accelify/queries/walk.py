"""``findall`` over the original tree without a traversal.

``libcst.matchers.findall`` visits the whole subtree (and rebuilds every node of it
on the way) for each question; accelify asks thousands of them per file.  The
original tree is indexed once (pre-order, each node's subtree as a range, the
nodes of each type), so a question costs the nodes of the asked type in the
subtree.  Nodes outside the indexed tree (code a codemod wrote) fall back to
LibCST's own ``findall``.
"""

from __future__ import annotations

import bisect
from typing import Optional, Sequence

import libcst as cst
import libcst.matchers as m


class Index(cst.CSTVisitor):
    """Parents, pre-order and subtree ranges of one tree, from a single traversal."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: list[cst.CSTNode] = []
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}
        self.by_type: dict[type, list[int]] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[node] = self._stack[-1]
        i = len(self.order)
        self.order.append(node)
        self.start[id(node)] = i
        self.by_type.setdefault(type(node), []).append(i)
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        self.end[id(original_node)] = len(self.order)

    def holds(self, node: cst.CSTNode) -> bool:
        """``node`` is a node of the indexed tree."""
        start = self.start.get(id(node))
        return start is not None and self.order[start] is node

    def positions(self, tree: cst.CSTNode, cls: type) -> Optional[list[int]]:
        """Pre-order positions of the ``cls`` nodes in ``tree`` (None: ``tree`` is not indexed)."""
        if not self.holds(tree):
            return None
        found = self.by_type.get(cls, [])
        return found[bisect.bisect_left(found, self.start[id(tree)]):bisect.bisect_left(found, self.end[id(tree)])]

    def of_type(self, tree: cst.CSTNode, cls: type) -> Optional[list[cst.CSTNode]]:
        """The ``cls`` nodes in ``tree``, in pre-order (None: ``tree`` is not indexed)."""
        found = self.positions(tree, cls)
        return None if found is None else [self.order[i] for i in found]

    # no `visit_<Node>_<attribute>` hooks: skip LibCST's per-field lookups
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None


_ACTIVE: Optional[Index] = None


def build(module: cst.Module) -> Index:
    index = Index()
    module.visit(index)
    return index


def activate(index: Optional[Index]) -> None:
    """Answer ``findall`` from ``index`` until ``activate(None)`` (the pipeline does it per file)."""
    global _ACTIVE
    _ACTIVE = index


def active() -> Optional[Index]:
    return _ACTIVE


def _types(matcher: object) -> Optional[Sequence[type]]:
    """The node types a matcher can match, when it says (None: any)."""
    if isinstance(matcher, m.OneOf):
        out: list[type] = []
        for option in matcher.options:
            found = _types(option)
            if found is None:
                return None
            out.extend(found)
        return out
    if isinstance(matcher, m.BaseMatcherNode):
        cls = getattr(cst, type(matcher).__name__, None)
        if isinstance(cls, type) and issubclass(cls, cst.CSTNode):
            return [cls]
    return None


def in_source_order(nodes: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
    """``nodes`` in the order they are written (pre-order of the active index), for what LibCST hands out
    as a set (a name's references): a report must not name one or another of them from run to run. As given
    where no index holds them."""
    index = _ACTIVE
    if index is None or not all(index.holds(n) for n in nodes):
        return list(nodes)
    return sorted(nodes, key=lambda n: index.start[id(n)])


def findall(tree: cst.CSTNode, matcher: object) -> Sequence[cst.CSTNode]:
    """``libcst.matchers.findall(tree, matcher)``, in the same (pre-)order."""
    index = _ACTIVE
    if index is None or not index.holds(tree):
        return m.findall(tree, matcher)  # type: ignore[arg-type]
    types = _types(matcher)
    if types is None:
        candidates: Sequence[int] = range(index.start[id(tree)], index.end[id(tree)])
    else:
        picked = [i for cls in types for i in index.positions(tree, cls) or ()]
        candidates = sorted(picked) if len(types) > 1 else picked
    order = index.order
    return [order[i] for i in candidates if m.matches(order[i], matcher)]  # type: ignore[arg-type]
