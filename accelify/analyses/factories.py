"""Training objects built by a factory: prepared where the factory's result is unpacked.

The PyTorch DDP tutorial series (and many scripts after it) builds its objects in a helper::

    def load_train_objs():
        train_set = MyTrainDataset(2048)
        model = torch.nn.Linear(20, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        return train_set, model, optimizer

    def main(...):
        dataset, model, optimizer = load_train_objs()
        train_data = prepare_dataloader(dataset, batch_size)
        ...

or returns them in a dict the caller reads key by key (``objects = build(cfg)``, ``model =
objects["model"].to(device)``, ``optimizer = objects["optimizer"]``). An Accelerator created in the factory
would not reach the code that trains, so the objects are prepared where they are unpacked: the optimizers become the caller's names, each training the
caller's name for the model the factory returned at the same position.  Only for a plain
module-level function with one ``return`` of names (or of a dict of names under string keys) at its end,
called once, as a statement that unpacks every returned value into plain names (or binds the dict, read only
as ``name = objects["key"]``), returning nothing but its optimizers, the models
they train, and other values no analysis prepares (a dataset): a scheduler or a DataLoader it
returned would need a decision this module does not make, so the file stays as it was (ACC107).

Input: the facts and the optimizers found where they are built.  Output: the optimizers as the
caller binds them (or the ones given, unchanged, when the factory is not that simple).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.facts import Facts, chain_root
from accelify.analyses.objects import Optimizers, _model_ref
from accelify.queries.names import DATALOADERS, has_qname
from accelify.queries.refs import ref_of
from accelify.queries.training import BACKWARD
from accelify.queries.walk import findall


def redirect(facts: Facts, optimizers: Optimizers) -> Optimizers:
    """The optimizers as the one caller of their factory unpacks them; ``optimizers`` when they are
    not built by such a factory."""
    keys = {ref[0] for ref in optimizers}
    if len(keys) != 1:
        return optimizers
    key = keys.pop()
    func = facts.functions.get(key)
    if func is None or func.decorators or findall(func.body, BACKWARD):
        return optimizers
    seen_as = _unpacked(facts, func)
    if seen_as is None:
        return optimizers
    returned, caller = seen_as
    redirected: Optimizers = {}
    models: set[str] = set()
    for ref, (_, trained) in optimizers.items():
        if ref[1] not in caller:
            return optimizers  # an optimizer the factory keeps to itself
        new_models = []
        for model in trained:
            model_ref = _model_ref(facts, model)
            if model_ref is None or model_ref[0] != key or model_ref[1] not in caller:
                return optimizers  # it trains a model the caller never sees
            models.add(model_ref[1])
            new_models.append(caller[model_ref[1]][1])
        assign, target = caller[ref[1]]
        caller_ref = ref_of(facts, target)
        if caller_ref is None:
            return optimizers
        redirected[caller_ref] = (assign, new_models)
    others = [name for name in returned if name not in models and (key, name) not in optimizers]
    if any(not _plain_value(facts, key, name, {r[1] for r in optimizers}) for name in others):
        return optimizers
    return redirected


def _unpacked(facts: Facts, func: cst.FunctionDef) -> Optional[tuple[list[str], dict[str, tuple[cst.Assign, cst.Name]]]]:
    """What ``func`` returns (its names) and, for each the caller binds, the caller's assignment and name: ``a, b, c
    = func(...)`` for ``return a, b, c``; ``objects = func(...)`` then ``model = objects["model"]`` (a method chain
    after it allowed: ``objects["model"].to(device)``) for ``return {"model": model, ...}``, every use of
    ``objects`` such a read. None for any other shape."""
    returned = _returned_names(facts, func)
    if returned is not None:
        unpack = _single_unpacking_call(facts, func)
        if unpack is None or len(unpack[1]) != len(returned):
            return None
        assign, targets = unpack
        return returned, {name: (assign, target) for name, target in zip(returned, targets)}
    keyed = _returned_dict(facts, func)
    unpack = _single_unpacking_call(facts, func) if keyed is not None else None
    if keyed is None or unpack is None or len(unpack[1]) != 1:
        return None
    holder = unpack[1][0]
    reads = _keyed_reads(facts, holder)
    if reads is None:
        return None
    caller = {keyed[k]: found for k, found in reads.items() if k in keyed}
    if len(caller) != len(reads):
        return None  # a key the factory does not return
    return list(keyed.values()), caller


def _returned_dict(facts: Facts, func: cst.FunctionDef) -> Optional[dict[str, str]]:
    """``return {"model": model, "optimizer": optimizer}`` as the last statement and the only return: key -> name."""
    returned = _last_return(facts, func)
    if returned is None or not isinstance(returned.value, cst.Dict):
        return None
    keyed: dict[str, str] = {}
    for element in returned.value.elements:
        if not (isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
                and isinstance(element.value, cst.Name)) or element.key.evaluated_value in keyed:
            return None
        keyed[str(element.key.evaluated_value)] = element.value.value
    return keyed or None


def _keyed_reads(facts: Facts, holder: cst.Name) -> Optional[dict[str, tuple[cst.Assign, cst.Name]]]:
    """Every use of the dict ``holder`` (bound once) is ``name = holder["key"]`` (a method chain after the read
    allowed), alone on its line, each key once: key -> (the assignment, its name)."""
    scope = facts.get_metadata(ScopeProvider, holder, None)
    if scope is None:
        return None
    bindings = list(scope.assignments[holder.value])
    if len(bindings) != 1:
        return None
    reads: dict[str, tuple[cst.Assign, cst.Name]] = {}
    for access in bindings[0].references:
        read = facts.get_metadata(ParentNodeProvider, access.node, None)
        if not (isinstance(read, cst.Subscript) and read.value is access.node and len(read.slice) == 1
                and isinstance(read.slice[0].slice, cst.Index) and isinstance(read.slice[0].slice.value, cst.SimpleString)):
            return None
        key = str(read.slice[0].slice.value.evaluated_value)
        up = facts.get_metadata(ParentNodeProvider, read, None)
        while isinstance(up, (cst.Attribute, cst.Call)):  # objects["model"].to(device)
            up = facts.get_metadata(ParentNodeProvider, up, None)
        if not (isinstance(up, cst.Assign) and chain_root(up.value) is read and len(up.targets) == 1
                and isinstance(up.targets[0].target, cst.Name)) or key in reads:
            return None
        reads[key] = (up, up.targets[0].target)  # type: ignore[assignment]
    return reads


def _returned_names(facts: Facts, func: cst.FunctionDef) -> Optional[list[str]]:
    """``return a, b, c`` as the last statement and the only return: the names, in order."""
    returned = _last_return(facts, func)
    if returned is None:
        return None
    value = returned.value
    elements = value.elements if isinstance(value, cst.Tuple) else [value] if value is not None else []
    names = []
    for element in elements:
        node = element.value if isinstance(element, cst.Element) else element
        if not isinstance(node, cst.Name):
            return None
        names.append(node.value)
    return names or None


def _last_return(facts: Facts, func: cst.FunctionDef) -> Optional[cst.Return]:
    """The function's one ``return`` (its own, not a nested function's), when it is its last statement."""
    returns = [r for r in findall(func.body, m.Return()) if _own(facts, r, func)]
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
    if len(returns) != 1 or not body:
        return None
    last = body[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and last.body[0] is returns[0]):
        return None
    return returns[0]


def _own(facts: Facts, node: cst.CSTNode, func: cst.FunctionDef) -> bool:
    """``node`` belongs to ``func`` itself, not to a function nested in it."""
    parent = facts.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        parent = facts.get_metadata(ParentNodeProvider, parent, None)
    return parent is func


def _single_unpacking_call(facts: Facts, func: cst.FunctionDef) -> Optional[tuple[cst.Assign, list[cst.Name]]]:
    """The one use of ``func``: ``a, b, c = func(...)`` (or ``a = func(...)``) alone on its line."""
    uses = [n for n in findall(facts.module, m.Name(func.name.value)) if n is not func.name]
    if len(uses) != 1:
        return None
    call = facts.get_metadata(ParentNodeProvider, uses[0], None)
    if not isinstance(call, cst.Call) or call.func is not uses[0]:
        return None
    assign = facts.get_metadata(ParentNodeProvider, call, None)
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or assign.value is not call:
        return None
    target = assign.targets[0].target
    elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
    if not all(isinstance(e, cst.Name) for e in elements):
        return None
    return assign, elements  # type: ignore[return-value]


def _plain_value(facts: Facts, key: str, name: str, optimizer_names: set[str]) -> bool:
    """A returned value no analysis prepares: bound once in the factory, not to a DataLoader, not
    to anything built from an optimizer (a scheduler)."""
    assigns = facts.assigns.get((key, name), [])
    if len(assigns) != 1:
        return False
    value = assigns[0].value
    if isinstance(value, cst.Call) and has_qname(facts, value.func, DATALOADERS):
        return False
    return not any(n.value in optimizer_names for n in findall(value, m.Name()))  # type: ignore[attr-defined]
