"""Evaluation and batch-inference scripts: the models a file without an optimizer runs over a DataLoader.

A file that trains nothing (no optimizer, no backward) but builds or loads a model and calls it
on the batches of a DataLoader is an evaluation script: the model and the loaders are prepared
(the model with ``prepare_model(..., evaluation_mode=True)``: no DDP wrapper for a model that
never trains), placements go as in a training script, and the metrics gather as they do after
training.  The loop may be in a helper the setup scope hands the model and the loader
(``evaluate(model, test_loader, device)``): its parameters are followed back through every call.

A model is a name bound to a call in the setup scope, called (or its ``generate``) inside a loop
over a DataLoader, that the file treats as a module: ``.eval()``, ``.to(...)``, ``.cuda()``,
``.load_state_dict(...)``, ``.half()`` on it, or a value built by one of those.  A loss module or
a tokenizer called in the loop is none of those.

Input: the facts (loops, assignments, call sites).  Output: the models, in the shape
:func:`accelify.analyses.objects.optimizers` gives the optimizers (the assignment that builds
each, and the model expression itself), so that the setup scope, the objects and the prepare
point are decided as for training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts, chain_root, param_names
from accelify.analyses.objects import Optimizers, _helper_loader
from accelify.queries.blocks import binds, iter_statements, simple_assign
from accelify.queries.loops import peel_iterable
from accelify.queries.names import DATALOADERS, assigned_names, code_of, has_qname, qualified_names
from accelify.queries.refs import Ref, assigned_values, key_at, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

#: methods only a module (the model) is given in a script: the evidence that a called name is a model
MODULE_METHODS = frozenset({"eval", "to", "cuda", "load_state_dict", "half", "bfloat16", "requires_grad_"})
#: calls on the model inside the loop that run it
_RUNS = frozenset({"generate", "forward"})


def models(facts: Facts) -> tuple[Optimizers, list[cst.For]]:
    """The models the file evaluates over a DataLoader or a plain list, by the ref of the name that
    builds them in the setup scope: ``{ref: (assignment, [model expression])}``, empty when there are
    none; and the loops over plain lists that run one of them (inference over prompts, file names)."""
    found: Optimizers = {}
    lists: list[cst.For] = []
    for loop in facts.loops:
        iterable = ref_of(facts, peel_iterable(facts, loop.iter))
        loader = _origin(facts, iterable, 0)
        over_list = loader is not None and loader[0] == iterable[0] and plain_list(facts, loop) is not None  # type: ignore[index]
        if loader is None or not (over_list or _is_loader(facts, loader)):
            continue
        for call in findall(loop.body, m.Call()):
            model = _origin(facts, ref_of(facts, run_model(call)), 0) if run_model(call) is not None else None
            if model is None or model[0] != loader[0]:
                continue
            assign = _built(facts, model)
            if assign is None or not _is_module(facts, model):
                continue
            found.setdefault(model, (assign, [assign.targets[0].target]))
            if over_list and loop not in lists:
                lists.append(loop)
    return found, lists


def run_model(call: cst.CSTNode) -> Optional[cst.Name]:
    """``model(x)`` / ``model.generate(x)``: the name of what runs, else None."""
    func = call.func  # type: ignore[attr-defined]
    if isinstance(func, cst.Attribute) and func.attr.value in _RUNS:
        func = func.value
    return func if isinstance(func, cst.Name) else None


#: calls whose value is a new list, read from nothing else
_LIST_CALLS = frozenset({"builtins.list", "builtins.sorted", "glob.glob", "os.listdir"})


def plain_list(visitor: cst.MetadataDependent, loop: cst.For) -> Optional[cst.Name]:
    """``for prompt in prompts:`` over a name bound (every time, in its scope) to a list: a literal, a
    comprehension, ``list(...)``/``sorted(...)``, ``text.splitlines()``, ``f.readlines()``."""
    if not isinstance(loop.iter, cst.Name):
        return None
    values = assigned_values(visitor, loop.iter)
    if not values:
        return None
    for value in values:
        if isinstance(value, (cst.List, cst.ListComp)):
            continue
        if isinstance(value, cst.Call) and (
                qualified_names(visitor, value.func) & _LIST_CALLS
                or m.matches(value.func, m.Attribute(attr=m.Name("splitlines") | m.Name("readlines")))):
            continue
        return None
    return loop.iter


def _origin(facts: Facts, ref: Optional[Ref], depth: int) -> Optional[Ref]:
    """Where the object at ``ref`` is bound by an assignment: ``ref`` itself, or for a parameter of a
    module-level function the one ref every call of it passes there."""
    if ref is None or depth > 4:
        return None
    func = facts.functions.get(ref[0])
    if func is None or ref[1] not in param_names(func):
        return ref if ref in facts.assigns else None
    sites = facts.call_sites(ref[0], func)
    origins = {_origin(facts, ref_of(facts, bound[ref[1]]), depth + 1) if ref[1] in bound else None
               for _, bound in sites}
    return origins.pop() if len(origins) == 1 else None


def _is_loader(facts: Facts, ref: Ref) -> bool:
    assigns = facts.assigns.get(ref, [])
    if assigns and all(isinstance(a.value, cst.Call) and has_qname(facts, a.value.func, DATALOADERS)
                       and facts.single_target(a) == ref for a in assigns):
        return True
    return bool(assigns) and all(_helper_loader(facts, a, ref) for a in assigns)


def _built(facts: Facts, ref: Ref) -> Optional[cst.Assign]:
    """The assignment that builds the model: the first of ``ref``'s, a call to one target."""
    for assign in facts.assigns.get(ref, []):
        if isinstance(assign.value, cst.Call) and facts.single_target(assign) == ref:
            return assign
    return None


def _is_module(facts: Facts, ref: Ref) -> bool:
    """The file treats ``ref`` as a module: a module method is called on it, or its value is built
    by one (``Net().to(device)``)."""
    for assign in facts.assigns.get(ref, []):
        value = assign.value
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            if value.func.attr.value in MODULE_METHODS:
                return True
            value = value.func.value
    for call in facts.calls:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODULE_METHODS:
            if ref_of(facts, chain_root(func.value)) == ref:
                return True
    return False


_APPENDS = frozenset({"append", "extend"})
_EXITS = m.Break() | m.Return() | m.Yield() | m.Global() | m.Nonlocal() | m.Await()


def accumulators(loop: cst.For) -> list[str]:
    """The lists the loop collects its results in (``completions.append(...)``), in order."""
    out: list[str] = []
    for call in findall(loop.body, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()))):
        func = call.func  # type: ignore[attr-defined]
        if func.attr.value in _APPENDS and func.value.value not in out:
            out.append(func.value.value)
    return out


def split_problem(visitor: cst.MetadataDependent, loop: cst.For, block: cst.BaseSuite | cst.Module) -> Optional[str]:
    """Why splitting ``loop`` between the processes (each runs a contiguous share of the list, the
    lists it fills gathered back in order with ``gather_object``) might not give the same result;
    None when it gives the same: the body computes each item's results from the item alone and
    only appends them to lists made empty right before the loop (``block`` holds the loop)."""
    if loop.orelse is not None:
        return "it has an `else:`"
    if not m.matches(loop.target, m.Name() | m.Tuple(elements=[m.ZeroOrMore(m.Element(m.Name()))])):
        return f"its target `{code_of(loop.target)}` is not a plain name"
    exits = findall(loop.body, _EXITS)
    if exits:
        return f"it stops or leaves early (`{code_of(exits[0]).split()[0]}`): where depends on the items before"
    lists = accumulators(loop)
    if not lists:
        return "it collects no results in a list"
    local: set[str] = set()
    for stmt, _ in iter_statements(loop.body):  # type: ignore[arg-type]
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.AugAssign):
                return (f"`{code_of(small).strip()}` adds up across the items: each process would add up its "
                        "own share")
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if not m.matches(target.target, m.Name() | m.Tuple(elements=[m.ZeroOrMore(m.Element(m.Name()))])):
                        return f"it assigns `{code_of(target.target)}`, which outlives the item"
                    local.update(n.value for n in findall(target.target, m.Name()))  # type: ignore[attr-defined]
            elif isinstance(small, cst.Expr):
                call = small.value
                if not (isinstance(call, cst.Call) and m.matches(call.func, m.Attribute(value=m.Name(), attr=m.Name()))
                        and call.func.attr.value in _APPENDS and call.func.value.value in lists):  # type: ignore[attr-defined]
                    return (f"`{code_of(small).strip()}` runs for its effect (printing, writing, updating state), "
                            "which would happen on each process for its share only, in another order")
            elif not isinstance(small, (cst.Pass, cst.Continue)):
                return f"`{code_of(small).strip()}` is more than computing a result"
    reads = [n for n in findall(loop.body, m.Name()) if n.value in lists]  # type: ignore[attr-defined]
    receivers = {id(c.func.value) for c in findall(loop.body, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name())))  # type: ignore[attr-defined]
                 if c.func.attr.value in _APPENDS}  # type: ignore[attr-defined]
    read = next((n for n in reads if id(n) not in receivers), None)
    if read is not None:
        return f"it reads `{read.value}` (the results so far) while it fills it"  # type: ignore[attr-defined]
    body = list(block.body)
    index = next(i for i, s in enumerate(body) if s is loop)
    for name in lists:
        made = [i for i, s in enumerate(body[:index]) if binds(s, {name})]
        empty = made and m.matches(body[made[-1]], m.SimpleStatementLine(body=[m.Assign(value=m.List(elements=[]))]))
        if not empty or any(name in {n.value for n in findall(s, m.Name())} for s in body[made[-1] + 1:index]):  # type: ignore[attr-defined]
            return f"`{name}` is not a list made empty right before the loop"
    local.update(n.value for n in findall(loop.target, m.Name()))  # type: ignore[attr-defined]
    kept = _read_before_bound(body[index + 1:], local - set(lists))
    if kept is not None:
        return f"`{kept}` is read after the loop, where it would hold the last item of one process's share"
    return None


def _read_before_bound(statements: list[cst.BaseStatement], names: set[str]) -> Optional[str]:
    """The first of ``names`` the statements read before binding it again (``for prompt, out in
    zip(...)`` binds ``prompt`` before its body reads it), or None."""
    names = set(names)
    for stmt in statements:
        assign = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if isinstance(stmt, cst.For):
            first, target, rest = stmt.iter, stmt.target, [stmt.body, stmt.orelse]
        elif isinstance(assign, cst.Assign):
            first, target, rest = assign.value, cst.Tuple([cst.Element(t.target) for t in assign.targets]), []
        else:
            first, target, rest = stmt, None, []
        read = next((n.value for n in findall(first, m.Name()) if n.value in names), None)  # type: ignore[attr-defined]
        if read is not None:
            return read
        if target is not None:
            names -= {n.value for n in findall(target, m.Name())}  # type: ignore[attr-defined]
        read = next((n.value for part in rest if part is not None for n in findall(part, m.Name())
                     if n.value in names), None)  # type: ignore[attr-defined]
        if read is not None:
            return read
    return None


def splits(facts: Facts, plan: Plan, loops: list[cst.For]) -> bool:
    """``plan.split_lists``: the lists whose loops each process runs a share of; False (ACC132) when a
    loop over a list that runs a model cannot be split with the same result."""
    for loop in loops:
        block = facts.get_metadata(ParentNodeProvider, loop, None)
        why = split_problem(facts, loop, block) if isinstance(block, (cst.IndentedBlock, cst.Module)) else (
            "it is not a statement of a plain block")
        if why is not None:
            facts.finding(
                plan, loop, "ACC132",
                f"inference over the list `{code_of(loop.iter)}` cannot be split between the processes with the "
                f"same result: {why}. File not converted.",
                "compute each item's results from the item alone and collect them in lists made empty before "
                "the loop (print or write them after it); or split it by hand with "
                "`with accelerator.split_between_processes(items) as shard:` and `gather_object`.",
            )
            return False
        if loop.iter.value not in plan.split_lists:  # type: ignore[attr-defined]
            plan.split_lists.append(loop.iter.value)  # type: ignore[attr-defined]
    return True


def unrecognised(facts: Facts, plan: Plan) -> None:
    """ACC133: a script that builds a DataLoader and puts a model in eval mode, but whose model and
    loader accelify cannot pair in one loop (the loader in a dict, or built in the helper the model
    is handed to, the model called through another object): not converted, and said so.  A module
    that only defines (a library, nothing runs at import) stays silent."""
    if not (facts.is_script or _runs_at_import(facts.module)):
        return
    loaders = [c for c in facts.calls if has_qname(facts, c.func, DATALOADERS)]
    evaluates = any(m.matches(c.func, m.Attribute(attr=m.Name("eval"))) and not c.args for c in facts.calls)
    if not loaders or not evaluates:
        _unsplit_loop(facts, plan)
        return
    facts.finding(
        plan, loaders[0], "ACC133",
        "this looks like an evaluation or inference script (a DataLoader, a model in eval mode), but accelify "
        "finds no model it can follow into a loop over a DataLoader of this file; file not converted.",
        "bind the model and the DataLoader in the same function (not in a dict), and loop over the loader there "
        "or in a helper handed both (`evaluate(model, loader)`), calling the model itself (`model(x)`, "
        "`model.generate(...)`); or prepare them by hand: `loader = accelerator.prepare(loader)`, "
        "`model = accelerator.prepare_model(model, evaluation_mode=True)`.",
    )


def _unsplit_loop(facts: Facts, plan: Plan) -> None:
    """ACC133 too: a model (built here, treated as a module) runs in a loop over inputs that are no
    DataLoader and no list looped over directly (``enumerate(files)``, ``glob.glob(...)`` inline, a
    helper handed the model): accelify cannot split it; not a loop over ``range(...)`` (generation
    repeated, no data)."""
    models = {ref for ref in facts.assigns if _built(facts, ref) is not None and _is_module(facts, ref)}
    for loop in facts.loops:
        iterable = peel_iterable(facts, loop.iter)
        if m.matches(iterable, m.Call(func=m.Name("range"))):
            continue
        used = next((n for n in findall(loop.body, m.Name()) if ref_of(facts, n) in models), None)
        if used is None:
            continue
        facts.finding(
            plan, loop, "ACC133",
            f"the model `{used.value}` runs in a loop over `{code_of(loop.iter)}`, which accelify cannot split between "  # type: ignore[attr-defined]
            "the processes: it is no DataLoader, nor a list looped over directly where the model runs "
            "(`for item in items:` calling the model); file not converted.",
            "loop over the list itself, call the model in the loop, collect the results in lists and write them "
            "after the loop; or build a DataLoader over the inputs; or split by hand with "
            "`with accelerator.split_between_processes(items) as shard:` and `gather_object`.",
        )
        return


def _runs_at_import(module: cst.Module) -> bool:
    """Module-level code that runs something: a loop, a ``with``, a call as a statement."""
    return any(isinstance(s, (cst.For, cst.While, cst.With)) or m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.Call())]))
               for s in module.body)


def kept_results(facts: Facts, plan: Plan) -> bool:
    """False (ACC114) when a loop over a prepared loader keeps results in a way no gather covers:
    ``features = torch.cat((features, out))`` (a value rebuilt from itself batch after batch),
    ``preds[i] = p`` / ``self.x = ...`` (written into an object from before the loop), a file
    written per batch (``torch.save``, ``save_image``, ``np.save``...).  Over a prepared loader
    each process would keep its own shard only, and what is written or printed after the loop
    would be the main process's shard, not the whole set.  Metrics ACC011 gathers (``+=``,
    ``append``, ``add_batch``) are not such results."""
    from accelify.queries.names import WRITERS

    in_loops = assigns_in_loops(facts)
    for loop in facts.loops:
        if ref_of(facts, peel_iterable(facts, loop.iter)) not in plan.flow["loader"]:
            continue
        if findall(loop.body, m.Attribute(attr=m.Name("backward"))):
            continue  # a training loop: what it keeps is per process by nature (a running loss)
        # a training script's sample image of a batch (`if i == 0: save_image(...)`) is the main
        # process's batch, written once (ACC017): only an evaluation's files are its results
        why = kept_by(facts, loop, WRITERS if plan.evaluation else frozenset(), in_loops)
        if why is None and plan.evaluation:
            why = _printed_per_batch(facts, plan, loop)
        if why is not None:
            facts.finding(
                plan, loop, "ACC114",
                f"results of the loop over a prepared dataloader would be one process's shard only: {why}. "
                "File not converted.",
                "collect each batch's results with `results.append(...)` (accelify gathers them), or gather them "
                "yourself first: `out = accelerator.gather_for_metrics(out)`.",
            )
            return False
    return True


def assigns_in_loops(facts: Facts) -> set[int]:
    """Ids of the assignments inside some loop: per-batch values, not results that outlive the loop (``kept_by``)."""
    return {id(n) for other in (*facts.loops, *facts.whiles) for n in findall(other.body, m.Assign())}  # type: ignore[attr-defined]


def kept_by(facts: Facts, loop: cst.For, writers: frozenset[str], in_loops: set[int]) -> Optional[str]:
    """What ``loop`` keeps that no gather covers (a value rebuilt batch after batch, a write into an object from
    before the loop, a file ``writers`` writes batch by batch), as the finding says it; None when nothing."""
    key = key_at(facts, loop)
    per_batch = set(assigned_names(loop.target))

    def outer(name: str) -> bool:
        """``name`` is bound in this scope outside every loop (``features = torch.zeros(...)``): it
        outlives a batch."""
        return name not in per_batch and key is not None and any(
            id(a) not in in_loops for a in facts.assigns.get((key, name), []))

    for stmt, _ in iter_statements(loop.body):  # type: ignore[arg-type]
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    node = target.target
                    if isinstance(node, cst.Name):
                        if outer(node.value) and node.value in {n.value for n in findall(small.value, m.Name())}:  # type: ignore[attr-defined]
                            return f"`{code_of(small).strip()}` rebuilds `{node.value}` batch after batch"
                    elif isinstance(node, (cst.Subscript, cst.Attribute)):
                        root = _root(node)
                        if root is not None and (root == "self" or outer(root)):
                            return f"`{code_of(small).strip()}` writes into an object from before the loop"
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                func = small.value.func
                if qualified_names(facts, func) & writers:
                    return f"`{code_of(small).strip()}` writes a file batch by batch"
    return None


def _printed_per_batch(facts: Facts, plan: Plan, loop: cst.For) -> Optional[str]:
    """An evaluation's ``print(name, pred)`` in the loop, before any gather: each process would print
    its own shard, and only the main process's lines would show.  A print of the batch index or of
    sizes (``len(x)``, ``x.shape``) is progress, not results; one after ACC011's gather prints the
    gathered batch."""
    from accelify.analyses.gathers import Gather, find_gather

    index = None
    if isinstance(loop.iter, cst.Call) and m.matches(loop.iter.func, m.Name("enumerate")) and isinstance(
            loop.target, cst.Tuple) and loop.target.elements and isinstance(loop.target.elements[0].value, cst.Name):
        index = loop.target.elements[0].value.value
    # what is computed from the batch: the loop's target (not its enumerate index), and what is
    # assigned (or looped over) from it, in the body's order
    data = set(assigned_names(loop.target)) - {index}
    for stmt, _ in iter_statements(loop.body):  # type: ignore[arg-type]
        if isinstance(stmt, cst.For) and {n.value for n in findall(stmt.iter, m.Name())} & data:  # type: ignore[attr-defined]
            data |= set(assigned_names(stmt.target))
        assign = simple_assign(stmt)
        if assign is not None and {n.value for n in findall(assign.value, m.Name())} & data:  # type: ignore[attr-defined]
            data |= {n for t in assign.targets for n in assigned_names(t.target)}
    gather = find_gather(facts, loop, plan)
    rows = [s for s, _ in iter_statements(loop.body)]  # type: ignore[arg-type]
    gathered_from = None
    if isinstance(gather, Gather):
        gathered_from = next((i for i, s in enumerate(rows) if s is gather.statement), None)
    for position, stmt in enumerate(rows):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for call in findall(stmt, m.Call(func=m.Name("print") | m.Attribute(attr=m.Name("write"), value=m.Name("tqdm")))):
            sizes = {id(n) for c in findall(call, m.Call(func=m.Name("len") | m.Attribute(attr=m.Name("size"))))  # type: ignore[attr-defined]
                     for n in findall(c, m.Name())}
            sizes |= {id(a.value) for a in findall(call, m.Attribute(attr=m.Name("shape")))}  # type: ignore[attr-defined]
            read = {n.value for n in findall(call, m.Name()) if id(n) not in sizes} & data  # type: ignore[attr-defined]
            if read and (gathered_from is None or position < gathered_from):
                return (f"`{code_of(call)}` prints each batch's results: each process would print its own shard, "
                        "and only the main process's lines would show")
    return None


def _root(node: cst.BaseExpression) -> Optional[str]:
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None
