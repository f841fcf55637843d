"""Step: what a cell showed, the script shows: a cell's last expression becomes `nbddp_show(<expression>)`.

Jupyter displays the value of a cell's last statement when it is an expression (`df.head()`, `dataset`, the value
`trainer.evaluate()` returns), unless the line ends with `;` or the value is None. In the script the value is still
computed where the notebook computed it (on every rank, or under the rank-0 guard a later step may put around it);
`nbddp_show` shows its text on rank 0 (nbddp/runtime/ipython_forms.py; in a `%ddp` session, the kernel's own display).
Calls that show nothing of their value (print, display, nbddp's helpers, the notebook's own functions that return
nothing) are left as they are, and so are saves, pushes and a tracker's calls: what they return is bookkeeping (the
files a tokenizer wrote), which the script does not show.

A notebook that reads IPython's history (`_`, `__`, `___`, `_N`, `Out`, `In`, `_iN`, names it never binds itself)
gets it: `nbddp_history([...])` before its first cell binds the inputs (each cell's Python as IPython runs it) and an
empty output history, and `nbddp_show(value, N)` keeps each shown value under the cell's execution count N (its
place among the code cells, as a kernel that runs them in order counts them), on every rank.
"""
from __future__ import annotations

import re

import libcst as cst
from IPython.core.inputtransformer2 import TransformerManager

from ..cells import starts_cell
from ..cst_helpers import LiveVisitor
from ..vocabulary import DISPLAY, MEMORY, PRINT, PUSH, SAVE, TRACK
from ..walk import walk
from .base import TreeStep

SHOW, HISTORY, INPUT = "nbddp_show", "nbddp_history", "nbddp_cell_input"
HISTORY_NAMES = re.compile(r"_{1,3}|_\d+|_i\d+|Out|In|_oh|_ih")  # what IPython binds in a notebook's namespace
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
    walk(function.body, returns)
    return not returns.found


def reads_history(names) -> bool:
    """The notebook reads a name of IPython's history that it never binds itself."""
    return any(not referents and HISTORY_NAMES.fullmatch(node.value) for node, referents in names.referents.items())


class Show(TreeStep):
    name = "show"
    inserts = (SHOW, HISTORY, INPUT)

    def _shows(self, names, expr) -> bool:
        if isinstance(expr, (cst.Yield, cst.Await)):
            return False
        if isinstance(expr, cst.Call):
            meanings = names.meanings(expr.func)
            if meanings & SHOW_NOTHING or names.kinds(expr.func) & BOOKKEEPING or any(
                    m.startswith(("nbddp_", "NBDDP_")) for m in meanings):
                return False
            functions = names.definitions(expr.func)
            return not (functions and all(map(_returns_nothing, functions)))
        return True

    def run(self, tree, ctx):
        body = list(tree.module.body)
        ends = [i for i, stmt in enumerate(body) if i + 1 == len(body) or starts_cell(body[i + 1]) is not None]
        history = reads_history(tree.names) and not any(n.startswith(HISTORY) for n in tree.names_in(body[0]))
        counts = {number: count for count, number in enumerate(tree.numbers, start=1)}  # execution counts
        cell = None
        for i, stmt in enumerate(body):
            cell = starts_cell(stmt) or cell
            last = _last_expression(stmt) if i in ends else None
            if last is None or not self._shows(tree.names, last.value):
                continue
            tree.at = stmt
            value = last.value
            if isinstance(value, cst.Tuple) and not value.lpar:  # `a, b`: one value, a tuple, as IPython shows it
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            args = [cst.Arg(value)] + ([cst.Arg(cst.Integer(str(counts[cell])))] if history else [])
            shown = last.with_changes(value=cst.Call(cst.Name(SHOW), args=args))
            body[i] = stmt.with_changes(body=[*stmt.body[:-1], shown])
            tree.names.origin[body[i]] = tree.names.orig(stmt)
            ctx.report.change(cell, "the cell's last value is shown on rank 0, as the notebook showed it")
        if history:
            body = _with_history(body, [ctx.inputs[number] for number in tree.numbers], counts)
            ctx.report.change(tree.numbers[0], "the notebook reads IPython's history (_, Out, In, ...): the script "
                                               "keeps it, each shown value under its cell's execution count")
        return tree.module.with_changes(body=body)


def _line(name, *args, leading=()) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name(name), args=[cst.Arg(a) for a in args]))],
                                   leading_lines=leading)


def _with_history(body, inputs, counts) -> list:
    """`nbddp_history([...])` before the notebook's first statement, and `nbddp_cell_input(N)` first in each cell N (after
    its marker): the inputs as written and as IPython runs them (In)."""
    manager = TransformerManager()
    pairs = cst.List([cst.Element(cst.Tuple([  # without their last newlines, as IPython's history keeps them
        cst.Element(cst.SimpleString(repr(text.rstrip("\n")))),
        cst.Element(cst.SimpleString(repr(manager.transform_cell(text).rstrip("\n"))))])) for text in inputs])
    out = []
    for stmt in body:
        number = starts_cell(stmt)
        if number is not None:
            start = [_line(HISTORY, pairs)] if not out else []
            out += start + [_line(INPUT, cst.Integer(str(counts[number])))]
            out[-1 - len(start)] = out[-1 - len(start)].with_changes(leading_lines=stmt.leading_lines)
            stmt = stmt.with_changes(leading_lines=())
        out.append(stmt)
    return out
