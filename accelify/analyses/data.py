"""The data a backward trains on: does it come from a dataloader ``prepare`` shards and places?

``prepare`` shards a DataLoader between the processes and moves its batches to the device.  Data
that comes from anything else is neither: tensors the script makes by hand stay on the CPU when it
places nothing itself (ACC121), a DataLoader ``prepare`` does not see feeds every process all of
it while the model trains as one (ACC123), and data that is no DataLoader is trained on whole by
every process, correct but no faster (ACC124), unless it is drawn at random without a seed: then
every process trains on its own draws, not the one-process training (ACC134).

Input: the facts (backwards and the loops around them, calls, helpers' call sites), the prepared
dataloaders (``plan.dataloaders``, ``plan.flow["loader"]``) and devices.  Output: refusals ACC121,
ACC123 and ACC134; the note ACC124.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Iterator, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from accelify.analyses.device_kinds import classify_device, is_option_device
from accelify.analyses.facts import Facts
from accelify.analyses.foreign import called_function
from accelify.analyses.ranks import rank_attribute
from accelify.queries.blocks import binds, enclosing_function, inside, scope_root
from accelify.queries.loops import peel_iterable
from accelify.queries.training import locate_setup
from accelify.queries.names import DATALOADERS, code_of, has_qname, qualified_names, star_imports, string_value
from accelify.queries.refs import MODULE, assigned_values, key_at, receiver_refs, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

# Tensors a script makes by hand: on the CPU unless it says otherwise.
_TENSOR_FACTORIES = frozenset(
    f"torch.{name}" for name in (
        "tensor", "as_tensor", "from_numpy", "randn", "rand", "randint", "randperm", "zeros", "ones", "empty",
        "full", "arange", "linspace", "stack", "cat",
    )
)


def placed(facts: Facts, plan: Plan, first: cst.Assign) -> bool:
    """False (ACC121, reported at the first optimizer) when the script trains on tensors it makes by
    hand and places nothing: ``prepare`` would move the model and leave the data on the CPU."""
    if plan.devices or plan.module_device or plan.has_accelerator or ".cuda(" in facts.module.code or \
            _placed_by_option(facts):
        return True  # the script places things itself: it already moves what it makes
    if _placed_on_a_rank(facts, plan):
        return True  # `.to(device_id)`, `device_id = rank % torch.cuda.device_count()`: each process's own GPU
    placer = _foreign_placement(facts)
    if placer is not None:
        call, module = placer
        facts.finding(
            plan, call, "ACC135",
            f"the script places its tensors through `{code_of(call.func)}`, a function of {module} whose placements "
            "accelify does not follow: it cannot tell what that moves where (`prepare` places the model and the batches "
            "itself). File not converted.",
            f"place with `.to(device)` in this file, or convert `{code_of(call.func)}` by hand to use "
            "`accelerator.device`.",
        )
        return False
    moved = _model_moved(facts, plan)
    if moved is not None:
        device = code_of(moved.args[0].value)
        function = enclosing_function(facts, moved)
        handed = function is not None and isinstance(moved.args[0].value, cst.Name) and any(
            p.name.value == device for p in function.params.params)
        where = (f"a parameter of `{function.name.value}` that accelify does not follow to where the device is chosen"
                 if handed and function is not None else
                 "a device accelify cannot follow to a choice it knows (`torch.device(...)`, `\"cuda\"`, `\"cpu\"`)")
        facts.finding(
            plan, moved, "ACC108",
            f"`{code_of(moved)}`: the script moves its model to `{device}`, {where}; left in place, every process "
            "would use that one device, and removed, what the script moves there by hand would stay behind. File "
            "not converted.",
            f"choose the device where the script builds the model (`device = torch.device(\"cuda\" if "
            f"torch.cuda.is_available() else \"cpu\")`) instead of `{device}`, or use `accelerator.device`.",
        )
        return False
    hand_made = not plan.dataloaders and any(has_qname(facts, c.func, _TENSOR_FACTORIES) for c in facts.calls)
    global_device = _module_device_placement(facts, plan) if hand_made or _hand_made_input(facts, plan) else None
    if global_device is not None:
        # (it would be ACC121's "places nothing": it places, on a device the function that trains does not own)
        call, name = global_device
        facts.finding(
            plan, call, "ACC108",
            f"`{code_of(call)}`: `{name}` is a device chosen at the module's top (line {facts.line(facts.assigns[(MODULE, name)][0])}), "
            f"not where the training objects are built (`{plan.setup}`); left in place, every process would use that "
            "one device, and removed, what the script moves there by hand would stay behind. File not converted.",
            f"choose the device in `{plan.setup}` and hand it to the functions that use it, or use "
            "`accelerator.device`.",
        )
        return False
    elsewhere = _placed_on_a_name(facts)
    if hand_made and elsewhere is not None:
        facts.finding(
            plan, elsewhere, "ACC121", f"the training data does not come from a DataLoader, and `{code_of(elsewhere)}` "
            f"places it on `{code_of(elsewhere.args[0].value)}`, which accelify cannot follow to a device it knows: "
            "`prepare` would move the model to the accelerator, and the data would stay where the script puts it. "
            "File not converted.",
            f"choose `{code_of(elsewhere.args[0].value)}` with `torch.device(...)` where the model is built, or move "
            "the tensors with `.to(accelerator.device)` by hand.",
        )
        return False
    if hand_made:
        facts.finding(
            plan, first, "ACC121", "the training data does not come from a DataLoader and the script places nothing "
            "on a device: `prepare` would move the model to the accelerator and leave the data on the CPU. "
            "File not converted.",
            "build the data with a `torch.utils.data.DataLoader` (prepare places its batches), or move the "
            "tensors with `.to(accelerator.device)`; `Accelerator(cpu=True)` keeps everything on the CPU.",
        )
        return False
    fed = _hand_made_input(facts, plan)
    if fed is not None:
        call, tensor = fed
        facts.finding(
            plan, call, "ACC121",
            f"the script places nothing on a device and gives the model `{code_of(tensor)}`, a tensor it makes by "
            "hand: `prepare` would move the model to the accelerator and leave that tensor on the CPU (on a GPU: "
            "a device mismatch). File not converted.",
            "move the tensors the script makes with `.to(accelerator.device)` by hand, or keep everything on the "
            "CPU with `Accelerator(cpu=True)`.",
        )
        return False
    return True


def _placements(facts: Facts) -> Iterator[tuple[cst.Call, cst.Arg]]:
    """Every ``x.to(...)`` of the file with an argument: the call and its first argument."""
    for call in facts.calls:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "to" and call.args:
            yield call, call.args[0]


def _placed_on_a_name(facts: Facts) -> Optional[cst.Call]:
    """The first ``x.to(d)`` with ``d`` a name or an attribute given by position (no dtype of torch): a placement
    on a device accelify does not know (what it knows is in ``plan.devices``), so not "nothing placed"."""
    return next((call for call, first in _placements(facts) if first.keyword is None
                 and isinstance(first.value, (cst.Name, cst.Attribute))
                 and not any(n.startswith("torch.") for n in qualified_names(facts, first.value))), None)


def _placed_on_a_rank(facts: Facts, plan: Plan) -> bool:
    """``x.to(r)`` with ``r`` a name that holds the process's rank (``plan.distributed``): the script places
    its tensors on each process's GPU (the DDP tutorial's ``labels = torch.randn(20, 5).to(device_id)``)."""
    dist = plan.distributed
    if dist is None:
        return False
    ranks = set(dist.ranks) | set(dist.passed)
    return any(ref_of(facts, first.value) in ranks for _, first in _placements(facts))


#: what a function or class that trains is called
_TRAINS = re.compile(r"(?i)train|fit|solver|engine|runner|learner")


def trained_here(facts: Facts, plan: Plan, optimizers) -> bool:
    """False (ACC135) when the file builds its optimizer but runs no backward: the objects are
    handed to code of another module that trains them (BYOL's ``BYOLTrainer(online_network,
    predictor, optimizer, ...)`` from ``trainer.py``). Converting this file alone would prepare
    them and leave that code's data and backward pass as they were."""
    if facts.backwards or plan.evaluation:
        return True
    refs = set(optimizers)
    models = {ref_of(facts, e) for _, exprs in optimizers.values() for e in exprs} - {None}
    for handed in facts.calls:
        given = {ref_of(facts, a.value) for a in handed.args}
        if given & refs and (given & models or _TRAINS.search(code_of(handed.func))):
            module = _foreign_module(facts, handed.func)
            if module is not None:
                break
    else:
        return True  # nothing to say it goes elsewhere: the analyses that follow decide
    facts.finding(
        plan, handed, "ACC135",
        f"the optimizer is handed to `{code_of(handed.func)}`, of {module}, which trains "
        "in another module that accelify cannot convert together with this file (this file runs no backward): "
        "converting this file alone would prepare the model and leave that module's data and backward pass as "
        "they are. File not converted.",
        "convert the training loop where it is (`accelerator.prepare(...)` of its data, "
        "`accelerator.backward(loss)`), or move the loop into this file.",
    )
    return False


def handed_elsewhere(facts: Facts, plan: Plan) -> bool:
    """False (ACC135) when the prepared model or a prepared DataLoader is handed to a function of another
    module of the project that places tensors, trains or runs more of the project's code (NCF's
    ``evaluate.metrics(model, test_loader, top_k)`` and its ``user.cuda()``), and was not converted together
    with this file: after ``prepare`` it would move the batches off each process's device, or count one
    shard."""
    objects = plan.flow["model"] | plan.flow["loader"]
    for call in facts.calls:
        if not any(ref_of(facts, a.value) in objects for a in call.args):
            continue
        function = called_function(facts, facts.module, facts.foreign, call.func)
        if function is None or not function.unsafe or function.trains is not None:
            continue  # (an optimizer factory reads the model's parameters before `prepare`)
        given = next(code_of(a.value) for a in call.args if ref_of(facts, a.value) in objects)
        facts.finding(
            plan, call, "ACC135",
            f"`{given}` is handed to `{code_of(call.func)}`, a function of `{function.module}` that {function.why[:160]}: "
            "accelify cannot convert it together with this file, and after `prepare` it would move the batches "
            "off each process's device or count one process's shard. File not converted.",
            f"convert `{code_of(call.func)}` by hand (place on `accelerator.device`, gather with "
            "`accelerator.gather_for_metrics`), or move it into this file.",
        )
        return False
    return True


#: what the processes of a hand-written distributed run are managed with
_PROCESS_PLUMBING = re.compile(r"^(launch|spawn|all_gather|all_reduce|reduce|broadcast|barrier|synchronize|get_rank|"
                               r"get_world_size|get_local_rank|is_primary|is_main_process|data_sampler|init_distributed\w*"
                               r"|setup_for_distributed|init_process_group)$")


def processes_here(facts: Facts, plan: Plan) -> bool:
    """False (ACC135) when the script manages its processes through a module of its own that
    accelify does not read (rosinality's vq-vae-2: ``import distributed as dist``, then
    ``dist.launch(main, n_gpu, ...)``, ``dist.all_gather(...)``, ``dist.data_sampler(...)``):
    converted beside it, the script would start its own processes under the launcher's and
    collect across them by hand (two processes were seen to hang). The torchvision references' helpers
    (``get_rank()``, ``get_world_size()`` asking torch.distributed when a group exists, ``is_main_process()``,
    ``setup_for_distributed(is_master)``) are no such management: they answer right under any launcher."""
    for call in facts.calls:
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if not _PROCESS_PLUMBING.match(name):
            continue
        module = _foreign_module(facts, func)
        if module is None:
            continue
        helper = called_function(facts, facts.module, facts.foreign, func)
        if helper is not None and helper.role is not None:
            continue  # `utils.get_world_size()`, `utils.is_main_process()`: right under any launcher
        facts.finding(
            plan, call, "ACC135",
            f"`{code_of(func)}(...)`: the script manages its processes through {module}, which accelify does not "
            "convert: converted beside it, the script would start and synchronise processes of its own under "
            "`accelerate launch`. File not converted.",
            "replace that module's launch, rank and collective helpers with `accelerate launch` and the "
            "Accelerator's (`accelerator.process_index`, `accelerator.gather`), then run accelify again.",
        )
        return False
    return True


def _module_device_placement(facts: Facts, plan: Plan) -> Optional[tuple[cst.Call, str]]:
    """``x.to(device)`` where ``device`` is a module-level device (NeRF's ``device = torch.device("cuda" if ...)``
    at the top, read in its functions) and the setup scope is a function: the script does place, on a device
    the conversion does not own. (A flat script's module-level device is the setup's own.)"""
    if plan.setup == MODULE:
        return None
    devices = {ref for ref, assigns in facts.assigns.items() if ref[0] == MODULE and assigns and all(
        classify_device(facts, a.value) is not None for a in assigns)}
    for call in facts.calls:
        if m.matches(call.func, m.Attribute(attr=m.Name("to") | m.Name("cuda"))) and call.args and isinstance(
                call.args[0].value, cst.Name) and ref_of(facts, call.args[0].value) in devices:
            return call, call.args[0].value.value
    return None


def _placed_by_option(facts: Facts) -> bool:
    """``.to(args.device)`` of the ``--device`` option (accelify.analyses.option_devices)."""
    return any(m.matches(c.func, m.Attribute(attr=m.Name("to"))) and c.args and is_option_device(facts, c.args[0].value)
               for c in facts.calls)


#: names of helpers that place what they are handed (``cuda(x, use_cuda)``, ``to_device(batch, device)``)
_PLACERS = re.compile(r"(?i)^(cuda|to_cuda|to_device|to_gpu|move_to(_device)?|send_to_device|var_cuda)$")


def _foreign_placement(facts: Facts) -> Optional[tuple[cst.Call, str]]:
    """A call of a placement helper of another module (``from utils import cuda``), with how to
    name that module."""
    for call in facts.calls:
        func = call.func
        if not isinstance(func, cst.Name) or not _PLACERS.match(func.value) or func.value in facts.functions:
            continue
        module = _foreign_module(facts, func)
        if module is not None:
            return call, module
    return None


def _model_moved(facts: Facts, plan: Plan) -> Optional[cst.Call]:
    """``model.to(device)`` (``model = model.to(device)``) where ``device`` is none of the devices
    accelify knows: the script places its model after all, on a device chosen elsewhere
    (``device = torch_utils.select_device()``, ``args.device``)."""
    models = plan.flow["model"]
    for call in facts.calls:
        if not m.matches(call.func, m.Attribute(attr=m.Name("to"))) or not call.args or call.args[0].keyword is not None:
            continue
        if not any(ref in models for ref in receiver_refs(facts, call.func.value)) \
                and not _binds_model(facts, call, models):  # type: ignore[attr-defined]
            continue
        target = call.args[0].value
        if string_value(target) is not None or m.matches(target, m.Name("torch") | m.Attribute(value=m.Name("torch"))):
            continue
        if is_option_device(facts, target):
            continue  # the `--device` option: the training device (accelify.analyses.option_devices)
        if isinstance(target, cst.Name) and any(classify_device(facts, v) is not None
                                                for v in assigned_values(facts, target)):
            continue  # a device choice accelify knows, made elsewhere: the placement's ACC108 says so
        return call
    return None


def _binds_model(facts: Facts, call: cst.Call, models) -> bool:
    """``model = Net().to(device)``: the call's value is what a model is bound to."""
    parent = facts.get_metadata(ParentNodeProvider, call, None)
    return isinstance(parent, cst.Assign) and parent.value is call and any(
        ref_of(facts, t.target) in models for t in parent.targets)


def is_hand_made(facts: cst.MetadataDependent, expr: cst.BaseExpression) -> bool:
    """``torch.randn(...)``, ``torch.from_numpy(z).float()``: a tensor factory, through method calls on it."""
    while isinstance(expr, cst.Call):
        if has_qname(facts, expr.func, _TENSOR_FACTORIES):
            return not any(a.keyword is not None and a.keyword.value == "device" for a in expr.args)
        if not isinstance(expr.func, cst.Attribute):
            return False
        expr = expr.func.value
    return False


def places_nothing(visitor: cst.MetadataDependent, plan: Plan, module: cst.Module) -> bool:
    """Whether the script placed nothing on a device itself: no ``.cuda(``, and no ``.to(...)`` of a
    model or to a device. Its tensors were all on the CPU; converted, the model and the batches are
    on the accelerator's device, and what the script makes by hand is not."""
    if ".cuda(" in module.code or plan.has_accelerator:
        return False  # placed by the script, or by Accelerate already
    models, devices = plan.flow["model"], plan.flow["device"]
    for call in findall(module, m.Call(func=m.Attribute(attr=m.Name("to")))):
        if any(ref in models for ref in receiver_refs(visitor, call.func.value)):  # type: ignore[attr-defined]
            return False
        if any(ref_of(visitor, arg.value) in devices for arg in call.args):
            return False
    return True


def _hand_made_input(facts: Facts, plan: Plan):
    """(a call of a prepared model, the argument) where the argument is a tensor made by hand (directly,
    or a name bound to one), else None."""
    models = plan.flow["model"]
    for call in facts.calls:
        if ref_of(facts, call.func) not in models:
            continue
        for arg in call.args:
            value = arg.value
            if is_hand_made(facts, value):
                return call, value
            ref = ref_of(facts, value)
            assigns = facts.assigns.get(ref, []) if ref is not None else []
            if any(is_hand_made(facts, a.value) for a in assigns):
                return call, value
    return None


def custom_batch_sampler(facts: Facts) -> Optional[str]:
    """The batch sampler of its own a DataLoader of the file is built with (ProtoNet's ``DataLoader(dataset,
    batch_sampler=PrototypicalBatchSampler(...))``: each batch one few-shot episode), as written; None when
    there is none (``torch.utils.data.BatchSampler`` only groups indices: no structure a metric reads)."""
    for call in facts.calls:
        if not has_qname(facts, call.func, DATALOADERS):
            continue
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "batch_sampler":
                values = [arg.value, *facts.bound_values(arg.value)]
                if not any(isinstance(v, cst.Call) and has_qname(facts, v.func, _TORCH_BATCH_SAMPLERS) for v in values):
                    return code_of(arg.value)
    return None


_TORCH_BATCH_SAMPLERS = frozenset({"torch.utils.data.BatchSampler", "torch.utils.data.sampler.BatchSampler"})


def rebound_loaders(facts: Facts, plan: Plan) -> bool:
    """False (ACC123) when a function handed a prepared DataLoader binds that parameter again (StyleGAN's
    ``loader = sample_data(dataset, batch_size, resolution)`` at each new resolution): the new loader never
    goes through ``prepare``, and every process would train on all of its data."""
    for key, name in sorted(plan.flow["loader"]):
        if key == plan.setup or key == plan.owner:
            continue  # the setup scope: a loader bound again after `prepare` is prepare_point's
        again = [a for a in facts.assigns.get((key, name), []) if facts.assign_key.get(id(a)) == key
                 and not _wraps_itself(facts, a.value, name)]
        if again:
            value = again[0].value
            made = f"{code_of(value.func)}(...)" if isinstance(value, cst.Call) else code_of(value)
            facts.finding(
                plan, again[0], "ACC123",
                f"`{name}` is handed the prepared DataLoader, and `{key}` binds it again here to `{made}`: that "
                "loader never goes through `prepare`, so every process would train on all of its data. File not "
                "converted.",
                f"prepare the new loader where it is made (`{name} = accelerator.prepare({made})`), or build every "
                "loader where the model is built.",
            )
            return False
    return True


def _wraps_itself(facts: Facts, value: cst.BaseExpression, name: str) -> bool:
    """``data_loader = tqdm(data_loader, ...)`` (on the main process only, in WZMIAOMIAO's ``evaluate``): the same
    batches, in the same order, behind a progress bar; still the prepared loader."""
    peeled = peel_iterable(facts, value) if isinstance(value, cst.Call) else value
    return peeled is not value and isinstance(peeled, cst.Name) and peeled.value == name


def loops_through_wrappers(facts: Facts, plan: Plan) -> bool:
    """False (ACC114) when an evaluation loop draws a prepared DataLoader's batches through a call accelify
    does not see into (``for x, y in wrap(test_loader):``): prepared, the loader gives each process its shard,
    and the loop's metrics, which no gather reaches, would count that shard alone."""
    loaders = plan.flow["loader"]
    for loop in facts.loops:
        if ref_of(facts, peel_iterable(facts, loop.iter)) in loaders:
            continue
        read = next((n for n in findall(loop.iter, m.Name()) if ref_of(facts, n) in loaders), None)
        if read is None or findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("backward")))):
            continue  # a training loop: each process trains on its shard, as it should
        facts.finding(
            plan, loop.iter, "ACC114",
            f"the batches of the prepared DataLoader `{code_of(read)}` come through `{code_of(loop.iter)}`, which "
            "accelify does not follow: each process would evaluate its own shard, and the loop's results, which no "
            "gather reaches, would count that shard alone. File not converted.",
            f"iterate the loader itself (`for batch in {code_of(read)}:`), or gather what the loop computes with "
            "`accelerator.gather_for_metrics(...)` by hand.",
        )
        return False
    return True


def training_data(facts: Facts, plan: Plan) -> bool:
    """Every loop around a backward should draw from a prepared dataloader.

    A DataLoader accelify does not prepare (returned by a helper, built elsewhere) would feed
    every process the whole dataset while the model trains as one: ACC123, file unchanged.
    Data that is no DataLoader (hand-sliced tensors, ``get_batch()``) cannot be prepared: the
    conversion goes on and ACC124 says that every process trains on all of it.
    """
    reported = False
    for call in facts.backwards:
        loops = []
        node = facts.get_metadata(ParentNodeProvider, call, None)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            if isinstance(node, cst.For):
                loops.append(node)
            node = facts.get_metadata(ParentNodeProvider, node, None)
        if loops:
            _move_iterators(facts, plan, loops[-1])
        if not loops or any(_prepared_data(facts, plan, loop.iter, 0) or _bound_by_prepare(facts, loop.iter)
                            for loop in loops) or _drawn_by_next(facts, plan, loops[-1]) \
                or _drawn_through_wrapper(facts, plan, loops[-1]):
            continue
        early = _iterator_made_before(facts, plan, loops[-1])
        if early is not None and not seeded(facts, TORCH_SEEDS):
            # (torch seeded, every process's DataLoader shuffles the same way and draws the same batches from it:
            # ACC124 below says so; a NumPy generator of its own shuffles no DataLoader)
            iterator, call = early
            facts.finding(
                plan, call, "ACC123",
                f"the training loop draws with `{code_of(call)}` from `{code_of(iterator)}`, made from a DataLoader "
                "before the loop, where `prepare` has not run yet: it would keep drawing from the loader as it was, "
                "unsharded (and shuffled differently on every process). File not converted.",
                f"make `{code_of(iterator)}` after `accelerator.prepare(...)` (inside the training loop, or after "
                "the line that builds the optimizer), then convert again.",
            )
            return False
        for loop in loops:
            if _loader_like(facts, loop.iter, set()):
                drawn = peel_iterable(facts, loop.iter)
                what = code_of(drawn)
                if isinstance(drawn, cst.Subscript):
                    facts.finding(
                        plan, loop, "ACC123",
                        f"the training loop draws from `{what}`, one of the DataLoaders held in "
                        f"`{code_of(drawn.value)}`, which accelify does not prepare one by one: every process "
                        "would train on all of it. File not converted.",
                        f"prepare each DataLoader where `{code_of(drawn.value)}` is built (e.g. "
                        f"`{code_of(drawn.value)} = {{k: accelerator.prepare(v) for k, v in "
                        f"{code_of(drawn.value)}.items()}}`) and the model and optimizer with "
                        "`accelerator.prepare(...)`.",
                    )
                    return False
                method = _method_parameter(facts, drawn)
                why = (f"`{what}` is a parameter of the method `{method}`, whose calls accelify does not follow "
                       "(it follows those of module-level functions and of a class's constructor)"
                       if method is not None else
                       "it is not built where the model and optimizer are, nor returned there by a helper of this "
                       "file that builds it on every path")
                facts.finding(
                    plan, loop, "ACC123",
                    f"the training loop draws from `{what}`, a DataLoader accelify cannot prepare ({why}): every "
                    "process would train on all of it. File not converted.",
                    "build the DataLoader beside the model and optimizer (or hand it to the class's constructor), "
                    "or pass it through the same `accelerator.prepare(...)` call." if method is not None else
                    "build the DataLoader beside the model and optimizer, or pass it through the same "
                    "`accelerator.prepare(...)` call.",
                )
                return False
        unprepared = next((d for loop in loops if (d := _unprepared_next(facts, plan, loop)) is not None), None)
        if unprepared is not None:
            iterator, call = unprepared
            facts.finding(
                plan, call, "ACC123",
                f"the training loop draws with `{code_of(call)}` from `{code_of(iterator)}`, an iterator of a "
                "DataLoader accelify cannot prepare (built where the model and optimizer are not, or by a helper "
                "there): every process would train on all of it, shuffled its own way. File not converted.",
                "build the DataLoader beside the model and optimizer and pass it through the same "
                "`accelerator.prepare(...)` call, or prepare it where it is built.",
            )
            return False
        foreign = next((f for loop in loops if (f := _foreign_source(facts, loop.iter)) is not None), None)
        if foreign is not None:
            call, module = foreign
            function = called_function(facts, facts.module, facts.foreign, call.func)
            known = (f"which {function.why[:160]}" if function is not None and function.why else
                     "which accelify does not read (no such file beside this one)")
            facts.finding(
                plan, call, "ACC135",
                f"the training data comes from `{code_of(call)}`, a function of {module} {known}: accelify cannot "
                "tell whether that is a DataLoader `prepare` should shard (left as it is, every process would draw "
                "its own batches). File not converted.",
                "build the DataLoader in this file, or pass what the function returns through "
                "`accelerator.prepare(...)` by hand.",
            )
            return False
        if not reported:
            reported = True
            drawn = _unseeded_draw(facts, loops)
            if drawn is not None:
                data = code_of(peel_iterable(facts, loops[0].iter))
                facts.finding(
                    plan, drawn, "ACC134",
                    f"the training data (`{data}`) is no DataLoader and is drawn at random (`{code_of(drawn)}`) "
                    "without a seed: every process would draw its own batches, so each step would average N "
                    "different batches and an epoch would be N passes over the data, not the one-process "
                    "training. File not converted.",
                    "seed the draws (`torch.manual_seed(0)`: converted, every process draws the same batches, as "
                    "one process does), or build a `Dataset` + `DataLoader`, which `prepare` shards.",
                )
                return False
            facts.note(plan, loops[0], "ACC124", *_unsharded_data(facts, plan, loops[0]))
    return True


def _unsharded_data(facts: Facts, plan: Plan, loop: cst.For) -> tuple[str, str]:
    """ACC124's message and suggestion: a training loop over no DataLoader. Its data is not sharded; what
    each process draws: the script's own loader split by rank, its own seeded draws, or all of it."""
    head = f"the training loop runs over `{code_of(peel_iterable(facts, loop.iter))}`, not over a DataLoader: "
    split = _split_by_rank(facts, plan, loop)
    if split is not None:
        return (head + f"its batches come from `{code_of(split)}`, handed the process's rank, which splits the data "
                "between the processes itself, as in the original.",
                "nothing to do; a `torch.utils.data.Dataset` + `DataLoader` would let `prepare` shard it instead.")
    seed = _per_process_seed(facts, plan)
    if seed is not None:
        return (head + f"its batches are drawn at random with a seed of each process's own (`{code_of(seed)}`), so "
                "each process trains on draws of its own, as in the original (not sharded: no epoch is split).",
                "wrap the data in a `torch.utils.data.Dataset` + `DataLoader`, which `prepare` shards, if an epoch "
                "should be split between the processes.")
    return (head + "its data is not sharded, every process trains on all of it (correct, but no faster).",
            "wrap the data in a `torch.utils.data.Dataset` + `DataLoader`, which `prepare` shards, or slice it per "
            "process with `accelerator.split_between_processes`.")


def _split_by_rank(facts: Facts, plan: Plan, loop: cst.CSTNode) -> Optional[cst.Call]:
    """``x, y = train_loader.next_batch()`` in the loop, ``train_loader = DataLoaderLite(B, T,
    process_rank=ddp_rank, num_processes=ddp_world_size)`` (build-nanoGPT): a loader of the script's own,
    handed the rank, that splits the data itself."""
    if plan.distributed is None:
        return None
    body = getattr(loop, "body", loop)
    for call in findall(body, m.Call(func=m.Attribute(value=m.Name()))):
        ref = ref_of(facts, call.func.value)  # type: ignore[attr-defined]
        for assign in facts.assigns.get(ref, []) if ref is not None else []:
            made = assign.value
            if isinstance(made, cst.Call) and any(
                rank_attribute(facts, a.value, plan) is not None for a in made.args
            ):
                return made
    return None


def _per_process_seed(facts: Facts, plan: Plan) -> Optional[cst.Call]:
    """``torch.manual_seed(1337 + seed_offset)`` with ``seed_offset`` a rank (nanoGPT): each process draws
    its own batches, on purpose."""
    if plan.distributed is None:
        return None
    def rank(node: cst.BaseExpression) -> bool:
        return rank_attribute(facts, node, plan) is not None

    for call in facts.calls:
        if not has_qname(facts, call.func, frozenset({"torch.manual_seed"})) or not call.args:
            continue
        for node in findall(call.args[0].value, m.Name() | m.Attribute()):
            ref = ref_of(facts, node)
            values = [a.value for a in facts.assigns.get(ref, [])] if ref is not None else []
            # `seed_offset = ddp_rank` when launched (`= 0` in one process)
            if rank(node) or any(rank(v) for v in values if isinstance(v, (cst.Name, cst.Attribute, cst.Call))):
                return call
    return None


#: packages whose functions accelify knows do not return a DataLoader to prepare (their data is
#: no DataLoader: ACC124 / ACC134 say what that means)
_KNOWN_PACKAGES = frozenset({"torch", "torchvision", "torchaudio", "torchtext", "numpy", "random", "itertools", "accelerate",
                             "builtins", "math", "tqdm", "datasets", "transformers", "os", "glob", "json", "pandas"})


#: the standard library's modules (functools.reduce is no collective)
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset({
    "functools", "operator", "collections", "itertools", "os", "sys", "math", "random", "json", "pickle", "time",
    "multiprocessing", "concurrent", "threading", "subprocess", "shutil", "pathlib", "glob", "re", "copy"})


def _foreign_source(facts: Facts, iterable: cst.BaseExpression) -> Optional[tuple[cst.Call, str]]:
    """The call of a function defined in another module (``from utils import get_data``, or a name a
    ``from utils import *`` brings) that the loop's data comes from (through a few assignments),
    with how to name that module; None when the data comes from this file or a known package."""
    expr = peel_iterable(facts, iterable)
    for _ in range(4):
        if isinstance(expr, cst.Call):
            break
        values = (facts.bound_values(expr) or _handed(facts, expr) or _unpacked_from_call(facts, expr)
                  or _self_attribute_values(facts, expr))
        if len(values) != 1:
            return None
        expr = peel_iterable(facts, values[0])
    if not isinstance(expr, cst.Call) or not isinstance(expr.func, (cst.Name, cst.Attribute)):
        return None
    func = expr.func
    if isinstance(func, cst.Name) and func.value in facts.functions:
        return None
    module = _foreign_module(facts, func)
    return (expr, module) if module is not None else None


def _self_attribute_values(facts: Facts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``self.data_loader``: the values its class assigns it (BetaVAE's ``self.data_loader =
    return_data(args)`` in ``Solver.__init__``)."""
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self"):
        return []
    ref = ref_of(facts, expr)
    return [a.value for a in facts.assigns.get(ref, [])] if ref is not None else []


def _handed(facts: Facts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What every call of the module-level function hands the parameter ``expr`` names (RepDistiller's
    ``train_vanilla(epoch, train_loader, ...)`` loops over the loader of its one call)."""
    function = enclosing_function(facts, expr)
    if not isinstance(expr, cst.Name) or function is None or function.name.value not in facts.functions \
            or facts.functions[function.name.value] is not function \
            or expr.value not in {p.name.value for p in function.params.params}:
        return []
    values = [bound.get(expr.value) for _, bound in facts.call_sites(function.name.value, function)]
    if not values or any(v is None for v in values):
        return []
    codes = {code_of(v) for v in values}  # type: ignore[arg-type]
    return [values[0]] if len(codes) == 1 and all(isinstance(v, cst.Name) for v in values) else []


def _method_parameter(facts: Facts, expr: cst.BaseExpression) -> Optional[str]:
    """``Class.method`` when ``expr`` names a parameter of a method (``def fit(self, loader)``)."""
    if not isinstance(expr, cst.Name):
        return None
    function = enclosing_function(facts, expr)
    if function is None or expr.value not in {p.name.value for p in function.params.params}:
        return None
    key = key_at(facts, expr)
    return key if key is not None and "." in key and key.split(".")[0] in facts.classes else None


def _unpacked_from_call(facts: Facts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``train_loader, val_loader = get_cifar100_dataloaders(...)``: the call, for a name bound there only."""
    if not isinstance(expr, cst.Name):
        return []
    scope = facts.get_metadata(ScopeProvider, expr, None)
    assignments = list(scope[expr.value]) if scope is not None else []
    if len(assignments) != 1 or not isinstance(getattr(assignments[0], "node", None), cst.Name):
        return []
    element = facts.get_metadata(ParentNodeProvider, assignments[0].node, None)
    packed = facts.get_metadata(ParentNodeProvider, element, None) if isinstance(element, cst.Element) else None
    target = facts.get_metadata(ParentNodeProvider, packed, None) if isinstance(packed, (cst.Tuple, cst.List)) else None
    assign = facts.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
    return [assign.value] if isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call) else []


def foreign_callee(facts: Facts, func: cst.BaseExpression) -> bool:
    """Is ``func`` code of another module: a name imported from one (``utils.save``, ``save_images``), or a
    method of an object this file makes from one of its classes (``ema = EMA(0.995)`` ... ``ema.step_ema``)?"""
    if _foreign_module(facts, func) is not None:
        return True
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
        return False
    made = assigned_values(facts, func.value)
    return bool(made) and all(isinstance(v, cst.Call) and _foreign_module(facts, v.func) is not None for v in made)


def _foreign_module(facts: Facts, func: cst.BaseExpression) -> Optional[str]:
    """How to name the module ``func`` comes from when it is another module of the project
    (imported by name, or brought by a ``from utils import *``), not a known package's nor this
    file's; None otherwise."""
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name):
        return None
    names = {q.name for q in facts.get_metadata(QualifiedNameProvider, func, set())
             if q.source is QualifiedNameSource.IMPORT}
    if not names and qualified_names(facts, func):
        return None  # a name of this file (a class, a variable, the accelerator)
    if names:
        foreign = sorted(n for n in names if "." in n.lstrip(".") and n.lstrip(".").split(".")[0] not in _KNOWN_PACKAGES
                         and n.split(".")[0] not in _STDLIB)
        if not foreign or len(foreign) != len(names):
            return None  # a known package's, or a name of this file (a class, a variable)
        return f"`{foreign[0].rpartition('.')[0]}`"
    scope = facts.get_metadata(ScopeProvider, root, None)
    stars = star_imports(facts.module) if scope is not None and not list(scope[root.value]) else []
    if stars:
        return "a module imported with `*` (" + ", ".join(f"`{m}`" for m in stars) + ")"
    return None



_RANDOM_DRAWS = frozenset({
    "random.shuffle", "random.sample", "random.randint", "random.choice", "random.choices", "random.randrange",
    "numpy.random.shuffle", "numpy.random.permutation", "numpy.random.choice", "numpy.random.randint",
    "torch.randperm", "torch.randint", "torch.multinomial",
})
_SHUFFLES = frozenset({"random.shuffle", "random.sample", "numpy.random.shuffle", "numpy.random.permutation",
                       "torch.randperm"})
_SEEDS = frozenset({
    "random.seed", "numpy.random.seed", "torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all", "accelerate.utils.set_seed", "accelerate.utils.random.set_seed",
    "transformers.set_seed", "numpy.random.default_rng", "numpy.random.RandomState", "random.Random",
})


#: the seeds of the generator a DataLoader shuffles with
TORCH_SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed", "accelerate.utils.set_seed",
                          "accelerate.utils.random.set_seed", "transformers.set_seed"})


def seeded(facts: Facts, seeds: frozenset = _SEEDS) -> bool:
    """Does the file seed a random generator (then every process draws the same)?"""
    return any(has_qname(facts, c.func, seeds) for c in facts.calls)


def _unseeded_draw(facts: Facts, loops: list) -> Optional[cst.Call]:
    """The first random draw that makes the training data (``random.shuffle(data)``, ``torch.randint(len(data)
    - n, ...)``) when the file seeds no generator: every process would draw differently. A draw counts in
    the training loops, before them in their scope, or in a function of the file they call (the batch
    generator); not in a function they never reach (sampling text after training: ``np.random.choice``)."""
    if seeded(facts):
        return None
    relevant = _reached_functions(facts, loops) | _callers(facts, {(key_at(facts, lp) or "").split(".")[0] for lp in loops})
    # (a draw from a generator of its own, `torch.randint(..., generator=g)`, is the same on every process)
    drawn = [c for c in facts.calls if has_qname(facts, c.func, _RANDOM_DRAWS) and not any(
        a.keyword is not None and a.keyword.value == "generator" for a in c.args)
        and ((top := (key_at(facts, c) or "").split(".")[0]) not in facts.functions or top in relevant)]
    # a shuffle says it best: the data's order drawn per process
    return next((c for c in drawn if has_qname(facts, c.func, _SHUFFLES)), drawn[0] if drawn else None)


def _reached_functions(facts: Facts, loops: list) -> set[str]:
    """The module-level functions of the file the training loops call, and those they call in turn."""
    todo = [c.func.value for loop in loops for c in findall(loop, m.Call(func=m.Name()))]  # type: ignore[attr-defined]
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in facts.functions and name not in reached:
            reached.add(name)
            todo += [c.func.value for c in findall(facts.functions[name].body, m.Call(func=m.Name()))]  # type: ignore[attr-defined]
    return reached


def _callers(facts: Facts, functions: set[str]) -> set[str]:
    """``functions`` and the module-level functions of the file that call one of them, in turn (``main``
    calling ``train``): a draw there shapes the data it hands down."""
    found = set(functions)
    changed = True
    while changed:
        changed = False
        for name, func in facts.functions.items():
            if name not in found and any(c.func.value in found for c in findall(func.body, m.Call(func=m.Name()))):  # type: ignore[attr-defined]
                found.add(name)
                changed = True
    return found


def _next_draws(facts: Facts, plan: Plan, loop: cst.For) -> Iterator[tuple[cst.Name, cst.Call, bool]]:
    """``next(it)`` in the loop from an iterator of a prepared dataloader (wgan: ``data_iter =
    iter(dataloader)`` per epoch, then ``data = next(data_iter)`` in a ``while`` inside): (the iterator,
    the call, whether the iterator is made in the loop). One made before it (``looper =
    infiniteloop(dataloader)`` in the setup code) holds the loader as it was before ``prepare``, unsharded."""
    for iterator, call in _next_calls(facts, loop):
        if _prepared_data(facts, plan, iterator, 0):
            yield iterator, call, _made_in(facts, iterator, loop)


def _next_calls(facts: Facts, loop: cst.For) -> Iterator[tuple[cst.Name, cst.Call]]:
    """``next(it)`` and ``it.__next__()`` in the loop's body, with the iterator they draw from (a name)."""
    for call in findall(loop.body, m.Call(func=m.Name("next") | m.Attribute(attr=m.Name("__next__")))):
        if isinstance(call.func, cst.Attribute) and not call.args:  # `data_gen.__next__()`
            iterator = call.func.value
        elif call.args and qualified_names(facts, call.func) & {"builtins.next", "next"}:
            iterator = call.args[0].value
        else:
            continue
        if isinstance(iterator, cst.Name):
            yield iterator, call  # type: ignore[misc]


def _unprepared_next(facts: Facts, plan: Plan, loop: cst.For) -> Optional[tuple[cst.Name, cst.Call]]:
    """``real_image = next(data_loader)`` in the loop where ``data_loader = iter(loader)`` and ``loader`` is a
    DataLoader no ``prepare`` takes (StyleGAN's ``loader = sample_data(dataset, batch, resolution)`` in
    ``train``): (the iterator, the ``next`` call)."""
    return next(((iterator, call) for iterator, call in _next_calls(facts, loop)
                 if not _prepared_data(facts, plan, iterator, 0) and _loader_like(facts, iterator, set())), None)


def _drawn_by_next(facts: Facts, plan: Plan, loop: cst.For) -> bool:
    """Does the loop draw its batches with ``next(...)`` from an iterator of a prepared dataloader made in it, or
    made after ``prepare`` (there, or moved there)?"""
    return any(made_in or _made_after_prepare(facts, plan, iterator) or _moved(facts, plan, iterator)
               for iterator, _, made_in in _next_draws(facts, plan, loop))


def _drawn_through_wrapper(facts: Facts, plan: Plan, loop: cst.For) -> bool:
    """Does the loop draw its batches from an object made from a prepared dataloader, in the loop or after
    ``prepare`` (NVIDIA's data prefetcher: ``prefetcher = DataPrefetcher(loader, device)`` per epoch, then
    ``inputs, targets = prefetcher.next()`` until it hands back None)? It draws the process's shard."""
    for call in findall(loop.body, m.Call(func=m.Attribute(value=m.Name()))):
        receiver = call.func.value  # type: ignore[attr-defined]
        if not isinstance(facts.get_metadata(ParentNodeProvider, call, None), cst.Assign):
            continue
        assignments = _assignments(facts, receiver)  # type: ignore[arg-type]
        made_in = bool(assignments) and all(a is not None and inside(facts, a, {id(loop)}) for a in assignments)
        if (made_in or _made_after_prepare(facts, plan, receiver)) and any(  # type: ignore[arg-type]
                isinstance(v, cst.Call) and _prepared_data(facts, plan, v, 0) for v in facts.bound_values(receiver)):
            return True
    return False


def _move_iterators(facts: Facts, plan: Plan, loop: cst.For) -> None:
    """``plan.after_prepare``: the iterators the loop draws from that are made before ``prepare`` and can be made
    right after it instead (then they wrap the prepared loader)."""
    for iterator, _, made_in in _next_draws(facts, plan, loop):
        if not made_in and not _made_after_prepare(facts, plan, iterator):
            moved = _movable_iterator(facts, plan, iterator)
            if moved is not None:
                plan.after_prepare.add(id(moved))


def _moved(facts: Facts, plan: Plan, iterator: cst.Name) -> bool:
    """Is ``iterator`` made by a statement the conversion moves after ``prepare``?"""
    return any(a is not None and id(facts.get_metadata(ParentNodeProvider, a, None)) in plan.after_prepare
               for a in _assignments(facts, iterator))


def _iterator_made_before(facts: Facts, plan: Plan, loop: cst.For) -> Optional[tuple[cst.Name, cst.Call]]:
    """``looper = infiniteloop(dataloader)`` (or ``iter(dataloader)``) before the loop and before ``prepare``,
    ``next(looper)`` in it: (the iterator, the ``next`` call). One made after the point where ``prepare`` goes
    (after the line that builds the optimizer) wraps the prepared loader."""
    return next(((iterator, call) for iterator, call, made_in in _next_draws(facts, plan, loop)
                 if not made_in and not _made_after_prepare(facts, plan, iterator)
                 and not _moved(facts, plan, iterator)), None)


def _prepare_point(facts: Facts, plan: Plan) -> Optional[tuple[cst.BaseSuite, int]]:
    """The setup block and the index in it where ``prepare`` goes; None when the script prepares already."""
    root = scope_root(facts.module, plan.setup)
    located = locate_setup(root, set(plan.anchors()), facts.trainers, touches=plan.touches()) if root else None
    return None if plan.has_prepare else located


def _assignments(facts: Facts, iterator: cst.Name) -> list[cst.Assign]:
    """The assignments that bind ``iterator`` in its scope (a binding of another kind: not an Assign)."""
    scope = facts.get_metadata(ScopeProvider, iterator, None)
    out = []
    for assignment in scope[iterator.value] if scope is not None else ():
        target = facts.get_metadata(ParentNodeProvider, getattr(assignment, "node", None), None)
        assign = facts.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        out.append(assign if isinstance(assign, cst.Assign) else None)
    return out  # type: ignore[return-value]


def _made_after_prepare(facts: Facts, plan: Plan, iterator: cst.Name) -> bool:
    """Is every assignment of ``iterator`` a statement of the setup block after the point ``prepare`` goes?"""
    located = _prepare_point(facts, plan)
    if located is None:
        return False
    block, index = located
    after = {id(n) for stmt in block.body[index:] for n in findall(stmt, m.Assign())}
    assignments = _assignments(facts, iterator)
    return bool(assignments) and all(a is not None and id(a) in after for a in assignments)


def _movable_iterator(facts: Facts, plan: Plan, iterator: cst.Name) -> Optional[cst.SimpleStatementLine]:
    """``datalooper = infiniteloop(dataloader)`` (a generator of this file) or ``data_iter = iter(loader)``,
    made once in the setup block before the point ``prepare`` goes and not read before it: the statement, which
    the conversion moves to just after ``prepare`` (where an Accelerate user would write it), so that it wraps
    the prepared loader. None when it is made otherwise (twice, from more than names, by a call with effects,
    or from a name bound again before ``prepare``)."""
    located = _prepare_point(facts, plan)
    assignments = _assignments(facts, iterator)
    if located is None or len(assignments) != 1 or assignments[0] is None:
        return None
    block, index = located
    assign = assignments[0]
    line = next((i for i, stmt in enumerate(block.body[:index]) if isinstance(stmt, cst.SimpleStatementLine)
                 and len(stmt.body) == 1 and stmt.body[0] is assign), None)
    value = assign.value
    if line is None or len(assign.targets) != 1 or not isinstance(value, cst.Call) or not value.args:
        return None
    if not all(isinstance(arg.value, cst.Name) and arg.keyword is None and not arg.star for arg in value.args):
        return None
    if not (qualified_names(facts, value.func) & {"builtins.iter", "iter"} or _generator_of_file(facts, value.func)):
        return None
    between = block.body[line + 1:index]
    names = {iterator.value} | {arg.value.value for arg in value.args}  # type: ignore[attr-defined]
    for stmt in between:
        if findall(stmt, m.Name(iterator.value)) or binds(stmt, names):
            return None
    return block.body[line]  # type: ignore[return-value]


def _generator_of_file(facts: Facts, func: cst.BaseExpression) -> bool:
    """Is ``func`` a module-level function of this file whose own body yields (calling it runs nothing)?"""
    if not isinstance(func, cst.Name):
        return False
    defined = facts.functions.get(func.value)
    if defined is None or defined.decorators:
        return False
    return any(enclosing_function(facts, y) is defined for y in findall(defined.body, m.Yield()))


def _made_in(facts: Facts, iterator: cst.Name, loop: cst.For) -> bool:
    """Is ``iterator`` a name every assignment of which is inside ``loop``?"""
    scope = facts.get_metadata(ScopeProvider, iterator, None)
    assignments = list(scope[iterator.value]) if scope is not None else []
    return bool(assignments) and all(
        (node := getattr(a, "node", None)) is not None and inside(facts, node, {id(loop)}) for a in assignments)


def _prepared_data(facts: Facts, plan: Plan, expr: cst.BaseExpression, depth: int) -> bool:
    """Does ``expr`` draw from a prepared dataloader, directly or through names bound to
    wrappers of one (``epoch_iterator = tqdm(train_dataloader)``)?"""
    expr = peel_iterable(facts, expr)
    if ref_of(facts, expr) in plan.flow["loader"]:
        return True
    if isinstance(expr, cst.Call) and depth < 4:
        return any(_prepared_data(facts, plan, arg.value, depth + 1) for arg in expr.args[:1])
    return depth < 4 and any(_prepared_data(facts, plan, v, depth + 1) for v in facts.bound_values(expr))


def _bound_by_prepare(facts: Facts, expr: cst.BaseExpression, seen: frozenset[int] = frozenset()) -> bool:
    """Is ``expr`` a name the script binds from its own ``accelerator.prepare(...)`` (code already on
    Accelerate: ``model, optimizer, train_dataloader = accelerator.prepare(...)``), or a parameter of a
    module-level helper that every call of it hands such a name (``train(train_dataloader, ...)``)?"""
    expr = peel_iterable(facts, expr)
    if not isinstance(expr, cst.Name) or id(expr) in seen:
        return False
    scope = facts.get_metadata(ScopeProvider, expr, None)
    for assignment in scope[expr.value] if scope is not None else ():
        node = getattr(assignment, "node", None)
        if isinstance(node, cst.Param):
            func = enclosing_function(facts, node)
            sites = facts.call_sites(func.name.value, func) if func is not None and facts.functions.get(
                func.name.value) is func else []
            if sites and all((arg := bound.get(node.name.value)) is not None
                             and _bound_by_prepare(facts, arg, seen | {id(expr)}) for _, bound in sites):
                return True
            continue
        while node is not None and not isinstance(node, (cst.Assign, cst.BaseStatement)):
            node = facts.get_metadata(ParentNodeProvider, node, None)
        if isinstance(node, cst.Assign) and m.matches(node.value, m.Call(func=m.Attribute(attr=m.Name("prepare")))):
            return True
    return False


def _loader_like(facts: Facts, expr: cst.BaseExpression, seen: set[int]) -> bool:
    """Could ``expr`` hold a DataLoader: one built by the constructor, or returned by a function of
    this file that builds one, followed through assignments and helper parameters."""
    expr = peel_iterable(facts, expr)
    if isinstance(expr, cst.Subscript):  # `dataloaders[phase]`: a dict (or list) of DataLoaders
        return _holds_loaders(facts, expr.value, seen)
    if isinstance(expr, cst.Call):
        if has_qname(facts, expr.func, DATALOADERS):
            return True
        func = facts.functions.get(expr.func.value) if isinstance(expr.func, cst.Name) else None
        return func is not None and any(has_qname(facts, c.func, DATALOADERS) for c in findall(func, m.Call()))
    if isinstance(expr, cst.Attribute):
        ref = ref_of(facts, expr)
        return any(_loader_like(facts, a.value, seen) for a in facts.assigns.get(ref, [])) if ref else False
    if not isinstance(expr, cst.Name) or id(expr) in seen:
        return False
    seen.add(id(expr))
    scope = facts.get_metadata(ScopeProvider, expr, None)
    if scope is None:
        return False
    for assignment in scope[expr.value]:
        node = getattr(assignment, "node", None)
        if isinstance(node, cst.Param):
            func = enclosing_function(facts, node)
            sites = facts.call_sites(func.name.value, func) if func is not None and facts.functions.get(
                func.name.value) is func else []
            if sites:  # a module-level helper: what its calls pass
                if any((arg := bound.get(node.name.value)) is not None and _loader_like(facts, arg, seen)
                       for _, bound in sites):
                    return True
                continue
            annotation = node.annotation.annotation if node.annotation is not None else None
            if "loader" in node.name.value.lower() or (
                annotation is not None and has_qname(facts, annotation, DATALOADERS)
            ):
                return True  # a method's `data_loader`, `loader: DataLoader`: said by the code itself
            continue
        parent = facts.get_metadata(ParentNodeProvider, node, None) if node is not None else None
        while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List, cst.AssignTarget)):
            parent = facts.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.Assign) and _loader_like(facts, parent.value, seen):
            return True
    return False


def _holds_loaders(facts: Facts, container: cst.BaseExpression, seen: set[int]) -> bool:
    """Is ``container`` bound to a dict, list or tuple of DataLoaders (a literal or a comprehension)?"""
    values = facts.bound_values(container) if isinstance(container, cst.Name) else [container]
    for value in values:
        if isinstance(value, cst.Dict):
            items = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        elif isinstance(value, (cst.List, cst.Tuple)):
            items = [e.value for e in value.elements]
        elif isinstance(value, cst.DictComp):
            items = [value.value]
        elif isinstance(value, (cst.ListComp, cst.GeneratorExp)):
            items = [value.elt]
        else:
            continue
        if any(_loader_like(facts, item, seen) for item in items):
            return True
    return False
