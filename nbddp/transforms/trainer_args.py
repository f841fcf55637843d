"""Step: trainer configs get `ddp_find_unused_parameters=False` unless the notebook sets it."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, code_of, has_star_kwargs, keyword
from ..vocabulary import CONFIG, parts
from .base import CallRewriter, TreeStep

KEY = "ddp_find_unused_parameters"


def config_name(call: cst.Call) -> str:
    """`SFTConfig` for `trl.SFTConfig(...)`: how the report names a trainer config."""
    return parts(code_of(call.func))[-1]


class _TrainerArgs(CallRewriter):
    def leave_Call(self, original, updated):
        if CONFIG not in self.kinds(original) or keyword(updated, KEY) is not None:
            return updated
        name = config_name(updated)
        if has_star_kwargs(updated):
            self.report.warn(self.cell, f"{name}(**kwargs): cannot tell if {KEY} is set; set it to False for DDP speed")
            return updated
        self.report.change(self.cell, f"{name}: {KEY}=False (every LoRA parameter gets a gradient each step)")
        return add_keyword(updated, KEY, cst.Name("False"))


class TrainerArgs(TreeStep):
    name = "trainer-args"
    rewriter = _TrainerArgs
    wants = frozenset({CONFIG})
