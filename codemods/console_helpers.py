"""ACC023: a home-made progress bar draws on the local main process only."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.plan import Plan
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.names import qualified_names
from accelify.queries.refs import assigned_values
from accelify.queries.walk import findall

from .base import AccelifyCodemod

_CONSOLE = frozenset({"sys.stdout.write", "sys.stderr.write"})


class ConsoleHelpers(AccelifyCodemod):
    """A call of a function of the file that only writes to the console (``sys.stdout.write``: a
    home-made progress bar) runs on the local main process.

    kuangliu/pytorch-cifar's ``progress_bar(batch_idx, len(trainloader), msg)`` redraws a bar with
    ``\\r`` after every batch. Every process runs the loop: N bars would be drawn over each other
    on one console. The function itself is left as it is (its state, such as the time of the last
    call, is its own); its call sites go under ``if accelerator.is_local_main_process:``. A function
    that also computes something (a return value, torch, the training objects) is not one of these.
    A method that only prints and changes nothing of its object (the ImageNet example's
    ``progress.display(i)`` of ``ProgressMeter``) is one too.

    Before::

        import sys

        import torch
        from torch.utils.data import DataLoader


        def progress_bar(current, total):
            sys.stdout.write(f"\\r[{current + 1}/{total}]")


        loader = DataLoader(dataset, batch_size=8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch_idx, (x, y) in enumerate(loader):
            progress_bar(batch_idx, len(loader))

    After::

        import sys

        import torch
        from torch.utils.data import DataLoader


        def progress_bar(current, total):
            sys.stdout.write(f"\\r[{current + 1}/{total}]")


        loader = DataLoader(dataset, batch_size=8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch_idx, (x, y) in enumerate(loader):
            if accelerator.is_local_main_process:
                progress_bar(batch_idx, len(loader))
    """

    CODE = "ACC023"
    NAME = "console-helpers"
    DESCRIPTION = "A call of a console-only helper (a home-made progress bar) -> under accelerator.is_local_main_process."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "stdout.write" in code or "stderr.write" in code or "def display(" in code

    def visit_Module(self, node: cst.Module) -> None:
        self._helpers = {id(f) for f in node.body if isinstance(f, cst.FunctionDef) and self._console_only(f)}
        # `ProgressMeter.display(self, batch)` of the ImageNet example (MoCo, SimSiam...): a method that prints
        # the meters and changes nothing, called on an object of that class
        self._methods = {(c.name.value, f.name.value) for c in node.body if isinstance(c, cst.ClassDef)
                         for f in c.body.body if isinstance(f, cst.FunctionDef) and self._console_only(f, method=True)}

    def _console_only(self, function: cst.FunctionDef, method: bool = False) -> bool:
        """Writes to the console and does nothing else anyone sees: no value returned, no torch, no
        training object; a method (``method``): prints, and sets no attribute."""
        calls = findall(function, m.Call())
        console = _CONSOLE | {"builtins.print"} if method else _CONSOLE
        if not any(qualified_names(self, c.func) & console for c in calls):  # type: ignore[attr-defined]
            return False
        if method and (findall(function, m.AssignTarget(target=m.Attribute()) | m.AugAssign(target=m.Attribute()))
                       or any(isinstance(c.func, cst.Attribute) and not (qualified_names(self, c.func) & console)
                              and m.matches(c.func.value, m.Name("self")) for c in calls)):  # type: ignore[attr-defined]
            return False  # (it changes the object, or runs another of its methods)
        if any(r.value is not None for r in findall(function, m.Return())):  # type: ignore[attr-defined]
            return False
        if any(n.startswith("torch") for c in calls for n in qualified_names(self, c.func)):  # type: ignore[attr-defined]
            return False
        training = {ref[1] for flow in ("model", "loader") for ref in self.plan.flow[flow]} | set(self.plan.optimizers)
        return not {n.value for n in findall(function, m.Name())} & training  # type: ignore[attr-defined]

    def _helper_called(self, statement: cst.SimpleStatementLine) -> bool:
        if len(statement.body) == 1 and m.matches(statement.body[0], m.Expr(m.Call(func=m.Attribute(value=m.Name())))):
            func = statement.body[0].value.func  # type: ignore[attr-defined]
            values = assigned_values(self, func.value)
            return len(values) == 1 and isinstance(values[0], cst.Call) and isinstance(values[0].func, cst.Name) and (
                values[0].func.value, func.attr.value) in self._methods  # `progress = ProgressMeter(...)`
        if len(statement.body) != 1 or not m.matches(statement.body[0], m.Expr(m.Call(func=m.Name()))):
            return False
        name = statement.body[0].value.func  # type: ignore[attr-defined]
        scope = self.get_metadata(ScopeProvider, name, None)
        found = [getattr(a, "node", None) for a in scope[name.value]] if scope is not None else []
        return len(found) == 1 and id(found[0]) in self._helpers

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if updated is not updated_node or not self._helper_called(original_node) \
                or under_main_process_check(self, original_node) or self._in_helper(original_node):
            return updated
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return updated
        self.change(original_node, "a console-only helper (a progress bar): drawn by the local main process")
        self.replaced(original_node)
        return cst.If(
            test=cst.parse_expression(f"{accelerator}.is_local_main_process"),
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=updated_node.leading_lines,
        )

    def _in_helper(self, node: cst.CSTNode) -> bool:
        """Inside one of the helpers itself (one progress function calling another)."""
        current = self.get_metadata(ParentNodeProvider, node, None)
        while current is not None:
            if id(current) in self._helpers:
                return True
            current = self.get_metadata(ParentNodeProvider, current, None)
        return False
