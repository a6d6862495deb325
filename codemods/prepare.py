"""ACC004: dataloaders, models, optimizers (and per-step schedulers) go through ``accelerator.prepare``."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.queries.blocks import Body as Block
from accelify.queries.blocks import binds, scope_root
from accelify.queries.training import built_at_top, locate_setup, trainer_functions
from accelify.queries.trees import Item

from .base import AccelifyCodemod, depth_of, insert_paragraph

DEFAULT_LINE_LENGTH = 88


class Prepare(AccelifyCodemod):
    """Pass the training objects through ``accelerator.prepare(...)`` once, right after the last is built.

    Order as in the Accelerate docs: dataloaders, models, optimizers, then any
    scheduler that was built before that point and is stepped once per batch
    (one built later, from ``len(train_dataloader)`` of the prepared loader, is
    not prepared).  A call too long for one line is split as the docs do.  In an evaluation
    or batch-inference script (no optimizer), the loaders go through ``prepare`` and each model
    through ``prepare_model(model, evaluation_mode=True)``: placed, never wrapped for training.

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

    AFTER = frozenset({"ACC002", "ACC003", "ACC006"})
    CODE = "ACC004"
    NAME = "prepare"
    DESCRIPTION = "Insert accelerator.prepare(...) for dataloaders, models, optimizers and per-step schedulers."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return not plan.has_prepare

    def visit_Module(self, node: cst.Module) -> None:
        self._target: Optional[Block] = None
        #: a function that builds its optimizer for the model it is handed: block -> (index, optimizers, accelerator)
        self._late: dict[int, tuple[int, list[str], str]] = {}
        if self.plan.has_prepare:
            return
        for function, optimizers in self.plan.late.items():
            root = scope_root(node, function)
            at = built_at_top(root, set(optimizers), trainer_functions(node)) if isinstance(root, cst.FunctionDef) else None
            if at is not None:
                self._late[id(at[0])] = (at[1], optimizers, self.plan.accelerator_in(function) or "accelerator")
        self._names = self.plan.core()
        root = scope_root(node, self.plan.setup)
        if root is None:
            return
        anchors = set(self.plan.anchors())
        device = self.other("ACC002")
        site = device.creation_site() if device is not None else None  # type: ignore[attr-defined]
        created = self.statements_around(site)
        if any(binds(stmt, {self.plan.accelerator}) or id(stmt) in created for stmt in _statements(root)):
            anchors.add(self.plan.accelerator)  # created where the device was: prepare comes after it
        located = locate_setup(root, anchors, trainer_functions(node), self.vanishing(), created, self.plan.accelerator,
                               touches=self.plan.touches())
        if located is None:  # the analysis already reported why
            return
        block, index = located
        # A per-step scheduler built before that point is prepared too; one built after is not.
        self._names += [s for s in self.plan.schedulers if any(binds(stmt, {s}) for stmt in block.body[:index])]
        self.prepared = list(self._names)  # what ACC013 and ACC015 read
        self._target, self._index, self._depth = block, index, depth_of(node, block)

    def _statements(self) -> list[cst.BaseStatement]:
        if not self.plan.evaluation:
            return [self._prepare_statement(self._names)]
        # An evaluation: the loaders through `prepare`, each model through
        # `prepare_model(model, evaluation_mode=True)`: placed, never wrapped for training.
        loaders = [n for n in self._names if n in self.plan.dataloaders]
        lines = [self._prepare_statement(loaders)] if loaders else []
        for model in (n for n in self._names if n in self.plan.models):
            lines.append(self.parse_statement(
                f"{model} = {self.plan.accelerator}.prepare_model({model}, evaluation_mode=True)"))
        return lines

    def _prepare_statement(self, prepared: list[str]) -> cst.BaseStatement:
        names = ", ".join(prepared)
        call = f"{self.plan.accelerator}.prepare("
        line_length = self.context.scratch.get("accelify.line_length", DEFAULT_LINE_LENGTH)
        one_line = f"{names} = {call}{names})"
        module = self.context.module
        indent = module.default_indent if module is not None else "    "
        fits = lambda text: len(self._depth) + len(text) <= line_length  # noqa: E731
        items = "".join(f"{indent}{n},\n" for n in prepared)
        if fits(one_line):
            code = one_line
        elif fits(f"{names} = {call}") and fits(indent + names):  # the docs' three lines
            code = f"{names} = {call}\n{indent}{names}\n)"
        elif fits(f"{names} = {call}"):
            code = f"{names} = {call}\n{items})"
        else:  # black's layout for a target list that does not fit either
            code = f"(\n{items}) = {call}\n{items})"
        return self.parse_statement(code)

    def edit_body(self, block: Block, items: list[Item]) -> list[Item]:
        if id(block) in self._late:
            items = self._prepare_late(block, items)
        if block is not self._target:
            return items
        what = "prepare_model" if self.plan.evaluation and not self.plan.dataloaders else "prepare"
        self.change(block.body[self._index - 1],
                    f"`{self.plan.accelerator}.{what}({', '.join(self._names)})` inserted")
        moved = [item for item in items if item[1] is not None and id(item[1]) in self.plan.after_prepare]
        for _, origin in moved:
            self.change(origin, "moved after `prepare`, to wrap the prepared loader")
        items = [item for item in items if item not in moved]
        at = self.position(block, items, self._index)
        first, *others = self._statements()
        body = insert_paragraph([node for node, _ in items], at, first)
        body[at + 1:at + 1] = [*others, *(node for node, _ in moved)]
        origins = [origin for _, origin in items]
        return list(zip(body, [*origins[:at], *[None] * (1 + len(others)), *(o for _, o in moved), *origins[at:]]))


    def _prepare_late(self, block: Block, items: list[Item]) -> list[Item]:
        """``optimizer = accelerator.prepare(optimizer)`` right after the function builds it for the model
        it is handed (accelify.analyses.handed): the model was prepared where it is built."""
        index, optimizers, accelerator = self._late[id(block)]
        names = ", ".join(optimizers)
        self.change(block.body[index - 1], f"`{names} = {accelerator}.prepare({names})` inserted")
        at = self.position(block, items, index)
        statement = self.parse_statement(f"{names} = {accelerator}.prepare({names})")
        return [*items[:at], (statement, None), *items[at:]]  # no paragraph of its own: it belongs to the line above


def _statements(root: Union[cst.Module, cst.FunctionDef]) -> Sequence[cst.BaseStatement]:
    body = root if isinstance(root, cst.Module) else root.body
    return body.body if isinstance(body, (cst.Module, cst.IndentedBlock)) else ()
