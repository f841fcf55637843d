"""Step: `%run other.ipynb` (or `.ipy`) becomes the other notebook's code cells, in place of the line.

IPython runs such a notebook's cells one by one in the notebook's own namespace, as if they stood in the cell
(`InteractiveShell.safe_execfile_ipy`): what they bind is the notebook's, and they read its names. So the script holds
them there, and every later step decides where each of their statements runs as it does for the notebook's own. A
`%run` inside a block (`if not ready: %run setup.ipynb`) gets them in the block; inside a function or class body,
after `global` for the names they bind at their top level (IPython binds them in the notebook's namespace there
too). A relative path is the kernel's folder's (the notebook's), also for a `%run` inside the notebook it runs. The
converter reads the file and never runs it. A line the converter cannot read (no such file beside the notebook, a
computed name, a notebook that runs itself) stays as it was, and the magics step says what became of it.
"""
from __future__ import annotations

import ast
import os
import shlex

import libcst as cst
import nbformat
from libcst.metadata import MetadataWrapper, PositionProvider

from ..cells import cell_number
from ..cst_helpers import parse
from ..errors import ConversionError
from ..reads_writes import reads_writes
from .base import Context, Transform
from .ipython_calls import is_ipython_call
from .ipython_lines import ipython_to_python, leading_comments
from .ipython_names import shell_aliases

SUFFIXES = (".ipynb", ".ipy")
DEPTH = 8  # notebooks that run notebooks


class _RunLines(cst.CSTVisitor):
    """{line number: (the argument, how deep in blocks, inside a function or class body)} of a cell's `%run` lines."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, aliases):
        self.aliases, self.found, self.depth, self.scopes = aliases, {}, 0, 0

    def visit_IndentedBlock(self, node):
        self.depth += 1

    def leave_IndentedBlock(self, node):
        self.depth -= 1

    def visit_FunctionDef(self, node):
        self.scopes += 1

    def leave_FunctionDef(self, node):
        self.scopes -= 1

    visit_ClassDef, leave_ClassDef = visit_FunctionDef, leave_FunctionDef

    def visit_SimpleStatementLine(self, node):
        small = node.body[0] if len(node.body) == 1 else None
        call = small.value if isinstance(small, cst.Expr) else None
        if is_ipython_call(call, self.aliases) and call.func.attr.value == "run_line_magic" and len(call.args) == 2 \
                and all(isinstance(a.value, cst.SimpleString) for a in call.args):
            name, line = (a.value.evaluated_value for a in call.args)
            if name == "run":
                self.found[self.get_metadata(PositionProvider, node).start.line] = (line, self.depth, self.scopes > 0)
        return False


def _run_lines(source: str, aliases: set) -> dict[int, tuple]:
    """{line number: (the argument, depth, scoped)} of the cell's `%run` lines, as IPython reads the cell (also
    spelled `get_ipython().run_line_magic("run", ...)`, through a saved `ip = get_ipython()`: `aliases`, which the
    cell's own such names join)."""
    try:
        module = cst.parse_module(ipython_to_python(source))
    except (SyntaxError, cst.ParserSyntaxError):
        return {}
    aliases |= shell_aliases(module)
    lines = _RunLines(aliases)
    MetadataWrapper(module).visit(lines)
    return lines.found


def _compiles(source: str) -> bool:
    """The cell, as IPython makes it Python, compiles (a `global` after the name's use in the function does not)."""
    try:
        compile(ipython_to_python(source), "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _in_block(cells, indent: str, scoped: bool) -> str:
    """The ran cells' statements (Python, as IPython makes each cell) as the lines of a block indented `indent`;
    `scoped`: first `global` for the names they bind at their top level."""
    body = []
    for label, code in cells:
        module = cst.parse_module(code)
        statements = list(module.body)
        if statements:
            mark = cst.EmptyLine(comment=cst.Comment(f"# {label}"))
            statements[0] = statements[0].with_changes(leading_lines=[mark, *module.header,
                                                                      *statements[0].leading_lines])
        body += statements
    bound = sorted(set().union(*(reads_writes(stmt)[1] for stmt in body))) if scoped else []
    if bound:  # after the first cell's mark
        body[0], marks = body[0].with_changes(leading_lines=[]), body[0].leading_lines
        body.insert(0, cst.SimpleStatementLine([cst.Global([cst.NameItem(cst.Name(n)) for n in bound])],
                                               leading_lines=marks))
    block = cst.If(test=cst.Name("True"), body=cst.IndentedBlock(body=body or [cst.SimpleStatementLine([cst.Pass()])],
                                                                 indent=indent))
    return cst.Module(body=[block]).code.split("\n", 1)[1]


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
        for number, (line, depth, scoped) in sorted(_run_lines(source, self.aliases).items(), reverse=True):
            path = _target(line)
            cells = self._cells(path, ctx, running) if path else None
            if cells is None:
                continue
            ran = [(f"%run {path}, cell {n}", self._valid(self.expand(code, cell, ctx, (*running, path)), path, n,
                                                          cell)) for n, code in cells]
            if depth:
                indent = lines[number - 1][:len(lines[number - 1]) - len(lines[number - 1].lstrip())]
                ran = [(label, ipython_to_python(code)) for label, code in ran]
                kept, lines[number - 1] = lines[number - 1], _in_block(ran, indent, scoped)
                if not _compiles("".join(lines)):  # a name the function used before, `import *` in a function
                    lines[number - 1] = kept
                    ctx.report.warn(cell, f"`%run {path}` inside a function: its cells bind names the function "
                                          "also uses as its own (or `import *`); move the line to the notebook's top "
                                          "level and convert again")
                    continue
            else:
                lines[number - 1] = "".join(f"# {label}\n" + code.rstrip("\n") + "\n" for label, code in ran)
            if not running:
                count = f"{len(cells)} code cell" + ("s" if len(cells) != 1 else "")
                where = " inside a function, its names the notebook's (`global`)" if scoped else \
                    " inside a block" if depth else ""
                ctx.report.change(cell, f"`%run {path}`: its {count} converted in its place{where}, as IPython runs "
                                        "them in the notebook's namespace")
        return "".join(lines)

    def _valid(self, code: str, path: str, number: int, cell: int) -> str:
        """The ran notebook's cell, where IPython makes Python of it; else the conversion stops, naming that cell."""
        try:
            parse(ipython_to_python(code))
        except ConversionError as error:
            where = f", line {error.line}" if error.line is not None else ""
            said = error.message.split(";")[0]
            raise ConversionError(f"`%run {path}`: cell {number} of {path}{where}: {said}; fix it in {path}",
                                  step=self.name, cell=cell) from None
        return code

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
