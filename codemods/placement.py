"""ACC003: device placement removed where ``accelerator.prepare`` takes over."""

from __future__ import annotations

import re
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider, QualifiedNameSource

from accelify.analyses.device_kinds import classify_device
from accelify.analyses.distributed import DATA_PARALLEL
from accelify.analyses.plan import Plan
from accelify.analyses.ranks import MAIN_TESTS, rank_attribute
from accelify.queries.blocks import enclosing_function, iter_statements, scope_root, simple_assign
from accelify.queries.devices import is_availability_check
from accelify.queries.loops import peel_iterable
from accelify.queries.names import assigned_names, has_qname, root_name, string_value
from accelify.queries.refs import assigned_values, key_at, receiver_refs, ref_of
from accelify.queries.training import locate_setup, trainer_functions
from accelify.queries.trees import descendants, remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, accelerator_attr, add_target_import, flat_code

#: builtins that take a model without running it
_INERT = frozenset({"print", "len", "str", "repr", "type", "id", "isinstance", "hasattr", "getattr", "vars", "dir"})

_DEVICE_ONLY_KEYWORDS = frozenset({"device", "non_blocking", "copy"})
_DEVICE_LIKE = re.compile(r"dev|gpu|cuda|rank", re.I)


# nn.Module methods that return the module itself.
_MODULE_RETURNING = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_"})


class RemovePlacement(AccelifyCodemod):
    """Drop ``.to(device)`` / ``.cuda()`` on prepared models and on batches of prepared dataloaders.

    ``prepare`` moves the model, and a prepared dataloader yields batches that are
    already on the right device.  Anything else (a tensor built by hand, a model
    no optimizer trains) keeps a placement, as ``.to(accelerator.device)``.

    Before::

        import torch
        from torch.utils.data import DataLoader

        train_dataloader = DataLoader(dataset, batch_size=8)
        model = Net().to("cuda")
        optimizer = torch.optim.AdamW(model.parameters())
        for batch in train_dataloader:
            batch = {k: v.cuda() for k, v in batch.items()}
            mask = torch.ones(4).cuda()

    After::

        import torch
        from torch.utils.data import DataLoader

        train_dataloader = DataLoader(dataset, batch_size=8)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        for batch in train_dataloader:
            mask = torch.ones(4).to(accelerator.device)
    """

    CODE = "ACC003"
    NAME = "remove-placement"
    DESCRIPTION = "Remove .to(device)/.cuda() where prepare() places the object; keep others on accelerator.device."
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return ".to(" in code or ".cuda(" in code or ".cpu(" in code or bool(plan.rebound_models)

    def __init__(self, context, plan, shared) -> None:
        super().__init__(context, plan, shared)
        self._derived: list[set[str]] = []  # one set per enclosing loop/comprehension over batch data
        self._strip: set[int] = set()  # ids of placement calls to strip (original nodes)
        self._place: set[int] = set()  # ids of model constructions to place on accelerator.device

    # ------------------------------------------------------------ what is placement
    def _device_arg(self, call: cst.Call) -> Optional[cst.Arg]:
        """The argument of a ``.to(...)`` call that names an automatic device, if any."""
        for i, arg in enumerate(call.args):
            if (arg.keyword is None and i == 0) or (arg.keyword is not None and arg.keyword.value == "device"):
                if self._is_device(arg.value):
                    return arg
        return None

    def _is_device(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, (cst.Name, cst.Attribute)) and ref_of(self, expr) in self.plan.flow["device"]:
            return True
        if rank_attribute(self, expr, self.plan) in MAIN_TESTS:  # `.to(local_rank)`: the process's own device
            return True
        kind = classify_device(self, expr)
        return kind is not None and kind.kind == "auto"

    def _placement(self, call: cst.Call) -> bool:
        if not isinstance(call.func, cst.Attribute):
            return False
        method = call.func.attr.value
        if method == "to":
            return self._device_arg(call) is not None
        if method == "cuda":
            # `x.cuda()` is a placement; an imported module's `cuda` attribute is not.
            receiver = call.func.value
            return not isinstance(receiver, (cst.Name, cst.Attribute)) or not any(
                q.source is QualifiedNameSource.IMPORT
                for q in self.get_metadata(QualifiedNameProvider, receiver, set())
            )
        return False

    # ------------------------------------------------------------ batch data flow
    def _is_derived(self, expr: cst.BaseExpression, derived: set[str]) -> bool:
        if isinstance(expr, cst.Call) and self._placement(expr):
            return self._is_derived(expr.func.value, derived)  # type: ignore[union-attr]
        if isinstance(expr, (cst.Tuple, cst.List)):
            return bool(expr.elements) and all(self._is_derived(e.value, derived) for e in expr.elements)
        if isinstance(expr, (cst.DictComp, cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self._is_derived(expr.for_in.iter, derived)
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value in ("tuple", "list", "dict"):
            return len(expr.args) == 1 and self._is_derived(expr.args[0].value, derived)
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value in ("zip", "enumerate"):
            # zip(x.split(4), y.split(4)): pieces of the batch; enumerate's start is a number
            data = [a for a in expr.args if a.keyword is None][: None if expr.func.value == "zip" else 1]
            return bool(data) and all(a.star == "" and self._is_derived(a.value, derived) for a in data)
        root = root_name(expr)
        return root is not None and root.value in derived

    def _loop_derived(self, loop: cst.For, seed: set[str]) -> set[str]:
        """Names in the loop body that only ever hold data drawn from the batch."""
        assigns = [a for stmt, _ in iter_statements(loop.body) if (a := simple_assign(stmt)) is not None]
        values: dict[str, list[cst.BaseExpression]] = {}
        for assign in assigns:
            for target in assign.targets:
                for name in assigned_names(target.target):
                    values.setdefault(name, []).append(assign.value)
        # Greatest fixpoint: assume every name is batch data, drop those given anything else
        # (`y = y.to(device)` keeps `y` batch data; `x = x + noise` makes `x` something else).
        derived = set(seed) | set(values)
        changed = True
        while changed:
            changed = False
            for name in list(derived):
                if not all(self._is_derived(v, derived) for v in values.get(name, [])):
                    derived.discard(name)
                    changed = True
        return derived

    def _current_derived(self) -> set[str]:
        out: set[str] = set()
        for names in self._derived:
            out |= names
        return out

    def visit_For(self, node: cst.For) -> None:
        source = peel_iterable(self, node.iter)
        seed: set[str] = set()
        if ref_of(self, source) in self.plan.flow["loader"]:
            seed = set(assigned_names(node.target))
        elif self._is_derived(node.iter, self._current_derived()):
            seed = set(assigned_names(node.target))
        self._derived.append(self._loop_derived(node, seed | self._current_derived()) if seed else set())

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.BaseStatement, cst.FlattenSentinel]:
        """``if torch.cuda.is_available(): x = x.cuda()`` rewritten to ``.to(accelerator.device)``: the
        guard goes with it (and an ``else:`` that does the same without the placement). The
        accelerator's device is not always CUDA (MPS, a TPU, ``cpu=True``); left under the guard, the
        tensor would stay on the host there while the model is placed."""
        result = super().leave_If(original_node, updated_node)
        if result is not updated_node or not isinstance(updated_node.body, cst.IndentedBlock) \
                or not is_availability_check(self, original_node.test):
            return result
        accelerator = self.accelerator_at(original_node)
        body = list(updated_node.body.body)
        if accelerator is None or not body:
            return result
        if flat_code(updated_node.body) == flat_code(original_node.body):
            return self._typed_tensors(original_node, updated_node, accelerator) or result
        device = f"{accelerator}.device"
        if original_node.orelse is None:
            if not all(_places_on(statement, device) for statement in body):
                return result
        elif not isinstance(updated_node.orelse, cst.Else) or flat_code(
                updated_node.body.visit(_Unplaced(device))) != flat_code(updated_node.orelse.body):
            return result  # `else:` does something else than the same code without the placement
        self.change(original_node, "the availability check around the placement goes with it: the accelerator's "
                                   "device is not always CUDA (MPS, TPU, `cpu=True`)")
        if self.emptied(updated_node.body):  # nothing left but the `pass` of an emptied block (retinanet)
            return self.remove(updated_node)
        body[0] = body[0].with_changes(leading_lines=[*updated_node.leading_lines, *body[0].leading_lines])
        return cst.FlattenSentinel(body)

    def _typed_tensors(self, original: cst.If, updated: cst.If, accelerator: str) -> Optional[cst.FlattenSentinel]:
        """``if torch.cuda.is_available(): eps = torch.cuda.FloatTensor(n).normal_()`` with ``else: eps =
        torch.FloatTensor(n).normal_()``: the CPU branch, made on ``accelerator.device``."""
        if not isinstance(updated.orelse, cst.Else) or not isinstance(updated.orelse.body, cst.IndentedBlock):
            return None
        cpu_branch = updated.orelse.body
        if not findall(cpu_branch, _TYPED_TENSOR) or flat_code(updated.body) != flat_code(cpu_branch).replace(
                "torch.", "torch.cuda."):
            return None
        placed = cpu_branch.visit(_OnDevice(f"{accelerator}.device"))
        self.change(original, "a tensor typed for CUDA or the CPU: made on the accelerator's device, which may be "
                              "neither (MPS, TPU)")
        body = list(placed.body)  # type: ignore[attr-defined]
        body[0] = body[0].with_changes(leading_lines=[*updated.leading_lines, *body[0].leading_lines])
        return cst.FlattenSentinel(body)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.BaseStatement]:
        self._derived.pop()
        return super().leave_For(original_node, updated_node)

    def abandon(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, (cst.For, cst.DictComp, cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            self._derived.pop()
        super().abandon(original_node)

    def _visit_comp(self, node: Union[cst.DictComp, cst.ListComp, cst.GeneratorExp, cst.SetComp]) -> None:
        derived = self._current_derived()
        names: set[str] = set()
        comp_for: Optional[cst.CompFor] = node.for_in
        while comp_for is not None:
            if self._is_derived(comp_for.iter, derived | names):
                names |= set(assigned_names(comp_for.target))
            comp_for = comp_for.inner_for_in
        self._derived.append(names)

    def _leave_comp(self, original_node, updated_node):
        self._derived.pop()
        return updated_node

    visit_DictComp = visit_ListComp = visit_GeneratorExp = visit_SetComp = _visit_comp
    leave_DictComp = leave_ListComp = leave_GeneratorExp = leave_SetComp = _leave_comp

    # ------------------------------------------------------------ statements
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        super().visit_SimpleStatementLine(node)
        assign = simple_assign(node)
        if assign is None:
            return
        if not all(ref_of(self, t.target) in self.plan.flow["model"] for t in assign.targets):
            return
        if self._before_prepare(node):
            return
        if self.inside(node, self._plain):
            # A model bound again after training is not prepared: it keeps its placement, and one
            # built with none goes where the prepared dataloaders put their batches.
            placed = findall(assign.value, m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda"))))
            if isinstance(assign.value, cst.Call) and not placed:
                self._place.add(id(assign.value))
            return
        self._strip |= self._chain_strips(assign)

    def _chain_strips(self, assign: cst.Assign) -> set[int]:
        """model = Net().to(device) / model = Net().cuda().half(): strip along the method chain, and
        into the wrapper ACC006 removes around the model (``DDP(Net().to(device), ...)``)."""
        out = set()
        node_ = assign.value
        while isinstance(node_, cst.Call):
            if isinstance(node_.func, cst.Attribute):
                if self._placement(node_):
                    out.add(id(node_))
                node_ = node_.func.value
            elif node_.args and has_qname(self, node_.func, DATA_PARALLEL):
                node_ = node_.args[0].value
            else:
                break
        return out

    def _derived_at(self, node: cst.CSTNode) -> set[str]:
        """The batch-data names at ``node``: what the loop and comprehension stack holds there
        during the traversal, rebuilt from its ancestors (to answer before the traversal)."""
        chain = []
        current = self.get_metadata(ParentNodeProvider, node, None)
        while current is not None:
            if isinstance(current, (cst.For, cst.DictComp, cst.ListComp, cst.GeneratorExp, cst.SetComp)):
                chain.append(current)
            current = self.get_metadata(ParentNodeProvider, current, None)
        saved = self._derived
        self._derived = []
        try:
            for scope in reversed(chain):
                (self.visit_For if isinstance(scope, cst.For) else self._visit_comp)(scope)  # type: ignore[operator]
            return self._current_derived()
        finally:
            self._derived = saved

    def would_strip(self, call: cst.Call) -> bool:
        """Does :meth:`leave_Call` strip the placement ``call``? (Asked by codemods that decide
        before the traversal reaches it.)"""
        if not self._placement(call):
            return False
        stmt: Optional[cst.CSTNode] = call
        while stmt is not None and not isinstance(stmt, cst.SimpleStatementLine):
            stmt = self.get_metadata(ParentNodeProvider, stmt, None)
        assign = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
        chained = (
            assign is not None
            and all(ref_of(self, t.target) in self.plan.flow["model"] for t in assign.targets)
            and not self._before_prepare(stmt)  # type: ignore[arg-type]
            and not self.inside(stmt, self._plain)  # type: ignore[arg-type]
            and id(call) in self._chain_strips(assign)
        )
        return self._strips(call, chained, self._derived_at(call))

    def _strips(self, original_node: cst.Call, chained: bool, derived: set[str]) -> bool:
        receiver = original_node.func.value  # type: ignore[union-attr]
        root = root_name(receiver)
        strip = chained
        if not strip and root is not None and root.value in derived:
            strip = True
        if not strip and any(ref in self.plan.flow["model"] for ref in receiver_refs(self, receiver)) and not self.inside(
            original_node, self._plain
        ) and not self._before_prepare(original_node):
            # A model the script moves off the device (`model.cpu()` to save) must be moved back.
            strip = not self._model_leaves_device
        return strip

    def strips_use(self, name: cst.BaseExpression) -> bool:
        """Is ``name`` the device of a placement this codemod strips (so it goes with it)?"""
        arg = self.get_metadata(ParentNodeProvider, name, None)
        call = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or not self._placement(call):
            return False
        device = self._device_arg(call)
        return device is not None and device.value is name and self.would_strip(call)

    def visit_Module(self, node: cst.Module) -> None:
        self._plain = self.rebound_statements(node)
        self._runs_early = self._model_runs_early(node)
        self._model_leaves_device = any(
            self._is_model(call.func.value)  # type: ignore[attr-defined]
            and (call.func.attr.value == "cpu"  # type: ignore[attr-defined]
                 or (call.args and string_value(call.args[0].value) == "cpu"))  # type: ignore[attr-defined]
            for call in findall(node, m.Call(func=m.Attribute(attr=m.Name("cpu") | m.Name("to"))))
        )

    def stripped(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """What stripping the placement ``call`` leaves when that is its receiver alone, else None."""
        if call.func.attr.value == "cuda":  # type: ignore[union-attr]
            return call.func.value  # type: ignore[union-attr]
        device = self._device_arg(call)
        rest = [a for a in call.args if a is not device
                and not (a.keyword is not None and a.keyword.value in _DEVICE_ONLY_KEYWORDS)]
        return None if rest else call.func.value  # type: ignore[union-attr]

    def _before_prepare(self, node: cst.CSTNode) -> bool:
        """A trainer class that prepares in a method (``train``): the model its ``__init__`` builds keeps
        a placement on ``accelerator.device`` there, for the methods that may run before ``train``. So
        does a model the setup runs before ``prepare`` (``profile(model, inputs=(x.cuda(),))``)."""
        return (bool(self.plan.built_in_init) and key_at(self, node) != self.plan.setup) or self._runs_early

    def _model_runs_early(self, module: cst.Module) -> bool:
        """Does the setup block run a model between its construction and ``prepare`` (a forward, or
        the model handed to a function: a FLOPs count, a summary)? There it is still where the
        script put it; removed, that placement would leave it on the host beside inputs on the
        device."""
        root = scope_root(module, self.plan.setup)
        located = locate_setup(root, set(self.plan.anchors()), trainer_functions(module),
                               touches=self.plan.touches()) if root is not None else None
        if located is None:
            return False
        block, index = located
        models = self.plan.flow["model"]
        placed = False
        local = {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)}
        gone = self.plan.apex.removed if self.plan.apex is not None else set()  # apex's set-up: removed (ACC033)
        for stmt in block.body[:index]:
            if id(stmt) in gone:
                continue
            calls = [n for n in descendants(stmt, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) if isinstance(n, cst.Call)]
            if placed and any(self._runs(call, models, local) for call in calls):
                return True
            assign = simple_assign(stmt)
            binds_model = assign is not None and any(ref_of(self, t.target) in models for t in assign.targets)
            placed = placed or any(self._placement(call) and (binds_model or self._is_model(call.func.value))  # type: ignore[attr-defined]
                                   for call in calls)
        return False

    def _runs(self, call: cst.Call, models: set, local: set[str]) -> bool:
        """``model(x)``, or the model handed to a function of another package (``profile(model, ...)``,
        ``summary(model, ...)``): not to a builtin that only looks at it, a DataParallel wrapper, nor a
        function of this file."""
        if ref_of(self, call.func) in models:
            return True
        if not any(isinstance(a.value, cst.Name) and ref_of(self, a.value) in models for a in call.args):
            return False
        if isinstance(call.func, cst.Name) and (call.func.value in _INERT or call.func.value in local):
            return False
        return not has_qname(self, call.func, DATA_PARALLEL)

    def _is_model(self, expr: cst.BaseExpression) -> bool:
        """``model``, ``model.encoder[0]``, ``model.half()``: the model or a part of it, not what a
        method of it returns (``model.decode(z)`` is a tensor)."""
        while True:
            if ref_of(self, expr) in self.plan.flow["model"]:
                return True
            if isinstance(expr, (cst.Attribute, cst.Subscript)):
                expr = expr.value
            elif m.matches(expr, m.Call(func=m.Attribute(attr=m.OneOf(*(m.Name(n) for n in _MODULE_RETURNING))))):
                expr = expr.func.value  # type: ignore[attr-defined]
            else:
                return False

    def _report_unclear(self, call: cst.Call) -> None:
        """Placements accelify recognises but must not guess about (ACC108)."""
        if not isinstance(call.func, cst.Attribute):
            return
        method = call.func.attr.value
        receiver = call.func.value
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        on_model = self._is_model(receiver)
        if on_model and (method == "cpu" or (method == "to" and first is not None and string_value(first) == "cpu")):
            self.finding(
                call, "ACC108", "a prepared model is moved off the accelerator; left as it is.",
                "after `prepare` the model may be wrapped: move a copy, e.g. "
                "`accelerator.unwrap_model(model).to(\"cpu\")`, after training.",
            )
        elif method == "to" and isinstance(first, (cst.Name, cst.Attribute)) and ref_of(self, first) not in self.plan.flow["device"]:
            name = cst.Module(body=[]).code_for_node(first)
            root = root_name(receiver)
            # a module built around the model (pytorch-ddpm's `GaussianDiffusionTrainer(net_model, ...).to(device)`)
            holds_model = isinstance(receiver, cst.Call) and any(self._is_model(a.value) for a in receiver.args)
            on_model = on_model or holds_model
            training_data = on_model or (root is not None and root.value in self._current_derived())
            if not training_data or not _DEVICE_LIKE.search(name) or name.endswith(".device"):
                return
            if ref_of(self, first) == self.plan.module_device:
                return  # each process's own device now (ACC031)
            chosen_outside = isinstance(first, cst.Name) and any(
                (kind := classify_device(self, v)) is not None and kind.kind != "cpu"  # to the CPU: on purpose
                for v in assigned_values(self, first))
            if chosen_outside:
                # `device = torch.device(...)` at module level, read by the function that trains or a
                # helper: the training device, chosen where the Accelerator cannot replace it.
                runs, built = (("evaluates", "the model and the loaders are built") if self.plan.evaluation
                               else ("trains", "the model and optimizer are built"))
                self.refuse(
                    call, "ACC108", f"`.to({name})`: `{name}` is a device chosen outside the function that {runs} "
                    f"(`{self.plan.setup}`); left in place, after `prepare` every process would move the "
                    f"{'model' if on_model else 'batches'} to that one device. File not converted.",
                    f"build `{name}` in `{self.plan.setup}`, where {built}, and hand it "
                    "on from there, or use `accelerator.device`.",
                )
            elif key_at(self, call) != self.plan.setup:
                # A device handed in from elsewhere (`Trainer(..., gpu_id)` given a module-level
                # `device = 0`): after `prepare` it would move the model or the batches off each
                # process's own device.
                self.refuse(
                    call, "ACC108", f"`.to({name})`: this code places the {'model' if on_model else 'batches'} on "
                    "a device it is handed, which accelify cannot follow to a `torch.device` choice; after "
                    "`prepare` every process would move them to that one device. File not converted.",
                    f"build the device where {'the model and the loaders' if self.plan.evaluation else 'the model and optimizer'} "
                    "are built (`device = torch.device(\"cuda\" if "
                    "torch.cuda.is_available() else \"cpu\")`) and pass it on from there, or use `accelerator.device`.",
                )
            else:
                self.finding(
                    call, "ACC108", f"`.to({name})`: a device accelify does not recognise; left as it is.",
                    "if this is the training device, use `accelerator.device` (Accelerate picks one device per process).",
                )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self._place:
            accelerator = self.accelerator_at(original_node)
            if accelerator is not None:
                self.change(original_node, "a model built again after training: placed on `accelerator.device`")
                return cst.Call(func=cst.Attribute(value=updated_node, attr=cst.Name("to")),
                                args=[cst.Arg(accelerator_attr(accelerator, "device"))])
        if not self._placement(original_node):
            self._report_unclear(original_node)
            return updated_node
        strip = self._strips(original_node, id(original_node) in self._strip, self._current_derived())
        if strip:
            self.touch()
            self.change(original_node, "placement removed: prepare() places this object")
            device = self._device_arg(original_node)
            if device is not None:
                remove_imports_of(self.context, device.value)
            return self._strip_device(original_node, updated_node)
        return self._to_accelerator_device(original_node, updated_node)

    def _strip_device(self, original: cst.Call, call: cst.Call) -> cst.BaseExpression:
        receiver = call.func.value  # type: ignore[union-attr]
        if call.func.attr.value == "cuda":  # type: ignore[union-attr]
            return receiver
        device = original.args.index(self._device_arg(original))  # metadata lives on the original
        rest = [
            a
            for i, a in enumerate(call.args)
            if i != device and not (a.keyword is not None and a.keyword.value in _DEVICE_ONLY_KEYWORDS)
        ]
        if not rest:
            return receiver
        rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return call.with_changes(args=rest)

    def _to_accelerator_device(self, original: cst.Call, call: cst.Call) -> cst.BaseExpression:
        """A placement that stays: make it name the accelerator's device."""
        func = call.func
        assert isinstance(func, cst.Attribute)
        device = self._device_arg(original)
        if func.attr.value != "cuda" and (device is None or ref_of(self, device.value) is not None):
            return call  # a device variable or parameter: the device codemod decides
        accelerator = self.accelerator_at(original)
        if accelerator is None and _method_of_class(self, original) and self.name_free("PartialState"):
            # a model's or a loss's method (MoCo v3's `contrastive_loss`), run once the Accelerator exists: its state
            add_target_import(self.context, "PartialState")
            accelerator = "PartialState()"
        if accelerator is None and self._handed_to_setup(original):
            return call  # a model its caller hands to the function that prepares it: `prepare` moves it there
        if accelerator is None:
            self.refuse(original, "ACC109", f"{_left_on(original)} File not converted.",
                        "pass the accelerator (or `accelerator.device`) to this function and place on `accelerator.device`.")
            return call
        target = accelerator_attr(accelerator, "device")
        if func.attr.value == "cuda":
            keep = [a for a in call.args if a.keyword is not None and a.keyword.value == "non_blocking"]
            self.change(original, "`.cuda()` -> `.to(accelerator.device)`")
            return call.with_changes(func=func.with_changes(attr=cst.Name("to")), args=[cst.Arg(target), *keep])
        index = original.args.index(device)
        self.change(original, "placement kept on `accelerator.device`")
        return call.with_changes(
            args=[a.with_changes(value=target) if i == index else a for i, a in enumerate(call.args)]
        )

    def _handed_to_setup(self, call: cst.Call) -> bool:
        """``net = ViT_seg(...).cuda()`` (or ``net.cuda()``) in the caller of a function that prepares the model
        it is handed with its own loaders (accelify.analyses.handed)."""
        if not self.plan.handed_refs:
            return False
        refs = set(receiver_refs(self, call.func.value))  # type: ignore[attr-defined]
        node: Optional[cst.CSTNode] = call
        while isinstance(node, (cst.Call, cst.Attribute)):
            node = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            refs.add(ref_of(self, node.targets[0].target))
        return bool(refs & self.plan.handed_refs)


def _left_on(call: cst.Call) -> str:
    """What a placement accelify cannot rewrite would do, left as it is. A GPU index (``.cuda(0)``,
    ``"cuda:0"``) is that GPU on every process, while each prepared model is on its own. Plain CUDA
    (``.cuda()``, ``"cuda"``) is the current GPU, which Accelerate makes each process's own: right on GPUs,
    but not ``accelerator.device`` where that is no GPU (``cpu=True``, MPS, a TPU)."""
    code = cst.Module(body=[]).code_for_node(call.func)
    indexed = [a for a in call.args if a.keyword is None or a.keyword.value == "device"]
    value = indexed[0].value if indexed else None
    text = string_value(value) if value is not None else None
    if value is None or text == "cuda":
        return (f"`{code}(...)` in code that cannot reach the Accelerator: left as it is, it places on CUDA (each "
                "process's own GPU, which Accelerate makes the current one), not on `accelerator.device`: where that is "
                "no GPU (`cpu=True`, MPS, a TPU) these tensors and the model would be apart.")
    index = cst.Module(body=[]).code_for_node(value)
    if isinstance(value, cst.Integer) or (text or "").startswith("cuda:"):
        return (f"`{code}(...)` in code that cannot reach the Accelerator: left as it is, every process would put these "
                f"tensors on `{index}`, while its prepared model is on its own device.")
    return (f"`{code}(...)` in code that cannot reach the Accelerator: left as it is, it places these tensors on "
            f"`{index}`, which accelify cannot tie to `accelerator.device` (where the prepared model is).")


def _method_of_class(visitor: AccelifyCodemod, node: cst.CSTNode) -> bool:
    """Inside a method of a class (not its ``__init__``, which may run before the Accelerator exists)."""
    function = enclosing_function(visitor, node)
    if function is None or function.name.value == "__init__":
        return False
    block = visitor.get_metadata(ParentNodeProvider, function, None)
    return isinstance(visitor.get_metadata(ParentNodeProvider, block, None), cst.ClassDef)


def _places_on(statement: cst.BaseStatement, device: str) -> bool:
    """``x = x.to(accelerator.device)``, ``a, b = a.to(...), b.to(...)``, ``model.to(accelerator.device)``:
    a line that only places tensors on ``device``."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False

    def placed(value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Tuple):
            return all(placed(element.value) for element in value.elements)
        return m.matches(value, m.Call(func=m.Attribute(attr=m.Name("to")))) and bool(value.args) and \
            flat_code(value.args[0].value) == device.replace(" ", "")  # type: ignore[attr-defined]

    for small in statement.body:
        if isinstance(small, cst.Assign) and placed(small.value):
            continue
        if isinstance(small, cst.Expr) and placed(small.value):
            continue
        return False
    return True


class _Unplaced(cst.CSTTransformer):
    """The code without its ``.to(<device>)`` calls: what an ``else:`` beside a placement does."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device.replace(" ", "")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if m.matches(updated_node.func, m.Attribute(attr=m.Name("to"))) and len(updated_node.args) == 1 \
                and flat_code(updated_node.args[0].value) == self.device:
            return updated_node.func.value  # type: ignore[attr-defined]
        return updated_node


_TYPED_TENSOR = m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.MatchIfTrue(lambda n: n.value.endswith("Tensor"))))


class _OnDevice(cst.CSTTransformer):
    """``torch.FloatTensor(n)`` -> ``torch.FloatTensor(n).to(<device>)``."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not m.matches(original_node, _TYPED_TENSOR):
            return updated_node
        return cst.Call(func=cst.Attribute(value=updated_node, attr=cst.Name("to")),
                        args=[cst.Arg(cst.parse_expression(self.device))])
