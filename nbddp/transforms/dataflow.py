"""Which names a statement reads and which it binds: enough dataflow to follow values across cells."""
from __future__ import annotations

import libcst as cst


class _ReadsWrites(cst.CSTVisitor):
    def __init__(self):
        self.reads: set[str] = set()
        self.writes: set[str] = set()

    def _bind(self, target):
        if isinstance(target, cst.Name):
            self.writes.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)
        else:  # x.attr = … / x[i] = …: reads x
            target.visit(self)

    def visit_Assign(self, node):
        for target in node.targets:
            self._bind(target.target)
        node.value.visit(self)
        return False

    def visit_AnnAssign(self, node):
        self._bind(node.target)
        if node.value is not None:
            node.value.visit(self)
        return False

    def visit_AugAssign(self, node):
        node.target.visit(self)
        self._bind(node.target)
        node.value.visit(self)
        return False

    def visit_For(self, node):
        self._bind(node.target)

    def visit_WithItem(self, node):
        if node.asname is not None:
            self._bind(node.asname.name)

    def visit_ImportAlias(self, node):
        if node.asname is not None:
            self._bind(node.asname.name)
        else:
            name = node.name
            while isinstance(name, cst.Attribute):
                name = name.value
            self._bind(name)
        return False

    def visit_FunctionDef(self, node):
        self.writes.add(node.name.value)
        return False  # its body runs later, when called

    def visit_ClassDef(self, node):
        self.writes.add(node.name.value)
        return False

    def visit_Name(self, node):
        self.reads.add(node.value)


def reads_writes(node) -> tuple[set[str], set[str]]:
    visitor = _ReadsWrites()
    node.visit(visitor)
    return visitor.reads, visitor.writes


def header_of(stmt) -> list:
    """The parts of a compound statement that run before its blocks decide anything."""
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.For):
        return [stmt.iter]
    if isinstance(stmt, cst.With):
        return list(stmt.items)
    return []
