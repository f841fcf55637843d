"""The shape every pipeline step has: the magics step takes each cell's text; the steps after it take the notebook's
one tree (nbddp.tree.Tree) and return the new tree."""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..report import Report
from ..tree import Tree, TreeTransformer


@dataclass
class Options:
    scale_batch: bool = False  # N times the samples per step by default (NBDDP_BATCH=scale), not the notebook's
    seed: int = 3407
    main_prints: bool = True  # top-level prints on rank 0 only (off for `%%torchrun --all-ranks`)
    whole: bool = True  # the whole job (not one cell of `%ddp`): what training does not need runs once (nbddp.needs)


@dataclass
class Context:
    report: Report = field(default_factory=Report)
    options: Options = field(default_factory=Options)
    runtime: object = None  # nbddp.inline.Choice: the runtime modules the script carries, set by the last step
    tree: Tree | None = None  # the notebook's one tree, once the magics step is done
    inputs: dict = field(default_factory=dict)  # cell number -> the code cell's source as the notebook holds it
    folder: str | None = None  # where the notebook's own modules are (beside it): nbddp.written reads them


class Transform:
    """A step over the notebook's cells as text (before the tree exists): `preprocess_cell` or `preprocess`.
    `inserts`: the runtime's helpers (nbddp.runtime.HELPERS) the step may write into the script."""

    name = "transform"
    inserts: tuple = ()

    def preprocess(self, nb, ctx: Context):
        nb.cells = [self.preprocess_cell(cell, ctx) for cell in nb.cells]
        return nb

    def preprocess_cell(self, cell, ctx: Context):
        return cell


class TreeStep:
    """A step over the notebook's one tree: `run(tree, ctx)` returns the new module. A step that is one call-site
    rewrite names its CallRewriter as `rewriter`."""

    name = "tree-step"
    inserts: tuple = ()  # the runtime's helpers (nbddp.runtime.HELPERS) the step may write into the script
    rewriter: type | None = None
    wants: frozenset | None = None  # the statement facts (nbddp.tree.Tree.facts) the step acts on; None: all

    def run(self, tree: Tree, ctx: Context) -> cst.Module:
        return tree.visit(self.rewriter(tree, ctx), self.wants)


class CallRewriter(TreeTransformer):
    """A call-site rewrite: subclasses implement `leave_Call` and read `self.names` for what a call is."""

    def kinds(self, call: cst.Call) -> frozenset:
        return call_kinds(self.names, call)


def call_kinds(names, call: cst.Call) -> frozenset:
    """nbddp.vocabulary's kinds of what a call's callee is (through imports and aliases)."""
    return names.kinds(call.func)
