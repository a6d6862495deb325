"""ACC119: leaving the training loop on a value each process computes from its own shard.

After ``prepare`` every process sees a different part of the data, so a
validation loss or a batch loss differs between processes.  ``if val_loss >
best: break`` then stops one process and not the others, and the next
collective (a gradient all-reduce, ``gather_for_metrics``, ``wait_for_everyone``)
waits forever.  Accelerate's answer is ``accelerator.set_trigger()`` on the
deciding process and ``if accelerator.check_trigger(): break`` on all of them.

Which values differ per process is a small taint analysis over one function:
the prepared dataloaders are the sources; a name assigned from an expression
that reads a tainted name, or assigned under an ``if`` whose test does, is
tainted too; a value passed through ``gather``/``gather_for_metrics``/``reduce``
is the same on every process again.  Step counters, ``len(loader)`` and
arguments stay clean, so ``if step >= max_steps: break`` is not reported.
"""

from __future__ import annotations

from typing import Iterator, Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, PositionProvider

from accelify.queries.loops import peel_iterable
from accelify.queries.names import assigned_names, qualified_names
from accelify.queries.records import RawFinding
from accelify.queries.refs import MODULE, key_at, ref_of
from accelify.queries.walk import findall

_GATHERS = frozenset({"gather", "gather_for_metrics", "reduce", "pad_across_processes", "check_trigger"})
Loop = Union[cst.For, cst.While]
_EMPTY = cst.Module(body=[])


def _reads(expr: cst.CSTNode) -> Iterator[str]:
    """Names (and ``self.x`` attributes) an expression reads, except through a gather."""
    if isinstance(expr, cst.Call) and m.matches(expr.func, m.Attribute(attr=m.Name())) and expr.func.attr.value in _GATHERS:  # type: ignore[attr-defined]
        return
    if isinstance(expr, cst.Name):
        yield expr.value
        return
    if isinstance(expr, cst.Attribute):
        if isinstance(expr.value, cst.Name) and expr.value.value == "self":
            yield f"self.{expr.attr.value}"
        yield from _reads(expr.value)
        return
    if isinstance(expr, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
        return
    for child in expr.children:
        yield from _reads(child)


class EarlyStops:
    def __init__(self, visitor: cst.MetadataDependent, plan, module: cst.Module, loops: list[Loop], exits: list[cst.CSTNode],
                 trust_gathers: bool = False):
        """``trust_gathers``: a value a function of the file returns from gathered metrics is the same on every
        process (for ACC119's report only: the codemods that place a barrier on such a decision do not
        rely on it, since a function may return something else beside its metric)."""
        self.visitor, self.plan, self.module = visitor, plan, module
        self.trust_gathers = trust_gathers
        self.loops, self.exits = loops, exits
        self._taint: dict[int, set[str]] = {}
        self._gathering: Optional[set[str]] = None

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.visitor.get_metadata(ParentNodeProvider, node, None)

    def _over_loader(self, loop: Loop) -> bool:
        return isinstance(loop, cst.For) and ref_of(self.visitor, peel_iterable(self.visitor, loop.iter)) in self.plan.flow["loader"]

    def findings(self) -> list[RawFinding]:
        loader_loops = [loop for loop in self.loops if self._over_loader(loop)]
        training_functions = {key_at(self.visitor, loop) for loop in loader_loops}
        out = []
        for exit_ in self.exits:
            guards, loop, root = self._context(exit_)
            if loop is None or not guards or not self._trains(loop, loader_loops, training_functions):
                continue
            tainted = self._tainted(root)
            culprits = sorted({n for test in guards for n in _reads(test)} & tainted)
            if not culprits:
                continue
            if synced_break(self.visitor, exit_) and self.plan.accelerator_in(key_at(self.visitor, exit_)):
                continue  # ACC026 takes it on every process together
            pos = self.visitor.get_metadata(PositionProvider, exit_).start
            kind = "break" if isinstance(exit_, cst.Break) else "return"
            accelerator = self.plan.accelerator
            out.append(RawFinding(
                pos.line, pos.column + 1, "ACC119",
                f"`{kind}` out of the training loop decided by `{culprits[0]}`, which each process computes from "
                "its own shard: processes would stop at different steps and the next collective hangs.",
                f"call `{accelerator}.set_trigger()` where the condition holds, and leave the loop on "
                f"`if {accelerator}.check_trigger(): {kind}` so that every process stops together.",
            ))
        return out

    def leaves_trained_loop(self, exit_: cst.CSTNode) -> bool:
        """Does ``exit_`` (a ``break``) leave a loop that trains, as ACC119 counts them (over a prepared
        loader, around one, or calling the function that has one)?"""
        loader_loops = [loop for loop in self.loops if self._over_loader(loop)]
        _, loop, _ = self._context(exit_)
        return loop is not None and self._trains(loop, loader_loops, {key_at(self.visitor, lp) for lp in loader_loops})

    def guarded_by(self, node: cst.CSTNode) -> Optional[str]:
        """A name read by an ``if``/``while`` around ``node`` whose value differs per process, if any."""
        root: Optional[cst.CSTNode] = self.parent(node)
        while root is not None and not isinstance(root, (cst.FunctionDef, cst.Module)):
            root = self.parent(root)
        root = root if root is not None else self.module
        tainted = self._tainted(root)
        culprits = sorted({n for test in self._guards(node, root) for n in _reads(test)} & tainted)
        return culprits[0] if culprits else None

    def _context(self, exit_: cst.CSTNode) -> tuple[list[cst.BaseExpression], Optional[Loop], cst.CSTNode]:
        """(the ``if`` tests guarding ``exit_`` inside its loop, the loop it leaves, the function around it)."""
        guards: list[cst.BaseExpression] = []
        loop: Optional[Loop] = None
        node = self.parent(exit_)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            if loop is None and isinstance(node, cst.If):
                guards.append(node.test)
            if loop is None and isinstance(node, (cst.For, cst.While)):
                loop = node
                if isinstance(exit_, cst.Break):
                    break
            node = self.parent(node)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            node = self.parent(node)
        return guards, loop, node if node is not None else self.module

    def _trains(self, loop: Loop, loader_loops: list[Loop], training_functions: set) -> bool:
        """The loop is over a prepared dataloader, contains one, or calls the function that has one."""
        for inner in loader_loops:
            node: Optional[cst.CSTNode] = inner
            while node is not None:
                if node is loop:
                    return True
                node = self.parent(node)
        for call in findall(loop.body, m.Call(func=m.Name())):
            if call.func.value in training_functions:  # type: ignore[attr-defined]
                return True
        return False

    def _tainted(self, root: cst.CSTNode) -> set[str]:
        if id(root) in self._taint:
            return self._taint[id(root)]
        key = MODULE
        if isinstance(root, cst.FunctionDef) and isinstance(root.body, cst.IndentedBlock):
            key = key_at(self.visitor, root.body.body[0])
        tainted = {name for k, name in self.plan.flow["loader"] if k == key or (k == self.plan.owner and name.startswith("self."))}
        # (names bound, expressions read to compute them)
        bindings: list[tuple[list[str], list[cst.CSTNode]]] = []
        for node in findall(root, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
            guards = self._guards(node, root)
            if isinstance(node, cst.Assign):
                names = [n for t in node.targets for n in assigned_names(t.target)]
                if self._gathered_result(node.value):
                    bindings.append((names, guards))  # `dev_acc = eval(dev_iter, model)`: computed from gathers
                    continue
                bindings.append((names, [node.value, *guards]))
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                if node.value is not None:
                    bindings.append((assigned_names(node.target), [node.value, *guards]))
            else:  # a for loop: enumerate's index counts batches, the rest is data
                target, it = node.target, node.iter
                if (
                    isinstance(it, cst.Call) and qualified_names(self.visitor, it.func) & {"builtins.enumerate", "enumerate"}
                    and isinstance(target, cst.Tuple) and len(target.elements) == 2 and it.args
                ):
                    bindings.append((assigned_names(target.elements[1].value), [it.args[0].value, *guards]))
                else:
                    bindings.append((assigned_names(target), [it, *guards]))
        changed = True
        while changed:
            changed = False
            for names, reads in bindings:
                if set(names) <= tainted:
                    continue
                if any(n in tainted for expr in reads for n in _reads(expr)):
                    tainted |= set(names)
                    changed = True
        self._taint[id(root)] = tainted
        return tainted

    def _gathered_result(self, value: cst.BaseExpression) -> bool:
        """``eval(dev_iter, model, args)``: a call of a function of the file whose every loop over a prepared
        loader gathers its metrics (accelify.analyses.gathers): what it returns is the same on every process
        (textCNN's early stop on the gathered dev accuracy was reported as a per-process decision)."""
        if not self.trust_gathers or not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return False
        if self._gathering is None:
            self._gathering = set()
            for function in self.module.body:
                if not isinstance(function, cst.FunctionDef):
                    continue
                loops = [loop for loop in findall(function.body, m.For()) if self._over_loader(loop)]  # type: ignore[arg-type]
                if loops and all(id(loop) in self.plan.gathering for loop in loops):
                    self._gathering.add(function.name.value)
        return value.func.value in self._gathering and ref_of(self.visitor, value.func) == (MODULE, value.func.value)

    def _guards(self, node: cst.CSTNode, root: cst.CSTNode) -> list[cst.BaseExpression]:
        tests = []
        parent = self.parent(node)
        while parent is not None and parent is not root:
            if isinstance(parent, (cst.If, cst.While)):
                tests.append(parent.test)
            parent = self.parent(parent)
        return tests


def reached_every_pass(visitor: cst.MetadataDependent, statement: cst.CSTNode) -> bool:
    """Does every pass of the loop around ``statement`` reach it: is it in the loop's own body, or in the
    body of a ``with`` or ``try`` there, not under an ``if``? (Where a collective such as
    ``check_trigger()`` may go: every process makes it.)"""
    node = statement
    while True:
        block = visitor.get_metadata(ParentNodeProvider, node, None)
        owner = visitor.get_metadata(ParentNodeProvider, block, None)
        if isinstance(owner, (cst.For, cst.While)):
            return owner.body is block
        if not isinstance(owner, (cst.With, cst.Try)) or owner.body is not block:
            return False
        node = owner


def jump_if(node: cst.CSTNode, jump: type) -> bool:
    """``if <test>: ...; break`` (``jump``: ``cst.Break`` or ``cst.Continue``), no ``else``: the jump last,
    nothing else in the body jumps."""
    if not isinstance(node, cst.If) or node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
        return False
    body = node.body.body
    last = body[-1] if body else None
    if not isinstance(last, cst.SimpleStatementLine) or len(last.body) != 1 or not isinstance(last.body[0], jump):
        return False
    return not findall(cst.IndentedBlock(body=list(body[:-1])), m.Continue() | m.Break() | m.Return())


def synced_break(visitor: cst.MetadataDependent, exit_: cst.CSTNode) -> bool:
    """A ``break`` ACC026 takes together (``set_trigger``/``check_trigger``): the last statement of an ``if``
    with nothing else jumping, which every pass of its loop reaches."""
    line = visitor.get_metadata(ParentNodeProvider, exit_, None)
    block = visitor.get_metadata(ParentNodeProvider, line, None) if line is not None else None
    statement = visitor.get_metadata(ParentNodeProvider, block, None) if block is not None else None
    return isinstance(exit_, cst.Break) and statement is not None and jump_if(statement, cst.Break) and \
        reached_every_pass(visitor, statement)
