"""ACC012: ``accelerate.utils.set_seed`` where it changes nothing in one process."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan
from accelify.queries.names import qualified_names
from accelify.queries.trees import Item, remove_imports_of
from accelify.queries.walk import findall

from .base import AccelifyCodemod, add_target_import

#: ``set_seed`` as accelify imports it (accelerate's, or accelify.runtime's for ``--target runtime``).
_SET_SEED = frozenset({"accelerate.utils.set_seed", "accelify.runtime.set_seed"})
_SEEDS = frozenset(
    {"torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "random.seed", "numpy.random.seed"}
)
# Modules known not to draw from Python's or NumPy's global generators: with only these
# imported, also seeding `random` and `numpy` (as set_seed does) changes nothing.
_NO_GLOBAL_RNG = frozenset(  # (apex: removed by ACC033, or the file is not converted)
    {"__future__", "accelerate", "accelify", "apex", "argparse", "collections", "copy", "dataclasses", "functools", "itertools",
     "json", "logging", "math", "os", "pathlib", "sys", "time", "torch", "tqdm", "typing", "warnings"}
)


class Seeding(AccelifyCodemod):
    """``torch.manual_seed(s)`` (with ``random.seed(s)``/``np.random.seed(s)`` beside it) -> ``set_seed(s)``.

    ``set_seed`` seeds Python, NumPy, torch and every accelerator backend at once.
    It is used only where the switch cannot change a single-process run: the
    script seeds ``random`` and ``numpy`` with the same value next to it, or it
    imports nothing that could draw from their global generators.

    Before::

        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(args.seed)

    After::

        import torch
        from accelerate.utils import set_seed

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        set_seed(args.seed)
    """

    CODE = "ACC012"
    NAME = "seeding"
    DESCRIPTION = "torch.manual_seed(s) (+ random/numpy seeds beside it) -> accelerate.utils.set_seed(s), when equivalent."

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return "manual_seed(" in code

    def visit_Module(self, node: cst.Module) -> None:
        self._quiet_imports = all(
            (module or "").split(".")[0] in _NO_GLOBAL_RNG for module in _imported_modules(node)
        )
        # The script's own `set_seed` (a helper, another library's) would shadow the import.
        self._name_taken = any(
            not qualified_names(self, name) & _SET_SEED for name in findall(node, m.Name("set_seed"))
        )

    def _seed(self, stmt: cst.BaseStatement) -> Optional[tuple[str, str]]:
        """(which seed function, the seed's code) for a seeding statement."""
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call(args=[m.Arg(keyword=None)]))])):
            return None
        call = stmt.body[0].value  # type: ignore[attr-defined]
        names = qualified_names(self, call.func) & _SEEDS
        if not names:
            return None
        return names.pop(), cst.Module(body=[]).code_for_node(call.args[0].value)

    def _seed_of(self, origin: Optional[cst.BaseStatement]) -> Optional[tuple[str, str]]:
        return self._seed(origin) if origin is not None else None

    def edit_body(self, block, items: list[Item]) -> list[Item]:
        if self._name_taken or not any(self._seed(stmt) is not None for stmt in block.body):
            return items
        out: list[Item] = []
        i = 0
        while i < len(items):
            seed = self._seed_of(items[i][1])
            if seed is None:
                out.append(items[i])
                i += 1
                continue
            j = i
            group: dict[str, str] = {}
            while j < len(items) and (s := self._seed_of(items[j][1])) is not None and s[1] == seed[1]:
                group[s[0]] = s[1]
                j += 1
            others = {"random.seed", "numpy.random.seed"} <= set(group)
            if "torch.manual_seed" in group and (others or self._quiet_imports):
                statement = self.parse_statement(f"set_seed({_seed_code(items[i][0], seed[1])})\n")
                out.append((statement.with_changes(leading_lines=items[i][0].leading_lines), None))
                for k in range(i, j):
                    remove_imports_of(self.context, items[k][1])
                add_target_import(self.context, "set_seed")
                self.change(items[i][1], "seeding -> `set_seed` (Python, NumPy, torch, every device)")
            else:
                out.extend(items[i:j])
            i = j
        return out


def _seed_code(current: cst.BaseStatement, original: str) -> str:
    """The seed as the statement now reads it (another codemod may have rewritten it: a rank the
    seed is offset by becomes ``accelerator.process_index``)."""
    if m.matches(current, m.SimpleStatementLine(body=[m.Expr(m.Call(args=[m.Arg(keyword=None)]))])):
        return cst.Module(body=[]).code_for_node(current.body[0].value.args[0].value)  # type: ignore[attr-defined]
    return original


def _imported_modules(module: cst.Module) -> list[Optional[str]]:
    from libcst.helpers import get_full_name_for_node

    out: list[Optional[str]] = []
    for node in findall(module, m.Import() | m.ImportFrom()):
        if isinstance(node, cst.Import):
            out.extend(get_full_name_for_node(a.name) for a in node.names)
        elif node.relative:
            out.append(None)  # a local module: it may draw from anything
        else:
            out.append(get_full_name_for_node(node.module) if node.module else None)  # type: ignore[arg-type]
    return out
