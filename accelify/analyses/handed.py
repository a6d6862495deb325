"""An optimizer built in a function for the model it is handed: each object prepared where it is built.

Research code often builds the model (and the data) in ``main`` and hands them to a ``train``
function that builds its own optimizer (textCNN, many course projects)::

    def train(train_iter, dev_iter, model, args):
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        for epoch in range(args.epochs):
            ...

    cnn = CNN_Text(args)
    train_iter = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True)
    train(train_iter, dev_iter, cnn, args)

The caller becomes the setup scope: the Accelerator is created there and prepares the model and
loaders it builds, so every later use of them (an evaluation after training, a reload) sees the
prepared objects.  The function gets the accelerator and prepares its optimizer right after building
it, on the prepared model's parameters: ``optimizer = accelerator.prepare(optimizer)``.  Accelerate's
own FSDP examples prepare a model first and its optimizer later in the same way; DeepSpeed and FSDP2
take a model and its optimizer in one ``prepare`` call, so the conversion says so (ACC142).

Only for a plain module-level function, every model its optimizers train one of its parameters
that it never binds, called from one scope (the module or one function) with a plain name of that
scope for each model.  A scheduler the function builds itself is not handled yet: the file stays as
it was, with the reason (ACC104).

A function that builds its own DataLoaders too (Milesial's U-Net) is itself the setup scope: it
prepares the models it is handed with its loaders and optimizer (``plan.handed_in``), at each call,
when its callers do nothing with a model after handing it but call the function again or a method
of the model on its own line (ACC104 otherwise; ACC148 for a call again in an ``except``).

Input: the facts and the optimizers found where they are built, ``plan.setup`` (the function).
Output: ``plan.setup`` and ``plan.owner`` (the caller), ``plan.late`` (function -> the optimizers
it prepares), the optimizers' models as the caller names them; the note ACC142; or ``plan.handed_in``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts
from accelify.analyses.helpers import why_no_accelerator
from accelify.analyses.objects import Optimizers, _handed_in, _model_ref, is_scheduler
from accelify.analyses.prepare_point import _exhaustive_choices
from accelify.queries.blocks import bound_on_all_paths, under
from accelify.queries.names import DATALOADERS, code_of, has_qname
from accelify.queries.refs import MODULE, key_at, ref_of
from accelify.queries.training import built_at_top
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def handed_models(facts: Facts, plan: Plan, optimizers: Optimizers) -> list[str]:
    """The parameters of the setup function that its optimizers train and that it never binds; empty
    unless every model is one (or the setup is no module-level function)."""
    names: list[str] = []
    for _, models in optimizers.values():
        for model in models:
            ref = _model_ref(facts, model)
            if ref is None or ref[0] != plan.setup or not _handed_in(facts, plan, ref[1]):
                return []
            if ref[1] not in names:
                names.append(ref[1])
    return names


def relocate(facts: Facts, plan: Plan, optimizers: Optimizers) -> bool:
    """Make the caller of the setup function the setup scope when the function builds its optimizers for
    models it is handed; True when there is nothing to do or it is done, False (ACC104) when the file
    must stay as it is."""
    models = handed_models(facts, plan, optimizers)
    if not models:
        return True
    function = plan.setup
    func = facts.functions[function]
    if _own_loader(facts, function) is not None:
        return _prepared_inside(facts, plan, function, models)
    first = min((a for a, _ in optimizers.values()), key=facts.line)
    why = _unsupported(facts, plan, function, optimizers)
    sites = facts.call_sites(function, func)
    callers = {key_at(facts, call) for call, _ in sites}
    if why is None and not sites:
        why = f"`{function}` is not called in this file (or is handed on as a value)"
    elif why is None and (len(callers) != 1 or None in callers or function in callers):
        why = f"`{function}` is called from more than one place (`{'`, `'.join(sorted(str(c) for c in callers))}`)"
    caller = next(iter(callers)) if len(callers) == 1 else None
    if why is None and caller != MODULE and caller not in facts.functions:
        why = f"`{function}` is called from `{caller}`, not from the module or a module-level function"
    redirected: dict[str, cst.BaseExpression] = {}
    for name in models if why is None else ():
        args = [bound.get(name) for _, bound in sites]
        handed = [a for a in args if a is not None and isinstance(a, cst.Name) and ref_of(facts, a) == (caller, a.value)]
        if len(handed) != len(args) or len({a.value for a in handed}) != 1:
            why = f"`{function}` is not handed one name of `{caller}` for `{name}` at every call"
            break
        redirected[name] = handed[0]
    if why is not None:
        facts.finding(
            plan, first, "ACC104",
            f"the optimizer is built in `{function}` for `{models[0]}`, a parameter, and {why}: accelify prepares "
            f"the model where it is built and the optimizer in `{function}` only for a function called from one "
            "place with the objects it trains. File not converted.",
            f"build the optimizer where the model is built and hand it to `{function}` too, or prepare by hand "
            f"in `{function}`: `{models[0]}, optimizer = accelerator.prepare({models[0]}, optimizer)`.",
        )
        return False
    for ref, (assign, trained) in list(optimizers.items()):
        optimizers[ref] = (assign, [redirected[_model_ref(facts, t)[1]] for t in trained])  # type: ignore[index]
    plan.late[function] = [ref[1] for ref in sorted(optimizers, key=lambda r: facts.line(optimizers[r][0]))]
    plan.setup = plan.owner = caller  # type: ignore[assignment]
    names = ", ".join(plan.late[function])
    facts.note(
        plan, first, "ACC142",
        f"`{names}` is prepared in `{function}`, where it is built, and the model it trains where that is built: "
        "two `prepare` calls, right for one device, DDP, FSDP (version 1) and mixed precision; DeepSpeed and "
        "FSDP2 need a model and its optimizer in one `prepare` call and stop with an error at the second.",
        f"to train with DeepSpeed or FSDP2, build `{names}` where the model is built and hand it to `{function}`.",
    )
    return True


def _unsupported(facts: Facts, plan: Plan, function: str, optimizers: Optimizers):
    """Why the function's own objects cannot be prepared in it yet: it builds a DataLoader or a scheduler."""
    refs = set(optimizers)
    for ref, assigns in facts.assigns.items():
        for assign in assigns:
            value = assign.value
            if facts.assign_key.get(id(assign)) != function or not isinstance(value, cst.Call):
                continue
            if ref not in refs and is_scheduler(facts, value, refs):
                return f"`{function}` builds a scheduler too (`{code_of(value.func)}`)"
    located = built_at_top(facts.functions[function], {r[1] for r in refs}, facts.trainers)
    if located is None:
        return f"`{function}` does not build it in its own body before it trains"
    block, index = located
    exhaustive = _exhaustive_choices(facts)
    for ref in sorted(refs):
        if not bound_on_all_paths(block.body[:index], ref[1], exhaustive):
            return f"`{ref[1]}` is bound there only under a condition"
    return None


def _prepared_inside(facts: Facts, plan: Plan, function: str, models: list[str]) -> bool:
    """The function builds its own DataLoaders too (Milesial's U-Net: ``train_model(model, device, ...)``
    builds the dataset, the loaders, the optimizer and the scheduler): it stays the setup scope and
    prepares the models it is handed with them, at each call (called again after an out-of-memory error,
    it prepares the same model anew with new objects).  What a caller does with a model after handing it
    is not converted, so it may only hand it to the function again, and call a method of it on its own line
    before that (``model.use_checkpointing()``); False (ACC104) otherwise."""
    sites = facts.call_sites(function, facts.functions[function])
    first: dict[object, int] = {}
    for call, _ in sites:
        caller = key_at(facts, call)
        first[caller] = min(first.get(caller, facts.line(call)), facts.line(call))
    calls = {id(call) for call, _ in sites}
    last = max((facts.line(call) for call, _ in sites), default=0)
    for call, bound in sites:
        caller = key_at(facts, call)
        for name in models:
            arg = bound.get(name)
            ref = ref_of(facts, arg) if isinstance(arg, cst.Name) else None
            later = next((n for n in findall(facts.module, m.Name(arg.value)) if ref_of(facts, n) == ref
                          and facts.line(n) > first[caller] and not _reused(facts, n, calls, last)), None) if ref else None
            if later is None:
                continue
            where = "the module's own code" if caller == MODULE else f"`{caller}`"
            facts.finding(
                plan, later, "ACC104",
                f"`{code_of(arg)}` is used in {where} after `{function}` has prepared and trained it: accelify "
                f"prepares it in `{function}`, which builds the data and the optimizer, and does not convert what "
                f"{where} does with it afterwards (every process would run it as written). File not converted.",
                f"move that code into `{function}` (after its training), or build the loaders and the optimizer "
                f"where the model is built and hand them to `{function}`.",
            )
            return False
    plan.handed_in = models
    plan.handed_refs = {ref_of(facts, bound[name]) for _, bound in sites for name in models  # type: ignore[misc]
                        if isinstance(bound.get(name), cst.Name)}
    retried = next((call for call, _ in sites if under(facts, call, (cst.ExceptHandler,))), None)
    if retried is not None:
        facts.note(
            plan, retried, "ACC148",
            f"`{function}` is called again when an error is caught: it prepares the "
            "model anew with new loaders and a new optimizer, right when every process catches the error. Under "
            "several processes an error of one process (an out-of-memory error on one GPU) reaches that process "
            "only, and the others wait for it in their next step.",
            "to recover on every process alike, check the condition on every process "
            "(`accelerator.gather`) before calling it again, or let the run stop and restart it.",
        )
    return True


def _reused(facts: Facts, name: cst.Name, calls: set[int], last: int) -> bool:
    """The model handed to the function again, or a method of it called on its own line before the function's
    last call (``model.use_checkpointing()`` before training again: not ``model.save(...)`` after the training)."""
    parent = facts.get_metadata(ParentNodeProvider, name, None)
    if isinstance(parent, cst.Arg):
        return id(facts.get_metadata(ParentNodeProvider, parent, None)) in calls
    call = facts.get_metadata(ParentNodeProvider, parent, None) if isinstance(parent, cst.Attribute) else None
    return (isinstance(call, cst.Call) and call.func is parent and facts.line(call) < last
            and isinstance(facts.get_metadata(ParentNodeProvider, call, None), cst.Expr))


def _own_loader(facts: Facts, function: str) -> Optional[str]:
    """The first DataLoader the function builds itself (``train_loader = DataLoader(...)``), if any."""
    for ref, assigns in facts.assigns.items():
        if ref[0] == function and any(isinstance(a.value, cst.Call) and has_qname(facts, a.value.func, DATALOADERS)
                                      and facts.assign_key.get(id(a)) == function for a in assigns):
            return ref[1]
    return None


def _prepares_itself(func: cst.FunctionDef, names: list[str]) -> bool:
    """Converted code: the function already passes its optimizers through a ``prepare`` of its own."""
    return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare"
               and set(names) <= {code_of(a.value) for a in call.args} for call in findall(func.body, m.Call()))


def reachable(facts: Facts, plan: Plan) -> bool:
    """Each function that prepares its optimizer reaches the Accelerator (a parameter it gets): False
    (ACC104) when one cannot."""
    for function, names in plan.late.items():
        if plan.accelerator_in(function) is None and not _prepares_itself(facts.functions[function], names):
            why = why_no_accelerator(facts, plan, function)
            facts.finding(
                plan, facts.assigns[(function, names[0])][0], "ACC104",
                f"`{names[0]}` is built in `{function}` for the model it is handed, and `{function}` cannot be given "
                f"the accelerator to prepare it ({why}); file not converted.",
                f"build the optimizer where the model is built and hand it to `{function}` too.",
            )
            return False
    return True
