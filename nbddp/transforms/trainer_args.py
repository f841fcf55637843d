"""Step: trainer configs get `ddp_find_unused_parameters=False` unless the notebook sets it."""
from __future__ import annotations

import libcst as cst

from ..cst import add_keyword, callee_tail, has_star_kwargs, keyword
from .base import CallRewriter, CstTransform

TRL_CONFIGS = frozenset({
    "SFTConfig", "DPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig", "GRPOConfig", "PPOConfig", "RewardConfig",
    "GKDConfig", "RLOOConfig", "OnlineDPOConfig", "XPOConfig", "NashMDConfig", "PRMConfig", "BCOConfig",
})
KEY = "ddp_find_unused_parameters"


def is_training_arguments(call: cst.Call) -> bool:
    name = callee_tail(call) or ""
    return name in TRL_CONFIGS or name.endswith("TrainingArguments")


class _TrainerArgs(CallRewriter):
    def leave_Call(self, original, updated):
        if not is_training_arguments(updated) or keyword(updated, KEY) is not None:
            return updated
        name = callee_tail(updated)
        if has_star_kwargs(updated):
            self.report.warn(self.cell, f"{name}(**kwargs): cannot tell if {KEY} is set; set it to False for DDP speed")
            return updated
        self.report.change(self.cell, f"{name}: {KEY}=False (every LoRA parameter gets a gradient each step)")
        return add_keyword(updated, KEY, cst.Name("False"))


class TrainerArgs(CstTransform):
    name = "trainer-args"
    rewriter = _TrainerArgs
    triggers = ("Config", "Arguments")
