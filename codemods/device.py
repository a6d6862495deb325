"""ACC002: the hand-made device goes; what still needs it uses ``accelerator.device``."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ExpressionContext, ExpressionContextProvider, ParentNodeProvider

from accelify.analyses.device_kinds import classify_device, is_option_device
from accelify.analyses.plan import Plan, bind_arguments, param_names
from accelify.queries.blocks import child_blocks, simple_assign
from accelify.queries.names import code_of, qualified_names, string_value
from accelify.queries.refs import MODULE, key_at, ref_of
from accelify.queries.trees import remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, accelerator_attr, cpu_string, loads_on_the_cpu, unused_note


class RemoveDevice(AccelifyCodemod):
    """Remove ``device = torch.device(...)``; remaining uses become ``accelerator.device``.

    Recognised: ``torch.device("cuda")``, ``"cuda:0"``, ``"cuda" if torch.cuda.is_available()
    else "cpu"`` (as a string or inside ``torch.device``), ``torch.device("cuda") if ...
    else torch.device("cpu")``, ``mps``/``xpu`` checks and
    ``torch.accelerator.current_accelerator()``.  A device chosen by a flag
    (``"cuda" if use_cuda else "cpu"``, or an ``if``/``else``) keeps the flag as
    ``Accelerator(cpu=not use_cuda)``, created where the device was.  A helper
    function's ``device`` parameter becomes ``accelerator`` when the function needs
    it for the backward pass, and disappears (with the matching arguments) when
    nothing uses it any more.  A device forced to the CPU or chosen per rank is
    reported (ACC102) and the file is left alone.

    Before::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        noise = torch.zeros(3, device=device)

    After::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        noise = torch.zeros(3, device=accelerator.device)
    """

    AFTER = frozenset({"ACC003"})
    CODE = "ACC002"
    NAME = "remove-device"
    DESCRIPTION = "Remove device construction; remaining uses of the device become accelerator.device."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.devices or plan.device_params or plan.option_device)

    METADATA_DEPENDENCIES = (*AccelifyCodemod.METADATA_DEPENDENCIES, ExpressionContextProvider)

    def visit_Module(self, node: cst.Module) -> None:
        self._devices = self.plan.refs(sorted(self.plan.devices))
        self._created = False
        # helper -> {param: "rename" | "remove" | "keep"}
        self._actions: dict[str, dict[str, str]] = {}
        functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        for key, params in self.plan.device_params.items():
            func = functions.get(key)
            if func is None:
                continue
            actions: dict[str, str] = {}
            for i, param in enumerate(params):
                used = self._remaining_uses(func, key, param)
                if i == 0 and key in self.plan.needs_accelerator and "accelerator" not in param_names(func):
                    actions[param] = "rename"
                elif not used:
                    actions[param] = "remove"
            if actions:
                self._actions[key] = actions
                self._functions = functions

    def _remaining_uses(self, func: cst.FunctionDef, key: str, param: str) -> bool:
        """Is the parameter still read once the placements that go (ACC003) and the state dicts loaded on
        the CPU are gone?"""
        placement = self.other("ACC003")
        return any(
            ref_of(self, name) == (key, param)
            and self.get_metadata(ExpressionContextProvider, name, None) == ExpressionContext.LOAD
            and not (placement is not None and placement.strips_use(name))  # type: ignore[attr-defined]
            and not loads_on_the_cpu(self, name)  # `map_location=device` -> "cpu"
            for name in findall(func.body, m.Name(param))
        )

    def creation_site(self) -> Optional[cst.BaseStatement]:
        """The original statement this codemod replaces with ``accelerator = Accelerator(...)``
        (the first device statement it rewrites), or None when the Accelerator goes elsewhere."""
        if self.plan.has_accelerator or (self.plan.setup == MODULE and self.plan.cpu_flag is None):
            return None
        if self.plan.distributed is not None:
            # a script that set up its own processes reads the rank (`accelerator.process_index`) before
            # its device, often: the Accelerator goes before the first statement that uses it (ACC001)
            return None
        if self.shared.device_creation is None:
            found = None
            for stmt in _walk_statements(self.shared.module):
                if isinstance(stmt, cst.If) and self._is_device_if(stmt) and self._top_of_chain(stmt) is stmt:
                    found = stmt
                elif self._is_device_assignment(stmt) and not self._in_device_if(stmt):  # type: ignore[arg-type]
                    found = stmt
                if found is not None:
                    break
            self.shared.device_creation = (found,)
        return self.shared.device_creation[0]

    # ------------------------------------------------------------------ uses
    def _replacement(self, node: cst.CSTNode) -> Optional[str]:
        """The accelerator spelling that replaces this device use, if it is one."""
        if self.get_metadata(ExpressionContextProvider, node, None) != ExpressionContext.LOAD:
            return None
        ref = ref_of(self, node)
        if ref in self._devices:
            return self.plan.accelerator
        if ref is not None and self._actions.get(ref[0], {}).get(ref[1]) == "rename":
            return "accelerator"
        return None

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Union[cst.Name, cst.Attribute]:
        accelerator = self._replacement(original_node)
        if accelerator is None:
            if ref_of(self, original_node) in self.plan.flow["device"] and loads_on_the_cpu(self, original_node):
                # a helper's kept `device` parameter (it is handed `accelerator.device`)
                self.change(original_node, f"`map_location={original_node.value}` -> `map_location=\"cpu\"`")
                return cpu_string(self, original_node)
            return updated_node
        placement = self.other("ACC003")
        if placement is not None and placement.strips_use(original_node):  # type: ignore[attr-defined]
            return updated_node  # `.to(device)` goes as a whole (ACC003)
        if loads_on_the_cpu(self, original_node):
            self.change(original_node, f"`map_location={original_node.value}` -> `map_location=\"cpu\"`")
            return cpu_string(self, original_node)
        if self._used_as_string(original_node) or self._device_type_keyword(original_node):
            # `device == "cuda"` compared a string; a torch.device never equals one
            self.change(original_node, f"`{original_node.value}` -> `{accelerator}.device.type`")
            return accelerator_attr(accelerator, "device.type")
        self.change(original_node, f"`{original_node.value}` -> `{accelerator}.device`")
        return accelerator_attr(accelerator, "device")

    def _option_device(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        """``args.device`` where a device goes (``device=args.device``, ``.to(args.device)`` kept,
        ``torch.device(args.device)``): ``accelerator.device``; elsewhere (``print(args.device)``,
        ``args.device == "cpu"``) the option as the user gave it."""
        placement = self.other("ACC003")
        if placement is not None and placement.strips_use(original_node):  # type: ignore[attr-defined]
            return updated_node  # `.to(args.device)` goes as a whole (ACC003)
        code = code_of(original_node)
        if loads_on_the_cpu(self, original_node):
            self.change(original_node, f"`map_location={code}` -> `map_location=\"cpu\"`")
            return cpu_string(self, original_node)
        arg = self.get_metadata(ParentNodeProvider, original_node, None)
        call = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or arg.value is not original_node:  # type: ignore[union-attr]
            return updated_node
        keyword = arg.keyword.value if arg.keyword is not None else None  # type: ignore[union-attr]
        first = arg.keyword is None and call.args and call.args[0] is arg  # type: ignore[union-attr]
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if keyword == "device" or (first and (method == "to" or classify_device(self, call) is not None)):
            accelerator = self.plan.accelerator
            self.change(original_node, f"`{code}` -> `{accelerator}.device`")
            return accelerator_attr(accelerator, "device")
        return updated_node

    def _device_type_keyword(self, node: cst.Name) -> bool:
        """A string device handed on as a string: ``torch.amp.autocast(device_type=device_type)`` (the API
        takes the type), or a device type with no index (``"cuda" if ... else "cpu"``) handed to a function
        (nanoGPT's ``model.configure_optimizers(..., device_type)`` compares it with ``"cuda"``, which a
        ``torch.device`` never equals); not where a device goes (``device=``, ``map_location=``, ``.to()``)."""
        ref = ref_of(self, node)
        if ref is None or ref not in self.plan.refs(sorted(self.plan.string_devices)):
            return False
        arg = self.get_metadata(ParentNodeProvider, node, None)
        if not isinstance(arg, cst.Arg) or arg.value is not node:
            return False
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "device_type":
            return True
        call = self.get_metadata(ParentNodeProvider, arg, None)
        if keyword == "device" and isinstance(call, cst.Call) and _library_call(self, call):
            # torchsummary's `summary(model, size, device="cuda")` checks `device.lower() in ["cuda", "cpu"]`
            values = _values_of(self, ref)
            return bool(values) and all(_indexless(v) for v in values)
        if keyword in ("device", "map_location") or not isinstance(call, cst.Call) or (
            isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda")
        ) or classify_device(self, call) is not None:
            return False
        return _indexless_device(self, ref)

    def _used_as_string(self, node: cst.Name) -> bool:
        """A string device in a comparison or a string method call (``device.startswith("cuda")``)."""
        ref = ref_of(self, node)
        strings = self.plan.refs(sorted(self.plan.string_devices))
        if self.plan.string_devices and self.plan.string_devices == self.plan.devices:
            strings |= self.plan.flow["device"]  # helper parameters can only receive a string device
        if ref not in strings:
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.ComparisonTarget):
            return True
        if isinstance(parent, cst.Comparison):
            return parent.left is node
        return isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value != "type"

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if is_option_device(self, original_node):
            return self._option_device(original_node, updated_node)
        if not isinstance(original_node.value, cst.Name) or original_node.value.value != "self":
            return updated_node
        accelerator = self._replacement(original_node)
        if accelerator is None:
            return updated_node
        placement = self.other("ACC003")
        if placement is not None and placement.strips_use(original_node):  # type: ignore[attr-defined]
            return updated_node  # `.to(self.device)` goes as a whole (ACC003)
        if loads_on_the_cpu(self, original_node):
            self.change(original_node, f"`map_location=self.{original_node.attr.value}` -> `map_location=\"cpu\"`")
            return cpu_string(self, original_node)
        self.change(original_node, f"`self.{original_node.attr.value}` -> `{accelerator}.device`")
        return accelerator_attr(accelerator, "device")

    # ------------------------------------------------------------------ the device statement(s)
    def _is_device_assignment(self, stmt: cst.BaseStatement) -> bool:
        assign = simple_assign(stmt)
        return (
            assign is not None
            and len(assign.targets) == 1
            and ref_of(self, assign.targets[0].target) in self._devices
        )

    def _creation(self) -> Optional[cst.BaseStatement]:
        """Where the Accelerator must take the device's place: a flag, a function or a class."""
        if self._created or self.plan.has_accelerator:
            return None
        if self.plan.setup == MODULE and self.plan.cpu_flag is None:
            return None  # module level: the Accelerator goes after the imports, as in the docs
        if self.plan.distributed is not None:
            return None  # see creation_site: ACC001 places it
        self._created = True
        args = self.plan.accelerator_args()
        return self.parse_statement(f"{self.plan.accelerator} = Accelerator({args})\n")

    def _replace_or_remove(self, original: cst.BaseStatement, updated: cst.BaseStatement) -> cst.BaseStatement:
        remove_imports_of(self.context, original)
        creation = self._creation()
        if creation is not None:
            self.replaced(original)
            self.change(original, f"device construction replaced by `{self.plan.accelerator} = Accelerator()`"
                        + unused_note(self.plan))
            return creation.with_changes(leading_lines=updated.leading_lines)
        self.change(original, "device construction removed: the Accelerator picks the device")
        return self.remove(updated)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if (m.matches(original_node, m.SimpleStatementLine(body=[m.Expr(m.Name())]))
                and ref_of(self, original_node.body[0].value) in self._devices):  # type: ignore[attr-defined]
            # `device` alone on a line: a notebook cell showing the device it made
            self.change(original_node, "device display removed: the Accelerator picks the device")
            return self.remove(updated)
        if self._is_device_assignment(original_node):
            if self._in_device_if(original_node):
                return updated  # the whole `if`/`else` is replaced in leave_If
            return self._replace_or_remove(original_node, updated)
        return updated

    def _is_device_if(self, node: cst.If) -> bool:
        """``if ...: device = ... [elif ...: device = ...] else: device = ...``, every branch a device."""
        if not all(self._is_device_assignment(s) for s in node.body.body):
            return False
        if isinstance(node.orelse, cst.If):
            return self._is_device_if(node.orelse)
        return isinstance(node.orelse, cst.Else) and all(self._is_device_assignment(s) for s in node.orelse.body.body)

    def _top_of_chain(self, node: cst.If) -> cst.If:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while isinstance(parent, cst.If) and parent.orelse is node:
            node, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        return node

    def _in_device_chain(self, node: cst.If) -> bool:
        top = self._top_of_chain(node)
        return top is not node and self._is_device_if(top)

    def _in_device_if(self, stmt: cst.SimpleStatementLine) -> bool:
        node: Optional[cst.CSTNode] = stmt
        for _ in range(3):  # line < block < (Else <) If
            node = self.get_metadata(ParentNodeProvider, node, None)
            if isinstance(node, cst.If):
                return self._is_device_if(self._top_of_chain(node))
        return False

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        # if use_accel: device = ... else: device = torch.device("cpu")
        if self._is_device_if(original_node) and self._top_of_chain(original_node) is original_node:
            return self._replace_or_remove(original_node, updated_node)
        if self._in_device_chain(original_node):
            return updated_node  # an `elif` of a device chain: the whole chain is replaced at its top
        return super().leave_If(original_node, updated_node)

    # ------------------------------------------------------------------ helper signatures and calls
    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        actions = self._actions.get(original_node.name.value)
        if not actions or key_at(self, original_node) != MODULE:
            return updated_node
        params = []
        for param in updated_node.params.params:
            action = actions.get(param.name.value)
            if action == "remove":
                self.change(original_node, f"unused parameter `{param.name.value}` removed")
                continue
            if action == "rename":
                self.change(original_node, f"parameter `{param.name.value}` -> `accelerator`")
                param = param.with_changes(name=cst.Name("accelerator"), annotation=None)
                if param.default is not None:  # a device default means nothing for an Accelerator
                    tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
                    param = param.with_changes(default=cst.Name("None"), equal=tight)
            params.append(param)
        old = updated_node.params.params
        if params and old and params[-1] is not old[-1]:  # the last one went: do not leave its comma dangling
            params[-1] = params[-1].with_changes(comma=old[-1].comma, whitespace_after_param=old[-1].whitespace_after_param)
        return updated_node.with_changes(params=updated_node.params.with_changes(params=params))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        if not isinstance(func, cst.Name) or func.value not in self._actions:
            return updated_node
        if ref_of(self, func) != (MODULE, func.value):
            return updated_node
        definition = self._functions[func.value]
        bound = bind_arguments(definition, original_node)
        if bound is None:
            return updated_node
        by_arg = {id(value): name for name, value in bound.items()}
        actions = self._actions[func.value]
        args = []
        for original_arg, arg in zip(original_node.args, updated_node.args):
            action = actions.get(by_arg.get(id(original_arg.value), ""))
            if action == "remove":
                continue
            if action == "rename":
                accelerator = self.accelerator_at(original_node) or "accelerator"
                arg = arg.with_changes(value=cst.parse_expression(accelerator))
                if arg.keyword is not None:
                    arg = arg.with_changes(keyword=cst.Name("accelerator"))
            args.append(arg)
        if args and updated_node.args and args[-1] is not updated_node.args[-1]:
            # and the line break before `)` that followed it
            args[-1] = args[-1].with_changes(comma=updated_node.args[-1].comma,
                                             whitespace_after_arg=updated_node.args[-1].whitespace_after_arg)
        return updated_node.with_changes(args=args)



def _walk_statements(module: cst.Module):
    """Every statement of the file, in the order the traversal leaves them (a statement nested in
    another first), functions and classes included."""
    def walk(body):
        for stmt in body:
            for block in child_blocks(stmt) if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else (
                [stmt.body] if isinstance(stmt.body, cst.IndentedBlock) else []
            ):
                yield from walk(block.body)
            yield stmt
    yield from walk(module.body)


def _indexless(value: cst.BaseExpression) -> bool:
    """``"cuda"``, ``"cuda" if ... else "cpu"``: a device type, no index."""
    if isinstance(value, cst.IfExp):
        return _indexless(value.body) and _indexless(value.orelse)
    text = string_value(value)
    return text is not None and ":" not in text


def _indexless_device(codemod: AccelifyCodemod, ref) -> bool:
    """The device name ``ref`` is a device *type* derived from another device (nanoGPT's ``device_type =
    "cuda" if "cuda" in device else "cpu"``): every value the file binds it to has no index and tests a
    device. A device chosen by its own test (``"cuda" if torch.cuda.is_available() else "cpu"``) stays a device."""
    devices = codemod.plan.refs(sorted(codemod.plan.devices)) - {ref}
    values = _values_of(codemod, ref)
    return bool(values) and all(
        _indexless(v) and isinstance(v, cst.IfExp)
        and any(ref_of(codemod, n) in devices for n in findall(v.test, m.Name())) for v in values
    )


def _values_of(codemod: AccelifyCodemod, ref) -> list[cst.BaseExpression]:
    """What the file binds the name ``ref`` to (``name = value`` statements)."""
    return [a.value for a in findall(codemod.shared.module, m.Assign())
            if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
            and ref_of(codemod, a.targets[0].target) == ref]


def _library_call(visitor: cst.MetadataDependent, call: cst.Call) -> bool:
    """A function of an installed package other than torch (``torchsummary.summary``): it may take a device as a
    string only, as the script handed it."""
    names = qualified_names(visitor, call.func)
    return bool(names) and all("." in n and not n.startswith(("torch.", "accelerate.", "builtins.")) and
                               not n.startswith(".") for n in names)
