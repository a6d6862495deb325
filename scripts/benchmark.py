"""Conversion speed and memory: how long accelify takes per file, and its peak memory.

    python scripts/benchmark.py [--repeat 3]

Measures, on this machine: the CLI's start-up (`accelify --version`, no LibCST
loaded), converting every fixture (training scripts: the full pipeline) and a
set of non-training files (the cheap pre-check path), and peak RSS. Numbers
are printed, not asserted: targets belong in reports, not in tests.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    startup = timed(lambda: subprocess.run([sys.executable, "-m", "accelify", "--version"], check=True,
                                           capture_output=True), args.repeat)
    print(f"cli start-up (--version):        median {statistics.median(startup) * 1000:7.1f} ms")

    from accelify.pipeline import convert_source

    training = sorted((ROOT / "fixtures").glob("*/before.py"))
    sources = [(p, p.read_text()) for p in training]
    lines = sum(s.count("\n") for _, s in sources)
    convert_source(sources[0][1])  # warm imports
    runs = timed(lambda: [convert_source(s, str(p)) for p, s in sources], args.repeat)
    best = min(runs)
    print(f"training scripts: {len(sources)} files, {lines} lines: "
          f"{best:.2f} s total, {best / len(sources) * 1000:.0f} ms/file, {lines / best:.0f} lines/s")

    import libcst

    library = sorted(Path(libcst.__file__).parent.glob("_nodes/*.py"))
    others = [(p, p.read_text()) for p in library]
    other_lines = sum(s.count("\n") for _, s in others)
    runs = timed(lambda: [convert_source(s, str(p)) for p, s in others], args.repeat)
    best = min(runs)
    print(f"non-training files: {len(others)} files, {other_lines} lines: "
          f"{best:.2f} s total, {best / len(others) * 1000:.0f} ms/file")

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS:                        {peak:.0f} MiB")


if __name__ == "__main__":
    main()
