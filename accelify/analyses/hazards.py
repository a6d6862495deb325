"""Hazards: code that trains correctly in one process and wrongly, or not at all, in several.

Some refuse the file: a backward with no optimizer accelify recognises (ACC125), a backward that cannot reach the Accelerator (ACC106), an
attribute of the model read on the DistributedDataParallel wrapper ``prepare`` returns (ACC120).
Others are reported for a human and the file is still converted: a collective under a main-process check (ACC116), leaving the training loop on a value
each process computes from its own shard (ACC119, :mod:`accelify.analyses.early_stop`).

Input: the facts (backwards, calls, loops and exits) and the whole plan so far (the Accelerator's
spelling and reach, the prepared objects).  Output: those findings; no plan field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.facts import Facts
from accelify.analyses.foreign import ForeignFunction, called_function
from accelify.analyses.helpers import why_no_accelerator
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.blocks import enclosing_function, under
from accelify.queries.names import MODULE_HOLDERS, OPTIMIZER_NAME, code_of, qualified_names, root_name, star_imports
from accelify.queries.refs import ACCELERATOR_SPELLINGS, key_at, scope_key
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

COLLECTIVES = frozenset({"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})

def untrained_backward(facts: Facts, plan: Plan) -> None:
    """ACC125: a file that runs a backward but has no optimizer accelify recognises is left as it
    is: say so (the parameters are updated by hand, or by an optimizer from a factory)."""
    backwards = [c for c in facts.backwards if _tensor_backward(facts, c) and not _delegating(facts, c)
                 and code_of(c.func.value) not in ACCELERATOR_SPELLINGS]  # type: ignore[attr-defined]
    if not backwards or plan.has_accelerator or findall(facts.module, m.Name("Accelerator")):
        return
    hidden = _star_imported_optimizer(facts)
    if hidden is not None:
        call, stars = hidden
        facts.finding(
            plan, call, "ACC125",
            f"`{code_of(call.func)}` reads `{code_of(root_name(call.func))}`, which only {stars} brings into this file: "
            "accelify cannot tell that it is PyTorch's optimizer. File not converted.",
            f"import it by name (`import {code_of(root_name(call.func))}`), then run accelify again.",
        )
        return
    factories = _unread_factories(facts)
    for call, function in factories:
        facts.finding(
            plan, call, "ACC125",
            f"`{code_of(call.func)}` builds the optimizer in `{function.module}`, and accelify cannot tell what it "
            f"trains: it {function.why if function.unsafe or function.writes else _NO_FACTORY}. "
            "File not converted.",
            f"make `{code_of(call.func)}` only build and return the optimizer over the model it is handed "
            "(`torch.optim.SGD(model.parameters(), ...)`), or build it beside the model.",
        )
    firsts: dict[str, cst.Call] = {}
    for call in backwards:  # one finding per function that trains (an entry and a module converted with it)
        firsts.setdefault(key_at(facts, call) or "", call)
    for key in {key_at(facts, call) or "" for call, _ in factories}:
        firsts.pop(key, None)  # said where the optimizer comes from
    for call in firsts.values():
        facts.finding(
            plan, call, "ACC125",
            "this file runs a backward pass, but builds no optimizer accelify recognises (a `torch.optim` class, or "
            "an optimizer over `model.parameters()`): the parameters are updated by hand, or by an optimizer "
            "made elsewhere. File not converted.",
            "build the optimizer beside the model (`torch.optim.SGD(model.parameters(), ...)`), or convert by "
            "hand: `accelerator.prepare(model, ...)` and `accelerator.backward(loss)`.",
        )


_NO_FACTORY = "does not return an optimizer it builds over the parameters of a model it is handed"


def _unread_factories(facts: Facts) -> list[tuple[cst.Call, ForeignFunction]]:
    """``optimizer = get_optimizer(args.name, model)`` where ``get_optimizer``, a function of another module of the
    project named for optimizers, is no factory accelify can read (accelify.analyses.foreign: ``trains``)."""
    found = []
    for assigns in facts.assigns.values():
        for assign in assigns:
            call = assign.value
            if not isinstance(call, cst.Call) or not OPTIMIZER_NAME.search(code_of(call.func).rsplit(".", 1)[-1]):
                continue
            function = called_function(facts, facts.module, facts.foreign, call.func)
            if function is not None and function.trains is None:
                found.append((call, function))
    return found


def _star_imported_optimizer(facts: Facts) -> Optional[tuple[cst.Call, str]]:
    """``torch.optim.SGD(...)`` where ``torch`` is bound by no import but a ``from x import *`` of
    the file may bring it (DeepLab's ``from modeling.deeplab import *``): the call and how to name
    the star imports."""
    stars = star_imports(facts.module)
    if not stars:
        return None
    for call in facts.calls:
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)
                and func.value.attr.value == "optim"):
            continue
        root = root_name(func)
        scope = facts.get_metadata(ScopeProvider, root, None) if root is not None else None
        if scope is not None and not list(scope[root.value]):  # type: ignore[union-attr]
            return call, "a star import (" + ", ".join(f"`from {s} import *`" for s in stars) + ")"
    return None


def backwards_in_reach(facts: Facts, plan: Plan) -> bool:
    """False (ACC106) when a tensor ``.backward()`` cannot reach the Accelerator."""
    unreachable = _backward_out_of_reach(facts, plan)
    if unreachable is not None:
        why = why_no_accelerator(facts, plan, key_at(facts, unreachable) or "")
        facts.finding(
            plan, unreachable, "ACC106", f"this backward cannot reach the script's Accelerator ({why}), and with a "
            "prepared optimizer a plain backward is wrong under fp16, accumulation or DeepSpeed; file not converted.",
            "pass the accelerator to this function and call `accelerator.backward(loss)`.",
        )
        return False
    return True


def _delegating(facts: Facts, call: cst.Call) -> bool:
    """A backward inside a function named ``backward`` (DeepSpeed's wrapper, ``def backward(self, loss):
    self.engine.backward(loss)``): it trains nothing until the wrapper is called, and that call is the file's
    backward if the file makes one. ``accelify.core.precheck`` skips the same."""
    return "backward" in (key_at(facts, call) or "").split(".")


def _tensor_backward(facts: Facts, call: cst.Call) -> bool:
    """``loss.backward()``, not the function ``torch.autograd.backward(...)``."""
    return not qualified_names(facts, call.func.value) & {"torch.autograd", "torch"}  # type: ignore[attr-defined]


def _backward_out_of_reach(facts: Facts, plan: Plan) -> Optional[cst.Call]:
    """A tensor ``.backward()`` that cannot go through the Accelerator.

    With the optimizer prepared, such a backward is wrong as soon as the launcher picks
    fp16 (the prepared optimizer unscales gradients nobody scaled), accumulation or
    DeepSpeed: the file is better left as it is.
    """
    for call in facts.backwards:
        key = key_at(facts, call)
        if key is None or plan.accelerator_in(key) is not None or key in plan.needs_accelerator:
            continue
        if not _tensor_backward(facts, call):
            continue
        if code_of(call.func.value) in (plan.accelerator, *ACCELERATOR_SPELLINGS):  # type: ignore[attr-defined]
            continue
        scope = facts.get_metadata(ScopeProvider, call, None)
        if scope is not None and any(scope_key(a.scope) == key for a in scope["accelerator"]):
            continue  # hand-written Accelerate code with its own accelerator
        return call
    return None


def multi_process(facts: Facts, plan: Plan) -> bool:
    """Constructs that are fine in one process and wrong in several (ACC116, ACC119; ACC120 and
    ACC114 for an evaluation on the main process only refuse the file: False)."""
    from accelify.analyses.early_stop import EarlyStops

    plan.findings.extend(
        EarlyStops(facts, plan, facts.module, [*facts.loops, *facts.whiles], facts.exits, trust_gathers=True).findings()
    )
    _swallowed_steps(facts, plan)
    refused = _wrapped_model_attributes(facts, plan) or _evaluated_by_one_process(facts, plan)
    refused = _container_models(facts, plan) or refused
    collectives_under_main_process(facts, plan)
    return not refused


def collectives_under_main_process(facts: Facts, plan: Plan) -> None:
    """ACC116: ``accelerator.wait_for_everyone()`` (a collective) inside ``if accelerator.is_main_process:``: the
    other processes never reach it and the run hangs. Said of a converted file, and of one on Accelerate already
    (the one thing accelify says of those: ``accelify.analyses.accelerator.prepared_by_hand``)."""
    for call in facts.calls:
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in COLLECTIVES
            and code_of(func.value) in (plan.accelerator, *ACCELERATOR_SPELLINGS)
            and under_main_process_check(facts, call)
        ):
            facts.finding(
                plan, call, "ACC116", f"`{func.attr.value}` is a collective: under a main-process check the other "
                "processes never reach it and the run hangs.",
                "call it outside the `if accelerator.is_main_process:` block, on every process.",
            )


#: exceptions every process meets at the same point (the end of an iterator) or that end the run
_SHARED_EXCEPTIONS = frozenset({"StopIteration", "KeyboardInterrupt", "SystemExit"})


def _swallowed_steps(facts: Facts, plan: Plan) -> None:
    """ACC151 (a note): a backward inside ``try:`` in a loop, whose ``except`` goes on without raising (RetinaNet's
    ``except Exception as e: print(e); continue``). One process that meets the error skips a step the others
    take: their gradient all-reduces then pair different steps, or wait for it."""
    seen: set[int] = set()
    for call in facts.backwards:
        child: cst.CSTNode = call
        node = facts.get_metadata(ParentNodeProvider, call, None)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module, cst.For, cst.While)):
            if isinstance(node, cst.Try) and child is node.body and id(node) not in seen:
                seen.add(id(node))
                handler = next((h for h in node.handlers if not findall(h.body, m.Raise()) and not (
                    h.type is not None and {code_of(t.value if isinstance(t, cst.Element) else t) for t in (
                        h.type.elements if isinstance(h.type, cst.Tuple) else [h.type])} <= _SHARED_EXCEPTIONS)), None)
                if handler is not None and under(facts, node, (cst.For, cst.While)):
                    facts.note(
                        plan, handler, "ACC151",
                        f"the training step (`{code_of(call)}`) runs inside `try:`, and this `except` goes on without "
                        "raising: an error that one process meets alone (a bad sample, one GPU out of memory) makes it "
                        "skip a step the others take, and from there their gradient all-reduces pair different steps "
                        "or wait for it.",
                        "let such errors stop the run (without the `try`), or decide to skip on every process alike "
                        "(`accelerator.gather` the condition first).",
                    )
            child, node = node, facts.get_metadata(ParentNodeProvider, node, None)




def _container_models(facts: Facts, plan: Plan) -> bool:
    """ACC147: the optimizer trains an ``nn.ModuleList`` (or ``ModuleDict``) and the script calls the modules in it
    (RepDistiller's ``trainable_list.append(model_s)``, ``SGD(trainable_list.parameters())``, then ``model_s(x)``):
    prepared, the container would be wrapped in DistributedDataParallel, whose ``forward`` never runs (a
    container has none), so no gradient would be averaged between the processes and each would train a model
    of its own. True when one is found: the file is not converted."""
    found = False
    for ref in sorted(plan.flow.get("model", ())):
        for assign in facts.assigns.get(ref, []):
            value = assign.value
            if isinstance(value, cst.Call) and qualified_names(facts, value.func) & MODULE_HOLDERS:
                name = ref[1]
                facts.finding(
                    plan, assign, "ACC147",
                    f"the optimizer trains `{name}`, a `{code_of(value.func)}`, which holds modules and has no "
                    "`forward`: prepared, it would be wrapped for distributed training, the wrapper would never run "
                    "(the script calls the modules in it), and no gradient would be averaged between the processes. "
                    "File not converted.",
                    "prepare the modules the script calls (`model = accelerator.prepare(model)`, each) and build the "
                    f"optimizer over their parameters, or call `{name}` through a module whose `forward` runs them.",
                )
                found = True
                break
    return found


def _evaluated_by_one_process(facts: Facts, plan: Plan) -> bool:
    """ACC114: an evaluation loop ACC011 would gather (or could not: it is an evaluation all the same), run on the main process only (``if rank == 0:``
    around it, or around every call of the function it is in). The gather is a collective: the
    main process would wait in it for processes that never come. True when one is found."""
    from accelify.analyses.gathers import find_gather

    for loop in facts.loops:
        if find_gather(facts, loop, plan) is None:  # (a reason why no gather can be made is no less an evaluation: FixMatch's test)
            continue
        func = enclosing_function(facts, loop)
        calls = [c for c, _ in facts.call_sites(func.name.value, func)] if func is not None and (
            func.name.value in facts.functions and facts.functions[func.name.value] is func) else []
        if under_main_process_check(facts, loop) or any(under_main_process_check(facts, c) for c in calls):
            facts.finding(
                plan, loop, "ACC114",
                "this evaluation runs on the main process only (under a rank test): over a prepared dataloader "
                "it sees one shard, and the gather that would collect the others is a collective the other "
                "processes never reach (the run would hang). File not converted.",
                "evaluate on every process (no rank test around the loop: `accelerator.gather_for_metrics` collects "
                "the whole set) and print the result under `if accelerator.is_main_process:`.",
            )
            return True
    return False


def _wrapped_model_attributes(facts: Facts, plan: Plan) -> bool:
    """ACC120: ``model.generate(...)``, ``model.config`` on a prepared model.

    In a multi-process run ``prepare`` returns a DistributedDataParallel wrapper,
    which has the ``nn.Module`` API and nothing of the model's own: an attribute
    of the model raises AttributeError there (and setting one sets it on the
    wrapper).  Code in the setup scope before the ``prepare`` point still holds
    the plain model and is not reported. True when one is found: the file is not converted.
    """
    from accelify.analyses.unwrapping import model_attribute, plain_model_statements, why_not_unwrapped

    if plan.has_prepare:
        return False
    plain = {
        id(n) for stmt in plain_model_statements(facts.module, plan, facts.trainers)
        for n in findall(stmt, m.Attribute())
    }
    reported: set[tuple[Optional[str], str, str]] = set()
    for node in findall(facts.module, m.Attribute()):
        if id(node) in plain or not model_attribute(facts, node, plan):  # type: ignore[arg-type]
            continue
        why = why_not_unwrapped(facts, node, plan)  # type: ignore[arg-type]
        if why is None:
            continue  # ACC016 reads it through `accelerator.unwrap_model(...)`
        attr = node.attr.value  # type: ignore[attr-defined]
        key = key_at(facts, node)
        model = code_of(node.value)  # type: ignore[attr-defined]
        if (key, model, attr) in reported:
            continue
        reported.add((key, model, attr))
        accelerator = plan.accelerator_in(key) or plan.accelerator
        facts.finding(
            plan, node, "ACC120",
            f"`{model}.{attr}` is the model's own attribute, and {why}: in a multi-process run `prepare` "
            "returns a DistributedDataParallel wrapper without it. File not converted.",
            f"use `{accelerator}.unwrap_model({model}).{attr}` outside the training step (under "
            "`torch.no_grad()`, at evaluation), or make it part of `forward`.",
        )
    return bool(reported)
