"""Step: Unsloth's scratch folder gets one subfolder per rank where ranks would write the same file.

`FastLanguageModel.get_peft_model` (under any name the notebook gives the loader) with `embed_tokens`/`lm_head`
among the trained modules saves those weights to `_unsloth_temporary_saved_buffers/…` and maps them back; two ranks
writing and mapping one file race, and one reads it half-written (seen on 2 GPUs with the Mistral CPT notebook).
Each rank gets its own `temporary_location`.
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, keyword
from ..vocabulary import PEFT, is_unsloth_loader
from .base import CallRewriter, TreeStep

SHARED_WEIGHTS = frozenset({"embed_tokens", "lm_head"})
RANK_LOCATION = 'f"_unsloth_temporary_saved_buffers/rank{NBDDP_RANK}"'


def _strings(node) -> set[str]:
    found: set[str] = set()

    class _Strings(cst.CSTVisitor):
        def visit_SimpleString(self, s):
            found.add(str(s.evaluated_value))

    node.visit(_Strings())
    return found


class _Scratch(CallRewriter):
    def leave_Call(self, original, updated):
        unsloth = any(is_unsloth_loader(m, self.names.packages) for m in self.names.meanings(original.func))
        if PEFT not in self.kinds(original) or not unsloth:
            return updated
        if keyword(updated, "temporary_location") is not None or any(a.star == "**" for a in updated.args):
            return updated
        if not _strings(updated) & SHARED_WEIGHTS:
            return updated
        self.report.change(self.cell, "get_peft_model trains embed_tokens/lm_head: each rank gets its own "
                                      "temporary_location, so ranks do not write one file at once")
        return add_keyword(updated, "temporary_location", cst.parse_expression(RANK_LOCATION))


class Scratch(TreeStep):
    name = "scratch"
    inserts = ("NBDDP_RANK",)
    rewriter = _Scratch
    wants = frozenset({PEFT})
