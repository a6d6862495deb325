"""A script and the module beside it that trains, converted as one program.

``python run.py`` may train in a function or class of a sibling module: ``from train import train``
... ``train(loader, model, optimizer)``, the loop and its ``loss.backward()`` in ``train.py``. Neither
file converts alone (one builds the objects, the other trains them). Here the two become one program:

1. **Program**: the script's text, with the ``from train import ...`` statement masked (a comment per
   line: the names then mean the functions below, not an import); then, each after a marker line, the
   statements of the module the script reaches: its imports (a relative one written absolute), and the
   top-level functions, classes and assignments the imported names use, transitively, in their order.
   Everything else in the module (other functions, its ``__main__`` block) stays out and unchanged.
2. The program is converted as a script (by the caller: :mod:`accelify.core.pipeline`).
3. **Split**: the output is cut at the markers; the masked lines come back byte for byte; each changed
   piece goes back into its module at its lines, with that module's newlines. An import the
   conversion added that a module's new code reads goes into that module too.

The program is built only when it can mean what the two files mean: the names imported as they are
defined (no ``as`` renaming), no name bound by both files to different things, the module's reached
statements plain definitions. Otherwise :func:`unit_of` gives None and the script is converted alone, as
before. Text and CPython's ``ast`` only: no LibCST, no file written.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from accelify.core.project import ProjectSources
from accelify.core.symbols import undefined_names


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


@dataclass
class Companion:
    """A module of the unit: its text as read, and its newline."""

    path: str
    text: str
    newline: str
    pieces: list[Piece] = field(default_factory=list)


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
                if piece.renamed is not None:
                    module_name, program_name = piece.renamed
                    if body.count(program_name) != 1:
                        return None
                    body = body.replace(program_name, module_name)
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


_FROM_LOCAL = re.compile(r"^from[ \t]+(\.?)([\w.]+)[ \t]+import\b", re.MULTILINE)


def companion_files(source: str, path: str) -> list[str]:
    """The files of the modules ``source`` would be converted with (none for most files: a text test)."""
    unit = unit_of(source, path)
    if unit is None:
        return []
    root = os.path.dirname(os.path.abspath(path))
    return [os.path.join(root, os.path.relpath(c.path, os.path.dirname(path) or ".")) for c in unit.companions]


def _trains_beside(source: str, sources: ProjectSources) -> bool:
    """The text test: a top-level ``from X import`` of a module beside the script that runs a backward."""
    for match in _FROM_LOCAL.finditer(source):
        text = sources.module_source(match.group(2), len(match.group(1)))
        if text is not None and ".backward(" in text:
            return True
    return False


def unit_of(source: str, path: str, sources: Optional[ProjectSources] = None) -> Optional[Unit]:
    """The program of ``source`` and the sibling modules it trains in; None when there is none, or
    when it could not mean what the files mean."""
    if "import" not in source:
        return None
    sources = sources or ProjectSources(path)
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
    for statement in tree.body:
        if not isinstance(statement, ast.ImportFrom) or statement.level > 1 or not statement.module:
            continue
        found = sources.module_file(statement.module, statement.level)
        if found is None:
            continue
        text = _read(found)
        if text is None or ".backward(" not in text:
            continue
        try:
            module_tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            return None
        names = [alias.name for alias in statement.names]
        defined = _top_definitions(module_tree)
        if any(alias.name == "*" for alias in statement.names):
            return None
        if not any(".backward(" in (ast.get_source_segment(text, defined[n]) or "") for n in _reached(defined, names)):
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
        for name, key in _bindings([s for s in module_tree.body if _kept(s, companion)], package).items():
            if name in names:
                continue
            other = entry_bound.get(name) or taken.get(name)
            if other is not None and (other != key or key[0] != "import"):
                return None  # both files bind it, to different things
            taken[name] = key
        masked_statements.append(statement)
        companions.append(companion)
    if not companions:
        return None
    tag = _tag(source + "".join(c.text for c in companions))
    masked: dict[str, str] = {}
    program_lines = list(lines)
    word = "accelify_masked_" + tag.split("-")[1]
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
    cut = max(s.end_lineno or s.lineno for s in masked_statements)
    head = "".join(program_lines[:cut])
    tail = "".join(program_lines[cut:])
    if head and not head.endswith(("\n", "\r")):
        return None  # the import is the script's last line, without a newline: nothing follows it anyway
    fence = f"{word} = 0"
    unit = Unit(path, source, "", tag, masked, companions, cut, 0, fence, head)
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


def _tag(text: str) -> str:
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
    for size in range(10, 41):
        tag = f"accelify-{digest[:size]}-"
        if tag not in text:
            return tag
    return "accelify-unit-" + digest


def _display(entry: str, relative: str) -> str:
    """The module's path as the script's is given: ``src/train.py`` and ``loops.py`` -> ``src/loops.py``."""
    folder = os.path.dirname(entry)
    return os.path.join(folder, relative) if folder else relative


def _read(path: str) -> Optional[str]:
    """The module's text with its newlines as they are (utf-8; anything else is not read)."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None
