"""ACC022: the script no longer picks its GPUs: the launcher gives each process its own."""

# A script that manages its own processes loses its ``torch.cuda.set_device(local_rank)`` to ACC019.

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan
from accelify.queries.names import has_qname, string_value
from accelify.queries.trees import remove_imports_of

from .base import AccelifyCodemod

_ENVIRON = frozenset({"os.environ"})
_KEY = "CUDA_VISIBLE_DEVICES"
_SET_DEVICE = frozenset({"torch.cuda.set_device"})


class LauncherDevices(AccelifyCodemod):
    """``os.environ["CUDA_VISIBLE_DEVICES"] = ...`` and ``torch.cuda.set_device(...)`` set by the script go.

    A single-process script picks its GPU by hiding the others (``--gpu_id 2``). Under
    ``accelerate launch`` every process runs that line: all of them see the same one GPU and train
    on it, on top of each other. The launcher gives each process its own device
    (``accelerate launch --gpu_ids 2,3`` chooses which ones); the variable set in the environment
    before launching still works as before. ``torch.cuda.set_device(args.gpu)`` made every process's
    current GPU the one the option picks, after the Accelerator set each its own: what runs on the
    current device (a collective's barrier, ``.cuda()``) would all land on that GPU.

    Before::

        import os

        import torch
        from torch.utils.data import DataLoader

        os.environ["CUDA_VISIBLE_DEVICES"] = opts.gpu_id
        torch.cuda.set_device(opts.gpu)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader(dataset, batch_size=8)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

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
    """

    CODE = "ACC022"
    NAME = "launcher-devices"
    DESCRIPTION = ('os.environ["CUDA_VISIBLE_DEVICES"] = ... and torch.cuda.set_device(...) set by the script -> '
                   'removed (the launcher assigns devices).')
    REQUIRES = frozenset({"ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return _KEY in code or ("set_device" in code and plan.distributed is None)

    def _sets_device(self, statement: cst.BaseSmallStatement) -> bool:
        """``torch.cuda.set_device(...)`` as a statement, in a script that does not manage its processes."""
        return (self.plan.distributed is None and isinstance(statement, cst.Expr)
                and isinstance(statement.value, cst.Call) and has_qname(self, statement.value.func, _SET_DEVICE))

    def _sets_devices(self, statement: cst.BaseSmallStatement) -> bool:
        """``os.environ["CUDA_VISIBLE_DEVICES"] = ...`` or ``os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...)``."""
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
            target = statement.targets[0].target
            return (isinstance(target, cst.Subscript) and has_qname(self, target.value, _ENVIRON)
                    and len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index)
                    and string_value(target.slice[0].slice.value) == _KEY)
        if isinstance(statement, cst.Expr) and m.matches(statement.value, m.Call(func=m.Attribute(attr=m.Name("setdefault")))):
            call = statement.value
            return (has_qname(self, call.func.value, _ENVIRON) and bool(call.args)  # type: ignore[attr-defined]
                    and string_value(call.args[0].value) == _KEY)  # type: ignore[attr-defined]
        return False

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if len(original_node.body) == 1 and self._sets_device(original_node.body[0]):
            self.change(original_node, "`torch.cuda.set_device(...)` removed: the launcher gives each process its "
                                       "device, and the Accelerator makes it the process's current one")
            return self.remove(updated)  # type: ignore[arg-type]
        if len(original_node.body) != 1 or not self._sets_devices(original_node.body[0]):
            return updated
        remove_imports_of(self.context, original_node)
        self.change(original_node, "CUDA_VISIBLE_DEVICES set by the script removed: the launcher gives each process "
                                   "its device (`accelerate launch --gpu_ids ...` chooses them)")
        return self.remove(updated)  # type: ignore[arg-type]
