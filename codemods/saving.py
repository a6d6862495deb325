"""ACC009: save the unwrapped model once, after every process is done."""

from __future__ import annotations

import re
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ClassScope, ParentNodeProvider, ScopeProvider

from accelify.analyses.distributed import BARRIER
from accelify.analyses.early_stop import EarlyStops
from accelify.analyses.plan import Plan
from accelify.analyses.ranks import rank_attribute, under_main_process_check
from accelify.queries.blocks import enclosing_function, handed_values, opened_around, under_rank_test
from accelify.queries.names import TORCH_LOAD, TORCH_SAVE, code_of, qualified_names
from accelify.queries.refs import assigned_values, key_at, receiver_refs, ref_of
from accelify.queries.training import direct_calls
from accelify.queries.trees import remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod

# A parameter's state_dict that is no model's: an optimizer's, a scheduler's, a scaler's.
_NOT_A_MODEL = re.compile(r"optim|sched|scaler|state", re.I)


class Saving(AccelifyCodemod):
    """``torch.save(model.state_dict(), path)`` -> wait for every process, then ``accelerator.save``.

    ``accelerator.save`` writes once (on the main process), and
    ``accelerator.unwrap_model`` drops the DDP/FSDP wrapper so the checkpoint's
    keys are the plain model's.  A checkpoint of the whole training state (model
    *and* optimizer) is reported instead: ``accelerator.save_state`` is the tool.

    Before::

        import torch

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.save(model.state_dict(), "model.pt")

    After::

        import torch

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        accelerator.wait_for_everyone()
        accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    """

    CODE = "ACC009"
    NAME = "saving"
    DESCRIPTION = "torch.save(model.state_dict(), ...) -> wait_for_everyone() + accelerator.save(unwrap_model(model)...)."
    REQUIRES = frozenset({"ACC001", "ACC004"})
    #: ACC006 says which models' ``.module`` is a wrapper's
    AFTER = frozenset({"ACC006"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "save(" in code or bool(plan.foreign_writers)

    def visit_Module(self, node: cst.Module) -> None:
        self._taint = EarlyStops(self, self.plan, node, [], [])
        self._module = node
        self._saved: set[int] = set()  # saves rewritten with a barrier before them
        checkpoints = self._checkpoint_dicts(node)
        self._states = self._model_states(checkpoints)
        self._whole_models = self._models_whole(checkpoints)
        self._unsynced = False  # a save no barrier follows: the next load must wait for it
        # Lines of `torch.load` calls: a file saved by the main process is read back by every
        # process only once it is written.
        self._loads = [self.line_of(c)[0] for c in findall(node, m.Call()) if qualified_names(self, c.func) & TORCH_LOAD]  # type: ignore[arg-type]

    def _checkpoint_dicts(self, module: cst.Module) -> list[cst.BaseExpression]:
        """What ``torch.save`` writes as a checkpoint: a dict written directly, or the dict or
        ``model.state_dict()`` bound to the name it writes."""
        dicts: list[cst.BaseExpression] = []
        for call in findall(module, m.Call()):
            if id(call) in self.plan.foreign_writers:
                # what a call of another module's function that writes files hands it (`utils.save_checkpoint(
                # {"model": model.state_dict(), ...}, path)`): written to a file too, by the main process (ACC017)
                dicts += [a.value for a in call.args]  # type: ignore[attr-defined]
                continue
            if not qualified_names(self, call.func) & TORCH_SAVE or not call.args:  # type: ignore[attr-defined]
                continue
            first = call.args[0].value  # type: ignore[attr-defined]
            if isinstance(first, cst.Name):  # `checkpoint = {...}` or `checkpoint = model.state_dict()`
                dicts.extend(v for v in assigned_values(self, first) if isinstance(v, (cst.Dict, cst.Call)))
                dicts.extend(v for _, v in handed_values(self, module, first) if isinstance(v, cst.Dict))
            elif isinstance(first, cst.Dict):
                dicts.append(first)
        return dicts

    def _model_states(self, dicts: list[cst.BaseExpression]) -> set[int]:
        """``model.state_dict()`` calls in those checkpoints: saved from the unwrapped model."""
        return {
            id(c) for d in dicts for c in findall(d, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[]))
            if ref_of(self, c.func.value) in self.plan.flow["model"]  # type: ignore[attr-defined]
        }

    def _models_whole(self, dicts: list[cst.BaseExpression]) -> set[int]:
        """``{"net": net, "acc": acc}``: the model object itself in a checkpoint, pickled: unwrapped too."""
        return {
            id(e.value) for d in dicts if isinstance(d, cst.Dict) for e in d.elements
            if isinstance(e, cst.DictElement) and ref_of(self, e.value) in self.plan.flow["model"]
        }

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement) -> cst.DictElement:
        if id(original_node.value) not in self._whole_models:
            return updated_node
        unwrapped = self._unwrapped(original_node, updated_node.value, "", "not its wrapper")
        return updated_node if unwrapped is None else updated_node.with_changes(value=unwrapped)

    def _unwrapped(self, original: cst.CSTNode, model: cst.BaseExpression, suffix: str,
                   why: str = "") -> Optional[cst.BaseExpression]:
        """``accelerator.unwrap_model(<model>)<suffix>`` for a checkpoint's part at ``original``
        (recorded as a change), or None where no accelerator is in reach."""
        accelerator = self.accelerator_at(original)
        if accelerator is None:
            return None
        code = f"{accelerator}.unwrap_model({code_of(model)}){suffix}"
        self.change(original, f"checkpoint holds `{code}`" + (f", {why}" if why else ""))
        return cst.parse_expression(code)

    def unwraps(self, call: cst.Call) -> bool:
        """Does this codemod save ``call`` (a ``model.state_dict()``) from the unwrapped model?"""
        if id(call) in self._states:
            return self.accelerator_at(call) is not None
        arg = self.get_metadata(ParentNodeProvider, call, None)
        save = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        return (
            isinstance(save, cst.Call) and bool(save.args) and save.args[0] is arg
            and bool(qualified_names(self, save.func) & TORCH_SAVE)
            and self._model_state(call) is not None and self.accelerator_at(call) is not None
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self._states:
            return updated_node
        unwrapped = self._unwrapped(original_node, updated_node.func.value, ".state_dict()")  # type: ignore[attr-defined]
        return updated_node if unwrapped is None else unwrapped

    def _per_process(self, node: cst.CSTNode) -> bool:
        """Under a test each process decides on its own (``if acc > best:``), or one spelled like a rank test
        accelify did not recognise as one (``if args.rank == 0:``): not every process gets there."""
        return self._taint.guarded_by(node) is not None or under_rank_test(self, node)

    def _model_state(self, expr: cst.BaseExpression) -> Optional[str]:
        """``model.state_dict()`` or ``accelerator.unwrap_model(model).state_dict()`` -> the model's code."""
        if ref_of(self, expr) in self.plan.flow["model"]:
            return None  # the whole model object: see _whole_model
        if not m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[])):
            return None
        owner = expr.func.value  # type: ignore[attr-defined]
        if m.matches(owner, m.Call(func=m.Attribute(attr=m.Name("unwrap_model")), args=[m.Arg()])):
            owner = owner.args[0].value  # type: ignore[attr-defined]
        if isinstance(owner, cst.IfExp) and rank_attribute(self, owner.test, self.plan) == "use_distributed":
            owner = owner.orelse  # `(model.module if distributed else model)`: that model
        wrapper = self.other("ACC006")
        if m.matches(owner, m.Attribute(attr=m.Name("module"))) and wrapper is not None and ref_of(
            self, owner.value) in wrapper.wrapped:  # type: ignore[attr-defined]
            owner = owner.value  # type: ignore[attr-defined]  # `model.module`: the model the removed wrapper held
        if ref_of(self, owner) in self.plan.flow["model"]:
            return cst.Module(body=[]).code_for_node(owner)
        return None

    def _handed_model(self, expr: cst.BaseExpression) -> Optional[str]:
        """``torch.save(model.state_dict(), path)`` in a method given ``model`` (an early-stopping
        callback's ``save_checkpoint(self, val_loss, model)``): a parameter accelify does not follow."""
        values = assigned_values(self, expr) if isinstance(expr, cst.Name) else [expr]
        for value in values:
            for call in findall(value, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[])):
                owner = call.func.value  # type: ignore[attr-defined]
                if not isinstance(owner, cst.Name) or owner.value == "self" or ref_of(self, owner) in self.plan.flow["model"]:
                    continue  # `self.state_dict()` in the model's own method: a wrapper has no such method
                scope = self.get_metadata(ScopeProvider, owner, None)
                if scope is not None and any(isinstance(a.node, cst.Param) for a in scope[owner.value] if hasattr(a, "node")):
                    if not _NOT_A_MODEL.search(owner.value):
                        return owner.value
        return None

    def _opened_handle(self, call: cst.Call) -> Optional[str]:
        """``torch.save(obj, f)`` inside ``with open(path, "wb") as f:`` (not under a main-process check): the
        name of the handle every process opens."""
        target = call.args[1].value if len(call.args) > 1 else None
        opened = opened_around(self, call, target.value) if isinstance(target, cst.Name) else None
        if opened is None or under_main_process_check(self, opened[0]):
            return None
        return target.value  # type: ignore[union-attr]

    def _one_model_state(self, expr: cst.BaseExpression) -> bool:
        """``checkpoint = model.state_dict()`` ... ``torch.save(checkpoint, path)``: one model's weights."""
        values = assigned_values(self, expr) if isinstance(expr, cst.Name) else []
        return bool(values) and all(m.matches(v, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[]))
                                    for v in values)

    def _training_state(self, expr: cst.BaseExpression) -> bool:
        """A dict holding the state of a prepared model or optimizer (or a name bound to one)."""
        prepared = self.plan.flow["model"] | self.plan.refs(self.plan.optimizers)
        if isinstance(expr, cst.Name):
            return any(self._training_state(value) for value in assigned_values(self, expr))
        for call in findall(expr, m.Call(func=m.Attribute(attr=m.Name("state_dict")))):
            if any(r in prepared for r in receiver_refs(self, call.func.value)):  # type: ignore[attr-defined]
                return True
        return False

    def _after_a_barrier(self, statement: cst.SimpleStatementLine) -> bool:
        """Is the statement before ``statement`` in its block a barrier (``dist.barrier()``,
        ``accelerator.wait_for_everyone()``)?"""
        block = self.get_metadata(ParentNodeProvider, statement, None)
        body = list(getattr(block, "body", ()))
        index = next((i for i, s in enumerate(body) if s is statement), 0)
        before = body[index - 1] if index > 0 else None
        if not m.matches(before, m.SimpleStatementLine(body=[m.Expr(m.Call(args=[]))])):
            return False
        func = before.body[0].value.func  # type: ignore[union-attr]
        return bool(qualified_names(self, func) & BARRIER) or m.matches(func, m.Attribute(attr=m.Name("wait_for_everyone")))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement]]:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if self._unsynced and any(qualified_names(self, c.func) & TORCH_LOAD for c in findall(original_node, m.Call())):  # type: ignore[attr-defined]
            accelerator = self.accelerator_at(original_node)
            if self._after_a_barrier(original_node):
                self._unsynced = False  # the script waits already (`dist.barrier()`, now the Accelerator's)
            elif accelerator is not None and not under_main_process_check(self, original_node) and not self._per_process(
                original_node
            ) and self._every_process_calls(original_node):
                # A file saved under a test (`if acc > best:`) may still be being written by the main
                # process: every process waits for it before reading it back.
                self._unsynced = False
                wait = self.parse_statement(f"{accelerator}.wait_for_everyone()\n")
                self.change(original_node, "every process waits for the main process's save before loading")
                return cst.FlattenSentinel([wait.with_changes(leading_lines=updated.leading_lines),
                                            updated.with_changes(leading_lines=[])])
        if len(original_node.body) != 1 or not m.matches(original_node.body[0], m.Expr(m.Call())):
            return updated
        call = original_node.body[0].value  # type: ignore[attr-defined]
        if not qualified_names(self, call.func) & TORCH_SAVE or not call.args:
            return updated
        accelerator = self.accelerator_at(original_node)
        model = self._model_state(call.args[0].value)
        whole = ref_of(self, call.args[0].value) in self.plan.flow["model"]
        if whole:  # torch.save(model, path): pickle the plain model, once
            model = cst.Module(body=[]).code_for_node(call.args[0].value)
        state = model is None and self._training_state(call.args[0].value)
        handed = self._handed_model(call.args[0].value) if model is None else None
        if handed is not None:
            self.refuse(
                call, "ACC128", f"a `state_dict()` of `{handed}`, a parameter here, is saved with `torch.save`: "
                "handed the prepared model, every process would write it, with the DistributedDataParallel "
                "wrapper's `module.` keys, and accelify cannot follow what is handed in. File not converted.",
                f"save `accelerator.unwrap_model({handed}).state_dict()` with `accelerator.save(...)`, after "
                "`accelerator.wait_for_everyone()`.",
            )
            return updated
        if model is None and not state:
            if accelerator is not None and not under_main_process_check(self, original_node):
                # another object (`{"epoch": epoch}`): the main process writes it (ACC017); a later load waits
                self._unsynced = True
            return updated
        handle = self._opened_handle(call)
        if handle is not None:
            self.refuse(
                call, "ACC128", f"the checkpoint is written through `{handle}`, a file every process opens for "
                f"writing (`with open(...) as {handle}`): saved once by the main process, the others would still "
                "open it and truncate what it wrote. File not converted.",
                "save to the path itself: `accelerator.save(obj, path)` (after `accelerator.wait_for_everyone()`), "
                "with no `open` around it.",
            )
            return updated
        if accelerator is None:
            if not state:
                self.refuse(
                    call, "ACC128", "a model saved with `torch.save` in code that cannot reach the Accelerator: every "
                    "process would write it, with the DistributedDataParallel wrapper's `module.` keys; file not "
                    "converted.",
                    "pass the accelerator here and save `accelerator.unwrap_model(model).state_dict()` with "
                    "`accelerator.save(...)`.",
                )
            else:
                self.finding(
                    call, "ACC111", "a checkpoint of the whole training state is saved with `torch.save` in code "
                    "that cannot reach the Accelerator: left as it is, every process writes it.",
                    "pass the accelerator here and save with `accelerator.save(...)`, or use "
                    "`accelerator.save_state(output_dir)` / `accelerator.load_state(output_dir)`.",
                )
            return updated
        if state and not self._one_model_state(call.args[0].value):
            self.finding(
                call, "ACC111", "a checkpoint of the whole training state: saved once with `accelerator.save`, the "
                "models in it unwrapped; that is right for one device or DDP, not for sharded training.",
                "for FSDP or DeepSpeed use `accelerator.save_state(output_dir)` and "
                "`accelerator.load_state(output_dir)`: they save every prepared object (model, optimizer, "
                "scheduler, RNG) for any launch.",
            )
        first = updated_node.body[0].value.args[0].value  # type: ignore[attr-defined]
        if not state:
            first = cst.parse_expression(f"{accelerator}.unwrap_model({model})" + ("" if whole else ".state_dict()"))
        saved = cst.Module(body=[]).code_for_node(first)
        # accelerator.save(obj, f) takes the path and nothing else (no pickle options): other
        # calls keep torch.save, on the main process only.
        path_arg = call.args[1] if len(call.args) == 2 else None
        if path_arg is not None and (path_arg.keyword is None or path_arg.keyword.value == "f"):
            path = cst.Module(body=[]).code_for_node(updated_node.body[0].value.args[1].value)  # type: ignore[attr-defined]
            save = self.parse_statement(f"{accelerator}.save({saved}, {path})\n")
        else:
            args = list(updated_node.body[0].value.args)  # type: ignore[attr-defined]
            args[0] = args[0].with_changes(value=first)
            torch_call = cst.Module(body=[]).code_for_node(updated_node.body[0].value.with_changes(args=args))  # type: ignore[attr-defined]
            guarded = under_main_process_check(self, original_node)
            save = self.parse_statement(torch_call + "\n" if guarded else f"if {accelerator}.is_main_process:\n    {torch_call}\n")
        remove_imports_of(self.context, call.func)
        self.change(original_node, "saved once, from the unwrapped model, after every process is done")
        if (under_main_process_check(self, original_node) or self._per_process(original_node)
                or not self._every_process_calls(original_node)):
            # A barrier here would wait for processes that never get here: under a main-process
            # check, under a test each process decides on its own (`if val_acc > best:`), or in a
            # helper called so (`if acc > best: save_checkpoint(model, path)`).
            self._unsynced = True  # a later load waits for it
            self.replaced(original_node)
            return save.with_changes(leading_lines=updated_node.leading_lines)
        self._saved.add(id(original_node))
        wait = self.parse_statement(f"{accelerator}.wait_for_everyone()\n")
        # A later `torch.load` may read this file back: every process waits until it is written.
        after = [wait] if any(line > self.line_of(original_node)[0] for line in self._loads) else []
        if self._follows_a_save(original_node):
            # `save(G); save(D)`: the barrier before the first one covers both
            return cst.FlattenSentinel([save.with_changes(leading_lines=updated_node.leading_lines), *after])
        return cst.FlattenSentinel([wait.with_changes(leading_lines=updated_node.leading_lines), save, *after])

    def _every_process_calls(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """Does every process reach ``node``, as far as the functions around it go? Up to the setup
        function (every process trains) or the module, each function in between must be called
        in this file, and only where every process goes: not under a main-process check or a
        test each process decides on its own. A function also used otherwise (handed as a
        callback, called from another file) cannot be followed: no."""
        func = enclosing_function(self, node)
        if func is None or key_at(self, func.body) == self.plan.setup:
            return True
        calls = self._calls_of(func)
        if depth > 4 or not calls:
            return False
        return all(not under_main_process_check(self, call) and not self._per_process(call)
                   and self._every_process_calls(call, depth + 1) for call in calls)

    def _calls_of(self, func: cst.FunctionDef) -> list[cst.Call]:
        """The calls of ``func`` in this file; empty when it is also used in another way (handed on,
        or a method reached through anything but an attribute call)."""
        name = func.name.value
        if not isinstance(self.get_metadata(ScopeProvider, func, None), ClassScope):
            return direct_calls(self, func, name, only=func)
        calls = []  # a method: `self.save(...)`, `trainer.save(...)`
        for use in findall(self._module, m.Attribute(attr=m.Name(name))):
            call = self.get_metadata(ParentNodeProvider, use, None)
            if not isinstance(call, cst.Call) or call.func is not use:
                return []
            calls.append(call)
        return calls

    def _follows_a_save(self, node: cst.SimpleStatementLine) -> bool:
        block = self.get_metadata(ParentNodeProvider, node, None)
        body = list(getattr(block, "body", ()))
        index = next((i for i, s in enumerate(body) if s is node), 0)
        return index > 0 and id(body[index - 1]) in self._saved
