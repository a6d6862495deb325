"""Checks of a run on the CPU for what only a GPU or several processes would show.

A converted script is checked on a laptop's CPU, where every tensor is on the same device and a
file written by every process is one file: the two ways a conversion most often fails on a
cluster are invisible there. This module makes them visible. Both checks are installed by
``accelify.runtime.trace`` (``accelify verify``) and by the tests' end-to-end wrapper.

**The device check** (``install_device_check``) emulates a GPU's device rules. The accelerator's
device is ``cpu:0`` (``ACCELERATE_TORCH_DEVICE=cpu:0``, which Accelerate and the single-process
stand-in both honour): a ``torch.device`` with an index, which a plain ``"cpu"`` placement never
has. A ``TorchFunctionMode`` marks every tensor that lives on that device:

- what ``.to(...)``, ``.cuda()`` or a factory's ``device=`` puts there (a prepared model's
  parameters and buffers, a prepared loader's batches, ``.to(accelerator.device)``,
  ``torch.zeros(..., device=accelerator.device)``), and ``.to(other)`` of a marked ``other``;
- whatever an operation computes from a marked tensor (its ``.grad`` and ``.data`` included).

``.cpu()`` / ``.to("cpu")`` give an unmarked copy (a real move copies), and a marked tensor's
``.device`` reads ``cpu:0``, so ``torch.arange(n, device=x.device)`` lands where ``x`` is, as on a
GPU. The tensors themselves stay plain CPU tensors (a checkpoint saved from them loads as the
script's would). Then, as CUDA would:

- an operation that takes a marked tensor and an unmarked one of one or more dimensions raises
  ``DeviceMismatch`` (an unmarked 0-dim tensor is a host scalar, which CUDA accepts; so are
  ``copy_``, moves, and host indices into a device tensor);
- ``.numpy()`` of a marked tensor (``np.asarray(t)`` too) raises ``DeviceMismatch``.

The error names the user's file, line and source, and the name the host tensor has there when it
has one ("train.py:233 `pred = model(x)`: `x` is on the host"). ``on_error`` (if given) receives
the same as a dict before the raise, so a run that swallows the exception is still known.

**Side effects per process** (``install_side_effects``): every file written (``open`` for writing,
``torch.save``, ``shutil`` copies), directory created (``os.makedirs``, ``os.mkdir``), archive
extracted (``zipfile``, ``tarfile``, ``shutil.unpack_archive``), URL downloaded (``urllib``,
``requests``) and line printed to stdout, each with the user's file and line, goes to ``record``
as a dict (prints: the first of each line of code, and a count per line of code at the end through
``summary()``). ``judge_side_effects`` (torch-free) reads the ranks' records and names the
failures: a path written by several processes, a download or an extraction on every process (not
inside ``main_process_first()``, where the processes take turns), and a line of code that prints
more than once on a process other than the first (per-batch or per-epoch output on every process). Directories made on every process are recorded, not judged:
a race on one either fails the run, which shows, or is handled by the script
(``try: os.makedirs(d) except OSError: pass``).

This module imports torch only inside the ``install_*`` functions; ``judge_side_effects`` needs
nothing but the standard library.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import io
import linecache
import os
import sys
from collections import Counter
from typing import Any, Callable, Iterable, Optional

#: The accelerator's device in the emulation (what ``ACCELERATE_TORCH_DEVICE`` is set to).
EMULATED_DEVICE = "cpu:0"

_MARK = "_accelify_on_device"

#: Where the user's code is not: frames in these folders are skipped when naming a line.
_LIBRARY_ROOTS: tuple[str, ...] = ()


def _library_roots() -> tuple[str, ...]:
    global _LIBRARY_ROOTS
    if not _LIBRARY_ROOTS:
        import sysconfig

        roots = {os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.__file__)}
        for key in ("purelib", "platlib", "stdlib", "platstdlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                roots.add(os.path.abspath(path))
        for module in ("torch", "accelerate", "numpy", "tqdm"):
            loaded = sys.modules.get(module)
            if loaded is not None and getattr(loaded, "__file__", None):
                roots.add(os.path.dirname(os.path.dirname(os.path.abspath(loaded.__file__))))
        _LIBRARY_ROOTS = tuple(sorted(roots))
    return _LIBRARY_ROOTS


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not any(path == root or path.startswith(root + os.sep) for root in _library_roots())


def user_frame(frame=None):
    """The innermost frame of the user's code (not the standard library, site-packages or accelify's
    runtime), from ``frame`` (the caller's caller by default) outwards; None if there is none."""
    frame = frame if frame is not None else sys._getframe(2)
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def where(frame=None) -> dict[str, Any]:
    """``{"file", "line", "code"}`` of the user's innermost frame (empty values when there is none)."""
    found = user_frame(frame if frame is not None else sys._getframe(2))
    if found is None:
        return {"file": None, "line": None, "code": None}
    filename, line = found.f_code.co_filename, found.f_lineno
    return {"file": filename, "line": line, "code": linecache.getline(filename, line).strip() or None}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after ``name`` is imported (once; the import is untouched)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def run(module):
            exec_module(module)
            try:
                then(module)
            except Exception:  # pragma: no cover - never break the user's import
                pass

        loader.exec_module = run
        return spec


def after_import(name: str, then: Callable[[Any], None]) -> None:
    """Call ``then(module)`` once ``name`` is imported: now if it is, else right after its import."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


# ------------------------------------------------------------------------------------------------
# the device check


class DeviceMismatch(RuntimeError):
    """What CUDA would raise: tensors on two devices in one operation, or ``.numpy()`` of a tensor on
    the accelerator's device. ``details``: file, line, code, name, op, message."""

    def __init__(self, details: dict[str, Any]) -> None:
        super().__init__("would fail on a GPU: " + details["message"])
        self.details = details


def _on_device(tensor) -> bool:
    return tensor.__dict__.get(_MARK, False) if hasattr(tensor, "__dict__") else False


def _mark(value, on_device: bool) -> None:
    """Mark every tensor in ``value`` (a tensor, or a tuple/list of them) as on the device or not."""
    import torch

    if isinstance(value, torch.Tensor):
        if on_device:
            value.__dict__[_MARK] = True
        else:
            value.__dict__.pop(_MARK, None)
    elif isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                _mark(item, on_device)


def _tensors(args, kwargs) -> Iterable:
    import torch

    Tensor = torch.Tensor
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, Tensor):
                    yield item
                elif isinstance(item, (tuple, list)):  # index tuples, lists of lists of tensors
                    for inner in item:
                        if isinstance(inner, Tensor):
                            yield inner


def is_emulated_device(device) -> bool:
    """Whether ``device`` (a ``torch.device``, a string or an int) is the accelerator's device: a CPU
    device with an index, or any CUDA device."""
    import torch

    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        return False
    return device.index is not None if device.type == "cpu" else device.type != "meta"


def _name_of(tensor, frame) -> Optional[str]:
    """The name ``tensor`` has in the user's frame or one of the frames it called (None if none)."""
    import torch

    base = getattr(tensor, "_base", None)  # x[None], x.view(...): a view of a named tensor

    def rank(value) -> int:
        if value is tensor:
            return 3
        if base is None or not isinstance(value, torch.Tensor):
            return 0
        if value._base is base and value.data_ptr() == tensor.data_ptr() and value.numel() == tensor.numel():
            return 2  # the same elements under another shape: sample for sample[None]
        return 1 if value is base else 0

    while frame is not None:
        found = max(((rank(value), name) for name, value in frame.f_locals.items()), default=(0, None))
        if found[0]:
            return found[1]
        frame = frame.f_back
    return None


def _describe(tensor) -> str:
    return f"a host tensor of shape {list(tensor.shape)}"



def install_device_check(on_error: Optional[Callable[[dict[str, Any]], None]] = None):
    """Emulate the accelerator's device (see the module docstring) from now on in this thread, and
    return the active ``TorchFunctionMode``. Sets ``ACCELERATE_TORCH_DEVICE`` for Accelerate and
    the stand-in, unless it is set already."""
    import torch
    from torch.overrides import TorchFunctionMode

    os.environ.setdefault("ACCELERATE_TORCH_DEVICE", EMULATED_DEVICE)
    device = torch.device(EMULATED_DEVICE)
    Tensor = torch.Tensor
    parse_to = torch._C._nn._parse_to
    # operations that take a tensor on the device and one on the host, as CUDA allows
    mixable = {"copy_", "to", "cpu", "cuda", "set_", "_has_compatible_shallow_copy_type", "__set__", "__get__",
               "__setitem__", "index_put_", "index_put", "__repr__", "__format__", "__str__", "__reduce_ex__",
               "__deepcopy__", "is_same_size", "equal_",
               # lengths on the host by design (pack_padded_sequence requires them there)
               "pack_padded_sequence", "_pack_padded_sequence", "pad_packed_sequence", "_pad_packed_sequence",
               "ctc_loss"}

    def fail(op: str, host, frame, message: str, numpy: bool = False) -> None:
        found = user_frame(frame)
        here = where(found) if found is not None else {"file": None, "line": None, "code": None}
        name = _name_of(host, found) if host is not None and found is not None else None
        if numpy:
            what = f"`{name}`" if name else "a tensor"
            text = f"{what} is on the accelerator's device: .numpy() needs it on the host (.cpu() first)"
        else:
            text = (f"`{name}` is on the host ({_describe(host)})" if name else _describe(host)) + \
                f" meets tensors on the accelerator's device in {op}"
        location = f"{os.path.basename(here['file'])}:{here['line']} `{here['code']}`: " if here["file"] else ""
        details = {**here, "name": name, "op": op, "message": location + text + (f" ({message})" if message else "")}
        if on_error is not None:
            try:
                on_error(details)
            except Exception:  # pragma: no cover - a recorder must never change what the script does
                pass
        raise DeviceMismatch(details)

    host = torch.device("cpu")

    def on_host(value):
        """The emulated device as the real one, the host: no tensor is really made on ``cpu:0`` (it
        would be saved tagged so, and load nowhere)."""
        return host if isinstance(value, (torch.device, str)) and is_emulated_device(value) else value

    def moved(func, args, kwargs, target: Optional[bool]):
        """``.to``/``.cpu``/``.cuda``: the result is on ``target`` (None: where ``self`` is)."""
        args = tuple(on_host(a) for a in args)
        kwargs = {k: on_host(v) for k, v in kwargs.items()}
        source = args[0]
        here = _on_device(source)
        target = here if target is None else target
        out = func(*args, **kwargs)
        if isinstance(out, Tensor):
            if out is source and target != here:
                out = source.clone()  # a real move copies
            if out is not source:
                _mark(out, target)
        return out

    class DeviceCheck(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in ("__get__", "__set__"):
                return attribute(func, name, args, kwargs)
            if name == "to" and args and isinstance(args[0], Tensor):
                rest = args[1:]
                if rest and isinstance(rest[0], Tensor):
                    return moved(func, args, kwargs, _on_device(rest[0]))
                target_device = parse_to(*rest, **kwargs)[0]
                return moved(func, args, kwargs, None if target_device is None else is_emulated_device(target_device))
            if name == "type_as" and len(args) > 1 and isinstance(args[0], Tensor) and isinstance(args[1], Tensor):
                return moved(func, args, kwargs, _on_device(args[1]))  # the other's type, its device included
            if name == "cpu":
                return moved(func, args, kwargs, False)
            if name == "cuda":  # onto the device (the host): torch's own `.cuda()` needs a CUDA driver
                return moved(lambda tensor, *_, **__: tensor, args[:1], {}, True)
            if name in ("numpy", "__array__") and args and isinstance(args[0], Tensor) and _on_device(args[0]):
                fail(name, args[0], sys._getframe(1), "", numpy=True)
            device_hit = host_hit = None
            for tensor in _tensors(args, kwargs):
                if _on_device(tensor):
                    device_hit = tensor
                elif host_hit is None and tensor.dim() > 0:
                    host_hit = tensor
            if device_hit is not None and host_hit is not None and name not in mixable:
                if name != "__getitem__" or host_hit is args[0]:
                    fail(name, host_hit, sys._getframe(1), "")
            where_to = kwargs.get("device")
            if where_to is not None:
                kwargs = {**kwargs, "device": on_host(where_to)}
            out = func(*args, **kwargs)
            if where_to is not None:
                _mark(out, is_emulated_device(where_to))
            elif name in ("__getitem__", "__setitem__", "index_put_", "index_put", "copy_") and args \
                    and isinstance(args[0], Tensor):
                if out is not args[0]:
                    _mark(out, _on_device(args[0]))
            elif device_hit is not None:
                _mark(out, True)
            return out

    def attribute(func, name, args, kwargs):
        descriptor = getattr(func, "__self__", None)
        field = getattr(descriptor, "__name__", "")
        self = args[0] if args else None
        if name == "__get__":
            if field == "device" and isinstance(self, Tensor) and _on_device(self):
                return device
            if field == "is_cuda" and isinstance(self, Tensor) and _on_device(self):
                return True  # (PointNet's `if x.is_cuda:` branches)
            out = func(*args, **kwargs)
            if field in ("grad", "data", "real", "imag", "T", "mT", "H", "mH") and isinstance(out, Tensor) \
                    and isinstance(self, Tensor) and _on_device(self):
                _mark(out, True)
            return out
        out = func(*args, **kwargs)
        if field == "data" and isinstance(self, Tensor) and len(args) > 1 and isinstance(args[1], Tensor):
            _mark(self, _on_device(args[1]))
        return out

    _keep_marks_through_variable(torch)
    _keep_marks_through_deepcopy(torch)
    mode = DeviceCheck()
    mode.__enter__()
    after_import("accelerate.accelerator", _host_when_cpu)
    after_import("accelify.runtime.single_process", _host_when_cpu)
    return mode


def _keep_marks_through_variable(torch) -> None:
    """``Variable(x)`` (old scripts) makes a new tensor that shares ``x``'s data, outside any
    ``__torch_function__``: it is where ``x`` is."""
    import torch.autograd.variable as variable

    original = variable.Variable
    if getattr(original, "__accelify_marks__", False):
        return

    class Variable(original):  # type: ignore[misc, valid-type] - the metaclass keeps isinstance(x, Variable)
        __accelify_marks__ = True

        def __new__(cls, *args, **kwargs):
            out = original(*args, **kwargs)
            data = args[0] if args else kwargs.get("data")
            if isinstance(data, torch.Tensor) and _on_device(data):
                _mark(out, True)
            return out

    variable.Variable = torch.autograd.Variable = Variable


def _keep_marks_through_deepcopy(torch) -> None:
    """``copy.deepcopy(model)`` (an EMA copy) copies each parameter where it is, as on a GPU: a ``Parameter``'s
    ``__deepcopy__`` makes the copy with ``_make_subclass``, outside any ``__torch_function__``."""
    Parameter = torch.nn.Parameter
    original = Parameter.__deepcopy__
    if getattr(original, "__accelify_marks__", False):
        return

    def __deepcopy__(self, memo):
        out = original(self, memo)
        if _on_device(self):
            _mark(out, True)
        return out

    __deepcopy__.__accelify_marks__ = True  # type: ignore[attr-defined]
    Parameter.__deepcopy__ = __deepcopy__


def _host_when_cpu(module) -> None:
    """``Accelerator(cpu=True)`` computes on the host: the emulated device is not its device (in
    several processes too, where Accelerate would pick ``cpu:<index>``)."""
    cls = getattr(module, "Accelerator", None)
    if cls is None or getattr(cls.__init__, "__accelify_host_when_cpu__", False):
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        if not kwargs.get("cpu"):
            return init(self, *args, **kwargs)
        saved = os.environ.get("ACCELERATE_TORCH_DEVICE")
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
        try:
            return init(self, *args, **kwargs)
        finally:
            if saved is None:
                os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
            else:
                os.environ["ACCELERATE_TORCH_DEVICE"] = saved

    __init__.__accelify_host_when_cpu__ = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    cls.__init__ = __init__


# ------------------------------------------------------------------------------------------------
# side effects per process


class SideEffects:
    """Records what a process writes, creates, extracts, downloads and prints (see the module
    docstring). ``record`` receives one dict per event; ``summary()`` gives the print counts."""

    def __init__(self, record: Callable[[dict[str, Any]], None]) -> None:
        self.record = record
        self.prints: Counter = Counter()  # (file, line) -> outputs printed
        self.codes: dict[tuple, Optional[str]] = {}
        self.pid = os.getpid()
        self.depth = 0  # inside a recorded call (torch.save opening its file): not recorded again
        self.in_turn = 0  # inside Accelerate's main_process_first(): the processes take turns

    def event(self, kind: str, path=None, frame=None, **extra) -> None:
        if os.getpid() != self.pid or self.depth:
            return
        here = where(frame if frame is not None else sys._getframe(2))
        if here["file"] is None:
            return  # a library's own bookkeeping (a cache, a lock file), not the script's
        if path is not None and not (kind == "download" and "://" in str(path)):  # a URL stays a URL
            try:
                path = os.path.abspath(os.fspath(path))
            except TypeError:
                path = None
        if self.in_turn:
            extra["in_turn"] = True
        self.record({"event": "effect", "kind": kind, "path": path, **here, **extra})

    def printed(self, text: str) -> None:
        if os.getpid() != self.pid or not text:
            return
        found = user_frame(sys._getframe(2))
        if found is None:
            return
        key = (found.f_code.co_filename, found.f_lineno)
        # outputs, not lines: print writes its parts one by one and ends with its `end` ("\n"): a
        # `print("\nLoading data...")` once is one output; a progress line rewritten in place
        # (`sys.stdout.write("\rBatch[3] ...")`) is one per call
        count = 1 if text.endswith(("\n", "\r")) or text.startswith("\r") else 0
        if key not in self.codes:
            self.codes[key] = linecache.getline(key[0], key[1]).strip() or None
            self.record({"event": "effect", "kind": "print", "path": None, "file": key[0], "line": key[1],
                         "code": self.codes[key]})
        self.prints[key] += count

    def summary(self) -> list[dict[str, Any]]:
        return [{"file": f, "line": l, "code": self.codes.get((f, l)), "count": n} for (f, l), n in self.prints.items()]

    def wrap(self, owner, name: str, kind: str, path_of: Callable[..., Any], when=None) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "__accelify_effect__", False):
            return
        effects = self

        def wrapper(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                try:
                    path = path_of(*args, **kwargs)
                except Exception:
                    path = None
                extra = {"exist_ok": bool(kwargs.get("exist_ok", args[2] if len(args) > 2 else False))} \
                    if kind == "mkdir" and name == "makedirs" else {}
                effects.event(kind, path, sys._getframe(1), **extra)
            effects.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                effects.depth -= 1

        wrapper.__accelify_effect__ = True
        wrapper.__wrapped__ = original
        wrapper.__name__ = getattr(original, "__name__", name)
        setattr(owner, name, wrapper)


def _writes(mode) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


def _url(value) -> Optional[str]:
    url = getattr(value, "full_url", value)
    return url if isinstance(url, str) else None


class _Tee:
    """stdout that tells ``SideEffects`` which line of code printed what."""

    def __init__(self, stream, effects: SideEffects) -> None:
        self._stream, self._effects = stream, effects

    def write(self, text):
        self._effects.printed(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install_side_effects(record: Callable[[dict[str, Any]], None]) -> SideEffects:
    """Record this process's side effects (see ``SideEffects``) from now on."""
    import shutil
    import tarfile
    import tempfile
    import urllib.request
    import zipfile

    effects = SideEffects(record)
    io_open = builtins.open

    def opened(file, mode="r", *args, **kwargs):
        if _writes(mode) and isinstance(file, (str, bytes, os.PathLike)):
            effects.event("write", file, sys._getframe(1))
        effects.depth += 1
        try:
            return io_open(file, mode, *args, **kwargs)
        finally:
            effects.depth -= 1

    opened.__accelify_effect__ = True
    opened.__wrapped__ = io_open
    builtins.open = io.open = opened  # zipfile and others call io.open
    first = lambda target, *a, **k: target  # noqa: E731 - the path is the first argument
    second = lambda source, target, *a, **k: target  # noqa: E731
    effects.wrap(os, "makedirs", "mkdir", first)
    effects.wrap(os, "mkdir", "mkdir", first)
    for copy in ("copy", "copy2", "copyfile", "copytree", "move"):
        effects.wrap(shutil, copy, "write", second)
    effects.wrap(shutil, "unpack_archive", "extract",
                 lambda filename, extract_dir=None, *a, **k: extract_dir or os.getcwd())
    effects.wrap(zipfile.ZipFile, "extractall", "extract", lambda self, path=None, *a, **k: path or os.getcwd())
    effects.wrap(zipfile.ZipFile, "extract", "extract", lambda self, member, path=None, *a, **k: path or os.getcwd())
    effects.wrap(tarfile.TarFile, "extractall", "extract", lambda self, path=".", *a, **k: path)
    effects.wrap(tarfile.TarFile, "extract", "extract", lambda self, member, path="", *a, **k: path or os.getcwd())
    # a temporary file or directory has a name of its own in each process (numba probes its cache
    # directory with one under librosa.load): never a race
    for private in ("TemporaryFile", "NamedTemporaryFile", "mkstemp", "mkdtemp"):  # the classes call these
        effects.wrap(tempfile, private, "write", first, when=lambda *a, **k: False)  # nothing inside recorded
    effects.wrap(urllib.request, "urlretrieve", "download", lambda url, filename=None, *a, **k: filename,
                 when=lambda url, *a, **k: True)
    effects.wrap(urllib.request, "urlopen", "download", lambda url, *a, **k: _url(url))
    requests = sys.modules.get("requests")
    if requests is None:
        try:
            import requests  # noqa: F811 - only when the script's environment has it
        except ImportError:
            requests = None
    if requests is not None:
        effects.wrap(requests.Session, "request", "download", lambda self, method, url, *a, **k: url,
                     when=lambda self, method, *a, **k: str(method).upper() == "GET")
    try:
        import torch
    except ImportError:  # pragma: no cover - the runtime needs torch
        torch = None
    if torch is not None:
        effects.wrap(torch, "save", "write",
                     lambda obj, f, *a, **k: f if isinstance(f, (str, bytes, os.PathLike)) else None,
                     when=lambda obj, f, *a, **k: isinstance(f, (str, bytes, os.PathLike)))
    sys.stdout = _Tee(sys.stdout, effects)
    after_import("accelerate.state", lambda module: _taking_turns(module, effects))
    return effects


def _taking_turns(module, effects: SideEffects) -> None:
    """Mark what runs inside ``main_process_first()`` (and its local twin): the main process does it,
    then the others, in turn; a download or an extraction repeated so is no race."""
    state = getattr(module, "PartialState", None)
    goes_first = getattr(state, "_goes_first", None)
    if goes_first is None or getattr(goes_first, "__accelify_turns__", False):
        return
    def _goes_first(self, *args, **kwargs):  # a generator, as Accelerate's (``yield from`` in both)
        turn = goes_first(self, *args, **kwargs)
        value = next(turn)  # the others have waited for the main process here
        effects.in_turn += 1
        try:
            yield value
        finally:
            effects.in_turn -= 1
        yield from turn  # the main process waits for the others

    _goes_first.__accelify_turns__ = True  # type: ignore[attr-defined]
    state._goes_first = _goes_first


def judge_side_effects(ranks: dict[int, list[dict[str, Any]]], prints: dict[int, list[dict[str, Any]]]) -> list[str]:
    """The failures among several processes' side effects: ``ranks`` maps each rank to its effect
    events (``SideEffects``'s records), ``prints`` to its ``summary()``. One sentence each, naming
    the file and line."""
    if len(ranks) < 2:
        return []
    failures: list[str] = []

    def at(event) -> str:
        file = os.path.basename(event.get("file") or "?")
        code = f" `{event['code']}`" if event.get("code") else ""
        return f"{file}:{event.get('line')}{code}"

    by_path: dict[tuple[str, Optional[str]], dict[int, dict]] = {}
    for rank, events in sorted(ranks.items()):
        for event in events:
            if event.get("kind") == "print":
                continue
            if event["kind"] == "mkdir":
                # recorded, never judged: a race on a directory either fails the run (visible) or is
                # handled by the script (`try: os.makedirs(d) except OSError: pass`)
                continue
            if event.get("in_turn") and event["kind"] in ("download", "extract"):
                continue  # under main_process_first(): the others repeat it after the main process, no race
            if "__pycache__" in os.path.normpath(event.get("path") or "").split(os.sep):
                continue  # a cache of compiled code (Python's, numba's under librosa): every process may write it
            if (event.get("path") or "").startswith(("/proc/", "/dev/", "/sys/")):
                continue  # the process's own kernel entries (absl's `app.run` names its thread in /proc/self/comm)
            key = (event["kind"], event.get("path") if event["kind"] != "download" else event.get("path") or at(event))
            by_path.setdefault(key, {}).setdefault(rank, event)
    what = {"write": "writes", "extract": "extracts into", "download": "downloads"}
    for (kind, path), seen in by_path.items():
        if len(seen) < 2:
            continue
        event = next(iter(seen.values()))
        rank_list = ", ".join(str(r) for r in sorted(seen))
        failures.append(f"{at(event)} {what[kind]} {path} on every process (ranks {rank_list})")
    for rank, counts in sorted(prints.items()):
        if rank == 0:
            continue
        for entry in counts:
            if entry.get("count", 0) > 1:
                failures.append(f"{at(entry)} prints {entry['count']} times on rank {rank} "
                                "(output on every process: print on the main process only)")
    return failures
