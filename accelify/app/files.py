"""Reading and writing Python sources byte-faithfully: encoding, BOM and newlines are kept."""

from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

# Directories nobody wants converted, as black skips them by default.
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".nox", ".tox", ".venv", "venv",
     "__pycache__", ".ipynb_checkpoints", "_build", "buck-out", "build", "dist", "node_modules", "site-packages"}
)


class SourceError(Exception):
    """A file that cannot be read or decoded; the message names the file."""


@dataclass(frozen=True)
class Source:
    path: str
    text: str
    encoding: str


def decode(raw: bytes, path: str) -> Source:
    """Decode with the file's own PEP 263 encoding; newlines are left exactly as they are."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot decode: {exc}") from exc
    return Source(path, text, encoding)


def read_source(path: str) -> Source:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return decode(raw, path)


#: The mode bits that let someone write a file.
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def write_atomic(path: str, text: str, encoding: str) -> None:
    """Replace ``path`` with ``text`` in one step: a crash never leaves half a file.

    A symbolic link is written through: its target gets the text, the link stays a link.
    A file that is read-only (no write bit in its mode, whoever runs this: root too, whom the
    mode does not stop) or that this process may not write is not replaced (the rename would
    replace it all the same): PermissionError, and the file is left as it is.
    """
    target = Path(os.path.realpath(path))
    data = text.encode(encoding)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    if mode is not None and not mode & WRITE_BITS:
        raise PermissionError(errno.EACCES, f"permission denied: the file is read-only (mode {mode:04o}, no write "
                              f"permission bit; accelify does not write such a file, even as root); left unchanged",
                              path)
    if mode is not None and not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, f"permission denied: this user may not write the file (mode {mode:04o}); "
                              f"left unchanged", path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".accelify", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is None:  # a new file (`-o`): the mode any new file gets here, not mkstemp's 0600
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def iter_python_files(paths: Iterable[str]) -> Iterator[str]:
    """Files as given; directories expanded to their ``*.py`` and ``*.ipynb`` files, sorted, skipping
    tool folders (``.ipynb_checkpoints`` too) and links to files outside the directory.

    A file reached twice (given twice, or through symbolic links) comes once, under the first
    of its names; standard input ('-') is never merged.
    """
    seen: set[str] = set()
    for path in _expand(paths):
        if path != "-":
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
        yield path


def _expand(paths: Iterable[str]) -> Iterator[str]:
    for given in paths:
        if given == "-" or not os.path.isdir(given):
            yield given
            continue
        top = os.path.realpath(given)
        for root, dirs, files in os.walk(given):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                path = os.path.join(root, name)
                if name.endswith((".py", ".ipynb")) and not _leaves(path, top):
                    yield path


def _leaves(path: str, top: str) -> bool:
    """``path`` is a symbolic link to a file outside the directory ``top`` (as black, a directory
    run leaves such files alone: they belong to another tree; named on the command line, they
    are converted)."""
    if not os.path.islink(path):
        return False
    real = os.path.realpath(path)
    return os.path.commonpath([real, top]) != top
