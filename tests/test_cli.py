"""The CLI contract, through the real entry point in a subprocess."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, drain

TRAIN = (FIXTURES / "docs" / "before.py").read_text()
CONVERTED = (FIXTURES / "docs" / "after.py").read_text()


def run(*args: str, cwd: Path, stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "accelify", *args],
        cwd=cwd, input=stdin, capture_output=True, timeout=120, env={**os.environ, **(env or {})},
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "plain.py").write_text("import os\n\nprint(os.getcwd())\n")
    return tmp_path


def test_default_prints_diff_and_writes_nothing(project: Path) -> None:
    proc = run("convert", "train.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("--- a/train.py\n+++ b/train.py\n@@ ")
    assert "+from accelerate import Accelerator\n" in out
    assert "-        loss.backward()\n" in out
    assert "\x1b[" not in out  # not a terminal: no colour
    assert (project / "train.py").read_text() == TRAIN
    assert b"1 file would be converted" in proc.stderr


def test_diff_applies_with_patch(project: Path) -> None:
    diff = run("convert", "train.py", cwd=project).stdout
    subprocess.run(["patch", "-p1", "-s"], cwd=project, input=diff, check=True)
    assert (project / "train.py").read_text() == CONVERTED


def test_diff_headers_are_normalised_paths_git_apply_accepts(project: Path) -> None:
    """Issue 25: `convert .` named files `a/./train.py`, which `git apply` refuses."""
    (project / "sub").mkdir()
    (project / "sub" / "x.py").write_text(TRAIN)

    def headers(*args: str, cwd: Path = project) -> list[str]:
        diff = run("convert", *args, cwd=cwd).stdout.decode()
        return [line for line in diff.splitlines() if line.startswith(("--- ", "+++ "))]

    assert headers(".") == ["--- a/train.py", "+++ b/train.py", "--- a/sub/x.py", "+++ b/sub/x.py"]
    assert headers("./train.py") == headers("sub/../train.py") == ["--- a/train.py", "+++ b/train.py"]
    assert headers("./sub//x.py") == ["--- a/sub/x.py", "+++ b/sub/x.py"]
    # outside the current directory: the absolute path from the root, as before (patch -p1 from /)
    rooted = str(project / "train.py").lstrip("/")
    assert headers(str(project / "train.py")) == headers("../train.py", cwd=project / "sub") == [
        f"--- a/{rooted}", f"+++ b/{rooted}"]
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    diff = run("convert", ".", cwd=project).stdout
    subprocess.run(["git", "apply", "--check", "-"], cwd=project, input=diff, check=True, capture_output=True)
    subprocess.run(["git", "apply", "-"], cwd=project, input=diff, check=True, capture_output=True)
    assert (project / "train.py").read_text() == (project / "sub" / "x.py").read_text() == CONVERTED


def test_color_only_when_asked(project: Path) -> None:
    proc = run("convert", "--color", "train.py", cwd=project)
    assert "\x1b[" in proc.stdout.decode()


def test_in_place_then_check_is_clean(project: Path) -> None:
    proc = run("convert", "--in-place", "train.py", "plain.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b""
    assert (project / "train.py").read_text() == CONVERTED
    assert (project / "plain.py").read_text() == "import os\n\nprint(os.getcwd())\n"
    assert [p.name for p in project.iterdir() if p.name.startswith(".")] == []  # no temp file left
    again = run("convert", "--check", ".", cwd=project)
    assert again.returncode == 0, again.stderr


def test_check_exits_1_and_writes_nothing(project: Path) -> None:
    proc = run("convert", "--check", str(project), cwd=project)
    assert proc.returncode == 1
    assert proc.stdout == b""
    assert (project / "train.py").read_text() == TRAIN
    with_diff = run("convert", "--check", "--diff", "train.py", cwd=project)
    assert with_diff.returncode == 1 and with_diff.stdout.startswith(b"--- a/train.py")


def test_stdin_and_output_to_stdout(project: Path) -> None:
    proc = run("convert", "-", "-o", "-", cwd=project, stdin=TRAIN.encode())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == CONVERTED


def test_stdin_default_is_a_diff(project: Path) -> None:
    proc = run("convert", "-", cwd=project, stdin=TRAIN.encode())
    assert proc.stdout.startswith(b"--- a/stdin\n+++ b/stdin\n")


def test_output_file(project: Path) -> None:
    proc = run("convert", "train.py", "-o", "train_accel.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert (project / "train_accel.py").read_text() == CONVERTED
    assert (project / "train.py").read_text() == TRAIN
    # a new file gets the mode every new file gets (the umask's), not the temporary file's 0600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((project / "train_accel.py").stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize(
    "args",
    [
        ("convert",),
        ("convert", "--in-place", "--check", "train.py"),
        ("convert", "--in-place", "-"),
        ("convert", "-o", "x.py", "train.py", "plain.py"),
        ("convert", "--in-place", "-o", "x.py", "train.py"),
        ("rules", "ACC999"),
        ("convert", "--no-such-flag", "train.py"),
    ],
)
def test_usage_errors_exit_2(project: Path, args: tuple[str, ...]) -> None:
    proc = run(*args, cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert (project / "train.py").read_text() == TRAIN


def test_syntax_error_exit_123_names_line_and_others_still_processed(project: Path) -> None:
    broken = "import torch\n\ndef f(:\n    pass\n"
    (project / "broken.py").write_text(broken)
    proc = run("convert", "--in-place", "broken.py", "train.py", cwd=project)
    assert proc.returncode == 123
    assert b"broken.py:3:" in proc.stderr
    assert (project / "broken.py").read_text() == broken
    assert (project / "train.py").read_text() == CONVERTED


def test_error_beats_check(project: Path) -> None:
    (project / "broken.py").write_text("x = (\n")
    proc = run("convert", "--check", "broken.py", "train.py", cwd=project)
    assert proc.returncode == 123


@pytest.mark.parametrize("mode", [(), ("--check",), ("--in-place",), ("--format", "json")])
def test_a_path_that_does_not_exist_is_a_usage_error_exit_2(project: Path, mode: tuple[str, ...]) -> None:
    """Issue 25: as black and ruff, exit 2 naming the path, and nothing converted (it was 123)."""
    proc = run("convert", *mode, "nope.py", "train.py", "gone/x.py", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.decode().splitlines() == ["Usage error: nope.py: no such file or directory.",
                                                 "Usage error: gone/x.py: no such file or directory."]
    assert proc.stdout == b""
    assert (project / "train.py").read_text() == TRAIN


def test_crlf_is_kept(project: Path) -> None:
    crlf = TRAIN.replace("\n", "\r\n").encode()
    (project / "train.py").write_bytes(crlf)
    proc = run("convert", "--in-place", "train.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    data = (project / "train.py").read_bytes()
    assert data.count(b"\r\n") == data.count(b"\n")
    assert data.decode().replace("\r\n", "\n") == CONVERTED
    assert b"accelerator = Accelerator()\r\n" in data


def test_encoding_and_bom_are_kept(project: Path) -> None:
    latin = "# -*- coding: latin-1 -*-\n# Entraînement\n" + TRAIN
    (project / "train.py").write_bytes(latin.encode("latin-1"))
    (project / "bom.py").write_bytes(b"\xef\xbb\xbf" + TRAIN.encode())
    proc = run("convert", "--in-place", "train.py", "bom.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = (project / "train.py").read_bytes()
    assert "# Entraînement\n".encode("latin-1") in out and b"accelerator.backward(loss)" in out
    assert (project / "bom.py").read_bytes().startswith(b"\xef\xbb\xbf")


def test_file_mode_is_kept(project: Path) -> None:
    target = project / "train.py"
    target.chmod(0o755)
    proc = run("convert", "--in-place", "train.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == CONVERTED  # it was rewritten...
    assert target.stat().st_mode & 0o777 == 0o755  # ...and kept its mode


def test_rules_lists_every_code_and_shows_examples(project: Path) -> None:
    proc = run("rules", cwd=project)
    listed = [line.split()[0] for line in proc.stdout.decode().splitlines()]
    from accelify.codemods import by_code

    assert listed[: len(by_code())] == sorted(by_code()) and listed[:2] == ["ACC001", "ACC002"]
    one = run("rules", "acc005", cwd=project).stdout.decode()
    assert "Before:" in one and "accelerator.backward(loss)" in one


def test_version(project: Path) -> None:
    from accelify import __version__

    assert run("--version", cwd=project).stdout.decode().strip() == f"accelify {__version__}"


def test_converter_never_imports_torch(project: Path) -> None:
    code = (
        "import sys\n"
        "from accelify.app.cli import app\n"
        "try:\n"
        "    app(['convert', 'train.py'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules and 'accelerate' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, timeout=120)
    assert proc.stdout.decode().strip().endswith("ok"), proc.stderr
    importtime = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "accelify", "--help"], cwd=project, capture_output=True, timeout=120
    )
    assert importtime.returncode == 0
    assert b"torch" not in importtime.stderr


def test_check_is_clean_on_every_converted_fixture(project: Path) -> None:
    outputs = sorted(str(p) for p in FIXTURES.glob("*/after.py")) + [str(FIXTURES / "noop")]
    proc = run("convert", "--check", *outputs, cwd=project)
    assert proc.returncode == 0, proc.stderr


AMBIGUOUS = (FIXTURES / "ambiguous_placement" / "before.py").read_text()


@pytest.fixture
def ambiguous(tmp_path: Path) -> Path:
    (tmp_path / "amb.py").write_text(AMBIGUOUS)
    return tmp_path


def test_findings_on_stderr_with_file_line_code_and_suggestion(ambiguous: Path) -> None:
    proc = run("convert", "amb.py", cwd=ambiguous)
    err = proc.stderr.decode()
    assert "amb.py:12:16: ACC108 `.to(mirror_device)`" in err and "Suggestion:" in err
    assert "amb.py:17:1: ACC108" in err
    assert err.strip().endswith("1 file would be converted, 0 unchanged, 2 findings.")
    assert b"ACC108" not in proc.stdout  # stdout carries only the diff


def test_format_json(ambiguous: Path) -> None:
    import json

    proc = run("convert", "--format", "json", "amb.py", cwd=ambiguous)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (entry,) = doc["files"]
    assert entry["path"] == "amb.py" and entry["status"] == "changed"
    assert [f["code"] for f in entry["findings"]] == ["ACC108", "ACC108"]
    assert {c["code"] for c in entry["changes"]} >= {"ACC001", "ACC003", "ACC004", "ACC005"}
    assert entry["diff"].startswith("--- a/amb.py")
    assert (ambiguous / "amb.py").read_text() == AMBIGUOUS


def test_format_github(ambiguous: Path) -> None:
    (ambiguous / "bad.py").write_text("x = (\n")
    proc = run("convert", "--format", "github", "amb.py", "bad.py", cwd=ambiguous)
    assert proc.returncode == 123
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("::warning file=amb.py,line=12,col=16,title=accelify ACC108::`.to(mirror_device)`")
    # the error's position goes where GitHub puts it on the file; the message does not repeat the path
    assert "::error file=bad.py,line=1,col=5,title=accelify::cannot parse: '(' was never closed" in lines
    assert not any(line.startswith(("---", "+++")) for line in lines)


def test_select_and_ignore(ambiguous: Path) -> None:
    only_findings = run("convert", "--select", "ACC1", "amb.py", cwd=ambiguous)
    assert only_findings.returncode == 0 and only_findings.stdout == b""  # report only: nothing changes
    assert only_findings.stderr.count(b"ACC108") == 2
    ignored = run("convert", "--ignore", "ACC108", "amb.py", cwd=ambiguous)
    assert b"ACC108" not in ignored.stderr and b"+from accelerate import Accelerator" in ignored.stdout
    backward_only = run("convert", "--select", "ACC001,ACC005", "-o", "-", "amb.py", cwd=ambiguous)
    out = backward_only.stdout.decode()
    assert "accelerator.backward(loss)" in out and "accelerator.prepare(" not in out and '.to("cuda")' in out
    missing = run("convert", "--select", "ACC003", "amb.py", cwd=ambiguous)
    assert missing.returncode == 2 and b"ACC003 needs ACC001, ACC004" in missing.stderr
    unknown = run("convert", "--ignore", "ACC9", "amb.py", cwd=ambiguous)
    assert unknown.returncode == 2


def test_suppression_comments(ambiguous: Path) -> None:
    (ambiguous / "skip.py").write_text("#!/usr/bin/env python\n# accelify: skip\n" + AMBIGUOUS)
    skipped = run("convert", "skip.py", cwd=ambiguous)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout == b"" and b"ACC108" not in skipped.stderr
    assert skipped.stderr.strip() == b"0 files would be converted, 1 unchanged."
    (ambiguous / "ign.py").write_text(AMBIGUOUS.replace("model.cpu()\n", "model.cpu()  # accelify: ignore[ACC108]\n"))
    ignored = run("convert", "ign.py", cwd=ambiguous)
    assert ignored.stderr.count(b"ACC108") == 1 and b"ign.py:12:16" in ignored.stderr


def test_rules_lists_findings_too(project: Path) -> None:
    from accelify.output.findings import FINDINGS

    listed = run("rules", cwd=project).stdout.decode()
    for code in FINDINGS:
        assert f"{code}  finding" in listed
    assert run("rules", "acc104", cwd=project).stdout.decode().startswith("ACC104 (finding):")


def _rules_listing() -> list[tuple[str, str, str]]:
    """(code, the line `accelify rules` prints for it, its description) in the printed order."""
    from typer.testing import CliRunner

    from accelify.app.cli import app
    from accelify.codemods import by_code
    from accelify.output.findings import FINDINGS

    described = {code: cls.DESCRIPTION for code, cls in by_code().items()} | dict(FINDINGS)
    result = CliRunner().invoke(app, ["rules"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    return [(line.split()[0], line, described[line.split()[0]]) for line in lines]


def _code_number(code: str) -> int:
    return int(code[len("ACC"):])


def test_rules_lists_codes_in_numeric_order(monkeypatch) -> None:
    """Codes come in numeric order, whatever the order of the table they are kept in (ACC129
    was listed after ACC134, where it was added to FINDINGS)."""
    import accelify.output.findings

    shuffled = dict(reversed(list(accelify.output.findings.FINDINGS.items())))
    monkeypatch.setattr(accelify.output.findings, "FINDINGS", shuffled)
    listed = [code for code, _, _ in _rules_listing()]
    assert listed == sorted(listed, key=_code_number)
    assert listed.index("ACC129") == listed.index("ACC128") + 1


def test_rules_aligns_descriptions_after_the_longest_name(monkeypatch) -> None:
    """Every description starts in the same column, one past the longest name (names longer than
    18 characters pushed theirs to the right)."""
    from accelify.codemods import by_code

    monkeypatch.setattr(by_code()["ACC005"], "NAME", "a-name-longer-than-any-real-one")
    listing = _rules_listing()
    columns = {len(line) - len(text) for _, line, text in listing}
    assert all(line.endswith(text) for _, line, text in listing)
    assert len(columns) == 1, columns
    backward = next(line for code, line, _ in listing if code == "ACC005")
    assert backward.startswith("ACC005  a-name-longer-than-any-real-one Rewrite")


# ---------------------------------------------------------------- every claim about the CLI (README, docs/usage.md)


def test_directory_search_skips_tool_folders(project: Path) -> None:
    import json

    for folder in (".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", ".hidden"):
        (project / folder).mkdir()
        (project / folder / "train.py").write_text(TRAIN)
    (project / "src").mkdir()
    (project / "src" / "train.py").write_text(TRAIN)
    proc = run("convert", "--format", "json", ".", cwd=project)
    assert proc.returncode == 0, proc.stderr
    seen = sorted(entry["path"] for entry in json.loads(proc.stdout)["files"])
    assert seen == ["./plain.py", "./src/train.py", "./train.py"]


def test_quiet_prints_no_summary(project: Path) -> None:
    loud = run("convert", "train.py", cwd=project)
    assert b"1 file would be converted" in loud.stderr
    quiet = run("convert", "-q", "train.py", cwd=project)
    assert quiet.returncode == 0 and quiet.stderr == b""
    assert quiet.stdout == loud.stdout


def test_line_length_shapes_inserted_code(project: Path) -> None:
    one_line = "train_dataloader, eval_dataloader, model, optimizer = accelerator.prepare(train_dataloader, "
    default = run("convert", "-o", "-", "train.py", cwd=project).stdout.decode()
    assert one_line not in default  # 88 columns: the docs' three-line layout
    wide = run("convert", "--line-length", "160", "-o", "-", "train.py", cwd=project).stdout.decode()
    assert one_line in wide
    assert run("convert", "--line-length", "5", "train.py", cwd=project).returncode == 2


def test_target_runtime_imports_from_accelify_runtime(project: Path) -> None:
    """`--target runtime`: the same conversion, its import from accelify.runtime; anything else
    than accelerate/runtime is a usage error."""
    default = run("convert", "-o", "-", "train.py", cwd=project).stdout.decode()
    runtime = run("convert", "--target", "runtime", "-o", "-", "train.py", cwd=project).stdout.decode()
    assert default == CONVERTED
    assert runtime == CONVERTED.replace("from accelerate import Accelerator", "from accelify.runtime import Accelerator")
    assert run("convert", "--target", "runtime", "--check", "-", cwd=project, stdin=runtime.encode()).returncode == 0
    bad = run("convert", "--target", "jax", "train.py", cwd=project)
    assert bad.returncode == 2 and b"--target" in bad.stderr


def _on_a_terminal(*args: str, cwd: Path) -> bytes:
    """stdout of the CLI when stdout is a terminal (a pseudo-terminal)."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "accelify", *args], cwd=cwd, stdout=follower,
                              stderr=subprocess.PIPE, timeout=120)
        os.close(follower)
        follower = -1
        shown = drain(leader)
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return shown


def test_color_on_a_terminal_unless_no_color(project: Path) -> None:
    coloured = _on_a_terminal("convert", "train.py", cwd=project)
    assert b"\x1b[" in coloured and b"accelerator.prepare(" in coloured
    plain = _on_a_terminal("convert", "--no-color", "train.py", cwd=project)
    assert b"\x1b[" not in plain and b"accelerator.prepare(" in plain


def test_no_diff_prints_nothing_but_the_summary(project: Path) -> None:
    proc = run("convert", "--no-diff", "train.py", cwd=project)
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"1 file would be converted" in proc.stderr
    assert (project / "train.py").read_text() == TRAIN


@pytest.mark.parametrize("failure", ["does not parse", "undefined"])
def test_rewrite_failing_a_safety_check_exits_123_and_writes_nothing(project: Path, monkeypatch, failure: str) -> None:
    """The pipeline's last checks (the output compiles, reads no name the input did not) refuse a
    rewrite: the CLI says so, exits 123, writes nothing and still converts the other files."""
    from typer.testing import CliRunner

    import accelify.core.pipeline as pipeline
    from accelify.app.cli import app

    if failure == "does not parse":
        monkeypatch.setattr(pipeline, "_still_parses", lambda source, output: "Accelerator" not in output)
    else:
        real = pipeline.undefined_names
        monkeypatch.setattr(pipeline, "undefined_names",
                            lambda code: real(code) | ({"ghost"} if "accelerator" in code else set()))
    (project / "other.py").write_text(TRAIN)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["convert", "--in-place", "train.py"])
    assert result.exit_code == 123, result.output
    assert "internal error" in result.output and failure in result.output
    assert (project / "train.py").read_text() == TRAIN


def test_readme_command_one_converts_the_shipped_example(root: Path) -> None:
    """README's first command, after its install: the diff of examples/train.py."""
    readme = (root / "README.md").read_text()
    command = "pip install . && accelify convert examples/train.py"
    assert command in readme
    proc = run(*command.split(" && ")[1].split()[1:], cwd=root)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("--- a/examples/train.py\n+++ b/examples/train.py\n")
    assert "+from accelerate import Accelerator\n" in out and "+accelerator = Accelerator()" in out
    assert "accelerator.prepare(" in out and "+        accelerator.backward(loss)\n" in out
    assert b"1 file would be converted" in proc.stderr


def test_github_error_positions() -> None:
    from accelify.output.report import _error_position

    assert _error_position("a/b.py", "a/b.py:3:7: cannot parse: x") == (3, 7, "cannot parse: x")
    assert _error_position("a/b.py", "a/b.py:3: bad") == (3, None, "bad")
    assert _error_position("a/b.py", "a/b.py: internal error, file left unchanged: E()") == (
        None, None, "internal error, file left unchanged: E()")
    assert _error_position("a:1.py", "a:1.py:2:1: cannot parse: y") == (2, 1, "cannot parse: y")
    assert _error_position("a.py", "cannot read b.py") == (None, None, "cannot read b.py")


def test_a_converted_distributed_script_says_how_to_launch_it(project: Path) -> None:
    (project / "ddp.py").write_text((FIXTURES / "ddp_module_level" / "before.py").read_text())
    proc = run("convert", "--in-place", "ddp.py", "train.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert "converted ddp.py\n  run it with `accelerate launch --num_processes N ddp.py`" in err
    assert "accelerate launch --num_processes N train.py" not in err  # a plain script: no launcher hint
