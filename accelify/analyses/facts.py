"""The facts every analysis decides from, collected in one visit of the file.

:class:`Facts` looks at each node once on the way down and decides nothing: it keeps every
assignment under the ref it binds (and the function it is in), the module-level functions and
classes, the ``.step()`` and ``.backward()`` calls among all the calls, the loops, and the
``break``/``return`` statements.  ``plan.analyze`` drives it over the walk index's pre-order
(or as a plain LibCST visitor), then hands it to the analyses, which ask it the questions
several of them share: positions, the single target of an assignment, the values a name is
bound to, the call sites of a helper.  It is also the ``visitor`` they hand to the metadata
helpers of :mod:`accelify.queries` (``ref_of(facts, node)``).

Input: the module and its metadata.  Output: the collected facts; :meth:`Facts.finding` puts a
finding, at a node's position, in a plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    FunctionScope, GlobalScope, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider,
)

from accelify.queries.names import has_qname, param_names  # noqa: F401 (param_names: imported from here by the analyses)
from accelify.queries.records import RawFinding
from accelify.queries.refs import Ref, assigned_values, key_at, ref_of, scope_key
from accelify.queries.training import direct_calls, trainer_functions

if TYPE_CHECKING:
    from accelify.analyses.foreign import Foreign
    from accelify.analyses.plan import Plan

#: the kinds of object whose refs flow from the setup scope into helpers (``Plan.flow``)
KINDS = ("loader", "model", "device")


class Facts(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider, ParentNodeProvider)

    def __init__(self) -> None:
        super().__init__()
        self.foreign: Optional[Foreign] = None  # the project's other modules (accelify.analyses.foreign)
        self.elsewhere: frozenset = frozenset()  # functions and classes of other modules in the program
        self.assigns: dict[Ref, list[cst.Assign]] = {}
        self.assign_key: dict[int, Optional[str]] = {}  # id(assign) -> key of the function it is in
        self.functions: dict[str, cst.FunctionDef] = {}  # module-level functions by name
        self.nested: dict[str, cst.FunctionDef] = {}  # functions defined in a function, by key (``train.save``)
        self.classes: dict[str, cst.ClassDef] = {}  # module-level classes by name
        self.steps: list[cst.Call] = []
        self.backwards: list[cst.Call] = []
        self.calls: list[cst.Call] = []
        self.loops: list[cst.For] = []
        self.whiles: list[cst.While] = []
        self.exits: list[cst.CSTNode] = []  # break and return statements
        self.is_script = False  # has an `if __name__ == "__main__":` block
        self.module: cst.Module  # the visited module, once left
        self.trainers: set[str]  # ... and its functions and methods that train (`trainer_functions`)
        self.plan: Optional[Plan] = None  # the plan being decided from these facts

    # ------------------------------------------------------------------ collection
    def visit_Assign(self, node: cst.Assign) -> None:
        self.assign_key[id(node)] = key_at(self, node)
        for target in node.targets:
            for element in _target_elements(target.target):
                ref = ref_of(self, element)
                if ref is not None:
                    self.assigns.setdefault(ref, []).append(node)

    def visit_If(self, node: cst.If) -> None:
        guard = m.If(test=m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal())]))
        if m.matches(node, guard) and isinstance(self.get_metadata(ScopeProvider, node, None), GlobalScope):
            self.is_script = True

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.whiles.append(node)

    def visit_Break(self, node: cst.Break) -> None:
        self.exits.append(node)

    def visit_Return(self, node: cst.Return) -> None:
        self.exits.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        scope = self.get_metadata(ScopeProvider, node, None)
        if isinstance(scope, GlobalScope):
            self.functions[node.name.value] = node
        elif isinstance(scope, FunctionScope):
            self.nested[f"{scope_key(scope)}.{node.name.value}"] = node

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if isinstance(self.get_metadata(ScopeProvider, node, None), GlobalScope):
            self.classes[node.name.value] = node

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(attr=m.Name("step"))):
            self.steps.append(node)
        if m.matches(node.func, m.Attribute(attr=m.Name("backward"))):
            self.backwards.append(node)
        self.calls.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        self.module = original_node
        self.trainers = trainer_functions(original_node)

    # ------------------------------------------------------------------ shared queries
    def finding(self, plan: Plan, node: cst.CSTNode, code: str, message: str, suggestion: str = "") -> None:
        if isinstance(node, cst.Module):  # the whole file: its first line
            node = node.body[0] if node.body else node
        found = self.get_metadata(PositionProvider, node, None)
        line, column = (found.start.line, found.start.column + 1) if found is not None else (1, 1)
        plan.findings.append(RawFinding(line, column, code, message, suggestion))

    def note(self, plan: Plan, node: cst.CSTNode, code: str, message: str, suggestion: str = "") -> None:
        """A finding about what the conversion does: reported only when the file is converted."""
        before = len(plan.findings)
        self.finding(plan, node, code, message, suggestion)
        plan.conversion_notes.append(plan.findings.pop(before))

    def line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def single_target(self, assign: cst.Assign) -> Optional[Ref]:
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, (cst.Name, cst.Attribute)):
            return None
        return ref_of(self, assign.targets[0].target)

    def bound_values(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The values a plain name is assigned in its scope (``params = [...]`` for ``Adam(params)``)."""
        return assigned_values(self, expr) if isinstance(expr, cst.Name) else []

    def handed(self, seeds: set, key: Callable[[cst.BaseExpression], object], sites_of: Optional[dict] = None) -> set:
        """``seeds`` and the parameters ``(function, parameter)`` of the file's module-level functions every call
        of which hands them one of those (as ``key`` spells an argument), to a fixpoint: ``main(args)`` then
        ``train(args)``. ``sites_of`` adds call sites ``call_sites`` does not see (a ``Process`` target)."""
        found = set(seeds)
        sites = {name: self.call_sites(name, func) or (sites_of or {}).get(name, []) for name, func in self.functions.items()}
        changed = True
        while changed:
            changed = False
            for name, func in self.functions.items():
                for param in [p.name.value for p in func.params.params] if sites[name] else ():
                    if (name, param) not in found and all(
                            param in bound and key(bound[param]) in found for _, bound in sites[name]):
                        found.add((name, param))
                        changed = True
        return found

    def call_sites(
        self, name: str, func: cst.FunctionDef, cls: Optional[cst.ClassDef] = None
    ) -> list[tuple[cst.Call, dict[str, cst.BaseExpression]]]:
        """Every call of a module-level function (or of class ``cls``, whose ``__init__`` is
        ``func``), with its arguments bound to parameter names.

        Empty when the function escapes (is passed around, decorated) or a call uses ``*args``.
        """
        if not _transparent(self, func.decorators) or (cls is not None and cls.decorators):
            return []
        sites = []
        for call in direct_calls(self, cls if cls is not None else func, name):
            bound = bind_arguments(func, call, skip_self=cls is not None)
            if bound is None:
                return []
            sites.append((call, bound))
        return sites


#: decorators that call the function as it is, arguments and result unchanged (gradients off or on)
_GRAD_MODES = frozenset({"torch.no_grad", "torch.inference_mode", "torch.enable_grad", "torch.autograd.grad_mode.no_grad",
                         "torch.autograd.grad_mode.inference_mode", "torch.autograd.grad_mode.enable_grad"})


def _transparent(visitor: cst.MetadataDependent, decorators: Sequence[cst.Decorator]) -> bool:
    """Every decorator is a grad mode (``@torch.no_grad()``, ``@torch.inference_mode()``): the function is
    called as written, so its call sites bind its parameters."""
    for decorator in decorators:
        target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        if isinstance(decorator.decorator, cst.Call) and decorator.decorator.args:
            return False
        if not has_qname(visitor, target, _GRAD_MODES):
            return False
    return True


def _target_elements(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [e for el in target.elements for e in _target_elements(el.value)]
    if isinstance(target, cst.StarredElement):
        return _target_elements(target.value)
    return [target]


def chain_root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``model.cuda().half()`` -> ``model``; ``Net().cuda()`` -> ``Net()``."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        expr = expr.func.value
    return expr


def bind_arguments(
    func: cst.FunctionDef, call: cst.Call, skip_self: bool = False
) -> Optional[dict[str, cst.BaseExpression]]:
    """Map a call's arguments to parameter names; ``None`` for ``*args``/``**kwargs`` calls.
    ``skip_self``: ``func`` is the ``__init__`` a class call runs."""
    p = func.params
    positional = [x.name.value for x in (*p.posonly_params, *p.params)][1 if skip_self else 0:]
    keyword = {x.name.value for x in (*p.params, *p.kwonly_params)}
    bound: dict[str, cst.BaseExpression] = {}
    index = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= len(positional):
                return None
            bound[positional[index]] = arg.value
            index += 1
        elif arg.keyword.value in keyword:
            bound[arg.keyword.value] = arg.value
        else:
            return None
    return bound
