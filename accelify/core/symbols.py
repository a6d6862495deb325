"""What names a piece of code reads, from CPython's own symbol tables (fast: no LibCST tree).

Two questions the pipeline asks of the converted text: does it read a name that nothing
binds (a rewrite must never add one: an ``accelerator`` used in a function it does not
reach would be a NameError at run time), and which names does it still read (an import
of a name nobody reads any more can go).
"""

from __future__ import annotations

import builtins
import re
import symtable
from typing import Iterator, Optional

_STAR = re.compile(r"\bimport\s*\(?\s*\*")
_MODULE_ATTRIBUTES = frozenset({
    "__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__", "__path__",
    "__annotations__", "__dict__", "__cached__", "__debug__",
})


def _tables(source: str) -> Optional[symtable.SymbolTable]:
    try:
        return symtable.symtable(source, "<source>", "exec")
    except (SyntaxError, ValueError):
        return None


def _walk(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    yield table
    for child in table.get_children():
        yield from _walk(child)


def _module_bound(top: symtable.SymbolTable) -> set[str]:
    bound: set[str] = set()
    for table in _walk(top):
        for symbol in table.get_symbols():
            if table is top and (symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()):
                bound.add(symbol.get_name())
            elif symbol.is_declared_global() and symbol.is_assigned():
                bound.add(symbol.get_name())  # `global x; x = ...` in a function
    return bound


def module_names(source: str) -> set[str]:
    """The names the module binds at its top, or from a function with ``global`` (empty if it does not compile)."""
    top = _tables(source)
    return _module_bound(top) if top is not None else set()


def undefined_names(source: str) -> set[str]:
    """Names read that no scope binds, the module's included, and that are no builtins."""
    top = _tables(source)
    if top is None:
        return set()
    bound = _module_bound(top)
    if _STAR.search(source):
        return set()  # `from m import *`: anything may be bound
    missing: set[str] = set()
    for table in _walk(top):
        for symbol in table.get_symbols():
            if not symbol.is_referenced():
                continue
            name = symbol.get_name()
            if table is top:
                unbound = name not in bound
            else:
                unbound = symbol.is_global() and name not in bound
            if unbound and not hasattr(builtins, name) and name not in _MODULE_ATTRIBUTES:
                missing.add(name)
    return missing


def read_anywhere(source: str) -> Optional[set[str]]:
    """Every name some scope of ``source`` reads (None when it does not compile)."""
    top = _tables(source)
    if top is None:
        return None
    return {s.get_name() for table in _walk(top) for s in table.get_symbols() if s.is_referenced()}
