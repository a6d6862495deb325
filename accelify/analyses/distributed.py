"""Hand-written distributed training: what Accelerate owns once the script is converted, whole or not at all.

A script launched with ``torchrun`` sets up its own process group (``init_process_group``,
``torch.cuda.set_device(local_rank)``), reads its rank from the environment, wraps its model in
``DistributedDataParallel``, shards its data with a ``DistributedSampler`` and synchronises by hand
(``dist.barrier()``, ``dist.all_reduce(t)``).  Under Accelerate the launcher and ``prepare`` do
all of that, so each construct has one fate:

- the plumbing goes: ``init_process_group(...)``, ``torch.cuda.set_device(...)``, the
  ``MASTER_ADDR``/``MASTER_PORT`` environment, and a set-up helper (``ddp_setup()``) left empty
  by that, with its calls; ``destroy_process_group()`` becomes ``accelerator.end_training()``;
- a rank read once into a name (``local_rank = int(os.environ["LOCAL_RANK"])``,
  ``rank = dist.get_rank()``) goes, and each use becomes the Accelerator's: a placement on it
  goes (``.to(local_rank)``), ``rank == 0`` becomes ``accelerator.is_main_process``, anything
  else ``accelerator.process_index`` (``local_process_index``, ``num_processes``);
- the ``DistributedDataParallel`` wrapper goes (ACC006), its behaviour arguments
  (``find_unused_parameters=True``) become ``DistributedDataParallelKwargs`` on the Accelerator;
- a ``DistributedSampler`` goes from its DataLoader (its ``shuffle`` moves to the DataLoader),
  with its ``set_epoch`` calls (its ``drop_last=True`` is refused: in one process it drops nothing,
  the DataLoader's drops the last short batch);
- ``dist.barrier()`` -> ``accelerator.wait_for_everyone()``, ``dist.all_reduce(t, op)`` ->
  ``t = accelerator.reduce(t, reduction=...)``, ``dist.get_rank()``/``get_world_size()`` -> the
  Accelerator's attributes, ``dist.is_initialized()`` -> ``accelerator.use_distributed``;
  ``model.no_sync()`` -> ``accelerator.no_sync(model)`` (the same context on the prepared model).

Anything else distributed (an ``mp.spawn`` accelify cannot follow, ``all_gather``, ``broadcast``,
process subgroups, FSDP, ``require_backward_grad_sync``, a rank spelled another way) refuses the file (ACC126) with a finding that names it:
half a conversion would wrap the model twice or shard the data twice.

Input: the facts (calls, assignments, functions).  Output: ``plan.distributed`` (None for a file
that does not manage its own processes); refusal ACC126.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.accumulation import code_of
from accelify.analyses.facts import Facts
from accelify.analysis import DATALOADERS, Ref, has_qname, inside, qualified_names, ref_of, string_value
from accelify.walk import findall

if TYPE_CHECKING:
    from accelify.plan import Plan

_C10D = "torch.distributed.distributed_c10d."


def _both(name: str) -> frozenset[str]:
    return frozenset({f"torch.distributed.{name}", _C10D + name})


INIT = _both("init_process_group")
DESTROY = _both("destroy_process_group")
BARRIER = _both("barrier")
ALL_REDUCE = _both("all_reduce")
GET_RANK = _both("get_rank")
GET_WORLD_SIZE = _both("get_world_size")
IS_INITIALIZED = _both("is_initialized")
#: queries that need no process group: left as they are
HARMLESS = frozenset({"torch.distributed.is_available", "torch.distributed.ReduceOp", "torch.distributed.Backend"})
SET_DEVICE = frozenset({"torch.cuda.set_device"})
DDP = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
SAMPLERS = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)
SPAWN = frozenset({
    "torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.start_processes",
    "torch.multiprocessing.spawn.start_processes",
})
FSDP = frozenset({
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard",
})
REDUCE_OPS = {"SUM": "sum", "AVG": "mean"}

#: environment variables a launcher sets, and the Accelerator attribute each one is
ENV_RANKS = {"LOCAL_RANK": "local_process_index", "RANK": "process_index", "WORLD_SIZE": "num_processes"}
#: DistributedDataParallel arguments that say where it runs: ``prepare`` decides that
_DDP_PLACEMENT = frozenset({"device_ids", "output_device"})
#: DistributedDataParallel arguments that change what it does: ``DistributedDataParallelKwargs``
_DDP_BEHAVIOUR = frozenset(
    {"find_unused_parameters", "broadcast_buffers", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb"}
)
#: rank attributes and the main-process test ``== 0`` of each
MAIN_TESTS = {"process_index": "is_main_process", "local_process_index": "is_local_main_process"}


@dataclass
class Distributed:
    """What the conversion of a hand-written distributed script does (``plan.distributed``)."""

    #: ids of original statements that go (the process-group plumbing)
    remove: set[int] = field(default_factory=set)
    #: ids of ``destroy_process_group()`` statements: ``accelerator.end_training()``
    end_training: set[int] = field(default_factory=set)
    #: module-level set-up helpers left empty: they go, with the statements that call them
    helpers: set[str] = field(default_factory=set)
    #: module-level helpers that only end the process group (``cleanup()``): they go, and the
    #: statements that call them become ``accelerator.end_training()``
    teardowns: set[str] = field(default_factory=set)
    #: names bound once to a rank or world size -> the Accelerator attribute that replaces each use
    ranks: dict[Ref, str] = field(default_factory=dict)
    #: ids of the assignments of those names (they go)
    rank_assigns: set[int] = field(default_factory=set)
    #: ids of ``DistributedSampler(...)`` calls that go, with the names they are bound to
    samplers: set[int] = field(default_factory=set)
    #: ... -> the ``shuffle`` their DataLoader gets
    sampler_names: dict[Ref, str] = field(default_factory=dict)
    #: ids of all-reduce statements that go because the counts they add up are gathered (ACC011)
    gathered: set[int] = field(default_factory=set)
    #: names given a rank in a script's launched branch and their one-process value in the other
    #: (``ddp_world_size = int(os.environ["WORLD_SIZE"])`` / ``ddp_world_size = 1``): kept, the
    #: first assignment's value becomes the Accelerator's (ids of those assignments -> attribute)
    kept: dict[Ref, str] = field(default_factory=dict)
    kept_assigns: dict[int, str] = field(default_factory=dict)
    #: flags true on the main process only (``master_process = ddp_rank == 0`` / ``= True`` in the
    #: single-process branch): tests on them are main-process checks
    main_flags: dict[Ref, str] = field(default_factory=dict)
    #: parameters and ``self`` attributes handed a rank at every call site (``Trainer(..., rank)``'s
    #: ``gpu_id``): left as they are (they hold the Accelerator's value), but placements on them go
    passed: dict[Ref, str] = field(default_factory=dict)
    #: the parsed arguments (``args = parser.parse_args()``) whose ``.local_rank`` (``--local_rank``,
    #: passed by ``torch.distributed.launch``) is the local rank: each read becomes the Accelerator's
    arg_ranks: set[Ref] = field(default_factory=set)
    #: the "rank 0 first" barrier pairs (``if local_rank != 0: barrier()`` ... ``if local_rank == 0:
    #: barrier()``): ids of the two ``if`` statements; what is between runs under ``main_process_first()``
    first: list[tuple[int, int]] = field(default_factory=list)
    #: ``mp.spawn(worker, args=(...), nprocs=n)``: id of the statement, the worker, and the worker's
    #: parameters that go (the rank spawn passes first, a world size equal to ``nprocs``)
    spawn: Optional[tuple[int, str, list[str]]] = None
    #: ``DistributedDataParallelKwargs`` arguments, in the order written
    ddp_kwargs: list[str] = field(default_factory=list)


def rank_attribute(visitor: cst.MetadataDependent, expr: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """The Accelerator attribute ``expr`` stands for: a rank name, or ``dist.get_rank()``; None if none."""
    if plan.distributed is None:
        return None
    if isinstance(expr, (cst.Name, cst.Attribute)):
        ref = ref_of(visitor, expr)
        if ref is not None and ref in plan.distributed.ranks:
            return plan.distributed.ranks[ref]
        if ref is not None and ref in plan.distributed.passed:
            return plan.distributed.passed[ref]
        if ref is not None and ref in plan.distributed.kept:
            return plan.distributed.kept[ref]
        if is_arg_rank(visitor, expr, plan.distributed):
            return "local_process_index"
    if isinstance(expr, cst.Call) and not expr.args:
        if has_qname(visitor, expr.func, GET_RANK):
            return "process_index"
        if has_qname(visitor, expr.func, GET_WORLD_SIZE):
            return "num_processes"
    return None


def is_arg_rank(visitor: cst.MetadataDependent, expr: cst.BaseExpression, dist: Distributed) -> bool:
    """``args.local_rank`` of arguments parsed with a ``--local_rank`` option."""
    return (isinstance(expr, cst.Attribute) and expr.attr.value == "local_rank"
            and ref_of(visitor, expr.value) in dist.arg_ranks)


def not_main_process_test(visitor: cst.MetadataDependent, test: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """``rank != 0``, ``local_rank > 0``, ``args.local_rank not in [-1, 0]``, ``not rank == 0``: the
    main-process attribute it negates, or None."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return main_process_test(visitor, test.expression, plan)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    operator = target.operator
    if isinstance(operator, (cst.NotEqual, cst.GreaterThan)) and _is_zero(target.comparator):
        equal = test.with_changes(comparisons=[target.with_changes(operator=cst.Equal())])
        return main_process_test(visitor, equal, plan)
    if isinstance(operator, cst.NotIn):
        return main_process_test(visitor, test.with_changes(comparisons=[target.with_changes(operator=cst.In())]), plan)
    return None


def main_process_test(visitor: cst.MetadataDependent, test: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """``rank == 0``, ``0 == local_rank``, ``args.local_rank in [-1, 0]``, ``not distributed or rank
    == 0``: ``is_main_process`` or ``is_local_main_process``; None when ``test`` is not such a test."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or) and isinstance(
        test.left, cst.UnaryOperation
    ) and isinstance(test.left.operator, cst.Not) and rank_attribute(visitor, test.left.expression, plan) == (
        "use_distributed"
    ):
        return main_process_test(visitor, test.right, plan)  # one process without a launcher: the main one
    if isinstance(test, (cst.Name, cst.Attribute)) and plan.distributed is not None:
        return plan.distributed.main_flags.get(ref_of(visitor, test))  # type: ignore[arg-type]
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    left, right = test.left, target.comparator
    if isinstance(target.operator, cst.Equal):
        if _is_zero(left):
            left, right = right, left
        if not _is_zero(right):
            return None
    elif isinstance(target.operator, cst.In):
        # `local_rank in [-1, 0]`: -1 is the "not distributed" value of a rank a launcher never sets
        if not isinstance(right, (cst.List, cst.Tuple, cst.Set)):
            return None
        values = {code_of(e.value).replace(" ", "") for e in right.elements}
        if "0" not in values or not values <= {"0", "-1"}:
            return None
    else:
        return None
    return MAIN_TESTS.get(rank_attribute(visitor, left, plan) or "")


def _is_zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Integer) and expr.value == "0"


def decide(facts: Facts, plan: Plan) -> bool:
    """Recognise a script that manages its own processes: ``plan.distributed``; False (ACC126) when
    something in it is not understood, with a finding that names it."""
    if not any(_is_distributed(facts, call) for call in facts.calls):
        return True
    dist = Distributed()
    plan.distributed = dist
    why = _recognise(facts, plan, dist)
    if why is None:
        return True
    node, message, suggestion = why
    facts.finding(plan, node, "ACC126", f"{message}; file not converted (half a conversion would wrap the model "
                  "or shard the data twice).", suggestion)
    plan.distributed = None
    return False


Why = tuple[cst.CSTNode, str, str]


def _is_distributed(facts: Facts, call: cst.Call) -> bool:
    names = qualified_names(facts, call.func)
    return any(n.startswith("torch.distributed.") or n in SPAWN or n in DDP or n in SAMPLERS for n in names)


def _recognise(facts: Facts, plan: Plan, dist: Distributed) -> Optional[Why]:
    handled: set[int] = set()  # ids of calls accounted for
    env_reads = _env_rank_reads(facts)
    # ranks first: the rest asks whether an argument is one
    for ref, assigns in facts.assigns.items():
        kinds = {_rank_source(facts, a.value, env_reads) for a in assigns if facts.single_target(a) == ref}
        if not kinds or kinds == {None}:
            continue
        if len(kinds) != 1 or len(assigns) != 1 or None in kinds:
            kept = _kept_rank(facts, ref, assigns, env_reads)
            if kept is None:
                return (assigns[0], f"`{ref[1]}` holds a rank but is bound more than once, or to other values too",
                        "read the rank once, or use `accelerator.process_index` by hand")
            dist.kept[ref] = kept[0]
            dist.kept_assigns[id(kept[1])] = kept[0]
            handled.update(id(c) for c in findall(kept[1].value, m.Call()))
            continue
        kind = kinds.pop()
        if kind.startswith("?"):
            return (assigns[0], kind[1:], "a script with a single-process path too is not converted yet: keep the "
                    "distributed path only (under `accelerate launch` it also runs as one process), reading the rank "
                    "as `int(os.environ[\"LOCAL_RANK\"])`, or use `accelerator.process_index`")
        dist.ranks[ref] = kind  # type: ignore[assignment]
        dist.rank_assigns.add(id(assigns[0]))
        handled.update(id(c) for c in findall(assigns[0].value, m.Call()))
    why = _arg_ranks(facts, plan, dist)
    if why is not None:
        return why
    spawns = [c for c in facts.calls if qualified_names(facts, c.func) & SPAWN]
    for call in spawns + [c for c in facts.calls if c not in spawns]:  # the spawned worker's ranks first
        if id(call) in handled:
            continue
        names = qualified_names(facts, call.func)
        why = _call(facts, plan, dist, call, names, handled)
        if why is not None:
            return why
    for read in env_reads:
        target = facts.get_metadata(ParentNodeProvider, read, None)
        assign = facts.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        if isinstance(assign, cst.Assign) and _env_key(facts, read) in ("MASTER_ADDR", "MASTER_PORT"):
            line = facts.get_metadata(ParentNodeProvider, assign, None)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                dist.remove.add(id(line))
                continue
        if not inside(facts, read, dist.remove) and not inside(facts, read, dist.rank_assigns | set(dist.kept_assigns)):
            return (read, f"`{code_of(read)}` is read outside the process-group set-up accelify removes",
                    "use `accelerator.process_index` / `local_process_index` / `num_processes`")
    for node in findall(facts.module, m.Attribute(attr=m.Name("no_sync") | m.Name("require_backward_grad_sync"))):
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if node.attr.value == "no_sync" and isinstance(parent, cst.Call) and parent.func is node and not parent.args:  # type: ignore[attr-defined]
            continue  # `model.no_sync()` -> `accelerator.no_sync(model)` (ACC018)
        if node.attr.value == "require_backward_grad_sync" and isinstance(parent, cst.AssignTarget) and (
            _launch_branches(facts, node) or (None, False)
        )[1]:
            continue  # nanoGPT's `if ddp: model.require_backward_grad_sync = ...`: the prepared DDP wrapper's
        return (node, f"`{code_of(node)}` (gradient synchronisation switched by hand) is not converted yet",
                "use `with accelerator.accumulate(model):` (or `accelerator.no_sync(model)`) by hand")
    helpers = _setup_helpers(facts, dist)
    dist.helpers = helpers
    _propagate(facts, dist)
    _main_flags(facts, plan, dist)
    _first_pairs(facts, plan, dist)
    return None


#: what each rank attribute is in a single process
ONE_PROCESS = {"process_index": "0", "local_process_index": "0", "num_processes": "1"}


def _launch_branches(facts: Facts, node: cst.CSTNode) -> Optional[tuple[cst.If, bool]]:
    """The ``if <launch test>:`` around ``node``, and whether ``node`` is in its launched branch."""
    child: cst.CSTNode = node
    parent = facts.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.If) and child in (parent.body, parent.orelse) and _is_launch_test(facts, parent.test):
            return parent, child is parent.body
        child, parent = parent, facts.get_metadata(ParentNodeProvider, parent, None)
    return None


def _is_launch_test(facts: Facts, test: cst.BaseExpression) -> bool:
    """``if ddp:`` with ``ddp`` a launch test (or the test itself)."""
    env_reads = _env_rank_reads(facts)
    if _launched_test(facts, test, env_reads):
        return True
    values = facts.bound_values(test)
    return len(values) == 1 and _launched_test(facts, values[0], env_reads)


def _kept_rank(facts: Facts, ref: Ref, assigns: list[cst.Assign],
               env_reads: list[cst.BaseExpression]) -> Optional[tuple[str, cst.Assign]]:
    """``ddp_world_size = int(os.environ["WORLD_SIZE"])`` in the launched branch and ``ddp_world_size = 1``
    in the other: (attribute, the launched assignment); None when it is not that shape."""
    sources = [(a, k) for a in assigns if (k := _rank_source(facts, a.value, env_reads)) is not None]
    if len(sources) != 1 or sources[0][1].startswith("?") or sources[0][1] not in ONE_PROCESS:
        return None
    source, kind = sources[0]
    where = _launch_branches(facts, source)
    if where is None or not where[1]:
        return None
    for other in assigns:
        if other is source:
            continue
        if facts.single_target(other) != ref or code_of(other.value) != ONE_PROCESS[kind]:
            return None
        branch = _launch_branches(facts, other)
        if branch is None or branch[0] is not where[0] or branch[1]:
            return None
    return kind, source


def _main_flags(facts: Facts, plan: Plan, dist: Distributed) -> None:
    """``master_process = ddp_rank == 0`` in the launched branch, ``master_process = True`` in the other."""
    for ref, assigns in facts.assigns.items():
        tests = [main_process_test(facts, a.value, plan) for a in assigns]
        found = [t for t in tests if t is not None]
        if len(set(found)) != 1 or any(facts.single_target(a) != ref for a in assigns):
            continue
        ok = True
        for assign, test in zip(assigns, tests):
            branch = _launch_branches(facts, assign)
            if test is not None:
                ok &= branch is not None and branch[1]
            else:
                ok &= code_of(assign.value) == "True" and branch is not None and not branch[1]
        if ok:
            dist.main_flags[ref] = found[0]


def _arg_ranks(facts: Facts, plan: Plan, dist: Distributed) -> Optional[Why]:
    """``parser.add_argument("--local_rank", ...)`` and ``args = parser.parse_args()``: ``args.local_rank``
    is the local rank, where it is read as one (a placement, ``== 0``, ``!= 0``, ``in [-1, 0]``, a value)."""
    options = [c for c in facts.calls if m.matches(c.func, m.Attribute(attr=m.Name("add_argument")))
               and c.args and string_value(c.args[0].value) in ("--local_rank", "--local-rank")]
    if not options:
        return None
    for ref, assigns in facts.assigns.items():
        if any(m.matches(a.value, m.Call(func=m.Attribute(attr=m.Name("parse_args")))) for a in assigns):
            dist.arg_ranks.add(ref)
    usage = "read the local rank only as a rank (`== 0`, `in [-1, 0]`, a device), or use `accelerator.local_process_index`"
    for node in findall(facts.module, m.Attribute(attr=m.Name("local_rank"))):
        if not is_arg_rank(facts, node, dist):  # type: ignore[arg-type]
            continue
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
            isinstance(parent, cst.Assign) and node is not parent.value
        ):
            return node, f"`{code_of(node)}` is set by the script itself", usage
        if isinstance(parent, cst.Comparison) and main_process_test(facts, parent, plan) is None and (
            not_main_process_test(facts, parent, plan) is None
        ):
            return parent, f"`{code_of(parent)}` tests for a run without a launcher (a single-process path too)", usage
    return None


def _first_pairs(facts: Facts, plan: Plan, dist: Distributed) -> None:
    """``if rank != 0: barrier()`` ... ``if rank == 0: barrier()`` in one block: ``dist.first``."""
    for block in findall(facts.module, m.IndentedBlock() | m.Module()):
        body = list(block.body)  # type: ignore[attr-defined]
        for i, stmt in enumerate(body):
            wait = _barrier_if(facts, plan, stmt, negated=True)
            if wait is None:
                continue
            for j in range(i + 1, len(body)):
                if _barrier_if(facts, plan, body[j], negated=False) == wait:
                    if not any(findall(s, m.Call()) and any(has_qname(facts, c.func, BARRIER)
                               for c in findall(s, m.Call())) for s in body[i + 1:j]):
                        dist.first.append((id(stmt), id(body[j])))
                    break


def _barrier_if(facts: Facts, plan: Plan, stmt: cst.BaseStatement, negated: bool) -> Optional[str]:
    """``if <rank test>: dist.barrier()`` (nothing else, no else): the main-process attribute tested."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return None
    if len(stmt.body.body) != 1 or not isinstance(stmt.body.body[0], cst.SimpleStatementLine):
        return None
    line = stmt.body.body[0]
    if len(line.body) != 1 or not isinstance(line.body[0], cst.Expr) or not isinstance(line.body[0].value, cst.Call):
        return None
    if not has_qname(facts, line.body[0].value.func, BARRIER):
        return None
    test = not_main_process_test if negated else main_process_test
    return test(facts, stmt.test, plan)


def _spawn(facts: Facts, dist: Distributed, call: cst.Call, names: set[str]) -> Optional[Why]:
    """``mp.spawn(worker, args=(a, b), nprocs=n)`` as a statement, ``worker`` a module-level function
    used nowhere else: the launcher starts the processes, so the worker is called once, directly,
    without the rank spawn passed first (the Accelerator's ``local_process_index``) nor a world size
    equal to ``nprocs`` (``num_processes``)."""
    usage = ("call the worker once (`accelerate launch` / `torchrun` start the processes) with the rank from "
             "the launcher, then run accelify on that script")
    what = f"`{code_of(call.func)}(...)`"
    if names & {"torch.multiprocessing.start_processes", "torch.multiprocessing.spawn.start_processes"}:
        return call, f"{what} starts processes with its own start method", usage
    statement = plan_statement(facts, call)
    if statement is None or dist.spawn is not None:
        return call, f"{what} is not a single launch statement", usage
    worker = call.args[0].value if call.args and call.args[0].keyword is None else None
    func = facts.functions.get(worker.value) if isinstance(worker, cst.Name) else None
    if func is None or func.decorators or func.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or (
        func.params.posonly_params
    ):
        return call, f"{what} launches `{code_of(worker) if worker else '?'}`, not a plain function of this file", usage
    uses = [n for n in findall(facts.module, m.Name(func.name.value)) if n is not func.name]
    if len(uses) != 1:
        return call, f"`{func.name.value}` is used elsewhere too, not only launched by {what}", usage
    arguments: list[cst.BaseExpression] = []
    nprocs: Optional[cst.BaseExpression] = None
    for arg in call.args[1:]:
        key = arg.keyword.value if arg.keyword is not None else None
        if key == "args" and isinstance(arg.value, cst.Tuple):
            arguments = [e.value for e in arg.value.elements]
        elif key == "nprocs":
            nprocs = arg.value
        elif key == "join" and code_of(arg.value) == "True":
            continue
        else:
            return arg, f"`{code_of(arg)}` of {what} has no meaning under a launcher accelify knows", usage
    params = [p.name.value for p in func.params.params]
    if not params or len(arguments) > len(params) - 1 or any(
        p.default is None for p in func.params.params[1 + len(arguments):]
    ):
        return call, f"{what} does not call `{func.name.value}` with one argument per parameter", usage
    gone = [params[0]]
    key = func.name.value
    dist.ranks[(key, params[0])] = "local_process_index"
    for param, value in zip(params[1:], arguments):
        if nprocs is not None and code_of(value) == code_of(nprocs):
            dist.ranks[(key, param)] = "num_processes"
            gone.append(param)
    dist.spawn = (id(statement), key, gone)
    return None


def spawn_arguments(call: cst.Call, worker: cst.FunctionDef, gone: list[str]) -> list[cst.BaseExpression]:
    """What the worker is called with once spawn is gone: the ``args=`` tuple but the parameters that go."""
    arguments: list[cst.BaseExpression] = []
    for arg in call.args[1:]:
        if arg.keyword is not None and arg.keyword.value == "args" and isinstance(arg.value, cst.Tuple):
            arguments = [e.value for e in arg.value.elements]
    params = [p.name.value for p in worker.params.params][1:]
    return [value for param, value in zip(params, arguments) if param not in gone]


def _propagate(facts: Facts, dist: Distributed) -> None:
    """``dist.passed``: parameters every call site hands a rank (``Trainer(model, ..., rank)``), and
    ``self`` attributes bound only to those (``self.gpu_id = gpu_id``)."""
    plan = facts.plan
    if plan is None:
        return
    callables: list[tuple[str, cst.FunctionDef, Optional[cst.ClassDef]]] = [
        (name, func, None) for name, func in facts.functions.items()]
    for name, cls in facts.classes.items():
        init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is not None:
            callables.append((name, init, cls))
    changed = True
    while changed:
        changed = False
        for name, func, cls in callables:
            sites = facts.call_sites(name, func, cls)
            if not sites:
                continue
            key = f"{name}.__init__" if cls is not None else name
            for param in [p.name.value for p in func.params.params]:
                if (key, param) in dist.passed or (key, param) in dist.ranks:
                    continue
                kinds = {rank_attribute(facts, bound[param], plan) if param in bound else None for _, bound in sites}
                if len(kinds) == 1 and None not in kinds:
                    dist.passed[(key, param)] = kinds.pop()  # type: ignore[assignment]
                    changed = True
        for (owner, name), assigns in facts.assigns.items():
            if owner not in facts.classes or not name.startswith("self.") or (owner, name) in dist.passed:
                continue
            kinds = {rank_attribute(facts, a.value, plan) if facts.single_target(a) == (owner, name) else None
                     for a in assigns}
            if len(kinds) == 1 and None not in kinds:
                dist.passed[(owner, name)] = kinds.pop()  # type: ignore[assignment]
                changed = True


def _call(facts: Facts, plan: Plan, dist: Distributed, call: cst.Call, names: set[str], handled: set[int]) -> Optional[Why]:
    """Account for one call of the distributed API (None) or say why it cannot be converted."""
    if names & SPAWN:
        return _spawn(facts, dist, call, names)
    if names & FSDP:
        return (call, f"`{code_of(call.func)}` shards the model by hand",
                "use Accelerate's FSDP plugin (`accelerate config`, or `FullyShardedDataParallelPlugin`) and "
                "`accelerator.prepare(model)`")
    if names & DDP:
        return _ddp(facts, dist, call)
    if names & SAMPLERS:
        return _sampler(facts, plan, dist, call)
    if names & SET_DEVICE and plan_statement(facts, call) is not None and _is_distributed_file(facts):
        dist.remove.add(id(plan_statement(facts, call)))
        return None
    if not any(n.startswith("torch.distributed.") for n in names):
        if m.matches(call.func, m.Attribute(attr=m.Name("set_epoch"))) and _sets_sampler_epoch(facts, dist, call):
            statement = plan_statement(facts, call)
            if statement is None:
                return call, f"`{code_of(call)}` is used as a value", "call `set_epoch` as a statement"
            dist.remove.add(id(statement))
        return None
    if names & HARMLESS or any(n.startswith("torch.distributed.ReduceOp") for n in names):
        return None
    statement = plan_statement(facts, call)
    if names & INIT:
        if statement is None:
            return call, "`init_process_group(...)` is used as a value", "call it as a statement"
        dist.remove.add(id(statement))
        return None
    if names & DESTROY:
        if statement is None:
            return call, "`destroy_process_group()` is used as a value", "call it as a statement"
        dist.end_training.add(id(statement))
        return None
    if names & (GET_RANK | GET_WORLD_SIZE | IS_INITIALIZED):
        if call.args:
            return call, f"`{code_of(call)}` asks about a process subgroup", "use the Accelerator's attributes"
        return None  # rewritten where it is (ACC018)
    if names & BARRIER:
        if statement is None or any(a.keyword is None or a.keyword.value != "device_ids" for a in call.args):
            return call, f"`{code_of(call)}` is not a plain barrier statement", "use `accelerator.wait_for_everyone()`"
        return None
    if names & ALL_REDUCE:
        return _all_reduce(facts, call, statement)
    return (call, f"`{code_of(call.func)}` ({sorted(names)[0]}) has no Accelerate equivalent accelify knows",
            "convert this call by hand (`accelerator.gather`, `accelerator.reduce`, `broadcast_object_list` in "
            "`accelerate.utils`), then run accelify again")


def _all_reduce(facts: Facts, call: cst.Call, statement: Optional[cst.SimpleStatementLine]) -> Optional[Why]:
    """``dist.all_reduce(t[, op=SUM|AVG])`` as a statement, ``t`` a name: ``t = accelerator.reduce(t, ...)``."""
    usage = "use `t = accelerator.reduce(t, reduction=\"sum\")` (it returns a new tensor)"
    if statement is None or not call.args or not isinstance(call.args[0].value, (cst.Name, cst.Attribute)):
        return call, f"`{code_of(call)}` is not an all-reduce of a named tensor, as a statement", usage
    if call.args[0].keyword is not None:
        return call, f"`{code_of(call)}` passes the tensor by keyword", usage
    reduced = call.args[0].value
    if findall(reduced, m.Attribute(attr=m.Name("grad"))) or _in_parameter_loop(facts, call):
        return (call, f"`{code_of(call)}` synchronises gradients by hand (DDP's job, which `prepare` gives the "
                "model: they would be added up twice)", "drop the hand-written synchronisation: `prepare` wraps "
                "the model in DistributedDataParallel")
    op = reduce_op(facts, call)
    if op is None:
        return call, f"`{code_of(call)}` reduces with an operation other than SUM or AVG, or asynchronously", usage
    return None


def _in_parameter_loop(facts: Facts, node: cst.CSTNode) -> bool:
    """Inside ``for p in model.parameters():`` (a hand-written gradient or weight synchronisation)."""
    current = facts.get_metadata(ParentNodeProvider, node, None)
    while current is not None:
        if isinstance(current, cst.For) and findall(
            current.iter, m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters")))
        ):
            return True
        current = facts.get_metadata(ParentNodeProvider, current, None)
    return False


def reduce_op(visitor: cst.MetadataDependent, call: cst.Call) -> Optional[str]:
    """``"sum"`` / ``"mean"`` for ``all_reduce(t)``, ``all_reduce(t, op=ReduceOp.SUM)``, ...; None otherwise."""
    op: Optional[cst.BaseExpression] = None
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == "op" or (arg.keyword is None and i == 1):
            op = arg.value
        elif i > 0:
            return None  # group=, async_op=
    if op is None:
        return "sum"
    for name in qualified_names(visitor, op):
        head, _, last = name.rpartition(".")
        if head.endswith("ReduceOp") and last in REDUCE_OPS:
            return REDUCE_OPS[last]
    return None


def _ddp(facts: Facts, dist: Distributed, call: cst.Call) -> Optional[Why]:
    if not call.args or call.args[0].keyword is not None:
        return call, f"`{code_of(call)}` does not wrap a model given first", "pass the model first"
    for arg in call.args[1:]:
        if arg.keyword is None or arg.keyword.value in _DDP_PLACEMENT:
            if arg.keyword is None and len(call.args) > 1 and arg is call.args[1]:
                continue  # DDP(model, [local_rank]): the device ids
            if arg.keyword is not None:
                continue
            return call, f"`{code_of(call)}` passes arguments by position", "pass them by keyword"
        if arg.keyword.value not in _DDP_BEHAVIOUR or not isinstance(arg.value, (cst.Name, cst.Integer, cst.Float)) or (
            isinstance(arg.value, cst.Name) and arg.value.value not in ("True", "False")
        ):
            return (arg, f"`{code_of(arg)}` of DistributedDataParallel is not a constant accelify can move to the "
                    "Accelerator", "pass it with `Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])`")
        text = f"{arg.keyword.value}={code_of(arg.value)}"
        if text not in dist.ddp_kwargs:
            dist.ddp_kwargs.append(text)
    return None


def _sampler(facts: Facts, plan: Plan, dist: Distributed, call: cst.Call) -> Optional[Why]:
    """A ``DistributedSampler`` given to a DataLoader (directly or through a name used only there
    and for ``set_epoch``) goes; its ``shuffle`` moves to the DataLoader."""
    usage = "pass `sampler=DistributedSampler(dataset, ...)` to the DataLoader, or drop the sampler by hand"
    for i, arg in enumerate(call.args):
        if i == 0 and arg.keyword is None:
            continue
        key = arg.keyword.value if arg.keyword is not None else None
        if key in ("shuffle", "dataset") or (key == "drop_last" and code_of(arg.value) == "False"):
            continue
        if key in ("num_replicas", "rank") and rank_attribute(facts, arg.value, plan) is not None:
            continue
        return (arg, f"`{code_of(arg)}` of the DistributedSampler is not one accelify can move to the DataLoader",
                usage)
    parent = facts.get_metadata(ParentNodeProvider, call, None)
    if isinstance(parent, cst.IfExp) and parent.body is call and m.matches(parent.orelse, m.Name("None")) and (
        rank_attribute(facts, parent.test, plan) == "use_distributed"
    ):
        # `DistributedSampler(ds) if distributed else None`: the sampler of a launched run, which goes
        dist.samplers.add(id(parent))
        holder: cst.CSTNode = parent
        parent = facts.get_metadata(ParentNodeProvider, parent, None)
    else:
        holder = call
    loader = _loader_given(facts, holder)
    if loader is not None:
        why = _loader_takes(loader, call)
        if why:
            return call, why, usage
        dist.samplers.add(id(call))
        return None
    if isinstance(parent, cst.Assign) and facts.single_target(parent) is not None and isinstance(parent.targets[0].target, (cst.Name, cst.Attribute)):
        ref = facts.single_target(parent)
        if len(facts.assigns.get(ref, [])) != 1:  # type: ignore[arg-type]
            return call, f"`{ref[1]}` is bound more than once", usage  # type: ignore[index]
        uses = [n for n in findall(facts.module, m.Name() | m.Attribute())
                if ref_of(facts, n) == ref and n is not parent.targets[0].target]
        for use in uses:
            up = facts.get_metadata(ParentNodeProvider, use, None)
            if isinstance(up, cst.Attribute) and up.attr.value == "set_epoch":
                continue
            if _shuffle_unless_sampler(facts, up):
                continue  # `shuffle=(sampler is None)`: the DataLoader gets the sampler's shuffle instead
            loader = _loader_given(facts, use)
            if loader is None:
                return use, f"the DistributedSampler `{code_of(use)}` is used for more than the DataLoader", usage
            why = _loader_takes(loader, call)
            if why:
                return call, why, usage
        dist.samplers.add(id(call))
        dist.sampler_names[ref] = sampler_shuffle(call)  # type: ignore[index]
        dist.remove.add(id(facts.get_metadata(ParentNodeProvider, parent)))
        return None
    return call, f"`{code_of(call)}` is not given to a DataLoader accelify can see", usage


def _shuffle_unless_sampler(facts: Facts, node: Optional[cst.CSTNode]) -> bool:
    """``sampler is None`` as the ``shuffle=`` of a DataLoader."""
    if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, cst.Is) and m.matches(node.comparisons[0].comparator, m.Name("None"))):
        return False
    arg = facts.get_metadata(ParentNodeProvider, node, None)
    return isinstance(arg, cst.Arg) and arg.keyword is not None and arg.keyword.value == "shuffle"


def _loader_given(facts: Facts, value: cst.CSTNode) -> Optional[cst.Call]:
    """The ``DataLoader(..., sampler=<value>)`` call ``value`` is given to, if it is."""
    arg = facts.get_metadata(ParentNodeProvider, value, None)
    if not isinstance(arg, cst.Arg) or arg.keyword is None or arg.keyword.value != "sampler":
        return None
    loader = facts.get_metadata(ParentNodeProvider, arg, None)
    return loader if isinstance(loader, cst.Call) and has_qname(facts, loader.func, DATALOADERS) else None


def _loader_takes(loader: cst.Call, sampler: cst.Call) -> str:
    """Why the sampler's ``shuffle`` cannot move to ``loader`` ("" when it can)."""
    own = {a.keyword.value: a.value for a in loader.args if a.keyword is not None}
    if "batch_sampler" in own:
        return "the DataLoader also has a batch sampler"
    if "shuffle" in own and code_of(own["shuffle"]) not in ("False", "None") and not _is_none_test(own["shuffle"]):
        return "the DataLoader says `shuffle=` too"
    return ""


def _is_none_test(value: cst.BaseExpression) -> bool:
    """``(sampler is None)``: a shuffle that stood in for the sampler of a run without a launcher."""
    return m.matches(value, m.Comparison(comparisons=[m.ComparisonTarget(m.Is(), m.Name("None"))]))


def sampler_shuffle(sampler: cst.Call) -> str:
    """The ``shuffle=`` a DataLoader gets for the DistributedSampler it loses (the sampler's default: True)."""
    for arg in sampler.args:
        if arg.keyword is not None and arg.keyword.value == "shuffle":
            return code_of(arg.value)
    return "True"


def _sets_sampler_epoch(facts: Facts, dist: Distributed, call: cst.Call) -> bool:
    """``sampler.set_epoch(epoch)`` on a sampler that goes, or ``loader.sampler.set_epoch(epoch)``."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if ref_of(facts, receiver) in dist.sampler_names:
        return True
    return isinstance(receiver, cst.Attribute) and receiver.attr.value == "sampler" and bool(
        findall(facts.module, m.Call(func=m.Attribute(attr=m.Name("DistributedSampler")) | m.Name("DistributedSampler")))
    )


def _is_distributed_file(facts: Facts) -> bool:
    return any(has_qname(facts, c.func, INIT) for c in facts.calls)


def plan_statement(facts: Facts, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
    """The statement line ``call`` is the whole of (``init_process_group(...)`` alone on its line)."""
    expr = facts.get_metadata(ParentNodeProvider, call, None)
    line = facts.get_metadata(ParentNodeProvider, expr, None) if isinstance(expr, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def _env_rank_reads(facts: Facts) -> list[cst.BaseExpression]:
    """``os.environ["LOCAL_RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("WORLD_SIZE")``."""
    reads: list[cst.BaseExpression] = []
    for node in findall(facts.module, m.Subscript()):
        if _env_key(facts, node) is not None:
            reads.append(node)  # type: ignore[arg-type]
    for call in facts.calls:
        if _env_key(facts, call) is not None:
            reads.append(call)
    return reads


def _env_key(facts: Facts, node: cst.CSTNode) -> Optional[str]:
    """The launcher variable ``node`` reads (``LOCAL_RANK``...), or None."""
    key: Optional[cst.BaseExpression] = None
    if isinstance(node, cst.Subscript) and has_qname(facts, node.value, frozenset({"os.environ"})):
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
    elif isinstance(node, cst.Call) and node.args and (
        has_qname(facts, node.func, frozenset({"os.getenv"}))
        or (isinstance(node.func, cst.Attribute) and node.func.attr.value == "get"
            and has_qname(facts, node.func.value, frozenset({"os.environ"})))
    ):
        key = node.args[0].value
    text = string_value(key) if key is not None else None
    if text in ENV_RANKS or text in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        return text
    return None


def _rank_source(facts: Facts, value: cst.BaseExpression, env_reads: list[cst.BaseExpression]) -> Optional[str]:
    """What ``value`` binds: an Accelerator attribute (``"local_process_index"``), ``"?why"`` when it
    is a rank accelify cannot map, None when it is no rank."""
    if isinstance(value, cst.Call) and not value.args:
        if has_qname(facts, value.func, GET_RANK):
            return "process_index"
        if has_qname(facts, value.func, GET_WORLD_SIZE):
            return "num_processes"
    if _launched_test(facts, value, env_reads):
        return "use_distributed"
    inner = value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "int" and len(value.args) == 1:
        inner = value.args[0].value
    if not any(inner is r for r in env_reads):
        if any(r for r in env_reads if r in findall(value, m.Subscript() | m.Call())):
            return f"?`{code_of(value)}` computes with a launcher variable (a run with or without a launcher)"
        return None
    key = _env_key(facts, inner)
    if key not in ENV_RANKS:
        return f"?`{code_of(value)}` reads `{key}`, which has no Accelerate equivalent accelify knows"
    if inner is value:
        return f"?`{code_of(value)}` is a string, not a number"
    if isinstance(inner, cst.Call) and len(inner.args) > 1:
        default = inner.args[1].value
        if code_of(default).strip("'\"") != ("1" if key == "WORLD_SIZE" else "0"):
            return (f"?`{code_of(value)}` has the default `{code_of(default)}` for a run without a launcher "
                    "(a script with a single-process path too)")
    return ENV_RANKS[key]


def _launched_test(facts: Facts, value: cst.BaseExpression, env_reads: list[cst.BaseExpression]) -> bool:
    """``int(os.environ.get("WORLD_SIZE", 1)) > 1``, ``int(os.environ.get("RANK", -1)) != -1``,
    ``"LOCAL_RANK" in os.environ``: "was this run started by a launcher?", which under Accelerate is
    ``accelerator.use_distributed`` (in one process the script takes its single-process path, as
    it did without a launcher)."""
    if not isinstance(value, cst.Comparison) or len(value.comparisons) != 1:
        return False
    target = value.comparisons[0]
    if isinstance(target.operator, cst.In) and has_qname(facts, target.comparator, frozenset({"os.environ"})):
        return string_value(value.left) in ENV_RANKS  # type: ignore[arg-type]
    left = value.left
    if not (isinstance(left, cst.Call) and m.matches(left.func, m.Name("int")) and len(left.args) == 1):
        return False
    read = left.args[0].value
    if not any(read is r for r in env_reads) or not isinstance(read, cst.Call) or len(read.args) != 2:
        return False  # `os.environ.get(KEY, default)`: without a launcher, the default
    key, default = _env_key(facts, read), code_of(read.args[1].value).strip("'\"")
    operator, bound = target.operator, code_of(target.comparator)
    if key == "WORLD_SIZE":
        return default == "1" and ((isinstance(operator, cst.GreaterThan) and bound == "1")
                                   or (isinstance(operator, cst.NotEqual) and bound == "1"))
    if key in ("RANK", "LOCAL_RANK"):
        return default == "-1" and ((isinstance(operator, cst.NotEqual) and bound == "-1")
                                    or (isinstance(operator, cst.GreaterThanEqual) and bound == "0"))
    return False


def _setup_helpers(facts: Facts, dist: Distributed) -> set[str]:
    """Module-level functions whose every statement goes (``ddp_setup()``), called only as statements."""
    helpers = set()
    for name, func in facts.functions.items():
        body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
        statements = [s for s in body if not _is_docstring(s)]
        if statements and all(id(s) in dist.end_training for s in statements):
            uses = [n for n in findall(facts.module, m.Name(name)) if n is not func.name]
            if all(_called_as_statement(facts, n) for n in uses):
                dist.teardowns.add(name)
            continue
        if not statements or not all(_goes(facts, dist, s) for s in statements):
            continue
        uses = [n for n in findall(facts.module, m.Name(name)) if n is not func.name]
        if all(_called_as_statement(facts, n) for n in uses):
            helpers.add(name)
    return helpers


def _goes(facts: Facts, dist: Distributed, statement: cst.BaseStatement) -> bool:
    if id(statement) in dist.remove:
        return True
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign) and id(small) in dist.rank_assigns:
            return True
    if isinstance(statement, cst.If) and statement.orelse is None and all(
        has_qname(facts, c.func, frozenset({"torch.cuda.is_available"})) for c in findall(statement.test, m.Call())
    ):
        return all(_goes(facts, dist, s) for s in statement.body.body)  # type: ignore[attr-defined]
    return False


def _called_as_statement(facts: Facts, name: cst.Name) -> bool:
    call = facts.get_metadata(ParentNodeProvider, name, None)
    return isinstance(call, cst.Call) and call.func is name and plan_statement(facts, call) is not None


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]))


def reductions(facts: Facts, plan: Plan) -> bool:
    """``dist.all_reduce`` of counts an evaluation loop over a prepared dataloader accumulates.

    ACC011 gathers such a loop's predictions and labels (``gather_for_metrics``, which drops
    the samples ``prepare`` repeats to even out the last batch): its counts are then the whole
    set's on every process, and the all-reduce, which would add them up N times, goes.  When
    ACC011 cannot gather the loop, the reduced counts would include the repeated samples:
    False (ACC126).  Any other all-reduce (a training loss averaged for the log) becomes
    ``accelerator.reduce``.
    """
    from accelify.analysis import assigned_names, enclosing_function
    from accelify.codemods.gather import Gather, find_gather

    dist = plan.distributed
    if dist is None:
        return True
    for call in facts.calls:
        statement = plan_statement(facts, call)
        if statement is None or id(statement) in dist.remove or not has_qname(facts, call.func, ALL_REDUCE):
            continue
        func = enclosing_function(facts, call)
        scope: cst.CSTNode = func if func is not None else facts.module
        names = {n.value for n in findall(call.args[0].value, m.Name())}
        for _ in range(3):  # `t = torch.tensor([correct, total])`: what the reduced tensor is made of
            for assign in findall(scope, m.Assign()):
                if {n for t in assign.targets for n in assigned_names(t.target)} & names:  # type: ignore[attr-defined]
                    names |= {n.value for n in findall(assign.value, m.Name())}  # type: ignore[attr-defined]
        for loop in facts.loops:
            if not inside(facts, loop, {id(scope)}) or facts.line(loop) > facts.line(call):
                continue
            counted = {n for aug in findall(loop.body, m.AugAssign()) for n in assigned_names(aug.target)}  # type: ignore[attr-defined]
            if not counted & names:
                continue
            gather = find_gather(facts, loop, plan)
            if isinstance(gather, Gather):
                dist.remove.add(id(statement))
                dist.gathered.add(id(statement))
                break
            if isinstance(gather, str):
                facts.finding(
                    plan, call, "ACC126", f"`{code_of(call)}` adds up counts of an evaluation loop that accelify "
                    f"cannot gather ({gather}); reduced, they would count the samples `prepare` repeats to even out "
                    "the last batch. File not converted.",
                    "gather the predictions and labels with `accelerator.gather_for_metrics(...)` and drop the "
                    "all-reduce",
                )
                plan.distributed = None
                return False
    return True
