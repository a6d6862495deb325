"""DistributedSamplers: the ones ``prepare`` replaces, given to a DataLoader directly, through a name
used only there and for ``set_epoch``, or as ``DistributedSampler(ds) if distributed else None``.

Input: the facts, ``plan.distributed``.  Output: ``samplers``/``sampler_names`` of
``plan.distributed``, or why a sampler cannot go (ACC126, through the distributed analysis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts
from accelify.analyses.ranks import Why, launch_polarity, rank_attribute
from accelify.queries.blocks import inside
from accelify.queries.names import DATALOADERS, code_of, has_qname, qualified_names
from accelify.queries.refs import ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.distributed import Distributed
    from accelify.analyses.plan import Plan


SAMPLERS = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)


def recognise_sampler(facts: Facts, plan: Plan, dist: Distributed, call: cst.Call) -> Optional[Why]:
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
    chosen = _single_process_choice(facts, call, parent)
    if chosen is not None:
        # `RandomSampler(ds) if args.local_rank == -1 else DistributedSampler(ds)`: the single-process path's
        # sampler, which `prepare` shards
        dist.sampler_choices[id(parent)] = chosen
        return None
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
            size = _counted_size(call) if isinstance(up, cst.Attribute) and up.attr.value == "total_size" else None
            if size is not None:
                dist.sizes[id(up)] = size
                continue
            if _shuffle_unless_sampler(facts, up):
                continue  # `shuffle=(sampler is None)`: the DataLoader gets the sampler's shuffle instead
            if _batched(facts, dist, use, call):
                continue  # `BatchSampler(sampler, batch_size, drop_last=True)` handed to one DataLoader
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


def _counted_size(sampler: cst.Call) -> Optional[str]:
    """``len(dataset)`` for ``DistributedSampler(dataset)`` (the dataset a name): what its ``total_size`` stands
    for once the loader is prepared. ``total_size`` is the dataset padded to a multiple of the processes, each
    process's share counted once; ``gather_for_metrics`` drops what ``prepare`` repeats, so the counts gathered
    (ACC011) cover the dataset exactly (in one process the two are the same)."""
    dataset = sampler.args[0].value if sampler.args and sampler.args[0].keyword is None else None
    return f"len({dataset.value})" if isinstance(dataset, cst.Name) else None


def _single_process_choice(facts: Facts, call: cst.Call, parent: Optional[cst.CSTNode]) -> Optional[str]:
    """``"body"`` or ``"orelse"``: the branch of ``RandomSampler(ds) if args.local_rank == -1 else
    DistributedSampler(ds)`` (or ``DistributedSampler(ds) if args.local_rank != -1 else RandomSampler(ds)``) that the
    run without a launcher takes, when ``call`` is the other and that one is a sampler of no process group."""
    if not isinstance(parent, cst.IfExp) or call not in (parent.body, parent.orelse):
        return None
    polarity = launch_polarity(facts, parent.test, [])
    if polarity is None or (call is parent.body) != polarity:
        return None
    other = parent.orelse if call is parent.body else parent.body
    if not isinstance(other, cst.Call) or any(n.startswith("torch.distributed") or n.endswith("DistributedSampler")
                                               for n in qualified_names(facts, other.func)):
        return None
    return "orelse" if call is parent.body else "body"


_BATCH_SAMPLERS = frozenset({"torch.utils.data.BatchSampler", "torch.utils.data.sampler.BatchSampler"})


def _batched(facts: Facts, dist: Distributed, use: cst.CSTNode, sampler: cst.Call) -> bool:
    """``batches = BatchSampler(sampler, batch_size, drop_last=True)``, ``batches`` bound once and handed only
    to one ``DataLoader(..., batch_sampler=batches)`` that sets no batch size, shuffle or sampler of its own:
    that DataLoader becomes ``DataLoader(..., batch_size=batch_size, shuffle=<the sampler's>,
    drop_last=True)``, which ``prepare`` shards (the references' and many course scripts' way)."""
    arg = facts.get_metadata(ParentNodeProvider, use, None)
    call = facts.get_metadata(ParentNodeProvider, arg, None)
    if not isinstance(arg, cst.Arg) or not isinstance(call, cst.Call) or call.args[0] is not arg or arg.keyword is not None:
        return False
    if not has_qname(facts, call.func, _BATCH_SAMPLERS) or len(call.args) > 3:
        return False
    named = {a.keyword.value if a.keyword is not None else ("sampler", "batch_size", "drop_last")[i]: a.value
             for i, a in enumerate(call.args)}
    size, drop = named.get("batch_size"), named.get("drop_last", cst.Name("False"))
    if size is None or not isinstance(size, (cst.Name, cst.Attribute, cst.Integer)):
        return False
    assign = facts.get_metadata(ParentNodeProvider, call, None)
    line = facts.get_metadata(ParentNodeProvider, assign, None)
    if not isinstance(assign, cst.Assign) or facts.single_target(assign) is None or not isinstance(line, cst.SimpleStatementLine):
        return False
    ref = facts.single_target(assign)
    if len(facts.assigns.get(ref, [])) != 1:  # type: ignore[arg-type]
        return False
    uses = [n for n in findall(facts.module, m.Name() | m.Attribute())
            if ref_of(facts, n) == ref and n is not assign.targets[0].target]
    if len(uses) != 1:
        return False
    given = facts.get_metadata(ParentNodeProvider, uses[0], None)
    loader = facts.get_metadata(ParentNodeProvider, given, None)
    if not isinstance(given, cst.Arg) or given.keyword is None or given.keyword.value != "batch_sampler" or not (
        isinstance(loader, cst.Call) and has_qname(facts, loader.func, DATALOADERS)
    ):
        return False
    own = {a.keyword.value for a in loader.args if a.keyword is not None}
    if own & {"batch_size", "shuffle", "sampler", "drop_last"}:
        return False
    dist.batch_samplers[ref] = (sampler_shuffle(sampler), size, drop)  # type: ignore[index]
    dist.remove.add(id(line))
    return True


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


def sets_sampler_epoch(facts: Facts, dist: Distributed, call: cst.Call) -> bool:
    """``sampler.set_epoch(epoch)`` on a sampler that goes, or ``loader.sampler.set_epoch(epoch)``."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if ref_of(facts, receiver) in dist.sampler_names:
        return True
    return isinstance(receiver, cst.Attribute) and receiver.attr.value == "sampler" and bool(
        findall(facts.module, m.Call(func=m.Attribute(attr=m.Name("DistributedSampler")) | m.Name("DistributedSampler")))
    )


def own_samplers(facts: Facts, plan: Plan) -> bool:
    """A DataLoader built with a sampler of its own (not a DistributedSampler, which ACC018 removes):
    ``prepare`` shards its batches (and keeps a sampler with a ``generator`` in step across processes,
    seeding it: ``SubsetRandomSampler`` and ``WeightedRandomSampler`` shard correctly), but the prepared
    loader's ``.sampler`` is another one, over the whole dataset: ``len(loader.sampler)`` (the Udacity
    notebooks' average) changes even in one process.  ACC130 then, file unchanged."""
    loaders = plan.refs(plan.dataloaders)
    for call in facts.calls:
        if not has_qname(facts, call.func, DATALOADERS):
            continue
        arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "sampler"), None)
        if arg is None and len(call.args) > 3 and all(a.keyword is None for a in call.args[:4]):
            arg = call.args[3]  # DataLoader(dataset, batch_size, shuffle, sampler)
        if arg is None or m.matches(arg.value, m.Name("None")):
            continue
        sampler = _sampler_call(facts, arg.value)
        if sampler is not None and has_qname(facts, sampler.func, SAMPLERS):
            continue  # a DistributedSampler: ACC018 removes it (or refuses the file)
        holder = _loader_holder(facts, call)
        if holder is None or holder not in loaders:
            continue
        removed = plan.distributed.remove if plan.distributed is not None else set()
        for node in findall(facts.module, m.Attribute(attr=m.Name("sampler"))):
            if ref_of(facts, node.value) != holder or inside(facts, node, removed):  # type: ignore[attr-defined]
                continue  # (`loader.sampler.set_epoch(epoch)` of the launched path goes with it)
            facts.finding(
                plan, node, "ACC130",
                f"`{code_of(node)}` reads the sampler the DataLoader was built with; after `prepare` it is "
                "another one, over the whole dataset (`len(...)` of it changes even in one process). File "
                "not converted.",
                f"read the sampler from what it was built with (`{code_of(arg.value)}`) instead",
            )
            return False
    return True


def _sampler_call(facts: Facts, value: cst.BaseExpression) -> Optional[cst.Call]:
    """The sampler construction ``value`` is or names (a name bound once), else None."""
    if isinstance(value, cst.Call):
        return value
    ref = ref_of(facts, value)
    assigns = facts.assigns.get(ref, []) if ref is not None else []
    if len(assigns) == 1 and isinstance(assigns[0].value, cst.Call):
        return assigns[0].value
    return None


def _loader_holder(facts: Facts, call: cst.Call):
    """The ref the DataLoader ``call`` is bound to (``loader = DataLoader(...)``), else None."""
    parent = facts.get_metadata(ParentNodeProvider, call, None)
    if isinstance(parent, cst.Assign):
        return facts.single_target(parent)
    return None
