"""ACC007: gradient clipping through the accelerator."""

from __future__ import annotations

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.queries.names import qualified_names
from accelify.queries.trees import remove_imports_of

from .base import AccelifyCodemod, accelerator_attr

CLIPPING = {
    "torch.nn.utils.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_": "clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_value_": "clip_grad_value_",
}


class Clipping(AccelifyCodemod):
    """Clip gradients with ``accelerator.clip_grad_norm_`` / ``clip_grad_value_``.

    The accelerator unscales fp16 gradients first, clips only when gradients are
    synchronised during accumulation, and knows how FSDP and DeepSpeed shard the
    parameters: the plain ``torch.nn.utils`` functions do none of that.

    Before::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)

    After::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        accelerator.clip_grad_value_(model.parameters(), clip_value=0.5)
    """

    CODE = "ACC007"
    NAME = "clipping"
    DESCRIPTION = "Rewrite torch.nn.utils.clip_grad_norm_/clip_grad_value_ to the accelerator's."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "clip_grad_" in code

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        names = qualified_names(self, original_node.func) & set(CLIPPING)
        if not names:
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            self.refuse(
                original_node, "ACC110", "gradient clipping that cannot reach the Accelerator: left as it is, it "
                "would clip still-scaled gradients under mixed precision; file not converted.",
                "pass the accelerator here and call `accelerator.clip_grad_norm_(...)`.",
            )
            return updated_node
        method = CLIPPING[names.pop()]
        self.change(original_node, f"`{method}` -> `accelerator.{method}`")
        remove_imports_of(self.context, original_node.func)
        return updated_node.with_changes(func=accelerator_attr(accelerator, method))
