"""What a statement may change beyond the names it binds, for nbddp.needs: the names another name shares a value
with (`r = rows`, `for row in rows:`), the globals a function of the notebook's sets (`global DATA`), and the names a
value holds changes to (a `partial` of a function of the notebook's given them, and what is built from it).

    aliases(body)              -> name -> the names whose value it may share, transitively
    declared_global(def)       -> the names a def declares `global`
    carried(body, scan)        -> name -> the outside names that calling what it holds may change
    imported_by_call(body, names) -> the top-level lines that bind a name to a module by a call
"""
from __future__ import annotations

import libcst as cst

from .changes import base_name, given_changes
from .cst_helpers import names_in
from .meanings import IMPORTS
from .reads_writes import reads_writes
from .walk import walk


class _Globals(cst.CSTVisitor):
    def __init__(self, root):
        self.root, self.found = root, set()

    def visit_Global(self, node):
        self.found |= {item.name.value for item in node.names}

    def on_visit(self, node):  # a nested def or class has its own
        return node is self.root or not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and \
            super().on_visit(node)


def declared_global(definition) -> set[str]:
    """The names a def of the notebook declares `global` (its assignments to them bind the notebook's names)."""
    if not isinstance(definition, cst.FunctionDef):
        return set()
    found = _Globals(definition)
    walk(definition, found)
    return found.found


def carried(body, scan) -> dict:
    """name -> the outside names that calling what it holds may change: a `partial` of a function of the notebook's
    given them (`jobs = [partial(fill, cache, k) for k in keys]`), and what is built from such a value, in the
    notebook's order (`threads = [Thread(target=j) for j in jobs]`, `for t in threads:`)."""
    found: dict = {}
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        reads, writes = reads_writes(stmt)
        carried = set().union(*(found.get(name, ()) for name in reads))
        for call in scan.seen(stmt).calls:
            carried |= given_changes(call, scan)
        for name in writes if carried else ():
            found[name] = found.get(name, set()) | carried
    return found


def aliases(body) -> dict:
    """name -> the names whose value it may share: `r = rows`, `for row in rows:` (a change of `r` or `row` changes
    what `rows` holds), transitively."""
    found: dict = {}
    for stmt in body:
        pairs = []
        if isinstance(stmt, cst.For):
            pairs = [(target, base_name(stmt.iter)) for target in names_in(stmt.target)]
        elif isinstance(stmt, cst.SimpleStatementLine):
            pairs = [(t.target.value, base_name(s.value)) for s in stmt.body if isinstance(s, cst.Assign)
                     for t in s.targets if isinstance(t.target, cst.Name)
                     and isinstance(s.value, (cst.Name, cst.Attribute, cst.Subscript))]
        for name, other in pairs:
            if other is not None and other != name:
                found.setdefault(name, set()).update({other} | found.get(other, set()))
    return found


def imported_by_call(body, names) -> dict:
    """The top-level lines that bind a name to a module by a call (`net = importlib.import_module("requests")`,
    `np = __import__("numpy")`), imports as an import statement is: the line (an Assign) -> (name, the package)."""
    found = {}
    for small in (small for stmt in body if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body):
        call = small.value if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(
            small.targets[0].target, cst.Name) else None
        module = names.literal(call.args[0].value) if isinstance(call, cst.Call) and call.args and \
            names.meanings(call.func) & IMPORTS else None
        if isinstance(module, str) and module:
            found[small] = (small.targets[0].target.value, module.split(".")[0])
    return found
