"""Run a hand-written DDP *original* on a CPU-only machine, as its authors launch it.

Validation tooling only (``scripts/ddp/run.py`` puts this folder on ``PYTHONPATH`` for the originals of
the DDP real-scripts set; converted scripts never run with it). It changes only what would fail without
a GPU, so that the authors' own process-group code runs unchanged on gloo:

- ``torch.cuda.is_available()`` is True and ``device_count()`` is ``$SHIM_GPUS`` (default 2), so
  ``mp.spawn(nprocs=torch.cuda.device_count())`` starts that many processes;
- every CUDA device handed to torch (``.cuda()``, ``.to("cuda:1")``, ``device=...`` of a factory,
  ``map_location`` of ``torch.load``) is the host; ``set_device``, ``synchronize`` and the memory
  statistics do nothing;
- ``init_process_group(backend="nccl")`` is gloo; DDP is built without ``device_ids``/``output_device``;
- SyncBatchNorm (no CPU kernels) stays a per-process batch norm; loaders do not pin memory; a CUDA
  GradScaler is disabled (as it disables itself on a machine without CUDA).

Files ``extra_*.py`` in ``$SHIM_EXTRA`` (a folder) are imported after this: patches for one script's
other GPU-only calls, kept beside the set.
"""

import contextlib
import glob
import importlib.util
import os

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

_HOST = torch.device("cpu")


def _host(value):
    if isinstance(value, torch.device) and value.type == "cuda":
        return _HOST
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    return value


class _OnTheHost(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            first = args[1]
            if isinstance(first, int) and not isinstance(first, bool):
                first = _HOST
            args = (args[0], _host(first), *args[2:])
        return func(*args, **kwargs)


_OnTheHost().__enter__()

_GPUS = int(os.environ.get("SHIM_GPUS", "2"))
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: _GPUS
torch.cuda.set_device = lambda *a, **k: None
torch.cuda.current_device = lambda: int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.empty_cache = lambda: None
torch.cuda.get_device_name = lambda *a, **k: "shim"
torch.cuda.get_device_capability = lambda *a, **k: (8, 0)
torch.cuda.is_bf16_supported = lambda *a, **k: False
torch.cuda.device = lambda *a, **k: contextlib.nullcontext()
for _name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
    setattr(torch.cuda, _name, lambda *a, **k: 0)
torch.cuda.reset_peak_memory_stats = lambda *a, **k: None

_init = dist.init_process_group


def _init_process_group(*args, **kwargs):
    if args and isinstance(args[0], str):
        args = ("gloo", *args[1:])
    if "backend" in kwargs:
        kwargs["backend"] = "gloo"
    kwargs.pop("device_id", None)
    return _init(*args, **kwargs)


dist.init_process_group = _init_process_group

_ddp_init = torch.nn.parallel.DistributedDataParallel.__init__


def _ddp(self, module, device_ids=None, output_device=None, *args, **kwargs):
    _ddp_init(self, module, None, None, *args, **kwargs)


torch.nn.parallel.DistributedDataParallel.__init__ = _ddp
torch.nn.SyncBatchNorm.convert_sync_batchnorm = classmethod(lambda cls, module, process_group=None: module)

_load = torch.load


def _torch_load(*args, **kwargs):
    if "map_location" in kwargs and not callable(kwargs["map_location"]):
        kwargs["map_location"] = _host(kwargs["map_location"])
    return _load(*args, **kwargs)


torch.load = _torch_load

_loader_init = torch.utils.data.DataLoader.__init__


def _loader(self, *args, **kwargs):
    kwargs["pin_memory"] = False
    _loader_init(self, *args, **kwargs)


torch.utils.data.DataLoader.__init__ = _loader

for _scaler_class in {torch.amp.GradScaler, torch.cuda.amp.GradScaler}:
    _scaler_init = _scaler_class.__init__

    def _scaler(self, *args, _original=_scaler_init, **kwargs):
        kwargs["enabled"] = False
        _original(self, *args, **kwargs)

    _scaler_class.__init__ = _scaler

for _extra in sorted(glob.glob(os.path.join(os.environ.get("SHIM_EXTRA", "/nonexistent"), "extra_*.py"))):
    _spec = importlib.util.spec_from_file_location(os.path.basename(_extra)[:-3], _extra)
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
