"""A script and the modules beside it that it trains in, converted as one program (docs/projects.md).

``python run.py`` may train in a function or class of a sibling module: ``from train import train``
... ``train(loader, model, optimizer)``, the loop and its ``loss.backward()`` in ``train.py``. Neither
file converts alone (one builds the objects, the other trains them). Here they become one program:

1. **Which modules**: a module of the script's folder (or a package in it) joins when the script
   imports from it at the top and what it imports runs a backward (itself or through the module's
   definitions it uses), or is a function the script hands its model or a DataLoader that places
   tensors or evaluates. A ``torch.nn.Module`` that runs its own backward is a model, not a trainer.
2. **Program**: the script's text, its ``from train import ...`` replaced by an import of nothing (the
   names then mean the definitions below, not an import; the lines after a first, comments); right
   after the last such import, fenced by two plain statements (the import block ends there, and new
   imports stay in the script), each after a marker line, the module's pieces: its imports (a relative
   one written absolute) and the top-level definitions the imported names reach, in their order. A
   definition imported under another name (``train_vanilla as train``) carries that name; for
   ``import train`` ... ``train.train(...)``, each ``train.x`` of the script and the definition it
   means are one token of their own. Everything else in the module stays out and unchanged.
3. The program is converted as a script (by the caller, :mod:`accelify.core.pipeline`), its modules'
   definitions named ``elsewhere``: the script's module-level Accelerator is not theirs to read.
4. **Split**: the output is cut at the markers; the masked lines and the tokens come back byte for
   byte; each changed piece goes back into its module at its lines, with that module's newlines.

The program is built only when it can mean what the files mean: no name bound by two of them to
different things, the module's reached statements plain definitions, a renamed definition not read by
its own name. Otherwise :func:`unit_of` gives None and the script is converted alone, as before.
Text and CPython's ``ast`` only: no LibCST, no file written.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from accelify.core.project import ProjectSources
from accelify.core.symbols import module_names, undefined_names


@dataclass
class Piece:
    """A run of lines of a module, in the program."""

    path: str  # the module's path, as the script's path is given (``helper/loops.py`` beside ``train.py``)
    start: int  # 0-based: the module's lines [start, end)
    end: int
    text: str  # in the program (the script's newlines; a relative import written absolute)
    original: str  # the module's own text of those lines
    rewritten: bool = False
    first_line: int = 0  # 1-based, in the program
    #: ``from loops import train_vanilla as train``: (``def train_vanilla``, ``def train``), as the
    #: definition is named in the module and in the program
    renamed: Optional[tuple[str, str]] = None
    #: token -> the module's own name of a definition the script reaches as ``module.name``
    tokens: dict[str, str] = field(default_factory=dict)


@dataclass
class Companion:
    """A module of the unit: its text as read, and its newline."""

    path: str
    text: str
    newline: str
    pieces: list[Piece] = field(default_factory=list)
    dotted: str = ""  # as the script imports it: `train`, `engine.loops`
    unbound: set[str] = field(default_factory=set)  # names the module reads and binds nowhere
    line: int = 0  # the script's import of it
    changed: set[str] = field(default_factory=set)  # the definitions the conversion changed (after split)
    defined_in: str = ""  # the package's module that defines what the script imports through the package


@dataclass
class Unit:
    path: str
    source: str
    program: str
    tag: str
    masked: dict[str, str]  # placeholder line -> the script's line it stands for
    companions: list[Companion]
    head_lines: int  # the script's lines before the modules' pieces (through the last masked import)
    tail_first: int  # the program's line where the rest of the script starts
    fence: str  # the statement before and after the pieces (``<word> = 0``): the import block ends there
    program_head: str = ""  # the program's text before the pieces (the script's, masked)
    #: ``import train`` ... ``train.train(...)``: in the program, each ``train.train`` of the script is a
    #: name of its own (token -> ``train.train``), and so is the definition in the module's pieces
    tokens: dict[str, str] = field(default_factory=dict)

    def elsewhere(self) -> frozenset:
        """The functions and classes the modules' pieces define (in the program, under these names)."""
        names = set()
        for companion in self.companions:
            for piece in companion.pieces:
                try:
                    tree = ast.parse(piece.text)
                except (SyntaxError, ValueError):
                    continue
                names.update(s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                           ast.ClassDef)))
        return frozenset(names)

    def readable(self, text: str) -> str:
        """A finding's text with each token as the name the user wrote (``train`` for the definition the
        script calls as ``train.train``)."""
        for token, original in self.tokens.items():
            text = text.replace(token, original.rsplit(".", 1)[-1])
        return text

    def locate(self, line: int) -> tuple[str, int]:
        """A line of the program as (path, line in that file); a marker line maps to its piece's first."""
        if line <= self.head_lines:
            return self.path, line
        if line >= self.tail_first:
            return self.path, self.head_lines + line - self.tail_first + 1
        for companion in self.companions:
            for piece in companion.pieces:
                last = piece.first_line + piece.text.count("\n")
                if piece.first_line - 1 <= line < last:
                    return companion.path, piece.start + max(line - piece.first_line, 0) + 1
        return self.path, self.head_lines

    def split(self, output: str) -> Optional[tuple[str, dict[str, str]]]:
        """(the script's new text, {module path: its new text} of the modules changed), or None
        when the output cannot be put back where it came from."""
        pieces = [p for c in self.companions for p in c.pieces]
        markers = [self._marker("begin"), *(self._marker(i) for i in range(len(pieces))), self._marker("end")]
        chunks = _cut(output, markers)
        if chunks is None:
            return None
        head, fence, *bodies, tail = chunks
        if fence.strip() != self.fence or not tail.startswith(self.fence):
            return None  # the conversion put something between the script and the pieces
        last = bodies[-1].rstrip("\r\n") if bodies else ""
        if not last.endswith(self.fence):
            return None
        bodies[-1] = last[: -len(self.fence)]
        tail = tail[len(self.fence):]
        tail = tail[len(_newline_of(self.source)):] if tail.startswith(_newline_of(self.source)) else tail
        entry = self._unmask(_blank_ends_as(head, self.program_head) + tail)
        if entry is None:
            return None
        for token, original in self.tokens.items():
            entry = entry.replace(token, original)
        new_texts: dict[str, str] = {}
        for companion in self.companions:
            lines = companion.text.splitlines(keepends=True)
            replaced: list[tuple[int, int, str]] = []
            for piece in companion.pieces:
                body = bodies[pieces.index(piece)]
                if body == piece.text:
                    continue
                if piece.rewritten or not _same_definitions(piece.text, body):
                    return None
                body = _ends_as(body, piece.text)
                companion.changed |= _defined_names(piece.original)
                if piece.renamed is not None:
                    module_name, program_name = piece.renamed
                    if body.count(program_name) != 1:
                        return None
                    body = body.replace(program_name, module_name)
                for token, name in piece.tokens.items():
                    body = body.replace(token, name)
                replaced.append((piece.start, piece.end, body.replace(_newline_of(self.source), companion.newline)
                                 if companion.newline != _newline_of(self.source) else body))
            if not replaced:
                continue
            for start, end, body in sorted(replaced, reverse=True):
                lines[start:end] = [body]
            new_texts[companion.path] = "".join(lines)
        return entry, new_texts

    def _marker(self, index: "int | str") -> str:
        return f"# {self.tag}piece {index}{_newline_of(self.source)}"

    def _unmask(self, text: str) -> Optional[str]:
        for placeholder, original in self.masked.items():
            if text.count(placeholder) != 1:
                return None
            text = text.replace(placeholder, original)
        return text


def needed_imports(old: str, new: str) -> set[str]:
    """Names the new text reads that nothing binds, and the old text did not read unbound."""
    return undefined_names(new) - undefined_names(old)


# --------------------------------------------------------------------------
# building the program


#: What code that trains or evaluates a model says (a backward; the batches placed, the model put in
#: evaluation mode, gradients off): a module's function with none of these is no training code
_MARKS = (".backward(", ".cuda(", ".to(", "no_grad", ".eval()")

_FROM_LOCAL = re.compile(r"^(?:from[ \t]+(\.?)([\w.]+)[ \t]+import\b|import[ \t]+()([\w., \t]+)$)", re.MULTILINE)


def companion_files(source: str, path: str, sources: Optional[ProjectSources] = None) -> list[str]:
    """The files of the modules ``source`` would be converted with (none for most files: a text test)."""
    unit = unit_of(source, path, sources)
    if unit is None:
        return []
    root = os.path.dirname(os.path.abspath(path))
    return [os.path.join(root, os.path.relpath(c.path, os.path.dirname(path) or ".")) for c in unit.companions]


def printing_modules(source: str, sources: ProjectSources) -> list[str]:
    """The files of the modules beside the script that it imports at its top and whose text prints: what its
    conversion may change with it (their prints, accelify.core.module_output). A text test, no parse."""
    found = [sources.module_file(dotted, level) for dotted, level in _local_imports(source)
             if "print" in (sources.module_source(dotted, level) or "")]
    return [f for f in found if f is not None]


def _local_imports(source: str):
    """(module, level) of each module a top-level ``from X import`` or ``import X, Y as y`` of ``source`` names
    (a text test: the modules may be anywhere)."""
    for match in _FROM_LOCAL.finditer(source):
        if match.group(2) is not None:
            yield match.group(2), len(match.group(1))
        else:  # `import train, utils as u`
            yield from ((part.split()[0], 0) for part in match.group(4).split(",") if part.split())


def _trains_beside(source: str, sources: ProjectSources) -> bool:
    """The text test: a top-level ``from X import`` of a module beside the script that runs a backward."""
    for dotted, level in _local_imports(source):
        text = sources.module_source(dotted, level)
        if text is not None and any(mark in text for mark in _MARKS):
            return True
        # a package whose `__init__` takes names from its modules (`from .knn_monitor import knn_monitor`)
        for inner in _RELATIVE_FROM.findall(text or ""):
            found = sources.module_source(f"{dotted}.{inner}", level)
            if found is not None and any(mark in found for mark in _MARKS):
                return True
    return False


_RELATIVE_FROM = re.compile(r"^from[ \t]+\.(\w+)[ \t]+import\b", re.MULTILINE)


def unit_of(source: str, path: str, sources: Optional[ProjectSources] = None) -> Optional[Unit]:
    """The program of ``source`` and the sibling modules it trains in; None when there is none, or
    when it could not mean what the files mean."""
    if "import" not in source:
        return None
    if "__main__" not in source and os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(path)), "__init__.py")):
        return None  # a module of a package, without a main guard: a library others import, no script
    sources = sources or ProjectSources.of(path)
    if sources.root is None or not _trains_beside(source, sources):
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    newline = _newline_of(source)
    lines = source.splitlines(keepends=True)
    entry_bound = _bindings(tree.body, None)
    masked_statements: list[ast.ImportFrom] = []
    companions: list[Companion] = []
    taken: dict[str, tuple] = {}
    tag = unused_tag(source)
    word = "accelify_masked_" + tag.split("-")[1]
    tokens: dict[str, str] = {}  # token -> `module.name`, in the script
    handed = _handed_training_objects(tree)
    replacements: list[tuple[int, int, int, str]] = []  # (line, start, end byte) of `module.name` -> token
    last_import = 0
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                found = _module_attributes(tree, statement, alias, sources, path, word, handed)
                if found is False:
                    return None
                if found is None:
                    continue
                companion, module_tree, package, uses, used_tokens = found
                if _clashes(module_tree, companion, package, set(used_tokens.values()), entry_bound, taken):
                    return None
                local = alias.asname or alias.name
                for token, name in used_tokens.items():
                    tokens[token] = f"{local}.{name}"
                replacements += [(u.lineno, u.col_offset, u.end_col_offset or 0, f"{word}_{local}_{u.attr}")
                                 for u in uses if f"{word}_{local}_{u.attr}" in used_tokens]
                companion.dotted, companion.line = alias.name, statement.lineno
                companions.append(companion)
                last_import = max(last_import, statement.end_lineno or statement.lineno)
            continue
        if not isinstance(statement, ast.ImportFrom) or statement.level > 1 or not statement.module:
            continue
        found = sources.module_file(statement.module, statement.level)
        if found is None:
            continue
        dotted = statement.module
        if found.endswith("__init__.py"):  # `from tools import knn_monitor`, defined in tools/knn_monitor.py
            found, dotted = _through_package(found, statement, sources) or (found, dotted)
        text = read_module(found)
        if text is None or not any(mark in text for mark in _MARKS):
            continue
        try:
            module_tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            return None
        names = [alias.name for alias in statement.names]
        defined = _top_definitions(module_tree)
        if any(alias.name == "*" for alias in statement.names):
            return None
        local_of = {alias.asname or alias.name: alias.name for alias in statement.names}
        if not _joins(text, defined, names, {local_of[c] for c in handed if c in local_of}):
            continue
        if any(n not in defined for n in names):
            return None  # a constant or a name the module imports: kept as an import, it would clash
        relative = os.path.relpath(found, sources.root)
        package = os.path.dirname(relative).replace(os.sep, ".")
        companion = _companion(text, module_tree, names, _display(path, relative), package)
        if companion is None:
            return None
        renames = {a.name: a.asname for a in statement.names if a.asname not in (None, a.name)}
        if renames and not _rename(companion, module_tree, renames):
            return None
        if _clashes(module_tree, companion, package, set(names), entry_bound, taken):
            return None
        masked_statements.append(statement)
        companion.dotted, companion.line = statement.module, statement.lineno
        companion.defined_in = dotted if dotted != statement.module else ""
        companions.append(companion)
    if not companions or any(tag.rstrip("-") in c.text or word in c.text for c in companions):
        return None
    if any(c.unbound & (entry_bound.keys() | module_names(source)) for c in companions):
        return None  # the module reads a name only the script binds: one program would join what is apart
    if "__main__" not in source and not _runs_at_top(tree, {n for s in masked_statements for n in
                                                             (a.asname or a.name for a in s.names)}
                                                        | {t.split(".")[0] for t in tokens.values()}):
        return None  # a module others import (no `if __name__ == "__main__":`, nothing run at its top)
    masked: dict[str, str] = {}
    program_lines = list(lines)
    _splice(program_lines, replacements)
    for statement in masked_statements:
        for index in range(statement.lineno - 1, statement.end_lineno or statement.lineno):
            original = program_lines[index]
            ending = original[len(original.rstrip("\r\n")):]
            # an import of nothing keeps the import block as it was; the lines after a first, comments
            first = index == statement.lineno - 1
            placeholder = f"import {word}_{index + 1}" if first else f"# {tag}masked {index + 1}"
            masked[placeholder] = original[: len(original) - len(ending)]
            program_lines[index] = placeholder + ending
    if any(len(s.names) and s.lineno == (s.end_lineno or s.lineno) and ";" in lines[s.lineno - 1] for s in masked_statements):
        return None  # `from train import train; x = 1`: the mask would hide more than the import
    cut = max([s.end_lineno or s.lineno for s in masked_statements] + [last_import])
    head = "".join(program_lines[:cut])
    tail = "".join(program_lines[cut:])
    if head and not head.endswith(("\n", "\r")):
        return None  # the import is the script's last line, without a newline: nothing follows it anyway
    fence = f"{word} = 0"
    unit = Unit(path, source, "", tag, masked, companions, cut, 0, fence, head, tokens)
    parts = [head, unit._marker("begin"), fence + newline]
    line = head.count("\n") + 3
    for index, piece in enumerate(p for c in companions for p in c.pieces):
        parts.append(unit._marker(index))
        line += 1
        piece.first_line = line
        companion = next(c for c in companions if piece in c.pieces)
        if companion.newline != newline:
            piece.text = piece.text.replace(companion.newline, newline)
        parts.append(piece.text)
        line += piece.text.count("\n")
    parts += [fence + newline, unit._marker("end"), fence + newline]
    unit.tail_first = line + 3
    parts.append(tail)
    unit.program = "".join(parts)
    return unit


def _companion(text: str, tree: ast.Module, names: list[str], path: str, package: str) -> Optional[Companion]:
    """The module's pieces the imported names reach; None if a reached name is bound in a way the
    program cannot hold (in an ``if`` or ``try`` at the top, or by a statement that does more than bind)."""
    defined = _top_definitions(tree)
    reached = _reached(defined, names)
    bound_elsewhere = set(_bindings([s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))
                                     and s not in defined.values()], package))
    used = {n.id for name in reached for n in ast.walk(defined[name]) if isinstance(n, ast.Name)}
    if used & bound_elsewhere:
        return None
    lines = text.splitlines(keepends=True)
    newline = _newline_of(text)
    companion = Companion(path, text, newline)
    # names the module reads and never binds (set from outside: `train.args = args`, or a bug): in the
    # program they would mean the script's
    companion.unbound = undefined_names(text)
    for statement in tree.body:
        keep = isinstance(statement, (ast.Import, ast.ImportFrom)) and getattr(statement, "module", None) != "__future__"
        keep = keep or any(statement is defined[n] for n in reached)
        if not keep:
            continue
        first = min([statement.lineno] + [d.lineno for d in getattr(statement, "decorator_list", [])])
        last = statement.end_lineno or statement.lineno
        if ";" in lines[last - 1] and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        original = "".join(lines[first - 1:last])
        if not original.endswith(("\n", "\r")):
            original += newline
        piece = Piece(path, first - 1, last, original, original)
        if isinstance(statement, ast.ImportFrom) and statement.level:
            absolute = _absolute(statement, package)
            if absolute is None:
                return None
            piece.text = absolute + newline * (last - first + 1)
            piece.rewritten = True
        companion.pieces.append(piece)
    return companion


def _joins(text: str, defined: dict[str, ast.stmt], names: list[str], handed: set[str]) -> bool:
    """Does the module join the program: what the script imports from it runs a backward, or a function the
    script hands a training object (its model, a DataLoader) places tensors or evaluates (NCF's
    ``evaluate.metrics(model, test_loader, top_k)``: its ``.cuda()`` and its metrics over the loader)?"""
    def code(names_: "set[str] | list[str]") -> str:
        return "".join(ast.get_source_segment(text, defined[n]) or "" for n in _reached(defined, list(names_)))

    if any(_trains_itself(defined.get(n)) for n in names):
        return False  # MAML's `Meta(nn.Module)`: its forward steps its own optimizer; no trainer to convert
    if ".backward(" in code(names):
        return True
    functions = {n for n in handed if isinstance(defined.get(n), (ast.FunctionDef, ast.AsyncFunctionDef))}
    return any(mark in code({n}) for n in functions for mark in _MARKS)


def _trains_itself(statement: Optional[ast.stmt]) -> bool:
    """A ``torch.nn.Module`` subclass that runs a backward in its own methods (a meta-learner whose
    ``forward`` steps its optimizer): a model, not a trainer; under DDP its forward could not train."""
    if not isinstance(statement, ast.ClassDef):
        return False
    module = any((isinstance(b, ast.Attribute) and b.attr == "Module") or (isinstance(b, ast.Name) and b.id == "Module")
                 for b in statement.bases)
    return module and any(isinstance(n, ast.Attribute) and n.attr == "backward" for n in ast.walk(statement))


def _handed_training_objects(tree: ast.Module) -> set[str]:
    """The functions the script calls with its model or a DataLoader as an argument (``evaluate``,
    ``utils.metrics``): a model is a name whose ``.parameters()`` is read, a loader a name bound to a
    ``DataLoader(...)`` call."""
    objects: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parameters" \
                and isinstance(node.func.value, ast.Name):
            objects.add(node.func.value.id)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called.endswith("DataLoader"):
                objects.update(t.id for t in node.targets if isinstance(t, ast.Name))
    callees: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        args = [*node.args, *(k.value for k in node.keywords)]
        if not any(isinstance(a, ast.Name) and a.id in objects for a in args):
            continue
        if isinstance(node.func, ast.Name):
            callees.add(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            callees.add(f"{node.func.value.id}.{node.func.attr}")
    return callees


def _runs_at_top(tree: ast.Module, names: set[str]) -> bool:
    """Does the module's own top-level code (not its functions and classes) use one of ``names``?"""
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        if any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(statement)):
            return True
    return False


def _clashes(module_tree: ast.Module, companion: Companion, package: str, imported: set[str],
             entry_bound: dict[str, tuple], taken: dict[str, tuple]) -> bool:
    """Does a name the module's pieces bind (other than the ``imported`` ones) mean something else in the
    script or in a module already in the program? Imports of the same thing may be bound twice; ``taken``
    records the module's names for the modules after it."""
    for name, key in _bindings([s for s in module_tree.body if _kept(s, companion)], package).items():
        if name in imported:
            continue
        other = entry_bound.get(name) or taken.get(name)
        if other is not None and (other != key or key[0] != "import"):
            return True
        taken[name] = key
    return False


def _splice(lines: list[str], spots: list[tuple[int, int, int, str]]) -> None:
    """Put each ``(line, start byte, end byte, text)`` in place, in ``lines`` (``ast`` columns count UTF-8 bytes)."""
    for line, start, end, text in sorted(spots, reverse=True):
        raw = lines[line - 1].encode("utf-8")
        lines[line - 1] = (raw[:start] + text.encode() + raw[end:]).decode("utf-8")


def _module_attributes(tree: ast.Module, statement: ast.Import, alias: ast.alias, sources: ProjectSources,
                       path: str, word: str, handed: set[str]):
    """``import train`` and ``train.train(...)``, ``train.evaluate(...)``: (the module's pieces, its tree, its
    package, the script's ``train.x`` nodes, {token: name} of the definitions given tokens); None if it is
    not a module beside the script that trains; False if it is, but the program could not mean the files."""
    if "." in alias.name and alias.asname is None:
        return None  # `import a.b` binds `a`: not followed
    found = sources.module_file(alias.name, 0)
    text = read_module(found) if found is not None else None
    if text is None or not any(mark in text for mark in _MARKS):
        return None
    try:
        module_tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    local = alias.asname or alias.name.split(".")[0]
    uses = _attribute_uses(tree, local, statement)
    defined = _top_definitions(module_tree)
    if uses is None:
        return False
    names = sorted({u.attr for u in uses if isinstance(defined.get(u.attr), (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                              ast.ClassDef))})
    if not _joins(text, defined, names, {c.split(".", 1)[1] for c in handed if c.startswith(local + ".")}):
        return None
    if any(u.lineno != u.end_lineno for u in uses if u.attr in names):
        return False
    relative = os.path.relpath(found, sources.root)  # type: ignore[arg-type]
    package = os.path.dirname(relative).replace(os.sep, ".")
    companion = _companion(text, module_tree, names, _display(path, relative), package)
    if companion is None:
        return False
    tokens = {f"{word}_{local}_{name}": name for name in names}
    if not _retoken(companion, {name: token for token, name in tokens.items()}):
        return False
    return companion, module_tree, package, uses, tokens


def _attribute_uses(tree: ast.Module, local: str, statement: ast.Import) -> Optional[list[ast.Attribute]]:
    """Every ``local.x`` of the script; None if ``local`` is used otherwise (handed on, bound again)."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == local:
            uses.append(node)
    attributes = {id(u.value) for u in uses}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == local and id(node) not in attributes:
            return None
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node is not statement and any(
                (a.asname or a.name.split(".")[0]) == local for a in node.names):
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == local:
            return None
    if any(isinstance(u.ctx, (ast.Store, ast.Del)) for u in uses):
        return None  # `train.x = ...`: the module's state, set from the script
    return uses


def _retoken(companion: Companion, tokens: dict[str, str]) -> bool:
    """In the pieces, each definition in ``tokens`` and every name that reads it is its token."""
    for piece in companion.pieces:
        if piece.rewritten:
            continue
        try:
            tree = ast.parse(piece.original)
        except (SyntaxError, ValueError):
            return False
        lines = piece.text.splitlines(keepends=True)
        spots: list[tuple[int, int, int, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in tokens:
                spots.append((node.lineno, node.col_offset, node.end_col_offset or 0, tokens[node.id]))
            elif isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & tokens.keys():
                return False
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and statement.name in tokens:
                raw = lines[statement.lineno - 1].encode("utf-8")
                keyword = b"class" if isinstance(statement, ast.ClassDef) else b"def"
                found = re.search(rb"\b" + keyword + rb"\s+" + re.escape(statement.name.encode()) + rb"\b", raw)
                if found is None:
                    return False
                start = found.end() - len(statement.name.encode())
                spots.append((statement.lineno, start, found.end(), tokens[statement.name]))
        _splice(lines, spots)
        if spots:
            piece.tokens = {token: name for name, token in tokens.items() if token in "".join(lines)}
            piece.text = "".join(lines)
    return True


def _rename(companion: Companion, tree: ast.Module, renames: dict[str, str]) -> bool:
    """In the program, a definition imported under another name has that name (``def train(`` for
    ``from loops import train_vanilla as train``): the script's calls mean it. Only where nothing else
    in the program reads the module's own name, and the new one means nothing there."""
    defined = _top_definitions(tree)
    read: dict[str, int] = {}
    for piece in companion.pieces:
        for node in ast.walk(ast.parse(piece.original) if not piece.rewritten else ast.parse("")):
            if isinstance(node, ast.Name):
                read[node.id] = read.get(node.id, 0) + 1
    for name, alias in renames.items():
        statement = defined.get(name)
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        if read.get(name) or alias in defined or alias in read:
            return False
        piece = next((p for p in companion.pieces if p.start <= statement.lineno - 1 < p.end), None)
        if piece is None:
            return False
        keyword = "class" if isinstance(statement, ast.ClassDef) else "async def" if isinstance(
            statement, ast.AsyncFunctionDef) else "def"
        header = re.compile(rf"\b{keyword}\s+{re.escape(name)}\b")
        if len(header.findall(piece.text)) != 1:
            return False
        old = header.search(piece.text).group(0)  # type: ignore[union-attr]
        new = old[: len(old) - len(name)] + alias
        piece.text = piece.text.replace(old, new, 1)
        piece.renamed = (old, new)
    return True


def _reached(defined: dict[str, ast.stmt], names: list[str]) -> set[str]:
    """The top-level definitions ``names`` use, transitively (themselves included)."""
    reached: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in reached or name not in defined:
            continue
        reached.add(name)
        todo.extend(n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name))
    return reached


def _kept(statement: ast.stmt, companion: Companion) -> bool:
    first = min([statement.lineno] + [d.lineno for d in getattr(statement, "decorator_list", [])])
    return any(p.start == first - 1 for p in companion.pieces)


def _absolute(statement: ast.ImportFrom, package: str) -> Optional[str]:
    """``from .util import a`` of a module in ``helper`` as ``from helper.util import a``."""
    parts = package.split(".") if package else []
    if statement.level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (statement.level - 1)]
    module = ".".join(base + ([statement.module] if statement.module else []))
    if not module:
        return None
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in statement.names)
    return f"from {module} import {names}"


def _through_package(init: str, statement: ast.ImportFrom, sources: ProjectSources) -> Optional[tuple[str, str]]:
    """(the file, the module) of the one submodule a package's ``__init__`` takes every name of ``statement``
    from, under the same name (``from .knn_monitor import knn_monitor``); None otherwise."""
    text = read_module(init)
    try:
        tree = ast.parse(text) if text is not None else None
    except (SyntaxError, ValueError, RecursionError):
        return None
    if tree is None:
        return None
    origin: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                if alias.asname in (None, alias.name):
                    origin[alias.name] = node.module
    modules = {origin.get(alias.name) for alias in statement.names}
    if len(modules) != 1 or None in modules:
        return None
    dotted = f"{statement.module}.{modules.pop()}"
    found = sources.module_file(dotted, statement.level)
    return (found, dotted) if found is not None else None


def _top_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The module's top-level functions and classes, and names assigned once at the top, by name."""
    found: dict[str, ast.stmt] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[statement.name] = statement
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = statement
    return found


def _bindings(statements: list[ast.stmt], package: Optional[str]) -> dict[str, tuple]:
    """Names the statements bind at the top of their module, each with what it is: ``("import",
    "torch.nn")`` or ``("other", line)``. Into ``if``/``try``/``with``/loops, not into functions."""
    found: dict[str, tuple] = {}

    def visit(statement: ast.stmt) -> None:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                name = alias.asname or alias.name.split(".")[0]
                found[name] = ("import", alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level and package is not None:
                absolute = _absolute(statement, package)
                base = absolute.split()[1] if absolute else f"?{statement.level}{base}"
            elif statement.level:
                base = "." * statement.level + base
            for alias in statement.names:
                found[alias.asname or alias.name] = ("import", f"{base}.{alias.name}")
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[statement.name] = ("other", statement.lineno)
        else:
            for node in ast.walk(statement):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    found[node.id] = ("other", statement.lineno)
            for child in ast.iter_child_nodes(statement):
                if isinstance(child, ast.stmt):
                    visit(child)

    for statement in statements:
        visit(statement)
    return found


def _defined_names(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    return {s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _same_definitions(old: str, new: str) -> bool:
    """Does the converted piece still define what it did, and nothing more at the top (a statement
    the conversion put after the last definition of the program would land here)?"""
    try:
        before, after = ast.parse(old), ast.parse(new)
    except (SyntaxError, ValueError):
        return False
    return [type(s).__name__ + str(getattr(s, "name", "")) for s in before.body] == \
        [type(s).__name__ + str(getattr(s, "name", "")) for s in after.body]


def _ends_as(new: str, old: str) -> str:
    """The new piece with as many line ends at its end as the old one had."""
    core = new.rstrip("\r\n")
    return core + old[len(old.rstrip("\r\n")):]


def _blank_ends_as(new: str, old: str) -> str:
    """``new`` with as many blank lines at its end as ``old`` (a new import brings a blank line before the
    statement after the import block: here the fence, which goes)."""
    def blank_end(text: str) -> int:
        lines = text.splitlines(keepends=True)
        count = 0
        while count < len(lines) and not lines[len(lines) - 1 - count].strip():
            count += 1
        return count

    lines = new.splitlines(keepends=True)
    extra = blank_end(new) - blank_end(old)
    return "".join(lines[: len(lines) - extra]) if extra > 0 else new


def _cut(output: str, markers: list[str]) -> Optional[list[str]]:
    """[the text before the first marker, the text after each]: each marker once, in order, at a line start."""
    chunks = []
    position = 0
    for marker in markers:
        found = output.find(marker, position)
        if found < 0 or (found > 0 and output[found - 1] != "\n") or output.count(marker) != 1:
            return None
        chunks.append(output[position:found])
        position = found + len(marker)
    chunks.append(output[position:])
    return chunks


def _newline_of(text: str) -> str:
    match = re.search(r"\r\n|\n|\r", text)
    return match.group(0) if match else "\n"


def unused_tag(text: str) -> str:
    """A word found nowhere in ``text`` (``accelify-<hex>-``), for markers and placeholders."""
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
    for size in range(10, 41):
        tag = f"accelify-{digest[:size]}-"
        if tag not in text:
            return tag
    salt = 0
    while f"accelify-{salt}-" in text:
        salt += 1
    return f"accelify-{salt}-"


def _display(entry: str, relative: str) -> str:
    """The module's path as the script's is given: ``src/train.py`` and ``loops.py`` -> ``src/loops.py``."""
    folder = os.path.dirname(entry)
    return os.path.join(folder, relative) if folder else relative


def read_module(path: str) -> Optional[str]:
    """The module's text with its newlines as they are (utf-8; anything else is not read)."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None
