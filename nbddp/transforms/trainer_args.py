"""Step: trainer configs get `ddp_find_unused_parameters=False` where the notebook trains LoRA/PEFT adapters (every
trainable parameter gets a gradient each step, so DDP need not search the graph for unused ones) and does not set it
itself. A full fine-tune keeps the Trainer's own default (parameters that get no gradient, a classifier head's
pooler, stop a job that sets it False at the second step), and the report says so. The analysis decides which
(nbddp.features.ddp_setting); this step writes it."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, code_of
from ..features import FULL, SET, STARS, UNUSED, ddp_setting
from ..vocabulary import CONFIG, parts
from .base import CallRewriter, TreeStep


def config_name(call: cst.Call) -> str:
    """`SFTConfig` for `trl.SFTConfig(...)`: how the report names a trainer config."""
    return parts(code_of(call.func))[-1]


class _TrainerArgs(CallRewriter):
    def leave_Call(self, original, updated):
        setting = ddp_setting(original, self.tree.features.adapters) if CONFIG in self.kinds(original) else SET
        if setting == SET:
            return updated
        name = config_name(updated)
        if setting == FULL:
            self.report.change(self.cell, f"{name}: {UNUSED} left to the Trainer's default (no LoRA or PEFT adapter "
                                          "in the notebook: a full fine-tune may have parameters that get no gradient)")
        elif setting == STARS:
            self.report.warn(self.cell, f"{name}(**kwargs): cannot tell if {UNUSED} is set; set it to False for DDP "
                                        "speed")
        else:
            self.report.change(self.cell, f"{name}: {UNUSED}=False (every LoRA parameter gets a gradient each step)")
            return add_keyword(updated, UNUSED, cst.Name("False"))
        return updated


class TrainerArgs(TreeStep):
    name = "trainer-args"
    rewriter = _TrainerArgs
    wants = frozenset({CONFIG})
