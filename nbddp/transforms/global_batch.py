"""Step: say what each trainer config trains per optimizer step on 1, 2 and 4 processes; the script keeps it.

The script keeps the notebook's global batch at run time (nbddp/runtime/global_batch.py): each rank accumulates
`gradient_accumulation_steps / N` where N divides it, else N times the samples train a step and rank 0 says so.
`--scale-batch` makes N times the samples the script's default (NBDDP_BATCH=keep|scale decides at run time). The
notebook's code is not changed.
"""
from __future__ import annotations

import libcst as cst

from ..cst import has_star_kwargs, keyword
from ..tree import TreeTransformer
from ..vocabulary import CONFIG
from .base import TreeStep, call_kinds
from .trainer_args import config_name

ACCUMULATION, PER_DEVICE = "gradient_accumulation_steps", "per_device_train_batch_size"
DEFAULTS = {ACCUMULATION: 1, PER_DEVICE: 8}  # transformers' TrainingArguments defaults
COUNTS = (2, 4)  # the process counts the report gives numbers for (Kaggle's and Colab's 2 GPUs, a 4-GPU box)


def _literal(call: cst.Call, name: str):
    """The keyword's int literal, its default when absent, or None when it is an expression."""
    arg = keyword(call, name)
    if arg is None:
        return None if has_star_kwargs(call) else DEFAULTS[name]
    if isinstance(arg.value, cst.Integer):
        return int(arg.value.value, 0)
    return None


def effective(batch, steps, scale: bool) -> str:
    """What a config trains per optimizer step, in numbers, on 1 process and on each of COUNTS."""
    if batch is None or steps is None:
        return ("samples per optimizer step decided at run time (the batch size or accumulation is not a literal): "
                "the notebook's batch where the process count divides gradient_accumulation_steps")
    one = batch * steps
    if scale:
        ns = ", ".join(f"{one * n} on {n}" for n in COUNTS)
        return f"{batch} x {steps} = {one} samples per optimizer step on 1 process; {ns} (--scale-batch)"
    said = []
    for n in COUNTS:
        said.append(f"{one} on {n} ({batch} x {steps // n} per rank)" if steps % n == 0 else
                    f"{one * n} on {n} (gradient_accumulation_steps {steps} does not divide by {n})")
    hint = "" if all(steps % n == 0 for n in COUNTS) else \
        "; an accumulation that the process count divides keeps the notebook's batch"
    return f"{batch} x {steps} = {one} samples per optimizer step on 1 process; {', '.join(said)}{hint}"


class _Report(TreeTransformer):
    def leave_Call(self, original, updated):
        if CONFIG in call_kinds(self.names, original):
            batch, steps = _literal(original, PER_DEVICE), _literal(original, ACCUMULATION)
            self.report.change(self.cell, f"{config_name(original)}: "
                                          f"{effective(batch, steps, self.options.scale_batch)}")
        return updated


class GlobalBatch(TreeStep):
    name = "global-batch"
    rewriter = _Report
    wants = frozenset({CONFIG})
