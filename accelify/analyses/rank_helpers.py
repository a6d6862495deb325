"""Rank helpers: the script's own ``get_rank()``/``get_world_size()`` that ask torch.distributed when a group exists.

The torchvision references' ``utils.py``, pasted into DINO, MoCo-style and many research scripts, asks
torch.distributed for the rank only when a process group exists (``is_dist_avail_and_initialized()``, then
``get_rank()``, ``get_world_size()``; the before/after of ACC034's docstring, ``codemods/rank_helpers.py``).
They answer right in one process and under any launcher, so the rest of the conversion leaves their
queries (``codemods.distributed``'s guarded queries); but they are process-group code left in a converted
script. Under Accelerate the same answers come from the state every process shares: each such helper
becomes one ``return PartialState().process_index`` (``num_processes``, ``use_distributed``; ACC034).

A helper qualifies when its body is only that decision: ``if <test>: return <value>`` lines and a last
``return``, or one ``return a if <test> else b``, where the tests ask ``is_available()``,
``is_initialized()`` or another such helper, and the body, run with no process group, gives the
one-process answer (0, 1, False) and, run with one, the group's (``dist.get_rank()``, ...). Evaluated, not
matched: the order and spelling of its lines do not matter.

Left as they are (correct, only not Accelerate's) when ``PartialState()`` could be made where the original
asked nothing of a state:
- in what a DataLoader's workers run (a ``spawn``ed worker would set the processes up again);
- before the Accelerator exists, when it is made with ``cpu=`` (a state made first would not know it):
  a call at the module's top, in a class's code, or in the setup function before its last optimizer.

Input: the facts and the plan (its setup scope and ``cpu_flag``). Output: ``plan.rank_helpers``.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.analyses.facts import Facts
from accelify.analyses.ranks import GET_RANK, GET_WORLD_SIZE, IS_INITIALIZED
from accelify.queries.blocks import is_docstring
from accelify.queries.names import qualified_names
from accelify.queries.refs import MODULE
from accelify.queries.walk import findall
from accelify.queries.workers import run_by_workers

IS_AVAILABLE = frozenset({"torch.distributed.is_available"})

#: the symbol a helper returns with a process group -> (the Accelerate attribute, its one-process value)
ATTRIBUTES = {"rank": ("process_index", 0), "world": ("num_processes", 1), True: ("use_distributed", False)}

def decide(facts: Facts, plan, optimizers: list[cst.Assign]) -> dict[int, str]:
    """id of each module-level rank helper the conversion rewrites -> the ``PartialState`` attribute it returns."""
    found = queries(facts, facts.functions)
    if not found:
        return {}
    workers = run_by_workers(facts.module)
    if any(id(f) in workers and _calls(facts, f, set(found)) for f in findall(facts.module, m.FunctionDef())):
        return {}
    if plan.cpu_flag is not None and _asked_early(facts, plan, set(found), optimizers):
        return {}
    return {id(facts.functions[name]): attribute for name, attribute in found.items()}


def queries(meta, functions: dict[str, cst.FunctionDef]) -> dict[str, str]:
    """The rank helpers among a module's ``functions`` (by name), each with the attribute it stands for; ``meta``
    answers the module's qualified names (the facts, or a project module's metadata)."""
    candidates = {name: f for name, f in functions.items() if _plain(f)}
    found: dict[str, str] = {}
    grew = True
    while grew:  # a helper may ask another (``get_rank`` asks ``is_dist_avail_and_initialized``)
        grew = False
        for name, function in candidates.items():
            if name not in found:
                attribute = _attribute(meta, function, found)
                if attribute is not None:
                    found[name] = attribute
                    grew = True
    return found


def main_process_test(function: cst.FunctionDef, found: dict[str, str]) -> bool:
    """``def is_main_process(): return get_rank() == 0``, ``get_rank`` a rank helper of ``found``."""
    body = function.body.body if _plain(function) else ()  # type: ignore[union-attr]
    return len(body) == 1 and m.matches(body[0], m.SimpleStatementLine(body=[m.Return(m.Comparison(
        left=m.Call(func=m.Name(), args=[]), comparisons=[m.ComparisonTarget(m.Equal(), m.Integer("0"))]))])) and \
        found.get(body[0].body[0].value.left.func.value) == "process_index"  # type: ignore[attr-defined]


def _plain(function: cst.FunctionDef) -> bool:
    params = function.params
    return not function.decorators and not params.params and not params.kwonly_params \
        and not params.posonly_params and not isinstance(params.star_arg, cst.Param) \
        and params.star_kwarg is None and function.asynchronous is None and isinstance(function.body, cst.IndentedBlock)


def _attribute(meta, function: cst.FunctionDef, helpers: dict[str, str]) -> Optional[str]:
    """The attribute ``function`` stands for, when its body is only the decision (see the module's text); ``meta``
    answers qualified names, as in :func:`queries`."""
    initialised = {name for name, attribute in helpers.items() if attribute == "use_distributed"}
    body = list(function.body.body)  # type: ignore[union-attr]
    if body and is_docstring(body[0]):
        body = body[1:]
    answers = set()
    for available, group in ((True, True), (True, False), (False, False)):
        answer = _run(meta, body, available, group, initialised)
        if answer is _UNKNOWN:
            return None
        answers.add((group, answer))
    with_group = {a for g, a in answers if g}
    without = {a for g, a in answers if not g}
    if len(with_group) != 1 or len(without) != 1:
        return None
    symbol = next(iter(with_group))
    if not (symbol in ("rank", "world") or symbol is True):  # (not 1, which equals True)
        return None
    attribute, one_process = ATTRIBUTES[symbol]
    value = next(iter(without))
    if value != one_process or type(value) is not type(one_process):
        return None
    return attribute


_UNKNOWN = object()


def _run(meta, body: list[cst.BaseStatement], available: bool, group: bool, initialised: set[str]):
    """What ``body`` returns when torch.distributed is ``available`` and a ``group`` exists; _UNKNOWN for
    anything but the decision's statements."""
    for statement in body:
        if isinstance(statement, cst.If):
            if statement.orelse is not None and not isinstance(statement.orelse, cst.Else):
                return _UNKNOWN
            test = _test(meta, statement.test, available, group, initialised)
            if test is None:
                return _UNKNOWN
            branch = statement.body if test else (statement.orelse.body if statement.orelse else None)
            if branch is None:
                continue
            answer = _run(meta, list(branch.body), available, group, initialised)  # type: ignore[union-attr]
            if answer is not _FALLS_THROUGH:
                return answer
            continue
        if not m.matches(statement, m.SimpleStatementLine(body=[m.Return()])):
            return _UNKNOWN
        value = statement.body[0].value  # type: ignore[union-attr]
        return _UNKNOWN if value is None else _value(meta, value, available, group, initialised)
    return _FALLS_THROUGH


_FALLS_THROUGH = object()


def _value(meta, node: cst.BaseExpression, available: bool, group: bool, initialised: set[str]):
    if isinstance(node, cst.IfExp):
        test = _test(meta, node.test, available, group, initialised)
        if test is None:
            return _UNKNOWN
        return _value(meta, node.body if test else node.orelse, available, group, initialised)
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.Call) and not node.args:
        names = qualified_names(meta, node.func)
        if names & GET_RANK:
            return "rank" if group else _UNKNOWN
        if names & GET_WORLD_SIZE:
            return "world" if group else _UNKNOWN
    test = _test(meta, node, available, group, initialised)
    return _UNKNOWN if test is None else test


def _test(meta, node: cst.BaseExpression, available: bool, group: bool, initialised: set[str]) -> Optional[bool]:
    """The truth of a test made only of ``is_available()``, ``is_initialized()``, helpers that ask them,
    ``not``, ``and``, ``or`` and ``True``/``False``; None for any other."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _test(meta, node.expression, available, group, initialised)
        return None if inner is None else not inner
    if isinstance(node, cst.BooleanOperation):
        left = _test(meta, node.left, available, group, initialised)
        right = _test(meta, node.right, available, group, initialised)
        if left is None or right is None:
            return None
        return (left and right) if isinstance(node.operator, cst.And) else (left or right)
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.Call) and not node.args:
        if isinstance(node.func, cst.Name) and node.func.value in initialised:
            return group
        names = qualified_names(meta, node.func)
        if names & IS_INITIALIZED:
            return group
        if names & IS_AVAILABLE:
            return available
    return None


def _calls(facts: Facts, node: cst.CSTNode, names: set[str]) -> bool:
    """Does ``node`` call one of ``names`` (``get_rank()``, or ``utils.get_rank()``: by its name, torch's own
    ``dist.get_rank()`` aside)?"""
    for call in findall(node, m.Call()):
        func = call.func
        if isinstance(func, cst.Name) and func.value in names:
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in names and not any(
                q.startswith("torch.") for q in qualified_names(facts, func)):
            return True
    return False


def _asked_early(facts: Facts, plan, helpers: set[str], optimizers: list[cst.Assign]) -> bool:
    """Could a helper run before the Accelerator is made: called, itself or through the module's functions
    that call it, at the module's top, in a class, or in the setup function above its last optimizer?"""
    reaching = set(helpers)
    setup = plan.setup.split(".")[0]
    grew = True
    while grew:
        grew = False
        for name, function in facts.functions.items():
            if name not in reaching and name != setup and _calls(facts, function, reaching):
                reaching.add(name)
                grew = True
    if any(_calls(facts, c, reaching) for c in facts.classes.values()):
        return True
    last = max((facts.line(a) for a in optimizers), default=0)
    top = [s for s in facts.module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
    if plan.setup != MODULE:
        # the script's top runs before the setup function it calls ("main(args)"): a call there is early
        if any(_calls(facts, s, reaching) for s in top):
            return True
        function = facts.functions.get(setup)
        if function is None:
            return True
        top = [function]
    return any(_calls(facts, call, reaching) and facts.line(call) <= last for node in top for call in findall(node, m.Call()))
