"""Where the Accelerator and ``prepare`` go: the setup scope, and the point in it after the training objects.

The setup scope is the one function (or the module) that builds the optimizers; in a trainer
class, ``__init__``, or a method that runs once (``Trainer.train``: method mode, the Accelerator
in ``__init__`` and ``prepare`` in the method).  ``prepare`` goes in the block that binds every
training object, after the last binding before training, and must see each of them bound on
every path; code after it that binds one again holds a new, plain object.

Input: the optimizers and their assignments, the facts (classes, trainers, assignments), the
plan's objects.  Output: ``plan.owner``, ``plan.setup``, ``plan.built_in_init``,
``plan.has_prepare``, ``plan.rebound_models``; refusals ACC107 (no single setup scope, or one the
Accelerator cannot serve from) and ACC104 (no single point where ``prepare`` sees every object).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts, bind_arguments
from accelify.analyses.objects import Optimizers
from accelify.queries.blocks import binds, bound_on_all_paths, scope_root
from accelify.queries.loops import peel_iterable
from accelify.queries.names import code_of, string_value
from accelify.queries.refs import MODULE, key_at, ref_of
from accelify.queries.training import BACKWARD, bound_again, locate_setup, trains
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def setup_scope(facts: Facts, plan: Plan, optimizers: Optimizers, first: cst.Assign) -> bool:
    """``plan.setup``, the scope that builds the optimizers (``first`` is the first of them), and
    ``plan.owner``, the one their refs live in; False when the file must stay as it is."""
    owners = {ref[0] for ref in optimizers}
    setups = {facts.assign_key[id(a)] for a, _ in optimizers.values()}
    if len(owners) != 1 or len(setups) != 1 or None in setups:
        facts.finding(
            plan, first, "ACC107", "optimizers are built in more than one place; file not converted.",
            "build all training objects in one function and pass them through one `accelerator.prepare(...)`.",
        )
        return False
    plan.owner, plan.setup = owners.pop(), setups.pop()  # type: ignore[assignment]
    cls, _, method = plan.setup.rpartition(".")
    if cls in facts.classes and method != "__init__" and method in facts.trainers:
        why = _method_setup(facts, cls, method)
        if why is not None:
            facts.finding(
                plan, first, "ACC107",
                f"the optimizer is built in `{plan.setup}`, not in `__init__`, and {why}; file not converted.",
                f"build the model, optimizer and dataloaders in `__init__`, or call `{method}()` once.",
            )
            return False
        plan.owner = cls
    elif plan.class_mode and not plan.setup.endswith(".__init__"):
        facts.finding(
            plan, first, "ACC107", f"the optimizer is built in `{plan.setup}`, not in `__init__`; file not converted.",
            "build the model, optimizer and dataloaders in `__init__`.",
        )
        return False
    return True


def _method_setup(facts: Facts, cls: str, method: str) -> Optional[str]:
    """A trainer class whose optimizer is built in a method (``Trainer.train``): ``prepare`` can go
    there when the class builds its model in ``__init__`` and the method runs once. None when it
    can, else why not (for the finding)."""
    if scope_root(facts.module, f"{cls}.__init__") is None:
        return f"`{cls}` has no `__init__` to create the Accelerator in"
    instances = {
        ref for ref, assigns in facts.assigns.items()
        if all(isinstance(a.value, cst.Call) and m.matches(a.value.func, m.Name(cls)) for a in assigns)
    }
    uses = [
        node for node in findall(facts.module, m.Attribute(attr=m.Name(method)))
        if ref_of(facts, node.value) in instances  # type: ignore[attr-defined]
        or m.matches(node.value, m.Call(func=m.Name(cls)))  # type: ignore[attr-defined]
        or (code_of(node.value) == "self" and (key_at(facts, node) or "").split(".")[0] == cls)  # type: ignore[attr-defined]
    ]
    if not uses:
        return f"`{method}` is not called in this file (called from elsewhere, it may run `prepare` more than once)"
    if len(uses) != 1:
        return f"`{method}` is used {len(uses)} times (`prepare` there must run exactly once)"
    use = uses[0]
    parent = facts.get_metadata(ParentNodeProvider, use, None)
    if not isinstance(parent, cst.Call) or parent.func is not use or code_of(use.value) == "self":
        return f"`{method}` is not simply called once on an instance of `{cls}`"
    node: Optional[cst.CSTNode] = parent
    while node is not None:
        if isinstance(node, (cst.For, cst.While, cst.CompFor)):
            return f"`{method}` is called in a loop (`prepare` there must run exactly once)"
        node = facts.get_metadata(ParentNodeProvider, node, None)
    return None


def init_objects(facts: Facts, plan: Plan) -> bool:
    """Method mode: ``plan.built_in_init``, the objects ``prepare`` takes as they are when the method
    runs; False (ACC104) when another method that trains binds one of them."""
    again = _init_objects(facts, plan, plan.owner)
    if again is not None:
        name = next(n for n in plan.core() if binds(cst.SimpleStatementLine([again]), {n}))
        facts.finding(
            plan, again, "ACC104", f"`{name}` is bound in `{facts.assign_key[id(again)]}`, which trains it, but "
            f"prepared in `{plan.setup}`: the object bound there would train unprepared; file not "
            "converted.",
            f"bind `{name}` once in `__init__`, or load the new weights into it with `load_state_dict`.",
        )
        return False
    return True


def _init_objects(facts: Facts, plan: Plan, cls: str) -> Optional[cst.Assign]:
    """Method mode: the ``self`` objects built outside the method that prepares them (the model
    ``__init__`` builds, one ``load_model`` builds anew: ``prepare`` takes the one there is when
    the method runs); an assignment in another method that trains, if there is one."""
    for name in plan.core():
        if not name.startswith("self."):
            continue
        assigns = facts.assigns.get((cls, name), [])
        if any(facts.assign_key[id(a)] == plan.setup for a in assigns):
            continue
        training = [a for a in assigns if (facts.assign_key[id(a)] or "").rpartition(".")[2] in facts.trainers]
        if training:
            return training[0]
        plan.built_in_init.append(name)
    return None


def reaches_training(facts: Facts, plan: Plan, first: cst.Assign) -> bool:
    """False (ACC107) when the setup function is a factory that returns the training objects: an
    Accelerator created there would not reach the code that trains them."""
    factory = scope_root(facts.module, plan.setup) if not plan.class_mode and plan.setup != MODULE else None
    if factory is not None and not plan.has_accelerator and _returns_training_objects(facts, plan, factory):
        facts.finding(
            plan, first, "ACC107", f"the optimizer is built in `{plan.setup}`, which returns the training objects: an "
            "Accelerator created there would not reach the code that trains; file not converted.",
            "create the Accelerator where the training loop runs and call `accelerator.prepare(...)` on what "
            f"`{plan.setup}()` returns.",
        )
        return False
    return True


def _returns_training_objects(facts: Facts, plan: Plan, func: cst.FunctionDef) -> bool:
    """A factory: ``return model, optimizer`` (objects built here are trained elsewhere)."""
    core = plan.refs(plan.core())
    if findall(func.body, BACKWARD):
        return False  # it trains them too: `return model` at the end hands back the trained model
    for ret in findall(func.body, m.Return()):
        if ret.value is None or key_at(facts, ret) != plan.setup:  # type: ignore[attr-defined]
            continue
        if any(ref_of(facts, node) in core for node in findall(ret.value, m.Name())):  # type: ignore[attr-defined]
            return True
    return False


def place(facts: Facts, plan: Plan) -> bool:
    """``plan.has_prepare`` (the script already calls ``prepare``) and ``plan.rebound_models``; else
    whether the one ``prepare`` call can go after the last training object: False when not."""
    plan.has_prepare = f"{plan.accelerator}.prepare(" in facts.module.code
    if not plan.has_prepare and not _prepare_point_ok(facts, plan):
        return False
    if plan.has_prepare:  # converted code: a model bound again after training is still a plain one
        root = scope_root(facts.module, plan.setup)
        located = locate_setup(root, set(plan.anchors()), facts.trainers, touches=plan.touches()) if root is not None else None
        if located is not None:
            after = bound_again(located[0].body[located[1]:], set(plan.anchors()), facts.trainers)
            plan.rebound_models = [n for n in plan.models if any(binds(stmt, {n}) for stmt in after)]
    return True


def _read_before(stmts: Sequence[cst.BaseStatement], name: str) -> bool:
    """After the first statement that binds ``name`` (under a condition), a statement of the same block
    reads it whatever path ran (``model.to(device)``, ``if block_size < model.config.block_size:``): the
    script itself needs it bound there, so ``prepare`` after it reads nothing the original did not
    (nanoGPT's ``if init_from == 'scratch': ... elif init_from == 'resume': ...`` has no ``else``)."""
    first = next((i for i, stmt in enumerate(stmts) if binds(stmt, {name})), None)
    if first is None:
        return False
    for stmt in stmts[first + 1:]:
        if isinstance(stmt, cst.SimpleStatementLine):
            parts: list[cst.CSTNode] = [stmt]
        elif isinstance(stmt, (cst.If, cst.While)):
            parts = [stmt.test]
        elif isinstance(stmt, cst.For):
            parts = [stmt.iter]
        else:
            parts = []
        if any(findall(part, m.Name(name)) for part in parts) and not any(
            findall(part, m.Lambda() | m.ListComp() | m.GeneratorExp() | m.DictComp() | m.SetComp()) for part in parts
        ):
            return True
        if binds(stmt, {name}) and not _rebinds_from_itself(stmt, name):
            return False
    return False


def _rebinds_from_itself(stmt: cst.BaseStatement, name: str) -> bool:
    """``if device == "cuda": net = torch.nn.DataParallel(net)``: under a condition, every binding of ``name``
    reads it (a wrapper around it): where ``name`` was unbound that reads it first, so it binds nothing new."""
    if not isinstance(stmt, cst.If):
        return False
    assigns = [a for a in findall(stmt, m.Assign()) if any(
        n.value == name for t in a.targets for n in findall(t.target, m.Name()))]  # type: ignore[attr-defined]
    return bool(assigns) and all(findall(a.value, m.Name(name)) for a in assigns)  # type: ignore[attr-defined]


def _only_copied(facts: Facts, call: cst.Call, core: set) -> bool:
    """``ModelEMA(args, model, decay)`` whose ``__init__`` reads the training object it is handed only as
    ``deepcopy(model)`` (FixMatch's EMA): it keeps a copy, whose weights are the same before ``prepare`` as
    after it (the original made it before ``DistributedDataParallel`` too), never the object itself."""
    cls = facts.classes[call.func.value]  # type: ignore[attr-defined]
    init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    bound = bind_arguments(init, call, skip_self=True) if init is not None else None
    if init is None or bound is None:
        return False
    copies = {id(a.value) for c in findall(init, m.Call(func=m.Name("deepcopy") | m.Attribute(attr=m.Name("deepcopy"))))
              for a in c.args}  # type: ignore[attr-defined]
    handed = [name for name, value in bound.items() if ref_of(facts, value) in core]
    for name in handed:
        reads = findall(init.body, m.Name(name))
        if not reads or not all(id(n) in copies for n in reads):
            return False
    return bool(handed)


def _prepare_point_ok(facts: Facts, plan: Plan) -> bool:
    module = facts.module
    names = plan.anchors()
    listed = ", ".join(plan.core())
    root = scope_root(module, plan.setup)
    located = locate_setup(root, set(names), facts.trainers, touches=plan.touches()) if root is not None else None
    if located is None:
        facts.finding(
            plan, module.body[0] if root is None else root, "ACC104",
            "the dataloaders, models and optimizers are not built in one block; file not converted.",
            f"build them in the same block, then call `{listed} = {plan.accelerator}.prepare({listed})` once.",
        )
        return False
    block, index = located
    core = plan.refs(plan.core())
    for stmt in block.body[:index]:
        for call in findall(stmt, m.Call(func=m.Name())):
            handed = [a.value for a in call.args if ref_of(facts, a.value) in core]  # type: ignore[attr-defined]
            if call.func.value in facts.classes and handed and not _only_copied(facts, call, core):  # type: ignore[attr-defined]
                facts.finding(
                    plan, call, "ACC104",
                    f"`{code_of(call.func)}` is handed `{code_of(handed[0])}` before the "  # type: ignore[attr-defined]
                    "last training object is built, where `prepare` goes: it would keep the unprepared "
                    "object. File not converted.",
                    f"build every training object first, then `{code_of(call.func)}(...)` after "  # type: ignore[attr-defined]
                    f"`{plan.accelerator}.prepare(...)`.",
                )
                return False
    loaders, models = plan.refs(plan.dataloaders), plan.refs(plan.models)
    for stmt in block.body[:index]:
        # (a loop that only looks at a batch, `for batch in loader: break`, runs the same on the unprepared loader)
        early = next((loop for loop in findall(stmt, m.For())
                      if ref_of(facts, peel_iterable(facts, loop.iter)) in loaders  # type: ignore[attr-defined]
                      and any(ref_of(facts, n) in models for n in findall(loop.body, m.Name()))), None)
        if early is not None:
            loader = code_of(peel_iterable(facts, early.iter))  # type: ignore[attr-defined]
            facts.finding(
                plan, early, "ACC104",
                f"the loop over `{loader}` runs the model before the last training object is built, where "
                "`prepare` goes: it would run on the unprepared loader in every process (each the whole data, "
                "on the CPU beside a model on the accelerator). File not converted.",
                f"build every training object before that loop (the optimizer too), or prepare `{loader}` and "
                "the model before it by hand.",
            )
            return False
    exhaustive = _exhaustive_choices(facts)
    for name in names:
        if not bound_on_all_paths(block.body[:index], name, exhaustive) and not _read_before(block.body[:index], name):
            facts.finding(
                plan, next((st for st in block.body[:index] if binds(st, {name})), block.body[index - 1]), "ACC104",
                f"`{name}` is bound only under a condition: `prepare` after it would read a name that may not "
                "exist; file not converted.",
                f"bind `{name}` on every path (`{name} = None` in the other branch is not enough: `prepare` "
                "needs the object), or call `prepare` inside the condition by hand.",
            )
            return False
    # `prepare` goes after the last binding before training. An object bound again after
    # that is a new one: a model re-created to reload a checkpoint and test it stays a plain
    # model on `accelerator.device`; anything else bound again, or training after it, would
    # run on unprepared objects.
    after = bound_again(block.body[index:], set(names), facts.trainers)
    if not _loaders_kept_in_training(facts, plan, block.body[index:], after):
        return False
    rebound = [n for n in names if any(binds(stmt, {n}) for stmt in after)]
    if not rebound:
        return True
    first = next(i for i, stmt in enumerate(after) if binds(stmt, set(rebound)))
    training = next((stmt for stmt in after[first:] if trains(stmt, facts.trainers, frozenset(names))), None)
    others = [n for n in rebound if n not in plan.models]
    if training is not None or others:
        what = ", ".join(others or rebound)
        where = training if training is not None and not others else after[first]
        facts.finding(
            plan, where, "ACC104",
            f"`{what}` is bound again after training starts (line {facts.line(after[first])})"
            + (" and trained again after that" if training is not None and not others else "")
            + ": one `prepare` cannot cover both objects, and the second would train unprepared; file not "
            "converted.",
            f"give the object bound again a name of its own (`best_model = ...`), or build every training "
            f"object before the loop, so that `{listed} = {plan.accelerator}.prepare({listed})` covers "
            "what trains.",
        )
        return False
    plan.rebound_models = rebound
    return True


def _loaders_kept_in_training(facts: Facts, plan: Plan, region: Sequence[cst.BaseStatement],
                              after: list[cst.BaseStatement]) -> bool:
    """False (ACC123) when the statement that trains (the one ``bound_again`` leaves out: ``model = train(model)``
    hands the model back) binds a prepared DataLoader again inside it (StyleGAN's ``loader = sample_data(dataset,
    batch_size, resolution)`` at each new resolution, in the loop that trains): the new loader never goes through
    ``prepare``, and from there every process would train on all of its data."""
    kept = {id(s) for s in after}
    for stmt in region:
        if id(stmt) in kept or isinstance(stmt, cst.SimpleStatementLine):
            continue
        assigns = findall(stmt, m.Assign())
        for name in plan.dataloaders:
            again = next((a for a in assigns if binds(cst.SimpleStatementLine([a]), {name})
                          and facts.assign_key.get(id(a)) == plan.setup  # type: ignore[arg-type]
                          and code_of(peel_iterable(facts, a.value)) != name), None)  # not `loader = tqdm(loader)`
            if again is None:
                continue
            value = again.value  # type: ignore[attr-defined]
            made = f"{code_of(value.func)}(...)" if isinstance(value, cst.Call) else code_of(value)
            facts.finding(
                plan, again, "ACC123",
                f"`{name}` is bound again to `{made}` in the loop that trains: that loader never goes through "
                "`prepare`, so from there every process would train on all of its data. File not converted.",
                f"prepare the new loader where it is made (`{name} = {plan.accelerator}.prepare({made})`), or build "
                "one loader before training.",
            )
            return False
    return True


def _exhaustive_choices(facts: Facts):
    """A test of an ``if``/``elif`` chain with no ``else``: does the chain compare one option with
    every value its ``choices=[...]`` allow (DINO: ``if args.optimizer == "adamw": ... elif ... ==
    "sgd": ... elif ... == "lars":`` with ``choices=['adamw', 'sgd', 'lars']``)? argparse rejects
    any other value, so one branch always runs."""
    choices: dict[str, set[str]] = {}
    for call in facts.calls:
        if not m.matches(call.func, m.Attribute(attr=m.Name("add_argument"))) or not call.args:
            continue
        option = string_value(call.args[0].value)
        listed = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "choices"), None)
        if option is None or not option.startswith("--") or not isinstance(listed, (cst.List, cst.Tuple, cst.Set)):
            continue
        values = {string_value(e.value) for e in listed.elements}
        if None not in values:
            choices[option[2:].replace("-", "_")] = values  # type: ignore[assignment]

    def exhaustive(chain: cst.If) -> bool:
        seen: set[str] = set()
        attrs: set[str] = set()
        node: object = chain
        while isinstance(node, cst.If):
            test = node.test
            if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                    and isinstance(test.comparisons[0].operator, cst.Equal)
                    and isinstance(test.left, cst.Attribute) and isinstance(test.left.value, cst.Name)
                    and string_value(test.comparisons[0].comparator) is not None):
                return False
            attrs.add(test.left.attr.value)
            seen.add(string_value(test.comparisons[0].comparator))  # type: ignore[arg-type]
            node = node.orelse
        return node is None and len(attrs) == 1 and next(iter(attrs)) in choices and choices[next(iter(attrs))] <= seen

    return exhaustive
