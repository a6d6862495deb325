"""ACC025: a part of the batch the script kept on the host is collected on the host."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan
from accelify.queries.loops import peel_iterable
from accelify.queries.names import assigned_names
from accelify.queries.refs import ref_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod


class HostBatchParts(AccelifyCodemod):
    """A part of the batch the original never moved (``labels.append(y)`` beside ``x = x.to(device)``)
    is collected with ``.cpu()``.

    The original kept ``y`` on the host while it moved ``x``: what it collected of ``y`` was a host
    tensor, and the code after the loop treats it so (bentrevett's MLP notebook hands the labels to
    ``plt.scatter``, which converts them to numpy). Converted, the prepared loader puts the whole
    batch on the accelerator's device: ``.cpu()`` where the part is collected keeps the collection
    where it was (and does nothing where the script runs on the CPU).

    Before::

        import torch
        from torch.utils.data import DataLoader

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader(dataset, batch_size=8)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        features, labels = [], []
        for x, y in loader:
            x = x.to(device)
            features.append(model(x).cpu())
            labels.append(y)

    After::

        import torch
        from torch.utils.data import DataLoader

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader(dataset, batch_size=8)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        features, labels = [], []
        for x, y in loader:
            x = x.to(device)
            features.append(model(x).cpu())
            labels.append(y.cpu())
    """

    CODE = "ACC025"
    NAME = "host-batch-parts"
    DESCRIPTION = "A batch part the original never moved, collected with .append(y) -> .append(y.cpu())."
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ".append(" in code and (".to(" in code or ".cuda(" in code)

    def visit_Module(self, node: cst.Module) -> None:
        self._host: set[int] = set()  # ids of the appended names to collect with .cpu()
        loaders = self.plan.flow["loader"]
        for loop in findall(node, m.For()):
            if ref_of(self, peel_iterable(self, loop.iter)) not in loaders:  # type: ignore[attr-defined]
                continue
            parts = set(assigned_names(loop.target))  # type: ignore[attr-defined]
            moved = {n for call in findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda"))))
                     for n in _names(call.func.value)}  # type: ignore[attr-defined]
            if not parts & moved:
                continue  # the script moved no part of this batch: nothing tells where it wanted them
            assigned = {n for a in findall(loop.body, m.Assign()) for t in a.targets  # type: ignore[attr-defined]
                        for n in assigned_names(t.target)}
            for call in findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg(m.Name())])):
                name = call.args[0].value  # type: ignore[attr-defined]
                if name.value in parts - moved - assigned:
                    self._host.add(id(name))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if id(original_node.value) not in self._host:
            return updated_node
        self.change(original_node, "a part of the batch the original kept on the host: collected with `.cpu()`")
        return updated_node.with_changes(value=cst.Call(func=cst.Attribute(value=updated_node.value, attr=cst.Name("cpu"))))


def _names(expr: cst.BaseExpression) -> set[str]:
    """``x`` of ``x.to(device)``, ``batch["x"].to(device)``."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return {expr.value} if isinstance(expr, cst.Name) else set()
