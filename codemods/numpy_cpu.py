"""ACC019: ``.numpy()`` gets ``.cpu()`` first where the tensor may now be on the device."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.data import is_hand_made, places_nothing
from accelify.analyses.plan import Plan
from accelify.queries.blocks import binds
from accelify.queries.loops import enclosing_loop_over, enumerate_counter
from accelify.queries.names import assigned_names

from .base import AccelifyCodemod


class NumpyOnCpu(AccelifyCodemod):
    """In a script that placed nothing on a device, ``.numpy()`` gets ``.cpu()`` first.

    The original computed on the CPU, where ``.numpy()`` of a batch or of a model's output works.
    Converted, ``prepare`` puts the model and the batches on the accelerator's device, where
    ``.numpy()`` raises (the PyTorch CIFAR-10 tutorial's ``imshow`` of a test batch). ``.cpu()`` of
    a tensor already on the CPU is that tensor: nothing changes where the script still runs on the
    CPU. A script that placed its model itself already moved its tensors back before ``.numpy()``:
    left as it is, but for a batch taken to NumPy as the loop draws it, before the script placed it
    (PointNet's ``points = points.data.numpy()`` for its augmentation): ``prepare`` placed it already.

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
    DESCRIPTION = ("In a script that placed nothing on a device, tensor.numpy() -> tensor.cpu().numpy(); in any script, "
                   "batch.numpy() of a batch as a prepared loader gives it.")
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ".numpy()" in code

    def visit_Module(self, node: cst.Module) -> None:
        self.active = places_nothing(self, self.plan, node)

    def _fresh_batch(self, call: cst.Call, receiver: cst.BaseExpression) -> bool:
        """In a script that placed its tensors: ``points.data.numpy()`` of a batch of a prepared loader, as
        the loop drew it (PointNet converts its batch to NumPy before placing it): ``prepare`` has put it
        on the device already."""
        root = _root(receiver)
        if not isinstance(root, cst.Name):
            return False
        loop = enclosing_loop_over(self, call, self.plan.flow["loader"])
        if loop is None or root.value not in assigned_names(loop.target) or root.value in enumerate_counter(loop):
            return False
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []
        statement = next((s for s in body if self.inside(call, {id(s)})), None)
        return statement is not None and not any(binds(s, {root.value}) for s in body[:body.index(statement)])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node.args or not m.matches(original_node.func, m.Attribute(attr=m.Name("numpy"))):
            return updated_node
        receiver = original_node.func.value  # type: ignore[attr-defined]
        if not self.active and not self._fresh_batch(original_node, receiver):
            return updated_node
        if _moved_to_cpu(receiver) or is_hand_made(self, receiver):
            return updated_node
        self.change(original_node, "`.numpy()` -> `.cpu().numpy()`: the tensor may be on the accelerator's device now")
        func = updated_node.func  # type: ignore[assignment]
        cpu = cst.Call(func=cst.Attribute(value=func.value, attr=cst.Name("cpu")))  # type: ignore[attr-defined]
        return updated_node.with_changes(func=func.with_changes(value=cpu))  # type: ignore[attr-defined]


def _root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``x.data.float()`` -> ``x``: the start of an attribute and method chain."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        elif isinstance(expr, cst.Attribute):
            expr = expr.value
        else:
            return expr


def _moved_to_cpu(expr: cst.BaseExpression) -> bool:
    """``x.cpu()``, ``x.detach().cpu()``, ``x.cpu().detach()``: a ``.cpu()`` along the method chain."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        if expr.func.attr.value == "cpu" or (
            expr.func.attr.value == "to" and expr.args and m.matches(expr.args[0].value, m.SimpleString('"cpu"') | m.SimpleString("'cpu'"))
        ):
            return True
        expr = expr.func.value
    return False
