"""ACC015: a helper that needs the Accelerator and has no ``device`` parameter to carry it gets one."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import MODULE, key_at, ref_of
from accelify.plan import Plan, bind_arguments

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
        return bool(plan.accelerator_params)

    def visit_Module(self, node: cst.Module) -> None:
        self._functions = {
            s.name.value: s for s in node.body
            if isinstance(s, cst.FunctionDef) and s.name.value in self.plan.accelerator_params
        }

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = original_node.name.value
        if name not in self._functions or key_at(self, original_node) != MODULE:
            return updated_node
        params = list(updated_node.params.params)
        first = cst.Param(name=cst.Name("accelerator"))
        if params:
            # `(model, loader)` -> `(accelerator, model, loader)`; one parameter per line stays so
            first = first.with_changes(comma=params[0].comma if isinstance(params[0].comma, cst.Comma) else cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" ")))
        elif updated_node.params.star_arg is not cst.MaybeSentinel.DEFAULT or updated_node.params.kwonly_params:
            first = first.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        self.change(original_node, f"`{name}` takes the accelerator as its first parameter")
        return updated_node.with_changes(params=updated_node.params.with_changes(params=[first, *params]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        if not isinstance(func, cst.Name) or func.value not in self._functions:
            return updated_node
        if ref_of(self, func) != (MODULE, func.value) or bind_arguments(self._functions[func.value], original_node) is None:
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
