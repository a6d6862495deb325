"""``--notebook-launcher N``: the converted notebook's training code in ``def training_function():``,
started by ``notebook_launcher(training_function, num_processes=N)``, as Accelerate's notebook guide
does for multi-GPU and TPU notebooks (the Accelerator must be created inside the function the
launcher forks; nothing before the launch may create it).

Works on the converted program's cells (placeholders of IPython lines still in place), with the
standard library's ``ast`` only:

- the training code is the code cells from the first one that uses ``accelerator`` to the last
  one, extended to the later cells that read what those cells bind (they would find nothing in the
  notebook's namespace once the code runs in the launched processes), and back to the cell that
  builds what it reads before binding it again (``train_dataloader, ... =
  accelerator.prepare(train_dataloader, ...)`` in a function reads a local not bound yet: the
  cell that builds the loader goes in too, as the guide's function builds its dataloaders);
- those cells' code becomes the body of ``def training_function():`` in the first of them, with
  ``accelerator = Accelerator(...)`` moved to its top (from the cell that created it); the last
  cell gets the ``notebook_launcher(...)`` call (after its ``%%time``-style first line, if it had
  one), the cells in between are emptied (cells of IPython lines only, ``model?``, stay as they
  are); ``from accelerate import notebook_launcher`` joins the Accelerator's import.

It is not done (the conversion is kept without it, and the note says why) where it cannot be
done that way: no single notebook-level ``accelerator = Accelerator(...)``, a multi-line string in
the code to move (indenting would change it), a cell magic on a cell other than the last one, a
``notebook_launcher`` already there.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Optional

FUNCTION = "training_function"


def _tree(text: str) -> Optional[ast.Module]:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _reads(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _binds(tree: ast.Module) -> set[str]:
    """Names a cell binds in the notebook's namespace (its top-level statements)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
            continue
        for node in ast.walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
    return names


def _multiline_string(text: str) -> bool:
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING and token.start[0] != token.end[0]:
                return True
            if getattr(tokenize, "FSTRING_MIDDLE", None) == token.type and "\n" in token.string:
                return True
    except (tokenize.TokenError, SyntaxError):
        return True
    return False


def _creation(tree: ast.Module) -> list[ast.Assign]:
    return [s for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) and s.targets[0].id == "accelerator"
            and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name)
            and s.value.func.id == "Accelerator"]


def _cut(text: str, first: int, last: int) -> str:
    """``text`` without lines ``first``..``last`` (1-based) and one blank line after them (or
    before them, at the end of the text)."""
    lines = text.splitlines(keepends=True)
    end = last
    if end < len(lines) and not lines[end].strip():
        end += 1
    elif first > 1 and not lines[first - 2].strip():
        first -= 1
    return "".join(lines[:first - 1] + lines[end:])


def wrap(chunks: list[str], numbers: list[int], magic_line: dict[int, str], processes: int
         ) -> tuple[Optional[list[str]], str]:
    """The cells' converted text with the training code wrapped (or None), and a note of what was
    done (or why not). ``numbers``: each chunk's cell number; ``magic_line``: the placeholder line
    of a chunk whose first line was a cell magic."""
    trees = [_tree(chunk) for chunk in chunks]
    if any(tree is None for tree in trees):
        return None, "notebook launcher not added: a converted cell does not parse on its own"
    if any("notebook_launcher" in _reads(tree) for tree in trees):  # type: ignore[arg-type]
        return None, "notebook launcher not added: the notebook calls notebook_launcher already"
    created = [(i, s) for i, tree in enumerate(trees) for s in _creation(tree)]  # type: ignore[arg-type]
    if len(created) != 1:
        return None, ("notebook launcher not added: it needs one `accelerator = Accelerator(...)` at the notebook's "
                      "top level (the training code in a function of its own is launched by calling it)")
    home, creation = created[0]
    using = [i for i, tree in enumerate(trees) if "accelerator" in _reads(tree)]  # type: ignore[arg-type]
    if not using:
        return None, "notebook launcher not added: no cell uses the accelerator"
    first, last = using[0], using[-1]
    statement = "".join(chunks[home].splitlines(keepends=True)[creation.lineno - 1:creation.end_lineno])
    while True:
        bound = set().union(*(_binds(trees[i]) for i in range(first, last + 1)))  # type: ignore[arg-type]
        for i in range(last + 1, len(trees)):  # later cells that read what the training code binds
            if _reads(trees[i]) & bound:  # type: ignore[arg-type]
                last = i
                bound |= _binds(trees[i])  # type: ignore[arg-type]
        span = range(first, last + 1)
        moved = [i for i in span if trees[i].body]  # type: ignore[union-attr]  # (IPython-only cells stay)
        code = _body(chunks, moved, magic_line, statement if home not in span else "")
        before = set().union(set(), *(_binds(trees[i]) for i in range(first)))  # type: ignore[arg-type]
        passed = _read_first(code, before - {"accelerator"})
        # what it reads before binding it again (the loader `prepare` takes): the cell that builds it
        # goes in too, as the guide's function builds its dataloaders
        # (``before`` is what the cells before ``first`` bind: one of them binds it)
        if not passed:
            break
        first = max(i for i in range(first) if _binds(trees[i]) & set(passed))  # type: ignore[arg-type]
    for i in moved:
        if i in magic_line and i != last:
            return None, (f"notebook launcher not added: cell {numbers[i]} starts with a cell magic, which cannot "
                          f"go inside the training function")
        if _multiline_string(chunks[i]):
            return None, (f"notebook launcher not added: cell {numbers[i]} has a string over several lines, which "
                          f"indenting into the training function would change")
    if home not in span:
        chunks = list(chunks)
        chunks[home] = _cut(chunks[home], creation.lineno, creation.end_lineno or creation.lineno)
    else:
        statement = ""  # it moves with its cell
    function = f"def {FUNCTION}():\n" + "".join(
        ("    " + line if line.strip() else line.lstrip(" \t")) for line in code.splitlines(keepends=True))
    call = f"notebook_launcher({FUNCTION}, num_processes={processes})\n"
    out = list(chunks)
    for i in moved:
        out[i] = ""
    if first == last:
        out[first] = (magic_line[last] if last in magic_line else "") + function + "\n\n" + call
    else:
        out[first] = function
        out[last] = (magic_line[last] if last in magic_line else "") + call
    out = _add_import(out)
    if out is None:
        return None, "notebook launcher not added: no `from accelerate import Accelerator` to add its import to"
    if _tree("".join(out)) is None:
        return None, "notebook launcher not added: the wrapped code does not parse"
    emptied = [numbers[i] for i in moved if i not in (first, last)]
    note = (f"training code of cells {_cells([numbers[i] for i in moved])} wrapped in `def {FUNCTION}():` in cell "
            f"{numbers[first]}, started by `notebook_launcher({FUNCTION}, num_processes={processes})` in cell "
            f"{numbers[last]}")
    if emptied:
        note += f"; cell{'s' if len(emptied) > 1 else ''} {_cells(emptied)} emptied"
    if statement:
        note += f"; `accelerator = Accelerator()` moved into it from cell {numbers[home]}"
    return out, note


def _read_first(code: str, before: set[str]) -> list[str]:
    """The names of ``before`` that ``code``, as a function body, binds and reads before it first
    binds them (``loader, model = accelerator.prepare(loader, model)``, ``step += 1``): local to the
    function, they would be read unbound (UnboundLocalError); the code that binds them first must
    go into the function too."""
    tree = ast.parse(code)
    stores: dict[str, tuple[int, int]] = {}
    loads: dict[str, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in before:
            table = loads if isinstance(node.ctx, ast.Load) else stores
            where = (node.lineno, node.col_offset)
            table[node.id] = min(table.get(node.id, where), where)
    needed = {name for name in stores if name in loads and loads[name] < stores[name]}
    for stmt in ast.walk(tree):  # an assignment reads its value before it binds its targets
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or stmt.value is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        first = {n.id for t in targets for n in ast.walk(t)
                 if isinstance(n, ast.Name) and stores.get(n.id) == (n.lineno, n.col_offset)}
        if isinstance(stmt, ast.AugAssign):
            needed |= first
        else:
            needed |= first & {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
    return sorted(needed)


def _body(chunks: list[str], span: list[int], magic_line: dict[int, str], statement: str) -> str:
    """The code of the cells in ``span`` as one function body (not indented yet)."""
    body: list[str] = []
    if statement:
        body.append(statement if statement.endswith("\n") else statement + "\n")
    for i in span:
        text = chunks[i]
        if i in magic_line:
            text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.strip("\n")
        if not text:
            continue
        if body:
            body.append("\n")
        body.append(text + "\n")
    return "".join(body)


def _cells(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)


_IMPORT = re.compile(r"^from accelerate import [^\n]*\bAccelerator\b[^\n]*\n", re.M)


def _add_import(chunks: list[str]) -> Optional[list[str]]:
    for i, chunk in enumerate(chunks):
        found = _IMPORT.search(chunk)
        if found and not chunk[found.end() - 2:found.end() - 1] in ("(", "\\"):
            out = list(chunks)
            out[i] = chunk[:found.end()] + "from accelerate import notebook_launcher\n" + chunk[found.end():]
            return out
    return None
