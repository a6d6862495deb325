"""The stand-ins ``accelify.runtime`` uses when accelerate is not installed: one process.

- ``Accelerator``: the part of ``accelerate.Accelerator`` that accelify emits, behaving as
  Accelerate does in one process (the semantics were read off accelerate 1.x's ``accelerator.py``,
  ``state.py``, ``data_loader.py``, ``optimizer.py`` and ``scheduler.py``);
- ``DistributedDataParallelKwargs``: a dataclass with accelerate's fields (nothing to apply in one
  process);
- ``set_seed``: seeds ``random``, NumPy (when installed) and torch (every CUDA device);
- ``gather_object``: the object itself, as ``accelerate.utils.gather_object`` in one process.

Importing this module imports torch. Tests build these directly, whatever is installed.

What the stand-in ``Accelerator`` supports (anything else raises ``TypeError`` at construction or
``AttributeError`` naming the missing method):

- constructor keywords ``cpu``, ``mixed_precision`` (``"no"``, ``"fp16"``, ``"bf16"``),
  ``gradient_accumulation_steps`` and ``kwargs_handlers`` (``DistributedDataParallelKwargs``,
  which one process does not use);
- device: CUDA when available, else MPS, else the CPU; ``cpu=True`` forces the CPU;
  ``$ACCELERATE_TORCH_DEVICE`` names another, as for Accelerate;
- mixed precision as Accelerate does it in one process: ``"bf16"`` autocasts on the device
  (CPU, CUDA with bfloat16 support, MPS); ``"fp16"`` autocasts and scales the loss with a
  GradScaler on CUDA, and on the CPU does nothing at all (as Accelerate, which enables fp16 only on
  accelerators); fp16 on MPS is refused (install accelerate). A prepared model's forward runs
  under autocast and returns float32 tensors, as with Accelerate;
- it refuses to start (``RuntimeError``) when a launcher started several processes
  (``WORLD_SIZE`` > 1): that needs accelerate.
"""

from __future__ import annotations

import builtins

import contextlib
import dataclasses
import functools
import os
import random
from typing import Any, Iterator, Optional

import torch

from accelify.runtime import operations
from accelify.runtime.wrappers import DeviceLoader, GatedOptimizer, GatedScheduler, GradientState

_PRECISIONS = ("no", "fp16", "bf16")


@dataclasses.dataclass
class DistributedDataParallelKwargs:
    """``accelerate.DistributedDataParallelKwargs``' fields (the arguments of
    ``torch.nn.parallel.DistributedDataParallel`` Accelerate passes on); one process has no DDP
    wrapper, so the stand-in Accelerator only keeps it."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_kwargs(self) -> dict:
        """The fields that differ from their defaults (what Accelerate would pass to DDP)."""
        default = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if default[k] != v}


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy's global generator (when NumPy is installed) and torch
    (CPU and every CUDA device). ``device_specific`` adds the process index (0 here);
    ``deterministic`` turns on ``torch.use_deterministic_algorithms``."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # a no-op without CUDA
    if deterministic:
        torch.use_deterministic_algorithms(True)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """accelerate.utils.reduce in one process: a copy of the tensor (the sum or mean over one process)."""
    return tensor.clone()


def wait_for_everyone() -> None:
    """accelerate.utils.wait_for_everyone in one process: nothing to wait for."""


class PartialState:
    """``accelerate.PartialState`` in one process: the first and only process, no process group."""

    num_processes = 1
    process_index = 0
    local_process_index = 0
    is_main_process = True
    is_local_main_process = True
    use_distributed = False

    @property
    def device(self) -> torch.device:
        return _default_device()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``PartialState().print``: the one process is the main one."""
        builtins.print(*args, **kwargs)


def gather(tensor: Any) -> Any:
    """``accelerate.utils.gather`` in one process: the tensor (or nested tensors), unchanged."""
    return tensor


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """``accelerate.utils.broadcast`` in one process: the tensor (or nested tensors), unchanged."""
    return tensor


def gather_object(object: Any) -> Any:  # noqa: A002 (accelerate's parameter name)
    """``accelerate.utils.gather_object`` in one process: the object, unchanged."""
    return object


@dataclasses.dataclass(frozen=True)
class State:
    """The few facts of ``accelerator.state`` a one-process run has."""

    device: torch.device
    mixed_precision: str
    num_processes: int = 1
    process_index: int = 0
    local_process_index: int = 0
    distributed_type: str = "NO"
    is_main_process: bool = True
    is_local_main_process: bool = True
    is_last_process: bool = True
    use_distributed: bool = False


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class Accelerator:
    """Single-process ``accelerate.Accelerator``: the objects ``prepare`` returns train exactly as
    Accelerate's would in one process (see the module docstring for what is supported)."""

    def __init__(
        self,
        *,
        cpu: bool = False,
        mixed_precision: Optional[str] = None,
        gradient_accumulation_steps: int = 1,
        kwargs_handlers: Optional[list] = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise TypeError(
                f"accelify.runtime.Accelerator without accelerate takes only cpu, mixed_precision, "
                f"gradient_accumulation_steps and kwargs_handlers, not {', '.join(sorted(unsupported))}; "
                "install accelerate (`pip install accelerate`) for the others."
            )
        world = _world_size()
        if world > 1:
            raise RuntimeError(
                f"this script was started as one of {world} processes (WORLD_SIZE={world}), but accelerate "
                "is not installed: accelify.runtime's own Accelerator runs a single process only. Install "
                "accelerate (`pip install accelerate`) to train on several processes, or run the script "
                "with plain `python`."
            )
        if not isinstance(gradient_accumulation_steps, int) or isinstance(gradient_accumulation_steps, bool) \
                or gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be a positive int, not {gradient_accumulation_steps!r}")
        precision = "no" if mixed_precision is None else str(getattr(mixed_precision, "value", mixed_precision))
        if precision not in _PRECISIONS:
            raise ValueError(
                f"mixed_precision {mixed_precision!r} is not supported without accelerate; choose one of "
                f"{', '.join(_PRECISIONS)} (or install accelerate)."
            )
        self.ddp_handler: Optional[DistributedDataParallelKwargs] = None
        for handler in kwargs_handlers or ():
            if not isinstance(handler, DistributedDataParallelKwargs):
                raise TypeError(
                    f"kwargs_handlers: accelify.runtime.Accelerator without accelerate takes "
                    f"DistributedDataParallelKwargs only, not {type(handler).__name__}."
                )
            if self.ddp_handler is not None:
                raise ValueError("You can only pass one DistributedDataParallelKwargs in `kwargs_handlers`.")
            self.ddp_handler = handler

        chosen = os.environ.get("ACCELERATE_TORCH_DEVICE")  # as Accelerate's PartialState reads it
        self._device = torch.device(chosen) if chosen else torch.device("cpu") if cpu else _default_device()
        self._mixed_precision = precision
        self.gradient_state = GradientState(gradient_accumulation_steps)
        self.step = 0
        self.scaler: Any = None
        self.native_amp = False
        if precision == "fp16" and self._device.type != "cpu":
            if self._device.type != "cuda":
                raise ValueError(
                    f"fp16 mixed precision on {self._device.type} needs accelerate (`pip install accelerate`); "
                    "accelify.runtime's own Accelerator supports it on CUDA."
                )
            self.native_amp = True
            self.scaler = torch.amp.GradScaler("cuda")
        elif precision == "bf16":
            if self._device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ValueError("bf16 mixed precision requires a GPU with bfloat16 support.")
            self.native_amp = True
        self._optimizers: list = []
        self._models: list = []
        self._schedulers: list = []
        self._dataloaders: list = []
        self._trigger = False

    # -- one process ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def state(self) -> State:
        return State(self._device, self._mixed_precision)

    @property
    def mixed_precision(self) -> str:
        return self._mixed_precision

    distributed_type = "NO"
    num_processes = 1
    process_index = 0
    local_process_index = 0
    is_main_process = True
    is_local_main_process = True
    is_last_process = True
    use_distributed = False

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """A barrier: nothing to wait for in one process."""

    def end_training(self) -> None:
        """Nothing to tear down in one process."""

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        yield

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: Any) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        yield inputs

    def set_trigger(self) -> None:
        """Raise the flag ``check_trigger`` reads (a break decided on one process)."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """Whether ``set_trigger`` was called since the last check (the flag is then lowered)."""
        fired, self._trigger = self._trigger, False
        return fired

    # -- collectives: the data itself in one process ----------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return tensor

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``input_data``, cut as Accelerate cuts it in one process: on the last batch of a loader
        whose dataset does not divide into full batches, tensors (or a gathered object) are cut
        to the samples of that batch along their first dimension."""
        use_gather_object = use_gather_object or not operations.is_tensors(input_data)
        state = self.gradient_state
        if not state.end_of_dataloader or state.remainder <= 0:
            return input_data
        try:
            if use_gather_object:
                return input_data[: state.remainder]
            return operations.apply(lambda t: t[: state.remainder], input_data)
        except Exception:  # not sliceable (a 0-d tensor, an object): as it is, like Accelerate
            return input_data

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """A copy of the tensors (one process: the sum, mean or max of one value is itself)."""
        if reduction not in ("sum", "mean", "max", "none"):
            raise ValueError(f"reduction must be 'sum', 'mean', 'max' or 'none', not {reduction!r}")
        return operations.apply(lambda t: t.clone(), tensor, strict=True)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        return tensor

    # -- preparing ----------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: Optional[list] = None) -> Any:
        """DataLoaders, models, optimizers and LR schedulers ready to train; other objects as they
        are. Returns them in the order given (a single object unwrapped, as Accelerate does)."""
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(f"`device_placement` should be a list with {len(args)} elements (the number of objects passed).")
        first = [self._prepare_one(obj, place) for obj, place in zip(args, device_placement)]
        result = tuple(
            self.prepare_scheduler(obj) if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) else obj
            for obj in first
        )
        return result if len(result) > 1 else result[0]

    def _prepare_one(self, obj: Any, device_placement: Optional[bool]) -> Any:
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=device_placement)
        return obj

    def prepare_data_loader(self, data_loader: Any, device_placement: Optional[bool] = None) -> DeviceLoader:
        """A loader whose batches are on ``device`` (see ``DeviceLoader``)."""
        if isinstance(data_loader, DeviceLoader):
            return data_loader
        loader = DeviceLoader(data_loader, self._device if device_placement is not False else None, self.gradient_state)
        self._dataloaders.append(loader)
        return loader

    def prepare_model(self, model: torch.nn.Module, device_placement: Optional[bool] = None, **_: Any) -> torch.nn.Module:
        """The model itself, moved to ``device``; under mixed precision its forward runs under
        autocast and returns float32 tensors."""
        if model in self._models:
            return model
        self._models.append(model)
        if device_placement is not False:
            model.to(self._device)
        if self.native_amp and "_original_forward" not in vars(model):
            original = model.forward
            autocast = self.autocast

            @functools.wraps(original)
            def forward(*args: Any, **kwargs: Any) -> Any:
                with autocast():
                    outputs = original(*args, **kwargs)
                return operations.to_float32(outputs)

            model._original_forward = original
            model.forward = forward
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: Optional[bool] = None) -> Any:
        """The optimizer itself, or (gradient accumulation, an fp16 GradScaler) a ``GatedOptimizer``
        that steps only on accumulation boundaries. Any state it holds goes to its parameters'
        device."""
        if isinstance(optimizer, GatedOptimizer) or optimizer in self._optimizers:
            return optimizer
        if optimizer.state and device_placement is not False:
            optimizer.load_state_dict(optimizer.state_dict())  # torch casts the state to each parameter's device
        if self.gradient_state.num_steps > 1 or self.scaler is not None:
            optimizer = GatedOptimizer(optimizer, self.gradient_state, self.scaler)
        self._optimizers.append(optimizer)
        return optimizer

    def prepare_scheduler(self, scheduler: Any) -> Any:
        """The scheduler itself, or (when the optimizer is gated) a ``GatedScheduler`` that steps
        only when its optimizer did."""
        if isinstance(scheduler, GatedScheduler):
            return scheduler
        gated = [opt for opt in self._optimizers if isinstance(opt, GatedOptimizer)]
        if not gated:
            self._schedulers.append(scheduler)
            return scheduler
        own = [opt for opt in gated if getattr(scheduler, "optimizer", None) in (opt, opt.optimizer)]
        wrapped = GatedScheduler(scheduler, self.gradient_state, own or gated)
        self._schedulers.append(wrapped)
        return wrapped

    # -- training step ------------------------------------------------------------------------------
    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.num_steps = steps

    @property
    def sync_gradients(self) -> bool:
        """Whether the current step ends an accumulation (the prepared optimizer steps)."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @contextlib.contextmanager
    def accumulate(self, *models: Any) -> Iterator[None]:
        """One batch of gradient accumulation: the optimizer steps on every
        ``gradient_accumulation_steps``-th batch and on the last batch of the loader."""
        self._do_sync()
        yield

    def _do_sync(self) -> None:
        if self.gradient_state.end_of_dataloader:
            self.step = 0
            self.gradient_state.sync_gradients = True
        else:
            self.step += 1
            self.gradient_state.sync_gradients = self.step % self.gradient_state.num_steps == 0

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, the loss divided by ``gradient_accumulation_steps`` (and scaled by
        the GradScaler under fp16 on CUDA)."""
        loss = loss / self.gradient_accumulation_steps
        if self.scaler is not None:
            self.scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    @contextlib.contextmanager
    def autocast(self, autocast_handler: Any = None) -> Iterator[None]:
        """``torch.autocast`` on the device in the mixed precision chosen; nothing without one."""
        if autocast_handler is not None:
            raise TypeError("accelify.runtime.Accelerator without accelerate takes no autocast_handler")
        if not self.native_amp:
            yield
            return
        dtype = torch.float16 if self._mixed_precision == "fp16" else torch.bfloat16
        with torch.autocast(device_type=self._device.type, dtype=dtype):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide the gradients by the GradScaler's scale (fp16 on CUDA only; otherwise nothing)."""
        if self.scaler is None:
            return
        optimizers = self._optimizers if optimizer is None else (
            optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        for opt in optimizers:
            while isinstance(opt, GatedOptimizer):
                opt = opt.optimizer
            self.scaler.unscale_(opt)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        self.unscale_gradients()
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(getattr(opt, "step_was_skipped", False) for opt in self._optimizers)

    # -- models and files -------------------------------------------------------------------------
    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
        """The model without ``DataParallel``/``DistributedDataParallel`` around it. As Accelerate:
        a ``torch.compile``d model stays compiled (around the unwrapped one) unless
        ``keep_torch_compile=False``; ``keep_fp32_wrapper=False`` restores the forward that
        ``prepare`` put under autocast."""
        compiled = model if "_orig_mod" in getattr(model, "_modules", {}) else None
        if compiled is not None:
            model = compiled._orig_mod
        while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        if not keep_fp32_wrapper and "_original_forward" in vars(model):
            original = vars(model).pop("_original_forward")
            vars(model).pop("forward", None)
            if getattr(original, "__self__", None) is not model:  # a forward set on the instance before
                model.forward = original
        if keep_torch_compile and compiled is not None:
            compiled._orig_mod = model
            return compiled
        return model

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save(obj, f)`` (one process is the main process)."""
        if safe_serialization:
            raise NotImplementedError("safe_serialization needs accelerate (`pip install accelerate`)")
        torch.save(obj, f)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"accelify.runtime.Accelerator (accelerate is not installed) has no {name!r}: it covers the API "
            "accelify emits. Install accelerate (`pip install accelerate`) for the rest."
        )

    def __repr__(self) -> str:
        return (f"accelify.runtime.Accelerator(device={self._device}, mixed_precision={self._mixed_precision!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")
