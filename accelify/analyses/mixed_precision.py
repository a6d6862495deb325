"""Mixed precision: a script's GradScaler and autocast become the Accelerator's ``mixed_precision``.

``scaler = GradScaler()``, ``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``,
``scaler.update()`` and ``with autocast(dtype=torch.float16):`` are what
``Accelerator(mixed_precision="fp16")`` does through ``accelerator.backward`` and
``accelerator.autocast()``.  They are replaced only when every use is one the Accelerator maps,
with one precision and one ``enabled=`` switch it can read where it is created.

Input: the setup scope's GradScalers, the facts' autocast calls, whether the optimizer is wrapped
(ACC118), :class:`~accelify.analyses.accelerator.Arguments` for the switch.  Output:
``plan.mixed_precision``, ``plan.scalers``; ACC112 when they are left as they are (the file is
still converted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.accelerator import Arguments
from accelify.analyses.facts import Facts
from accelify.queries.names import code_of, has_qname, qualified_names, string_value
from accelify.queries.refs import Ref, key_at, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

GRAD_SCALERS = frozenset(
    {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
     "torch.amp.grad_scaler.GradScaler"}
)
AUTOCASTS = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast_mode.autocast",
     "torch.cuda.amp.autocast_mode.autocast"}
)


def decide(
    facts: Facts, plan: Plan, in_owner: dict[Ref, list[cst.Assign]], wrapped: bool, arguments: Arguments
) -> None:
    """Replace a GradScaler and autocast by the Accelerator's, when every use is one it can map."""
    scalers = [
        (ref, a) for ref, assigns in in_owner.items() for a in assigns
        if isinstance(a.value, cst.Call) and has_qname(facts, a.value.func, GRAD_SCALERS)
    ]
    autocasts = [c for c in facts.calls if has_qname(facts, c.func, AUTOCASTS)]
    if not scalers and not autocasts:
        return
    anchor = scalers[0][1] if scalers else autocasts[0]

    def refuse(why: str) -> None:
        facts.finding(plan, anchor, "ACC112", f"mixed precision left as it is: {why}.",
                      'create the Accelerator with `mixed_precision="fp16"` (or "bf16"), call '
                      "`accelerator.backward(loss)` and use `with accelerator.autocast():`.")

    if plan.has_accelerator:
        return refuse("the script already has an Accelerator")
    if wrapped:
        return refuse("the optimizer is wrapped (ACC118), `prepare` would not unscale its gradients")
    if len(scalers) > 1 or len({r for r, _ in scalers}) > 1:
        return refuse("more than one GradScaler")
    precisions = set()
    switches: list[tuple[Optional[cst.BaseExpression], cst.CSTNode]] = []
    if scalers:
        ref, assign = scalers[0]
        switch = _scaler_switch(facts, assign.value)  # type: ignore[arg-type]
        if switch is False:
            return refuse("the GradScaler has arguments Accelerate does not take from it")
        switches.append((switch, assign))  # type: ignore[arg-type]
        if not _scaler_uses_ok(facts, plan, ref):
            return refuse("the GradScaler is used beyond `scale(loss).backward()`, `step`, `update` and `unscale_`")
        precisions.add("fp16")
    for call in autocasts:
        found = _autocast_precision(facts, plan, call)
        if found is None:
            return refuse("an autocast that is not a plain `with` on CUDA with a float16/bfloat16 dtype")
        precision, switch = found
        precisions.add(precision)
        switches.append((switch, call))
    if len(precisions) != 1:
        return refuse("float16 and bfloat16 are mixed")
    flags = {None if flag is None else "".join(code_of(flag).split()) for flag, _ in switches}
    if len(flags) != 1:
        if None in flags:
            return refuse("mixed precision is switched by `enabled=` in some places only")
        return refuse("mixed precision is switched by different flags")
    precision = f'"{precisions.pop()}"'
    flag = switches[0][0]
    if flag is not None:
        if not all(arguments.available(f, at) for f, at in switches):  # type: ignore[arg-type]
            return refuse("the `enabled=` flag is not known where the Accelerator is created")
        text = arguments.use(flag)
        if not isinstance(flag, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            text = f"({text})"
        precision = f'{precision} if {text} else "no"'
    plan.mixed_precision = precision
    plan.scalers = {r[1] for r, _ in scalers}


def _scaler_switch(facts: Facts, call: cst.Call):
    """None (always on), the ``enabled=`` expression, or False when an argument cannot be mapped."""
    generic = has_qname(facts, call.func, frozenset({"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}))
    switch = None
    for i, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword is None and generic and i == 0:
            keyword = "device"
        if keyword == "device":
            if string_value(arg.value) != "cuda":
                return False
        elif keyword == "enabled":
            switch = _switch(arg.value)
            if switch is False:
                return False
        else:
            return False
    return switch


def _scaler_uses_ok(facts: Facts, plan: Plan, ref: Ref) -> bool:
    name = ref[1]
    if name.startswith("self."):
        nodes = findall(facts.module, m.Attribute(value=m.Name("self"), attr=m.Name(name[5:])))
    else:
        nodes = findall(facts.module, m.Name(name))
    for node in nodes:
        if ref_of(facts, node) != ref:
            continue
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.AssignTarget):
            continue
        call = facts.get_metadata(ParentNodeProvider, parent, None) if parent is not None else None
        if not (isinstance(parent, cst.Attribute) and isinstance(call, cst.Call) and call.func is parent):
            return False
        if parent.attr.value == "scale":
            outer = facts.get_metadata(ParentNodeProvider, call, None)
            backward = facts.get_metadata(ParentNodeProvider, outer, None) if outer is not None else None
            if not (m.matches(outer, m.Attribute(attr=m.Name("backward"))) and isinstance(backward, cst.Call)):
                return False
        elif parent.attr.value not in ("step", "update", "unscale_"):
            return False
        if plan.accelerator_in(key_at(facts, node)) is None:
            return False
    return True


def _autocast_precision(
    facts: Facts, plan: Plan, call: cst.Call
) -> Optional[tuple[str, Optional[cst.BaseExpression]]]:
    """("fp16"|"bf16", the ``enabled=`` flag or None) of a ``with`` autocast accelify can map."""
    if not isinstance(facts.get_metadata(ParentNodeProvider, call, None), cst.WithItem):
        return None
    if plan.accelerator_in(key_at(facts, call)) is None:
        return None
    generic = not has_qname(facts, call.func, frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}))
    dtype: Optional[cst.BaseExpression] = None
    switch: Optional[cst.BaseExpression] = None
    for i, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword is None and generic and i == 0:
            keyword = "device_type"
        elif keyword is None and generic and i == 1:
            keyword = "dtype"
        if keyword == "device_type":
            if string_value(arg.value) != "cuda":
                return None
        elif keyword == "dtype":
            dtype = arg.value
        elif keyword == "enabled":
            found = _switch(arg.value)
            if found is False:
                return None
            switch = found  # type: ignore[assignment]
        else:
            return None  # cache_enabled=, or positional flags: not mapped
    if dtype is None:
        return "fp16", switch
    names = qualified_names(facts, dtype)
    if names & {"torch.bfloat16"}:
        return "bf16", switch
    if names & {"torch.float16", "torch.half"}:
        return "fp16", switch
    return None


def _switch(value: cst.BaseExpression):
    """``enabled=<value>``: None when always on (``True``), False when always off, else the flag."""
    if m.matches(value, m.Name("True")):
        return None
    if m.matches(value, m.Name("False")):
        return False
    return value
