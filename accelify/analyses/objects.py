"""What to prepare: the optimizers, the models they train and the dataloaders of the setup scope.

An optimizer is a ``torch.optim`` class, or a call named like one that trains ``.parameters()``;
the models are what those parameters belong to; a dataloader is a ``DataLoader(...)`` bound in the
setup scope, or one a helper of this file builds and returns.  The same classification tells a
scheduler (it takes the optimizer, and is named or built like one) from an optimizer wrapper.

Input: the facts (assignments, calls) and, once :mod:`~accelify.analyses.prepare_point` has found
it, the setup scope (``plan.owner``, ``plan.setup``).  Output: ``plan.optimizers``,
``plan.models``, ``plan.dataloaders``; refusals ACC107 (an optimizer trains a model of another
scope) and ACC104 (an optimizer that can be None); ACC118 for an optimizer wrapper, which
``prepare`` cannot wrap.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.foreign import called_function
from accelify.analyses.facts import Facts, bind_arguments, param_names
from accelify.queries.blocks import bound_on_all_paths, under
from accelify.queries.loops import built_loader
from accelify.queries.names import (DATALOADERS, OPTIMIZER_NAME, code_of, has_qname, qualified_names, root_name,
                                   subclasses_optimizer)
from accelify.queries.refs import ACCELERATOR_SPELLINGS, MODULE, Ref, key_at, ref_of
from accelify.queries.training import UNWRAP_MODEL
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

TORCH_SCHEDULER_PREFIX = "torch.optim.lr_scheduler."
_OPTIMIZER_NAME = OPTIMIZER_NAME
SCHEDULER_FACTORY = re.compile(r"(^|\.)get_\w*schedule\w*$")
_SCHEDULER_NAME = re.compile(r"sched|lr|warmup|decay|anneal|cycl|plateau", re.I)

#: an optimizer's ref -> the assignment that builds it and the model expressions it trains
Optimizers = dict[Ref, tuple[cst.Assign, list[cst.BaseExpression]]]


def optimizers(facts: Facts) -> Optimizers:
    """Every assignment of an optimizer to a single name, by that name's ref; not one built in a
    method the file never names (a model class's ``configure_optimizers``, pasted along with the
    model into a script that only samples from it)."""
    found: Optimizers = {}
    for ref, assigns in facts.assigns.items():
        for assign in assigns:
            value = assign.value
            # `Adam(...) if fine_tune else None` is an optimizer too (that can be None)
            calls = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
            for call in calls:
                if isinstance(call, cst.Call) and facts.single_target(assign) == ref:
                    models = _optimizer_models(facts, call)
                    if models is not None:
                        found[ref] = (assign, models)
    _from_model_methods(facts, found)
    # asked only of the scopes that build one: the question searches the whole module
    return {ref: built for ref, built in found.items() if not _unused_method(facts, ref[0])}


def _from_model_methods(facts: Facts, found: Optimizers) -> None:
    """``optimizer = model.configure_optimizers(...)`` (nanoGPT, llama2.c, minGPT): the model's own
    method builds the optimizer and returns it, so the optimizer is the caller's name, training the model
    the method is called on, and the one inside the method is not another optimizer to prepare.  Only
    for a method of a module-level class that ends by returning the one optimizer it builds, called once
    as ``name = receiver.method(...)`` with ``receiver`` a plain name."""
    for key in {ref[0] for ref in found}:
        cls, _, method = key.partition(".")
        if cls not in facts.classes or not method or "." in method or method in facts.trainers:
            continue
        built = [ref for ref in found if ref[0] == key]
        func = next((s for s in facts.classes[cls].body.body
                     if isinstance(s, cst.FunctionDef) and s.name.value == method), None)
        if func is None or len(built) != 1 or not _returns_only(func, built[0][1]):
            continue
        sites = [a for a in (a for assigns in facts.assigns.values() for a in assigns)
                 if isinstance(a.value, cst.Call) and m.matches(a.value.func, m.Attribute(value=m.Name(), attr=m.Name(method)))]
        sites = list({id(a): a for a in sites}.values())
        if len(sites) != 1 or len(sites[0].targets) != 1 or not isinstance(sites[0].targets[0].target, cst.Name):
            continue
        site = sites[0]
        ref = ref_of(facts, site.targets[0].target)
        model = _unwrapped_alias(facts, site.value.func.value)  # type: ignore[attr-defined]
        receiver = ref_of(facts, model)
        built_as = [a.value for a in facts.assigns.get(receiver, [])] if receiver is not None else []
        name = model.value if isinstance(model, cst.Name) else None
        same = m.Name(name) if name else m.DoNotCare()
        if ref is None or name is None or not built_as or not all(
            m.matches(v, m.Call(func=m.Name(cls) | m.Attribute(value=m.Name(cls))))  # GPT(...), GPT.from_pretrained(...)
            or m.matches(v, m.Call(args=[m.Arg(value=same, keyword=None), m.ZeroOrMore()]))  # DDP(model), torch.compile(model)
            or m.matches(v, m.Call(func=m.Attribute(value=same | m.Call(func=m.Name(cls)))))  # model.to(device), GPT(c).to(d)
            for v in built_as
        ):
            continue  # called on something else than a model of that class
        del found[built[0]]
        found[ref] = (site, [model])


def _unwrapped_alias(facts: Facts, receiver: cst.BaseExpression) -> cst.BaseExpression:
    """``raw_model`` of ``raw_model = model.module if ddp else model`` (build-nanoGPT): ``model``, the model
    itself once the DistributedDataParallel wrapper is gone (``accelerator.unwrap_model(model)`` before
    ``prepare`` is the model); ``receiver`` for anything else."""
    ref = ref_of(facts, receiver)
    assigns = facts.assigns.get(ref, []) if ref is not None else []
    if len(assigns) != 1:
        return receiver
    value = assigns[0].value
    if _unwrapped_by_the_accelerator(value):
        return value.args[0].value  # type: ignore[attr-defined]  # `raw_model = accelerator.unwrap_model(model)`
    if not isinstance(value, cst.IfExp):
        return receiver
    if m.matches(value, m.IfExp(body=m.Attribute(value=m.Name(), attr=m.Name("module")), orelse=m.Name())) and (
        value.body.value.value == value.orelse.value  # type: ignore[attr-defined]
    ):
        return value.orelse
    return receiver


def _unwrapped_by_the_accelerator(expr: cst.BaseExpression) -> bool:
    """``accelerator.unwrap_model(model)`` (``self.accelerator``): the model itself, for what it trains."""
    return m.matches(expr, UNWRAP_MODEL) and code_of(expr.func.value) in ACCELERATOR_SPELLINGS  # type: ignore[attr-defined]


def _returns_only(func: cst.FunctionDef, name: str) -> bool:
    """``func`` ends with ``return name`` and returns nothing else."""
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
    returns = findall(func.body, m.Return())
    return bool(body) and len(returns) == 1 and m.matches(
        body[-1], m.SimpleStatementLine(body=[m.Return(value=m.Name(name))]))


def _unused_method(facts: Facts, key: str) -> bool:
    """``key`` is a method (``GPT.configure_optimizers``) of a module-level class, training nothing
    itself, whose name the file uses nowhere else: nothing in this file runs it."""
    cls, _, method = key.partition(".")
    if cls not in facts.classes or not method or "." in method or method.startswith("__") or method in facts.trainers:
        return False  # a method that trains (`Trainer.train` never called here) keeps its optimizer: ACC107
    return not any(
        (isinstance(c.func, cst.Attribute) and c.func.attr.value == method)
        or (isinstance(c.func, cst.Name) and c.func.value == method) for c in facts.calls
    ) and not findall(facts.module, m.Attribute(attr=m.Name(method)))


def _optimizer_models(facts: Facts, call: cst.Call) -> Optional[list[cst.BaseExpression]]:
    """The models an optimizer construction trains, or ``None`` if ``call`` is no optimizer."""
    names = qualified_names(facts, call.func)
    if not names or any(n.startswith(TORCH_SCHEDULER_PREFIX) or n.startswith("builtins.") for n in names):
        return None
    values = [value for arg in call.args for value in (arg.value, *facts.bound_values(arg.value))]
    found = [
        c.func.value  # type: ignore[union-attr]
        for value in values
        for c in findall(value, m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters"))))
    ]
    # parameter groups a model's own method or a helper handed the model makes (DeepLab's
    # `model.get_1x_lr_params()`, RealNVP's `util.get_param_groups(net, weight_decay)`)
    found = found or [
        model for value in values for c in findall(value, m.Call())
        for model in _param_group_models(c)  # type: ignore[arg-type]
    ]
    is_torch_optim = any(n.startswith("torch.optim.") and not n.startswith("torch.optim.swa_utils") for n in names)
    looks_like_optim = any(_OPTIMIZER_NAME.search(n.rsplit(".", 1)[-1]) for n in names) or any(
        n in facts.classes and subclasses_optimizer(facts, facts.classes[n]) for n in names)
    if not found and (is_torch_optim or looks_like_optim) and facts.loops:
        # lists filled in a loop over the parameters (Barlow Twins: `for param in model.parameters():
        # (param_biases if param.ndim == 1 else param_weights).append(param)`, then `[{'params': param_weights}, ...]`)
        filled = _filled_from_parameters(facts)
        found = [filled[inner.value] for value in values for name in findall(value, m.Name())  # type: ignore[attr-defined]
                 for group in [name, *facts.bound_values(name)] for inner in findall(group, m.Name())  # type: ignore[arg-type]
                 if inner.value in filled]  # type: ignore[attr-defined]
    if (is_torch_optim or looks_like_optim) and found:
        return found
    if is_torch_optim:
        return []
    found = _one_line_factory(facts, call)
    return found if found is not None or not looks_like_optim else _foreign_factory(facts, call)


def _filled_from_parameters(facts: Facts) -> dict[str, cst.BaseExpression]:
    """``name.append(p)`` inside ``for p in model.parameters():`` (or ``named_parameters()``): name -> ``model``."""
    filled: dict[str, cst.BaseExpression] = {}
    for loop in facts.loops:
        source = loop.iter
        if not m.matches(source, m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters")))):
            continue
        for call in findall(loop.body, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")))):
            filled.setdefault(call.func.value.value, source.func.value)  # type: ignore[attr-defined]
    return filled


_PARAM_GROUPS = re.compile(r"param", re.I)


def _param_group_models(call: cst.Call) -> list[cst.BaseExpression]:
    """``model.get_10x_lr_params()`` -> ``model``; ``get_param_groups(net, wd)`` -> ``net``: a method of
    the model, or a function handed it as a plain name, named for parameters."""
    func = call.func
    if isinstance(func, cst.Attribute) and _PARAM_GROUPS.search(func.attr.value) and isinstance(
            func.value, (cst.Name, cst.Attribute)) and not call.args:
        return [func.value]
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    if _PARAM_GROUPS.search(name) and isinstance(first, cst.Name):
        return [first]
    return []


def _one_line_factory(facts: Facts, call: cst.Call) -> Optional[list[cst.BaseExpression]]:
    """``optim = init_optim(opt, model)`` where ``def init_optim(opt, model): return torch.optim.Adam(
    params=model.parameters(), lr=opt.learning_rate)`` (protonet): a module-level function of the file whose
    body is that one ``return`` (a docstring aside) of an optimizer over its parameters' ``.parameters()``:
    the optimizer trains what the call hands those parameters."""
    if not isinstance(call.func, cst.Name) or ref_of(facts, call.func) != (MODULE, call.func.value):
        return None
    func = facts.functions.get(call.func.value)
    if func is None or func.decorators or not isinstance(func.body, cst.IndentedBlock):
        return None
    body = [s for s in func.body.body if not m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())]))]
    if len(body) != 1 or not m.matches(body[0], m.SimpleStatementLine(body=[m.Return(value=m.Call())])):
        return None
    inner = body[0].body[0].value  # type: ignore[attr-defined]
    if not any(n.startswith("torch.optim.") for n in qualified_names(facts, inner.func)):
        return None
    models = _optimizer_models(facts, inner)
    bound = bind_arguments(func, call)
    if not models or bound is None:
        return None
    handed = []
    for model in models:
        if not isinstance(model, cst.Name) or model.value not in bound:
            return None  # a model the factory builds or finds itself
        handed.append(bound[model.value])
    return handed


def _foreign_factory(facts: Facts, call: cst.Call) -> Optional[list[cst.BaseExpression]]:
    """``optimizer = get_optimizer(args.name, model, lr=...)`` where ``get_optimizer`` is an optimizer factory of
    the project's other modules (SimSiam's ``optimizers.get_optimizer``, accelify.analyses.foreign): the
    optimizer trains what the call hands the parameters whose parameters the factory reads, each a plain name."""
    function = called_function(facts, facts.module, facts.foreign, call.func)
    if function is None or function.trains is None or function.node is None:
        return None
    bound = bind_arguments(function.node, call)
    if bound is None or any(not isinstance(bound.get(name), cst.Name) for name in function.trains):
        return None
    return [bound[name] for name in function.trains]


def homes(plan: Plan) -> set[str]:
    """The scope keys the training objects live in: the owner, and in method mode the method too."""
    return {plan.owner, plan.setup} if plan.method_mode else {plan.owner}


def setup_assigns(facts: Facts, plan: Plan) -> dict[Ref, list[cst.Assign]]:
    """The assignments of the scopes the training objects live in (:func:`homes`), by ref."""
    scopes = homes(plan)
    return {ref: assigns for ref, assigns in facts.assigns.items() if ref[0] in scopes}


def _handed_in(facts: Facts, plan: Plan, name: str) -> bool:
    """Is the model ``name`` a parameter of the module-level function that builds the optimizer (``def
    train(model, loader, device): optimizer = Adam(model.parameters())``), not built there?"""
    function = facts.functions.get(plan.setup)
    if function is None or plan.class_mode or name not in param_names(function):
        return False
    return not any(facts.assign_key.get(id(a)) == plan.setup for a in facts.assigns.get((plan.setup, name), []))


def training_objects(
    facts: Facts, plan: Plan, optimizers: Optimizers, in_owner: dict[Ref, list[cst.Assign]]
) -> bool:
    """``plan.optimizers``, the ``plan.models`` they train and the ``plan.dataloaders`` of the setup
    scope; False when the file must stay as it is."""
    scopes = homes(plan)
    # an evaluation plan's "optimizers" are the models it runs (accelify.analyses.evaluation)
    if not plan.evaluation:
        late = {(key, name) for key, names in plan.late.items() for name in names}
        plan.optimizers = [r[1] for r in sorted(optimizers, key=lambda r: facts.line(optimizers[r][0])) if r not in late]
    for assign, models in sorted(optimizers.values(), key=lambda v: facts.line(v[0])):
        for model in models:
            ref = _model_ref(facts, model)
            if ref is None and _unbound(facts, model):
                continue  # a fragment (a docstring example) or a star import: nothing to prepare
            if ref is None or ref[0] not in scopes:
                where = f"`{ref[0]}`" if ref is not None else "another scope"
                what = (f"the optimizer is built inside the model's own class (`{plan.setup}` trains `self`)"
                        if code_of(model) == "self" else
                        f"the optimizer (built in `{plan.setup}`) trains `{code_of(model)}`, which lives in {where}")
                facts.finding(
                    plan, assign, "ACC107",
                    f"{what}: one `accelerator.prepare(...)` cannot take both, and an unprepared model would "
                    "train separately on every process. File not converted.",
                    "build the model and its optimizer in the same function (or both in `__init__`).",
                )
                return False
            if ref[1] not in plan.models:
                plan.models.append(ref[1])
            if not plan.evaluation and _handed_in(facts, plan, ref[1]) and ref[1] not in plan.handed_in:
                facts.finding(
                    plan, assign, "ACC104",
                    f"the optimizer is built in `{plan.setup}` for `{ref[1]}`, a parameter: the model (and the data "
                    f"it trains on) are built where `{plan.setup}` is called and handed in. accelify prepares the "
                    "objects where the optimizer is built, and does not prepare objects handed in yet. File not "
                    "converted.",
                    f"build the optimizer where the model is built and hand it to `{plan.setup}` too, or prepare by "
                    f"hand in `{plan.setup}`: `{ref[1]}, optimizer, loader = accelerator.prepare({ref[1]}, optimizer, "
                    "loader)`.",
                )
                return False
    for ref in optimizers if not plan.evaluation else ():
        for assign in in_owner.get(ref, []):
            value = assign.value
            if m.matches(value, m.Name("None") | m.IfExp(body=m.Name("None")) | m.IfExp(orelse=m.Name("None"))):
                if m.matches(value, m.Name("None")) and _overwritten(facts, assign, ref[1]):
                    continue  # `self.optimizer = None` as a placeholder, bound for good a few lines below
                facts.finding(
                    plan, assign, "ACC104",
                    f"`{ref[1]}` can be None (`{_none_case(value)}`): the model it trains may then be frozen, and "
                    "a prepared model with nothing to train fails in a multi-process run (DDP); file not "
                    "converted.",
                    "prepare the model and its optimizer only when it trains (inside the `if`), and move the "
                    "frozen model with `.to(accelerator.device)` otherwise.",
                )
                return False
    loaders = [
        (ref, a) for ref, assigns in in_owner.items() for a in assigns
        if isinstance(a.value, cst.Call) and has_qname(facts, a.value.func, DATALOADERS)
        and facts.single_target(a) == ref
    ]
    # `train_loader, test_loader = get_loaders(args)`: a helper of this file that returns DataLoaders
    loaders += [
        (ref, assigns[0]) for ref, assigns in in_owner.items()
        if assigns and all(_helper_loader(facts, a, ref) for a in assigns)
    ]
    # a DataLoader built under a condition and never read (retinanet's `dataloader_val`, built only with
    # `--csv_val`, never used) has nothing to shard, and `prepare` could not take it on every path: no
    # object to prepare. (One built on every path is prepared though unread, as the Accelerate docs do.)
    loaders = [(ref, a) for ref, a in loaders if _read_anywhere(facts, a) or not under(facts, a, (cst.If,))]
    plan.dataloaders = _unique(r[1] for r, a in sorted(loaders, key=lambda x: facts.line(x[1])))
    return True


def _overwritten(facts: Facts, assign: cst.Assign, name: str) -> bool:
    """Is ``name = None`` followed, in its own block, by statements that bind ``name`` on every path?"""
    line = facts.get_metadata(ParentNodeProvider, assign, None)
    block = facts.get_metadata(ParentNodeProvider, line, None) if line is not None else None
    body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
    if line not in body:
        return False
    return bound_on_all_paths(body[body.index(line) + 1:], name)


def modelled(facts: Facts, plan: Plan, optimizers: Optimizers) -> bool:
    """False (ACC107) when an optimizer trains parameters accelify cannot tie to a model (NeRF's `Adam(params=
    grad_vars)`, the list a factory returns): prepared alone, it would step a model never wrapped for
    distributed training, every process training its own copy on its own shard."""
    for assign, models in sorted(optimizers.values(), key=lambda v: facts.line(v[0])):
        if models or plan.evaluation:
            continue
        call = assign.value
        params = code_of(call.args[0].value) if isinstance(call, cst.Call) and call.args else "its parameters"
        facts.finding(
            plan, assign, "ACC107",
            f"the optimizer trains `{params}`, and accelify cannot tell which model those parameters belong to "
            "(no `model.parameters()` there): prepared alone, the optimizer would step a model that is never "
            "wrapped for distributed training, so every process would train its own copy on its own data. "
            "File not converted.",
            "build the optimizer over `model.parameters()` (or parameter groups of it) where the model is "
            "built, so that `accelerator.prepare(model, optimizer)` can take both.",
        )
        return False
    return True


def _read_anywhere(facts: Facts, assign: cst.Assign) -> bool:
    """Is the name ``assign`` binds read anywhere (by any of its assignments in that scope)?"""
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not isinstance(target, cst.Name):
        return True
    scope = facts.get_metadata(ScopeProvider, target, None)
    if scope is None:
        return True
    return any(a.references for a in scope[target.value])


def _unbound(facts: Facts, expr: cst.BaseExpression) -> bool:
    root = root_name(expr)
    scope = facts.get_metadata(ScopeProvider, root, None) if root is not None else None
    return root is not None and root.value != "self" and scope is not None and not scope[root.value]


def _model_ref(facts: Facts, expr: cst.BaseExpression) -> Optional[Ref]:
    """The model an optimizer trains: ``model`` for ``model.fc.parameters()`` too, and for
    ``accelerator.unwrap_model(model).encoder.parameters()`` (a converted SimSiam's parameter groups, converted
    again: the model itself before ``prepare``)."""
    while True:
        if _unwrapped_by_the_accelerator(expr):
            expr = expr.args[0].value  # type: ignore[attr-defined]
        ref = ref_of(facts, expr)
        if ref is not None or not isinstance(expr, cst.Attribute):
            return ref
        expr = expr.value


def _none_case(value: cst.BaseExpression) -> str:
    """``... if flag else None`` for a conditional optimizer, in one short line."""
    if isinstance(value, cst.IfExp):
        body = "None" if m.matches(value.body, m.Name("None")) else "..."
        orelse = "None" if m.matches(value.orelse, m.Name("None")) else "..."
        return f"{body} if {code_of(value.test)} else {orelse}"
    return code_of(value)


def _helper_loader(facts: Facts, assign: cst.Assign, ref: Ref) -> bool:
    """``loader = get_loader(...)`` / ``train, test = get_loaders(...)``: the value at ``ref``'s place
    is a DataLoader that a module-level function of this file builds and returns, on every return."""
    value = assign.value
    if len(assign.targets) != 1 or not isinstance(value, cst.Call):
        return False
    func = facts.functions.get(value.func.value) if isinstance(value.func, cst.Name) else None
    if func is None or ref_of(facts, value.func) != (MODULE, value.func.value):  # type: ignore[attr-defined]
        return _foreign_loader(facts, assign, ref)
    position = _target_position(facts, assign.targets[0].target, ref)
    if position is None:
        return False
    index, count = position
    returns = [r for r in findall(func.body, m.Return()) if key_at(facts, r) == func.name.value]
    if not returns:
        return False
    for ret in returns:
        returned = ret.value  # type: ignore[attr-defined]
        if index is not None:
            if not isinstance(returned, cst.Tuple) or len(returned.elements) != count:
                return False
            returned = returned.elements[index].value
        if returned is None or not built_loader(facts, returned):
            return False
    return True


def _foreign_loader(facts: Facts, assign: cst.Assign, ref: Ref) -> bool:
    """``loader = get_data(args)`` / ``train, test = get_loaders(args)`` where the function is another
    module's of the project that builds and returns DataLoaders (accelify.analyses.foreign)."""
    function = called_function(facts, facts.module, facts.foreign, assign.value.func)  # type: ignore[attr-defined]
    position = _target_position(facts, assign.targets[0].target, ref)
    if function is None or function.loaders is None or position is None:
        return False
    index, count = position
    if index is None:
        return function.loaders == (True,)
    return count == len(function.loaders) and function.loaders[index]


def _target_position(facts: Facts, target: cst.BaseExpression, ref: Ref) -> Optional[tuple[Optional[int], int]]:
    """Where an assignment's target binds ``ref``: ``(None, 1)`` for the plain name, ``(i, n)`` for the
    ``i``-th of ``n`` names it unpacks (``train, test = ...``); None when it does not bind it, or unpacks
    into a starred name."""
    if isinstance(target, (cst.Tuple, cst.List)):
        names = [e.value for e in target.elements]
        index = next((i for i, n in enumerate(names) if ref_of(facts, n) == ref), None)
        if index is None or any(isinstance(e, cst.StarredElement) for e in target.elements):
            return None
        return index, len(names)
    return (None, 1) if ref_of(facts, target) == ref else None


def _unique(items) -> list[str]:
    out: list[str] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def is_scheduler(facts: Facts, call: cst.Call, optimizers: set[Ref]) -> bool:
    names = qualified_names(facts, call.func)
    if any(n.startswith(TORCH_SCHEDULER_PREFIX) or SCHEDULER_FACTORY.search(n) for n in names):
        return True
    return _takes_optimizer(facts, call, optimizers) and _scheduler_like(names)


def _takes_optimizer(facts: Facts, call: cst.Call, optimizers: set[Ref]) -> bool:
    """``Thing(optimizer, ...)`` / ``Thing(optimizer=optimizer)``: a scheduler or an optimizer wrapper."""
    for i, arg in enumerate(call.args):
        positional_first = i == 0 and arg.keyword is None
        if (positional_first or (arg.keyword is not None and arg.keyword.value == "optimizer")) and ref_of(
            facts, arg.value
        ) in optimizers:
            return True
    return False


def _scheduler_like(names: set[str]) -> bool:
    """A home-made class that takes the optimizer: a scheduler by its name, unless it is named an
    optimizer (``ScheduledOptim``, ``NoamOpt`` wrap the optimizer and step it themselves)."""
    last = [n.rsplit(".", 1)[-1] for n in names]
    if any(_OPTIMIZER_NAME.search(n) or re.search(r"opt", n, re.I) for n in last):
        return False
    return any(_SCHEDULER_NAME.search(n) for n in last)


def _trainer_class(facts: Facts, name: str) -> bool:
    """A class of the program with a method that trains (BYOL's ``BYOLTrainer``, handed the optimizer): it
    runs the training itself, it does not wrap the optimizer's step."""
    for stmt in facts.module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            return any(isinstance(f, cst.FunctionDef) and f.name.value in facts.trainers for f in stmt.body.body)
    return False


def optimizer_wrappers(
    facts: Facts, plan: Plan, in_owner: dict[Ref, list[cst.Assign]], optimizers: Optimizers
) -> bool:
    """ACC118: an object that wraps the optimizer and steps it itself (Lookahead, ScheduledOptim).

    ``accelerator.prepare`` only wraps ``torch.optim.Optimizer`` instances, so such a
    wrapper steps an optimizer that knows nothing of gradient accumulation or of the
    Accelerator's loss scaling: those two rewrites are refused where one exists.
    """
    wrappers = []
    for ref, (assign, _) in optimizers.items():
        call = assign.value
        if not isinstance(call, cst.Call):
            continue  # `optimizer = objects["optimizer"]`: built by a factory (analyses/factories.py)
        names = qualified_names(facts, call.func)
        if any(n.startswith("torch.optim.") for n in names):
            continue
        inner = [c for arg in call.args for c in findall(arg.value, m.Call())  # type: ignore[attr-defined]
                 if any(n.startswith("torch.optim.") for n in qualified_names(facts, c.func))]  # type: ignore[attr-defined]
        if inner:
            wrappers.append(assign)
    for ref, assigns in in_owner.items():
        for assign in assigns:
            value = assign.value
            if ref in optimizers or not isinstance(value, cst.Call) or facts.single_target(assign) != ref:
                continue
            if isinstance(value.func, cst.Name) and (value.func.value in facts.trainers or _trainer_class(facts, value.func.value)):
                continue  # `loss = train(optimizer, model, loader)`, `BYOLTrainer(optimizer=optimizer, ...)`: it trains
            if _takes_optimizer(facts, value, set(optimizers)) and not is_scheduler(facts, value, set(optimizers)):
                if not m.matches(value.func, m.Attribute(attr=m.Name("prepare"))):
                    wrappers.append(assign)
    for assign in wrappers:
        facts.finding(
            plan, assign, "ACC118", "an optimizer wrapper: `accelerator.prepare` only wraps `torch.optim.Optimizer` "
            "instances, so this object steps an optimizer that knows nothing of gradient accumulation or "
            "mixed precision.",
            "prepare the inner `torch.optim` optimizer and build the wrapper on what `prepare` returns "
            "(or make the wrapper a `torch.optim.Optimizer` subclass).",
        )
    return bool(wrappers)
