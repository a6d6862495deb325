"""Statements and blocks: walking a scope's statements, the blocks under a statement, what a
statement binds, the function or scope around a node."""

from __future__ import annotations

import re
from typing import Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m

from accelify.queries.names import assigned_names, code_of, qualified_names, root_name
from accelify.queries.refs import MODULE
from accelify.queries.walk import findall

Body = Union[cst.Module, cst.IndentedBlock]


# --------------------------------------------------------------------------
# statements and blocks


def iter_statements(
    body: Body, chain: tuple[Body, ...] = ()
) -> Iterator[tuple[cst.BaseStatement, tuple[Body, ...]]]:
    """Yield every statement in module scope with the blocks that contain it.

    Function and class bodies are not entered: they are other scopes.
    """
    chain = chain + (body,)
    for stmt in body.body:
        yield stmt, chain
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        for block in child_blocks(stmt):
            yield from iter_statements(block, chain)


def child_blocks(stmt: cst.BaseStatement) -> list[cst.IndentedBlock]:
    blocks: list[cst.IndentedBlock] = []
    if isinstance(stmt, cst.BaseCompoundStatement) and isinstance(stmt.body, cst.IndentedBlock):
        blocks.append(stmt.body)
    orelse = getattr(stmt, "orelse", None)
    while orelse is not None:
        if isinstance(orelse.body, cst.IndentedBlock):
            blocks.append(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    for handler in getattr(stmt, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            blocks.append(handler.body)
    final = getattr(stmt, "finalbody", None)
    if final is not None and isinstance(final.body, cst.IndentedBlock):
        blocks.append(final.body)
    return blocks


def simple_assign(stmt: cst.BaseStatement) -> Optional[cst.Assign]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        return stmt.body[0]
    return None


def _assigned_targets(stmt: cst.BaseStatement) -> list[cst.BaseExpression]:
    """The targets the assignments of a statement line bind (``a = b = ...``, ``x += 1``, ``n: int = 0``)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return []
    targets: list[cst.BaseExpression] = []
    for small in stmt.body:
        if isinstance(small, cst.Assign):
            targets += [t.target for t in small.targets]
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
            targets.append(small.target)
    return targets


def binds(stmt: cst.BaseStatement, names: set[str], reads: Optional[set[str]] = None) -> bool:
    """Does ``stmt`` (or a statement nested in it, same scope) assign one of ``names``, or an
    attribute of one (``args.cuda = ...`` changes what ``args.cuda`` reads after it)?

    With ``reads`` (the names and attribute chains some code reads, ``{"args.cuda"}``), an
    attribute assigned counts only when it is one of them, a part of one or inside one:
    ``args.start_epoch = 3`` leaves ``args.cuda`` alone."""
    for inner, _ in iter_statements(cst.IndentedBlock(body=[stmt])):
        # every assignment of the line: `args.cuda = ...; del args.no_cuda` binds `args.cuda` too
        for target in _assigned_targets(inner):
            if set(assigned_names(target)) & names:
                return True
            root = root_name(target) if isinstance(target, cst.Attribute) else None
            if root is None or root.value not in names:
                continue
            if reads is None:
                return True
            chain = code_of(target)
            if any(r == chain or r.startswith(chain + ".") or chain.startswith(r + ".") for r in reads):
                return True
    return False


def enclosing_function(visitor: cst.MetadataDependent, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The innermost function definition around ``node``, if any."""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return parent


def handed_values(visitor: cst.MetadataDependent, module: cst.Module, name: cst.Name
                  ) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """``name`` a parameter of a module-level function (``def save_checkpoint(state, is_best, filename)``): the
    function's calls in ``module`` and the value each hands it, by position or keyword (``save_checkpoint(
    {"state_dict": model.state_dict(), ...}, is_best)``); none for any other name."""
    function = enclosing_function(visitor, name)
    if function is None or not any(f is function for f in module.body):
        return []
    params = [p.name.value for p in function.params.params]
    if name.value not in params:
        return []
    position = params.index(name.value)
    found = []
    for call in findall(module, m.Call(func=m.Name(function.name.value))):
        args = call.args  # type: ignore[attr-defined]
        keyword = [a.value for a in args if a.keyword is not None and a.keyword.value == name.value]
        positional = [a.value for a in args if a.keyword is None]
        value = keyword[0] if keyword else positional[position] if position < len(positional) else None
        if value is not None:
            found.append((call, value))
    return found


def statement_line(visitor: cst.MetadataDependent, node: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
    """The simple statement line ``node`` is in (itself when it is one); None in a compound statement's
    header (an ``if`` test, a ``for`` target)."""
    from libcst.metadata import ParentNodeProvider

    current: Optional[cst.CSTNode] = node
    while current is not None and not isinstance(current, cst.SimpleStatementLine):
        current = visitor.get_metadata(ParentNodeProvider, current, None)
    return current


def under(visitor: cst.MetadataDependent, node: cst.CSTNode, kinds: tuple[type, ...]) -> bool:
    """Is ``node`` inside a node of one of ``kinds`` (``cst.If``, ``cst.Try``) of its own function (or of
    the module, outside any function)?"""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, kinds):
            return True
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return False


#: names that hold a rank, or say whether this process is the main one (`args.rank`, `gpu`, `master_process`)
_RANKISH = re.compile(r"(^|_)(rank|gpu|gpu_id|master|main_process|is_main|process_index|local_rank)($|_)", re.I)


def under_rank_test(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    """Inside an ``if`` (of its function) whose test reads a name spelled like a rank or a main-process
    flag (``if args.rank == 0:``, ``if gpu == 0:``): not every process gets there, whatever accelify
    recognised of it; a barrier there would wait for processes that never come."""
    from libcst.metadata import ParentNodeProvider

    child, parent = node, visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.If) and child is not parent.test and any(
            _RANKISH.search(n.value) for n in m.findall(parent.test, m.Name())  # type: ignore[attr-defined]
        ):
            return True
        child, parent = parent, visitor.get_metadata(ParentNodeProvider, parent, None)
    return False


def inside(visitor: cst.MetadataDependent, node: cst.CSTNode, ids: Union[set[int], frozenset[int]]) -> bool:
    """Is ``node``, or a node around it, one of ``ids``?"""
    from libcst.metadata import ParentNodeProvider

    current: Optional[cst.CSTNode] = node
    while current is not None:
        if id(current) in ids:
            return True
        current = visitor.get_metadata(ParentNodeProvider, current, None)
    return False


def opened_around(visitor: cst.MetadataDependent, node: cst.CSTNode, handle: str) -> Optional[tuple[cst.With, cst.Call]]:
    """The ``with open(path, ...) as handle:`` around ``node`` in its function, as (the ``with``, the ``open(...)``
    call), or None: a write into ``handle`` goes into a file every process running that code opens."""
    from libcst.metadata import ParentNodeProvider

    current = visitor.get_metadata(ParentNodeProvider, node, None)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
        if isinstance(current, cst.With):
            for item in current.items:
                if (item.asname is not None and m.matches(item.asname.name, m.Name(handle)) and isinstance(item.item, cst.Call)
                        and qualified_names(visitor, item.item.func) & {"builtins.open", "open"}):
                    return current, item.item
        current = visitor.get_metadata(ParentNodeProvider, current, None)
    return None


def scope_root(module: cst.Module, key: str) -> Union[cst.Module, cst.FunctionDef, None]:
    """The node whose body is the scope ``key``: the module, or a (possibly nested) function."""
    if key == MODULE:
        return module
    body: Sequence[cst.BaseStatement] = module.body
    found: Optional[cst.CSTNode] = None
    for part in key.split("."):
        found = next((s for s in body if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == part), None)
        if found is None:
            return None
        body = found.body.body if isinstance(found.body, cst.IndentedBlock) else ()
    return found if isinstance(found, cst.FunctionDef) else None


_EXITS = m.Expr(m.Call(func=m.Name("exit") | m.Name("quit") | m.Attribute(value=m.Name("sys"), attr=m.Name("exit"))))


def _leaves(stmt: cst.SimpleStatementLine) -> bool:
    """``raise ...``, ``return``, ``sys.exit(...)``: the path ends here."""
    return any(isinstance(small, (cst.Raise, cst.Return)) or m.matches(small, _EXITS) for small in stmt.body)


def bound_on_all_paths(stmts: Sequence[cst.BaseStatement], name: str, exhaustive=None) -> bool:
    """Is ``name`` bound whatever path runs through ``stmts`` (both branches of an if/else, the
    body of a ``with`` or ``try``)? A path that raises or leaves (``else: raise ValueError(...)``
    after an ``if``/``elif`` per choice of an option) never reaches ``prepare``: it counts as bound."""
    for stmt in stmts:
        if isinstance(stmt, cst.SimpleStatementLine) and (binds(stmt, {name}) or _leaves(stmt)):
            return True
        if isinstance(stmt, cst.If) and exhaustive is not None and exhaustive(stmt):
            branches_ = []
            node_: object = stmt
            while isinstance(node_, cst.If):
                branches_.append(node_.body)
                node_ = node_.orelse
            if all(isinstance(b, cst.IndentedBlock) and bound_on_all_paths(b.body, name, exhaustive) for b in branches_):
                return True
        if isinstance(stmt, cst.If) and stmt.orelse is not None:
            branches = [stmt.body, stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else None]
            orelse = stmt.orelse
            if isinstance(orelse, cst.If):  # elif: the rest of the chain is one statement
                branches[1] = cst.IndentedBlock(body=[orelse])
            if all(isinstance(b, cst.IndentedBlock) and bound_on_all_paths(b.body, name, exhaustive) for b in branches):
                return True
        if isinstance(stmt, (cst.With, cst.Try)) and isinstance(stmt.body, cst.IndentedBlock):
            if bound_on_all_paths(stmt.body.body, name, exhaustive):
                return True
    return False


def is_docstring(statement: cst.BaseStatement) -> bool:
    """A string alone on its line (a docstring where it opens a body)."""
    return m.matches(statement, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]))
