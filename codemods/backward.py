"""ACC005: ``loss.backward()`` -> ``accelerator.backward(loss)``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from accelify.analyses.plan import Plan
from accelify.queries.refs import ACCELERATOR_SPELLINGS

from .base import AccelifyCodemod, accelerator_attr

# Tensor.backward(gradient=None, retain_graph=None, create_graph=False, inputs=None);
# Accelerator.backward(loss, **kwargs) takes everything after the loss by keyword.
_BACKWARD_PARAMS = ("gradient", "retain_graph", "create_graph", "inputs")


class Backward(AccelifyCodemod):
    """Route the backward pass through the accelerator (gradient scaling, accumulation, DeepSpeed).

    Works on any expression, keeps keyword arguments and turns positional ones
    into keywords.  ``scaler.scale(loss).backward()`` is left alone and reported:
    rewriting it would scale the loss twice.

    Before::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        outputs.loss.backward(retain_graph=True)

    After::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        accelerator.backward(loss)
        accelerator.backward(outputs.loss, retain_graph=True)
    """

    AFTER = frozenset({"ACC010"})  # `scaler.scale(loss).backward()` is `loss.backward()` once ACC010 is done
    CODE = "ACC005"
    NAME = "backward"
    DESCRIPTION = "Rewrite <loss>.backward(...) to accelerator.backward(<loss>, ...)."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ".backward(" in code

    def _has_own_accelerator(self, node: cst.CSTNode) -> bool:
        scope = self.get_metadata(ScopeProvider, node, None)
        return scope is not None and any(a.scope is scope for a in scope["accelerator"])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not m.matches(original_node.func, m.Attribute(attr=m.Name("backward"))):
            return updated_node
        receiver = original_node.func.value  # type: ignore[union-attr]
        if cst.Module(body=[]).code_for_node(receiver) in (self.plan.accelerator, *ACCELERATOR_SPELLINGS):
            return updated_node
        if any(q.source is QualifiedNameSource.IMPORT for q in self.get_metadata(QualifiedNameProvider, receiver, set())):
            return updated_node  # torch.autograd.backward(...) is a function, not a tensor method
        if m.matches(updated_node.func, m.Attribute(value=m.Call(func=m.Attribute(attr=m.Name("scale"))))):
            self.finding(
                original_node,
                "ACC105",
                "backward through a GradScaler left as it is: `accelerator.backward` would scale the loss twice.",
                'drop the GradScaler, create `Accelerator(mixed_precision="fp16")` and call '
                "`accelerator.backward(loss)`.",
            )
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None and self._has_own_accelerator(original_node):
            return updated_node  # hand-written Accelerate code: a plain backward there is deliberate
        if accelerator is None:
            self.finding(
                original_node,
                "ACC106",
                "backward left as it is: this code cannot reach the script's Accelerator.",
                "pass the accelerator to this function and call `accelerator.backward(loss)`.",
            )
            return updated_node
        args = [cst.Arg(updated_node.func.value)]  # type: ignore[union-attr]
        for i, arg in enumerate(updated_node.args):
            if arg.keyword is None and arg.star == "" and i < len(_BACKWARD_PARAMS):
                arg = arg.with_changes(
                    keyword=cst.Name(_BACKWARD_PARAMS[i]),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                )
            args.append(arg)
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        self.change(original_node, "`.backward()` -> `accelerator.backward(...)`")
        return updated_node.with_changes(func=accelerator_attr(accelerator, "backward"), args=args)
