"""What a correct migration of this file is, decided once before anything is rewritten.

:func:`analyze` finds the scope that builds the training objects (the module, a
function such as ``main()``, or a class's ``__init__``), the objects themselves,
the device, and how they flow into helper functions (``train(args, model,
device, train_loader, optimizer, epoch)``).  The :class:`Plan` it returns holds
only *refs*, ``(scope key, name)`` pairs such as ``("main", "model")`` or
``("Trainer", "self.model")``, never nodes: refs stay valid while the codemods
rewrite the tree pass after pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify import walk
from accelify.walk import findall
from libcst.metadata import MetadataWrapper, ScopeProvider

from accelify.accumulation import code_of
from accelify.analyses import (
    accelerator, data, devices, gradient_accumulation, helpers, mixed_precision, objects, prepare_point, schedulers,
)
from accelify.analyses.facts import KINDS, Facts, bind_arguments, param_names  # noqa: F401 (codemods import these from here)
from accelify.analyses.mixed_precision import AUTOCASTS  # noqa: F401 (codemods/mixed_precision.py imports it from here)
from accelify.analyses.objects import _OPTIMIZER_NAME  # noqa: F401 (tests/test_precheck.py compares precheck's copy)
from accelify.analysis import (
    ACCELERATOR_SPELLINGS,
    MODULE,
    RawFinding,
    Ref,
    has_qname,
    key_at,
    qualified_names,
    scope_key,
    under_main_process_check,
)

DISTRIBUTED_SAMPLERS = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)
COLLECTIVES = frozenset({"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})


@dataclass
class Plan:
    convertible: bool = False
    #: key of the scope that builds the objects: "<module>", "main", "Trainer.__init__"
    setup: str = MODULE
    #: key the objects' refs live in: the setup key, or the class ("Trainer") for self attributes
    owner: str = MODULE
    #: how the setup scope spells its Accelerator: "accelerator", "self.accelerator", or an existing name
    accelerator: str = "accelerator"
    has_accelerator: bool = False
    has_prepare: bool = False
    dataloaders: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    devices: set[str] = field(default_factory=set)
    #: devices that were strings (``"cuda" if ... else "cpu"``): compared as ``accelerator.device.type``
    string_devices: set[str] = field(default_factory=set)
    #: ``Accelerator(cpu=<this>)`` when the device depended on a flag
    cpu_flag: Optional[str] = None
    #: ``Accelerator(mixed_precision=<this>)`` when a GradScaler/autocast is replaced
    mixed_precision: Optional[str] = None
    #: GradScaler names in the setup scope, replaced by the Accelerator's own scaling
    scalers: set[str] = field(default_factory=set)
    #: ``Accelerator(gradient_accumulation_steps=<this>)`` when a hand-written accumulation is replaced
    accumulation_steps: Optional[str] = None
    #: names the Accelerator's arguments read: it must be created after they are bound
    argument_names: set[str] = field(default_factory=set)
    #: models bound again in the setup block after training (a reload for a test): plain models there
    rebound_models: list[str] = field(default_factory=list)
    #: a trainer class whose optimizer is built in a method (``Trainer.train``): the objects built in
    #: ``__init__`` (``self.model``), prepared in that method with those it builds
    built_in_init: list[str] = field(default_factory=list)
    #: per-batch schedulers sized from ``len(dataloader)`` before the objects are prepared: prepared with them
    sized_early: list[str] = field(default_factory=list)
    #: every ref of each kind, setup objects and helper parameters alike
    flow: dict[str, set[Ref]] = field(default_factory=lambda: {k: set() for k in KINDS})
    #: module-level helper -> its parameters that carry the device
    device_params: dict[str, list[str]] = field(default_factory=dict)
    #: module-level helpers that need the accelerator (backward) and get it through a parameter
    needs_accelerator: set[str] = field(default_factory=set)
    #: ... of which those with no ``device`` parameter to rename: they get a new first parameter
    accelerator_params: set[str] = field(default_factory=set)
    #: module-level classes handed the training objects (``Trainer(model, loader, optimizer, device)``)
    #: whose methods need the accelerator: ``__init__`` takes it first and keeps it as ``self.accelerator``
    accelerator_classes: set[str] = field(default_factory=set)
    findings: list[RawFinding] = field(default_factory=list)

    @property
    def class_mode(self) -> bool:
        return self.owner != self.setup

    @property
    def method_mode(self) -> bool:
        """A trainer class whose optimizer is built in a method other than ``__init__`` (``Trainer.train``):
        the Accelerator lives in ``__init__``, ``prepare`` runs in that method."""
        return self.class_mode and not self.setup.endswith(".__init__")

    def core(self) -> list[str]:
        """Dataloaders, models, optimizers: the objects that decide where ``prepare`` goes."""
        return [*self.dataloaders, *self.models, *self.optimizers]

    def accelerator_args(self) -> str:
        args = []
        if self.cpu_flag:
            args.append(f"cpu={self.cpu_flag}")
        if self.mixed_precision:
            args.append(f"mixed_precision={self.mixed_precision}")
        if self.accumulation_steps:
            args.append(f"gradient_accumulation_steps={self.accumulation_steps}")
        return ", ".join(args)

    def restrict(self, codes: Optional[frozenset[str]]) -> None:
        """Forget what a codemod that does not run would have provided: ``mixed_precision="fp16"``
        without ACC010 would scale a loss the script's own GradScaler scales too,
        ``gradient_accumulation_steps`` without ACC013 would divide it twice, and without
        ACC002 no helper's ``device`` parameter becomes ``accelerator``."""
        if codes is None:
            return
        if "ACC010" not in codes:
            self.mixed_precision, self.scalers = None, set()
        if "ACC013" not in codes:
            self.accumulation_steps = None
        if "ACC002" not in codes:
            # helpers get the accelerator through their renamed `device` parameter: no rename, no accelerator
            self.needs_accelerator &= self.accelerator_params
        if "ACC015" not in codes:
            self.needs_accelerator -= self.accelerator_params
            self.accelerator_params = set()
            self.accelerator_classes = set()

    def anchors(self) -> list[str]:
        """The core objects the setup scope binds: ``prepare`` goes after the last of them."""
        return [n for n in self.core() if n not in self.built_in_init] + self.sized_early

    def ref(self, name: str) -> Ref:
        """``self.model`` lives in the class, a local of the setup method in that method."""
        return (self.owner if name.startswith("self.") else self.setup), name

    def refs(self, names: list[str]) -> set[Ref]:
        return {self.ref(n) for n in names}

    def accelerator_in(self, key: Optional[str]) -> Optional[str]:
        """How code in function ``key`` reaches the Accelerator without a new parameter."""
        if key is None:
            return None
        if self.class_mode:
            return self.accelerator if key == self.owner or key.startswith(self.owner + ".") else None
        if key == self.setup or key.startswith(self.setup + ".") or self.setup == MODULE:
            return self.accelerator
        if key in self.needs_accelerator:
            return "accelerator"
        if key.split(".")[0] in self.accelerator_classes and "." in key:
            return "self.accelerator"
        return None


class _Analyzer(Facts):
    def __init__(self) -> None:
        super().__init__()
        self.plan = Plan()
        self._scheduler_calls: list[cst.Call] = []  # constructions of the per-batch schedulers

    def leave_Module(self, original_node: cst.Module) -> None:
        super().leave_Module(original_node)
        self._finish(original_node)  # metadata is only available during the visit

    # ------------------------------------------------------------------ the plan
    def _finish(self, module: cst.Module) -> None:
        plan = self.plan
        optimizers = objects.optimizers(self)
        if not optimizers:
            self._untrained_backward()
            return
        own_group = next((c for c in self.calls if has_qname(self, c.func, _PROCESS_GROUP)), None)
        if own_group is not None and not plan.has_accelerator:
            self.finding(
                self.plan, own_group, "ACC126",
                f"this script manages its own processes (`{code_of(own_group.func)}`): DistributedDataParallel, "
                "process groups and per-rank devices are not converted yet, and half a conversion would wrap "
                "the model twice. File not converted.",
                "remove the process-group set-up, DDP wrapper and DistributedSampler by hand (Accelerate and "
                "`accelerate launch` / `torchrun` do all three), then run accelify on the plain script.",
            )
            return
        first = min((a for a, _ in optimizers.values()), key=self.line)
        if not prepare_point.setup_scope(self, plan, optimizers, first):
            return
        accelerator.existing(self, plan)
        if any(f.code == "ACC100" for f in plan.findings):
            return

        in_owner = objects.setup_assigns(self, plan)
        if not objects.training_objects(self, plan, optimizers, in_owner):
            return
        if plan.method_mode and not prepare_point.init_objects(self, plan):
            return
        plan.flow["loader"] = plan.refs(plan.dataloaders)
        plan.flow["model"] = plan.refs(plan.models)
        if not prepare_point.reaches_training(self, plan, first):
            return
        if not devices.classify(self, plan, in_owner):
            return
        plan.flow["device"] = plan.refs(sorted(plan.devices))
        if not data.placed(self, plan, first):
            return
        self._arguments = accelerator.Arguments(self, plan, in_owner)
        if not plan.devices and plan.cpu_flag is None:
            devices.placement_flag(self, plan, self._arguments)
        helpers.flows(self, plan)
        scheduler_calls = schedulers.decide(self, plan, in_owner, set(optimizers))
        if scheduler_calls is None:
            return
        self._scheduler_calls = scheduler_calls
        if not prepare_point.place(self, plan):
            return
        helpers.needs_accelerator(self, plan)
        unreachable = self._backward_out_of_reach()
        if unreachable is not None:
            self.finding(
                self.plan, unreachable, "ACC106", "this backward cannot reach the script's Accelerator, and with a prepared "
                "optimizer a plain backward is wrong under fp16, accumulation or DeepSpeed; file not converted.",
                "pass the accelerator to this function and call `accelerator.backward(loss)`.",
            )
            return
        if not data.training_data(self, plan):
            return
        self._wrapped = objects.optimizer_wrappers(self, plan, in_owner, optimizers)
        mixed_precision.decide(self, plan, in_owner, self._wrapped, self._arguments)
        gradient_accumulation.decide(self, plan, self._wrapped, self._scheduler_calls, self._arguments)
        if not self._multi_process_hazards():
            return
        plan.convertible = True

    def _untrained_backward(self) -> None:
        """ACC125: a file that runs a backward but has no optimizer accelify recognises is left as it
        is: say so (the parameters are updated by hand, or by an optimizer from a factory)."""
        backwards = [c for c in self.backwards if self._tensor_backward(c)
                     and code_of(c.func.value) not in ACCELERATOR_SPELLINGS]  # type: ignore[attr-defined]
        if not backwards or self.plan.has_accelerator or findall(self.module, m.Name("Accelerator")):
            return
        self.finding(
            self.plan, backwards[0], "ACC125",
            "this file runs a backward pass, but builds no optimizer accelify recognises (a `torch.optim` class, or "
            "an optimizer over `model.parameters()`): the parameters are updated by hand, or by an optimizer "
            "made elsewhere. File not converted.",
            "build the optimizer beside the model (`torch.optim.SGD(model.parameters(), ...)`), or convert by "
            "hand: `accelerator.prepare(model, ...)` and `accelerator.backward(loss)`.",
        )

    def _wrapped_model_attributes(self) -> bool:
        """ACC120: ``model.generate(...)``, ``model.config`` on a prepared model.

        In a multi-process run ``prepare`` returns a DistributedDataParallel wrapper,
        which has the ``nn.Module`` API and nothing of the model's own: an attribute
        of the model raises AttributeError there (and setting one sets it on the
        wrapper).  Code in the setup scope before the ``prepare`` point still holds
        the plain model and is not reported. True when one is found: the file is not converted.
        """
        from accelify.codemods.unwrap import model_attribute, plain_model_statements, why_not_unwrapped

        plan = self.plan
        if plan.has_prepare:
            return False
        plain = {
            id(n) for stmt in plain_model_statements(self.module, plan, self.trainers)
            for n in findall(stmt, m.Attribute())
        }
        reported: set[tuple[Optional[str], str, str]] = set()
        for node in findall(self.module, m.Attribute()):
            if id(node) in plain or not model_attribute(self, node, plan):  # type: ignore[arg-type]
                continue
            why = why_not_unwrapped(self, node, plan)  # type: ignore[arg-type]
            if why is None:
                continue  # ACC016 reads it through `accelerator.unwrap_model(...)`
            attr = node.attr.value  # type: ignore[attr-defined]
            key = key_at(self, node)
            model = code_of(node.value)  # type: ignore[attr-defined]
            if (key, model, attr) in reported:
                continue
            reported.add((key, model, attr))
            accelerator = plan.accelerator_in(key) or plan.accelerator
            self.finding(
                self.plan, node, "ACC120",
                f"`{model}.{attr}` is the model's own attribute, and {why}: in a multi-process run `prepare` "
                "returns a DistributedDataParallel wrapper without it. File not converted.",
                f"use `{accelerator}.unwrap_model({model}).{attr}` outside the training step (under "
                "`torch.no_grad()`, at evaluation), or make it part of `forward`.",
            )
        return bool(reported)

    # ------------------------------------------------------------------ hazards left for a human
    def _multi_process_hazards(self) -> bool:
        """Constructs that are fine in one process and wrong in several (ACC115, ACC116, ACC119)."""
        from accelify.early_stop import EarlyStops

        self.plan.findings.extend(
            EarlyStops(self, self.plan, self.module, [*self.loops, *self.whiles], self.exits).findings()
        )
        refused = self._wrapped_model_attributes()
        for call in self.calls:
            if has_qname(self, call.func, DISTRIBUTED_SAMPLERS):
                self.finding(
                    self.plan, call, "ACC115", "a DistributedSampler is kept: `accelerator.prepare` shards the dataloader itself.",
                    "drop the sampler (use `shuffle=True` on the DataLoader) and let `prepare` shard the data.",
                )
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in COLLECTIVES
                and cst.Module(body=[]).code_for_node(func.value) in (self.plan.accelerator, *ACCELERATOR_SPELLINGS)
                and under_main_process_check(self, call)
            ):
                self.finding(
                    self.plan, call, "ACC116", f"`{func.attr.value}` is a collective: under a main-process check the other "
                    "processes never reach it and the run hangs.",
                    "call it outside the `if accelerator.is_main_process:` block, on every process.",
                )

        return not refused

    def _tensor_backward(self, call: cst.Call) -> bool:
        """``loss.backward()``, not the function ``torch.autograd.backward(...)``."""
        return not qualified_names(self, call.func.value) & {"torch.autograd", "torch"}  # type: ignore[attr-defined]

    def _backward_out_of_reach(self) -> Optional[cst.Call]:
        """A tensor ``.backward()`` that cannot go through the Accelerator.

        With the optimizer prepared, such a backward is wrong as soon as the launcher picks
        fp16 (the prepared optimizer unscales gradients nobody scaled), accumulation or
        DeepSpeed: the file is better left as it is.
        """
        plan = self.plan
        for call in self.backwards:
            key = key_at(self, call)
            if key is None or plan.accelerator_in(key) is not None or key in plan.needs_accelerator:
                continue
            if not self._tensor_backward(call):
                continue
            if code_of(call.func.value) in (plan.accelerator, *ACCELERATOR_SPELLINGS):  # type: ignore[attr-defined]
                continue
            scope = self.get_metadata(ScopeProvider, call, None)
            if scope is not None and any(scope_key(a.scope) == key for a in scope["accelerator"]):
                continue  # hand-written Accelerate code with its own accelerator
            return call
        return None



# What the DistributedDataParallel wrapper answers like the model: the nn.Module API. `module` is
# the wrapper's own (ACC006 rewrites it).
MODULE_API = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "eval",
    "extra_repr", "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half",
    "load_state_dict", "modules", "named_buffers", "named_children", "named_modules", "named_parameters",
    "parameters", "register_backward_hook", "register_buffer", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_module",
    "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_",
    "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training",
    "type", "xpu", "zero_grad", "module", "__class__", "__dict__",
})


# A script that runs its own distributed training (issue 10 converts them; until then: refused).
_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group",
     "torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
     "torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"}
)



def analyze(wrapper: MetadataWrapper) -> Plan:
    analyzer = _Analyzer()
    index = walk.active()
    if index is None or index.order[0] is not wrapper.module:
        wrapper.visit(analyzer)
        return analyzer.plan
    # The analysis only looks on the way down: run it over the indexed pre-order, no traversal.
    analyzer.metadata = {dep: wrapper.resolve(dep) for dep in analyzer.get_inherited_dependencies()}
    methods: dict[type, object] = {}
    for node in index.order:
        method = methods.get(type(node), False)
        if method is False:
            method = methods[type(node)] = getattr(analyzer, f"visit_{type(node).__name__}", None)
        if method is not None:
            method(node)  # type: ignore[operator]
    analyzer.leave_Module(wrapper.module)
    return analyzer.plan
