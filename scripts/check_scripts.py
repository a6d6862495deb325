"""Convert a folder of real training scripts and run each with the checks a CPU run needs.

usage: python scripts/check_scripts.py FOLDER [--only NAME ...] [--no-multi] [--json OUT] [--timeout S]

Run it with the python of an environment that has accelify, torch and accelerate (and what the
scripts import). For each ``FOLDER/*.py``, in a scratch copy of the folder:

1. convert it (``accelify.core.pipeline.convert_source``) and convert the result again: the second
   conversion must change nothing and report nothing;
2. unchanged: the row says ``refused`` with the findings' codes and first lines (read each: is the
   reason true?) or ``silent``;
3. changed: run the original and the converted script in one process through the tracing hook
   (``python -m accelify.runtime.trace``) with the device check and the side-effect record on
   (``ACCELIFY_CHECKS=device,effects``): the converted run must print the same ``step``/``eval_``
   lines as the original (the convention of ../shared/tools/equivalence.py) and break no GPU
   device rule; then the converted script on two CPU processes (``torchrun``, gloo, each rank's
   output in its own file): every rank ends, no device rule is broken, no side effect is repeated
   on every process (``accelify.runtime.checks.judge_side_effects``), and each
   process-independent ``eval_`` line (samples, correct, pred_checksum, learning rates) is printed
   once with the one-process value.

With ``--launched`` (hand-written DDP scripts, whose originals need their launcher) the original
is not run: the conversion runs in one process and in two, with the checks.

Prints one row per script and a summary; ``--json`` writes the rows. Nothing here is a test: the
table goes into docs/real-scripts.md and the session's note.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from accelify.core.pipeline import convert_source
from accelify.runtime.checks import judge_side_effects

KEEP = re.compile(r"^(step \S+ loss \S+|eval_\w+ \S+)$")
EVAL = re.compile(r"^eval_\w+ ")
# what must not depend on the number of processes: counts over the whole eval set and learning
# rates (accuracies of a model trained on two processes are another model's: printed once, that is all)
INVARIANT = re.compile(r"^eval_(samples|lr_epoch\d+|final_lr) ")
BIN = Path(sys.executable).parent


def kept(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if KEEP.match(line.strip())]


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "ACCELIFY_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", ACCELIFY_CHECKS="device,effects",
               ACCELERATE_USE_CPU="1", **extra)
    return env


def read_trace(prefix: str, rank: int) -> dict:
    """What the tracing hook recorded for one rank."""
    found: dict = {"device": None, "effects": [], "prints": [], "end": None, "steps": 0}
    path = Path(f"{prefix}.{rank}.jsonl")
    if not path.exists():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("event")
        if kind == "device" and found["device"] is None:
            found["device"] = event["message"]
        elif kind == "effect":
            found["effects"].append(event)
        elif kind == "prints":
            found["prints"] = event["counts"]
        elif kind == "end":
            found["end"] = event.get("reason")
            found["error"] = event.get("error")
        elif kind == "step":
            found["steps"] = event["steps"]
    return found


def run_one(work: Path, script: str, prefix: str, timeout: float) -> tuple[int, str, str, dict]:
    env = environment({"ACCELIFY_TRACE": str(work / prefix)})
    proc = subprocess.run([sys.executable, "-m", "accelify.runtime.trace", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, read_trace(str(work / prefix), 0)


def run_two(work: Path, script: str, timeout: float, port: int) -> tuple[int, list[str], str, list[dict]]:
    logs = work / "logs"
    env = environment({"ACCELIFY_TRACE": str(work / "two")})
    proc = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port),
                           "--log-dir", str(logs), "--redirects", "3", "-m", "accelify.runtime.trace", script],
                          cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    outs = []
    for rank in (0, 1):
        found = sorted(logs.rglob(f"*/{rank}/stdout.log"))
        outs.append(found[-1].read_text(encoding="utf-8", errors="replace") if found else "")
    errs = proc.stderr + "".join(p.read_text(errors="replace") for p in sorted(logs.rglob("stderr.log")))
    return proc.returncode, outs, errs, [read_trace(str(work / "two"), rank) for rank in (0, 1)]


def last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not line.startswith(" ")]
    return (lines[-1] if lines else "")[:200]


def check(script: Path, multi: bool, timeout: float, port: int, launched: bool = False) -> dict:
    row: dict = {"name": script.stem}
    source = script.read_text(encoding="utf-8")
    result = convert_source(source, str(script.name))
    row["findings"] = [f"{f.code} line {f.line}: {f.message.splitlines()[0][:160]}" for f in result.findings]
    if result.error is not None:
        row["status"] = "internal error" if "internal" in result.error.lower() else "error"
        row["why"] = result.error[:200]
        return row
    changed = result.output != source
    again = convert_source(result.output, str(script.name))
    # converted again: no diff, and nothing said that the first conversion did not say
    said = {(f.code, f.message) for f in result.findings}
    new = [f"{f.code} line {f.line}" for f in again.findings if (f.code, f.message) not in said]
    row["idempotent"] = again.output == result.output and not (changed and new)
    if not row["idempotent"]:
        row["idempotent_why"] = (["diff"] if again.output != result.output else []) + new
    lines = source.splitlines()
    reported = {lines[f.line - 1].strip() for f in result.findings if 0 < f.line <= len(lines)}
    if not changed:
        row["status"] = "refused" if result.findings else "silent"
        return row
    with tempfile.TemporaryDirectory() as scratch:
        # each run in a folder of its own, as a fresh checkout: what one run downloads, extracts or
        # saves must not spare the next one its own (the two processes' race on a download included)
        runs = {}
        for name in ("orig", "conv", "two"):
            folder = Path(scratch, name)
            folder.mkdir()
            for sibling in script.parent.iterdir():  # data files and sibling modules the script reads
                if sibling.is_file() and sibling.suffix != ".py":
                    shutil.copy(sibling, folder / sibling.name)
            (folder / "orig.py").write_text(source, encoding="utf-8")
            (folder / "conv.py").write_text(result.output, encoding="utf-8")
            runs[name] = folder
        if launched:  # a hand-written DDP original needs its launcher: only the conversion runs here
            rc_o, out_o, err_o = 0, "", ""
        else:
            rc_o, out_o, err_o, _ = run_one(runs["orig"], "orig.py", "orig", timeout)
        rc_c, out_c, err_c, trace_c = run_one(runs["conv"], "conv.py", "conv", timeout)
        ref, got = (kept(out_c), kept(out_c)) if launched else (kept(out_o), kept(out_c))
        row["original_ok"] = rc_o == 0
        if rc_o != 0:
            row["status"] = "original fails"
            row["why"] = last_error(err_o)
            return row
        if trace_c["device"]:
            row["status"] = "wrong"
            row["why"] = "would fail on a GPU (1 process): " + trace_c["device"]
            return row
        if rc_c != 0:
            row["status"] = "wrong"
            row["why"] = f"converted fails: {last_error(err_c)}"
            return row
        if ref != got:
            differ = sum(a != b for a, b in zip(ref, got)) + abs(len(ref) - len(got))
            row["single"] = f"{differ} of {len(ref)} lines differ"
        else:
            row["single"] = f"same {len(ref)} lines"
        row["status"] = "converted"
        if not multi:
            return row
        rc_m, outs, err_m, traces = run_two(runs["two"], "conv.py", timeout, port)
        devices = [t["device"] for t in traces if t["device"]]
        if devices:
            row["status"] = "wrong"
            row["why"] = "would fail on a GPU (2 processes): " + devices[0]
            return row
        if rc_m != 0 or any(t["end"] not in ("finished", "steps") for t in traces):
            row["status"] = "wrong"
            row["why"] = f"2 processes fail: {last_error(err_m)}"
            return row
        effects = judge_side_effects({r: t["effects"] for r, t in enumerate(traces)},
                                     {r: t["prints"] for r, t in enumerate(traces)})
        # a side effect on the line of a finding of the conversion is reported, not silent
        problems = [p for p in effects if not any(f"`{text}`" in p for text in reported if text)]
        if len(problems) < len(effects):
            row["reported"] = [p for p in effects if p not in problems]
        both = kept(outs[0]) + kept(outs[1])
        for name in dict.fromkeys(line.split()[0] for line in ref if EVAL.match(line)):
            alone = [l for l in ref if l.split()[0] == name]
            seen = [l for l in both if l.split()[0] == name]
            if len(seen) != len(alone) or (INVARIANT.match(alone[0]) and seen != alone):
                problems.append(f"{name}: one process {[l.split()[1] for l in alone]}, two {[l.split()[1] for l in seen]}")
        row["multi"] = "ok" if not problems else "; ".join(problems)
        if problems:
            row["status"] = "wrong"
            row["why"] = row["multi"]
        elif row.get("reported"):
            row["status"] = "incomplete"  # converted, with a finding naming what it left to the user
            row["why"] = "reported: " + "; ".join(row["reported"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--no-multi", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--launched", action="store_true",
                        help="hand-written DDP originals (they need their launcher): run only the conversion, "
                             "in one process and in two")
    args = parser.parse_args()
    rows = []
    for script in sorted(args.folder.glob("*.py")):
        if args.only and script.stem not in args.only:
            continue
        try:
            row = check(script, not args.no_multi, args.timeout, args.port, args.launched)
        except subprocess.TimeoutExpired:
            row = {"name": script.stem, "status": "wrong", "why": "timed out (a hang?)"}
        rows.append(row)
        detail = row.get("why") or row.get("single", "") + ("; 2 processes: " + row["multi"] if "multi" in row else "")
        if row["status"] in ("refused",):
            detail = " | ".join(row["findings"][:3])
        idem = "" if row.get("idempotent", True) else f" [NOT IDEMPOTENT: {row.get('idempotent_why')}]"
        print(f"{row['name']:40} {row['status']:15} {detail}{idem}", flush=True)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
