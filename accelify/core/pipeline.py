"""The pure core: source text in, new text + changes + findings out.

Parse once, analyse once, run the ordered codemods, let LibCST's import visitors
add and remove imports, render once.  Nothing here touches the file system and
nothing raises on user input: a file that cannot be parsed comes back with
``error`` set and its text unchanged.
"""

from __future__ import annotations

import ast
import difflib
import os
import sys
from dataclasses import replace
from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node

from accelify.analyses.plan import analyze
from accelify.core.project import ProjectSources, training_elsewhere
from accelify.codemods import gather_codemods
from accelify.codemods.base import Shared
from accelify.codemods.launch import SpawnLaunch
from accelify.codemods.setup_helper import SetUpHelper
from accelify.codemods.world_size import ProcessGroupAttributes
from accelify.core import joined
from accelify.core.composite import Composite, plan_names
from accelify.core.metadata import resolve
from accelify.core.module_output import with_module_prints
from accelify.core.precheck import cpython_error, without_analysis
from accelify.core.result import TARGETS, Options, Result, brief, suppress
from accelify.core.symbols import read_anywhere, undefined_names
from accelify.core.unit import Unit, needed_imports, unit_of
from accelify.queries import walk
from accelify.queries.records import Change, Finding, RawFinding


def _gather_once_per_class() -> None:
    """LibCST's import visitors (AddImportsVisitor, the GatherImportsVisitor it makes, ...) are
    matcher-decoratable: each new instance looks for decorated methods through ``dir()`` of
    itself, some 15 ms per visitor, several visitors per converted file, whatever its size.
    LibCST's own visitor classes never change and have none: looked for once per class, the
    answer (nothing) is remembered. Other classes are looked at every time, as LibCST does."""
    import libcst.matchers._visitors as visitors

    def once_per_class(gather):
        nothing: set[type] = set()

        def gathered(obj):
            cls = type(obj)
            if cls in nothing:
                return {}
            found = gather(obj)
            if not found and cls.__module__.startswith("libcst."):
                nothing.add(cls)
            return found

        gathered.accelify_once_per_class = True  # type: ignore[attr-defined]
        return gathered

    for name in ("_gather_matchers", "_gather_constructed_visit_funcs", "_gather_constructed_leave_funcs"):
        gather = getattr(visitors, name, None)
        if callable(gather) and not getattr(gather, "accelify_once_per_class", False):
            setattr(visitors, name, once_per_class(gather))


_gather_once_per_class()


def convert_source(source: str, path: str = "<stdin>", options: Optional[Options] = None) -> Result:
    options = options or Options()
    if options.target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {options.target!r}")
    quick = without_analysis(source, path)
    if quick is not None:  # nothing to train: only the syntax is checked (CPython's parser, no LibCST tree)
        return quick
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return Result(path, source, source, error=_syntax_error(path, source, exc))
    if joined.has_joined(module):
        return _convert_joined(module, source, path, options)
    return _convert_parsed(module, source, path, options)


def _convert_parsed(module: cst.Module, source: str, path: str, options: Options) -> Result:
    """The conversion of ``source``, parsed as ``module`` (one statement per line)."""
    sources = ProjectSources.of(path)  # (read once for the set-up helper, the unit and the modules' prints)
    try:
        inlined = None if path.endswith(".ipynb") or SetUpHelper.HINT in source or (
            options.select is not None and SetUpHelper.CODE not in options.select) \
            else SetUpHelper.specialise_foreign(module, sources)
    except Exception as exc:  # a bug of ours must never cost the user a file
        return _internal_error(path, source, exc)
    if inlined is not None:
        return _with_foreign_set_up(inlined, source, path, options)
    try:
        # (a notebook's cells are one program already; its modules are not converted with it yet)
        unit = unit_of(source, path, sources) if not path.endswith(".ipynb") else None
        result = _convert_unit(unit, options) if unit is not None else None
        alone = result is None
        if alone:
            result = _convert_specialised(module, source, path, options) or _convert(module, source, path, options)
            shared = _changed_for_others(result, sources) if result.changed and path.endswith(".py") else None
            if shared is not None:
                result = Result(path, source, source, findings=sorted(
                    [f for f in result.findings if f.code != "ACC124"] + [shared]))
    except Exception as exc:  # a bug of ours must never cost the user a file
        return _internal_error(path, source, exc)
    finally:
        walk.activate(None)
    if alone and result.error is None and not result.changed and not result.findings:
        result.findings = training_elsewhere(source, path)  # silent otherwise: it trains nothing itself
    try:
        result = with_module_prints(result, module, options, sources)
    except Exception as exc:  # a bug of ours must never cost the user a file
        return _internal_error(path, source, exc)
    result.findings = suppress(result.findings, source, options.findings)
    for companion in result.companions:
        companion.findings = suppress(companion.findings, companion.source, options.findings)
    return result


def _with_foreign_set_up(inlined, source: str, path: str, options: Options) -> Result:
    """The script whose call of another module's set-up helper (DINO's ``utils.init_distributed_mode(args)``) is its
    launched path (ACC030), converted; the positions put back on the script's lines. Refused, it stays as it was."""
    text = inlined.module.code
    result = _convert_parsed(inlined.module, text, path, options)
    lines = _line_map(text, source)
    findings = sorted(replace(f, line=lines(f.line)) for f in result.findings)
    if result.error is not None or result.output == text:
        return Result(path, source, source, findings=findings, error=result.error)
    changes = sorted([replace(c, line=lines(c.line)) for c in result.changes]
                     + [Change(inlined.line, SetUpHelper.CODE, inlined.change)])
    return replace(result, source=source, output=_imports_left_unused(source, result.output), changes=changes,
                   findings=findings)


def _internal_error(path: str, source: str, exc: Exception) -> Result:
    return Result(path, source, source, error=f"{path}: internal error, file left unchanged: {brief(exc)}")


def _convert_joined(module: cst.Module, source: str, path: str, options: Options) -> Result:
    """A file with statements joined on a line (``a; b``) converted with one statement per line
    (:mod:`accelify.core.joined`): the lines the conversion leaves alone come back as written, the
    positions of what is said on the file's own lines."""
    try:
        derived = joined.split(module)
        result = _convert_parsed(cst.parse_module(derived), derived, path, options)
        positions = joined.Positions(source, derived)
        output = source if result.error is not None or result.output == derived else joined.rejoin(source, derived, result.output)
        findings = sorted(replace(f, line=positions.line(f.line), column=positions.column(f.line, f.column))
                          for f in result.findings)
        changes = sorted(replace(c, line=positions.line(c.line)) for c in result.changes)
    except Exception as exc:  # the split and the putting back are ours too
        return _internal_error(path, source, exc)
    return replace(result, source=source, output=output, findings=findings, changes=changes)


def _convert_unit(unit: Unit, options: Options) -> Optional[Result]:
    """The script converted with the modules beside it that it trains in (:mod:`accelify.core.unit`);
    None when the program cannot be converted or put back (the script is then converted alone)."""
    try:
        module = cst.parse_module(unit.program)
    except cst.ParserSyntaxError:
        return None
    result = _convert(module, unit.program, unit.path, options, unit.elsewhere())
    if result.error is not None:
        return None

    def place(item):
        path, line = unit.locate(item.line)
        words = {"message": unit.readable(item.message)}
        if hasattr(item, "suggestion"):
            words["suggestion"] = unit.readable(item.suggestion)
        return replace(item, line=line, **words, **({"path": path} if hasattr(item, "path") else {})), path

    findings = [place(f) for f in result.findings]
    changes = [place(c) for c in result.changes]
    texts = {c.path: c.text for c in unit.companions}
    outputs: dict[str, str] = {}
    entry = unit.source
    if result.changed:
        split = unit.split(result.output)
        if split is None:
            return None
        entry, outputs = split
        shared = _used_elsewhere(unit)
        if shared is not None:
            return Result(unit.path, unit.source, unit.source, findings=sorted(
                [f for f, where in findings if where == unit.path and f.code != "ACC124"] + [shared]))
        moved = _move_imports(unit.source, entry, texts, outputs)
        if moved is None:
            return None
        entry, outputs = moved

    def mine(items, path):
        return sorted(item for item, where in items if where == path)

    companions = [Result(path, text, outputs.get(path, text), changes=mine(changes, path), findings=mine(findings, path))
                  for path, text in texts.items() if path in outputs or mine(findings, path)]
    return Result(unit.path, unit.source, entry, changes=mine(changes, unit.path), findings=mine(findings, unit.path),
                  companions=companions)


def _used_elsewhere(unit: Unit) -> Optional[Finding]:
    """ACC141 when a definition the conversion changes in a module is used by another file of the project
    too (``finetune.py`` calling ``train(model, device, ...)`` of train.py): changed for this script, it
    would no longer fit that file's call (a new ``accelerator`` parameter, batches no longer placed)."""
    sources = ProjectSources.of(unit.path)
    exclude = {os.path.realpath(unit.path)} | {os.path.realpath(c.path) for c in unit.companions}
    for companion in unit.companions:
        if not companion.changed:
            continue
        users = sources.users_of(companion.dotted, companion.changed, exclude)
        if companion.defined_in:  # `from tools import knn_monitor`: `from tools.knn_monitor import ...` uses it too
            users += [u for u in sources.users_of(companion.defined_in, companion.changed, exclude) if u not in users]
        if users:
            names = ", ".join(f"`{n}`" for n in sorted(companion.changed))
            return Finding(
                unit.path, companion.line, 1, "ACC141",
                f"{names} of `{companion.path}` would change with this script's conversion, and "
                f"{', '.join(f'`{u}`' for u in users[:3])}{' and others' if len(users) > 3 else ''} use"
                f"{'s' if len(users) == 1 else ''} {'it' if len(companion.changed) == 1 else 'them'} too: changed, "
                "they would no longer fit those calls (a new `accelerator` parameter, batches no longer placed). "
                "Nothing changed.",
                "convert those scripts together (`accelify convert` on the folder converts each with the module, "
                "and leaves it whole if they differ), or give this script a training function of its own.",
            )
    return None


def _changed_for_others(result: Result, sources: ProjectSources) -> Optional[Finding]:
    """ACC141 for a file converted on its own whose top-level definitions the conversion changes (a trainer class
    that now makes its Accelerator, a ``train`` taking one) while another file of its folder imports them (MAML's
    ``meta.py``, whose ``Meta`` class trains, and whose ``omniglot_train.py`` builds it): changed alone, they
    would no longer fit that file. Converting the script that uses them converts the module with it, or says why
    not."""
    changed = _changed_definitions(result.source, result.output)
    if not changed:
        return None
    dotted = os.path.splitext(os.path.basename(result.path))[0]
    users = sources.users_of(dotted, changed, {os.path.realpath(result.path)})
    if not users:
        return None
    names = ", ".join(f"`{n}`" for n in sorted(changed))
    return Finding(
        result.path, 1, 1, "ACC141",
        f"{names} would change with this file's conversion, and {', '.join(f'`{u}`' for u in users[:3])}"
        f"{' and others' if len(users) > 3 else ''} use{'s' if len(users) == 1 else ''} "
        f"{'it' if len(changed) == 1 else 'them'}: converted alone, this file would change what "
        f"{'that script runs' if len(users) == 1 else 'those scripts run'} (an Accelerator made or taken there, "
        "batches no longer placed) without converting it, and whether it would still run right on N processes "
        "(its placements, its launch) is not checked from here. Nothing changed.",
        f"convert {'that script' if len(users) == 1 else 'those scripts'} instead (`accelify convert {users[0]}` "
        "converts this module with it, or says why not), or give this file definitions of its own.",
    )


def _changed_definitions(source: str, output: str) -> set[str]:
    """The names of the module-level functions and classes whose code differs between ``source`` and ``output``
    (CPython's parser: formatting aside)."""

    def definitions(text: str) -> dict[str, str]:
        return {node.name: ast.dump(node) for node in ast.parse(text).body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}

    before, after = definitions(source), definitions(output)
    return {name for name, code in before.items() if after.get(name) != code}


def _move_imports(source: str, entry: str, texts: dict[str, str],
                  outputs: dict[str, str]) -> Optional[tuple[str, dict[str, str]]]:
    """An import the conversion added at the top of the program goes to the module whose new code reads
    it (``from accelerate import Accelerator`` for an Accelerator made in the module's class), and
    leaves the script if the script does not read it. None if a new name has no import to take."""
    if needed_imports(source, entry):
        return None
    try:
        old_tree, new_tree = cst.parse_module(source), cst.parse_module(entry)
    except cst.ParserSyntaxError:
        return None
    old_imports = {old_tree.code_for_node(s).strip() for s in old_tree.body if m.matches(s, _IMPORT)}
    added = [s for s in new_tree.body if m.matches(s, _IMPORT) and new_tree.code_for_node(s).strip() not in old_imports]
    offered: dict[str, tuple[str, Optional[str], Optional[str]]] = {}
    for statement in added:
        node = statement.body[0]  # type: ignore[attr-defined]
        if isinstance(node, cst.ImportFrom) and not node.relative and not isinstance(node.names, cst.ImportStar):
            base = get_full_name_for_node(node.module) or ""  # type: ignore[arg-type]
            for alias in node.names:
                name = get_full_name_for_node(alias.name) or ""
                asname = alias.asname.name.value if alias.asname else None  # type: ignore[union-attr]
                offered[asname or name] = (base, name, asname)
    new_outputs = dict(outputs)
    taken: set[str] = set()
    for module_path, new in outputs.items():
        wanted = needed_imports(texts[module_path], new)
        if not wanted:
            continue
        if not wanted <= offered.keys():
            return None
        context = CodemodContext()
        for name in sorted(wanted):
            AddImportsVisitor.add_needed_import(context, *offered[name])
        try:
            new_outputs[module_path] = AddImportsVisitor(context).transform_module(cst.parse_module(new)).code
        except cst.ParserSyntaxError:
            return None
        taken |= wanted
    read = read_anywhere(entry)
    unused = [name for name in taken if read is not None and name not in read]
    if unused:
        context = CodemodContext()
        for name in unused:
            RemoveImportsVisitor.remove_unused_import(context, *offered[name])
        entry = RemoveImportsVisitor(context).transform_module(new_tree).code
    return entry, new_outputs


#: The codemods that run before the analysis, on the file as written, in this order (each on what the
#: one before made of it): the script is converted as the path its launch takes.
SPECIALISERS = (SpawnLaunch, SetUpHelper, ProcessGroupAttributes)


def _convert_specialised(module: cst.Module, source: str, path: str, options: Options) -> Optional[Result]:
    """A script whose launch decides its path (ACC027), that sets up in a helper (ACC030) or counts its processes
    (ACC028): converted as
    that path alone, the positions of what is said put back on the file's lines; None for any other file."""
    steps = []
    current, text = module, source
    for codemod in SPECIALISERS:
        if codemod.HINT not in source or (options.select is not None and codemod.CODE not in options.select):
            continue
        done = codemod.specialise(current)
        if done is None:
            continue
        steps.append((codemod, done, _line_map(text, source) if steps else (lambda line: line)))
        current, text = done.module, done.module.code
    if not steps:
        return None
    result = _convert(current, text, path, options)
    lines = _line_map(text, source)
    findings = sorted(replace(f, line=lines(f.line)) for f in result.findings)
    selected = options.select is not None  # `--select ACC027`: the launch alone, whatever else would do
    if result.error is not None or (result.output == text and not selected):
        return Result(path, source, source, findings=findings, error=result.error)  # refused (or an error)
    output = _imports_left_unused(source, result.output)
    changes = [replace(c, line=lines(c.line)) for c in result.changes]
    for codemod, done, located in steps:
        changes.append(Change(located(done.line), codemod.CODE, done.change))
        findings.extend(replace(f, line=located(f.line)) for f in done.notes(path))
    return Result(path, source, output, changes=sorted(changes), findings=sorted(findings))


def _imports_left_unused(source: str, output: str) -> str:
    """The imports only the code a specialisation dropped read (``import os`` of a set-up helper that read
    ``os.environ``) go, through LibCST's RemoveImportsVisitor; an import the original left unused stays."""
    before, after = read_anywhere(source), read_anywhere(output)
    if before is None or after is None or not before - after:
        return output
    gone = before - after
    try:
        module = cst.parse_module(output)
    except cst.ParserSyntaxError:
        return output
    context = CodemodContext()
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    name = get_full_name_for_node(alias.name) or ""
                    bound = alias.asname.name.value if alias.asname else name.split(".")[0]  # type: ignore[attr-defined]
                    if bound in gone:
                        RemoveImportsVisitor.remove_unused_import(
                            context, name, asname=alias.asname.name.value if alias.asname else None)  # type: ignore[attr-defined]
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(small.names, cst.ImportStar):
                origin = "." * len(small.relative) + (get_full_name_for_node(small.module) or "")
                for alias in small.names:
                    bound = alias.asname.name.value if alias.asname else alias.name.value  # type: ignore[attr-defined]
                    if bound in gone:
                        RemoveImportsVisitor.remove_unused_import(
                            context, origin, alias.name.value,  # type: ignore[arg-type]
                            alias.asname.name.value if alias.asname else None)  # type: ignore[attr-defined]
    if not context.scratch:
        return output
    return RemoveImportsVisitor(context).transform_module(module).code


def _line_map(derived: str, source: str):
    """Line of ``derived`` (the source with statements dropped and blocks dedented) -> line of ``source``."""
    a = [t.strip() for t in derived.splitlines()]
    b = [t.strip() for t in source.splitlines()]
    known: dict[int, int] = {}
    for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            known[block.a + k + 1] = block.b + k + 1

    def locate(line: int) -> int:
        below = [k for k in known if k <= line]
        return known[max(below)] if below else line
    return locate


def _report_only(options: Options) -> bool:
    """``--select`` named findings but no codemod: look at everything, change nothing."""
    return options.select is not None and not options.select


def _one_per_construct(findings: list[Finding]) -> list[Finding]:
    """The reasons a file stays as it is, sorted, one per construct (its position) and code: the analysis's
    first (an evaluation on the main process only), not the codemod's view of the same loop after it."""
    seen: set[tuple[int, int, str]] = set()
    kept = []
    for finding in findings:
        if (finding.line, finding.column, finding.code) not in seen:
            seen.add((finding.line, finding.column, finding.code))
            kept.append(finding)
    return sorted(kept)


def _run_codemods(module: cst.Module, context: CodemodContext, plan, source: str, options: Options):
    """Every codemod that applies, in one traversal: (the codemods, their shared state, the rewritten tree)."""
    shared = Shared(context.wrapper)
    codemods = []
    for codemod_class in gather_codemods():
        if options.select is not None and codemod_class.CODE not in options.select and not _report_only(options):
            continue
        if not codemod_class.applies(plan, source):
            continue
        codemod = codemod_class(context, plan, shared)
        shared.codemods[codemod_class.CODE] = codemod
        codemods.append(codemod)
    module = module.visit(Composite(codemods, shared, frozenset(plan_names(plan))))  # every codemod, one traversal
    for codemod in codemods:
        codemod.finished()
    return codemods, shared, module


def _codemod_refusals(module: cst.Module, context: CodemodContext, plan, source: str, options: Options) -> list:
    """What the codemods would refuse in a file an analysis check refused (the rewrite is thrown away).
    The plan is whole (``plan.complete``), so the codemods run on it as on a file that converts; should
    one still fail, the file is reported with the analysis's reasons alone (``ACCELIFY_STRICT`` set, as
    in the test suite: the error is raised)."""
    try:
        codemods, _, _ = _run_codemods(module, replace(context, scratch={}), plan, source, options)
    except Exception:
        if os.environ.get("ACCELIFY_STRICT"):
            raise
        return []
    return [f for c in codemods for f in c.refusals]


def _convert(module: cst.Module, source: str, path: str, options: Options, elsewhere: frozenset = frozenset()) -> Result:
    wrapper = resolve(module)  # metadata once, on the tree as written
    context = CodemodContext(filename=path, full_module_name=None, full_package_name=None, wrapper=wrapper)
    context.scratch["accelify.line_length"] = options.line_length
    context.scratch["accelify.target"] = options.target
    plan = analyze(wrapper, ProjectSources.of(path), elsewhere)
    if not _report_only(options):
        plan.restrict(options.select)

    def place(raw: RawFinding) -> Finding:
        return Finding(path, raw.line, raw.column, raw.code, raw.message, raw.suggestion)

    findings = [place(f) for f in plan.findings]
    if not plan.convertible and not plan.complete:
        return Result(path, source, source, findings=sorted(findings))
    if not plan.convertible:
        # refused by a check that builds nothing: what the codemods would refuse is named too
        refusals = _codemod_refusals(module, context, plan, source, options)
        return Result(path, source, source, findings=_one_per_construct(findings + [place(f) for f in refusals]))

    codemods, shared, module = _run_codemods(module, context, plan, source, options)
    if any(c.refused for c in codemods):
        # what every codemod refuses: the reasons the file stays as it is (not what a conversion would have
        # done, the analysis's or a codemod's: ACC136's "it is now `accelerator.device`", ACC143's "is now
        # `accelerator.num_processes`")
        notes = {id(n) for n in plan.conversion_notes}
        kept = [place(f) for f in plan.findings if id(f) not in notes]
        return Result(path, source, source, findings=_one_per_construct(kept + [place(f) for c in codemods for f in c.refusals]))
    accelerator = shared.codemod("ACC001")
    if accelerator is not None:
        module = accelerator.place(module)  # type: ignore[attr-defined]
    output_codemod = shared.codemod("ACC008")
    if output_codemod is not None:
        module = output_codemod.settle(module)  # type: ignore[attr-defined]
    changes = [c for codemod in codemods for c in codemod.changes]
    findings += [place(f) for codemod in codemods for f in codemod.findings]

    module = _imports(module, context)
    output = module.code
    if _report_only(options):
        return Result(path, source, source, findings=sorted(findings))
    if output != source and not _still_parses(source, output):
        return Result(path, source, source, findings=sorted(findings),
                      error=f"{path}: internal error: the rewrite does not parse; file left unchanged")
    # (A selection without ACC001 asks for a fragment that names an accelerator nobody creates.)
    if output != source and (options.select is None or "ACC001" in options.select):
        new_names = undefined_names(output) - undefined_names(source)
        if new_names:
            return Result(path, source, source, findings=sorted(findings),
                          error=f"{path}: internal error: the rewrite reads undefined "
                                f"{', '.join(sorted(new_names))}; file left unchanged")
    return Result(path, source, output, changes=sorted(changes), findings=sorted(findings))


def _imports(module: cst.Module, context: CodemodContext) -> cst.Module:
    """Add and remove imports (LibCST's visitors, which resolve metadata on the converted tree
    again: the removals are first narrowed to the names nothing reads any more)."""
    bare = replace(context, wrapper=None)
    before_imports = module
    if bare.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        # LibCST's visitor reads and writes the leading import block and the statement after it
        # only: give it that head of the module, not the whole tree to copy and walk.
        cut = _head_length(module)
        body = list(module.body[:cut])
        after = body[-1] if cut > _import_block(module)[1] else None
        if after is not None:  # the statement after the imports matters by its blank lines only
            body[-1] = cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=after.leading_lines)
        head = list(AddImportsVisitor(bare).transform_module(module.with_changes(body=body)).body)
        if after is not None:
            head[-1] = after.with_changes(leading_lines=head[-1].leading_lines)
        module = module.with_changes(body=[*head, *module.body[cut:]])
        module = _place_added_imports(before_imports, module)
    requests = bare.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, [])
    if requests:
        read = read_anywhere(module.code)
        requests = [r for r in requests if read is None or _bound_name(r) not in read]
        bare.scratch[RemoveImportsVisitor.CONTEXT_KEY] = requests
    if requests:
        module = RemoveImportsVisitor(bare).transform_module(module)
    return _no_new_leading_blank(before_imports, module)


def _head_length(module: cst.Module) -> int:
    """How many top-level statements AddImportsVisitor looks at: a docstring, the imports after
    it and the first statement after them (it may get a blank line before it)."""
    i = 0
    if module.body and m.matches(module.body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        i = 1
    while i < len(module.body) and m.matches(module.body[i], _IMPORT):
        i += 1
    return min(i + 1, len(module.body))


def _bound_name(request: tuple[str, Optional[str], Optional[str]]) -> str:
    """The name an import binds: ``import a.b`` binds ``a``, ``from a import b as c`` binds ``c``."""
    module, obj, asname = request
    if asname:
        return asname
    return obj if obj is not None else module.split(".")[0]


def _syntax_error(path: str, source: str, exc: cst.ParserSyntaxError) -> str:
    """Prefer CPython's own message and position: it is the one users know."""
    return cpython_error(source, path) or f"{path}:{exc.raw_line}:{exc.raw_column + 1}: cannot parse: {exc.message}"


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

