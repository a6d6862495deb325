"""Schedulers: which are prepared with the optimizers, and where ``prepare`` must wait for one.

``accelerator.prepare`` wraps a scheduler so that it steps once per process per optimizer step:
right for a scheduler stepped once per batch, wrong for one stepped once per epoch (it would
count once per process), so only per-batch schedulers are prepared.  A per-batch scheduler sized
from ``len(dataloader)`` before ``prepare`` shards the dataloader decays N times too slowly:
``prepare`` goes after it when it can (``plan.sized_early``).

Input: the setup scope's assignments, the optimizers, the facts' ``.step()`` calls, the prepared
dataloaders (``plan.flow["loader"]``).  Output: ``plan.schedulers``, ``plan.sized_early``, and
the constructions of the per-batch schedulers (the accumulation analysis reads them); refusal
ACC122 (a scheduler stepped both per batch and per epoch), ACC113 (sized too early, not moved).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts
from accelify.analyses.objects import is_scheduler
from accelify.queries.blocks import scope_root, simple_assign
from accelify.queries.loops import enclosing_loop_over, enumerate_counter
from accelify.queries.names import PLATEAU_SCHEDULERS, assigned_names, has_qname, read_names
from accelify.queries.refs import Ref, ref_of
from accelify.queries.training import locate_setup, trains
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def decide(
    facts: Facts, plan: Plan, in_owner: dict[Ref, list[cst.Assign]], optimizers: set[Ref]
) -> Optional[list[cst.Call]]:
    """The constructions of the per-batch schedulers, which go into ``plan.schedulers``; None when the
    file must stay as it is."""
    calls: list[cst.Call] = []
    found = []
    for ref, assigns in in_owner.items():
        for a in assigns:
            if ref not in optimizers and isinstance(a.value, cst.Call) and facts.single_target(a) == ref:
                # a ReduceLROnPlateau is never prepared: the wrapper would step it N times on one value (ACC032)
                if is_scheduler(facts, a.value, optimizers) and not has_qname(facts, a.value.func, PLATEAU_SCHEDULERS):
                    found.append((ref, a))
    for ref, assign in sorted(found, key=lambda x: facts.line(x[1])):
        stepping = _stepping(facts, plan, ref)
        if stepping == "mixed":
            facts.finding(
                plan, assign, "ACC122",
                f"`{ref[1]}` is stepped both once per batch and outside the loop over the dataloader: prepared, "
                "its per-epoch steps would count once per process; not prepared, its per-batch steps would "
                "count the shard's batches only. Its learning rates would differ from one process; file not "
                "converted.",
                "step the scheduler in one place (per batch, or per epoch), or use two schedulers.",
            )
            return None
        if stepping == "batch":
            plan.schedulers.append(ref[1])
            calls.append(assign.value)  # type: ignore[arg-type]
    _early_lengths(facts, plan, found)
    return calls


def _early_lengths(facts: Facts, plan: Plan, found: list[tuple[Ref, cst.Assign]]) -> None:
    """A per-batch scheduler built after the objects but sized from ``len(dataloader)`` taken before
    them (``t_total = len(train_dataloader) * epochs``) counts the batches of one process: ``prepare``
    goes after it and takes it too, so that it steps once per process per batch, the schedule of one
    process. ACC113 when it cannot (bound under a condition, or code before it reads the loaders)."""
    root = scope_root(facts.module, plan.setup)
    located = locate_setup(root, set(plan.anchors()), facts.trainers) if root is not None else None
    if located is None:
        return
    block, index = located
    length = m.Call(func=m.Name("len"), args=[m.Arg(m.Name())])
    assigns = [a for stmt in block.body[:index] if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
               for a in findall(stmt, m.Assign())]
    early: set[str] = set()
    changed = True
    while changed:  # t_total = steps_per_epoch * epochs, steps_per_epoch = len(loader) // accumulation
        changed = False
        for assign in assigns:
            reads = {n.value for n in findall(assign.value, m.Name())}  # type: ignore[attr-defined]
            lens = {c.args[0].value.value for c in findall(assign.value, length)}  # type: ignore[attr-defined]
            if lens & set(plan.dataloaders) or reads & early:
                targets = {n for t in assign.targets for n in assigned_names(t.target)}  # type: ignore[attr-defined]
                if not targets <= early:
                    early |= targets
                    changed = True
    rest = block.body[index:]
    late = {id(a) for stmt in rest if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) for a in findall(stmt, m.Assign())}
    for ref, assign in found:
        if id(assign) not in late or not _stepped_per_batch(facts, plan, ref):
            continue
        if not {n.value for n in findall(assign.value, m.Name())} & early:  # type: ignore[attr-defined]
            continue
        at = next((i for i, stmt in enumerate(rest) if simple_assign(stmt) is assign), None)
        between = rest[:at] if at is not None else []
        if at is not None and not any(trains(stmt, facts.trainers, frozenset(plan.core())) for stmt in between) and not any(
            n.value in plan.dataloaders for stmt in between for n in read_names(stmt)
        ):
            plan.sized_early.append(ref[1])
            continue
        facts.finding(
            plan, assign, "ACC113",
            "this scheduler steps once per batch of the prepared (sharded) dataloader, but is sized from "
            "`len(dataloader)` taken before `prepare`: with N processes it decays N times too slowly.",
            "compute the number of steps after `accelerator.prepare(...)`, from the prepared dataloader, or "
            "build the scheduler right after the optimizer and pass it to `prepare` too.",
        )


def _stepped_per_batch(facts: Facts, plan: Plan, scheduler: Ref) -> bool:
    """Stepped once per optimizer step: every ``.step()`` of it sits in a loop over a dataloader."""
    return _stepping(facts, plan, scheduler) == "batch"


def _stepping(facts: Facts, plan: Plan, scheduler: Ref) -> Optional[str]:
    """Where the scheduler's ``.step()`` calls sit: "batch" (all in loops over a dataloader),
    "epoch" (none), "mixed" (some of each), None (never stepped).

    A loop over the dataloader that ends after a number of iterations (inside ``while cur_itrs <
    total_itrs:``, or left by a ``break``/``return``/``sys.exit()`` under a test of a counter it
    increments) runs as many iterations on N processes as on one: prepared, its scheduler would
    step N times per iteration and pass the end of its schedule after 1/N of the run. Its steps
    count as per-epoch ones (not prepared: once per iteration, the schedule of one process)."""
    steps = [s for s in facts.steps if ref_of(facts, s.func.value) == scheduler]  # type: ignore[attr-defined]
    inside = []
    for step in steps:
        loop = _loader_loop(facts, plan, step)
        inside.append(loop is not None and not _iteration_bounded(facts, loop))
    if not inside:
        return None
    return "batch" if all(inside) else "epoch" if not any(inside) else "mixed"


def _loader_loop(facts: Facts, plan: Plan, node: cst.CSTNode) -> Optional[cst.For]:
    return enclosing_loop_over(facts, node, plan.flow["loader"])


def _in_loader_loop(facts: Facts, plan: Plan, node: cst.CSTNode) -> bool:
    return _loader_loop(facts, plan, node) is not None


_EXITS = m.Break() | m.Return() | m.Raise() | m.Call(func=m.Attribute(value=m.Name("sys"), attr=m.Name("exit"))
                                                       | m.Name("exit") | m.Name("quit"))


def _optional_bound(test: cst.BaseExpression) -> bool:
    """``args.max_steps > 0 and global_step > args.max_steps`` (``0 < max_steps < step``): a bound that is
    off by default, the epochs bounding the loop then (Hugging Face's examples, JointBERT)."""
    return any(
        isinstance(comparison.left, cst.Integer) and comparison.left.value == "0"
        or any(isinstance(target.comparator, cst.Integer) and target.comparator.value == "0"
               for target in comparison.comparisons)
        for comparison in findall(test, m.Comparison())
    )


def _iteration_bounded(facts: Facts, loop: cst.For) -> bool:
    """Does ``loop`` (over a dataloader) end after a number of iterations rather than with the data?"""
    parent = facts.get_metadata(ParentNodeProvider, loop, None)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.While):
            return True
        parent = facts.get_metadata(ParentNodeProvider, parent, None)
    counters = {n for a in findall(loop.body, m.AugAssign(target=m.Name())) for n in assigned_names(a.target)}  # type: ignore[attr-defined]
    counters |= enumerate_counter(loop)
    for exit_ in findall(loop.body, _EXITS):
        node = facts.get_metadata(ParentNodeProvider, exit_, None)
        while node is not None and node is not loop:
            if isinstance(node, (cst.For, cst.While, cst.FunctionDef)):
                break  # it leaves an inner loop or function, not this one
            if isinstance(node, cst.If) and {n.value for n in read_names(node.test)} & counters \
                    and not _optional_bound(node.test):
                return True
            node = facts.get_metadata(ParentNodeProvider, node, None)
    return False
