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
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m

from accelify.walk import findall
from libcst.metadata import BuiltinScope, ClassScope, FunctionScope, GlobalScope, QualifiedNameProvider, ScopeProvider

# --------------------------------------------------------------------------
# qualified names

DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
TORCH_SAVE = frozenset({"torch.save", "torch.serialization.save"})
TORCH_LOAD = frozenset({"torch.load", "torch.serialization.load"})
TORCH_DEVICE = frozenset({"torch.device"})
ACCELERATOR_CLASS = frozenset(
    {"accelerate.Accelerator", "accelerate.accelerator.Accelerator", "accelify.runtime.Accelerator"}
)
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


Body = Union[cst.Module, cst.IndentedBlock]


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> set[str]:
    return {q.name for q in visitor.get_metadata(QualifiedNameProvider, node, set())}


def has_qname(visitor: cst.MetadataDependent, node: cst.CSTNode, names: frozenset[str]) -> bool:
    return bool(qualified_names(visitor, node) & names)






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
    """Names (and ``self.x`` attributes, spelled so) bound by an assignment target."""
    if isinstance(target, cst.Name):
        return [target.value]
    if m.matches(target, m.Attribute(value=m.Name("self"), attr=m.Name())):
        return [f"self.{target.attr.value}"]  # type: ignore[attr-defined]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(assigned_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return assigned_names(target.value)
    return []


def read_names(node: cst.CSTNode) -> list[cst.Name]:
    """The ``Name`` nodes in ``node`` that name something, not the ``.attr`` part of an attribute
    (in ``torch.accelerator.x`` only ``torch``)."""
    attrs = {id(a.attr) for a in findall(node, m.Attribute())}  # type: ignore[attr-defined]
    return [n for n in findall(node, m.Name()) if id(n) not in attrs]  # type: ignore[misc]


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
    if per_process_device(visitor, expr):
        return DeviceKind("auto")
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
        if body.kind == "auto" and orelse.kind in ("auto", "cpu"):
            # An availability check, or a flag (`use_cuda`), that becomes `Accelerator(cpu=not flag)`.
            return DeviceKind("auto")
        return DeviceKind("other", "device chosen by a condition accelify cannot map")
    return None


def per_process_device(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> bool:
    """``f"cuda:{local_rank}"``, ``torch.device("cuda", local_rank)``, ``torch.device(f"cuda:{rank}")``
    in a script that managed its own processes: each process's own accelerator, ``accelerator.device``."""
    plan = getattr(visitor, "plan", None)
    if plan is None or getattr(plan, "distributed", None) is None:
        return False
    from accelify.analyses.ranks import MAIN_TESTS, rank_attribute

    def rank(e: cst.BaseExpression) -> bool:
        return rank_attribute(visitor, e, plan) in MAIN_TESTS

    if isinstance(expr, cst.FormattedString) and len(expr.parts) == 2:
        text, value = expr.parts
        return (isinstance(text, cst.FormattedStringText) and text.value in ("cuda:", "xpu:", "npu:")
                and isinstance(value, cst.FormattedStringExpression) and value.format_spec is None
                and rank(value.expression))
    if isinstance(expr, cst.Call) and has_qname(visitor, expr.func, TORCH_DEVICE) and expr.args:
        if len(expr.args) == 1:
            return per_process_device(visitor, expr.args[0].value)
        if len(expr.args) == 2 and string_value(expr.args[0].value) in ("cuda", "xpu", "npu"):
            return rank(expr.args[1].value)
    return False


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


_EMPTY = cst.Module(body=[])


def code_of(node: cst.CSTNode) -> str:
    """The source of ``node`` as written (its own whitespace and comments)."""
    return _EMPTY.code_for_node(node)


def simple_assign(stmt: cst.BaseStatement) -> Optional[cst.Assign]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        return stmt.body[0]
    return None


def binds(stmt: cst.BaseStatement, names: set[str], reads: Optional[set[str]] = None) -> bool:
    """Does ``stmt`` (or a statement nested in it, same scope) assign one of ``names``, or an
    attribute of one (``args.cuda = ...`` changes what ``args.cuda`` reads after it)?

    With ``reads`` (the names and attribute chains some code reads, ``{"args.cuda"}``), an
    attribute assigned counts only when it is one of them, a part of one or inside one:
    ``args.start_epoch = 3`` leaves ``args.cuda`` alone."""
    for inner, _ in iter_statements(cst.IndentedBlock(body=[stmt])):
        assign = simple_assign(inner)
        if assign is None:
            continue
        for target in assign.targets:
            if set(assigned_names(target.target)) & names:
                return True
            root = root_name(target.target) if isinstance(target.target, cst.Attribute) else None
            if root is None or root.value not in names:
                continue
            if reads is None:
                return True
            chain = code_of(target.target)
            if any(r == chain or r.startswith(chain + ".") or chain.startswith(r + ".") for r in reads):
                return True
    return False


def enclosing_function(visitor: cst.MetadataDependent, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The innermost function definition around ``node``, if any."""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return parent


def direct_calls(visitor: cst.MetadataDependent, scope_of: cst.CSTNode, name: str,
                 only: Optional[cst.CSTNode] = None) -> list[cst.Call]:
    """The calls of ``name`` as bound in the scope of ``scope_of`` (a function or class defined
    there): every use of the binding, each the callee of a call. Empty when a use is anything
    else (the function is handed on), or, with ``only``, when the name is bound to something
    other than ``only`` too."""
    from libcst.metadata import ParentNodeProvider

    scope = visitor.get_metadata(ScopeProvider, scope_of, None)
    if scope is None:
        return []
    calls = []
    for assignment in scope.assignments[name]:
        if only is not None and getattr(assignment, "node", None) is not only:
            return []
        for access in assignment.references:
            call = visitor.get_metadata(ParentNodeProvider, access.node, None)
            if not isinstance(call, cst.Call) or call.func is not access.node:
                return []
            calls.append(call)
    return calls


def enclosing_loop_over(visitor: cst.MetadataDependent, node: cst.CSTNode, refs) -> Optional[cst.For]:
    """The innermost ``for`` around ``node`` whose iterable (``tqdm(enumerate(loader))`` peeled) is one
    of ``refs`` (the prepared loaders), or None."""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None:
        if isinstance(parent, cst.For) and ref_of(visitor, peel_iterable(visitor, parent.iter)) in refs:
            return parent
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return None


def enumerate_counter(loop: cst.For) -> set[str]:
    """The batch index of ``for i, batch in enumerate(loader)`` (``tqdm(enumerate(loader))`` too): a
    number the loop counts, not part of the batch."""
    it: cst.BaseExpression = loop.iter
    while isinstance(it, cst.Call) and not m.matches(it.func, m.Name("enumerate")) and it.args:
        it = it.args[0].value  # tqdm(enumerate(loader), ...)
    if m.matches(it, m.Call(func=m.Name("enumerate"))) and isinstance(loop.target, (cst.Tuple, cst.List)) \
            and loop.target.elements:
        return set(assigned_names(loop.target.elements[0].value))
    return set()


def peel_iterable(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))`` -> ``loader``; ``bar = tqdm(loader)`` ... ``enumerate(bar)`` too."""
    for _ in range(4):  # through a few such names, never round a cycle
        while isinstance(expr, cst.Call) and expr.args:
            names = qualified_names(visitor, expr.func)
            if names & {"builtins.enumerate", "enumerate", "builtins.iter", "iter"} or any(
                n == "tqdm" or n.startswith("tqdm.") for n in names
            ):
                expr = expr.args[0].value
            else:
                break
        if not isinstance(expr, cst.Name):
            break
        values = assigned_values(visitor, expr)
        scope = visitor.get_metadata(ScopeProvider, expr, None)
        if len(values) != 1 or scope is None or len(scope[expr.value]) != 1:
            break
        value = values[0]
        wraps = isinstance(value, cst.Call) and value.args and (
            qualified_names(visitor, value.func) & {"builtins.enumerate", "enumerate", "builtins.iter", "iter"}
            or any(n == "tqdm" or n.startswith("tqdm.") for n in qualified_names(visitor, value.func))
        )
        if not wraps:
            break
        expr = value
    return expr


def setup_blocks(root: Union[cst.Module, cst.FunctionDef]) -> Iterator[Body]:
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

    top = root if isinstance(root, cst.Module) else root.body
    if not isinstance(top, (cst.Module, cst.IndentedBlock)):
        return
    yield top
    for stmt in top.body:
        yield from inside(stmt)


BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))


_TRAINERS: list[tuple[cst.Module, frozenset[str]]] = []  # the last module asked about (one file at a time)


def trainer_functions(module: cst.Module) -> set[str]:
    """Names of the module's functions and methods that train: they run a backward, or call
    (by name) one that does. ``train(model, loader)``, ``trainer.fit()``."""
    if _TRAINERS and _TRAINERS[0][0] is module:
        return set(_TRAINERS[0][1])
    found = _trainer_functions(module)
    _TRAINERS[:] = [(module, frozenset(found))]
    return found


def _trainer_functions(module: cst.Module) -> set[str]:
    defs: dict[str, list[cst.FunctionDef]] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            defs.setdefault(stmt.name.value, []).append(stmt)
        elif isinstance(stmt, cst.ClassDef):
            for inner in stmt.body.body:
                if isinstance(inner, cst.FunctionDef):
                    defs.setdefault(inner.name.value, []).append(inner)
    found = {name for name, funcs in defs.items() if any(findall(f, BACKWARD) for f in funcs)}
    changed = True
    while changed:
        changed = False
        for name, funcs in defs.items():
            if name not in found and any(_calls_any(f, found) for f in funcs):
                found.add(name)
                changed = True
    return found


def _calls_any(node: cst.CSTNode, names: set[str], objects: frozenset[str] = frozenset()) -> bool:
    """A call of one of ``names``; a method call on one of ``objects`` (``model.train()`` is
    ``nn.Module.train``, whatever a trainer class calls its own methods) does not count."""
    for call in findall(node, m.Call(func=m.Name() | m.Attribute())):
        func = call.func  # type: ignore[attr-defined]
        if isinstance(func, cst.Attribute):
            root = root_name(func.value)
            if root is not None and root.value in objects:
                continue
        name = func.value if isinstance(func, cst.Name) else func.attr.value
        if name in names:
            return True
    return False


def trains(stmt: cst.BaseStatement, trainers: set[str], objects: frozenset[str] = frozenset()) -> bool:
    """Does running ``stmt`` train: a backward in it, or a call of a function that trains?
    (A definition runs nothing until it is called.)"""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return False
    return bool(findall(stmt, BACKWARD)) or _calls_any(stmt, trainers, objects)


def locate_setup(
    root: Union[cst.Module, cst.FunctionDef], names: set[str], trainers: Optional[set[str]] = None,
    ignore: frozenset[int] = frozenset(), created: frozenset[int] = frozenset(), created_name: str = "",
    touches: frozenset[str] = frozenset(),
) -> Optional[tuple[Body, int]]:
    """The deepest block that binds every name, and the index just after the last binding.

    With ``trainers``, only bindings before the first statement that trains count: the
    objects training uses are the ones bound before it (a model bound again after training,
    to reload a checkpoint for a test, is another object).  The conversion changes what some
    statements bind: those in ``ignore`` bind nothing, those in ``created`` bind ``created_name``.

    ``touches`` (an evaluation: the models it runs): statements that only call methods of one of
    them (``model.load_state_dict(...)``, ``model.eval()``) count as binding it, and the setup ends
    at the first statement that hands one of ``names`` to a call or loops over one.
    """

    def binding(stmt: cst.BaseStatement, wanted: set[str]) -> bool:
        if id(stmt) in ignore:
            return False
        if id(stmt) in created and created_name in wanted:
            return True
        return binds(stmt, wanted) or bool(touches and _touches(stmt, touches & wanted))

    best: Optional[tuple[Body, int]] = None
    for block in setup_blocks(root):  # outermost first: a later match is nested in an earlier one
        end = len(block.body)
        if trainers is not None:
            end = next((i for i, stmt in enumerate(block.body) if trains(stmt, trainers, frozenset(names))), end)
        if touches:
            end = next((i for i, stmt in enumerate(block.body[:end]) if _runs(stmt, names)), end)
        hits = [i for i, stmt in enumerate(block.body[:end]) if binding(stmt, names)]
        if hits and all(any(binding(block.body[i], {n}) for i in hits) for n in names):
            best = (block, hits[-1] + 1)
    return best


def _touches(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """``model.load_state_dict(...)``, ``model.to(device)``: a line of calls of methods of ``names``."""
    if not names or not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
               and isinstance(small.value.func, cst.Attribute)
               and isinstance(small.value.func.value, cst.Name) and small.value.func.value.value in names
               for small in stmt.body)


def _runs(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """An evaluation starts here: ``stmt`` loops over one of ``names`` or hands one to a call
    (``evaluate(model, loader)``), without binding one (``model = nn.DataParallel(model)``)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or binds(stmt, names):
        return False
    for loop in findall(stmt, m.For()):
        if any(n.value in names for n in findall(loop.iter, m.Name())):  # type: ignore[attr-defined]
            return True
    return any(isinstance(arg.value, cst.Name) and arg.value.value in names
               for call in findall(stmt, m.Call()) for arg in call.args)  # type: ignore[attr-defined]


def bound_again(after: Sequence[cst.BaseStatement], names: set[str], trainers: set[str]) -> list[cst.BaseStatement]:
    """The statements after the ``prepare`` point that may bind a training object again: all of
    them but the first that trains, which hands the trained model back (``model = train(model)``)."""
    start = next((i for i, stmt in enumerate(after) if trains(stmt, trainers, frozenset(names))), None)
    return [stmt for i, stmt in enumerate(after) if i != start]


def rebound_region(
    block: Body, index: int, names: set[str], rebound: set[str], trainers: set[str],
    ignore: frozenset[int] = frozenset(),
) -> list[cst.BaseStatement]:
    """The setup block's statements from the first that binds one of ``rebound`` again after the
    ``prepare`` point (``index``): ``model = Net()`` to reload a checkpoint, a plain model from there on."""
    after = bound_again(block.body[index:], names, trainers)
    first = next((i for i, stmt in enumerate(after) if id(stmt) not in ignore and binds(stmt, rebound)), len(after))
    return after[first:]


# --------------------------------------------------------------------------
# references: a training object is known by (scope key, name)

MODULE = "<module>"
#: how converted code (and hand-written Accelerate code) spells the Accelerator
ACCELERATOR_SPELLINGS = ("accelerator", "self.accelerator")
Ref = tuple[str, str]


def scope_key(scope: object) -> str:
    """``"<module>"``, ``"main"``, ``"Trainer.fit"``: stable across passes, unlike scope objects."""
    names: list[str] = []
    while scope is not None and not isinstance(scope, GlobalScope):
        if isinstance(scope, BuiltinScope):
            return "<builtins>"
        if isinstance(scope, (FunctionScope, ClassScope)):
            names.append(scope.name or "?")
        parent = getattr(scope, "parent", None)
        scope = None if parent is scope else parent
    return ".".join(reversed(names)) or MODULE


def key_at(visitor: cst.MetadataDependent, node: cst.CSTNode) -> Optional[str]:
    """The key of the function (or module) whose code ``node`` is."""
    scope = visitor.get_metadata(ScopeProvider, node, None)
    return None if scope is None else scope_key(scope)


def ref_of(visitor: cst.MetadataDependent, expr: cst.CSTNode) -> Optional[Ref]:
    """``model`` -> ``("main", "model")``; ``self.model`` -> ``("Trainer", "self.model")``.

    ``None`` when the expression is not a plain name or ``self`` attribute, or when
    the name can be bound in more than one scope.
    """
    if isinstance(expr, cst.Name):
        scope = visitor.get_metadata(ScopeProvider, expr, None)
        if scope is None:
            return None
        owners = {id(a.scope): a.scope for a in scope[expr.value]}
        if len(owners) != 1:
            return None
        return scope_key(next(iter(owners.values()))), expr.value
    if m.matches(expr, m.Attribute(value=m.Name("self"), attr=m.Name())):
        scope = visitor.get_metadata(ScopeProvider, expr.value, None)  # type: ignore[attr-defined]
        if isinstance(scope, FunctionScope) and isinstance(scope.parent, ClassScope):
            return scope_key(scope.parent), f"self.{expr.attr.value}"  # type: ignore[attr-defined]
        parent = getattr(scope, "parent", None)  # a comprehension or nested function in a method
        while parent is not None and not isinstance(parent, (ClassScope, GlobalScope)):
            parent = getattr(parent, "parent", None)
        if isinstance(parent, ClassScope):
            return scope_key(parent), f"self.{expr.attr.value}"  # type: ignore[attr-defined]
    return None


def assigned_values(visitor: cst.MetadataDependent, name: cst.Name) -> list[cst.BaseExpression]:
    """The values ``name`` is assigned in its scope by ``name = value`` (``params = [...]`` for
    ``Adam(params)``, ``state = {...}`` for ``torch.save(state, path)``)."""
    from libcst.metadata import ParentNodeProvider

    scope = visitor.get_metadata(ScopeProvider, name, None)
    values = []
    for assignment in scope[name.value] if scope is not None else ():
        node = getattr(assignment, "node", None)
        target = visitor.get_metadata(ParentNodeProvider, node, None) if isinstance(node, cst.Name) else None
        assign = visitor.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        if isinstance(assign, cst.Assign):
            values.append(assign.value)
    return values


def receiver_refs(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Iterator[Ref]:
    """Refs along a receiver chain: ``self.model.encoder[0]`` yields ``self.model``'s ref."""
    while True:
        ref = ref_of(visitor, expr)
        if ref is not None:
            yield ref
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        else:
            return


def inside(visitor: cst.MetadataDependent, node: cst.CSTNode, ids: Union[set[int], frozenset[int]]) -> bool:
    """Is ``node``, or a node around it, one of ``ids``?"""
    from libcst.metadata import ParentNodeProvider

    current: Optional[cst.CSTNode] = node
    while current is not None:
        if id(current) in ids:
            return True
        current = visitor.get_metadata(ParentNodeProvider, current, None)
    return False


def under_main_process_check(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    """Inside ``if accelerator.is_main_process:`` (or ``is_local_main_process``), or, in a script
    that managed its own processes, ``if rank == 0:`` (which becomes one)?"""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None:
        if isinstance(parent, cst.If) and (findall(
            parent.test, m.Attribute(attr=m.Name("is_main_process") | m.Name("is_local_main_process"))
        ) or _rank_zero_test(visitor, parent.test)):
            return True
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return False


def _rank_zero_test(visitor: cst.MetadataDependent, test: cst.BaseExpression) -> bool:
    """``rank == 0`` (a rank of ``plan.distributed``) or a main-process flag, alone or as a term of an ``and``."""
    while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        if _rank_zero_test(visitor, test.right):
            return True
        test = test.left
    if isinstance(test, cst.Name) and _converted_main_flag(visitor, test):
        return True
    plan = getattr(visitor, "plan", None)
    if plan is None or getattr(plan, "distributed", None) is None:
        return False
    from accelify.analyses.ranks import main_process_test

    return main_process_test(visitor, test, plan) is not None


def _converted_main_flag(visitor: cst.MetadataDependent, name: cst.Name) -> bool:
    """``master_process`` of converted code: ``= accelerator.is_main_process`` under ``if
    accelerator.use_distributed:`` and ``= True`` in its ``else:`` (what ACC018 makes of nanoGPT's flag)."""
    from libcst.metadata import ParentNodeProvider

    scope = visitor.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) < 2:
        return False
    for assignment in assignments:
        node = getattr(assignment, "node", None)
        target = visitor.get_metadata(ParentNodeProvider, node, None) if isinstance(node, cst.Name) else None
        assign = visitor.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.AssignTarget) else None
        if not isinstance(assign, cst.Assign):
            return False
        main = m.matches(assign.value, m.Attribute(attr=m.Name("is_main_process") | m.Name("is_local_main_process")))
        if not main and not m.matches(assign.value, m.Name("True")):
            return False
        branch: Optional[cst.CSTNode] = assign
        while branch is not None and not isinstance(branch, (cst.If, cst.Else, cst.FunctionDef, cst.Module)):
            branch = visitor.get_metadata(ParentNodeProvider, branch, None)
        if isinstance(branch, cst.Else):
            branch_if = visitor.get_metadata(ParentNodeProvider, branch, None)
            in_else = True
        else:
            branch_if, in_else = branch, False
        if not (isinstance(branch_if, cst.If) and m.matches(branch_if.test, m.Attribute(attr=m.Name("use_distributed")))):
            return False
        if main == in_else:
            return False
    return True


def scope_root(module: cst.Module, key: str) -> Union[cst.Module, cst.FunctionDef, None]:
    """The node whose body is the scope ``key``: the module, or a (possibly nested) function."""
    if key == MODULE:
        return module
    body: Sequence[cst.BaseStatement] = module.body
    found: Optional[cst.CSTNode] = None
    for part in key.split("."):
        found = next((s for s in body if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == part), None)
        if found is None:
            return None
        body = found.body.body if isinstance(found.body, cst.IndentedBlock) else ()
    return found if isinstance(found, cst.FunctionDef) else None


@dataclass(frozen=True)
class RawFinding:
    """A finding before the pipeline attaches a path: line/column in the analysed text."""

    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""


