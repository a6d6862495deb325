"""accelify.runtime: what converted scripts may import.

Installed as ``accelify.runtime`` (the folder in the repository is ``runtime/``). It depends on
torch only and never imports libcst, rich or typer, so it can ship to a training environment
alone. ``accelify convert --target runtime`` writes ``from accelify.runtime import Accelerator``
(and ``set_seed``, ``DistributedDataParallelKwargs``, ``gather_object``, ``gather``, ``reduce``,
``wait_for_everyone``, ``PartialState``, ``broadcast``) instead of importing accelerate.

Each name is resolved on first use (module ``__getattr__``), so ``import accelify.runtime``
imports neither torch nor accelerate:

- when ``accelerate`` is importable, the name IS accelerate's object
  (``accelify.runtime.Accelerator is accelerate.Accelerator``);
- otherwise it is the single-process stand-in of ``accelify.runtime.single_process``, which
  implements the part of Accelerate's API that accelify emits, behaving as Accelerate does in one
  process (and refusing to run under a multi-process launcher).

Input: an attribute name. Output: accelerate's object, or the stand-in.
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> (accelerate's module, its attribute)
_FROM_ACCELERATE = {
    "Accelerator": ("accelerate", "Accelerator"),
    "DistributedDataParallelKwargs": ("accelerate", "DistributedDataParallelKwargs"),
    "set_seed": ("accelerate.utils", "set_seed"),
    "gather_object": ("accelerate.utils", "gather_object"),
    "reduce": ("accelerate.utils", "reduce"),
    "wait_for_everyone": ("accelerate.utils", "wait_for_everyone"),
    "PartialState": ("accelerate", "PartialState"),
    "gather": ("accelerate.utils", "gather"),
    "broadcast": ("accelerate.utils", "broadcast"),
}

__all__ = sorted(_FROM_ACCELERATE)


def __getattr__(name: str) -> Any:
    if name not in _FROM_ACCELERATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _FROM_ACCELERATE[name]
    try:
        value = getattr(importlib.import_module(module), attribute)
    except ImportError:  # accelerate is not installed (a broken install raises what it raises)
        from accelify.runtime import single_process

        value = getattr(single_process, name)
    globals()[name] = value  # resolved once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def uses_accelerate() -> bool:
    """Whether the names above are accelerate's (True) or the single-process stand-ins (False).
    Imports accelerate when it is installed."""
    from accelify.runtime import single_process

    accelerator = globals().get("Accelerator") or __getattr__("Accelerator")
    return accelerator is not single_process.Accelerator
