"""ACC014: load a state dict into the unwrapped model once it has been prepared."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider

from accelify.analyses.plan import Plan
from accelify.queries.blocks import iter_statements, scope_root
from accelify.queries.refs import key_at, ref_of
from accelify.queries.training import LOAD_STATE_DICT, UNWRAP_MODEL
from accelify.queries.walk import findall

from .base import AccelifyCodemod, accelerator_attr

_STATE = m.Call(func=m.Attribute(attr=m.Name("state_dict")))


class Loading(AccelifyCodemod):
    """``model.load_state_dict(...)`` after ``prepare`` -> ``accelerator.unwrap_model(model).load_state_dict(...)``.

    In a multi-process run a prepared model is wrapped (DistributedDataParallel)
    and its keys carry the wrapper's ``module.`` prefix, so a plain checkpoint only
    loads into ``accelerator.unwrap_model(model)`` (the model itself when nothing
    wraps it).
    Before ``prepare`` the model is still the plain one and is left as it is; so is
    every load in a file that also keeps the *wrapped* model's ``state_dict()``
    (``best = copy.deepcopy(model.state_dict())``, a whole-training-state checkpoint),
    since that is what such a load may be reading back. The other way round, a prepared
    model's state loaded into a model that is not prepared (an EMA copy:
    ``ema_model.load_state_dict(model.state_dict())``) is read from
    ``accelerator.unwrap_model(model).state_dict()``, whose names the copy has.

    Before::

        import torch

        model = Net()
        model.load_state_dict(torch.load("pretrained.pt"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        train(model, optimizer)
        model.load_state_dict(torch.load("best.pt"))

    After::

        import torch

        model = Net()
        model.load_state_dict(torch.load("pretrained.pt"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        train(model, optimizer)
        accelerator.unwrap_model(model).load_state_dict(torch.load("best.pt"))
    """

    AFTER = frozenset({"ACC004", "ACC003", "ACC006", "ACC009"})
    CODE = "ACC014"
    NAME = "loading"
    DESCRIPTION = ("model.load_state_dict(...) after prepare -> accelerator.unwrap_model(model).load_state_dict(...); "
                   "copy.load_state_dict(model.state_dict()) -> copy.load_state_dict(accelerator.unwrap_model(model).state_dict()).")
    REQUIRES = frozenset({"ACC001", "ACC004"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        # an evaluation's model is prepared with `evaluation_mode=True`: nothing wraps it
        return "load_state_dict" in code and not plan.evaluation

    def visit_Module(self, node: cst.Module) -> None:
        self._plain = self.rebound_statements(node, self.vanishing())  # a model bound again after training: never wrapped
        self._prepares: list[tuple[cst.Call, list[cst.BaseStatement]]] = []
        root = scope_root(node, self.plan.setup)
        if root is not None:
            body = root if isinstance(root, cst.Module) else root.body
            if isinstance(body, (cst.Module, cst.IndentedBlock)):
                for stmt, _ in iter_statements(body):
                    if not isinstance(stmt, cst.SimpleStatementLine):
                        continue
                    for call in findall(stmt, m.Call(func=m.Attribute(attr=m.Name("prepare")))):
                        if _code(call.func.value) == self.plan.accelerator:  # type: ignore[attr-defined]
                            names = {_code(a.value) for a in call.args}  # type: ignore[attr-defined]
                            self._prepares.append((names, self._chain(stmt)))  # type: ignore[arg-type]
        prepare = self.other("ACC004")
        if prepare is not None and prepare._target is not None:  # type: ignore[attr-defined]
            # the `prepare` ACC004 inserts: between two statements of its block
            block, index = prepare._target, prepare._index  # type: ignore[attr-defined]
            self._prepares.append((set(prepare.prepared), [*self._chain(block.body[0])[:-1], _Inserted(block, index)]))  # type: ignore[attr-defined]
        # A load may be reading back a state dict taken from the wrapped model (keys with
        # the wrapper's prefix): unwrapping the model it goes into would break that pairing.
        # (a state loaded into a model that is not prepared is read unwrapped: `_unwrapped_state`)
        self._wrapped_state = any(self._wrapped(call) for call in findall(node, _STATE)  # type: ignore[arg-type]
                                  if id(call) not in self.plan.states_into_plain)

    # ------------------------------------------------------------------ order in the setup scope
    def _chain(self, node: cst.CSTNode) -> list[cst.BaseStatement]:
        """The statements that contain ``node``, outermost first, up to its scope's body."""
        chain: list[cst.BaseStatement] = []
        child, parent = node, self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None and not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            if isinstance(parent, (cst.Module, cst.IndentedBlock)) and isinstance(child, cst.BaseStatement):
                chain.append(child)
            child, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        return chain[::-1]

    def _after_prepare(self, node: cst.CSTNode, receiver: str) -> Optional[bool]:
        """Does ``node`` (in the setup scope) run after the ``prepare`` of ``receiver``? None: cannot tell."""
        prepares = [chain for names, chain in self._prepares if receiver in names]
        if len(prepares) != 1:
            return None
        here, there = self._chain(node), prepares[0]
        for mine, theirs in zip(here, there):
            if mine is theirs:
                continue
            block = self.get_metadata(ParentNodeProvider, mine, None)
            if isinstance(theirs, _Inserted):
                if block is not theirs.block:
                    return None
                return _index(list(block.body), mine) >= theirs.index  # type: ignore[union-attr]
            if block is None or block is not self.get_metadata(ParentNodeProvider, theirs, None):
                return None  # different branches of one statement
            body = list(block.body)  # type: ignore[attr-defined]
            return _index(body, mine) > _index(body, theirs)
        return None  # the same statement, or one holds the other

    def _wrapped(self, call: cst.Call) -> bool:
        """``model.state_dict()`` of a prepared model, where it is (or may be) wrapped."""
        owner = call.func.value  # type: ignore[attr-defined]
        if m.matches(owner, UNWRAP_MODEL) or ref_of(self, owner) not in self.plan.flow["model"]:
            return False
        saving = self.other("ACC009")
        if saving is not None and saving.unwraps(call):  # type: ignore[attr-defined]
            return False  # saved as `accelerator.unwrap_model(model).state_dict()`
        if self.inside(call, self._plain):
            return False
        if key_at(self, call) == self.plan.setup and self._after_prepare(call, _code(owner)) is False:
            return False  # taken before prepare: the plain model's keys
        return True

    # ------------------------------------------------------------------ the rewrite
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.plan.states_into_plain:
            return self._unwrapped_state(original_node, updated_node)
        if not m.matches(original_node, LOAD_STATE_DICT) or self._wrapped_state:
            return updated_node
        owner = original_node.func.value  # type: ignore[attr-defined]
        if ref_of(self, owner) not in self.plan.flow["model"] or self.inside(original_node, self._plain):
            return updated_node
        model = _code(owner)
        if key_at(self, original_node) == self.plan.setup and not self._after_prepare(original_node, model):
            return updated_node  # before prepare the model is the plain one
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:
            return updated_node
        self.change(original_node, f"`{model}.load_state_dict` -> `{accelerator}.unwrap_model({model}).load_state_dict`")
        return _through_unwrap(updated_node, accelerator)

    def _unwrapped_state(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """``ema_model.load_state_dict(model.state_dict())`` -> ``...(accelerator.unwrap_model(model).state_dict())``
        once ``model`` is prepared: the names of the state the plain model loads are its own, without ``module.``."""
        accelerator = self.accelerator_at(original_node)
        if accelerator is None or not self._wrapped(original_node):
            return updated_node
        model = _code(original_node.func.value)  # type: ignore[attr-defined]
        self.change(original_node, f"`{model}.state_dict()` loaded into a model that is not prepared -> "
                    f"`{accelerator}.unwrap_model({model}).state_dict()`")
        return _through_unwrap(updated_node, accelerator)


def _through_unwrap(call: cst.Call, accelerator: str) -> cst.Call:
    """``model.method(...)`` -> ``accelerator.unwrap_model(model).method(...)``."""
    unwrapped = cst.Call(
        func=accelerator_attr(accelerator, "unwrap_model"),
        args=[cst.Arg(call.func.value.with_changes(lpar=[], rpar=[]))],  # type: ignore[attr-defined]
    )
    return call.with_changes(func=call.func.with_changes(value=unwrapped))  # type: ignore[attr-defined]


def _code(node: cst.CSTNode) -> str:
    """The code of an expression, without the parentheses around it."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        node = node.with_changes(lpar=[], rpar=[])
    return cst.Module(body=[]).code_for_node(node)


def _index(body: list[cst.BaseStatement], stmt: cst.BaseStatement) -> int:
    return next(i for i, s in enumerate(body) if s is stmt)


class _Inserted:
    """Where ACC004 inserts its ``prepare`` statement: before ``block.body[index]``."""

    def __init__(self, block: cst.CSTNode, index: int) -> None:
        self.block, self.index = block, index
