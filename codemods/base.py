"""What every accelify codemod shares: identity (code, name), records, statement editing."""

from __future__ import annotations

import textwrap
from typing import ClassVar, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider

from accelify.analyses.plan import Plan
from accelify.queries.blocks import inside, iter_statements, scope_root, simple_assign
from accelify.queries.names import TORCH_LOAD, has_qname
from accelify.queries.records import Change, RawFinding
from accelify.queries.refs import key_at, ref_of, scope_key
from accelify.queries.training import locate_setup, rebound_region, trainer_functions
from accelify.queries.trees import Block, Item, remove_imports_of
from accelify.queries.walk import findall

Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]

#: The module each name accelify imports comes from, per ``Options.target``: accelerate's own
#: modules, or ``accelify.runtime`` (which is accelerate's object when it is installed).
TARGET_MODULES = {
    "accelerate": {
        "Accelerator": "accelerate",
        "DistributedDataParallelKwargs": "accelerate",
        "set_seed": "accelerate.utils",
        "gather_object": "accelerate.utils",
        "reduce": "accelerate.utils",
        "wait_for_everyone": "accelerate.utils",
        "PartialState": "accelerate",
        "gather": "accelerate.utils",
        "broadcast": "accelerate.utils",
    },
    "runtime": dict.fromkeys(("Accelerator", "DistributedDataParallelKwargs", "set_seed", "gather_object", "reduce",
                              "wait_for_everyone", "PartialState", "gather", "broadcast"), "accelify.runtime"),
}


def add_target_import(context: CodemodContext, name: str) -> None:
    """Have ``from <module> import <name>`` added to the converted file. Input: the context (its
    scratch holds the target of the run, ``Options.target``) and one of ``TARGET_MODULES``' names."""
    target = context.scratch.get("accelify.target", "accelerate")
    AddImportsVisitor.add_needed_import(context, TARGET_MODULES[target][name], name)


def add_accelerator_imports(context: CodemodContext, plan: Plan) -> None:
    """What ``accelerator = Accelerator(<plan.accelerator_args()>)`` needs imported."""
    add_target_import(context, "Accelerator")
    if plan.all_ddp_kwargs():
        add_target_import(context, "DistributedDataParallelKwargs")


def unused_note(plan: Plan) -> str:
    """The change message's note on ``find_unused_parameters=True``, when the models need it."""
    if not plan.unused_parameters:
        return ""
    return (f", with `find_unused_parameters=True`: {', '.join(f'`{c}.forward`' for c in plan.unused_parameters)} "
            "runs a part under `no_grad` or detaches a result, and parameters that still require grad get none "
            "(DDP would wait for their gradients)")


def merge_leading_lines(first: Sequence[cst.EmptyLine], second: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """Concatenate two runs of leading lines without doubling the blank lines where they meet."""
    first, second = list(first), list(second)
    trailing = 0
    while trailing < len(first) and first[len(first) - 1 - trailing].comment is None:
        trailing += 1
    leading = 0
    while leading < len(second) and second[leading].comment is None:
        leading += 1
    keep = max(trailing, leading)
    head = first[: len(first) - trailing]
    tail = second[leading:]
    blanks = (first[len(first) - trailing :] if trailing >= leading else second[:leading])[:keep]
    return head + blanks + tail


class AccelifyCodemod(cst.CSTTransformer):
    """Base class: one rewrite, one stable code, one file.

    Subclasses set ``CODE`` (``ACC0xx``), ``NAME`` (kebab-case) and ``DESCRIPTION``
    (one line), and put a before/after example in their docstring between the
    ``Before::`` and ``After::`` markers: docs/rules/ and ``accelify rules`` show it,
    and the test-suite converts it.

    All codemods run in one traversal of the original tree (``accelify.core.composite``):
    ``original_node`` is always a node of the file as written (its metadata is
    known), ``updated_node`` what the children and the codemods before this one
    made of it.  A codemod that needs what another one decides asks it through
    :meth:`other` and names it in ``AFTER``.

    Statements are removed by returning them from ``leave_*`` after calling
    :meth:`remove`; the enclosing block then drops them and hands their blank
    lines and comment lines to the next statement.  A block emptied that way
    loses its ``if``/``for`` header when the header has no side effects, comments
    inside the block included; otherwise it keeps a ``pass``.  Statements are
    inserted around others by :meth:`edit_body`, once per block.
    """

    CODE: ClassVar[str] = ""
    NAME: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""
    #: Codes that must run too: what this codemod writes refers to what they create.
    REQUIRES: ClassVar[frozenset[str]] = frozenset()
    #: Codes whose decisions this codemod reads (through :meth:`other`): it runs after them at each node.
    AFTER: ClassVar[frozenset[str]] = frozenset()

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ParentNodeProvider)

    def __init__(self, context: CodemodContext, plan: Plan, shared: Shared) -> None:
        # A plain CSTTransformer (not LibCST's matcher-decoratable ContextAwareTransformer):
        # no codemod uses matcher decorators, and their dispatch doubles the cost of a pass.
        super().__init__()
        self.context = context
        self.plan = plan
        self.shared = shared
        self.metadata = shared.metadata  # resolved once, on the original tree
        self.changes: list[Change] = []
        self.findings: list[RawFinding] = []
        #: the findings that cost the whole conversion (``refuse``), each also in ``findings``
        self.refusals: list[RawFinding] = []
        self.refused = False
        self._touched: list[bool] = []  # one per enclosing statement: did this codemod strip something in it?

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        """A cheap necessary condition on the source: when False the codemod could change nothing and is skipped."""
        return True

    def finished(self) -> None:
        """Called once the traversal is over: raise if it could not carry out what the plan promised
        (the pipeline then leaves the file unchanged and reports an internal error)."""

    def name_free(self, name: str) -> bool:
        """``name`` is read or bound nowhere in the file: an import of it would clash with nothing
        (``from functools import reduce`` would). An attribute's name (``dist.broadcast``) or a keyword
        (``f(reduce=...)``) clashes with nothing."""
        if name not in self.shared.free:  # asked once per file: the original tree does not change
            self.shared.free[name] = self._binds_or_reads_nowhere(name)
        return self.shared.free[name]

    def _binds_or_reads_nowhere(self, name: str) -> bool:
        for node in findall(self.shared.module, m.Name(name)):
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if not ((isinstance(parent, cst.Attribute) and parent.attr is node)
                    or (isinstance(parent, cst.Arg) and parent.keyword is node)):
                return False
        return True

    def other(self, code: str) -> "Optional[AccelifyCodemod]":
        """The codemod ``code`` of this run (None when it does not run): to ask what it decided."""
        assert code in self.AFTER, f"{self.CODE} reads {code}: declare it in AFTER"
        return self.shared.codemod(code)

    # ------------------------------------------------------------------ examples
    @classmethod
    def example(cls) -> tuple[str, str]:
        """The (before, after) pair from the class docstring."""
        doc = cls.__doc__ or ""
        before, _, after = doc.partition("After::")
        before = before.partition("Before::")[2]
        return textwrap.dedent(before).strip("\n") + "\n", textwrap.dedent(after).strip("\n") + "\n"

    # ------------------------------------------------------------------ records
    def line_of(self, node: cst.CSTNode) -> tuple[int, int]:
        """(line, column) of ``node`` in the original file; a node written by a codemod has the
        position of the original node being rewritten."""
        pos = self.get_metadata(PositionProvider, node, None)
        if pos is None:
            origin = self.shared.origin_of(node)
            if origin is not None:
                pos = self.get_metadata(PositionProvider, origin, None)
        if pos is None:
            for current in reversed(self.shared.current):
                pos = self.get_metadata(PositionProvider, current, None)
                if pos is not None:
                    break
        if pos is None:
            return 0, 0
        return pos.start.line, pos.start.column + 1

    def change(self, node: cst.CSTNode, message: str) -> None:
        line, _ = self.line_of(node)
        self.changes.append(Change(line, self.CODE, message))

    def finding(self, node: cst.CSTNode, code: str, message: str, suggestion: str = "") -> None:
        line, col = self.line_of(node)
        self.findings.append(RawFinding(line, col, code, message, suggestion))

    def refuse(self, node: cst.CSTNode, code: str, message: str, suggestion: str = "") -> None:
        """A finding that costs the whole conversion: what this codemod met cannot be left as it is
        in a converted file, so the pipeline returns the file unchanged with the findings."""
        self.finding(node, code, message, suggestion)
        self.refusals.append(self.findings[-1])
        self.refused = True

    def accelerator_at(self, node: cst.CSTNode) -> Optional[str]:
        """How the code at ``node`` spells the Accelerator, or None where it cannot reach one."""
        key = key_at(self, node)
        acc = self.plan.accelerator_in(key)
        if acc is None or acc.startswith("self."):
            return acc
        scope = self.get_metadata(ScopeProvider, node, None)
        if scope is None:
            return None
        # A local that merely shares the name would shadow the setup scope's Accelerator.
        allowed = {self.plan.setup, key}
        if all(scope_key(a.scope) in allowed for a in scope[acc]):
            return acc
        return None

    def rebound_statements(self, module: cst.Module, ignore: frozenset[int] = frozenset()) -> set[int]:
        """Ids of the setup block's statements from the first one that binds a model again after
        training (``model = Net()`` to reload a checkpoint for a test): there it is a plain model.
        ``ignore``: statements that bind nothing once converted (``model = model.to(device)``)."""
        if not self.plan.rebound_models:
            return set()
        root = scope_root(module, self.plan.setup)
        trainers = trainer_functions(module)
        core = set(self.plan.anchors())
        located = locate_setup(root, core, trainers, ignore, touches=self.plan.touches()) if root is not None else None
        if located is None:
            return set()
        return {id(s) for s in rebound_region(*located, core, set(self.plan.rebound_models), trainers, ignore)}

    def vanishing(self) -> frozenset[int]:
        """Original statements the conversion turns into nothing (``model = model.to(device)``,
        ``model = nn.DataParallel(model)``): they no longer bind what they assign."""
        if self.shared.vanishing is None:
            self.shared.vanishing = vanishing_statements(self.shared)
        return self.shared.vanishing

    def statements_around(self, node: Optional[cst.CSTNode]) -> frozenset[int]:
        """Ids of ``node`` and of the statements that contain it."""
        out = set()
        while node is not None:
            if isinstance(node, cst.BaseStatement):
                out.add(id(node))
            node = self.get_metadata(ParentNodeProvider, node, None)
        return frozenset(out)

    def inside(self, node: cst.CSTNode, statements: set[int]) -> bool:
        """Is ``node`` part of one of ``statements``?"""
        return inside(self, node, statements)

    # ------------------------------------------------------------------ statements
    def remove(self, updated: Statement) -> Statement:
        """Mark a statement (the ``updated_node`` being returned) for removal."""
        self.shared.marked[id(updated)] = updated
        return updated

    def replaced(self, original: cst.CSTNode) -> None:
        """Say that the statement ``original`` is being replaced with new code: the codemods after
        this one do not rewrite it as the statement it was."""
        self.shared.replaced.add(id(original))

    def touch(self) -> None:
        """Say that something was stripped from the current statement: if it is left doing
        nothing (``model = model``, ``batch = {k: v for k, v in batch.items()}``), it goes."""
        if self._touched:
            self._touched[-1] = True

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._touched.append(False)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        touched = self._touched.pop()
        if not touched:
            return updated_node
        if len(updated_node.body) == 1:
            return self.remove(updated_node) if is_noop(updated_node.body[0]) else updated_node
        # `x = x.to(device); y = y.to(device)`: the statements of the line left doing nothing go,
        # not those written so (a statement of the line that was not touched is kept as it is)
        kept = [new for old, new in zip(original_node.body, updated_node.body)
                if not (is_noop(new) and flat_code(new) != flat_code(old))]
        if not kept:
            return self.remove(updated_node)
        if len(kept) == len(updated_node.body):
            return updated_node
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=kept)

    def abandon(self, original_node: cst.CSTNode) -> None:
        """The traversal leaves ``original_node`` without this codemod's ``leave_*``: a codemod before
        it replaced the node.  Undo what ``visit_*`` set up for it."""
        if isinstance(original_node, cst.SimpleStatementLine):
            self._touched.pop()

    def is_removed(self, node: cst.CSTNode) -> bool:
        return id(node) in self.shared.marked

    def parse_statement(self, code: str) -> Statement:
        module = self.context.module
        config = module.config_for_parsing if module is not None else cst.PartialParserConfig()
        return cst.parse_statement(code, config=config)

    def edit_body(self, block: Block, items: list[Item]) -> list[Item]:
        """Hook for codemods that insert or replace statements of a block.

        ``block`` is the original block; ``items`` its statements as they are now, each with
        the original statement it comes from (None for one inserted), removals already
        applied.  Return ``items`` itself when there is nothing to do, else a new list.
        """
        return items

    @staticmethod
    def position(block: Block, items: list[Item], index: int) -> int:
        """Where in ``items`` the original ``block.body[index]`` is (or would be, had it not gone)."""
        order = {id(s): i for i, s in enumerate(block.body)}
        for k, (_, origin) in enumerate(items):
            if origin is not None and order.get(id(origin), -1) >= index:
                return k
        return len(items)

    def emptied(self, block: cst.BaseSuite) -> bool:
        """True when the edits removed every statement of ``block``."""
        return id(block) in self.shared.emptied

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.BaseStatement]:
        if self.emptied(updated_node.body) and updated_node.orelse is None and _side_effect_free(updated_node.iter):
            if id(original_node) not in self.shared.removed:
                remove_imports_of(self.context, original_node)
            return self.remove(updated_node)
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if self._chain_emptied(updated_node):
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if not isinstance(parent, cst.If):  # an `elif` cannot be dropped on its own
                if id(original_node) not in self.shared.removed:
                    remove_imports_of(self.context, original_node)
                return self.remove(updated_node)
        return updated_node


    def _chain_emptied(self, node: Union[cst.If, cst.Else, None]) -> bool:
        """Every block of an ``if``/``elif``/``else`` chain emptied, every test without side effects
        (``if torch.cuda.is_available(): device = "cuda" elif ...: device = "mps"``, its assignments gone)."""
        while isinstance(node, cst.If):
            if not (self.emptied(node.body) and _side_effect_free(node.test)):
                return False
            node = node.orelse  # type: ignore[assignment]
        return node is None or self.emptied(node.body)


_PURE_METHODS = frozenset({"items", "keys", "values", "is_available", "device_count"})


def _side_effect_free(expr: cst.BaseExpression) -> bool:
    """Conservative: names, attributes, literals, comparisons and a few well-known calls."""
    if isinstance(expr, (cst.Name, cst.Integer, cst.SimpleString)):
        return True
    if isinstance(expr, cst.Attribute):
        return _side_effect_free(expr.value)
    if isinstance(expr, cst.Subscript):
        return _side_effect_free(expr.value)
    if isinstance(expr, cst.UnaryOperation):
        return _side_effect_free(expr.expression)
    if isinstance(expr, cst.BooleanOperation):
        return _side_effect_free(expr.left) and _side_effect_free(expr.right)
    if isinstance(expr, cst.Comparison):
        return _side_effect_free(expr.left) and all(_side_effect_free(c.comparator) for c in expr.comparisons)
    if isinstance(expr, cst.Call) and not expr.args and isinstance(expr.func, cst.Attribute):
        return expr.func.attr.value in _PURE_METHODS and _side_effect_free(expr.func.value)
    if m.matches(expr, m.Call(func=m.Name("hasattr"), args=[m.Arg(keyword=None), m.Arg(value=m.SimpleString())])):
        return _side_effect_free(expr.args[0].value)  # type: ignore[attr-defined]
    return False


def depth_of(module: cst.Module, target: Block) -> str:
    """The indentation of the statements of ``target``, a block of ``module``."""
    from accelify.queries.blocks import child_blocks

    def walk(block: Block, indent: str) -> Optional[str]:
        if block is target:
            return indent
        for stmt in block.body:
            for child in child_blocks(stmt):
                child_indent = indent + (child.indent if child.indent is not None else module.default_indent)
                found = walk(child, child_indent)
                if found is not None:
                    return found
        return None

    return walk(module, "") or ""


def wrapped_call(head: str, arguments: str, depth: str, line_length: int, indent: str) -> str:
    """``head(arguments)`` on one line when it fits at ``depth``, else black's three lines."""
    one_line = f"{head}({arguments})"
    if len(depth) + len(one_line) <= line_length or not arguments:
        return one_line
    return f"{head}(\n{indent}{arguments}\n)"


def insert_paragraph(body: Sequence[cst.BaseStatement], index: int, stmt: Statement) -> list[cst.BaseStatement]:
    """Insert ``stmt`` at ``index`` as a paragraph of its own: a blank line before and after it.

    At the very top of a block there is no blank line before it.
    """
    blank = cst.EmptyLine(indent=False)
    stmt = stmt.with_changes(leading_lines=[blank] if index > 0 else [])
    after = list(body[index:])
    if after and (not after[0].leading_lines or after[0].leading_lines[0].comment is not None):
        after[0] = after[0].with_changes(leading_lines=[blank, *after[0].leading_lines])
    return [*body[:index], stmt, *after]


def accelerator_attr(accelerator: str, attr: str) -> cst.Attribute:
    """``accelerator.device`` / ``self.accelerator.device`` as a node."""
    return cst.parse_expression(f"{accelerator}.{attr}")  # type: ignore[return-value]


def flat_code(node: cst.CSTNode) -> str:
    text = cst.Module(body=[]).code_for_node(node)
    return "".join(text.split()).strip("()")


def is_noop(small: cst.BaseSmallStatement) -> bool:
    """What a stripped placement statement becomes when it no longer does anything."""
    if isinstance(small, cst.Expr):
        return isinstance(small.value, (cst.Name, cst.Attribute, cst.Subscript))
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return False
    target, value = small.targets[0].target, small.value
    if flat_code(target) == flat_code(value):
        return True
    # batch = {k: v for k, v in batch.items()}
    if m.matches(
        value,
        m.DictComp(
            key=m.Name(), value=m.Name(),
            for_in=m.CompFor(
                target=m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]),
                iter=m.Call(func=m.Attribute(attr=m.Name("items")), args=[]),
                inner_for_in=None, ifs=[],
            ),
        ),
    ):
        k, v = (e.value.value for e in value.for_in.target.elements)  # type: ignore[union-attr]
        if (value.key.value, value.value.value) == (k, v):  # type: ignore[union-attr]
            return flat_code(value.for_in.iter.func.value) == flat_code(target)  # type: ignore[union-attr]
    # batch = [t for t in batch] / tuple(t for t in batch)
    comp = value
    if m.matches(value, m.Call(func=m.Name("tuple") | m.Name("list"), args=[m.Arg(m.GeneratorExp() | m.ListComp())])):
        comp = value.args[0].value  # type: ignore[union-attr]
    if isinstance(comp, (cst.ListComp, cst.GeneratorExp)) and comp.for_in.inner_for_in is None and not comp.for_in.ifs:
        return (
            isinstance(comp.elt, cst.Name)
            and flat_code(comp.elt) == flat_code(comp.for_in.target)
            and flat_code(comp.for_in.iter) == flat_code(target)
        )
    return False


def loads_on_the_cpu(visitor: AccelifyCodemod, node: cst.CSTNode) -> bool:
    """``node`` is the device of ``torch.load(path, map_location=<node>)`` whose result only goes
    into ``load_state_dict`` (directly, through a subscript, or through a name read nowhere else):
    a state dict is copied into the model wherever it lies, so it loads on the CPU; so does an
    evaluation's whole pickled model (``model = torch.load(path, map_location=device)``), which
    ``prepare_model`` places.  That is also what stays correct with several CPU processes, whose
    ``accelerator.device`` (``cpu:0``) ``torch.load`` rejects, and on GPUs keeps every process from
    loading onto the first one."""
    arg = visitor.get_metadata(ParentNodeProvider, node, None)
    if not (isinstance(arg, cst.Arg) and arg.keyword is not None and arg.keyword.value == "map_location"):
        return False
    load = visitor.get_metadata(ParentNodeProvider, arg, None)
    if not isinstance(load, cst.Call) or not has_qname(visitor, load.func, TORCH_LOAD):
        return False
    return _into_load_state_dict(visitor, load)


def _into_load_state_dict(visitor: AccelifyCodemod, expr: cst.CSTNode) -> bool:
    parent = visitor.get_metadata(ParentNodeProvider, expr, None)
    while isinstance(parent, cst.Subscript) and parent.value is expr:  # `torch.load(...)["model"]`
        expr, parent = parent, visitor.get_metadata(ParentNodeProvider, parent, None)
    if isinstance(parent, cst.Arg) and parent.value is expr:
        call = visitor.get_metadata(ParentNodeProvider, parent, None)
        return isinstance(call, cst.Call) and m.matches(call.func, m.Attribute(attr=m.Name("load_state_dict")))
    if isinstance(parent, cst.Assign) and parent.value is expr and len(parent.targets) == 1 and isinstance(
            parent.targets[0].target, cst.Name):
        name = parent.targets[0].target
        if visitor.plan.evaluation and ref_of(visitor, name) in visitor.plan.refs(visitor.plan.models):
            return True  # a whole pickled model, placed by `prepare_model` after it is loaded
        scope = visitor.get_metadata(ScopeProvider, name, None)
        if scope is None or len(scope[name.value]) != 1:
            return False
        accesses = [a for assignment in scope[name.value] for a in assignment.references]
        return bool(accesses) and all(_into_load_state_dict(visitor, a.node) for a in accesses)
    return False


def cpu_string(visitor: AccelifyCodemod, node: cst.CSTNode) -> cst.SimpleString:
    """``"cpu"`` for the ``map_location`` ``node`` is, in the quotes of the ``torch.load`` call's own
    path when it is a string literal (``torch.load('m.pt', map_location='cpu')``)."""
    arg = visitor.get_metadata(ParentNodeProvider, node, None)
    load = visitor.get_metadata(ParentNodeProvider, arg, None) if arg is not None else None
    strings = [a.value for a in load.args if isinstance(a.value, cst.SimpleString)] if isinstance(load, cst.Call) else []
    quote = "'" if strings and strings[0].quote == "'" else '"'
    return cst.SimpleString(f"{quote}cpu{quote}")


class Shared:
    """What the codemods of one run share: the edits recorded against original statements."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.module = wrapper.module
        self.metadata = wrapper._metadata
        self.removed: set[int] = set()  # original statements that go
        self.marked: dict[int, cst.CSTNode] = {}  # nodes handed to remove() (held: ids stay unique)
        self.replaced: set[int] = set()  # original statements a codemod replaced with new code
        self.free: dict[str, bool] = {}  # names read or bound nowhere in the file (AccelifyCodemod.name_free)
        self.emptied: dict[int, cst.CSTNode] = {}  # blocks left with a `pass` only
        self.results: dict[int, list[cst.BaseStatement]] = {}  # original statement -> what it became
        self.origin: dict[int, cst.BaseStatement] = {}  # id(statement of the new tree) -> original
        self.held: list[cst.CSTNode] = []  # nodes whose ids are keys above
        self.current: list[cst.CSTNode] = []  # original nodes being visited, innermost last
        self.codemods: dict[str, "AccelifyCodemod"] = {}
        #: ids of `accelerator` names written where they do not decide where the Accelerator goes
        self.quiet_uses: set[int] = set()
        #: decisions codemods ask of one another, computed once on first request
        self.vanishing: Optional[frozenset[int]] = None  # see AccelifyCodemod.vanishing
        self.device_creation: Optional[tuple[Optional[cst.BaseStatement]]] = None  # see RemoveDevice.creation_site

    def codemod(self, code: str) -> Optional["AccelifyCodemod"]:
        """The codemod with ``code`` in this run, if it runs."""
        return self.codemods.get(code)

    def origin_of(self, stmt: cst.CSTNode) -> Optional[cst.BaseStatement]:
        return self.origin.get(id(stmt))


def vanishing_statements(shared) -> frozenset[int]:
    """Original statements of the setup scope that the conversion leaves doing nothing, so they
    go (``model = model.to(device)``, ``model = nn.DataParallel(model)``): what binds the training
    objects is decided without them."""
    placement = shared.codemod("ACC003")
    data_parallel = shared.codemod("ACC006")
    if placement is None and data_parallel is None:
        return frozenset()
    root = scope_root(shared.module, placement.plan.setup if placement is not None else data_parallel.plan.setup)
    body = root if isinstance(root, cst.Module) else getattr(root, "body", None)
    if not isinstance(body, (cst.Module, cst.IndentedBlock)):
        return frozenset()
    found = set()
    for stmt, _ in iter_statements(body):
        assign = simple_assign(stmt)
        if assign is None or len(assign.targets) != 1:
            continue
        expr, stripped = assign.value, False
        while isinstance(expr, cst.Call):
            if placement is not None and isinstance(expr.func, cst.Attribute) and placement.would_strip(expr):
                expr = placement.stripped(expr)
            elif data_parallel is not None and data_parallel.unwraps(expr):
                expr = expr.args[0].value
            else:
                break
            if expr is None:
                break
            stripped = True
        if stripped and expr is not None and is_noop(cst.Assign(targets=assign.targets, value=expr)):
            found.add(id(stmt))
    return frozenset(found)


def with_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``keyword=value`` as its last argument (after a trailing comma it ends with one too)."""
    added = cst.Arg(keyword=cst.Name(keyword), value=value,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    args = list(call.args)
    if args and args[-1].comma != cst.MaybeSentinel.DEFAULT:  # a trailing comma: keep the style
        return call.with_changes(args=[*args, added.with_changes(comma=args[-1].comma)])
    return call.with_changes(args=[*args, added])
