"""ACC002: the hand-made device goes; what still needs it uses ``accelerator.device``."""

from __future__ import annotations

from typing import Union

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import ScopeProvider

from accelify.analysis import is_global, simple_assign
from .base import AccelifyCodemod, accelerator_attr


class RemoveDevice(AccelifyCodemod):
    """Remove ``device = torch.device(...)``; remaining uses become ``accelerator.device``.

    Recognised: ``torch.device("cuda")``, ``"cuda:0"``, ``"cuda" if torch.cuda.is_available()
    else "cpu"`` (as a string or inside ``torch.device``), ``torch.device("cuda") if ...
    else torch.device("cpu")``, ``mps``/``xpu`` checks and
    ``torch.accelerator.current_accelerator()``.  A device forced to the CPU, chosen
    by a flag or by a rank is reported (ACC102) and the file is left alone.

    Before::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        noise = torch.zeros(3, device=device)

    After::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        noise = torch.zeros(3, device=accelerator.device)
    """

    CODE = "ACC002"
    NAME = "remove-device"
    DESCRIPTION = "Remove device construction; remaining uses of the device become accelerator.device."

    def visit_Module(self, node: cst.Module) -> None:
        scope = self.get_metadata(ScopeProvider, node)
        self._uses: set[int] = set()
        for name in self.plan.device_vars:
            for assignment in scope.assignments[name]:
                for access in assignment.references:
                    self._uses.add(id(access.node))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Union[cst.Name, cst.Attribute]:
        if id(original_node) in self._uses:
            self.change(original_node, f"`{original_node.value}` -> `{self.plan.accelerator}.device`")
            return accelerator_attr(self.plan, "device")
        return updated_node

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        assign = simple_assign(original_node)
        if (
            assign is not None
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and assign.targets[0].target.value in self.plan.device_vars
            and is_global(self, assign)
        ):
            RemoveImportsVisitor.remove_unused_import_by_node(self.context, original_node)
            self.change(original_node, "device construction removed: the Accelerator picks the device")
            return self.remove(updated_node)
        return updated_node
