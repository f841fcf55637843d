"""Step: say what each trainer config trains per optimizer step on 1, 2 and 4 processes; the script keeps it.

The script keeps the notebook's global batch at run time (nbddp/runtime/global_batch.py): each rank accumulates
`gradient_accumulation_steps / N` where N divides it, else N times the samples train a step and rank 0 says so.
`--scale-batch` makes N times the samples the script's default (NBDDP_BATCH=keep|scale decides at run time). The
notebook's code is not changed.
"""
from __future__ import annotations

import math

import libcst as cst

from ..cst_helpers import has_star_kwargs, keyword
from ..tree import TreeTransformer
from ..vocabulary import CONFIG
from .base import TreeStep, call_kinds
from .trainer_args import config_name

ACCUMULATION, PER_DEVICE = "gradient_accumulation_steps", "per_device_train_batch_size"
DEFAULTS = {ACCUMULATION: 1, PER_DEVICE: 8}  # transformers' TrainingArguments defaults
COUNTS = (2, 4)  # the process counts the report gives numbers for (Kaggle's and Colab's 2 GPUs, a 4-GPU box)
GENERATION = "generation_batch_size"  # TRL's GRPO and RLOO: must divide by per_device_train_batch_size x processes


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


def generation_batch(call: cst.Call, batch) -> str | None:
    """Where the config sets generation_batch_size (TRL's online trainers) as a number: the process counts on which
    it no longer divides by per_device_train_batch_size x N, which TRL refuses, and what to set instead."""
    arg = keyword(call, GENERATION)
    if arg is None or batch is None or not isinstance(arg.value, cst.Integer):
        return None
    size = int(arg.value.value, 0)
    broken = [n for n in COUNTS if size % (batch * n)]
    if not broken:
        return None
    counts = ", ".join(f"{n} ({batch} x {n} = {batch * n})" for n in broken)
    return (f"{GENERATION}={size} must divide by {PER_DEVICE} x the process count, or TRL stops the job: not on "
            f"{counts} processes; leave {GENERATION} unset (it then follows the batch, valid on any count) or make it "
            f"a multiple of {batch * math.lcm(*COUNTS)}")


class _Report(TreeTransformer):
    def leave_Call(self, original, updated):
        if CONFIG in call_kinds(self.names, original):
            batch, steps = _literal(original, PER_DEVICE), _literal(original, ACCUMULATION)
            self.report.change(self.cell, f"{config_name(original)}: "
                                          f"{effective(batch, steps, self.options.scale_batch)}")
            why = generation_batch(original, batch)
            if why:
                self.report.warn(self.cell, f"{config_name(original)}: {why}")
        return updated


class GlobalBatch(TreeStep):
    name = "global-batch"
    rewriter = _Report
    wants = frozenset({CONFIG})
