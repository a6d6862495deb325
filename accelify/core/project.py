"""The project around a script: the source of the local modules it imports, read from disk, never
imported and never from site-packages.

``python train.py`` puts the script's folder first on ``sys.path``: ``import utils`` and ``from
utils import get_data`` mean ``<folder>/utils.py`` (or ``<folder>/utils/__init__.py``), and
``from .data import x`` a module beside it. Only files inside the script's folder are read; a
module that is not there (a package, the standard library) is None. Sources are read once.
"""

from __future__ import annotations

import os
from typing import Optional

#: larger modules are not read (generated code, vendored libraries)
MAX_BYTES = 1_000_000


class ProjectSources:
    """``module_source("utils")``, ``module_source("data", level=1)``: the text of a local module."""

    def __init__(self, entry: str) -> None:
        path = os.path.abspath(entry)
        self.root = os.path.dirname(path) if os.path.isfile(path) else None
        self._texts: dict[str, Optional[str]] = {}

    def module_source(self, dotted: str, level: int = 0) -> Optional[str]:
        if self.root is None or not dotted or level > 1:
            return None  # beyond the script's own folder: not read
        parts = dotted.split(".")
        if not all(p.isidentifier() for p in parts):
            return None
        base = os.path.join(self.root, *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            text = self._read(candidate)
            if text is not None:
                return text
        return None

    def _read(self, path: str) -> Optional[str]:
        if path not in self._texts:
            self._texts[path] = None
            real = os.path.realpath(path)
            if os.path.isfile(real) and os.path.commonpath([real, os.path.realpath(self.root or "")]) == \
                    os.path.realpath(self.root or "") and os.path.getsize(real) <= MAX_BYTES:
                try:
                    with open(real, encoding="utf-8") as f:
                        self._texts[path] = f.read()
                except (OSError, UnicodeDecodeError):
                    pass
        return self._texts[path]
