"""ACC010: GradScaler and autocast become the Accelerator's mixed precision."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import AUTOCASTS, Plan
from accelify.queries.names import has_qname
from accelify.queries.refs import ref_of
from accelify.queries.trees import remove_imports_of

from .base import AccelifyCodemod, accelerator_attr


class MixedPrecision(AccelifyCodemod):
    """Let the Accelerator scale the loss: ``Accelerator(mixed_precision="fp16")``, no GradScaler.

    ``scaler.scale(loss).backward()`` becomes ``accelerator.backward(loss)`` (with
    ACC005), ``scaler.step(optimizer)`` becomes ``optimizer.step()``,
    ``scaler.update()`` and ``scaler.unscale_(optimizer)`` go (clipping through
    ``accelerator.clip_grad_norm_`` unscales first), and ``with torch.autocast(...)``
    becomes ``with accelerator.autocast():``; a bfloat16 autocast selects
    ``mixed_precision="bf16"``.  The loss is never scaled twice: a scaler switched
    by ``enabled=``, saved in a checkpoint or passed around is left as it is and
    reported (ACC112).

    Before::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = model(x)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()

    After::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with accelerator.autocast():
            loss = model(x)
        loss.backward()
        optimizer.step()
    """

    CODE = "ACC010"
    NAME = "mixed-precision"
    DESCRIPTION = 'GradScaler/autocast -> Accelerator(mixed_precision="fp16"|"bf16") and accelerator.autocast().'
    REQUIRES = frozenset({"ACC001", "ACC005"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return plan.mixed_precision is not None

    def _scaler(self, node: cst.BaseExpression) -> bool:
        ref = ref_of(self, node)
        return ref is not None and ref[0] == self.plan.owner and ref[1] in self.plan.scalers

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if len(original_node.body) != 1:
            return updated
        small = original_node.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and self._scaler(small.targets[0].target):
            remove_imports_of(self.context, small.value)
            self.change(original_node, "GradScaler removed: the Accelerator scales the loss")
            return self.remove(updated)
        call = m.Expr(m.Call(func=m.Attribute(attr=m.Name("update") | m.Name("unscale_"))))
        if m.matches(small, call) and self._scaler(small.value.func.value):  # type: ignore[attr-defined]
            self.change(original_node, f"`scaler.{small.value.func.attr.value}()` removed")  # type: ignore[attr-defined]
            return self.remove(updated)
        return updated

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not isinstance(func, cst.Attribute) or not self._scaler(func.value) or len(updated_node.args) != 1:
            return updated_node
        inner = updated_node.args[0].value
        if func.attr.value == "scale":  # scaler.scale(loss).backward() -> loss.backward()
            return inner
        if func.attr.value == "step":  # scaler.step(optimizer) -> optimizer.step()
            self.change(original_node, "`scaler.step(optimizer)` -> `optimizer.step()`")
            return cst.Call(func=cst.Attribute(value=inner, attr=cst.Name("step")))
        return updated_node

    def leave_WithItem(self, original_node: cst.WithItem, updated_node: cst.WithItem) -> cst.WithItem:
        item = original_node.item
        if not isinstance(item, cst.Call) or not has_qname(self, item.func, AUTOCASTS):
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return updated_node
        remove_imports_of(self.context, item)
        self.change(original_node, "autocast -> `accelerator.autocast()`")
        return updated_node.with_changes(item=cst.Call(func=accelerator_attr(accelerator, "autocast")))
