"""Loops: the loop over a given loader around a node, its enumerate counter, and the loader
under ``enumerate``/``tqdm`` wrappers."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.queries.names import DATALOADERS, assigned_names, qualified_names
from accelify.queries.refs import assigned_values, bound_once, ref_of


def enclosing_loop_over(visitor: cst.MetadataDependent, node: cst.CSTNode, refs) -> Optional[cst.For]:
    """The innermost ``for`` around ``node`` whose iterable (``tqdm(enumerate(loader))`` peeled) is one
    of ``refs`` (the prepared loaders), or None."""
    from libcst.metadata import ParentNodeProvider

    parent = visitor.get_metadata(ParentNodeProvider, node, None)
    while parent is not None:
        if isinstance(parent, cst.For) and ref_of(visitor, peel_iterable(visitor, parent.iter)) in refs:
            return parent
        parent = visitor.get_metadata(ParentNodeProvider, parent, None)
    return None


def enumerate_counter(loop: cst.For) -> set[str]:
    """The batch index of ``for i, batch in enumerate(loader)`` (``tqdm(enumerate(loader))`` too): a
    number the loop counts, not part of the batch."""
    it: cst.BaseExpression = loop.iter
    while isinstance(it, cst.Call) and not m.matches(it.func, m.Name("enumerate")) and it.args:
        it = it.args[0].value  # tqdm(enumerate(loader), ...)
    if m.matches(it, m.Call(func=m.Name("enumerate"))) and isinstance(loop.target, (cst.Tuple, cst.List)) \
            and loop.target.elements:
        return set(assigned_names(loop.target.elements[0].value))
    return set()


def peel_iterable(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))`` -> ``loader``; ``bar = tqdm(loader)`` ... ``enumerate(bar)`` too."""
    for _ in range(4):  # through a few such names, never round a cycle
        while isinstance(expr, cst.Call) and expr.args:
            names = qualified_names(visitor, expr.func)
            if names & {"builtins.enumerate", "enumerate", "builtins.iter", "iter"} or any(
                n == "tqdm" or n.startswith("tqdm.") for n in names
            ) or _logs_every(expr):
                expr = expr.args[0].value
            else:
                break
        if not isinstance(expr, cst.Name):
            break
        value = bound_once(visitor, expr)
        if value is None:
            break
        wraps = isinstance(value, cst.Call) and value.args and (
            qualified_names(visitor, value.func) & {"builtins.enumerate", "enumerate", "builtins.iter", "iter"}
            or any(n == "tqdm" or n.startswith("tqdm.") for n in qualified_names(visitor, value.func))
        )
        if not wraps:
            break
        expr = value
    return expr


def _logs_every(call: cst.Call) -> bool:
    """``metric_logger.log_every(loader, print_freq, header)``: the torchvision references' ``MetricLogger``
    (DINO, DeiT, MAE, the detection references), a generator that yields the loader's batches as they are."""
    return m.matches(call.func, m.Attribute(attr=m.Name("log_every"))) and call.args[0].keyword is None


def built_loader(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> bool:
    """``DataLoader(...)``, or a name bound only to ``DataLoader(...)`` where it is read (what a helper
    that builds a loader returns)."""
    if isinstance(expr, cst.Call):
        return bool(qualified_names(visitor, expr.func) & DATALOADERS)
    values = assigned_values(visitor, expr) if isinstance(expr, cst.Name) else []
    return bool(values) and all(isinstance(v, cst.Call) and qualified_names(visitor, v.func) & DATALOADERS
                                for v in values)
