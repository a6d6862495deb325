"""Conversion speed and memory of the ``accelify`` command, against LibCST baselines.

    python scripts/benchmark.py [--repeat N] [--quick] [--keep] [--timeout SECONDS]

Every measured case runs in a fresh subprocess (start-up and imports count, as a
user sees them); each number is the median wall-clock time of ``--repeat`` runs
(default 5), the accelify and reference runs interleaved so that load from other
jobs hits both alike. ``--quick`` is a smoke run: one repeat, growth points 0
and 500 only.

Cases (targets are printed, not asserted):

1. ``accelify convert --check F`` on a 50-line module that trains nothing, vs
   ``python -c "import libcst"``.                                 ratio <= 0.5
2. ``accelify convert F`` (diff to /dev/null) on the ~100-line training script
   of the repository, vs parse + ScopeProvider + QualifiedNameProvider + code.
                                                                  ratio <= 1.5
3. The same with 500 generated helper functions appended (~3.1k lines), and a
   growth series over 0/250/500/1000 helpers.                    ratio <= 1.5
4. ``accelify convert --check -j 1 DIR`` over a copy of the installed
   accelerate package (the issue's case), vs a sequential bare
   ``libcst.parse_module(text).code`` of the same files: throughput.
                                                     ratio >= 2.0 (issue 25)
   4c. The same directory plus the project fixtures' ``before/`` folders (scripts
   converted with the modules beside them): throughput, reported (no target).
   4b. The same directory plus the fixtures' ``before.py`` (81 training
   scripts, each fully analysed): throughput, reported (no target).
5. ``-j <all cores>`` vs ``-j 1`` on each directory: speed-up.   >= 1.7 (2 cores)
   Beside it, what the machine gives perfectly parallel work: the bare parse of
   the directory split in two halves run at once, vs both halves one after the
   other (two cores of a shared host are not twice one core).
7. A repository (issue 28): the ``five_modules`` project's model, data and utils modules,
   each padded with 300 helper functions (~1.9k lines), and K entry scripts that import them
   and train (K = 1, 2, 4, 8): ``accelify convert --check -j 1 DIR``. The cost of an added
   entry script, against the modules' parse + scope + qualified names once: the modules
   are read once for all the scripts of their folder, so an added script costs its own
   conversion, not the modules' again.            slope per entry < modules' reading
6. Peak RSS (``wait4`` of the child: the largest process of its tree) of the
   directory run and of the 3.1k-line conversion. Linux counts the image a child
   was forked from, so the harness imports nothing heavy (not even accelerate)
   and prints its own peak as the floor.

``--only 1,2,4,7`` runs those cases (2 is 2 and 3; 4 is 4, 4b, 4c and 5).

Exit status 1 of ``--check`` (a file would change) is success; 2, 123, any
other status or a traceback is reported with the child's stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TIMEOUT = 3600.0  # seconds for one child (--timeout): a hung run must not hang the benchmark

# ---------------------------------------------------------------------------
# Running children


@dataclass
class Run:
    seconds: float
    max_rss_kib: int
    status: int  # exit code, or -signal
    stderr: str


@dataclass
class Measure:
    """Repeated runs of one command line."""

    label: str
    argv: list[str]
    ok_status: tuple[int, ...]
    runs: list[Run] = field(default_factory=list)
    #: commands started at once with ``argv`` (one run lasts until the last ends)
    beside: list[list[str]] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def max_rss_mib(self) -> float:
        return max(r.max_rss_kib for r in self.runs) / 1024

    def failed(self, run: Run) -> bool:
        return run.status not in self.ok_status or "Traceback (most recent call last)" in run.stderr

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not any(self.failed(r) for r in self.runs)

    def describe(self) -> str:
        times = ", ".join(f"{r.seconds * 1000:.0f}" for r in self.runs)
        statuses = sorted({r.status for r in self.runs})
        return (f"median {fmt_seconds(self.median)}, min {fmt_seconds(min(r.seconds for r in self.runs))}; "
                f"runs [{times}] ms; exit {statuses}; max RSS {self.max_rss_mib:.0f} MiB")


def run_child(argv: Sequence[str], stdout_path: Optional[str] = None) -> Run:
    """Run ``argv`` once: wall time from spawn to reap, and the child's own rusage via ``wait4``."""
    return run_together([argv], stdout_path)


def run_together(argvs: Sequence[Sequence[str]], stdout_path: Optional[str] = None) -> Run:
    """Start every command at once (the first one's stdout to ``stdout_path``, if given); the run
    lasts until the last one ends: the worst status, the largest RSS, every stderr."""
    stdout = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    errs = [tempfile.TemporaryFile() for _ in argvs]
    start = time.perf_counter()
    # own sessions: a timeout kills a whole group (workers of -j included)
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=stdout if i == 0 else subprocess.DEVNULL,
                              stderr=e, start_new_session=True)
             for i, (a, e) in enumerate(zip(argvs, errs))]
    timers = [threading.Timer(TIMEOUT, _kill_group, (p.pid,)) for p in procs]
    for t in timers:
        t.start()
    statuses, rss = [], 0
    try:
        for proc in procs:
            _, wait_status, usage = os.wait4(proc.pid, 0)
            proc.returncode = status = os.waitstatus_to_exitcode(wait_status)  # reaped by hand
            statuses.append(status)
            rss = max(rss, usage.ru_maxrss)  # KiB on Linux
    finally:
        elapsed = time.perf_counter() - start
        for t in timers:
            t.cancel()
        if stdout is not subprocess.DEVNULL:
            stdout.close()
    text = ""
    for e in errs:
        e.seek(0)
        text += e.read().decode("utf-8", "replace")
        e.close()
    return Run(elapsed, rss, next((st for st in statuses if st != 0), 0), text)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def measure(pairs: Sequence[Measure], repeat: int) -> None:
    """``repeat`` rounds, each running every command once (interleaved: load hits all alike)."""
    for _ in range(repeat):
        for m in pairs:
            run = run_together([m.argv, *m.beside])
            m.runs.append(run)
            if m.failed(run):
                report_failure(m, run)


_reported: set[tuple[str, int]] = set()


def report_failure(m: Measure, run: Run) -> None:
    key = (m.label, run.status)
    if key in _reported:
        return
    _reported.add(key)
    killed = " (killed: --timeout)" if run.status == -signal.SIGKILL else ""
    print(f"\n!! {m.label}: exit status {run.status}{killed}\n   command: {shlex.join(m.argv)}", flush=True)
    lines = run.stderr.rstrip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    if errors and "Traceback" not in run.stderr:
        for message, paths in group_errors(errors).items():
            print(f"   | {len(paths)} file(s): {message}")
    else:
        for line in lines[-60:]:
            print(f"   | {line}")
    print(flush=True)


def group_errors(lines: list[str], strip: str = "") -> dict[str, list[str]]:
    """``error: PATH: message`` lines grouped by message: {message: [paths]}."""
    groups: dict[str, list[str]] = {}
    for line in lines:
        rest = line[len("error:"):].strip()
        match = re.match(r"(\S+?\.py)(:\d+(?::\d+)?)?: (.*)", rest)
        path, message = (match.group(1) + (match.group(2) or ""), match.group(3)) if match else ("?", rest)
        if strip and path.startswith(strip):
            path = path[len(strip):].lstrip("/")
        groups.setdefault(message, []).append(path)
    return groups


def fmt_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Inputs

PLAIN_MODULE = '''"""Plain configuration helpers: no training in here."""
import json
import os
from dataclasses import dataclass, field


@dataclass
class Settings:
    name: str
    retries: int = 3
    tags: list = field(default_factory=list)

    def describe(self):
        return f"{self.name} ({self.retries} retries, {len(self.tags)} tags)"


def load(path):
    with open(path) as handle:
        raw = json.load(handle)
    return Settings(raw["name"], raw.get("retries", 3), raw.get("tags", []))


def save(settings, path):
    data = {"name": settings.name, "retries": settings.retries, "tags": settings.tags}
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def merge(first, second):
    tags = sorted(set(first.tags) | set(second.tags))
    return Settings(second.name or first.name, max(first.retries, second.retries), tags)


def from_environ(prefix="APP_"):
    values = {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
    retries = int(values.get("retries", "3"))
    return Settings(values.get("name", "default"), retries, values.get("tags", "").split(","))


if __name__ == "__main__":
    import sys

    for argument in sys.argv[1:]:
        print(load(argument).describe())
    if len(sys.argv) == 1:
        print(from_environ().describe())
    sys.exit(0)
'''

_HELPERS = (
    "def helper_{i}(x, y):\n"
    "    z = x + y * {i}\n"
    "    if z > {a}:\n"
    "        return [k for k in range(z)]\n"
    "    return z\n",
    "def helper_{i}(items, scale={a}):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total += item * scale - {i}\n"
    "    return total\n",
    "def helper_{i}(text, limit={a}):\n"
    "    parts = text.split(\"_{i}\")\n"
    "    while len(parts) > limit:\n"
    "        parts.pop()\n"
    "    return \"-\".join(parts)\n",
    "def helper_{i}(mapping, key=\"k{i}\"):\n"
    "    try:\n"
    "        return mapping[key] * {a}\n"
    "    except KeyError:\n"
    "        return None\n",
    "def helper_{i}(path, size=None):\n"
    "    size = size if size is not None else {i}\n"
    "    with open(path) as handle:\n"
    "        data = handle.read()[:size]\n"
    "    return {{\"id\": {i}, \"data\": data, \"n\": {a}}}\n",
    "def helper_{i}(values, *, key=lambda v: v % {a}):\n"
    "    grouped = {{}}\n"
    "    for value in sorted(values, key=key):\n"
    "        grouped.setdefault(key(value), []).append(value + {i})\n"
    "    return grouped\n",
)


def helpers(count: int) -> str:
    """``count`` small module-level functions (5 lines each, plus a blank line), varied bodies."""
    return "".join("\n" + _HELPERS[i % len(_HELPERS)].format(i=i, a=i % 7 + 2) for i in range(count))


#: The issue's "100-line training script", fixed so that numbers compare across sessions (a new fixture
#: of about 100 lines must not change what is measured).
TRAINING_SCRIPT = ROOT / "fixtures" / "mnist_functions" / "before.py"


def pick_training_script() -> Path:
    """``TRAINING_SCRIPT``, else the repository's training script closest to 100 lines (examples/ first
    on a tie)."""
    if TRAINING_SCRIPT.exists():
        return TRAINING_SCRIPT
    candidates = sorted(ROOT.glob("examples/*.py")) + sorted(ROOT.glob("fixtures/*/before.py"))
    if not candidates:
        sys.exit("no examples/*.py or fixtures/*/before.py to benchmark")
    return min(candidates, key=lambda p: abs(line_count(p.read_text(encoding="utf-8")) - 100))


def line_count(text: str) -> int:
    return len(text.splitlines())


def build_corpus(dest: Path, training: bool, projects: bool = False) -> tuple[list[Path], int, Path]:
    """Copy accelerate's ``*.py`` (and with ``training`` the fixtures' ``before.py``) under ``dest``;
    files and lines."""
    # find_spec, not import: importing accelerate (and torch) here would swell this process, and
    # a child's ru_maxrss counts the parent's image it was forked from.
    spec = importlib.util.find_spec("accelerate")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("accelerate is not installed in this interpreter's environment")
    package = Path(list(spec.submodule_search_locations)[0]).resolve()
    for source in sorted(package.rglob("*.py")):
        if "__pycache__" in source.parts:
            continue
        target = dest / "accelerate" / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    if training:
        scripts = dest / "training_scripts"
        scripts.mkdir(parents=True)
        for before in sorted(ROOT.glob("fixtures/*/before.py")):
            shutil.copyfile(before, scripts / f"{before.parent.name}.py")
    if projects:
        for before in sorted(ROOT.glob("fixtures/projects/*/before")):
            shutil.copytree(before, dest / "projects" / before.parent.name)
    files = sorted(dest.rglob("*.py"))
    lines = sum(line_count(p.read_bytes().decode("utf-8", "replace")) for p in files)
    return files, lines, package


REPOSITORY = ROOT / "fixtures" / "projects" / "five_modules" / "before"

ENTRY = '''"""Entry point {k}: trains the project's model on its data."""
import torch

from data import get_loaders
from model import Regressor
from utils import AverageMeter, get_device, save_checkpoint


def main():
    torch.manual_seed({k})
    device = get_device()
    train_loader, val_loader = get_loaders(batch_size=8)
    model = Regressor().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        meter = AverageMeter()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            meter.update(loss.item(), len(x))
        print(f"epoch {{epoch}}: {{meter.avg:.4f}}")
        save_checkpoint({{"model": model.state_dict()}}, "runs_{k}")


if __name__ == "__main__":
    main()
'''


def build_repository(dest: Path, entries: int, padding: int = 300) -> tuple[list[Path], list[Path], int]:
    """Case 7's repository: the project's modules, each padded with ``padding`` helpers, and ``entries``
    entry scripts; (modules, all files, lines)."""
    dest.mkdir(parents=True)
    modules = []
    for name in ("model.py", "data.py", "utils.py"):
        text = (REPOSITORY / name).read_text(encoding="utf-8")
        (dest / name).write_text(text + helpers(padding), encoding="utf-8")
        modules.append(dest / name)
    for k in range(entries):
        (dest / f"train_{k}.py").write_text(ENTRY.format(k=k), encoding="utf-8")
    files = sorted(dest.glob("*.py"))
    return modules, files, sum(line_count(p.read_text(encoding="utf-8")) for p in files)


# Reference programs, run as `python FILE ARGS` in their own process.
REF_METADATA = '''import sys
import libcst
import libcst.codemod
from libcst.metadata import MetadataWrapper, ScopeProvider, QualifiedNameProvider

with open(sys.argv[1], encoding="utf-8", newline="") as handle:
    src = handle.read()
m = libcst.parse_module(src)
w = MetadataWrapper(m)
w.resolve_many([ScopeProvider, QualifiedNameProvider])
w.module.code
'''

REF_METADATA_MANY = '''import sys
import libcst
from libcst.metadata import MetadataWrapper, ScopeProvider, QualifiedNameProvider

for path in sys.argv[1:]:
    with open(path, encoding="utf-8", newline="") as handle:
        w = MetadataWrapper(libcst.parse_module(handle.read()))
    w.resolve_many([ScopeProvider, QualifiedNameProvider])
    w.module.code
'''

REF_PARSE_MANY = '''import io
import sys
import tokenize
import libcst

failed = 0
with open(sys.argv[1], encoding="utf-8") as listing:
    paths = listing.read().splitlines()
for path in paths:
    with open(path, "rb") as handle:
        raw = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    text = raw.decode(encoding)
    try:
        libcst.parse_module(text).code
    except libcst.ParserSyntaxError as exc:
        failed += 1
        print(f"error: {path}: {exc}", file=sys.stderr)
sys.exit(123 if failed else 0)
'''


# ---------------------------------------------------------------------------
# The command line under test


def accelify_exe() -> list[str]:
    beside = Path(PYTHON).parent / "accelify"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("accelify")
    return [found] if found else [PYTHON, "-m", "accelify"]


def jobs_flag(accelify: list[str]) -> Optional[str]:
    """``-j`` or ``--jobs`` if ``accelify convert`` has it, else None."""
    proc = subprocess.run([*accelify, "convert", "--help"], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if re.search(r"(^|[\s,])-j\b", text):
        return "-j"
    if "--jobs" in text:
        return "--jobs"
    return None


def j1_flag(jflag: Optional[str]) -> list[str]:
    return [jflag, "1"] if jflag else []


ENTRY_COUNTS = (1, 2, 4, 8)


def repository_case(work: Path, accelify: list[str], j1: list[str], repeat: int) -> tuple[list["Row"], list[str]]:
    """Case 7: ``convert --check`` of the repository with 1, 2, 4 and 8 entry scripts; the cost of an added
    script against the modules' reading once (parse + scope + qualified names)."""
    runs: dict[int, Measure] = {}
    sizes: dict[int, tuple[int, int]] = {}
    modules: list[Path] = []
    for count in ENTRY_COUNTS:
        modules, files, lines = build_repository(work / f"repository_{count}", count)
        sizes[count] = (len(files), lines)
        runs[count] = Measure(f"case 7 accelify ({count} entry scripts)",
                              [*accelify, "convert", "--check", *j1, str(work / f"repository_{count}")], (1,))
    reading = Measure("case 7 reference (the modules read once)",
                      [PYTHON, str(work / "ref_metadata_many.py"), *map(str, modules)], (0,))
    bare = Measure("case 7 reference (start-up)", [PYTHON, str(work / "ref_metadata_many.py")], (0,))
    progress(f"case 7: a repository with {', '.join(map(str, ENTRY_COUNTS))} entry scripts")
    measure([*runs.values(), reading, bare], repeat)
    module_cost = reading.median - bare.median
    first, last = ENTRY_COUNTS[0], ENTRY_COUNTS[-1]
    slope = (runs[last].median - runs[first].median) / (last - first)
    module_lines = sum(line_count(p.read_text(encoding="utf-8")) for p in modules)
    rows = [Row(f"7. `convert --check -j 1`, a repository ({len(modules)} modules, {module_lines:,} lines): "
                f"each added entry script", f"{slope * 1000:.0f} ms",
                f"{module_cost * 1000:.0f} ms (the modules' parse + scope + qualified names, once)",
                f"{slope / module_cost:.2f}", verdict(slope / module_cost, "< 1.0"))]
    details = ["repository (case 7): " + "; ".join(
        f"{count} scripts: {sizes[count][0]} files, {sizes[count][1]:,} lines, {fmt_seconds(runs[count].median)}"
        for count in ENTRY_COUNTS) + f"\n  modules read once: {reading.describe()}\n  start-up: {bare.describe()}"]
    details.extend(f"  {m.label}: {m.describe()}" for m in runs.values())
    return rows, details


def print_growth(growth: dict[int, tuple[Measure, Measure, int]]) -> None:
    print()
    print("Growth (training script + N helpers, `accelify convert` vs parse + metadata):")
    print()
    print("| helpers | lines | accelify | reference | ratio | accelify ms / 1k extra lines | "
          "reference ms / 1k extra lines |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    previous = None
    for count in sorted(growth):
        acc, ref, lines = growth[count]
        if previous is None:
            slope_a = slope_r = "-"
        else:
            pa, pr, pl = previous
            slope_a = f"{(acc.median - pa) * 1000 / ((lines - pl) / 1000):.0f}"
            slope_r = f"{(ref.median - pr) * 1000 / ((lines - pl) / 1000):.0f}"
        print(f"| {count} | {lines:,} | {fmt_seconds(acc.median)} | {fmt_seconds(ref.median)} | "
              f"{acc.median / ref.median:.2f} | {slope_a} | {slope_r} |")
        previous = (acc.median, ref.median, lines)


# ---------------------------------------------------------------------------
# Report


@dataclass
class Row:
    case: str
    accelify: str
    reference: str
    ratio: str
    target: str


def verdict(value: Optional[float], target: str) -> str:
    if value is None:
        return target
    op, bound = target.split()
    met = {"<=": value <= float(bound), "<": value < float(bound), ">=": value >= float(bound)}[op]
    return f"{target} ({'met' if met else 'missed'})"


def ratio_row(case: str, acc: Measure, ref: Measure, ref_note: str, target: str) -> Row:
    value = acc.median / ref.median
    flag = "" if acc.ok else " (errors)"
    return Row(case, fmt_seconds(acc.median) + flag, f"{fmt_seconds(ref.median)} ({ref_note})",
               f"{value:.2f}", verdict(value, target))


def markdown(rows: list[Row]) -> str:
    head = ["case", "accelify", "reference", "ratio", "target"]
    cells = [head] + [[r.case, r.accelify, r.reference, r.ratio, r.target] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def error_files(m: Measure) -> list[str]:
    """The ``error: ...`` lines accelify printed (same in every run: from the first failing one)."""
    for run in m.runs:
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        if errors:
            return errors
    return []


def directory_outcome(m: Measure, corpus: Path) -> list[str]:
    """What ``--check`` said: library files it would convert, training scripts it would leave alone."""
    if not m.runs:
        return []
    lines = m.runs[0].stderr.splitlines()
    out = [f"  accelify summary line: {lines[-1].strip()}"] if lines else []
    would = {line[len("would convert "):].strip() for line in lines if line.startswith("would convert ")}
    would = {str(Path(p).relative_to(corpus)) if p.startswith(str(corpus)) else p for p in would}
    library = sorted(p for p in would if not p.startswith("training_scripts/"))
    errors = {path for paths in group_errors(error_files(m), str(corpus)).values() for path in paths}
    kept = sorted(p for p in (f"training_scripts/{b.parent.name}.py" for b in ROOT.glob("fixtures/*/before.py"))
                  if p not in would and p not in errors and (corpus / p).exists())
    if library:
        out.append(f"  library (non-fixture) files accelify would convert: {', '.join(library)}")
    if kept:
        out.append(f"  fixtures' before.py accelify would leave unchanged: {', '.join(kept)}")
    return out


# ---------------------------------------------------------------------------


def main() -> None:
    global TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement (default 5; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: --repeat 1, growth points 0 and 500 only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory of inputs")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds before one child is killed")
    parser.add_argument("--only", default="1,2,4,7", help="the cases to run, comma-separated (default: all)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= {"1", "2", "4", "7"}:
        parser.error("--only takes 1, 2, 4 and 7")
    TIMEOUT = args.timeout
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    growth_points = (0, 500) if args.quick else (0, 250, 500, 1000)
    cores = os.cpu_count() or 1

    accelify = accelify_exe()
    jflag = jobs_flag(accelify)
    work = Path(tempfile.mkdtemp(prefix="accelify-bench-"))
    details: list[str] = []
    rows: list[Row] = []
    try:
        (work / "ref_metadata.py").write_text(REF_METADATA)
        (work / "ref_parse_many.py").write_text(REF_PARSE_MANY)
        (work / "ref_metadata_many.py").write_text(REF_METADATA_MANY)

        # Warm-up (not measured): byte-compiles accelify and LibCST once, so the first timed run
        # does not pay for it.
        plain = work / "plain" / "settings.py"
        plain.parent.mkdir()
        plain.write_text(PLAIN_MODULE)
        progress("warm-up")
        # An installed package has its bytecode (pip compiles it); a shell with
        # PYTHONDONTWRITEBYTECODE=1 would make every accelify run compile its modules again.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        run_child([*accelify, "convert", "--check", str(plain)])
        run_child([*accelify, "convert", "--check", str(pick_training_script())])  # the pipeline's modules too
        run_child([PYTHON, str(work / "ref_metadata.py"), str(plain)])

        # 1. a file that trains nothing
        if "1" in only:
            progress("case 1: --check on a plain module")
            acc1 = Measure("case 1 accelify", [*accelify, "convert", "--check", str(plain)], (0, 1))
            ref1 = Measure("case 1 reference", [PYTHON, "-c", "import libcst"], (0,))
            measure([acc1, ref1], repeat)
            rows.append(ratio_row(f"1. `convert --check`, {line_count(PLAIN_MODULE)}-line module without torch",
                                  acc1, ref1, "`import libcst`", "<= 0.5"))
            details.append(f"case 1 input: {plain} ({line_count(PLAIN_MODULE)} lines)\n"
                           f"  accelify:  {acc1.describe()}\n  reference: {ref1.describe()}")

        script = pick_training_script()
        growth: dict[int, tuple[Measure, Measure, int]] = {}
        acc3 = ref3 = None
        lines2 = lines3 = 0
        if "2" in only:
            # 2 + 3. a training script, then with helpers appended
            base = script.read_text(encoding="utf-8")
            if not base.endswith("\n"):
                base += "\n"
            for count in sorted(set(growth_points) | {0, 500}):
                progress(f"cases 2/3: training script + {count} helpers")
                path = work / "scripts" / f"train_{count}.py"
                path.parent.mkdir(exist_ok=True)
                text = base + helpers(count)
                path.write_text(text, encoding="utf-8")
                acc = Measure(f"case 3 accelify ({count} helpers)", [*accelify, "convert", str(path)], (0,))
                ref = Measure(f"case 3 reference ({count} helpers)", [PYTHON, str(work / "ref_metadata.py"), str(path)],
                              (0,))
                diff_note = ""
                if count == 0:
                    # one untimed run that keeps the diff: shows the conversion really happens
                    check = run_child(acc.argv, stdout_path=str(work / "diff_0.txt"))
                    if acc.failed(check):
                        report_failure(acc, check)
                    diff_lines = line_count((work / "diff_0.txt").read_text(encoding="utf-8", errors="replace"))
                    diff_note = f"; untimed check run: exit {check.status}, diff of {diff_lines} lines"
                measure([acc, ref], repeat)
                growth[count] = (acc, ref, line_count(text))
                details.append(f"training script + {count} helpers: {path} ({line_count(text)} lines{diff_note})\n"
                               f"  accelify:  {acc.describe()}\n  reference: {ref.describe()}")
            acc2, ref2, lines2 = growth[0]
            rows.append(ratio_row(f"2. `convert` (diff), {lines2}-line training script", acc2, ref2,
                                  "parse + scope + qualified names", "<= 1.5"))
            acc3, ref3, lines3 = growth[500]
            rows.append(ratio_row(f"3. `convert` (diff), same + 500 helpers ({lines3:,} lines)", acc3, ref3,
                                  "parse + scope + qualified names", "<= 1.5"))

        dirs = {}
        if "4" in only:
            # 4 + 5. directories: accelerate's package (the case), then with training scripts
            j1 = j1_flag(jflag)
            for key, training in (("4", False), ("4b", True), ("4c", False)):
                progress(f"case {key}: building the directory corpus")
                corpus = work / f"corpus_{key}"
                files, total_lines, package = build_corpus(corpus, training, projects=key == "4c")
                listing = work / f"files_{key}.txt"
                listing.write_text("\n".join(str(p) for p in files) + "\n")
                halves = [work / f"files_{key}_{half}.txt" for half in (0, 1)]
                for half, path in enumerate(halves):
                    path.write_text("\n".join(str(p) for p in files[half::2]) + "\n")
                acc = Measure(f"case {key} accelify", [*accelify, "convert", "--check", *j1, str(corpus)], (0, 1))
                ref = Measure(f"case {key} reference", [PYTHON, str(work / "ref_parse_many.py"), str(listing)], (0,))
                jobs: Optional[Measure] = None
                ceiling: Optional[Measure] = None
                if jflag is not None and cores > 1:
                    jobs = Measure(f"case {key} accelify {jflag} {cores}",
                                   [*accelify, "convert", "--check", jflag, str(cores), str(corpus)], (0, 1))
                    ceiling = Measure(f"case {key} two halves at once",
                                      [PYTHON, str(work / "ref_parse_many.py"), str(halves[0])], (0,),
                                      beside=[[PYTHON, str(work / "ref_parse_many.py"), str(halves[1])]])
                progress(f"case {key}: --check{' ' + shlex.join(j1) if j1 else ''}"
                         f"{f' and {jflag} {cores}' if jobs else ''} over {len(files)} files, {total_lines} lines")
                # the -j 1 run serves both case 4 and case 5, all interleaved
                measure([acc, ref] + ([jobs, ceiling] if jobs and ceiling else []), repeat)
                dirs[key] = (acc, ref, jobs, ceiling)
                acc_lps, ref_lps = total_lines / acc.median, total_lines / ref.median
                what = ("accelerate's package" if key == "4" else
                        f"the same + {len(list(ROOT.glob('fixtures/projects/*/before')))} projects" if key == "4c"
                        else f"the same + {len(list(ROOT.glob('fixtures/*/before.py')))} training scripts")
                rows.append(Row(
                    f"{key}. `convert --check{' -j 1' if jflag else ''}`, {what}: {len(files)} files / {total_lines:,} lines",
                    f"{acc_lps:,.0f} lines/s, {len(files) / acc.median:.1f} files/s" + ("" if acc.ok else " (errors)"),
                    f"{ref_lps:,.0f} lines/s, {len(files) / ref.median:.1f} files/s (parse + code)",
                    f"{acc_lps / ref_lps:.2f}", verdict(acc_lps / ref_lps, ">= 2.0") if key == "4" else "(reported)"))
                details.append(f"directory {key}: {corpus}: {len(files)} files, {total_lines} lines "
                               f"(accelerate {importlib.metadata.version('accelerate')} from {package}"
                               + (", plus the fixtures' before.py)" if training else ")") + "\n"
                               f"  accelify{' -j 1' if jflag else ''}:  {acc.describe()}\n"
                               + (f"  accelify {jflag} {cores}:  {jobs.describe()}\n" if jobs else "")
                               + (f"  two halves of the bare parse at once:  {ceiling.describe()}\n" if ceiling else "")
                               + f"  reference: {ref.describe()}")
                details.extend(directory_outcome(acc, corpus))
                if jflag is None:
                    rows.append(Row(f"5. `-j` all cores vs `-j 1`, directory {key}", "n/a (no --jobs option)", "", "",
                                    ">= 1.7"))
                elif jobs is None or ceiling is None:
                    rows.append(Row(f"5. `-j` all cores vs `-j 1`, directory {key}", "n/a (1 core)", "", "", ">= 1.7"))
                else:
                    speedup = acc.median / jobs.median
                    machine = ref.median / ceiling.median
                    rows.append(Row(f"5. `-j {cores}` vs `-j 1`, directory {key}", fmt_seconds(jobs.median),
                                    f"{fmt_seconds(acc.median)} (`-j 1`); the machine: two halves of the bare parse "
                                    f"at once {machine:.2f}x", f"{speedup:.2f}x", verdict(speedup, ">= 1.7")))

        # 7. a repository: entry scripts sharing the project's modules
        if "7" in only:
            repository_rows, repository_details = repository_case(work, accelify, j1_flag(jflag), repeat)
            rows.extend(repository_rows)
            details.extend(repository_details)

        # 6. memory (from the runs above)
        if "4" in dirs:
            acc4, ref4, acc5, _ = dirs["4"]
            rows.append(Row(f"6. peak RSS, directory run{' (-j 1)' if jflag else ''}", f"{acc4.max_rss_mib:.0f} MiB",
                            f"{ref4.max_rss_mib:.0f} MiB (parse + code)",
                            f"{acc4.max_rss_mib / ref4.max_rss_mib:.2f}", "(none)"))
            if acc5 is not None:
                rows.append(Row(f"6. peak RSS, directory run (-j {cores}, largest process)",
                                f"{acc5.max_rss_mib:.0f} MiB", "", "", "(none)"))
        if acc3 is not None and ref3 is not None:
            rows.append(Row(f"6. peak RSS, {lines3:,}-line file", f"{acc3.max_rss_mib:.0f} MiB",
                            f"{ref3.max_rss_mib:.0f} MiB (parse + metadata)",
                            f"{acc3.max_rss_mib / ref3.max_rss_mib:.2f}", "(none)"))

        # Output
        print()
        print(markdown(rows))
        print()
        print("Medians of wall-clock time, each run a fresh process; ratio = accelify / reference "
              "(case 4: throughput, accelify / reference; case 5: speed-up). "
              "Peak RSS: ru_maxrss from wait4, the largest single process "
              f"(floor: this harness's own {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
              "which a child's count includes).")
        if growth:
            print_growth(growth)
        print()
        print("Details:")
        if growth:
            print(f"training script: {script.relative_to(ROOT)} ({lines2} lines)")
        for block in details:
            print(block)
        for key, (acc, ref, _, _) in dirs.items():
            corpus = work / f"corpus_{key}"
            for who, m in (("accelify", acc), ("the reference", ref)):
                errors = error_files(m)
                if errors:
                    print(f"\n{who} reported {len(errors)} error(s) in directory {key} (paths under {corpus}):")
                    for message, paths in group_errors(errors, str(corpus)).items():
                        print(f"- {message}\n  {len(paths)} file(s): {', '.join(paths)}")
        if jflag is None:
            print("\n`accelify convert` has no -j/--jobs option: case 4 ran without it, case 5 is n/a.")
        print()
        print(f"command: {shlex.join([PYTHON, *sys.argv])}")
        print(f"machine: {platform.system()} {platform.machine()}, os.cpu_count()={cores}, "
              f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"Python {platform.python_version()}, libcst {importlib.metadata.version('libcst')}, "
              f"accelify {importlib.metadata.version('accelify')}; repeat={repeat}")
    finally:
        if args.keep:
            print(f"inputs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
