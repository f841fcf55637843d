"""Step: deprecated `torch.cuda.amp.autocast(...)`/`GradScaler(...)` → `torch.amp.…("cuda", ...)`."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import dotted
from ..vocabulary import AMP
from .base import CallRewriter, TreeStep

RENAMES = {"torch.cuda.amp.autocast": "torch.amp.autocast", "torch.cuda.amp.GradScaler": "torch.amp.GradScaler"}


class _Autocast(CallRewriter):
    def leave_Call(self, original, updated):
        old = dotted(updated.func)
        if old not in RENAMES:
            return updated
        self.report.change(self.cell, f"{old}(...) → {RENAMES[old]}(\"cuda\", ...)")
        args = [cst.Arg(cst.SimpleString('"cuda"'))] + list(updated.args)
        if len(args) > 1:
            args[0] = args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(func=cst.parse_expression(RENAMES[old]), args=args)

    def leave_ImportFrom(self, original, updated):
        if dotted(updated.module) == "torch.cuda.amp":
            self.report.warn(self.cell, "`from torch.cuda.amp import ...` is deprecated; use torch.amp with device \"cuda\"")
        return updated


class Autocast(TreeStep):
    name = "autocast"
    rewriter = _Autocast
    wants = frozenset({AMP})
