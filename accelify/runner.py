"""Converting a list of files, in this process or in a pool of worker processes.

Nothing here imports LibCST, typer or rich: a file that cannot train is read,
checked with :mod:`accelify.precheck` and done (LibCST only confirms a syntax error
CPython reports); :mod:`accelify.pipeline`, and with it LibCST, is imported only by
the process that meets a file needing the analysis.

Results come back in the order of the input list whatever the scheduling, and at
most a few per worker are held at a time: the caller prints or writes each one and
lets it go, so memory does not grow with the number of files.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

from accelify import precheck
from accelify.io import SourceError, decode, read_source
from accelify.result import Options, Result

#: Files submitted to the pool ahead of the one being printed, per worker.
LOOK_AHEAD = 16


@dataclass
class Outcome:
    """One file converted: the result, and the encoding to write its output back with."""

    result: Result
    encoding: str = "utf-8"


def convert_text(text: str, path: str, options: Options) -> Result:
    """The conversion of one file's text; LibCST is imported only if the file may train."""
    if not precheck.needs_analysis(text):
        return Result(path, text, text, error=precheck.syntax_error(text, path))
    from accelify.pipeline import convert_source

    return convert_source(text, path, options)


def convert_path(path: str, options: Options) -> Outcome:
    """Read and convert one file ('-': standard input). A worker process runs this."""
    try:
        source = decode(sys.stdin.buffer.read(), "<stdin>") if path == "-" else read_source(path)
    except SourceError as exc:
        return Outcome(Result("<stdin>" if path == "-" else path, "", "", error=str(exc)))
    return Outcome(convert_text(source.text, source.path, options), source.encoding)


def needing_analysis(paths: Iterable[str], enough: int) -> int:
    """How many of ``paths`` need the LibCST analysis, counting up to ``enough`` (stdin not counted)."""
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
        count += precheck.needs_analysis(text)
    return count


def convert_all(paths: Sequence[str], options: Options, jobs: int) -> Iterator[Outcome]:
    """The outcome of each path, in the order of ``paths``.

    A pool of ``jobs`` processes is started only when at least two files need the
    analysis: starting workers costs more than one file's conversion.
    """
    if jobs > 1 and needing_analysis(paths, 2) >= 2:
        return _pooled(paths, options, min(jobs, len(paths)))
    return (convert_path(path, options) for path in paths)


def _make_pool(jobs: int):
    from concurrent.futures import ProcessPoolExecutor

    # Files needing the analysis are coming: import it once here, so that forked workers start
    # with it (each would otherwise spend most of a second importing LibCST on its own).
    import accelify.pipeline  # noqa: F401

    return ProcessPoolExecutor(max_workers=jobs, initializer=_worker_start)


def _worker_start() -> None:
    """Ctrl-C is the parent's to handle: it stops submitting and waits for the files under way."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _failed(path: str, exc: BaseException) -> Outcome:
    """A file whose worker died (out of memory, a crash in the parser): an error, like any other."""
    return Outcome(Result(path, "", "", error=f"{path}: internal error, file left unchanged: {exc!r}"))


class _Ready:
    """A result computed in this process, queued with the pool's futures (standard input)."""

    def __init__(self, outcome: Outcome) -> None:
        self._outcome = outcome

    def result(self) -> Outcome:
        return self._outcome


def _pooled(paths: Sequence[str], options: Options, jobs: int) -> Iterator[Outcome]:
    pool = _make_pool(jobs)
    queued: deque = deque()
    todo = iter(paths)

    def top_up() -> None:
        while len(queued) < jobs * LOOK_AHEAD:
            path: Optional[str] = next(todo, None)
            if path is None:
                return
            if path == "-":  # the parent's standard input
                queued.append((path, _Ready(convert_path(path, options))))
                continue
            try:
                queued.append((path, pool.submit(convert_path, path, options)))
            except Exception as exc:  # the pool is broken: a worker died
                queued.append((path, _Ready(_failed(path, exc))))

    try:
        top_up()
        while queued:
            path, job = queued.popleft()
            top_up()
            try:
                outcome = job.result()
            except Exception as exc:
                outcome = _failed(path, exc)
            del job
            yield outcome
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
