"""ACC001: ``from accelerate import Accelerator`` and one ``accelerator = Accelerator()``."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan
from accelify.queries.blocks import Body as Block
from accelify.queries.blocks import binds, scope_root
from accelify.queries.names import code_of, read_names
from accelify.queries.refs import MODULE
from accelify.queries.training import setup_blocks
from accelify.queries.trees import replace_in
from accelify.queries.walk import findall

from .base import AccelifyCodemod, add_accelerator_imports, depth_of, insert_paragraph, unused_note, wrapped_call

_IMPORT = m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])


class AddAccelerator(AccelifyCodemod):
    """Create the one ``Accelerator`` of the program before the training objects are built.

    At module level it goes right after the import block, as in the Accelerate
    docs.  A script that already has an ``Accelerator`` keeps it: accelify reuses
    its name and never creates a second one.

    Before::

        import torch

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())

    After::

        import torch
        from accelerate import Accelerator

        accelerator = Accelerator()

        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
    """

    CODE = "ACC001"
    NAME = "accelerator"
    DESCRIPTION = "Add `from accelerate import Accelerator` and `accelerator = Accelerator()`."
    REQUIRES = frozenset()

    _module: Optional[cst.Module] = None
    #: per block (its id): the functions that read the Accelerator, asked once per statement of the block
    _reading: Optional[dict[int, set[str]]] = None

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return not plan.has_accelerator

    AFTER = frozenset({"ACC002", "ACC008"})

    def place(self, module: cst.Module) -> cst.Module:
        """After the edit pass: insert the Accelerator before the first statement that uses it.

        It runs on the converted tree because where it goes depends on what every other
        codemod wrote (a ``prepare``, an ``accelerator.device``), except for the output
        ACC008 routes through it: a ``print`` does not pull the Accelerator up (ACC008
        leaves the ones that end up before it as they were).
        """
        if self.plan.has_accelerator:
            return module
        self._module = module  # the converted tree: its functions may read the Accelerator now
        self._reading = {}
        device = self.other("ACC002")
        if device is not None and device.creation_site() is not None:  # type: ignore[attr-defined]
            # the device codemod created it where the device was
            self._import()
            return self._before_first_use(module)
        root = scope_root(module, self.plan.setup)
        if root is None:
            return module
        names = set(self.plan.anchors())
        best: Optional[tuple[Block, int]] = None
        for block in setup_blocks(root):
            hits = [
                i for i, stmt in enumerate(block.body)
                if binds(stmt, names) or (not isinstance(stmt, cst.FunctionDef) and self._uses_accelerator(stmt, block))
            ]
            if hits and all(any(binds(block.body[i], {n}) for i in hits) for n in names):
                best = (block, hits[0])
        if best is None:
            return module
        block, index = best
        first_use = index
        if block is module:
            imports = [i for i, stmt in enumerate(module.body[:index]) if m.matches(stmt, _IMPORT)]
            if imports:
                index = imports[-1] + 1
        # Its arguments (`gradient_accumulation_steps=N`, an `enabled=` flag) must be bound first.
        names_read = self._argument_names()
        arguments = [i for i, stmt in enumerate(block.body) if binds(stmt, names_read)]
        # (after its first use, only what leaves the arguments' values alone: `args.start_epoch = 3`
        # when the Accelerator reads `args.cuda`)
        read = _read_chains(self.plan.accelerator_args())
        # It goes before the first training object when it can; an argument bound after that
        # (`args.cuda = ...` below the DataLoaders) puts it later, if nothing reads it before.
        reading = next((i for i, stmt in enumerate(block.body)
                        if not isinstance(stmt, cst.FunctionDef) and self._uses_accelerator(stmt, block)), len(block.body))
        if any(i >= reading and binds(block.body[i], names_read, read) for i in arguments):
            raise RuntimeError("an argument of the Accelerator is bound after its first use")
        arguments = [i for i in arguments if i < first_use or binds(block.body[i], names_read, read)]
        if arguments:
            index = max(index, arguments[-1] + 1)
        self._import()
        # Reported at the statement it follows, as ACC004 reports prepare (the block's first when it
        # goes first): in a notebook the statement after it may start the next cell, not this one.
        anchor = block.body[index - 1] if index > 0 else block.body[0]
        self.change(anchor, f"`{self.plan.accelerator} = Accelerator()` inserted" + unused_note(self.plan))
        args = self.plan.accelerator_args()
        line_length = self.context.scratch.get("accelify.line_length", 88)
        code = wrapped_call(f"{self.plan.accelerator} = Accelerator", args, depth_of(module, block), line_length,
                            module.default_indent)
        statement = self.parse_statement(code + "\n")
        body = insert_paragraph(block.body, index, statement)
        if block is module:
            return module.with_changes(body=body)
        return replace_in(module, block, block.with_changes(body=body))

    def _before_first_use(self, module: cst.Module) -> cst.Module:
        """The Accelerator the device codemod created where the device was goes up to the first statement
        of its block that reads it (codesearch: a TensorBoard writer made by the main process, `... if
        args.visual and accelerator.is_main_process else None`, above the device line), when nothing
        between binds what its arguments read."""
        root = scope_root(module, self.plan.setup)
        if root is None or self.plan.class_mode:
            return module
        creation = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(self.plan.accelerator))],
                                                        value=m.Call(func=m.Name("Accelerator")))])
        for block in setup_blocks(root):
            at = next((i for i, stmt in enumerate(block.body) if m.matches(stmt, creation)), None)
            if at is None:
                continue
            first = next((i for i, stmt in enumerate(block.body[:at])
                          if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and self._uses_accelerator(stmt, block)),
                         None)
            if first is None:
                return module
            read = _read_chains(self.plan.accelerator_args())
            if any(binds(stmt, self._argument_names(), read) for stmt in block.body[first:at]):
                raise RuntimeError("the Accelerator is read before the device line where it is created, and its "
                                   "arguments are bound in between")
            body = list(block.body)
            made = body.pop(at)
            body.insert(first, made.with_changes(leading_lines=body[first].leading_lines))
            body[first + 1] = body[first + 1].with_changes(leading_lines=[])
            if block is module:
                return module.with_changes(body=body)
            return replace_in(module, block, block.with_changes(body=body))
        return module

    def _argument_names(self) -> set[str]:
        """The names the Accelerator's arguments read: the analysis's, and the roots of what its arguments read
        (``cpu=not cuda``: ``cuda``, a flag a device was chosen by)."""
        return self.plan.argument_names | {chain.split(".")[0] for chain in _read_chains(self.plan.accelerator_args())}

    def _import(self) -> None:
        add_accelerator_imports(self.context, self.plan)

    def _uses_accelerator(self, stmt: cst.BaseStatement, block: Optional[Block] = None) -> bool:
        """Does ``stmt`` read the Accelerator (``accelerator.x``, not ``torch.accelerator.x``), itself or
        through a function defined in ``block`` that it calls (PointNet's ``log_string``, whose ``print`` is
        ``accelerator.print`` now: called before the Accelerator exists, a NameError)?"""
        if self._reads_accelerator(stmt):
            return True
        if block is None:
            return False
        # (a print there counts: it runs wherever the function is called, and nothing puts it back)
        closures = self._functions_reading_it(block)
        return bool(closures) and any(isinstance(c.func, cst.Name) and c.func.value in closures
                                      for c in findall(stmt, m.Call()))  # type: ignore[attr-defined]

    def _functions_reading_it(self, block: Block) -> set[str]:
        """The functions defined in ``block`` and, for a script set up at its top level, the module's functions
        (ODE-Net's ``get_logger``, whose log file the main process opens now), that read the Accelerator, by
        themselves or through another such function they call."""
        known = self._reading.get(id(block)) if self._reading is not None else None
        if known is not None:
            return known
        functions = {s.name.value: s for s in block.body if isinstance(s, cst.FunctionDef)}
        reading = {name for name, f in functions.items() if self._reads_accelerator(f.body, quiet=False)}
        if self.plan.setup == MODULE and self._module is not None:
            # (a print of theirs does not count: ACC008 keeps it a print where they run before the Accelerator)
            for s in self._module.body:
                if isinstance(s, cst.FunctionDef) and s.name.value not in functions:
                    functions[s.name.value] = s
                    if self._reads_accelerator(s.body):
                        reading.add(s.name.value)
        grew = bool(reading)
        while grew:
            grew = False
            for name, f in functions.items():
                if name not in reading and any(isinstance(c.func, cst.Name) and c.func.value in reading
                                               for c in findall(f.body, m.Call())):  # type: ignore[attr-defined]
                    reading.add(name)
                    grew = True
        if self._reading is not None:
            self._reading[id(block)] = reading
        return reading

    def _reads_accelerator(self, node: cst.CSTNode, quiet: bool = True) -> bool:
        quiet = self.shared.quiet_uses if quiet else set()
        if self.plan.class_mode:
            return any(id(a.value) not in quiet for a in findall(
                node, m.Attribute(value=m.Name("self"), attr=m.Name("accelerator"))))
        name = self.plan.accelerator.split(".")[0]
        return any(n.value == name and id(n) not in quiet for n in read_names(node))


def _read_chains(arguments: str) -> set[str]:
    """The names and attribute chains read by ``Accelerator(<arguments>)``: ``args.cuda``."""
    call = cst.parse_expression(f"f({arguments})")
    chains: set[str] = set()

    def collect(node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Name, cst.Attribute)):
            chains.add(code_of(node))
            return
        for child in node.children:
            collect(child)

    for arg in call.args:  # type: ignore[attr-defined]
        collect(arg.value)
    return chains
