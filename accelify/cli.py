"""The ``accelify`` command line: ``convert`` and ``rules``.

Exit codes (as black): 0 success, 1 ``--check`` found files that would change,
2 usage error, 123 a file could not be read or parsed (it is left untouched and
the other files are still processed).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console

from accelify import __version__
from accelify.diff import print_diff, unified_diff
from accelify.io import Source, SourceError, decode, iter_python_files, read_source, write_atomic
from accelify.report import Finding, report_github, report_json

if TYPE_CHECKING:
    from accelify.pipeline import Result

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 123

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
) -> None:
    """Convert training scripts; by default print a unified diff and write nothing."""
    from accelify.pipeline import Options, convert_source  # LibCST loads only when there is work

    if in_place and output is not None:
        _usage("--in-place and --output cannot be used together.")
    if in_place and check:
        _usage("--in-place and --check cannot be used together.")
    if in_place and "-" in paths:
        _usage("standard input cannot be converted in place; use -o or the default diff.")
    if output_format not in ("text", "json", "github"):
        _usage(f"--format must be text, json or github, not {output_format!r}.")
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
    err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    options = Options(line_length=line_length, select=codemods, findings=finding_codes)
    diffs: dict[str, str] = {}

    results: "list[Result]" = []
    status = EXIT_OK
    for path in files:
        try:
            source = decode(sys.stdin.buffer.read(), "<stdin>") if path == "-" else read_source(path)
        except SourceError as exc:
            err.print(f"error: {exc}", markup=False)
            status = EXIT_ERROR
            continue
        result = convert_source(source.text, source.path, options)
        results.append(result)
        if result.error is not None:
            err.print(f"error: {result.error}", markup=False)
            status = EXIT_ERROR
            continue
        if result.changed:
            diffs[source.path] = unified_diff(result.source, result.output, source.path)
        if show_diff and result.changed:
            print_diff(diffs[source.path], sys.stdout, use_color)
            sys.stdout.flush()
        if output is not None:
            _write_output(output, result, source)
        elif in_place and result.changed:
            try:
                write_atomic(source.path, result.output, source.encoding)
            except OSError as exc:
                err.print(f"error: {source.path}: cannot write: {exc.strerror or exc}", markup=False)
                status = EXIT_ERROR
        if check and result.changed:
            status = max(status, EXIT_WOULD_CHANGE)
        if output_format == "text":
            _print_findings(err, result.findings)

    summary = _summary(results, len(files), in_place=in_place, check=check)
    if output_format == "json":
        report_json(results, diffs, summary, sys.stdout)
    elif output_format == "github":
        report_github(results, sys.stdout)
    if not quiet:
        err.print(summary, markup=False)
    raise typer.Exit(status)


def _split(values: List[str]) -> list[str]:
    return [v.strip().upper() for value in values for v in value.split(",") if v.strip()]


def _selection(select: List[str], ignore: List[str]) -> tuple[Optional[frozenset[str]], Optional[frozenset[str]]]:
    """(codemods to run, findings to report) from --select/--ignore; None means all."""
    from accelify.codemods import by_code
    from accelify.findings import FINDINGS

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


def _write_output(output: str, result: "Result", source: Source) -> None:
    if output == "-":
        sys.stdout.buffer.write(result.output.encode(source.encoding))
        sys.stdout.flush()
    else:
        write_atomic(output, result.output, source.encoding)


def _print_findings(err: Console, findings: list[Finding]) -> None:
    for finding in findings:
        err.print(finding.render(), markup=False)


def _summary(results: "list[Result]", total: int, *, in_place: bool, check: bool) -> str:
    changed = sum(r.changed for r in results)
    errors = total - sum(r.error is None for r in results)
    findings = sum(len(r.findings) for r in results)
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

    from accelify.findings import FINDINGS

    table = by_code()
    if code is None:
        for cls in table.values():
            typer.echo(f"{cls.CODE}  {cls.NAME:<18} {cls.DESCRIPTION}")
        for finding, text in FINDINGS.items():
            typer.echo(f"{finding}  {'finding':<18} {text}")
        return
    if code.upper() in FINDINGS:
        typer.echo(f"{code.upper()} (finding): {FINDINGS[code.upper()]}")
        return
    cls = table.get(code.upper())
    if cls is None:
        _usage(f"unknown code {code!r}; `accelify rules` lists them.")
    before, after = cls.example()
    typer.echo(f"{cls.CODE} {cls.NAME}: {cls.DESCRIPTION}\n\nBefore:\n{before}\nAfter:\n{after}", nl=False)


def main() -> None:
    app()
