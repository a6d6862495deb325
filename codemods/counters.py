"""ACC021: a tensor made by hand that adds up what a prepared loop computes is made on the device."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.data import is_hand_made, places_nothing
from accelify.analyses.plan import Plan
from accelify.queries.loops import peel_iterable
from accelify.queries.names import assigned_names, read_names
from accelify.queries.refs import ref_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod


class CountersOnDevice(AccelifyCodemod):
    """In a script that placed nothing on a device, a tensor it makes by hand and then adds to in a
    loop over a prepared DataLoader is made on the accelerator's device.

    The original computed on the CPU, where ``correct = torch.zeros(1)`` and
    ``correct += (pred == y).sum()`` meet on one device. Converted, ``pred`` and ``y`` come from the
    prepared model and loader, on the accelerator's device: on a GPU the in-place add of a CUDA
    tensor into a CPU one raises. Made with ``device=accelerator.device``, the counter is where
    what it adds up is (on the CPU, where the script still runs there). A hand-written DDP script on
    gloo has this shape: its counters are all-reduced after the loop.

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
        correct = torch.zeros(1)
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
        print(correct.item())

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
        correct = torch.zeros(1, device=accelerator.device)
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
        print(correct.item())
    """

    CODE = "ACC021"
    NAME = "device-counters"
    DESCRIPTION = ("In a script that placed nothing on a device, a hand-made tensor added to in a prepared loop "
                   "-> made with device=accelerator.device.")
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "+=" in code or "-=" in code

    def visit_Module(self, node: cst.Module) -> None:
        self._factories: dict[int, str] = {}  # id of a factory call -> how its scope spells the Accelerator
        if not places_nothing(self, self.plan, node):
            return
        loaders, models = self.plan.flow["loader"], self.plan.flow["model"]
        adds: dict[int, list[str]] = {}  # factory -> what each augmented add brings: device, number, host
        places: dict[int, Optional[str]] = {}
        in_loops: set[int] = set()
        for loop in findall(node, m.For()):
            if ref_of(self, peel_iterable(self, loop.iter)) not in loaders:
                continue
            derived = self._derived(loop, models)
            for step in findall(loop.body, m.AugAssign()):
                factory = self._made_by_hand(step.target)  # type: ignore[attr-defined]
                if factory is not None and id(step) not in in_loops:
                    in_loops.add(id(step))
                    adds.setdefault(id(factory), []).append(self._brings(step.value, derived, models))  # type: ignore[attr-defined]
                    places.setdefault(id(factory), self.accelerator_at(loop))
        for step in findall(node, m.AugAssign()):  # adds anywhere else
            factory = self._made_by_hand(step.target)  # type: ignore[attr-defined]
            if factory is not None and id(factory) in adds and id(step) not in in_loops:
                adds[id(factory)].append(self._brings(step.value, set(), models))  # type: ignore[attr-defined]
        for key, brought in adds.items():
            # something from the device is added, and nothing that may be a tensor on the host
            if "device" in brought and "host" not in brought and places.get(key):
                self._factories[key] = places[key]  # type: ignore[assignment]

    def _derived(self, loop: cst.For, models) -> set[str]:
        """Names in ``loop`` that hold the batch or what is computed from it or from a model's call."""
        derived = set(assigned_names(loop.target))
        for assign in findall(loop.body, m.Assign()):
            if self._brings(assign.value, derived, models) == "device":  # type: ignore[attr-defined]
                for target in assign.targets:  # type: ignore[attr-defined]
                    derived.update(assigned_names(target.target))
        return derived

    def _brings(self, value: cst.BaseExpression, derived: set[str], models) -> str:
        """``number`` (``.item()``, ``len(y)``, ``y.size(0)``, a literal), ``device`` (computed from the
        batch or a prepared model's call, never moved to the host), else ``host``."""
        if _number(value):
            return "number"
        if findall(value, m.Call(func=m.Attribute(attr=m.Name("cpu") | m.Name("numpy") | m.Name("tolist") | m.Name("to")))):
            return "host"
        reads = {name.value for name in read_names(value)}
        if reads & derived or any(ref_of(self, call.func) in models for call in findall(value, m.Call())):
            return "device"
        return "host"

    def _made_by_hand(self, target: cst.BaseExpression) -> Optional[cst.Call]:
        """The factory call that made ``target`` (``correct``, ``counts[0]``), when that is its one
        binding besides augmented assignments (``torch.zeros(1)``, ``torch.tensor(0).long()``)."""
        while isinstance(target, cst.Subscript):
            target = target.value
        if not isinstance(target, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, target, None)
        made: list[cst.BaseExpression] = []
        for assignment in scope[target.value] if scope is not None else ():
            node = getattr(assignment, "node", None)
            parent = self.get_metadata(ParentNodeProvider, node, None) if isinstance(node, cst.Name) else None
            if isinstance(parent, cst.AugAssign):
                continue
            assign = self.get_metadata(ParentNodeProvider, parent, None) if isinstance(parent, cst.AssignTarget) else None
            if isinstance(assign, cst.Assign) and self._goes(assign):
                continue  # `sum_num = reduce_value(sum_num, average=False)` after a gather: the conversion drops it
            if not isinstance(assign, cst.Assign) or not is_hand_made(self, assign.value):
                return None
            made.append(assign.value)
        if len(made) != 1:
            return None
        value = made[0]
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and is_hand_made(self, value.func.value):
            value = value.func.value  # torch.zeros(1).long(): the factory is the innermost call
        return value if isinstance(value, cst.Call) else None

    def _goes(self, assign: cst.Assign) -> bool:
        """Is ``assign`` a statement the distributed conversion removes (ACC018)?"""
        dist = self.plan.distributed
        return dist is not None and id(self.get_metadata(ParentNodeProvider, assign, None)) in dist.remove

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        accelerator = self._factories.get(id(original_node))
        if accelerator is None:
            return updated_node
        self.change(original_node, "a counter of what the prepared loop computes: made on the accelerator's device")
        args = list(updated_node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        device = cst.parse_expression(f"{accelerator}.device")
        args.append(cst.Arg(value=device, keyword=cst.Name("device"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
        return updated_node.with_changes(args=args)


_NUMBER_METHODS = frozenset({"item", "size", "numel", "nelement", "dim"})


def _number(value: cst.BaseExpression) -> bool:
    """A Python number: a literal, ``x.item()``, ``len(x)``, ``y.size(0)``, ``y.numel()``, ``x.shape[0]``,
    and arithmetic of those."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.BinaryOperation):
        return _number(value.left) and _number(value.right)
    if isinstance(value, cst.UnaryOperation):
        return _number(value.expression)
    if isinstance(value, cst.Call):
        if m.matches(value.func, m.Name("len") | m.Name("int") | m.Name("float")):
            return True
        return m.matches(value.func, m.Attribute(attr=m.OneOf(*(m.Name(n) for n in _NUMBER_METHODS))))
    return m.matches(value, m.Subscript(value=m.Attribute(attr=m.Name("shape"))))
