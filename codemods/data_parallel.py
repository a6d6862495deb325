"""ACC006: ``nn.DataParallel`` goes (prepare wraps the model); ``model.module`` -> ``unwrap_model``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ExpressionContext, ExpressionContextProvider, ParentNodeProvider

from accelify.analyses.distributed import DATA_PARALLEL, DDP
from accelify.analyses.plan import Plan
from accelify.analyses.ranks import rank_attribute
from accelify.queries.blocks import enclosing_function
from accelify.queries.names import has_qname
from accelify.queries.refs import receiver_refs, ref_of
from accelify.queries.trees import remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod


def _frozen(module: cst.Module, name: str) -> bool:
    """The script turns the gradients of ``name`` off (``for p in teacher.parameters(): p.requires_grad = False``,
    ``teacher.requires_grad_(False)``): the evidence that no optimizer trains it (DINO's teacher)."""
    for loop in findall(module, m.For(iter=m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("parameters"))))):
        if isinstance(loop.target, cst.Name) and findall(loop.body, m.Assign(
                targets=[m.AssignTarget(m.Attribute(value=m.Name(loop.target.value), attr=m.Name("requires_grad")))],
                value=m.Name("False"))):
            return True
    return bool(findall(module, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("requires_grad_")),
                                       args=[m.Arg(m.Name("False"))])))


class DataParallel(AccelifyCodemod):
    """Remove ``nn.DataParallel`` (or ``DistributedDataParallel``) around a trained model and unwrap ``model.module``.

    ``accelerator.prepare`` wraps the model for whatever the launch asks for (DDP,
    FSDP, DeepSpeed), so a hand-made ``DataParallel`` goes, and an ``if`` that only
    did that goes with it.  ``model.module`` (the wrapped model) becomes
    ``accelerator.unwrap_model(model)``, which works with or without a wrapper.
    Only done for models the file wrapped in ``DataParallel``: elsewhere ``.module``
    may be the model's own attribute. A ``DataParallel`` around another module of the
    script (``trainer = nn.DataParallel(trainer)``, a sampler built around the model) goes
    too: under ``accelerate launch`` each process has one device, where that wrapper would
    spread the module over every GPU from every process (and stop, on all but the first,
    with its own error about ``device_ids[0]``).

    Before::

        import torch
        from torch import nn

        model = Net()
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.save(model.module.state_dict(), "model.pt")

    After::

        import torch

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    """

    CODE = "ACC006"
    NAME = "data-parallel"
    DESCRIPTION = ("Remove nn.DataParallel/DistributedDataParallel around trained models; model.module becomes "
                   "accelerator.unwrap_model(model).")
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "DataParallel" in code

    METADATA_DEPENDENCIES = (*AccelifyCodemod.METADATA_DEPENDENCIES, ExpressionContextProvider)

    def visit_Module(self, node: cst.Module) -> None:
        wrap_assigns = [
            a for a in findall(node, m.Assign())
            if len(a.targets) == 1 and ref_of(self, a.targets[0].target) in self.plan.flow["model"]  # type: ignore[attr-defined]
            and self._contains_wrap(a.value)  # type: ignore[attr-defined]
        ]
        wraps = bool(wrap_assigns)
        # Once the script wraps its model, `.module` on it (or on a helper's parameter holding it) is the wrapper's.
        self.wrapped = set(self.plan.flow["model"]) if wraps else set()
        # `trainer = nn.DataParallel(trainer)` around a module no optimizer trains (pytorch-ddpm's trainer and samplers,
        # under `if FLAGS.parallel:`): it goes too, its `.module` read through `unwrap_model` (the module itself)
        others = [a for a in findall(node, m.Assign()) if self._rewraps_other(a)]  # type: ignore[arg-type]
        self._other_wraps = {id(a.value) for a in others}  # type: ignore[attr-defined]
        self.wrapped |= {ref_of(self, a.targets[0].target) for a in others}  # type: ignore[attr-defined]
        # `teacher = DDP(teacher, ...)` around a model the script freezes: `accelerator.prepare_model(teacher)`
        # (in :meth:`leave_Call`), whose `.module` is the wrapper's too
        self._untrained_wraps: set[int] = set()
        for assign in findall(node, m.Assign()):
            value = assign.value
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) and self._is_wrap(value) \
                    and has_qname(self, value.func, DDP) and m.matches(value.args[0].value, m.Name(assign.targets[0].target.value)) \
                    and not self.unwraps(value) and all(a.keyword is not None and a.keyword.value in ("device_ids", "output_device")
                                                        for a in value.args[1:]) \
                    and _frozen(node, assign.targets[0].target.value):
                self._untrained_wraps.add(id(value))
                self.wrapped.add(ref_of(self, assign.targets[0].target))
        states = [c.func.value for c in findall(node, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[]))]  # type: ignore[attr-defined]
        # `model.module.state_dict()` and never `model.state_dict()`: the script saves plain keys itself
        plain_saves = any(m.matches(s, m.Attribute(attr=m.Name("module"))) and ref_of(self, s.value) in self.wrapped
                          for s in states) and not any(ref_of(self, s) in self.wrapped for s in states)
        kind = "DistributedDataParallel" if self.plan.distributed is not None else "DataParallel"
        if wraps and not plain_saves:
            for load in findall(node, m.Call(func=m.Attribute(attr=m.Name("load_state_dict")))):
                if any(r in self.plan.flow["model"] for r in receiver_refs(self, load.func.value)) and (  # type: ignore[attr-defined]
                        not self._before_the_wrap(load, wrap_assigns)):
                    self.finding(
                        load, "ACC129", f"the {kind} wrapper is removed, so this loads into the plain model: a "
                        "checkpoint the original script saved from the wrapped model has `module.`-prefixed keys and "
                        "will not load (checkpoints the converted script saves have plain keys).",
                        "convert old checkpoints once: `{k.removeprefix(\"module.\"): v for k, v in state.items()}`.",
                    )
                    break

    def _before_the_wrap(self, load: cst.Call, wraps: list[cst.Assign]) -> bool:
        """Does ``load`` run, in the function that wraps the model, before it wraps it (WZMIAOMIAO's initial
        weights, loaded before ``DistributedDataParallel(model)``)? The original loaded into the plain model too."""
        here = enclosing_function(self, load)
        same = [w for w in wraps if enclosing_function(self, w) is here]
        return bool(same) and all(self.line_of(load)[0] < self.line_of(w)[0] for w in same)

    def _is_wrap(self, call: cst.CSTNode) -> bool:
        return isinstance(call, cst.Call) and bool(call.args) and has_qname(self, call.func, DATA_PARALLEL)

    def _contains_wrap(self, expr: cst.BaseExpression) -> bool:
        while isinstance(expr, cst.Call):
            if self._is_wrap(expr):
                return True
            if not isinstance(expr.func, cst.Attribute):
                return False
            expr = expr.func.value  # nn.DataParallel(model).to(device)
        return False

    def unwraps(self, call: cst.Call) -> bool:
        """Is ``call`` a wrapper this codemod removes (around a trained model, or ``x = nn.DataParallel(x)``)?"""
        if not self._is_wrap(call):
            return False
        inner = call.args[0].value
        return any(r in self.plan.flow["model"] for r in receiver_refs(self, inner)) or self._assigned_to_model(call) \
            or id(call) in self._other_wraps

    def _rewraps_other(self, assign: cst.Assign) -> bool:
        """``x = nn.DataParallel(x, ...)``, ``x`` no trained model: the plain ``DataParallel`` (not DDP, which needs
        the process group: ACC126) around a module of the script, bound to its own name again."""
        value = assign.value
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or not self._is_wrap(value) \
                or has_qname(self, value.func, DDP):  # type: ignore[arg-type]
            return False
        name = assign.targets[0].target.value
        return m.matches(value.args[0].value, m.Name(name)) and ref_of(self, assign.targets[0].target) not in \
            self.plan.flow["model"] and all(a.keyword is not None and a.keyword.value in ("device_ids", "output_device", "dim")
                                           for a in value.args[1:])  # type: ignore[attr-defined]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.unwraps(original_node):
            accelerator = self.accelerator_at(original_node) if id(original_node) in self._untrained_wraps else None
            if accelerator is not None:
                # DINO's teacher, wrapped for its SyncBatchNorm: what the original did on its launch, `prepare_model`
                # does on any (a DDP wrapper when there are processes, the model itself in one)
                inner = cst.Module(body=[]).code_for_node(updated_node.args[0].value)
                self.change(original_node, f"`DistributedDataParallel({inner}, ...)` -> "
                            f"`{accelerator}.prepare_model({inner})` (a model no optimizer trains)")
                remove_imports_of(self.context, original_node.func)
                return cst.parse_expression(f"{accelerator}.prepare_model({inner})")
            if self._is_wrap(original_node) and has_qname(self, original_node.func, DDP):
                inner = cst.Module(body=[]).code_for_node(original_node.args[0].value)
                self.refuse(
                    original_node, "ACC126", f"`DistributedDataParallel({inner}, ...)` wraps a model accelify does not "
                    "prepare (no optimizer it recognises trains it): left, the wrapper needs the process group the "
                    "conversion removes (in one process it fails); file not converted.",
                    f"prepare it as well (`{inner} = accelerator.prepare({inner})`; a teacher is wrapped so for its "
                    "SyncBatchNorm), or build the optimizer over its parameters where it is built, then run accelify "
                    "again",
                )
            return updated_node
        self.touch()
        kind = "DistributedDataParallel" if has_qname(self, original_node.func, DDP) else "DataParallel"
        self.change(original_node, f"`{kind}(...)` removed: " + (
            "each process has a device of its own" if id(original_node) in self._other_wraps else "prepare() wraps the model"))
        remove_imports_of(self.context, original_node.func)
        return updated_node.args[0].value

    def _assigned_to_model(self, call: cst.Call) -> bool:
        parent = self.get_metadata(ParentNodeProvider, call, None)
        while isinstance(parent, (cst.Attribute, cst.Call, cst.Arg)):
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return isinstance(parent, cst.Assign) and any(
            ref_of(self, t.target) in self.plan.flow["model"] for t in parent.targets
        )

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if original_node.attr.value != "module" or ref_of(self, original_node.value) not in self.wrapped:
            return updated_node
        if self.get_metadata(ExpressionContextProvider, original_node, None) != ExpressionContext.LOAD:
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            self.refuse(
                original_node, "ACC109", "`.module` of a model whose DataParallel wrapper is removed, in code that "
                "cannot reach the Accelerator: left as it is, it would fail on the plain model; file not converted.",
                "pass the accelerator to this function and use `accelerator.unwrap_model(model)`.",
            )
            return updated_node
        model = cst.Module(body=[]).code_for_node(updated_node.value)
        self.change(original_node, f"`{model}.module` -> `{accelerator}.unwrap_model({model})`")
        return cst.parse_expression(f"{accelerator}.unwrap_model({model})")

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """``model.module if isinstance(model, nn.DataParallel) else model`` (or ``hasattr(model, "module")``):
        once ``.module`` is ``unwrap_model(model)``, the unwrapped branch serves every case."""
        test = original_node.test
        if rank_attribute(self, test, self.plan) == "use_distributed" and ref_of(self, original_node.orelse) in self.wrapped:
            # `model.module if distributed else model`: `unwrap_model` serves both runs
            if "unwrap_model(" in cst.Module(body=[]).code_for_node(updated_node.body):
                self.change(original_node, "launch test removed: `unwrap_model` works with or without a wrapper")
                return updated_node.body
            return updated_node
        body = original_node.body
        if (m.matches(body, m.Attribute(attr=m.Name("module"))) and ref_of(self, original_node.orelse) in self.wrapped
                and ref_of(self, body.value) == ref_of(self, original_node.orelse)  # type: ignore[attr-defined]
                and not findall(test, m.Call()) and "unwrap_model(" in cst.Module(body=[]).code_for_node(updated_node.body)):
            # `model.module if args.cuda else model` (the condition the script wrapped under, kws's DataParallel):
            # the prepared model is wrapped whatever it says, and `unwrap_model` gives the plain model either way
            self.change(original_node, "wrapper condition removed: `unwrap_model` works with or without a wrapper")
            return updated_node.body
        if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and len(test.args) == 2):
            return updated_node
        subject = ref_of(self, test.args[0].value)
        kind = test.func.value
        if subject not in self.wrapped:
            return updated_node
        if kind == "isinstance" and has_qname(self, test.args[1].value, DATA_PARALLEL):
            pass
        elif kind == "hasattr" and m.matches(test.args[1].value, m.SimpleString()) and test.args[1].value.evaluated_value == "module":  # type: ignore[attr-defined]
            pass
        else:
            return updated_node
        if "unwrap_model(" not in cst.Module(body=[]).code_for_node(updated_node.body):
            return updated_node
        self.change(original_node, "wrapper test removed: `unwrap_model` works with or without a wrapper")
        remove_imports_of(self.context, original_node.test)
        return updated_node.body
