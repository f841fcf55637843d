"""Step: `%run other.ipynb` (or `.ipy`) becomes the other notebook's code cells, in place of the line.

IPython runs such a notebook's cells one by one in the notebook's own namespace, as if they stood in the cell
(`InteractiveShell.safe_execfile_ipy`): what they bind is the notebook's, and they read its names. So the script holds
them there, and every later step decides where each of their statements runs as it does for the notebook's own. A
relative path is the kernel's folder's (the notebook's), also for a `%run` inside the notebook it runs. The converter
reads the file and never runs it. A line the converter cannot read (no such file beside the notebook, a computed
name, a notebook that runs itself) stays as it was, and the magics step says what became of it.
"""
from __future__ import annotations

import os
import shlex

import libcst as cst
import nbformat
from libcst.metadata import MetadataWrapper, PositionProvider

from ..cells import cell_number
from .base import Context, Transform
from .ipython_calls import is_ipython_call
from .ipython_lines import ipython_to_python, leading_comments
from .ipython_names import shell_aliases

SUFFIXES = (".ipynb", ".ipy")
DEPTH = 8  # notebooks that run notebooks


def _run_lines(source: str, aliases: set) -> dict[int, str]:
    """{line number: the argument} of the cell's top-level `%run` lines, as IPython reads the cell (also spelled
    `get_ipython().run_line_magic("run", ...)`, through a saved `ip = get_ipython()`: `aliases`, which the cell's own
    such names join)."""
    try:
        module = cst.parse_module(ipython_to_python(source))
    except (SyntaxError, cst.ParserSyntaxError):
        return {}
    aliases |= shell_aliases(module)
    wrapper = MetadataWrapper(module)
    positions = wrapper.resolve(PositionProvider)
    found = {}
    for stmt in wrapper.module.body:
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        call = small.value if isinstance(small, cst.Expr) else None
        if not (is_ipython_call(call, aliases) and call.func.attr.value == "run_line_magic" and len(call.args) == 2
                and all(isinstance(a.value, cst.SimpleString) for a in call.args)):
            continue
        name, line = (a.value.evaluated_value for a in call.args)
        if name == "run":
            found[positions[stmt].start.line] = line
    return found


def _target(line: str) -> str | None:
    """The notebook `%run line` runs (its flags and arguments aside), where it is one."""
    try:
        words = shlex.split(line.split(" #")[0])
    except ValueError:
        return None
    while words and words[0].startswith("-"):
        if words.pop(0) == "-m":
            return None
    return words[0] if words and words[0].endswith(SUFFIXES) else None


class RanNotebooks(Transform):
    name = "ran-notebooks"

    def __init__(self):
        self.aliases: set[str] = set()  # names the notebook bound to get_ipython(), so far

    def preprocess_cell(self, cell, ctx: Context):
        if "%run" in cell.source or "get_ipython" in cell.source or "run_line_magic" in cell.source:  # (no other
            cell.source = self.expand(cell.source, cell_number(cell), ctx, ())                     # cell can run one)
        return cell

    def expand(self, source: str, cell: int, ctx: Context, running: tuple) -> str:
        """The cell's text with each readable top-level `%run x.ipynb` line replaced by x's code cells."""
        if leading_comments(source)[1].lstrip().startswith("%%"):  # a cell magic's body is not IPython's lines
            return source
        lines = source.splitlines(keepends=True)
        for number, line in sorted(_run_lines(source, self.aliases).items(), reverse=True):
            path = _target(line)
            cells = self._cells(path, ctx, running) if path else None
            if cells is None:
                continue
            if not running:
                count = f"{len(cells)} code cell" + ("s" if len(cells) != 1 else "")
                ctx.report.change(cell, f"`%run {path}`: its {count} converted in its place, as IPython runs them in "
                                        "the notebook's namespace")
            lines[number - 1] = "".join(f"# %run {path}, cell {n}\n" + self.expand(code, cell, ctx, (*running, path))
                                        .rstrip("\n") + "\n" for n, code in cells)
        return "".join(lines)

    @staticmethod
    def _cells(path: str, ctx: Context, running: tuple):
        """[(cell number, source)] of the notebook's code cells, or None where it cannot be read (or runs itself)."""
        full = path if os.path.isabs(path) or not ctx.folder else os.path.join(ctx.folder, path)
        if path in running or len(running) >= DEPTH or not os.path.isfile(full):
            return None
        try:
            if path.endswith(".ipy"):
                with open(full, encoding="utf-8") as fh:
                    return [(1, fh.read())]
            nb = nbformat.read(full, as_version=4)
        except Exception:  # not a notebook nbformat can read: the magics step says what became of the line
            return None
        return [(n, c.source) for n, c in enumerate(nb.cells, start=1) if c.cell_type == "code" and c.source.strip()]
