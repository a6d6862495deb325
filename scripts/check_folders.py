"""Convert and verify real training projects laid out one folder each, with a ``run.sh``.

usage: python scripts/check_folders.py ROOT [--only NAME ...] [--steps N] [--timeout S] [--json OUT]

Run it with the python of an environment that has accelify, torch, accelerate and what the
projects import. Each ``ROOT/<name>/run.sh`` prepares the project's tiny data, then runs its
entry script with ``python <script> <args>`` (the last such line not under ``../_tools``). In a
scratch copy of the folder:

1. the preparation lines of ``run.sh`` run (everything before the entry line);
2. the entry script is converted (``accelify.core.pipeline.convert_source``) and converted again:
   the second conversion must change nothing;
3. unchanged: the row says ``refused`` with every finding (read each: is it true?);
4. changed: ``accelify verify <script> --processes 2 -- <args>``, in a shell that runs the
   preparation lines first (their exports and background servers are there, as for the entry
   line of ``run.sh``), runs the original and the
   conversion in one process (the losses passed to backward must be the same) and the conversion
   on two CPU processes, with the GPU device rules and the per-process side effects checked.

Prints one row per project; ``--json`` writes the rows. Nothing here is a test: the table goes into
docs/real-scripts.md and the session's note.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from accelify.core.pipeline import convert_source

_PYTHON = re.compile(r"^(?:cd\s+(?P<cd>\S+)\s*&&\s*)?(?P<env>(?:[A-Z_]+=\S+\s+)*)\S*python3?\s+"
                     r"(?P<script>[^\s-]\S*)(?P<args>.*)$")


def entry(run_sh: str) -> tuple[list[str], dict[str, str], str, list[str]] | None:
    """(preparation lines, environment, script, arguments) of a ``run.sh``; None without an entry."""
    lines = run_sh.splitlines()
    found = None
    for i, line in enumerate(lines):
        match = _PYTHON.match(line.strip())
        if match and not match["script"].startswith(("../_tools", "-c")):
            found = i, match
    if found is None:
        return None
    i, match = found
    env = dict(part.split("=", 1) for part in match["env"].split())
    script = os.path.join(match["cd"], match["script"]) if match["cd"] else match["script"]  # `cd src && python train.py`
    return lines[:i], env, script, shlex.split(match["args"])


def _enters_its_folder(run_sh: str) -> bool:
    """Does the entry line of ``run_sh`` ``cd`` into the script's folder first (``cd src && python train.py``)?"""
    lines = [line for line in run_sh.splitlines() if _PYTHON.match(line.strip())
             and not _PYTHON.match(line.strip())["script"].startswith(("../_tools", "-c"))]
    return bool(lines) and bool(_PYTHON.match(lines[-1].strip())["cd"])


def check(folder: Path, steps: int, timeout: float) -> dict:
    row: dict = {"name": folder.name}
    run_sh = (folder / "run.sh").read_text()
    parsed = entry(run_sh)
    if parsed is None:
        return {**row, "result": "no entry"}
    prep, env, script, args = parsed
    row["script"] = script
    with tempfile.TemporaryDirectory(prefix=f"accelify-check-{folder.name}-") as tmp:
        work = Path(tmp) / folder.name
        shutil.copytree(folder, work, symlinks=True)
        tools = folder.parent / "_tools"
        if tools.exists():
            shutil.copytree(tools, Path(tmp) / "_tools", symlinks=True)
        environ = {**os.environ, **env, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        if prep:  # its data only: the run itself comes after the conversion, in the same shell (below)
            subprocess.run(["bash", "-c", "\n".join(prep)], cwd=work, env=environ, capture_output=True,
                           timeout=timeout)
        source = (work / script).read_text(encoding="utf-8")
        result = convert_source(source, str(work / script))  # its local modules are read beside it
        row["findings"] = [f"{f.line}:{f.code} {f.message}" for f in result.findings] + [
            f"{os.path.relpath(c.path, work)}:{f.line}:{f.code} {f.message}" for c in result.companions for f in c.findings]
        if result.error:
            return {**row, "result": "error", "error": result.error}
        if not result.changed:
            return {**row, "result": "refused" if row["findings"] else "silent"}
        row["companions"] = [os.path.relpath(c.path, work) for c in result.companions if c.changed]
        if row["companions"]:  # converted with modules beside it: converted again where they are converted too
            twice = Path(tmp) / "twice"
            shutil.copytree(work, twice, symlinks=True)
            for companion in result.companions:
                (twice / os.path.relpath(companion.path, work)).write_text(companion.output, encoding="utf-8")
            again = convert_source(result.output, str(twice / script))
        else:
            again = convert_source(result.output, str(work / script))
        if again.changed or any(c.changed for c in again.companions):
            return {**row, "result": "not idempotent"}
        # from where run.sh runs it: `cd src && python train.py` in src, `python examples/x.py` from the folder
        folder_of, name = os.path.split(script) if _enters_its_folder(run_sh) else ("", script)
        verify = [str(Path(sys.executable).parent / "accelify"), "verify", name, "--steps", str(steps),
                  "--processes", "2", "--timeout", str(timeout), "--", *args]
        # in a shell that runs run.sh's preparation again first, as run.sh runs its entry line: what it
        # exports and the servers it starts for the run (cyclegan's Visdom, stopped by its trap) are there
        shell = "\n".join([*prep, (f"cd {shlex.quote(folder_of)} && " if folder_of else "") + shlex.join(verify)])
        proc = subprocess.run(["bash", "-c", shell], cwd=work, env=environ, capture_output=True, text=True,
                              timeout=4 * timeout)
        row["verdict"] = next((line for line in proc.stdout.splitlines()[::-1] if line.strip()), "")
        row["two"] = next((line for line in proc.stdout.splitlines() if line.startswith("2 processes")), "")
        row["exit"] = proc.returncode
        row["result"] = "verified" if proc.returncode == 0 else "failed"
        if proc.returncode == 0 and "identical-read-ahead" in proc.stdout:
            row["result"] = "verified, read-ahead"  # the same losses as the original reading its loaders ahead
        if proc.returncode:
            row["tail"] = (proc.stdout + proc.stderr)[-1500:]
        return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    rows = []
    for folder in sorted(p for p in options.root.iterdir() if (p / "run.sh").exists()):
        if options.only and folder.name not in options.only:
            continue
        try:
            row = check(folder, options.steps, options.timeout)
        except subprocess.TimeoutExpired:
            row = {"name": folder.name, "result": "timeout"}
        rows.append(row)
        print(f"{row['name']:<24} {row['result']:<10} {row.get('two', '')} "
              + "; ".join(f[:140] for f in row.get("findings", [])), flush=True)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["result"]] = counts.get(row["result"], 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
