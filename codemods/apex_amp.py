"""ACC033: NVIDIA apex's mixed precision becomes the Accelerator's."""

from __future__ import annotations

from typing import Union

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.queries.names import code_of
from accelify.queries.trees import remove_imports_of

from .base import AccelifyCodemod


class ApexAmp(AccelifyCodemod):
    """Replace NVIDIA apex's ``amp`` by ``Accelerator(mixed_precision="fp16")``.

    The branch that imports apex and calls ``amp.initialize`` goes; an ``if``/``else`` whose two
    branches differ only by apex (``amp.scale_loss`` against ``loss.backward()``,
    ``amp.master_params(optimizer)`` against ``model.parameters()``) keeps its ``else``, which the
    other codemods convert; a lone ``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``
    becomes ``accelerator.backward(loss)``. The flag that switched apex on switches the Accelerator's
    mixed precision, when it is known where the Accelerator is created (else the note ACC152: the
    launch chooses). apex's O2 and O3 have no Accelerate counterpart (ACC152). Any other use of apex
    (its DistributedDataParallel, ``amp.state_dict()``) leaves the file unchanged (ACC145).

    Before::

        import torch

        args = get_args()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()

    After::

        import torch

        args = get_args()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
    """

    CODE = "ACC033"
    NAME = "apex-amp"
    DESCRIPTION = ('apex amp.initialize/amp.scale_loss -> Accelerator(mixed_precision="fp16") and '
                   "accelerator.backward(loss).")
    REQUIRES = frozenset({"ACC001", "ACC005"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return plan.apex is not None

    def visit_Module(self, node: cst.Module) -> None:
        for statement in self.plan.apex.imports:  # type: ignore[union-attr]
            remove_imports_of(self.context, statement)

    def _dropped(self, original: cst.CSTNode, updated):  # type: ignore[no-untyped-def]
        if id(original) in self.plan.apex.removed:  # type: ignore[union-attr]
            self.change(original, "apex set-up removed: the Accelerator's mixed precision replaces it")
            return self.remove(updated)
        return None

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        return self._dropped(original_node, updated) or updated

    def leave_Try(self, original_node: cst.Try, updated_node: cst.Try) -> cst.BaseStatement:
        return self._dropped(original_node, updated_node) or updated_node

    def leave_If(
        self, original_node: cst.If, updated_node: cst.If
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement]]:
        dropped = self._dropped(original_node, updated_node)
        if dropped is not None:
            return dropped
        if id(original_node) not in self.plan.apex.collapsed or not isinstance(updated_node.orelse, cst.Else):  # type: ignore[union-attr]
            return updated_node
        self.change(original_node, f"`if {code_of(original_node.test)}:` apex branch removed, its `else` kept")
        kept = list(updated_node.orelse.body.body)  # type: ignore[union-attr]
        kept[0] = kept[0].with_changes(leading_lines=[*updated_node.leading_lines, *kept[0].leading_lines])
        return cst.FlattenSentinel(kept)

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.BaseStatement:
        loss = self.plan.apex.scaled.get(id(original_node))  # type: ignore[union-attr]
        accelerator = self.accelerator_at(original_node) if loss is not None else None
        if loss is None or accelerator is None:
            return updated_node
        self.replaced(original_node)
        self.change(original_node, f"`amp.scale_loss` -> `{accelerator}.backward({loss})`")
        line = cst.parse_statement(f"{accelerator}.backward({loss})\n")
        return line.with_changes(leading_lines=updated_node.leading_lines)

