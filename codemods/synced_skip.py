"""ACC026: a batch skipped before its backward pass, or a training loop left, on a value of one process's
shard, by every process together."""

from __future__ import annotations

from typing import Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.early_stop import EarlyStops, jump_if, reached_every_pass
from accelify.analyses.plan import Plan
from accelify.queries.walk import findall

from .base import AccelifyCodemod

_BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))


class SyncedSkip(AccelifyCodemod):
    """Skip a batch on every process when one of them decides to (``set_trigger``/``check_trigger``).

    ``if <value of this batch>: ... continue`` before the backward pass (a zero or NaN loss, an empty
    batch) holds on the process whose shard has that batch, not on the others: that process skips
    its backward while the others run theirs, and from then on the processes' gradient
    all-reduces no longer pair up (a hang, or gradients of different steps averaged).  Raising
    Accelerate's trigger where the condition holds and skipping on ``check_trigger()`` makes every
    process skip that step together; in one process it is the same skip.  ``check_trigger()`` is a
    collective: a skip nested in another condition, which only some processes would reach, is
    refused (ACC137); in the body of a ``with`` or ``try`` it is reached by every process.  The same
    holds for ``if <value of this shard>: break`` out of a loop that trains: every process leaves it
    at the same step (one under another condition stays reported, ACC119).

    Before::

        import torch

        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            if torch.isnan(loss):
                continue
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    After::

        import torch

        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            if torch.isnan(loss):
                accelerator.set_trigger()
            if accelerator.check_trigger():
                continue
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """

    CODE = "ACC026"
    NAME = "synced-skip"
    DESCRIPTION = ("A batch skipped before its backward pass (`if loss == 0: continue`), or a training loop left "
                   "(`if loss.item() < 1e-4: break`), on a value of one process's shard, by every process together: "
                   "accelerator.set_trigger() + check_trigger().")
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ("continue" in code or "break" in code) and not plan.evaluation

    def visit_Module(self, node: cst.Module) -> None:
        loops = [n for n in findall(node, m.For() | m.While())]
        self._stops = EarlyStops(self, self.plan, node, loops, [])  # type: ignore[arg-type]

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.BaseStatement, cst.FlattenSentinel]:
        skip = jump_if(original_node, cst.Continue) and self._skips_backward(original_node)
        stop = not skip and jump_if(original_node, cst.Break) and self._stops.leaves_trained_loop(
            original_node.body.body[-1].body[0])  # type: ignore[attr-defined]
        if not skip and not stop:
            return updated_node
        culprit = self._stops.guarded_by(original_node.body.body[-1])  # type: ignore[attr-defined]
        accelerator = self.accelerator_at(original_node)
        if culprit is None:
            return updated_node
        if accelerator is None:
            if stop and reached_every_pass(self, original_node):  # (ACC119 left it to this codemod)
                self.finding(original_node.body.body[-1], "ACC119",  # type: ignore[attr-defined]
                             f"`break` out of the training loop decided by `{culprit}`, which each process computes "
                             "from its own shard, where no Accelerator is in reach: processes would stop at different "
                             "steps and the next collective hangs.",
                             "hand the accelerator here, call `accelerator.set_trigger()` where the condition holds "
                             "and leave the loop on `if accelerator.check_trigger(): break`.")
            return updated_node
        if not reached_every_pass(self, original_node):
            if stop:
                return updated_node  # reported (ACC119), converted around
            # `check_trigger()` is a collective: under another condition, only some processes would reach it
            self.refuse(
                original_node, "ACC137",
                f"a batch is skipped before its backward pass on `{culprit}`, which each process computes from its "
                "own shard, inside another condition: the processes would run different numbers of backward "
                "passes (their gradient all-reduces stop pairing up), and a check every process makes cannot go "
                "there. File not converted.",
                f"decide the skip directly in the loop (`if <condition>: {accelerator}.set_trigger()`, then "
                f"`if {accelerator}.check_trigger(): continue` at the loop's own level).",
            )
            return updated_node
        what = "skip" if skip else "stop"
        self.change(original_node, f"the {what} decided by `{culprit}` is taken by every process together")
        self.replaced(original_node)
        body = list(updated_node.body.body)  # type: ignore[attr-defined]
        raise_it = updated_node.with_changes(body=updated_node.body.with_changes(
            body=[*body[:-1], cst.parse_statement(f"{accelerator}.set_trigger()")]))
        check = cst.If(test=cst.parse_expression(f"{accelerator}.check_trigger()"),
                       body=updated_node.body.with_changes(body=[body[-1]]))
        return cst.FlattenSentinel([raise_it, check])  # the jump keeps its comment

    def _skips_backward(self, statement: cst.If) -> bool:
        """Is there a backward pass after ``statement`` in the body of the loop its ``continue`` continues?"""
        node: cst.CSTNode = statement
        while True:
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if parent is None or isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                return False
            if isinstance(parent, (cst.For, cst.While)):
                break
            node = parent
        line = self.line_of(statement)[0]
        return any(self.line_of(call)[0] > line for call in findall(parent.body, _BACKWARD))
