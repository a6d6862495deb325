"""ACC028: the world size and rank a script counted for its process group are the launcher's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from accelify.analyses.distributed import INIT, SPAWN, dead_setup
from accelify.analyses.plan import Plan
from accelify.queries.names import name_attribute, wrapper_qualified_names
from accelify.queries.records import Finding
from accelify.queries.walk import findall

from .base import AccelifyCodemod

#: ``init_process_group`` keyword -> what a read of the attribute it is handed becomes once the group exists
_QUERIES = {"world_size": "get_world_size", "rank": "get_rank"}

#: what the value of a dropped assignment may call: reads of the environment and arithmetic, no effect
_PURE_CALLS = frozenset({"int", "str", "float", "len", "os.getenv", "os.environ.get", "torch.cuda.device_count"})


class ProcessGroupAttributes(AccelifyCodemod):
    """The world size and rank a script counts for ``init_process_group`` are read from the process group.

    Barlow Twins, the "distributed tutorial" and many scripts after them count the processes
    themselves (``args.world_size = args.gpus * args.nodes``, ``args.rank += gpu``), hand the counts
    to ``init_process_group(world_size=args.world_size, rank=args.rank)`` and read them again:
    ``args.batch_size // args.world_size``, ``DistributedSampler(num_replicas=args.world_size)``,
    ``if args.rank == 0:``. Under ``accelerate launch`` the processes are the launcher's, so the
    counting goes and each read after the process group exists asks the group
    (``dist.get_world_size()``, ``dist.get_rank()``), which ACC018 then turns into
    ``accelerator.num_processes`` / ``accelerator.is_main_process``: the same numbers on the
    original's launch, and 1 and 0 in one process.

    This runs before the analysis, on the file as written (after ACC027). A read where the process
    group may not exist yet (in the function that spawns the workers, above ``init_process_group``,
    at module level), or a count that cannot be dropped alone (``args.rank, args.gpu = ...``, a value
    that calls something), leaves the file as it is, and the analysis says why.

    Before::

        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def main(args):
            args.world_size = args.gpus * args.nodes
            mp.spawn(train, nprocs=args.gpus, args=(args,))


        def train(gpu, args):
            args.rank = args.nr * args.gpus + gpu
            dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
            model = torch.nn.Linear(4, 2).cuda(gpu)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(args.steps // args.world_size):
                loss = model(torch.randn(8, 4).cuda(gpu)).sum()
                loss.backward()
                optimizer.step()
            if args.rank == 0:
                torch.save(model.state_dict(), "model.pt")

    After::

        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def main(args):
            mp.spawn(train, nprocs=args.gpus, args=(args,))


        def train(gpu, args):
            dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
            model = torch.nn.Linear(4, 2).cuda(gpu)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(args.steps // dist.get_world_size()):
                loss = model(torch.randn(8, 4).cuda(gpu)).sum()
                loss.backward()
                optimizer.step()
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), "model.pt")
    """

    CODE = "ACC028"
    HINT = "init_process_group"  # (the text a file needs for this to be looked for at all)
    NAME = "process-group-attributes"
    DESCRIPTION = "The world size and rank a script counts for its process group are read from the group"

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return False  # it runs before the analysis (:func:`specialise`), not in the one traversal

    @staticmethod
    def specialise(module: cst.Module) -> Optional[Counted]:
        """The module with its counted attributes dropped and read from the group; None when there are
        none or one of them cannot be."""
        if not _candidate(module):
            return None
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = _find(wrapper)
        if found is None:
            return None
        folder = _Replace(found)
        result = wrapper.module.visit(folder)
        return Counted(result, found.line, sorted(found.spellings))


@dataclass
class Counted:
    """What :meth:`ProcessGroupAttributes.specialise` made of a file."""

    module: cst.Module
    line: int  # of the first `init_process_group` handed a counted attribute
    attributes: list[str]  # `args.world_size`, ...

    @property
    def change(self) -> str:
        counted = ", ".join(f"`{a}`" for a in self.attributes)
        return (f"{counted}, counted by the script for its process group, is read from the group: under "
                "`accelerate launch` the processes are the launcher's")

    def notes(self, path: str) -> list[Finding]:
        return []


@dataclass
class _Found:
    args: str  # `args`
    attrs: dict[str, str]  # attribute -> the keyword it is handed as (`world_size`, `rank`)
    dist: str  # how the file spells torch.distributed (`dist`, `torch.distributed`)
    reads: dict[int, str]  # id of a read that asks the group -> the keyword its value was handed as
    drops: set[int]  # ids of the small statements that count
    line: int
    spellings: list[str]  # `args.world_size`, `rank`


def _candidate(module: cst.Module) -> bool:
    """Syntax only: an ``init_process_group(...)`` handed an attribute as ``world_size=`` or ``rank=``."""
    return bool(findall(module, m.Call(
        func=m.Name("init_process_group") | m.Attribute(attr=m.Name("init_process_group")),
        args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("world_size") | m.Name("rank"), value=m.Attribute(value=m.Name())),
              m.ZeroOrMore()],
    )))




def _dist_spelling(module: cst.Module) -> Optional[str]:
    """``dist`` for ``import torch.distributed as dist``, ``torch.distributed`` after ``import torch``."""
    spelled = None
    for statement in findall(module, m.Import() | m.ImportFrom()):
        if isinstance(statement, cst.Import):
            for alias in statement.names:
                name = cst.Module([]).code_for_node(alias.name)
                if name == "torch.distributed" and alias.asname is not None:
                    return alias.asname.name.value  # type: ignore[attr-defined]
                if name in ("torch", "torch.distributed") and alias.asname is None:
                    spelled = "torch.distributed"
        elif m.matches(statement.module, m.Name("torch")) and not isinstance(statement.names, cst.ImportStar):
            for alias in statement.names:
                if alias.name.value == "distributed":  # type: ignore[union-attr]
                    return alias.asname.name.value if alias.asname else "distributed"  # type: ignore[attr-defined]
    return spelled


def _find(wrapper: MetadataWrapper) -> Optional[_Found]:
    module = wrapper.module
    parents = wrapper.resolve(ParentNodeProvider)
    positions = wrapper.resolve(PositionProvider)
    spelled = _dist_spelling(module)
    inits = [c for c in findall(module, m.Call()) if wrapper_qualified_names(wrapper, c.func) & INIT]
    if spelled is None or not inits:
        return None

    def function_of(node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        current = parents.get(node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = parents.get(current)
        return current

    def within(node: cst.CSTNode, ancestor_ids: set[int]) -> bool:
        current: Optional[cst.CSTNode] = node
        while current is not None:
            if id(current) in ancestor_ids:
                return True
            current = parents.get(current)
        return False

    # what is counted: `args.world_size` anywhere (an attribute of one object), or a local `rank` of the
    # function that sets the group up; each with the keyword it is handed as
    attrs: dict[str, str] = {}
    names: dict[tuple[int, str], str] = {}
    args_name = None
    for init in inits:
        for arg in init.args:
            if arg.keyword is None or arg.keyword.value not in _QUERIES:
                continue
            named, keyword = name_attribute(arg.value), arg.keyword.value
            function = function_of(init)
            if isinstance(arg.value, cst.Name) and function is not None:
                if arg.value.value in {p.name.value for p in function.params.params}:
                    continue  # a parameter (spawn's rank): the analysis knows it
                key = (id(function), arg.value.value)
                if names.get(key, keyword) != keyword:
                    return None
                names[key] = keyword
                continue
            if named is None:
                continue
            if args_name not in (None, named[0]) or attrs.get(named[1], keyword) != keyword:
                return None
            args_name = named[0]
            attrs[named[1]] = keyword
    if not attrs and not names:
        return None

    def counted(node: cst.CSTNode) -> Optional[str]:
        """The keyword the value ``node`` names was handed as, or None."""
        if isinstance(node, cst.Attribute) and name_attribute(node) is not None and name_attribute(node)[0] == args_name:
            return attrs.get(node.attr.value)
        if isinstance(node, cst.Name):
            function = function_of(node)
            return names.get((id(function), node.value)) if function is not None else None
        return None

    init_ids = {id(c) for c in inits}
    spawning = {id(f) for f in (function_of(c) for c in findall(module, m.Call()) if wrapper_qualified_names(wrapper, c.func) & SPAWN)
                if f is not None}
    init_lines: dict[int, int] = {}  # function -> line of its first init_process_group
    for init in inits:
        function = function_of(init)
        if function is not None:
            line = positions[init].start.line
            init_lines[id(function)] = min(line, init_lines.get(id(function), line))
    found = _Found(args_name or "", attrs, spelled, {}, set(), positions[inits[0]].start.line, [])
    stores: set[int] = set()
    counting: list[cst.CSTNode] = []  # the counting statements, for the set-up's report (:func:`_setup_report`)
    for small in findall(module, m.Assign() | m.AugAssign()):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        elements = [e for t in targets for e in ([x.value for x in t.elements] if isinstance(t, (cst.Tuple, cst.List))
                                                 else [t])]
        hits = [e for e in elements if counted(e) is not None]
        if not hits:
            continue
        if len(hits) != len(elements) or not _pure(wrapper, small.value):
            return None  # `args.rank, args.gpu = ...`: one of them stays; a value that does something
        stores.update(id(e) for e in hits)
        found.drops.add(id(small))
        counting.append(small)
    for node in findall(module, m.Attribute() | m.Name()):
        keyword = counted(node) if id(node) not in stores else None
        if keyword is None or within(node, init_ids) or within(node, found.drops):
            continue  # not counted; handed to the set-up, or counting: both go
        if isinstance(parents.get(node), (cst.Attribute, cst.Param, cst.Arg)) and not (
            isinstance(parents.get(node), cst.Arg) and parents.get(node).value is node  # type: ignore[union-attr]
        ):
            continue  # `x.rank`, a parameter, a keyword's name: another thing
        if isinstance(parents.get(node), cst.Attribute) and parents.get(node).value is not node:  # type: ignore[union-attr]
            continue
        function = function_of(node)
        if function is None or id(function) in spawning:
            return None  # the group may not exist there
        if id(function) in init_lines and positions[node].start.line <= init_lines[id(function)]:
            if dead_setup(function, module, lambda node: wrapper_qualified_names(wrapper, node)):
                continue  # a set-up function nothing calls or names (pasted with its module): it never runs
            report = _setup_report(node, parents)
            if report is None or not any(
                    function_of(d) is function and positions[d].start.line < positions[node].start.line
                    and _assigns(d, node) for d in counting):
                return None  # read above the set-up (not the report of what this function just counted)
            found.drops.add(id(report))  # `print('| distributed init (rank {})'.format(args.rank))`: goes with it
            continue
        found.reads[id(node)] = keyword
        spelled_as = f"{args_name}.{node.attr.value}" if isinstance(node, cst.Attribute) else node.value
        if spelled_as not in found.spellings:
            found.spellings.append(spelled_as)
    if not found.reads and not found.drops:
        return None
    return found


def _assigns(small: cst.CSTNode, read: cst.CSTNode) -> bool:
    """Does the counting statement ``small`` bind what ``read`` reads (``args.rank = rank``, ``args.rank``)?"""
    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]  # type: ignore[attr-defined]
    code = cst.Module([]).code_for_node
    return any(code(t) == code(read) for t in targets)


def _setup_report(node: cst.CSTNode, parents) -> Optional[cst.Expr]:
    """``print(...)`` alone on its line around ``node`` (the torchvision references' ``print('| distributed init
    (rank {}): {}'.format(args.rank, args.dist_url), flush=True)`` before ``init_process_group``): the report of
    the set-up, which goes with it when the function counted what it reads just before (``args.rank = rank``:
    the launcher's processes are set up by Accelerate)."""
    current = parents.get(node)
    while current is not None and not isinstance(current, cst.SimpleStatementLine):
        current = parents.get(current)
    if current is None or len(current.body) != 1:
        return None
    small = current.body[0]
    return small if m.matches(small, m.Expr(m.Call(func=m.Name("print")))) else None  # type: ignore[return-value]


def _pure(wrapper: MetadataWrapper, value: cst.BaseExpression) -> bool:
    for call in findall(value, m.Call()):
        names = {n.removeprefix("builtins.") for n in wrapper_qualified_names(wrapper, call.func)}
        if not names & _PURE_CALLS:
            return False
    return True


class _Replace(cst.CSTTransformer):
    """The counting statements go (an emptied block keeps a ``pass``, an emptied plain ``if`` goes);
    each read asks the group."""

    def __init__(self, found: _Found) -> None:
        super().__init__()
        self.found = found
        self._passes: list[cst.SimpleStatementLine] = []
        #: the statements all of whose parts were dropped (kept alive here: an id is unique only while its node lives)
        self._gone: dict[int, cst.SimpleStatementLine] = {}

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._read(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._read(original_node, updated_node)

    def _read(self, original_node: cst.BaseExpression, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        keyword = self.found.reads.get(id(original_node))
        if keyword is None:
            return updated_node
        return cst.parse_expression(f"{self.found.dist}.{_QUERIES[keyword]}()")

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        kept = [s for o, s in zip(original_node.body, updated_node.body) if id(o) not in self.found.drops]
        if len(kept) == len(updated_node.body):
            return updated_node
        if not kept:  # dropped by its block, which hands its comment lines on (:meth:`_body`)
            gone = updated_node.with_changes(body=[cst.Pass()])
            self._gone[id(gone)] = gone
            return gone
        return updated_node.with_changes(body=[*kept[:-1], kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])

    def _body(self, body) -> list:
        """The statements of a block but the dropped ones, whose leading lines go to the next one kept."""
        kept, carried = [], []
        for statement in body:
            if id(statement) in self._gone:
                carried.extend(statement.leading_lines)
                continue
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                carried = []
            kept.append(statement)
        return kept

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._body(updated_node.body))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._body(updated_node.body)
        if body:
            return updated_node.with_changes(body=body)
        filler = cst.SimpleStatementLine([cst.Pass()])
        self._passes.append(filler)
        return updated_node.with_changes(body=[filler])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.BaseStatement, cst.RemovalSentinel]:
        body = updated_node.body.body
        emptied = len(body) == 1 and any(body[0] is p for p in self._passes)
        if emptied and updated_node.orelse is None and not findall(original_node.test, m.Call()):
            return cst.RemovalSentinel.REMOVE
        return updated_node
