"""The project's modules a converted script imports print once (ACC008 there too).

A dataset class of ``data_utils/ModelNetDataLoader.py`` whose ``__init__`` prints the size of the data
runs on every process once the script is converted: every line of it N times. The script's
``accelerator`` cannot reach that module, so its prints become ``PartialState().print(...)``
(:func:`accelify.codemods.main_process.module_prints`), the module one more file of the result
(``Result.companions``, beside the modules converted with the script). Only the modules the script
imports itself, at its top, from its own folder; never a module converted with it already.

``PartialState()`` sets up the processes' shared state when nothing has yet. Made before the
Accelerator, that state would not know the Accelerator's ``cpu=True`` (Accelerate refuses to change it
then): when the Accelerator takes ``cpu=``, a module whose names the script uses before creating it is
left as it is.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import libcst as cst

from accelify.analyses.foreign import Foreign
from accelify.codemods.main_process import module_prints
from accelify.core.project import ProjectSources
from accelify.core.result import Options, Result
from accelify.core.unit import read_module
from accelify.queries.names import code_of
from accelify.queries.records import Change, Finding


def with_module_prints(result: Result, module: cst.Module, options: Options,
                       sources: Optional[ProjectSources] = None) -> Result:
    """``result`` (a converted script) with the modules it imports whose prints change, as companions; ``sources``:
    the script's project, when the caller read it already."""
    if not result.changed or result.path.endswith(".ipynb") or (
            options.select is not None and "ACC008" not in options.select):
        return result
    sources = sources or ProjectSources.of(result.path)
    taken = {os.path.realpath(result.path)} | {os.path.realpath(c.path) for c in result.companions}
    early = _used_before_the_accelerator(result.output)
    added = []
    kept: list[str] = []
    for found, display, names in _imported_modules(module, sources, result.path):
        if os.path.realpath(found) in taken:
            continue
        taken.add(os.path.realpath(found))
        text = read_module(found)
        if text is None:
            continue
        if early is not None and (names is None or names & early):
            if _prints_through_the_state(text):
                return _left_for_the_state(result, os.path.relpath(found, os.path.dirname(os.path.abspath(result.path))))
            if _module_prints(sources, found, text, options.target) is not None:
                kept.append(os.path.realpath(found))  # (another script of a run must not change it)
            continue
        done = _module_prints(sources, found, text, options.target)
        if done is None:
            continue
        output, lines = done
        changes = [Change(line, "ACC008", "`print` -> `PartialState().print`: this module's code runs on every "
                          "process, and prints on the main process") for line in lines]
        added.append(Result(display, text, output, changes=changes))  # type: ignore[arg-type]
    if not added and not kept:
        return result
    return Result(result.path, result.source, result.output, changes=result.changes, findings=result.findings,
                  error=result.error, cells=result.cells, notes=result.notes, companions=[*result.companions, *added],
                  kept=kept)


def _prints_through_the_state(text: str) -> bool:
    """Does a module call ``PartialState().print`` (converted with another script, or so written)?"""
    return re.search(r"\bPartialState\(\s*\)\s*\.\s*print\(", text) is not None


def _left_for_the_state(result: Result, module: str) -> Result:
    """The script left as it is: a module it uses before its ``Accelerator(cpu=...)`` prints through the processes'
    shared state, which that print would set up before the Accelerator, without ``cpu=`` (Accelerate then refuses
    ``cpu=True`` on a GPU machine: ``AcceleratorState._check_initialized``)."""
    line = next((i for i, text in enumerate(result.source.splitlines(), 1) if os.path.splitext(
        os.path.basename(module))[0] in text and re.match(r"\s*(from|import)\s", text)), 1)
    return Result(result.path, result.source, result.source, findings=[*result.findings, Finding(
        result.path, line, 1, "ACC141",
        f"`{module}` prints through `PartialState().print` (as accelify makes a module print for another script "
        "that imports it), and this script uses it before creating its `Accelerator(cpu=...)`: such a print sets "
        "the processes' state up "
        "before the Accelerator, and on a GPU machine `Accelerator(cpu=True)` then stops with Accelerate's "
        "ValueError (the state is set up already, on the GPU). File not converted.",
        f"create the Accelerator before the first use of `{module}` in this script, or give this script a module "
        "of its own.")])


def _module_prints(sources: ProjectSources, path: str, text: str, target: str) -> Optional[tuple[str, list[int]]]:
    """:func:`module_prints` of a module, once for every script of the folder that imports it (``sources.memo``)."""
    memo = sources.memo.setdefault("module_prints", {})
    known = memo.get((path, target))
    if known is not None and known[0] == text:
        return known[1]
    done = module_prints(text, target, Foreign.of(sources).wrapper_of(path, text))
    memo[(path, target)] = (text, done)
    return done


def _imported_modules(module: cst.Module, sources: ProjectSources, path: str):
    """(file, path as shown, the names the import binds or None for ``*``) of each module of the script's
    folder its top-level imports name: ``import data_loader``, ``from data_utils.X import Y``, ``from .x import y``."""
    folder = os.path.dirname(path)
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            wanted: list[tuple[str, int, Optional[set[str]]]] = []
            if isinstance(small, cst.Import):
                wanted = [(code_of(a.name), 0, {code_of(a.asname.name) if a.asname else code_of(a.name).split(".")[0]})
                          for a in small.names]
            elif isinstance(small, cst.ImportFrom) and small.module is not None:
                star = isinstance(small.names, cst.ImportStar)
                bound = None if star else {code_of(a.asname.name) if a.asname else code_of(a.name) for a in small.names}  # type: ignore[union-attr]
                wanted = [(code_of(small.module), len(small.relative), bound)]
            for dotted, level, names in wanted:
                found = sources.module_file(dotted, level)
                if found is not None:
                    shown = os.path.relpath(found, sources.root)
                    yield found, (os.path.join(folder, shown) if folder else shown), names


def _used_before_the_accelerator(output: str) -> Optional[set[str]]:
    """When the converted script's Accelerator takes ``cpu=``: the names read before the line that creates it
    (an import is no use); else None."""
    lines = output.splitlines()
    made = next((i for i, line in enumerate(lines) if re.search(r"=\s*Accelerator\(.*\bcpu=", line)), None)
    if made is None:
        return None
    words: set[str] = set()
    for line in lines[:made]:
        if not re.match(r"\s*(import|from)\s", line):
            words |= set(re.findall(r"[A-Za-z_]\w*", line))
    return words

