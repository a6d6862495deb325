"""Names: qualified names (matched through ``QualifiedNameProvider``, never by spelling: ``import
torch as T`` and ``from torch import device`` are the same thing, a local variable that merely
shares a name is not), the qualified names accelify knows, string values and read names."""

from __future__ import annotations

import re

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from accelify.queries.walk import findall

# --------------------------------------------------------------------------
# qualified names

#: ``torch.optim.Optimizer``: a class of the script that subclasses it is an optimizer, whatever its name
OPTIMIZER_BASES = frozenset({"torch.optim.Optimizer", "torch.optim.optimizer.Optimizer"})
DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
TORCH_SAVE = frozenset({"torch.save", "torch.serialization.save"})
TORCH_LOAD = frozenset({"torch.load", "torch.serialization.load"})
#: ``multiprocessing.Process`` (torch's is the same class): a process started by hand
PROCESS = frozenset({"torch.multiprocessing.Process", "multiprocessing.Process", "multiprocessing.context.Process"})
ACCELERATOR_CLASS = frozenset(
    {"accelerate.Accelerator", "accelerate.accelerator.Accelerator", "accelify.runtime.Accelerator"}
)


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> set[str]:
    return {q.name for q in visitor.get_metadata(QualifiedNameProvider, node, set())}


def wrapper_qualified_names(wrapper: MetadataWrapper, node: cst.CSTNode) -> set[str]:
    """``qualified_names`` asked of a ``MetadataWrapper`` (the conversions that run before the analysis
    hold one, not a visitor); LibCST's lazy values resolved."""
    value = wrapper.resolve(QualifiedNameProvider).get(node, set())
    return {q.name for q in (value() if callable(value) else value)}


def name_attribute(node: cst.CSTNode) -> Optional[tuple[str, str]]:
    """``args.world_size`` -> (``args``, ``world_size``): an attribute of a plain name; None for anything else."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        return node.value.value, node.attr.value
    return None


def has_qname(visitor: cst.MetadataDependent, node: cst.CSTNode, names: frozenset[str]) -> bool:
    return bool(qualified_names(visitor, node) & names)


#: modules without a ``forward``: they only hold others
MODULE_HOLDERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.modules.container.ModuleList",
                            "torch.nn.modules.container.ModuleDict"})

#: schedulers that decide the learning rate from a value handed to each ``step`` (never prepared: Accelerate's
#: wrapper would step one N times per call)
PLATEAU_SCHEDULERS = frozenset({"torch.optim.lr_scheduler.ReduceLROnPlateau"})

#: a name an optimizer class or factory has (``AdamW``, ``LARS``, ``get_optimizer``); core/precheck.py keeps a copy
OPTIMIZER_NAME = re.compile(r"adam|sgd|rmsprop|adagrad|adadelta|adafactor|lamb|lion|lars|sophia|optim", re.I)


def subclasses_optimizer(visitor: cst.MetadataDependent, cls: cst.ClassDef) -> bool:
    """``class LARS(torch.optim.Optimizer)`` (``optim.Optimizer`` after ``from torch import optim``)."""
    return any(has_qname(visitor, base.value, OPTIMIZER_BASES) for base in cls.bases)






def string_value(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def root_name(node: cst.BaseExpression) -> Optional[cst.Name]:
    """``batch["x"].y[0]`` -> ``batch``: the name an access chain starts from."""
    while True:
        if isinstance(node, cst.Name):
            return node
        if isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            # batch.pop("labels"), batch.get("x"), x.float()
            node = node.func.value
        else:
            return None


def param_names(func: cst.FunctionDef) -> list[str]:
    """The names of a function's parameters, but ``*args`` and ``**kwargs``."""
    p = func.params
    return [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]


def assigned_names(target: cst.BaseExpression) -> list[str]:
    """Names (and ``self.x`` attributes, spelled so) bound by an assignment target."""
    if isinstance(target, cst.Name):
        return [target.value]
    if m.matches(target, m.Attribute(value=m.Name("self"), attr=m.Name())):
        return [f"self.{target.attr.value}"]  # type: ignore[attr-defined]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(assigned_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return assigned_names(target.value)
    return []


def read_names(node: cst.CSTNode) -> list[cst.Name]:
    """The ``Name`` nodes in ``node`` that name something, not the ``.attr`` part of an attribute
    (in ``torch.accelerator.x`` only ``torch``)."""
    attrs = {id(a.attr) for a in findall(node, m.Attribute())}  # type: ignore[attr-defined]
    return [n for n in findall(node, m.Name()) if id(n) not in attrs]  # type: ignore[misc]


_EMPTY = cst.Module(body=[])


def star_imports(module: cst.Module) -> list[str]:
    """The modules ``module`` imports with ``from x import *``, as written (without a relative import's dots)."""
    return [dotted for dotted, _ in star_import_modules(module)]


def star_import_modules(module: cst.Module) -> list[tuple[str, int]]:
    """``(module, level)`` of each ``from x import *`` of ``module``: ``from ..utils import *`` is
    ``("utils", 2)``."""
    return [(code_of(s.module), len(s.relative)) for s in findall(module, m.ImportFrom())  # type: ignore[attr-defined]
            if isinstance(s.names, cst.ImportStar) and s.module is not None]  # type: ignore[attr-defined]


def split_relative(name: str) -> tuple[str, int]:
    """``".data.get_data"`` -> ``("data.get_data", 1)``: a dotted name without a relative import's
    leading dots, and how many there were."""
    dotted = name.lstrip(".")
    return dotted, len(name) - len(dotted)


def code_of(node: cst.CSTNode) -> str:
    """The source of ``node`` as written (its own whitespace and comments)."""
    return _EMPTY.code_for_node(node)

# Calls that write a file whose name does not depend on the process: N processes would write it N
# times at once (a torn or interleaved file), each from its own shard.
WRITERS = TORCH_SAVE | frozenset({  # torch.save: what ACC009 does not save with `accelerator.save`
    "torchvision.utils.save_image", "matplotlib.pyplot.savefig", "numpy.save", "numpy.savetxt", "numpy.savez",
    "numpy.savez_compressed",
    # copies and moves of a file (`shutil.copyfile(last, best)` after a save): once, or N processes
    # race on the same target (and the others may copy before the main process has written)
    "shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.move",
    # deletions (pyGAT keeps the best epoch's checkpoint and removes the others): once, or the processes
    # race to remove the same file and all but one fail
    "os.remove", "os.unlink", "shutil.rmtree",
})


def process_target(call: cst.Call) -> Optional[tuple[str, list[cst.BaseExpression]]]:
    """``Process(target=worker, args=(a, b))``: the worker's name and the arguments the process hands it; None
    when the target is no plain name or the arguments no tuple written out."""
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    target, arguments = keywords.get("target"), keywords.get("args")
    if not isinstance(target, cst.Name) or not isinstance(arguments, cst.Tuple):
        return None
    return target.value, [e.value for e in arguments.elements]
