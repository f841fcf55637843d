"""DDP's start-up sync, with the nbddp layer and without: rank 1 starts from other weights and buffers.

    torchrun --nproc_per_node=2 sync_case.py layer|plain

Rank 0 prints one `RESULT {json}`: whether every rank holds rank 0's parameters and buffers once DDP is built
(a trainable, a frozen and a non-contiguous parameter, and a buffer), and how many packed broadcasts
(`torch.distributed._broadcast_coalesced`, DDP's own sync) ran during construction.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _layer import finish, load_layer  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

if sys.argv[1] == "layer":
    load_layer()


class Model(nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.trained = nn.Parameter(torch.randn(4, 3, generator=g))
        self.frozen = nn.Parameter(torch.randn(5, 3, generator=g), requires_grad=False)
        self.transposed = nn.Parameter(torch.randn(3, 6, generator=g).t())  # not contiguous
        self.register_buffer("table", torch.randn(7, generator=g))

    def forward(self, x):
        return x @ self.trained.t() + (x @ self.frozen.t()).sum() + (x @ self.transposed[:3].t()).sum() \
            + self.table.sum()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = Model(seed=rank)  # every rank starts from its own values
    packed = []
    coalesced = dist._broadcast_coalesced

    def counting(*a, **k):
        packed.append(1)
        return coalesced(*a, **k)

    dist._broadcast_coalesced = counting
    nn.parallel.DistributedDataParallel(model)
    dist._broadcast_coalesced = coalesced
    mine = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if rank == 0:
        same = {n: all(torch.equal(other[n], t) for other in every) for n, t in mine.items()}
        print("RESULT " + json.dumps({"synced": same, "packed_broadcasts": len(packed),
                                      "contiguous_after": model.transposed.is_contiguous()}), flush=True)
    finish()


if __name__ == "__main__":
    main()
