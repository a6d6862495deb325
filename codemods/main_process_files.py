"""ACC017: files written once, on the main process; directories created without a race."""

from __future__ import annotations

import re

from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.analyses.early_stop import EarlyStops
from accelify.analyses.hazards import COLLECTIVES
from accelify.analyses.plan import Plan
from accelify.analyses.ranks import under_main_process_check
from accelify.queries.blocks import binds, enclosing_function, opened_around, scope_root, statement_line, under, under_rank_test
from accelify.queries.loops import peel_iterable
from accelify.queries.names import TORCH_LOAD, WRITERS, qualified_names, string_value
from accelify.queries.refs import assigned_values, key_at, ref_of
from accelify.queries.settings import SETTINGS_WRITERS, same_on_every_process
from accelify.queries.training import BACKWARD, setup_blocks
from accelify.queries.trees import Item
from accelify.queries.walk import findall

from .base import AccelifyCodemod, with_keyword

#: what writes a log's rows into a file handle (`csv.writer(f).writerow(...)`)
_CSV_WRITERS = frozenset({"csv.writer", "csv.DictWriter"})
#: pandas' writers, methods of a DataFrame whose type accelify cannot know: by name, with a path
_TABLE_WRITERS = ("to_csv", "to_parquet", "to_json", "to_excel", "to_pickle", "to_feather")
_MAKEDIRS = frozenset({"os.makedirs"})
_MKDIR = frozenset({"os.makedirs", "os.mkdir"})
_EXISTS = frozenset({"os.path.exists", "os.path.isdir"})
#: TensorBoard writers: created and written by the main process when every use is a statement of its own
_TENSORBOARD = frozenset({"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
                          "tensorboardX.SummaryWriter"})
#: experiment trackers' runs: every process but the main one gets ``mode="disabled"``
_RUNS = frozenset({"wandb.init"})
#: loggers every process would run: left to the user (ACC127) but for the TensorBoard writers and runs above
_LOGGERS = _TENSORBOARD | _RUNS | frozenset({"mlflow.start_run"})
#: handlers that write the standard library's log records to a file (codesearch, PointNet, ODE-Net): made and
#: attached by the main process where every use is a statement of its own, else ACC127
_LOG_FILES = frozenset({"logging.FileHandler", "logging.handlers.RotatingFileHandler",
                        "logging.handlers.TimedRotatingFileHandler"})
#: calls every process must make: a logging statement that makes one cannot go under the main process
_COLLECTIVE_CALLS = COLLECTIVES | frozenset({"all_reduce", "all_gather", "barrier", "broadcast", "check_trigger"})


#: URL fetches: a helper that calls one downloads
_FETCHES = frozenset({
    "urllib.request.urlopen", "urllib.request.urlretrieve", "requests.get", "torch.hub.download_url_to_file",
    "torchvision.datasets.utils.download_url", "torchvision.datasets.utils.download_and_extract_archive",
    "wget.download", "gdown.download",
})


def _run_mode_converted(call: cst.Call) -> bool:
    """``wandb.init(..., mode=... if accelerator.is_main_process else "disabled")``: converted already."""
    return any(a.keyword is not None and a.keyword.value == "mode" and m.matches(a.value, m.IfExp(
        test=m.Attribute(attr=m.Name("is_main_process")), orelse=m.SimpleString())) for a in call.args)


def _downloads(call: cst.Call) -> bool:
    """``download=True`` or ``download=opts.download`` (anything but ``False``/``None``)."""
    return any(a.keyword is not None and a.keyword.value == "download"
               and not m.matches(a.value, m.Name("False") | m.Name("None")) for a in call.args)


class MainProcessFiles(AccelifyCodemod):
    """Sample images, ``save_pretrained`` and other files are written by the main process; directories are made race-free.

    Every process runs the whole script: a ``save_image`` would write the same file once
    per process, at the same time; a dataset built with ``download=True`` in the setup code is
    built under ``with accelerator.main_process_first():`` (downloaded once, then read).  ``if not os.path.exists(d): os.makedirs(d)`` races (two
    processes see no directory, the second ``makedirs`` fails): ``exist_ok=True`` does not.  In an
    evaluation script a ``with open(path, "w") as f:`` block after its loops is written by the
    main process too (what it writes was gathered); one inside the loop over the prepared loader
    is refused (ACC131).  A ``with open(path, "w")`` outside any loop that writes only the run's
    settings (``json.dump(vars(args), f)``: options, literals and pure functions of them, the same
    on every process) is written by the main process; so is a log (``with open(logname, "a") as f:``
    whose body only writes to ``f``, ``csv.writer(f).writerow(...)`` included, a path the script never
    reads back): rank 0's values, as ``accelerator.print`` shows them, once.  Any other file opened for
    writing is left with ACC127.  A ``logging.FileHandler`` whose every use is a statement of its own
    (``handler.setFormatter(...)``, ``logger.addHandler(handler)``) is made and attached by the main process:
    one process writes the log file (the others' records reach no handler of that logger); any other is left
    with ACC127 (every process's records in one file).  A TensorBoard ``SummaryWriter`` whose every use is a statement of its own
    (``writer.add_scalar(...)``) is created and written by the main process; an optional one
    (``SummaryWriter(...) if args.log else None``, used under ``if writer is not None:``) gets the
    main process as one more condition.  A wandb run (``wandb.init(...)``) gets ``mode="disabled"`` on every
    process but the main one.  A call of another module's function that writes files
    (accelify.analyses.foreign) is made by the main process.

    Before::

        import os

        import torch
        from torchvision.utils import save_image

        if not os.path.exists("samples"):
            os.makedirs("samples")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            save_image(model.sample(), f"samples/{epoch}.png")

    After::

        import os

        import torch
        from torchvision.utils import save_image

        os.makedirs("samples", exist_ok=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            if accelerator.is_main_process:
                save_image(model.sample(), f"samples/{epoch}.png")
    """

    AFTER = frozenset({"ACC002"})
    CODE = "ACC017"
    NAME = "main-process-files"
    DESCRIPTION = ("save_image/savefig/np.save/save_pretrained/other torch.save/shutil copies on the main process only; "
                   "os.makedirs(..., exist_ok=True) "
                   "instead of a racing check; download=True under main_process_first().")
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.foreign_writers) or any(word in code for word in ("save", "mkdir", "makedirs", "open(", "download", "Writer", "init(", "start_run", "Handler", "basicConfig",
                                             *_TABLE_WRITERS))

    def _writer(self, stmt: cst.CSTNode) -> bool:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call())])):
            return False
        func = stmt.body[0].value.func  # type: ignore[attr-defined]
        # `model.save_pretrained(dir)` / `tokenizer.save_pretrained(dir)`: the Hugging Face convention;
        # `df.to_csv(path)` (pandas: with no path it returns the text instead)
        call = stmt.body[0].value  # type: ignore[attr-defined]
        if id(call) in self.plan.foreign_writers:  # another module's function that writes files
            return True
        if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("save"))) and call.args and self._made_by(
                func.value, ("matplotlib.", "PIL.")):  # type: ignore[attr-defined]
            return True  # `anim.save("celeba.gif")` of an animation, `img.save(path)` of a PIL image
        return bool(qualified_names(self, func) & WRITERS) or m.matches(func, m.Attribute(attr=m.Name("save_pretrained"))) or (
            m.matches(func, m.Attribute(attr=m.OneOf(*(m.Name(n) for n in _TABLE_WRITERS)))) and bool(call.args))

    def _per_process_path(self, call: cst.Call) -> bool:
        """The file ``call`` writes is one of each process's own: its path reads a rank, a process id
        (``f"log_{rank}.txt"``, ``os.path.join(tmpdir, name)`` with ``tmpdir = f"tmp_{os.getpid()}"``)."""
        if not call.args:
            return False
        parts: list[cst.CSTNode] = [call.args[0].value]
        for name in findall(call.args[0].value, m.Name()):
            parts += [v for v in assigned_values(self, name) if v is not None]  # type: ignore[arg-type]
        for part in parts:
            if any(re.search(r"rank|pid|process|worker", n.value, re.IGNORECASE) for n in findall(part, m.Name())):
                return True
        return False

    def _into_an_open_file(self, call: cst.Call) -> bool:
        """``np.save(f, array)`` inside ``with open(path, "wb") as f:``: every process opens (and truncates) the
        file, so the write alone on the main process would leave the others' empty; it stays as written (a path
        per process, ``.part-{os.getpid()}``, included)."""
        target = call.args[0].value if call.args else None
        return isinstance(target, cst.Name) and opened_around(self, call, target.value) is not None

    def _made_by(self, name: cst.Name, packages: tuple[str, ...]) -> bool:
        """Is ``name`` bound only to what a call of one of ``packages`` returns
        (``anim = animation.ArtistAnimation(...)``, ``im = Image.fromarray(...)``)?"""
        values = assigned_values(self, name)
        return bool(values) and all(isinstance(v, cst.Call) and any(
            n.startswith(packages) for n in qualified_names(self, v.func)) for v in values)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement]]:
        updated = super().leave_SimpleStatementLine(original_node, updated_node)
        if id(original_node) in self._logger_lines:
            self.change(original_node, "the TensorBoard writer is created and written by the main process")
            self._guard[id(original_node)] = self._logger_lines[id(original_node)]
            return updated
        if self._writer(original_node) and not under_main_process_check(self, original_node) and not (
            self._per_process_path(original_node.body[0].value)  # type: ignore[attr-defined]
        ) and not self._into_an_open_file(original_node.body[0].value):  # type: ignore[attr-defined]
            accelerator = self.accelerator_at(original_node)
            if accelerator is None:
                return updated
            self.change(original_node, "written once, by the main process")
            self._guard[id(original_node)] = accelerator  # wrapped with its neighbours in edit_body
            line = self.line_of(original_node)[0]
            if self._pretrained(original_node) and any(load > line for load in self._loads) and self._everyone_gets_here(
                original_node
            ):
                # read back later (`from_pretrained`): every process waits until it is written
                self._wait.add(id(original_node))
            return updated
        if id(original_node) in self._first:
            accelerator = self._first[id(original_node)]
            self.change(original_node, "downloaded by the main process first, then read by the others")
            self.replaced(original_node)
            return self._under(f"with {accelerator}.main_process_first():", [updated_node])
        made = self._makedirs(original_node)
        if made is not None and not self._in_try(original_node) and not any(a.keyword is not None and a.keyword.value == "exist_ok" for a in made.args):
            self.change(original_node, "`os.makedirs(..., exist_ok=True)`: every process may create it")
            return updated_node.with_changes(body=[updated_node.body[0].with_changes(value=self._exist_ok(made))])
        return updated

    def visit_Module(self, node: cst.Module) -> None:
        self._guard: dict[int, str] = {}  # writer statements -> the accelerator that guards them
        self._first: dict[int, str] = {}  # downloading statements -> under main_process_first()
        self._module = node
        self._helpers = self._download_helpers(node)
        self._wait: set[int] = set()  # guarded writes every process waits for (the file is read back)
        self._guard_with: dict[int, str] = {}  # an evaluation's `with open(path, "w")` -> its accelerator
        # TensorBoard writers: their statements -> the accelerator; `X if flag else None` tests -> the accelerator
        self._logger_lines: dict[int, str] = {}
        self._logger_tests: dict[int, str] = {}
        self._loggers_handled: set[int] = set()  # the SummaryWriter(...) calls those take care of
        self._main_process_loggers(node)
        self._runs: dict[int, str] = {}  # `wandb.init(...)` calls -> the accelerator whose main process logs
        for call in findall(node, m.Call()):
            if qualified_names(self, call.func) & _RUNS and not under_main_process_check(self, call):  # type: ignore[attr-defined]
                accelerator = self.accelerator_at(call)
                if accelerator is not None:
                    self._loggers_handled.add(id(call))
                    if not _run_mode_converted(call):  # type: ignore[arg-type]
                        self._runs[id(call)] = accelerator
        self._taint = EarlyStops(self, self.plan, node, [], [])
        self._loads = [self.line_of(c)[0] for c in findall(node, m.Call()) if (
            qualified_names(self, c.func) & TORCH_LOAD  # type: ignore[arg-type]
            or m.matches(c.func, m.Attribute(attr=m.Name("from_pretrained"))))]  # type: ignore[arg-type]
        # `accelerator = Accelerator(...)` written where the device was (ACC002)
        device = self.other("ACC002")
        site = device.creation_site() if device is not None else None  # type: ignore[attr-defined]
        self._site = self.statements_around(site)
        self._created = site is not None
        if not self._created and self.plan.has_accelerator:
            # the script creates its Accelerator itself (converted already): downloads after it only
            existing = [a for a in findall(node, m.Assign(value=m.Call())) if {"accelerate.Accelerator",
                        "accelerate.accelerator.Accelerator", "accelify.runtime.Accelerator"}
                        & qualified_names(self, a.value.func)]  # type: ignore[attr-defined]
            self._site = frozenset().union(*(self.statements_around(a) for a in existing))
            self._created = bool(existing)
        # downloading statements (and calls of a downloading helper), decided before any body is visited:
        # the helper's own downloads are reported or not by whether its calls are guarded
        for statement in findall(node, m.SimpleStatementLine()):
            if any(_downloads(c) for c in findall(statement, m.Call())) or self._calls_download_helper(statement):  # type: ignore[arg-type]
                accelerator = self._download_guard(statement)
                if accelerator is not None:
                    self._first[id(statement)] = accelerator

    def _download_guard(self, stmt: Optional[cst.CSTNode]) -> Optional[str]:
        """The accelerator to put a downloading statement under ``main_process_first()`` with, when
        it is a statement of the setup scope that runs after the Accelerator can exist."""
        if not isinstance(stmt, cst.SimpleStatementLine) or self.plan.class_mode or under_main_process_check(self, stmt):
            return None
        if key_at(self, stmt) != self.plan.setup:
            return None
        if self._main_process_first(stmt):
            return None  # already downloaded by the main process first
        accelerator = self.accelerator_at(stmt)
        block = self.get_metadata(ParentNodeProvider, stmt, None)
        if accelerator is None or not isinstance(block, (cst.Module, cst.IndentedBlock)):
            return None
        root = scope_root(self._module, self.plan.setup)
        blocks = list(setup_blocks(root)) if root is not None else []
        if not any(b is block for b in blocks):
            return None  # in a loop or a nested function
        before = list(block.body[: next(i for i, s in enumerate(block.body) if s is stmt)])
        if self._created:
            # created where the device was: this statement must come after it (in the same block, or
            # in an `if` branch after it: the dataset chosen by an option)
            if not self._after_site(stmt):
                return None
        elif any(binds(s, self.plan.argument_names) for s in block.body[len(before):]):
            return None  # the Accelerator's arguments are bound after this: it cannot come before
        return accelerator

    def _helper_guarded(self, node: cst.CSTNode, seen: frozenset[str] = frozenset()) -> bool:
        """A download inside a helper every call of which is downloaded by the main process first
        (directly, or from another such helper: ``get_training_set()`` -> ``download_bsd300()``)."""
        function = enclosing_function(self, node)
        if function is None or self._helpers.get(function.name.value) is not function or function.name.value in seen:
            return False
        calls = [c for c in findall(self._module, m.Call(func=m.Name(function.name.value)))]
        return bool(calls) and all(
            id(statement_line(self, c)) in self._first or self._main_process_first(c)
            or self._helper_guarded(c, seen | {function.name.value}) for c in calls)

    def _main_process_first(self, node: cst.CSTNode) -> bool:
        """Is ``node`` inside a ``with ....main_process_first():`` block?"""
        current = self.get_metadata(ParentNodeProvider, node, None)
        while current is not None:
            if isinstance(current, cst.With) and any(
                    findall(item.item, m.Attribute(attr=m.Name("main_process_first"))) for item in current.items):
                return True
            current = self.get_metadata(ParentNodeProvider, current, None)
        return False

    def _after_site(self, stmt: cst.CSTNode) -> bool:
        """Does ``stmt``, or a statement around it, come after the statement that creates the Accelerator
        in the same block?"""
        node: Optional[cst.CSTNode] = stmt
        while node is not None:
            parent = self.get_metadata(ParentNodeProvider, node, None)
            body = getattr(parent, "body", None)
            if isinstance(body, (list, tuple)) and any(s is node for s in body):
                before = body[: next(i for i, s in enumerate(body) if s is node)]
                if any(id(s) in self._site for s in before):
                    return True
            node = parent
        return False

    def _download_helpers(self, module: cst.Module) -> dict[str, cst.FunctionDef]:
        """Module-level functions that download: a dataset built with ``download=...``
        (``get_dataset(opts)``), a URL fetched (``urllib.request.urlopen``, ``requests.get``), or a call
        of another such function (``get_training_set()`` -> ``download_bsd300()``)."""
        functions = {f.name.value: f for f in module.body if isinstance(f, cst.FunctionDef)}
        helpers = {name: f for name, f in functions.items() if any(
            _downloads(c) or qualified_names(self, c.func) & _FETCHES for c in findall(f, m.Call()))}  # type: ignore[arg-type]
        grew = True
        while grew:
            grew = False
            for name, function in functions.items():
                if name not in helpers and any(m.matches(c, m.Call(func=m.Name())) and c.func.value in helpers  # type: ignore[attr-defined]
                                               for c in findall(function, m.Call())):
                    helpers[name] = function
                    grew = True
        return helpers

    def _calls_download_helper(self, node: cst.CSTNode) -> bool:
        return any(m.matches(c, m.Call(func=m.Name())) and c.func.value in self._helpers  # type: ignore[attr-defined]
                   for c in findall(node, m.Call()))

    def visit_Call(self, node: cst.Call) -> None:
        """ACC127: loggers, files opened for writing and downloads every process runs."""
        if under_main_process_check(self, node):
            return
        names = qualified_names(self, node.func)
        what = None
        if id(node) in self._loggers_handled:
            return  # a TensorBoard writer or a log file's handler, made by the main process
        if names & _LOGGERS:
            what = f"`{cst.Module(body=[]).code_for_node(node.func)}(...)`: every process logs"
            how = "create it and log under `if accelerator.is_main_process:` (or use `Accelerator(log_with=...)`)"
        elif names & _LOG_FILES or (names & {"logging.basicConfig"} and any(
                a.keyword is not None and a.keyword.value == "filename" for a in node.args)):
            what = f"`{cst.Module(body=[]).code_for_node(node.func)}(...)`: every process writes that log file"
            how = ("attach the file handler on the main process only (`if accelerator.is_main_process:`), or log "
                   "with `accelerate.logging.get_logger(__name__)`, which logs on the main process")
        elif names & {"builtins.open", "open"} and len(node.args) > 1 and (mode := string_value(node.args[1].value)) and set(mode) & set("wax"):
            if self.plan.evaluation and self._evaluation_file(node):
                return
            if self._helper_guarded(node):
                return  # a download helper's file: written by the main process first
            if "w" in mode and self._settings_file(node):
                return  # the settings of the run: written once, by the main process
            if self._log_file(node, mode):
                return  # a log of the run (a CSV of the epochs' metrics): written by the main process
            what = f"a file opened with mode {mode!r}: every process writes it"
            how = "write it under `if accelerator.is_main_process:` when its content is the same on every process"
        elif (self.plan.evaluation or self._in_evaluation_loop(node)) and self._per_batch_write(node):
            return
        elif _downloads(node) and id(statement_line(self, node)) not in self._first \
                and not self._main_process_first(node) and not self._helper_guarded(node):
            flag = next(a for a in node.args if a.keyword is not None and a.keyword.value == "download")
            what = f"`download={cst.Module(body=[]).code_for_node(flag.value)}`: every process downloads into the same place at once"
            how = "build the dataset under `with accelerator.main_process_first():`"
        if what is not None:
            self.finding(node, "ACC127", f"{what}; left as it is.", how + ".")

    # ------------------------------------------------------------ TensorBoard writers
    def _main_process_loggers(self, module: cst.Module) -> None:
        """``writer = SummaryWriter(...)`` whose every use is a statement of its own (``writer.add_scalar(...)``,
        ``writer.close()``) where the Accelerator is: the creation and the uses go under ``if
        accelerator.is_main_process:`` (one event file, not one per process). ``writer = SummaryWriter(...)
        if args.log else None`` whose every use is under ``if writer is not None:`` (or ``if writer:``): the
        main process is one more condition of its creation. Anything else keeps ACC127."""
        for call in findall(module, m.Call()):
            # `logger.addHandler(logging.FileHandler(path))`: the statement goes under the main process
            if qualified_names(self, call.func) & _LOG_FILES and not under_main_process_check(self, call):  # type: ignore[attr-defined]
                accelerator = self.accelerator_at(call)
                line = self._attaching_line(call, accelerator) if accelerator is not None else None
                if line is not None:
                    self._logger_lines[id(line)] = accelerator  # type: ignore[assignment]
                    self._loggers_handled.add(id(call))
        for assign in findall(module, m.Assign()):
            value = assign.value
            call = value.body if isinstance(value, cst.IfExp) and m.matches(value.orelse, m.Name("None")) else value
            if not isinstance(call, cst.Call):
                continue
            log_file = bool(qualified_names(self, call.func) & _LOG_FILES) and call is value
            if not (qualified_names(self, call.func) & _TENSORBOARD or log_file):
                continue
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                continue
            statement = self.get_metadata(ParentNodeProvider, assign, None)
            accelerator = self.accelerator_at(assign)
            if accelerator is None or not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 \
                    or under_main_process_check(self, statement):
                continue
            target = assign.targets[0].target
            scope = self.get_metadata(ScopeProvider, target, None)
            assignments = list(scope[target.value]) if scope is not None else []
            if len(assignments) != 1:
                continue
            uses = [a.node for a in assignments[0].references]
            if call is value:
                lines = [self._logging_line(use, accelerator) or (self._attaching_line(use, accelerator) if log_file else None)
                         for use in uses]
                if lines and all(line is not None for line in lines):
                    for line in [statement, *lines]:
                        if not under_main_process_check(self, line):  # (a use already under the check stays)
                            self._logger_lines[id(line)] = accelerator
                    self._loggers_handled.add(id(call))
            elif uses and all(self._checked_for_none(use, target.value) for use in uses):
                if not any(m.matches(n, m.Attribute(attr=m.Name("is_main_process")))
                           for n in findall(value.test, m.Attribute())):  # (converted already)
                    self._logger_tests[id(value)] = accelerator
                self._loggers_handled.add(id(call))

    def _logging_line(self, use: cst.CSTNode, accelerator: str) -> Optional[cst.SimpleStatementLine]:
        """The statement ``writer.add_scalar(...)`` that ``use`` (``writer``) starts, when it is a statement of
        its own, makes no collective call, and reaches the same Accelerator; None otherwise."""
        attribute = self.get_metadata(ParentNodeProvider, use, None)
        call = self.get_metadata(ParentNodeProvider, attribute, None) if isinstance(attribute, cst.Attribute) else None
        if not isinstance(call, cst.Call) or call.func is not attribute:
            return None
        line = self._own_line(call, accelerator)
        if line is None or any(isinstance(c.func, cst.Attribute) and c.func.attr.value in _COLLECTIVE_CALLS
                               for c in findall(line, m.Call())):
            return None
        return line

    def _attaching_line(self, use: cst.CSTNode, accelerator: str) -> Optional[cst.SimpleStatementLine]:
        """The statement ``logger.addHandler(handler)`` (or ``removeHandler``) that hands ``use`` (``handler``) to a
        logger, when it is a statement of its own that reaches the same Accelerator; None otherwise."""
        arg = self.get_metadata(ParentNodeProvider, use, None)
        call = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if not (isinstance(call, cst.Call) and m.matches(call.func, m.Attribute(attr=m.Name("addHandler") | m.Name("removeHandler")))
                and len(call.args) == 1):
            return None
        return self._own_line(call, accelerator)

    def _own_line(self, call: cst.Call, accelerator: str) -> Optional[cst.SimpleStatementLine]:
        """The line ``call`` is the only statement of, when code there reaches ``accelerator``; None otherwise."""
        expr = self.get_metadata(ParentNodeProvider, call, None)
        line = self.get_metadata(ParentNodeProvider, expr, None) if isinstance(expr, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        return line if self.accelerator_at(line) == accelerator else None

    def _checked_for_none(self, use: cst.CSTNode, name: str) -> bool:
        """Is ``use`` the test ``writer is not None`` / ``writer``, or under an ``if`` with that test?"""
        node: Optional[cst.CSTNode] = use
        checked = m.Comparison(left=m.Name(name), comparisons=[m.ComparisonTarget(
            operator=m.IsNot(), comparator=m.Name("None"))]) | m.Name(name)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if isinstance(parent, cst.If) and m.matches(parent.test, checked) and (
                    node is parent.body or node is parent.test):
                return True
            node = parent
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """``wandb.init(...)``: its ``mode`` is ``"disabled"`` on every process but the main one, where it
        stays as written (``None``, wandb's default, when not given): one run, and each ``run.log(...)``,
        ``wandb.log(...)`` of the others does nothing."""
        accelerator = self._runs.get(id(original_node))
        if accelerator is None:
            return updated_node
        self.change(original_node, "a wandb run on the main process only (`mode=\"disabled\"` on the others)")
        given = next((a for a in updated_node.args if a.keyword is not None and a.keyword.value == "mode"), None)
        value = given.value if given is not None else cst.Name("None")
        if isinstance(value, (cst.IfExp, cst.Lambda)):
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        strings = [n.value for n in findall(updated_node, m.SimpleString())]
        quote = "'" if strings and all(text.lstrip("rbuRBU").startswith("'") for text in strings) else '"'
        mode = cst.IfExp(test=cst.parse_expression(f"{accelerator}.is_main_process"), body=value,
                         orelse=cst.SimpleString(f"{quote}disabled{quote}"))
        if given is not None:
            return updated_node.with_changes(args=[a.with_changes(value=mode) if a is given else a for a in updated_node.args])
        return with_keyword(updated_node, "mode", mode)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        accelerator = self._logger_tests.get(id(original_node))
        if accelerator is None:
            return updated_node
        self.change(original_node, "the TensorBoard writer is created by the main process only")
        test = updated_node.test
        if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda)):
            test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node.with_changes(test=cst.BooleanOperation(
            left=test, operator=cst.And(), right=cst.parse_expression(f"{accelerator}.is_main_process")))

    # ------------------------------------------------------------ settings files
    def _settings_file(self, call: cst.Call) -> bool:
        """``with open(path, "w") as f:`` outside any loop, writing settings only (``json.dump(vars(args), f)``,
        ``f.write(json.dumps(config))``: the same on every process, accelify.queries.settings): written by
        the main process (True: guarded in leave_With)."""
        item = self.get_metadata(ParentNodeProvider, call, None)
        statement = self.get_metadata(ParentNodeProvider, item, None) if isinstance(item, cst.WithItem) else None
        if not isinstance(statement, cst.With) or self._in_loop(statement) or not isinstance(
                self.get_metadata(ParentNodeProvider, statement, None), (cst.IndentedBlock, cst.Module)):
            return False
        accelerator = self.accelerator_at(statement)
        handles = {i.asname.name.value for i in statement.items
                   if i.asname is not None and isinstance(i.asname.name, cst.Name)}
        if accelerator is None or len(handles) != len(statement.items) or not all(
                self._setting(a.value) for i in statement.items if isinstance(i.item, cst.Call) for a in i.item.args):
            return False
        if not all(self._writes_settings(stmt, handles, frozenset()) for stmt in statement.body.body):
            return False
        if self._read_back(call):
            return False  # read back by the script: every process needs it there
        self._guard_with[id(statement)] = accelerator
        return True

    def _log_file(self, call: cst.Call, mode: str) -> bool:
        """``with open(logname, "a") as f:`` whose body only writes to ``f`` (``f.write(...)``, ``print(...,
        file=f)``, ``json.dump(x, f)``, ``w = csv.writer(f)`` then ``w.writerow(...)``), with nothing the
        processes do together in it, where the Accelerator is, and a path the script never reads back: the
        run's log, written by the main process (rank 0's values, as `accelerator.print` shows them) rather
        than once per process into the same file (True: guarded in leave_With)."""
        if set(mode) - set("wat"):
            return False  # binary, or read too
        item = self.get_metadata(ParentNodeProvider, call, None)
        statement = self.get_metadata(ParentNodeProvider, item, None) if isinstance(item, cst.WithItem) else None
        if not isinstance(statement, cst.With) or len(statement.items) != 1 or not call.args or not isinstance(
                self.get_metadata(ParentNodeProvider, statement, None), (cst.IndentedBlock, cst.Module)):
            return False
        accelerator = self.accelerator_at(statement)
        handle = statement.items[0].asname.name if statement.items[0].asname is not None else None
        if accelerator is None or not isinstance(handle, cst.Name) or self._in_loader_loop(call):
            return False
        writers = {handle.value}
        for stmt in statement.body.body:
            if m.matches(stmt, m.SimpleStatementLine(body=[m.Pass()])):
                continue  # `with open(log_file, "w") as f: pass`: the log emptied (build-nanoGPT), once
            if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call()) | m.Assign(value=m.Call())])):
                return False
            small = stmt.body[0]  # type: ignore[attr-defined]
            inner: cst.Call = small.value
            if findall(inner, m.Attribute(value=m.Name(accelerator))) or findall(inner, m.Name(accelerator)):
                return False  # gathers, waits: every process must run it
            names = {n.value for n in findall(inner, m.Name())}
            if isinstance(small, cst.Assign):  # `logwriter = csv.writer(logfile, ...)`
                if not (qualified_names(self, inner.func) & _CSV_WRITERS) or not names & writers \
                        or len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
                    return False
                writers.add(small.targets[0].target.value)
                continue
            func = inner.func
            to_handle = (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
                         and func.value.value in writers and func.attr.value in (
                             "write", "writelines", "writerow", "writerows", "writeheader", "flush"))
            to_handle = to_handle or (  # `csv.writer(f).writerow(...)`
                isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call)
                and bool(qualified_names(self, func.value.func) & _CSV_WRITERS)
                and any(m.matches(a.value, m.Name(handle.value)) for a in func.value.args)
                and func.attr.value in ("writerow", "writerows", "writeheader"))
            printed = m.matches(func, m.Name("print")) and any(
                a.keyword is not None and a.keyword.value == "file" and m.matches(a.value, m.Name(handle.value))
                for a in inner.args)
            dumped = bool(qualified_names(self, func) & {"json.dump", "yaml.dump", "yaml.safe_dump"}) and any(
                m.matches(a.value, m.Name(handle.value)) for a in inner.args)
            if not (to_handle or printed or dumped):
                return False
        if self._per_process_path(call):
            return False  # `f"log_{rank}.txt"`: a file per process
        if self._read_back(call):
            return False
        self._guard_with[id(statement)] = accelerator
        return True

    def _read_back(self, call: cst.Call) -> bool:
        """Is the path ``open(path, "w")`` writes used by the script otherwise than to write it or to ask
        whether it exists (read back, handed on)? The other processes may need the file then."""
        path = cst.Module(body=[]).code_for_node(call.args[0].value)
        for other in findall(self.shared.module, m.Call()):
            if other is call or not other.args or cst.Module(body=[]).code_for_node(other.args[0].value) != path:
                continue
            if qualified_names(self, other.func) & {"os.path.exists", "os.path.isfile"}:
                continue
            if m.matches(other.func, m.Name("open")) and len(other.args) > 1 and set(
                    string_value(other.args[1].value) or "r") & set("wa"):
                continue
            return True
        return False

    def _setting(self, expr: cst.BaseExpression, allowed: frozenset[int] = frozenset()) -> bool:
        return same_on_every_process(self, self.shared.module, expr, allowed)

    def _writes_settings(self, stmt: cst.CSTNode, handles: set[str], allowed: frozenset[int]) -> bool:
        """``f.write(setting)``, ``json.dump(setting, f)``, ``print(setting, file=f)``, or a ``for`` over
        settings whose body writes only those (``for k, v in sorted(vars(args).items()): f.write(...)``)."""
        if isinstance(stmt, cst.For) and not stmt.orelse and self._setting(stmt.iter, allowed):
            targets = {n.value for n in findall(stmt.target, m.Name())}
            inner = allowed | {id(n) for n in findall(stmt.body, m.Name()) if n.value in targets}
            return all(self._writes_settings(s, handles, inner) for s in stmt.body.body)
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call())])):
            return False
        call: cst.Call = stmt.body[0].value  # type: ignore[attr-defined]
        args = [a.value for a in call.args]
        handle = [i for i, a in enumerate(args) if isinstance(a, cst.Name) and a.value in handles]
        if m.matches(call.func, m.Attribute(attr=m.Name("write") | m.Name("writelines"))) and isinstance(
                call.func.value, cst.Name) and call.func.value.value in handles:  # type: ignore[attr-defined]
            handle = []
        elif not (qualified_names(self, call.func) & SETTINGS_WRITERS) or len(handle) != 1:
            return False
        return all(self._setting(a, allowed) for i, a in enumerate(args) if i not in handle)

    # ------------------------------------------------------------ evaluation scripts
    def _evaluation_file(self, call: cst.Call) -> bool:
        """An evaluation's ``with open(path, "w") as f:`` after its loops: what it writes was gathered,
        the same on every process, so the main process writes it (True: handled).  Written batch by
        batch, inside the loop over the prepared loader, each process would write its own shard into
        the same file: refused (ACC131, also True)."""
        item = self.get_metadata(ParentNodeProvider, call, None)
        statement = self.get_metadata(ParentNodeProvider, item, None) if isinstance(item, cst.WithItem) else None
        if self._in_loader_loop(call) or (isinstance(statement, cst.With) and self._runs_loader(statement)):
            self._refuse_per_batch(call)
            return True
        if not isinstance(statement, cst.With) or not isinstance(
                self.get_metadata(ParentNodeProvider, statement, None), (cst.IndentedBlock, cst.Module)):
            return False
        accelerator = self.accelerator_at(statement)
        if accelerator is None or self._in_loop(statement) or any(
                not m.matches(i.item, m.Call(func=m.Name("open"))) for i in statement.items):
            return False
        self._guard_with[id(statement)] = accelerator
        return True

    def _per_batch_write(self, call: cst.Call) -> bool:
        """``f.write(...)`` (``writerow``, ``print(..., file=f)``) in the loop over a prepared loader."""
        writes = m.matches(call.func, m.Attribute(attr=m.Name("write") | m.Name("writelines") | m.Name("writerow")
                                                  | m.Name("writerows"))) or (
            m.matches(call.func, m.Name("print")) and any(a.keyword is not None and a.keyword.value == "file"
                                                          for a in call.args))
        if writes and self._in_loader_loop(call):
            self._refuse_per_batch(call)
            return True
        return False

    def _refuse_per_batch(self, node: cst.CSTNode) -> None:
        if any(f.code == "ACC131" for f in self.findings):
            return  # one finding says it (`with open(...)` around the loop, and its `f.write` in it)
        self.refuse(
            node, "ACC131", "results are written batch by batch in the loop over the prepared dataloader: each "
            "process would write its own shard of them into the same file; file not converted.",
            "collect the results in a list in the loop (`preds.append(...)`), then write the file once after it, "
            "and convert again: accelify gathers the list and writes it on the main process.",
        )

    def _loops(self, node: cst.CSTNode):
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            if isinstance(parent, (cst.For, cst.While)):
                yield parent
            parent = self.get_metadata(ParentNodeProvider, parent, None)

    def _in_loop(self, node: cst.CSTNode) -> bool:
        return next(self._loops(node), None) is not None

    def _in_evaluation_loop(self, node: cst.CSTNode) -> bool:
        """In a loop over a prepared loader that runs no backward (kws's ``test(..., save=path)``, writing a
        line per sample with the batch's own file names beside its predictions)."""
        return any(isinstance(loop, cst.For) and self._over_loader(loop) and not findall(loop, BACKWARD)
                   for loop in self._loops(node))

    def _in_loader_loop(self, node: cst.CSTNode) -> bool:
        return any(isinstance(loop, cst.For) and self._over_loader(loop) for loop in self._loops(node))

    def _over_loader(self, loop: cst.For) -> bool:
        return ref_of(self, peel_iterable(self, loop.iter)) in self.plan.flow["loader"]

    def _runs_loader(self, statement: cst.With) -> bool:
        return any(self._over_loader(loop) for loop in findall(statement.body, m.For()))  # type: ignore[arg-type]

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.BaseStatement:
        accelerator = self._guard_with.get(id(original_node))
        if accelerator is None:
            return updated_node
        self.change(original_node, "written once, by the main process")
        return self._under(f"if {accelerator}.is_main_process:", [updated_node])

    def edit_body(self, block, items: list[Item]) -> list[Item]:
        """Consecutive writes go under one ``if accelerator.is_main_process:``."""
        if not any(id(s) in self._guard for s in block.body):
            return items
        out: list[Item] = []
        run: list[cst.BaseStatement] = []
        accelerator = ""

        wait = False

        def flush() -> None:
            nonlocal wait
            if run:
                out.append((self._under(f"if {accelerator}.is_main_process:", run), None))
                if wait:
                    out.append((self.parse_statement(f"{accelerator}.wait_for_everyone()\n"), None))
                run.clear()
            wait = False

        for updated, before in items:
            guard = self._guard.get(id(before)) if before is not None else None
            if guard != accelerator:
                flush()
            if guard is None:
                out.append((updated, before))
            else:
                accelerator = guard
                run.append(updated)
                wait = wait or id(before) in self._wait
        flush()
        return out

    def _everyone_gets_here(self, node: cst.CSTNode, depth: int = 0, seen: frozenset[str] = frozenset()) -> bool:
        """Does every process run ``node`` at the same point (a barrier after it cannot hang)? Not under
        a test each process decides on its own (``if acc > best:``) or a rank test, in its function or at
        a call of it, up through the functions that call it (llama2.c's ``hf_export``, called by
        ``model_export``, called by the master process only)."""
        if self._taint.guarded_by(node) is not None or under_rank_test(self, node) or (
            depth and under_main_process_check(self, node)
        ):
            return False
        func = self.get_metadata(ParentNodeProvider, node, None)
        while func is not None and not isinstance(func, (cst.FunctionDef, cst.Module)):
            func = self.get_metadata(ParentNodeProvider, func, None)
        if not isinstance(func, cst.FunctionDef):
            return True
        name = func.name.value
        if name in seen:
            return True  # round a cycle of calls (`train` and `self.model.train()` share a name): nothing new
        calls = findall(self._module, m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name))))
        return bool(calls) and depth < 4 and all(
            self._everyone_gets_here(call, depth + 1, seen | {name}) for call in calls)

    @staticmethod
    def _pretrained(stmt: cst.SimpleStatementLine) -> bool:
        return m.matches(stmt.body[0], m.Expr(m.Call(func=m.Attribute(attr=m.Name("save_pretrained")))))

    def _under(self, header: str, statements: list[cst.BaseStatement]) -> cst.BaseStatement:
        """``header`` (``if ...:``, ``with ...:``) around ``statements``, taking over the first one's
        blank and comment lines."""
        block = self.parse_statement(f"{header}\n    pass\n")
        inner = [statements[0].with_changes(leading_lines=[]), *statements[1:]]
        return block.with_changes(body=block.body.with_changes(body=inner), leading_lines=statements[0].leading_lines)  # type: ignore[union-attr]

    def _in_try(self, node: cst.CSTNode) -> bool:
        """``try: os.makedirs(d) except OSError: pass`` is already safe."""
        return under(self, node, (cst.Try,))

    def _makedirs(self, stmt: cst.CSTNode) -> Optional[cst.Call]:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call())])):
            return None
        call = stmt.body[0].value  # type: ignore[attr-defined]
        return call if qualified_names(self, call.func) & _MAKEDIRS and len(call.args) == 1 else None

    def _exist_ok(self, call: cst.Call) -> cst.Call:
        path = call.args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        exist_ok = cst.Arg(cst.Name("True"), keyword=cst.Name("exist_ok"),
                           equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        return call.with_changes(args=[path, exist_ok])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.BaseStatement, cst.If]:
        """``if not os.path.exists(d): os.makedirs(d)`` -> ``os.makedirs(d, exist_ok=True)``."""
        updated = super().leave_If(original_node, updated_node)
        if updated is not updated_node or original_node.orelse is not None:
            return updated
        test = original_node.test
        if not (isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
                and isinstance(test.expression, cst.Call) and len(test.expression.args) == 1
                and qualified_names(self, test.expression.func) & _EXISTS):
            return updated
        body = original_node.body
        if not (isinstance(body, cst.IndentedBlock) and len(body.body) == 1
                and m.matches(body.body[0], m.SimpleStatementLine(body=[m.Expr(m.Call())]))):
            return updated
        call = body.body[0].body[0].value  # type: ignore[attr-defined]
        if not (qualified_names(self, call.func) & _MKDIR and len(call.args) == 1):
            return updated
        checked = cst.Module(body=[]).code_for_node(test.expression.args[0].value)
        if cst.Module(body=[]).code_for_node(call.args[0].value) != checked or body.body[0].leading_lines:
            return updated
        if not self._os_imported(original_node):
            return updated
        self.change(original_node, "`os.makedirs(..., exist_ok=True)`: a check then a create races between processes")
        self.replaced(original_node)
        made = self.parse_statement(f"os.makedirs({checked}, exist_ok=True)\n")
        return made.with_changes(leading_lines=original_node.leading_lines)

    def _os_imported(self, node: cst.CSTNode) -> bool:
        """``os.makedirs`` spelled as the file spells ``os``."""
        func = node.test.expression.func  # type: ignore[attr-defined]
        return m.matches(func, m.Attribute(value=m.Attribute(value=m.Name("os"), attr=m.Name("path"))))
