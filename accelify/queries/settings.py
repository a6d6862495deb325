"""Settings: values that are the same on every process because they come from the command line,
literals and pure functions of those only (``vars(args)``, ``{"nz": nz, "ngf": int(opt.ngf)}``,
``json.dumps(config)``), never from data, tensors, time, randomness or the process's rank.

``same_on_every_process(visitor, module, expr)`` answers for one expression, following names
through every assignment of their scope; a name with one assignment it cannot read (a parameter,
an augmented assignment, an import, ``global``) is not a setting. A namespace from
``parser.parse_args()`` is a setting as long as every ``args.x = value`` of the file assigns one
(``opt.manualSeed = random.randint(1, 10000)`` does not: each process draws its own) and no
``setattr`` touches it. Conservative by design: "no" costs a finding, a wrong "yes" a file
written with one process's content.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ParentNodeProvider, ScopeProvider

from accelify.queries.names import qualified_names
from accelify.queries.walk import findall

#: functions whose result depends on their arguments only
PURE_FUNCTIONS = frozenset({
    *(f"builtins.{n}" for n in ("int", "float", "str", "bool", "dict", "list", "tuple", "set", "sorted", "vars",
                                "len", "repr", "format", "zip", "enumerate", "range", "min", "max", "abs", "round")),
    "json.dumps", "yaml.dump", "yaml.safe_dump", "os.path.join", "os.path.basename", "os.path.dirname",
    "os.path.splitext", "pprint.pformat", "copy.deepcopy", "copy.copy",
})
#: methods of str, dict and list that return a value computed from the receiver and arguments only
PURE_METHODS = frozenset({"items", "keys", "values", "get", "format", "join", "upper", "lower", "replace", "strip",
                          "split", "rstrip", "lstrip", "copy"})
#: writers that read what they are given and write it to a file handed to them
SETTINGS_WRITERS = frozenset({"json.dump", "yaml.dump", "yaml.safe_dump", "pickle.dump", "builtins.print"})
_CONTAINERS = (cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)
#: pure functions whose result can be changed in place (or, iterators, used up)
_MUTABLE_RESULTS = frozenset({"builtins.list", "builtins.dict", "builtins.set", "builtins.sorted", "builtins.vars",
                              "builtins.zip", "builtins.enumerate", "copy.deepcopy", "copy.copy"})
_PARSE = m.Call(func=m.Attribute(attr=m.Name("parse_args") | m.Name("parse_known_args")))


class _Settings:
    def __init__(self, visitor: cst.MetadataDependent, module: cst.Module, allowed: frozenset[int]) -> None:
        self.visitor = visitor
        self.module = module
        self.allowed = allowed  # ids of names taken as settings by the caller (a loop's target over settings)
        self.values: dict[int, Optional[list[cst.BaseExpression]]] = {}
        # names and attributes being decided: met again (`args.out = os.path.join("runs", args.out)`), they
        # are taken as settings, and the answer rests on their other values (every base value is checked)
        self.deciding: set[tuple[object, str]] = set()

    def expr(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        if depth > 12:
            return False
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)):
            return True
        if isinstance(node, cst.ConcatenatedString):
            return self.expr(node.left, depth + 1) and self.expr(node.right, depth + 1)
        if isinstance(node, cst.FormattedString):
            return all(self.expr(p.expression, depth + 1) for p in node.parts
                       if isinstance(p, cst.FormattedStringExpression))
        if isinstance(node, cst.Name):
            return self.name(node, depth)
        if isinstance(node, cst.Attribute):
            return self.attribute(node, depth)
        if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
            return all(self.expr(e.value, depth + 1) for e in node.elements)
        if isinstance(node, cst.Dict):
            return all(isinstance(e, cst.DictElement) and self.expr(e.key, depth + 1) and self.expr(e.value, depth + 1)
                       for e in node.elements)
        if isinstance(node, cst.Subscript):
            return self.expr(node.value, depth + 1) and all(
                isinstance(s.slice, cst.Index) and self.expr(s.slice.value, depth + 1) for s in node.slice)
        if isinstance(node, cst.BinaryOperation):
            return self.expr(node.left, depth + 1) and self.expr(node.right, depth + 1)
        if isinstance(node, cst.UnaryOperation):
            return self.expr(node.expression, depth + 1)
        if isinstance(node, cst.BooleanOperation):
            return self.expr(node.left, depth + 1) and self.expr(node.right, depth + 1)
        if isinstance(node, cst.Comparison):
            return self.expr(node.left, depth + 1) and all(self.expr(c.comparator, depth + 1) for c in node.comparisons)
        if isinstance(node, cst.IfExp):
            return all(self.expr(n, depth + 1) for n in (node.test, node.body, node.orelse))
        if isinstance(node, cst.Call):
            return self.call(node, depth)
        return False

    def call(self, node: cst.Call, depth: int) -> bool:
        if not all(self.expr(a.value, depth + 1) for a in node.args):
            return False
        if qualified_names(self.visitor, node.func) & PURE_FUNCTIONS:
            return True
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in PURE_METHODS:
            return self.expr(node.func.value, depth + 1)
        return False

    def attribute(self, node: cst.Attribute, depth: int) -> bool:
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or not self.namespace(root, depth):
            return False
        if isinstance(node.value, cst.Name):  # `opt.experiment`: what the file assigns to it too
            key = (root.value, node.attr.value)
            return key in self.deciding or self._all(key, self._attribute_values(root, node.attr.value), depth)
        return True

    def name(self, node: cst.Name, depth: int) -> bool:
        if id(node) in self.allowed or node.value in ("True", "False", "None"):
            return True
        if self.namespace(node, depth):
            values = self._attribute_values(node, None)
            return values is not None and all(self.expr(v, depth + 1) for v in values)
        key = (id(self.visitor.get_metadata(ScopeProvider, node, None)), node.value)
        return key in self.deciding or self._all(key, self._values(node), depth)

    def _all(self, key: tuple[object, str], values: Optional[list[cst.BaseExpression]], depth: int) -> bool:
        """Are all ``values`` (of the name or attribute ``key``) settings? While they are decided, ``key``
        met again counts as one: the answer rests on its other values."""
        self.deciding.add(key)
        try:
            return values is not None and all(self.expr(v, depth + 1) for v in values)
        finally:
            self.deciding.discard(key)

    def namespace(self, node: cst.Name, depth: int) -> bool:
        """Is ``node`` bound (everywhere in its scope) to ``parser.parse_args()``, touched by no ``setattr``?"""
        values = self._values(node)
        if not values or not all(m.matches(v, _PARSE) for v in values):
            return False
        return not any(c.args and m.matches(c.args[0].value, m.Name(node.value))
                       for c in findall(self.module, m.Call(func=m.Name("setattr"))))

    def _values(self, node: cst.Name) -> Optional[list[cst.BaseExpression]]:
        """Every value ``node`` is assigned in its scope, or None when one assignment is not ``name = value``."""
        if id(node) not in self.values:
            self.values[id(node)] = self._read_values(node)
        return self.values[id(node)]

    def _read_values(self, node: cst.Name) -> Optional[list[cst.BaseExpression]]:
        scope = self.visitor.get_metadata(ScopeProvider, node, None)
        if scope is None:
            return None
        assignments = list(scope[node.value])
        if not assignments:
            return None
        values = []
        for assignment in assignments:
            target = getattr(assignment, "node", None)
            parent = self.visitor.get_metadata(ParentNodeProvider, target, None) if isinstance(target, cst.Name) else None
            assign = self.visitor.get_metadata(ParentNodeProvider, parent, None) if isinstance(
                parent, cst.AssignTarget) else None
            if not isinstance(assign, cst.Assign):
                return None
            values.append(assign.value)
        if any(self._mutable(v) for v in values) and not all(
                self._reads_only(access.node) for a in assignments for access in a.references):
            return None  # `history = []`, then `history.append(loss.item())`
        return values

    def _mutable(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, _CONTAINERS) or (
            isinstance(value, cst.Call) and bool(qualified_names(self.visitor, value.func) & _MUTABLE_RESULTS))

    def _reads_only(self, node: cst.CSTNode) -> bool:
        """Does this use of a container leave it as it is (a pure method, an argument of a pure function or
        a writer, a read of an item)?"""
        parent = self.visitor.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = self.visitor.get_metadata(ParentNodeProvider, parent, None)
            return not isinstance(call, cst.Call) or parent.attr.value in PURE_METHODS
        if isinstance(parent, cst.Subscript) and parent.value is node:
            holder = self.visitor.get_metadata(ParentNodeProvider, parent, None)
            return not isinstance(holder, (cst.AssignTarget, cst.AugAssign, cst.Del))
        if isinstance(parent, cst.Arg):
            call = self.visitor.get_metadata(ParentNodeProvider, parent, None)
            return isinstance(call, cst.Call) and bool(
                qualified_names(self.visitor, call.func) & (PURE_FUNCTIONS | SETTINGS_WRITERS)
                or (isinstance(call.func, cst.Attribute) and call.func.attr.value in ("write", "writelines")))
        return not isinstance(parent, (cst.AugAssign, cst.Del))

    def _attribute_values(self, root: cst.Name, attr: Optional[str]) -> Optional[list[cst.BaseExpression]]:
        """The values the module assigns to ``root.attr`` (every attribute of ``root`` when ``attr`` is None);
        None when one is augmented (``opt.lr *= 0.1``)."""
        found: list[cst.BaseExpression] = []
        pattern = m.Attribute(value=m.Name(root.value), attr=m.Name(attr) if attr is not None else m.Name())
        for assign in findall(self.module, m.Assign()):
            if any(m.matches(t.target, pattern) for t in assign.targets):
                found.append(assign.value)
        if findall(self.module, m.AugAssign(target=pattern)):
            return None
        return found


def same_on_every_process(visitor: cst.MetadataDependent, module: cst.Module, expr: cst.BaseExpression,
                          allowed: frozenset[int] = frozenset()) -> bool:
    """Is ``expr`` a setting: the same on every process (see the module's docstring)?
    ``allowed``: ids of names the caller knows to be settings."""
    return _Settings(visitor, module, allowed).expr(expr)
