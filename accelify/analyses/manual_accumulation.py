"""Manual gradient accumulation, and when Accelerate's is provably the same update.

A loop such as::

    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss = loss / N
        loss.backward()
        if (step + 1) % N == 0 or (step + 1) == len(loader):
            optimizer.step()
            optimizer.zero_grad()

does exactly what ``Accelerator(gradient_accumulation_steps=N)`` and
``with accelerator.accumulate(model):`` do: ``accelerator.backward`` divides the
loss by ``N``, and the optimizer steps when its counter reaches a multiple of
``N`` *or* the dataloader ends (the counter restarts with each pass over the
dataloader).  Without the ``len(loader)`` clause the hand-written loop carries
the last ``len(loader) % N`` batches' gradients into the next epoch, which
Accelerate never does: that loop is kept and reported, never rewritten.

:func:`match` is shared by the analysis (which decides) and the codemod (which
finds the same loop again in its own pass); it answers either a
:class:`Accumulation` or the reason the loop must be left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from accelify.queries.loops import peel_iterable
from accelify.queries.names import code_of, qualified_names
from accelify.queries.refs import ref_of
from accelify.queries.walk import findall


@dataclass
class Accumulation:
    loop: cst.For
    steps: cst.BaseExpression  # N
    division: cst.SimpleStatementLine  # `loss = loss / N`, `loss /= N` or `loss = <expr> / N`
    branch: cst.If  # `if (i + 1) % N == 0 or (i + 1) == len(loader):`
    model: str  # the code that names the model inside the loop


def looks_manual(loop: cst.For) -> bool:
    """``loss = loss / N`` (or ``/=``) and an optimizer step under ``if ... % N == 0`` in the same loop."""
    divides = bool(findall(loop.body, m.AugAssign(operator=m.DivideAssign()))) or bool(
        findall(loop.body, m.Assign(value=m.BinaryOperation(operator=m.Divide())))
    )
    if not divides:
        return False
    return any(
        findall(branch, m.Call(func=m.Attribute(attr=m.Name("step"))))
        for branch in findall(loop.body, m.If(test=m.Comparison(left=m.BinaryOperation(operator=m.Modulo()))))
        + findall(loop.body, m.If(test=m.BooleanOperation()))
    )


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return "".join(code_of(a).split()).strip("()") == "".join(code_of(b).split()).strip("()")


def _strip(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.with_changes(lpar=[], rpar=[]) if getattr(expr, "lpar", None) else expr


def _is_batch_number(expr: cst.BaseExpression, index: str, start: int) -> bool:
    """The 1-based number of the batch: ``i + 1`` when ``enumerate`` counts from 0, ``i`` from 1."""
    expr = _strip(expr)
    if start == 1:
        return m.matches(expr, m.Name(index))
    return m.matches(
        expr,
        m.BinaryOperation(left=m.Name(index), operator=m.Add(), right=m.Integer("1"))
        | m.BinaryOperation(left=m.Integer("1"), operator=m.Add(), right=m.Name(index)),
    )


def _every_n(test: cst.BaseExpression, index: str, start: int) -> Optional[cst.BaseExpression]:
    """``(i + 1) % N == 0`` -> N."""
    test = _strip(test)
    if not m.matches(test, m.Comparison(comparisons=[m.ComparisonTarget(m.Equal(), comparator=m.Integer("0"))])):
        return None
    left = _strip(test.left)  # type: ignore[attr-defined]
    if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
        if _is_batch_number(left.left, index, start):
            return left.right
    return None


def _last_batch(test: cst.BaseExpression, index: str, start: int) -> Optional[cst.BaseExpression]:
    """``(i + 1) == len(loader)`` (either side), ``i == len(loader) - 1`` -> the ``len`` argument."""
    test = _strip(test)
    if not m.matches(test, m.Comparison(comparisons=[m.ComparisonTarget(m.Equal())])):
        return None
    sides = [_strip(test.left), _strip(test.comparisons[0].comparator)]  # type: ignore[attr-defined]
    length = m.Call(func=m.Name("len"), args=[m.Arg(keyword=None, star="")])
    for a, b in (sides, sides[::-1]):
        if _is_batch_number(a, index, start) and m.matches(b, length):
            return b.args[0].value  # type: ignore[attr-defined]
        if start == 0 and m.matches(a, m.Name(index)) and m.matches(
            b, m.BinaryOperation(left=length, operator=m.Subtract(), right=m.Integer("1"))
        ):
            return b.left.args[0].value  # type: ignore[attr-defined]
    return None


def _enumerate_start(visitor: cst.MetadataDependent, it: cst.BaseExpression) -> Optional[int]:
    """0 for ``enumerate(loader)``, 1 for ``enumerate(loader, 1)`` / ``start=1``; None otherwise."""
    if not isinstance(it, cst.Call) or not qualified_names(visitor, it.func) & {"builtins.enumerate", "enumerate"}:
        return None
    args = it.args
    if not args or args[0].keyword is not None or args[0].star or len(args) > 2:
        return None
    if len(args) == 1:
        return 0
    second = args[1]
    if second.star or (second.keyword is not None and second.keyword.value != "start"):
        return None
    if m.matches(second.value, m.Integer("0")):
        return 0
    if m.matches(second.value, m.Integer("1")):
        return 1
    return None


def _division(stmt: cst.BaseStatement) -> Optional[tuple[str, cst.BaseExpression, bool]]:
    """(loss name, N, whether the statement divides the name by itself) for the three division forms."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if m.matches(small, m.AugAssign(target=m.Name(), operator=m.DivideAssign())):
        return small.target.value, small.value, True  # type: ignore[attr-defined]
    if m.matches(small, m.Assign(targets=[m.AssignTarget(m.Name())], value=m.BinaryOperation(operator=m.Divide()))):
        name = small.targets[0].target.value  # type: ignore[attr-defined]
        value = small.value  # type: ignore[attr-defined]
        return name, value.right, m.matches(_strip(value.left), m.Name(name))
    return None


def _backward_of(stmt: cst.BaseStatement, loss: str, scalers: set[str]) -> bool:
    """``loss.backward()``, or ``scaler.scale(loss).backward()`` for a scaler the Accelerator replaces."""
    plain = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=m.Name(loss), attr=m.Name("backward")), args=[]))])
    if m.matches(stmt, plain):
        return True
    scaled = m.SimpleStatementLine(body=[m.Expr(m.Call(
        func=m.Attribute(value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("scale")), args=[m.Arg(m.Name(loss))]),
                         attr=m.Name("backward")),
        args=[],
    ))])
    return m.matches(stmt, scaled) and stmt.body[0].value.func.value.func.value.value in scalers  # type: ignore[attr-defined]


def match(visitor: cst.MetadataDependent, loop: cst.For, plan) -> Union[Accumulation, str]:
    """The accumulation in ``loop`` when Accelerate's does the same update, else why not."""
    it = loop.iter
    start = _enumerate_start(visitor, it)
    if start is None:
        return "the loop does not count its batches with `enumerate(dataloader)` (from 0 or 1)"
    loader = ref_of(visitor, peel_iterable(visitor, it.args[0].value))
    if loader not in plan.flow["loader"]:
        return "the loop is not over a prepared dataloader"
    target = loop.target
    first = target.elements[0].value if isinstance(target, cst.Tuple) and target.elements else None
    if not isinstance(first, cst.Name):
        return "the batch index is not a plain name"
    index = first.value
    if not isinstance(loop.body, cst.IndentedBlock):
        return "the loop body is on one line"
    body = list(loop.body.body)

    divisions = [(i, d) for i, s in enumerate(body) if (d := _division(s)) is not None]
    branches = [
        (i, s) for i, s in enumerate(body)
        if isinstance(s, cst.If) and findall(s.body, m.Call(func=m.Attribute(attr=m.Name("step"))))
    ]
    if len(divisions) != 1 or len(branches) != 1:
        return "the division of the loss and the optimizer step are not one statement each in the loop body"
    d_index, (loss, steps, self_divided) = divisions[0]
    b_index, branch = branches[0]
    if branch.orelse is not None:
        return "the step is under an `if` with an `else`"
    n = _every_n(branch.test, index, start)
    last = None
    if n is None and isinstance(branch.test, cst.BooleanOperation) and isinstance(branch.test.operator, cst.Or):
        left, right = branch.test.left, branch.test.right
        for every, end in ((left, right), (right, left)):
            if (n := _every_n(every, index, start)) is not None and (last := _last_batch(end, index, start)) is not None:
                break
        else:
            n = None
    if n is None:
        return "the step is not under `if (step + 1) % N == 0`"
    if not _same(n, steps):
        return "the loss is divided by something other than the N of the `% N` test"
    if last is None:
        return (
            "the step is taken every N batches only, so the last `len(dataloader) % N` batches' gradients "
            "are carried into the next epoch; `accelerator.accumulate` would step at the end of each epoch"
        )
    if ref_of(visitor, last) != loader:
        return "the last-batch test measures another dataloader"

    backwards = [i for i, s in enumerate(body) if _backward_of(s, loss, plan.scalers)]
    all_backwards = findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("backward"))))
    if len(backwards) != 1 or len(all_backwards) != 1 or not d_index < backwards[0] < b_index:
        return "the loss is not divided, then `.backward()`-ed once, before the step"
    others = [s for i, s in enumerate(body) if i != b_index]
    stepping = m.Call(func=m.Attribute(attr=m.Name("step") | m.Name("zero_grad")))
    if any(findall(s, stepping) for s in others):
        return "an optimizer or scheduler is stepped (or zeroed) outside the `% N` branch"
    if not _loss_used_only_before(visitor, loop, body, d_index, backwards[0], loss, self_divided):
        return "the divided loss is used beyond `.backward()` (logged or returned): its value would change"

    models = {
        code_of(node) for node in findall(loop.body, m.Name() | m.Attribute())
        if ref_of(visitor, node) in plan.flow["model"]  # type: ignore[arg-type]
    }
    if len(plan.models) != 1 or len(models) != 1:
        return "the loop does not train exactly one model"
    if findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("accumulate")))):
        return "the loop already uses `accumulate`"
    return Accumulation(loop, steps, body[d_index], branch, models.pop())  # type: ignore[arg-type]


def _loss_used_only_before(
    visitor: cst.MetadataDependent, loop: cst.For, body: list[cst.BaseStatement],
    d_index: int, b_index: int, loss: str, self_divided: bool,
) -> bool:
    """Every read of ``loss`` comes before the division (it sees the undivided value either way),
    is the division's own ``loss / N``, or is the ``.backward()``."""
    scope = visitor.get_metadata(ScopeProvider, body[b_index], None)
    if scope is None:
        return False
    allowed_nodes = {id(n) for n in findall(body[b_index], m.Name(loss))}
    if self_divided:
        # Reads between the statement that computes the loss and the division see the
        # undivided value, before and after the rewrite alike.
        computed = [i for i, s in enumerate(body[:d_index]) if _binds_name(s, loss)]
        if not computed:
            return False
        for stmt in body[computed[-1] + 1 : d_index + 1]:
            allowed_nodes |= {id(n) for n in findall(stmt, m.Name(loss))}
    return all(id(access.node) in allowed_nodes for access in scope.accesses[loss])


def _binds_name(stmt: cst.BaseStatement, name: str) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(name))])]))
