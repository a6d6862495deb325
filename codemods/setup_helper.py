"""ACC030: a set-up helper (``init_distributed_mode(args)``) is its launched path, written where it is called."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider, QualifiedNameSource

from accelify.analyses.distributed import BARRIER, INIT, SET_DEVICE
from accelify.analyses.foreign import Foreign
from accelify.analyses.plan import Plan
from accelify.queries.names import code_of, split_relative, wrapper_qualified_names
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

    @staticmethod
    def specialise_foreign(module: cst.Module, sources) -> Optional[Inlined]:
        """The script with its call of another project module's set-up helper (DINO's
        ``utils.init_distributed_mode(args)``, ``sources`` the project's modules) replaced by the helper's launched
        path; the helper stays in its module (other scripts may call it). None when there is no such call, or
        its path reads a name the script cannot reach as the module does. (A script that sets up itself, whose
        text names ``init_process_group``, is :meth:`specialise`'s: the pipeline does not ask.)"""
        if not _imports_a_set_up(module, sources):
            return None  # no module of the project that sets up
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = _find_foreign(wrapper, sources)
        if found is None:
            return None
        return Inlined(wrapper.module.visit(_Inline(found)), found.line, found.name, foreign=True)


@dataclass
class Inlined:
    """What :meth:`SetUpHelper.specialise` made of a file."""

    module: cst.Module
    line: int  # of the helper's call
    helper: str
    foreign: bool = False  # the helper is another module's: it stays there

    @property
    def change(self) -> str:
        return (f"`{self.helper}(...)` is its launched path (what `accelerate launch` sets), written where it was "
                "called; " + ("its module keeps it (other scripts may call it)" if self.foreign else "the helper goes"))

    def notes(self, path: str) -> list[Finding]:
        return []


@dataclass
class _Found:
    helper: cst.FunctionDef
    call: cst.SimpleStatementLine
    statements: list[cst.BaseStatement]  # what the call becomes, the helper's parameter renamed
    line: int
    name: str
    #: imports of the helper's module its path needs and the script lacks (``import torch.distributed as dist``)
    imports: list[cst.SimpleStatementLine] = field(default_factory=list)



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
    # the calls: one statement `helper(args)` / `helper(args=args)` / `utils.helper(args)`, nothing else names it
    uses = [n for n in findall(module, m.Name(name)) if n is not helper.name]
    calls = [n for n in uses if _call_statement(parents, n) is not None]
    if len(calls) != 1 or len(uses) != 1:
        return None
    return _launched_path(wrapper, helper, wrapper, _call_statement(parents, calls[0]))


def _launched_path(home: MetadataWrapper, helper: cst.FunctionDef, wrapper: MetadataWrapper,
                   line: cst.SimpleStatementLine) -> Optional[_Found]:
    """What the call ``line`` of the script ``wrapper`` becomes: ``helper``'s launched path (``home``: the module
    that defines it, the script itself or another module of the project), its parameter renamed."""
    module = wrapper.module
    parents = wrapper.resolve(ParentNodeProvider)
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
        kept = _kept(home, statement, param)
        if kept is None and m.matches(statement, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(target=m.Attribute(value=m.Name(param)))],
                value=m.SimpleString() | m.Name("True") | m.Name("False"))])):
            # `args.dist_backend = "nccl"`, `args.distributed = True`: gone when only the helper reads it
            kept = _read_elsewhere(module, argument, statement.body[0].targets[0].target.attr.value, helper)  # type: ignore[attr-defined]
        if kept is None:
            return None
        if kept:
            rest.append(statement)
    if not any(wrapper_qualified_names(home, c.func) & INIT for s in rest for c in findall(s, m.Call())):
        return None  # the process group is set up in a branch
    gpu = _local_rank_attr(launched, param)
    statements = [s for s in launched if gpu is None or not _binds(s, param, gpu)]
    if gpu is not None and not _gpu_reads_go(wrapper, parents, param, argument, gpu, helper):
        return None
    renamed = [s.visit(_Rename(param, argument)) for s in [*statements, *rest]]
    position = wrapper.resolve(PositionProvider)[line].start.line
    return _Found(helper, line, renamed, position, name)  # type: ignore[arg-type]


def _imports_a_set_up(module: cst.Module, sources) -> bool:
    """Does the script import, at its top, a module of the project whose text sets a process group up? (Read before
    any metadata: most scripts import none.)"""
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Import):
                wanted = [(code_of(a.name), 0) for a in small.names]
            elif isinstance(small, cst.ImportFrom) and small.module is not None:
                wanted = [(code_of(small.module), len(small.relative))]
            else:
                continue
            if any("init_process_group" in (sources.module_source(dotted, level) or "") for dotted, level in wanted):
                return True
    return False


def _find_foreign(wrapper: MetadataWrapper, sources) -> Optional[_Found]:
    """The one statement call ``utils.init_distributed_mode(args)`` (or ``init_distributed_mode(args)`` imported from
    it) of a function of another module of the project that sets the process group up, as :func:`_find` reads a
    helper of the script's own."""
    module = wrapper.module
    parents = wrapper.resolve(ParentNodeProvider)
    found: list[_Found] = []
    for line in findall(module, m.SimpleStatementLine(body=[m.Expr(m.Call(args=[m.Arg(m.Name())]))])):
        func = line.body[0].value.func  # type: ignore[attr-defined]
        value = wrapper.resolve(QualifiedNameProvider).get(func, set())
        names = [q.name for q in (value() if callable(value) else value) if q.source is QualifiedNameSource.IMPORT]
        if len(names) != 1 or not isinstance(func, (cst.Name, cst.Attribute)):
            continue
        full, level = split_relative(names[0])
        defined = Foreign.of(sources).definition(full) if level <= 1 else None
        if defined is None or defined != tuple(full.rsplit(".", 1)):
            continue  # (one a module imports from another: the script's names would not reach its module's)
        dotted, name = defined
        text = sources.module_source(dotted) if dotted else None
        if text is None or "init_process_group" not in text:
            continue
        try:
            home = MetadataWrapper(cst.parse_module(text))
        except Exception:  # a module that does not parse is one accelify cannot read
            continue
        helper = next((f for f in home.module.body if isinstance(f, cst.FunctionDef) and f.name.value == name), None)
        if helper is None or not any(wrapper_qualified_names(home, c.func) & INIT for c in findall(helper, m.Call())):
            continue
        uses = [n for n in findall(module, m.Name(func.value if isinstance(func, cst.Name) else func.attr.value))
                if not isinstance(parents.get(n), cst.ImportAlias)]
        path = _launched_path(home, helper, wrapper, line) if len(uses) == 1 else None
        if path is None:
            return None  # (ACC135 says why the file is left)
        reach, addable = _reach(wrapper, home, func)
        argument = line.body[0].value.args[0].value.value  # type: ignore[attr-defined]
        taken: dict[str, cst.ImportAlias] = {}
        statements = [_reached(s, reach, addable, argument, taken) for s in path.statements]
        if any(s is None for s in statements):
            return None
        imports = [cst.SimpleStatementLine([cst.Import([a.with_changes(comma=cst.MaybeSentinel.DEFAULT)])])
                   for a in taken.values()]
        found.append(_Found(path.helper, path.call, statements, path.line, path.name, imports))  # type: ignore[arg-type]
    return found[0] if len(found) == 1 else None


def _reach(wrapper: MetadataWrapper, home: MetadataWrapper, func: cst.BaseExpression
           ) -> tuple[dict[str, Optional[cst.BaseExpression]], dict[str, cst.ImportAlias]]:
    """How the script reaches the names the helper's module binds at its top: an import bound to the same module
    in both (``os``, ``torch``) as it is (None), a function or class of that module through the script's name for
    it (``utils.setup_for_distributed``); and the imports of that module whose names the script binds nowhere
    (``import torch.distributed as dist``), which it can take. Names bound otherwise are left out."""
    mine = _top_imports(wrapper.module)
    theirs = _top_imports(home.module)
    reach: dict[str, Optional[cst.BaseExpression]] = {
        n: None for n, (dotted, _) in theirs.items() if n in mine and mine[n][0] == dotted}
    taken = {n.value for n in findall(wrapper.module, m.Name())}
    addable = {n: alias for n, (_, alias) in theirs.items() if n not in taken}
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):  # `import utils` (as u): `u.name`
        for statement in home.module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                reach.setdefault(statement.name.value, cst.Attribute(func.value, cst.Name(statement.name.value)))
    return reach, addable


def _top_imports(module: cst.Module) -> dict[str, tuple[str, cst.ImportAlias]]:
    """Names the module's top-level ``import`` statements bind -> the module each names (``dist`` ->
    ``torch.distributed``; ``torch`` -> ``torch`` for ``import torch.nn``), with the import's alias."""
    bound: dict[str, tuple[str, cst.ImportAlias]] = {}
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = code_of(alias.name)
                    if alias.asname is not None:
                        bound[code_of(alias.asname.name)] = (dotted, alias)
                    else:
                        bound.setdefault(dotted.split(".")[0], (dotted.split(".")[0], alias))
    return bound


def _reached(statement: cst.BaseStatement, reach: dict[str, Optional[cst.BaseExpression]],
             addable: dict[str, cst.ImportAlias], argument: str, taken: dict[str, cst.ImportAlias]
             ) -> Optional[cst.BaseStatement]:
    """``statement`` (of the helper's launched path, its parameter renamed to the script's ``argument``) with the
    names of its module as the script reaches them (an import it can take goes into ``taken``); None when it reads
    one the script cannot (a builtin is everyone's)."""
    names = {id(n.attr) for n in findall(statement, m.Attribute())} | {  # `os.environ`, `backend=`: no reads
        id(a.keyword) for a in findall(statement, m.Arg()) if a.keyword is not None}
    reads = [n for n in findall(statement, m.Name()) if n.value != argument and id(n) not in names]
    replace: dict[int, cst.BaseExpression] = {}
    for name in reads:
        if name.value in reach:
            if reach[name.value] is not None:
                replace[id(name)] = reach[name.value]  # type: ignore[assignment]
        elif name.value in addable:
            taken[name.value] = addable[name.value]
        elif not hasattr(builtins, name.value):
            return None
    return statement.visit(_Replace(replace)) if replace else statement


class _Replace(cst.CSTTransformer):
    def __init__(self, replace: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.replace = replace

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.replace.get(id(original_node), updated_node)


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

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.found.imports:
            return updated_node
        body = list(updated_node.body)
        at = max((i + 1 for i, s in enumerate(body) if m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))),
                 default=0)
        return updated_node.with_changes(body=body[:at] + self.found.imports + body[at:])
