"""The shape every pipeline step has: take a notebook (or one cell) and return it, like nbconvert's Preprocessor."""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..cst import is_if_false, parse
from ..report import Report


@dataclass
class Options:
    keep_global_batch: bool = False
    seed: int = 3407
    main_prints: bool = True  # top-level prints on rank 0 only (off for `%%torchrun --all-ranks`)


@dataclass
class Context:
    report: Report = field(default_factory=Report)
    options: Options = field(default_factory=Options)
    runtime: object = None  # nbddp.inline.Choice: the runtime modules the script carries, set by the last step


def cell_number(cell) -> int:
    """The cell's 1-based position in the original notebook (markdown cells included)."""
    return cell.metadata["nbddp"]["cell"]


class Transform:
    """One step of the pipeline. Subclasses override `preprocess_cell`, or `preprocess` for whole-notebook work."""

    name = "transform"

    def preprocess(self, nb, ctx: Context):
        nb.cells = [self.preprocess_cell(cell, ctx) for cell in nb.cells]
        return nb

    def preprocess_cell(self, cell, ctx: Context):
        return cell


class CstTransform(Transform):
    """A step that rewrites each cell's code as a libcst tree.

    `triggers`: names the step acts on; a cell whose text holds none of them cannot need the step and is not
    parsed (a fast path only: the rewrite itself always works on the tree).
    """

    triggers: tuple[str, ...] = ()

    def preprocess_cell(self, cell, ctx):
        if self.triggers and not any(word in cell.source for word in self.triggers):
            return cell
        module = parse(cell.source, cell=cell_number(cell), step=self.name)
        new = self.rewrite(module, cell_number(cell), ctx)
        code = new.code  # libcst round-trips exactly: the same text means nothing changed
        if code != cell.source:
            cell.source = code
        return cell

    rewriter: type | None = None  # a CallRewriter subclass, for steps that are one call-site rewrite

    def rewrite(self, module, cell_no: int, ctx: Context):
        return module.visit(self.rewriter(cell_no, ctx))


class CallRewriter(cst.CSTTransformer):
    """A call-site rewrite of one cell: subclasses implement `leave_Call`; `if False:` blocks are left alone."""

    def __init__(self, cell: int, ctx: Context):
        self.cell, self.report, self.options = cell, ctx.report, ctx.options

    def visit_If(self, node):
        return not is_if_false(node)
