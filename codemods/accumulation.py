"""ACC013: hand-written gradient accumulation -> ``accelerator.accumulate(model)``."""

from __future__ import annotations

from typing import Union

import libcst as cst
import libcst.matchers as m

from accelify.analyses.manual_accumulation import Accumulation, match
from accelify.analyses.plan import Plan
from accelify.queries.names import code_of
from accelify.queries.refs import ref_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, merge_leading_lines


class GradientAccumulation(AccelifyCodemod):
    """Let the Accelerator accumulate: ``gradient_accumulation_steps=N`` and ``accelerator.accumulate(model)``.

    Only a loop whose update is provably Accelerate's is rewritten: the loss is
    divided by ``N`` right before its one ``.backward()``, and the optimizer steps
    under ``if (i + 1) % N == 0 or (i + 1) == len(loader)``, ``i`` counting the
    batches of a prepared dataloader.  ``accelerator.backward`` then divides the
    loss, the optimizer and a prepared scheduler skip their step between
    synchronisations, and processes exchange gradients only when they step.  A
    step branch doing more than stepping and zeroing keeps its ``if``, tested on
    ``accelerator.sync_gradients``.  Every other hand-written accumulation is kept
    and reported (ACC117): with only the ``% N`` test, the last batches of each
    epoch would be stepped on where the script carries them over.

    Before::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step, (x, y) in enumerate(loader):
            loss = model(x, y)
            loss = loss / 4
            loss.backward()
            if (step + 1) % 4 == 0 or (step + 1) == len(loader):
                optimizer.step()
                optimizer.zero_grad()

    After::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step, (x, y) in enumerate(loader):
            with accelerator.accumulate(model):
                loss = model(x, y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """

    AFTER = frozenset({"ACC004"})
    CODE = "ACC013"
    NAME = "gradient-accumulation"
    DESCRIPTION = "Manual accumulation (loss / N, step every N batches) -> gradient_accumulation_steps=N + accumulate()."
    REQUIRES = frozenset({"ACC001", "ACC004", "ACC005"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return plan.accumulation_steps is not None

    def visit_Module(self, node: cst.Module) -> None:
        self.converted = 0
        # Only a scheduler that went through `prepare` skips its step between synchronisations.
        prepare = m.Call(func=m.Attribute(attr=m.Name("prepare")))
        self._prepared = {
            code_of(arg.value) for call in findall(node, prepare)
            if code_of(call.func.value) == self.plan.accelerator  # type: ignore[attr-defined]
            for arg in call.args  # type: ignore[attr-defined]
        }
        inserted = self.other("ACC004")
        self._prepared |= set(getattr(inserted, "prepared", ()))

    def finished(self) -> None:
        # The Accelerator divides every loss by N from now on: a loop left dividing too would
        # divide twice, so a plan this pass could not carry out must not reach the output.
        if self.converted != 1:
            raise RuntimeError("the gradient accumulation loop planned for ACC013 was not found")

    def _only_steps(self, branch: cst.If) -> bool:
        """The branch only steps and zeroes prepared objects: inside ``accumulate`` those calls
        skip themselves between synchronisations, so the ``if`` can go."""
        if branch.body.header.comment is not None or not isinstance(branch.body, cst.IndentedBlock):
            return False
        optimizers = self.plan.refs(self.plan.optimizers)
        schedulers = self.plan.refs([s for s in self.plan.schedulers if s in self._prepared])
        scalers = self.plan.refs(sorted(self.plan.scalers))
        for stmt in branch.body.body:
            call = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=m.Name() | m.Attribute())))])
            if not m.matches(stmt, call):
                return False
            call_node = stmt.body[0].value  # type: ignore[attr-defined]
            receiver, method = ref_of(self, call_node.func.value), call_node.func.attr.value
            ok = (
                (receiver in optimizers and method in ("step", "zero_grad"))
                or (receiver in schedulers and method == "step" and not call_node.args)
                or (receiver in scalers and method == "update")
                or (
                    receiver in scalers and method == "step" and len(call_node.args) == 1
                    and ref_of(self, call_node.args[0].value) in optimizers
                )
            )
            if not ok:
                return False
        return True

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.BaseStatement]:
        updated = super().leave_For(original_node, updated_node)
        found = match(self, original_node, self.plan)
        if not isinstance(found, Accumulation) or code_of(found.steps) != self.plan.accumulation_steps:
            return updated
        accelerator = self.accelerator_at(original_node)
        if accelerator is None or not isinstance(updated, cst.For) or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        dedent = self._only_steps(found.branch)

        statements: list[cst.BaseStatement] = []
        pending: list[cst.EmptyLine] = []
        for stmt in body:
            origin = self.shared.origin_of(stmt)
            if pending:
                stmt = stmt.with_changes(leading_lines=merge_leading_lines(pending, stmt.leading_lines))
                pending = []
            if origin is found.division:
                small = stmt.body[0]  # type: ignore[attr-defined]
                if isinstance(small, cst.AugAssign) or m.matches(small.value.left, small.targets[0].target):
                    pending = list(stmt.leading_lines)  # `loss = loss / N`, `loss /= N`: the statement goes
                    continue
                left = small.value.left
                if getattr(left, "lpar", None):
                    left = left.with_changes(lpar=[], rpar=[])
                stmt = stmt.with_changes(body=[small.with_changes(value=left)])  # `loss = f(x) / N` -> `loss = f(x)`
            elif origin is found.branch and dedent:
                inner = list(stmt.body.body)  # type: ignore[attr-defined]
                inner[0] = inner[0].with_changes(leading_lines=merge_leading_lines(stmt.leading_lines, inner[0].leading_lines))
                statements.extend(inner)
                continue
            elif origin is found.branch:
                stmt = stmt.with_changes(test=cst.parse_expression(f"{accelerator}.sync_gradients"))  # type: ignore[call-arg]
            statements.append(stmt)

        with_ = cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{accelerator}.accumulate({found.model})"))],
            body=cst.IndentedBlock(body=statements),
        )
        self.converted += 1
        self.change(
            original_node,
            f"gradient accumulation through `{accelerator}.accumulate({found.model})` "
            f"(`gradient_accumulation_steps={self.plan.accumulation_steps}`)",
        )
        return updated.with_changes(body=updated.body.with_changes(body=[with_]))
