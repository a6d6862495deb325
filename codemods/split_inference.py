"""ACC020: inference over a plain list runs a share of it on each process, the results gathered back in order."""

from __future__ import annotations

from typing import Union

import libcst as cst
import libcst.matchers as m

from accelify.analyses.evaluation import accumulators
from accelify.analyses.plan import Plan
from accelify.queries.refs import key_at, ref_of
from accelify.queries.trees import Item
from accelify.queries.walk import findall

from .base import AccelifyCodemod, add_target_import


class SplitInference(AccelifyCodemod):
    """``for item in items:`` that runs the model, in an evaluation script -> each process takes a share.

    ``accelerator.split_between_processes(items)`` gives each process a contiguous share of the
    list (the first processes one item more when it does not divide); the lists the loop fills are
    gathered back with ``gather_object``, which puts the shares one after the other in process
    order: the original order.  Done only when that is the same result (the analysis checks the
    body computes each item's results from the item alone and only appends them to lists made
    empty right before the loop); otherwise the file is refused (ACC132).

    Before::

        import torch

        model = Net()
        model.eval()
        prompts = ["the cat", "a dog", "hello"]
        completions = []
        for prompt in prompts:
            completions.append(decode(model.generate(encode(prompt))))
        for prompt, completion in zip(prompts, completions):
            print(prompt, completion)

    After::

        import torch
        from accelerate.utils import gather_object

        model = Net()
        model.eval()
        prompts = ["the cat", "a dog", "hello"]
        completions = []
        with accelerator.split_between_processes(prompts) as shard:
            for prompt in shard:
                completions.append(decode(model.generate(encode(prompt))))
        completions = gather_object(completions)
        for prompt, completion in zip(prompts, completions):
            print(prompt, completion)
    """

    CODE = "ACC020"
    NAME = "split-inference"
    DESCRIPTION = "Inference over a plain list: each process runs its share (split_between_processes), results gathered."
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.split_lists)

    def visit_Module(self, node: cst.Module) -> None:
        lists = self.plan.refs(self.plan.split_lists)
        #: the loops to split -> the lists they fill
        self._loops: dict[int, list[str]] = {
            id(loop): accumulators(loop) for loop in findall(node, m.For(iter=m.Name()))  # type: ignore[misc]
            if key_at(self, loop) == self.plan.setup and ref_of(self, loop.iter) in lists  # type: ignore[attr-defined]
        }

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.BaseStatement]:
        updated = super().leave_For(original_node, updated_node)
        if id(original_node) not in self._loops or not isinstance(updated, cst.For):
            return updated
        shard = self._fresh(original_node, "shard")
        accelerator = self.plan.accelerator
        self.change(original_node, f"each process runs its share of `{original_node.iter.value}`, "  # type: ignore[attr-defined]
                    "the results gathered in order")
        block = self.parse_statement(
            f"with {accelerator}.split_between_processes({original_node.iter.value}) as {shard}:\n    pass\n")  # type: ignore[attr-defined]
        loop = updated.with_changes(iter=cst.Name(shard), leading_lines=[])
        return block.with_changes(body=block.body.with_changes(body=[loop]),  # type: ignore[attr-defined]
                                  leading_lines=updated.leading_lines)

    def _fresh(self, loop: cst.For, base: str) -> str:
        taken = {n.value for n in findall(self.context.module or loop, m.Name())}  # type: ignore[attr-defined]
        name, i = base, 2
        while name in taken:
            name, i = f"{base}{i}", i + 1
        return name

    def edit_body(self, block, items: list[Item]) -> list[Item]:
        if not any(id(s) in self._loops for s in block.body):
            return items
        out: list[Item] = []
        for updated, before in items:
            out.append((updated, before))
            if before is not None and id(before) in self._loops:
                add_target_import(self.context, "gather_object")
                for name in self._loops[id(before)]:
                    out.append((self.parse_statement(f"{name} = gather_object({name})\n"), None))
        return out
