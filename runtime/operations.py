"""Nested data (tensors in dicts, lists, tuples, named tuples) for the single-process stand-in.

- ``apply(fn, data)``: ``fn`` on every tensor, the structure rebuilt around the results;
- ``send_to_device(data, device)``: every tensor (and object with a ``.to``, such as a tokenizer's
  ``BatchEncoding``) moved to ``device``, as Accelerate moves a batch;
- ``to_float32(data)``: float16/bfloat16 tensors as float32 (what Accelerate does to a prepared
  model's outputs under mixed precision);
- ``is_tensors(data)``: whether every leaf is a tensor.

Imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch


class NotATensor(TypeError):
    """A leaf that is not a tensor where only tensors are allowed."""


def apply(fn: Callable[[torch.Tensor], Any], data: Any, strict: bool = False) -> Any:
    """``data`` with ``fn`` applied to each tensor in it. Input: a tensor or a nested
    dict/list/tuple of them. Output: the same structure (same container types). Other leaves are
    kept as they are, or raise ``NotATensor`` when ``strict``."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: apply(fn, v, strict) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple
        return type(data)(*(apply(fn, v, strict) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply(fn, v, strict) for v in data)
    if strict:
        raise NotATensor(f"expected tensors (in dicts, lists and tuples), found a {type(data).__name__}")
    return data


def is_tensors(data: Any) -> bool:
    """Whether ``data`` is a tensor or a nested dict/list/tuple whose every leaf is one."""
    try:
        apply(lambda t: t, data, strict=True)
    except NotATensor:
        return False
    return True


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``data`` with its tensors on ``device``. Input: a batch (tensor, nested containers, an
    object with a ``.to(device)`` method). Output: the same structure on ``device``; strings,
    numbers and other objects unchanged."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: send_to_device(v, device, non_blocking) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(send_to_device(v, device, non_blocking) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(send_to_device(v, device, non_blocking) for v in data)
    to = getattr(data, "to", None)
    if callable(to) and not isinstance(data, (str, bytes)):
        return to(device)
    return data


def to_float32(data: Any) -> Any:
    """``data`` with its float16 and bfloat16 tensors converted to float32 (others unchanged)."""
    return apply(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, data)


def _rebuild_mapping(original: Mapping, items: dict) -> Any:
    """A mapping of ``original``'s type holding ``items`` (a plain dict when that type cannot be
    built from a dict, e.g. a ``defaultdict``)."""
    try:
        return type(original)(items)
    except TypeError:
        return items
