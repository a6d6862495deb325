"""Statements joined on one line (``loss.backward(); optimizer.step()``, ``if rank == 0: save(...)``).

The codemods and the analysis read one statement per line: a removal, a replacement or a guard
of one statement of ``a; b; c`` would take the others with it, or not happen. So a file with
such lines is converted as the same program with each statement on its own line
(:func:`split`), and afterwards every line the conversion left alone is put back as the author
wrote it (:func:`rejoin`): only the lines it changed come out split. Positions of findings and
changes are put back on the original lines (:class:`Positions`).
"""

from __future__ import annotations

import difflib
from typing import Optional, Union

import libcst as cst


def has_joined(module: cst.Module) -> bool:
    """Some line holds several statements (``a; b``), or a compound statement's body sits on its
    header's line (``if x: model.cuda()``; not ``if done: break``). Statements only are walked (their blocks,
    ``else``, handlers, ``finally``, cases), not the expressions in them."""
    todo: list[cst.CSTNode] = list(module.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            if _joined(node):
                return True
            continue
        for name in ("body", "orelse", "handlers", "finalbody", "cases"):
            part = getattr(node, name, None)
            if isinstance(part, cst.CSTNode):
                todo.append(part)
            elif isinstance(part, (list, tuple)):
                todo.extend(part)
    return False


#: Statements on a header's line no conversion edits (``if done: break``, ``else: return None``).
_INERT = (cst.Pass, cst.Continue, cst.Break)


def _joined(node: Union[cst.SimpleStatementLine, cst.SimpleStatementSuite]) -> bool:
    """Several statements on the line, or a body on its header's line a conversion may edit."""
    if len(node.body) > 1:
        return True
    if isinstance(node, cst.SimpleStatementLine):
        return False
    small = node.body[0]
    if isinstance(small, _INERT):
        return False
    return not (isinstance(small, cst.Return) and (small.value is None or isinstance(small.value, cst.Name)))


class _Splitter(cst.CSTTransformer):
    """Every statement of a joined line on a line of its own, at the line's indentation; a body on its
    header's line becomes an indented block. The comment after the line stays after its last statement."""

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.FlattenSentinel[cst.SimpleStatementLine]]:
        if len(updated_node.body) < 2:
            return updated_node
        return cst.FlattenSentinel(_lines(updated_node.body, updated_node.trailing_whitespace, updated_node.leading_lines))

    def leave_SimpleStatementSuite(
        self, original_node: cst.SimpleStatementSuite, updated_node: cst.SimpleStatementSuite
    ) -> Union[cst.SimpleStatementSuite, cst.IndentedBlock]:
        if not _joined(updated_node):
            return updated_node
        return cst.IndentedBlock(body=_lines(updated_node.body, updated_node.trailing_whitespace, ()))


def _lines(body, trailing: cst.TrailingWhitespace, leading) -> list[cst.SimpleStatementLine]:
    lines = []
    for k, small in enumerate(body):
        last = k == len(body) - 1
        small = small.with_changes(semicolon=small.semicolon if last else cst.MaybeSentinel.DEFAULT)
        lines.append(cst.SimpleStatementLine(
            body=[small],
            leading_lines=leading if k == 0 else (),
            trailing_whitespace=trailing if last else cst.TrailingWhitespace(),
        ))
    return lines


def split(module: cst.Module) -> str:
    """The module's text with one statement per line (see :class:`_Splitter`)."""
    return module.visit(_Splitter()).code


def _groups(source: list[str], derived: list[str]) -> list[tuple[int, int, int, int]]:
    """(i1, i2, j1, j2): the lines ``source[i1:i2]`` became ``derived[j1:j2]`` (the joined lines), in order."""
    matcher = difflib.SequenceMatcher(None, source, derived, autojunk=False)
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def rejoin(source: str, derived: str, output: str) -> str:
    """``output`` (the conversion of ``derived``, the split ``source``) with every group of split lines that
    came out untouched, and in a row, put back as ``source`` had it; of a line of statements some of which were
    changed or removed, the ones left untouched and in a row stay on one line."""
    original = source.splitlines(keepends=True)
    middle = derived.splitlines(keepends=True)
    final = output.splitlines(keepends=True)
    kept: dict[int, int] = {}  # line of derived -> the same line, unchanged, in output
    for block in difflib.SequenceMatcher(None, middle, final, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            kept[block.a + k] = block.b + k
    swaps: dict[int, tuple[int, list[str]]] = {}  # first output line -> (how many lines, what replaces them)
    for i1, i2, j1, j2 in _groups(original, middle):
        at = [kept.get(j) for j in range(j1, j2)]
        if j2 > j1 and None not in at and at == list(range(at[0], at[0] + len(at))):  # type: ignore[operator]
            swaps[at[0]] = (len(at), original[i1:i2])  # type: ignore[index]
            continue
        # `x = x.to(device); n = n; k = x.sum()` whose first statement went: what is left stays on one line
        left = [a for a in at if a is not None]
        indents = {_indent(middle[j]) for j in range(j1, j2)}
        if i2 - i1 == 1 and len(left) > 1 and len(indents) == 1 and left == list(range(left[0], left[0] + len(left))):
            lines = [final[a].rstrip("\r\n") for a in left]
            newline = final[left[-1]][len(lines[-1]):]
            swaps[left[0]] = (len(left), [lines[0] + "".join("; " + line.strip() for line in lines[1:]) + newline])
    out: list[str] = []
    line = 0
    while line < len(final):
        if line in swaps:
            count, text = swaps[line]
            out.extend(text)
            line += count
        else:
            out.append(final[line])
            line += 1
    return "".join(out)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


class Positions:
    """Line and column of the split text -> line and column of the source as written."""

    def __init__(self, source: str, derived: str) -> None:
        self._original = source.splitlines()
        self._derived = derived.splitlines()
        self._line: dict[int, int] = {}  # 1-based derived line -> 1-based source line
        matcher = difflib.SequenceMatcher(None, self._original, self._derived, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    self._line[j1 + k + 1] = i1 + k + 1
                continue
            i = i1
            for j in range(j1, j2):
                text = self._derived[j].strip().rstrip(";").strip()
                for candidate in range(i, max(i2, i + 1)):
                    if candidate < len(self._original) and text and text in self._original[candidate]:
                        i = candidate
                        break
                self._line[j + 1] = min(i, len(self._original) - 1) + 1 if self._original else 1

    def line(self, line: int) -> int:
        return self._line.get(line, line)

    def column(self, line: int, column: int) -> int:
        """A column of the split text's ``line`` (1-based, as findings count) on the source's line."""
        if not 0 < line <= len(self._derived):
            return column
        split_line = self._derived[line - 1]
        indent = len(split_line) - len(split_line.lstrip())
        text = split_line.strip().rstrip(";").strip()
        original = self._original[self.line(line) - 1] if 0 < self.line(line) <= len(self._original) else ""
        at: Optional[int] = original.find(text) if text else -1
        if at is None or at < 0 or column - 1 < indent:
            return column
        return at + (column - 1 - indent) + 1
