"""The device: which names of the setup scope hold the automatic device, and the flag that picks the CPU.

``device = torch.device("cuda" if torch.cuda.is_available() else "cpu")`` is what
``Accelerator()`` picks by itself: such a name becomes ``accelerator.device``.  A choice made by
a flag (``"cuda" if use_cuda else "cpu"``, an ``if args.cuda: ... else: ...`` chain, or with
no device variable ``if args.cuda: model.cuda()``) stays the script's choice, as
``Accelerator(cpu=not use_cuda)``.

Input: the setup scope's assignments, the placements of the trained models (``plan.flow``), and
:class:`~accelify.analyses.accelerator.Arguments` for what the flag may read.  Output:
``plan.devices``, ``plan.string_devices``, ``plan.cpu_flag``; refusals ACC103 (a device bound
more than once, not as an accelerator-or-CPU chain) and ACC102 (a device that forces the CPU, or
a fixed or computed one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider, ScopeProvider

from accelify.analyses.accelerator import Arguments
from accelify.analyses.device_kinds import DeviceKind, chosen_index, classify_device, per_process_device
from accelify.analyses.facts import Facts, chain_root
from accelify.analyses.foreign import called_function
from accelify.queries.blocks import inside, is_docstring, statement_line, under
from accelify.queries.devices import is_availability_check
from accelify.queries.names import code_of, param_names, read_names, string_value
from accelify.queries.refs import MODULE, Ref, key_at, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def classify(facts: Facts, plan: Plan, in_owner: dict[Ref, list[cst.Assign]]) -> bool:
    """Classify the device variables of the setup scope; False when the file must stay as it is."""
    plan.devices.update(_handed_devices(facts, plan))
    for ref, assigns in in_owner.items():
        kinds = [classify_device(facts, a.value) or _device_function(facts, a.value) for a in assigns
                 if facts.single_target(a) == ref]
        if not any(kinds):
            continue
        name = ref[1]
        why = "is assigned more than once"
        if len(assigns) >= 2 and plan.distributed is not None and len(kinds) == len(assigns) and all(
            k is not None and k.kind == "auto" for k in kinds
        ):
            # `device = "cuda"`, then `device = f"cuda:{local_rank}"` once launched: each process's own
            plan.devices.add(name)
            if all(_is_string(a.value) for a in assigns):
                plan.string_devices.add(name)
            continue
        if len(assigns) >= 2 and _upgrade_chain(facts, plan, name, assigns):
            continue
        if len(assigns) >= 2:
            why = _if_else_device(facts, plan, name, assigns) or ""
            if not why:
                continue
        if len(assigns) != 1 or len(kinds) != 1 or kinds[0] is None:
            facts.finding(plan, assigns[0], "ACC103", f"`{name}` {why}; file not converted.",
                          "keep a single `device = ...` assignment, or replace each use by `accelerator.device`.")
            return False
        kind, value = kinds[0], assigns[0].value
        if kind.kind == "auto" and not per_process_device(facts, value) and not _index_noted(facts, plan, name, value):
            return False
        if kind.kind == "auto":
            plan.devices.add(name)
            if _is_string(value):
                plan.string_devices.add(name)
            flag = _flag_of(facts, value)
            # `device_type = "cuda" if "cuda" in device else "cpu"` tests a device the conversion replaces, no
            # flag of the user's; only a device setting (nanoGPT's `device = 'cuda'`) is worth a word (ACC144)
            read = _device_read(facts, value) if flag is not None else None
            if read is None and flag is not None:
                plan.cpu_flag = flag
            elif read is not None and _is_setting(facts, read):
                facts.note(plan, assigns[0], "ACC144",
                           f"`{name}` followed the `{read.value}` setting, which no longer chooses the device: "
                           "Accelerate does (each process its GPU, the CPU without one).",
                           "to train on the CPU where there is a GPU, run `accelerate launch --cpu` (the setting "
                           "is no longer one the script reads).")
        elif kind.kind == "cpu":
            facts.finding(plan, assigns[0], "ACC102",
                          f"`{name}` forces the CPU; converting would move training to the accelerator. File not converted.",
                          "use `Accelerator(cpu=True)` to keep training on the CPU.")
            return False
        else:
            facts.finding(plan, assigns[0], "ACC102",
                          f"`{name}` is a {kind.detail}, not the automatic choice Accelerate makes. File not converted.",
                          "decide the device with `Accelerator(cpu=...)` and use `accelerator.device`.")
            return False
    return True


def _device_function(facts: Facts, value: cst.BaseExpression) -> Optional[DeviceKind]:
    """``device = get_device()``: a call, with no arguments, of a function of this file or of another module of the
    project (``from utils import get_device``) that takes none and whose body is only ``return <device>`` (a
    docstring aside): the kind of that device. The call then goes with the assignment (it does nothing else)."""
    if not isinstance(value, cst.Call) or value.args or not isinstance(value.func, cst.Name):
        return None
    visitor: object = facts
    func = facts.functions.get(value.func.value)
    scope = facts.get_metadata(ScopeProvider, value.func, None)
    if func is None or scope is None or [a.node for a in scope[value.func.value]] != [func]:
        function = called_function(facts, facts.module, facts.foreign, value.func)
        func = function.node if function is not None else None
        visitor = facts.foreign.metadata(function) if function is not None and facts.foreign is not None else None
    if func is None or visitor is None or func.decorators or func.params.params or func.params.star_arg not in (
            None, cst.MaybeSentinel.DEFAULT) or func.params.kwonly_params or func.params.star_kwarg is not None:
        return None
    body = [s for s in (func.body.body if isinstance(func.body, cst.IndentedBlock) else ()) if not is_docstring(s)]
    if len(body) != 1 or not m.matches(body[0], m.SimpleStatementLine(body=[m.Return(value=m.DoNotCare())])):
        return None
    returned = body[0].body[0].value  # type: ignore[attr-defined]
    if returned is None or not all(name.value in ("True", "False", "None") or {
            q.name.split(".")[0] for q in visitor.get_metadata(QualifiedNameProvider, name, set())}  # type: ignore[attr-defined]
            == {"torch"} for name in read_names(returned)):
        return None  # it reads a flag (`args.no_cuda`) or a global: what the call means is not the function's alone
    return classify_device(visitor, returned)  # type: ignore[arg-type]


def _handed_devices(facts: Facts, plan: Plan) -> set[str]:
    """The parameters of a setup function that prepares the models it is handed (``plan.handed_in``)
    that every call hands the caller's automatic device (``device = torch.device("cuda" if ... else
    "cpu")``, bound once there): inside the function they are the training device."""
    func = facts.functions.get(plan.setup) if plan.handed_in else None
    if func is None:
        return set()
    sites = facts.call_sites(plan.setup, func)
    found = set()
    for param in param_names(func):
        if param in plan.handed_in or facts.assigns.get((plan.setup, param)) or not sites:
            continue
        kinds = []
        for _, bound in sites:
            arg = bound.get(param)
            ref = ref_of(facts, arg) if isinstance(arg, cst.Name) else None
            assigns = facts.assigns.get(ref, []) if ref is not None else []
            kinds.append(classify_device(facts, assigns[0].value) if len(assigns) == 1 else None)
        if kinds and all(k is not None and k.kind == "auto" and not k.detail for k in kinds):
            found.add(param)
    return found


def _index_noted(facts: Facts, plan: Plan, name: str, value: cst.BaseExpression) -> bool:
    """``device = torch.device(f"cuda:{args.gpu_id}" if ... else "cpu")``: under Accelerate the launcher gives
    each process its GPU, so the option no longer picks one (ACC136 says so). False (ACC102) when the
    index also picks a GPU elsewhere (``torch.cuda.set_device(args.gpu_id)``, ``model.cuda(args.gpu)``):
    that code would still send every process to the one GPU."""
    index = next((i for e in findall(value, m.OneOf(m.FormattedString(), m.Call(), m.BinaryOperation()))
                  if (i := chosen_index(facts, e)) is not None), None)
    if index is None:
        return True
    option = code_of(index)
    binding = facts.get_metadata(ParentNodeProvider, index, None)  # `gpu = args.gpu`, read in `f"cuda:{gpu}"`
    via = binding.targets[0].target if isinstance(binding, cst.Assign) and len(binding.targets) == 1 else None
    others = [a for a in findall(facts.module, m.Attribute(attr=m.Name(index.attr.value)))
              if code_of(a) == option and a is not index and not inside(facts, a, {id(value)}) and not _read_as_text(facts, a)]
    if isinstance(via, cst.Name):
        others += [a.node for assignment in _scope_assignments(facts, via) for a in assignment.references
                   if not inside(facts, a.node, {id(value)}) and not _read_as_text(facts, a.node)]
    if others:
        facts.finding(plan, others[0], "ACC102",
                      f"`{option}` picks the GPU of `{name}` and is also used here (`{code_of(_statement(facts, others[0]))}`): "
                      "under Accelerate each process gets its GPU from the launcher, and this code would still "
                      "send every process to the one GPU. File not converted.",
                      f"remove the other uses of `{option}` (use `accelerator.device`), then convert again.")
        return False
    facts.note(plan, index, "ACC136",
               f"`{name}` was the GPU `{option}` picks; it is now `accelerator.device`, the GPU the launcher gives "
               f"each process, and `{option}` no longer picks one.",
               "to train one process on a given GPU, run it with `CUDA_VISIBLE_DEVICES=<index>`.")
    return True


def _scope_assignments(facts: Facts, name: cst.Name) -> list:
    scope = facts.get_metadata(ScopeProvider, name, None)
    return list(scope[name.value]) if scope is not None else []


def _read_as_text(facts: Facts, attr: cst.Attribute) -> bool:
    """``print(args.gpu_id)``, ``f"gpu {args.gpu}"``, ``add_argument``: read, not used to pick a device."""
    node = facts.get_metadata(ParentNodeProvider, attr, None)
    while node is not None and not isinstance(node, cst.BaseStatement):
        if isinstance(node, cst.FormattedString):
            return True
        if isinstance(node, cst.Call) and m.matches(node.func, m.Name("print") | m.Attribute(
                attr=m.Name("info") | m.Name("debug") | m.Name("warning") | m.Name("add_scalar") | m.Name("log"))):
            return True
        node = facts.get_metadata(ParentNodeProvider, node, None)
    return False


def _statement(facts: Facts, node: cst.CSTNode) -> cst.CSTNode:
    """The statement ``node`` is in, for a finding (``node`` itself in a compound statement's header)."""
    line = statement_line(facts, node)
    return line.body[0] if line is not None else node


def _if_else_device(facts: Facts, plan: Plan, name: str, assigns: list[cst.Assign]) -> Optional[str]:
    """``if use_accel: device = <accelerator> [elif use_mps: device = <accelerator>] else: device = "cpu"``.

    Every branch but the last picks an accelerator and the last the CPU: the tests
    together are the flag, ``Accelerator(cpu=not (a or b))``. None when it is that shape,
    else why not (for the finding).
    """
    top = _enclosing_if(facts, assigns[0])
    if not isinstance(top, cst.If):
        return "is assigned more than once"
    tests: list[cst.BaseExpression] = []
    branches: list[cst.BaseSuite] = []
    node: cst.CSTNode = top
    while isinstance(node, cst.If):
        tests.append(node.test)
        branches.append(node.body)
        node = node.orelse  # type: ignore[assignment]
    if not isinstance(node, cst.Else):
        return "is chosen by an if/elif chain with no `else:` (no CPU fallback)"
    branches.append(node.body)
    busy = f"is chosen by an if/elif chain whose branches do more than set `{name}`"
    if len(assigns) != len(branches) or not all(isinstance(b, cst.IndentedBlock) and len(b.body) == 1 for b in branches):
        return busy
    lines = [b.body[0] for b in branches]  # type: ignore[attr-defined]
    for line, assign in zip(lines, assigns):
        if not isinstance(line, cst.SimpleStatementLine) or line.body[0] is not assign:
            return busy
    kinds = [k.kind if (k := classify_device(facts, a.value)) else None for a in assigns]
    if kinds != ["auto"] * (len(assigns) - 1) + ["cpu"]:
        return "is chosen by an if/elif chain that is not accelerators first and the CPU last"
    plan.devices.add(name)
    flags = [t for t in tests if not is_availability_check(facts, t)]
    if len(flags) == len(tests):
        if len(tests) == 1:
            plan.cpu_flag = _negate(tests[0])
        else:
            plan.cpu_flag = "not (" + " or ".join(
                code_of(t) if not isinstance(t, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) else f"({code_of(t)})"
                for t in tests
            ) + ")"
    elif flags:
        return ("is chosen by an if/elif chain that mixes a flag with an availability check: no single "
                "`Accelerator(cpu=...)` says the same")
    return None


def _upgrade_chain(facts: Facts, plan: Plan, name: str, assigns: list[cst.Assign]) -> bool:
    """``device = "cpu"`` then ``if torch.cuda.is_available(): device = "cuda" elif <mps available>: device =
    "mps"`` (no ``else``), in a script that manages its processes maybe also ``device = f"cuda:{local_rank}"``
    once launched (build-nanoGPT): the choice ``Accelerator()`` makes, so ``plan.devices``."""
    own = [a for a in assigns if not (plan.distributed is not None and per_process_device(facts, a.value))]
    if len(own) < 2 or string_value(own[0].value) not in ("cpu",):
        return False
    line = facts.get_metadata(ParentNodeProvider, own[0], None)
    block = facts.get_metadata(ParentNodeProvider, line, None)
    body = list(getattr(block, "body", ()))
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or line not in body:
        return False
    chain = body[body.index(line) + 1] if body.index(line) + 1 < len(body) else None
    branches = []
    node = chain
    while isinstance(node, cst.If):
        if not is_availability_check(facts, node.test):
            return False
        branches.append(node.body)
        node = node.orelse  # type: ignore[assignment]
    if node is not None or not branches:
        return False  # an `else:` would be a choice of its own
    chosen = []
    for branch in branches:
        stmts = branch.body if isinstance(branch, cst.IndentedBlock) else ()
        if len(stmts) != 1 or not isinstance(stmts[0], cst.SimpleStatementLine) or len(stmts[0].body) != 1:
            return False
        chosen.append(stmts[0].body[0])
    if [id(a) for a in own] != [id(own[0])] + [id(c) for c in chosen]:
        return False
    if any(string_value(c.value) not in ("cuda", "mps", "xpu", "npu") for c in chosen):  # type: ignore[attr-defined]
        return False
    plan.devices.add(name)
    if all(_is_string(a.value) for a in assigns):
        plan.string_devices.add(name)
    return True


def _enclosing_if(facts: Facts, assign: cst.Assign) -> Optional[cst.CSTNode]:
    node: Optional[cst.CSTNode] = assign
    for _ in range(5):  # Assign < line < block < (Else <) If
        node = facts.get_metadata(ParentNodeProvider, node, None)
        if node is None or isinstance(node, cst.If):
            return node
    return None


def placement_flag(facts: Facts, plan: Plan, arguments: Arguments) -> bool:
    """``if args.cuda: model = model.cuda()``: the flag still decides, as ``Accelerator(cpu=not args.cuda)``.

    Only when every placement of a trained model sits under one same test that is not
    an availability check, and the Accelerator can read that test where it is created;
    False (ACC102) when it cannot read it.
    """
    placements = [
        call for call in facts.calls
        if m.matches(call.func, m.Attribute(attr=m.Name("cuda") | m.Name("to")))
        and ref_of(facts, chain_root(call.func.value)) in plan.flow["model"]  # type: ignore[attr-defined]
    ]
    tests = []
    for call in placements:
        parent = facts.get_metadata(ParentNodeProvider, call, None)
        while parent is not None and not isinstance(parent, (cst.If, cst.FunctionDef, cst.Module)):
            parent = facts.get_metadata(ParentNodeProvider, parent, None)
        if not isinstance(parent, cst.If) or call in findall(parent.test, m.Call()):
            return True
        tests.append(parent.test)
    if not tests or len({"".join(code_of(t).split()) for t in tests}) != 1:
        return True
    test = tests[0]
    if is_availability_check(facts, test) or findall(test, m.Call()):
        return True
    roots = read_names(test)
    if not roots or not all(arguments.available(n, n) for n in roots):  # type: ignore[arg-type]
        facts.finding(
            plan, test, "ACC102",
            f"the model is placed only when `{code_of(test)}` holds, and the Accelerator, created before the "
            "training objects, cannot read that test there (a name bound after them, or more than once): "
            "converted with no `cpu=` flag it would train on the GPU where the script's own placements of the "
            "data follow the flag (a device mismatch). File not converted.",
            f"bind what `{code_of(test)}` reads once, before the model is built (or pass `--cpu` to `accelerate "
            "launch` yourself), then convert again.",
        )
        return False
    plan.cpu_flag = _negate(test)
    arguments.use(test)
    return True


def _is_string(value: cst.BaseExpression) -> bool:
    """``"cuda"``, ``"cuda" if ... else "cpu"``, ``current_accelerator().type``: a device spelled as a string."""
    if isinstance(value, cst.IfExp):
        return _is_string(value.body) and _is_string(value.orelse)
    if isinstance(value, cst.Attribute):
        return value.attr.value == "type"
    return string_value(value) is not None


def _negate(test: cst.BaseExpression) -> str:
    code = cst.Module(body=[]).code_for_node(test)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return cst.Module(body=[]).code_for_node(test.expression)
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return f"not {code}"
    return f"not ({code})"


def _device_read(facts: Facts, value: cst.BaseExpression) -> Optional[cst.Name]:
    """The device a device's test reads (``"cuda" if "cuda" in device else "cpu"`` -> ``device``), if any."""
    test = value.args[0].value if isinstance(value, cst.Call) and value.args else value
    if not isinstance(test, cst.IfExp):
        return None
    for node in findall(test.test, m.Name()):
        ref = ref_of(facts, node)
        if ref is not None and any(classify_device(facts, a.value) for a in facts.assigns.get(ref, [])):
            return node  # type: ignore[return-value]
    return None


def _is_setting(facts: Facts, name: cst.Name) -> bool:
    """``device = 'cuda'`` bound to a string whatever runs: a setting (nanoGPT's, which ``--device=cpu`` overrides)."""
    ref = ref_of(facts, name)
    return ref is not None and any(string_value(a.value) not in (None, "cpu") and not under(facts, a, (cst.If,))
                                   for a in facts.assigns.get(ref, []))  # (`"cpu"` then upgraded: a default)


def _flag_of(visitor: cst.MetadataDependent, value: cst.BaseExpression) -> Optional[str]:
    """``torch.device("cuda" if use_cuda else "cpu")`` -> ``"not use_cuda"``; None for availability checks."""
    if isinstance(value, cst.Call) and value.args:
        value = value.args[0].value
    if isinstance(value, cst.IfExp) and not is_availability_check(visitor, value.test):
        return _negate(value.test)
    return None


def module_device(facts: Facts, plan: Plan) -> Optional[Ref]:
    """A device chosen at the module's top, read by functions, where the script trains in a function
    (pytorch-ddpm's ``device = torch.device('cuda:0')`` read by ``train()`` and ``evaluate()``): what every read
    of it means is each process's device, ``accelerator.device`` (ACC031 rewrites the reads).
    Only a choice that reads nothing of the script's (``"cuda:0"``, ``"cuda" if torch.cuda.is_available() else
    "cpu"``: a flag choosing the CPU is the Accelerator's ``cpu=``), bound once, never in a function."""
    if plan.setup == MODULE or plan.distributed is not None:
        return None
    found = None
    for ref, assigns in facts.assigns.items():
        if ref[0] != MODULE or len(assigns) != 1 or facts.single_target(assigns[0]) != ref:
            continue
        kind = classify_device(facts, assigns[0].value)
        if kind is None or kind.kind == "cpu" or chosen_index(facts, assigns[0].value) is not None:
            continue
        if any(n.value != "torch" for n in read_names(assigns[0].value)):
            continue  # a flag, an option, a rank
        if not isinstance(facts.get_metadata(ParentNodeProvider, facts.get_metadata(
                ParentNodeProvider, assigns[0], None), None), cst.Module):
            continue  # under an `if` or a `with` at the top: not the one choice
        if found is not None:
            return None  # two devices at the top: which is the training one is not for accelify to guess
        found = ref
    if found is None or findall(facts.module, m.Name("PartialState")):  # (the rewrite's name taken)
        return None
    reads = [n for n in findall(facts.module, m.Name(found[1])) if ref_of(facts, n) == found
             and key_at(facts, n) != MODULE]
    if not reads or not all(_where_a_device_goes(facts, n) for n in reads):
        return None  # read as a string too (`device == "cuda"`, `device_type=device`): not a device's place
    return found


def _where_a_device_goes(facts: Facts, name: cst.Name) -> bool:
    """``x.to(device)``, ``.cuda(device)``, ``torch.device(device)``, ``device=device``, ``map_location=device``:
    where ``accelerator.device`` (a ``torch.device``) means what the name meant."""
    arg = facts.get_metadata(ParentNodeProvider, name, None)
    call = facts.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
    if not isinstance(call, cst.Call) or arg.value is not name:  # type: ignore[union-attr]
        return False
    if arg.keyword is not None:  # type: ignore[union-attr]
        return arg.keyword.value in ("device", "map_location")  # type: ignore[union-attr]
    first = call.args[0] is arg
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    return first and (method in ("to", "cuda") or classify_device(facts, call) is not None)
