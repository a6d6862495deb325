"""ACC031: a device chosen at the module's top: each process's own, where the code runs."""

from __future__ import annotations

from typing import Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ExpressionContext, ExpressionContextProvider

from accelify.analyses.plan import Plan
from accelify.queries.refs import MODULE, key_at, ref_of
from accelify.queries.trees import remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, accelerator_attr, add_target_import


class ModuleDevice(AccelifyCodemod):
    """``device = torch.device("cuda:0")`` at the module's top, read in functions -> the process's device there.

    A script that trains in a function and chose its device once at the top (pytorch-ddpm, NeRF) reads
    it everywhere: the model and the batches are moved there, noise is made there. Under
    ``accelerate launch`` that one choice would put every process on the first GPU. Each read becomes
    ``accelerator.device`` where the code reaches the Accelerator, and ``PartialState().device`` (the
    same state, asked when the code runs) where it does not; the line at the top goes once nothing
    there reads it. Not ``device = PartialState().device`` at the top: made at import, before the
    Accelerator, that state would not know ``accelerate launch --cpu``. Only a choice that reads
    nothing of the script's (``"cuda" if torch.cuda.is_available() else "cpu"``, ``"cuda:0"``), bound
    once at the top, read in functions only where a device goes (``.to(device)``, ``device=device``), where
    no ``cpu=`` flag of the Accelerator picks the CPU.

    Before::

        import torch

        device = torch.device("cuda:0")


        def sample(model):
            return model(torch.randn(4, 8).to(device))


        def train():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model = model.to(device)
            sample(model)

    After::

        import torch
        from accelerate import PartialState


        def sample(model):
            return model(torch.randn(4, 8).to(PartialState().device))


        def train():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model = model.to(accelerator.device)
            sample(model)
    """

    AFTER = frozenset({"ACC003"})
    CODE = "ACC031"
    NAME = "module-device"
    DESCRIPTION = ("A device chosen at the module's top, read in functions -> accelerator.device there, or "
                   "PartialState().device where the Accelerator cannot be reached.")
    REQUIRES = frozenset({"ACC001"})
    METADATA_DEPENDENCIES = (*AccelifyCodemod.METADATA_DEPENDENCIES, ExpressionContextProvider)

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return plan.module_device is not None

    def visit_Module(self, node: cst.Module) -> None:
        name = self.plan.module_device[1]  # type: ignore[index]
        reads = [n for n in findall(node, m.Name(name)) if ref_of(self, n) == self.plan.module_device
                 and self.get_metadata(ExpressionContextProvider, n, None) == ExpressionContext.LOAD]
        self._kept = any(key_at(self, n) == MODULE for n in reads)  # read at the top too: the line stays

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Union[cst.Name, cst.BaseExpression]:
        device = self.plan.module_device
        if device is None or original_node.value != device[1] or ref_of(self, original_node) != device \
                or key_at(self, original_node) == MODULE \
                or self.get_metadata(ExpressionContextProvider, original_node, None) != ExpressionContext.LOAD:
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is not None:
            self.change(original_node, f"`{original_node.value}` (chosen at the top) -> `{accelerator}.device`")
            return accelerator_attr(accelerator, "device")
        add_target_import(self.context, "PartialState")
        self.change(original_node, f"`{original_node.value}` (chosen at the top) -> `PartialState().device`")
        return cst.parse_expression("PartialState().device")

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        assign = original_node.body[0] if len(original_node.body) == 1 else None
        if self._kept or not isinstance(assign, cst.Assign) or len(assign.targets) != 1 \
                or ref_of(self, assign.targets[0].target) != self.plan.module_device:
            return updated
        remove_imports_of(self.context, assign.value)
        self.change(original_node, "device chosen at the top removed: each process's own is read where it is used")
        return self.remove(updated)
