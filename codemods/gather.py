"""ACC011: evaluation metrics see every sample once, over all processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import libcst as cst
import libcst.matchers as m

from accelify.analysis import assigned_names, peel_iterable, ref_of, root_name, simple_assign
from accelify.plan import Plan

from .base import AccelifyCodemod

_METRIC_CALLS = m.Expr(m.Call(func=m.Attribute(attr=m.Name("append") | m.Name("extend") | m.Name("add_batch")
                                               | m.Name("update"))))


# Attributes of a tensor, not parts of an output object.
_TENSOR_ATTRIBUTES = frozenset({"shape", "data", "T", "dtype", "device", "ndim", "real", "imag"})


@dataclass
class Gather:
    """Where to gather (after ``statement``, in ``block``) and which names."""

    block: cst.IndentedBlock
    statement: cst.BaseStatement
    names: list[str]


def find_gather(visitor: cst.MetadataDependent, loop: cst.For, plan: Plan) -> Union[Gather, str, None]:
    """An evaluation loop over a prepared dataloader whose model outputs and labels feed metrics.

    ``None`` when the loop trains (calls ``.backward()``), already gathers, or is not
    of the plain shape accelify can rewrite: ``out = model(...)`` followed by
    counters (``+=``) or ``append``/``add_batch``/``update`` calls over names.  The
    reason, when the metrics read something computed from the batch that is not
    a plain batch name (gathering the outputs alone would pair them with one
    process's labels).
    """
    if ref_of(visitor, peel_iterable(visitor, loop.iter)) not in plan.flow["loader"]:
        return None
    if m.findall(loop.body, m.Attribute(attr=m.Name("backward") | m.Name("gather_for_metrics"))):
        return None
    batch = set(assigned_names(loop.target))
    derived = set(batch)  # anything computed from the batch, gatherable or not
    rows = list(_statements(loop.body))
    for position, (block, stmt) in enumerate(rows):
        assign = simple_assign(stmt)
        if assign is not None and {n.value for n in m.findall(assign.value, m.Name())} & derived:  # type: ignore[attr-defined]
            derived |= {n for t in assign.targets for n in assigned_names(t.target)}
        if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            if assign is not None:
                root = root_name(assign.value)
                if root is not None and root.value in batch:
                    batch |= {n for t in assign.targets for n in assigned_names(t.target)}
            continue
        value = _model_call(assign.value)
        if not (isinstance(value, cst.Call) and ref_of(visitor, value.func) in plan.flow["model"]):
            root = root_name(assign.value)
            if root is not None and root.value in batch:
                batch.add(assign.targets[0].target.value)
            continue
        output = assign.targets[0].target.value
        later = [s for _, s in rows[position + 1 :]]
        metrics = [s for s in later if m.matches(s, m.SimpleStatementLine(body=[m.AugAssign() | _METRIC_CALLS]))]
        if not metrics:
            return None
        # What the metrics read, directly or through the statements between (`mse = criterion(out, y)`).
        needed = {n.value for metric in metrics for n in m.findall(metric, m.Name())}  # type: ignore[attr-defined]
        for s in reversed(later):
            inner = simple_assign(s)
            if inner is not None and {n for t in inner.targets for n in assigned_names(t.target)} & needed:
                needed |= {n.value for n in m.findall(inner.value, m.Name())}  # type: ignore[attr-defined]
        # Labels are the batch names the metrics read (`target`, or a whole `batch` dict).
        names: list[str] = [output, *sorted(batch & needed, key=_first_use(later, batch))]
        if (derived & needed) - set(names):
            return "the metrics read a value derived from the batch that accelify cannot gather with the outputs"
        # Only tensors are gathered: not a whole output object (`outputs.logits`: a dataclass or a
        # namespace crashes the gather) nor a whole batch (`batch["labels"]`: the inputs too).
        for name in names:
            for s in later:
                called = {id(c.func) for c in m.findall(s, m.Call())}  # type: ignore[attr-defined]
                parts = [
                    *(a for a in m.findall(s, m.Attribute(value=m.Name(name)))
                      if id(a) not in called and a.attr.value not in _TENSOR_ATTRIBUTES),  # type: ignore[attr-defined]
                    *m.findall(s, m.Subscript(value=m.Name(name), slice=[m.SubscriptElement(m.Index(m.SimpleString()))])),
                ]
                if parts:
                    return (f"they read a part of `{name}` (`{cst.Module(body=[]).code_for_node(parts[0])}`), and "
                            "gathering the whole object would send every input and can fail on a non-tensor "
                            "output; gather the tensors the metric reads right before it")
        return Gather(block, stmt, names)
    return None


def _model_call(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``model(x).logits``, ``model(a, b).squeeze()`` -> ``model(...)``: the call that makes the output."""
    while True:
        if isinstance(expr, cst.Attribute):
            expr = expr.value
        elif isinstance(expr, cst.Call) and m.matches(expr.func, m.Attribute(value=m.Call() | m.Attribute(value=m.Call()))):
            expr = expr.func.value  # type: ignore[attr-defined]
        else:
            return expr  # `model(x)`, `self.model(x)`


def _first_use(statements: list[cst.BaseStatement], names: set[str]):
    order: dict[str, int] = {}
    for s in statements:
        for node in m.findall(s, m.Name()):
            if node.value in names:  # type: ignore[attr-defined]
                order.setdefault(node.value, len(order))  # type: ignore[attr-defined]
    return lambda name: order.get(name, len(order))


def _statements(block: cst.BaseSuite) -> Sequence[tuple[cst.IndentedBlock, cst.BaseStatement]]:
    """The loop body's statements, with those of a ``with`` directly in it (``with torch.no_grad():``)."""
    out: list[tuple[cst.IndentedBlock, cst.BaseStatement]] = []
    if not isinstance(block, cst.IndentedBlock):
        return out
    for stmt in block.body:
        out.append((block, stmt))
        if isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock):
            out.extend(_statements(stmt.body))
    return out


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
        self._after: dict[int, tuple[cst.BaseStatement, str]] = {}

    def visit_For(self, node: cst.For) -> None:
        gather = find_gather(self, node, self.plan)
        if gather is None:
            return
        accelerator = self.accelerator_at(node)
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
        names = ", ".join(gather.names)
        value = f"({names})" if len(gather.names) > 1 else names
        self._after[id(gather.statement)] = (gather.statement, f"{names} = {accelerator}.gather_for_metrics({value})\n")
        self.change(gather.statement, f"`{names}` gathered from every process before the metrics")

    def edit_body(self, original, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        if not any(id(s) in self._after for s in original.body):
            return body
        out: list[cst.BaseStatement] = []
        for before, updated in zip(original.body, body):
            out.append(updated)
            if id(before) in self._after:
                out.append(self.parse_statement(self._after[id(before)][1]))
        return out
