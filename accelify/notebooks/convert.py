"""Jupyter notebooks (``.ipynb``): the code cells converted as one program, every cell kept a cell.

Nothing here imports LibCST or torch: the program is handed to the same conversion as a
``.py`` file (``convert``, :func:`accelify.app.runner.convert_python`).

1. **Read**: the JSON is parsed for its content, and scanned once more for where each cell's
   ``source`` value lies in the text. Writing back replaces the ``source`` values of the
   rewritten cells there and nothing else: indentation, key order, escapes, the trailing newline,
   outputs, ids and metadata stay byte for byte. A rewritten source is written in the form it had
   (a string, or a list of lines laid out as the list was).
2. **Mask**: IPython syntax Python does not parse (``%magic``, ``!shell``, ``model?``, ``?model``,
   ``files = !ls``) becomes a placeholder line per line (a comment, or ``pass`` inside a block); a
   ``%%time``/``%%capture``-style cell magic masks its first line (the body is Python); a cell of
   another language (``%%bash``, ``%%writefile``, an unknown cell magic) is left out of the program.
   Only lines CPython reports as errors, and that look like IPython, are masked.
3. **One program**: the code cells in order, each after a marker comment line. It is converted
   as a script; the output is split at the markers, placeholders are restored byte for byte (with
   the new indentation of their line), and a cell whose text did not change keeps its exact source.
4. **Where things are**: findings and changes name the cell (1-based over all the notebook's cells,
   markdown included) and the line in it; the diff is one unified diff per changed cell.

A cell left out of the program (it does not parse, or is another language) stays as it is. If it
mentions training (the pre-check's text test), converting the rest could train differently
(its loop would not see ``prepare``), so the whole notebook is left unchanged with ACC140;
otherwise the rest is converted and the cell reported. Nothing here raises on user input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from accelify.core import precheck
from accelify.core.result import Options, Result
from accelify.core.unit import unused_tag
from accelify.queries.records import Finding

#: The finding for a cell the conversion cannot see (it does not parse, is another language, or
#: runs code through a magic).
CODE = "ACC140"

#: Cell magics whose body is Python run in the kernel: only the ``%%`` line is masked.
PYTHON_BODY_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
#: Cell magics whose body is not run by the kernel's Python: the cell is left out of the program.
OTHER_LANGUAGE_MAGICS = frozenset({
    "bash", "sh", "script", "writefile", "file", "html", "HTML", "javascript", "js", "latex", "markdown", "svg",
    "perl", "ruby", "python", "python2", "python3", "pypy", "system", "sx",
})
#: Line magics whose argument is Python run in the kernel: masked, the code is not seen.
PYTHON_ARGUMENT_MAGICS = frozenset({"time", "timeit", "prun", "debug"})


class NotebookError(Exception):
    """A file that is not a notebook accelify can read; the message names the file."""


def is_notebook(path: str) -> bool:
    return path.endswith(".ipynb")


def looks_like_notebook(text: str) -> bool:
    """Standard input that is a notebook's JSON (an object with ``cells`` and ``nbformat``)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and "cells" in data and "nbformat" in data


# --------------------------------------------------------------------------
# reading and writing


@dataclass
class Cell:
    number: int  # 1-based, over all the notebook's cells
    kind: str  # "code", "markdown", "raw"
    text: str  # the source, joined
    form: str  # "list" or "str": how the file spells it
    span: tuple[int, int]  # where the source value lies in the file's text
    items: list[tuple[int, int]] = field(default_factory=list)  # list form: each line's string


@dataclass
class Notebook:
    text: str
    cells: list[Cell]
    newline: str  # the file's newline
    unit: str  # one level of indentation ("" for a one-line file)


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


_DECODER = json.JSONDecoder()


def _value(text: str, i: int) -> tuple[object, int]:
    return _DECODER.raw_decode(text, i)


def _expect(text: str, i: int, char: str) -> int:
    if i >= len(text) or text[i] != char:
        raise ValueError(f"expected {char!r} at character {i}")
    return i + 1


def _members(text: str, i: int):
    """The members of the object starting at ``text[i]``: yields (key, start of value) and
    expects to be sent the end of each value."""
    i = _expect(text, _ws(text, i), "{")
    i = _ws(text, i)
    if text[i:i + 1] == "}":
        return i + 1
    while True:
        key, i = _value(text, i)
        i = _ws(text, _expect(text, _ws(text, i), ":"))
        i = yield key, i
        i = _ws(text, i)
        if text[i:i + 1] == ",":
            i = _ws(text, i + 1)
            continue
        return _expect(text, i, "}")


def _walk_object(text: str, i: int, on_member: Callable[[str, int], int]) -> int:
    members = _members(text, i)
    try:
        key, start = next(members)
        while True:
            key, start = members.send(on_member(key, start))
    except StopIteration as stop:
        return stop.value


def read(text: str, path: str) -> Notebook:
    """The notebook in ``text``; NotebookError if it is not a version 4 notebook."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"{path}: cannot read notebook: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        version = data.get("nbformat") if isinstance(data, dict) else None
        if isinstance(version, int) and version < 4:
            raise NotebookError(f"{path}: notebook format {version} is not supported; upgrade it to format 4 "
                                f"(jupyter nbconvert --to notebook --nbformat 4)")
        raise NotebookError(f"{path}: cannot read notebook: no list of cells")
    spans: list[dict] = []

    def top(key: str, start: int) -> int:
        if key != "cells":
            return _value(text, start)[1]
        i = _ws(text, _expect(text, start, "["))
        spans.clear()
        if text[i:i + 1] == "]":
            return i + 1
        while True:
            found: dict = {}

            def member(key: str, start: int, found=found) -> int:
                obj, end = _value(text, start)
                found[key] = (start, end, obj)
                return end

            i = _ws(text, _walk_object(text, i, member))
            spans.append(found)
            if text[i:i + 1] == ",":
                i = _ws(text, i + 1)
                continue
            return _expect(text, i, "]")

    try:
        _walk_object(text, 0, top)
    except (ValueError, IndexError, StopIteration, RecursionError) as exc:
        raise NotebookError(f"{path}: cannot read notebook: {exc}") from exc
    if len(spans) != len(data["cells"]):
        raise NotebookError(f"{path}: cannot read notebook: its cells could not be located")
    cells = []
    for number, found in enumerate(spans, 1):
        kind = found.get("cell_type", (0, 0, None))[2]
        if "source" not in found:
            if kind == "code":
                raise NotebookError(f"{path}: cell {number} has no source")
            continue
        start, end, source = found["source"]
        if isinstance(source, str):
            cells.append(Cell(number, str(kind), source, "str", (start, end)))
        elif isinstance(source, list) and all(isinstance(s, str) for s in source):
            cells.append(Cell(number, str(kind), "".join(source), "list", (start, end), _items(text, start)))
        else:
            raise NotebookError(f"{path}: cell {number}: its source is neither a string nor a list of strings")
    newline = "\r\n" if "\r\n" in text else "\n"
    indented = re.search(r"\n([ \t]+)\S", text)
    return Notebook(text, cells, newline, indented.group(1) if indented else "")


def _items(text: str, start: int) -> list[tuple[int, int]]:
    """The spans of the strings of the list starting at ``text[start]``."""
    items = []
    i = _ws(text, start + 1)
    if text[i] == "]":
        return items
    while True:
        _, end = _value(text, i)
        items.append((i, end))
        i = _ws(text, end)
        if text[i] == ",":
            i = _ws(text, i + 1)
            continue
        return items


def _ensure_ascii(text: str) -> bool:
    """Did the writer escape non-ASCII characters? (nbformat does not: the default is False.)"""
    if not text.isascii():
        return False
    return bool(re.search(r"\\u(?:00[89a-fA-F]|0[1-9a-fA-F]|[1-9a-fA-F])[0-9a-fA-F]{2}", text))


def split_lines(text: str) -> list[str]:
    """Lines with their ends, as nbformat splits a source into a list."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _source_json(notebook: Notebook, cell: Cell, new: str) -> str:
    """``new`` as the JSON value of ``cell``'s source, laid out as the file lays out that value."""
    ascii_only = _ensure_ascii(notebook.text)
    if cell.form == "str":
        return json.dumps(new, ensure_ascii=ascii_only)
    text = notebook.text
    start, end = cell.span
    lines = [json.dumps(line, ensure_ascii=ascii_only) for line in split_lines(new)]
    if len(cell.items) == 1 and "\n" in cell.text.rstrip("\n") and new:
        lines = [json.dumps(new, ensure_ascii=ascii_only)]  # one string of many lines, as sphinx-gallery writes
    if cell.items:  # the layout of the list as it is
        first, last = cell.items[0], cell.items[-1]
        opening = text[start + 1:first[0]]
        closing = text[last[1]:end - 1]
        separator = text[first[1]:cell.items[1][0]] if len(cell.items) > 1 else "," + (opening or " ")
    else:  # an empty list: the layout nbformat would give it
        line_start = text.rfind("\n", 0, start) + 1
        indent = re.match(r"[ \t]*", text[line_start:]).group(0)
        if not notebook.unit:
            opening, closing, separator = "", "", ", "
        else:
            opening = notebook.newline + indent + notebook.unit
            closing = notebook.newline + indent
            separator = "," + opening
    if not lines:
        return "[]"
    return "[" + opening + separator.join(lines) + closing + "]"


def write(notebook: Notebook, sources: dict[int, str]) -> str:
    """The notebook's text with the sources of the cells numbered in ``sources`` replaced."""
    out, last = [], 0
    for cell in notebook.cells:
        if cell.number not in sources:
            continue
        start, end = cell.span
        out += [notebook.text[last:start], _source_json(notebook, cell, sources[cell.number])]
        last = end
    out.append(notebook.text[last:])
    return "".join(out)


# --------------------------------------------------------------------------
# IPython syntax


@dataclass
class Masked:
    """One code cell made Python: ``text`` to analyse (None: left out of the program), the
    original lines of the placeholders, and why a cell is left out."""

    text: Optional[str]
    originals: dict[str, str] = field(default_factory=dict)  # placeholder tag -> original line
    reason: str = ""  # "", "language", "magic", "syntax"
    line: int = 0
    column: int = 0
    detail: str = ""
    hidden_training: int = 0  # a masked line magic that runs code mentioning training: its line
    cell_magic: bool = False  # the first line is a (masked) %%time-style cell magic


_HELP = re.compile(r"^\s*(?:\?\??\s*[\w.]+|[\w.]+(?:\(\))?\s*\?\??)\s*$")
_ASSIGNED = re.compile(r"^\s*[\w.,\s()\[\]]+=\s*[!%]")


def _ipython_line(line: str) -> bool:
    """A line IPython transforms: a magic, a shell command, a help request, a shell assignment."""
    stripped = line.lstrip()
    return stripped.startswith(("%", "!", "?")) or bool(_HELP.match(line)) or bool(_ASSIGNED.match(line))


def _compiles(text: str) -> Optional[SyntaxError]:
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        return exc
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, nesting too deep
        error = SyntaxError(str(exc))
        error.lineno, error.offset = 1, 1
        return error
    return None


def mask(text: str, tag: str) -> Masked:
    """``text`` (a code cell) with its IPython lines replaced by placeholder lines tagged
    ``tag`` + a number."""
    lines = split_lines(text)
    placeholders: dict[int, str] = {}
    originals: dict[str, str] = {}
    hidden = 0
    cell_magic = False

    def put(index: int, block: bool) -> None:
        line = lines[index]
        body = line.rstrip("\r\n")
        indent = body[:len(body) - len(body.lstrip())]
        name = f"{tag}m{len(originals)}."
        originals[name] = body
        statement = "pass  " if block and indent else ""
        placeholders[index] = f"{indent}{statement}# {name}{line[len(body):]}"

    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].startswith("%%"):
        words = lines[first][2:].split()
        magic = words[0] if words else ""
        if magic not in PYTHON_BODY_MAGICS:
            return Masked(None, reason="language" if magic in OTHER_LANGUAGE_MAGICS else "magic",
                          line=first + 1, column=1, detail=f"%%{magic}")
        put(first, False)
        cell_magic = True
    for _ in range(len(lines) + 1):
        current = "".join(placeholders.get(i, line) for i, line in enumerate(lines))
        error = _compiles(current)
        if error is None:
            return Masked(current, originals, hidden_training=hidden, cell_magic=cell_magic)
        index = (error.lineno or 0) - 1
        if not (0 <= index < len(lines)) or index in placeholders or not _ipython_line(lines[index]):
            return Masked(None, reason="syntax", line=error.lineno or 1, column=error.offset or 1,
                          detail=error.msg or "invalid syntax")
        put(index, True)
        stripped = lines[index].lstrip()
        magic = re.match(r"%(\w+)", stripped)
        if magic and magic.group(1) in PYTHON_ARGUMENT_MAGICS and precheck.mentions_training(stripped):
            hidden = hidden or index + 1
        while lines[index].rstrip("\r\n").endswith("\\") and index + 1 < len(lines):
            index += 1  # a command continued on the next line
            put(index, False)
    return Masked(None, reason="syntax", line=1, column=1, detail="invalid syntax")


def unmask(text: str, originals: dict[str, str]) -> Optional[str]:
    """The placeholders of ``text`` back to their original lines (at the indentation their line has
    now); None if one is missing, doubled or changed."""
    if not originals:
        return text
    lines = split_lines(text)
    for name, original in originals.items():
        where = [i for i, line in enumerate(lines) if name in line]
        if len(where) != 1:
            return None
        line = lines[where[0]]
        body = line.rstrip("\r\n")
        stripped = body.lstrip()
        if stripped not in (f"# {name}", f"pass  # {name}"):
            return None
        indent = body[:len(body) - len(stripped)]
        old_indent = original[:len(original) - len(original.lstrip())]
        lines[where[0]] = indent + original[len(old_indent):] + line[len(body):]
    return "".join(lines)


# --------------------------------------------------------------------------
# the conversion


@dataclass
class _Part:
    cell: Cell
    masked: Masked
    first_line: int = 0  # of the cell's text in the program


def _locate(parts: list[_Part], line: int) -> tuple[Optional[int], int]:
    """A line of the program as (cell number, line in the cell)."""
    for part in reversed(parts):
        if part.first_line and line >= part.first_line:
            return part.cell.number, line - part.first_line + 1
    return None, line


def _finding(path: str, cell: Cell, line: int, column: int, message: str, suggestion: str) -> Finding:
    return Finding(path, line, column, CODE, message, suggestion, cell=cell.number)


def convert(text: str, path: str, options: Options, convert_python: Callable[[str, str, Options], Result]) -> Result:
    """The conversion of a notebook's text (see the module's docstring); never raises on user input."""
    try:
        return _convert(text, path, options, convert_python)
    except Exception as exc:  # a bug of ours must never cost the user a file
        from accelify.core.result import brief

        return Result(path, text, text, error=f"{path}: internal error, notebook left unchanged: {brief(exc)}")


def _convert(text: str, path: str, options: Options, convert_python: Callable[[str, str, Options], Result]) -> Result:
    try:
        notebook = read(text, path)
    except NotebookError as exc:
        return Result(path, text, text, error=str(exc))
    tag = unused_tag(text)
    parts: list[_Part] = []
    left_out: list[Finding] = []
    refuse = False
    for cell in notebook.cells:
        if cell.kind != "code":
            continue
        masked = mask(cell.text, f"{tag}{cell.number}")
        training = precheck.mentions_training(cell.text)
        if masked.text is None:
            what = {"language": f"runs another language ({masked.detail})",
                    "magic": f"starts with a cell magic accelify does not know ({masked.detail})",
                    "syntax": f"does not parse: {masked.detail}"}[masked.reason]
            if masked.reason == "language" and not training:
                continue  # a shell cell, a file written: nothing the kernel trains with
            if masked.reason == "language":
                left_out.append(_finding(
                    path, cell, masked.line, masked.column,
                    f"the cell {what} and mentions training: left as it is, not converted.",
                    "convert the code it runs on its own (`accelify convert` on the file it writes)."))
                continue
            if training:
                refuse = True
                left_out.append(_finding(
                    path, cell, masked.line, masked.column,
                    f"the cell {what}, and it mentions training: notebook left unchanged (the rest converted "
                    f"without it could train differently).",
                    "make the cell plain Python (or IPython syntax accelify masks: %magic, !shell, obj?)."))
            else:
                left_out.append(_finding(
                    path, cell, masked.line, masked.column,
                    f"the cell {what}: left as it is; the other cells are converted.",
                    "make the cell plain Python if it belongs to the training code."))
            continue
        if masked.hidden_training:
            refuse = True
            left_out.append(_finding(
                path, cell, masked.hidden_training, 1,
                "a line magic runs code that mentions training, which accelify cannot see: notebook left unchanged.",
                "write the code as plain Python (`%%time` as the cell's first line keeps the timing)."))
            continue
        parts.append(_Part(cell, masked))
    if options.findings is not None and CODE not in options.findings:  # --select/--ignore
        left_out = []
    if refuse or not parts:
        return Result(path, text, text, findings=_sorted(left_out))

    program: list[str] = []
    line = 1
    markers = []
    for part in parts:
        marker = f"# {tag}cell {part.cell.number}\n"
        markers.append(marker)
        program.append(marker)
        line += 1
        part.first_line = line
        body = part.masked.text or ""
        if body and not body.endswith("\n"):
            body += "\n"
        program.append(body)
        line += body.count("\n")
    source = "".join(program)
    result = convert_python(source, path, options)

    findings = [_place(f, parts) for f in result.findings] + left_out
    changes = [_place_change(c, parts) for c in result.changes]
    error = _place_error(result.error, parts, path) if result.error else None
    if error or result.output == source:
        notes = ["notebook launcher not added: nothing to convert"] if options.notebook_launcher and not error else []
        return Result(path, text, text, findings=_sorted(findings), error=error, notes=notes)

    chunks = _split(result.output, markers)
    if chunks is None:
        return _internal(path, text, findings, "the conversion moved code across cells")
    notes: list[str] = []
    if options.notebook_launcher is not None:
        chunks, note = _launch(chunks, parts, options.notebook_launcher)
        notes.append(note)
    # every placeholder once (--notebook-launcher moves code, and its placeholders, across cells)
    originals = {name: line for part in parts for name, line in part.masked.originals.items()}
    joined = "".join(chunks)
    if any(joined.count(name) != 1 for name in originals):
        return _internal(path, text, findings, "the conversion changed a masked IPython line")
    sources: dict[int, str] = {}
    diffs: list[tuple[int, str, str]] = []
    for part, chunk in zip(parts, chunks):
        body = part.masked.text or ""
        padded = body + ("\n" if body and not body.endswith("\n") else "")
        if chunk == padded:
            continue
        new = unmask(chunk, {name: line for name, line in originals.items() if name in chunk})
        if new is None:
            return _internal(path, text, findings, f"cell {part.cell.number}: the conversion changed a masked "
                                                   f"IPython line")
        new = _tidy(new, part.cell.text)
        if new == part.cell.text:
            continue
        if part.masked.cell_magic and new.lstrip("\n").split("\n", 1)[0] != part.cell.text.lstrip("\n").split("\n", 1)[0]:
            return _internal(path, text, findings, f"cell {part.cell.number}: its cell magic would no longer be its "
                                                   f"first line")
        sources[part.cell.number] = new
        diffs.append((part.cell.number, part.cell.text, new))
    output = write(notebook, sources)
    return Result(path, text, output, changes=sorted(changes, key=_order), findings=_sorted(findings), cells=diffs,
                  notes=notes)


def _launch(chunks: list[str], parts: list[_Part], processes: int) -> tuple[list[str], str]:
    """``--notebook-launcher``: the chunks with the training code wrapped (unchanged if that cannot be done),
    and the note saying what was done."""
    from accelify.notebooks.launcher import wrap

    magic_line = {}
    for i, (part, chunk) in enumerate(zip(parts, chunks)):
        if part.masked.cell_magic:
            line = chunk.split("\n", 1)[0] + "\n"
            if not any(name in line for name in part.masked.originals):
                return chunks, f"notebook launcher not added: cell {part.cell.number} lost its first line"
            magic_line[i] = line
    wrapped, note = wrap(chunks, [p.cell.number for p in parts], magic_line, processes)
    return (wrapped if wrapped is not None else chunks), note


def _split(output: str, markers: list[str]) -> Optional[list[str]]:
    """The program's output cut at the markers (each once, in order, at the start of a line); text
    before the first marker goes to the first cell."""
    chunks = []
    position = 0
    head = ""
    for index, marker in enumerate(markers):
        found = output.find(marker, position)
        if found < 0 or (found > 0 and output[found - 1] != "\n") or output.count(marker) != 1:
            return None
        if index == 0:
            head = output[:found]
        else:
            chunks.append(output[position:found])
        position = found + len(marker)
    chunks.append(output[position:])
    if head.strip():
        chunks[0] = head + chunks[0]
    return chunks


def _tidy(new: str, old: str) -> str:
    """A rewritten cell's text with the blank lines at its ends as the cell had them (the program
    separates cells with blank lines, a cell does not need them)."""
    old_core = old.strip("\n")
    leading = old[:len(old) - len(old.lstrip("\n"))]
    trailing = old[len(old.rstrip("\n")):] if old_core else ""
    core = new.strip("\n")
    if not core:
        return ""
    return leading + core + trailing


def _order(item) -> tuple:
    return (item.cell or 0, item.line, getattr(item, "column", 0), item.code)


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=_order)


def _place(finding: Finding, parts: list[_Part]) -> Finding:
    cell, line = _locate(parts, finding.line)
    return replace(finding, line=line, cell=cell)


def _place_change(change, parts: list[_Part]):
    cell, line = _locate(parts, change.line)
    return replace(change, line=line, cell=cell)


_POSITION = re.compile(r"(\d+)(?::(\d+))?: ")


def _place_error(error: str, parts: list[_Part], path: str) -> str:
    """``path:LINE:COL: message`` of the program as ``path:cell N:LINE:COL: message``."""
    if not error.startswith(path + ":"):
        return error
    rest = error[len(path) + 1:]
    found = _POSITION.match(rest)
    if found is None:
        return error
    cell, line = _locate(parts, int(found.group(1)))
    if cell is None:
        return error
    column = f":{found.group(2)}" if found.group(2) else ""
    return f"{path}:cell {cell}:{line}{column}: {rest[found.end():]}"


def _internal(path: str, text: str, findings: list[Finding], why: str) -> Result:
    return Result(path, text, text, findings=_sorted(findings),
                  error=f"{path}: internal error: {why}; notebook left unchanged")
