"""ACC016: the model's own attributes are read through ``accelerator.unwrap_model(model)``."""

from __future__ import annotations

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.analyses.unwrapping import model_attribute, plain_model_statements, why_not_unwrapped
from accelify.queries.training import trainer_functions

from .base import AccelifyCodemod


class UnwrapModelAttributes(AccelifyCodemod):
    """``model.decode(z)`` -> ``accelerator.unwrap_model(model).decode(z)`` after ``prepare``.

    In a multi-process run ``prepare`` returns a DistributedDataParallel wrapper,
    which has the ``nn.Module`` API and nothing of the model's own: ``model.decode``,
    ``model.config``, ``model.init_hidden`` raise AttributeError on it.
    ``unwrap_model`` gives the plain model in every launch.  A method called in the
    training step (a loop that runs a backward, outside ``torch.no_grad()``) is not
    rewritten: the file is left unchanged with ACC120, since running the model
    around its wrapper there would skip the gradient synchronisation.  The model handed to
    another module's code in a call made as a statement (``ema.step_ema(ema_model, model)``,
    ``wandb.watch(model)``) is handed ``accelerator.unwrap_model(model)``: that code reads the
    model (its ``state_dict()`` keys, its attributes), and what it returns trains nothing. So is
    the model handed to a function of the file that only reads its state, by name
    (``ema(model, ema_model, decay)`` over ``source.state_dict()``): its names are the plain model's.

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
    DESCRIPTION = ("model.attr (not nn.Module's) after prepare -> accelerator.unwrap_model(model).attr; the model handed "
                   "to another module's code in a statement call, or to a function reading its state by name -> "
                   "accelerator.unwrap_model(model).")
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        # an evaluation's model is prepared with `evaluation_mode=True`: nothing wraps it
        return not plan.evaluation

    def visit_Module(self, node: cst.Module) -> None:
        prepare = self.other("ACC004")
        located = (prepare._target, prepare._index) if prepare is not None and prepare._target is not None else None  # type: ignore[attr-defined]
        self._plain = {id(s) for s in plain_model_statements(node, self.plan, trainer_functions(node), located, self.vanishing())}

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        """``ema.step_ema(ema_model, model)`` -> ``ema.step_ema(ema_model, accelerator.unwrap_model(model))``: code
        of another module gets the model itself (accelify.analyses.unwrapping.handed_away)."""
        if id(original_node.value) not in self.plan.handed_away or self.inside(original_node, self._plain):
            return updated_node
        return self._unwrapped(original_node, updated_node, "`{model}` handed to code that reads it as "
                               "`{accelerator}.unwrap_model({model})`")

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if not model_attribute(self, original_node, self.plan) or self.inside(original_node, self._plain):
            return updated_node
        if why_not_unwrapped(self, original_node, self.plan) is not None:
            return updated_node  # the analysis refused the file
        attr = original_node.attr.value
        return self._unwrapped(original_node, updated_node, f"`{{model}}.{attr}` -> `{{accelerator}}.unwrap_model({{model}}).{attr}`")

    def _unwrapped(self, original_node, updated_node, change: str):
        """``updated_node`` with its ``value`` (the model) read through ``accelerator.unwrap_model(...)``; as it
        is where the code cannot reach the Accelerator."""
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return updated_node
        model = cst.Module(body=[]).code_for_node(updated_node.value)
        self.change(original_node, change.format(model=model, accelerator=accelerator))
        unwrapped = cst.Call(func=cst.parse_expression(f"{accelerator}.unwrap_model"), args=[cst.Arg(updated_node.value)])
        return updated_node.with_changes(value=unwrapped)
