"""ACC011: evaluation metrics see every sample once, over all processes."""

from __future__ import annotations

import libcst as cst

from accelify.analyses.gathers import Gather, Refusal, find_gather
from accelify.analyses.plan import Plan
from accelify.queries.trees import Item

from .base import AccelifyCodemod


class GatherForMetrics(AccelifyCodemod):
    """In evaluation loops, gather model outputs and labels before they feed a metric.

    A prepared dataloader gives each process a shard: without a gather, every
    process counts only its own samples.  ``gather_for_metrics`` also drops the
    samples repeated to fill the last, uneven batch, so each sample counts once.

    Before::

        import torch
        from torch.utils.data import DataLoader

        test_loader = DataLoader(test_set, batch_size=32)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for data, target in test_loader:
            output = model(data)
            correct += (output.argmax(dim=1) == target).sum().item()

    After::

        import torch
        from torch.utils.data import DataLoader

        test_loader = DataLoader(test_set, batch_size=32)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for data, target in test_loader:
            output = model(data)
            output, target = accelerator.gather_for_metrics((output, target))
            correct += (output.argmax(dim=1) == target).sum().item()
    """

    CODE = "ACC011"
    NAME = "gather-for-metrics"
    DESCRIPTION = "In eval loops, outputs and labels go through accelerator.gather_for_metrics before metrics."
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "+=" in code or ".append(" in code or ".extend(" in code or ".add_batch(" in code or ".update(" in code

    def visit_Module(self, node: cst.Module) -> None:
        self._before: dict[int, tuple[Gather, str]] = {}
        self._replace: dict[int, str] = {}
        self._inline: dict[int, str] = {}  # a model call gathered inline -> its code once rewritten

    def visit_For(self, node: cst.For) -> None:
        gather = find_gather(self, node, self.plan)
        if gather is None:
            return
        accelerator = self.accelerator_at(node)
        if isinstance(gather, Refusal):
            self.refuse(node, "ACC114", gather.message, gather.suggestion)
            return
        if isinstance(gather, str):
            self.refuse(
                node, "ACC114", f"evaluation metrics over a prepared dataloader would count one process's shard "
                f"only: {gather}. File not converted.",
                "gather the tensors the metric reads together, right before it: "
                "`predictions, labels = accelerator.gather_for_metrics((predictions, labels))`.",
            )
            return
        if accelerator is None:
            self.refuse(
                node, "ACC114", "evaluation metrics over a prepared dataloader would count one process's shard "
                "only, and this code cannot reach the Accelerator. File not converted.",
                "pass the accelerator here and gather outputs and labels with `accelerator.gather_for_metrics(...)`.",
            )
            return
        self._before[id(gather.statement)] = (gather, accelerator)
        self._replace.update(gather.replace)
        self.change(gather.statement, f"`{', '.join(gather.values)}` gathered from every process before the metrics")

    def _gather_line(self, gather: Gather, accelerator: str) -> str:
        # a model call gathered where it is (`features.append(model(x.to(device)))`) keeps what the
        # other codemods made of it (`model(x)`)
        values = [self._inline.get(id(node), code) for node, code in zip(gather.nodes, gather.values)]
        value = f"({', '.join(values)})" if len(values) > 1 else values[0]
        return f"{', '.join(gather.names)} = {accelerator}.gather_for_metrics({value})\n"

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return cst.Name(self._replace[id(original_node)]) if id(original_node) in self._replace else updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        return cst.Name(self._replace[id(original_node)]) if id(original_node) in self._replace else updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self._replace:
            return updated_node
        self._inline[id(original_node)] = cst.Module(body=[]).code_for_node(updated_node)
        return cst.Name(self._replace[id(original_node)])

    def edit_body(self, block, items: list[Item]) -> list[Item]:
        if not any(id(s) in self._before for s in block.body):
            return items
        out: list[Item] = []
        done: set[int] = set()
        for updated, before in items:
            if before is not None and id(before) in self._before and id(before) not in done:
                done.add(id(before))
                gather = self.parse_statement(self._gather_line(*self._before[id(before)]))
                if not any(line.comment is not None for line in updated.leading_lines):
                    # blank lines go before the gather; comment lines stay with what they describe
                    gather = gather.with_changes(leading_lines=updated.leading_lines)
                    updated = updated.with_changes(leading_lines=[])
                out.append((gather, None))
            out.append((updated, before))
        return out
