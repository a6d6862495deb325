"""The Accelerator: the script's own or the name of a new one, and what it can be created with.

A script that already creates an ``Accelerator`` (or whose setup function is handed one) keeps it;
otherwise the conversion adds ``accelerator = Accelerator(...)`` (``self.accelerator`` in a class)
in the setup scope, before the device and the training objects.  Its arguments (``cpu=``,
``mixed_precision=``, ``gradient_accumulation_steps=``) may only read values bound by then:
:class:`Arguments` answers whether an expression is one, for the analyses that decide them.

Input: the facts (assignments, definitions and imports of the module and the setup scope) and
the setup scope (``plan.owner``, ``plan.setup``).  Output: ``plan.accelerator``,
``plan.has_accelerator``; ``plan.argument_names`` (the names the arguments read); refusal ACC100
when the name the new Accelerator needs is taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import Assignment, ParentNodeProvider, ScopeProvider

from accelify.analyses.facts import Facts, param_names
from accelify.queries.blocks import scope_root
from accelify.queries.names import ACCELERATOR_CLASS, code_of, has_qname, read_names
from accelify.queries.refs import MODULE, Ref, scope_key

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan


def prepared_by_hand(facts: Facts) -> Optional[cst.Call]:
    """A call ``accelerator.prepare(...)`` of an Accelerator the file creates itself
    (``accelerator = Accelerator()`` or ``self.accelerator = Accelerator()``, any scope): the file is on
    Accelerate already, converted by its author or by accelify, and is left as it is (no rewrite, no
    finding: a second conversion would prepare objects twice). ``accelify.core.precheck`` knows the
    same before any parse."""
    created = set()
    for call in facts.calls:
        parent = facts.get_metadata(ParentNodeProvider, call, None)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and \
                has_qname(facts, call.func, ACCELERATOR_CLASS):
            created.add(get_full_name_for_node(parent.targets[0].target))
    created.discard(None)
    if not created:
        return None
    return next((call for call in facts.calls if isinstance(call.func, cst.Attribute)
                 and call.func.attr.value == "prepare" and get_full_name_for_node(call.func.value) in created), None)


def spelling(facts: Facts, plan: Plan) -> bool:
    """How the setup scope spells its Accelerator: the one it already has, or the name of the new
    one; False (ACC100) when that name, or ``Accelerator``, is taken."""
    for ref, assigns in facts.assigns.items():
        for assign in assigns:
            if isinstance(assign.value, cst.Call) and has_qname(facts, assign.value.func, ACCELERATOR_CLASS):
                if ref[0] == plan.owner:
                    plan.accelerator, plan.has_accelerator = ref[1], True
    wanted = "self.accelerator" if plan.class_mode else "accelerator"
    setup = facts.functions.get(plan.setup) if plan.setup != MODULE else None
    if not plan.has_accelerator and setup is not None and "accelerator" in param_names(setup):
        # The setup function is handed an Accelerator by its caller: use that one.
        plan.accelerator, plan.has_accelerator = "accelerator", True
    if not plan.has_accelerator:
        plan.accelerator = wanted
        taken = facts.assigns.get((plan.owner, wanted)) or (
            facts.assigns.get((MODULE, wanted)) if plan.owner != MODULE else None
        )
        if taken:
            facts.finding(
                plan, taken[0], "ACC100",
                f"the name `{wanted}` is already bound to something else; file not converted.",
                "rename that variable, then run accelify again.",
            )
        elif not plan.class_mode:
            other = _bound_otherwise(facts, wanted, setup)
            if other is not None:  # `def accelerator()`, `from settings import accelerator`
                facts.finding(
                    plan, other, "ACC100",
                    f"the name `{wanted}` is already bound to something else (a definition or an "
                    "import); the new `accelerator = Accelerator()` would take its place. File not converted.",
                    "rename it, then run accelify again.",
                )
    if not plan.has_accelerator:
        other = _bound_otherwise(facts, "Accelerator", None, allowed=("accelerate", "accelify.runtime"))
        if other is not None:  # `from mylib import Accelerator`: it would win over (or lose to) accelerate's
            facts.finding(
                plan, other, "ACC100",
                "the name `Accelerator` is already bound to something other than accelerate's "
                "class; the added `from accelerate import Accelerator` would clash with it. File not converted.",
                "import it under another name (`from mylib import Accelerator as MyAccelerator`), then run "
                "accelify again.",
            )
    return not any(f.code == "ACC100" for f in plan.findings)


def _bound_otherwise(
    facts: Facts, name: str, setup: Optional[cst.FunctionDef], allowed: tuple[str, ...] = ()
) -> Optional[cst.CSTNode]:
    """A definition or import binding ``name`` where the setup scope sees it (that scope or the module),
    other than an import from a module ``allowed`` (a package, or a module of it)."""
    scopes = [facts.get_metadata(ScopeProvider, facts.module, None)]
    if setup is not None and isinstance(setup.body, cst.IndentedBlock) and setup.body.body:
        scopes.append(facts.get_metadata(ScopeProvider, setup.body.body[0], None))
    for scope in scopes:
        if scope is None:
            continue
        for assignment in scope.assignments[name]:
            node = getattr(assignment, "node", None)
            source = (get_full_name_for_node(node.module) or "") if isinstance(node, cst.ImportFrom) and \
                node.module is not None and not node.relative else ""
            if source and any(source == a or source.startswith(a + ".") for a in allowed):
                continue
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Import, cst.ImportFrom)):
                return node
    return None


class Arguments:
    """What the Accelerator's arguments can read: it is created in the setup scope before the first
    device or training object (``anchor``, a line) of the setup scope's assignments ``in_owner``."""

    def __init__(self, facts: Facts, plan: Plan, in_owner: dict[Ref, list[cst.Assign]]) -> None:
        self.facts, self.plan = facts, plan
        self.anchor = min((facts.line(a) for ref, assigns in in_owner.items()
                           if ref[1] in plan.devices or ref[1] in plan.core() for a in assigns), default=0)

    def available(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Can the Accelerator, created in the setup scope before the device and the training
        objects, evaluate ``expr`` (written at ``at``) and get the same value?

        Literals, and names (or ``name.attr``) bound once: a parameter of the setup function, a
        module-level name, or a setup-scope name bound before the first device or training object.
        """
        facts, plan = self.facts, self.plan
        if isinstance(expr, cst.Integer):
            return True
        root = expr
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name):
            return False
        here = facts.get_metadata(ScopeProvider, at, None)
        setup_root = scope_root(facts.module, plan.setup)
        if here is None or setup_root is None:
            return False
        first = setup_root.body[0] if isinstance(setup_root, cst.Module) else setup_root.body.body[0]
        there = facts.get_metadata(ScopeProvider, first, None)
        if there is None:
            return False
        found, seen = here[root.value], there[root.value]
        if len(found) > 1 and found == seen and self._all_before_anchor(found):
            return True  # `def main(args): ... args = parse_args()` before the objects: its last value
        if len(found) != 1 or found != seen:
            return False
        assignment = next(iter(found))
        if not isinstance(assignment, Assignment):
            return False
        key = scope_key(assignment.scope)
        if key == MODULE and plan.setup != MODULE:
            return True
        if key != plan.setup:
            return False
        if isinstance(assignment.node, cst.Param):
            return True
        return facts.line(assignment.node) < self.anchor

    def _all_before_anchor(self, assignments) -> bool:
        """Every binding a parameter of the setup function or an assignment in it before the first device
        or training object: the Accelerator, created after them, reads the value the code after reads."""
        for assignment in assignments:
            if not isinstance(assignment, Assignment) or scope_key(assignment.scope) != self.plan.setup:
                return False
            if not isinstance(assignment.node, cst.Param) and self.facts.line(assignment.node) >= self.anchor:
                return False
        return True

    def use(self, expr: cst.BaseExpression) -> str:
        """Record that the Accelerator reads ``expr`` (it is created after its names are bound)."""
        self.plan.argument_names |= {n.value for n in read_names(expr)}
        return code_of(expr)
