"""ACC027: the ImageNet example's launch (``mp.spawn`` or a direct call) becomes the distributed path alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from accelify.analyses.distributed import INIT, SPAWN
from accelify.analyses.plan import Plan
from accelify.queries.names import name_attribute, wrapper_qualified_names
from accelify.queries.records import Finding
from accelify.queries.walk import findall

from .base import AccelifyCodemod

#: the ``init_process_group`` arguments whose attributes (``args.rank``) only the set-up reads
_SETUP_KEYWORDS = ("rank", "world_size")


class SpawnLaunch(AccelifyCodemod):
    """A script that decides its own launch (``--multiprocessing-distributed``) keeps the distributed path.

    The ImageNet example and the repositories written after it (MoCo, SimSiam, ...) start their
    processes themselves: ``main()`` calls ``mp.spawn(main_worker, nprocs=ngpus_per_node, ...)``
    when ``args.multiprocessing_distributed`` is set and ``main_worker(args.gpu, ...)`` directly
    otherwise, and ``main_worker`` branches on ``args.distributed`` (``args.world_size > 1 or
    args.multiprocessing_distributed``) for the process group, ``DistributedDataParallel`` and the
    ``DistributedSampler``. Under ``accelerate launch`` the launcher starts the processes and
    ``prepare`` does what the distributed branches did, in one process too; so both flags are taken
    as set: the ``mp.spawn`` branch is the launch (ACC018 turns it into one call of the worker),
    each branch on a flag keeps its distributed side, ``args.gpu is not None`` is true (spawn hands
    every process its GPU), and the assignments to the rank and world size the process group was
    given (``args.rank = args.rank * ngpus_per_node + gpu``) go with it. What the other paths did
    (``DataParallel``, one chosen GPU, ``raise NotImplementedError``) is what ``accelerate launch
    --num_processes 1`` / ``--gpu_ids`` do now.

    This runs before the analysis, on the file as written; the rest of the conversion sees the
    distributed path alone. When a flag is read where it cannot be decided (stored, passed on), or
    the rank is read outside the set-up, nothing is taken as set and the file is analysed as it is.
    The example shows this codemod alone; ACC018 and the others then turn the spawn into one call of
    the worker and its plumbing into the Accelerator's (fixtures/ddp_spawn_or_call_runnable).

    Before::

        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler


        def main():
            args = parser.parse_args()
            args.distributed = args.world_size > 1 or args.multiprocessing_distributed
            ngpus_per_node = torch.cuda.device_count()
            if args.multiprocessing_distributed:
                args.world_size = ngpus_per_node * args.world_size
                mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
            else:
                main_worker(args.gpu, ngpus_per_node, args)


        def main_worker(gpu, ngpus_per_node, args):
            args.gpu = gpu
            if args.distributed:
                args.rank = args.rank * ngpus_per_node + gpu
                dist.init_process_group(backend="nccl", init_method=args.dist_url,
                                        world_size=args.world_size, rank=args.rank)
            model = Net()
            if args.distributed:
                torch.cuda.set_device(args.gpu)
                model.cuda(args.gpu)
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            else:
                model = torch.nn.DataParallel(model).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if args.distributed:
                sampler = DistributedSampler(dataset)
            else:
                sampler = None
            loader = DataLoader(dataset, batch_size=8, shuffle=(sampler is None), sampler=sampler)
            for x, y in loader:
                if args.gpu is not None:
                    x = x.cuda(args.gpu, non_blocking=True)
                y = y.cuda(args.gpu, non_blocking=True)
                loss = criterion(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

    After::

        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler


        def main():
            args = parser.parse_args()
            ngpus_per_node = torch.cuda.device_count()
            mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


        def main_worker(gpu, ngpus_per_node, args):
            args.gpu = gpu
            dist.init_process_group(backend="nccl", init_method=args.dist_url,
                                    world_size=args.world_size, rank=args.rank)
            model = Net()
            torch.cuda.set_device(args.gpu)
            model.cuda(args.gpu)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, batch_size=8, shuffle=(sampler is None), sampler=sampler)
            for x, y in loader:
                x = x.cuda(args.gpu, non_blocking=True)
                y = y.cuda(args.gpu, non_blocking=True)
                loss = criterion(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """

    CODE = "ACC027"
    HINT = "spawn"  # (the text a file needs for this to be looked for at all)
    NAME = "spawn-or-call-launch"
    DESCRIPTION = "A script that spawns its workers or calls one directly keeps its distributed path"

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return False  # it runs before the analysis (:func:`specialise`), not in the one traversal

    @staticmethod
    def specialise(module: cst.Module) -> Optional[Launched]:
        """The module with its launch flags taken as set; None when the file has no such launch or a
        flag cannot be decided everywhere."""
        if not _candidate(module):
            return None  # (the metadata below costs a scope analysis of the whole file: only for a launch's shape)
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        launch = _find_launch(wrapper)
        if launch is None:
            return None
        folder = _Fold(launch)
        result = wrapper.module.visit(folder)
        if folder.undecided or _reads_any(result, launch, folder.kept_setup_reads):
            return None
        if any(any(n is c for c in folder.constants) for n in findall(result, m.Name("True") | m.Name("False"))):
            return None  # a flag folded where no statement could drop it (`x = args.distributed`)
        worker = next((f for f in result.body if isinstance(f, cst.FunctionDef) and f.name.value == launch.worker), None)
        counts = sorted({n.value for n in findall(worker.body, m.Name()) if n.value in launch.nprocs_params}
                        if worker is not None else set())
        return Launched(result, launch.line, launch.worker, counts)


@dataclass
class Launched:
    """What :meth:`SpawnLaunch.specialise` made of a file."""

    module: cst.Module
    line: int  # of the launch (`if args.multiprocessing_distributed:`)
    worker: str
    #: the worker's parameters handed `nprocs` (the GPUs of one machine) that it still reads
    #: (`args.batch_size / ngpus_per_node`): `accelerator.num_processes` once converted, every machine's
    machine_counts: list[str] = field(default_factory=list)

    change = ("the launch is the distributed path: `mp.spawn` starts no process of its own any more, each flag "
              "of it is taken as set")

    def notes(self, path: str) -> list[Finding]:
        """ACC143 for each count of one machine's GPUs that the worker still reads."""
        return [Finding(
            path, self.line, 1, "ACC143",
            f"`{count}`, which `{self.worker}` read as the GPUs of one machine (what `mp.spawn` started there), "
            "is now `accelerator.num_processes`, the processes of the whole run: the same on one machine; on "
            f"several, what it divides (a batch of one machine) is divided by all of them.",
            "on several machines, divide by the processes of one machine "
            "(`accelerator.num_processes // <machines>`) to keep the original's per-machine batch",
        ) for count in self.machine_counts]


@dataclass
class _Launch:
    statement: cst.If  # `if args.multiprocessing_distributed: ... mp.spawn(...) else: main_worker(...)`
    args: str  # the parsed arguments' name in the flag tests (`args`)
    flags: set[str] = field(default_factory=set)  # attributes taken as True
    #: the attribute the worker binds its spawned GPU to (`args.gpu = gpu`): never None
    gpu: Optional[str] = None
    #: attributes the process group was given (`rank=args.rank`): their assignments go
    setup_attrs: set[str] = field(default_factory=set)
    rank_attr: Optional[str] = None  # the one given as `rank=`
    worker: str = ""  # the spawned function, and its first parameter (the GPU spawn hands it)
    rank_param: str = ""
    nprocs_params: set[str] = field(default_factory=set)  # the worker's parameters handed `nprocs`
    launcher: str = ""  # the function the launch is in: there `args.gpu` is still the option
    #: how the file names `torch.distributed` (`dist`): a rank read after the set-up is `dist.get_rank()`
    dist_module: Optional[str] = None
    #: attribute -> `init_process_group` keyword it is handed as (`world_size`, `rank`)
    setup_keywords: dict[str, str] = field(default_factory=dict)
    inits: set[int] = field(default_factory=set)  # ids of the `init_process_group(...)` calls
    line: int = 0


def _candidate(module: cst.Module) -> bool:
    """Syntax only: an ``if`` whose body calls something named ``spawn`` and that has an ``else:``."""
    spawn = m.Call(func=m.Name("spawn") | m.Attribute(attr=m.Name("spawn")))
    return any(isinstance(node.orelse, cst.Else) and findall(node.body, spawn)  # type: ignore[attr-defined]
               for node in findall(module, m.If()))



def _find_launch(wrapper: MetadataWrapper) -> Optional[_Launch]:
    module = wrapper.module
    spawns = [c for c in findall(module, m.Call()) if _spawns(wrapper, c)]
    if len(spawns) != 1:
        return None
    parents = wrapper.resolve(ParentNodeProvider)
    call = spawns[0]
    worker = call.args[0].value if call.args and call.args[0].keyword is None else None
    if not isinstance(worker, cst.Name):
        return None
    line = parents.get(parents.get(call))
    block = parents.get(line)
    statement = parents.get(block)
    if not isinstance(statement, cst.If) or not isinstance(statement.orelse, cst.Else):
        return None
    other = statement.orelse.body.body
    if len(other) != 1 or not m.matches(
        other[0], m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Name(worker.value)))])
    ):
        return None
    flag = name_attribute(statement.test)
    if flag is None:
        return None
    launch = _Launch(statement, flag[0], {flag[1]})
    outer = parents.get(statement)
    while outer is not None and not isinstance(outer, cst.FunctionDef):
        outer = parents.get(outer)
    launch.launcher = outer.name.value if isinstance(outer, cst.FunctionDef) else ""
    functions = {f.name.value: f for f in module.body if isinstance(f, cst.FunctionDef)}
    func = functions.get(worker.value)
    if func is None or not func.params.params:
        return None
    rank = func.params.params[0].name.value
    launch.worker, launch.rank_param = worker.value, rank
    nprocs = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "nprocs"), None)
    handed = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "args"), None)
    if nprocs is not None and isinstance(handed, cst.Tuple):
        for param, value in zip(func.params.params[1:], handed.elements):
            if m.matches(value.value, m.Name()) and m.matches(nprocs, m.Name(value.value.value)):  # type: ignore[attr-defined]
                launch.nprocs_params.add(param.name.value)
    for assign in findall(module, m.Assign()):
        target = name_attribute(assign.targets[0].target) if len(assign.targets) == 1 else None
        if target is None or target[0] != launch.args:
            continue
        if any(name_attribute(a) == (launch.args, flag[1]) for a in findall(assign.value, m.Attribute())):
            launch.flags.add(target[1])  # args.distributed = args.world_size > 1 or args.multiprocessing_distributed
        if m.matches(assign.value, m.Name(rank)) and any(assign is a for a in findall(func, m.Assign())):
            launch.gpu = target[1]  # args.gpu = gpu
    for init in findall(module, m.Call()):
        if not wrapper_qualified_names(wrapper, init.func) & INIT:
            continue
        launch.inits.add(id(init))
        for arg in init.args:
            named = name_attribute(arg.value)
            if arg.keyword is not None and arg.keyword.value in _SETUP_KEYWORDS and named and named[0] == launch.args:
                launch.setup_attrs.add(named[1])
                launch.setup_keywords[named[1]] = arg.keyword.value
                if arg.keyword.value == "rank":
                    launch.rank_attr = named[1]
    launch.line = wrapper.resolve(cst.metadata.PositionProvider)[statement].start.line
    for imp in findall(module, m.Import()):
        for alias in imp.names:  # type: ignore[attr-defined]
            if cst.Module([]).code_for_node(alias.name) == "torch.distributed":
                launch.dist_module = alias.asname.name.value if alias.asname else "torch.distributed"
    return launch



def _spawns(wrapper: MetadataWrapper, call: cst.Call) -> bool:
    return bool(wrapper_qualified_names(wrapper, call.func) & SPAWN)


class _Fold(cst.CSTTransformer):
    """Flags -> True, then the tests, branches and assignments they decide."""

    def __init__(self, launch: _Launch) -> None:
        super().__init__()
        self.launch = launch
        self.constants: list[cst.Name] = []
        self.undecided = False
        #: reads of the set-up attributes inside init_process_group (their nodes kept alive: an id is unique
        #: only while its node lives)
        self.kept_setup_reads: dict[int, cst.Attribute] = {}
        self._in_init = 0
        self._functions: list[str] = []
        self._elifs: set[int] = set()
        self._stores: set[int] = set()  # ids of assignment targets: bound, not read

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._functions.pop()
        return updated_node

    # ------------------------------------------------------------------ values
    def _constant(self, value: bool) -> cst.Name:
        name = cst.Name("True" if value else "False")
        self.constants.append(name)
        return name

    def _value(self, node: cst.BaseExpression) -> Optional[bool]:
        if isinstance(node, cst.Name) and any(node is c for c in self.constants):
            return node.value == "True"
        return None

    def visit_Call(self, node: cst.Call) -> None:
        if id(node) in self.launch.inits:
            self._in_init += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.launch.inits:
            self._in_init -= 1
        return updated_node

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._stores.add(id(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._stores.add(id(node.target))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        named = name_attribute(original_node)
        if named is None or named[0] != self.launch.args or id(original_node) in self._stores:
            return updated_node
        if named[1] in self.launch.flags:
            return self._constant(True)
        if named[1] in self.launch.setup_attrs and self._in_init:
            self.kept_setup_reads[id(updated_node)] = updated_node
        elif named[1] in self.launch.setup_attrs and self.launch.dist_module and self._functions and (
            self._functions[0] != self.launch.launcher
        ):  # read once the process group exists: what it was given
            query = "get_rank" if self.launch.setup_keywords[named[1]] == "rank" else "get_world_size"
            return cst.parse_expression(f"{self.launch.dist_module}.{query}()")
        return updated_node

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        local = self._local_rank_zero(original_node)
        if local is not None:
            return local
        named = name_attribute(original_node.left)
        if named is None or named != (self.launch.args, self.launch.gpu) or len(original_node.comparisons) != 1:
            return updated_node
        if not self._functions or self._functions[0] == self.launch.launcher:
            return updated_node  # before the worker binds it, `args.gpu` is the option (`--gpu`)
        target = original_node.comparisons[0]
        if not m.matches(target.comparator, m.Name("None")):
            return updated_node
        if isinstance(target.operator, cst.IsNot):
            return self._constant(True)
        if isinstance(target.operator, cst.Is):
            return self._constant(False)
        return updated_node

    def _local_rank_zero(self, node: cst.Comparison) -> Optional[cst.Comparison]:
        """``args.rank % ngpus_per_node == 0`` in the worker: the rank is ``node * ngpus_per_node + gpu``,
        so this is ``gpu == 0`` (the first process of its machine)."""
        launch = self.launch
        if not self._functions or self._functions[-1] != launch.worker or launch.rank_attr is None or (
            not launch.nprocs_params
        ):
            return None
        if not m.matches(node, m.Comparison(
            left=m.BinaryOperation(operator=m.Modulo(), right=m.OneOf(*(m.Name(n) for n in launch.nprocs_params))),
            comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.Integer("0"))],
        )):
            return None
        if name_attribute(node.left.left) != (launch.args, launch.rank_attr):  # type: ignore[attr-defined]
            return None
        return node.with_changes(left=cst.Name(launch.rank_param))

    def leave_UnaryOperation(self, original_node: cst.UnaryOperation,
                             updated_node: cst.UnaryOperation) -> cst.BaseExpression:
        value = self._value(updated_node.expression)
        if isinstance(updated_node.operator, cst.Not) and value is not None:
            return self._constant(not value)
        return updated_node

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation,
                               updated_node: cst.BooleanOperation) -> cst.BaseExpression:
        left, right = self._value(updated_node.left), self._value(updated_node.right)
        is_and = isinstance(updated_node.operator, cst.And)
        if left is not None:
            if left is is_and:  # True and x, False or x
                return updated_node.right if right is None else self._constant(right)
            return self._constant(left)
        if right is not None and right is not is_and:  # x or True -> True (x is a read: no side effect kept)
            return updated_node  # (left undecided: keep as written)
        if right is not None:  # x and True -> x
            return updated_node.left
        return updated_node

    # ------------------------------------------------------------------ statements
    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[
        cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement], cst.RemovalSentinel
    ]:
        if original_node is self.launch.statement:
            return self._keep(updated_node.body, updated_node)
        while isinstance(updated_node.orelse, cst.If):  # `elif` (decided here: its parent slot takes no list)
            elif_value = self._value(updated_node.orelse.test)
            if elif_value is True:
                updated_node = updated_node.with_changes(orelse=cst.Else(body=updated_node.orelse.body))
            elif elif_value is False:
                updated_node = updated_node.with_changes(orelse=updated_node.orelse.orelse)
            else:
                break
        if id(original_node) in self._elifs:
            return updated_node
        value = self._value(updated_node.test)
        if value is True:
            return self._keep(updated_node.body, updated_node)
        if value is False:
            if updated_node.orelse is None:
                return cst.RemovalSentinel.REMOVE
            if isinstance(updated_node.orelse, cst.Else):
                return self._keep(updated_node.orelse.body, updated_node)
            return updated_node.orelse.with_changes(leading_lines=updated_node.leading_lines)  # elif -> if
        if isinstance(updated_node.body, cst.IndentedBlock) and not updated_node.body.body:
            if updated_node.orelse is None and not _has_call(original_node.test):
                return cst.RemovalSentinel.REMOVE  # `if args.dist_url == "env://": args.rank = ...` emptied
            self.undecided = True
        return updated_node

    def _keep(self, block: cst.BaseSuite, statement: cst.If) -> Union[cst.FlattenSentinel, cst.RemovalSentinel]:
        body = list(block.body) if isinstance(block, cst.IndentedBlock) else []
        if not body:
            return cst.RemovalSentinel.REMOVE
        body[0] = body[0].with_changes(leading_lines=[*statement.leading_lines, *body[0].leading_lines])
        return cst.FlattenSentinel(body)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        value = self._value(updated_node.test)
        if value is None:
            return updated_node
        return updated_node.body if value else updated_node.orelse

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> Union[cst.BaseStatement, cst.RemovalSentinel]:
        kept = [s for s in updated_node.body if not self._goes(s)]
        if len(kept) == len(updated_node.body):
            return updated_node
        if not kept:
            return cst.RemovalSentinel.REMOVE
        return updated_node.with_changes(body=kept)

    def _goes(self, small: cst.BaseSmallStatement) -> bool:
        """``args.distributed = ...``, ``args.rank = ...``, ``args.world_size = ...``."""
        if not isinstance(small, (cst.Assign, cst.AugAssign)):
            return False
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        names = [name_attribute(t) for t in targets]
        gone = self.launch.setup_attrs | self.launch.flags
        return all(n is not None and n[0] == self.launch.args and n[1] in gone for n in names)


def _has_call(node: cst.CSTNode) -> bool:
    return bool(findall(node, m.Call()))


def _reads_any(module: cst.Module, launch: _Launch, allowed: dict[int, cst.Attribute]) -> bool:
    """Reads of the flags or the set-up attributes left (outside ``init_process_group``): undecided."""
    attrs = launch.flags | launch.setup_attrs
    return any(name_attribute(n) in {(launch.args, a) for a in attrs} and id(n) not in allowed
               for n in findall(module, m.Attribute()))
