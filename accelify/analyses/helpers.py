"""Helper functions: which of their parameters carry the training objects, and which need the accelerator.

``train(args, model, device, train_loader, optimizer, epoch)`` is a module-level helper the setup
scope hands its objects: its ``model`` is the prepared model, its ``device`` becomes the
accelerator.  The flow is followed through every call of a helper (all calls must agree) and
through the ``self.model = model`` of a class handed them.  A helper that runs a backward, gathers
metrics or saves the model needs the Accelerator: through its renamed ``device`` parameter, a new
first parameter, or (a trainer class) ``self.accelerator``.

Input: the facts (functions, classes, their call sites; backwards, loops, calls) and the plan's
objects.  Output: ``plan.flow``, ``plan.device_params``, ``plan.needs_accelerator``,
``plan.accelerator_params``, ``plan.accelerator_classes``.  No findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from accelify.analyses.device_kinds import is_option_device
from accelify.analyses.facts import KINDS, Facts, chain_root, param_names
from accelify.analyses.ranks import under_main_process_check
from accelify.analyses.unwrapping import model_attribute
from accelify.queries.blocks import handed_values
from accelify.queries.names import TORCH_SAVE, code_of, has_qname
from accelify.queries.refs import MODULE, assigned_values, key_at, receiver_refs, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def flows(facts: Facts, plan: Plan) -> None:
    """Which parameters of module-level functions (and of functions defined in one, called there) receive
    loaders, models or devices."""
    calls: dict[str, list[tuple[cst.Call, dict[str, cst.BaseExpression]]]] = {}
    funcs: dict[str, cst.FunctionDef] = {}
    for name, func in facts.functions.items():
        sites = facts.call_sites(name, func)
        if sites:
            calls[name], funcs[name] = sites, func
    for key, func in facts.nested.items():  # `def save_model(model, path):` inside `train`, called there
        sites = facts.call_sites(func.name.value, func)
        if sites:
            calls[key], funcs[key] = sites, func
    for name in facts.classes:
        init = _constructor(facts, name)
        sites = facts.call_sites(name, init, facts.classes[name]) if init is not None else []
        if sites:  # `Trainer(model, loader, optimizer, device)`: the parameters of `Trainer.__init__`
            calls[f"{name}.__init__"], funcs[f"{name}.__init__"] = sites, init  # type: ignore[assignment]
    changed = True
    while changed:
        changed = False
        for name, sites in calls.items():
            for param in param_names(funcs[name]):
                ref = (name, param)
                args = [bound.get(param) for _, bound in sites]
                if any(a is None for a in args):
                    continue
                for kind in KINDS:
                    if ref not in plan.flow[kind] and all(ref_of(facts, a) in plan.flow[kind] or (
                            kind == "device" and is_option_device(facts, a)) for a in args):
                        plan.flow[kind].add(ref)
                        changed = True
        changed |= _attribute_flows(facts, plan)
    if plan.setup != MODULE and not facts.is_script:
        return  # a module others may import: its functions' signatures are not ours to change
    for key, param in sorted(plan.flow["device"]):
        if key in facts.functions and param in param_names(facts.functions[key]):
            plan.device_params.setdefault(key, []).append(param)


def mixed_loaders(facts: Facts, plan: Plan) -> bool:
    """False (ACC123) when a function of the file is handed a prepared DataLoader at one call and another
    loader at another (ProtoNet's ``test(opt, test_dataloader, model)`` from ``main``, where it is prepared,
    and from ``eval``, where it is not): converted for the one, it would count one shard's metrics with no
    gather, or gather where nothing was sharded."""
    for name, func in facts.functions.items():
        sites = facts.call_sites(name, func)
        for param in param_names(func):
            args = [(call, bound.get(param)) for call, bound in sites]
            given = [(call, a) for call, a in args if a is not None and not m.matches(a, m.Name("None"))]
            prepared = [(call, a) for call, a in given if ref_of(facts, a) in plan.flow["loader"]]
            other = next(((call, a) for call, a in given if ref_of(facts, a) not in plan.flow["loader"]), None)
            if prepared and other is not None:
                dead = _never_runs(facts, other[0])
                facts.finding(
                    plan, other[0], "ACC123",
                    f"`{name}` is handed the prepared DataLoader `{code_of(prepared[0][1])}` in "
                    f"`{key_at(facts, prepared[0][0])}` (line {facts.line(prepared[0][0])}) and `{code_of(other[1])}`, "
                    f"which is not prepared, here in `{key_at(facts, other[0])}`"
                    + (" (which nothing in this file calls)" if dead else "")
                    + ": converted for one of them, it would count one process's shard with no gather, or gather what "
                    "was never sharded. File not converted.",
                    (f"remove `{(key_at(facts, other[0]) or '').split('.')[0]}` if it is unused, or " if dead else "")
                    + f"prepare the loader this call hands `{name}` too, or give the two uses functions of their own.",
                )
                return False
    return True


def _never_runs(facts: Facts, call: cst.Call) -> bool:
    """Is ``call`` in a module-level function of the file that nothing names (ProtoNet's ``eval(opt)``, which
    no line calls)?"""
    top = (key_at(facts, call) or "").split(".")[0]
    func = facts.functions.get(top)
    scope = facts.get_metadata(ScopeProvider, func, None) if func is not None else None
    return scope is not None and all(not a.references for a in scope[top])


def _constructor(facts: Facts, name: str) -> Optional[cst.FunctionDef]:
    """The ``__init__`` of a plain module-level class (no bases but ``object``), if it has one."""
    cls = facts.classes[name]
    if any(code_of(base.value) != "object" for base in cls.bases) or cls.keywords:
        return None
    return next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                 and s.params.params and s.params.params[0].name.value == "self"), None)


def _attribute_flows(facts: Facts, plan: Plan) -> bool:
    """``self.model = model.to(gpu_id)`` in a class handed ``model``: ``self.model`` is that model
    too, when every binding of the attribute is such a parameter (placed or not)."""
    changed = False
    for (owner, name), assigns in facts.assigns.items():
        if owner not in facts.classes or not name.startswith("self."):
            continue
        for kind in KINDS:
            ref = (owner, name)
            if ref in plan.flow[kind]:
                continue
            values = [_unwrapped(facts, a.value) if kind != "device" else a.value for a in assigns]
            # `self.model = DDP(self.model, ...)` after `self.model = model`: still that model
            others = [v for v in values if ref_of(facts, v) != ref]
            if others and all(facts.single_target(a) == ref for a in assigns) and all(
                ref_of(facts, v) in plan.flow[kind] and ref_of(facts, v)[0].startswith(owner + ".")  # type: ignore[index]
                for v in others
            ):
                plan.flow[kind].add(ref)
                changed = True
    return changed


def _unwrapped(facts: Facts, value: cst.BaseExpression) -> cst.BaseExpression:
    """``model.to(gpu_id)``, ``DDP(model, device_ids=[gpu_id])`` -> ``model``."""
    from accelify.analyses.distributed import DATA_PARALLEL

    value = chain_root(value)
    while isinstance(value, cst.Call) and value.args and has_qname(facts, value.func, DATA_PARALLEL):
        value = chain_root(value.args[0].value)
    return value


def needs_accelerator(facts: Facts, plan: Plan) -> None:
    """Helpers outside the setup scope that call ``.backward()`` or gather metrics get the
    accelerator through their device parameter."""
    from accelify.analyses.gathers import Gather, find_gather

    gathering = [loop for loop in facts.loops if isinstance(find_gather(facts, loop, plan), Gather)]
    plan.gathering = {id(loop) for loop in gathering}
    # torch.save(model.state_dict(), ...) in a helper: saved once and unwrapped through the accelerator
    saving = [c for c in facts.calls if has_qname(facts, c.func, TORCH_SAVE) and c.args and _saves_model(
        facts, plan, c.args[0].value)]
    # `model.encode(...)` in a helper handed the prepared model (codesearch's `validate`): it reads the model
    # through `accelerator.unwrap_model(...)` (ACC016), so it takes the accelerator too
    unwrapping = [n for n in findall(facts.module, m.Attribute()) if key_at(facts, n) != plan.setup
                  and model_attribute(facts, n, plan)]  # type: ignore[arg-type]
    # `input.cuda()` in a helper handed the prepared model (RepDistiller's `validate`, its loader not a
    # DataLoader): left as it is, it would move its batches to CUDA, not to `accelerator.device` (apart from the
    # model with `cpu=True`, MPS, a TPU); it takes the accelerator and places on `accelerator.device`
    # So does a helper that places what it is handed (`def cuda(tensor, use_cuda): return tensor.cuda() ...`,
    # BetaVAE's): the batches it moves meet the prepared model on each process's device.
    handed = {key for key, _ in plan.flow["model"]}
    placing = [c for c in facts.calls if isinstance(c.func, cst.Attribute) and c.func.attr.value == "cuda"
               and key_at(facts, c) != plan.setup and (key_at(facts, c) in handed or _places_what_it_is_handed(
                   facts, key_at(facts, c)))]
    # `points.cuda()` in a loop over a loader left whole (accelify.analyses.unsharded): its batches go to
    # `accelerator.device`
    placing += [c for loop in facts.loops if id(loop) in plan.unsharded_loops for c in findall(loop.body, m.Call(
        func=m.Attribute(attr=m.Name("cuda")))) if key_at(facts, c) != plan.setup]
    # a function that builds the optimizer for the model it is handed prepares it (accelify.analyses.handed)
    late = [a for key, names in plan.late.items() for n in names for a in facts.assigns.get((key, n), [])]
    # a prepared model handed to another module's code (`ema.step_ema(ema_model, model)`): handed unwrapped
    away = [c for c in facts.calls if any(id(a.value) in plan.handed_away for a in c.args)]
    # ... or whose state is loaded into a model that is not prepared (`ema_model.load_state_dict(model.state_dict())`)
    away += [c for c in facts.calls if id(c) in plan.states_into_plain]
    for call in [*facts.backwards, *gathering, *saving, *unwrapping, *placing, *late, *away]:
        key = key_at(facts, call)
        if key is None or plan.accelerator_in(key) is not None:
            continue
        top = key.split(".")[0]
        if top in plan.device_params and top == key:
            plan.needs_accelerator.add(key)
        elif top == key and _can_take_accelerator(facts, plan, key):
            plan.needs_accelerator.add(key)
            plan.accelerator_params.add(key)
        elif top != key and top in facts.classes and _class_can_take_accelerator(facts, plan, top):
            plan.accelerator_classes.add(top)
        elif top != key and top in facts.functions and top not in plan.device_params and \
                _can_take_accelerator(facts, plan, top):
            # a function defined inside a module-level one (GAT's `main_loop` inside `get_main_loop`): the outer
            # one takes the accelerator, the inner one reads it from there (no name `accelerator` in the outer one,
            # the inner included, would hide it: `_can_take_accelerator`)
            plan.needs_accelerator.add(top)
            plan.accelerator_params.add(top)
    # A helper that hands its own device parameter to one that now takes the accelerator
    # there must take the accelerator too: `train(..., device)` calling `train_epoch(..., device)`.
    changed = True
    while changed:
        changed = False
        for name in sorted(plan.needs_accelerator - plan.accelerator_params):
            func = facts.functions.get(name)
            if func is None:
                continue
            for call, bound in facts.call_sites(name, func):
                caller = key_at(facts, call)
                if caller is None or caller in plan.needs_accelerator or plan.accelerator_in(caller) is not None:
                    continue
                passed = [bound.get(p) for p in plan.device_params.get(name, [])]
                if caller in plan.device_params and any(
                    isinstance(arg, cst.Name) and arg.value in plan.device_params[caller] for arg in passed
                ):
                    plan.needs_accelerator.add(caller)
                    changed = True


def _places_what_it_is_handed(facts: Facts, key: Optional[str]) -> bool:
    """A module-level function whose ``.cuda()`` moves one of its parameters (``tensor.cuda()``)."""
    func = facts.functions.get(key) if key is not None else None
    if func is None:
        return False
    params = set(param_names(func))
    return any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "cuda" and isinstance(c.func.value, cst.Name)
               and c.func.value.value in params for c in findall(func.body, m.Call()))


def _saves_model(facts: Facts, plan: Plan, saved: cst.BaseExpression) -> bool:
    """``model.state_dict()``, ``model``, or a dict (or a name bound to one: vdsr's ``state = {"epoch":
    epoch, "model": model}``) that holds one of those: the model flows into what is saved."""
    values = [saved]
    if isinstance(saved, cst.Name):
        values += [v for v in assigned_values(facts, saved) if isinstance(v, cst.Dict)]
        # handed one (`def save_checkpoint(state, is_best)`) by a call every process makes: the helper writes it
        # once through the accelerator (a call under a main-process check is made by one process already)
        values += [v for call, v in handed_values(facts, facts.module, saved)
                   if isinstance(v, cst.Dict) and not under_main_process_check(facts, call)]
    for value in values:
        parts = [e.value for e in value.elements if isinstance(e, cst.DictElement)] if isinstance(
            value, cst.Dict) else [value]
        if any(ref in plan.flow["model"] for part in parts for ref in receiver_refs(facts, part)):
            return True
    return False


def _class_can_take_accelerator(facts: Facts, plan: Plan, name: str) -> bool:
    """A script's class handed the training objects (``Trainer(model, loader, optimizer)``) can take
    the accelerator as the first argument of every construction, made where the Accelerator is
    visible, and keep it as ``self.accelerator``."""
    init = _constructor(facts, name)
    if not facts.is_script or init is None or init.params.posonly_params or plan.class_mode:
        return False
    cls = facts.classes[name]
    if "accelerator" in param_names(init) or findall(cls, m.Attribute(value=m.Name("self"), attr=m.Name("accelerator"))):
        return False
    sites = facts.call_sites(name, init, cls)
    return bool(sites) and all(plan.accelerator_in(key_at(facts, call)) == "accelerator" for call, _ in sites)


def _can_take_accelerator(facts: Facts, plan: Plan, name: str) -> bool:
    """A script's module-level helper can get a new first parameter ``accelerator`` when every
    call of it is plain (no ``*args``) and made where the Accelerator is visible."""
    func = facts.functions.get(name)
    if not facts.is_script or func is None or func.params.posonly_params:
        return False
    if "accelerator" in param_names(func) or findall(func.body, m.Name("accelerator")):
        return False
    sites = facts.call_sites(name, func)
    return bool(sites) and all(plan.accelerator_in(key_at(facts, call)) is not None for call, _ in sites)


def why_no_accelerator(facts: Facts, plan: Plan, key: str) -> str:
    """Why the code of ``key`` (a function, a method) cannot be handed the accelerator, for ACC106."""
    top, _, rest = key.partition(".")
    if not facts.is_script:
        return "the file has no `if __name__ == \"__main__\":` guard: a module others may import, whose signatures " \
               "accelify does not change"
    if top in facts.functions and rest:
        return f"it runs in a function defined inside `{top}` (a closure), which accelify does not hand the accelerator"
    if top in facts.functions:
        func = facts.functions[top]
        sites = facts.call_sites(top, func)
        if not sites:
            return f"`{top}` is not called in this file with plain arguments (handed on as a value, or called with `*args`)"
        outside = next((key_at(facts, call) for call, _ in sites if plan.accelerator_in(key_at(facts, call)) is None), None)
        if outside is not None:
            return f"`{top}` is called from `{outside}`, which does not reach the Accelerator either"
        return f"`{top}` already has a name `accelerator`, or positional-only parameters"
    if top in facts.classes:
        init = _constructor(facts, top)
        if init is None:
            return (f"`{top}` has no plain `__init__(self, ...)` (a base class other than `object`, or none of its "
                    "own) to take it")
        if not facts.call_sites(top, init, facts.classes[top]):
            if isinstance(init.params.star_arg, cst.Param) or init.params.star_kwarg is not None:
                return f"`{top}.__init__` takes its arguments through `*args` / `**kwargs`"
            return (f"`{top}` is not constructed in this file with plain arguments (`**config`, `*args`, or handed "
                    "on as a value)")
        return f"`{top}` is constructed where the Accelerator is not visible, or already has an `accelerator`"
    return "accelify cannot tell where it is called from"
