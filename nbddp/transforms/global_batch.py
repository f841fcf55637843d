"""Step: state each trainer config's effective global batch; with --keep-global-batch, keep the one-process one.

`gradient_accumulation_steps=4` becomes `gradient_accumulation_steps=nbddp_accumulation(4)`; the script's runtime
layer divides it by the number of processes when it divides evenly (otherwise it warns with the real batch).
"""
from __future__ import annotations

import libcst as cst

from ..cst import has_star_kwargs, keyword
from ..vocabulary import CONFIG
from .base import CallRewriter, TreeStep
from .trainer_args import config_name

ACCUMULATION, PER_DEVICE = "gradient_accumulation_steps", "per_device_train_batch_size"
DEFAULTS = {ACCUMULATION: 1, PER_DEVICE: 8}  # transformers' TrainingArguments defaults


def _literal(call: cst.Call, name: str):
    """The keyword's int literal, its default when absent, or None when it is an expression."""
    arg = keyword(call, name)
    if arg is None:
        return None if has_star_kwargs(call) else DEFAULTS[name]
    if isinstance(arg.value, cst.Integer):
        return int(arg.value.value, 0)
    return None


class _GlobalBatch(CallRewriter):
    def leave_Call(self, original, updated):
        if CONFIG not in self.kinds(original):
            return updated
        name = config_name(updated)
        batch, steps = _literal(updated, PER_DEVICE), _literal(updated, ACCUMULATION)
        arg = keyword(updated, ACCUMULATION)
        if batch is None or steps is None:
            effective = "cannot tell (batch size or accumulation is not a literal)"
        elif self.options.keep_global_batch:
            effective = (f"{batch} x {steps} = {batch * steps} (as on one process) when N divides {steps}, "
                         f"else {batch} x {steps} x N")
        else:
            effective = f"{batch} x {steps} x N = {batch * steps}N for N processes"
        self.report.change(self.cell, f"{name}: effective global batch {effective}")
        if not self.options.keep_global_batch or arg is None or _is_wrapped(arg.value):
            if self.options.keep_global_batch and arg is None and steps == 1:
                self.report.warn(self.cell, f"{name}: gradient_accumulation_steps is 1; the global batch grows "
                                            f"with N (lower per_device_train_batch_size to keep it)")
            return updated
        wrapped = cst.Call(func=cst.Name("nbddp_accumulation"), args=[cst.Arg(arg.value)])
        return updated.deep_replace(arg, arg.with_changes(value=wrapped))


def _is_wrapped(value) -> bool:
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "nbddp_accumulation"


class GlobalBatch(TreeStep):
    name = "global-batch"
    rewriter = _GlobalBatch
    wants = frozenset({CONFIG})
