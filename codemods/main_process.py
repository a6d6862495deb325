"""ACC008: logs and progress bars once, on the main process."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import (
    FunctionScope, MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider,
)

from accelify.analyses.plan import Plan
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.blocks import scope_root
from accelify.queries.names import qualified_names
from accelify.queries.refs import MODULE, key_at
from accelify.queries.training import setup_blocks
from accelify.queries.trees import descendants, rebuild_with, replace_in
from accelify.queries.walk import findall
from accelify.queries.workers import run_by_workers

from .base import AccelifyCodemod, accelerator_attr, add_target_import, with_keyword

_PRINT = frozenset({"builtins.print", "print"})
_WRITES = {"sys.stdout.write": None, "sys.stderr.write": "sys.stderr"}


#: library functions that print unless told not to, by ``verbose=``: thop's FLOPs counter
_VERBOSE_LIBRARIES = frozenset({"thop.profile", "thop.profile.profile"})


def _calls_by_name(node: cst.CSTNode) -> list[cst.Call]:
    """The calls of a plain name in ``node``, not inside the functions and classes it defines."""
    return [n for n in descendants(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)]


class MainProcessOutput(AccelifyCodemod):
    """``print`` -> ``accelerator.print``; ``tqdm(...)`` only draws on the local main process.

    With N processes every ``print`` would appear N times and every progress bar
    would be drawn N times.  Only calls that run after the Accelerator exists are
    rewritten: a ``print`` before it, in the function that creates it, stays.  A
    ``sys.stdout.write(text)`` statement (a progress line rewritten in place) is a
    ``print`` with no end of its own: ``accelerator.print(text, end="")``. thop's
    ``profile(model, inputs=...)`` (a FLOPs count, common in research code) prints a
    line per layer type it registers: it gets ``verbose=accelerator.is_main_process``.
    A ``print`` in a function of the script the Accelerator does not reach (a
    ``log(message)`` helper) becomes ``PartialState().print`` (not in what DataLoader
    workers run, nor beside ``Accelerator(cpu=...)``). The modules of the project the
    script imports print once too: their ``print`` calls in functions and methods (a
    dataset's ``__init__`` saying what it loaded) become ``PartialState().print``
    (:func:`module_prints`).

    Before::

        import sys

        import torch
        from tqdm.auto import tqdm

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in tqdm(range(3)):
            print(f"epoch {epoch}")
            sys.stdout.write(f"\\rloss {loss:.3f}")

    After::

        import sys

        import torch
        from tqdm.auto import tqdm

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in tqdm(range(3), disable=not accelerator.is_local_main_process):
            accelerator.print(f"epoch {epoch}")
            accelerator.print(f"\\rloss {loss:.3f}", end="")
    """

    CODE = "ACC008"
    NAME = "main-process-output"
    DESCRIPTION = ("print (and sys.stdout.write) -> accelerator.print; tqdm(...) gets disable=not "
                   "accelerator.is_local_main_process.")
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "print(" in code or "tqdm" in code or "trange" in code or ".write(" in code or "thop" in code

    def visit_Module(self, node: cst.Module) -> None:
        # Functions a print of which becomes `PartialState().print` when the Accelerator does not reach it: not
        # what a DataLoader's workers run, not with `Accelerator(cpu=...)` or the script's own Accelerator (a state
        # made before it would not know `cpu=True`), not in a notebook (`notebook_launcher` refuses a state made before it), not where
        # the script binds `PartialState` itself.
        self._in_workers = run_by_workers(node) if self.plan.cpu_flag is None and not self.plan.has_accelerator and not str(
            self.context.filename or "").endswith(".ipynb") and not findall(node, m.Name("PartialState")) else None
        self._names: dict[int, bool] = {}  # id of a module-level function -> the module names it (`_named`)
        # Statements of the setup block that run before the Accelerator is created.
        self._before: set[int] = set()
        self._rewrites: list[tuple[cst.CSTNode, cst.CSTNode, Optional[str], object]] = []
        root = scope_root(node, self.plan.setup)
        if root is None:
            return
        creation = m.SimpleStatementLine(body=[m.Assign(value=m.Call(func=m.Name("Accelerator")))])
        for block in setup_blocks(root):
            for i, stmt in enumerate(block.body):
                if m.matches(stmt, creation):
                    self._before = {id(s) for s in block.body[:i]}
                    self._keep_alive = block
                    return

    def _reachable(self, node: cst.CSTNode) -> Optional[str]:
        accelerator = self.accelerator_at(node)
        if accelerator is None:
            return None
        key = key_at(self, node)
        if key in (self.plan.setup, MODULE) and self._inside_before(node):
            return None
        return accelerator

    def _inside_before(self, node: cst.CSTNode) -> bool:
        current: Optional[cst.CSTNode] = node
        while current is not None:
            if id(current) in self._before:
                return True
            current = self.get_metadata(ParentNodeProvider, current, None)
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        made = self._rewrite(original_node, updated_node)
        if made is not updated_node:
            # Where the Accelerator is created is decided after this pass (ACC001, ACC002): a call
            # that turns out to run before it is put back in `settle`.
            for name in _names_in(made, updated_node):
                self.shared.quiet_uses.add(id(name))
            self._rewrites.append((made, updated_node, key_at(self, original_node), self.changes[-1]))
        return made

    def settle(self, module: cst.Module) -> cst.Module:
        """After ACC001 placed the Accelerator: the prints and progress bars of the setup block that
        run before it is created stay as they were."""
        root = scope_root(module, self.plan.setup) if self._rewrites else None
        if root is None:
            return module
        creation = m.SimpleStatementLine(body=[m.Assign(value=m.Call(func=m.Name("Accelerator")))])
        for block in setup_blocks(root):
            at = next((i for i, stmt in enumerate(block.body) if m.matches(stmt, creation)), None)
            if at is None:
                continue
            module = self._settle_helpers(module, block.body[:at])
            block = next(b for b in setup_blocks(scope_root(module, self.plan.setup))  # type: ignore[arg-type]
                         if any(m.matches(stmt, creation) for stmt in b.body))
            back = {id(new): old for new, old, key, _ in self._rewrites if key in (self.plan.setup, MODULE)}
            body = list(block.body)
            for i in range(at):
                body[i] = rebuild_with(body[i], back, (cst.FunctionDef, cst.ClassDef, cst.Lambda))  # type: ignore[assignment]
            if all(a is b for a, b in zip(body, block.body)):
                return module
            was, now = _ids_in(block.body[:at]), _ids_in(body[:at])
            dropped = [change for new, _, _, change in self._rewrites if id(new) in was and id(new) not in now]
            self.changes = [c for c in self.changes if not any(c is d for d in dropped)]
            if block is module:
                return module.with_changes(body=body)
            return replace_in(module, block, block.with_changes(body=body))
        return module

    def _settle_helpers(self, module: cst.Module, before: list[cst.BaseStatement]) -> cst.Module:
        """The module's functions that the statements ``before`` the Accelerator call (directly or
        through one another: makemore's ``create_datasets``) print as they did: the Accelerator
        does not exist yet when they run. One that still reads it otherwise cannot run there."""
        functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        early: set[str] = set()
        todo = [c.func.value for stmt in before for c in _calls_by_name(stmt)]  # type: ignore[attr-defined]
        while todo:
            name = todo.pop()
            if name in functions and name not in early:
                early.add(name)
                todo += [c.func.value for c in _calls_by_name(functions[name].body)]  # type: ignore[attr-defined]
        if not early:
            return module
        back = {id(new): old for new, old, key, _ in self._rewrites if key in early}
        body = [rebuild_with(s, back) if isinstance(s, cst.FunctionDef) and s.name.value in early else s
                for s in module.body]
        kept = {id(new) for s in body for new in descendants(s)}
        self.changes = [c for c in self.changes if not any(
            c is change and id(new) not in kept for new, _, key, change in self._rewrites if key in early)]
        for s in body:
            if isinstance(s, cst.FunctionDef) and s.name.value in early and any(
                    isinstance(n, cst.Name) and n.value == self.plan.accelerator for n in descendants(s.body)):
                raise RuntimeError(f"`{s.name.value}` reads the Accelerator and runs before it is created")
        return module.with_changes(body=body)

    def _rewrite(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        names = qualified_names(self, original_node.func)
        if isinstance(original_node.func, cst.Name) and names & _PRINT:
            if self._to_a_file(original_node):
                return updated_node  # `print(row, file=csv_file)` writes a file: ACC017 / ACC127 decide
            if under_main_process_check(self, original_node):
                return updated_node  # `if rank == 0: print(...)`: once already
            accelerator = self._reachable(original_node)
            if accelerator is not None:
                self.change(original_node, "`print` -> `accelerator.print`: once, on the main process")
                return updated_node.with_changes(func=accelerator_attr(accelerator, "print"))
            if self._out_of_reach(original_node):
                self.change(original_node, "`print` -> `PartialState().print`: once, on the main process (the "
                            "Accelerator does not reach this function)")
                add_target_import(self.context, "PartialState")
                return updated_node.with_changes(func=cst.parse_expression("PartialState().print"))
            return updated_node
        if any(n.startswith("tqdm.") and n.endswith("tqdm.write") for n in names) and all(
                a.keyword is None or a.keyword.value in ("file", "end") for a in original_node.args):
            # `tqdm.write("Loss: ...")`: a print that spares the bars, which draw on the local main process only
            if under_main_process_check(self, original_node):
                return updated_node
            accelerator = self._reachable(original_node)
            if accelerator is None:
                return updated_node
            self.change(original_node, "`tqdm.write` -> `accelerator.print`: once, on the main process")
            return updated_node.with_changes(func=accelerator_attr(accelerator, "print"))
        written = next((_WRITES[n] for n in names if n in _WRITES), False)
        if written is not False and self._console_write(original_node):
            # `sys.stdout.write("\rBatch[3] ...")`, as a statement: `print` with no end of its own
            if under_main_process_check(self, original_node):
                return updated_node
            accelerator = self._reachable(original_node)
            if accelerator is None:
                return updated_node
            self.change(original_node, "`sys.stdout.write` -> `accelerator.print(..., end=\"\")`: once, on the main process")
            extra = ', end=""' + (f", file={written}" if written else "")
            made = cst.parse_expression(f'f(x{extra})').args[1:]  # type: ignore[attr-defined]
            text = updated_node.args[0]
            if text.comma != cst.MaybeSentinel.DEFAULT:  # `write(text,)`: the trailing comma stays last
                made = [*made[:-1], made[-1].with_changes(comma=text.comma)]
            return updated_node.with_changes(func=accelerator_attr(accelerator, "print"), args=[
                text.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *made])
        if names & _VERBOSE_LIBRARIES and not any(
                a.keyword is not None and a.keyword.value in ("verbose", "report_missing") for a in original_node.args):
            # thop's `profile(model, inputs=...)` prints a line per layer type it registers: on every process
            accelerator = self._reachable(original_node)
            if accelerator is None or under_main_process_check(self, original_node):
                return updated_node
            self.change(original_node, "`profile` prints its registrations on the main process only")
            return with_keyword(updated_node, "verbose", accelerator_attr(accelerator, "is_main_process"))
        if any(n.startswith("tqdm.") and n.rsplit(".", 1)[-1] in ("tqdm", "trange") for n in names):
            if any(a.keyword is not None and a.keyword.value == "disable" for a in original_node.args):
                return updated_node
            accelerator = self._reachable(original_node)
            if accelerator is None:
                return updated_node
            self.change(original_node, "progress bar drawn on the local main process only")
            return with_keyword(updated_node, "disable", cst.parse_expression(f"not {accelerator}.is_local_main_process"))
        return updated_node


    def _out_of_reach(self, call: cst.Call) -> bool:
        """A print in a function or method of the script that the Accelerator does not reach (a ``log(message)``
        helper, a dataset's ``__init__``): every process would print it. ``PartialState()``, the state the
        processes share with the Accelerator, prints it on the main process, as in the project's modules
        (:func:`module_prints`). Not in the setup scope, whose prints before the Accelerator stay."""
        if self._in_workers is None or key_at(self, call) in (self.plan.setup, MODULE, None):
            return False
        if any(a.keyword is not None and a.keyword.value not in ("sep", "end", "flush") for a in call.args):
            return False  # `print(..., force=True)` of a print silencer (DINO's): every process, on purpose
        node = self.get_metadata(ParentNodeProvider, call, None)
        inside = False
        while node is not None:
            if isinstance(node, cst.FunctionDef):
                if id(node) in self._in_workers:
                    return False
                if isinstance(self.get_metadata(ParentNodeProvider, node, None), cst.Module) and not self._named(node):
                    return False  # a function of the module nothing names (a set-up helper the conversion drops)
                inside = True
            node = self.get_metadata(ParentNodeProvider, node, None)
        return inside

    def _named(self, function: cst.FunctionDef) -> bool:
        """Does the module name ``function`` anywhere but in its definition (asked once per function)?"""
        if id(function) not in self._names:
            self._names[id(function)] = any(
                n is not function.name for n in findall(self.shared.module, m.Name(function.name.value)))
        return self._names[id(function)]

    def _to_a_file(self, call: cst.Call) -> bool:
        """``print(..., file=f)`` to anything but the console (``sys.stdout``, ``sys.stderr``)."""
        target = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "file"), None)
        return target is not None and not (qualified_names(self, target) & {"sys.stdout", "sys.stderr"})

    def _console_write(self, call: cst.Call) -> bool:
        """``sys.stdout.write(text)`` as a statement of its own (its count of characters unused), in code
        that trains or is handed the training objects: a home-made progress bar of its own (kuangliu's
        ``progress_bar``) is left whole, its calls made by the main process (ACC023)."""
        key = key_at(self, call)
        training = {self.plan.setup, *self.plan.needs_accelerator} | {
            k for kind in ("model", "loader") for k, _ in self.plan.flow[kind]}
        return (len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star
                and isinstance(self.get_metadata(ParentNodeProvider, call, None), cst.Expr) and key in training)


def _names_in(made: cst.CSTNode, before: cst.CSTNode) -> list[cst.Name]:
    """The ``Name`` nodes of ``made`` that ``before`` did not have (the ``accelerator`` written)."""
    old = _ids_in([before])
    return [n for n in descendants(made) if isinstance(n, cst.Name) and id(n) not in old]


def _ids_in(nodes) -> set[int]:
    return {id(n) for node in nodes for n in descendants(node)}


def module_prints(source: str, target: str = "accelerate", wrapper: Optional[MetadataWrapper] = None
                  ) -> Optional[tuple[str, list[int]]]:
    """ACC008 in a module of the project the converted script imports (a dataset whose ``__init__`` prints the
    size of the data, a helper that prints what it loads): that code runs on every process, and cannot reach the
    script's Accelerator. Its ``print(...)`` calls inside functions and methods become
    ``PartialState().print(...)`` (the state every process shares with the Accelerator: printed on the main
    process, as by ``accelerator.print``), with the import added. Left alone: the module's top (run at import),
    methods a DataLoader's workers run (``__getitem__``, and what the module's code there calls), a
    ``print(..., file=f)``, and a module that binds
    ``PartialState`` itself. Returns (the new text, the lines changed), or None when nothing changes.
    ``wrapper``: the module, parsed from ``source`` already (accelify.analyses.foreign read it)."""
    if "print" not in source:
        return None  # (no parse for a module that cannot print)
    try:
        wrapper = wrapper or MetadataWrapper(cst.parse_module(source))
    except (cst.ParserSyntaxError, RecursionError):
        return None
    tree = wrapper.module
    if findall(tree, m.Name("PartialState")):
        return None
    chosen: set[int] = set()
    lines: list[int] = []
    in_workers = run_by_workers(tree)

    class _Find(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

        def __init__(self) -> None:
            super().__init__()
            self.functions: list[bool] = []  # per function entered: do a DataLoader's workers run it?

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            # (a worker method is in them; a function defined in one runs there too)
            self.functions.append(id(node) in in_workers or (bool(self.functions) and self.functions[-1]))

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.functions.pop()

        def visit_Call(self, node: cst.Call) -> None:
            if not (isinstance(node.func, cst.Name) and "builtins.print" in
                    {q.name for q in self.get_metadata(QualifiedNameProvider, node.func, set())}):
                return
            if not self.functions or self.functions[-1] or not isinstance(
                    self.get_metadata(ScopeProvider, node, None), FunctionScope):
                return
            if any(a.keyword is not None and a.keyword.value == "file" for a in node.args):
                return
            chosen.add(id(node))
            lines.append(self.get_metadata(PositionProvider, node).start.line)

    wrapper.visit(_Find())
    if not chosen:
        return None

    class _Rewrite(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            if id(original_node) not in chosen:
                return updated_node
            return updated_node.with_changes(func=cst.parse_expression("PartialState().print"))

    context = CodemodContext(scratch={"accelify.target": target})
    add_target_import(context, "PartialState")
    rewritten = AddImportsVisitor(context).transform_module(tree.visit(_Rewrite()))
    return rewritten.code, sorted(lines)
