"""An evaluation whose metrics no gather can collect runs over the whole set on every process.

A training script's test loader is prepared, and the metrics of the loop over it gathered
(``accelerator.gather_for_metrics``, ACC011). Where no gather can pair what the metrics read
(a top-k over the batch, a model call accelify does not follow, a value rebuilt batch after
batch), the expert's other answer is not to shard that loader at all: every process evaluates
the whole set, its metrics are the whole set's, as in one process, and every process agrees on
what follows from them (the best checkpoint, an early stop). It costs N times the evaluation's
work, no more. The loader is then not prepared; its batches are placed on
``accelerator.device`` like any tensor the script places.

Only where that is sure: the loader is used by evaluation loops alone (no backward in them;
read otherwise only through ``len(...)`` and attributes, and through the helpers the setup hands
it to), none of them runs under a main-process check (the prepared model's first forward after
training syncs its buffers across processes), no sampler of its own, no collective written by
hand anywhere in the file (it would sum N copies of the same metric), a training script (an
evaluation script is all evaluation: sharding it is the point).

Input: the facts, ``plan.dataloaders`` and ``plan.flow["loader"]`` (after the helpers' flows).
Output: those two without the loaders left whole, ``plan.unsharded`` and ``plan.unsharded_loops``, and a
note (ACC146) per loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.evaluation import assigns_in_loops, kept_by
from accelify.analyses.facts import Facts, bind_arguments, param_names
from accelify.analyses.gathers import Refusal, find_gather
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.blocks import enclosing_function
from accelify.queries.loops import peel_iterable
from accelify.queries.names import qualified_names
from accelify.queries.refs import Ref, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

#: ``torch.distributed`` calls that combine values across processes: a metric reduced by hand would add
#: up N copies of the whole set's.
_COLLECTIVES = frozenset({"all_reduce", "reduce", "all_gather", "all_gather_object", "gather", "reduce_scatter",
                          "all_gather_into_tensor", "gather_object"})


def decide(facts: Facts, plan: Plan) -> bool:
    """Take out of ``plan`` the loaders an evaluation runs over whole (see the module). Never refuses."""
    if plan.evaluation or plan.class_mode or _reduces_by_hand(facts):
        return True
    loops: dict[str, list[tuple[cst.For, Optional[str]]]] = {}  # loader -> its loops, why each cannot be gathered
    origins_of: dict[int, set[str]] = {}  # loop -> the loaders it runs over
    in_loops = assigns_in_loops(facts)
    for loop in facts.loops:
        ref = ref_of(facts, peel_iterable(facts, loop.iter))
        if ref not in plan.flow["loader"]:
            continue
        origins = _origins(facts, plan, ref, 0)
        if origins is None:
            return True  # a loop over a loader accelify cannot trace to its DataLoader: leave every loader as it is
        origins_of[id(loop)] = origins
        why = _why_not_gathered(facts, plan, loop, in_loops)
        for origin in origins:
            loops.setdefault(origin, []).append((loop, why))
    whole = {name for name, found in loops.items()
             if any(why is not None for _, why in found) and all(_evaluates(facts, loop) for loop, _ in found)
             and not any(_runs_another_model(facts, plan, loop) for loop, _ in found)
             and _plain_loader(facts, plan, name)}
    # a loop over loaders of which one stays prepared cannot be left whole for the other
    shared = True
    while shared:
        shared = False
        for name in sorted(whole):
            if any(origins_of[id(loop)] - whole for loop, _ in loops[name]):
                whole.discard(name)
                shared = True
    if not whole:
        return True
    plan.dataloaders = [name for name in plan.dataloaders if name not in whole]
    plan.flow["loader"] = {ref for ref in plan.flow["loader"] if not set(_origins(facts, plan, ref, 0, whole) or ()) & whole}
    plan.unsharded = sorted(whole)
    plan.unsharded_loops = {id(loop) for name in whole for loop, _ in loops[name]}
    for name in sorted(whole):
        loop, why = next((loop, why) for loop, why in loops[name] if why is not None)
        facts.note(
            plan, loop, "ACC146",
            f"`{name}` is not prepared: the metrics of this loop cannot be gathered ({why}), so every process "
            "evaluates the whole set, and its metrics are the whole set's, as in one process (N times the "
            "evaluation's work).",
            f"to share the evaluation out, gather what the metrics read (`accelerator.gather_for_metrics(...)`) "
            f"and prepare `{name}` with the others.",
        )
    return True


def _why_not_gathered(facts: Facts, plan: Plan, loop: cst.For, in_loops: set[int]) -> Optional[str]:
    """Why the metrics of ``loop`` (over a prepared loader) cannot be gathered; None when they can, or it
    keeps none. ``in_loops``: the ids of the assignments inside some loop."""
    if findall(loop.body, m.Attribute(attr=m.Name("backward"))):
        return None
    found = find_gather(facts, loop, plan)
    if isinstance(found, Refusal):
        return found.message.removesuffix(" File not converted.").rstrip(".")
    if isinstance(found, str):
        return found
    return kept_by(facts, loop, frozenset(), in_loops)


#: Methods of a module that return the module itself (``classifier = model.eval()``).
_RETURN_SELF = frozenset({"eval", "train", "to", "cuda", "float", "half", "double", "bfloat16", "requires_grad_"})


def _runs_another_model(facts: Facts, plan: Plan, loop: cst.For) -> bool:
    """The loop calls a name bound in its function (a parameter, an assignment) that accelify does not trace to
    the prepared model or to a loss: another model (FixMatch's EMA copy ``ema_model.ema``, a
    ``copy.deepcopy(model)`` left where it was made), whose device accelify does not know. Calls of the file's
    functions and classes, of imported names and of attributes are not such calls; a model handed on as
    ``classifier.eval()`` and bound again as ``classifier = model.eval()`` (PointNet's) is the prepared one."""
    for call in findall(loop.body, m.Call(func=m.Name())):
        name = call.func.value  # type: ignore[attr-defined]
        if name in facts.functions or name in facts.classes:
            continue
        ref = ref_of(facts, call.func)  # type: ignore[attr-defined]
        if ref is None or not (facts.assigns.get(ref) or _parameter(facts, ref)):
            continue  # a builtin, an import, a name bound in a way accelify does not follow
        if not _known_callable(facts, plan, call.func, 0):  # type: ignore[arg-type]
            return True
    return False


def _parameter(facts: Facts, ref: Ref) -> bool:
    func = facts.functions.get(ref[0])
    return func is not None and ref[1] in param_names(func)


def _known_callable(facts: Facts, plan: Plan, expr: cst.BaseExpression, depth: int) -> bool:
    """``expr`` is the prepared model (a name it flows into, through ``.eval()``-like calls, single assignments and
    the parameters every call hands it), a loss (``nn.CrossEntropyLoss()``, ``F.mse_loss``), or a function."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _RETURN_SELF:
        expr = expr.func.value
    if isinstance(expr, cst.Lambda):
        return True
    if isinstance(expr, cst.Call) and any(q.rsplit(".", 1)[-1].endswith("Loss") for q in qualified_names(facts, expr.func)):
        return True  # a loss module: nothing of its own to place (or the script's weights, placed as before)
    names = qualified_names(facts, expr)
    if names and any(q.startswith("torch.nn.functional.") or q.rsplit(".", 1)[-1].endswith("_loss") for q in names):
        return True
    if isinstance(expr, cst.Name) and (expr.value in facts.functions or expr.value in facts.classes):
        return True  # a function of the file handed on
    ref = ref_of(facts, expr)
    if ref is None or depth > 5:
        return False
    if ref in plan.flow["model"]:
        return True
    assigns = facts.assigns.get(ref, [])
    if _parameter(facts, ref):
        func = facts.functions[ref[0]]
        sites = facts.call_sites(ref[0], func)
        return not assigns and bool(sites) and all(
            bound.get(ref[1]) is not None and _known_callable(facts, plan, bound[ref[1]], depth + 1) for _, bound in sites)
    return len(assigns) == 1 and _known_callable(facts, plan, assigns[0].value, depth + 1)


def _evaluates(facts: Facts, loop: cst.For) -> bool:
    """``loop`` runs no backward, nothing that trains, and not on the main process only (its own rank test,
    or one around a call of its function, or of the function that calls it)."""
    if findall(loop.body, m.Attribute(attr=m.Name("backward") | m.Name("step") | m.Name("zero_grad"))):
        return False
    return not under_main_process_check(facts, loop) and _on_every_process(facts, enclosing_function(facts, loop), 0)


def _on_every_process(facts: Facts, func: Optional[cst.FunctionDef], depth: int) -> bool:
    """Every call of ``func`` (None: module level) runs on every process, as far as the file shows."""
    if func is None:
        return True
    name = func.name.value
    if facts.functions.get(name) is not func or depth > 4:
        return False  # a method or a nested function: its calls are not followed
    sites = facts.call_sites(name, func)
    return bool(sites) and all(
        not under_main_process_check(facts, call) and _on_every_process(facts, enclosing_function(facts, call), depth + 1)
        for call, _ in sites)


def _origins(facts: Facts, plan: Plan, ref: Optional[Ref], depth: int,
             among: Optional[set[str]] = None) -> Optional[set[str]]:
    """The DataLoaders of the setup scope whose values reach ``ref`` (a loader itself, or a parameter every call
    hands one); None when some call hands something else, or the trail is lost. ``among``: loaders no longer in
    ``plan.dataloaders`` that count still."""
    names = [*plan.dataloaders, *(among or ())]
    for name in names:
        if plan.ref(name) == ref:
            return {name}
    if ref is None or depth > 4:
        return None
    key, param = ref
    func = facts.functions.get(key)
    if func is None or param not in param_names(func):
        return None
    sites = facts.call_sites(key, func)
    if not sites:
        return None
    found: set[str] = set()
    for _, bound in sites:
        arg = bound.get(param)
        sub = _origins(facts, plan, ref_of(facts, arg), depth + 1, among) if arg is not None else None
        if sub is None:
            return None
        found |= sub
    return found


def _plain_loader(facts: Facts, plan: Plan, name: str) -> bool:
    """``name`` is built by one ``DataLoader(...)`` with no distributed sampler, and read only as what a loop
    runs over, in ``len(...)``, through an attribute (``loader.dataset``), or handed to a function of the file."""
    assigns = facts.assigns.get(plan.ref(name), [])
    if len(assigns) != 1 or not isinstance(assigns[0].value, cst.Call):
        return False
    for arg in assigns[0].value.args:
        if arg.keyword is not None and arg.keyword.value in ("sampler", "batch_sampler") and any(
                "Distributed" in q for c in findall(arg.value, m.Call()) for q in qualified_names(facts, c.func)):  # type: ignore[attr-defined]
            return False
    return _read_plainly(facts, assigns[0].targets[0].target, name, 0)


def _read_plainly(facts: Facts, bound: cst.CSTNode, name: str, depth: int) -> bool:
    """Every read of ``name`` (bound at ``bound``) is what a loop runs over, ``len(...)``, an attribute
    (``loader.dataset``), or an argument to a function of the file whose parameter is read so in turn."""
    scope = facts.get_metadata(ScopeProvider, bound, None)
    if scope is None or depth > 4:
        return False
    for access in scope.accesses[name]:
        node = access.node
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            continue  # `loader.dataset`, `loader.batch_size`
        call = facts.get_metadata(ParentNodeProvider, parent, None) if isinstance(parent, cst.Arg) else None
        if isinstance(call, cst.Call) and m.matches(call.func, m.Name("len")):
            continue
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in facts.functions:
            func = facts.functions[call.func.value]
            given = bind_arguments(func, call) or {}
            param = next((p for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)
                          if given.get(p.name.value) is node), None)
            if param is not None and _read_plainly(facts, param.name, param.name.value, depth + 1):
                continue
            return False
        if not _looped_over(facts, node, depth):
            return False
    return True


def _looped_over(facts: Facts, node: cst.CSTNode, depth: int) -> bool:
    """``node`` is what a ``for`` loop runs over, itself or through ``enumerate(...)``/``tqdm(...)`` in its header
    or in a name read so (``val_bar = tqdm(val_loader)``); not ``next(iter(loader))``: that batch is the
    script's to place."""
    current = node
    while True:
        parent = facts.get_metadata(ParentNodeProvider, current, None)
        if isinstance(parent, cst.For):
            return parent.iter is current
        if current is not node and isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
                parent.targets[0].target, cst.Name):
            target = parent.targets[0].target
            return _read_plainly(facts, target, target.value, depth + 1)
        call = facts.get_metadata(ParentNodeProvider, parent, None) if isinstance(parent, cst.Arg) else None
        if not (isinstance(call, cst.Call) and peel_iterable(facts, call) is node):
            return False
        current = call


def _reduces_by_hand(facts: Facts) -> bool:
    """A ``torch.distributed`` collective anywhere in the file."""
    for call in facts.calls:
        if any(q.startswith("torch.distributed.") and q.rsplit(".", 1)[-1] in _COLLECTIVES
               for q in qualified_names(facts, call.func)):
            return True
    return False

