"""ACC016: the model's own attributes are read through ``accelerator.unwrap_model(model)``."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.walk import findall
from libcst.metadata import ParentNodeProvider

from accelify.analysis import (
    BACKWARD,
    has_qname,
    key_at,
    locate_setup,
    rebound_region,
    ref_of,
    scope_root,
    trainer_functions,
)
from accelify.plan import MODULE_API, Plan

from .base import AccelifyCodemod

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


class UnwrapModelAttributes(AccelifyCodemod):
    """``model.decode(z)`` -> ``accelerator.unwrap_model(model).decode(z)`` after ``prepare``.

    In a multi-process run ``prepare`` returns a DistributedDataParallel wrapper,
    which has the ``nn.Module`` API and nothing of the model's own: ``model.decode``,
    ``model.config``, ``model.init_hidden`` raise AttributeError on it.
    ``unwrap_model`` gives the plain model in every launch.  A method called in the
    training step (a loop that runs a backward, outside ``torch.no_grad()``) is not
    rewritten: the file is left unchanged with ACC120, since running the model
    around its wrapper there would skip the gradient synchronisation.

    Before::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=64)
        model = VAE()
        optimizer = torch.optim.Adam(model.parameters())
        loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
        with torch.no_grad():
            sample = model.decode(z)

    After::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=64)
        model = VAE()
        optimizer = torch.optim.Adam(model.parameters())
        loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
        with torch.no_grad():
            sample = accelerator.unwrap_model(model).decode(z)
    """

    AFTER = frozenset({"ACC004"})
    CODE = "ACC016"
    NAME = "model-attributes"
    DESCRIPTION = "model.attr (not nn.Module's) after prepare -> accelerator.unwrap_model(model).attr."
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        # an evaluation's model is prepared with `evaluation_mode=True`: nothing wraps it
        return not plan.evaluation

    def visit_Module(self, node: cst.Module) -> None:
        prepare = self.other("ACC004")
        located = (prepare._target, prepare._index) if prepare is not None and prepare._target is not None else None  # type: ignore[attr-defined]
        self._plain = {id(s) for s in plain_model_statements(node, self.plan, trainer_functions(node), located, self.vanishing())}

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if not model_attribute(self, original_node, self.plan) or self.inside(original_node, self._plain):
            return updated_node
        if why_not_unwrapped(self, original_node, self.plan) is not None:
            return updated_node  # the analysis refused the file
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return updated_node
        model = cst.Module(body=[]).code_for_node(updated_node.value)
        self.change(original_node, f"`{model}.{original_node.attr.value}` -> `{accelerator}.unwrap_model({model}).{original_node.attr.value}`")
        unwrapped = cst.Call(func=cst.parse_expression(f"{accelerator}.unwrap_model"), args=[cst.Arg(updated_node.value)])
        return updated_node.with_changes(value=unwrapped)
