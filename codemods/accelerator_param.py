"""ACC015: a helper that needs the Accelerator and has no ``device`` parameter to carry it gets one."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.analyses.plan import Plan, bind_arguments
from accelify.queries.refs import MODULE, key_at, ref_of

from .base import AccelifyCodemod


class AcceleratorParameter(AccelifyCodemod):
    """Pass the Accelerator to a helper that runs the backward pass or gathers metrics.

    Only in scripts (a ``__main__`` block), for module-level functions called
    with plain arguments from code that sees the Accelerator: ``accelerator``
    becomes their first parameter and every call passes it.  A helper with a
    ``device`` parameter gets the Accelerator through that one instead (ACC002);
    one that cannot be given it is reported (ACC106).

    Before::

        import torch


        def train_epoch(model, loader, optimizer):
            for x, y in loader:
                loss = model(x, y)
                loss.backward()
                optimizer.step()


        def main():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train_epoch(model, loader, optimizer)


        if __name__ == "__main__":
            main()

    After::

        import torch


        def train_epoch(accelerator, model, loader, optimizer):
            for x, y in loader:
                loss = model(x, y)
                loss.backward()
                optimizer.step()


        def main():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train_epoch(accelerator, model, loader, optimizer)


        if __name__ == "__main__":
            main()
    """

    CODE = "ACC015"
    NAME = "accelerator-parameter"
    DESCRIPTION = "A helper that needs the Accelerator and has no device parameter gets `accelerator` as first parameter."
    REQUIRES = frozenset({"ACC001"})

    @classmethod
    def applies(cls, plan: Plan, code: str) -> bool:
        return bool(plan.accelerator_params or plan.accelerator_classes)

    def visit_Module(self, node: cst.Module) -> None:
        self._functions = {
            s.name.value: s for s in node.body
            if isinstance(s, cst.FunctionDef) and s.name.value in self.plan.accelerator_params
        }
        # A class handed the training objects: its `__init__` takes the accelerator and keeps it.
        for s in node.body:
            if isinstance(s, cst.ClassDef) and s.name.value in self.plan.accelerator_classes:
                init = next(f for f in s.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "__init__")
                self._functions[s.name.value] = init

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = original_node.name.value
        owner = key_at(self, original_node)
        if name == "__init__" and owner in self.plan.accelerator_classes:
            return self._constructor(owner, updated_node)
        if name not in self._functions or owner != MODULE:
            return updated_node
        self.change(original_node, f"`{name}` takes the accelerator as its first parameter")
        return self._first_parameter(updated_node, after_self=False)

    def _constructor(self, cls: str, node: cst.FunctionDef) -> cst.FunctionDef:
        """``def __init__(self, model, ...)`` -> ``def __init__(self, accelerator, model, ...)`` and
        ``self.accelerator = accelerator`` first (after a docstring)."""
        self.change(node, f"`{cls}` takes the accelerator and keeps it as `self.accelerator`")
        node = self._first_parameter(node, after_self=True)
        body = list(node.body.body)  # type: ignore[attr-defined]
        at = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
        keep = self.parse_statement("self.accelerator = accelerator\n")
        if at == 0 and body:
            keep = keep.with_changes(leading_lines=body[0].leading_lines)
            body[0] = body[0].with_changes(leading_lines=[])
        body.insert(at, keep)
        return node.with_changes(body=node.body.with_changes(body=body))

    def _first_parameter(self, updated_node: cst.FunctionDef, after_self: bool) -> cst.FunctionDef:
        """``(model, loader)`` -> ``(accelerator, model, loader)``; after ``self`` for a constructor.
        The new parameter is laid out as the first one is (one parameter per line stays so)."""
        params = list(updated_node.params.params)
        at = 1 if after_self else 0
        space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        first = cst.Param(name=cst.Name("accelerator"))
        more = updated_node.params.star_arg is not cst.MaybeSentinel.DEFAULT or bool(updated_node.params.kwonly_params)
        if params and isinstance(params[0].comma, cst.Comma):
            first = first.with_changes(comma=params[0].comma)
        elif len(params) > at or more:
            first = first.with_changes(comma=space)
        if after_self and not isinstance(params[0].comma, cst.Comma):
            params[0] = params[0].with_changes(comma=space)  # `(self)` -> `(self, accelerator)`
        params.insert(at, first)
        return updated_node.with_changes(params=updated_node.params.with_changes(params=params))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        if not isinstance(func, cst.Name) or func.value not in self._functions:
            return updated_node
        is_class = func.value in self.plan.accelerator_classes
        if ref_of(self, func) != (MODULE, func.value) or bind_arguments(
            self._functions[func.value], original_node, skip_self=is_class
        ) is None:
            return updated_node
        accelerator = self.accelerator_at(original_node)
        if accelerator is None:  # the analysis checked every call site: cannot happen, never guess
            raise RuntimeError(f"a call of `{func.value}` cannot reach the Accelerator")
        args = list(updated_node.args)
        arg = cst.Arg(value=cst.parse_expression(accelerator))
        if args:
            arg = arg.with_changes(comma=args[0].comma if isinstance(args[0].comma, cst.Comma) else cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" ")))
        self.change(original_node, f"the accelerator is passed to `{func.value}`")
        return updated_node.with_changes(args=[arg, *args])
