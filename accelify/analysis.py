"""Read-only analysis shared by the codemods.

Before anything is rewritten, :func:`analyze` looks at the whole module and
decides *what* a correct migration is: which names are devices, dataloaders,
models, optimizers and schedulers, whether an ``Accelerator`` already exists,
and whether the file is one accelify can convert at all.  The result, a
:class:`Plan`, holds only names (never nodes), so it stays valid while the
codemods rewrite the tree pass after pass.

Everything is matched by qualified name (``QualifiedNameProvider``) and scope
(``ScopeProvider``): ``import torch as T`` and ``from torch import device`` are
the same thing, and a local variable that merely shares a name is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    GlobalScope,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

# --------------------------------------------------------------------------
# qualified names

DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
TORCH_DEVICE = frozenset({"torch.device"})
ACCELERATOR_CLASS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
AVAILABILITY_CHECKS = frozenset(
    {
        "torch.cuda.is_available",
        "torch.backends.mps.is_available",
        "torch.accelerator.is_available",
        "torch.xpu.is_available",
        "torch.npu.is_available",
        "torch.mps.is_available",
    }
)
CURRENT_ACCELERATOR = frozenset({"torch.accelerator.current_accelerator"})
# Accelerator device types a single-process script would pick "automatically".
AUTO_DEVICE_STRINGS = frozenset({"cuda", "cuda:0", "mps", "xpu", "xpu:0", "npu", "npu:0"})
CPU_STRINGS = frozenset({"cpu"})
_OPTIMIZER_NAME = re.compile(r"adam|sgd|rmsprop|adagrad|adadelta|adafactor|lamb|lion|lars|sophia|optim", re.I)
_SCHEDULER_FACTORY = re.compile(r"(^|\.)get_\w*schedule\w*$")
TORCH_SCHEDULER_PREFIX = "torch.optim.lr_scheduler."


Body = Union[cst.Module, cst.IndentedBlock]


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> set[str]:
    return {q.name for q in visitor.get_metadata(QualifiedNameProvider, node, set())}


def has_qname(visitor: cst.MetadataDependent, node: cst.CSTNode, names: frozenset[str]) -> bool:
    return bool(qualified_names(visitor, node) & names)


def is_global(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    return isinstance(visitor.get_metadata(ScopeProvider, node, None), GlobalScope)


def resolves_to_global(visitor: cst.MetadataDependent, name: cst.Name) -> bool:
    """True when ``name`` (a load) refers to a module-level binding only."""
    scope = visitor.get_metadata(ScopeProvider, name, None)
    if scope is None:
        return False
    assignments = scope[name.value]
    if not assignments:
        return False
    return all(isinstance(a.scope, GlobalScope) for a in assignments)


def string_value(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def root_name(node: cst.BaseExpression) -> Optional[cst.Name]:
    """``batch["x"].y[0]`` -> ``batch``: the name an access chain starts from."""
    while True:
        if isinstance(node, cst.Name):
            return node
        if isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            # batch.pop("labels"), batch.get("x"), x.float()
            node = node.func.value
        else:
            return None


def assigned_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(assigned_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return assigned_names(target.value)
    return []


# --------------------------------------------------------------------------
# devices


@dataclass(frozen=True)
class DeviceKind:
    """What a device expression means for a migration.

    ``auto``: the accelerator if there is one, else the CPU: exactly what
    ``Accelerator()`` picks.  ``cpu``: the CPU only.  ``other``: anything else
    (a flag, a rank, an index): accelify leaves it to a human.
    """

    kind: str  # "auto" | "cpu" | "other"
    detail: str = ""


def classify_device(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Optional[DeviceKind]:
    """Classify an expression that *looks like* a device; ``None`` if it does not."""
    text = string_value(expr)
    if text is not None:
        if text in AUTO_DEVICE_STRINGS:
            return DeviceKind("auto")
        if text in CPU_STRINGS:
            return DeviceKind("cpu")
        if re.fullmatch(r"(cuda|xpu|npu|mps)(:\d+)?", text):
            return DeviceKind("other", f"fixed device {text!r}")
        return None
    if isinstance(expr, cst.Call):
        if has_qname(visitor, expr.func, TORCH_DEVICE):
            if not expr.args:
                return None
            first = expr.args[0]
            if first.keyword is not None and first.keyword.value != "type":
                return None
            inner = classify_device(visitor, first.value)
            if len(expr.args) > 1:
                index = expr.args[1].value
                if isinstance(index, cst.Integer) and index.value == "0" and inner and inner.kind == "auto":
                    return inner
                return DeviceKind("other", "device with an explicit index")
            if inner is None:
                return DeviceKind("other", "device built from a runtime value")
            return inner
        if has_qname(visitor, expr.func, CURRENT_ACCELERATOR):
            return DeviceKind("auto")
        return None
    if isinstance(expr, cst.Attribute) and expr.attr.value == "type" and isinstance(expr.value, cst.Call):
        if has_qname(visitor, expr.value.func, CURRENT_ACCELERATOR):
            return DeviceKind("auto")
        return None
    if isinstance(expr, cst.IfExp):
        body = classify_device(visitor, expr.body)
        orelse = classify_device(visitor, expr.orelse)
        if body is None and orelse is None:
            return None
        if body is None or orelse is None:
            return DeviceKind("other", "conditional device")
        if body.kind == "auto" and orelse.kind in ("auto", "cpu") and is_availability_check(visitor, expr.test):
            return DeviceKind("auto")
        return DeviceKind("other", "device chosen by a flag")
    return None


def is_availability_check(visitor: cst.MetadataDependent, test: cst.BaseExpression) -> bool:
    """``torch.cuda.is_available()`` and friends, possibly combined with ``and``."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return is_availability_check(visitor, test.left) and is_availability_check(visitor, test.right)
    if isinstance(test, cst.Call) and not test.args:
        return has_qname(visitor, test.func, AVAILABILITY_CHECKS)
    if isinstance(test, cst.Comparison) and isinstance(test.left, cst.Call):
        # torch.cuda.device_count() > 0
        return has_qname(visitor, test.left.func, frozenset({"torch.cuda.device_count"})) and m.matches(
            test, m.Comparison(comparisons=[m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))])
        )
    return False


# --------------------------------------------------------------------------
# statements and blocks


def iter_statements(
    body: Body, chain: tuple[Body, ...] = ()
) -> Iterator[tuple[cst.BaseStatement, tuple[Body, ...]]]:
    """Yield every statement in module scope with the blocks that contain it.

    Function and class bodies are not entered: they are other scopes.
    """
    chain = chain + (body,)
    for stmt in body.body:
        yield stmt, chain
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        for block in child_blocks(stmt):
            yield from iter_statements(block, chain)


def child_blocks(stmt: cst.BaseStatement) -> list[cst.IndentedBlock]:
    blocks: list[cst.IndentedBlock] = []
    if isinstance(stmt, cst.BaseCompoundStatement) and isinstance(stmt.body, cst.IndentedBlock):
        blocks.append(stmt.body)
    orelse = getattr(stmt, "orelse", None)
    while orelse is not None:
        if isinstance(orelse.body, cst.IndentedBlock):
            blocks.append(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    for handler in getattr(stmt, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            blocks.append(handler.body)
    final = getattr(stmt, "finalbody", None)
    if final is not None and isinstance(final.body, cst.IndentedBlock):
        blocks.append(final.body)
    return blocks


def simple_assign(stmt: cst.BaseStatement) -> Optional[cst.Assign]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        return stmt.body[0]
    return None


def binds(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """Does ``stmt`` (or a statement nested in it, same scope) assign one of ``names``?"""
    for inner, _ in iter_statements(cst.IndentedBlock(body=[stmt])):
        assign = simple_assign(inner)
        if assign is None:
            continue
        for target in assign.targets:
            if set(assigned_names(target.target)) & names:
                return True
    return False


def peel_iterable(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))`` -> ``loader``."""
    while isinstance(expr, cst.Call) and expr.args:
        names = qualified_names(visitor, expr.func)
        if names & {"builtins.enumerate", "enumerate", "builtins.iter", "iter"} or any(
            n == "tqdm" or n.startswith("tqdm.") for n in names
        ):
            expr = expr.args[0].value
        else:
            break
    return expr


def setup_blocks(module: cst.Module) -> Iterator[Body]:
    """Module-scope blocks where training objects can be set up, outermost first.

    Loop bodies, functions and classes are not entered: objects built there are
    not the script's one set of training objects.
    """

    def inside(stmt: cst.BaseStatement) -> Iterator[Body]:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
            return
        for child in child_blocks(stmt):
            yield child
            for inner in child.body:
                yield from inside(inner)

    yield module
    for stmt in module.body:
        yield from inside(stmt)


def locate_setup(module: cst.Module, names: set[str]) -> Optional[tuple[Body, int]]:
    """The deepest block that binds every name, and the index just after the last binding."""
    best: Optional[tuple[Body, int]] = None
    for block in setup_blocks(module):  # outermost first: a later match is nested in an earlier one
        hits = [i for i, stmt in enumerate(block.body) if binds(stmt, names)]
        if hits and all(any(binds(block.body[i], {n}) for i in hits) for n in names):
            best = (block, hits[-1] + 1)
    return best


def loop_over(visitor: cst.MetadataDependent, stmts: Sequence[cst.BaseStatement], loaders: set[str]) -> Optional[cst.For]:
    """The first ``for`` loop in ``stmts`` that iterates one of ``loaders``."""
    for stmt in stmts:
        for loop in m.findall(stmt, m.For()):
            source = peel_iterable(visitor, loop.iter)  # type: ignore[attr-defined]
            if isinstance(source, cst.Name) and source.value in loaders:
                return loop  # type: ignore[return-value]
    return None


# --------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class RawFinding:
    """A finding before the pipeline attaches a path: line/column in the analysed text."""

    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""


@dataclass
class Plan:
    convertible: bool = False
    accelerator: str = "accelerator"
    has_accelerator: bool = False
    has_prepare: bool = False
    device_vars: set[str] = field(default_factory=set)
    dataloaders: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    findings: list[RawFinding] = field(default_factory=list)

    @property
    def prepared(self) -> list[str]:
        return [*self.dataloaders, *self.models, *self.optimizers, *self.schedulers]


def plan_core(plan: Plan) -> list[str]:
    """Dataloaders, models, optimizers: the objects that decide where ``prepare`` goes."""
    return [*plan.dataloaders, *plan.models, *plan.optimizers]


class _Analyzer(m.MatcherDecoratableVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider, ParentNodeProvider)

    def __init__(self) -> None:
        super().__init__()
        self.plan = Plan()
        # name -> (kind, assign node) for module-level bindings
        self.global_assigns: dict[str, list[cst.Assign]] = {}
        self.creations: dict[str, cst.Assign] = {}
        self.local_optimizers: list[tuple[cst.Assign, str]] = []
        self.scheduler_steps: dict[str, list[cst.Call]] = {}
        self.loops: list[cst.For] = []

    # -- helpers
    def finding(self, node: cst.CSTNode, code: str, message: str, suggestion: str = "") -> None:
        pos = self.get_metadata(PositionProvider, node).start
        self.plan.findings.append(RawFinding(pos.line, pos.column + 1, code, message, suggestion))

    def _enclosing_function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None:
            if isinstance(parent, cst.FunctionDef):
                return parent
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return None

    # -- visits
    def visit_Assign(self, node: cst.Assign) -> None:
        if not is_global(self, node):
            if isinstance(node.value, cst.Call) and self._optimizer_models(node.value) is not None:
                func = self._enclosing_function(node)
                self.local_optimizers.append((node, func.name.value if func else "?"))
            return
        for target in node.targets:
            for name in assigned_names(target.target):
                self.global_assigns.setdefault(name, []).append(node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("step"))):
            self.scheduler_steps.setdefault(func.value.value, []).append(node)

    # -- classification
    def _optimizer_models(self, call: cst.Call) -> Optional[list[cst.Name]]:
        """The models an optimizer construction trains, or ``None`` if ``call`` is no optimizer."""
        names = qualified_names(self, call.func)
        if not names or any(n.startswith(TORCH_SCHEDULER_PREFIX) or n.startswith("builtins.") for n in names):
            return None
        models = [n for arg in call.args for n in _parameters_receivers(arg.value)]
        is_torch_optim = any(n.startswith("torch.optim.") and not n.startswith("torch.optim.swa_utils") for n in names)
        looks_like_optim = any(_OPTIMIZER_NAME.search(n.rsplit(".", 1)[-1]) for n in names)
        if (is_torch_optim or looks_like_optim) and models:
            return models
        if is_torch_optim:
            return []
        return None

    def _is_scheduler(self, call: cst.Call, optimizers: set[str]) -> bool:
        names = qualified_names(self, call.func)
        if any(n.startswith(TORCH_SCHEDULER_PREFIX) or _SCHEDULER_FACTORY.search(n) for n in names):
            return True
        args = call.args
        if args and args[0].keyword is None and m.matches(args[0].value, m.Name()):
            if args[0].value.value in optimizers:  # type: ignore[attr-defined]
                return True
        return any(
            arg.keyword is not None
            and arg.keyword.value == "optimizer"
            and isinstance(arg.value, cst.Name)
            and arg.value.value in optimizers
            for arg in args
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        self.finish(original_node)  # metadata is only available during the visit

    def finish(self, module: cst.Module) -> Plan:
        plan = self.plan
        # An existing Accelerator: reuse its name, never build a second one.
        for name, assigns in self.global_assigns.items():
            for assign in assigns:
                if isinstance(assign.value, cst.Call) and has_qname(self, assign.value.func, ACCELERATOR_CLASS):
                    plan.accelerator, plan.has_accelerator = name, True
        if not plan.has_accelerator and "accelerator" in self.global_assigns:
            self.finding(
                self.global_assigns["accelerator"][0],
                "ACC100",
                "the name `accelerator` is already bound to something else; file not converted.",
                "rename that variable, then run accelify again.",
            )
            return plan

        # Optimizers and the models they train.
        for name, assigns in self.global_assigns.items():
            for assign in assigns:
                if isinstance(assign.value, cst.Call) and isinstance(assign.targets[0].target, cst.Name):
                    models = self._optimizer_models(assign.value)
                    if models is not None:
                        plan.optimizers.append(name)
                        self.creations[name] = assign
                        for model in models:
                            if model.value not in plan.models and resolves_to_global(self, model):
                                plan.models.append(model.value)
        if not plan.optimizers:
            for assign, func in self.local_optimizers[:1]:
                self.finding(
                    assign,
                    "ACC101",
                    f"the training objects are built inside function `{func}()`; only module-level training "
                    "scripts are converted so far. File left unchanged.",
                    "create `accelerator = Accelerator()` in that function, pass the dataloaders, model and "
                    "optimizer through `accelerator.prepare(...)` and call `accelerator.backward(loss)`.",
                )
            return plan
        plan.optimizers.sort(key=lambda n: self._line(self.creations[n]))

        # Dataloaders, schedulers, devices.
        optimizer_set = set(plan.optimizers)
        for name, assigns in self.global_assigns.items():
            for assign in assigns:
                value = assign.value
                single = len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                if isinstance(value, cst.Call) and single and has_qname(self, value.func, DATALOADERS):
                    plan.dataloaders.append(name)
                    self.creations[name] = assign
                elif isinstance(value, cst.Call) and single and name not in optimizer_set and self._is_scheduler(
                    value, optimizer_set
                ):
                    self.creations[name] = assign
                    if self._stepped_per_batch(name, set(plan.dataloaders) | self._all_dataloader_names()):
                        plan.schedulers.append(name)
                kind = classify_device(self, value) if single else None
                if kind is not None:
                    self._device(name, assign, kind, len(assigns))
        plan.dataloaders.sort(key=lambda n: self._line(self.creations[n]))
        for model in plan.models:
            for assign in self.global_assigns.get(model, []):
                self.creations.setdefault(model, assign)

        if any(f.code in ("ACC102", "ACC103") for f in plan.findings):
            return plan
        plan.has_prepare = self._has_prepare(module)
        if not plan.has_prepare and not self._prepare_point_ok(module):
            return plan
        plan.convertible = True
        return plan

    def _prepare_point_ok(self, module: cst.Module) -> bool:
        names = [*plan_core(self.plan)]
        located = locate_setup(module, set(names))
        if located is None:
            self.finding(
                self.creations[self.plan.optimizers[0]],
                "ACC104",
                "the dataloaders, models and optimizers are not built in one block; file not converted.",
                "build them in the same block, then call "
                f"`{', '.join(names)} = accelerator.prepare({', '.join(names)})` once.",
            )
            return False
        block, index = located
        loop = loop_over(self, block.body[:index], set(self.plan.dataloaders))
        if loop is not None:
            self.finding(
                loop,
                "ACC104",
                "a dataloader is iterated before the last training object is built; file not converted.",
                "build the dataloaders, model and optimizer first, then call "
                f"`{', '.join(names)} = accelerator.prepare({', '.join(names)})` before the first loop.",
            )
            return False
        return True

    def _all_dataloader_names(self) -> set[str]:
        return {
            name
            for name, assigns in self.global_assigns.items()
            for a in assigns
            if isinstance(a.value, cst.Call) and has_qname(self, a.value.func, DATALOADERS)
        }

    def _stepped_per_batch(self, scheduler: str, loaders: set[str]) -> bool:
        """A scheduler is stepped per optimizer step when its ``.step()`` sits in a loop over a dataloader."""
        steps = self.scheduler_steps.get(scheduler, [])
        if not steps:
            return False
        for step in steps:
            parent = self.get_metadata(ParentNodeProvider, step, None)
            inside = False
            while parent is not None:
                if isinstance(parent, cst.For):
                    source = peel_iterable(self, parent.iter)
                    if isinstance(source, cst.Name) and source.value in loaders:
                        inside = True
                        break
                parent = self.get_metadata(ParentNodeProvider, parent, None)
            if not inside:
                return False
        return True

    def _device(self, name: str, assign: cst.Assign, kind: DeviceKind, n_assigns: int) -> None:
        if kind.kind == "auto" and n_assigns == 1:
            self.plan.device_vars.add(name)
        elif kind.kind == "auto":
            self.finding(
                assign,
                "ACC103",
                f"`{name}` is assigned more than once; device handling left as it is. File not converted.",
                "keep a single `device = ...` assignment, or replace each use by `accelerator.device`.",
            )
        elif kind.kind == "cpu":
            self.finding(
                assign,
                "ACC102",
                f"`{name}` forces the CPU; converting would move training to the accelerator. File not converted.",
                "use `Accelerator(cpu=True)` to keep training on the CPU.",
            )
        else:
            self.finding(
                assign,
                "ACC102",
                f"`{name}` is a {kind.detail}, not the automatic choice Accelerate makes. File not converted.",
                "decide the device with `Accelerator(cpu=...)` and use `accelerator.device`.",
            )

    def _has_prepare(self, module: cst.Module) -> bool:
        name = self.plan.accelerator
        return bool(
            m.findall(module, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("prepare"))))
        )

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line


def _parameters_receivers(expr: cst.BaseExpression) -> list[cst.Name]:
    """``model.parameters()`` anywhere in an optimizer's params argument -> ``model``."""
    found = m.findall(
        expr,
        m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters") | m.Name("named_parameters"))),
    )
    return [call.func.value for call in found]  # type: ignore[union-attr]


def analyze(wrapper: MetadataWrapper) -> Plan:
    analyzer = _Analyzer()
    wrapper.visit(analyzer)
    return analyzer.plan


def body_index(body: Sequence[cst.BaseStatement], names: set[str]) -> list[int]:
    return [i for i, stmt in enumerate(body) if binds(stmt, names)]
