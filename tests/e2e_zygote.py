"""A fork server for the end-to-end tests (see tests/e2e.py, ``Zygote``).

usage: python e2e_zygote.py   (requests on stdin, replies on stdout, one JSON object a line)

Most of an end-to-end run of a tiny training script is importing torch and accelerate
(~2.7 s of CPU each time, on the 2-core CI machine, against well under a second of training).
This process imports them once and then forks one child per request; the child runs
tests/e2e_wrapper.py exactly as ``python e2e_wrapper.py SCRIPT`` would, in its own session
(so a timeout kills it with everything it started), with the request's working directory and
environment, stdin from /dev/null and stdout/stderr to the request's files.

What cannot change after the interpreter started (PYTHONHASHSEED, OMP_NUM_THREADS,
CUDA_VISIBLE_DEVICES, PYTHONPATH, a blocked ``accelerate``) is this process's own: the client
sends only requests that agree with it and runs the others as plain subprocesses.

Request: ``{"tag": n, "argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path}``,
optionally ``"module": name`` (run ``python -m name ARGV`` instead of the wrapper), ``"append":
true`` (append to stdout/stderr) and ``"block": [package, ...]`` (those raise ModuleNotFoundError
in the child, as where they are not installed).
Replies: ``{"tag": n, "pid": pid}`` when the child started, ``{"tag": n, "code": c}`` when it
ended (negative: killed by that signal). End of stdin: the children are killed, the server exits.

Importing this file runs nothing: it is a script.
"""
import json
import os
import select
import signal
import sys
import traceback


def _run_child(request, replies_fd):
    """In the forked child: become ``python e2e_wrapper.py ARGV`` and never return."""
    code = 1
    try:
        os.close(replies_fd)
        os.setsid()
        os.chdir(request["cwd"])
        import multiprocessing.process

        # A new interpreter's: spawned workers (mp.spawn) find a relative __main__ path from it.
        multiprocessing.process.ORIGINAL_DIR = os.getcwd()
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        mode = os.O_APPEND if request.get("append") else os.O_TRUNC
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o644)
            os.dup2(out, fd)
            os.close(out)
        import faulthandler

        # The client's signal for a run that timed out: every thread's stack to stderr, then it kills.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        for name in request.get("block", ()):
            _block(name)
        try:
            if request.get("module"):  # python -m MODULE ARGV
                import runpy

                sys.argv = [request["module"], *request["argv"]]
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            else:  # python e2e_wrapper.py ARGV
                import e2e_wrapper

                sys.argv = [e2e_wrapper.__file__, *request["argv"]]
                e2e_wrapper.main()
            code = 0
        except SystemExit as stop:  # as the interpreter maps sys.exit(...) to an exit status
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - an uncaught exception: printed, exit status 1
            traceback.print_exc()
            code = 1
        import atexit
        import threading

        threading._shutdown()  # noqa: SLF001 - what interpreter exit does: join non-daemon threads
        atexit._run_exitfuncs()  # noqa: SLF001
    except BaseException:  # noqa: BLE001 - the child must never return into the server's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _Blocked:
    """A finder for which a package is not installed: its import raises ModuleNotFoundError."""

    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


def _block(name):
    """Make ``name`` (a package this process imported) unimportable in this child, as where it is
    not installed: forgotten from sys.modules, refused by a finder first on sys.meta_path."""
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    sys.meta_path.insert(0, _Blocked(name))


def main():
    import accelerate  # noqa: F401 - the point of this process: imported once, before any fork
    import accelerate.utils  # noqa: F401
    import accelerate.data_loader  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - imported by the first optimizer made: 2.3 s of the 5 of a fixture
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data  # noqa: F401

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import e2e_wrapper  # noqa: F401

    replies_fd = os.dup(1)
    replies = os.fdopen(replies_fd, "w", buffering=1)

    def reply(**message):
        replies.write(json.dumps(message) + "\n")

    children = {}  # pid -> tag
    pending = b""
    open_stdin = True
    reply(ready=True)
    while open_stdin or children:
        readable, _, _ = select.select([0] if open_stdin else [], [], [], 0.02)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                open_stdin = False
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _run_child(request, replies_fd)
                children[pid] = request["tag"]
                reply(tag=request["tag"], pid=pid)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            reply(tag=children.pop(pid), code=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
