"""Step: trainer configs get `ddp_find_unused_parameters=False` where the notebook trains LoRA/PEFT adapters (every
trainable parameter gets a gradient each step, so DDP need not search the graph for unused ones) and does not set it
itself. A full fine-tune keeps the Trainer's own default (parameters that get no gradient, a classifier head's
pooler, stop a job that sets it False at the second step), and the report says so."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, code_of, has_star_kwargs, keyword
from ..vocabulary import CONFIG, PEFT, parts
from .base import CallRewriter, TreeStep

KEY = "ddp_find_unused_parameters"


def config_name(call: cst.Call) -> str:
    """`SFTConfig` for `trl.SFTConfig(...)`: how the report names a trainer config."""
    return parts(code_of(call.func))[-1]


class _TrainerArgs(CallRewriter):
    lora = True  # the notebook trains adapters (TrainerArgs.run decides)

    def leave_Call(self, original, updated):
        if CONFIG not in self.kinds(original) or keyword(updated, KEY) is not None:
            return updated
        name = config_name(updated)
        if not self.lora:
            self.report.change(self.cell, f"{name}: {KEY} left to the Trainer's default (no LoRA or PEFT adapter in "
                                          "the notebook: a full fine-tune may have parameters that get no gradient)")
            return updated
        if has_star_kwargs(updated):
            self.report.warn(self.cell, f"{name}(**kwargs): cannot tell if {KEY} is set; set it to False for DDP speed")
            return updated
        self.report.change(self.cell, f"{name}: {KEY}=False (every LoRA parameter gets a gradient each step)")
        return add_keyword(updated, KEY, cst.Name("False"))


class TrainerArgs(TreeStep):
    name = "trainer-args"
    wants = frozenset({CONFIG})

    def run(self, tree, ctx):
        rewriter = _TrainerArgs(tree, ctx)
        rewriter.lora = uses_peft(tree)
        return tree.visit(rewriter, self.wants)


def uses_peft(tree) -> bool:
    """The notebook makes or loads PEFT adapters: get_peft_model (Unsloth's or peft's), or anything of peft's
    (`PeftModel.from_pretrained`, a `LoraConfig` handed to a trainer as peft_config)."""
    names = tree.names
    return any(PEFT in tree.facts(stmt) or any(m.split(".")[0] == "peft" for c in tree.calls_in(stmt)
                                              for m in names.meanings(c.func)) for stmt in tree.module.body)
