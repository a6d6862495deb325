"""ACC034: the script's own rank helpers ask Accelerate's state, not torch.distributed."""

from __future__ import annotations

import libcst as cst

from accelify.analyses.plan import Plan
from accelify.queries.blocks import is_docstring
from accelify.queries.trees import remove_imports_of

from .base import AccelifyCodemod, add_target_import


class RankHelpers(AccelifyCodemod):
    """``get_rank()`` / ``get_world_size()`` helpers that ask torch.distributed when a group exists -> ``PartialState()``.

    The torchvision references' ``utils.py`` (pasted into DINO and many research scripts after it)
    answers the rank 0 and the world size 1 without a process group, and the group's otherwise.
    Under Accelerate the state every process shares gives the same answers, in one process and
    under ``accelerate launch``: each such helper returns ``PartialState().process_index``,
    ``.num_processes`` or ``.use_distributed``, and ``torch.distributed`` goes once nothing else
    reads it. The helpers stay (the script and its modules call them); only their bodies change.
    Left alone where ``PartialState()`` could be made before the Accelerator that takes a ``cpu=``
    flag, or in what a DataLoader's workers run (accelify.analyses.rank_helpers).

    Before::

        import torch
        import torch.distributed as dist


        def is_dist_avail_and_initialized():
            if not dist.is_available():
                return False
            if not dist.is_initialized():
                return False
            return True


        def get_rank():
            if not is_dist_avail_and_initialized():
                return 0
            return dist.get_rank()


        def main():
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
            for batch in loader:
                loss = model(batch).sum()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            if get_rank() == 0:
                print(loss.item())

    After::

        import torch
        from accelerate import PartialState


        def is_dist_avail_and_initialized():
            return PartialState().use_distributed


        def get_rank():
            return PartialState().process_index


        def main():
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
            for batch in loader:
                loss = model(batch).sum()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            if get_rank() == 0:
                print(loss.item())
    """

    CODE = "ACC034"
    NAME = "rank-helpers"
    DESCRIPTION = ("A helper of the script answering the rank or world size from torch.distributed when a group "
                   "exists (0 and 1 otherwise) -> return PartialState().process_index / num_processes.")

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.rank_helpers)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        attribute = self.plan.rank_helpers.get(id(original_node))
        if attribute is None:
            return updated_node
        body = list(updated_node.body.body)  # type: ignore[union-attr]
        kept = body[:1] if body and is_docstring(body[0]) else []
        remove_imports_of(self.context, original_node.body)
        add_target_import(self.context, "PartialState")
        self.change(original_node, f"`{original_node.name.value}()` asks torch.distributed -> "
                                   f"`PartialState().{attribute}`")
        answer = self.parse_statement(f"return PartialState().{attribute}\n")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*kept, answer]))
