"""ACC029: an optimizer class of the script takes the ``closure`` its prepared wrapper hands ``step``."""

from __future__ import annotations

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.queries.names import subclasses_optimizer

from .base import AccelifyCodemod

class OptimizerStepClosure(AccelifyCodemod):
    """Give an optimizer written in the script a ``closure=None`` parameter on ``step``.

    Research code often writes its own optimizer (LARS in Barlow Twins, VICReg, DINO, MoCo v3) with
    ``def step(self):``. The optimizer ``accelerator.prepare`` returns calls
    ``self.optimizer.step(closure)``, and under mixed precision ``scaler.step(optimizer, closure)``,
    always with the closure (``None``) by position: a ``step`` that takes no argument fails with
    ``TypeError: step() takes 1 positional argument but 2 were given`` at the first step, on every
    launch. ``torch.optim.Optimizer.step`` takes ``closure=None``; so does the class now (it is not
    read: ``None`` is all the wrapper passes when the script calls ``optimizer.step()``).

    Before::

        import torch


        class LARS(torch.optim.Optimizer):
            @torch.no_grad()
            def step(self):
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(p.grad, alpha=-group["lr"])

        model = torch.nn.Linear(4, 2).cuda()
        optimizer = LARS(model.parameters(), {"lr": 0.1})
        for x in torch.randn(8, 4):
            model(x.cuda()).sum().backward()
            optimizer.step()

    After::

        import torch


        class LARS(torch.optim.Optimizer):
            @torch.no_grad()
            def step(self, closure=None):
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(p.grad, alpha=-group["lr"])

        model = torch.nn.Linear(4, 2).cuda()
        optimizer = LARS(model.parameters(), {"lr": 0.1})
        for x in torch.randn(8, 4):
            model(x.cuda()).sum().backward()
            optimizer.step()
    """

    CODE = "ACC029"
    NAME = "optimizer-step-closure"
    DESCRIPTION = "An optimizer class of the script takes the closure its prepared wrapper passes to step"

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.optimizers) and "def step(self)" in code

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._classes: list[bool] = []  # for each enclosing class: is it an optimizer?

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(subclasses_optimizer(self, node))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._classes.pop()
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        params = original_node.params
        if original_node.name.value != "step" or not self._classes or not self._classes[-1]:
            return updated_node
        if len(params.params) != 1 or params.posonly_params or params.kwonly_params or (
            not isinstance(params.star_arg, cst.MaybeSentinel) or params.star_kwarg is not None
        ):
            return updated_node  # it takes something already: `closure`, `*args`
        self.change(original_node, "`def step(self)` -> `def step(self, closure=None)`: the prepared optimizer "
                    "passes the closure")
        closure = cst.Param(cst.Name("closure"), default=cst.Name("None"),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        first = updated_node.params.params[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated_node.with_changes(params=updated_node.params.with_changes(params=[first, closure]))
