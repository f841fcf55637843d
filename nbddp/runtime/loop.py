"""A training loop of the notebook's own (`loss.backward()`, `optimizer.step()`, no Trainer) trains one model on every
rank: the model's training forward goes through DistributedDataParallel, so each backward averages the gradients
over the ranks, and the loop's DataLoader deals each rank its share. By default (the notebook's global batch kept,
global_batch.py) every rank draws the notebook's batches and takes its slice of each (batch_size / N where N divides
it), so a step sees the notebook's samples; otherwise (or NBDDP_BATCH=scale) each rank reads its own share of every
epoch in batches of the notebook's size (a DistributedSampler): N times the samples a step.

The notebook's names keep their objects: `model` stays the notebook's model (its `generate`, `save_pretrained`,
`state_dict` unchanged) and only its `forward` in training mode is routed through DDP, which also gives every rank
rank 0's starting weights.
"""
import inspect
import weakref

import torch

from .global_batch import nbddp_batch_mode
from .group import NBDDP_LOCAL_RANK, NBDDP_RANK, NBDDP_WORLD_SIZE, nbddp_dist
from .hooks import _nbddp_choice, nbddp_say


# Buffers (a batch norm's statistics) synced once at the start, not at every forward: torch 2.13's name for it, or the
# older one (which now warns on every rank)
_NBDDP_BUFFERS_ONCE = {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(
    torch.nn.parallel.DistributedDataParallel.__init__).parameters else {"broadcast_buffers": False}


def nbddp_ddp(model):
    """Route `model`'s training forward through DDP (once per model); returns `model` itself."""
    if NBDDP_WORLD_SIZE == 1 or not nbddp_dist() or "_nbddp_ddp" in vars(model):
        return model
    cuda = any(p.is_cuda for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[NBDDP_LOCAL_RANK] if cuda else None, **_NBDDP_BUFFERS_ONCE,
        find_unused_parameters=bool(_nbddp_choice("NBDDP_FIND_UNUSED")))
    forward, inside = model.forward, []

    def through_ddp(*args, **kwargs):
        if inside or not (model.training and torch.is_grad_enabled()):  # DDP's own call, evaluation, generation
            return forward(*args, **kwargs)
        inside.append(True)
        try:
            return ddp(*args, **kwargs)
        finally:
            inside.pop()

    vars(model).update(forward=through_ddp, _nbddp_ddp=ddp)  # plain attributes: not a submodule, not in state_dict
    nbddp_say("loop-ddp", f"the notebook's training loop trains one {type(model).__name__} on {NBDDP_WORLD_SIZE} "
                          "processes: DDP averages the gradients at each backward")
    return model


class _NbddpSampler(torch.utils.data.DistributedSampler):
    """A DistributedSampler that moves to the next epoch each time the loop starts over the data, as a shuffling
    DataLoader reshuffles (the notebook does not call set_epoch)."""

    def __iter__(self):
        order = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return order


_NBDDP_DEALT = weakref.WeakKeyDictionary()  # the notebook's DataLoader -> each rank's, made once


def nbddp_distributed(loader):
    """The same DataLoader with each rank reading its own share of the data (shuffled if the loader shuffled); the
    same one each time the loop starts over it, so each epoch is dealt anew."""
    data = torch.utils.data
    if NBDDP_WORLD_SIZE == 1 or not isinstance(loader, data.DataLoader) or isinstance(loader.sampler,
                                                                                       data.DistributedSampler):
        return loader
    if loader not in _NBDDP_DEALT:
        _NBDDP_DEALT[loader] = _nbddp_deal(loader)
    return _NBDDP_DEALT[loader]


class _NbddpSlices:
    """The notebook's batches (its own sampler, drawn alike on every rank), this rank's slice of each."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return (batch[NBDDP_RANK::NBDDP_WORLD_SIZE] for batch in self.batches)

    def __len__(self):
        return len(self.batches)


def _nbddp_deal(loader):
    data, size, world = torch.utils.data, loader.batch_size, NBDDP_WORLD_SIZE
    if isinstance(loader.dataset, data.IterableDataset) or size is None:
        nbddp_say("loop-data", "the training loop's DataLoader streams its data or batches it itself: every rank "
                               "reads all of it (one model still, but no speed-up)")
        return loader
    how = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
               timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
               prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    if nbddp_batch_mode() == "keep" and size % world == 0:
        nbddp_say("loop-data", f"the training loop's DataLoader keeps the notebook's batch of {size}: each of {world} "
                               f"processes takes {size // world} samples of every batch")
        return data.DataLoader(loader.dataset, batch_sampler=_NbddpSlices(loader.batch_sampler), **how)
    sampler = _NbddpSampler(loader.dataset, num_replicas=world, rank=NBDDP_RANK,
                            shuffle=isinstance(loader.sampler, data.RandomSampler), drop_last=loader.drop_last)
    why = "NBDDP_BATCH=scale" if nbddp_batch_mode() == "scale" else \
        f"batch_size {size} does not divide by {world}; a multiple of {world} keeps the notebook's batch"
    nbddp_say("loop-data", f"the training loop's DataLoader gives each of {world} processes its own {size} samples a "
                           f"step: {size * world} a step, {world} times the notebook's ({why})")
    return data.DataLoader(loader.dataset, batch_size=size, sampler=sampler, drop_last=loader.drop_last, **how)


def nbddp_unsynced_loop(where):
    """A training loop nbddp could not put under DDP: stop before it, rather than train one copy per rank."""
    if NBDDP_WORLD_SIZE > 1:
        nbddp_say("loop-unsynced", f"{where} trains outside DDP and nbddp could not wrap it: every rank would train "
                                   "its own copy. Wrap the model in torch's DistributedDataParallel yourself, or run "
                                   "one process (NBDDP_NPROC=1)")
        raise SystemExit(1)
