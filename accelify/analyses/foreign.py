"""Functions of the project's other modules, read (never imported, never edited): what a script's
``from utils import get_data`` builds and does.

The pipeline hands the analysis a source of the project's modules (accelify.core.project); for a
function the script calls, :class:`Foreign` parses its module once and answers:

- ``loaders``: which of the values it returns are DataLoaders it builds, on every return
  (``return DataLoader(...)``, ``return train_loader, test_loader``), or None when it is no such
  function. The script's ``loader = get_data(args)`` is then a DataLoader to prepare, as for a
  helper of its own file (accelify.analyses.objects);
- ``writes``: it writes files (``torch.save``, ``save_image``, ``savefig``, ``open(path, "w")``,
  an image's ``.save(path)``) and neither trains nor synchronises: every process would write them; the script's call goes under ``if accelerator.is_main_process:``
  (accelify.codemods.main_process_files) when its result is not used;
- ``prints``: it writes to the console only (``print``, ``sys.stdout.write``: kuangliu's ``progress_bar``),
  keeping its own timing in module globals and calling only functions of its module that compute
  (``format_time``): every process would print it; the script's call goes under ``if
  accelerator.is_main_process:`` as for a writer;
- ``trains``: it is an optimizer factory (``get_optimizer(name, model, lr, ...)``, ``build_optimizer(cfg,
  model)``): every ``return`` hands back an optimizer it builds (a ``torch.optim`` class, a class named like one,
  or one wrapping such an optimizer: ``LARC(SGD(...))``), over the parameters of some of its parameters
  (``model.parameters()``, ``named_parameters()``, ``named_modules()``), and it neither places tensors, trains
  nor defines functions; ``trains`` names those parameters. The script's ``optimizer = get_optimizer(...,
  model, ...)`` is then an optimizer training what the call hands them (accelify.analyses.objects);
- ``unsafe``: it places tensors, trains, downloads or unpacks data (``download=True``,
  ``urlretrieve``, ``extractall``), runs a command (``subprocess``, ``os.system``), makes a directory
  without ``exist_ok=True`` or manages processes: none of the above is claimed for it (ACC135 still
  says why the file is left).

What the function runs of the project (a function, a dataset class it builds) is read with the same
rules, transitively: code of the project that places, trains, downloads or writes makes it ``unsafe``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Protocol

import libcst as cst
import libcst.matchers as m
from libcst._metadata_dependent import LazyValue
from libcst.helpers import ModuleNameAndPackage, get_absolute_module_from_package
from libcst.metadata import (FullRepoManager, FullyQualifiedNameProvider, ImportAssignment, MetadataWrapper,
                             ParentNodeProvider, QualifiedName, QualifiedNameProvider, QualifiedNameSource,
                             ScopeProvider)

from accelify.analyses import rank_helpers
from accelify.queries.names import (OPTIMIZER_NAME, WRITERS, code_of, qualified_names, split_relative,
                                   star_import_modules, string_value)
from accelify.queries.loops import built_loader
from accelify.queries.walk import findall

_PLACES = frozenset({"to", "cuda", "backward", "step"})
#: calls that train or synchronise: a function that makes one is no plain writer
_TRAINS = frozenset({"backward", "step", "zero_grad", "all_reduce", "all_gather", "barrier", "broadcast", "gather",
                     "reduce", "prepare", "wait_for_everyone"})


#: the processes' shared state, which a module's prints go through once converted (ACC008)
_STATE = frozenset({"accelerate.PartialState", "accelerate.state.PartialState", "accelerate.PartialState.print",
                    "accelerate.state.PartialState.print"})
#: what downloads or unpacks data (every process would, at once)
_FETCHES = ("urllib.", "requests.", "wget.", "gdown.", "torch.hub.", "huggingface_hub.", "datasets.load_dataset",
            "zipfile.", "tarfile.", "shutil.unpack_archive", "torchvision.datasets.utils.download",
            # a command run from Python (BetaVAE's `subprocess.call(['./download_dsprites.sh'])`): anything
            "subprocess.", "os.system", "os.popen")
_FETCHES_ATTRS = frozenset({"download", "extractall", "extract"})


class Sources(Protocol):
    root: Optional[str]
    memo: dict

    def module_source(self, dotted: str, level: int = 0) -> Optional[str]: ...

    def module_file(self, dotted: str, level: int = 0) -> Optional[str]: ...

    def files(self) -> list[str]: ...


@dataclass(frozen=True)
class ForeignFunction:
    module: str  # the module's fully qualified name, from the script's folder (``utils``, ``tools.knn``)
    name: str
    loaders: Optional[tuple[bool, ...]]  # per returned value: a DataLoader built here; None: no loader function
    writes: bool
    unsafe: bool
    why: str = ""  # what keeps it from being read as a loader function, for a finding
    prints: bool = False
    trains: Optional[tuple[str, ...]] = None  # an optimizer factory: the parameters whose parameters it trains
    node: Optional[cst.FunctionDef] = field(default=None, compare=False, repr=False)
    #: what it is of the torchvision references' process helpers, right under any launcher (accelify.analyses.
    #: rank_helpers): "rank" (``get_rank()``, ``get_world_size()`` asking torch.distributed when a group exists),
    #: "main" (``return get_rank() == 0``), "print" (``setup_for_distributed(is_master)``: print on the master only)
    role: Optional[str] = None


class _Metadata:
    """What the queries ask of a visitor (``get_metadata``), over a parsed module of the project; its names
    fully qualified too (``FullyQualifiedNameProvider``: ``from .rows import Rows`` in ``data/__init__.py`` is
    ``data.rows.Rows``, a function of the module ``utils.helper``)."""

    _PROVIDERS = (ParentNodeProvider, QualifiedNameProvider, ScopeProvider, FullyQualifiedNameProvider)

    def __init__(self, wrapper: MetadataWrapper, names: ModuleNameAndPackage) -> None:
        self._data = {p: wrapper.resolve(p) for p in self._PROVIDERS}
        self.names = names

    def get_metadata(self, key, node, default=None):
        value = self._data[key].get(node, default)
        return value() if isinstance(value, LazyValue) else value

    def fully_qualified(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(FullyQualifiedNameProvider, node, set())
                if q.source is not QualifiedNameSource.BUILTIN}


class Foreign:
    """The project's modules, each parsed once, and their definitions found by fully qualified name.

    Module names are LibCST's (``FullRepoManager`` and ``FullyQualifiedNameProvider``) with the script's folder
    as the repository's root, which is where ``python train.py`` looks first: ``utils.py`` beside it is the
    module ``utils``, ``data/rows.py`` is ``data.rows``. One ``Foreign`` serves every script of a folder
    (``Sources.memo``)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._repository: Optional[FullRepoManager] = None
        self._modules: dict[str, Optional[tuple[cst.Module, _Metadata]]] = {}
        self._wrappers: dict[str, tuple[str, MetadataWrapper]] = {}  # by file: the text parsed, its wrapper
        self._functions: dict[tuple[str, str], Optional[ForeignFunction]] = {}
        self._rank_helpers: dict[str, dict[str, str]] = {}
        #: (module, name) of project code a read function runs -> why it is unsafe ("" when safe)
        self._why: dict[tuple[str, str], str] = {}

    @classmethod
    def of(cls, sources: Sources) -> "Foreign":
        """The one ``Foreign`` of ``sources`` (kept in its memo, emptied when a module changes)."""
        found = sources.memo.get("foreign")
        if not isinstance(found, Foreign):
            found = sources.memo["foreign"] = cls(sources)
        return found

    # -- names

    def definition(self, name: str, seen: frozenset = frozenset()) -> Optional[tuple[str, str]]:
        """(module, name) of the project's module-level definition a fully qualified ``name`` means:
        ``utils.get_data`` is ``get_data`` of ``utils.py``; a name a module imports (``tools.knn_monitor``,
        which ``tools/__init__.py`` takes ``from .knn_monitor import knn_monitor``) is followed to where it is
        defined. None for anything else (a package's, a method, a module)."""
        dotted, _, attr = name.rpartition(".")
        if not dotted or name in seen:
            return None
        parsed = self._module(dotted)
        if parsed is None:
            return None
        module, meta = parsed
        if any(isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == attr for s in module.body):
            return dotted, attr
        scope = meta.get_metadata(ScopeProvider, module, None)
        if scope is None or not any(isinstance(a, ImportAssignment) for a in scope[attr]):
            return None
        imported = {_absolute(meta.names, q) for q in scope.get_qualified_names_for(attr)
                    if q.source is QualifiedNameSource.IMPORT}
        imported.discard(None)
        return self.definition(imported.pop(), seen | {name}) if len(imported) == 1 else None  # type: ignore[arg-type]

    def callee(self, meta: _Metadata, func: cst.BaseExpression) -> Optional[tuple[str, str]]:
        """The project's definition a callee (or a base class) of a project module names, as :meth:`definition`."""
        names = meta.fully_qualified(func)
        found = {d for n in names if (d := self.definition(n)) is not None}
        if not found and isinstance(func, cst.Name) and any(
                q.source is QualifiedNameSource.LOCAL for q in meta.get_metadata(QualifiedNameProvider, func, set())):
            return meta.names.name, func.value  # a local callable (a parameter, a variable): not read, not vouched for
        return found.pop() if len(found) == 1 else None

    # -- modules

    def _module(self, dotted: str) -> Optional[tuple[cst.Module, _Metadata]]:
        if dotted not in self._modules:
            parsed = None
            path = self.sources.module_file(dotted)
            text = self.sources.module_source(dotted) if path is not None else None
            if path is not None and text is not None:
                try:
                    cache = self._cache(path)
                    wrapper = MetadataWrapper(cst.parse_module(text), cache=cache)
                    parsed = wrapper.module, _Metadata(wrapper, cache[FullyQualifiedNameProvider])
                    self._wrappers[path] = (text, wrapper)
                except Exception:  # a module that does not parse is one accelify cannot read
                    parsed = None
            self._modules[dotted] = parsed
        return self._modules[dotted]

    def wrapper_of(self, path: str, text: str) -> Optional[MetadataWrapper]:
        """The parsed module of ``path`` with its metadata, when it was read with this ``text``: what other
        readings of the module (its prints, accelify.codemods.main_process) use instead of parsing it again."""
        found = self._wrappers.get(path)
        return found[1] if found is not None and found[0] == text else None

    def _cache(self, path: str) -> Mapping:
        """LibCST's full-repository cache for a module of the project (its name and package)."""
        if self._repository is None:
            self._repository = FullRepoManager(self.sources.root or ".", self.sources.files(),
                                               {FullyQualifiedNameProvider})
        try:
            return self._repository.get_cache_for_path(path)
        except ValueError:  # a module past the files listed (MAX_FILES): named alone, by the same rule
            return FullRepoManager(self.sources.root or ".", [path],
                                   {FullyQualifiedNameProvider}).get_cache_for_path(path)

    # -- functions and classes

    def function(self, dotted: str, name: str) -> Optional[ForeignFunction]:
        """The module-level function ``name`` of the project's module ``dotted`` (or the one it imports under
        that name); None when the module is not the project's (or cannot be read) or defines no such function."""
        key = (dotted, name)
        if key not in self._functions:
            self._functions[key] = None  # (imports that go round in a circle read nothing)
            self._functions[key] = self._read(dotted, name)
        return self._functions[key]

    def class_def(self, dotted: str, name: str) -> Optional[tuple[cst.ClassDef, cst.Module, "_Metadata"]]:
        """The module-level class ``name`` of the project's module ``dotted`` (or the one it imports under that
        name: a package's ``__init__`` taking it from one of its modules), with its module and that module's
        metadata."""
        found = self.definition(f"{dotted}.{name}")
        parsed = self._module(found[0]) if found is not None else None
        if parsed is None:
            return None
        module, meta = parsed
        cls = next((s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == found[1]), None)
        return (cls, module, meta) if cls is not None else None

    def metadata(self, function: ForeignFunction) -> Optional[_Metadata]:
        """What the queries ask of ``function``'s module (its scopes, qualified names, parents)."""
        parsed = self._module(function.module)
        return parsed[1] if parsed is not None else None

    def _read(self, dotted: str, name: str) -> Optional[ForeignFunction]:
        parsed = self._module(dotted)
        if parsed is None:
            return None
        module, meta = parsed
        func = next((s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)
        if func is None:
            found = self.definition(f"{dotted}.{name}")
            return self.function(*found) if found is not None and found != (dotted, name) else None
        calls = findall(func.body, m.Call())
        nested = findall(func.body, m.FunctionDef() | m.ClassDef() | m.Global() | m.Nonlocal())
        culprit = next((call for call in calls if self._unsafe(meta, call)), None)
        unsafe = bool(nested) or culprit is not None
        why = ("defines functions or classes inside it" if nested else
               f"runs `{code_of(culprit)}`{self.why_unsafe(meta, culprit)}" if culprit is not None
               else "")
        # a loader function that writes (a cache file) would write it on every process: not vouched for
        writes = any(_writes(meta, c) for c in calls)
        trains = any(isinstance(c.func, cst.Attribute) and c.func.attr.value in _TRAINS for c in calls) or any(
            n.startswith(("torch.distributed", "accelerate")) for c in calls for n in qualified_names(meta, c.func))
        loaders = None if unsafe or writes else _loaders(meta, func)
        if not why and writes:
            why = "writes files"
        elif not why and loaders is None:
            why = "does not return a DataLoader it builds on every return"
        return ForeignFunction(dotted, name, loaders, writes and not trains, unsafe, why,
                               _console_only(module, meta, func), _optimizer_factory(meta, func), func,
                               self._process_role(dotted, module, meta, func))

    def _process_role(self, dotted: str, module: cst.Module, meta: _Metadata,
                      func: cst.FunctionDef) -> Optional[str]:
        """``ForeignFunction.role``: a rank helper, a main-process test of one, or a print silencer (the module's
        rank helpers found once per module)."""
        found = self._rank_helpers.get(dotted)
        if found is None:
            functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
            found = self._rank_helpers[dotted] = rank_helpers.queries(meta, functions)
        if func.name.value in found:
            return "rank"
        if rank_helpers.main_process_test(func, found):
            return "main"
        return "print" if _silences_print(func) else None

    def _unsafe(self, meta: _Metadata, call: cst.Call, seen: frozenset = frozenset()) -> bool:
        """Does the call place tensors, train, synchronise, download, or run code of the project that does
        (a function or class of this module or of another of the project: :meth:`_runs_safely`)?"""
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "download" and not m.matches(
                    arg.value, m.Name("False") | m.Name("None")):
                return True
            if arg.keyword is not None and arg.keyword.value == "device" and string_value(arg.value) != "cpu":
                return True
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _PLACES | _TRAINS:
            return True
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _FETCHES_ATTRS:
            return True  # `dataset.download()`, `archive.extractall(...)`: every process would
        for name in meta.get_metadata(QualifiedNameProvider, call.func, set()):
            if name.name in _STATE:
                continue  # `PartialState().print(...)`: a print by the main process (a module converted for a script)
            if name.name.startswith(("torch.cuda", "torch.distributed", "accelerate", *_FETCHES)):
                return True
            if name.name in ("os.makedirs", "os.mkdir") and not any(
                    a.keyword is not None and a.keyword.value == "exist_ok" and m.matches(a.value, m.Name("True"))
                    for a in call.args):
                return True  # two processes race to make it
        key = self.callee(meta, call.func)
        return key is not None and not self._runs_safely(*key, seen)

    def why_unsafe(self, meta: _Metadata, call: cst.Call) -> str:
        """What makes the project code ``call`` runs unsafe (``, whose code runs `self.x.cuda()```), for a
        finding; empty for a call unsafe itself."""
        key = self.callee(meta, call.func)
        return self._why.get(key, "") if key is not None else ""

    def _runs_safely(self, dotted: str, name: str, seen: frozenset) -> bool:
        """A module-level function or class ``name`` of the project's module ``dotted`` whose code is safe to run
        on every process: read with :meth:`_unsafe`'s rules, the project code it runs read in turn (a dataset
        class built in a loader function: SimSiam's, PointNet's ``get_loaders`` making their ``Dataset``). For a
        class, every method (a DataLoader's workers run ``__getitem__``) and the project classes it derives
        from; neither may write files (every process would), define functions inside its code, or declare
        ``global``. A function or class the reading meets again is being read already."""
        key = (dotted, name)
        if key in seen:
            return True
        if key not in self._why:
            self._why[key] = ", which is not read"  # (until read)
            self._why[key] = self._read_safely(dotted, name, seen | {key})
        return not self._why[key]

    def _read_safely(self, dotted: str, name: str, seen: frozenset) -> str:
        """Empty when safe; else why not (``, whose code runs `x.cuda()```)."""
        parsed = self._module(dotted)
        if parsed is None:
            return ", which is not read"
        module, meta = parsed
        definition = next((s for s in reversed(module.body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
                           and s.name.value == name), None)
        if definition is None:
            found = self.definition(f"{dotted}.{name}")  # a name the module imports: read where it is defined
            if found is None or found == (dotted, name):
                return ", which is not read"
            return "" if self._runs_safely(*found, seen) else self._why[found]
        bodies: list[cst.CSTNode] = [definition.body]
        if isinstance(definition, cst.ClassDef):
            for base in definition.bases:  # a project class it derives from runs too (`class Train(Base)`)
                key = self.callee(meta, base.value)
                if key is not None and not self._runs_safely(*key, seen):
                    return f", whose base class `{code_of(base.value)}`" + re.sub(r"^, (whose code|which) ", " ",
                                                                                   self._why[key])
            methods = [s for s in definition.body.body if isinstance(s, cst.FunctionDef)]
            bodies = [f.body for f in methods] + [s for s in definition.body.body if not isinstance(s, cst.FunctionDef)]
        for body in bodies:
            if findall(body, m.FunctionDef() | m.ClassDef() | m.Global() | m.Nonlocal()):
                return ", which defines a function or class inside its code"
            calls = findall(body, m.Call())
            for call in calls:
                if _writes(meta, call):
                    return f", which writes a file on every process (`{code_of(call)}`)"
            for call in calls:
                if self._unsafe(meta, call, seen):
                    return f", whose code runs `{code_of(call)}`" + self.why_unsafe(meta, call)
        return ""


def _silences_print(func: cst.FunctionDef) -> bool:
    """``def setup_for_distributed(is_master)``: a ``print`` defined inside that prints when its flag (or
    ``force=True``) says so, made the builtin one (``__builtin__.print = print``), nothing else called."""
    params = func.params
    if len(params.params) != 1 or not isinstance(func.body, cst.IndentedBlock):
        return False
    printers = findall(func.body, m.FunctionDef(name=m.Name("print")))
    replaced = findall(func.body, m.Assign(targets=[m.AssignTarget(m.Attribute(attr=m.Name("print")))],
                                           value=m.Name("print")))
    if len(printers) != 1 or len(replaced) != 1:
        return False
    inner = findall(printers[0], m.Call())
    if len(findall(func.body, m.Call())) != len(inner):
        return False  # a call outside the print it defines
    return all(isinstance(c.func, cst.Name) or m.matches(c.func, m.Attribute(attr=m.Name("pop"))) for c in inner)


#: what a console function may call besides printing: builtins, string and list methods, the clock
_COMPUTES = frozenset({"int", "float", "str", "len", "range", "min", "max", "abs", "round", "format", "divmod",
                       "enumerate", "zip", "sum", "append", "join", "split", "strip", "ljust", "rjust"})


def _to_console(names: set[str]) -> bool:
    """A call's qualified names: ``print``, ``sys.stdout.write``, ``sys.stderr.write``."""
    return bool(names & {"builtins.print", "print"}) or any(n.startswith(("sys.stdout.", "sys.stderr.")) for n in names)


def _console_only(module: cst.Module, meta: _Metadata, func: cst.FunctionDef, seen: frozenset = frozenset()) -> bool:
    """Does ``func`` print and do nothing else (see the module's docstring: ``prints``)?"""
    prints = False
    if findall(func.body, m.FunctionDef() | m.ClassDef() | m.Nonlocal() | m.Yield() | m.Return(value=m.Call())):
        return False
    for call in findall(func.body, m.Call()):
        names = qualified_names(meta, call.func)
        if _to_console(names):
            prints = True
            continue
        if any(n.startswith(("time.", "math.")) for n in names) or (
                isinstance(call.func, cst.Name) and call.func.value in _COMPUTES and not names - {
                    f"builtins.{call.func.value}", call.func.value}):
            continue
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _COMPUTES:
            continue  # `L.append(...)`, `"".join(L)`
        local = next((s for s in module.body if isinstance(s, cst.FunctionDef) and isinstance(call.func, cst.Name)
                      and s.name.value == call.func.value), None)
        if local is not None and local.name.value not in seen and _computes(local):
            continue
        return False
    return prints


def _computes(func: cst.FunctionDef) -> bool:
    """A function of the module that only computes a value from its arguments (``format_time``)."""
    if findall(func.body, m.Global() | m.Nonlocal() | m.FunctionDef() | m.ClassDef()):
        return False
    for call in findall(func.body, m.Call()):
        if not (isinstance(call.func, cst.Name) and call.func.value in _COMPUTES) and not (
                isinstance(call.func, cst.Attribute) and call.func.attr.value in _COMPUTES):
            return False
    return True


_MODEL_PARAMETERS = frozenset({"parameters", "named_parameters", "named_modules"})


def _optimizer_factory(meta: _Metadata, func: cst.FunctionDef) -> Optional[tuple[str, ...]]:
    """The parameters of ``func`` whose parameters the optimizer it builds and returns trains, when it is an
    optimizer factory (see the module's docstring: ``trains``); None otherwise."""
    if findall(func.body, m.FunctionDef() | m.ClassDef() | m.Global() | m.Nonlocal() | m.Yield()):
        return None
    for call in findall(func.body, m.Call()):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _PLACES | _TRAINS:
            return None
        if any(n.startswith(("torch.cuda", "torch.distributed", "accelerate")) for n in qualified_names(meta, call.func)):
            return None
    returns = findall(func.body, m.Return())
    if not returns:
        return None
    for ret in returns:
        value = ret.value
        if isinstance(value, cst.Name):
            built = [a.value for a in findall(func.body, m.Assign()) if any(
                m.matches(t.target, m.Name(value.value)) for t in a.targets)]  # type: ignore[attr-defined]
            if not built or findall(func.body, m.AugAssign(target=m.Name(value.value)) | m.AnnAssign(
                    target=m.Name(value.value))) or any(not _builds_optimizer(meta, b) for b in built):
                return None
        elif value is None or not _builds_optimizer(meta, value):
            return None
    names = [p.name.value for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)]
    read = {c.func.value.value for c in findall(func.body, m.Call(func=m.Attribute(value=m.Name(), attr=m.OneOf(
        *(m.Name(a) for a in _MODEL_PARAMETERS)))))}  # type: ignore[attr-defined]
    trained = tuple(n for n in names if n in read)
    return trained or None


def _builds_optimizer(meta: _Metadata, value: cst.BaseExpression) -> bool:
    """``torch.optim.SGD(...)``, ``LARS(...)``, ``LARC(torch.optim.SGD(...), ...)``."""
    if not isinstance(value, cst.Call):
        return False
    names = qualified_names(meta, value.func) or (
        {value.func.value} if isinstance(value.func, cst.Name) else set())
    if any(n.startswith(("torch.optim.lr_scheduler", "torch.optim.swa_utils")) for n in names):
        return False
    if any(n.startswith("torch.optim.") or OPTIMIZER_NAME.search(n.rsplit(".", 1)[-1]) for n in names):
        return True
    first = value.args[0].value if value.args and value.args[0].keyword is None else None
    return first is not None and isinstance(first, cst.Call) and _builds_optimizer(meta, first)


def _writes(meta: _Metadata, call: cst.Call) -> bool:
    """``torch.save``, ``save_image`` and the other writers, ``open(path, "w")``, an image's ``.save(path)``,
    ``.savefig(...)``: the call writes a file."""
    return bool(qualified_names(meta, call.func) & WRITERS) or _opens_for_writing(meta, call) or m.matches(
        call.func, m.Attribute(attr=m.Name("save") | m.Name("savefig")))


def _opens_for_writing(meta: _Metadata, call: cst.Call) -> bool:
    if not qualified_names(meta, call.func) & {"builtins.open"} or len(call.args) < 2:
        return False
    mode = string_value(call.args[1].value)
    return mode is None or bool(set(mode) & set("wax"))


def _loaders(meta: _Metadata, func: cst.FunctionDef) -> Optional[tuple[bool, ...]]:
    """Per position of what ``func`` returns, whether it is a DataLoader built here, on every return."""
    returns = [r for r in findall(func.body, m.Return())]
    if not returns or any(r.value is None for r in returns):
        return None
    shapes: Optional[tuple[bool, ...]] = None
    for ret in returns:
        value = ret.value
        values = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        shape = tuple(built_loader(meta, v) for v in values)  # type: ignore[arg-type]
        if shapes is not None and shape != shapes:
            return None
        shapes = shape
    return shapes if shapes is not None and any(shapes) else None


def called_function(visitor, module: cst.Module, foreign: Optional[Foreign],
                    func: cst.BaseExpression) -> Optional[ForeignFunction]:
    """The project function a call's ``func`` names: imported by name (``from utils import get_data``,
    ``from .data import get_data``, ``import utils`` then ``utils.get_data``), or brought by the one
    ``from utils import *`` whose module defines it; None otherwise (a package's, this file's)."""
    if foreign is None:
        return None
    found = _imported(visitor, module, foreign, func)
    return foreign.function(*found) if found is not None else None


def called_class(visitor, module: cst.Module, foreign: Optional[Foreign],
                 func: cst.BaseExpression) -> Optional[tuple[cst.ClassDef, cst.Module, _Metadata]]:
    """The project class a call's ``func`` names (``from models import Net`` then ``Net(...)``), found as
    :func:`called_function` finds a function; None otherwise."""
    if foreign is None:
        return None
    found = _imported(visitor, module, foreign, func)
    return foreign.class_def(*found) if found is not None else None


def _imported(visitor, module: cst.Module, foreign: Foreign, func: cst.BaseExpression) -> Optional[tuple[str, str]]:
    """(module, name) of the project's definition a name the script imports means (:meth:`Foreign.definition`).
    The script is the root module of its folder: its absolute imports are fully qualified as written, and a
    relative one (``from .data import x``, which ``python train.py`` would refuse) means the module beside it,
    as it does when the folder is run as a package."""
    names = {q.name for q in visitor.get_metadata(QualifiedNameProvider, func, set())
             if q.source is QualifiedNameSource.IMPORT}
    if len(names) == 1:
        full, level = split_relative(names.pop())
        return foreign.definition(full) if level <= 1 else None
    if names or not isinstance(func, cst.Name):
        return None
    scope = visitor.get_metadata(ScopeProvider, func, None)
    if scope is None or list(scope[func.value]):
        return None  # a name of this file
    found = [f for dotted, level in star_import_modules(module)
             if level <= 1 and (f := foreign.definition(f"{dotted}.{func.value}")) is not None]
    return found[0] if len(found) == 1 else None


def _absolute(names: ModuleNameAndPackage, name: QualifiedName) -> Optional[str]:
    """A name a module of the project imports, fully qualified as ``FullyQualifiedNameProvider`` does (a relative
    import from the module's package); None for one beyond the script's folder."""
    dotted, level = split_relative(name.name)
    if level == 1 and not names.package:
        return dotted  # a module at the folder's top: the module beside it, as for the script
    return get_absolute_module_from_package(names.package, dotted, level)


def console_methods(cls: cst.ClassDef, meta: _Metadata) -> set[str]:
    """The methods of a project class that write to the console (``print``, ``sys.stdout.write``: CycleGAN's
    ``Logger.log`` redraws its progress line), themselves or through the class's methods they call on ``self``,
    and neither train nor synchronise (:data:`_TRAINS`)."""
    methods = {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}

    def own(func: cst.FunctionDef) -> tuple[bool, bool, set[str]]:
        prints, trains, calls = False, False, set()
        for call in findall(func.body, m.Call()):
            if _to_console(qualified_names(meta, call.func)):
                prints = True
            if isinstance(call.func, cst.Attribute):
                if call.func.attr.value in _TRAINS:
                    trains = True
                if m.matches(call.func.value, m.Name("self")) and call.func.attr.value in methods:
                    calls.add(call.func.attr.value)
        return prints, trains, calls

    read = {name: own(func) for name, func in methods.items()}
    found = set()
    for name in methods:
        seen, stack, prints, trains = set(), [name], False, False
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            p, t, calls = read[current]
            prints, trains = prints or p, trains or t
            stack.extend(calls)
        if prints and not trains:
            found.add(name)
    return found
