"""The ``accelify`` command line: ``convert``, ``verify`` and ``rules``.

Exit codes (as black): 0 success, 1 ``--check`` found files that would change,
2 usage error (a path that does not exist too: nothing is converted), 123 a file could
not be read, parsed or written (a read-only file is not written; it is left untouched and
the other files are still processed).
``verify``: 0 equivalent, 1 different, 2 usage error, 3 a run failed or timed out,
123 the script cannot be read or parsed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer

from accelify import __version__
from accelify.app.files import iter_python_files, write_atomic

if TYPE_CHECKING:
    from accelify.app.runner import Outcome
    from accelify.core.result import Result
    from accelify.queries.records import Change, Finding

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 123

#: From this many files on, a progress bar on a terminal's stderr.
PROGRESS_FROM = 10

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Migrate plain PyTorch training scripts to Hugging Face Accelerate.",
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"accelify {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Migrate plain PyTorch training scripts to Hugging Face Accelerate."""


def _usage(message: str) -> None:
    typer.echo(f"Usage error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


@app.command()
def convert(
    paths: List[str] = typer.Argument(..., help="Files or directories to convert; '-' reads standard input."),
    in_place: bool = typer.Option(False, "--in-place", "-i", help="Write the converted code back to the files."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    diff: Optional[bool] = typer.Option(
        None, "--diff/--no-diff", help="Print the unified diff (default: on, unless --in-place, --check or -o)."
    ),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="Write the converted code of the single input to this file ('-': stdout)."
    ),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Colour the diff (default: on a terminal)."),
    line_length: int = typer.Option(88, "--line-length", min=20, help="Line length for inserted code."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line on stderr."),
    select: List[str] = typer.Option([], "--select", help="Only these codes or prefixes (ACC004, ACC1); repeatable or comma-separated."),
    ignore: List[str] = typer.Option([], "--ignore", help="Not these codes or prefixes; repeatable or comma-separated."),
    output_format: str = typer.Option("text", "--format", help="text (diff on stdout, findings on stderr), json, or github."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", "-j", min=1, help="Files converted at once, in worker processes (default: the number of CPUs; 1: no workers)."
    ),
    target: str = typer.Option(
        "accelerate", "--target",
        help="Where added imports come from: accelerate, or runtime (accelify.runtime: runs without accelerate installed).",
    ),
    notebook_launcher: Optional[int] = typer.Option(
        None, "--notebook-launcher", min=1, metavar="N",
        help="Notebooks: wrap the training code in def training_function(): started by "
             "notebook_launcher(training_function, num_processes=N).",
    ),
) -> None:
    """Convert training scripts; by default print a unified diff and write nothing."""
    from accelify.app.runner import convert_all
    from accelify.core.result import TARGETS, Options

    if in_place and output is not None:
        _usage("--in-place and --output cannot be used together.")
    if in_place and check:
        _usage("--in-place and --check cannot be used together.")
    if in_place and "-" in paths:
        _usage("standard input cannot be converted in place; use -o or the default diff.")
    if output_format not in ("text", "json", "github"):
        _usage(f"--format must be text, json or github, not {output_format!r}.")
    if target not in TARGETS:
        _usage(f"--target must be accelerate or runtime, not {target!r}.")
    if notebook_launcher is not None and target != "accelerate":
        _usage("--notebook-launcher imports notebook_launcher from accelerate: it needs --target accelerate.")
    missing = [path for path in paths if path != "-" and _missing(path)]
    if missing:  # as black and ruff: a usage error, and nothing converted
        for path in missing[:-1]:
            typer.echo(f"Usage error: {path}: no such file or directory.", err=True)
        _usage(f"{missing[-1]}: no such file or directory.")
    codemods, finding_codes = _selection(select, ignore)
    files = list(iter_python_files(paths))
    if output is not None and len(files) != 1:
        _usage("--output takes exactly one input file.")
    if output == "-" and output_format != "text":
        _usage("-o - and --format json/github both want stdout.")
    quiet_default = in_place or check or output is not None or output_format != "text"
    show_diff = diff if diff is not None else not quiet_default
    if show_diff and output_format == "json":
        _usage("--diff with --format json: the diffs are in the JSON already.")
    use_color = color if color is not None else sys.stdout.isatty()
    options = Options(line_length=line_length, select=codemods, findings=finding_codes, target=target,
                      notebook_launcher=notebook_launcher)
    if jobs is None:
        jobs = os.cpu_count() or 1

    run = _Run(show_diff=show_diff, use_color=use_color, output=output, in_place=in_place, quiet=quiet,
               output_format=output_format, keep=output_format != "text")
    # A bar on stderr only where a person watches it, and not over diffs printed on that terminal.
    if len(files) >= PROGRESS_FROM and not quiet and sys.stderr.isatty() and not (show_diff and sys.stdout.isatty()):
        run.progress = _progress_bar()
    run.inputs = {os.path.realpath(f) for f in files if f != "-"}
    if len(files) > 1:
        from accelify.app.runner import companion_inputs

        run.companion_inputs = companion_inputs(files)
    if run.progress is None:
        for outcome in convert_all(files, options, jobs):
            run.finish(outcome)
    else:
        with run.progress:
            task = run.progress.add_task("accelify", total=len(files))
            for outcome in convert_all(files, options, jobs):
                run.finish(outcome)
                run.progress.advance(task)
        run.progress = None

    run.flush()
    status = EXIT_ERROR if run.errors else EXIT_WOULD_CHANGE if check and run.changed else EXIT_OK
    summary = _summary(run.changed, run.errors, run.findings, len(files) + run.extra, in_place=in_place)
    if output_format == "json":
        from accelify.output.report import report_json

        report_json(run.records, run.diffs, summary, sys.stdout)
    elif output_format == "github":
        from accelify.output.report import report_github

        report_github(run.records, sys.stdout)
    if not quiet:
        run.say(summary)
    raise typer.Exit(status)


def _missing(path: str) -> bool:
    """Nothing is there (a path that exists but cannot be looked at is no usage error: reading it
    says why, exit 123)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, ValueError):
        return False
    return False


@dataclass
class _Record:
    """What the summary and the JSON/GitHub reports need of a file once it is printed or written."""

    path: str
    error: Optional[str]
    changed: bool
    changes: "list[Change]"
    findings: "list[Finding]"
    notes: "list[str]" = field(default_factory=list)


@dataclass
class _Run:
    """Prints or writes each file's outcome as it comes, keeping only the counts (and, for the
    JSON and GitHub reports, each file's changes, findings and diff: never its text)."""

    show_diff: bool
    use_color: bool
    output: Optional[str]
    in_place: bool
    quiet: bool
    output_format: str
    keep: bool
    progress: object = None
    changed: int = 0
    errors: int = 0
    findings: int = 0
    records: "list[_Record]" = field(default_factory=list)
    diffs: "dict[str, str]" = field(default_factory=dict)
    #: the input files (real paths), and among them the modules some input script trains in (None:
    #: a run of one file, nothing is held back)
    inputs: "set[str]" = field(default_factory=set)
    companion_inputs: "Optional[set[str]]" = None
    held: "list[Outcome]" = field(default_factory=list)
    #: files changed or reported that were not given: the modules beside the scripts
    extra: int = 0

    def say(self, text: str) -> None:
        """A line on stderr (above the progress bar when there is one)."""
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def finish(self, outcome: "Outcome") -> None:
        """Print or write one file's outcome; in a run of several files, a script converted with a
        module beside it, and such a module's own outcome, wait for :meth:`flush`."""
        result = outcome.result
        if self.companion_inputs is not None and (
                result.companions or result.kept or os.path.realpath(result.path) in self.companion_inputs):
            self.held.append(outcome)
            return
        self._emit(outcome)

    def flush(self) -> None:
        """The outcomes held back: a module two scripts would change differently is left as it is, and
        so are those scripts (a finding names them); a module changed with its script is not converted
        again on its own."""
        held, self.held = self.held, []
        versions: dict[str, dict[str, list[str]]] = {}
        for outcome in held:
            for companion in outcome.result.companions:
                if companion.changed:
                    versions.setdefault(os.path.realpath(companion.path), {}).setdefault(
                        companion.output, []).append(outcome.result.path)
        needs: dict[str, list[str]] = {}  # a module -> the scripts that need it as it is (`Result.kept`)
        for outcome in held:
            for path in outcome.result.kept:
                needs.setdefault(path, []).append(outcome.result.path)
        conflicted = {path for path, texts in versions.items() if len(texts) > 1 or path in needs}
        clashes = {id(o): _clashes(o.result, conflicted) for o in held}
        left = {o.result.path for o in held if any(clashes[id(o)])}  # the scripts left unchanged for a conflict
        merged = _merge_into_scripts(held)
        done: set[str] = set()
        for outcome in held:
            result = outcome.result
            real = os.path.realpath(result.path)
            clash, needed = clashes[id(outcome)]
            if id(outcome) in merged:
                continue  # (named with its script, once)
            if not result.companions and not needed:
                if real in versions and real not in conflicted and any(
                        p not in left for ps in versions[real].values() for p in ps):
                    if not self.quiet and self.output_format == "text":
                        self.say(f"{result.path}: converted with "
                                 f"{', '.join(sorted({p for ps in versions[real].values() for p in ps}))}")
                    continue
                self._emit(outcome)
                continue
            from accelify.app.runner import Outcome

            if clash or needed:
                outcome = Outcome(_left_for_conflict(result, clash, versions, needed, needs), outcome.encoding)
            else:
                kept = [c for c in result.companions if not (c.changed and os.path.realpath(c.path) in done)]
                done |= {os.path.realpath(c.path) for c in result.companions if c.changed}
                outcome = Outcome(dataclass_replace(result, companions=kept), outcome.encoding)
            self._emit(outcome)

    def _emit(self, outcome: "Outcome") -> None:
        result = outcome.result
        files = [(result, outcome.encoding)] + [(c, "utf-8") for c in result.companions]
        for item, _ in files:
            if item is not result and os.path.realpath(item.path) not in self.inputs:
                self.extra += 1  # a module beside the script, not given: counted in the summary
        if result.error is None:
            self._diffs([item for item, _ in files if item.changed])
        error = result.error
        changed = [item for item, _ in files if item.changed] if error is None else []
        if error is None and changed:
            error = self._write_all([(item, encoding) for item, encoding in files if item.changed])
            if error is not None:  # a failed write is an error, not a conversion
                self.say(f"error: {error}")
                changed = []
            elif not self.quiet:
                for item in changed:
                    self.say(f"{'converted' if self.in_place else 'would convert'} {item.path}"
                             + (f" (with {result.path})" if item is not result else ""))
                if self.output_format == "text" and any(c.code == "ACC018" for c in result.changes):
                    # it started its own processes: say how the converted script is started
                    self.say(f"  run it with `accelerate launch --num_processes N {result.path}` (N processes, one "
                             f"per GPU; `torchrun --nproc_per_node N {result.path}` works as before)")
        elif error is not None:
            self.say(f"error: {error}")
        if self.output_format == "text" and result.error is None:
            for note in result.notes:
                self.say(f"  {result.path}: {note}")
            for item, _ in files:
                for finding in item.findings:
                    self.say(finding.render())
        for item, _ in files:
            self.findings += len(item.findings)
        self.errors += error is not None
        self.changed += len(changed)
        if self.keep:
            for item, _ in files:
                self.records.append(_Record(item.path, error if item is result else None, item in changed,
                                            item.changes, item.findings, item.notes))

    def _diffs(self, items: "list[Result]") -> None:
        if not items or not (self.show_diff or self.output_format == "json"):
            return
        from accelify.output.diff import notebook_diff, print_diff, unified_diff

        for item in items:
            if item.cells is not None:
                diff = notebook_diff(item.cells, item.path)
            else:
                diff = unified_diff(item.source, item.output, item.path)
            if self.output_format == "json":
                self.diffs[item.path] = diff
            if self.show_diff:
                print_diff(diff, sys.stdout, self.use_color)
                sys.stdout.flush()

    def _write_all(self, items: "list[tuple[Result, str]]") -> Optional[str]:
        """Write every changed file of one conversion, or none: a failure puts back those written."""
        if self.output is not None and len(items) > 1:
            others = ", ".join(item.path for item, _encoding in items[1:])
            return (f"{items[0][0].path}: converting it changes {others} too; --output writes one file: use "
                    f"--in-place, or the diff")
        written: list[tuple[Result, str]] = []
        for item, encoding in sorted(items, key=lambda pair: pair[0] is not items[0][0]):
            error = self._write(item.output, item.path, encoding, True)
            if error is not None:
                for done, done_encoding in written:
                    self._write(done.source, done.path, done_encoding, True)
                return error if not written else error + " (the files of this conversion written before it were put back)"
            written.append((item, encoding))
        return None

    def _write(self, text: str, path: str, encoding: str, changed: bool) -> Optional[str]:
        """Write the converted text where asked; the error, if that failed."""
        target = self.output if self.output is not None else path if self.in_place and changed else None
        if target is None:
            return None
        try:
            if target == "-":
                sys.stdout.buffer.write(text.encode(encoding))
                sys.stdout.flush()
            else:
                write_atomic(target, text, encoding)
        except OSError as exc:
            return f"{target}: cannot write: {exc.strerror or exc}"
        return None


def _merge_into_scripts(held: "list[Outcome]") -> set[int]:
    """A module left unchanged both with its script (the script's finding placed in it) and on its own: one entry,
    the script's, with what the module's own conversion says beside it; the ids of the outcomes merged so."""
    carriers: dict[str, "Result"] = {}
    for outcome in held:
        for companion in outcome.result.companions:
            if not companion.changed and companion.findings:
                carriers.setdefault(os.path.realpath(companion.path), companion)
    merged: set[int] = set()
    for outcome in held:
        result = outcome.result
        carrier = carriers.get(os.path.realpath(result.path))
        if carrier is None or carrier is result or result.companions or result.kept or result.changed \
                or result.error is not None:
            continue
        known = {(f.line, f.code, f.message) for f in carrier.findings}
        carrier.findings = sorted([*carrier.findings, *(dataclass_replace(f, path=carrier.path) for f in result.findings
                                                         if (f.line, f.code, f.message) not in known)])
        merged.add(id(outcome))
    return merged


def _clashes(result: "Result", conflicted: set[str]) -> "tuple[list[Result], list[str]]":
    """(the modules converted with ``result`` that a run leaves for a conflict, the modules it needs as they are
    that another script of the run would change)."""
    return ([c for c in result.companions if os.path.realpath(c.path) in conflicted],
            [p for p in result.kept if p in conflicted])


def _left_for_conflict(result: "Result", clash: "list[Result]", versions: "dict[str, dict[str, list[str]]]",
                       needed: Sequence[str] = (), needs: "Optional[dict[str, list[str]]]" = None) -> "Result":
    """The script left as it is: a module it trains in is converted differently for another script, or one it
    needs as it is is converted for another script."""
    from accelify.queries.records import Finding

    findings = list(result.findings)
    for path in needed:
        scripts = sorted({p for ps in versions[path].values() for p in ps})
        shown = os.path.relpath(path, os.path.dirname(os.path.abspath(result.path)))
        findings.append(Finding(
            result.path, 1, 1, "ACC141",
            f"`{shown}` would print through `PartialState().print` once converted with "
            f"{', '.join(f'`{p}`' for p in scripts)}, and this script uses it before creating its "
            "`Accelerator(cpu=...)`: such a print sets the processes' state up before the Accelerator, and on a GPU "
            "machine `Accelerator(cpu=True)` then stops with Accelerate's ValueError. The module and these scripts "
            "are left unchanged.",
            f"create the Accelerator before the first use of `{shown}` in this script: the module can then print "
            "through the state for every script.",
        ))
    for companion in clash:
        kept = (needs or {}).get(os.path.realpath(companion.path))
        if kept:
            findings.append(Finding(
                result.path, 1, 1, "ACC141",
                f"`{companion.path}` is converted with this script (its prints through `PartialState().print`), "
                f"and {', '.join(f'`{p}`' for p in sorted(kept))} uses it before creating its "
                "`Accelerator(cpu=...)`, which such a print would make stop with Accelerate's ValueError on a GPU "
                "machine (the state set up before it): the module and these scripts are left unchanged.",
                f"in {', '.join(f'`{p}`' for p in sorted(kept))}, create the Accelerator before the first use of "
                f"`{companion.path}`.",
            ))
            continue
        scripts = sorted({p for ps in versions[os.path.realpath(companion.path)].values() for p in ps})
        findings.append(Finding(
            result.path, 1, 1, "ACC141",
            f"`{companion.path}` is converted with this script, and differently with "
            f"{', '.join(f'`{p}`' for p in scripts if p != result.path)}: the module and these scripts are left "
            f"unchanged.",
            "convert each script on its own (`accelify convert SCRIPT`), or give the module one training function "
            "per script.",
        ))
    return dataclass_replace(result, output=result.source, changes=[], findings=findings, companions=[
        dataclass_replace(c, output=c.source, changes=[]) for c in result.companions if c.findings])


def _progress_bar():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True, redirect_stdout=False, redirect_stderr=False,
    )


def _split(values: List[str]) -> list[str]:
    return [v.strip().upper() for value in values for v in value.split(",") if v.strip()]


def _selection(select: List[str], ignore: List[str]) -> tuple[Optional[frozenset[str]], Optional[frozenset[str]]]:
    """(codemods to run, findings to report) from --select/--ignore; None means all."""
    if not select and not ignore:
        return None, None  # (the codemods, and LibCST with them, are not even imported)
    from accelify.codemods import by_code
    from accelify.output.findings import FINDINGS

    codemods = by_code()
    everything = set(codemods) | set(FINDINGS)

    def expand(items: list[str]) -> set[str]:
        out: set[str] = set()
        for item in items:
            matched = {code for code in everything if code.startswith(item)}
            if not matched:
                _usage(f"unknown code {item!r}; `accelify rules` lists them.")
            out |= matched
        return out

    chosen = (expand(_split(select)) if select else set(everything)) - expand(_split(ignore))
    run = chosen & set(codemods)
    for code in sorted(run):
        missing = codemods[code].REQUIRES - run
        if missing:
            _usage(f"{code} needs {', '.join(sorted(missing))}: select it too (or ignore {code}).")
    shown = chosen & set(FINDINGS)
    return (
        None if run == set(codemods) else frozenset(run),
        None if shown == set(FINDINGS) else frozenset(shown),
    )


def _summary(changed: int, errors: int, findings: int, total: int, *, in_place: bool) -> str:
    verb = "converted" if in_place else "would be converted"
    parts = [f"{changed} file{'s' if changed != 1 else ''} {verb}", f"{total - changed - errors} unchanged"]
    if findings:
        parts.append(f"{findings} finding{'s' if findings != 1 else ''}")
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    return ", ".join(parts) + "."


@app.command()
def rules(code: Optional[str] = typer.Argument(None, help="A code such as ACC004: show its before/after.")) -> None:
    """List the codemods with their codes, or show one with its before/after example."""
    from accelify.codemods import by_code

    from accelify.output.findings import FINDINGS, code_key

    table = by_code()
    if code is None:
        rows = [(cls.CODE, cls.NAME, cls.DESCRIPTION) for cls in table.values()]
        rows += [(finding, "finding", text) for finding, text in FINDINGS.items()]
        width = max(len(name) for _, name, _ in rows)
        for listed, name, text in sorted(rows, key=lambda row: code_key(row[0])):
            typer.echo(f"{listed}  {name:<{width}} {text}")
        return
    if code.upper() in FINDINGS:
        typer.echo(f"{code.upper()} (finding): {FINDINGS[code.upper()]}")
        return
    cls = table.get(code.upper())
    if cls is None:
        _usage(f"unknown code {code!r}; `accelify rules` lists them.")
    before, after = cls.example()
    typer.echo(f"{cls.CODE} {cls.NAME}: {cls.DESCRIPTION}\n\nBefore:\n{before}\nAfter:\n{after}", nl=False)


@app.command()
def verify(
    path: str = typer.Argument(..., help="The training script to verify."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script, after '--'."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps each run takes before it is stopped."),
    processes: int = typer.Option(1, "--processes", min=1, help="Also run the converted script on N CPU processes (torchrun, gloo)."),
    rtol: float = typer.Option(0.0, "--rtol", min=0.0, help="Relative tolerance between the losses (0: bit for bit)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Seconds a run may take before it counts as hung."),
    output_format: str = typer.Option("text", "--format", help="text (a table and a verdict) or json."),
) -> None:
    """Run a script and its conversion on the CPU and compare the losses they pass to backward."""
    from accelify.app.verify import VerifyError
    from accelify.app.verify import verify as run_verify

    if output_format not in ("text", "json"):
        _usage(f"--format must be text or json, not {output_format!r}.")
    if not os.path.isfile(path):
        _usage(f"{path}: no such file.")
    if path.endswith(".ipynb"):
        _usage(f"{path}: verify runs Python scripts, not notebooks (jupyter nbconvert --to script makes one).")
    display = _VerifyDisplay(steps)
    try:
        with display:
            result = run_verify(path, steps=steps, processes=processes, rtol=rtol, args=script_args or [],
                                timeout=timeout, progress=display.update)
    except VerifyError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_ERROR)
    if output_format == "json":
        import json

        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_verification(result)
    raise typer.Exit(result.exit_code)


class _VerifyDisplay:
    """Live progress of the runs on a terminal's stderr (rich); plain lines on stderr otherwise."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.progress = None
        self.tasks: dict = {}
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=True,
            )

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, run, state: str, steps: int) -> None:
        if self.progress is None:
            if state == "started":
                typer.echo(f"{run.name}: started", err=True)
            elif state == "done":
                typer.echo(f"{run.name}: {run.state} after {run.seconds:.1f} s, {steps} optimizer steps", err=True)
            return
        if run.name not in self.tasks:
            self.tasks[run.name] = self.progress.add_task(run.name, total=self.steps, state="")
        task = self.tasks[run.name]
        label = {"started": "starting", "running": "running", "done": run.state if state == "done" else ""}[state]
        self.progress.update(task, completed=min(steps, self.steps), state=label)


def _number(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.8g}"


def _print_verification(result) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    for finding in result.findings:
        console.print(finding, markup=False, style="yellow")
    if result.rows:
        table = Table(title=f"{result.path}: losses passed to backward", title_justify="left")
        table.add_column("step", justify="right")
        table.add_column("original", justify="right")
        table.add_column("converted", justify="right")
        table.add_column("difference", justify="right")
        if result.distributed is not None:
            table.add_column(f"rank 0 of {result.distributed.processes}", justify="right")
        first = result.first_difference.index if result.first_difference is not None else None
        for row in result.rows:
            difference = row.difference
            cells = [str(row.step), _number(row.original), _number(row.converted),
                     "" if difference is None else ("0" if difference == 0 else f"{difference:+.3g}")]
            if result.distributed is not None:
                cells.append(_number(row.distributed))
            table.add_row(*cells, style="bold red" if row.index == first else None)
        console.print(table)
    colour = "green" if result.exit_code == 0 else "red"
    console.print(f"[{colour}]{result.verdict}[/{colour}]: ", end="")
    console.print(result.message, markup=False)
    for run in (result.original, result.converted):
        if run is not None and not run.ok:
            _print_failure(console, run)
    if result.distributed is not None:
        colour = "green" if result.distributed.verdict == "ok" else "red"
        console.print(f"[{colour}]{result.distributed.processes} processes: {result.distributed.verdict}[/{colour}]: ", end="")
        console.print(result.distributed.message, markup=False)
        if result.distributed.verdict != "ok":
            _print_failure(console, result.distributed.run)


def _print_failure(console, run) -> None:
    if run.stderr_tail and run.device_error is None:  # the message names the line already
        console.print(f"last lines of the {run.name} run's stderr:", markup=False)
        for line in run.stderr_tail:
            console.print("    " + line, markup=False, style="dim", soft_wrap=True)


def main() -> None:
    kwargs = _plain_convert_args(sys.argv[1:])
    if kwargs is None:
        app()
        return
    try:
        convert(**kwargs)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `accelify convert . | head`: as click does
        sys.stdout = open(os.devnull, "w")
        sys.exit(1)
    except KeyboardInterrupt:  # as click does
        sys.stderr.write("\nAborted!\n")
        sys.exit(1)


def _plain_convert_args(argv: List[str]) -> Optional[dict]:
    """``convert``'s arguments read straight from a plain ``accelify convert ...`` command line.

    typer builds a pydantic validator for each parameter it converts, which costs more than
    the whole run on a file that cannot train; this reads the options ``convert`` declares
    (the same flags, defaults and minimums) and gives up, leaving the command line to typer,
    on anything else: help, an unknown or bundled option, a missing or invalid value.
    """
    import inspect
    import typing

    if not argv or argv[0] != "convert":
        return None
    hints = typing.get_type_hints(convert)
    switches: dict[str, tuple[str, bool]] = {}  # flag -> (parameter, value)
    takes_value: dict[str, tuple[str, object, Optional[int], bool]] = {}  # flag -> (parameter, type, min, repeatable)
    kwargs: dict = {}
    positional = ""
    for name, parameter in inspect.signature(convert).parameters.items():
        info = parameter.default
        if isinstance(info, typer.models.ArgumentInfo):
            positional = name
            kwargs[name] = []
            continue
        hint = hints[name]
        kind = next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)  # Optional[X], List[X]: X
        repeatable = typing.get_origin(hint) is list
        kwargs[name] = list(info.default) if repeatable else info.default
        for decl in info.param_decls:
            on, _, off = decl.partition("/")
            if kind is bool:
                switches[on] = (name, True)
                if off:
                    switches[off] = (name, False)
            else:
                takes_value[on] = (name, kind, info.min, repeatable)
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "--":
            kwargs[positional].extend(rest)
            break
        if arg == "-" or not arg.startswith("-"):
            kwargs[positional].append(arg)
            continue
        if arg in switches:
            name, value = switches[arg]
            kwargs[name] = value
            continue
        flag, value = (arg.split("=", 1) + [None])[:2] if arg.startswith("--") else (arg[:2], arg[2:] or None)
        if flag not in takes_value:
            return None
        name, kind, minimum, repeatable = takes_value[flag]
        if value is None:
            value = next(rest, None)
            if value is None or (value.startswith("-") and value != "-"):
                return None
        if kind is int:
            if not (value.isascii() and value.isdigit()) or (minimum is not None and int(value) < minimum):
                return None
            value = int(value)
        elif kind is not str:
            return None
        if repeatable:
            kwargs[name].append(value)
        else:
            kwargs[name] = value
    return kwargs if kwargs[positional] else None
