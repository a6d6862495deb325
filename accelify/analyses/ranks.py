"""The ranks of a hand-written distributed script, and the tests and flags built from them.

A rank is read from the launcher (``int(os.environ["LOCAL_RANK"])``), asked of torch.distributed
(``dist.get_rank()``), parsed from ``--local_rank``, handed to a helper (``Trainer(..., rank)``), or
given in the launched branch of a launch test with its one-process value in the other (nanoGPT's
``ddp_world_size``).  Each stands for an Accelerator attribute (``process_index``,
``local_process_index``, ``num_processes``, ``use_distributed``), and the tests on them for
``is_main_process``/``is_local_main_process``.

Input: the facts, ``plan.distributed`` as :mod:`accelify.analyses.distributed` fills it.  Output:
its rank fields (``ranks``, ``kept``, ``passed``, ``arg_ranks``, ``main_flags``); the questions
the other analyses and the codemods ask (:func:`rank_attribute`, :func:`main_process_test`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.facts import Facts
from accelify.queries.names import code_of, has_qname, string_value
from accelify.queries.refs import Ref, ref_of
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.distributed import Distributed
    from accelify.analyses.plan import Plan
from libcst.metadata import ScopeProvider

_C10D = "torch.distributed.distributed_c10d."


def both(name: str) -> frozenset[str]:
    return frozenset({f"torch.distributed.{name}", _C10D + name})


GET_RANK = both("get_rank")


GET_WORLD_SIZE = both("get_world_size")


IS_INITIALIZED = both("is_initialized")


#: environment variables a launcher sets, and the Accelerator attribute each one is
ENV_RANKS = {"LOCAL_RANK": "local_process_index", "RANK": "process_index", "WORLD_SIZE": "num_processes"}


#: rank attributes and the main-process test ``== 0`` of each
MAIN_TESTS = {"process_index": "is_main_process", "local_process_index": "is_local_main_process"}


#: what each rank attribute is in a single process
ONE_PROCESS = {"process_index": "0", "local_process_index": "0", "num_processes": "1"}


Why = tuple[cst.CSTNode, str, str]


def rank_attribute(visitor: cst.MetadataDependent, expr: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """The Accelerator attribute ``expr`` stands for: a rank name, or ``dist.get_rank()``; None if none."""
    if plan.distributed is None:
        return None
    if isinstance(expr, (cst.Name, cst.Attribute)):
        ref = ref_of(visitor, expr)
        if ref is not None and ref in plan.distributed.ranks:
            return plan.distributed.ranks[ref]
        if ref is not None and ref in plan.distributed.passed:
            return plan.distributed.passed[ref]
        if ref is not None and ref in plan.distributed.kept:
            return plan.distributed.kept[ref]
        if is_arg_rank(visitor, expr, plan.distributed):
            return "local_process_index"
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
            held = plan.distributed.attr_ranks.get((expr.value.value, expr.attr.value))
            if held is not None:
                return held
    if isinstance(expr, cst.Call) and not expr.args:
        if has_qname(visitor, expr.func, GET_RANK):
            return "process_index"
        if has_qname(visitor, expr.func, GET_WORLD_SIZE):
            return "num_processes"
    return None


def is_arg_rank(visitor: cst.MetadataDependent, expr: cst.BaseExpression, dist: Distributed) -> bool:
    """``args.local_rank`` of arguments parsed with a ``--local_rank`` option."""
    return (isinstance(expr, cst.Attribute) and expr.attr.value == "local_rank"
            and ref_of(visitor, expr.value) in dist.arg_ranks)


def not_main_process_test(visitor: cst.MetadataDependent, test: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """``rank != 0``, ``local_rank > 0``, ``args.local_rank not in [-1, 0]``, ``not rank == 0``: the
    main-process attribute it negates, or None."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return main_process_test(visitor, test.expression, plan)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    operator = target.operator
    if isinstance(operator, (cst.NotEqual, cst.GreaterThan)) and _is_zero(target.comparator):
        equal = test.with_changes(comparisons=[target.with_changes(operator=cst.Equal())])
        return main_process_test(visitor, equal, plan)
    if isinstance(operator, cst.NotIn):
        return main_process_test(visitor, test.with_changes(comparisons=[target.with_changes(operator=cst.In())]), plan)
    return None


def main_process_test(visitor: cst.MetadataDependent, test: cst.BaseExpression, plan: Plan) -> Optional[str]:
    """``rank == 0``, ``0 == local_rank``, ``args.local_rank in [-1, 0]``, ``not distributed or rank
    == 0``: ``is_main_process`` or ``is_local_main_process``; None when ``test`` is not such a test."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or) and isinstance(
        test.left, cst.UnaryOperation
    ) and isinstance(test.left.operator, cst.Not) and rank_attribute(visitor, test.left.expression, plan) == (
        "use_distributed"
    ):
        return main_process_test(visitor, test.right, plan)  # one process without a launcher: the main one
    if isinstance(test, (cst.Name, cst.Attribute)) and plan.distributed is not None:
        return plan.distributed.main_flags.get(ref_of(visitor, test))  # type: ignore[arg-type]
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    left, right = test.left, target.comparator
    if isinstance(target.operator, cst.Equal):
        if _is_zero(left):
            left, right = right, left
        if not _is_zero(right):
            return None
    elif isinstance(target.operator, cst.In):
        # `local_rank in [-1, 0]`: -1 is the "not distributed" value of a rank a launcher never sets
        if not isinstance(right, (cst.List, cst.Tuple, cst.Set)):
            return None
        values = {code_of(e.value).replace(" ", "") for e in right.elements}
        if "0" not in values or not values <= {"0", "-1"}:
            return None
    else:
        return None
    return MAIN_TESTS.get(rank_attribute(visitor, left, plan) or "")


def _is_zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Integer) and expr.value == "0"


def launch_branches(facts: Facts, node: cst.CSTNode,
                    env_reads: list[cst.BaseExpression]) -> Optional[tuple[cst.If, bool]]:
    """The ``if <launch test>:`` around ``node``, and whether ``node`` is in its launched branch
    (``env_reads``: :func:`env_rank_reads`, computed once by the caller)."""
    child: cst.CSTNode = node
    parent = facts.get_metadata(ParentNodeProvider, node, None)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.If) and child in (parent.body, parent.orelse):
            polarity = launch_polarity(facts, parent.test, env_reads)
            if polarity is not None:
                return parent, (child is parent.body) == polarity
        child, parent = parent, facts.get_metadata(ParentNodeProvider, parent, None)
    return None


def launch_polarity(facts: Facts, test: cst.BaseExpression, env_reads: list[cst.BaseExpression]) -> Optional[bool]:
    """True for ``if ddp:`` with ``ddp`` a launch test (or the test itself, ``args.local_rank != -1``), False for
    its negation (``args.local_rank == -1``, ``not ddp``: the single-process path), None for any other test."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = launch_polarity(facts, test.expression, env_reads)
        return None if inner is None else not inner
    if launched_test(facts, test, env_reads):
        return True
    if local_rank_launch(facts, test) is False:
        return False
    values = facts.bound_values(test)
    if len(values) == 1 and launched_test(facts, values[0], env_reads):
        return True
    return None


def _parsed_local_rank(facts: Facts, expr: cst.BaseExpression) -> bool:
    """``args.local_rank`` of the parsed arguments (``args = parser.parse_args()``, or what every call of the
    function hands it: :func:`arg_ranks` once the analysis has run it)."""
    if not (isinstance(expr, cst.Attribute) and expr.attr.value == "local_rank"):
        return False
    plan = getattr(facts, "plan", None)
    dist = plan.distributed if plan is not None else None
    if dist is not None and dist.arg_ranks:
        return ref_of(facts, expr.value) in dist.arg_ranks
    ref = ref_of(facts, expr.value)
    return ref is not None and any(m.matches(a.value, m.Call(func=m.Attribute(attr=m.Name("parse_args"))))
                                   for a in getattr(facts, "assigns", {}).get(ref, []))


def local_rank_launch(visitor: cst.MetadataDependent, test: cst.BaseExpression) -> Optional[bool]:
    """``args.local_rank`` of the parsed arguments against the -1 it is without a launcher: True for "started by a
    launcher" (``!= -1``, ``>= 0``, ``> -1``: ``accelerator.use_distributed``), False for "started without one"
    (``== -1``, ``< 0``: the old Hugging Face examples' and FixMatch's single-process path), None for any other
    test."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not _parsed_local_rank(visitor, test.left):  # type: ignore[arg-type]
        return None
    operator, bound = test.comparisons[0].operator, code_of(test.comparisons[0].comparator)
    for kinds, value, launched in ((cst.NotEqual, "-1", True), (cst.GreaterThanEqual, "0", True),
                                   (cst.GreaterThan, "-1", True), (cst.Equal, "-1", False), (cst.LessThan, "0", False)):
        if isinstance(operator, kinds) and bound == value:
            return launched
    return None


def kept_rank(facts: Facts, ref: Ref, assigns: list[cst.Assign],
               env_reads: list[cst.BaseExpression]) -> Optional[tuple[str, cst.Assign]]:
    """``ddp_world_size = int(os.environ["WORLD_SIZE"])`` in the launched branch and ``ddp_world_size = 1``
    in the other: (attribute, the launched assignment); None when it is not that shape."""
    sources = [(a, k) for a in assigns if (k := rank_source(facts, a.value, env_reads)) is not None]
    if len(sources) != 1 or sources[0][1].startswith("?") or sources[0][1] not in ONE_PROCESS:
        return None
    source, kind = sources[0]
    where = launch_branches(facts, source, env_reads)
    if where is None or not where[1]:
        return None
    for other in assigns:
        if other is source:
            continue
        if facts.single_target(other) != ref or code_of(other.value) != ONE_PROCESS[kind]:
            return None
        branch = launch_branches(facts, other, env_reads)
        if branch is None or branch[0] is not where[0] or branch[1]:
            return None
    return kind, source


def main_flags_of(facts: Facts, plan: Plan, dist: Distributed, env_reads: list[cst.BaseExpression]) -> None:
    """``master_process = ddp_rank == 0`` in the launched branch, ``master_process = True`` in the other."""
    for ref, assigns in facts.assigns.items():
        tests = [main_process_test(facts, a.value, plan) for a in assigns]
        found = [t for t in tests if t is not None]
        if len(set(found)) != 1 or any(facts.single_target(a) != ref for a in assigns):
            continue
        ok = True
        for assign, test in zip(assigns, tests):
            branch = launch_branches(facts, assign, env_reads)
            if test is not None:
                ok &= branch is not None and branch[1]
            else:
                ok &= code_of(assign.value) == "True" and branch is not None and not branch[1]
        if ok:
            dist.main_flags[ref] = found[0]


def arg_ranks(facts: Facts, plan: Plan, dist: Distributed, env_reads: list[cst.BaseExpression]) -> Optional[Why]:
    """``parser.add_argument("--local_rank", ...)`` and ``args = parser.parse_args()``: ``args.local_rank``
    is the local rank, where it is read as one (a placement, ``== 0``, ``!= 0``, ``in [-1, 0]``, a value).
    Its default may be the launcher's ``LOCAL_RANK`` (``default=int(os.environ.get("LOCAL_RANK", 0))``,
    for torchrun, which passes no ``--local_rank``): the same rank, the read is left as it is."""
    options = [c for c in facts.calls if m.matches(c.func, m.Attribute(attr=m.Name("add_argument")))
               and c.args and string_value(c.args[0].value) in ("--local_rank", "--local-rank")]
    if not options:
        return None
    for option in options:
        default = next((a.value for a in option.args if a.keyword is not None and a.keyword.value == "default"), None)
        if default is None:
            continue
        for read in env_reads:
            if any(read is n for n in findall(default, m.Subscript() | m.Call())):
                if not _launcher_local_rank(facts, default, read):
                    return (read, f"`{code_of(default)}`, the default of `--local_rank`, is not the launcher's local rank",
                            "use `default=int(os.environ.get(\"LOCAL_RANK\", 0))`, or `accelerator.local_process_index`")
                dist.arg_defaults.add(id(read))
    for ref, assigns in facts.assigns.items():
        if any(m.matches(a.value, m.Call(func=m.Attribute(attr=m.Name("parse_args")))) for a in assigns):
            dist.arg_ranks.add(ref)
    # the parameters every call hands the parsed arguments (`main_worker(..., args)`): the same option there
    dist.arg_ranks |= facts.handed(set(dist.arg_ranks), lambda arg: ref_of(facts, arg))
    usage = "read the local rank only as a rank (`== 0`, `in [-1, 0]`, a device), or use `accelerator.local_process_index`"
    for node in findall(facts.module, m.Attribute(attr=m.Name("local_rank"))):
        if not is_arg_rank(facts, node, dist):  # type: ignore[arg-type]
            continue
        parent = facts.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
            isinstance(parent, cst.Assign) and node is not parent.value
        ):
            return node, f"`{code_of(node)}` is set by the script itself", usage
        if isinstance(parent, cst.Comparison) and main_process_test(facts, parent, plan) is None and (
            not_main_process_test(facts, parent, plan) is None
        ) and launch_polarity(facts, parent, []) is None:
            return parent, f"`{code_of(parent)}` tests for a run without a launcher (a single-process path too)", usage
    return None


def _launcher_local_rank(facts: Facts, default: cst.BaseExpression, read: cst.BaseExpression) -> bool:
    """``os.environ["LOCAL_RANK"]`` or ``os.environ.get("LOCAL_RANK", 0 or -1)``, maybe in ``int(...)``: the
    launcher's local rank (without a launcher 0 or -1, which the script's rank tests read as "the main
    process" or "no launcher": those tests are checked where ``args.local_rank`` is read)."""
    if default is not read and not (
        m.matches(default, m.Call(func=m.Name("int"), args=[m.Arg(keyword=None)])) and default.args[0].value is read  # type: ignore[attr-defined]
    ):
        return False
    if env_key(facts, read) != "LOCAL_RANK":
        return False
    if isinstance(read, cst.Call) and len(read.args) > 1:
        return code_of(read.args[1].value).strip("'\"") in ("0", "-1")
    return True


def propagate(facts: Facts, dist: Distributed) -> None:
    """``dist.passed``: parameters every call site hands a rank (``Trainer(model, ..., rank)``), and
    ``self`` attributes bound only to those (``self.gpu_id = gpu_id``)."""
    plan = facts.plan
    if plan is None:
        return
    callables: list[tuple[str, cst.FunctionDef, Optional[cst.ClassDef]]] = [
        (name, func, None) for name, func in facts.functions.items()]
    for name, cls in facts.classes.items():
        init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is not None:
            callables.append((name, init, cls))
    changed = True
    while changed:
        changed = False
        for name, func, cls in callables:
            sites = facts.call_sites(name, func, cls)
            if not sites:
                continue
            key = f"{name}.__init__" if cls is not None else name
            for param in [p.name.value for p in func.params.params]:
                if (key, param) in dist.passed or (key, param) in dist.ranks:
                    continue
                kinds = {rank_attribute(facts, bound[param], plan) if param in bound else None for _, bound in sites}
                if len(kinds) == 1 and None not in kinds:
                    dist.passed[(key, param)] = kinds.pop()  # type: ignore[assignment]
                    changed = True
        for (owner, name), assigns in facts.assigns.items():
            if owner not in facts.classes or not name.startswith("self.") or (owner, name) in dist.passed:
                continue
            kinds = {rank_attribute(facts, a.value, plan) if facts.single_target(a) == (owner, name) else None
                     for a in assigns}
            if len(kinds) == 1 and None not in kinds:
                dist.passed[(owner, name)] = kinds.pop()  # type: ignore[assignment]
                changed = True


def env_rank_reads(facts: Facts) -> list[cst.BaseExpression]:
    """``os.environ["LOCAL_RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("WORLD_SIZE")``."""
    reads: list[cst.BaseExpression] = []
    for node in findall(facts.module, m.Subscript()):
        if env_key(facts, node) is not None:
            reads.append(node)  # type: ignore[arg-type]
    for call in facts.calls:
        if env_key(facts, call) is not None:
            reads.append(call)
    return reads


def env_key(facts: Facts, node: cst.CSTNode) -> Optional[str]:
    """The launcher variable ``node`` reads (``LOCAL_RANK``...), or None."""
    key: Optional[cst.BaseExpression] = None
    if isinstance(node, cst.Subscript) and has_qname(facts, node.value, frozenset({"os.environ"})):
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
    elif isinstance(node, cst.Call) and node.args and (
        has_qname(facts, node.func, frozenset({"os.getenv"}))
        or (isinstance(node.func, cst.Attribute) and node.func.attr.value == "get"
            and has_qname(facts, node.func.value, frozenset({"os.environ"})))
    ):
        key = node.args[0].value
    text = string_value(key) if key is not None else None
    if text in ENV_RANKS or text in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        return text
    return None


def rank_source(facts: Facts, value: cst.BaseExpression, env_reads: list[cst.BaseExpression]) -> Optional[str]:
    """What ``value`` binds: an Accelerator attribute (``"local_process_index"``), ``"?why"`` when it
    is a rank accelify cannot map, None when it is no rank."""
    if isinstance(value, cst.Call) and not value.args:
        if has_qname(facts, value.func, GET_RANK):
            return "process_index"
        if has_qname(facts, value.func, GET_WORLD_SIZE):
            return "num_processes"
    if launched_test(facts, value, env_reads):
        return "use_distributed"
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo) and isinstance(
        value.right, cst.Call
    ) and not value.right.args and has_qname(facts, value.right.func, DEVICE_COUNT):
        # `device_id = rank % torch.cuda.device_count()` (the DDP tutorial's elastic example): the process's
        # GPU on its machine, what `local_process_index` is under a launcher that starts one per GPU
        left = value.left
        bound = facts.assigns.get(ref_of(facts, left), []) if isinstance(left, cst.Name) else []
        sources = [left] if not isinstance(left, cst.Name) else [a.value for a in bound] if len(bound) == 1 else []
        if sources and not isinstance(sources[0], cst.BinaryOperation) and rank_source(
            facts, sources[0], env_reads
        ) == "process_index":
            return "local_process_index"
        return None
    inner = value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "int" and len(value.args) == 1:
        inner = value.args[0].value
    if not any(inner is r for r in env_reads):
        if any(r for r in env_reads if r in findall(value, m.Subscript() | m.Call())):
            return f"?`{code_of(value)}` computes with a launcher variable (a run with or without a launcher)"
        return None
    key = env_key(facts, inner)
    if key not in ENV_RANKS:
        return f"?`{code_of(value)}` reads `{key}`, which has no Accelerate equivalent accelify knows"
    if inner is value:
        return f"?`{code_of(value)}` is a string, not a number"
    if isinstance(inner, cst.Call) and len(inner.args) > 1:
        default = inner.args[1].value
        if code_of(default).strip("'\"") != ("1" if key == "WORLD_SIZE" else "0"):
            return (f"?`{code_of(value)}` has the default `{code_of(default)}` for a run without a launcher "
                    "(a script with a single-process path too)")
    return ENV_RANKS[key]


#: how many GPUs the machine has
DEVICE_COUNT = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})


def launched_test(facts: Facts, value: cst.BaseExpression, env_reads: list[cst.BaseExpression]) -> bool:
    """``int(os.environ.get("WORLD_SIZE", 1)) > 1``, ``int(os.environ.get("RANK", -1)) != -1``,
    ``"LOCAL_RANK" in os.environ``: "was this run started by a launcher?", which under Accelerate is
    ``accelerator.use_distributed`` (in one process the script takes its single-process path, as
    it did without a launcher)."""
    if not isinstance(value, cst.Comparison) or len(value.comparisons) != 1:
        return False
    target = value.comparisons[0]
    if _parsed_local_rank(facts, value.left):  # `args.local_rank != -1`: the launcher's, -1 without one
        return local_rank_launch(facts, value) is True
    if isinstance(target.operator, cst.In) and has_qname(facts, target.comparator, frozenset({"os.environ"})):
        return string_value(value.left) in ENV_RANKS  # type: ignore[arg-type]
    left = value.left
    if not (isinstance(left, cst.Call) and m.matches(left.func, m.Name("int")) and len(left.args) == 1):
        return False
    read = left.args[0].value
    if not any(read is r for r in env_reads) or not isinstance(read, cst.Call) or len(read.args) != 2:
        return False  # `os.environ.get(KEY, default)`: without a launcher, the default
    key, default = env_key(facts, read), code_of(read.args[1].value).strip("'\"")
    operator, bound = target.operator, code_of(target.comparator)
    if key == "WORLD_SIZE":
        return default == "1" and ((isinstance(operator, cst.GreaterThan) and bound == "1")
                                   or (isinstance(operator, cst.NotEqual) and bound == "1"))
    if key in ("RANK", "LOCAL_RANK"):
        return default == "-1" and ((isinstance(operator, cst.NotEqual) and bound == "-1")
                                    or (isinstance(operator, cst.GreaterThanEqual) and bound == "0"))
    return False


def under_main_process_check(visitor: cst.MetadataDependent, node: cst.CSTNode) -> bool:
    """Inside ``if accelerator.is_main_process:`` (or ``is_local_main_process``), or, in a script
    that managed its own processes, ``if rank == 0:`` (which becomes one)?"""
    from libcst.metadata import ParentNodeProvider

    child, parent = node, visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None:
        # `if rank == 0:`, or `SummaryWriter() if rank == 0 else None` (MoCo v3)
        if (isinstance(parent, cst.If) or (isinstance(parent, cst.IfExp) and parent.body is child)) and (findall(
            parent.test, m.Attribute(attr=m.Name("is_main_process") | m.Name("is_local_main_process"))
        ) or _rank_zero_test(visitor, parent.test)):
            return True
        child, parent = parent, visitor.get_metadata(ParentNodeProvider, parent, None)
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
