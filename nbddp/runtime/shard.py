"""The frozen base sharded over the ranks, the adapters data-parallel (docs/sharded.md): each rank keeps 1/N of the
bytes of each repeated block's frozen parameters; just before a block runs (forward, a checkpointed block's
recompute, backward), the ranks all-gather them and the block runs on its whole weights; the next block to gather
lets them go. Everything that trains stays whole on every rank, and DDP
keeps it equal as in DDP mode; the frozen parameters are hidden from DDP, since they differ between ranks.

A CPU prototype of the mechanism: gathers are synchronous (no prefetch stream yet), and 4-bit weights, loading each
rank's share and the fit check's choice of this mode are not built (docs/sharded.md, "Next")."""
import torch
import torch.distributed


_nbddp_all_gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor


def nbddp_blocks(model):
    """The model's repeated blocks: the `nn.ModuleList` holding the most parameters (a decoder's layers)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


class NbddpShardedBlock:
    """One block's frozen parameters: this rank's slice of their bytes, gathered whole while the block runs (its
    forward, its recompute under checkpointing, its backward); at most one block of a model is whole at a time."""

    def __init__(self, block, rank, world, whole):
        self.params = [p for p in block.parameters() if not p.requires_grad]
        self.layout = [(p, p.shape, p.dtype, p.numel() * p.element_size()) for p in self.params]
        flat = torch.cat([p.data.reshape(-1).view(torch.uint8) for p in self.params])
        self.size = -(-flat.numel() // world) * world  # padded to a multiple of the ranks
        padded = torch.zeros(self.size, dtype=torch.uint8, device=flat.device)
        padded[:flat.numel()] = flat
        self.shard = padded.view(world, -1)[rank].clone()
        self.whole = whole  # [the model's block that is whole now]
        self.release()
        block.register_forward_pre_hook(lambda *_: self.gather())
        block.register_forward_hook(self.before_backward)

    def gather(self):
        """Every rank's slice, into one buffer; each frozen parameter a view of it (the one whole block before it
        lets its weights go)."""
        if self.whole[0] is self:
            return
        if self.whole[0] is not None:
            self.whole[0].release()
        buffer = torch.empty(self.size, dtype=torch.uint8, device=self.shard.device)
        _nbddp_all_gather(buffer, self.shard)
        start = 0
        for param, shape, dtype, size in self.layout:
            param.data = buffer[start:start + size].view(dtype).view(shape)  # the same tensor: what autograd saved
            start += size                                                     # of it sees these bytes
        self.whole[0] = self

    def before_backward(self, block, inputs, output):
        """The block's backward reads its weights: gather them again when the gradient reaches its output."""
        first = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda grad: self.gather())

    def release(self):
        for param, _, dtype, _ in self.layout:
            param.data = torch.empty(0, dtype=dtype, device=self.shard.device)
        if self.whole[0] is self:
            self.whole[0] = None


def nbddp_shard_frozen(model):
    """Shard the frozen parameters of the model's repeated blocks over the process group; returns the names of the
    parameters DDP must leave alone (give them to `nbddp_ddp_ignore`)."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    names = {id(p): n for n, p in model.named_parameters()}
    ignored, whole = [], [None]
    for block in nbddp_blocks(model):
        sharded = NbddpShardedBlock(block, rank, world, whole)
        ignored += [names[id(p)] for p in sharded.params]
    return ignored


def nbddp_ddp_ignore(model, names):
    """DDP's start-up broadcast and its reducer skip these parameters (each rank holds its own share)."""
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(names))
