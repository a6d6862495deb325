"""The device chosen on the command line: ``parser.add_argument("--device", default="cuda")`` and
``args = parser.parse_args()``, then ``model.to(args.device)``, ``x.to(args.device)``,
``torch.device(args.device)``, ``torch.zeros(n, device=args.device)``.

What the model is moved to is the training device. Under a launcher each process has its own
accelerator, so every read of the option where a device goes becomes ``accelerator.device`` (or
goes with the placement ``prepare`` makes), while the option still decides the CPU:
``Accelerator(cpu=args.device == "cpu")``. Reads that are not devices (``print(args.device)``,
``if args.device == "cuda":``) read the option as before.

Input: the file's ``add_argument`` and ``parse_args`` calls, the reads of the option.
Output: ``plan.option_device`` (the namespace's ref and the option's attribute), read by
:func:`~accelify.analyses.device_kinds.classify_device`, and ``plan.cpu_flag``; refusals ACC108
(the namespace handed to a function that reads the option as a device, where accelify does not
follow it) and ACC102 (the CPU chosen both by the option and by another flag).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m

from accelify.analyses.accelerator import Arguments
from accelify.analyses.device_kinds import is_option_device
from accelify.analyses.facts import Facts
from accelify.queries.names import PROCESS, code_of, has_qname, process_target, string_value
from accelify.queries.refs import Ref, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

#: option strings that name the training device
_OPTIONS = frozenset({"--device"})
#: what a default may be: a device type, optionally with an index
_DEVICE_STRING = re.compile(r"(cuda|xpu|npu|mps|cpu)(:\d+)?")
_PARSE = m.Call(func=m.Attribute(attr=m.Name("parse_args")))
#: names a device variable has
_DEVICE_NAMES = frozenset({"device", "dev"})
#: names of configuration objects (a tensor's ``x.device`` is where that tensor is, not a choice)
_CONFIG_NAMES = frozenset({"args", "opt", "opts", "config", "cfg", "conf", "hparams", "hp", "params", "options",
                           "flags", "FLAGS", "settings", "hyperparams", "train_args", "training_args"})


def find(facts: Facts) -> Optional[tuple[Ref, str, bool]]:
    """``(ref of args, "device", True)`` when the file parses one namespace that has a ``--device``
    option whose default is a device string (``"cuda"``, ``"cuda:0"``, ``"cpu"``, or ``"cuda"
    if torch.cuda.is_available() else "cpu"``); ``(ref of cfg, "device", False)`` when the device
    comes from a configuration object (``device = args.device``, ``device = cfg.device``, the
    object a parameter or a name of the file): its value may be a string or a ``torch.device``.
    None otherwise."""
    options = [c for c in facts.calls if m.matches(c.func, m.Attribute(attr=m.Name("add_argument")))
               and any(string_value(a.value) in _OPTIONS for a in c.args if a.keyword is None)]
    if len(options) > 1:
        return None
    if options:
        option = options[0]
        dest = next((string_value(a.value) for a in option.args
                     if a.keyword is not None and a.keyword.value == "dest"), "device")
        default = next((a.value for a in option.args if a.keyword is not None and a.keyword.value == "default"), None)
        if dest is None or default is None or not _device_default(default):
            return None
        namespaces = [ref for ref, assigns in facts.assigns.items() if any(m.matches(a.value, _PARSE) for a in assigns)]
        if not namespaces:  # `main(parser.parse_args())`: the parameter is the namespace
            handed = [((name, param), len(sites)) for name, function in facts.functions.items()
                      for sites in [facts.call_sites(name, function)]
                      for _, bound in sites for param, value in bound.items() if m.matches(value, _PARSE)]
            if len(handed) == 1 and handed[0][1] == 1:  # (one call, the only one of that function)
                return handed[0][0], dest, True
            return None
        if len(namespaces) != 1 or len(facts.assigns[namespaces[0]]) != 1:
            return None
        return namespaces[0], dest, True
    return _configured(facts)


def handed_on(facts: Facts, namespace: Ref) -> frozenset[Ref]:
    """The namespace and the parameters it is handed to: a parameter of a function of the file that every
    call hands the namespace (``main(args)`` under ``if __name__ == "__main__":``, then ``train(args)``), or a
    ``Process`` its worker."""
    started = {name: [(None, bound)] for name, bound in _started(facts)}
    return frozenset(facts.handed({namespace}, lambda arg: ref_of(facts, arg) if isinstance(arg, cst.Name) else None,
                                  started))


def _started(facts: Facts) -> list[tuple[str, dict[str, cst.BaseExpression]]]:
    """The functions of the file a ``Process(target=worker, args=(...))`` starts, with the arguments it hands them
    (WZMIAOMIAO's ``Process(target=main_fun, args=(rank, world_size, opt))``): a call, in another process."""
    started = []
    for call in facts.calls:
        target = process_target(call) if has_qname(facts, call.func, PROCESS) else None
        function = facts.functions.get(target[0]) if target is not None else None
        if function is None:
            continue
        params = [p.name.value for p in function.params.params]
        if len(target[1]) == len(params):  # type: ignore[index]
            started.append((function.name.value, dict(zip(params, target[1]))))  # type: ignore[index]
    return started


def _configured(facts: Facts) -> Optional[tuple[Ref, str, bool]]:
    """``device = args.device`` (``cfg.device``, ``opt.device``): one configuration object, named as
    configurations are (``args``, ``opt``, ``cfg``, ``config``, ...), whose ``device`` a device
    variable is bound to (a tensor's ``src.device`` is where that tensor is, not a choice)."""
    found = set()
    for ref, assigns in facts.assigns.items():
        if ref[1] not in _DEVICE_NAMES:
            continue
        for assign in assigns:
            value = assign.value
            if isinstance(value, cst.Attribute) and value.attr.value == "device" and isinstance(value.value, cst.Name) \
                    and value.value.value in _CONFIG_NAMES:
                root = ref_of(facts, value.value)
                if root is None:
                    return None
                found.add(root)
    return (next(iter(found)), "device", False) if len(found) == 1 else None


def _device_default(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.IfExp):
        return _device_default(expr.body) and _device_default(expr.orelse)
    text = string_value(expr)
    return text is not None and _DEVICE_STRING.fullmatch(text) is not None


def _named(option: tuple[Ref, str, bool]) -> str:
    """How a finding names the option: ``--device``, or ``args.device`` for a configuration."""
    return f"--{option[1]}" if option[2] else f"{option[0][1]}.{option[1]}"


def decide(facts: Facts, plan: Plan, arguments: Arguments) -> bool:
    """The option becomes the Accelerator's CPU flag; False (a finding) when accelify cannot
    follow every read of it as a device, or the CPU is chosen by another flag as well."""
    option = plan.option_device
    if option is None:
        return True
    reads = [n for n in findall(facts.module, m.Attribute(attr=m.Name(option[1])))
             if is_option_device(facts, n)]  # type: ignore[arg-type]
    if not reads:
        return True
    # the CPU flag reads the option where the namespace is bound, or where it is handed first (`main(args)`)
    reads.sort(key=lambda n: (ref_of(facts, n.value) != option[0], facts.line(n)))  # type: ignore[attr-defined]
    handed = _handed(facts, plan, option)
    if handed is not None:
        function, read = handed
        facts.finding(
            plan, read, "ACC108",
            f"`{code_of(read)}`: `{function}` is handed the parsed options and moves things to their "
            f"`{option[1]}`, where accelify does not follow them; left in place, every process would use "
            "that one device. File not converted.",
            f"pass the device to `{function}` (`accelerator.device`) instead of reading it from the options.",
        )
        return False
    read = code_of(reads[0])
    flag = f'{read} == "cpu"' if option[2] else f'str({read}) == "cpu"'
    if plan.cpu_flag is not None and plan.cpu_flag != flag:
        facts.finding(
            plan, reads[0], "ACC102",
            f"the CPU is chosen both by `{_named(option)}` and by `{plan.cpu_flag}`: no single "
            "`Accelerator(cpu=...)` says the same. File not converted.",
            "choose the device in one place.",
        )
        return False
    if not arguments.available(reads[0].value, reads[0]):
        facts.finding(
            plan, reads[0], "ACC108",
            f"`{code_of(reads[0])}` is parsed after the model is built: the Accelerator, created before it, "
            f"cannot keep `{_named(option)}` on the CPU when it says so. File not converted.",
            "parse the options before building the model.",
        )
        return False
    plan.cpu_flag = arguments.use(cst.parse_expression(flag))
    return True


def _handed(facts: Facts, plan: Plan, option: tuple[Ref, str, bool]) -> Optional[tuple[str, cst.Attribute]]:
    """A function of the file handed the namespace (``train(args, model)``) that reads the option
    on its parameter: its name and the read."""
    functions = {f.name.value: f for f in findall(facts.module, m.FunctionDef())}  # type: ignore[attr-defined]
    for call in facts.calls:
        if not isinstance(call.func, cst.Name) or call.func.value not in functions:
            continue
        function = functions[call.func.value]
        params = function.params.params
        for i, arg in enumerate(call.args):
            if not (isinstance(arg.value, cst.Name) and ref_of(facts, arg.value) == option[0]):
                continue
            if arg.keyword is not None:
                param = arg.keyword.value
            elif arg.star == "" and i < len(params):
                param = params[i].name.value
            else:
                continue
            if (function.name.value, param) in plan.option_namespaces:
                continue  # every call hands it the namespace: its reads are the option's
            for read in findall(function, m.Attribute(value=m.Name(param), attr=m.Name(option[1]))):
                return function.name.value, read  # type: ignore[return-value]
    return None
