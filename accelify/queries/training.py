"""What trains: the functions that call ``.backward()``, the statements that run them, and the
setup block where the training objects are built."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from accelify.queries.blocks import Body, binds, child_blocks
from accelify.queries.names import param_names, root_name
from accelify.queries.walk import findall, in_source_order


def direct_calls(visitor: cst.MetadataDependent, scope_of: cst.CSTNode, name: str,
                 only: Optional[cst.CSTNode] = None) -> list[cst.Call]:
    """The calls of ``name`` as bound in the scope of ``scope_of`` (a function or class defined
    there): every use of the binding, each the callee of a call. Empty when a use is anything
    else (the function is handed on), or, with ``only``, when the name is bound to something
    other than ``only`` too."""
    from libcst.metadata import ParentNodeProvider

    scope = visitor.get_metadata(ScopeProvider, scope_of, None)
    if scope is None:
        return []
    calls = []
    for assignment in scope.assignments[name]:
        if only is not None and getattr(assignment, "node", None) is not only:
            return []
        for access in assignment.references:
            call = visitor.get_metadata(ParentNodeProvider, access.node, None)
            if not isinstance(call, cst.Call) or call.func is not access.node:
                return []
            calls.append(call)
    return in_source_order(calls)  # the references are a set


def setup_blocks(root: Union[cst.Module, cst.FunctionDef]) -> Iterator[Body]:
    """Module-scope blocks where training objects can be set up, outermost first.

    Loop bodies, functions and classes are not entered: objects built there are
    not the script's one set of training objects.
    """

    def inside(stmt: cst.BaseStatement) -> Iterator[Body]:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
            return
        for child in child_blocks(stmt):
            yield child
            for inner in child.body:
                yield from inside(inner)

    top = root if isinstance(root, cst.Module) else root.body
    if not isinstance(top, (cst.Module, cst.IndentedBlock)):
        return
    yield top
    for stmt in top.body:
        yield from inside(stmt)


BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
#: ``x.load_state_dict(...)``
LOAD_STATE_DICT = m.Call(func=m.Attribute(attr=m.Name("load_state_dict")))
#: ``accelerator.unwrap_model(model)``
UNWRAP_MODEL = m.Call(func=m.Attribute(attr=m.Name("unwrap_model")), args=[m.Arg()])


_TRAINERS: list[tuple[cst.Module, frozenset[str]]] = []  # the last module asked about (one file at a time)


def trainer_functions(module: cst.Module) -> set[str]:
    """Names of the module's functions and methods that train: they run a backward, or call
    (by name) one that does. ``train(model, loader)``, ``trainer.fit()``."""
    if _TRAINERS and _TRAINERS[0][0] is module:
        return set(_TRAINERS[0][1])
    found = _trainer_functions(module)
    _TRAINERS[:] = [(module, frozenset(found))]
    return found


def _trainer_functions(module: cst.Module) -> set[str]:
    defs: dict[str, list[cst.FunctionDef]] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            defs.setdefault(stmt.name.value, []).append(stmt)
        elif isinstance(stmt, cst.ClassDef):
            for inner in stmt.body.body:
                if isinstance(inner, cst.FunctionDef):
                    defs.setdefault(inner.name.value, []).append(inner)
    found = {name for name, funcs in defs.items() if any(findall(f, BACKWARD) for f in funcs)}
    changed = True
    while changed:
        changed = False
        for name, funcs in defs.items():
            if name not in found and any(_calls_any(f, found) for f in funcs):
                found.add(name)
                changed = True
    return found


def _calls_any(node: cst.CSTNode, names: set[str], objects: frozenset[str] = frozenset()) -> bool:
    """A call of one of ``names``; a method call on one of ``objects`` (``model.train()`` is
    ``nn.Module.train``, whatever a trainer class calls its own methods) does not count."""
    for call in findall(node, m.Call(func=m.Name() | m.Attribute())):
        func = call.func  # type: ignore[attr-defined]
        if isinstance(func, cst.Attribute):
            root = root_name(func.value)
            if root is not None and root.value in objects:
                continue
            if func.attr.value == "train" and len(call.args) == 1 and m.matches(  # type: ignore[attr-defined]
                    call.args[0].value, m.Name("True") | m.Name("False")):  # type: ignore[attr-defined]
                continue  # `g_running.train(False)`: `nn.Module.train(mode)`, whatever the object
        name = func.value if isinstance(func, cst.Name) else func.attr.value
        if name in names:
            return True
    return False


def trains(stmt: cst.BaseStatement, trainers: set[str], objects: frozenset[str] = frozenset()) -> bool:
    """Does running ``stmt`` train: a backward in it, or a call of a function that trains?
    (A definition runs nothing until it is called.)"""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return False
    return bool(findall(stmt, BACKWARD)) or _calls_any(stmt, trainers, objects)


def locate_setup(
    root: Union[cst.Module, cst.FunctionDef], names: set[str], trainers: Optional[set[str]] = None,
    ignore: frozenset[int] = frozenset(), created: frozenset[int] = frozenset(), created_name: str = "",
    touches: frozenset[str] = frozenset(),
) -> Optional[tuple[Body, int]]:
    """The deepest block that binds every name, and the index just after the last binding.

    With ``trainers``, only bindings before the first statement that trains count: the
    objects training uses are the ones bound before it (a model bound again after training,
    to reload a checkpoint for a test, is another object).  The conversion changes what some
    statements bind: those in ``ignore`` bind nothing, those in ``created`` bind ``created_name``.

    ``touches`` (an evaluation: the models it runs): statements that only call methods of one of
    them (``model.load_state_dict(...)``, ``model.eval()``) count as binding it, and the setup ends
    at the first statement that hands one of ``names`` to a call or loops over one.
    """

    def binding(stmt: cst.BaseStatement, wanted: set[str]) -> bool:
        if id(stmt) in ignore:
            return False
        if id(stmt) in created and created_name in wanted:
            return True
        return binds(stmt, wanted) or bool(touches and _touches(stmt, touches & wanted))

    best: Optional[tuple[Body, int]] = None
    for block in setup_blocks(root):  # outermost first: a later match is nested in an earlier one
        end = len(block.body)
        if trainers is not None:
            end = next((i for i, stmt in enumerate(block.body) if trains(stmt, trainers, frozenset(names))), end)
        if touches:
            end = next((i for i, stmt in enumerate(block.body[:end]) if _runs(stmt, names)), end)
        hits = [i for i, stmt in enumerate(block.body[:end]) if binding(stmt, names)]
        if hits and all(any(binding(block.body[i], {n}) for i in hits) for n in names):
            best = (block, hits[-1] + 1)
    return best


def built_at_top(func: cst.FunctionDef, names: set[str], trainers: set[str]) -> Optional[tuple[Body, int]]:
    """The function's own body and the index just after its last statement that binds one of ``names``
    before the first that trains (``if ...: optimizer = Adadelta(...) else: optimizer = Adam(...)``
    counts as one statement); None when none does, or the body is a one-line suite.  A method call on a
    parameter (``net.train()``, ``nn.Module.train``) trains nothing."""
    body = func.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    objects = frozenset(names) | set(param_names(func))
    end = next((i for i, stmt in enumerate(body.body) if trains(stmt, trainers, objects)), len(body.body))
    hits = [i for i, stmt in enumerate(body.body[:end]) if binds(stmt, names)]
    return (body, hits[-1] + 1) if hits else None


def _touches(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """``model.load_state_dict(...)``, ``model.to(device)``: a line of calls of methods of ``names``."""
    if not names or not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
               and isinstance(small.value.func, cst.Attribute)
               and isinstance(small.value.func.value, cst.Name) and small.value.func.value.value in names
               for small in stmt.body)


def _runs(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """An evaluation starts here: ``stmt`` loops over one of ``names`` or hands one to a call
    (``evaluate(model, loader)``), without binding one (``model = nn.DataParallel(model)``)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or binds(stmt, names):
        return False
    for loop in findall(stmt, m.For()):
        if any(n.value in names for n in findall(loop.iter, m.Name())):  # type: ignore[attr-defined]
            return True
    return any(isinstance(arg.value, cst.Name) and arg.value.value in names
               for call in findall(stmt, m.Call()) for arg in call.args)  # type: ignore[attr-defined]


def bound_again(after: Sequence[cst.BaseStatement], names: set[str], trainers: set[str]) -> list[cst.BaseStatement]:
    """The statements after the ``prepare`` point that may bind a training object again: all of
    them but the first that trains, which hands the trained model back (``model = train(model)``)."""
    start = next((i for i, stmt in enumerate(after) if trains(stmt, trainers, frozenset(names))), None)
    return [stmt for i, stmt in enumerate(after) if i != start]


def rebound_region(
    block: Body, index: int, names: set[str], rebound: set[str], trainers: set[str],
    ignore: frozenset[int] = frozenset(),
) -> list[cst.BaseStatement]:
    """The setup block's statements from the first that binds one of ``rebound`` again after the
    ``prepare`` point (``index``): ``model = Net()`` to reload a checkpoint, a plain model from there on."""
    after = bound_again(block.body[index:], names, trainers)
    first = next((i for i, stmt in enumerate(after) if id(stmt) not in ignore and binds(stmt, rebound)), len(after))
    return after[first:]
