"""Run one script of the DDP real-scripts set, original or converted, on N CPU processes.

usage: python scripts/ddp/run.py SET/NAME.py [--procs N] [--converted] [--plain] [--port P] [--timeout S]

``SET/launch.tsv`` holds, per script, how its authors launch it: ``NAME.py<TAB>COMMAND``, where
COMMAND is ``torchrun --nproc_per_node {n} {script} ARGS`` or ``python {script} ARGS`` (``mp.spawn``
over the GPU count, or a ``Process`` loop) or ``python -m torch.distributed.launch ...``.

- The original runs as written with ``scripts/ddp/shim`` on ``PYTHONPATH`` (GPU calls on the host,
  nccl as gloo; ``SHIM_GPUS`` = N; ``SET/shim-extra/extra_*.py`` for a script's other GPU calls).
- ``--converted`` converts the script (``accelify convert``) into the scratch folder and runs it as
  ``accelerate launch`` would: ``torchrun --nproc_per_node N`` with ``ACCELERATE_USE_CPU=1``, under the
  tracing hook with the device and side-effect checks on (``ACCELIFY_CHECKS=device,effects``);
  ``--plain`` runs it as ``python NAME.py ARGS`` instead (one process, no launcher). ``$ACCELIFY_BIN``:
  the ``accelify`` command that converts (another checkout's, to validate a version while working on one).

Each run happens in a scratch copy of SET; each rank's output is printed after the run.
Validation tooling: nothing here is a test.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def launch_of(root: Path, name: str) -> list[str]:
    for line in (root / "launch.tsv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            script, _, command = line.partition("\t")
            if script.strip() == name:
                return shlex.split(command)
    raise SystemExit(f"{name}: no line in {root / 'launch.tsv'}")


def script_args(command: list[str]) -> list[str]:
    """The arguments after ``{script}``."""
    return command[command.index("{script}") + 1:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("script")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--converted", action="store_true")
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--port", type=int, default=29612)
    parser.add_argument("--timeout", type=float, default=600)
    options = parser.parse_args()
    script = Path(options.script).resolve()
    root = script.parent
    command = launch_of(root, script.name)
    work = Path(tempfile.mkdtemp(prefix="ddprun-"))
    shutil.copytree(root, work, dirs_exist_ok=True)
    logs = work / "_logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "ACCELIFY_"))}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", PATH=f"{BIN}:{env.get('PATH', '')}")
    if options.converted:
        converter = os.environ.get("ACCELIFY_BIN", str(BIN / "accelify"))  # another version's, to validate it
        converted = subprocess.run([converter, "convert", "--in-place", script.name], cwd=work,
                                   capture_output=True, text=True)
        print(converted.stdout[-3000:], converted.stderr[-3000:])
        if (work / script.name).read_text() == script.read_text():
            print("not converted: nothing to run")
            return 1
        env.update(ACCELERATE_USE_CPU="1", ACCELIFY_CHECKS="device,effects", ACCELIFY_TRACE=str(work / "_trace"),
                   PYTHONPATH=str(HERE / "sbn"), CUDA_VISIBLE_DEVICES="")
        args = [part.replace("{n}", str(1 if options.plain else options.procs)) for part in script_args(command)]
        if options.plain:
            argv = [str(BIN / "python"), script.name, *args]
        else:
            argv = [str(BIN / "torchrun"), "--nproc_per_node", str(options.procs), "--master_port", str(options.port),
                    "--log-dir", str(logs), "--redirects", "3", "-m", "accelify.runtime.trace", script.name, *args]
    else:
        env.update(PYTHONPATH=str(HERE / "shim"), SHIM_GPUS=str(options.procs), SHIM_EXTRA=str(root / "shim-extra"),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(options.port))
        argv = [part.replace("{n}", str(options.procs)).replace("{script}", script.name) for part in command]
        if argv[0] == "torchrun":
            argv = [str(BIN / "torchrun"), "--master_port", str(options.port), "--log-dir", str(logs),
                    "--redirects", "3", *argv[1:]]
        elif argv[0] == "python":
            argv[0] = str(BIN / "python")
    print("$", " ".join(argv), f"(in {work})", flush=True)
    try:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=options.timeout)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    print(out[-6000:])
    print(err[-4000:], file=sys.stderr)
    for path in sorted(glob.glob(str(logs / "**" / "std*.log"), recursive=True)):
        text = Path(path).read_text(errors="replace")
        if text.strip():
            print(f"--- {Path(path).relative_to(logs)}\n{text[-6000:]}")
    if options.converted:
        code = _judge(work / "_trace", 1 if options.plain else options.procs, code)
    print("exit", code)
    return 0 if code == 0 else 1


def _judge(prefix: Path, procs: int, code):
    """What the tracing hook recorded: a device rule broken (as on a GPU), side effects repeated on every process."""
    sys.path.insert(0, str(HERE.parent))
    from check_scripts import read_trace

    from accelify.runtime.checks import judge_side_effects

    traces = [read_trace(str(prefix), rank) for rank in range(procs)]
    for rank, trace in enumerate(traces):
        print(f"rank {rank}: {trace['steps']} optimizer steps, end {trace['end']}"
              + (f", DEVICE: {trace['device']}" if trace["device"] else ""))
    effects = judge_side_effects({r: t["effects"] for r, t in enumerate(traces)}, {r: t["prints"] for r, t in enumerate(traces)})
    for problem in effects:
        print("SIDE EFFECT:", problem)
    if code == 0 and (effects or any(t["device"] for t in traces)):
        return "checks failed"
    return code


if __name__ == "__main__":
    sys.exit(main())
