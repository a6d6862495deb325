"""ACC004: dataloaders, models, optimizers (and per-step schedulers) go through ``accelerator.prepare``."""

from __future__ import annotations

from typing import Iterator, Optional, Union

import libcst as cst
import libcst.matchers as m

from accelify.analysis import binds, peel_iterable
from .base import AccelifyCodemod, insert_paragraph

Block = Union[cst.Module, cst.IndentedBlock]
DEFAULT_LINE_LENGTH = 88


class Prepare(AccelifyCodemod):
    """Pass the training objects through ``accelerator.prepare(...)`` once, right after the last is built.

    Order as in the Accelerate docs: dataloaders, models, optimizers, then any
    scheduler that was built before that point and is stepped once per batch
    (one built later, from ``len(train_dataloader)`` of the prepared loader, is
    not prepared).  A call too long for one line is split as the docs do.

    Before::

        import torch
        from torch.utils.data import DataLoader

        train_dataloader = DataLoader(train_set, shuffle=True, batch_size=8)
        eval_dataloader = DataLoader(eval_set, batch_size=8)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
        for epoch in range(num_epochs):
            for batch in train_dataloader:
                train_step(batch)

    After::

        import torch
        from torch.utils.data import DataLoader

        train_dataloader = DataLoader(train_set, shuffle=True, batch_size=8)
        eval_dataloader = DataLoader(eval_set, batch_size=8)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)

        train_dataloader, eval_dataloader, model, optimizer = accelerator.prepare(
            train_dataloader, eval_dataloader, model, optimizer
        )

        for epoch in range(num_epochs):
            for batch in train_dataloader:
                train_step(batch)
    """

    CODE = "ACC004"
    NAME = "prepare"
    DESCRIPTION = "Insert accelerator.prepare(...) for dataloaders, models, optimizers and per-step schedulers."

    def visit_Module(self, node: cst.Module) -> None:
        self._target: Optional[Block] = None
        self._names = self._ordered_names()
        if self.plan.has_prepare or not self.plan.optimizers:
            return
        located = self._locate(node)
        if located is None:
            return
        block, index = located
        for stmt in block.body[:index]:
            loop = self._early_loop(stmt)
            if loop is not None:
                self.finding(
                    loop,
                    "ACC104",
                    "a prepared dataloader is iterated before the last training object is built; "
                    "`accelerator.prepare(...)` not inserted.",
                    "build the dataloaders, model and optimizer first, then call "
                    f"`{', '.join(self._names)} = {self.plan.accelerator}.prepare({', '.join(self._names)})` "
                    "before the first loop.",
                )
                return
        # A per-step scheduler built before that point is prepared too; one built after is not.
        self._names += [s for s in self.plan.schedulers if any(binds(stmt, {s}) for stmt in block.body[:index])]
        self._target, self._index, self._depth = block, index, self._depth_of(node, block)

    def _ordered_names(self) -> list[str]:
        """Dataloaders, models, optimizers: the objects that decide where prepare goes."""
        return [*self.plan.dataloaders, *self.plan.models, *self.plan.optimizers]

    def _locate(self, module: cst.Module) -> Optional[tuple[Block, int]]:
        """The deepest block that binds every training object, and the index to insert at."""
        names = set(self._names)
        best: Optional[tuple[Block, int]] = None
        for block in _blocks(module):  # outermost first: a later match is nested in an earlier one
            hits = [i for i, stmt in enumerate(block.body) if binds(stmt, names)]
            if all(any(binds(block.body[i], {n}) for i in hits) for n in names):
                best = (block, hits[-1] + 1)
        return best

    def _early_loop(self, stmt: cst.BaseStatement) -> Optional[cst.For]:
        loaders = set(self.plan.dataloaders)
        for loop in m.findall(stmt, m.For()):
            source = peel_iterable(self, loop.iter)  # type: ignore[arg-type]
            if isinstance(source, cst.Name) and source.value in loaders:
                return loop  # type: ignore[return-value]
        return None

    def _depth_of(self, module: cst.Module, target: Block) -> str:
        """The indentation of statements in ``target``."""

        def walk(block: Block, indent: str) -> Optional[str]:
            if block is target:
                return indent
            for stmt in block.body:
                for child in _child_blocks(stmt):
                    child_indent = indent + (child.indent if child.indent is not None else module.default_indent)
                    found = walk(child, child_indent)
                    if found is not None:
                        return found
            return None

        return walk(module, "") or ""

    def _statement(self) -> cst.BaseStatement:
        names = ", ".join(self._names)
        call = f"{self.plan.accelerator}.prepare("
        line_length = self.context.scratch.get("accelify.line_length", DEFAULT_LINE_LENGTH)
        one_line = f"{names} = {call}{names})"
        module = self.context.module
        indent = module.default_indent if module is not None else "    "
        if len(self._depth) + len(one_line) <= line_length:
            code = one_line
        elif len(self._depth) + len(indent) + len(names) <= line_length:
            code = f"{names} = {call}\n{indent}{names}\n)"
        else:
            items = "".join(f"{indent}{n},\n" for n in self._names)
            code = f"{names} = {call}\n{items})"
        return self.parse_statement(code)

    def _insert(self, original: Block, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        self.change(original.body[self._index - 1], f"`{self.plan.accelerator}.prepare({', '.join(self._names)})` inserted")
        return insert_paragraph(body, self._index, self._statement())

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        updated_node = super().leave_IndentedBlock(original_node, updated_node)
        if original_node is self._target:
            return updated_node.with_changes(body=self._insert(original_node, list(updated_node.body)))
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        updated_node = super().leave_Module(original_node, updated_node)
        if original_node is self._target:
            return updated_node.with_changes(body=self._insert(original_node, list(updated_node.body)))
        return updated_node


def _child_blocks(stmt: cst.BaseStatement) -> list[cst.IndentedBlock]:
    from accelify.analysis import _child_blocks as child_blocks

    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
        return []
    return child_blocks(stmt)


def _blocks_in(stmt: cst.BaseStatement) -> Iterator[Block]:
    for child in _child_blocks(stmt):
        yield child
        for inner in child.body:
            yield from _blocks_in(inner)


def _blocks(module: cst.Module) -> Iterator[Block]:
    """Module-scope blocks, outermost first, never inside loops, functions or classes."""
    yield module
    for stmt in module.body:
        yield from _blocks_in(stmt)
