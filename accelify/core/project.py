"""The project around a script: the source of the local modules it imports, read from disk, never
imported and never from site-packages.

``python train.py`` puts the script's folder first on ``sys.path``: ``import utils`` and ``from
utils import get_data`` mean ``<folder>/utils.py`` (or ``<folder>/utils/__init__.py``), and
``from .data import x`` a module beside it. Only files inside the script's folder are read; a
module that is not there (a package, the standard library) is None.

One ``ProjectSources`` per folder (:meth:`ProjectSources.of`), shared by every script of that folder a run
converts: a module is read once, and what the analyses make of it (``memo``: the parsed modules of
accelify.analyses.foreign) is kept for the next script, until a file it read changes (a module written by
``--in-place`` for an earlier script): then the texts are read again and the memo is emptied.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Optional

from accelify.queries.records import Finding

#: larger modules are not read (generated code, vendored libraries)
MAX_BYTES = 1_000_000
#: files looked at for other users of a module converted with a script
MAX_FILES = 5_000
#: folders that hold no code of the project
_NOT_PROJECT = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "build", "dist", "_build"})


#: the shared sources, by the folder of the scripts they serve
_SHARED: dict[str, "ProjectSources"] = {}


class ProjectSources:
    """``module_source("utils")``, ``module_source("data", level=1)``: the text of a local module."""

    def __init__(self, entry: str) -> None:
        path = os.path.abspath(entry)
        self.root = os.path.dirname(path) if os.path.isfile(path) else None
        self._real_root = os.path.realpath(self.root) if self.root is not None else ""
        self._texts: dict[str, tuple[Optional[tuple[int, int]], Optional[str]]] = {}
        self._files: Optional[list[str]] = None
        self._search_texts: dict[str, tuple[Optional[tuple[int, int]], Optional[str]]] = {}
        #: what the analyses derive from the texts (accelify.analyses.foreign), emptied when a text changes
        self.memo: dict[str, object] = {}

    @classmethod
    def of(cls, entry: str) -> "ProjectSources":
        """The sources of the folder of ``entry``, shared with the other scripts of that folder."""
        path = os.path.abspath(entry)
        if not os.path.isfile(path):
            return cls(entry)
        folder = os.path.dirname(path)
        shared = _SHARED.get(folder)
        if shared is None:
            if len(_SHARED) >= 64:  # (a run over many folders keeps the last ones)
                _SHARED.pop(next(iter(_SHARED)))
            shared = _SHARED[folder] = cls(entry)
        shared.verify()
        return shared

    def verify(self) -> None:
        """Forget every text (and the memo) when a file read has changed since."""
        for path, (signature, _) in list(self._texts.items()):
            if _signature(path) != signature:
                self._texts.clear()
                self._files = None
                self.memo.clear()
                return

    def files(self) -> list[str]:
        """The Python files of the script's folder and its subfolders (not hidden ones, nor :data:`_NOT_PROJECT`),
        at most :data:`MAX_FILES`: the modules the project's names can mean."""
        if self._files is None:
            found: list[str] = []
            for folder, dirs, names in os.walk(self.root) if self.root is not None else ():
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_PROJECT)
                found.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
                if len(found) >= MAX_FILES:
                    break
            self._files = found[:MAX_FILES]
        return self._files

    def module_source(self, dotted: str, level: int = 0) -> Optional[str]:
        found = self.module_file(dotted, level)
        return self._read(found) if found is not None else None

    def module_file(self, dotted: str, level: int = 0) -> Optional[str]:
        """The file of a local module (``<folder>/utils.py`` or ``<folder>/utils/__init__.py``) that can
        be read, or None."""
        if self.root is None or not dotted or level > 1:
            return None  # beyond the script's own folder: not read
        parts = dotted.split(".")
        if not all(p.isidentifier() for p in parts):
            return None
        base = os.path.join(self.root, *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if self._read(candidate) is not None:
                return candidate
        return None

    def users_of(self, dotted: str, names: set[str], exclude: set[str]) -> list[str]:
        """The files of the script's folder (its subfolders too; not ``exclude``, real paths) that use one of
        ``names`` of the local module ``dotted``: ``from dotted import name``, or ``import dotted`` and
        ``dotted.name`` (a text search: what could be such a use counts). Paths relative to the folder."""
        if self.root is None:
            return []
        last = dotted.rsplit(".", 1)[-1]
        imports = re.compile(rf"^\s*from\s+\.?{re.escape(dotted)}\s+import\s+([^\n]*(?:\n[^\n]*?\))?)", re.MULTILINE)
        whole = re.compile(rf"^\s*import\s+[^\n]*\b{re.escape(dotted)}\b", re.MULTILINE)
        found = []
        seen = 0
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_PROJECT)
            for name in sorted(files):
                if not name.endswith((".py", ".ipynb")):
                    continue
                seen += 1
                path = os.path.join(folder, name)
                if seen > MAX_FILES or os.path.realpath(path) in exclude:
                    continue
                text = self._searched(path)
                if text is None or last not in text:
                    continue
                uses = any(n in match.group(1) or "*" in match.group(1) for match in imports.finditer(text) for n in names) \
                    or (whole.search(text) is not None and any(f"{last}.{n}" in text for n in names))
                if uses:
                    found.append(os.path.relpath(path, self.root))
        return found

    def _searched(self, path: str) -> Optional[str]:
        """A file's text for :meth:`users_of`'s search (undecodable bytes replaced), read again only when it
        changed: a run that converts many files of a folder searches it once per file, from memory."""
        signature = _signature(path)
        known = self._search_texts.get(path)
        if known is not None and known[0] == signature:
            return known[1]
        text = _text_of(path, signature, "replace")
        self._search_texts[path] = (signature, text)
        return text

    def _read(self, path: str) -> Optional[str]:
        if path not in self._texts:
            real = os.path.realpath(path)
            signature = _signature(real)
            inside = signature is not None and os.path.commonpath([real, self._real_root]) == self._real_root
            self._texts[path] = (signature, _text_of(real, signature, "strict") if inside else None)
        return self._texts[path][1]


def _text_of(path: str, signature: Optional[tuple[int, int]], errors: str) -> Optional[str]:
    """A file's UTF-8 text (``errors``: how undecodable bytes are taken); None for no file, one over
    :data:`MAX_BYTES`, or one that cannot be read."""
    if signature is None or signature[1] > MAX_BYTES:
        return None
    try:
        with open(path, encoding="utf-8", errors=errors) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _signature(path: str) -> Optional[tuple[int, int]]:
    """(modification time, size) of a file; None when it is no file."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size) if stat.S_ISREG(found.st_mode) else None


_FROM_IMPORT = re.compile(r"^from[ \t]+(\.?[\w.]*)[ \t]+import[ \t]+(?:\(([^)]*)\)|([\w \t,]+))", re.MULTILINE)
_IMPORT = re.compile(r"^import[ \t]+([\w., \t]+)$", re.MULTILINE)
_TOP_LEVEL = re.compile(r"^(?:class|def)\s+(\w+)", re.MULTILINE)


def delegated_training(source: str, sources: ProjectSources) -> Optional[tuple[int, str, str]]:
    """A script that trains nothing itself but runs ``if __name__ == "__main__":`` and calls a class or
    function of a module beside it whose code runs a backward pass (betavae: ``from solver import
    Solver`` ... ``net = Solver(args); net.train()``): (the import's line, the name, the module).
    Text only, as the pre-check reads files that do not train."""
    if "__main__" not in source:
        return None
    for match in _IMPORT.finditer(source):  # `import train` ... `train.train(loader, model, optimizer)`
        for part in match.group(1).split(","):
            words = part.split()
            if not words or not all(p.isidentifier() for p in words[0].split(".")):
                continue
            module, local = words[0], words[-1]
            text = sources.module_source(module)
            if text is None or ".backward(" not in text:
                continue
            bodies = _top_level_bodies(text)
            for name in re.findall(rf"\b{re.escape(local)}\.(\w+)\s*\(", source[match.end():]):
                if name in bodies and ".backward(" in bodies[name]:
                    return source.count("\n", 0, match.start()) + 1, name, module
    for match in _FROM_IMPORT.finditer(source):
        module = match.group(1)  # (no LibCST here: the pre-check's side of the runner imports this module)
        dotted = module.lstrip(".")
        text = sources.module_source(dotted, len(module) - len(dotted)) if dotted else None
        if text is None or ".backward(" not in text:
            continue
        bodies = _top_level_bodies(text)
        for imported in (match.group(2) or match.group(3)).split(","):
            name, _, local = (part.strip() for part in imported.strip().partition(" as "))
            local = local or name
            # called (`train(...)`), or handed on to be called (TransUNet's `trainer = {'Synapse': trainer_synapse}`)
            if name in bodies and ".backward(" in bodies[name] and re.search(rf"\b{local}\b", source[match.end():]):
                return source.count("\n", 0, match.start()) + 1, name, module
    return None


def _top_level_bodies(text: str) -> dict[str, str]:
    """``{name: its source}`` for each top-level ``class``/``def`` of a module (until the next one)."""
    found = list(_TOP_LEVEL.finditer(text))
    return {m.group(1): text[m.start(): found[i + 1].start() if i + 1 < len(found) else len(text)]
            for i, m in enumerate(found)}


def training_elsewhere(source: str, path: str) -> list[Finding]:
    """ACC135 for a script that trains nothing itself and runs a module beside it that trains: it says
    why nothing changed (the script was silent)."""
    found = delegated_training(source, ProjectSources.of(path))
    if found is None:
        return []
    line, name, module = found
    return [Finding(
        path, line, 1, "ACC135",
        f"this script trains nothing itself: it runs `{name}` of `{module}`, a module beside it that trains (it runs "
        "`.backward()`), which accelify does not convert together with this script yet. Nothing changed.",
        f"convert that module's training where it is (`accelify convert {module.lstrip('.').replace('.', '/')}.py`), "
        "or move the training loop into this script.",
    )]
