"""ACC018: a hand-written distributed script (torchrun, DDP) hands its processes to Accelerate."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ExpressionContext, ExpressionContextProvider, ParentNodeProvider

from accelify.analyses.device_kinds import per_process_device
from accelify.analyses.distributed import ALL_REDUCE, BARRIER, GET_BACKEND, IS_INITIALIZED, blocking, held, reduce_op, spawn_arguments
from accelify.analyses.plan import Plan, bind_arguments
from accelify.analyses.ranks import GET_RANK, GET_WORLD_SIZE, MAIN_TESTS, is_arg_rank, local_rank_launch, main_process_test
from accelify.analyses.samplers import sampler_shuffle
from accelify.queries.blocks import enclosing_function, inside
from accelify.queries.names import DATALOADERS, has_qname
from accelify.queries.refs import ref_of
from accelify.queries.trees import remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, accelerator_attr, add_target_import, cpu_string, loads_on_the_cpu


class Distributed(AccelifyCodemod):
    """Remove the process-group plumbing Accelerate owns; ranks and collectives become the Accelerator's.

    ``accelerate launch`` (or ``torchrun``) starts the processes and ``Accelerator()`` joins
    them: ``init_process_group``, ``torch.cuda.set_device`` and a set-up helper left empty go,
    ``destroy_process_group()`` becomes ``accelerator.end_training()``.  A rank read from the
    launcher goes, and its uses become the Accelerator's (``rank == 0`` ->
    ``accelerator.is_main_process``, a placement on it goes).  A ``DistributedSampler`` goes,
    its ``shuffle`` moving to the DataLoader (``prepare`` shards the data and sets the epoch);
    ``dist.barrier()`` -> ``accelerator.wait_for_everyone()``, ``dist.all_reduce(t)`` ->
    ``t = accelerator.reduce(t, reduction="sum")``, ``dist.all_gather(parts, t)`` (into a list built
    for it) -> ``parts = list(accelerator.gather(t[None]))``, ``model.no_sync()`` ->
    ``accelerator.no_sync(model)``.  The ``DistributedDataParallel`` wrapper
    is removed by ACC006.  A script with anything else distributed is left unchanged (ACC126).

    Before::

        import os

        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group(backend="nccl")
        loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            dist.barrier()
            if local_rank == 0:
                torch.save(model.state_dict(), "model.pt")
        dist.destroy_process_group()

    After::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            accelerator.wait_for_everyone()
            if accelerator.is_local_main_process:
                torch.save(model.state_dict(), "model.pt")
        accelerator.end_training()
    """

    CODE = "ACC018"
    NAME = "distributed"
    DESCRIPTION = ("Remove init_process_group/set_device/DistributedSampler plumbing; ranks, barriers and "
                   "all-reduces become the Accelerator's.")
    REQUIRES = frozenset({"ACC001", "ACC006"})

    METADATA_DEPENDENCIES = (*AccelifyCodemod.METADATA_DEPENDENCIES, ExpressionContextProvider)

    def visit_Module(self, node: cst.Module) -> None:
        self._counted_gpus = False  # ACC143 said once per file
        self._unreachable_refused: list[tuple[cst.CSTNode, object]] = []  # (node, its ACC126), for `_unreachable`

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return plan.distributed is not None

    # ------------------------------------------------------------------ statements
    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        result = super().leave_SimpleStatementLine(original_node, updated_node)
        dist = self.plan.distributed
        if dist is None or result is not updated_node or self._in_removed_helper(original_node):
            return result
        if id(original_node) in dist.gathered:
            return self._drop(original_node, updated_node,
                              "all-reduce removed: the counts are gathered with `gather_for_metrics` (ACC011)")
        if len(original_node.body) == 1 and id(original_node.body[0]) in dist.queries.values() and (
            self._asks_the_state(original_node)
        ):
            return self._state_query(original_node, updated_node)
        if id(original_node) in dist.remove or self._calls_helper(original_node) or (
            len(original_node.body) == 1 and id(original_node.body[0]) in dist.rank_assigns
        ):
            return self._drop(original_node, updated_node,
                              "process-group set-up removed: the launcher and `Accelerator()` do it")
        if len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.Expr):
            return updated_node
        call = original_node.body[0].value
        if not isinstance(call, cst.Call):
            return updated_node
        if dist.spawn is not None and id(original_node) == dist.spawn[0]:
            return self._spawned(original_node, updated_node, call)
        if id(original_node) in dist.end_training or (
                isinstance(call.func, cst.Name) and call.func.value in dist.teardowns):
            return self._statement(original_node, updated_node, "end_training()", "`destroy_process_group()`")
        if has_qname(self, call.func, BARRIER):
            return self._statement(original_node, updated_node, "wait_for_everyone()", "`barrier()`")
        if has_qname(self, call.func, ALL_REDUCE):
            tensor = cst.Module(body=[]).code_for_node(updated_node.body[0].value.args[0].value)  # type: ignore[attr-defined]
            op = reduce_op(self, call)
            accelerator = self.accelerator_at(original_node)
            if accelerator is None and self.name_free("reduce"):
                # in a model's forward, a loss, a helper the Accelerator cannot reach (Barlow Twins' `all_reduce(c)`):
                # accelerate's function, which works on the process group the Accelerator set up (and in one process)
                add_target_import(self.context, "reduce")
                return self._rewrite(original_node, updated_node, f'{tensor} = reduce({tensor}, reduction="{op}")',
                                     f"`all_reduce({tensor})` -> `{tensor} = reduce({tensor}, ...)` (accelerate.utils)")
            if accelerator is None:
                return self._unreachable(original_node, updated_node)
            return self._rewrite(original_node, updated_node, f'{tensor} = {accelerator}.reduce({tensor}, reduction="{op}")',
                                 f"`all_reduce({tensor})` -> `{tensor} = {accelerator}.reduce({tensor}, ...)`")
        if id(original_node) in dist.broadcasts:
            return self._broadcast(original_node, updated_node)
        if id(original_node) in dist.all_gathers:
            accelerator = self.accelerator_at(original_node)
            if accelerator is None and not self.name_free("gather"):
                return self._unreachable(original_node, updated_node)
            parts, tensor = (cst.Module(body=[]).code_for_node(a.value) for a in updated_node.body[0].value.args[:2])  # type: ignore[attr-defined]
            if not isinstance(call.args[1].value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                tensor = f"({tensor})"
            if accelerator is None:
                # in a model's forward (VICReg's `FullGatherLayer`): accelerate's function, as for all_reduce
                add_target_import(self.context, "gather")
                return self._rewrite(original_node, updated_node, f"{parts} = list(gather({tensor}[None]))",
                                     f"`all_gather({parts}, ...)` -> `{parts} = list(gather(...[None]))` (accelerate.utils)")
            return self._rewrite(original_node, updated_node, f"{parts} = list({accelerator}.gather({tensor}[None]))",
                                 f"`all_gather({parts}, ...)` -> `{parts} = list({accelerator}.gather(...[None]))`")
        return updated_node

    def _drop(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine, message: str) -> cst.BaseStatement:
        remove_imports_of(self.context, original)
        self.change(original, message)
        return self.remove(updated)

    def _rewrite(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine, code: str,
                 message: str) -> cst.BaseStatement:
        """The call statement ``original`` becomes ``code`` (the imports only it read may go)."""
        self.replaced(original)
        remove_imports_of(self.context, original.body[0].value.func)  # type: ignore[attr-defined]
        self.change(original, message)
        return self.parse_statement(code + "\n").with_changes(leading_lines=updated.leading_lines)

    def _spawned(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine,
                 call: cst.Call) -> cst.BaseStatement:
        """``mp.spawn(main, args=(world_size, epochs), nprocs=world_size)`` -> ``main(epochs)``."""
        dist = self.plan.distributed
        assert dist is not None and dist.spawn is not None
        _, name, gone = dist.spawn
        worker = next(s for s in self.shared.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name)
        empty = cst.Module(body=[])
        arguments = ", ".join(empty.code_for_node(a) for a in spawn_arguments(call, worker, gone))
        return self._rewrite(original, updated, f"{name}({arguments})", f"`{empty.code_for_node(call.func)}(...)` "
                             f"-> `{name}({arguments})`: the launcher starts the processes")

    def _broadcast(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> cst.BaseStatement:
        """``dist.broadcast(t, src=0)`` -> ``t = broadcast(t, from_process=0)``: the Accelerator has no such
        method, so accelerate's function, wherever it is (MoCo's batch shuffle, in the model)."""
        if not self.name_free("broadcast"):
            return self._unreachable(original, updated)  # type: ignore[return-value]
        tensor, source = (cst.Module(body=[]).code_for_node(a.value) for a in blocking(updated.body[0].value))  # type: ignore[attr-defined]
        add_target_import(self.context, "broadcast")
        return self._rewrite(original, updated, f"{tensor} = broadcast({tensor}, from_process={source})",
                             f"`broadcast({tensor}, ...)` -> `{tensor} = broadcast({tensor}, ...)` (accelerate.utils)")

    def _asks_the_state(self, node: cst.CSTNode) -> bool:
        """Code in a function that cannot reach the Accelerator, where ``PartialState()`` can stand in."""
        return self.accelerator_at(node) is None and enclosing_function(self, node) is not None and (
            self.name_free("PartialState"))

    def _kept_query(self, node: cst.CSTNode) -> bool:
        """``node`` reads a rank name bound to a bare query that stays (``_state_query``)."""
        dist = self.plan.distributed
        return dist is not None and ref_of(self, node) in dist.queries and self._asks_the_state(node)

    def _state_query(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> cst.BaseStatement:
        """``gpu_idx = dist.get_rank()`` where the Accelerator cannot be reached (MoCo's batch shuffle, in the
        model) -> ``gpu_idx = PartialState().process_index``; its reads stay as they are."""
        call = original.body[0].value  # type: ignore[attr-defined]
        attribute = _query(self, call)
        add_target_import(self.context, "PartialState")
        remove_imports_of(self.context, call)
        code = cst.Module(body=[]).code_for_node(call)
        self.change(original, f"`{code}` -> `PartialState().{attribute}` (the Accelerator's state, where it cannot be reached)")
        small = updated.body[0]
        return updated.with_changes(body=[small.with_changes(value=cst.parse_expression(f"PartialState().{attribute}"))])

    def _statement(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine, method: str,
                   what: str) -> cst.BaseStatement:
        accelerator = self.accelerator_at(original)
        if accelerator is None and method == "wait_for_everyone()" and self.name_free("wait_for_everyone"):
            add_target_import(self.context, "wait_for_everyone")
            return self._rewrite(original, updated, "wait_for_everyone()", f"{what} -> `wait_for_everyone()` (accelerate.utils)")
        if accelerator is None:
            return self._unreachable(original, updated)
        return self._rewrite(original, updated, f"{accelerator}.{method}", f"{what} -> `{accelerator}.{method}`")

    def _unreachable(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        code = cst.Module(body=[]).code_for_node(original).strip().splitlines()[0]
        where = enclosing_function(self, original)
        place = f"`{where.name.value}`" if where is not None else "the module"
        self.refuse(original, "ACC126", f"`{code}` (a rank or a collective of the launch) is in {place}, which "
                    "cannot reach the Accelerator (created where the training objects are); file not converted.",
                    f"create the Accelerator before {place} uses it, or pass it the accelerator")
        # one finding for `args.local_rank != -1`, not one more for the `args.local_rank` inside it (left first)
        inner = [f for node, f in self._unreachable_refused if inside(self, node, {id(original)})]
        self.findings = [f for f in self.findings if all(f is not i for i in inner)]
        self.refusals = [f for f in self.refusals if all(f is not i for i in inner)]
        self._unreachable_refused.append((original, self.findings[-1]))
        return updated

    def _in_removed_helper(self, node: cst.CSTNode) -> bool:
        """Inside ``ddp_setup()``/``cleanup()``, which go whole."""
        dist = self.plan.distributed
        func = enclosing_function(self, node)
        return dist is not None and func is not None and func.name.value in (dist.helpers | dist.teardowns) and (
            key_is_module(self, func))

    def _calls_helper(self, line: cst.SimpleStatementLine) -> bool:
        dist = self.plan.distributed
        if dist is None or len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
            return False
        call = line.body[0].value
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in dist.helpers

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.BaseStatement:
        dist = self.plan.distributed
        if dist is not None and dist.spawn is not None and original_node.name.value == dist.spawn[1] and (
                key_is_module(self, original_node)):
            gone = dist.spawn[2]
            params = [p for p in updated_node.params.params if p.name.value not in gone]
            if params and updated_node.params.params[-1].name.value in gone:
                params[-1] = params[-1].with_changes(comma=updated_node.params.params[-1].comma)
            self.change(original_node, f"`{original_node.name.value}` no longer takes "
                        f"{', '.join(f'`{g}`' for g in gone)}: the Accelerator knows its process")
            return updated_node.with_changes(params=updated_node.params.with_changes(params=params))
        if dist is not None and original_node.name.value in (dist.helpers | dist.teardowns) and key_is_module(
                self, original_node):
            remove_imports_of(self.context, original_node)
            self.change(original_node, f"`{original_node.name.value}()` removed: it only set up the process group")
            return self.remove(updated_node)
        return updated_node

    def edit_body(self, block, items):
        """``if rank != 0: barrier()`` / what rank 0 does first / ``if rank == 0: barrier()`` ->
        ``with accelerator.main_process_first():`` around what is between."""
        dist = self.plan.distributed
        if dist is None or not dist.first:
            return items
        origins = [id(origin) if origin is not None else None for _, origin in items]
        for opening, closing in dist.first:
            if opening not in origins or closing not in origins:
                continue
            start, end = origins.index(opening), origins.index(closing)
            inner = []
            for node, _ in items[start + 1:end]:
                if m.matches(node, m.With(items=[m.WithItem(m.Call(func=m.Attribute(attr=m.Name("main_process_first"))))])):
                    inner.extend(node.body.body)  # type: ignore[attr-defined]  # ACC017 put a download under it
                else:
                    inner.append(node)
            if not inner or end < start:
                continue
            accelerator = self.accelerator_at(items[start][1])  # type: ignore[arg-type]
            if accelerator is None:
                self._unreachable(items[start][1], items[start][0])  # type: ignore[arg-type]
                continue
            opening_node = items[start][0]
            inner[0] = inner[0].with_changes(leading_lines=[])
            first = cst.With(
                items=[cst.WithItem(cst.parse_expression(f"{accelerator}.main_process_first()"))],
                body=cst.IndentedBlock(body=inner),
                leading_lines=opening_node.leading_lines,
            )
            remove_imports_of(self.context, items[start][1])  # type: ignore[arg-type]
            self.change(items[start][1], "the \"rank 0 first\" barrier pair -> "  # type: ignore[arg-type]
                        f"`with {accelerator}.main_process_first():`")
            items = [*items[:start], (first, items[start][1]), *items[end + 1:]]
            origins = [id(origin) if origin is not None else None for _, origin in items]
        return items

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """``ddp_world_size = int(os.environ["WORLD_SIZE"])`` in the launched branch: the Accelerator's."""
        dist = self.plan.distributed
        if dist is None or id(original_node) not in dist.kept_assigns:
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return self._unreachable(original_node, updated_node)  # type: ignore[return-value]
        attribute = dist.kept_assigns[id(original_node)]
        remove_imports_of(self.context, original_node.value)
        self.change(original_node, f"rank from the launcher -> `{accelerator}.{attribute}`")
        return updated_node.with_changes(value=accelerator_attr(accelerator, attribute))

    # ------------------------------------------------------------------ expressions
    def leave_BooleanOperation(self, original_node: cst.BooleanOperation,
                               updated_node: cst.BooleanOperation) -> cst.BaseExpression:
        """``not distributed or rank == 0`` -> ``accelerator.is_main_process`` (true in one process)."""
        if not isinstance(original_node.operator, cst.Or) or main_process_test(self, original_node, self.plan) is None:
            return updated_node
        return self.leave_Comparison(original_node, updated_node)  # type: ignore[arg-type]

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        test = main_process_test(self, original_node, self.plan)
        if test is None and isinstance(original_node, cst.Comparison):
            return self._launch_test(original_node, updated_node)
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            if self._passed_only(original_node) or self._kept_sides(original_node):
                return updated_node  # `gpu_id == 0` on a parameter handed the rank: still right
            return self._unreachable(original_node, updated_node)  # type: ignore[return-value]
        self.change(original_node, f"rank test -> `{accelerator}.{test}`")
        remove_imports_of(self.context, original_node)
        return accelerator_attr(accelerator, test).with_changes(
            lpar=updated_node.lpar, rpar=updated_node.rpar)

    def _launch_test(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        """``args.local_rank != -1`` -> ``accelerator.use_distributed``, ``args.local_rank == -1`` -> ``not
        accelerator.use_distributed``: "was the run started by a launcher?" (under Accelerate, in one process the
        script takes its single-process path, as it did without a launcher)."""
        if not is_arg_rank(self, original.left, self.plan.distributed):  # type: ignore[arg-type]
            return updated
        polarity = local_rank_launch(self, original)
        if polarity is None:
            return updated
        accelerator = self.accelerator_at(original)
        if accelerator is None:
            return self._unreachable(original, updated)  # type: ignore[return-value]
        code = f"{accelerator}.use_distributed" if polarity else f"not {accelerator}.use_distributed"
        self.change(original, f"launch test -> `{code}`")
        return cst.parse_expression(code).with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def leave_FormattedString(self, original_node: cst.FormattedString,
                              updated_node: cst.FormattedString) -> cst.BaseExpression:
        """``f"cuda:{local_rank}"``: each process's own device, ``accelerator.device``."""
        if not per_process_device(self, original_node):
            return updated_node
        return self._per_process_device(original_node, updated_node)

    def _per_process_device(self, original_node: cst.BaseExpression, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return self._unreachable(original_node, updated_node)  # type: ignore[return-value]
        if loads_on_the_cpu(self, original_node):
            self.change(original_node, "per-rank `map_location` -> `\"cpu\"`")
            return cpu_string(self, original_node)
        self.change(original_node, f"per-rank device -> `{accelerator}.device`")
        return accelerator_attr(accelerator, "device")

    def _kept_sides(self, comparison: cst.BaseExpression) -> bool:
        return isinstance(comparison, cst.Comparison) and any(
            self._kept_query(s) for s in (comparison.left, comparison.comparisons[0].comparator))

    def _gpu_count(self, original: Union[cst.Name, cst.Attribute], updated: cst.BaseExpression) -> cst.BaseExpression:
        """A read of the GPUs of one machine the script divides by as the processes (``dist.gpu_counts``): the
        Accelerator's ``num_processes`` where it is reached; elsewhere left when its value comes from or goes to
        code that reaches it (a helper's parameter, ``main_worker(..., args.nprocs, ...)``), refused when divided
        by there."""
        accelerator = self.accelerator_at(original)
        code = cst.Module(body=[]).code_for_node(original)
        if accelerator is not None:
            if not self._counted_gpus:
                self._counted_gpus = True
                self.finding(original, "ACC143", f"`{code}`, the GPUs of the machine (`torch.cuda.device_count()`), "
                             "which the script divided by as the number of processes, is now "
                             f"`{accelerator}.num_processes`, the processes of the whole run: the same for one process "
                             "per GPU of one machine; on several machines, what it divides is divided by all of them.",
                             "on several machines, divide by the processes of one machine "
                             f"(`{accelerator}.num_processes // <machines>`) to keep the original's per-machine share")
            self.change(original, f"`{code}` (GPUs counted as the processes) -> `{accelerator}.num_processes`")
            return accelerator_attr(accelerator, "num_processes")
        if self._fed_by_the_accelerator(original) or self._handed_to_a_worker(original, self.plan.distributed.gpu_counts):  # type: ignore[union-attr]
            return updated
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if (isinstance(parent, cst.BinaryOperation) and parent.right is original) or (
                isinstance(parent, cst.AugAssign) and parent.value is original):
            where = enclosing_function(self, original)
            place = f"`{where.name.value}`" if where is not None else "the module"
            self.refuse(original, "ACC126", f"`{code}` counts the GPUs of the machine, and {place}, which cannot reach "
                        "the Accelerator, divides by it as by the number of processes: under `accelerate launch` the "
                        "processes are the launcher's (and on the CPU there is no GPU to count); file not converted.",
                        f"divide by `dist.get_world_size()` after the process group exists, or pass {place} the "
                        "accelerator, then run accelify again")
        return updated

    def _fed_by_the_accelerator(self, read: cst.BaseExpression) -> bool:
        """``nprocs`` in ``reduce_mean(tensor, nprocs)``, a parameter of a module-level function every call of
        which is made where the Accelerator is reached (there its argument becomes ``num_processes``)."""
        func = enclosing_function(self, read)
        if not isinstance(read, cst.Name) or func is None or read.value not in {p.name.value for p in func.params.params}:
            return False
        calls = findall(self.shared.module, m.Call(func=m.Name(func.name.value)))
        return bool(calls) and all(self.accelerator_at(c) is not None for c in calls)

    def _handed_to_a_worker(self, read: cst.BaseExpression, counts: frozenset = frozenset()) -> bool:
        """``main_worker(args.local_rank, ...)`` in ``main``, which cannot reach the Accelerator: the argument of
        a module-level function that creates it, bound to a parameter every call hands a rank (``dist.passed``) or
        one of ``counts`` (the GPUs counted as the processes: ``main_worker(..., args.nprocs, ...)``). There, tests
        on it become the Accelerator's, placements on it go and counts are ``num_processes``; the read stays as it
        is (under the launcher it is the process's local rank, as before)."""
        dist = self.plan.distributed
        arg = self.get_metadata(ParentNodeProvider, read, None)
        call = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if dist is None or not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
            return False
        worker = next((s for s in self.shared.module.body if isinstance(s, cst.FunctionDef)
                       and s.name.value == call.func.value), None)
        bound = bind_arguments(worker, call) if worker is not None else None
        if worker is None or bound is None or self.plan.accelerator_in(worker.name.value) is None:
            return False
        return any(value is read and ((worker.name.value, param) in dist.passed or (worker.name.value, param) in counts)
                   for param, value in bound.items())

    def _passed_only(self, comparison: cst.BaseExpression) -> bool:
        dist = self.plan.distributed
        if not isinstance(comparison, cst.Comparison):
            return False
        sides = [comparison.left, comparison.comparisons[0].comparator]
        return dist is not None and any(ref_of(self, s) in dist.passed for s in sides)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if isinstance(parent, cst.Attribute) and parent.attr is original_node:
            return updated_node
        return self._rank_use(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        dist = self.plan.distributed
        if dist is not None and id(original_node) in dist.sizes:
            size = dist.sizes[id(original_node)]
            self.change(original_node, f"`{cst.Module(body=[]).code_for_node(original_node)}` -> `{size}`: the "
                        "gathered counts cover the dataset once")
            return cst.parse_expression(size)
        return self._rank_use(original_node, updated_node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.BaseStatement]:
        """The loop that starts the worker in ``Process``es -> one call of the worker; the loop that joins them goes."""
        dist = self.plan.distributed
        if dist is not None and dist.spawn is not None and id(original_node) == dist.spawn[0]:
            name = dist.spawn[1]
            arguments = ", ".join(cst.Module(body=[]).code_for_node(a) for a in dist.spawned)
            self.replaced(original_node)
            remove_imports_of(self.context, original_node)
            self.change(original_node, f"the loop that started `{name}` in processes -> `{name}({arguments})`: the "
                        "launcher starts the processes")
            return self.parse_statement(f"{name}({arguments})\n").with_changes(leading_lines=updated_node.leading_lines)
        if dist is not None and id(original_node) in dist.joins:
            self.change(original_node, "the processes' joins removed: the launcher starts and waits for them")
            return self.remove(updated_node)  # type: ignore[return-value]
        return super().leave_For(original_node, updated_node)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """``RandomSampler(ds) if args.local_rank == -1 else DistributedSampler(ds)`` -> ``RandomSampler(ds)``."""
        dist = self.plan.distributed
        branch = dist.sampler_choices.get(id(original_node)) if dist is not None else None
        if branch is None:
            return updated_node
        remove_imports_of(self.context, original_node.orelse if branch == "body" else original_node.body)
        remove_imports_of(self.context, original_node.test)
        self.change(original_node, "the DistributedSampler of the launched path removed (`prepare` shards the data): "
                    "the single-process path's sampler")
        kept = updated_node.body if branch == "body" else updated_node.orelse
        return kept.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if updated_node.lpar else kept

    def _rank_use(self, original: Union[cst.Name, cst.Attribute], updated: cst.BaseExpression) -> cst.BaseExpression:
        dist = self.plan.distributed
        if dist is None:
            return updated
        if dist.gpu_counts and held(self, original) in dist.gpu_counts and self.get_metadata(
                ExpressionContextProvider, original, None) == ExpressionContext.LOAD:
            return self._gpu_count(original, updated)
        ref = ref_of(self, original)
        if ref is not None and ref in dist.ranks:
            attribute = dist.ranks[ref]
        elif is_arg_rank(self, original, dist):
            attribute = "local_process_index"
        else:
            return updated
        if self.get_metadata(ExpressionContextProvider, original, None) != ExpressionContext.LOAD:
            return updated
        if self._in_removed_code(original):
            return updated
        accelerator = self.accelerator_at(original)
        if accelerator is None and self._kept_query(original):
            return updated  # the name still holds the process's rank (`_state_query`)
        if accelerator is None and self._handed_to_a_worker(original):
            return updated
        if accelerator is None:
            return self._unreachable(original, updated)  # type: ignore[return-value]
        if attribute in MAIN_TESTS and self._device_position(original):
            if loads_on_the_cpu(self, original):
                self.change(original, "per-rank `map_location` -> `\"cpu\"`")
                return cpu_string(self, original)
            attribute = "device"
        code = cst.Module(body=[]).code_for_node(original)
        self.change(original, f"`{code}` -> `{accelerator}.{attribute}`")
        return accelerator_attr(accelerator, attribute)

    def _device_position(self, node: cst.CSTNode) -> bool:
        """``device=local_rank``, ``.to(local_rank)``, ``.cuda(local_rank)``, ``torch.device("cuda", local_rank)``."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if not isinstance(parent, cst.Arg):
            return False
        if parent.keyword is not None:
            return parent.keyword.value in ("device", "map_location")
        call = self.get_metadata(ParentNodeProvider, parent, None)
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in (
            "to", "cuda")

    def _in_removed_code(self, node: cst.CSTNode) -> bool:
        """Inside a statement that goes, where rewriting it would be wasted (and its position unknown)."""
        dist = self.plan.distributed
        return dist is not None and self.inside(node, dist.remove | dist.rank_assigns)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        dist = self.plan.distributed
        if dist is None:
            return updated_node
        if not original_node.args and (attribute := _query(self, original_node)) is not None:
            if self._in_removed_code(original_node) or _is_statement(self, original_node):
                return updated_node
            accelerator = self.accelerator_at(original_node)
            if accelerator is None and _guarded(self, original_node):
                return updated_node  # right as it is: Accelerate sets the process group up when there is one
            if accelerator is None and self.name_free("PartialState"):
                # in a loss's or a model's method (DINO's `update_center`): the state the Accelerator set up
                add_target_import(self.context, "PartialState")
                self.change(original_node, f"`{cst.Module(body=[]).code_for_node(original_node)}` -> "
                            f"`PartialState().{attribute}` (the Accelerator's state, where it cannot be reached)")
                remove_imports_of(self.context, original_node)
                return cst.parse_expression(f"PartialState().{attribute}")
            if accelerator is None:
                return self._unreachable(original_node, updated_node)  # type: ignore[return-value]
            replacement = accelerator_attr(accelerator, f"state.{attribute}" if attribute in _STATE_ONLY else attribute)
            self.change(original_node, f"`{cst.Module(body=[]).code_for_node(original_node)}` -> "
                        f"`{cst.Module(body=[]).code_for_node(replacement)}`")
            remove_imports_of(self.context, original_node)
            return replacement
        if has_qname(self, original_node.func, DATALOADERS):
            return self._loader(original_node, updated_node)
        if original_node.args and per_process_device(self, original_node) and not has_qname(
            self, original_node.func, frozenset({"torch.device"})
        ):
            return self._per_process_device(original_node, updated_node)  # "cuda:{}".format(gpu)
        func = original_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "no_sync" and not original_node.args:
            return self._no_sync(original_node, updated_node)
        return updated_node

    def _no_sync(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``model.no_sync()`` -> ``accelerator.no_sync(model)``: the prepared model may be no DDP wrapper
        (one process), which has no ``no_sync``; Accelerate's works for every launch."""
        receiver = original.func.value  # type: ignore[attr-defined]
        accelerator = self.accelerator_at(original)
        if ref_of(self, receiver) not in self.plan.flow["model"] or accelerator is None:
            self.refuse(original, "ACC126", f"`{cst.Module(body=[]).code_for_node(original)}` on something accelify "
                        "does not follow to a prepared model, or where the Accelerator cannot be reached; file not "
                        "converted.", "use `with accelerator.no_sync(model):` on the prepared model")
            return updated
        model = cst.Module(body=[]).code_for_node(updated.func.value)  # type: ignore[attr-defined]
        self.change(original, f"`{model}.no_sync()` -> `{accelerator}.no_sync({model})`")
        return cst.parse_expression(f"{accelerator}.no_sync({model})")

    def _loader(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``DataLoader(ds, shuffle=False, sampler=DistributedSampler(ds))`` -> ``DataLoader(ds, shuffle=True)``."""
        dist = self.plan.distributed
        assert dist is not None
        index = next((i for i, a in enumerate(original.args) if a.keyword is not None and a.keyword.value == "sampler"
                      and self._removed_sampler(a.value)), None)
        batched = next((i for i, a in enumerate(original.args) if a.keyword is not None
                        and a.keyword.value == "batch_sampler" and ref_of(self, a.value) in dist.batch_samplers), None)
        if batched is not None:
            shuffle, size, drop = dist.batch_samplers[ref_of(self, original.args[batched].value)]  # type: ignore[index]
            given = updated.args[batched]
            code = cst.Module(body=[]).code_for_node
            new = [given.with_changes(keyword=cst.Name("batch_size"), value=size.deep_clone()),
                   given.with_changes(keyword=cst.Name("shuffle"), value=cst.parse_expression(shuffle)),
                   given.with_changes(keyword=cst.Name("drop_last"), value=drop.deep_clone())]
            if batched < len(updated.args) - 1 or given.comma is not cst.MaybeSentinel.DEFAULT:
                new[-1] = new[-1].with_changes(comma=given.comma)
            new[0] = new[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            new[1] = new[1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args = [*updated.args[:batched], *new, *updated.args[batched + 1:]]
            self.change(original, f"BatchSampler over a DistributedSampler removed (`prepare` shards the data): "
                        f"`batch_size={code(size)}, shuffle={shuffle}, drop_last={code(drop)}` on the DataLoader")
            return updated.with_changes(args=args)
        if index is None:
            return updated
        value = original.args[index].value
        if isinstance(value, cst.IfExp):  # `DistributedSampler(ds) if distributed else None`
            value = value.body
        if isinstance(value, cst.Call):
            shuffle = sampler_shuffle(value)
        else:
            shuffle = dist.sampler_names[ref_of(self, value)]  # type: ignore[index]
        args = list(updated.args)
        removed = args[index]
        keywords = {a.keyword.value: i for i, a in enumerate(args) if a.keyword is not None}
        if "shuffle" in keywords:
            args[keywords["shuffle"]] = args[keywords["shuffle"]].with_changes(value=cst.parse_expression(shuffle))
            args[index] = None  # type: ignore[call-overload]
        else:
            args[index] = removed.with_changes(keyword=cst.Name("shuffle"), value=cst.parse_expression(shuffle))
        kept = [a for a in args if a is not None]
        if args[-1] is None and kept:
            kept[-1] = kept[-1].with_changes(comma=removed.comma)
        remove_imports_of(self.context, original.args[index].value)
        self.change(original, f"DistributedSampler removed (`prepare` shards the data); `shuffle={shuffle}` on the "
                    "DataLoader")
        return updated.with_changes(args=kept)

    def _removed_sampler(self, value: cst.BaseExpression) -> bool:
        dist = self.plan.distributed
        assert dist is not None
        return id(value) in dist.samplers or ref_of(self, value) in dist.sampler_names


def _query(visitor: AccelifyCodemod, call: cst.Call) -> Optional[str]:
    if has_qname(visitor, call.func, GET_RANK):
        return "process_index"
    if has_qname(visitor, call.func, GET_WORLD_SIZE):
        return "num_processes"
    if has_qname(visitor, call.func, IS_INITIALIZED):
        return "use_distributed"
    if has_qname(visitor, call.func, GET_BACKEND):
        return "backend"
    return None


#: what ``_query`` answers that the Accelerator has only through its state (``accelerator.state.backend``;
#: ``PartialState().backend`` is the state itself)
_STATE_ONLY = frozenset({"backend"})


def _guarded(visitor: AccelifyCodemod, call: cst.Call) -> bool:
    """A query right without an Accelerator: ``dist.is_initialized()`` (under Accelerate there is a process
    group exactly when it made one), or a rank asked below ``if not is_initialized(): return 0`` or inside
    ``if is_initialized():`` (the torchvision references' ``get_rank()``/``get_world_size()``, which answer
    0 and 1 in one process)."""
    if has_qname(visitor, call.func, IS_INITIALIZED):
        return True
    function = enclosing_function(visitor, call)
    if function is None:
        return False
    module = visitor.get_metadata(ParentNodeProvider, function, None)
    helpers = {f.name.value for f in (module.body if isinstance(module, cst.Module) else [])
               if isinstance(f, cst.FunctionDef) and any(has_qname(visitor, c.func, IS_INITIALIZED)
                                                         for c in findall(f, m.Call()))}

    def tests_initialised(test: cst.BaseExpression) -> bool:
        return any(has_qname(visitor, c.func, IS_INITIALIZED) or (isinstance(c.func, cst.Name) and c.func.value in helpers)
                   for c in findall(test, m.Call()))

    for statement in function.body.body:
        if findall(statement, m.Call()) and any(c is call for c in findall(statement, m.Call())):
            break
        if isinstance(statement, cst.If) and tests_initialised(statement.test) and isinstance(
            statement.body, cst.IndentedBlock
        ) and m.matches(statement.body.body[-1], m.SimpleStatementLine(body=[m.Return()])):
            return True  # `if not is_dist_avail_and_initialized(): return 0`
    node: Optional[cst.CSTNode] = call
    while node is not None and node is not function:
        parent = visitor.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, (cst.If, cst.IfExp)) and node is parent.body and tests_initialised(parent.test):
            return True
        node = parent
    return False


def _is_statement(visitor: AccelifyCodemod, call: cst.Call) -> bool:
    return isinstance(visitor.get_metadata(ParentNodeProvider, call, None), cst.Expr)


def key_is_module(visitor: AccelifyCodemod, node: cst.FunctionDef) -> bool:
    from libcst.metadata import GlobalScope, ScopeProvider

    return isinstance(visitor.get_metadata(ScopeProvider, node, None), GlobalScope)
