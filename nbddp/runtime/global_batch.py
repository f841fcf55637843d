"""The notebook's global batch, kept by default: with N processes each rank accumulates
`gradient_accumulation_steps / N` micro-batches, so an optimizer step sees the notebook's samples, as many steps
train as the notebook asked for, and the results are one process's, in less time. Where N does not divide the
accumulation (1, 3, ...) but divides `per_device_train_batch_size`, each rank takes `batch / N` samples a
micro-batch instead (the same samples a step). Where N divides neither, every rank trains the notebook's batch: a
step sees N times the samples (DDP's own semantics), and rank 0 says so with the numbers and what to change.

Decided at run time, when N is known, for every TrainingArguments (and its subclasses: TRL's configs, Unsloth's):
`NBDDP_BATCH=keep` (the default) or `scale` (N times the samples a step, the accumulation as written;
`nbddp convert --scale-batch` makes that the script's default)."""
import functools
import os

from .group import NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, nbddp_say
from .launcher import nbddp_usage_error


class NbddpAccumulation(int):
    """A gradient_accumulation_steps (or per-device batch) value already decided (never divided twice)."""


def nbddp_batch_as_written(steps, what="gradient_accumulation_steps"):
    """A gradient_accumulation_steps (or `what`: per_device_train_batch_size) the notebook computes from the world size
    itself: kept as it is, and the config's batch with it."""
    if isinstance(steps, int) and not isinstance(steps, NbddpAccumulation) and NBDDP_WORLD_SIZE > 1:
        nbddp_say("global-batch", f"{NBDDP_WORLD_SIZE} processes: the notebook sets its batch from the world size "
                                  f"itself; {what} {steps} kept as it computes it")
        return NbddpAccumulation(steps)
    return steps


def nbddp_batch_mode():
    """`keep` or `scale`, from NBDDP_BATCH."""
    mode = os.environ.get("NBDDP_BATCH", "keep").strip().lower() or "keep"
    if mode not in ("keep", "scale"):
        nbddp_usage_error(f"NBDDP_BATCH={mode!r}: use keep (the notebook's batch) or scale (N times its samples)")
    return mode


def nbddp_accumulation(steps, batch=None):
    """The accumulation of each rank for the notebook's `steps` (and per-device `batch`), said once on rank 0."""
    return nbddp_keep_batch(steps, batch)[0]


def nbddp_keep_batch(steps, batch=None):
    """(accumulation, per-device batch) of each rank for the notebook's `steps` and `batch`, said once on rank 0."""
    world = NBDDP_WORLD_SIZE
    if isinstance(steps, NbddpAccumulation) or isinstance(batch, NbddpAccumulation) or world == 1 or \
            not isinstance(steps, int) or steps < 1:
        return steps, batch
    size = f"{batch} x " if isinstance(batch, int) else "per_device_train_batch_size x "
    notebook = f" of {batch * steps}" if isinstance(batch, int) else ""
    if nbddp_batch_mode() == "keep" and steps % world == 0:
        nbddp_say("global-batch", f"{world} processes keep the notebook's batch{notebook}: gradient_accumulation_steps "
                                  f"{steps} -> {steps // world} per rank")
        return NbddpAccumulation(steps // world), batch
    if nbddp_batch_mode() == "keep" and isinstance(batch, int) and batch % world == 0:
        nbddp_say("global-batch", f"{world} processes keep the notebook's batch of {batch * steps}: "
                                  f"per_device_train_batch_size {batch} -> {batch // world} per rank "
                                  f"(gradient_accumulation_steps {steps} does not divide by {world})")
        return NbddpAccumulation(steps), batch // world
    trained = f"{size}{steps} x {world}" + (f" = {batch * steps * world}" if isinstance(batch, int) else "")
    if nbddp_batch_mode() == "scale":
        nbddp_say("global-batch", f"{world} processes train {trained} samples a step (NBDDP_BATCH=scale; the notebook"
                                  f"{notebook or ': ' + size + str(steps)})")
    else:
        nbddp_say("global-batch", f"{world} processes train {trained} samples a step, {world} times the notebook's"
                                  f"{notebook}: gradient_accumulation_steps {steps} does not divide by {world}; to keep "
                                  f"the notebook's batch, make it or per_device_train_batch_size a multiple of {world}")
    return NbddpAccumulation(steps), batch


def _nbddp_patch_training_args(module):
    args_class = getattr(module, "TrainingArguments", None)
    if args_class is None:
        return
    post_init = args_class.__post_init__

    @functools.wraps(post_init)
    def __post_init__(self, *a, **kw):
        batch = getattr(self, "per_device_train_batch_size", None)
        self.gradient_accumulation_steps, batch = nbddp_keep_batch(self.gradient_accumulation_steps, batch)
        if batch is not None:
            self.per_device_train_batch_size = batch
        return post_init(self, *a, **kw)

    args_class.__post_init__ = __post_init__


def nbddp_plain_accumulation(trainer):
    """Once the Trainer is built, the decided accumulation is a plain int again, in its arguments (and what a
    TRL config derived from it, `steps_per_generation`) and its accelerator: torch.compile cannot trace an int
    subclass (Unsloth's compiled GRPO loss reads it), and no copy of the arguments is made after this point."""
    state = getattr(getattr(trainer, "accelerator", None), "gradient_state", None)
    for values in (getattr(getattr(trainer, "args", None), "__dict__", None), getattr(state, "plugin_kwargs", None)):
        if isinstance(values, dict):
            values.update({k: int(v) for k, v in values.items() if isinstance(v, NbddpAccumulation)})


def _nbddp_patch_trainer(module):
    init = module.Trainer.__init__
    if getattr(init, "_nbddp_plain", False):
        return

    @functools.wraps(init)
    def __init__(self, *a, **kw):
        init(self, *a, **kw)
        nbddp_plain_accumulation(self)

    __init__._nbddp_plain = True
    module.Trainer.__init__ = __init__


NBDDP_IMPORTS.watch("transformers.training_args", _nbddp_patch_training_args)
NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer)
