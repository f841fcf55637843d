"""Modules the notebook writes itself (`%%writefile utils.py`, then `import utils`): what their code calls into.

    written_modules(body, names) -> {module name: the packages its code imports}

nbddp.needs reads a call into such a module as a call of the libraries the module's own code imports, not as a
library of its own: `utils.set_seed(42)` where utils.py imports torch sets up training (every rank), `utils.ping()`
where it imports only requests is an effect (once). The module's text is the literal the notebook wrote (the magics
step made `%%writefile` a `nbddp_write_file(path, text)` line); one written from a computed text, or one that does
not parse, stays a library of its own.
"""
from __future__ import annotations

import os

import libcst as cst

from .bindings import Bindings

WRITE = "nbddp_write_file"


def _written(stmt, names):
    """(path, text) of a top-level `nbddp_write_file("x.py", "...")` line with literal arguments, else None."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == WRITE and
            len(call.args) >= 2):
        return None
    path, text = (names.literal(arg.value) for arg in call.args[:2])
    return (path, text) if isinstance(path, str) and path.endswith(".py") and isinstance(text, str) else None


def written_modules(body, names) -> dict[str, set[str]]:
    found = {}
    for stmt in body:
        written = _written(stmt, names)
        if written is None:
            continue
        try:
            module = cst.parse_module(written[1])
        except cst.ParserSyntaxError:
            continue
        seen = Bindings(set(module.body))
        module.visit(seen)
        found[os.path.basename(written[0])[:-3]] = set(seen.packages)
    for name, packages in found.items():  # a written module that imports another: that one's packages too
        packages |= set().union(*(found[other] for other in packages & found.keys() - {name}))
    return found
