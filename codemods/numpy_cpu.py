"""ACC019: ``.numpy()`` gets ``.cpu()`` first in a script that computed on the CPU."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.data import is_hand_made, places_nothing
from accelify.analyses.plan import Plan

from .base import AccelifyCodemod


class NumpyOnCpu(AccelifyCodemod):
    """In a script that placed nothing on a device, ``.numpy()`` gets ``.cpu()`` first.

    The original computed on the CPU, where ``.numpy()`` of a batch or of a model's output works.
    Converted, ``prepare`` puts the model and the batches on the accelerator's device, where
    ``.numpy()`` raises (the PyTorch CIFAR-10 tutorial's ``imshow`` of a test batch). ``.cpu()`` of
    a tensor already on the CPU is that tensor: nothing changes where the script still runs on the
    CPU. A script that placed its model itself already moved its tensors back before ``.numpy()``:
    left as it is.

    Before::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            preds = model(x).argmax(1).numpy()

    After::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            preds = model(x).argmax(1).cpu().numpy()
    """

    CODE = "ACC019"
    NAME = "numpy-cpu"
    DESCRIPTION = "In a script that placed nothing on a device, tensor.numpy() -> tensor.cpu().numpy()."
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ".numpy()" in code and ".cuda(" not in code

    def visit_Module(self, node: cst.Module) -> None:
        self.active = places_nothing(self, self.plan, node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.active or original_node.args or not m.matches(original_node.func, m.Attribute(attr=m.Name("numpy"))):
            return updated_node
        receiver = original_node.func.value  # type: ignore[attr-defined]
        if _moved_to_cpu(receiver) or is_hand_made(self, receiver):
            return updated_node
        self.change(original_node, "`.numpy()` -> `.cpu().numpy()`: the tensor may be on the accelerator's device now")
        func = updated_node.func  # type: ignore[assignment]
        cpu = cst.Call(func=cst.Attribute(value=func.value, attr=cst.Name("cpu")))  # type: ignore[attr-defined]
        return updated_node.with_changes(func=func.with_changes(value=cpu))  # type: ignore[attr-defined]


def _moved_to_cpu(expr: cst.BaseExpression) -> bool:
    """``x.cpu()``, ``x.detach().cpu()``, ``x.cpu().detach()``: a ``.cpu()`` along the method chain."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        if expr.func.attr.value == "cpu" or (
            expr.func.attr.value == "to" and expr.args and m.matches(expr.args[0].value, m.SimpleString('"cpu"') | m.SimpleString("'cpu'"))
        ):
            return True
        expr = expr.func.value
    return False
