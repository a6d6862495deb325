"""Gradient accumulation: a hand-written one becomes ``Accelerator(gradient_accumulation_steps=N)``.

:mod:`accelify.analyses.manual_accumulation` tells whether a loop over a prepared dataloader accumulates by hand
exactly as ``accelerator.accumulate`` would (``match``); this analysis adds what the rest of the
file must allow: one such loop, a plain optimizer (no ACC118 wrapper) and schedulers that do not
read ``_step_count``, one backward, the Accelerator in reach, and an N it can read where it is
created.

Input: the facts' loops and backwards, the prepared dataloaders, whether the optimizer is
wrapped, the per-batch schedulers' constructions (from :mod:`~accelify.analyses.schedulers`),
:class:`~accelify.analyses.accelerator.Arguments` for N.  Output: ``plan.accumulation_steps``;
ACC117 for a loop kept as it is (the file is still converted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analyses.accelerator import Arguments
from accelify.analyses.facts import Facts
from accelify.analyses.manual_accumulation import looks_manual, match
from accelify.analyses.objects import SCHEDULER_FACTORY, TORCH_SCHEDULER_PREFIX
from accelify.queries.loops import peel_iterable
from accelify.queries.names import qualified_names
from accelify.queries.refs import key_at, ref_of

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def decide(facts: Facts, plan: Plan, wrapped: bool, scheduler_calls: list[cst.Call], arguments: Arguments) -> None:
    """Replace a hand-written accumulation by Accelerate's when the update is provably the same (ACC117 else)."""
    loops = [
        loop for loop in facts.loops
        if ref_of(facts, peel_iterable(facts, loop.iter)) in plan.flow["loader"] and looks_manual(loop)
    ]
    for loop in loops:
        found = match(facts, loop, plan)
        reason = found if isinstance(found, str) else None
        if reason is None and plan.has_accelerator:
            # said only where the loop would convert otherwise: a loop that cannot convert says why, the
            # same before and after a conversion that added the Accelerator
            reason = "the script already has an Accelerator"
        if reason is None:
            if len(loops) != 1:
                reason = "more than one loop accumulates gradients"
            elif wrapped:
                reason = "the optimizer is wrapped (ACC118)"
            elif not all(_plain_scheduler(facts, c) for c in scheduler_calls):
                reason = ("a prepared scheduler that is not a plain `torch.optim.lr_scheduler` one (Accelerate "
                          "counts the accumulated batches in `_step_count`, which OneCycleLR reads)")
            elif len(facts.backwards) != 1:
                reason = "the file calls `.backward()` more than once, and the Accelerator divides every loss"
            elif plan.accelerator_in(key_at(facts, loop)) is None:
                reason = "this loop cannot reach the Accelerator"
            elif not arguments.available(found.steps, found.steps):  # type: ignore[union-attr]
                reason = "N is not known where the Accelerator is created"
        if reason is not None:
            facts.finding(
                plan, loop, "ACC117", f"gradient accumulation done by hand is kept as it is: {reason}.",
                "create `Accelerator(gradient_accumulation_steps=N)`, put the loop body under "
                "`with accelerator.accumulate(model):`, drop the division by N and step when "
                "`accelerator.sync_gradients` (every N batches and at the end of the dataloader).",
            )
            continue
        plan.accumulation_steps = arguments.use(found.steps)  # type: ignore[union-attr]


def _plain_scheduler(facts: Facts, call: cst.Call) -> bool:
    """A scheduler whose learning rate does not depend on ``_step_count`` under ``accumulate``."""
    names = qualified_names(facts, call.func)
    if any(n.endswith("OneCycleLR") for n in names):
        return False
    return any(n.startswith(TORCH_SCHEDULER_PREFIX) or SCHEDULER_FACTORY.search(n) for n in names)
