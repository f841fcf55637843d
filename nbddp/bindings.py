"""One pass over the notebook's tree for nbddp.meanings: each bound name's value, the classes' methods, the order of
bindings, each def's parameters, every call, the packages imported; a def's `return` values; and `Assignments`, the
walk over what an assignment binds that nbddp.install_values shares."""
from __future__ import annotations

import libcst as cst

from .cst_helpers import dotted, is_if_false
from .walk import walk


class _Returns(cst.CSTVisitor):
    """The values a function's own `return` statements give (not those of functions and classes inside it)."""

    def __init__(self):
        self.values = []

    def visit_Return(self, node):
        if node.value is not None:
            self.values.append(node.value)

    def visit_FunctionDef(self, node):
        return False

    visit_ClassDef = visit_Lambda = visit_FunctionDef


def params_of(function: cst.FunctionDef) -> list[cst.Param]:
    """A def's parameters that take one argument each, positional ones first (keyword-only ones follow)."""
    params = function.params
    return [*params.posonly_params, *params.params, *params.kwonly_params]


def returns_of(definition: cst.FunctionDef) -> list:
    found = _Returns()
    walk(definition.body, found)
    return found.values


def receivers(calls) -> set:
    """The nodes whose value a method is called of: `x` of `x.m()`, `x.y` and `x` of `x.y.m()`."""
    found = set()
    for func in (call.func for call in calls):
        while isinstance(func, cst.Attribute):
            func = func.value
            found.add(func)
    return found


def static(function: cst.FunctionDef) -> bool:
    return any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in function.decorators)


class Assignments(cst.CSTVisitor):
    """A visitor told each name an assignment binds (`=`, annotated, `:=`, `with ... as`): `bind(name, value)`, the
    name node and the expression. A tuple or list target's i-th name gets `element(value, i)` (the whole value,
    unless a subclass pairs them); a starred name (`*rest`) gets the whole value where `starred` is set."""

    starred = True

    def bind(self, name: cst.Name, value) -> None:
        raise NotImplementedError

    def element(self, value, index: int):
        return value

    def targets(self, target, value) -> None:
        if isinstance(target, cst.Name):
            self.bind(target, value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for index, element in enumerate(target.elements):
                self.targets(element.value, self.element(value, index))
        elif isinstance(target, cst.StarredElement) and self.starred:
            self.targets(target.value, value)

    def visit_Assign(self, node):
        for target in node.targets:
            self.targets(target.target, node.value)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.targets(node.target, node.value)


class Bindings(Assignments):
    """Each bound Name (as the scope analysis sees it) -> the expression it was bound to."""

    def __init__(self, top, watcher=None):
        self.values: dict[cst.Name, cst.BaseExpression] = {}
        self.classes: dict[cst.ClassDef, dict[str, cst.FunctionDef]] = {}
        self.fields: dict[cst.Param, Fields] = {}  # a method's `self` -> its class's `self.x`: values, reads
        self.class_fields: dict[cst.ClassDef, Fields] = {}  # the same record, by its class
        self.order: dict[cst.CSTNode, int] = {}  # binding nodes in source order
        self.params: dict[cst.Param, cst.FunctionDef] = {}  # a def's parameter -> the def
        self.packages: set[str] = set()  # the packages the notebook imports, anywhere but in dead code
        self.dead = 0  # how deep in `if False:` blocks
        self.calls: list[cst.Call] = []  # every call, where a parameter's arguments are looked for
        self.reads: dict[str, list] = {}  # attribute name -> every `name.attribute` (an instance's, a module's)
        self.top, self.watcher, self.statement = top, watcher, None

    def on_visit(self, node):
        if node in self.top:
            self.statement = node
        if isinstance(node, cst.Call):
            self.calls.append(node)
        elif isinstance(node, cst.FunctionDef):
            self.params.update((param, node) for param in params_of(node))
        elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            self.reads.setdefault(node.attr.value, []).append(node)
        if isinstance(node, (cst.Name, cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef)):
            self.order[node] = len(self.order)
        if self.watcher is not None:  # what else one pass over the tree reads (nbddp.tree's statement facts)
            self.watcher(self.statement, node)
        return super().on_visit(node)

    def bind(self, name, value):
        self.values[name] = value

    def visit_NamedExpr(self, node):
        self.targets(node.target, node.value)

    def visit_WithItem(self, node):
        if node.asname is not None:
            self.targets(node.asname.name, node.item)

    def visit_If(self, node):
        self.dead += is_if_false(node)

    def leave_If(self, node):
        self.dead -= is_if_false(node)

    def visit_Import(self, node):
        if not self.dead:  # an import in `if False:` imports nothing
            self.packages.update(dotted(alias.name).split(".")[0] for alias in node.names)

    def visit_ImportFrom(self, node):
        if not self.dead and not node.relative and node.module is not None:
            self.packages.add(dotted(node.module).split(".")[0])

    def visit_ClassDef(self, node):
        self.classes[node] = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
        methods = [m for m in self.classes[node].values() if not static(m) and params_of(m)]
        fields = Fields()
        for method in methods:
            fields.own = params_of(method)[0].name.value
            walk(method.body, fields)
        for small in (s for line in node.body.body if isinstance(line, cst.SimpleStatementLine) for s in line.body):
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:  # a field of the class
                for target in [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]:
                    if isinstance(target, cst.Name):  # `rank: int = ...`: `self.rank` unless a method sets it
                        fields.values.setdefault(target.value, []).append(small.value)
        self.fields.update((params_of(m)[0], fields) for m in methods)
        self.class_fields[node] = fields


class Fields(Assignments):
    """The values a class's methods assign to attributes of their own `self` (`self.bot = Bot(token)`), and the
    other reads of those attributes."""

    def __init__(self):
        self.values: dict[str, list] = {}
        self.reads: dict[str, list] = {}  # the other uses of `self.x`
        self.own, self.assigned = None, set()

    def _own(self, node) -> bool:
        return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == self.own

    def targets(self, target, value) -> None:
        if self._own(target):
            self.values.setdefault(target.attr.value, []).append(value)
            self.assigned.add(target)
        else:
            super().targets(target, value)

    def visit_Attribute(self, node):
        if self._own(node) and node not in self.assigned:
            self.reads.setdefault(node.attr.value, []).append(node)

    def bind(self, name, value):
        pass

    def visit_FunctionDef(self, node):
        return False  # a function inside a method: its own names

    visit_ClassDef = visit_Lambda = visit_FunctionDef
