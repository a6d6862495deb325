"""ACC001: ``from accelerate import Accelerator`` and one ``accelerator = Accelerator()``."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from accelify.analysis import Body as Block
from accelify.analysis import binds, read_names, scope_root, setup_blocks
from accelify.plan import Plan

from .base import AccelifyCodemod, insert_paragraph

_IMPORT = m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])


class AddAccelerator(AccelifyCodemod):
    """Create the one ``Accelerator`` of the program before the training objects are built.

    At module level it goes right after the import block, as in the Accelerate
    docs.  A script that already has an ``Accelerator`` keeps it: accelify reuses
    its name and never creates a second one.

    Before::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())

    After::

        import torch
        from accelerate import Accelerator

        accelerator = Accelerator()

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
    """

    CODE = "ACC001"
    NAME = "accelerator"
    DESCRIPTION = "Add `from accelerate import Accelerator` and `accelerator = Accelerator()`."
    REQUIRES = frozenset()

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return not plan.has_accelerator

    def visit_Module(self, node: cst.Module) -> None:
        self._target: Optional[Block] = None
        if self.plan.has_accelerator:
            return
        creation = m.Assign(value=m.Call(func=m.Name("Accelerator")))
        if m.findall(node, creation):
            # the device codemod already created it where the device was
            AddImportsVisitor.add_needed_import(self.context, "accelerate", "Accelerator")
            return
        root = scope_root(node, self.plan.setup)
        if root is None:
            return
        names = set(self.plan.anchors())
        best: Optional[tuple[Block, int]] = None
        for block in setup_blocks(root):
            hits = [
                i for i, stmt in enumerate(block.body)
                if binds(stmt, names) or (not isinstance(stmt, cst.FunctionDef) and self._uses_accelerator(stmt))
            ]
            if hits and all(any(binds(block.body[i], {n}) for i in hits) for n in names):
                best = (block, hits[0])
        if best is None:
            return
        block, index = best
        first_use = index
        if block is node:
            imports = [i for i, stmt in enumerate(node.body[:index]) if m.matches(stmt, _IMPORT)]
            if imports:
                index = imports[-1] + 1
        # Its arguments (`gradient_accumulation_steps=N`, an `enabled=` flag) must be bound first.
        arguments = [i for i, stmt in enumerate(block.body) if binds(stmt, self.plan.argument_names)]
        if any(i >= first_use for i in arguments):
            raise RuntimeError("an argument of the Accelerator is bound after its first use")
        if arguments:
            index = max(index, arguments[-1] + 1)
        self._target, self._index = block, index
        AddImportsVisitor.add_needed_import(self.context, "accelerate", "Accelerator")

    def _uses_accelerator(self, stmt: cst.BaseStatement) -> bool:
        """Does ``stmt`` read the Accelerator (``accelerator.x``, not ``torch.accelerator.x``)?"""
        if self.plan.class_mode:
            return bool(m.findall(stmt, m.Attribute(value=m.Name("self"), attr=m.Name("accelerator"))))
        name = self.plan.accelerator.split(".")[0]
        return any(n.value == name for n in read_names(stmt))

    def edit_body(self, original: Block, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        if original is not self._target:
            return body
        anchor = original.body[min(self._index, len(original.body) - 1)]
        self.change(anchor, f"`{self.plan.accelerator} = Accelerator()` inserted")
        args = self.plan.accelerator_args()
        statement = self.parse_statement(f"{self.plan.accelerator} = Accelerator({args})\n")
        return insert_paragraph(body, self._index, statement)
