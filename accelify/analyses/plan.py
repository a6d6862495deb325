"""What a correct migration of this file is, decided once before anything is rewritten.

:func:`analyze` finds the scope that builds the training objects (the module, a
function such as ``main()``, or a class's ``__init__``), the objects themselves,
the device, and how they flow into helper functions (``train(args, model,
device, train_loader, optimizer, epoch)``).  The :class:`Plan` it returns holds
only *refs*, ``(scope key, name)`` pairs such as ``("main", "model")`` or
``("Trainer", "self.model")``, never nodes: refs stay valid while the codemods
rewrite the tree pass after pass.

How each part is decided lives in :mod:`accelify.analyses`, one concern a module
(what to prepare, the device, schedulers, mixed precision, ...): :func:`analyze`
collects the file's facts in one visit and ``_decide`` runs the analyses in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, ScopeProvider

from accelify.analyses import (
    accelerator,
    apex,
    data,
    devices,
    distributed,
    evaluation,
    factories,
    gradient_accumulation,
    handed,
    hazards,
    helpers,
    mixed_precision,
    objects,
    option_devices,
    prepare_point,
    random_splits,
    rank_helpers,
    samplers,
    schedulers,
    unsharded,
    unused_parameters,
    unwrapping,
)

# Names other modules import from here (the analyses lived in this module before they were split).
from accelify.analyses.apex import ApexPlan
from accelify.analyses.facts import KINDS, Facts, bind_arguments, param_names  # noqa: F401 (codemods)
from accelify.analyses.foreign import Foreign, Sources, called_class, called_function, console_methods
from accelify.analyses.mixed_precision import AUTOCASTS  # noqa: F401 (codemods/mixed_precision.py)
from accelify.analyses.objects import _OPTIMIZER_NAME  # noqa: F401 (tests/test_precheck.py compares precheck's copy)
from accelify.queries import walk
from accelify.queries.names import code_of
from accelify.queries.records import RawFinding
from accelify.queries.refs import MODULE, Ref


@dataclass
class Plan:
    convertible: bool = False
    #: every analysis ran, and only checks that build nothing refused the file (``apex``, a sampler of its
    #: own): the plan is whole, so the codemods can still be asked what they would refuse (every blocker
    #: of the file is reported, not only the analysis's)
    complete: bool = False
    #: key of the scope that builds the objects: "<module>", "main", "Trainer.__init__"
    setup: str = MODULE
    #: top-level functions and classes of other modules, analysed with this one as one program
    #: (accelify.core.unit): the module-level Accelerator of the script is not theirs to read
    elsewhere: frozenset = frozenset()
    #: key the objects' refs live in: the setup key, or the class ("Trainer") for self attributes
    owner: str = MODULE
    #: how the setup scope spells its Accelerator: "accelerator", "self.accelerator", or an existing name
    accelerator: str = "accelerator"
    has_accelerator: bool = False
    has_prepare: bool = False
    #: an evaluation or batch-inference script: no optimizer, the models only run
    #: (``prepare_model(model, evaluation_mode=True)``)
    evaluation: bool = False
    #: lists an evaluation runs its models over item by item (``for prompt in prompts:``), in the setup
    #: scope: each process takes its share (``split_between_processes``), the results are gathered
    split_lists: list[str] = field(default_factory=list)
    dataloaders: list[str] = field(default_factory=list)
    #: DataLoaders an evaluation runs over whole on every process, not prepared (accelify.analyses.unsharded)
    unsharded: list[str] = field(default_factory=list)
    #: ids of the loops over them: their batches are placed by the script, on ``accelerator.device``
    unsharded_loops: set[int] = field(default_factory=set)
    models: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    devices: set[str] = field(default_factory=set)
    #: devices that were strings (``"cuda" if ... else "cpu"``): compared as ``accelerator.device.type``
    string_devices: set[str] = field(default_factory=set)
    #: ``Accelerator(cpu=<this>)`` when the device depended on a flag
    cpu_flag: Optional[str] = None
    #: a device chosen at the module's top for a script that trains in a function (pytorch-ddpm's
    #: ``device = torch.device('cuda:0')``): its reads become each process's device where they run (ACC031,
    #: accelify.analyses.devices)
    module_device: Optional[Ref] = None
    #: the device an option or a configuration chose: (ref of the namespace, its attribute, whether it is
    #: an argparse ``--device`` option, a string; else a configuration's, a string or a ``torch.device``)
    option_device: Optional[tuple[Ref, str, bool]] = None
    #: the namespace of ``option_device`` and the parameters every call hands it to (``main(args)``)
    option_namespaces: frozenset[Ref] = frozenset()
    #: ``Accelerator(mixed_precision=<this>)`` when a GradScaler/autocast is replaced
    mixed_precision: Optional[str] = None
    #: what ACC033 removes and replaces of NVIDIA apex (``accelify.analyses.apex``)
    apex: Optional[ApexPlan] = None
    #: GradScaler names in the setup scope, replaced by the Accelerator's own scaling
    scalers: set[str] = field(default_factory=set)
    #: ``DistributedDataParallelKwargs`` the models need (``find_unused_parameters=True``)
    ddp_kwargs: list[str] = field(default_factory=list)
    #: classes of prepared models that run a trainable part under ``no_grad`` (unused parameters)
    unused_parameters: list[str] = field(default_factory=list)
    #: ``Accelerator(gradient_accumulation_steps=<this>)`` when a hand-written accumulation is replaced
    accumulation_steps: Optional[str] = None
    #: names the Accelerator's arguments read: it must be created after they are bound
    argument_names: set[str] = field(default_factory=set)
    #: models bound again in the setup block after training (a reload for a test): plain models there
    rebound_models: list[str] = field(default_factory=list)
    #: ids of statement calls of another module's function that writes files (accelify.analyses.foreign):
    #: the main process makes them (ACC017)
    foreign_writers: set[int] = field(default_factory=set)
    #: a batch sampler of its own a DataLoader is built with (episodes): gathered, batches of several processes
    #: would be scored as one (accelify.analyses.gathers refuses, ACC114)
    batch_sampler: Optional[str] = None
    #: ids of the loops whose metrics are gathered (accelify.analyses.gathers), as helpers.needs_accelerator finds them
    gathering: set[int] = field(default_factory=set)
    #: ids of the prepared models handed to another module's code in a statement call (``ema.step_ema(ema_model,
    #: model)``): they are handed ``accelerator.unwrap_model(model)`` (accelify.analyses.unwrapping, ACC016)
    handed_away: set[int] = field(default_factory=set)
    #: ids of a prepared model's ``state_dict()`` calls loaded into a model that is not prepared
    #: (``ema_model.load_state_dict(model.state_dict())``): read through ``accelerator.unwrap_model(model)`` (ACC014)
    states_into_plain: set[int] = field(default_factory=set)
    #: ids of statements of the setup block that make an iterator of a loader before ``prepare``
    #: (``datalooper = infiniteloop(dataloader)``): moved to just after it (accelify.analyses.data)
    after_prepare: set[int] = field(default_factory=set)
    #: findings that describe what the conversion did (ACC136): reported only when the file is converted
    conversion_notes: list[RawFinding] = field(default_factory=list)
    #: a trainer class whose optimizer is built in a method (``Trainer.train``): the objects built in
    #: ``__init__`` (``self.model``), prepared in that method with those it builds
    built_in_init: list[str] = field(default_factory=list)
    #: a function that builds its optimizers for the model it is handed (accelify.analyses.handed) -> those
    #: optimizers, prepared there; the model is prepared in the setup scope, its caller
    late: dict[str, list[str]] = field(default_factory=dict)
    #: the models a setup function that builds its own loaders is handed and prepares (accelify.analyses.handed)
    handed_in: list[str] = field(default_factory=list)
    #: the callers' names for those models (placed there before they are handed in: `prepare` moves them)
    handed_refs: set = field(default_factory=set)
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
    #: a script that managed its own processes (torchrun, DDP): what Accelerate takes over
    distributed: Optional[distributed.Distributed] = None
    #: a script whose process management is refused (ACC126) after its ranks were read: what the device analysis
    #: still reads to name the file's own device blockers too (ImageNet's device chain behind its sampler)
    refused_distributed: Optional[distributed.Distributed] = None
    #: ids of the script's own rank helpers (``get_rank()`` asking torch.distributed when a group exists) -> the
    #: ``PartialState`` attribute each returns now (ACC034, accelify.analyses.rank_helpers)
    rank_helpers: dict[int, str] = field(default_factory=dict)
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
        kwargs = self.all_ddp_kwargs()
        if kwargs:
            args.append(f"kwargs_handlers=[DistributedDataParallelKwargs({', '.join(kwargs)})]")
        return ", ".join(args)

    def all_ddp_kwargs(self) -> list[str]:
        """What the Accelerator's ``DistributedDataParallelKwargs`` gets: the DDP wrapper's own arguments
        (a hand-written DDP script) and what the models need (``find_unused_parameters=True``)."""
        kwargs = list(self.distributed.ddp_kwargs) if self.distributed is not None else []
        return kwargs + [k for k in self.ddp_kwargs if k.split("=")[0] not in {a.split("=")[0] for a in kwargs}]

    def restrict(self, codes: Optional[frozenset[str]]) -> None:
        """Forget what a codemod that does not run would have provided: ``mixed_precision="fp16"``
        without ACC010 would scale a loss the script's own GradScaler scales too,
        ``gradient_accumulation_steps`` without ACC013 would divide it twice, and without
        ACC002 no helper's ``device`` parameter becomes ``accelerator``."""
        if codes is None:
            return
        if "ACC010" not in codes and self.apex is None:
            self.mixed_precision, self.scalers = None, set()
        if "ACC033" not in codes and self.apex is not None:  # apex left beside a prepared optimizer: not converted
            self.mixed_precision, self.apex, self.convertible = None, None, False
            self.findings.append(RawFinding(1, 1, "ACC145", "NVIDIA apex is left as it is (ACC033 is not selected): apex "
                                            "patches the optimizer it is handed, and the one `accelerator.prepare` "
                                            "returns is another object. File not converted.", "select ACC033 too."))
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
        return [n for n in self.core() if n not in self.built_in_init and n not in self.handed_in] + self.sized_early

    def touches(self) -> frozenset[str]:
        """An evaluation's models: ``prepare`` goes after the lines that load or move them
        (``accelify.queries.training.locate_setup``)."""
        return frozenset(self.models) if self.evaluation else frozenset()

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
        if key == self.setup or key.startswith(self.setup + ".") or (
                self.setup == MODULE and key.split(".")[0] not in self.elsewhere):
            return self.accelerator
        if key in self.needs_accelerator:
            return "accelerator"
        top = key.split(".")[0]
        if "." in key and top in self.accelerator_params and top not in self.accelerator_classes:
            return "accelerator"  # a function defined inside one handed the accelerator reads its parameter
        if top in self.accelerator_classes and "." in key:
            return "self.accelerator"
        return None


def analyze(wrapper: MetadataWrapper, sources: Optional[Sources] = None, elsewhere: frozenset = frozenset()) -> Plan:
    """The plan of the module ``wrapper`` wraps; ``sources``: the project's other modules, read for the
    functions the script calls from them (accelify.analyses.foreign); ``elsewhere``: the names of the
    functions and classes in the program that another module defines (accelify.core.unit)."""
    facts = Facts()
    facts.elsewhere = elsewhere
    facts.foreign = Foreign.of(sources) if sources is not None else None
    index = walk.active()
    if index is None or index.order[0] is not wrapper.module:
        with facts.resolve(wrapper):  # the metadata is only available while resolved
            wrapper.module.visit(facts)
            facts.is_script = facts.is_script or bool(elsewhere)
            return _decide(facts)
    # The analysis only looks on the way down: run it over the indexed pre-order, no traversal.
    facts.metadata = {dep: wrapper.resolve(dep) for dep in facts.get_inherited_dependencies()}
    methods: dict[type, object] = {}
    for node in index.order:
        method = methods.get(type(node), False)
        if method is False:
            method = methods[type(node)] = getattr(facts, f"visit_{type(node).__name__}", None)
        if method is not None:
            method(node)  # type: ignore[operator]
    facts.leave_Module(wrapper.module)
    # a script converted with modules beside it is one (accelify.core.unit: a main guard, or it runs their
    # functions at its top): its functions' signatures are the program's to change
    facts.is_script = facts.is_script or bool(elsewhere)
    return _decide(facts)


class _Blockers:
    """The first analyses, each run when those it reads have decided: after one refuses the file,
    the others that do not depend on it still run, so that a file left unchanged is reported with
    every construct that blocks it (a device assigned twice *and* a collective with no Accelerate
    equivalent), not the first one found. In a file that converts, every step runs, in order."""

    def __init__(self) -> None:
        self.passed: set[str] = set()
        self.refused = False

    def step(self, name: str, needs: tuple[str, ...], run) -> None:
        if not self.passed.issuperset(needs):
            return
        if run():
            self.passed.add(name)
        else:
            self.refused = True


def _decide(facts: Facts) -> Plan:
    """The analyses, in order: each reads the facts and what those before it decided.  An analysis
    that refuses the file reports why (a finding) and the plan stays not ``convertible``."""
    plan = Plan(elsewhere=facts.elsewhere)
    facts.plan = plan  # what the shared helpers ask of it (`under_main_process_check` and a rank test)
    prepared = accelerator.prepared_by_hand(facts)
    if prepared is not None:  # on Accelerate already: nothing to convert, only a hang to say
        plan.accelerator = code_of(prepared.func.value)  # type: ignore[attr-defined]
        hazards.collectives_under_main_process(facts, plan)
        return plan
    optimizers = factories.redirect(facts, objects.optimizers(facts))
    if not optimizers:
        hazards.untrained_backward(facts, plan)
        if plan.findings or facts.backwards:
            return plan
        optimizers, lists = evaluation.models(facts)
        if not optimizers:
            evaluation.unrecognised(facts, plan)
            return plan
        plan.evaluation = True
        if not evaluation.splits(facts, plan, lists):
            return plan
    first = min((a for a, _ in optimizers.values()), key=facts.line)
    plan.option_device = option_devices.find(facts)
    if plan.option_device is not None:
        plan.option_namespaces = option_devices.handed_on(facts, plan.option_device[0])
    blockers = _Blockers()
    state: dict = {}

    def objects_step() -> bool:
        state["in_owner"] = in_owner = objects.setup_assigns(facts, plan)
        if not objects.training_objects(facts, plan, optimizers, in_owner):
            return False
        if plan.method_mode and not prepare_point.init_objects(facts, plan):
            return False
        plan.flow["loader"] = plan.refs(plan.dataloaders)
        plan.batch_sampler = data.custom_batch_sampler(facts)
        plan.flow["model"] = plan.refs(plan.models)
        return True

    def devices_step() -> bool:
        if not devices.classify(facts, plan, state["in_owner"]):
            return False
        plan.flow["device"] = plan.refs(sorted(plan.devices))
        plan.module_device = devices.module_device(facts, plan)
        return True

    def placed_step() -> bool:
        if not data.placed(facts, plan, first):
            return False
        state["arguments"] = arguments = accelerator.Arguments(facts, plan, state["in_owner"])
        if not option_devices.decide(facts, plan, arguments):
            return False
        if not plan.devices and plan.cpu_flag is None and not devices.placement_flag(facts, plan, arguments):
            return False
        if plan.cpu_flag is not None:
            plan.module_device = None  # the Accelerator's own choice of the CPU: the process's device is not it
        helpers.flows(facts, plan)
        return True

    def schedulers_step() -> bool:
        state["scheduler_calls"] = calls = schedulers.decide(facts, plan, state["in_owner"], set(optimizers))
        return calls is not None

    blockers.step("trained", (), lambda: data.trained_here(facts, plan, optimizers))
    blockers.step("splits", (), lambda: random_splits.decide(facts, plan))
    blockers.step("processes", (), lambda: data.processes_here(facts, plan))
    blockers.step("distributed", ("processes",), lambda: distributed.decide(facts, plan))
    blockers.step("setup", ("trained",), lambda: prepare_point.setup_scope(facts, plan, optimizers, first)
                  and handed.relocate(facts, plan, optimizers))
    blockers.step("spelling", ("setup",), lambda: accelerator.spelling(facts, plan))
    blockers.step("objects", ("setup",), objects_step)
    blockers.step("reaches", ("objects",), lambda: prepare_point.reaches_training(facts, plan, first))
    blockers.step("handed", ("objects",), lambda: data.handed_elsewhere(facts, plan))
    blockers.step("modelled", ("reaches",), lambda: objects.modelled(facts, plan, optimizers))
    # from here on every analysis reads the setup scope and what flows out of it: only where it reaches training
    blockers.step("devices", ("distributed", "modelled"), devices_step)
    blockers.step("placed", ("spelling", "devices"), placed_step)
    blockers.step("unsharded", ("placed",), lambda: unsharded.decide(facts, plan))
    blockers.step("reductions", ("placed",), lambda: distributed.reductions(facts, plan))
    blockers.step("results", ("placed",), lambda: evaluation.kept_results(facts, plan))
    blockers.step("schedulers", ("placed",), schedulers_step)
    if "distributed" not in blockers.passed and "modelled" in blockers.passed and plan.refused_distributed is not None:
        # the process management is refused, its ranks read: the devices are still classified over them, so that
        # a device blocker is named beside it (findings only: the file stays as it is)
        plan.distributed = plan.refused_distributed
        devices.classify(facts, plan, state["in_owner"])
        plan.distributed = None
    if blockers.refused:
        return plan
    in_owner, arguments, scheduler_calls = state["in_owner"], state["arguments"], state["scheduler_calls"]
    if not prepare_point.place(facts, plan):
        return plan
    if not plan.evaluation:  # an evaluation's model is prepared with `evaluation_mode=True`: nothing wraps it
        readers = unwrapping.state_readers(facts)
        plan.handed_away = unwrapping.handed_away(facts, plan, readers)
        plan.states_into_plain = {id(c) for c in unwrapping.states_into_plain_models(facts, plan, readers)}
    helpers.needs_accelerator(facts, plan)
    # The checks from here on build nothing the codemods read: each runs whatever the others found, so
    # that a file left unchanged is reported with every construct that blocks it.
    # (a backward out of reach of a function that cannot be handed the accelerator is that same blocker: asked
    # only when every function that prepares can be)
    passed = [handed.reachable(facts, plan)]
    passed.append(passed[0] and hazards.backwards_in_reach(facts, plan))
    passed += [check(facts, plan) for check in (
        data.training_data, data.rebound_loaders, helpers.mixed_loaders, data.loops_through_wrappers,
        samplers.own_samplers)]
    passed.append(apex.convert(facts, plan, arguments))
    if not plan.evaluation:
        wrapped = objects.optimizer_wrappers(facts, plan, in_owner, optimizers)
        mixed_precision.decide(facts, plan, in_owner, wrapped, arguments)
        gradient_accumulation.decide(facts, plan, wrapped, scheduler_calls, arguments)
    passed.append(hazards.multi_process(facts, plan))
    unused_parameters.decide(facts, plan)
    plan.foreign_writers = foreign_writers(facts)
    plan.rank_helpers = rank_helpers.decide(facts, plan, [a for a, _ in optimizers.values()])
    plan.complete = True
    plan.convertible = all(passed)
    if plan.convertible:
        plan.findings.extend(plan.conversion_notes)
    return plan


def foreign_writers(facts: Facts) -> set[int]:
    """Calls, as statements of their own, of functions of the project's other modules that write
    files (``save_images(samples, path)`` of dome272's utils) or print (``progress_bar(i, n, msg)``),
    and of the printing methods of an object of a project class the script uses only that way
    (CycleGAN's ``logger = Logger(...)``, ``logger.log({...}, images={...})``): every process would
    write them."""
    if facts.foreign is None:
        return set()
    found = set()
    for call in facts.calls:
        parent = facts.get_metadata(ParentNodeProvider, call, None)
        if isinstance(parent, cst.Expr) and not (isinstance(call.func, cst.Name) and call.func.value in facts.functions):
            function = called_function(facts, facts.module, facts.foreign, call.func)
            if function is not None and (function.writes or function.prints):
                found.add(id(call))
    return found | _console_objects(facts)


def _console_objects(facts: Facts) -> set[int]:
    """``obj.method(...)`` statements, where ``obj`` is bound once to an object of a class of the project's other
    modules, every use of it is such a statement, and the method prints (``foreign.console_methods``)."""
    found: set[int] = set()
    for (key, name), assigns in facts.assigns.items():
        if len(assigns) != 1 or "." in name or not isinstance(assigns[0].value, cst.Call) or facts.single_target(
                assigns[0]) != (key, name):
            continue
        read = called_class(facts, facts.module, facts.foreign, assigns[0].value.func)
        if read is None:
            continue
        target = assigns[0].targets[0].target
        scope = facts.get_metadata(ScopeProvider, target, None)
        bindings = list(scope.assignments[name]) if scope is not None else []
        if len(bindings) != 1:
            continue
        calls = []
        for access in bindings[0].references:
            attr = facts.get_metadata(ParentNodeProvider, access.node, None)
            call = facts.get_metadata(ParentNodeProvider, attr, None) if attr is not None else None
            statement = facts.get_metadata(ParentNodeProvider, call, None) if call is not None else None
            if not (isinstance(attr, cst.Attribute) and attr.value is access.node and isinstance(call, cst.Call)
                    and call.func is attr and isinstance(statement, cst.Expr)):
                break
            calls.append(call)
        else:
            printing = console_methods(read[0], read[2])
            found |= {id(c) for c in calls if c.func.attr.value in printing}  # type: ignore[attr-defined]
    return found
