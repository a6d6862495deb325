"""What ``gather_for_metrics`` needs in an evaluation loop: which collected values are per
sample, which metric is a mean of batch means, or why the loop cannot be gathered (a
``Refusal``). Asked by ACC011 and by the analyses that decide evaluation hazards."""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import GlobalScope, ParentNodeProvider, ScopeProvider

from accelify.queries.blocks import enclosing_function, iter_statements, simple_assign
from accelify.queries.loops import enumerate_counter, peel_iterable
from accelify.queries.names import assigned_names, code_of, qualified_names, string_value
from accelify.queries.refs import assigned_values, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

_METRIC_CALLS = m.Expr(m.Call(func=m.Attribute(attr=m.Name("append") | m.Name("extend") | m.Name("add_batch")
                                               | m.Name("update"))))


# Attributes of a tensor, not parts of an output object.
_TENSOR_ATTRIBUTES = frozenset({"shape", "data", "T", "dtype", "device", "ndim", "real", "imag"})


@dataclass
class Refusal:
    """Metrics that no gather makes right: the finding's message and suggestion."""

    message: str
    suggestion: str


@dataclass
class Gather:
    """Gather ``values`` into ``names`` right before ``statement`` (in ``block``); read
    ``replace`` (ids of the parts gathered: ``batch["labels"]``) as the new names after it."""

    block: cst.IndentedBlock
    statement: cst.BaseStatement
    names: list[str]
    values: list[str]
    replace: dict[int, str]
    #: the node each value is the code of (None for a plain name)
    nodes: list[Optional[cst.CSTNode]] = field(default_factory=list)


# Methods and torch functions that keep one row per sample: what comes out of them can still be
# gathered (`predictions = logits.argmax(dim=-1)`), unlike a loss or a `.item()`.
_PER_SAMPLE = frozenset({
    "argmax", "argmin", "max", "min", "softmax", "log_softmax", "sigmoid", "squeeze", "unsqueeze", "view",
    "reshape", "float", "long", "int", "detach", "cpu", "round", "flatten", "view_as", "topk", "sort", "exp",
})
_NEEDS_DIM = frozenset({"argmax", "argmin", "max", "min", "topk", "sort"})  # a reduction without a dim


def _per_sample(expr: cst.BaseExpression) -> bool:
    """``outputs.logits``, ``batch["labels"]``, ``torch.argmax(logits, dim=-1)``, ``out.max(1)``."""
    if isinstance(expr, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _per_sample(expr.expression)
    if isinstance(expr, cst.Attribute):
        return _per_sample(expr.value)
    if isinstance(expr, cst.Subscript):
        return len(expr.slice) == 1 and m.matches(expr.slice[0], m.SubscriptElement(m.Index(m.SimpleString() | m.Integer()))) and _per_sample(expr.value)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _PER_SAMPLE:
        name = expr.func.attr.value
        receiver = expr.func.value
        function = m.matches(receiver, m.Name("torch") | m.Attribute(value=m.Name("torch"), attr=m.Name("nn") | m.Name(
            "special")) | m.Attribute(attr=m.Name("functional"))) or m.matches(receiver, m.Name("F"))
        if name in _NEEDS_DIM and _without_dim(expr, function):
            return False
        args_ok = all(_per_sample(a.value) for a in expr.args)
        if function:
            return args_ok and bool(expr.args)  # torch.argmax(logits, dim=-1), F.softmax(out, dim=1)
        return args_ok and _per_sample(receiver)
    return False


def _without_dim(call: cst.Call, function: bool) -> bool:
    """``torch.topk(scores, k)``, ``scores.argmax()``: a reduction over the whole tensor, or over its last
    dimension, the batch's for a 1-D tensor (NCF ranks one user's candidates, a batch, against each other);
    not ``out.max(1)``, ``torch.topk(x, k, dim=1)``."""
    if any(a.keyword is not None and a.keyword.value == "dim" for a in call.args):
        return False
    positional = [a for a in call.args if a.keyword is None]
    needed = (1 if function else 0) + (2 if call.func.attr.value == "topk" else 1)  # type: ignore[attr-defined]
    return len(positional) < needed


def _across_samples(statements: Sequence[cst.BaseStatement], derived: set[str]) -> Optional[str]:
    """A reduction of what the batch gave that ranks or picks across its samples (``torch.topk(predictions,
    k)``, ``torch.take(item, indices)``): gathered, the batches of all processes would be ranked, or
    indexed, as one."""
    for statement in statements:
        for call in findall(statement, m.Call(func=m.Attribute())):
            name = call.func.attr.value  # type: ignore[attr-defined]
            receiver = call.func.value  # type: ignore[attr-defined]
            function = m.matches(receiver, m.Name("torch"))
            reads = _reads(call) & derived
            if not reads:
                continue
            if (name in _NEEDS_DIM and _without_dim(call, function)) or (function and name in ("take", "argsort")):
                return (f"they rank or pick across the samples of a batch (`{cst.Module(body=[]).code_for_node(call)}`)"
                        ": gathered, the batches of all the processes would be ranked as one")
    return None


def _early_exit(loop: cst.For) -> Optional[str]:
    """The code of the first ``break`` or ``return`` that leaves ``loop`` itself (not an inner loop,
    not a nested function) after a number of batches: unconditionally, or under a test that reads
    what the loop binds (``if i >= 3: break``); not under a test of a flag set before the loop
    (``if args.dry_run: break``, a mode every process is in alike). None when there is none."""
    bound = set(assigned_names(loop.target)) | {
        n for stmt, _ in iter_statements(loop.body) if (a := simple_assign(stmt)) is not None  # type: ignore[arg-type]
        for t in a.targets for n in assigned_names(t.target)}

    def walk(node: cst.CSTNode, tests: tuple[cst.BaseExpression, ...]) -> Optional[str]:
        for child in node.children:
            if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.For, cst.While)):
                continue  # another scope, or an inner loop's own break
            if isinstance(child, (cst.Break, cst.Return)):
                if not tests or any({n.value for n in findall(t, m.Name())} & bound for t in tests):  # type: ignore[attr-defined]
                    return "break" if isinstance(child, cst.Break) else "return"
                continue
            found = walk(child, (*tests, child.test) if isinstance(child, cst.If) else tests)
            if found is not None:
                return found
        return None
    return walk(loop.body, ())


def _metric(stmt: cst.BaseStatement) -> bool:
    """A statement that counts (``+=``) or collects (``append``/``add_batch``/...), or holds one."""
    return bool(findall(stmt, m.AugAssign() | _METRIC_CALLS))


def _targets(assign: cst.Assign) -> set[str]:
    return {n for t in assign.targets for n in assigned_names(t.target)}


def _branch_assigns(stmt: cst.BaseStatement) -> list[cst.Assign]:
    """The assignments inside an ``if``/``else`` or ``try`` of the loop body, whose values the loop computes too."""
    return list(findall(stmt, m.Assign())) if isinstance(stmt, (cst.If, cst.Try)) else []  # type: ignore[arg-type]


def _hoistable(visitor: cst.MetadataDependent, rows: list, metric: int, plan: Plan) -> Optional[tuple[cst.Call, int, int]]:
    """The one model call of the loop before its first metric, inside a line that is no ``output = model(...)``
    (ODE-Net's ``predicted_class = np.argmax(model(x).cpu().detach().numpy(), axis=1)``, after ``y = one_hot(
    np.array(y.numpy()), 10)``): (the call, its line, the line the gather goes before). The gather goes right after
    the last line that binds what the call reads, the outputs taken there from the call (the same inputs, the
    same model: the lines in between only bind other names), so that it pairs them with the batch as the
    loop drew it, before a line turns the labels into something else. None when there is no such one call, or
    the lines in between are not plain statements of the same block."""
    found = [(i, c) for i, (_, stmt) in enumerate(rows[:metric]) for c in findall(stmt, m.Call())
             if ref_of(visitor, c.func) in plan.flow["model"]]  # type: ignore[attr-defined]
    if len(found) != 1 or simple_assign(rows[found[0][0]][1]) is None:
        return None
    line, call = found[0]
    reads = {n.value for n in findall(call, m.Name())}  # type: ignore[attr-defined]
    at = 1 + max((i for i, (_, stmt) in enumerate(rows[:line]) if _binds(stmt) & reads), default=-1)
    if any(rows[i][0] is not rows[line][0] or not isinstance(rows[i][1], cst.SimpleStatementLine)
           for i in range(at, line + 1)):
        return None
    return call, line, at  # type: ignore[return-value]


def _on_the_host(rows: list, names: set[str]) -> bool:
    """Is one of ``names`` last bound, among ``rows``, to a NumPy array or Python values (``y = y.numpy()``,
    ``p = out.argmax(1).cpu().numpy()``, ``.tolist()``, ``.item()``)?"""
    last: dict[str, cst.BaseExpression] = {}
    for _, stmt in rows:
        assign = simple_assign(stmt)
        for name in _targets(assign) if assign is not None else ():
            last[name] = assign.value  # type: ignore[union-attr]
    host = m.Call(func=m.Attribute(attr=m.Name("numpy") | m.Name("tolist") | m.Name("item")))
    return any(name in last and m.matches(last[name], host) for name in names)


def _binds(stmt: cst.BaseStatement) -> set[str]:
    assign = simple_assign(stmt)
    return _targets(assign) if assign is not None else {n for a in _branch_assigns(stmt) for n in _targets(a)}


def _reads(stmt: cst.CSTNode, skip: frozenset[int] | set[int] = frozenset()) -> set[str]:
    """The names ``stmt`` reads, but those in ``skip`` (ids): not an attribute's name (``output.data``, which
    took the batch `data` along into the gather) nor a keyword (``size_average=``)."""
    skip = set(skip) | {id(a.attr) for a in findall(stmt, m.Attribute())} | {  # type: ignore[attr-defined]
        id(a.keyword) for a in findall(stmt, m.Arg()) if a.keyword is not None}  # type: ignore[attr-defined]
    return {n.value for n in findall(stmt, m.Name()) if id(n) not in skip}  # type: ignore[attr-defined]


_LIBRARIES = ("torch.", "numpy.", "builtins.", "math.", "scipy.", "sklearn.")


def _unfollowed_model_call(visitor: cst.MetadataDependent, rows, derived: set, metric: cst.CSTNode) -> Optional[str]:
    """The call, as code (``model(inputs)``), whose result the loop's first metric reads (directly or through
    what is computed from it: PointNet's ``pred, _ = classifier(points)``, then ``pred_choice = pred.max(1)[1]``):
    ``outputs = f(...)`` handed what the batch holds, of a model accelify does not follow."""
    calls: dict[str, set[str]] = {}  # call's code -> the names computed from its result
    for _, stmt in rows:
        if stmt is metric:
            break
        assign = simple_assign(stmt)
        if assign is None:
            continue
        value, read, targets = _model_call(assign.value), _reads(assign.value), _targets(assign)
        for names in calls.values():
            if read & names:
                names |= targets
        if isinstance(value, cst.Call) and any(_reads(a.value) & derived for a in value.args) and not any(
                n.startswith(_LIBRARIES) for n in qualified_names(visitor, value.func)):  # (a loss, `torch.sigmoid`)
            calls.setdefault(cst.Module(body=[]).code_for_node(value), set()).update(targets)
    used = _reads(metric)
    return next((code for code, names in calls.items() if names & used), None)


def find_gather(visitor: cst.MetadataDependent, loop: cst.For, plan: Plan) -> Union[Gather, Refusal, str, None]:
    """An evaluation loop over a prepared dataloader whose metrics read the model's outputs.

    The gather goes right before the first statement that no longer keeps one row per
    sample (a loss, a ``.item()``, the metric itself), and takes what the statements from
    there on read of the batch and the outputs: ``predictions`` and ``batch["labels"]``, the
    tensors themselves, never a whole output object or a whole batch dict.

    ``None`` when the loop trains (calls ``.backward()``), already gathers, or has no
    metric; the reason as a string when its metrics cannot be gathered that way.
    """
    if ref_of(visitor, peel_iterable(visitor, loop.iter)) not in plan.flow["loader"]:
        return None
    if findall(loop.body, m.Attribute(attr=m.Name("backward") | m.Name("gather_for_metrics"))) or _gathers(loop, plan):
        return None
    rows = list(_statements(loop.body))
    derived = set(assigned_names(loop.target)) - enumerate_counter(loop)  # anything computed from the batch
    defined_at: dict[str, int] = {n: -1 for n in derived}
    call_at = None
    for position, (_, stmt) in enumerate(rows):
        assign = simple_assign(stmt)
        if assign is None:
            for nested in _branch_assigns(stmt):  # `if "vit" in args.arch: output = ... else: output = model(inp)`
                if _reads(nested.value) & derived:
                    for n in _targets(nested):
                        derived.add(n)
                        defined_at.setdefault(n, position)
            continue
        targets = _targets(assign)
        if _reads(assign.value) & derived:
            derived |= targets
            for n in targets:
                defined_at.setdefault(n, position)
        value = _model_call(assign.value)
        if call_at is None and isinstance(value, cst.Call) and ref_of(visitor, value.func) in plan.flow["model"]:
            call_at = position
    # not a `with` whose statements are rows of their own: its metric is the row inside it
    metrics = [i for i, (_, s) in enumerate(rows) if not _opened(s) and _metric(s) and _reads(s) & derived]
    if not metrics:
        return None
    if plan.batch_sampler is not None:
        return (f"the loader's batches come from a batch sampler of its own (`{plan.batch_sampler}`): each batch is a "
                "unit it builds (an episode), and gathered, the batches of every process would be scored as one")
    exit_ = _early_exit(loop)
    if exit_ is not None:
        return (f"the loop can stop before the end of the loader (`{exit_}`): over a prepared loader each process "
                "stops after so many batches of its own shard, so the gathered metrics would cover another set of "
                "samples (N times as many batches, or each process's last ones)")
    inline = None  # `correct += (model(x).argmax(1) == y).sum()`: the model runs inside the metric
    if call_at is None or metrics[0] < call_at:
        calls = [c for c in findall(rows[metrics[0]][1], m.Call())
                 if ref_of(visitor, c.func) in plan.flow["model"]]  # type: ignore[attr-defined]
        hoisted = _hoistable(visitor, rows, metrics[0], plan) if len(calls) != 1 and call_at is None else None
        if hoisted is not None:
            inline, call_at, at = hoisted  # ODE-Net's `np.argmax(model(x).cpu().numpy(), 1)`, labels made NumPy first
        elif len(calls) != 1:
            if call_at is None:
                unfollowed = _unfollowed_model_call(visitor, rows, derived, rows[metrics[0]][1])
                if unfollowed is not None:  # FixMatch's `test(args, test_loader, ema_model.ema, epoch)`
                    return (f"they read the batch and the outputs of `{unfollowed}`, which accelify does not follow "
                            "to a prepared model (it is not the model the script trains, or not only), so it has no "
                            "outputs it can gather")
                branched = next((st for _, st in rows[:metrics[0] + 1] if isinstance(st, (cst.If, cst.Try)) and any(
                    ref_of(visitor, c.func) in plan.flow["model"] for c in findall(st, m.Call()))), None)  # type: ignore[attr-defined]
                if branched is not None:  # `if config['deep_supervision']: outputs = model(x) ... else: output = model(x)`
                    return (f"the model runs inside `{_head(branched)}` (in its branches), and accelify places a "
                            "gather only after an `output = model(...)` line of the loop's own body")
                return "they read the batch, but no `output = model(...)` line gives accelify the outputs to gather"
            return "a metric reads the batch before the model's outputs exist, so no one gather can pair them"
        else:
            inline, call_at, at = calls[0], metrics[0], metrics[0]
    else:
        at = call_at + 1
        while at < len(rows) and not _metric(rows[at][1]) and (a := simple_assign(rows[at][1])) is not None and _per_sample(a.value):
            at += 1
    if at >= len(rows):
        return None

    def chosen(inline: Optional[cst.Call], at: int) -> tuple[list[cst.BaseStatement], set[int], set[str], list[str]]:
        """What the statements from ``at`` on read of the batch and the outputs: (those statements, the ids of
        the inline call's names, the names the metrics need, the names gathered)."""
        later = [s for _, s in rows[at:]]
        skip = {id(n) for n in findall(inline, m.Name())} if inline is not None else set()  # its inputs stay
        # What the metrics read, directly or through the statements between (`mse = criterion(out, y)`).
        needed = {n for s in later if _metric(s) for n in _reads(s, skip)}
        for s in reversed(later):
            inner = simple_assign(s)
            for assign in reversed([inner] if inner is not None else _branch_assigns(s)):  # `if wide: acc1, acc5 = ...`
                if _targets(assign) & needed:
                    needed |= _reads(assign.value, skip)
        order = _first_use(later, derived)
        # outputs first, then labels: `predictions, references = ...` as in the Accelerate docs
        return later, skip, needed, sorted((n for n in derived & needed if defined_at.get(n, len(rows)) < at),
                                           key=lambda n: (defined_at[n] < call_at, order(n)))

    later, skip, needed, gathered = chosen(inline, at)
    if inline is None and _on_the_host(rows[:at], set(gathered)):
        # `predicted = model(x).argmax(1).cpu().numpy()` after `y = y.numpy()`: gathered there, they would be NumPy
        # arrays, which no gather takes; the outputs are taken where the batch still is what the loop drew
        hoisted = _hoistable(visitor, rows, metrics[0], plan)
        if hoisted is None:
            return ("the values they read are NumPy arrays (or Python numbers) by then, which `gather_for_metrics` "
                    "cannot gather, and the model's outputs cannot be taken before that")
        inline, call_at, at = hoisted
        later, skip, needed, gathered = chosen(inline, at)
    block, statement = rows[at]
    if any(
        ref_of(visitor, c.func) in plan.flow["model"] and c is not inline  # type: ignore[attr-defined]
        for s in later for c in findall(s, m.Call())
    ):
        return "the model runs again after the values the metrics read, so no one gather can cover both"
    # Gathered values grow N-fold: code other than the metrics that reads them (`recon.view(batch_size, ...)`
    # to save a sample image) would get a batch of another shape.
    def feeds_metrics(s: cst.BaseStatement) -> bool:
        """A metric, a print, a value a metric reads, or an ``if`` on something not gathered
        (DINO's ``if linear_classifier.module.num_labels >= 5:``) around only those."""
        inner = simple_assign(s)
        if isinstance(s, cst.If) and _reads(s.test) & set(gathered):
            return False  # `if out.shape[0] == 8:`: gathered, it tests every process's rows
        if _metric(s) or (inner is not None and _targets(inner) & needed):
            return True
        if m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Name("print")))])):
            return True
        if isinstance(s, cst.If) and isinstance(s.body, cst.IndentedBlock):
            branch = s.orelse.body if isinstance(s.orelse, cst.Else) else s.orelse
            return all(feeds_metrics(x) for x in s.body.body) and (branch is None or (
                feeds_metrics(branch) if isinstance(branch, cst.If) else isinstance(branch, cst.IndentedBlock)
                and all(feeds_metrics(x) for x in branch.body)))
        return False

    for s in _outermost(later):
        if feeds_metrics(s):
            continue
        used = sorted(_reads(s) & set(gathered))
        if used:
            what = ", ".join(f"`{n}`" for n in used)
            code = cst.Module(body=[]).code_for_node(s).strip()
            if isinstance(s, cst.BaseCompoundStatement):
                line = code.splitlines()[0]  # its header: `if i == 0:`
            else:  # a call over several lines, on one
                line = re.sub(r"([(\[{])\s+|\s+(?=[)\]}])", r"\1", " ".join(code.split()))
                line = line if len(line) <= 80 else line[:77] + "..."
            return (f"the values they read ({what}) are also read by `{line}`, which accelify does not take for a "
                    "metric; gathered, they would hold every process's samples there too (another shape)")
    # `output[1:]` of a gathered tensor: its first dimension holds every process's rows one after the
    # other (or is time, not samples: seq2seq's `[trg length, batch size]`), and a slice of it is not
    # the slice of one process.
    for s in later:
        for sub in findall(s, m.Subscript(value=m.Name())):
            first = sub.slice[0].slice  # type: ignore[attr-defined]
            if sub.value.value in gathered and isinstance(first, cst.Slice) and (  # type: ignore[attr-defined]
                first.lower is not None or first.upper is not None
            ):
                code = cst.Module(body=[]).code_for_node(sub)
                return (f"they slice the first dimension of `{sub.value.value}` (`{code}`): gathered, it holds "  # type: ignore[attr-defined]
                        "every process's rows one after the other (or it is not the sample dimension at all, "
                        "as in time-major sequences), so the slice would take other values")
    # `total += model(x, y).item()`: the output is one number per batch (a loss the model computes); gathered,
    # it holds one per process, and `.item()` of it raises
    single = [c for s in later for c in findall(s, m.Call(func=m.Attribute(attr=m.Name("item"))))
              if c.func.value is inline or (isinstance(c.func.value, cst.Name)  # type: ignore[attr-defined]
                                            and c.func.value.value in gathered)]  # type: ignore[attr-defined]
    if single:
        code = cst.Module(body=[]).code_for_node(single[0])
        return (f"they read `{code}`: one number per batch (a loss the model computes), which gathered holds one "
                "number per process, and `.item()` of that raises")
    across = _across_samples([s for _, s in rows[call_at:]], derived)
    if across is not None:
        return across
    mean = _batch_means_over_samples(visitor, loop, later, set(gathered))
    if mean is not None:
        return mean
    names: list[str] = []
    values: list[str] = []
    nodes: list[Optional[cst.CSTNode]] = []
    replace: dict[int, str] = {}
    keywords = {id(a.keyword) for a in findall(loop, m.Arg(keyword=m.Name()))}  # type: ignore[attr-defined]
    taken = {n.value for n in findall(loop, m.Name()) if id(n) not in keywords} | set(_scope_names(visitor, loop))  # type: ignore[attr-defined]
    if inline is not None:
        new = _fresh(visitor, [inline], taken)
        taken.add(new)
        names.append(new)
        values.append(cst.Module(body=[]).code_for_node(inline))
        nodes.append(inline)
        replace[id(inline)] = new
    for name in gathered:
        reads = [n for s in _outermost(later) for n in findall(s, m.Name(name)) if id(n) not in skip]
        parts: dict[str, list[cst.CSTNode]] = {}
        whole = False
        for read in reads:
            part = _part_of(visitor, read)
            if part is None:
                whole = True
            else:
                parts.setdefault(cst.Module(body=[]).code_for_node(part), []).append(part)
        if not parts:
            names.append(name)
            values.append(name)
            nodes.append(None)
            continue
        if whole:
            code = next(iter(parts))
            return (f"they read `{name}` whole and a part of it (`{code}`): gathering the whole object would send "
                    "every input and can fail on a non-tensor output")
        for code, found in parts.items():
            new = _fresh(visitor, found, taken)
            taken.add(new)
            names.append(new)
            values.append(code)
            nodes.append(None)
            replace.update({id(n): new for n in found})
    if not names:
        return "they read values computed from the batch that accelify cannot trace to the model's outputs"
    return Gather(block, statement, names, values, replace, nodes)


_FUNCTIONAL = "torch.nn.functional."


def _reduction(call: cst.Call) -> Optional[str]:
    """The ``reduction=`` a loss call or construction names (``size_average=False``: "sum"), else None."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            return string_value(arg.value) or "?"
        if arg.keyword is not None and arg.keyword.value == "size_average" and m.matches(arg.value, m.Name("False")):
            return "sum"
    return None


def _mean_loss(visitor: cst.MetadataDependent, call: cst.Call) -> bool:
    """``F.cross_entropy(out, y)`` or ``criterion(out, y)`` with ``criterion = nn.CrossEntropyLoss()``:
    a loss that averages over the batch (the default reduction)."""
    names = qualified_names(visitor, call.func)
    if any(n.startswith(_FUNCTIONAL) and n.endswith(("loss", "entropy", "kl_div")) for n in names):
        return _reduction(call) in (None, "mean")
    if not isinstance(call.func, cst.Name) or _reduction(call) is not None:
        return False
    made = assigned_values(visitor, call.func)
    return len(made) == 1 and isinstance(made[0], cst.Call) and _reduction(made[0]) in (None, "mean") and any(
        n.startswith("torch.nn.") and n.endswith("Loss") for n in qualified_names(visitor, made[0].func))


def _batch_means_over_samples(visitor: cst.MetadataDependent, loop: cst.For, later: Sequence[cst.BaseStatement],
                              gathered: set[str]) -> Optional[str]:
    """``test_loss += criterion(output, target).item()`` over gathered values, then ``test_loss /=
    len(test_loader.dataset)``: each per-batch mean is over N times as many samples and the loop runs
    1/N as many times, so the loss divided by the number of samples is 1/N of the one-process value.
    (Divided by the number of batches, it is the mean of the batch means, as in one process.)"""
    sums = {}
    means: dict[str, cst.Call] = {}  # `loss = criterion(outputs, labels)`, then `test_loss += loss.item()`
    for statement in later:
        assign = simple_assign(statement)
        if assign is not None:
            calls = [c for c in findall(assign.value, m.Call()) if _mean_loss(visitor, c)]  # type: ignore[attr-defined]
            if calls and _reads(calls[0]) & gathered:
                means.update(dict.fromkeys(_targets(assign), calls[0]))
        for step in findall(statement, m.AugAssign(operator=m.AddAssign(), target=m.Name())):
            calls = [c for c in findall(step.value, m.Call()) if _mean_loss(visitor, c)]  # type: ignore[attr-defined]
            if calls and _reads(calls[0]) & gathered:
                sums[step.target.value] = calls[0]  # type: ignore[attr-defined]
            elif isinstance(step.value, cst.Call) and m.matches(step.value.func, m.Attribute(value=m.Name(), attr=m.Name("item"))) \
                    and step.value.func.value.value in means:  # type: ignore[attr-defined]
                sums[step.target.value] = means[step.value.func.value.value]  # type: ignore[attr-defined]
    if not sums:
        return None
    root: cst.CSTNode = enclosing_function(visitor, loop) or loop
    while not isinstance(root, (cst.FunctionDef, cst.Module)):
        root = visitor.get_metadata(ParentNodeProvider, root)
    samples = {n for a in findall(root, m.Assign()) if findall(a.value, _DATASET_LENGTH)  # type: ignore[attr-defined]
               for t in a.targets for n in assigned_names(t.target)}  # type: ignore[attr-defined]
    for division in findall(root, m.AugAssign(operator=m.DivideAssign()) | m.BinaryOperation(operator=m.Divide())):
        total = division.target if isinstance(division, cst.AugAssign) else division.left  # type: ignore[attr-defined]
        by = division.value if isinstance(division, cst.AugAssign) else division.right  # type: ignore[attr-defined]
        if isinstance(total, cst.Name) and total.value in sums and (
                findall(by, _DATASET_LENGTH) or (isinstance(by, cst.Name) and by.value in samples)):
            loss = cst.Module(body=[]).code_for_node(sums[total.value])
            return Refusal(
                f"`{total.value}` adds up per-batch means (`{loss}` averages over the batch) and is divided by the "
                "number of samples: over gathered batches each mean covers every process's samples and the loop "
                "runs 1/N as many times, so the printed loss would be 1/N of the one-process value. File not "
                "converted.",
                "add up sums (`reduction=\"sum\"`) to divide by the number of samples, or divide the sum of the "
                "means by the number of batches; then convert again.",
            )
    return None


_DATASET_LENGTH = m.Call(func=m.Name("len"), args=[m.Arg(m.Attribute(attr=m.Name("dataset")))])


#: What a script already on Accelerate calls to collect its metrics itself.
_ACCELERATE_ONLY = frozenset({"pad_across_processes", "gather_object"})
_ACCELERATOR_METHODS = frozenset({"gather", "reduce"})


def _gathers(loop: cst.For, plan: Plan) -> bool:
    """The loop collects across processes itself (``accelerator.gather(...)``,
    ``accelerator.pad_across_processes(...)``: the course's token classification): a second gather
    would count every sample N times over."""
    spellings = {plan.accelerator, "accelerator", "self.accelerator"}
    for node in findall(loop.body, m.Attribute()):
        attr = node.attr.value  # type: ignore[attr-defined]
        if attr in _ACCELERATE_ONLY:
            return True
        receiver = node.value  # type: ignore[attr-defined]
        spelled = receiver.value if isinstance(receiver, cst.Name) else (
            f"self.{receiver.attr.value}" if m.matches(receiver, m.Attribute(value=m.Name("self"))) else None)
        if attr in _ACCELERATOR_METHODS and spelled in spellings:
            return True
    return False


def _part_of(visitor: cst.MetadataDependent, name: cst.Name) -> Optional[cst.BaseExpression]:
    """``outputs.logits`` / ``batch["labels"]`` around this read of ``outputs`` / ``batch``, if it is one."""
    parent = visitor.get_metadata(ParentNodeProvider, name, None)
    if isinstance(parent, cst.Attribute) and parent.value is name:
        if parent.attr.value in _TENSOR_ATTRIBUTES:
            return None
        grand = visitor.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(grand, cst.Call) and grand.func is parent:
            return None  # a method of the tensor: `labels.size(0)`
        return parent
    if (isinstance(parent, cst.Subscript) and parent.value is name and len(parent.slice) == 1
            and m.matches(parent.slice[0], m.SubscriptElement(m.Index(m.SimpleString())))):
        return parent
    return None


def _fresh(visitor: cst.MetadataDependent, nodes: list[cst.CSTNode], taken: set[str]) -> str:
    """A name for a gathered part: the keyword it is passed as (`references=batch["labels"]`), else
    its key or attribute (`labels`, `logits`)."""
    first = nodes[0]
    parent = visitor.get_metadata(ParentNodeProvider, first, None)
    candidates = []
    if isinstance(parent, cst.Arg) and parent.keyword is not None:
        candidates.append(parent.keyword.value)
    if isinstance(first, cst.Attribute):
        candidates.append(first.attr.value)
    elif isinstance(first, cst.Subscript):
        key = string_value(first.slice[0].slice.value)  # type: ignore[attr-defined]
        if key is not None and key.isidentifier():
            candidates.append(key)
    for name in candidates:
        if name.isidentifier() and not keyword.iskeyword(name) and name not in taken:
            return name
    if isinstance(first, cst.Call) and "outputs" not in taken:
        return "outputs"
    base = candidates[0] if candidates else "outputs" if isinstance(first, cst.Call) else "value"
    i = 0
    while f"gathered_{base}{i or ''}" in taken:
        i += 1
    return f"gathered_{base}{i or ''}"


def _scope_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> list[str]:
    scope = visitor.get_metadata(ScopeProvider, node, None)
    out: list[str] = []
    while scope is not None:
        out.extend(a.name for a in scope.assignments)
        parent = getattr(scope, "parent", None)
        scope = None if parent is scope or isinstance(scope, GlobalScope) else parent
    return out


def _outermost(statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """``statements`` without those nested in another of them (a `with` and its body)."""
    inner = {id(n) for s in statements for n in findall(s, m.SimpleStatementLine() | m.BaseCompoundStatement()) if n is not s}
    return [s for s in statements if id(s) not in inner]


def _model_call(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``model(x).logits``, ``model(a, b).squeeze()`` -> ``model(...)``: the call that makes the output."""
    while True:
        if isinstance(expr, cst.Attribute):
            expr = expr.value
        elif isinstance(expr, cst.Call) and m.matches(expr.func, m.Attribute(value=m.Call() | m.Attribute(value=m.Call()))):
            expr = expr.func.value  # type: ignore[attr-defined]
        else:
            return expr  # `model(x)`, `self.model(x)`


def _first_use(statements: list[cst.BaseStatement], names: set[str]):
    order: dict[str, int] = {}
    for s in statements:
        for node in findall(s, m.Name()):
            if node.value in names:  # type: ignore[attr-defined]
                order.setdefault(node.value, len(order))  # type: ignore[attr-defined]
    return lambda name: order.get(name, len(order))


def _opened(stmt: cst.BaseStatement) -> bool:
    """A ``with`` whose statements :func:`_statements` lists as rows of their own."""
    return isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock)


def _statements(block: cst.BaseSuite) -> Sequence[tuple[cst.IndentedBlock, cst.BaseStatement]]:
    """The loop body's statements, with those of a ``with`` directly in it (``with torch.no_grad():``)."""
    out: list[tuple[cst.IndentedBlock, cst.BaseStatement]] = []
    if not isinstance(block, cst.IndentedBlock):
        return out
    for stmt in block.body:
        out.append((block, stmt))
        if isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock):
            out.extend(_statements(stmt.body))
    return out


def _head(statement: cst.BaseStatement) -> str:
    """``if config['deep_supervision']:``, ``try:``: the first line of a compound statement."""
    if isinstance(statement, cst.If):
        return f"if {code_of(statement.test)}:"
    return "try:"
