"""ACC032: a ReduceLROnPlateau steps on the mean of its metric over the processes."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.names import PLATEAU_SCHEDULERS, code_of, qualified_names
from accelify.queries.refs import assigned_values
from accelify.queries.walk import findall

from .base import AccelifyCodemod, add_target_import


class PlateauMetric(AccelifyCodemod):
    """``scheduler.step(val_loss)`` of a ``ReduceLROnPlateau`` steps on the mean of ``val_loss`` over the processes.

    The scheduler lowers the learning rate when the value it is handed stops improving. Each process
    computes that value over what it saw (the mean loss of its shard of an epoch): handed as it is, each
    process would lower its learning rate at other epochs, and the processes would train the one model
    with different learning rates, their weights drifting apart with nothing reported. The mean over the
    processes (``gather_object``, exact in one process) is the same on every one, and close to the value
    one process computes over the whole epoch; a value already the same everywhere (a metric gathered over
    the whole validation set) stays what it was. A step made by one process only (under
    ``if accelerator.is_main_process:``), or where no Accelerator can be reached, leaves the file unchanged
    (ACC150).

    Before::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)
        for epoch in range(10):
            total = 0.0
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            scheduler.step(total / len(loader))

    After::

        import torch
        from accelerate.utils import gather_object

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)
        for epoch in range(10):
            total = 0.0
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            scheduler.step(sum(gather_object([float(total / len(loader))])) / accelerator.num_processes)
    """

    CODE = "ACC032"
    NAME = "plateau-metric"
    DESCRIPTION = ("scheduler.step(metric) of a ReduceLROnPlateau -> the metric's mean over the processes "
                   "(sum(gather_object([float(metric)])) / accelerator.num_processes).")
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "ReduceLROnPlateau" in code

    def visit_Module(self, node: cst.Module) -> None:
        self._steps: dict[int, str] = {}  # the step calls -> the accelerator they reach
        plateaus = {code_of(t.target) for a in findall(node, m.Assign()) if isinstance(a.value, cst.Call)  # type: ignore[attr-defined]
                    and qualified_names(self, a.value.func) & PLATEAU_SCHEDULERS for t in a.targets}  # type: ignore[attr-defined]
        for call in findall(node, m.Call(func=m.Attribute(attr=m.Name("step")))):
            receiver = call.func.value  # type: ignore[attr-defined]
            metric = _metric(call)  # type: ignore[arg-type]
            if metric is None or code_of(receiver) not in plateaus or not self._plateau(receiver) or _averaged(metric.value):
                continue
            accelerator = self.accelerator_at(call)
            if under_main_process_check(self, call) or accelerator is None:
                where = ("by the main process only" if accelerator is not None else
                         "where the Accelerator cannot be reached")
                self.refuse(
                    call, "ACC150",
                    f"`{code_of(call)}` steps a ReduceLROnPlateau on a value each process computes, {where}: every "
                    "process must step it on the same value (the mean over the processes), or the processes would "
                    "train with learning rates of their own. File not converted.",
                    "step the scheduler on every process, where the Accelerator is, on the mean over the processes "
                    "(`sum(gather_object([float(value)])) / accelerator.num_processes`).",
                )
                continue
            self._steps[id(call)] = accelerator

    def _plateau(self, receiver: cst.BaseExpression) -> bool:
        """``scheduler`` bound to a ReduceLROnPlateau wherever it is bound in its scope (``self.scheduler``: by
        its spelling, as bound in the class)."""
        if not isinstance(receiver, cst.Name):
            return True
        values = assigned_values(self, receiver)
        return bool(values) and all(isinstance(v, cst.Call) and qualified_names(self, v.func) & PLATEAU_SCHEDULERS for v in values)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        accelerator = self._steps.get(id(original_node))
        metric = _metric(updated_node) if accelerator is not None else None
        if metric is None:
            return updated_node
        self.change(original_node, "the ReduceLROnPlateau steps on the mean of its value over the processes")
        add_target_import(self.context, "gather_object")
        value = cst.parse_expression(
            f"sum(gather_object([float({code_of(metric.value)})])) / {accelerator}.num_processes")
        return updated_node.with_changes(args=[a.with_changes(value=value) if a is metric else a for a in updated_node.args])


def _metric(call: cst.Call) -> Optional[cst.Arg]:
    """The value handed to ``step``: its first positional argument, or ``metrics=``."""
    return next((a for a in call.args if (a.keyword is None and not a.star) or (
        a.keyword is not None and a.keyword.value == "metrics")), None)


def _averaged(value: cst.BaseExpression) -> bool:
    """Converted already: ``sum(gather_object([...])) / accelerator.num_processes``."""
    return m.matches(value, m.BinaryOperation(left=m.Call(func=m.Name("sum")), right=m.Attribute(
        attr=m.Name("num_processes"))))
