"""What a DataLoader's worker processes run: the worker methods of a module's classes and what they call of it.

A worker started by ``spawn`` shares no state with the process that made it: ``PartialState()`` there would
set the processes up again. Code that asks Accelerate's state leaves these functions alone.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.queries.walk import findall

#: methods a DataLoader's worker processes may run (there the Accelerator's state is not set up)
WORKER_METHODS = frozenset({"__getitem__", "__getitems__", "__iter__", "__next__", "__len__", "__call__"})


def run_by_workers(tree: cst.Module) -> set[int]:
    """Ids of the functions a DataLoader's worker processes may run: the worker methods of the module's classes
    (``__getitem__``) and what they call of the module, by name (``load(path)``) or on ``self``, transitively.
    In a worker started by ``spawn`` no state is shared: ``PartialState()`` there would set the processes up
    again."""
    functions = {s.name.value: s for s in tree.body if isinstance(s, cst.FunctionDef)}
    classes = [s for s in tree.body if isinstance(s, cst.ClassDef)]
    methods = {(c.name.value, s.name.value): s for c in classes for s in c.body.body if isinstance(s, cst.FunctionDef)}
    stack = [(owner, f) for (owner, name), f in methods.items() if name in WORKER_METHODS]
    seen: set[int] = set()
    while stack:
        owner, func = stack.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        for call in findall(func, m.Call()):
            if isinstance(call.func, cst.Name) and call.func.value in functions:
                stack.append((None, functions[call.func.value]))
            elif (owner is not None and m.matches(call.func, m.Attribute(value=m.Name("self")))
                  and (owner, call.func.attr.value) in methods):  # type: ignore[attr-defined]
                stack.append((owner, methods[(owner, call.func.attr.value)]))  # type: ignore[attr-defined]
    return seen

