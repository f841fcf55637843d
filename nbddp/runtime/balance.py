"""Equal work per rank: accelerate deals a sampler's batches to the ranks in turn, so within one optimizer step
one rank can get the long samples and wait less at the all-reduce than the other. Each step's samples are re-dealt
by length (on by default, NBDDP_BALANCE_LENGTHS=0 turns it off), only where that cannot change the gradient."""
import functools
import os

from .group import NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_choice, nbddp_say


def nbddp_balance_window(batches, length, world):
    """The batches of one optimizer step on every rank (batch i goes to rank i % world), with the same samples
    re-dealt: sorted by length into micro-batches of similar samples, the longest first, each to the rank with the
    fewest padded tokens so far."""
    size = len(batches[0])
    if any(len(b) != size for b in batches) or len(batches) % world:
        return batches
    lengths = {i: length(i) for b in batches for i in b}
    ordered = sorted(lengths, key=lengths.get, reverse=True)
    slots, ranks, load = len(batches) // world, [[] for _ in range(world)], [0] * world
    for start in range(0, len(ordered), size):
        micro = ordered[start:start + size]
        rank = min((r for r in range(world) if len(ranks[r]) < slots), key=load.__getitem__)
        ranks[rank].append(micro)
        load[rank] += len(micro) * lengths[micro[0]]
    return [ranks[r][slot] for slot in range(slots) for r in range(world)]


class NbddpBalancedBatches:
    """Stands in for the batch sampler that accelerate shards over the ranks; every rank draws the same batches
    from it (accelerate seeds them alike), so every rank deals each window the same way."""

    def __init__(self, inner, length, world, accumulation):
        self.inner, self.length, self.world, self.window = inner, length, world, world * accumulation

    def __getattr__(self, name):  # batch_size, drop_last, sampler, set_epoch: the wrapped sampler's
        return getattr(object.__getattribute__(self, "inner"), name)  # no `inner` yet (unpickling): AttributeError

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        window = []
        for batch in self.inner:
            window.append(batch)
            if len(window) == self.window:
                yield from nbddp_balance_window(window, self.length, self.world)
                window = []
        yield from window  # the epoch's last, partial step: as drawn


def _nbddp_length_of(dataset, trainer):
    """Sample index -> token count, from the dataset's length or input column; None if it has neither."""
    columns = getattr(dataset, "column_names", None) or []
    names = [getattr(trainer.args, "length_column_name", "length")]
    names += list(getattr(getattr(trainer, "processing_class", None), "model_input_names", None) or [])[:1]
    name = next((n for n in names + ["input_ids"] if n in columns), None)
    if name is None:
        return None
    column = dataset.select_columns([name])
    return (lambda i: int(column[i][name])) if name == names[0] else (lambda i: len(column[i][name]))


def nbddp_balance_loader(loader, trainer):
    """Wrap the train loader's batches in NbddpBalancedBatches where the loss is normalised by the token count of
    the whole step on every rank (transformers' average_tokens_across_devices): then which rank and micro-batch a
    sample lands in changes only the floating-point order. NBDDP_BALANCE_LENGTHS=force skips that check."""
    shard = getattr(loader, "batch_sampler", None)
    if _nbddp_choice("NBDDP_BALANCE_LENGTHS") is False or NBDDP_WORLD_SIZE == 1 \
            or isinstance(getattr(shard, "batch_sampler", None), NbddpBalancedBatches):
        return loader
    args, why = trainer.args, None
    force = os.environ.get("NBDDP_BALANCE_LENGTHS", "").strip().lower() == "force"
    if str(getattr(args, "train_sampling_strategy", "random")) not in ("random", "sequential") \
            or getattr(args, "group_by_length", False):
        why = "the notebook chose a length-aware sampling order of its own"
    elif type(shard).__name__ != "BatchSamplerShard" or getattr(shard, "split_batches", True) \
            or getattr(shard, "num_processes", 1) != NBDDP_WORLD_SIZE:
        why = "the train loader is not one that accelerate deals out batch by batch"
    elif not force and not (getattr(args, "average_tokens_across_devices", False)
                            and (getattr(trainer, "model_accepts_loss_kwargs", False)
                                 or getattr(trainer, "compute_loss_func", None))):
        why = ("the loss is not normalised by the whole step's token count, so moving samples between ranks "
               "would change the gradient (NBDDP_BALANCE_LENGTHS=force forces it)")
    length = None if why else _nbddp_length_of(getattr(loader, "dataset", None), trainer)
    if why is None and length is None:
        why = "the dataset has no token-length column to balance by"
    if why:
        nbddp_say("balance", f"length-balanced ranks off: {why}")
        return loader
    accumulation = int(args.gradient_accumulation_steps)
    shard.batch_sampler = NbddpBalancedBatches(shard.batch_sampler, length, NBDDP_WORLD_SIZE, accumulation)
    nbddp_say("balance", f"length-balanced ranks: each optimizer step's {NBDDP_WORLD_SIZE} x {accumulation} "
                         f"micro-batches keep their samples, dealt out by length (NBDDP_BALANCE_LENGTHS=0: off)")
    return loader


def _nbddp_patch_trainer_loader(module):
    trainer = getattr(module, "Trainer", None)
    make_loader = getattr(trainer, "get_train_dataloader", None)
    if make_loader is None or getattr(trainer, "_nbddp_loader_patched", False):
        return
    trainer._nbddp_loader_patched = True

    @functools.wraps(make_loader)
    def get_train_dataloader(self, *a, **kw):
        loader = make_loader(self, *a, **kw)
        try:
            return nbddp_balance_loader(loader, self)
        except Exception as exc:  # the layer must never stop training: keep the loader as drawn
            nbddp_say("balance", f"length-balanced ranks off ({type(exc).__name__}: {exc})")
            return loader

    trainer.get_train_dataloader = get_train_dataloader


NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer_loader)
