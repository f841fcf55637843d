"""Step: say what each trainer config trains per optimizer step on 1, 2 and 4 processes; the script keeps it.

The script keeps the notebook's global batch at run time (nbddp/runtime/global_batch.py): each rank accumulates
`gradient_accumulation_steps / N` where N divides it, else takes `per_device_train_batch_size / N` where N divides
that, else N times the samples train a step and rank 0 says so.
`--scale-batch` makes N times the samples the script's default (NBDDP_BATCH=keep|scale decides at run time). The
notebook's code is not changed, but where a config's batch or accumulation already follows the world size (the
notebook adapts it itself: `gradient_accumulation_steps = 8 // accelerator.num_processes`): then its accumulation is
marked as decided (`nbddp_batch_as_written(...)`), so the runtime leaves it as the notebook computes it.
"""
from __future__ import annotations

import math

import libcst as cst

from ..cst_helpers import add_keyword, has_star_kwargs, keyword
from ..rank_conditions import GPUS, WORLD, reads_rank
from ..reads_writes import reads_writes
from ..tree import TreeTransformer
from ..vocabulary import CONFIG
from ..walk import walk
from .base import TreeStep, call_kinds
from .trainer_args import config_name

WIDTH = frozenset({WORLD, GPUS})  # the world size, or the GPUs a one-process notebook spreads its batch over

ACCUMULATION, PER_DEVICE = "gradient_accumulation_steps", "per_device_train_batch_size"
DEFAULTS = {ACCUMULATION: 1, PER_DEVICE: 8}  # transformers' TrainingArguments defaults
COUNTS = (2, 4)  # the process counts the report gives numbers for (Kaggle's and Colab's 2 GPUs, a 4-GPU box)
AS_WRITTEN = "nbddp_batch_as_written"
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
                    f"{one} on {n} ({batch // n} x {steps} per rank)" if batch % n == 0 else
                    f"{one * n} on {n} (neither gradient_accumulation_steps {steps} nor per_device_train_batch_size "
                    f"{batch} divides by {n})")
    hint = "" if all(steps % n == 0 or batch % n == 0 for n in COUNTS) else \
        "; an accumulation or a batch that the process count divides keeps the notebook's batch"
    return f"{batch} x {steps} = {one} samples per optimizer step on 1 process; {', '.join(said)}{hint}"


def per_rank(batch, steps, n):
    """The per-device batch each of n ranks trains (the runtime's choice, nbddp/runtime/global_batch.py): the
    notebook's, or its n-th part where n divides it but not the accumulation."""
    return batch // n if steps is not None and steps % n and batch % n == 0 else batch


def generation_batch(call: cst.Call, batch, steps=1) -> str | None:
    """Where the config sets generation_batch_size (TRL's online trainers) as a number: the process counts on which
    it no longer divides by the per-device batch x N (each rank's, as the runtime splits it), which TRL refuses,
    and what to set instead."""
    arg = keyword(call, GENERATION)
    if arg is None or batch is None or not isinstance(arg.value, cst.Integer):
        return None
    size = int(arg.value.value, 0)
    broken = [n for n in COUNTS if size % (per_rank(batch, steps, n) * n)]
    if not broken:
        return None
    counts = ", ".join(f"{n} ({per_rank(batch, steps, n)} x {n} = {per_rank(batch, steps, n) * n})" for n in broken)
    return (f"{GENERATION}={size} must divide by {PER_DEVICE} x the process count, or TRL stops the job: not on "
            f"{counts} processes; leave {GENERATION} unset (it then follows the batch, valid on any count) or make it "
            f"a multiple of {batch * math.lcm(*COUNTS)}")


def _adapted(call: cst.Call, names) -> list:
    """The keywords of a config whose values follow the world size (the notebook adapts its batch itself)."""
    found = []
    for name in (PER_DEVICE, ACCUMULATION):
        arg = keyword(call, name)
        if arg is not None and WIDTH & reads_rank(arg.value, names):
            found.append(name)
    return found


def _marked(value: cst.BaseExpression, what: str = ACCUMULATION) -> cst.BaseExpression:
    """`nbddp_batch_as_written(value)`: an accumulation (or per-device batch) the notebook computes itself (marked
    once)."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == AS_WRITTEN:
        return value  # converting converted code
    extra = [cst.Arg(cst.SimpleString(f'"{what}"'))] if what != ACCUMULATION else []
    return cst.Call(cst.Name(AS_WRITTEN), [cst.Arg(value), *extra])


def _as_written(call: cst.Call) -> cst.Call:
    """The config with its accumulation marked as the notebook's own (the default 1 written out where absent)."""
    arg = keyword(call, ACCUMULATION)
    if arg is None:
        return add_keyword(call, ACCUMULATION, _marked(cst.Integer("1")))
    return call.with_changes(args=[a.with_changes(value=_marked(a.value)) if a is arg else a for a in call.args])


class _Spread(TreeTransformer):
    """In the statements that build a mapping a config is given as `**hp`, or set a config's attributes: an
    accumulation the notebook computes from the world size (`hp["gradient_accumulation_steps"] = 8 // world`,
    `dict(gradient_accumulation_steps=...)`, `{"gradient_accumulation_steps": ...}`, `args.gradient_accumulation_steps
    = ...`) is marked as written, as a config's own keyword is."""

    def _follows(self, key, value) -> str | None:
        """The setting (accumulation or per-device batch) a key names, where the value follows the world size."""
        what = key if isinstance(key, str) else self.names.literal(key)
        return what if what in DEFAULTS and WIDTH & reads_rank(value, self.names) else None

    def _said(self, updated, what):
        if what is None or _marked(updated.value) is updated.value:  # marked already (the config's own, converted)
            return updated
        self.report.change(self.cell, f"{what} follows the world size already: the notebook's batch is kept as it "
                                      "computes it (nbddp divides neither the accumulation nor the batch again)")
        return updated.with_changes(value=_marked(updated.value, what))

    def leave_Assign(self, original, updated):  # `hp["gradient_accumulation_steps"] = ...`, `args.<it> = ...`
        target = original.targets[0].target if len(original.targets) == 1 else None
        key = target.slice[0].slice if isinstance(target, cst.Subscript) and len(target.slice) == 1 else None
        key = key.value if isinstance(key, cst.Index) else target.attr.value if isinstance(target, cst.Attribute) \
            else None
        return self._said(updated, self._follows(key, original.value)) if key is not None else updated

    def leave_DictElement(self, original, updated):
        return self._said(updated, self._follows(original.key, original.value))

    def leave_Call(self, original, updated):  # `dict(gradient_accumulation_steps=...)`, a config beside `**hp`
        if CONFIG in call_kinds(self.names, original) and not has_star_kwargs(original):
            return updated  # a config's own keywords: the first pass's
        return updated.with_changes(args=[self._said(new, self._follows(old.keyword.value, old.value)) if old.keyword
                                          else new for old, new in zip(original.args, updated.args)])


class _SetLater(cst.CSTVisitor):
    """The names of configs whose accumulation or per-device batch a line sets from the world size after the config
    is made (`args.gradient_accumulation_steps //= args.world_size`, `= args.gradient_accumulation_steps // n`,
    `setattr(args, "gradient_accumulation_steps", 16 // n)`), and the configs made for those names."""

    def __init__(self, names):
        self.names, self.set, self.made = names, set(), []

    def _sets(self, target, value):
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.attr.value in \
                DEFAULTS and WIDTH & reads_rank(value, self.names):
            self.set.add(target.value.value)  # and what the notebook's calls give a parameter of that name
            self.set |= {arg.value for binding in self.names.bindings(target.value) if isinstance(binding, cst.Param)
                         for arg in self.names.passed(binding) if isinstance(arg, cst.Name)}

    def visit_Assign(self, node):
        for target in node.targets:
            self._sets(target.target, node.value)
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and \
                isinstance(node.value, cst.Call) and CONFIG in call_kinds(self.names, node.value):
            self.made.append((node.targets[0].target.value, node.value))

    def visit_AugAssign(self, node):
        self._sets(node.target, node.value)

    def visit_Call(self, node):
        if "builtins.setattr" in self.names.meanings(node.func) and len(node.args) == 3:
            key = self.names.literal(node.args[1].value)
            if isinstance(key, str):
                self._sets(cst.Attribute(node.args[0].value, cst.Name(key)), node.args[2].value)


class _Report(TreeTransformer):
    def __init__(self, tree, ctx):
        super().__init__(tree, ctx)
        self.spread = set()  # the names of mappings a config is given as `**name`
        later = _SetLater(tree.names)
        walk(tree.module, later)
        self.later = {id(call) for name, call in later.made if name in later.set}  # set from the world size later

    def leave_Call(self, original, updated):
        if CONFIG in call_kinds(self.names, original):
            self.spread |= {a.value.value for a in original.args if a.star == "**" and isinstance(a.value, cst.Name)}
            adapted = _adapted(original, self.names) or ([ACCUMULATION] if id(original) in self.later else [])
            if adapted and not has_star_kwargs(original):
                self.report.change(self.cell, f"{config_name(original)}: {' and '.join(adapted)} follow{'s' if len(adapted) == 1 else ''} the world "
                                              "size already: the notebook's batch is kept as it computes it (nbddp "
                                              "does not divide the accumulation again)")
                return _as_written(updated)
            batch, steps = _literal(original, PER_DEVICE), _literal(original, ACCUMULATION)
            self.report.change(self.cell, f"{config_name(original)}: "
                                          f"{effective(batch, steps, self.options.scale_batch)}")
            why = generation_batch(original, batch, steps)
            if why:
                self.report.warn(self.cell, f"{config_name(original)}: {why}")
        return updated


class GlobalBatch(TreeStep):
    name = "global-batch"
    inserts = (AS_WRITTEN,)
    rewriter = _Report
    wants = frozenset({CONFIG})

    def run(self, tree, ctx) -> cst.Module:
        report = self.rewriter(tree, ctx)
        configs = set().union(*(reads_writes(s)[1] for s in tree.module.body if tree.facts(s) & self.wants))
        tree.module = tree.visit(report, self.wants)
        return tree.visit(_Spread(tree, ctx), mentions=report.spread | configs)
