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
  Accelerator's attributes, ``dist.is_initialized()`` -> ``accelerator.use_distributed``,
  ``dist.broadcast(t, src=0)`` -> ``t = broadcast(t, from_process=0)`` (``accelerate.utils``);
  ``model.no_sync()`` -> ``accelerator.no_sync(model)`` (the same context on the prepared model).

Anything else distributed (an ``mp.spawn`` accelify cannot follow, an ``all_gather`` or ``broadcast`` of another shape,
process subgroups, FSDP, ``require_backward_grad_sync``, a rank spelled another way) refuses the file (ACC126) with a finding that names it:
half a conversion would wrap the model twice or shard the data twice.

Input: the facts (calls, assignments, functions).  Output: ``plan.distributed`` (None for a file
that does not manage its own processes); refusal ACC126.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts
from accelify.analyses.gathers import Gather, find_gather
from accelify.analyses.ranks import (
    DEVICE_COUNT,
    GET_RANK,
    GET_WORLD_SIZE,
    IS_INITIALIZED,
    Why,
    arg_ranks,
    both,
    env_key,
    env_rank_reads,
    kept_rank,
    launch_branches,
    main_flags_of,
    main_process_test,
    not_main_process_test,
    propagate,
    rank_attribute,
    rank_source,
)
from accelify.analyses.samplers import SAMPLERS, recognise_sampler, sets_sampler_epoch
from accelify.queries.blocks import enclosing_function, inside, is_docstring, statement_line
from accelify.queries.devices import is_availability_check
from accelify.queries.names import DATALOADERS, PROCESS, assigned_names, code_of, has_qname, process_target, qualified_names
from accelify.queries.refs import Ref, key_at, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

INIT = both("init_process_group")


DESTROY = both("destroy_process_group")


BARRIER = both("barrier")


ALL_REDUCE = both("all_reduce")
ALL_GATHER = both("all_gather")
BROADCAST = both("broadcast")


#: the process group's backend (printed by PyTorch's DDP example): ``accelerator.state.backend``
GET_BACKEND = both("get_backend")


#: queries that need no process group: left as they are
HARMLESS = frozenset({"torch.distributed.is_available", "torch.distributed.ReduceOp", "torch.distributed.Backend"})


SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.accelerator.set_device_index", "torch.accelerator.set_device_idx"})
#: the backend a device's process group takes (``backend = get_default_backend_for_device(acc)``, handed to
#: ``init_process_group``): chosen by Accelerate once the launcher's set-up goes
DEFAULT_BACKEND = both("get_default_backend_for_device")


DDP = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)


#: ZeRO stage 1 by hand: DeepSpeed's in Accelerate
ZERO = frozenset({"torch.distributed.optim.ZeroRedundancyOptimizer",
                  "torch.distributed.optim.zero_redundancy_optimizer.ZeroRedundancyOptimizer"})

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


#: DistributedDataParallel arguments that say where it runs: ``prepare`` decides that
_DDP_PLACEMENT = frozenset({"device_ids", "output_device"})


#: DistributedDataParallel arguments that change what it does: ``DistributedDataParallelKwargs``
_DDP_BEHAVIOUR = frozenset(
    {"find_unused_parameters", "broadcast_buffers", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb"}
)


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
    #: ``batches = BatchSampler(sampler, batch_size, drop_last=...)`` over a sampler that goes, handed to one
    #: DataLoader as ``batch_sampler=``: its ref -> (the sampler's shuffle, the batch size, drop_last)
    batch_samplers: dict[Ref, tuple[str, cst.BaseExpression, cst.BaseExpression]] = field(default_factory=dict)
    #: ids of all-reduce statements that go because the counts they add up are gathered (ACC011)
    gathered: set[int] = field(default_factory=set)
    #: ids of ``dist.all_gather(parts, t)`` statements: ``parts = list(accelerator.gather(t[None]))``
    #: (the list built for it beforehand goes, in ``remove``)
    all_gathers: set[int] = field(default_factory=set)
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
    #: ``args.gpu = gpu`` in a spawned worker, the attribute bound to a rank and to nothing else in the file:
    #: (``args``, ``gpu``) -> the Accelerator attribute; read anywhere as ``args.gpu``, it is left as it is
    #: (it holds the Accelerator's value), but placements on it go and tests on it are rank tests
    attr_ranks: dict[tuple[str, str], str] = field(default_factory=dict)
    #: the parsed arguments (``args = parser.parse_args()``) whose ``.local_rank`` (``--local_rank``,
    #: passed by ``torch.distributed.launch``) is the local rank: each read becomes the Accelerator's
    arg_ranks: set[Ref] = field(default_factory=set)
    #: ids of the launcher reads that are such an option's default
    #: (``add_argument("--local_rank", default=int(os.environ.get("LOCAL_RANK", 0)))``): left as they are
    arg_defaults: set[int] = field(default_factory=set)
    #: the "rank 0 first" barrier pairs (``if local_rank != 0: barrier()`` ... ``if local_rank == 0:
    #: barrier()``): ids of the two ``if`` statements; what is between runs under ``main_process_first()``
    first: list[tuple[int, int]] = field(default_factory=list)
    #: ``mp.spawn(worker, args=(...), nprocs=n)``: id of the statement, the worker, and the worker's
    #: parameters that go (the rank spawn passes first, a world size equal to ``nprocs``)
    spawn: Optional[tuple[int, str, list[str]]] = None
    #: the worker's arguments once the ``Process`` loop that started it is a call (:func:`_process_loop`)
    spawned: list[cst.BaseExpression] = field(default_factory=list)
    #: ids of the ``for p in processes: p.join()`` loops that go with that loop
    joins: set[int] = field(default_factory=set)
    #: ``DistributedDataParallelKwargs`` arguments, in the order written
    ddp_kwargs: list[str] = field(default_factory=list)
    #: rank names bound once to a bare query (``gpu_idx = dist.get_rank()``) -> the id of that assignment:
    #: where the Accelerator cannot be reached (a model's method), the assignment stays, asking
    #: ``PartialState()``, and its reads stay as they are
    queries: dict[Ref, int] = field(default_factory=dict)
    #: ids of ``RandomSampler(ds) if args.local_rank == -1 else DistributedSampler(ds)`` -> the branch that stays
    #: (``"body"``): the single-process path's sampler, which ``prepare`` shards
    sampler_choices: dict[int, str] = field(default_factory=dict)
    #: reads of the GPUs of one machine divided by as the processes (``("main_worker", "nprocs")``): each read where
    #: the Accelerator is reached is ``accelerator.num_processes``
    gpu_counts: set[tuple[Optional[str], str]] = field(default_factory=set)
    #: ids of ``sampler.total_size`` reads of a sampler that goes -> ``len(dataset)`` (accelify.analyses.samplers)
    sizes: dict[int, str] = field(default_factory=dict)
    #: ids of ``dist.broadcast(t, src)`` statements: ``t = broadcast(t, from_process=src)``
    broadcasts: set[int] = field(default_factory=set)
    #: the ranks and their arguments were all understood (what is refused, if anything, comes after them)
    ranks_read: bool = False


def decide(facts: Facts, plan: Plan) -> bool:
    """Recognise a script that manages its own processes: ``plan.distributed``; False (ACC126) when
    something in it is not understood, with a finding that names it."""
    if not any(_is_distributed(facts, call) for call in facts.calls):
        return True
    dist = Distributed()
    plan.distributed = dist
    whys = _recognise(facts, plan, dist)
    if not whys:
        return True
    for node, message, suggestion in whys:
        facts.finding(plan, node, "ACC126", f"{message}; file not converted (half a conversion would wrap the model "
                      "or shard the data twice).", suggestion)
    plan.distributed = None
    plan.refused_distributed = dist if dist.ranks_read else None
    return False


def _is_distributed(facts: Facts, call: cst.Call) -> bool:
    names = qualified_names(facts, call.func)
    return any(n.startswith("torch.distributed.") or n in SPAWN or n in DDP or n in SAMPLERS for n in names)


def _recognise(facts: Facts, plan: Plan, dist: Distributed) -> list[Why]:
    """What in the script's process management accelify does not understand: empty when all of it is. The ranks
    and their arguments come first and end it (the rest reads them); from the calls on, every construct not
    understood is named (Facebook's example: `get_default_backend_for_device` *and* `dist.get_backend()`)."""
    handled: set[int] = set()  # ids of calls accounted for
    dead = _dead_setups(facts)
    live = lambda node: (key_at(facts, node) or "").split(".")[0] not in dead  # noqa: E731
    env_reads = [r for r in env_rank_reads(facts) if live(r)]
    # ranks first: the rest asks whether an argument is one
    for ref, assigns in facts.assigns.items():
        assigns = [a for a in assigns if live(a)]
        if not assigns:
            continue
        kinds = {rank_source(facts, a.value, env_reads) for a in assigns if facts.single_target(a) == ref}
        if not kinds or kinds == {None}:
            continue
        if len(kinds) != 1 or len(assigns) != 1 or None in kinds:
            kept = kept_rank(facts, ref, assigns, env_reads)
            if kept is None:
                return [(assigns[0], f"`{ref[1]}` holds a rank but is bound more than once, or to other values too",
                         "read the rank once, or use `accelerator.process_index` by hand")]
            dist.kept[ref] = kept[0]
            dist.kept_assigns[id(kept[1])] = kept[0]
            handled.update(id(c) for c in findall(kept[1].value, m.Call()))
            continue
        kind = kinds.pop()
        if kind.startswith("?"):
            return [(assigns[0], kind[1:], "a script with a single-process path too is not converted yet: keep the "
                     "distributed path only (under `accelerate launch` it also runs as one process), reading the rank "
                     "as `int(os.environ[\"LOCAL_RANK\"])`, or use `accelerator.process_index`")]
        dist.ranks[ref] = kind  # type: ignore[assignment]
        dist.rank_assigns.add(id(assigns[0]))
        value = assigns[0].value
        if isinstance(value, cst.Call) and not value.args and has_qname(facts, value.func, GET_RANK | GET_WORLD_SIZE):
            dist.queries[ref] = id(assigns[0])
        handled.update(id(c) for c in findall(assigns[0].value, m.Call()))
    why = arg_ranks(facts, plan, dist, env_reads)
    if why is not None:
        return [why]
    dist.ranks_read = True
    whys: list[Why] = []
    spawns = [c for c in facts.calls if qualified_names(facts, c.func) & (SPAWN | PROCESS)]
    for call in spawns + [c for c in facts.calls if c not in spawns]:  # the spawned worker's ranks first
        if id(call) in handled or not live(call):
            continue
        names = qualified_names(facts, call.func)
        why = _call(facts, plan, dist, call, names, handled)
        if why is not None:
            whys.append(why)
    for read in env_reads:
        target = facts.get_metadata(ParentNodeProvider, read, None)
        assign = facts.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        if isinstance(assign, cst.Assign) and env_key(facts, read) in ("MASTER_ADDR", "MASTER_PORT"):
            line = facts.get_metadata(ParentNodeProvider, assign, None)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                dist.remove.add(id(line))
                continue
        if id(read) in dist.arg_defaults:
            continue
        if not inside(facts, read, dist.remove) and not inside(facts, read, dist.rank_assigns | set(dist.kept_assigns)):
            if any(key_at(facts, node) == key_at(facts, read) for node, _, _ in whys):
                continue  # the set-up helper that reads it is not removed for a reason already named there
            whys.append((read, f"`{code_of(read)}` is read outside the process-group set-up accelify removes",
                         "use `accelerator.process_index` / `local_process_index` / `num_processes`"))
    for node in findall(facts.module, m.Attribute(attr=m.Name("no_sync") | m.Name("require_backward_grad_sync"))):
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if node.attr.value == "no_sync" and isinstance(parent, cst.Call) and parent.func is node and not parent.args:  # type: ignore[attr-defined]
            continue  # `model.no_sync()` -> `accelerator.no_sync(model)` (ACC018)
        if node.attr.value == "require_backward_grad_sync" and isinstance(parent, cst.AssignTarget) and (
            launch_branches(facts, node, env_reads) or (None, False)
        )[1]:
            continue  # nanoGPT's `if ddp: model.require_backward_grad_sync = ...`: the prepared DDP wrapper's
        whys.append((node, f"`{code_of(node)}` (gradient synchronisation switched by hand) is not converted yet",
                     "use `with accelerator.accumulate(model):` (or `accelerator.no_sync(model)`) by hand"))
    if whys:
        return whys
    for line in findall(facts.module, m.SimpleStatementLine(body=[m.Assert()])):
        test = line.body[0].test  # type: ignore[attr-defined]
        if is_availability_check(facts, test) and (launch_branches(facts, line, env_reads) or (None, False))[1]:
            dist.remove.add(id(line))  # `assert torch.cuda.is_available()` once launched: nccl's need, not gloo's
    _gpus_counted_as_processes(facts, dist)
    helpers = _setup_helpers(facts, dist)
    dist.helpers = helpers | dead
    propagate(facts, dist)
    _rank_attributes(facts, plan, dist)
    main_flags_of(facts, plan, dist, env_reads)
    _first_pairs(facts, plan, dist)
    return []


def _gpus_counted_as_processes(facts: Facts, dist: Distributed) -> None:
    """``dist.gpu_counts``: ``args.nprocs = torch.cuda.device_count()`` in a script a launcher starts, then
    ``batch_size / nprocs`` or ``rt /= nprocs`` after an all-reduce: the GPUs of one machine taken for the processes
    of the run (tczhangzhi's pytorch-distributed). Under ``accelerate launch`` the processes are the launcher's (on
    the CPU there is no GPU to count, and the division fails): where the Accelerator is reached, each read becomes
    ``accelerator.num_processes`` (ACC018, with ACC143); a division by it where none is reached is refused. The
    ImageNet example's ``ngpus_per_node``, which ``mp.spawn`` is handed, is ACC027's."""
    if any(qualified_names(facts, c.func) & SPAWN for c in facts.calls):
        return
    for assign in findall(facts.module, m.Assign(value=m.Call(args=[]))):
        if not has_qname(facts, assign.value.func, DEVICE_COUNT) or len(assign.targets) != 1:  # type: ignore[attr-defined]
            continue
        carriers = _carriers(facts, assign.targets[0].target)  # type: ignore[attr-defined]
        if any(_division_by(facts, d) in carriers for d in _divisions(facts)):
            dist.gpu_counts |= carriers


def _divisions(facts: Facts) -> list[cst.CSTNode]:
    return [*findall(facts.module, m.BinaryOperation(operator=m.Divide() | m.FloorDivide())),
            *findall(facts.module, m.AugAssign(operator=m.DivideAssign() | m.FloorDivideAssign()))]


def _division_by(facts: Facts, division: cst.CSTNode) -> tuple[Optional[str], str]:
    """What ``a / b`` or ``a /= b`` divides by, as (scope key, code)."""
    return held(facts, division.right if isinstance(division, cst.BinaryOperation) else division.value)  # type: ignore[attr-defined]


def _carriers(facts: Facts, target: cst.BaseExpression) -> set[tuple[Optional[str], str]]:
    """Where what ``target`` is bound to is read, as (scope key, code): itself, and the parameters of the file's
    functions every call hands it (``main_worker(..., args.nprocs, args)``'s ``nprocs``, and ``args.nprocs``
    there through ``args``)."""
    spelled = lambda arg: held(facts, arg)  # noqa: E731
    seeds = {held(facts, target)}
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
        namespaces = facts.handed({held(facts, target.value)}, spelled)
        seeds |= {(key, f"{name}.{target.attr.value}") for key, name in namespaces}
    return facts.handed(seeds, spelled)


def held(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> tuple[Optional[str], str]:
    """``expr`` as (scope key, code): ``("train", "args.nprocs")``."""
    return key_at(visitor, expr), code_of(expr)


def _rank_attributes(facts: Facts, plan: Plan, dist: Distributed) -> None:
    """``args.gpu = gpu`` with ``gpu`` the rank ``mp.spawn`` hands its worker: ``dist.attr_ranks``, when
    every binding of an ``.gpu`` attribute in the file is that one (one object, one meaning)."""
    bindings: dict[str, list[tuple[str, Optional[str]]]] = {}
    for assign in findall(facts.module, m.Assign()):
        for target in assign.targets:
            node = target.target
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value != "self":
                kind = rank_attribute(facts, assign.value, plan) if len(assign.targets) == 1 else None
                bindings.setdefault(node.attr.value, []).append((node.value.value, kind))
    for attr, bound in bindings.items():
        if len(bound) == 1 and bound[0][1] is not None:
            dist.attr_ranks[(bound[0][0], attr)] = bound[0][1]


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
    uses = [n for n in findall(facts.module, m.Name(func.name.value)) if n is not func.name and not _member_name(facts, n)]
    if len(uses) != 1:
        return call, f"`{func.name.value}` is used elsewhere too, not only launched by {what}", usage
    arguments: list[cst.BaseExpression] = []
    nprocs: Optional[cst.BaseExpression] = None
    for position, arg in enumerate(call.args[1:]):
        key = arg.keyword.value if arg.keyword is not None else _SPAWN_POSITIONS.get(position)
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
    if isinstance(nprocs, cst.Name):
        _launch_count(facts, dist, nprocs, {id(call)})
    return None


#: what the value of a count only a launch reads may call: the GPUs, the environment, arithmetic
_COUNTS = frozenset({"int", "len", "min", "max", "os.getenv", "os.environ.get", "torch.cuda.device_count"})
#: ... and of a device only the backend choice of the set-up reads (``acc = torch.accelerator.current_accelerator()``,
#: ``device = torch.device(f"{acc}:{rank}")``)
_SET_UP_DEVICES = _COUNTS | {"str", "torch.device", "torch.accelerator.current_accelerator", "torch.accelerator.is_available",
                              "torch.cuda.is_available"}


def _backend_for_init(facts: Facts, dist: Distributed, call: cst.Call) -> bool:
    """``backend = torch.distributed.get_default_backend_for_device(acc)`` read only as the backend of
    ``init_process_group`` (the set-up Accelerate does): the line goes, and the device it was asked of when only that
    line reads it (``acc = torch.accelerator.current_accelerator()``)."""
    assign = facts.get_metadata(ParentNodeProvider, call, None)
    init = facts.get_metadata(ParentNodeProvider, assign, None) if isinstance(assign, cst.Arg) else None
    if isinstance(init, cst.Call) and has_qname(facts, init.func, INIT):
        return True  # `init_process_group(backend=get_default_backend_for_device(acc))`: it goes with the call
    statement = facts.get_metadata(ParentNodeProvider, assign, None) if isinstance(assign, cst.Assign) else None
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or len(assign.targets) != 1 \
            or not isinstance(assign.targets[0].target, cst.Name):  # type: ignore[union-attr]
        return False
    target = assign.targets[0].target
    ref = ref_of(facts, target)
    reads = [n for n in findall(facts.module, m.Name(target.value)) if n is not target and ref_of(facts, n) == ref]
    for read in reads:
        arg = facts.get_metadata(ParentNodeProvider, read, None)
        init = facts.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if not (isinstance(init, cst.Call) and has_qname(facts, init.func, INIT) and (
                arg.keyword is None and init.args[0] is arg or arg.keyword is not None and arg.keyword.value == "backend")):
            return False
    dist.remove.add(id(statement))
    for arg in call.args:
        if isinstance(arg.value, cst.Name):
            _launch_count(facts, dist, arg.value, {id(statement)}, _SET_UP_DEVICES, through=True)
    return True


def _launch_count(facts: Facts, dist: Distributed, count: cst.Name, within: set[int],
                  calls: frozenset[str] = _COUNTS, through: bool = False) -> None:
    """``world_size = torch.cuda.device_count()`` that only ``mp.spawn(..., nprocs=world_size)`` (``within``) reads goes
    with the launch (the tutorials' ``__main__``), and so does a count only that line reads (``world_size = n_gpus``):
    left, they would count the GPUs for nothing. (``calls``: what the dropped values may call; ``through``: follow
    every name a dropped value reads, ``device = torch.device(f"{acc}:{rank}")``, not only a value that is a name.)"""
    ref = ref_of(facts, count)
    assigns = facts.assigns.get(ref, []) if ref is not None else []
    if len(assigns) != 1 or len(assigns[0].targets) != 1 or not isinstance(assigns[0].targets[0].target, cst.Name):
        return
    line = facts.get_metadata(ParentNodeProvider, assigns[0], None)
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return
    if any(not (qualified_names(facts, c.func) & calls) for c in findall(assigns[0].value, m.Call())):
        return
    target = assigns[0].targets[0].target
    reads = [n for n in findall(facts.module, m.Name(count.value)) if n is not target and ref_of(facts, n) == ref]
    if all(inside(facts, n, within) for n in reads):
        dist.remove.add(id(line))
        value = assigns[0].value
        followed = [n for n in findall(value, m.Name()) if ref_of(facts, n) is not None] if through else (
            [value] if isinstance(value, cst.Name) else [])
        for name in followed:
            _launch_count(facts, dist, name, within | {id(line)}, calls, through)


def _process_loop(facts: Facts, dist: Distributed, call: cst.Call) -> Optional[Why]:
    """``for rank in range(n): p = Process(target=worker, args=(rank, ...)); p.start(); processes.append(p)``,
    then ``for p in processes: p.join()`` (WZMIAOMIAO's multi-GPU example): ``mp.spawn`` written by hand. The
    launcher starts the processes, so the worker is called once, directly, without the rank (the loop's variable,
    the Accelerator's ``local_process_index``) nor a world size equal to ``n`` (``num_processes``); the list and
    the joins go with the loop."""
    usage = ("call the worker once (`accelerate launch` / `torchrun` start the processes) with the rank from "
             "the launcher, then run accelify on that script")
    what = f"`{code_of(call.func)}(...)`"
    assign = facts.get_metadata(ParentNodeProvider, call, None)
    line = facts.get_metadata(ParentNodeProvider, assign, None) if isinstance(assign, cst.Assign) else None
    block = facts.get_metadata(ParentNodeProvider, line, None) if isinstance(line, cst.SimpleStatementLine) else None
    loop = facts.get_metadata(ParentNodeProvider, block, None) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(loop, cst.For) or dist.spawn is not None or loop.orelse is not None or not isinstance(
            loop.target, cst.Name) or not m.matches(loop.iter, m.Call(func=m.Name("range"), args=[m.Arg(keyword=None)])):
        return call, f"{what} is not made in a `for rank in range(n):` loop that starts each process", usage
    handle = assign.targets[0].target if len(assign.targets) == 1 else None  # type: ignore[union-attr]
    started = process_target(call)
    if not isinstance(handle, cst.Name) or started is None or sorted(
            a.keyword.value if a.keyword is not None else "" for a in call.args) != ["args", "target"]:
        return call, f"{what} is not `Process(target=worker, args=(rank, ...))`", usage
    worker, values = started
    if not values or not m.matches(values[0], m.Name(loop.target.value)):
        return call, f"{what} does not hand the worker the loop's rank first", usage
    starts = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=m.Name(handle.value), attr=m.Name("start")), args=[]))])
    body = list(block.body)  # type: ignore[union-attr]
    appended = body[2] if len(body) == 3 else None
    listed = m.matches(appended, m.SimpleStatementLine(body=[m.Expr(m.Call(
        func=m.Attribute(value=m.Name(), attr=m.Name("append")), args=[m.Arg(m.Name(handle.value))]))]))
    if body[0] is not line or not m.matches(body[1], starts) or not listed:
        return loop, f"the loop that starts the processes does more than `{handle.value}.start()` and keep it", usage
    processes = appended.body[0].value.func.value.value  # type: ignore[union-attr]
    outer = facts.get_metadata(ParentNodeProvider, loop, None)
    siblings = list(getattr(outer, "body", ()))
    at = next(i for i, s in enumerate(siblings) if s is loop)
    made = siblings[at - 1] if at > 0 else None
    joined = siblings[at + 1] if at + 1 < len(siblings) else None
    if not m.matches(made, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(processes))],
                                                                 value=m.List(elements=[]))])) or not (
        isinstance(joined, cst.For) and m.matches(joined.iter, m.Name(processes)) and isinstance(joined.target, cst.Name)
        and m.matches(joined.body, m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Expr(m.Call(
            func=m.Attribute(value=m.Name(joined.target.value), attr=m.Name("join")), args=[]))])]))
    ):
        return loop, f"the processes are not kept in a list made just before (`{processes} = []`) and joined just after", usage
    func = facts.functions.get(worker)
    if func is None or func.decorators or func.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or (
            func.params.posonly_params):
        return call, f"{what} starts `{worker}`, not a plain function of this file", usage
    uses = [n for n in findall(facts.module, m.Name(func.name.value)) if n is not func.name and not _member_name(facts, n)]
    params = [p.name.value for p in func.params.params]
    if len(uses) != 1 or len(values) != len(params):
        return call, f"`{func.name.value}` is used elsewhere too, or not called with one argument per parameter", usage
    key = func.name.value
    gone = [params[0]]
    dist.ranks[(key, params[0])] = "local_process_index"
    count = loop.iter.args[0].value  # type: ignore[attr-defined]
    for param, value in zip(params[1:], values[1:]):
        if code_of(value) == code_of(count):
            dist.ranks[(key, param)] = "num_processes"
            gone.append(param)
    dist.spawn = (id(loop), key, gone)
    dist.spawned = [value for param, value in zip(params, values) if param not in gone]
    dist.remove.add(id(made))
    dist.joins.add(id(joined))
    return None


def _member_name(facts: Facts, name: cst.Name) -> bool:
    """``model.train`` (an attribute's name) or ``f(train=...)`` (a keyword): not the function ``train``."""
    parent = facts.get_metadata(ParentNodeProvider, name, None)
    return (isinstance(parent, cst.Attribute) and parent.attr is name) or (
        isinstance(parent, cst.Arg) and parent.keyword is name)


#: ``mp.spawn(fn, args, nprocs, join, ...)``: the keyword of each argument after ``fn`` given by position
_SPAWN_POSITIONS = {0: "args", 1: "nprocs", 2: "join"}


def spawn_arguments(call: cst.Call, worker: cst.FunctionDef, gone: list[str]) -> list[cst.BaseExpression]:
    """What the worker is called with once spawn is gone: the ``args=`` tuple but the parameters that go."""
    arguments: list[cst.BaseExpression] = []
    for position, arg in enumerate(call.args[1:]):
        key = arg.keyword.value if arg.keyword is not None else _SPAWN_POSITIONS.get(position)
        if key == "args" and isinstance(arg.value, cst.Tuple):
            arguments = [e.value for e in arg.value.elements]
    params = [p.name.value for p in worker.params.params][1:]
    return [value for param, value in zip(params, arguments) if param not in gone]


def _call(facts: Facts, plan: Plan, dist: Distributed, call: cst.Call, names: set[str], handled: set[int]) -> Optional[Why]:
    """Account for one call of the distributed API (None) or say why it cannot be converted."""
    if names & PROCESS:
        return _process_loop(facts, dist, call)
    if names & SPAWN:
        return _spawn(facts, dist, call, names)
    if names & ZERO:
        return (call, f"`{code_of(call.func)}` shards the optimizer state over the processes by hand (ZeRO stage 1), "
                "which Accelerate does only through DeepSpeed",
                "build the plain optimizer it wraps (`optimizer_class(model.parameters(), ...)`) and launch with "
                "DeepSpeed ZeRO stage 1 (`accelerate config`, or `DeepSpeedPlugin(zero_stage=1)`), then run accelify "
                "again")
    if names & FSDP:
        return (call, f"`{code_of(call.func)}` shards the model by hand",
                "use Accelerate's FSDP plugin (`accelerate config`, or `FullyShardedDataParallelPlugin`) and "
                "`accelerator.prepare(model)`")
    if names & DDP:
        return _ddp(facts, dist, call)
    if names & SAMPLERS:
        return recognise_sampler(facts, plan, dist, call)
    if names & SET_DEVICE and plan_statement(facts, call) is not None and _is_distributed_file(facts):
        dist.remove.add(id(plan_statement(facts, call)))
        return None
    if not any(n.startswith("torch.distributed.") for n in names):
        if m.matches(call.func, m.Attribute(attr=m.Name("set_epoch"))) and sets_sampler_epoch(facts, dist, call):
            statement = plan_statement(facts, call)
            if statement is None:
                return call, f"`{code_of(call)}` is used as a value", "call `set_epoch` as a statement"
            dist.remove.add(id(statement))
        return None
    if names & HARMLESS or any(n.startswith("torch.distributed.ReduceOp") for n in names):
        return None
    if names & DEFAULT_BACKEND and _backend_for_init(facts, dist, call):
        return None
    statement = plan_statement(facts, call)
    if names & INIT:
        if statement is None:
            return call, "`init_process_group(...)` is used as a value", "call it as a statement"
        why = _world_size_read(facts, call)
        if why is not None:
            return why
        dist.remove.add(id(statement))
        return None
    if names & DESTROY:
        if statement is None:
            return call, "`destroy_process_group()` is used as a value", "call it as a statement"
        dist.end_training.add(id(statement))
        return None
    if names & (GET_RANK | GET_WORLD_SIZE | IS_INITIALIZED | GET_BACKEND):
        if call.args:
            return call, f"`{code_of(call)}` asks about a process subgroup", "use the Accelerator's attributes"
        return None  # rewritten where it is (ACC018)
    if names & BARRIER:
        if statement is None or any(a.keyword is None or a.keyword.value != "device_ids" for a in call.args):
            return call, f"`{code_of(call)}` is not a plain barrier statement", "use `accelerator.wait_for_everyone()`"
        return None
    if names & ALL_REDUCE:
        return _all_reduce(facts, call, statement)
    if names & ALL_GATHER:
        return _all_gather(facts, dist, call, statement)
    if names & BROADCAST:
        return _broadcast(dist, call, statement)
    return (call, f"`{code_of(call.func)}` ({sorted(names)[0]}) has no Accelerate equivalent accelify knows",
            "convert this call by hand (`accelerator.gather`, `accelerator.reduce`, `broadcast_object_list` in "
            "`accelerate.utils`), then run accelify again")


def _world_size_read(facts: Facts, call: cst.Call) -> Optional[Why]:
    """``init_process_group(..., world_size=args.world_size)`` with ``args.world_size`` computed by hand
    (Barlow Twins: ``args.world_size = args.ngpus_per_node``, the GPUs of the machine) and read elsewhere
    (``args.batch_size // args.world_size``): under ``accelerate launch`` the processes are not those GPUs,
    and nothing here turns the reads into ``accelerator.num_processes``."""
    inits = {id(c) for c in facts.calls if has_qname(facts, c.func, INIT)}  # (what any set-up is handed is no read)
    for arg in call.args:
        value = arg.value
        if arg.keyword is None or arg.keyword.value != "world_size" or not isinstance(value, cst.Attribute):
            continue
        reads = [n for n in findall(facts.module, m.Attribute(attr=m.Name(value.attr.value)))
                 if code_of(n) == code_of(value) and n is not value and not inside(facts, n, inits)
                 and not isinstance(facts.get_metadata(ParentNodeProvider, n, None), cst.AssignTarget)]
        if reads:
            line = statement_line(facts, reads[0])
            where = code_of(line).strip() if line is not None else code_of(reads[0])
            return (reads[0], f"`{code_of(value)}`, the world size the process group is given, is computed by the "
                    f"script and read here (`{where}`): under `accelerate launch` the processes are the "
                    "launcher's, not what the script counted",
                    f"read `accelerator.num_processes` (or `dist.get_world_size()`) here instead of `{code_of(value)}`, "
                    "then run accelify again")
    return None


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


def _all_gather(facts: Facts, dist: Distributed, call: cst.Call,
                statement: Optional[cst.SimpleStatementLine]) -> Optional[Why]:
    """``parts = [torch.zeros_like(t) for _ in range(world_size)]`` then ``dist.all_gather(parts, t)``:
    ``parts = list(accelerator.gather(t[None]))``, the same list (rank order, one tensor each, as in
    one process), the list built beforehand gone."""
    usage = "build the list with `parts = list(accelerator.gather(t[None]))` (one tensor per process, in rank order)"
    # MoCo v3: `async_op=False`, what all_gather does anyway
    if statement is None or len(blocking(call)) != 2 or any(a.keyword is not None for a in call.args[:2]):
        return call, f"`{code_of(call)}` is not `all_gather(parts, tensor)` as a statement", usage
    parts = call.args[0].value
    ref = ref_of(facts, parts)
    assigns = facts.assigns.get(ref, []) if ref is not None else []
    if not isinstance(parts, cst.Name) or len(assigns) != 1 or not isinstance(assigns[0].value, (cst.ListComp, cst.BinaryOperation)):
        return call, f"`{code_of(parts)}` is not a list built once for this all_gather", usage
    init = facts.get_metadata(ParentNodeProvider, assigns[0], None)
    block = facts.get_metadata(ParentNodeProvider, init, None)
    if not isinstance(init, cst.SimpleStatementLine) or len(init.body) != 1 or block is not facts.get_metadata(
        ParentNodeProvider, statement, None
    ):
        return call, f"`{code_of(parts)}` is not built in the block of the all_gather", usage
    gather_line = facts.line(statement)
    if facts.line(init) >= gather_line:
        return call, f"`{code_of(parts)}` is built after the all_gather", usage
    for node in findall(facts.module, m.Name(parts.value)):
        if ref_of(facts, node) == ref and facts.line(init) < facts.line(node) < gather_line and node is not parts:
            return node, f"`{code_of(parts)}` is read before the all_gather fills it", usage
    dist.remove.add(id(init))
    dist.all_gathers.add(id(statement))
    return None


def blocking(call: cst.Call) -> list[cst.Arg]:
    """The arguments of a collective but ``async_op=False``, what it does anyway."""
    return [a for a in call.args if not (a.keyword is not None and a.keyword.value == "async_op"
                                         and code_of(a.value) == "False")]


def _broadcast(dist: Distributed, call: cst.Call, statement: Optional[cst.SimpleStatementLine]) -> Optional[Why]:
    """``dist.broadcast(t, src=0)`` (``src`` by keyword or second), as a statement, ``t`` a name or an
    attribute: ``t = broadcast(t, from_process=0)``, accelerate's function, which broadcasts in place on
    the process group Accelerate set up (and returns the tensor as it is in one process)."""
    usage = "use `t = broadcast(t, from_process=0)` (accelerate.utils)"
    arguments = blocking(call)
    if statement is None or len(arguments) != 2 or arguments[0].keyword is not None or not isinstance(
        arguments[0].value, (cst.Name, cst.Attribute)
    ) or (arguments[1].keyword is not None and arguments[1].keyword.value != "src"):
        return call, f"`{code_of(call)}` is not `broadcast(tensor, src)` of a named tensor, as a statement", usage
    dist.broadcasts.add(id(statement))
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
    """``"sum"`` / ``"mean"`` for ``all_reduce(t)``, ``all_reduce(t, op=ReduceOp.SUM)``, ... (``async_op=False``
    is what it does anyway); None otherwise."""
    op: Optional[cst.BaseExpression] = None
    for i, arg in enumerate(blocking(call)):
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


def _is_distributed_file(facts: Facts) -> bool:
    return any(has_qname(facts, c.func, INIT) for c in facts.calls)


def plan_statement(facts: Facts, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
    """The statement line ``call`` is the whole of (``init_process_group(...)`` alone on its line)."""
    expr = facts.get_metadata(ParentNodeProvider, call, None)
    line = facts.get_metadata(ParentNodeProvider, expr, None) if isinstance(expr, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def _dead_setups(facts: Facts) -> set[str]:
    """The module-level functions of the file that are :func:`dead_setup`: they go with the rest of the set-up."""
    return {name for name, func in facts.functions.items()
            if dead_setup(func, facts.module, lambda node: qualified_names(facts, node))}


def dead_setup(func: cst.FunctionDef, module: cst.Module, qualified: Callable[[cst.CSTNode], set[str]]) -> bool:
    """Does ``func`` set a process group up (``init_process_group``), build no loader, sampler, model wrapper,
    process or loop (a set-up, not a whole training), and nothing in ``module`` call or name it
    (``init_distributed_mode``, pasted with the module of helpers a spawning script imports)? It never runs there.
    ``qualified``: the qualified names of a node (the analysis's, or ACC028's before it)."""
    calls = findall(func, m.Call())
    return any(qualified(c.func) & INIT for c in calls) and not any(  # type: ignore[attr-defined]
        qualified(c.func) & (DDP | SAMPLERS | SPAWN | PROCESS | DATALOADERS) for c in calls  # type: ignore[attr-defined]
    ) and not findall(func, m.For() | m.While()) and not [
        n for n in findall(module, m.Name(func.name.value)) if n is not func.name]


def _setup_helpers(facts: Facts, dist: Distributed) -> set[str]:
    """Module-level functions whose every statement goes (``ddp_setup()``), called only as statements."""
    helpers = set()
    for name, func in facts.functions.items():
        body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
        statements = [s for s in body if not is_docstring(s)]
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
        has_qname(facts, c.func, frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"}))
        for c in findall(statement.test, m.Call())
    ):
        return all(_goes(facts, dist, s) for s in statement.body.body)  # type: ignore[attr-defined]
    return False


def _called_as_statement(facts: Facts, name: cst.Name) -> bool:
    call = facts.get_metadata(ParentNodeProvider, name, None)
    return isinstance(call, cst.Call) and call.func is name and plan_statement(facts, call) is not None


def reductions(facts: Facts, plan: Plan) -> bool:
    """``dist.all_reduce`` of counts an evaluation loop over a prepared dataloader accumulates.

    ACC011 gathers such a loop's predictions and labels (``gather_for_metrics``, which drops
    the samples ``prepare`` repeats to even out the last batch): its counts are then the whole
    set's on every process, and the all-reduce, which would add them up N times, goes.  When
    ACC011 cannot gather the loop, the reduced counts would include the repeated samples:
    False (ACC126).  Any other all-reduce (a training loss averaged for the log) becomes
    ``accelerator.reduce``.
    """
    dist = plan.distributed
    if dist is None:
        return True
    for call in facts.calls:
        statement = plan_statement(facts, call)
        if statement is None or id(statement) in dist.remove:
            continue
        gathers = id(statement) in dist.all_gathers
        if not gathers and not has_qname(facts, call.func, ALL_REDUCE):
            continue
        func = enclosing_function(facts, call)
        scope: cst.CSTNode = func if func is not None else facts.module
        names = {n.value for n in findall(call.args[1 if gathers else 0].value, m.Name())}
        for _ in range(3):  # `t = torch.tensor([correct, total])`: what the reduced tensor is made of
            for assign in findall(scope, m.Assign()):
                if {n for t in assign.targets for n in assigned_names(t.target)} & names:  # type: ignore[attr-defined]
                    names |= {n.value for n in findall(assign.value, m.Name())}  # type: ignore[attr-defined]
        for loop in facts.loops:
            if not inside(facts, loop, {id(scope)}) or facts.line(loop) > facts.line(call):
                continue
            if not _counted(loop) & names:
                continue
            if gathers:
                facts.finding(
                    plan, call, "ACC126", f"`{code_of(call)}` collects counts of an evaluation loop: over a prepared "
                    "loader they are either gathered already (ACC011: the all_gather would count them N times) or "
                    "include the samples `prepare` repeats. File not converted.",
                    "gather the predictions and labels with `accelerator.gather_for_metrics(...)` and drop the all_gather",
                )
                plan.distributed = None
                return False
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
    return _reduced_by_helper(facts, plan)


def _counted(loop: cst.For) -> set[str]:
    """What a loop counts into: ``correct += ...``, and ``counts[0] += ...`` into a tensor of counts."""
    return {n for aug in findall(loop.body, m.AugAssign()) for n in assigned_names(  # type: ignore[attr-defined]
        aug.target.value if isinstance(aug.target, cst.Subscript) else aug.target)}  # type: ignore[attr-defined]


def _reduced_by_helper(facts: Facts, plan: Plan) -> bool:
    """False (ACC126) when the counts of an evaluation loop ACC011 gathers are then handed to a function of
    the file that all-reduces what it is given (WZMIAOMIAO's ``sum_num = reduce_value(sum_num, average=False)``):
    gathered, they are the whole set's on every process already, and the helper (kept: it also reduces
    other values, a loss for the log) would add them up once per process."""
    reducing = {func.name.value for func in facts.functions.values() if any(
        has_qname(facts, c.func, ALL_REDUCE) and c.args and isinstance(c.args[0].value, cst.Name)
        and c.args[0].value.value in {p.name.value for p in func.params.params}
        for c in findall(func, m.Call()))}
    for call in facts.calls:
        if not isinstance(call.func, cst.Name) or call.func.value not in reducing:
            continue
        handed = {n.value for a in call.args for n in findall(a.value, m.Name())}
        func = enclosing_function(facts, call)
        scope: cst.CSTNode = func if func is not None else facts.module
        for loop in facts.loops:
            if not inside(facts, loop, {id(scope)}) or facts.line(loop) > facts.line(call):
                continue
            counted = _counted(loop)
            if counted & handed and isinstance(find_gather(facts, loop, plan), Gather):
                statement = _returned_reduction(facts, call, counted)
                if statement is not None and plan.distributed is not None:
                    plan.distributed.remove.add(id(statement))
                    plan.distributed.gathered.add(id(statement))
                    break
                facts.finding(
                    plan, call, "ACC126", f"`{code_of(call)}` adds up over the processes the counts of an evaluation "
                    f"loop that are gathered (ACC011): gathered, they are the whole set's on every process, and "
                    f"`{call.func.value}` would count them once per process. File not converted.",
                    f"all-reduce these counts in this function (`dist.all_reduce(...)`, which accelify drops once "
                    f"they are gathered) instead of through `{call.func.value}`, then run accelify again",
                )
                plan.distributed = None
                return False
    return True


def _returned_reduction(facts: Facts, call: cst.Call, counted: set[str]) -> Optional[cst.SimpleStatementLine]:
    """``sum_num = reduce_value(sum_num, average=False)`` alone on its line, the helper all-reducing (a sum) the
    parameter it is handed first, maybe dividing it by the world size, and returning it on every path: on the counts
    ACC011 gathers (the same on every process) that is the identity, so the statement goes with the gather. None
    for any other shape (the helper returns something else, reduces with another op, is handed more)."""
    small = facts.get_metadata(ParentNodeProvider, call, None)
    statement = facts.get_metadata(ParentNodeProvider, small, None) if isinstance(small, cst.Assign) else None
    func = facts.functions.get(call.func.value)  # type: ignore[attr-defined]
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or func is None or (
            not call.args or call.args[0].keyword is not None):
        return None
    target = small.targets[0].target if len(small.targets) == 1 else None  # type: ignore[union-attr]
    counted_name = call.args[0].value
    if not (isinstance(target, cst.Name) and isinstance(counted_name, cst.Name) and target.value == counted_name.value
            and target.value in counted and small.value is call):  # type: ignore[union-attr]
        return None
    params = func.params.params
    if not params:
        return None
    param = params[0].name.value
    reduces = [c for c in findall(func, m.Call()) if has_qname(facts, c.func, ALL_REDUCE)]
    returns = findall(func, m.Return())
    if len(reduces) != 1 or not returns or any(not m.matches(r.value, m.Name(param)) for r in returns):  # type: ignore[attr-defined]
        return None
    reduce = reduces[0]
    if not reduce.args or not m.matches(reduce.args[0].value, m.Name(param)) or reduce_op(facts, reduce) != "sum":
        return None
    return statement  # type: ignore[return-value]


DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
) | DDP  # a script that wraps its model in DDP itself (ACC018 removes the rest of its plumbing)
