"""Convert every fixture and real-script folder and record what came out, to compare two versions.

usage: python scripts/snapshot.py OUT.json [FOLDER ...]        record
       python scripts/snapshot.py --compare A.json B.json      what differs

Records, per Python file (every ``*.py`` under ``fixtures/`` and under each FOLDER, ``_orig``/``orig``
copies included), the conversion's output (a hash), its findings (line, code, message) and its error,
converting each file alone as ``convert_source`` does (a project's modules are read beside it). Run it
with the version to record installed (``cd`` out of the checkout so that the installed one is
imported). Refactors must leave every record equal; a change of behaviour shows here file by file.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path


def record(out: str, folders: list[str]) -> None:
    from accelify.core.pipeline import convert_source

    root = Path(__file__).resolve().parent.parent
    rows = {}
    for base in [root / "fixtures", *map(Path, folders)]:
        for path in sorted([*base.rglob("*.py"), *_scripts_without_suffix(base)]):
            try:
                source = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            result = convert_source(source, str(path))
            rows[str(path)] = {
                "changed": result.output != source,
                "output": hashlib.sha1(result.output.encode()).hexdigest()[:12],
                "findings": [[f.line, f.code, f.message] for f in result.findings],
                "error": result.error,
                # the modules converted with it (joined, or their prints): each file's output
                "companions": {c.path: hashlib.sha1(c.output.encode()).hexdigest()[:12] for c in result.companions
                               if c.changed},
            }
    Path(out).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} files, {sum(r['changed'] for r in rows.values())} changed")


def _scripts_without_suffix(base: Path) -> list[Path]:
    """Entry scripts a ``run.sh`` starts that have no ``.py`` (CycleGAN's ``train``)."""
    found = []
    for run in base.rglob("run.sh"):
        for name in re.findall(r"python3?\s+(?:-\S+\s+)*([\w./-]+)", run.read_text(encoding="utf-8", errors="replace")):
            path = run.parent / name
            if path.suffix == "" and path.is_file():
                found.append(path)
    return found


def compare(a: str, b: str) -> int:
    old, new = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    differ = 0
    for path in sorted(set(old) | set(new)):
        x, y = old.get(path), new.get(path)
        if x == y:
            continue
        differ += 1
        print(f"== {path}")
        if x is None or y is None:
            print("   only in", a if y is None else b)
            continue
        if x["changed"] != y["changed"] or x["output"] != y["output"]:
            print(f"   output: changed {x['changed']} -> {y['changed']}, {x['output']} -> {y['output']}")
        if x.get("companions", {}) != y.get("companions", {}):
            print(f"   companions: {x.get('companions', {})} -> {y.get('companions', {})}")
        if x["error"] != y["error"]:
            print(f"   error: {x['error']} -> {y['error']}")
        gone = [f for f in x["findings"] if f not in y["findings"]]
        added = [f for f in y["findings"] if f not in x["findings"]]
        for line, code, message in gone:
            print(f"   - {line} {code} {message[:160]}")
        for line, code, message in added:
            print(f"   + {line} {code} {message[:160]}")
    print(f"{differ} of {len(set(old) | set(new))} files differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    record(sys.argv[1], sys.argv[2:])
