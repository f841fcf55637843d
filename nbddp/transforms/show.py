"""Step: what a cell showed, the script shows: a cell's last expression becomes `nbddp_show(<expression>)`.

Jupyter displays the value of a cell's last statement when it is an expression (`df.head()`, `dataset`, the value
`trainer.evaluate()` returns), unless the line ends with `;` or the value is None. In the script the value is still
computed where the notebook computed it (on every rank, or under the rank-0 guard a later step may put around it);
`nbddp_show` shows its text on rank 0 (nbddp/runtime/ipython_forms.py; in a `%ddp` session, the kernel's own display).
Calls that show nothing of their value (print, display, nbddp's helpers, the notebook's own functions that return
nothing) are left as they are, and so are saves, pushes and a tracker's calls: what they return is bookkeeping (the
files a tokenizer wrote), which the script does not show.
"""
from __future__ import annotations

import libcst as cst

from ..cells import starts_cell
from ..cst_helpers import LiveVisitor
from ..vocabulary import DISPLAY, MEMORY, PRINT, PUSH, SAVE, TRACK, kinds
from .base import TreeStep

SHOW = "nbddp_show"
SHOW_NOTHING = frozenset({"builtins.print", "display", "IPython.display.display"})
BOOKKEEPING = frozenset({SAVE, PUSH, TRACK, PRINT, DISPLAY, MEMORY})  # values of saves and logs: not shown


def _last_expression(stmt) -> cst.Expr | None:
    """The expression a statement line ends with, unless `;` ends it."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    last = stmt.body[-1]
    if isinstance(last, cst.Expr) and not isinstance(last.semicolon, cst.Semicolon):
        return last
    return None


class _Returns(LiveVisitor):
    """Whether a function's own body returns a value or yields (nested defs and lambdas are theirs)."""

    def __init__(self):
        self.found = False

    def visit_Return(self, node):
        self.found = self.found or node.value is not None

    def visit_Yield(self, node):
        self.found = True


def _returns_nothing(function) -> bool:
    if not isinstance(function, cst.FunctionDef) or function.name.value == "__init__":  # a class's call: an instance
        return False
    returns = _Returns()
    function.body.visit(returns)
    return not returns.found


class Show(TreeStep):
    name = "show"
    inserts = (SHOW,)

    def _shows(self, names, expr) -> bool:
        if isinstance(expr, (cst.Yield, cst.Await)):
            return False
        if isinstance(expr, cst.Call):
            meanings = names.meanings(expr.func)
            if meanings & SHOW_NOTHING or kinds(meanings) & BOOKKEEPING or any(
                    m.startswith(("nbddp_", "NBDDP_")) for m in meanings):
                return False
            functions = names.definitions(expr.func)
            return not (functions and all(map(_returns_nothing, functions)))
        return True

    def run(self, tree, ctx):
        body = list(tree.module.body)
        ends = [i for i, stmt in enumerate(body) if i + 1 == len(body) or starts_cell(body[i + 1]) is not None]
        cell = None
        for i, stmt in enumerate(body):
            cell = starts_cell(stmt) or cell
            last = _last_expression(stmt) if i in ends else None
            if last is None or not self._shows(tree.names, last.value):
                continue
            tree.at = stmt
            shown = last.with_changes(value=cst.Call(cst.Name(SHOW), args=[cst.Arg(last.value)]))
            body[i] = stmt.with_changes(body=[*stmt.body[:-1], shown])
            tree.names.origin[body[i]] = tree.names.orig(stmt)
            ctx.report.change(cell, "the cell's last value is shown on rank 0, as the notebook showed it")
        return tree.module.with_changes(body=body)
