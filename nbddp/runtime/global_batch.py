"""Keep the one-process global batch: gradient accumulation divided by the number of processes, where it divides
(`nbddp convert --keep-global-batch` writes `nbddp_accumulation(4)`; NBDDP_KEEP_GLOBAL_BATCH=1 does it for every
TrainingArguments at run time)."""
import functools

from .group import NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_flag, nbddp_say


class NbddpAccumulation(int):
    """A gradient_accumulation_steps value nbddp already divided by the world size."""


def nbddp_accumulation(steps, batch=None):
    """`steps` / world size when it divides evenly (same global batch as one process), else `steps` and a warning."""
    if isinstance(steps, NbddpAccumulation) or NBDDP_WORLD_SIZE == 1 or not isinstance(steps, int):
        return steps
    if steps % NBDDP_WORLD_SIZE == 0:
        nbddp_say("global-batch", f"gradient_accumulation_steps {steps} -> {steps // NBDDP_WORLD_SIZE} "
                                  f"({NBDDP_WORLD_SIZE} processes keep the one-process global batch)")
        return NbddpAccumulation(steps // NBDDP_WORLD_SIZE)
    per_device = f"{batch} x " if batch is not None else "per_device_train_batch_size x "
    nbddp_say("global-batch", f"warning: gradient_accumulation_steps={steps} does not divide by {NBDDP_WORLD_SIZE} "
                              f"processes; effective global batch is {per_device}{steps} x {NBDDP_WORLD_SIZE}")
    return NbddpAccumulation(steps)


def _nbddp_patch_training_args(module):
    args_class = getattr(module, "TrainingArguments", None)
    if args_class is None or not _nbddp_flag("NBDDP_KEEP_GLOBAL_BATCH"):
        return
    post_init = args_class.__post_init__

    @functools.wraps(post_init)
    def __post_init__(self, *a, **kw):
        self.gradient_accumulation_steps = nbddp_accumulation(self.gradient_accumulation_steps,
                                                              getattr(self, "per_device_train_batch_size", None))
        return post_init(self, *a, **kw)

    args_class.__post_init__ = __post_init__


NBDDP_IMPORTS.watch("transformers.training_args", _nbddp_patch_training_args)
