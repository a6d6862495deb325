"""Which attributes of a prepared model must be read from ``accelerator.unwrap_model(model)``
(a custom method or attribute the DDP wrapper hides), and why one cannot be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.data import foreign_callee
from accelify.queries.blocks import scope_root
from accelify.queries.names import TORCH_SAVE, has_qname, root_name
from accelify.queries.refs import key_at, ref_of
from accelify.queries.training import BACKWARD, locate_setup, rebound_region
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

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


def handed_away(facts, plan: Plan) -> set[int]:
    """The prepared models (plain names) handed, in a call made as a statement of its own, to code of another
    module (or in a call whose result is saved right away, GAT's ``torch.save(utils.get_training_state(config,
    gat), path)``): a function imported from it, or a method of an object made from one of its classes (dome272's
    ``ema.step_ema(ema_model, model)``, whose ``ema_model.load_state_dict(model.state_dict())`` would meet the
    DistributedDataParallel wrapper's ``module.`` keys). They are handed ``accelerator.unwrap_model(model)``:
    the model itself, its parameters shared with the wrapper. Nothing the call returns reaches a backward,
    and code of another module that trains is converted with the script or refused (accelify.core.unit),
    so the wrapper's gradient synchronisation is not bypassed. Output: ids of the argument expressions."""
    found: set[int] = set()
    for call in facts.calls:
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
    return found
