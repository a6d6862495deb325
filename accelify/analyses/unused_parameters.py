"""Models with a part that gets no gradient: DDP needs ``find_unused_parameters=True``.

A model whose ``forward`` runs a submodule under ``torch.no_grad()`` (a pretrained backbone used
as a fixed feature extractor, yunjey's image-captioning ``EncoderCNN``) while that submodule's
parameters still require grad, or cuts a computed value off the graph (``.detach()``, ``.data``),
trains fine in one process. Prepared on N processes it is wrapped in
``DistributedDataParallel``, which waits for a gradient of every parameter that requires one: the
second step fails with "Expected to have finished reduction in the prior iteration". The
Accelerator is then created with ``DistributedDataParallelKwargs(find_unused_parameters=True)``
(slower, never wrong); a submodule whose parameters the file freezes (``requires_grad = False``,
``requires_grad_(False)``) is not one of these.

Input: the facts (the module, its classes), the prepared models (``plan.models``). Output:
``plan.ddp_kwargs`` and ``plan.unused_parameters`` (the classes, for the change message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from accelify.analyses.facts import Facts
from accelify.queries.names import has_qname
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})
FIND_UNUSED = "find_unused_parameters=True"


def decide(facts: Facts, plan: Plan) -> None:
    """Record the prepared models' classes that run a trainable part without gradients."""
    classes = {c.name.value: c for c in facts.module.body if isinstance(c, cst.ClassDef)}
    built = set()
    for assign in findall(facts.module, m.Assign(value=m.Call())):
        names = {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}  # type: ignore[attr-defined]
        value = assign.value  # type: ignore[attr-defined]
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            value = value.func.value  # Encoder().to(device)
        if names & set(plan.models) and m.matches(value, m.Call(func=m.Name())):
            built.add(value.func.value)  # type: ignore[attr-defined]
    frozen = _frozen_attributes(facts.module)
    for name in sorted(built & set(classes)):
        if _runs_without_grad(facts, classes[name], frozen):
            plan.unused_parameters.append(name)
    if plan.unused_parameters and FIND_UNUSED not in plan.ddp_kwargs:
        plan.ddp_kwargs.append(FIND_UNUSED)


def _runs_without_grad(facts: Facts, cls: cst.ClassDef, frozen: set[str]) -> bool:
    """``forward`` calls ``self.<part>(...)`` inside ``with torch.no_grad():`` for a part not frozen, or
    cuts a result off the graph (``.detach()``, ``.data``: L1aoXingyu's sequence tagger feeds
    ``self.char_lstm(...).cpu().data`` on, so the character LSTM never gets a gradient)."""
    for function in findall(cls, m.FunctionDef(name=m.Name("forward"))):
        cut = findall(function, m.Call(func=m.Attribute(attr=m.Name("detach"))) | m.Attribute(attr=m.Name("data")))
        if any(not _attribute_of_self(node) for node in cut):
            return True  # `self.head.weight.data` reads a parameter; anything else cuts a computed value
        for block in findall(function, m.With()):
            if not any(isinstance(i.item, cst.Call) and has_qname(facts, i.item.func, _NO_GRAD)
                       for i in block.items):  # type: ignore[attr-defined]
                continue
            for call in findall(block.body, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name()))):
                if call.func.attr.value not in frozen:  # type: ignore[attr-defined]
                    return True
    return False


def _frozen_attributes(module: cst.Module) -> set[str]:
    """``self.resnet`` frozen somewhere: ``for p in self.resnet.parameters(): p.requires_grad = False``,
    ``self.resnet.requires_grad_(False)``."""
    frozen = set()
    for loop in findall(module, m.For(iter=m.Call(func=m.Attribute(attr=m.Name("parameters"))))):
        owner = loop.iter.func.value  # type: ignore[attr-defined]
        if m.matches(owner, m.Attribute(value=m.Name("self"), attr=m.Name())) and findall(
                loop.body, m.Assign(targets=[m.AssignTarget(m.Attribute(attr=m.Name("requires_grad")))],
                                    value=m.Name("False"))):
            frozen.add(owner.attr.value)  # type: ignore[attr-defined]
    for call in findall(module, m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name()),
                                                        attr=m.Name("requires_grad_")),
                                       args=[m.Arg(m.Name("False"))])):
        frozen.add(call.func.value.attr.value)  # type: ignore[attr-defined]
    return frozen


def _attribute_of_self(node: cst.CSTNode) -> bool:
    """``self.head.weight.data``: attributes all the way down to ``self``, no call (a parameter)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return m.matches(node, m.Name("self"))
