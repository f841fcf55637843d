"""Each cell a session runs, converted in the kernel exactly as `nbddp convert` converts a notebook.

The converter decides some things from earlier cells: a value made on rank 0 only (`outputs = model.generate(...)`
runs on rank 0) must be read on rank 0 only in every later cell too. So each new cell is converted together with
every cell the session ran before it, as one notebook, and the new cell's converted text is what the ranks run.
This costs one conversion of the cells so far per cell, and needs nothing of the pipeline's internals: only
`run_pipeline` and its Context/Options. Measured on the 31 corpus notebooks cell by cell (2026-11-27, a shared
2-core CPU): the last cell of a 20-25-cell notebook 0.2-0.7 s, of the 36-cell Kaggle Qwen3 GRPO notebook 1.3 s; each
cell's converted text equal to the whole notebook's conversion in all 31 corpus notebooks and the example.

The runtime modules a cell needs (`nbddp/runtime/`, the ones a generated script would carry for the cells so far)
go with it: the ranks import each the first time a cell needs it, before the cell runs, so that a library is still
patched right after the cell imports it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

#: runtime modules a session never imports: its ranks are always DDP ranks, started by torchrun
NOT_IN_A_SESSION = frozenset({"launcher", "fit"})


@dataclass
class Converted:
    code: str  # the cell as the ranks run it
    number: int  # its position among the cells the session ran (1-based)
    modules: list  # nbddp/runtime modules it needs (what they import from comes with them, by Python's import)
    warnings: list = field(default_factory=list)  # what the converter could not convert safely in this cell
    installs: list = field(default_factory=list)  # install commands removed from it
    lines: dict = field(default_factory=dict)  # a line of `code` -> the line of the cell as written it comes from
    alone: set = field(default_factory=set)  # (cell, index) of this cell's statements that rank 0 runs alone
    replayed: set = field(default_factory=set)  # (cell, index) of earlier statements it runs on the other ranks


class History:
    """The cells a session ran (as the user wrote them), and the conversion of the next one."""

    def __init__(self, all_ranks=False):
        self.cells: list[str] = []
        self.all_ranks = all_ranks
        self._installs: set = set()
        self.alone: set = set()  # (cell, index) of the statements of the cells run so far that rank 0 ran alone

    def convert(self, source: str) -> Converted:
        """The converted text of `source` as the next cell; raises NbddpError for a cell that cannot be converted.
        The cell joins the history only once `accept` is called (a cell that cannot run is forgotten)."""
        import nbformat

        from ..cells import cell_number
        from ..pipeline import run_pipeline
        from ..runtime import MODULES
        from ..report import Report
        from ..transforms.base import Context, Options

        cells = [*self.cells, source]
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text) for text in cells])
        ctx = Context(report=Report(source="%ddp session"), options=Options(main_prints=not self.all_ranks, whole=False))
        nb = run_pipeline(nb, ctx)
        number = len(cells)
        lines = {line: then for (cell, line), then in ctx.tree.line_map().items() if cell == number}
        code = next((cell.source for cell in nb.cells if cell_number(cell) == number), "")
        modules = [name for name in MODULES if name in ctx.runtime.reasons and name not in NOT_IN_A_SESSION]
        warnings = [note.text for note in ctx.report.warnings if note.cell == number]
        installs = [command for command in ctx.report.installs if command not in self._installs]
        alone, now = _positions(ctx.tree)
        replayed = {at: now[at] for at in sorted(self.alone - alone) if at in now and at[0] < number}
        if replayed:  # what this cell shows every rank needs (a library's set-up, then its value read here)
            note = cst.EmptyLine(comment=cst.Comment("# nbddp: this cell reads what an earlier cell's line made on rank "
                                                     "0 alone: the other ranks run it now"))
            head = cst.Module(body=[cst.If(test=cst.UnaryOperation(cst.Not(), cst.Name("NBDDP_IS_MAIN")),
                                           body=cst.IndentedBlock(body=list(replayed.values())),
                                           leading_lines=[note])]).code
            lines = {line + head.count("\n"): then for line, then in lines.items()}
            code = head + code
        return Converted(code, number, modules, warnings, installs, lines,
                         {at for at in alone if at[0] == number}, set(replayed))

    def accept(self, source: str, converted: Converted):
        self.cells.append(source)
        self._installs.update(converted.installs)
        self.alone = (self.alone - converted.replayed) | converted.alone


def _positions(tree) -> tuple[set, dict]:
    """(cell, index in the cell) of the notebook's statements that its plan runs on rank 0 alone (nbddp.alone), and of
    every statement, its converted form (what a later cell replays)."""
    from ..cells import starts_cell
    from ..transforms.data_prep import wraps_first

    alone, converted, cell, index = set(), {}, None, 0
    by_origin = {id(tree.names.orig(stmt)): stmt for stmt in tree.module.body}
    for stmt in tree.first.body:
        cell, index = (starts_cell(stmt), 0) if starts_cell(stmt) is not None else (cell, index + 1)
        if id(stmt) in tree.plan.alone:
            alone.add((cell, index))
        elif id(stmt) in by_origin:  # (a set-up the data-prep step wrapped: the first rank first; replayed bare)
            made = by_origin[id(stmt)]
            converted[cell, index] = made.body.body[0] if wraps_first(made) and len(made.body.body) == 1 else \
                made.with_changes(leading_lines=())
    return alone, converted
