"""What can be decided about a file from its text alone, before LibCST is even imported.

The command line asks these first: a file that cannot train (most files of a
repository) costs reading it, at most a parse by CPython's own parser, and
nothing else.
"""

from __future__ import annotations

import ast
import re
import warnings

_SKIP = re.compile(r"#\s*accelify:\s*skip\b")

#: A copy of ``accelify.plan._OPTIMIZER_NAME`` (plan imports LibCST, this module must not):
#: the two must stay equal (tests/test_precheck.py checks it).
_OPTIMIZER_NAME = re.compile(r"adam|sgd|rmsprop|adagrad|adadelta|adafactor|lamb|lion|lars|sophia|optim", re.I)
#: Under ``torch.optim`` but no optimizer: the analysis never takes these for one.
_NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
_PARAMETERS = frozenset({"parameters", "named_parameters"})


def may_train(source: str) -> bool:
    """Necessary condition for the analysis to do anything: True unless ``source`` surely comes
    out unchanged, with no finding, from :func:`accelify.pipeline.convert_source`.

    The analysis (``accelify.plan``) acts only on a file that builds an optimizer, assigned
    (``optimizer = <call>``, or ``<call> if flag else <call>``) from a callee that is
    ``torch.optim.*`` (schedulers aside) or is named like an optimizer (``_OPTIMIZER_NAME``)
    and trains some ``.parameters()``/``.named_parameters()``; without one, only a
    ``.backward()`` call makes it speak (ACC125).  The test below over-approximates that on
    CPython's syntax tree: every name and attribute chain of the callee, as written and with
    its imports resolved, in any scope.  A file CPython cannot parse goes to the pipeline,
    which reports the error or parses newer syntax with LibCST.  The text filter first:
    every such file names ``optim``, ``parameters(`` or ``backward``.
    """
    if "optim" not in source and "parameters(" not in source and "backward" not in source:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like: not ours to report
            tree = ast.parse(source)
    except Exception:  # SyntaxError, null bytes (ValueError), nesting too deep: let the pipeline say
        return True
    return _may_train(tree)


def _may_train(tree: ast.AST) -> bool:
    imports: dict[str, list[str]] = {}  # local name -> dotted names it is imported as, in any scope
    values: list[ast.expr] = []  # assigned values
    has_parameters = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                if func.attr == "backward":
                    return True
                if func.attr in _PARAMETERS:
                    has_parameters = True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
            if node.value is not None:
                values.append(node.value)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imports.setdefault(alias.asname, []).append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name != "*":
                    dotted = f"{base}.{alias.name}" if node.module else base + alias.name
                    imports.setdefault(alias.asname or alias.name, []).append(dotted)
    while values:
        value = values.pop()
        if isinstance(value, ast.IfExp):
            values += (value.body, value.orelse)
        elif isinstance(value, ast.Call) and _builds_optimizer(value, imports, has_parameters):
            return True
    return False


def _builds_optimizer(call: ast.Call, imports: dict[str, list[str]], has_parameters: bool) -> bool:
    """Can the analysis take ``call`` for an optimizer? Every chain in the callee counts
    (``torch.optim.__dict__[name](...)``, ``partial(Adam, lr=lr)(...)``)."""
    for node in ast.walk(call.func):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        chain = _chain(node)
        names = [".".join(chain)]
        names += [".".join([target, *chain[1:]]) for target in imports.get(chain[0], ())]
        for name in names:
            if has_parameters and _OPTIMIZER_NAME.search(name.rsplit(".", 1)[-1]):
                return True
            if name.startswith("torch.optim.") and not name.startswith(_NOT_OPTIMIZERS):
                return True
            parts = name.split(".")
            # an `optim` module however it is reached (`fw.optim.Adam` for a `fw` LibCST may resolve)
            if "optim" in parts[:-1] and "lr_scheduler" not in parts and "swa_utils" not in parts:
                return True
    return False


def _chain(node: ast.expr) -> list[str]:
    """``torch.optim.SGD`` -> ["torch", "optim", "SGD"]; through calls and subscripts as LibCST
    names them (``make().Adam`` -> ["make", "Adam"]); an unnamed start is dropped."""
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
    """False when the file comes out unchanged with no finding, whatever it contains."""
    return may_train(source) and not skipped(source)


def syntax_error(source: str, path: str) -> "str | None":
    """The error to report for a file that does not parse, or None.

    CPython's own parser first (fast, and its message and position are the ones
    users know); what it rejects is confirmed with LibCST, which also knows
    syntax newer than this interpreter.
    """
    try:
        compile(source, path, "exec", 0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST
        return None
    except SyntaxError as exc:
        message = f"{path}:{exc.lineno}:{exc.offset}: cannot parse: {exc.msg}"
    except ValueError as exc:  # null bytes
        message = f"{path}: cannot parse: {exc}"
    import libcst

    try:
        libcst.parse_module(source)
    except libcst.ParserSyntaxError:
        return message
    return None
