"""DDP's start-up sync, one tensor at a time: the same shape check and copy of rank 0's parameters and buffers
that DDP does, without its 250 MB packed broadcasts, which held a copy of the largest weight (on two H200s, the
1 GiB embedding of a Llama-3.1-8B shape set the run's memory peak)."""
import functools
import inspect
import itertools

import torch

from .group import NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_choice, nbddp_say


def nbddp_sync_module_states(ddp, buffers=True):
    """Rank 0's parameters (and buffers) to every rank of `ddp`'s group, in place; returns the largest in bytes."""
    from torch.distributed import utils as dist_utils

    ignore = getattr(ddp, "parameters_to_ignore", ())
    params = [p for n, p in ddp.module.named_parameters() if n not in ignore]
    check = getattr(dist_utils, "_verify_param_shape_across_processes", None)
    if check is not None:
        check(ddp.process_group, [p for p in params if p.requires_grad])
    states = [p.detach() for p in params]
    if buffers:
        states += [b.detach() for n, b in ddp.module.named_buffers() if n not in ignore]
    src = torch.distributed.get_global_rank(ddp.process_group, 0)
    biggest = 0
    for tensor in states:
        dense = tensor if tensor.is_contiguous() else tensor.contiguous()
        torch.distributed.broadcast(dense, src=src, group=ddp.process_group)
        if dense is not tensor:
            tensor.copy_(dense)
        biggest = max(biggest, tensor.numel() * tensor.element_size())
    return biggest


def _nbddp_patch_ddp(module):
    cls = module.DistributedDataParallel
    init = cls.__init__
    if getattr(cls, "_nbddp_patched", False):
        return
    if "init_sync" not in inspect.signature(init).parameters:  # older torch, or a wrapper hiding the signature
        if NBDDP_WORLD_SIZE > 1:
            nbddp_say("lean-init-sync", "DDP start-up sync left to DDP (its constructor shows no init_sync)")
        return
    cls._nbddp_patched = True

    @functools.wraps(init)
    def __init__(self, mod, *a, **kw):
        ours = (not a and "init_sync" not in kw and kw.get("mixed_precision") is None
                and _nbddp_choice("NBDDP_LEAN_INIT_SYNC") is not False
                and all(t.layout == torch.strided for t in itertools.chain(mod.parameters(), mod.buffers())))
        if not ours:
            return init(self, mod, *a, **kw)
        init(self, mod, init_sync=False, **kw)
        buffers = kw.get("forward_sync_buffers") is not None or kw.get("broadcast_buffers") is not False
        biggest = nbddp_sync_module_states(self, buffers)
        nbddp_say("lean-init-sync", f"DDP start-up sync one tensor at a time (no packed copy; the largest tensor "
                                    f"is {biggest / 2**30:.2f} GiB)")

    cls.__init__ = __init__


NBDDP_IMPORTS.watch("torch.nn.parallel.distributed", _nbddp_patch_ddp)
