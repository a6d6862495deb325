"""Converting a list of files, in this process or in a pool of worker processes.

Nothing here imports LibCST, typer or rich: a file that cannot train is read,
checked with :mod:`accelify.core.precheck` and done (LibCST only confirms a syntax error
CPython reports); :mod:`accelify.core.pipeline`, and with it LibCST, is imported only by
the process that meets a file needing the analysis.

Results come back in the order of the input list whatever the scheduling, and at
most a few per worker are held at a time: the caller prints or writes each one and
lets it go, so memory does not grow with the number of files.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from accelify.app.files import SourceError, decode, read_source
from accelify.core import precheck
from accelify.core.result import Options, Result, brief

#: Files submitted to the pool ahead of the one being printed, per worker.
LOOK_AHEAD = 16


@dataclass
class Outcome:
    """One file converted: the result, and the encoding to write its output back with."""

    result: Result
    encoding: str = "utf-8"


def convert_text(text: str, path: str, options: Options) -> Result:
    """The conversion of one file's text; LibCST is imported only if the file may train.

    A notebook (a ``.ipynb`` path) has its code cells converted as one program
    (:mod:`accelify.notebooks.convert`)."""
    if path.endswith(".ipynb"):
        return convert_notebook(text, path, options)
    return convert_python(text, path, options)


def convert_notebook(text: str, path: str, options: Options) -> Result:
    from accelify.notebooks import convert as notebook

    return notebook.convert(text, path, options, convert_python)


def convert_python(text: str, path: str, options: Options) -> Result:
    """The conversion of a Python file's text (or of a notebook's code cells as one program)."""
    quick = precheck.without_analysis(text, path)
    if quick is not None:
        return quick
    from accelify.core.pipeline import convert_source

    return convert_source(text, path, options)


def convert_path(path: str, options: Options) -> Outcome:
    """Read and convert one file ('-': standard input). A worker process runs this."""
    try:
        source = decode(sys.stdin.buffer.read(), "<stdin>") if path == "-" else read_source(path)
    except SourceError as exc:
        return Outcome(Result("<stdin>" if path == "-" else path, "", "", error=str(exc)))
    if path == "-":  # a notebook's JSON on standard input is converted as a notebook
        from accelify.notebooks.convert import looks_like_notebook

        if looks_like_notebook(source.text):
            return Outcome(convert_notebook(source.text, source.path, options), source.encoding)
    return Outcome(convert_text(source.text, source.path, options), source.encoding)


def companion_inputs(paths: Sequence[str]) -> set[str]:
    """The real paths of the modules some of ``paths`` would be converted with (the modules they
    train in, :mod:`accelify.core.unit`, and those whose prints they may change): a text test first, then
    CPython's parser, no LibCST."""
    from accelify.core.project import ProjectSources
    from accelify.core.unit import companion_files, printing_modules

    found: set[str] = set()
    folders: dict[str, ProjectSources] = {}  # one per folder: its modules are read once
    for path in paths:
        if path == "-" or not path.endswith(".py"):
            continue
        try:
            text = read_source(path).text
        except SourceError:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        sources = folders.setdefault(folder, ProjectSources.of(path))
        found.update(os.path.realpath(p) for p in companion_files(text, path, sources))
        if precheck.mentions_training(text):  # (a module whose prints its conversion may change)
            found.update(os.path.realpath(p) for p in printing_modules(text, sources))
    return found


def candidates(paths: Iterable[str], enough: int) -> int:
    """How many of ``paths`` the text test alone lets through to the analysis, counting up to
    ``enough`` (stdin not counted): reading is all it costs, no parse."""
    count = 0
    for path in paths:
        if count >= enough:
            break
        if path == "-":
            continue
        try:
            text = read_source(path).text
        except SourceError:
            continue
        count += precheck.mentions_training(text) and not precheck.skipped(text)
    return count


def convert_all(paths: Sequence[str], options: Options, jobs: int) -> Iterator[Outcome]:
    """The outcome of each path, in the order of ``paths``.

    A pool of ``jobs`` processes is started only when at least two files may need the
    analysis: for files that cannot train, starting workers costs more than it saves.
    """
    if jobs > 1 and candidates(paths, 2) >= 2:
        return _pooled(paths, options, min(jobs, len(paths)))
    return (convert_path(path, options) for path in paths)


def _make_pool(jobs: int):
    from concurrent.futures import ProcessPoolExecutor

    # Workers start from this small process: each imports the analysis (LibCST) only when it
    # meets a file that needs it, in parallel, while the other checks files. (Importing it here
    # first, to share it, would make every worker wait for that import.)
    return ProcessPoolExecutor(max_workers=jobs, initializer=_worker_start)


def _worker_start() -> None:
    """Ctrl-C is the parent's to handle: it stops submitting and waits for the files under way."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _failed(path: str, exc: BaseException) -> Outcome:
    """A file whose worker died (out of memory, a crash in the parser): an error, like any other."""
    return Outcome(Result(path, "", "", error=f"{path}: internal error, file left unchanged: {brief(exc)}"))


class _Ready:
    """A result computed in this process, queued with the pool's futures (standard input)."""

    def __init__(self, outcome: Outcome) -> None:
        self._outcome = outcome

    def result(self) -> Outcome:
        return self._outcome


def _cost(path: str) -> int:
    """A guess at the work a file costs, to hand out the costly ones first: its size, times 20
    if its text passes the pre-check's text test (read as latin-1: a guess needs no decoding)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("latin-1")
    except OSError:
        return 0
    return len(text) * (20 if precheck.mentions_training(text) else 1)


def _pooled(paths: Sequence[str], options: Options, jobs: int) -> Iterator[Outcome]:
    """Files go to the pool a window at a time, the costliest of a window first (so a large
    file does not start last and keep one worker busy while the others wait); outcomes come
    back in the order of ``paths``, and at most two windows of them are held."""
    pool = _make_pool(jobs)
    queued: deque = deque()
    window = jobs * LOOK_AHEAD
    todo = iter(paths)

    def submit_window() -> None:
        batch = [path for _, path in zip(range(window), todo)]
        jobs_of: dict[int, object] = {}
        for i in sorted(range(len(batch)), key=lambda i: -_cost(batch[i]) if batch[i] != "-" else 0):
            path = batch[i]
            if path == "-":  # the parent's standard input
                jobs_of[i] = _Ready(convert_path(path, options))
                continue
            try:
                jobs_of[i] = pool.submit(convert_path, path, options)
            except Exception as exc:  # the pool is broken: a worker died
                jobs_of[i] = _Ready(_failed(path, exc))
        queued.extend((path, jobs_of[i]) for i, path in enumerate(batch))

    try:
        submit_window()
        while queued:
            if len(queued) <= window:
                submit_window()
            path, job = queued.popleft()
            try:
                outcome = job.result()  # type: ignore[attr-defined]
            except Exception as exc:
                outcome = _failed(path, exc)
            del job
            yield outcome
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
