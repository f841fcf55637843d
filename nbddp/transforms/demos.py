"""Step: a demo server's `launch()` (gradio's: nbddp.entries.DEMOS) returns at once in a notebook, which it tells by
IPython, and blocks a script until the server stops: in the script it gets `prevent_thread_lock=True`, so it returns
as in the notebook, the rest of the notebook runs, and the demo stops when the script ends (the report says so). A
launch that sets the keyword itself is left as it is."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, code_of, has_star_kwargs, keyword
from ..entries import DEMOS
from ..entry_match import Table
from ..vocabulary import known
from ..reads_writes import imported_packages
from .base import CallRewriter, TreeStep

KEY = "prevent_thread_lock"
DEMO_PACKAGES = frozenset(entry.split(".")[0] for entry in DEMOS)


LAUNCHES = Table(DEMOS)


def _is_launch(meaning: str, names) -> bool:
    """gradio's launch(), or `x.launch` of a value nbddp cannot follow (a name bound in another cell converted alone)
    in a notebook that uses gradio."""
    return LAUNCHES.match(meaning, known(meaning, names.packages))


class _Demos(CallRewriter):
    def leave_Call(self, original, updated):
        launches = any(_is_launch(m, self.names) for m in self.names.meanings(original.func))
        if not launches or keyword(updated, KEY) is not None \
                or has_star_kwargs(updated):
            return updated
        self.report.change(self.cell, f"`{code_of(updated.func)}()` returns at once, as in the notebook "
                                      f"({KEY}=True): the demo runs until the script ends, then stops with it")
        return add_keyword(updated, KEY, cst.Name("True"))


class Demos(TreeStep):
    name = "demos"
    rewriter = _Demos

    def run(self, tree, ctx):
        if DEMO_PACKAGES.isdisjoint(imported_packages(tree.first.body)):
            return tree.module
        return tree.visit(self.rewriter(tree, ctx))
