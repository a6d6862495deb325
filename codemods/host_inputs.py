"""ACC024: a tensor the script computed on the host goes to the device where the model gets it."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.data import is_hand_made, places_nothing
from accelify.analyses.distributed import DDP
from accelify.analyses.plan import Plan
from accelify.queries.blocks import scope_root
from accelify.queries.loops import enclosing_loop_over
from accelify.queries.names import has_qname, qualified_names
from accelify.queries.refs import ref_of
from accelify.queries.training import locate_setup, trainer_functions
from accelify.queries.walk import findall

from .base import AccelifyCodemod

# torch's namespaces that hold no tensor operations
_NOT_TENSORS = ("torch.nn", "torch.optim", "torch.utils", "torch.device", "torch.load", "torch.save", "torch.cuda",
                "torch.backends", "torch.distributed", "torch.manual_seed", "torch.no_grad")


class HostInputs(AccelifyCodemod):
    """In a script that placed nothing on a device, a tensor it computes itself (not drawn from a
    prepared DataLoader) and hands to a prepared model goes to ``accelerator.device`` at the call.

    The original computed on the CPU: ``test_x``, cut from a dataset's tensor, met the model there.
    Converted, the model is on the accelerator's device and ``test_x`` is not: on a GPU the call
    raises. ``.to(accelerator.device)`` at the call moves it there (and does nothing where the
    script still runs on the CPU). Batches of a prepared loader are placed already; tensors made
    by a factory (``torch.randn(...)`` noise) are refused instead (ACC121). In a script that wrapped its
    model in ``DistributedDataParallel`` (which moved what it was given to the process's GPU:
    ``ddp_model(torch.randn(20, 10))``), those are placed at the call too.

    Before::

        import torch
        from torch.utils.data import DataLoader

        test_x = torch.unsqueeze(test_data.data, dim=1).float()[:2000] / 255.
        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        test_output = model(test_x[:10])

    After::

        import torch
        from torch.utils.data import DataLoader

        test_x = torch.unsqueeze(test_data.data, dim=1).float()[:2000] / 255.
        loader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        test_output = model(test_x[:10].to(accelerator.device))
    """

    CODE = "ACC024"
    NAME = "host-inputs"
    DESCRIPTION = ("In a script that placed nothing on a device, a tensor it computed itself and hands to the "
                   "model -> .to(accelerator.device) at the call.")
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.flow["model"])

    def visit_Module(self, node: cst.Module) -> None:
        self._place: dict[int, str] = {}  # id of an argument's value -> how its scope spells the Accelerator
        self._batches = {}
        # `DistributedDataParallel(model, device_ids=[rank])` moved what it was given to the process's GPU:
        # `ddp_model(torch.randn(20, 10))` (the DDP tutorial). The prepared model is a plain one in one process.
        ddp_moved = self.plan.distributed is not None and any(
            has_qname(self, c.func, DDP) for c in findall(node, m.Call()))
        if not places_nothing(self, self.plan, node) and not ddp_moved:
            return
        root = scope_root(node, self.plan.setup)
        located = locate_setup(root, set(self.plan.anchors()), trainer_functions(node)) if root is not None else None
        # the line of the last statement that builds a training object: `prepare` comes right after it
        self._prepare_line = self.line_of(located[0].body[located[1] - 1])[0] if located and located[1] else None
        models = self.plan.flow["model"]
        self._batches: dict[int, tuple[list[str], str]] = {}  # an early batch's statement -> its names, Accelerator
        for call in findall(node, m.Call()):
            if ref_of(self, call.func) not in models:  # type: ignore[attr-defined]
                continue
            for arg in call.args:  # type: ignore[attr-defined]
                if arg.keyword is not None or arg.star:
                    continue
                batch = self._early_batch_statement(arg.value)
                if batch is not None:
                    self._place_batch(batch)
                elif self._computed_on_host(arg.value) or (ddp_moved and is_hand_made(self, arg.value)):
                    accelerator = self.accelerator_at(call)
                    if accelerator is not None:
                        self._place[id(arg.value)] = accelerator

    def _early_batch_statement(self, value: cst.BaseExpression) -> Optional[cst.SimpleStatementLine]:
        """The statement ``val_image, val_label = next(iter(val_loader))`` (taken before ``prepare``) that
        binds ``value`` (``val_image``, ``val_image[:4]``), if that is its one binding."""
        while isinstance(value, cst.Subscript):
            value = value.value
        if not isinstance(value, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, value, None)
        bindings = list(scope[value.value]) if scope is not None else []
        if len(bindings) != 1:
            return None
        node: Optional[cst.CSTNode] = getattr(bindings[0], "node", None)
        while node is not None and not isinstance(node, cst.Assign):
            if isinstance(node, cst.BaseStatement):
                return None
            node = self.get_metadata(ParentNodeProvider, node, None)
        if node is None or len(node.targets) != 1 or not self._early_batch(node.value):
            return None
        line = self.get_metadata(ParentNodeProvider, node, None)
        return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None

    def _place_batch(self, statement: cst.SimpleStatementLine) -> None:
        target = statement.body[0].targets[0].target  # type: ignore[attr-defined]
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [cst.Element(target)]
        names = [e.value.value for e in elements if isinstance(e.value, cst.Name)]
        accelerator = self.accelerator_at(statement)
        if len(names) == len(elements) and accelerator is not None:
            self._batches[id(statement)] = (names, accelerator)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if id(original_node) not in self._batches or updated is not updated_node:
            return updated
        names, accelerator = self._batches[id(original_node)]
        self.change(original_node, "a batch taken before `prepare`, on the host: moved to the model's device")
        placed = ", ".join(f"{n}.to({accelerator}.device)" for n in names)
        return cst.FlattenSentinel([updated, self.parse_statement(f"{', '.join(names)} = {placed}\n")])

    def _computed_on_host(self, value: cst.BaseExpression) -> bool:
        """``test_x`` or ``test_x[:10]`` where every binding of ``test_x`` is a tensor the script
        computes from host data with torch (not a factory call: ACC121's)."""
        while isinstance(value, cst.Subscript):
            value = value.value
        if not isinstance(value, cst.Name):
            return False
        scope = self.get_metadata(ScopeProvider, value, None)
        bindings = list(scope[value.value]) if scope is not None else []
        if not bindings:
            return False
        for binding in bindings:
            node = getattr(binding, "node", None)
            target = self.get_metadata(ParentNodeProvider, node, None) if isinstance(node, cst.Name) else None
            while isinstance(target, (cst.Element, cst.Tuple, cst.List)):  # `images, labels = next(it)`
                target = self.get_metadata(ParentNodeProvider, target, None)
            assign = self.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                return False
            if isinstance(assign.targets[0].target, (cst.Tuple, cst.List)) or not self._host_tensor(assign.value):
                return False
            if self._in_loader_loop(assign):
                return False  # computed from a batch, on the device already
        return True

    def _early_batch(self, value: cst.BaseExpression) -> bool:
        """``next(iter(val_loader))`` (or ``next(it)``, ``it = iter(val_loader)``) taken before ``prepare``:
        a batch of the loader as it was, on the host (WZMIAOMIAO's LeNet validates on one such batch)."""
        if not m.matches(value, m.Call(func=m.Name("next"), args=[m.Arg()])):
            return False
        source = value.args[0].value  # type: ignore[attr-defined]
        if isinstance(source, cst.Name):
            scope = self.get_metadata(ScopeProvider, source, None)
            made = [getattr(b, "node", None) for b in scope[source.value]] if scope is not None else []
            if len(made) != 1 or not isinstance(made[0], cst.Name):
                return False
            target = self.get_metadata(ParentNodeProvider, made[0], None)
            assign = self.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
            source = assign.value if isinstance(assign, cst.Assign) else None
        if not m.matches(source, m.Call(func=m.Name("iter"), args=[m.Arg()])):
            return False
        loader = source.args[0].value  # type: ignore[union-attr]
        return ref_of(self, loader) in self.plan.flow["loader"] and self._prepare_line is not None \
            and self.line_of(source)[0] < self._prepare_line

    def _host_tensor(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.BinaryOperation):
            return (self._host_tensor(expr.left) and (self._host_tensor(expr.right) or _number(expr.right))) or (
                _number(expr.left) and self._host_tensor(expr.right))
        if isinstance(expr, cst.Subscript):
            return self._host_tensor(expr.value)
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Attribute) and isinstance(expr.func.value, (cst.Call, cst.Subscript)):
                if expr.func.attr.value in ("to", "cuda"):
                    return False  # placed by the script
                return self._host_tensor(expr.func.value)  # .float(), .type(torch.FloatTensor), .view(...)
            names = qualified_names(self, expr.func)
            if any(a.keyword is not None and a.keyword.value == "device" for a in expr.args):
                return False
            return bool(names) and all(n.startswith("torch.") and not n.startswith(_NOT_TENSORS) for n in names) \
                and not findall(expr, m.Call(func=m.Name()))  # no helper of the file inside
        return False

    def _in_loader_loop(self, node: cst.CSTNode) -> bool:
        return enclosing_loop_over(self, node, self.plan.flow["loader"]) is not None

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        accelerator = self._place.get(id(original_node.value))
        if accelerator is None:
            return updated_node
        self.change(original_node, "a tensor the script computed on the host: moved to the model's device")
        moved = cst.Call(func=cst.Attribute(value=updated_node.value, attr=cst.Name("to")),
                         args=[cst.Arg(cst.parse_expression(f"{accelerator}.device"))])
        return updated_node.with_changes(value=moved)


def _number(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float))
