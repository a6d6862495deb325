"""Which attributes of a prepared model must be read from ``accelerator.unwrap_model(model)``
(a custom method or attribute the DDP wrapper hides), and why one cannot be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.data import foreign_callee
from accelify.queries.blocks import scope_root
from accelify.queries.names import TORCH_SAVE, has_qname, root_name
from accelify.queries.refs import key_at, ref_of
from accelify.queries.training import BACKWARD, LOAD_STATE_DICT, UNWRAP_MODEL, locate_setup, rebound_region
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

_DEEPCOPY = frozenset({"copy.deepcopy"})
_NO_GRAD = frozenset({
    "torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
})


def model_attribute(visitor: cst.MetadataDependent, node: cst.Attribute, plan: Plan) -> bool:
    """``model.decode``, ``model.config``: an attribute of a prepared model that ``nn.Module`` does not have."""
    return (
        node.attr.value not in MODULE_API  # `module` included: the DataParallel wrapper's (ACC006)
        and node.attr.value not in ("no_sync", "require_backward_grad_sync")  # the DDP wrapper's own (ACC018)
        and ref_of(visitor, node.value) in plan.flow["model"]
    )


def why_not_unwrapped(visitor: cst.MetadataDependent, node: cst.Attribute, plan: Plan) -> Optional[str]:
    """None when ``accelerator.unwrap_model(model).attr`` is right at ``node``; else the reason."""
    if plan.accelerator_in(key_at(visitor, node)) is None:
        return "this code cannot reach the Accelerator"
    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    if not (isinstance(parent, cst.Call) and parent.func is node):
        return None  # reading or setting a value (`model.config`) is the same on the plain model
    if _without_grad(visitor, node) or not _in_training_step(visitor, node):
        return None
    return ("it is called in the training step: run through the plain model, it would bypass the "
            "DistributedDataParallel wrapper that synchronises the gradients")


def _without_grad(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    current = visitor.get_metadata(ParentNodeProvider, node, None)
    while current is not None:
        if isinstance(current, cst.With):
            for item in current.items:
                call = item.item
                if has_qname(visitor, call.func if isinstance(call, cst.Call) else call, _NO_GRAD):
                    return True
        if isinstance(current, cst.FunctionDef):
            for decorator in current.decorators:
                dec = decorator.decorator
                if has_qname(visitor, dec.func if isinstance(dec, cst.Call) else dec, _NO_GRAD):
                    return True
        current = visitor.get_metadata(ParentNodeProvider, current, None)
    return False


def _in_training_step(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    """Does the innermost loop around ``node`` (or its function, or its top-level statement) run a
    backward itself, not in a loop nested in it? The code of an epoch loop around the batch loop
    runs between steps (``model.sample()`` after an epoch), not in one."""
    child, current = node, visitor.get_metadata(ParentNodeProvider, node, None)
    while current is not None:
        if isinstance(current, (cst.For, cst.While)) and child is current.body:
            return _steps(current.body)
        if isinstance(current, cst.FunctionDef):
            return _steps(current.body)
        if isinstance(current, cst.Module):
            return isinstance(child, cst.BaseStatement) and _steps(child)
        child, current = current, visitor.get_metadata(ParentNodeProvider, current, None)
    return False


def _steps(node: cst.CSTNode) -> bool:
    """A backward in ``node``, outside the loops nested in it."""
    nested = {id(n) for loop in findall(node, m.For() | m.While()) if loop is not node
              for n in findall(loop, BACKWARD)}
    return any(id(call) not in nested for call in findall(node, BACKWARD))


def plain_model_statements(
    module: cst.Module, plan: Plan, trainers: set[str], located: Optional[tuple] = None,
    ignore: frozenset[int] = frozenset(),
) -> list[cst.BaseStatement]:
    """Setup statements that hold the plain model: those before ``prepare`` (where ``located`` says
    it goes, else where the objects are bound), and those from a model bound again after training
    on (a reload for a test).  ``ignore``: statements the conversion leaves binding nothing."""
    root = scope_root(module, plan.setup)
    core = set(plan.anchors())
    if located is None:
        located = locate_setup(root, core, trainers, ignore, touches=plan.touches()) if root is not None else None
    if located is None:
        return []
    block, index = located
    before = [s for s in block.body[:index] if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
    return before + rebound_region(block, index, core, set(plan.rebound_models), trainers, ignore)

# What the DistributedDataParallel wrapper answers like the model: the nn.Module API. `module` is
# the wrapper's own (ACC006 rewrites it).
MODULE_API = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "eval",
    "extra_repr", "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half",
    "load_state_dict", "modules", "named_buffers", "named_children", "named_modules", "named_parameters",
    "parameters", "register_backward_hook", "register_buffer", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_module",
    "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_",
    "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training",
    "type", "xpu", "zero_grad", "module", "__class__", "__dict__",
})


def handed_away(facts, plan: Plan, readers: set[tuple[str, str]]) -> set[int]:
    """The prepared models (plain names) handed, in a call made as a statement of its own, to code of another
    module (or in a call whose result is saved right away, GAT's ``torch.save(utils.get_training_state(config,
    gat), path)``): a function imported from it, or a method of an object made from one of its classes (dome272's
    ``ema.step_ema(ema_model, model)``, whose ``ema_model.load_state_dict(model.state_dict())`` would meet the
    DistributedDataParallel wrapper's ``module.`` keys). They are handed ``accelerator.unwrap_model(model)``:
    the model itself, its parameters shared with the wrapper. Nothing the call returns reaches a backward,
    and code of another module that trains is converted with the script or refused (accelify.core.unit),
    so the wrapper's gradient synchronisation is not bypassed. So are a copy of the model (``copy.deepcopy(model)``)
    and the model handed to a function of this file that only reads its state by name (``readers``, from
    ``state_readers``). Output: ids of the argument expressions."""
    found: set[int] = set()
    for call in facts.calls:
        # a copy of the model (`best_model = copy.deepcopy(model)`): of the model itself, not of its wrapper (whose
        # copy's `state_dict()` has `module.` names, saved so by `torch.save(best_model.state_dict(), path)`)
        if has_qname(facts, call.func, _DEEPCOPY) and len(call.args) == 1 and isinstance(call.args[0].value, cst.Name) \
                and ref_of(facts, call.args[0].value) in plan.flow["model"]:
            found.add(id(call.args[0].value))
            continue
        parent = facts.get_metadata(ParentNodeProvider, call, None)
        saved = None
        if isinstance(parent, cst.Arg) and parent.keyword is None:
            saved = facts.get_metadata(ParentNodeProvider, parent, None)
        # (or what it returns is saved right away: GAT's `torch.save(utils.get_training_state(config, gat), path)`)
        if not isinstance(parent, cst.Expr) and not (
                isinstance(saved, cst.Call) and saved.args and saved.args[0] is parent and has_qname(facts, saved.func, TORCH_SAVE)):
            continue
        models = [a.value for a in call.args if isinstance(a.value, cst.Name) and ref_of(facts, a.value) in plan.flow["model"]]
        root = root_name(call.func)
        if root is not None and root.value == plan.accelerator.split(".")[0]:
            continue  # `accelerator.print(model)`: the Accelerator's own
        if models and foreign_callee(facts, call.func):
            found.update(id(v) for v in models)
    # a function of this file that reads the state of the model it is handed by name (pytorch-ddpm's
    # `ema(net_model, ema_model, decay)`, pairing `source.state_dict()` keys with the EMA copy's)
    for name, param in readers:
        for _, bound in facts.call_sites(name, facts.functions[name]):
            if ref_of(facts, bound[param]) in plan.flow["model"]:
                found.add(id(bound[param]))
    return found


def state_readers(facts) -> set[tuple[str, str]]:
    """``(function, parameter)`` of this file's functions that read the state of the module they are handed by
    name (``_reads_named_state``), every call handing it a plain name: a prepared model among them is handed
    unwrapped."""
    found = set()
    for name, func in facts.functions.items():
        sites = facts.call_sites(name, func)
        for param in (p.name.value for p in func.params.params):
            if sites and all(isinstance(bound.get(param), cst.Name) for _, bound in sites) and \
                    _reads_named_state(facts, func, param):
                found.add((name, param))
    return found


#: nn.Module methods that name what they give: through the DistributedDataParallel wrapper every name has
#: `module.` before it, through the model itself the names are the script's
_NAMED = frozenset({"state_dict", "named_parameters", "named_buffers", "named_modules", "named_children"})
#: ... and the other methods that only read the module's own state
_READING = _NAMED | {"parameters", "buffers", "modules", "children"}


def _reads_named_state(facts, func: cst.FunctionDef, param: str) -> bool:
    """Does ``func`` use its parameter ``param`` only to read the module's state (``source.state_dict()``,
    ``named_parameters()``), by name at least once other than to save it, never running it, rebinding it or
    handing it on? Handed the unwrapped model, such a function reads what it read before ``prepare``, and
    nothing of the wrapper is lost."""
    if not isinstance(func.body, cst.IndentedBlock) or not func.body.body:
        return False
    scope = facts.get_metadata(ScopeProvider, func.body.body[0], None)
    assignments = list(scope.assignments[param]) if scope is not None else []
    if len(assignments) != 1 or not assignments[0].references:
        return False  # rebound in the function, or never read
    methods = set()
    for access in assignments[0].references:
        attribute = facts.get_metadata(ParentNodeProvider, access.node, None)
        call = facts.get_metadata(ParentNodeProvider, attribute, None) if attribute is not None else None
        if not (isinstance(attribute, cst.Attribute) and attribute.value is access.node and isinstance(call, cst.Call)
                and call.func is attribute and attribute.attr.value in _READING):
            return False
        if not _saved(facts, call):  # `torch.save(model.state_dict(), path)`: ACC009 saves it unwrapped
            methods.add(attribute.attr.value)
    return bool(methods & _NAMED)


def _saved(facts, node: cst.CSTNode) -> bool:
    """Is ``node`` inside the arguments of a ``torch.save(...)`` call?"""
    current = facts.get_metadata(ParentNodeProvider, node, None)
    while current is not None and not isinstance(current, cst.BaseStatement):
        if isinstance(current, cst.Call) and has_qname(facts, current.func, TORCH_SAVE):
            return True
        current = facts.get_metadata(ParentNodeProvider, current, None)
    return False


_STATE = m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[])


def states_into_plain_models(facts, plan: Plan, readers: set[tuple[str, str]]) -> list[cst.Call]:
    """``ema_model.load_state_dict(model.state_dict())`` (or of its ``copy.deepcopy``): the ``state_dict()`` calls
    of a prepared model loaded into a model that is not prepared. Through the wrapper its names have ``module.``
    before them and would not load; read from ``accelerator.unwrap_model(model)`` they are the names the script
    had (ACC014 reads them so once the model is prepared)."""
    found = []
    for call in facts.calls:
        if not m.matches(call, LOAD_STATE_DICT) or not call.args or call.args[0].keyword is not None:
            continue
        target = call.func.value  # type: ignore[attr-defined]
        if m.matches(target, UNWRAP_MODEL) or ref_of(facts, target) in plan.flow["model"]:
            continue
        value = call.args[0].value
        if isinstance(value, cst.Call) and len(value.args) == 1 and has_qname(facts, value.func, _DEEPCOPY):
            value = value.args[0].value
        owner = ref_of(facts, value.func.value) if m.matches(value, _STATE) else None  # type: ignore[attr-defined]
        if owner in plan.flow["model"] and owner not in readers:  # (a reader is handed the model unwrapped)
            found.append(value)
    return found
