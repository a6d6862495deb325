"""Models with a part that gets no gradient: DDP needs ``find_unused_parameters=True``.

A model whose ``forward`` runs a submodule under ``torch.no_grad()`` (a pretrained backbone used
as a fixed feature extractor, yunjey's image-captioning ``EncoderCNN``) while that submodule's
parameters still require grad, or cuts a computed value off the graph (``.detach()``, ``.data``),
trains fine in one process. Prepared on N processes it is wrapped in
``DistributedDataParallel``, which waits for a gradient of every parameter that requires one: the
second step fails with "Expected to have finished reduction in the prior iteration". The
Accelerator is then created with ``DistributedDataParallelKwargs(find_unused_parameters=True)``
(slower, never wrong); a submodule whose parameters the file freezes (``requires_grad = False``,
``requires_grad_(False)``) is not one of these. A model class of the project's other modules (``from
models import Captioner``, ``models.Captioner(...)``) is read where it is defined (accelify.analyses.foreign),
with what that module freezes.

Input: the facts (the module, its classes), the prepared models (``plan.models``). Output:
``plan.ddp_kwargs`` and ``plan.unused_parameters`` (the classes, for the change message).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from accelify.analyses.facts import Facts
from accelify.analyses.foreign import called_class
from accelify.queries.names import MODULE_HOLDERS, code_of, has_qname, qualified_names
from accelify.queries.walk import findall

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})
FIND_UNUSED = "find_unused_parameters=True"


def decide(facts: Facts, plan: Plan) -> None:
    """Record the prepared models' classes that run a trainable part without gradients."""
    classes = {c.name.value: c for c in facts.module.body if isinstance(c, cst.ClassDef)}
    built = set()
    for assign in findall(facts.module, m.Assign(value=m.Call())):
        names = {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}  # type: ignore[attr-defined]
        value = assign.value  # type: ignore[attr-defined]
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(
                value.func.value, cst.Call):
            value = value.func.value  # Encoder().to(device)
        if names & set(plan.models) and m.matches(value, m.Call(func=m.Name()) | m.Call(func=m.Attribute())):
            built.add(value)  # type: ignore[arg-type]
    frozen = _frozen_attributes(facts.module)
    for call in sorted(built, key=lambda c: code_of(c.func)):  # type: ignore[attr-defined]
        name = code_of(call.func)  # type: ignore[attr-defined]
        if name in classes:
            if (_runs_without_grad(facts, classes[name], frozen) or _idle_parts(facts, classes[name], classes)) \
                    and name not in plan.unused_parameters:
                plan.unused_parameters.append(name)
            continue
        # a model class of the project's other modules (`from models import Captioner`): read there
        found = called_class(facts, facts.module, facts.foreign, call.func)  # type: ignore[attr-defined]
        if found is not None and name not in plan.unused_parameters:
            cls, module, meta = found
            theirs = {c.name.value: c for c in module.body if isinstance(c, cst.ClassDef)}
            if _runs_without_grad(meta, cls, _frozen_attributes(module)) or _idle_parts(meta, cls, theirs):
                plan.unused_parameters.append(name)
    if plan.unused_parameters and FIND_UNUSED not in plan.ddp_kwargs:
        plan.ddp_kwargs.append(FIND_UNUSED)


def _runs_without_grad(facts: cst.MetadataDependent, cls: cst.ClassDef, frozen: set[str]) -> bool:
    """``forward`` calls ``self.<part>(...)`` inside ``with torch.no_grad():`` for a part not frozen, or
    cuts a result off the graph (``.detach()``, ``.data``: L1aoXingyu's sequence tagger feeds
    ``self.char_lstm(...).cpu().data`` on, so the character LSTM never gets a gradient)."""
    for function in findall(cls, m.FunctionDef(name=m.Name("forward"))):
        cut = findall(function, m.Call(func=m.Attribute(attr=m.Name("detach"))) | m.Attribute(attr=m.Name("data")))
        tested = {id(n) for test in _tests(function) for n in findall(test, m.Attribute())}
        cut_values = {id(_cut_value(c)) for c in cut}
        if any(not _attribute_of_self(node) and id(node) not in tested and not _also_kept(function, node, cut_values)
               for node in cut):
            return True  # `self.head.weight.data` reads a parameter; anything else cuts a computed value
        for block in findall(function, m.With()):
            if not any(isinstance(i.item, cst.Call) and has_qname(facts, i.item.func, _NO_GRAD)
                       for i in block.items):  # type: ignore[attr-defined]
                continue
            for call in findall(block.body, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name()))):
                if call.func.attr.value not in frozen:  # type: ignore[attr-defined]
                    return True
    return False


#: torch.nn modules without parameters: one that never runs leaves no gradient missing
_PARAMETER_FREE = re.compile(
    r"^torch\.nn\.(Dropout\w*|AlphaDropout|FeatureAlphaDropout|ReLU6?|LeakyReLU|R?ReLU|ELU|SELU|CELU|GELU|SiLU|Mish|"
    r"Sigmoid|Tanh|Softmax\w*|LogSoftmax|Softplus|Softsign|Softmin|Hardtanh|Hardswish|Hardsigmoid|Hardshrink|"
    r"Softshrink|Tanhshrink|Threshold|LogSigmoid|GLU|\w*Pool\w*|Upsampl\w*|Flatten|Unflatten|Identity|Pixel\w*|"
    r"\w*Pad\w*|Unfold|Fold|ChannelShuffle|\w*Loss)$")
#: reads of a module's parts by name or by walking them: what they run cannot be told
_DYNAMIC = frozenset({"getattr", "children", "named_children", "modules", "named_modules", "_modules", "__dict__"})


def _idle_parts(facts: cst.MetadataDependent, cls: cst.ClassDef, classes: dict[str, cst.ClassDef],
                seen: frozenset[str] = frozenset()) -> bool:
    """A part of the model that ``forward`` never runs: ``self.s3 = Conv2D(...)`` in ``__init__`` that no method
    ``forward`` reaches reads (MKDCNet's dilated-conv block), or a part of which it runs only pieces
    (``self.backbone.layer1(x)`` and never ``self.backbone(x)``: a classifier head left over), in the class or in the
    classes of its parts defined beside it. Its parameters get no gradient, and DDP waits for them."""
    if cls.name.value in seen:
        return False
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)} \
        if isinstance(cls.body, cst.IndentedBlock) else {}
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None:
        return False
    reached, todo = set(), ["forward"]
    while todo:  # forward and the methods it calls (`self._forward_features(x)`)
        name = todo.pop()
        if name in methods and name not in reached:
            reached.add(name)
            todo += [c.func.attr.value for c in findall(methods[name], m.Call(  # type: ignore[attr-defined]
                func=m.Attribute(value=m.Name("self"), attr=m.Name())))]
    running = [methods[n] for n in reached]
    if any(_dynamic(f) for f in running):
        return False
    parts: dict[str, cst.Call] = {}
    for assign in findall(init, m.Assign(value=m.Call())):
        for target in assign.targets:  # type: ignore[attr-defined]
            if m.matches(target.target, m.Attribute(value=m.Name("self"), attr=m.Name())):
                parts[target.target.attr.value] = assign.value  # type: ignore[attr-defined]
    built_into = {id(n) for a in findall(init, m.Assign()) for n in findall(a.value, m.Attribute(  # type: ignore[attr-defined]
        value=m.Name("self"), attr=m.Name()))}
    # what running code reads an attribute of: `self.backbone` in `self.backbone.layer1(x)` (a piece of the part)
    pieces_read = {id(a.value) for f in running for a in findall(f, m.Attribute())}  # type: ignore[attr-defined]
    for name, value in parts.items():
        if not _holds_parameters(facts, value, classes):
            continue
        reads = [n for f in running for n in findall(f, m.Attribute(value=m.Name("self"), attr=m.Name(name)))]
        if any(id(n) in built_into for n in findall(init, m.Attribute(value=m.Name("self"), attr=m.Name(name)))):
            continue  # handed to another part (`nn.Sequential(self.conv, self.bn)`): that part decides
        if not reads:
            return True
        if all(id(n) in pieces_read for n in reads) and _partly_run(facts, value, name, running):
            return True
        callee = value.func
        if isinstance(callee, cst.Name) and callee.value in classes and _idle_parts(
                facts, classes[callee.value], classes, seen | {cls.name.value}):
            return True
    return False


def _dynamic(function: cst.FunctionDef) -> bool:
    """``getattr(self, f"layer{i}")``, ``self.children()``: parts reached by name or by walking them."""
    return any(isinstance(c.func, cst.Name) and c.func.value == "getattr" and c.args
               and m.matches(c.args[0].value, m.Name("self")) for c in findall(function, m.Call())) or any(
        n.attr.value in _DYNAMIC for n in findall(function, m.Attribute(value=m.Name("self"))))  # type: ignore[attr-defined]


def _holds_parameters(facts: cst.MetadataDependent, value: cst.Call, classes: dict[str, cst.ClassDef]) -> bool:
    """A part built by a class of the module (a module of the project), by ``torch.nn`` but for its classes
    without parameters, or ``nn.Parameter``."""
    if isinstance(value.func, cst.Name) and value.func.value in classes:
        return True
    names = qualified_names(facts, value.func)
    return any(n.startswith("torch.nn.") and not _PARAMETER_FREE.match(n) and not n.startswith("torch.nn.functional.")
               for n in names)


_PARAMETERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
_CONTAINERS = MODULE_HOLDERS | {"torch.nn.Sequential", "torch.nn.modules.container.Sequential", "torch.nn.ParameterDict",
                                 "torch.nn.ParameterList"}


def _partly_run(facts: cst.MetadataDependent, value: cst.Call, name: str, running: list[cst.FunctionDef]) -> bool:
    """A part ``forward`` reads only pieces of: some of it may never run. A container's pieces are its contents:
    an ``nn.ModuleDict(dict(wte=..., h=...))`` (nanoGPT's ``self.transformer``) runs whole when every key it is
    built with is read; a list or a sequence read by pieces (``for block in self.blocks``) counts as run."""
    names = qualified_names(facts, value.func)
    if names & _PARAMETERS:
        return False  # `self.start.expand(...)`: a parameter is a tensor, any read of it uses it
    if not names & _CONTAINERS:
        return True  # `self.backbone.layer1(x)`: the backbone's other layers (its classifier) never run
    keys = _literal_keys(value)
    if keys is None:
        return False
    read = {a.attr.value for f in running for a in findall(f, m.Attribute(  # type: ignore[attr-defined]
        value=m.Attribute(value=m.Name("self"), attr=m.Name(name)), attr=m.Name()))}
    read |= {s.slice[0].slice.value.value.strip("'\"") for f in running for s in findall(f, m.Subscript(  # type: ignore[attr-defined]
        value=m.Attribute(value=m.Name("self"), attr=m.Name(name)), slice=[m.SubscriptElement(m.Index(m.SimpleString()))]))}
    return not keys <= read


def _literal_keys(value: cst.Call) -> "set[str] | None":
    """The keys of ``nn.ModuleDict(dict(a=..., b=...))`` or ``nn.ModuleDict({"a": ..., "b": ...})``; None otherwise."""
    if len(value.args) != 1:
        return None
    inner = value.args[0].value
    if isinstance(inner, cst.Call) and m.matches(inner.func, m.Name("dict")) and all(a.keyword for a in inner.args):
        return {a.keyword.value for a in inner.args}  # type: ignore[union-attr]
    if isinstance(inner, cst.Dict) and all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                                           for e in inner.elements):
        return {e.key.value.strip("'\"") for e in inner.elements}  # type: ignore[union-attr]
    return None


def _tests(function: cst.FunctionDef) -> list[cst.CSTNode]:
    """What ``function`` only tests (DCGAN's ``if isinstance(input.data, torch.cuda.FloatTensor) and ...``): the
    conditions of its ``if``/``while`` statements and the calls of ``isinstance``."""
    found: list[cst.CSTNode] = [s.test for s in findall(function, m.If() | m.While())]  # type: ignore[attr-defined]
    return found + findall(function, m.Call(func=m.Name("isinstance")))


def _cut_value(node: cst.CSTNode) -> cst.BaseExpression:
    """``z`` of ``z.detach()`` and of ``z.data``."""
    return node.func.value if isinstance(node, cst.Call) else node.value  # type: ignore[attr-defined]


def _also_kept(function: cst.FunctionDef, node: cst.CSTNode, cuts: set[int]) -> bool:
    """``z.detach()`` of a name the function also reads whole (SimSiam's ``p1 = self.predictor(z1)`` beside ``return
    p1, p2, z1.detach(), z2.detach()``): what computed it still gets a gradient through the other read. ``cuts``: the
    ids of every value the function detaches or reads ``.data`` of."""
    target = _cut_value(node)
    if not isinstance(target, cst.Name):
        return False
    bindings = [n for t in findall(function, m.AssignTarget() | m.Param() | m.AugAssign() | m.AnnAssign()
                                   | m.For() | m.WithItem() | m.NamedExpr())
                for n in findall(getattr(t, "target", None) or getattr(t, "name", None) or t, m.Name(target.value))]
    if len(bindings) != 1:
        return False  # `x = x.detach()`: the name holds the cut value from there on
    targets = {id(n) for n in bindings}
    return any(id(n) not in cuts and id(n) not in targets for n in findall(function.body, m.Name(target.value)))


def _frozen_attributes(module: cst.Module) -> set[str]:
    """``self.resnet`` frozen somewhere: ``for p in self.resnet.parameters(): p.requires_grad = False``,
    ``self.resnet.requires_grad_(False)``."""
    frozen = set()
    for loop in findall(module, m.For(iter=m.Call(func=m.Attribute(attr=m.Name("parameters"))))):
        owner = loop.iter.func.value  # type: ignore[attr-defined]
        if m.matches(owner, m.Attribute(value=m.Name("self"), attr=m.Name())) and findall(
                loop.body, m.Assign(targets=[m.AssignTarget(m.Attribute(attr=m.Name("requires_grad")))],
                                    value=m.Name("False"))):
            frozen.add(owner.attr.value)  # type: ignore[attr-defined]
    for call in findall(module, m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name()),
                                                        attr=m.Name("requires_grad_")),
                                       args=[m.Arg(m.Name("False"))])):
        frozen.add(call.func.value.attr.value)  # type: ignore[attr-defined]
    return frozen


def _attribute_of_self(node: cst.CSTNode) -> bool:
    """``self.head.weight.data``: attributes all the way down to ``self``, no call (a parameter)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return m.matches(node, m.Name("self"))
