"""ACC030: a set-up helper (``init_distributed_mode(args)``) is its launched path, written where it is called."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from accelify.analyses.distributed import BARRIER, INIT, SET_DEVICE
from accelify.analyses.plan import Plan
from accelify.queries.names import wrapper_qualified_names
from accelify.queries.records import Finding
from accelify.queries.walk import findall

from .base import AccelifyCodemod

#: the launcher's variables a launched branch may read
_LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class SetUpHelper(AccelifyCodemod):
    """A helper that sets the process group up is replaced, where it is called, by its launched path.

    The torchvision references and the repositories that copy them (DINO, VICReg, DeiT, MAE, and
    many course projects) set up with ``init_distributed_mode(args)``: it reads ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` into ``args`` when a launcher set them (SLURM's variables, or
    one GPU, otherwise), picks the GPU, calls ``init_process_group`` and a barrier, and silences
    ``print`` on all processes but the first. Under ``accelerate launch`` the launcher's path is
    the one taken, and Accelerate does the rest: so the call becomes that path, and the helper goes.
    What the path binds is then what ACC028 and ACC018 convert (``args.rank`` and
    ``args.world_size`` handed to the process group become ``accelerator.process_index`` and
    ``num_processes``; the barrier and the GPU choice go with the set-up); a call of the script's own
    print-silencing helper stays, on ``accelerator.is_main_process``.

    The GPU the helper binds (``args.gpu = int(os.environ["LOCAL_RANK"])``) goes too when the
    script reads it only where the conversion removes it (``torch.cuda.set_device``, ``device_ids=``
    of DistributedDataParallel, ``.cuda(args.gpu)``). Anything else in the helper (a ``return``, a
    flag read elsewhere, a branch that is not the launcher's) leaves the file as it is.

    Before::

        import os

        import torch
        import torch.distributed as dist


        def init_distributed_mode(args):
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                args.rank = int(os.environ["RANK"])
                args.world_size = int(os.environ["WORLD_SIZE"])
                args.gpu = int(os.environ["LOCAL_RANK"])
            else:
                print("Not using distributed mode")
                return
            torch.cuda.set_device(args.gpu)
            dist.init_process_group(backend="nccl", world_size=args.world_size, rank=args.rank)
            dist.barrier()


        def main(args):
            init_distributed_mode(args)
            model = torch.nn.Linear(4, 2).cuda(args.gpu)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(args.steps):
                loss = model(torch.randn(8, 4).cuda(args.gpu)).sum()
                loss.backward()
                optimizer.step()

    After::

        import os

        import torch
        import torch.distributed as dist


        def main(args):
            args.rank = int(os.environ["RANK"])
            args.world_size = int(os.environ["WORLD_SIZE"])
            dist.init_process_group(backend="nccl", world_size=args.world_size, rank=args.rank)
            model = torch.nn.Linear(4, 2).cuda(args.gpu)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(args.steps):
                loss = model(torch.randn(8, 4).cuda(args.gpu)).sum()
                loss.backward()
                optimizer.step()
    """

    CODE = "ACC030"
    HINT = "init_process_group"  # (the text a file needs for this to be looked for at all)
    NAME = "set-up-helper"
    DESCRIPTION = "A helper that sets the process group up becomes its launched path, where it is called"

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return False  # it runs before the analysis (:func:`specialise`), not in the one traversal

    @staticmethod
    def specialise(module: cst.Module) -> Optional[Inlined]:
        """The module with the helper's call replaced by its launched path and the helper gone; None when
        the file has no such helper or it does something else too."""
        if not findall(module, m.If(test=m.Comparison(comparisons=[m.ComparisonTarget(operator=m.In())])
                                    | m.BooleanOperation())):
            return None
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = _find(wrapper)
        if found is None:
            return None
        return Inlined(wrapper.module.visit(_Inline(found)), found.line, found.name)


@dataclass
class Inlined:
    """What :meth:`SetUpHelper.specialise` made of a file."""

    module: cst.Module
    line: int  # of the helper's call
    helper: str

    @property
    def change(self) -> str:
        return (f"`{self.helper}(...)` is its launched path (what `accelerate launch` sets), written where it was "
                "called; the helper goes")

    def notes(self, path: str) -> list[Finding]:
        return []


@dataclass
class _Found:
    helper: cst.FunctionDef
    call: cst.SimpleStatementLine
    statements: list[cst.BaseStatement]  # what the call becomes, the helper's parameter renamed
    line: int
    name: str



def _launcher_test(test: cst.BaseExpression) -> bool:
    """``"RANK" in os.environ and "WORLD_SIZE" in os.environ`` (each side a launcher variable)."""
    sides = [test.left, test.right] if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) \
        else [test]
    for side in sides:
        if not m.matches(side, m.Comparison(
            left=m.SimpleString(), comparisons=[m.ComparisonTarget(operator=m.In(), comparator=m.Attribute(
                value=m.Name("os"), attr=m.Name("environ")))])):
            return False
        if side.left.evaluated_value not in _LAUNCHER:  # type: ignore[attr-defined]
            return False
    return True


def _find(wrapper: MetadataWrapper) -> Optional[_Found]:
    module = wrapper.module
    parents = wrapper.resolve(ParentNodeProvider)
    helpers = [f for f in module.body if isinstance(f, cst.FunctionDef)
               and any(wrapper_qualified_names(wrapper, c.func) & INIT for c in findall(f, m.Call()))]
    if len(helpers) != 1:
        return None
    helper = helpers[0]
    name = helper.name.value
    params = helper.params
    if len(params.params) != 1 or params.star_arg is not cst.MaybeSentinel.DEFAULT and params.star_arg is not None:
        return None
    param = params.params[0].name.value
    body = list(helper.body.body)
    first = next((i for i, s in enumerate(body) if isinstance(s, cst.If)), None)
    if first is None or not _launcher_test(body[first].test) or any(  # type: ignore[attr-defined]
        not m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) for s in body[:first]
    ):
        return None  # (a docstring may come first)
    launched = body[first].body.body  # type: ignore[attr-defined]
    for statement in launched:
        if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                target=m.Attribute(value=m.Name(param)))])])):
            return None
    # the calls: one statement `helper(args)` / `helper(args=args)` / `utils.helper(args)`, nothing else names it
    uses = [n for n in findall(module, m.Name(name)) if n is not helper.name]
    calls = [n for n in uses if _call_statement(parents, n) is not None]
    if len(calls) != 1 or len(uses) != 1:
        return None
    line = _call_statement(parents, calls[0])
    call = line.body[0].value  # type: ignore[attr-defined]
    if len(call.args) != 1 or not isinstance(call.args[0].value, cst.Name) or (
        call.args[0].keyword is not None and call.args[0].keyword.value != param
    ):
        return None
    argument = call.args[0].value.value
    rest: list[cst.BaseStatement] = []
    for statement in body[first + 1:]:
        if not isinstance(statement, cst.SimpleStatementLine):
            return None
        kept = _kept(wrapper, statement, param)
        if kept is None and m.matches(statement, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(target=m.Attribute(value=m.Name(param)))],
                value=m.SimpleString() | m.Name("True") | m.Name("False"))])):
            # `args.dist_backend = "nccl"`, `args.distributed = True`: gone when only the helper reads it
            kept = _read_elsewhere(module, argument, statement.body[0].targets[0].target.attr.value, helper)  # type: ignore[attr-defined]
        if kept is None:
            return None
        if kept:
            rest.append(statement)
    if not any(wrapper_qualified_names(wrapper, c.func) & INIT for s in rest for c in findall(s, m.Call())):
        return None  # the process group is set up in a branch
    gpu = _local_rank_attr(launched, param)
    statements = [s for s in launched if gpu is None or not _binds(s, param, gpu)]
    if gpu is not None and not _gpu_reads_go(wrapper, parents, param, argument, gpu, helper):
        return None
    renamed = [s.visit(_Rename(param, argument)) for s in [*statements, *rest]]
    position = wrapper.resolve(PositionProvider)[line].start.line
    return _Found(helper, line, renamed, position, name)  # type: ignore[arg-type]


def _call_statement(parents, name: cst.Name) -> Optional[cst.SimpleStatementLine]:
    """The statement ``name(...)`` or ``x.name(...)`` when ``name`` is called there as a statement."""
    node: cst.CSTNode = name
    parent = parents.get(node)
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        node, parent = parent, parents.get(parent)
    if not isinstance(parent, cst.Call) or parent.func is not node:
        return None
    expr = parents.get(parent)
    line = parents.get(expr)
    if isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def _kept(wrapper: MetadataWrapper, statement: cst.SimpleStatementLine, param: str) -> Optional[bool]:
    """What becomes of a statement after the launcher test: kept (True), part of the set-up that goes
    (False: a print, the GPU choice, a barrier, the backend's name), or not understood (None)."""
    if len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        names = wrapper_qualified_names(wrapper, small.value.func)
        if names & (SET_DEVICE | BARRIER) or names & {"builtins.print"}:
            return False
        return True  # init_process_group, `setup_for_distributed(args.rank == 0)`
    return None  # (`args.dist_backend = "nccl"`: decided by the caller, :func:`_read_elsewhere`)


def _read_elsewhere(module: cst.Module, argument: str, attr: str, helper: cst.FunctionDef) -> bool:
    """``args.<attr>`` is read outside the helper (``args`` the name the helper is called with)."""
    inside = {id(n) for n in findall(helper, m.Attribute(attr=m.Name(attr)))}
    return any(id(n) not in inside for n in findall(module, m.Attribute(value=m.Name(argument), attr=m.Name(attr))))


def _binds(statement: cst.BaseStatement, param: str, attr: str) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
        target=m.Attribute(value=m.Name(param), attr=m.Name(attr)))])]))


def _local_rank_attr(launched, param: str) -> Optional[str]:
    """The attribute the launched branch binds to ``LOCAL_RANK`` (``gpu``)."""
    for statement in launched:
        assign = statement.body[0]
        keys = [s.evaluated_value for s in findall(assign.value, m.SimpleString())]
        if keys == ["LOCAL_RANK"]:
            return assign.targets[0].target.attr.value
    return None


def _gpu_reads_go(wrapper: MetadataWrapper, parents, param: str, argument: str, gpu: str,
                  helper: cst.FunctionDef) -> bool:
    """Every read of ``args.gpu`` outside the helper is where the conversion removes it: the GPU chosen
    (``set_device``), ``device_ids=[args.gpu]``/``output_device=`` of DistributedDataParallel, ``.cuda(args.gpu)``."""
    for node in findall(wrapper.module, m.Attribute(value=m.Name(argument), attr=m.Name(gpu))):
        current = parents.get(node)
        inside_helper = False
        walker: Optional[cst.CSTNode] = node
        while walker is not None:
            if walker is helper:
                inside_helper = True
                break
            walker = parents.get(walker)
        if inside_helper:
            continue
        if isinstance(current, cst.Element):
            current = parents.get(current)  # [args.gpu]
        arg = parents.get(current) if isinstance(current, cst.List) else current
        if isinstance(arg, cst.Arg):
            call = parents.get(arg)
            keyword = arg.keyword.value if arg.keyword is not None else None
            if isinstance(call, cst.Call) and (
                (keyword in ("device_ids", "output_device") and "DistributedDataParallel" in cst.Module([]).code_for_node(call.func))
                or wrapper_qualified_names(wrapper, call.func) & SET_DEVICE
                or (m.matches(call.func, m.Attribute(attr=m.Name("cuda"))) and len(call.args) == 1)
            ):
                continue
        return False
    return True


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.new) if original_node.value == self.old else updated_node


class _Inline(cst.CSTTransformer):
    def __init__(self, found: _Found) -> None:
        super().__init__()
        self.found = found

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
                                  ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement]]:
        if original_node is not self.found.call:
            return updated_node
        statements = [s.with_changes(leading_lines=[]) for s in self.found.statements]
        statements[0] = statements[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(statements)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
                          ) -> Union[cst.FunctionDef, cst.RemovalSentinel]:
        return cst.RemovalSentinel.REMOVE if original_node is self.found.helper else updated_node  # (its comments too)
