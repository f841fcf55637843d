"""The notebook as one libcst tree: every code cell after the magics step, parsed once, in order.

Each cell starts with the line `# %% cell N` (N: the cell's position in the notebook), the first leading line of its
first statement (of the module's footer for trailing cells without statements): the marker the script keeps, so a
traceback leads back to the cell. Steps take the tree and return a new one; `Tree.names` (nbddp.meanings) is computed
once on the first tree and shared by every step; what a step rewrites is recorded in `names.origin` (TreeTransformer
does it for every node it replaces), so later steps still classify the nodes. The text is rendered once, by
nbddp.render; `cells()` gives each cell's code back (the converter's API and tests read it).
"""
from __future__ import annotations

import operator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst._nodes.internal import CodegenState

from .cells import MARKER, CellIndex, cell_at, cell_number, marker_number, starts_cell
from .cst_helpers import is_if_false, names_in, parse
from .effects import Effects
from .features import read_features
from .meanings import Names
from .needs import training_needs
from .reads_writes import reads_writes
from .vocabulary import AMP, DEVICE, ENV
from .walk import walk
from .written import OwnModules


def marker(number) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"{MARKER}{number}"))


def build(cells, step: str) -> cst.Module:
    """One module of all cells: each cell's lines after a marker, a blank line between cells."""
    body, pending = [], []
    for cell in cells:
        module = parse(cell.source, cell=cell_number(cell), step=step)
        if any(not line.strip() for line in cell.source.strip("\n").split("\n")):
            module = module.visit(_BareBlankLines())  # blank lines inside blocks and brackets
        if body or pending:
            pending.append(cst.EmptyLine(indent=False))
        pending += [marker(cell_number(cell))] + _bare(module.header)
        for stmt in module.body:
            body.append(stmt.with_changes(leading_lines=tuple(pending) + tuple(_bare(stmt.leading_lines))))
            pending = []
        pending += _bare(module.footer)
    return cst.Module(body=body, footer=tuple(pending))


class _BareBlankLines(cst.CSTTransformer):
    """Blank lines get no indentation (no trailing spaces in the script, whatever block a line ends up in)."""

    def leave_EmptyLine(self, original, updated):
        return updated.with_changes(indent=False) if updated.comment is None else updated


def _bare(lines) -> list:
    return [line.with_changes(indent=False) if line.comment is None and line.indent else line for line in lines]


def _split_lines(lines, cells, expected):
    """Distribute leading lines over cells at their markers (the blank line before a marker is the separator). Only
    the marker of the next cell counts: a notebook's own `# %% cell 7` comment stays a comment."""
    lines = list(lines)
    while True:
        at = next((i for i, line in enumerate(lines) if expected and marker_number(line) == expected[0]), None)
        if at is None:
            return lines
        before = lines[:at]
        if cells and before and before[-1].comment is None:
            before = before[:-1]
        if cells:
            cells[-1][2] += before
        cells.append([expected.pop(0), [], []])  # number, statements, footer lines
        lines = lines[at + 1:]


def split(module: cst.Module, numbers) -> list[tuple[int, str]]:
    """(cell number, code) of each cell of a tree `build` made of the cells `numbers`."""
    cells: list = []
    expected = list(numbers)
    for stmt in module.body:
        rest = _split_lines(stmt.leading_lines, cells, expected)
        cells[-1][1].append(stmt.with_changes(leading_lines=tuple(rest)))
    tail = _split_lines(module.footer, cells, expected)
    cells[-1][2] += tail
    return [(n, cst.Module(body=stmts, footer=tuple(footer)).code) for n, stmts, footer in cells]


class _Facts(cst.CSTVisitor):
    """What a statement holds, for steps to skip the statements that cannot concern them: the vocabulary's kinds of
    its calls, DEVICE for a `device=` keyword or a GPU literal, ENV for CUDA_VISIBLE_DEVICES, AMP for an import.
    Read in the analysis' one pass over the first tree (`watch`), or by visiting a statement a step made."""

    def __init__(self):
        self.calls: dict = {}  # statement -> its calls
        self.raw: dict = {}  # statement -> facts read from literals and keywords
        self.names: dict = {}  # statement -> the names it holds

    def watch(self, statement, node):
        if isinstance(node, cst.Name):
            self.names.setdefault(statement, set()).add(node.value)
        elif isinstance(node, cst.Call):
            self.calls.setdefault(statement, []).append(node)
            if any(a.keyword is not None and a.keyword.value == "device" for a in node.args):
                self.raw.setdefault(statement, set()).add(DEVICE)
        elif isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            if value == "CUDA_VISIBLE_DEVICES":
                self.raw.setdefault(statement, set()).add(ENV)
            elif isinstance(value, str) and value.startswith("cuda:"):
                self.raw.setdefault(statement, set()).add(DEVICE)
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Integer):
            self.raw.setdefault(statement, set()).add(DEVICE)  # `gpu = 0`, perhaps used as a device later
        elif isinstance(node, cst.ImportFrom) and node.module is not None and \
                cst.Module([]).code_for_node(node.module).startswith("torch.cuda.amp"):
            self.raw.setdefault(statement, set()).add(AMP)

    def on_visit(self, node):
        self.watch(None, node)
        return True

    def of(self, names, statement) -> frozenset:
        found = set(self.raw.get(statement, ()))
        for call in self.calls.get(statement, ()):
            found |= names.kinds(call.func)
        return frozenset(found)


class Tree:
    def __init__(self, cells, step: str = "tree", folder=None):
        self.first = self.module = build(cells, step)
        self.folder = folder  # where the notebook's own modules are (nbddp.written)
        self.numbers, self._facts = [cell_number(cell) for cell in cells], {}
        self._seen = _Facts()  # filled by the analysis' pass over the first tree
        self._top = set(self.first.body)
        self.at = None  # the statement a step is at (an error names its cell and line)
        self.notebook = None  # the notebook whose code cells these are

    @cached_property
    def names(self) -> Names:
        names = Names(self.first, self._seen.watch)
        names.own = OwnModules(self.first.body, names, self.folder)  # the notebook's own modules (nbddp.written)
        return names

    @cached_property
    def effects(self) -> Effects:
        """What the notebook's calls do through its own functions (nbddp.effects), computed once for every step."""
        return Effects(self.names)

    @cached_property
    def plan(self):
        """Where each statement runs (nbddp.needs), once, on the first tree: steps read it through names.orig."""
        return training_needs(self.first.body, self.names, self.effects, self.folder)

    @cached_property
    def features(self):
        """What the notebook asks of the runtime, and the call-site decisions that follow (nbddp.features), once."""
        return read_features(self)

    def facts(self, stmt) -> frozenset:
        """What a top-level statement holds (see _Facts), read once from the first tree."""
        names, stmt = self.names, self.names.orig(stmt)
        if stmt not in self._facts:
            if stmt in self._top:
                self._facts[stmt] = self._seen.of(names, stmt)
            else:
                found = _Facts()
                walk(stmt, found)
                self._facts[stmt] = found.of(names, None)
        return self._facts[stmt]

    def calls_in(self, stmt) -> list:
        """The calls a top-level statement of the first tree holds (read in the analysis' one pass)."""
        return self._seen.calls.get(self.names.orig(stmt), [])  # (`names` first: the pass fills the facts)

    def names_in(self, stmt) -> set:
        """The names a top-level statement holds (read in the analysis' one pass over the first tree)."""
        stmt = self.names.orig(stmt)  # (the analysis' pass fills the statement facts)
        return self._seen.names.get(stmt, set()) if stmt in self._top else names_in(stmt)

    def visit(self, transformer, wants=None, mentions=None) -> cst.Module:
        """The tree through a transformer; with `wants`, only the top-level statements whose facts meet it; with
        `mentions` (names), only those that name one of them or a name an earlier such statement bound (an alias)."""
        if wants is None and mentions is None:
            return self.module.visit(transformer)
        body, named = [], set(mentions or ())
        for stmt in self.module.body:
            transformer.cell = starts_cell(stmt) or transformer.cell
            hit = self.facts(stmt) & wants if wants is not None else bool(self.names_in(stmt) & named)
            if hit and mentions is not None:
                named |= reads_writes(stmt)[1]
            new = stmt.visit(transformer) if hit else stmt
            body += new.nodes if isinstance(new, cst.FlattenSentinel) else [] if isinstance(
                new, cst.RemovalSentinel) else [new]
        return self.module.with_changes(body=body)

    def cells(self) -> list[tuple[int, str]]:
        return split(self.module, self.numbers)

    def line_map(self) -> dict:
        """(cell, line in the converted cell) -> the line of the cell's own text it came from, for each statement a
        step kept or rewrote in place (through `names.origin`); lines nbddp added (guards, barriers) map to none.
        Only the cells whose code a step changed are read (the others' lines are their own)."""
        first, found = _by_cell(self.first.body), {}
        for cell, statements in _by_cell(self.module.body).items():
            before = first.get(cell, [])
            if all(map(operator.is_, statements, before)) and len(statements) == len(before):
                continue  # no step touched the cell
            (now_at, now_cells), (then_at, then_cells) = statement_lines(statements), statement_lines(before)
            for node, where in now_at.items():
                origin = self.names.orig(node)
                if not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) or origin not in then_at:
                    continue
                now, then = now_cells.at(where), then_cells.at(then_at[origin])
                if now and then and now[0] == then[0]:
                    found[(int(now[0]), now[1])] = then[1]
        return found

    def where(self, node) -> tuple[int | None, int | None]:
        """(cell, line in the cell) of a node of the first tree (computed only when an error needs it)."""
        from libcst.metadata import MetadataWrapper, PositionProvider

        node = self.names.orig(node)
        positions = MetadataWrapper(self.first, unsafe_skip_copy=True).resolve(PositionProvider)
        if node not in positions:
            return None, None
        found = cell_at(self.first.code.splitlines(), positions[node].start.line)
        return (int(found[0]), found[1]) if found else (None, None)


def _by_cell(body) -> dict:
    """Cell number -> its top-level statements (a cell starts at its marker's statement)."""
    found, cell = {}, None
    for statement in body:
        cell = starts_cell(statement) or cell
        found.setdefault(cell, []).append(statement)
    return found


def statement_lines(statements):
    """The first line of each statement of these, in a module of them alone, and that module's cells' index: one
    code generation that counts lines (libcst's PositionProvider places every node, at several times the cost)."""
    module = cst.Module(body=statements)
    state = _Lines(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    return state.starts, CellIndex("".join(state.tokens).splitlines())


@dataclass
class _Lines(CodegenState):
    """Code generation that records the line each statement starts at (where its syntax starts: after its leading
    blank and comment lines and its decorators)."""

    line: int = 1
    starts: dict = field(default_factory=dict)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.line += value.count("\n")

    @contextmanager
    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.starts[node] = self.line
        yield


class Recording:
    """A transformer mixin: each node it replaces is recorded in `self.names.origin`, so later steps classify the
    new node as the old one."""

    names = None

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        if isinstance(result, cst.CSTNode) and result is not original_node:
            self.names.origin[result] = self.names.orig(original_node)
        return result


class TreeTransformer(Recording, cst.CSTTransformer):
    """A step's rewrite of the whole tree: `self.cell` is the cell being visited; each node it replaces is recorded
    in `names.origin`, so later steps classify the new node as the old one; `if False:` blocks are left alone."""

    def __init__(self, tree: Tree, ctx):
        super().__init__()
        self.tree, self.names, self.report, self.options = tree, tree.names, ctx.report, ctx.options
        self.cell = None

    def on_visit(self, node):
        if isinstance(node, cst.BaseStatement):
            self.cell, self.tree.at = starts_cell(node) or self.cell, node
        if isinstance(node, cst.If) and is_if_false(node):
            return False
        return super().on_visit(node)

