"""NVIDIA apex's mixed precision becomes the Accelerator's.

The shape research code copied from the BERT-era examples::

    if args.fp16:
        try:
            from apex import amp
        except ImportError:
            raise ImportError("Please install apex ...")
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
    ...
    if args.fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
    else:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)

is what ``Accelerator(mixed_precision="fp16" if args.fp16 else "no")`` does through
``accelerator.backward(loss)`` and ``accelerator.clip_grad_norm_``: the branch that sets apex up goes,
an ``if``/``else`` whose two branches differ only by apex keeps its ``else``, and a lone
``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`` is ``accelerator.backward(loss)``.
Anything else of apex (its DistributedDataParallel, ``amp.state_dict()`` in a checkpoint, two models,
a branch doing more than apex) is left as it is and the file refused (ACC145): apex patches the
optimizer it is handed, and the one ``prepare`` returns is another object.

Input: the facts' calls and imports, the plan, :class:`~accelify.analyses.accelerator.Arguments` for the
switch. Output: ``plan.apex`` (what the codemod ACC033 removes, keeps and replaces),
``plan.mixed_precision``; ACC145 when it is left, the note ACC152 when the switch or apex's
``opt_level`` does not carry over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.accelerator import Arguments
from accelify.analyses.facts import Facts
from accelify.queries.names import code_of, qualified_names, string_value
from accelify.queries.refs import key_at
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

INITIALIZE = "apex.amp.initialize"
SCALE_LOSS = "apex.amp.scale_loss"
MASTER_PARAMS = "apex.amp.master_params"
#: ``amp.initialize`` keywords that only tune apex's own scaling
_TUNING = frozenset({"opt_level", "loss_scale", "verbosity", "keep_batchnorm_fp32", "max_loss_scale", "min_loss_scale"})
#: apex's LARC wraps an optimizer and scales nothing: an optimizer wrapper (ACC118), not its mixed precision
_LARC = "apex.parallel.LARC"
_ATTEMPT = 'drop apex for the Accelerator\'s mixed precision (`Accelerator(mixed_precision="fp16")`, ' \
    "`accelerator.backward(loss)` for `amp.scale_loss`), then run accelify again"


@dataclass
class ApexPlan:
    """Node ids of the tree as written: what ACC033 removes, which ``if`` keeps its ``else``, which
    ``with amp.scale_loss(...)`` becomes ``accelerator.backward(loss)`` (with the loss's code)."""

    removed: set[int] = field(default_factory=set)
    collapsed: set[int] = field(default_factory=set)
    scaled: dict[int, str] = field(default_factory=dict)
    imports: list[Union[cst.Import, cst.ImportFrom]] = field(default_factory=list)


def _apex_import(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.ImportFrom):
        module = code_of(node.module) if node.module is not None else ""
        if module.startswith(_LARC) or (module == "apex.parallel" and not isinstance(node.names, cst.ImportStar)
                                        and all(code_of(a.name) == "LARC" for a in node.names)):
            return False
        return module == "apex" or module.startswith("apex.")
    if isinstance(node, cst.Import):
        return any(code_of(a.name) == "apex" or code_of(a.name).startswith("apex.") for a in node.names)
    return False


def _apex_call(facts: Facts, call: cst.Call) -> bool:
    return any(n.startswith("apex.") and not n.startswith(_LARC) for n in qualified_names(facts, call.func))


def convert(facts: Facts, plan: Plan, arguments: Arguments) -> bool:
    """Plan apex's replacement by the Accelerator's mixed precision; False (ACC145) when apex is used in a
    way the Accelerator does not map."""
    calls = [c for c in facts.calls if _apex_call(facts, c)]
    if not calls:
        return True  # (apex imported and not used: left as it is, as the original has it)
    imports = [i for i in findall(facts.module, m.Import() | m.ImportFrom()) if _apex_import(i)]
    found = ApexPlan()
    parent = lambda node: facts.get_metadata(ParentNodeProvider, node, None)  # noqa: E731

    def refuse(node: cst.CSTNode, why: str) -> bool:
        facts.finding(
            plan, node, "ACC145", f"`{code_of(node.func) if isinstance(node, cst.Call) else code_of(node).strip()}` is "
            f"NVIDIA apex {why}: apex patches the optimizer it is handed and scales the loss through it, and the "
            "optimizer `accelerator.prepare` returns is another object (converted, apex would fail reading it). File "
            "not converted.", _ATTEMPT)
        return False

    if plan.has_accelerator or plan.evaluation:
        return refuse(calls[0], "beside an Accelerator of the script's own")
    if any(n.startswith(("torch.cuda.amp.", "torch.amp.", "torch.autocast")) for c in facts.calls
           for n in qualified_names(facts, c.func)):
        return refuse(calls[0], "beside torch's own mixed precision")

    def branch(node: cst.CSTNode) -> Optional[cst.If]:
        """The ``if`` whose body (not its ``else``) holds ``node``, innermost, in the same function."""
        child, up = node, parent(node)
        while up is not None and not isinstance(up, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            if isinstance(up, cst.If) and child is up.body:
                return up
            child, up = up, parent(up)
        return None

    branches: dict[int, cst.If] = {}
    loose: list[cst.CSTNode] = []  # apex code under no `if` of its own
    initializes: list[cst.Call] = []
    for call in calls:
        names = qualified_names(facts, call.func)
        where = branch(call)
        if INITIALIZE in names:
            line = parent(parent(call))
            if not (_initializes_in_place(call, parent(call)) and isinstance(line, cst.SimpleStatementLine)
                    and len(line.body) == 1):
                return refuse(call, "(an `amp.initialize` that does not hand back the one model and optimizer it is given)")
            initializes.append(call)
            found.removed.add(id(line))
        elif SCALE_LOSS in names:
            loss = _scaled_backward(facts, call)
            if loss is None:
                return refuse(call, "(an `amp.scale_loss` that does more than one `backward()`)")
            if plan.accelerator_in(key_at(facts, call)) is None:
                return refuse(call, "where the Accelerator cannot be reached")
            found.scaled[id(parent(parent(call)))] = loss
        elif MASTER_PARAMS in names:
            if where is None or where.orelse is None:
                return refuse(call, "(`amp.master_params` outside an `if` whose `else` does the same without apex)")
        else:
            return refuse(call, "beyond `amp.initialize`, `amp.scale_loss` and `amp.master_params`")
        if where is not None:
            branches[id(where)] = where
        else:
            loose.append(call)
    for node in imports:
        where = branch(node)
        line = parent(node)
        holder = parent(parent(line)) if line is not None else None
        if isinstance(holder, cst.Try) and _import_guard(holder):
            found.removed.add(id(holder))
            where = branch(holder)
        elif isinstance(parent(line), cst.Module):
            found.imports.append(node)
            continue  # at the top: removed once unused
        else:
            found.removed.add(id(line))
        if where is not None:
            branches[id(where)] = where
        else:
            loose.append(node)
    if not initializes:
        return refuse(calls[0], "with no `amp.initialize` accelify can follow")
    tests = {"".join(code_of(b.test).split()) for b in branches.values()}
    if len(tests) > 1 or (branches and any(not isinstance(n, (cst.Import, cst.ImportFrom)) for n in loose)):
        return refuse(calls[0], "switched by different conditions (or on in some places only)")
    for test in branches.values():
        if test.orelse is None:
            if not all(id(s) in found.removed for s in test.body.body):
                return refuse(test, "in an `if` that does more than set apex up")
            found.removed.add(id(test))
        elif isinstance(test.orelse, cst.Else) and _same_but_apex(facts, test, found):
            found.collapsed.add(id(test))
        else:
            return refuse(test, "in an `if` whose `else` does something else than the apex branch without apex")
    plan.apex = found
    _precision(facts, plan, arguments, next(iter(branches.values())).test if branches else None, initializes[0])
    return True


def _initializes_in_place(call: cst.Call, assign: Optional[cst.CSTNode]) -> bool:
    """``model, optimizer = amp.initialize(model, optimizer, opt_level=...)``: the names it is handed, back."""
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or any(a.keyword is not None and a.keyword.value not in _TUNING for a in call.args):
        return False
    if len(positional) != 2 or not all(isinstance(a.value, cst.Name) for a in positional):
        return False
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return False
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
        return False
    return [code_of(e.value) for e in target.elements] == [a.value.value for a in positional]  # type: ignore[attr-defined]


def _scaled_backward(facts: Facts, call: cst.Call) -> Optional[str]:
    """``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``: the code of ``loss``."""
    item = facts.get_metadata(ParentNodeProvider, call, None)
    with_ = facts.get_metadata(ParentNodeProvider, item, None) if item is not None else None
    if not (isinstance(item, cst.WithItem) and isinstance(with_, cst.With) and len(with_.items) == 1
            and item.asname is not None and isinstance(item.asname.name, cst.Name) and call.args
            and call.args[0].keyword is None and isinstance(with_.body, cst.IndentedBlock)):
        return None
    scaled = item.asname.name.value
    body = with_.body.body
    backward = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=m.Name(scaled), attr=m.Name("backward")),
                                                         args=[]))])
    if len(body) != 1 or not m.matches(body[0], backward):
        return None
    return code_of(call.args[0].value)


def _import_guard(node: cst.Try) -> bool:
    """``try: from apex import amp`` ``except ImportError: raise ...``: the body imports apex only, and the
    handlers only raise or pass."""
    if node.orelse is not None or node.finalbody is not None:
        return False
    body_ok = all(isinstance(s, cst.SimpleStatementLine) and all(_apex_import(i) for i in s.body) for s in node.body.body)
    handlers_ok = all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(i, (cst.Raise, cst.Pass)) for i in s.body)
                      for h in node.handlers for s in h.body.body)
    return body_ok and handlers_ok


def _same_but_apex(facts: Facts, test: cst.If, found: ApexPlan) -> bool:
    """Do the two branches of ``test`` do the same, but for apex? Statement by statement: the same code, or
    a ``with amp.scale_loss(loss, ...)`` against ``loss.backward()``, or the same code around one
    ``amp.master_params(...)``."""
    body, other = test.body.body, test.orelse.body.body  # type: ignore[union-attr]
    if len(body) != len(other) or any(_apex_call(facts, c) for c in findall(test.orelse, m.Call())):
        return False
    for mine, theirs in zip(body, other):
        text, plain = code_of(mine).strip(), code_of(theirs).strip()
        if text == plain:
            continue
        if id(mine) in found.scaled:
            if plain == f"{found.scaled[id(mine)]}.backward()":
                continue
            return False
        masters = [c for c in findall(mine, m.Call()) if MASTER_PARAMS in qualified_names(facts, c.func)]
        if len(masters) != 1:
            return False
        head, _, tail = text.partition(code_of(masters[0]))
        if not (plain.startswith(head) and plain.endswith(tail) and len(plain) > len(head) + len(tail)):
            return False
    return True


def _precision(facts: Facts, plan: Plan, arguments: Arguments, flag: Optional[cst.BaseExpression],
               initialize: cst.Call) -> None:
    """``plan.mixed_precision`` from the ``if`` that switches apex on; the note ACC152 for what does not carry
    over."""
    level = next((a.value for a in initialize.args if a.keyword is not None and a.keyword.value == "opt_level"), None)
    literal = string_value(level) if level is not None else "O1"
    notes = []
    if literal is None:
        notes.append(f"`opt_level={code_of(level).strip()}` is chosen at run time, and Accelerate's fp16 is apex's O1 "
                     "(float16 where it is safe, float32 weights): an O2 or O3 run is not reproduced")
    elif literal != "O1":
        notes.append(f"apex ran at `opt_level=\"{literal}\"`, and Accelerate's fp16 is apex's O1 (float16 where it is "
                     "safe, float32 weights): O2's float16 model and O3's pure float16 are not reproduced")
    if flag is None:
        plan.mixed_precision = '"fp16"'
    elif arguments.available(flag, flag):
        text = arguments.use(flag)
        if not isinstance(flag, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            text = f"({text})"
        plan.mixed_precision = f'"fp16" if {text} else "no"'
    else:
        notes.append(f"`{code_of(flag).strip()}`, which switched apex on, is not known where the Accelerator is "
                     "created: mixed precision now comes from the launch (`accelerate launch --mixed_precision fp16`)")
    if notes:
        facts.note(plan, initialize, "ACC152", "apex's mixed precision is now the Accelerator's: " + "; ".join(notes) + ".",
                   "to keep apex's behaviour exactly, compare a short run of both; pass `mixed_precision=` to the "
                   "Accelerator (or `--mixed_precision` to `accelerate launch`) to choose it.")
