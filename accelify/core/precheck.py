"""What can be decided about a file before LibCST is even imported.

The command line asks these first: a file that cannot train (most files of a
repository) costs reading it, at most a parse by CPython's own parser, and
nothing else.
"""

from __future__ import annotations

import ast
import re
import unicodedata
import warnings
from typing import Optional

from accelify.core.project import training_elsewhere
from accelify.core.result import Result

_SKIP = re.compile(r"#\s*accelify:\s*skip\b")

#: A copy of ``accelify.analyses.objects._OPTIMIZER_NAME`` (the analyses import LibCST, this module must not):
#: the two must stay equal (tests/test_precheck.py checks it).
_OPTIMIZER_NAME = re.compile(r"adam|sgd|rmsprop|adagrad|adadelta|adafactor|lamb|lion|lars|sophia|optim", re.I)
#: Under ``torch.optim`` but no optimizer: the analysis never takes these for one.
_NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
_PARAMETERS = frozenset({"parameters", "named_parameters"})
#: Deep-learning frameworks other than PyTorch: a file that imports one of them and not torch is
#: not a PyTorch script, however much it looks like one.
_OTHER_FRAMEWORKS = frozenset({"paddle", "tensorflow", "jax", "flax", "mindspore", "oneflow", "mxnet", "keras"})
#: ``model.parameters(``, also spelled ``model.parameters (`` or split over lines inside brackets.
_PARAMETERS_CALL = re.compile(r"parameters(?:[\s\\]|#[^\r\n]*)*\(")

#: The last source :func:`may_train` parsed without error, and its answer: asked again of the same
#: text (the runner asks, then the pipeline), it is not parsed again; nor by :func:`syntax_error`.
_parsed: Optional[str] = None
_answer = False


def may_train(source: str) -> bool:
    """Necessary condition for the analysis to do anything: False only when
    :func:`accelify.core.pipeline.convert_source` would surely leave ``source`` unchanged, with no
    finding and no error (a false "no" would silently skip a training script).

    The analysis (``accelify.analyses.plan``) acts only on a file that assigns an optimizer
    (``optimizer = <call>``, or ``<call> if flag else <call>``): a call whose callee is
    ``torch.optim.*`` (schedulers aside), or is named like one (``_OPTIMIZER_NAME``) and
    trains some ``.parameters()``/``.named_parameters()`` (in an argument, or assigned to a
    name passed as one).  Without one it only reports a ``.backward()`` call (ACC125), and
    not in a file that names ``Accelerator``.  A file that imports another framework
    (paddle, tensorflow, jax, ...) and not torch is not a PyTorch script.  All are looked for
    on CPython's syntax tree (so not in strings and comments), generously: every name and
    attribute chain inside the callee, as written and through the file's imports in any
    scope; a name assigned in any scope.  A file CPython cannot parse goes to the pipeline, which reports the error (or
    knows the newer syntax).  First the text alone: such a file spells ``optim``,
    ``parameters(`` or ``backward``.
    """
    global _parsed, _answer
    if source is _parsed:
        return _answer
    if not mentions_training(source):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like: not ours to report
            tree = compile(source, "<precheck>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except Exception:  # SyntaxError, null bytes (ValueError), nesting too deep: the pipeline says
        return True
    _parsed, _answer = source, _may_train(tree, source)
    return _answer


def mentions_training(source: str) -> bool:
    """The text test alone (no parse): ``optim``, ``backward`` or ``parameters(`` is in ``source``.
    False implies :func:`may_train` is False."""
    return ("optim" in source or "backward" in source or "DataLoader" in source or ".eval()" in source
            or "load_state_dict" in source or bool(_PARAMETERS_CALL.search(source)))


def _may_train(tree: ast.AST, source: str) -> bool:
    imports: dict[str, list[str]] = {}  # local name -> the dotted names it is imported as
    values: list[ast.expr] = []  # every assigned value
    trained: set[str] = set()  # names assigned a value with a `.parameters()` call in it
    roots: set[str] = set()  # the top-level packages the file imports (absolute imports)
    methods = False  # a module method is called (`.eval()`, `.to(...)`): _evaluates needs one
    functions: list[ast.AST] = []  # every function: the scopes _evaluates looks in
    loaders = False  # `DataLoader` is named
    named: list[ast.AST] = []  # what is named `Accelerator` (_names_accelerator)
    backwards: list[ast.Call] = []  # `.backward(...)` calls
    delegates: list[ast.AST] = []  # functions named `backward` (_delegated)
    prepares: list[ast.Call] = []  # `.prepare(...)` calls (_prepared_by_hand)
    created: list[ast.Assign] = []  # `name = f(...)` (_prepared_by_hand)
    classes: dict[str, ast.alias] = {}  # local name -> its `from accelerate import Accelerator`
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                if func.attr == "backward":
                    backwards.append(node)
                elif func.attr == "prepare":
                    prepares.append(node)
                elif func.attr in _MODULE_METHODS:
                    methods = True
        elif isinstance(node, (ast.Name, ast.Attribute)):
            identifier = node.id if isinstance(node, ast.Name) else node.attr
            if identifier == "DataLoader":
                loaders = True
            elif identifier == "Accelerator":
                named.append(node)
            continue
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node)
            if node.name == "backward":
                delegates.append(node)
            continue
        elif isinstance(node, ast.ClassDef):
            if node.name == "Accelerator":
                named.append(node)
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
            if node.value is not None:
                values.append(node.value)
                if isinstance(node, ast.Assign) and _has_parameters(node.value):
                    trained.update(t.id for t in node.targets if isinstance(t, ast.Name))
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
                    created.append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                roots.add(alias.name.split(".")[0])
                if alias.name.rpartition(".")[2] == "DataLoader":
                    loaders = True
                if alias.name == "Accelerator":
                    named.append(alias)
                if alias.asname:
                    imports.setdefault(alias.asname, []).append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                roots.add(node.module.split(".")[0])
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name.rpartition(".")[2] == "DataLoader":
                    loaders = True
                if alias.name == "Accelerator":
                    named.append(alias)
                    if not node.level and node.module in _ACCELERATE_MODULES:
                        classes[alias.asname or alias.name] = alias
                if alias.name != "*":
                    dotted = f"{base}.{alias.name}" if node.module else base + alias.name
                    imports.setdefault(alias.asname or alias.name, []).append(dotted)
    if prepares and classes and _prepared_by_hand(classes, created, prepares, source):
        # on Accelerate already (accelify.analyses.accelerator.prepared_by_hand): only a hang is said
        return _collective_under_test(tree)
    if roots & _OTHER_FRAMEWORKS and "torch" not in roots:
        return False  # a script of another framework (its `loss.backward()`, its optimizers)
    backward = bool(backwards) and (not delegates or _delegated(backwards, delegates) < len(backwards))
    while values:
        value = values.pop()
        if isinstance(value, ast.IfExp):
            values += (value.body, value.orelse)
        elif isinstance(value, ast.Call) and _builds_optimizer(value, imports, _trains(value, trained)):
            return True
    # No optimizer: the analysis only reports a backward (ACC125), or converts an evaluation over
    # a DataLoader (accelify.analyses.evaluation); neither in a file that names `Accelerator` (it
    # uses Accelerate already, or is Accelerate).
    if _names_accelerator(named, source):
        return False
    return backward or (methods and _evaluates(tree, functions, loaders)) or _may_report_evaluation(tree)


#: Copies of ``accelify.analyses.evaluation.MODULE_METHODS`` and ``_RUNS`` (tests/test_precheck.py
#: checks they stay equal): what makes a model of a called name, and the calls on it that run it.
_MODULE_METHODS = frozenset({"eval", "to", "cuda", "load_state_dict", "half", "bfloat16", "requires_grad_"})
_RUNS = frozenset({"generate", "forward"})
#: What an iterable is peeled of (``enumerate(tqdm(loader))``).
_WRAPPERS = frozenset({"enumerate", "iter", "tqdm"})


_LIST_CALLS = frozenset({"list", "sorted", "glob", "listdir", "splitlines", "readlines"})


def _bound_to_list(scope: ast.AST, name: str) -> bool:
    """``name`` is assigned a list in ``scope`` (a literal, a comprehension, ``list(...)``,
    ``sorted(...)``, ``glob.glob(...)``, ``text.splitlines()``...): what ``evaluation.plain_list`` takes."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, (ast.List, ast.ListComp)):
                return True
            if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)) and (
                    value.func.id if isinstance(value.func, ast.Name) else value.func.attr) in _LIST_CALLS:
                return True
    return False


def _may_report_evaluation(tree: ast.AST) -> bool:
    """Necessary for ACC133 (an evaluation accelify cannot pair: ``evaluation.unrecognised``): code
    that runs (an ``if __name__ == "__main__":`` block, or a loop, ``with`` or call at module level),
    a name treated as a module (``model.eval()``, ``net = Net().to(device)``), and a DataLoader or a
    loop that reads such a name."""
    module = tree.body if isinstance(tree, ast.Module) else []
    if not any(isinstance(s, (ast.For, ast.While, ast.With)) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call))
               or (isinstance(s, ast.If) and isinstance(s.test, ast.Compare) and isinstance(s.test.left, ast.Name)
                   and s.test.left.id == "__name__") for s in module):
        return False
    evaluated: set[str] = set()  # names a module method is called on, or assigned a value built by one
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MODULE_METHODS:
            if isinstance(node.func.value, ast.Name):
                evaluated.add(node.func.value.id)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                if value.func.attr in _MODULE_METHODS:
                    evaluated |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                    break
                value = value.func.value
    if not evaluated:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and (node.id if isinstance(node, ast.Name) else node.attr) == "DataLoader":
            return True
        if isinstance(node, ast.For) and any(isinstance(n, ast.Name) and n.id in evaluated for n in ast.walk(node)):
            return True
    return False


def _evaluates(tree: ast.AST, functions: list[ast.AST], loaders: bool) -> bool:
    """Necessary for the analysis to find an evaluation (``accelify.analyses.evaluation.models``), in a
    file that calls a module method (``.eval()``, ``.to(...)``...) somewhere: in some scope (the module,
    ``functions``) a ``for`` loop over a name (peeled of ``enumerate``/``tqdm``) bound or received in that
    scope, whose body calls a name (or its ``generate``) bound or received there too; over a list unless
    the file names ``DataLoader`` (``loaders``).  Generous: no types, no flow."""
    scopes: list[ast.AST] = [tree, *functions]
    for scope in scopes:
        names: set[str] = set()  # bound in this scope: assigned, loop targets, parameters
        loops: list[ast.For] = []
        todo = list(ast.iter_child_nodes(scope))
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = scope.args
            names |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue  # another scope
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.For):
                loops.append(node)
            todo.extend(ast.iter_child_nodes(node))
        for loop in loops:
            iterable = loop.iter
            while isinstance(iterable, ast.Call) and iterable.args and isinstance(iterable.func, (ast.Name, ast.Attribute)) and (
                    iterable.func.id if isinstance(iterable.func, ast.Name) else iterable.func.attr) in _WRAPPERS:
                iterable = iterable.args[0]
            if not (isinstance(iterable, ast.Name) and iterable.id in names):
                continue
            if not loaders and not _bound_to_list(scope, iterable.id):
                continue  # the analysis pairs a model with a DataLoader or a list
            for node in ast.walk(loop):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in _RUNS:
                    func = func.value
                if isinstance(func, ast.Name) and func.id in names:
                    return True
    return False


def _has_parameters(value: ast.expr) -> bool:
    """``value`` calls ``.parameters()`` / ``.named_parameters()`` somewhere."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _PARAMETERS
               for n in ast.walk(value))


def _trains(call: ast.Call, trained: set[str]) -> bool:
    """The analysis's test for an optimizer named like one: an argument calls ``.parameters()``,
    or is a name assigned such a value (``Lion(params)``)."""
    for value in (*call.args, *(k.value for k in call.keywords)):
        if isinstance(value, ast.Starred):
            value = value.value
        if _has_parameters(value) or (isinstance(value, ast.Name) and value.id in trained):
            return True
    return False


_ACCELERATOR = b"Accelerator"


class _Written:
    """The source as written, its lines split when first asked: CPython's tree holds identifiers NFKC-normalised,
    LibCST (which the analysis asks) as written, so a name the pre-check relies on is checked in the text."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._lines: Optional[list[bytes]] = None

    def line(self, number: int) -> bytes:
        if self._lines is None:
            self._lines = self._source.encode("utf-8", "surrogatepass").splitlines()
        return self._lines[number - 1] if 0 < number <= len(self._lines) else b""

    def at(self, number: int, start: int, text: bytes) -> bool:
        """``text`` is written on line ``number`` from byte ``start``."""
        return self.line(number)[start:start + len(text)] == text

    def starts(self, node: ast.AST, identifier: str) -> bool:
        """``node`` starts with ``identifier`` as written (a name, the first name of an import)."""
        return self.at(node.lineno, node.col_offset, identifier.encode())  # type: ignore[attr-defined]

    def ends(self, node: ast.AST, identifier: str) -> bool:
        """``node`` ends with ``identifier`` as written (an attribute's name)."""
        end = node.end_col_offset  # type: ignore[attr-defined]
        text = identifier.encode()
        return end is not None and self.at(node.end_lineno or node.lineno, end - len(text), text)  # type: ignore[attr-defined]


def _names_accelerator(named: list[ast.AST], source: str) -> bool:
    """One of ``named`` (the names, attributes, imports and classes CPython's tree calls ``Accelerator``)
    is spelled so in the text (:class:`_Written`). A spelling this does not place (``class \\`` continued)
    counts as absent."""
    text = _Written(source)
    size = len(_ACCELERATOR)
    for node in named:
        if isinstance(node, ast.Name) and node.id == "Accelerator":
            if node.end_lineno != node.lineno or node.end_col_offset != node.col_offset + size:
                continue
            line, start = node.lineno, node.col_offset
        elif isinstance(node, ast.Attribute) and node.attr == "Accelerator" and node.end_col_offset is not None:
            line, start = node.end_lineno or node.lineno, node.end_col_offset - size
        elif isinstance(node, ast.alias) and node.name == "Accelerator":
            line, start = node.lineno, node.col_offset
        elif isinstance(node, ast.ClassDef) and node.name == "Accelerator":
            found = _CLASS.match(text.line(node.lineno), node.col_offset)
            if found is None:
                continue
            line, start = node.lineno, found.end() - size
        else:
            continue
        if text.at(line, start, _ACCELERATOR):
            return True
    return False


_CLASS = re.compile(rb"class[ \t\f]+Accelerator\b")
#: The modules whose ``Accelerator`` is ``accelify.queries.names.ACCELERATOR_CLASS`` (or a part of them).
_ACCELERATE_MODULES = frozenset({"accelerate", "accelerate.accelerator", "accelify.runtime"})


#: Copy of ``accelify.analyses.hazards.COLLECTIVES`` (tests/test_precheck.py checks they stay equal).
_COLLECTIVES = frozenset({"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})
_MAIN_TESTS = frozenset({"is_main_process", "is_local_main_process"})


def _collective_under_test(tree: ast.AST) -> bool:
    """A collective call (``x.wait_for_everyone()``) inside an ``if`` (or a conditional expression) whose test
    names ``is_main_process`` or ``is_local_main_process``, or has a plain name as a term of its ``and``s (a main
    flag of converted code): what ``accelify.analyses.ranks.under_main_process_check`` could take for ACC116."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.IfExp)):
            continue
        terms, test = [node.test], node.test
        while any(isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And) for t in terms):
            terms = [v for t in terms for v in (t.values if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And)
                                                 else [t])]
        if not (any(isinstance(t, ast.Name) for t in terms) or any(
                isinstance(n, ast.Attribute) and n.attr in _MAIN_TESTS for n in ast.walk(test))):
            continue
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _COLLECTIVES
               for n in ast.walk(node)):
            return True
    return False


def _delegated(backwards: list[ast.Call], delegates: list[ast.AST]) -> int:
    """How many of ``backwards`` are inside a function named ``backward`` (a wrapper's ``def backward(self,
    loss): self.engine.backward(loss)``, which trains nothing until it is called): ``hazards.untrained_backward``
    does not report those."""
    inside = {id(node) for function in delegates for node in ast.walk(function)}
    return sum(id(call) in inside for call in backwards)


def _prepared_by_hand(classes: dict[str, ast.alias], created: list[ast.Assign], prepares: list[ast.Call],
                      source: str) -> bool:
    """``accelerator.prepare(...)`` of an ``accelerator = Accelerator(...)`` (``self.accelerator`` too), the class
    imported from accelerate: a subset of what ``accelify.analyses.accelerator.prepared_by_hand`` takes, every
    name checked as written (:class:`_Written`)."""
    text = _Written(source)

    def dotted(node: ast.expr) -> Optional[str]:
        if isinstance(node, ast.Name) and text.starts(node, node.id):
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and text.starts(node.value, "self") and text.ends(node, node.attr):
            return f"self.{node.attr}"
        return None

    imported = {name for name, alias in classes.items() if alias.lineno == alias.end_lineno
                and text.line(alias.lineno)[alias.col_offset:alias.end_col_offset].split()
                in ([b"Accelerator"], [b"Accelerator", b"as", name.encode()])}
    accelerators = {dotted(a.targets[0]) for a in created if isinstance(a.value, ast.Call)  # type: ignore[attr-defined]
                    and isinstance(a.value.func, ast.Name) and a.value.func.id in imported
                    and text.starts(a.value.func, a.value.func.id)}
    accelerators.discard(None)
    return any(isinstance(call.func, ast.Attribute) and text.ends(call.func, "prepare")
               and dotted(call.func.value) in accelerators for call in prepares)


def _builds_optimizer(call: ast.Call, imports: dict[str, list[str]], trains: bool) -> bool:
    """Can the analysis take ``call`` for an optimizer?  Any chain in the callee counts
    (``torch.optim.__dict__[name](...)``, ``partial(Adam, lr=lr)(...)``)."""
    for node in ast.walk(call.func):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        chain = _chain(node)
        if not chain:
            continue
        names = [".".join(chain)]
        names += [".".join([target, *chain[1:]]) for target in imports.get(chain[0], ())]
        for name in names:
            if trains and _optimizer_named(name.rsplit(".", 1)[-1]):
                return True
            if name.startswith("torch.optim.") and not (name + ".").startswith(_NOT_OPTIMIZERS):
                return True
            parts = name.split(".")
            # an `optim` module however reached (`from . import optim`, a framework's `fw.optim`)
            if "optim" in parts[:-1] and "lr_scheduler" not in parts and "swa_utils" not in parts:
                return True
    return False


def _optimizer_named(name: str) -> bool:
    """``_OPTIMIZER_NAME`` on a name as LibCST sees it: CPython's tree holds identifiers NFKC-normalised,
    which composes a letter with a combining mark after it (``adam\\u0301`` -> ``ada\\u1e3f``)."""
    return bool(_OPTIMIZER_NAME.search(name)) or (
        not name.isascii() and bool(_OPTIMIZER_NAME.search(unicodedata.normalize("NFD", name))))


def _chain(node: ast.expr) -> list[str]:
    """``torch.optim.SGD`` -> ["torch", "optim", "SGD"]; through calls and subscripts as LibCST
    names them (``make().Adam`` -> ["make", "Adam"], ``table["adam"]`` -> ["table"])."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            break
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
    return parts[::-1]


def skipped(source: str) -> bool:
    """``# accelify: skip`` among the comments that open the file."""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return False
        if _SKIP.search(stripped):
            return True
    return False


def needs_analysis(source: str) -> bool:
    """False when the file comes out unchanged, whatever it contains (its only possible finding says that
    it trains through a module beside it: :func:`without_analysis`)."""
    return may_train(source) and not skipped(source)


def without_analysis(source: str, path: str) -> Optional[Result]:
    """The result of a file that needs no analysis (its syntax error, or nothing to say); None when it
    needs one (it may train, or its training runs in a module beside it)."""
    if needs_analysis(source):
        return None
    error = syntax_error(source, path)
    if error is None and not skipped(source) and training_elsewhere(source, path):
        return None  # converted with the module it trains in (accelify.core.unit), or ACC135 says why not
    return Result(path, source, source, error=error)


def syntax_error(source: str, path: str) -> "str | None":
    """The error to report for a file that does not parse, or None.

    CPython's own parser first (fast, and its message and position are the ones
    users know); what it rejects is confirmed with LibCST, which also knows
    syntax newer than this interpreter.
    """
    if source is _parsed:
        return None
    message = cpython_error(source, path)
    if message is None:
        return None
    import libcst

    try:
        libcst.parse_module(source)
    except libcst.ParserSyntaxError:
        return message
    return None


def cpython_error(source: str, path: str) -> Optional[str]:
    """CPython's own message and position for a source it cannot parse (the ones users know)."""
    try:
        compile(source, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}:{exc.offset}: cannot parse: {exc.msg}"
    except ValueError as exc:  # null bytes
        return f"{path}: cannot parse: {exc}"
    return None
