"""References: a training object is known by ``(scope key, name)``; what a name or attribute
refers to, and the values assigned to it."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import BuiltinScope, ClassScope, FunctionScope, GlobalScope, ScopeProvider

# --------------------------------------------------------------------------
# references: a training object is known by (scope key, name)

MODULE = "<module>"
#: how converted code (and hand-written Accelerate code) spells the Accelerator
ACCELERATOR_SPELLINGS = ("accelerator", "self.accelerator")
Ref = tuple[str, str]


def scope_key(scope: object) -> str:
    """``"<module>"``, ``"main"``, ``"Trainer.fit"``: stable across passes, unlike scope objects."""
    names: list[str] = []
    while scope is not None and not isinstance(scope, GlobalScope):
        if isinstance(scope, BuiltinScope):
            return "<builtins>"
        if isinstance(scope, (FunctionScope, ClassScope)):
            names.append(scope.name or "?")
        parent = getattr(scope, "parent", None)
        scope = None if parent is scope else parent
    return ".".join(reversed(names)) or MODULE


def key_at(visitor: cst.MetadataDependent, node: cst.CSTNode) -> Optional[str]:
    """The key of the function (or module) whose code ``node`` is."""
    scope = visitor.get_metadata(ScopeProvider, node, None)
    return None if scope is None else scope_key(scope)


def ref_of(visitor: cst.MetadataDependent, expr: cst.CSTNode) -> Optional[Ref]:
    """``model`` -> ``("main", "model")``; ``self.model`` -> ``("Trainer", "self.model")``.

    ``None`` when the expression is not a plain name or ``self`` attribute, or when
    the name can be bound in more than one scope.
    """
    if isinstance(expr, cst.Name):
        scope = visitor.get_metadata(ScopeProvider, expr, None)
        if scope is None:
            return None
        assignments = scope[expr.value]
        owners = {id(a.scope): a.scope for a in assignments}
        if len(owners) != 1:
            return None
        owner = next(iter(owners.values()))
        if isinstance(owner, GlobalScope) and assignments:
            # `global model` in `main`, which alone assigns it (vdsr): the name belongs to `main`, where the
            # objects are built and prepared, as if it were local there
            nodes = [getattr(a, "node", None) for a in assignments]
            where = {id(s): s for n in nodes if (s := visitor.get_metadata(ScopeProvider, n, None)) is not None}
            inner = next(iter(where.values()), None)
            if len(where) == 1 and isinstance(inner, FunctionScope) and all(n is not None for n in nodes):
                return scope_key(inner), expr.value
        return scope_key(owner), expr.value
    if m.matches(expr, m.Attribute(value=m.Name("self"), attr=m.Name())):
        scope = visitor.get_metadata(ScopeProvider, expr.value, None)  # type: ignore[attr-defined]
        if isinstance(scope, FunctionScope) and isinstance(scope.parent, ClassScope):
            return scope_key(scope.parent), f"self.{expr.attr.value}"  # type: ignore[attr-defined]
        parent = getattr(scope, "parent", None)  # a comprehension or nested function in a method
        while parent is not None and not isinstance(parent, (ClassScope, GlobalScope)):
            parent = getattr(parent, "parent", None)
        if isinstance(parent, ClassScope):
            return scope_key(parent), f"self.{expr.attr.value}"  # type: ignore[attr-defined]
    return None


def assigned_values(visitor: cst.MetadataDependent, name: cst.Name) -> list[cst.BaseExpression]:
    """The values ``name`` is assigned in its scope by ``name = value`` (``params = [...]`` for
    ``Adam(params)``, ``state = {...}`` for ``torch.save(state, path)``)."""
    from libcst.metadata import ParentNodeProvider

    scope = visitor.get_metadata(ScopeProvider, name, None)
    values = []
    for assignment in scope[name.value] if scope is not None else ():
        node = getattr(assignment, "node", None)
        target = visitor.get_metadata(ParentNodeProvider, node, None) if isinstance(node, cst.Name) else None
        if isinstance(target, cst.Element):  # `total, bar = 0, tqdm(loader)`: the value in the same place
            packed = visitor.get_metadata(ParentNodeProvider, target, None)
            holder = visitor.get_metadata(ParentNodeProvider, packed, None)
            assign = visitor.get_metadata(ParentNodeProvider, holder, None) if isinstance(holder, cst.AssignTarget) else None
            if isinstance(packed, (cst.Tuple, cst.List)) and isinstance(assign, cst.Assign) and isinstance(
                    assign.value, (cst.Tuple, cst.List)) and len(assign.value.elements) == len(packed.elements) \
                    and not any(isinstance(e, cst.StarredElement) for e in (*packed.elements, *assign.value.elements)):
                values.append(assign.value.elements[packed.elements.index(target)].value)
            continue
        assign = visitor.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        if isinstance(assign, cst.Assign):
            values.append(assign.value)
    return values


def bound_once(visitor: cst.MetadataDependent, name: cst.Name) -> Optional[cst.BaseExpression]:
    """The value ``name`` is assigned, when its scope binds it exactly once, by ``name = value`` (``gpu =
    args.gpu``, ``device_str = "cuda"``); None otherwise."""
    values = assigned_values(visitor, name)
    scope = visitor.get_metadata(ScopeProvider, name, None)
    if len(values) != 1 or scope is None or len(scope[name.value]) != 1:
        return None
    return values[0]


def receiver_refs(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Iterator[Ref]:
    """Refs along a receiver chain: ``self.model.encoder[0]`` yields ``self.model``'s ref."""
    while True:
        ref = ref_of(visitor, expr)
        if ref is not None:
            yield ref
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        else:
            return
