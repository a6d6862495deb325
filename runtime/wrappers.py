"""What the single-process ``Accelerator.prepare`` hands back, and the state they share.

- ``GradientState``: the accumulation step count, whether this step synchronises (steps the
  optimizer), and the dataloaders being iterated (Accelerate's ``GradientState`` in one process);
- ``DeviceLoader``: a prepared DataLoader. It iterates the original loader (same samples, same
  random draws) one batch ahead, as Accelerate's ``DataLoaderShard`` does, so it knows which batch
  is the last one (a step at the end of each epoch), and moves every batch to the device;
- ``GatedOptimizer``: a prepared optimizer whose ``step()``/``zero_grad()`` do nothing between
  accumulation boundaries, and step through the GradScaler under fp16 (Accelerate's
  ``AcceleratedOptimizer``);
- ``GatedScheduler``: a prepared LR scheduler that steps only when its optimizer did
  (Accelerate's ``AcceleratedScheduler`` in one process).

Imports torch.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import BatchSampler

from accelify.runtime.operations import send_to_device


_END = object()  # no batch left


class GradientState:
    """Shared by one Accelerator and what it prepared.

    ``num_steps``: batches accumulated per optimizer step; ``sync_gradients``: whether the current
    batch ends an accumulation (the optimizer steps); ``loaders``: the DeviceLoaders being
    iterated, innermost last."""

    def __init__(self, num_steps: int = 1) -> None:
        self.num_steps = num_steps
        self.sync_gradients = True
        self.loaders: list[DeviceLoader] = []

    @property
    def in_dataloader(self) -> bool:
        return bool(self.loaders)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the innermost loader being iterated is on its last batch."""
        return self.loaders[-1].end_of_dataloader if self.loaders else False

    @property
    def remainder(self) -> int:
        """Samples in the innermost loader's last batch when it is not full (0: it is full; -1:
        unknown, or no loader is being iterated)."""
        return self.loaders[-1].remainder if self.loaders else -1


class DeviceLoader:
    """A prepared DataLoader: iterating it yields the original loader's batches, on ``device``.

    Input: a ``torch.utils.data.DataLoader`` (or any iterable with a ``__len__``). ``len()``,
    ``dataset``, ``batch_size``, ``sampler`` and every other attribute are the original loader's.
    While it is iterated it is registered in ``state`` (for ``accumulate`` and
    ``gather_for_metrics``), ``end_of_dataloader`` is True on the last batch.
    """

    def __init__(self, loader: Any, device: Optional[torch.device], state: GradientState) -> None:
        self.base_dataloader = loader
        self.device = device
        self.gradient_state = state
        self.end_of_dataloader = False
        self.remainder = -1
        self.iteration = 0

    # attributes passed through ---------------------------------------------------------------
    @property
    def dataset(self) -> Any:
        return self.base_dataloader.dataset

    @property
    def batch_size(self) -> Any:
        return self.base_dataloader.batch_size

    @property
    def sampler(self) -> Any:
        return self.base_dataloader.sampler

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.base_dataloader!r}, device={self.device})"

    # iteration ---------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Tell the sampler (or the dataset) the epoch, as Accelerate's prepared loader does at the
        start of each pass."""
        self.iteration = epoch
        batch_sampler = getattr(self.base_dataloader, "batch_sampler", None)
        if hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(epoch)
        if hasattr(getattr(batch_sampler, "sampler", None), "set_epoch"):
            batch_sampler.sampler.set_epoch(epoch)
        elif hasattr(getattr(self.base_dataloader, "dataset", None), "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self._begin()
        self.set_epoch(self.iteration)
        try:
            batches = iter(self.base_dataloader)
            current = next(batches, _END)
            while current is not _END:
                if self.device is not None:
                    current = send_to_device(current, self.device)
                following = next(batches, _END)  # one batch ahead: is `current` the last one?
                self.end_of_dataloader = following is _END
                yield current
                current = following
            self.iteration += 1
        finally:  # also when the loop over it stops early
            self._end()

    def _begin(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1
        if not getattr(self.base_dataloader, "drop_last", False):
            try:
                loader = self.base_dataloader
                batches = loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler
                self.remainder = len(self.dataset) % batches.batch_size
            except Exception:  # no length, no batch size: unknown
                self.remainder = -1
        self.gradient_state.loaders.append(self)

    def _end(self) -> None:
        loaders = self.gradient_state.loaders
        for i in range(len(loaders) - 1, -1, -1):
            if loaders[i] is self:
                del loaders[i]
                break


class GatedOptimizer(torch.optim.Optimizer):
    """A prepared optimizer. Input: the optimizer, the shared state, a GradScaler or None.

    ``step()`` and ``zero_grad()`` act only on accumulation boundaries (``sync_gradients``); with
    a scaler, ``step()`` is the scaler's step and update, and ``step_was_skipped`` tells whether it
    skipped the update (inf/NaN gradients). Everything else is the wrapped optimizer's
    (``param_groups``, ``state``, ``state_dict()``...). An ``Optimizer`` itself, so that a scheduler
    can be built on it after ``prepare``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, state: GradientState, scaler: Any = None) -> None:
        # Not Optimizer.__init__: the wrapped optimizer holds the parameters and the state.
        self.optimizer = optimizer
        self.gradient_state = state
        self.scaler = scaler
        self._is_overflow = False

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> Any:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: Any) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict:  # type: ignore[override]
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return
        if "set_to_none" in inspect.signature(self.optimizer.zero_grad).parameters:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)
        elif set_to_none is not None:
            raise ValueError("this optimizer's zero_grad() takes no `set_to_none`")
        else:
            self.optimizer.zero_grad()

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return None
        if self.scaler is None:
            return self.optimizer.step() if closure is None else self.optimizer.step(closure)
        # GradScaler.step skips the optimizer's step on inf/NaN gradients: watch whether it ran.
        ran = []
        inner = self.optimizer
        had_own_step = "step" in vars(inner)
        original = inner.step

        def watched(*args: Any, **kwargs: Any) -> Any:
            ran.append(True)
            return original(*args, **kwargs)

        inner.step = watched  # type: ignore[method-assign]
        try:
            result = self.scaler.step(inner) if closure is None else self.scaler.step(inner, closure)
            self.scaler.update()
        finally:
            if had_own_step:
                inner.step = original  # type: ignore[method-assign]
            else:
                del inner.step
        self._is_overflow = not ran
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step()`` on a boundary skipped the update (fp16 overflow)."""
        return self._is_overflow

    def train(self) -> None:
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()

    def eval(self) -> None:
        if callable(getattr(self.optimizer, "eval", None)):
            self.optimizer.eval()

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"GatedOptimizer({self.optimizer!r})"


class GatedScheduler:
    """A prepared LR scheduler. Input: the scheduler, the shared state, the prepared optimizers it
    follows. ``step()`` does nothing between accumulation boundaries (it only counts the call, as
    Accelerate does) nor after an optimizer step the GradScaler skipped; otherwise it steps once.
    Every other attribute is the scheduler's."""

    def __init__(self, scheduler: Any, state: GradientState, optimizers: list) -> None:
        self.scheduler = scheduler
        self.gradient_state = state
        self.optimizers = optimizers

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.gradient_state.sync_gradients:
            if hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR: never step past its end
        if total is not None and self.scheduler._step_count > total:
            return
        self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"GatedScheduler({self.scheduler!r})"
