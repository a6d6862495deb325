"""The command line at scale: start-up cost, worker processes, progress, per-file messages,
failed writes, symbolic links, and the pre-commit/CI integration."""

from __future__ import annotations

import functools
import gc
import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from conftest import FIXTURES, ROOT, drain

TRAIN = (FIXTURES / "in_function" / "before.py").read_text()  # small: LibCST's time is the tests' time
CONVERTED = (FIXTURES / "in_function" / "after.py").read_text()
AMBIGUOUS = (FIXTURES / "ambiguous_placement" / "before.py").read_text()
PLAIN = "import os\n\nprint(os.getcwd())\n"


def run(*args: str, cwd: Path, env: dict | None = None, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *python, "-m", "accelify", *args],
        cwd=cwd, capture_output=True, timeout=600, env={**os.environ, **(env or {})},
    )


def imported(importtime_stderr: bytes) -> set[str]:
    """The modules a ``python -X importtime`` run imported."""
    names = set()
    for line in importtime_stderr.decode().splitlines():
        if line.startswith("import time:") and not line.rstrip().endswith("imported package"):
            names.add(line.rsplit("|", 1)[1].strip())
    return names


# ---------------------------------------------------------------- start-up cost


def test_files_that_cannot_train_cost_no_libcst_no_rich_no_pydantic(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(PLAIN)
    (tmp_path / "skip.py").write_text("# accelify: skip\n" + AMBIGUOUS)
    proc = run("convert", "--check", "plain.py", "skip.py", cwd=tmp_path, python=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.endswith(b"0 files would be converted, 2 unchanged.\n")
    modules = imported(proc.stderr)
    assert "accelify.app.cli" in modules and "accelify.app.runner" in modules  # the parse did see the run
    assert not {m for m in modules if m.split(".")[0] in ("libcst", "pydantic")}
    assert not {"accelify.core.pipeline", "accelify.codemods", "rich.console", "rich.progress"} & modules


def test_a_training_file_still_loads_the_converter(tmp_path: Path) -> None:
    """The other side of the test above: the import check sees LibCST when it is there."""
    (tmp_path / "train.py").write_text(TRAIN)
    proc = run("convert", "--check", "train.py", cwd=tmp_path, python=("-X", "importtime"))
    assert proc.returncode == 1
    assert {"libcst", "accelify.core.pipeline"} <= imported(proc.stderr)


def _typer_reads(argv: list[str]) -> dict | None:
    """The arguments typer itself hands ``convert`` for ``argv`` (None: a usage error)."""
    from accelify.app import cli

    seen: dict = {}

    @functools.wraps(cli.convert)
    def spy(**kwargs) -> None:
        seen.update(kwargs)

    app = typer.Typer()
    app.callback()(lambda: None)
    app.command(name="convert")(spy)
    result = CliRunner().invoke(app, argv)
    if result.exit_code != 0:
        return None
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in seen.items()}


PLAIN_COMMANDS = [
    ["convert", "a.py"],
    ["convert", "--check", "src", "b.py"],
    ["convert", "-i", "-q", "-j", "2", "a.py", "--line-length=100"],
    ["convert", "--in-place", "--jobs=3", "--no-color", "--diff", "a.py"],
    ["convert", "--no-diff", "--color", "--select", "ACC1", "--select=ACC004,ACC005", "--ignore", "ACC108", "a.py"],
    ["convert", "-", "-o", "-"],
    ["convert", "a.py", "-o", "out.py", "--output", "again.py", "--format", "json"],
    ["convert", "-j1", "--quiet", "--", "-weird.py", "--check"],
]
LEFT_TO_TYPER = [
    ["convert"],
    ["convert", "--help"],
    ["convert", "-j", "0", "a.py"],
    ["convert", "--jobs", "two", "a.py"],
    ["convert", "--line-length", "5", "a.py"],
    ["convert", "--no-such-flag", "a.py"],
    ["convert", "a.py", "-o"],
    ["convert", "-iq", "a.py"],
    ["convert", "--check=yes", "a.py"],
    ["rules"],
    ["--version"],
]


@pytest.mark.parametrize("argv", PLAIN_COMMANDS + LEFT_TO_TYPER, ids=" ".join)
def test_the_quick_reading_of_the_command_line_agrees_with_typer(argv: list[str]) -> None:
    """`main` reads a plain `convert` command line itself (typer's per-parameter validators
    cost more than a whole run on files that cannot train); it must read it exactly as typer
    does, and leave everything else to typer."""
    from accelify.app.cli import _plain_convert_args

    quick = _plain_convert_args(argv)
    if argv in LEFT_TO_TYPER:
        assert quick is None
    else:
        assert quick is not None and quick == _typer_reads(argv)


# ---------------------------------------------------------------- -j/--jobs


@pytest.fixture
def many(tmp_path: Path) -> Path:
    """Files that give a diff, findings, an error, a skip and plain files, in a nested tree."""
    (tmp_path / "a_train.py").write_text(TRAIN)
    (tmp_path / "b_amb.py").write_text(AMBIGUOUS)
    (tmp_path / "c_broken.py").write_text("import torch\noptimizer = (\n")
    (tmp_path / "d_plain.py").write_text(PLAIN)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "e_train.py").write_text(TRAIN.replace("lr=0.1", "lr=0.2"))
    (tmp_path / "pkg" / "f_skip.py").write_text("# accelify: skip\n" + TRAIN)
    return tmp_path


@pytest.mark.parametrize("mode", [(), ("--format", "json")])
def test_one_or_two_workers_print_the_same_bytes(many: Path, mode: tuple[str, ...]) -> None:
    one = run("convert", *mode, "-j", "1", ".", cwd=many)
    two = run("convert", *mode, "-j", "2", ".", cwd=many)
    assert one.returncode == two.returncode == 123
    assert one.stdout == two.stdout and one.stderr == two.stderr
    if not mode:
        assert one.stdout.index(b"--- a/a_train.py") < one.stdout.index(b"--- a/b_amb.py") < one.stdout.index(
            b"--- a/pkg/e_train.py")
        assert one.stderr.decode().endswith("3 files would be converted, 2 unchanged, 2 findings, 1 error.\n")
    else:
        paths = [entry["path"] for entry in json.loads(one.stdout)["files"]]
        assert paths == ["./a_train.py", "./b_amb.py", "./c_broken.py", "./d_plain.py", "./pkg/e_train.py",
                         "./pkg/f_skip.py"]


def test_jobs_0_is_a_usage_error(many: Path) -> None:
    proc = run("convert", "-j", "0", "a_train.py", cwd=many)
    assert proc.returncode == 2 and b"--jobs" in proc.stderr


def test_a_pool_only_for_two_files_that_need_the_analysis(many: Path, monkeypatch) -> None:
    from accelify.app import runner
    from accelify.app.cli import app

    pools: list[int] = []
    real = runner._make_pool
    monkeypatch.setattr(runner, "_make_pool", lambda jobs: pools.append(jobs) or real(jobs))
    # (what is converted does not matter here, only who converts it: no LibCST, forked workers see this)
    monkeypatch.setattr(runner, "convert_text", lambda text, path, options: runner.Result(path, text, text + "#\n"))
    monkeypatch.chdir(many)

    def pool_for(*args: str) -> list[int]:
        pools.clear()
        result = CliRunner().invoke(app, ["convert", "--check", *args])
        assert result.exit_code == 1, result.output
        return list(pools)

    assert pool_for("-j", "2", ".") == [2]
    assert pool_for("-j", "8", "a_train.py", "b_amb.py", "d_plain.py") == [3]  # never more workers than files
    assert pool_for("-j", "1", ".") == []
    assert pool_for("-j", "2", "a_train.py", "d_plain.py", "pkg/f_skip.py") == []  # one file to analyse
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert pool_for(".") == [2]  # the default: one worker per CPU


def test_output_in_file_order_when_workers_finish_in_reverse(tmp_path: Path, monkeypatch) -> None:
    import time

    from accelify.app import runner
    from accelify.app.cli import app

    def convert_text(text: str, path: str, options) -> runner.Result:  # the first files are the slowest
        time.sleep({"./f0.py": 1.0, "./f1.py": 0.5}.get(path, 0))
        return runner.Result(path, text, text + f"# {path}\n")

    monkeypatch.setattr(runner, "convert_text", convert_text)  # (forked workers run this too)
    for i in range(4):
        (tmp_path / f"f{i}.py").write_text("import torch\noptimizer = torch.optim.SGD(model.parameters())\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["convert", "-j", "2", "."])
    assert result.exit_code == 0, result.output
    assert re.findall(r"^\+# (.*)$", result.stdout, re.M) == ["./f0.py", "./f1.py", "./f2.py", "./f3.py"]
    assert re.findall(r"^would convert (.*)$", result.stderr, re.M) == ["./f0.py", "./f1.py", "./f2.py", "./f3.py"]


@pytest.mark.parametrize("output_format", ["text", "json"])
def test_no_result_is_kept_once_printed(tmp_path: Path, monkeypatch, output_format: str) -> None:
    from accelify.app import runner
    from accelify.app.cli import app
    from accelify.core.result import Result

    alive_before: list[int] = []
    made: list[weakref.ref] = []

    def convert_text(text: str, path: str, options) -> Result:
        gc.collect()
        alive_before.append(sum(ref() is not None for ref in made[:-2]))  # (the last two may still be in locals)
        result = Result(path, text, text + "# converted\n")
        made.append(weakref.ref(result))
        return result

    monkeypatch.setattr(runner, "convert_text", convert_text)
    for i in range(8):
        (tmp_path / f"f{i}.py").write_text(PLAIN * 200)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["convert", "-j", "1", "--format", output_format, "."])
    assert result.exit_code == 0, result.output
    assert len(made) == 8 and alive_before == [0] * 8
    del result  # (its traceback of the exit holds the command's last frame)
    gc.collect()
    assert [ref() for ref in made] == [None] * 8


# ---------------------------------------------------------------- progress bar


@pytest.fixture
def twelve(tmp_path: Path) -> Path:
    for i in range(12):
        (tmp_path / f"f{i:02}.py").write_text(PLAIN)
    return tmp_path


def test_no_progress_bar_when_stderr_is_no_terminal(twelve: Path) -> None:
    proc = run("convert", "--check", ".", cwd=twelve)
    assert proc.returncode == 0
    assert proc.stderr == b"0 files would be converted, 12 unchanged.\n"


def test_progress_bar_on_a_terminal(twelve: Path) -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "accelify", "convert", "--check", "."], cwd=twelve,
                              stdout=subprocess.PIPE, stderr=follower, timeout=120,
                              env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
        os.close(follower)
        follower = -1
        shown = drain(leader)
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0
    assert re.search(rb"accelify .*\d+/12", shown), shown
    assert shown.rstrip().endswith(b"0 files would be converted, 12 unchanged.")


# ---------------------------------------------------------------- messages, failed writes


def test_each_changed_file_is_named_on_stderr(many: Path) -> None:
    check = run("convert", "--check", "a_train.py", "d_plain.py", cwd=many)
    assert check.returncode == 1
    assert check.stderr.decode().splitlines() == ["would convert a_train.py", "1 file would be converted, 1 unchanged."]
    diff = run("convert", "a_train.py", "d_plain.py", cwd=many)
    assert diff.stderr.decode().splitlines()[0] == "would convert a_train.py"
    fixed = run("convert", "--in-place", "a_train.py", "d_plain.py", cwd=many)
    assert fixed.returncode == 0
    assert fixed.stderr.decode().splitlines() == ["converted a_train.py", "1 file converted, 1 unchanged."]


def test_a_failed_write_is_an_error_not_a_conversion(tmp_path: Path) -> None:
    """A name the atomic write's temporary file cannot have (it is longer): the write fails even
    for root, whom a read-only directory would not stop."""
    name = "t" * 242 + ".py"
    (tmp_path / name).write_text(TRAIN)
    proc = run("convert", "--in-place", name, cwd=tmp_path)
    assert proc.returncode == 123
    err = proc.stderr.decode()
    assert f"error: {name}: cannot write:" in err and f"converted {name}" not in err
    assert err.endswith("0 files converted, 0 unchanged, 1 error.\n")
    assert (tmp_path / name).read_text() == TRAIN


def test_a_read_only_file_is_left_alone_and_an_error(tmp_path: Path) -> None:
    """Issue 25: --in-place replaced a read-only file through the atomic rename. Decided by the
    mode's write bits, so root (whom the mode does not stop) gets the same as anyone."""
    (tmp_path / "ro.py").write_text(TRAIN)
    (tmp_path / "rw.py").write_text(TRAIN)
    (tmp_path / "link.py").symlink_to("ro.py")
    (tmp_path / "ro.py").chmod(0o444)
    before = (tmp_path / "ro.py").stat()
    proc = run("convert", "--in-place", "-j", "1", "link.py", "rw.py", cwd=tmp_path)
    assert proc.returncode == 123
    assert proc.stderr.decode().splitlines() == [
        "error: link.py: cannot write: permission denied: the file is read-only (mode 0444, no write permission "
        "bit; accelify does not write such a file, even as root); left unchanged",
        "converted rw.py",
        "1 file converted, 0 unchanged, 1 error.",
    ]
    after = (tmp_path / "ro.py").stat()
    assert (tmp_path / "ro.py").read_text() == TRAIN and (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert (tmp_path / "rw.py").read_text() != TRAIN  # the other file is converted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.py", "ro.py", "rw.py"]  # no temporary file left
    as_json = json.loads(run("convert", "--in-place", "--format", "json", "ro.py", cwd=tmp_path).stdout)
    assert as_json["files"][0]["status"] == "error" and "read-only" in as_json["files"][0]["error"]
    assert (tmp_path / "ro.py").read_text() == TRAIN


def test_a_file_this_user_may_not_write_is_not_replaced(tmp_path: Path, monkeypatch) -> None:
    """A file with write bits, not for this user (another's 0644): the rename would replace it all the same."""
    from accelify.app import files as io

    target = tmp_path / "theirs.py"
    target.write_text("x = 1\n")
    monkeypatch.setattr(io.os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match="this user may not write the file"):
        io.write_atomic(str(target), "x = 2\n", "utf-8")
    assert target.read_text() == "x = 1\n" and [p.name for p in tmp_path.iterdir()] == ["theirs.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "train.py").write_text(TRAIN)
    (tmp_path / "ro").chmod(0o555)
    try:
        proc = run("convert", "--in-place", "ro", cwd=tmp_path)
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert proc.returncode == 123
    assert proc.stderr.decode().endswith("0 files converted, 0 unchanged, 1 error.\n")


def test_findings_without_a_position_show_none() -> None:
    import io

    from accelify.queries.records import Finding
    from accelify.output.report import report_github

    assert Finding("a.py", 0, 0, "ACC121", "No DataLoader.").render() == "a.py: ACC121 No DataLoader."
    assert Finding("a.py", 7, 0, "ACC121", "No DataLoader.").render() == "a.py:7: ACC121 No DataLoader."
    assert Finding("a.py", 7, 3, "ACC108", "m", "s").render() == "a.py:7:3: ACC108 m Suggestion: s"

    class Done:
        path, error = "a,b.py", None
        findings = [Finding("a,b.py", 0, 0, "ACC121", "50% done\nnext"), Finding("a,b.py", 4, 2, "ACC108", "m")]

    stream = io.StringIO()
    report_github([Done()], stream)
    assert stream.getvalue().splitlines() == [
        "::warning file=a%2Cb.py,title=accelify ACC121::50%25 done next",  # a finding is one line
        "::warning file=a%2Cb.py,line=4,col=2,title=accelify ACC108::m",
    ]


# ---------------------------------------------------------------- symbolic links


def test_in_place_writes_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text(TRAIN)
    (tmp_path / "link.py").symlink_to(tmp_path / "real" / "train.py")
    proc = run("convert", "--in-place", "link.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "link.py").is_symlink()
    assert (tmp_path / "real" / "train.py").read_text() == CONVERTED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.py", "real"]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["train.py"]


def test_a_file_reached_through_several_links_is_converted_once(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(TRAIN)
    (tmp_path / "b.py").symlink_to("a.py")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").symlink_to("../a.py")
    (tmp_path / "other.py").write_text(TRAIN.replace("lr=0.1", "lr=0.3"))
    check = run("convert", "--check", "-j", "2", ".", "a.py", cwd=tmp_path)
    assert check.returncode == 1
    assert check.stderr.decode().splitlines() == [
        "would convert ./a.py", "would convert ./other.py", "2 files would be converted, 0 unchanged."]
    fixed = run("convert", "--in-place", "-j", "2", ".", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stderr.decode().endswith("2 files converted, 0 unchanged.\n")
    assert (tmp_path / "a.py").read_text() == CONVERTED and (tmp_path / "b.py").is_symlink()


def test_a_directory_run_leaves_links_to_other_trees_alone(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "vendored.py").write_text(TRAIN)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "train.py").write_text(TRAIN)
    (tmp_path / "repo" / "vendored.py").symlink_to(tmp_path / "outside" / "vendored.py")
    fixed = run("convert", "--in-place", "repo", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stderr.decode().endswith("1 file converted, 0 unchanged.\n")
    assert (tmp_path / "outside" / "vendored.py").read_text() == TRAIN  # another tree's file: untouched
    assert (tmp_path / "repo" / "train.py").read_text() == CONVERTED
    named = run("convert", "--in-place", "repo/vendored.py", cwd=tmp_path)  # named: converted, through the link
    assert named.returncode == 0 and (tmp_path / "outside" / "vendored.py").read_text() == CONVERTED


# ---------------------------------------------------------------- pre-commit and CI


def test_pre_commit_hooks_run_the_documented_commands(tmp_path: Path) -> None:
    import yaml

    hooks = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"accelify", "accelify-fix"}
    for hook in hooks.values():
        assert hook["language"] == "python" and hook["types"] == ["python"]
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "plain.py").write_text(PLAIN)

    def as_pre_commit(hook_id: str) -> subprocess.CompletedProcess:  # pre-commit appends the staged files
        program, *args = hooks[hook_id]["entry"].split()
        assert program == "accelify"
        return run(*args, *hooks[hook_id].get("args", []), "train.py", "plain.py", cwd=tmp_path)

    assert as_pre_commit("accelify").returncode == 1
    assert (tmp_path / "train.py").read_text() == TRAIN
    assert as_pre_commit("accelify-fix").returncode == 0
    assert (tmp_path / "train.py").read_text() == CONVERTED
    assert as_pre_commit("accelify").returncode == 0


def test_ci_doc_command_annotates_findings(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "ci.md").read_text()
    (command,) = set(re.findall(r"^\s*(?:- )?run: (accelify convert .*)$", doc, re.M))
    assert command == "accelify convert --check --format github ."
    (tmp_path / "amb.py").write_text(AMBIGUOUS)
    (tmp_path / "bad.py").write_text("import torch\nx = (\n")
    proc = run(*command.split()[1:], cwd=tmp_path)
    assert proc.returncode == 123
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("::warning file=./amb.py,line=12,col=16,title=accelify ACC108::")
    assert lines[2] == "::error file=./bad.py,line=2,col=5,title=accelify::cannot parse: '(' was never closed"
    assert len(lines) == 3 and "None" not in proc.stdout.decode()
