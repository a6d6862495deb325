"""The pure core: source text in, new text + changes + findings out.

Parse once, analyse once, run the ordered codemods, let LibCST's import visitors
add and remove imports, render once.  Nothing here touches the file system and
nothing raises on user input: a file that cannot be parsed comes back with
``error`` set and its text unchanged.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, ScopeProvider

from accelify.analysis import RawFinding
from accelify.plan import analyze
from accelify.codemods import gather_codemods
from accelify.report import Change, Finding


@dataclass(frozen=True)
class Options:
    line_length: int = 88
    #: Run only the codemods with these codes (``None``: all of them).
    select: Optional[frozenset[str]] = None
    #: Report only the findings with these codes (``None``: all of them).
    findings: Optional[frozenset[str]] = None


@dataclass
class Result:
    path: str
    source: str
    output: str
    changes: list[Change] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def changed(self) -> bool:
        return self.error is None and self.output != self.source


class _LineMap:
    """Maps a line of the text after N passes back to the original file's line."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.origin = list(range(1, len(self.lines) + 1))

    def to_original(self, line: int) -> int:
        if not self.origin:
            return max(line, 1)
        return self.origin[min(max(line, 1), len(self.origin)) - 1]

    def advance(self, text: str) -> None:
        new = text.splitlines(keepends=True)
        origin: list[int] = []
        matcher = difflib.SequenceMatcher(None, self.lines, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                origin.extend(self.origin[i1:i2])
            elif tag in ("replace", "insert"):
                anchor = self.origin[min(i1, len(self.origin) - 1)] if self.origin else 1
                origin.extend([anchor] * (j2 - j1))
        self.lines, self.origin = new, origin


def convert_source(source: str, path: str = "<stdin>", options: Optional[Options] = None) -> Result:
    options = options or Options()
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return Result(path, source, source, error=_syntax_error(path, source, exc))
    if not _may_train(source) or _skipped(source):
        return Result(path, source, source)
    try:
        result = _convert(module, source, path, options)
    except Exception as exc:  # a bug of ours must never cost the user a file
        return Result(path, source, source, error=f"{path}: internal error, file left unchanged: {exc!r}")
    result.findings = _suppress(result.findings, source, options.findings)
    return result


def _report_only(options: Options) -> bool:
    """``--select`` named findings but no codemod: look at everything, change nothing."""
    return options.select is not None and not options.select


def _convert(module: cst.Module, source: str, path: str, options: Options) -> Result:
    context = CodemodContext(filename=path, full_module_name=None, full_package_name=None)
    context.scratch["accelify.line_length"] = options.line_length
    analysed = MetadataWrapper(module)
    plan = analyze(analysed)
    if not _report_only(options):
        plan.restrict(options.select)
    linemap = _LineMap(source)

    def place(raw: RawFinding) -> Finding:
        return Finding(path, linemap.to_original(raw.line), raw.column, raw.code, raw.message, raw.suggestion)

    findings = [place(f) for f in plan.findings]
    changes: list[Change] = []
    if not plan.convertible:
        return Result(path, source, source, findings=sorted(findings))

    code = source  # the text of `module`, rendered once per pass
    for codemod_class in gather_codemods():
        if options.select is not None and codemod_class.CODE not in options.select and not _report_only(options):
            continue
        if not codemod_class.applies(plan, code):
            continue
        wrapper = MetadataWrapper(module)
        pass_context = replace(context, wrapper=wrapper)
        codemod = codemod_class(pass_context, plan)
        module = wrapper.visit(codemod)
        codemod.finished()
        if codemod.refused:
            return Result(path, source, source, findings=sorted(findings + [place(f) for f in codemod.findings]))
        changes.extend(replace(c, line=linemap.to_original(c.line)) for c in codemod.changes)
        findings.extend(place(f) for f in codemod.findings)
        new_code = module.code
        if new_code != code:
            linemap.advance(new_code)
            code = new_code

    before_imports = module
    module = AddImportsVisitor(replace(context, wrapper=None)).transform_module(module)
    module = _place_added_imports(before_imports, module)
    module = RemoveImportsVisitor(replace(context, wrapper=None)).transform_module(module)
    module = _no_new_leading_blank(before_imports, module)

    output = module.code
    if _report_only(options):
        return Result(path, source, source, findings=sorted(findings))
    if output != source and not _still_parses(source, output):
        return Result(path, source, source, findings=sorted(findings),
                      error=f"{path}: internal error: the rewrite does not parse; file left unchanged")
    # (A selection without ACC001 asks for a fragment that names an accelerator nobody creates.)
    if output != source and (options.select is None or "ACC001" in options.select):
        new_names = _undefined_names(MetadataWrapper(module)) - _undefined_names(analysed)
        if new_names:
            return Result(path, source, source, findings=sorted(findings),
                          error=f"{path}: internal error: the rewrite reads undefined "
                                f"{', '.join(sorted(new_names))}; file left unchanged")
    return Result(path, source, output, changes=sorted(changes), findings=sorted(findings))


_SKIP = re.compile(r"#\s*accelify:\s*skip\b")
_IGNORE = re.compile(r"#\s*accelify:\s*ignore(?:\[([A-Z0-9, ]+)\])?")


def _skipped(source: str) -> bool:
    """``# accelify: skip`` among the comments that open the file."""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return False
        if _SKIP.search(stripped):
            return True
    return False


def _suppress(findings: list[Finding], source: str, selected: Optional[frozenset[str]]) -> list[Finding]:
    """Drop findings not selected, or silenced by ``# accelify: ignore[ACC104]`` on their line."""
    lines = source.splitlines()
    kept = []
    for finding in findings:
        if selected is not None and finding.code not in selected:
            continue
        line = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        match = _IGNORE.search(line)
        if match and (match.group(1) is None or finding.code in {c.strip() for c in match.group(1).split(",")}):
            continue
        kept.append(finding)
    return kept


def _may_train(source: str) -> bool:
    """Cheap pre-check: a file that names no optimizer and no parameters trains nothing.

    Every optimizer accelify recognises is either imported from a module whose
    path contains ``optim`` or built from ``<model>.parameters()``, so skipping
    the metadata passes for other files changes no result.
    """
    return "optim" in source or "parameters(" in source


def _syntax_error(path: str, source: str, exc: cst.ParserSyntaxError) -> str:
    """Prefer CPython's own message and position: it is the one users know."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError) as syntax:
        if not isinstance(syntax, SyntaxError):
            return f"{path}: cannot parse: {syntax}"

        return f"{path}:{syntax.lineno}:{syntax.offset}: cannot parse: {syntax.msg}"
    return f"{path}:{exc.raw_line}:{exc.raw_column + 1}: cannot parse: {exc.message}"


def _undefined_names(wrapper: MetadataWrapper) -> set[str]:
    """Names read where no binding of them is visible: what a rewrite must never add (an
    `accelerator` used in a function it does not reach would be a NameError at run time)."""
    names = set()
    for scope in set(wrapper.resolve(ScopeProvider).values()):
        if scope is None:
            continue
        for access in scope.accesses:
            if not access.referents and isinstance(access.node, cst.Name):
                names.add(access.node.value)
    return names


def _still_parses(source: str, output: str) -> bool:
    """Does the output compile wherever the input did? (``compile`` also catches what a
    valid syntax tree can still get wrong, such as ``return`` outside a function.)"""
    try:
        compile(source, "<source>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return True  # newer syntax than this interpreter knows: LibCST's own parse must do
    try:
        compile(output, "<output>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------
# where a new import goes

_IMPORT = m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])


def _no_new_leading_blank(before: cst.Module, after: cst.Module) -> cst.Module:
    """A removed first import must not leave the file starting with the blank line that followed it."""
    if not after.body or not before.body or before.body[0].leading_lines or after.header:
        return after
    first = after.body[0]
    if first.leading_lines and all(line.comment is None for line in first.leading_lines):
        return after.with_changes(body=[first.with_changes(leading_lines=[]), *after.body[1:]])
    return after


def _import_block(module: cst.Module) -> tuple[int, int]:
    """[start, end) of the contiguous imports at the top, after a docstring."""
    start = 0
    if module.body and m.matches(module.body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        start = 1
    end = start
    while end < len(module.body) and m.matches(module.body[end], _IMPORT):
        end += 1
    return start, end


def _module_of(stmt: cst.BaseStatement) -> tuple[str, str]:
    """(kind, top-level module) of an import statement: kind is 'import' or 'from'."""
    node = stmt.body[0]  # type: ignore[attr-defined]
    if isinstance(node, cst.Import):
        return "import", get_full_name_for_node(node.names[0].name) or ""
    if node.relative:
        return "relative", ""
    return "from", get_full_name_for_node(node.module) or ""  # type: ignore[arg-type]


def _third_party(name: str) -> bool:
    top = name.split(".")[0]
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    return bool(top) and top != "__future__" and top not in stdlib


def _place_added_imports(before: cst.Module, after: cst.Module) -> cst.Module:
    """Move the ``from x import y`` lines AddImportsVisitor appended to where isort would put them.

    LibCST appends new imports at the end of the top import block; black/ruff
    users keep their third-party ``from`` imports sorted, so a new line goes
    before the first existing one that sorts after it.  Blocks without such a
    line are left as LibCST made them.
    """
    old = {before.code_for_node(s) for s in before.body if m.matches(s, _IMPORT)}
    start, end = _import_block(after)
    block = list(after.body[start:end])
    added = [s for s in block if after.code_for_node(s) not in old]
    movable = [s for s in added if _module_of(s)[0] == "from" and _third_party(_module_of(s)[1])]
    kept = [s for s in block if not any(s is a for a in movable)]
    for stmt in sorted(movable, key=lambda s: _module_of(s)[1].lower(), reverse=True):
        name = _module_of(stmt)[1].lower()
        later = [
            i for i, s in enumerate(kept)
            if _module_of(s)[0] == "from" and _third_party(_module_of(s)[1]) and _module_of(s)[1].lower() > name
        ]
        if not later:
            kept.append(stmt)  # nothing sorts after it: where LibCST put it
            continue
        target = later[0]
        kept.insert(target, stmt.with_changes(leading_lines=kept[target].leading_lines))
        kept[target + 1] = kept[target + 1].with_changes(leading_lines=[])
    return after.with_changes(body=[*after.body[:start], *kept, *after.body[end:]])

