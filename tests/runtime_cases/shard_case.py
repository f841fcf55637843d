"""The frozen base sharded (nbddp/runtime/shard.py), the adapters data-parallel, under torchrun (gloo): a tiny
model of frozen blocks with trainable LoRA-style adapters trains k steps on 2 ranks, each on its half of the global
batch, and rank 0 trains an unsharded copy alone on the whole batch. Rank 0 prints one `RESULT {json}` line.

    torchrun --nproc_per_node=2 shard_case.py CHECKPOINT [VARIANT]   # CHECKPOINT: 0 or 1 (the blocks checkpointed)

VARIANT: `prefetch` (the default: the next block gathered while one runs, gloo's asynchronous all-gather), `sync`
(each block's gather on its own), `meta` (the model made on the meta device, each block made just before it is
sharded, by `build`) or `host` (the gathers copy the other ranks' slices from shared host memory).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from nbddp.runtime.shard import nbddp_ddp_ignore, nbddp_shard_model  # noqa: E402

sys.path.insert(0, HERE)
from _layer import finish  # noqa: E402

CHECKPOINT = sys.argv[1] == "1"
VARIANT = sys.argv[2] if len(sys.argv) > 2 else "prefetch"
STEPS, BATCH, DIM, VOCAB = 3, 8, 16, 50


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.lora_a, self.lora_b = nn.Linear(DIM, 4, bias=False), nn.Linear(4, DIM, bias=False)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.base(x) + self.lora_b(self.lora_a(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.layers, self.head = nn.Embedding(VOCAB, DIM), nn.ModuleList(Block() for _ in range(4)), \
            nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if CHECKPOINT and self.training else layer(x)
        return self.head(x)


def build(device=None):
    torch.manual_seed(0)
    if device is None:
        model = Model()
    else:
        with torch.device(device):
            model = Model()
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name
    return model


def made_on_meta(weights):
    """The model on the meta device: the modules outside the blocks made now, each block by `build` (its weights
    from `weights`) just before it is sharded."""
    model = build("meta")
    for name in ("embed", "head"):
        getattr(model, name).to_empty(device="cpu")

    def make(index, block):
        block.to_empty(device="cpu")
        with torch.no_grad():
            for name, param in block.named_parameters():
                param.copy_(weights[f"layers.{index}.{name}"])

    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("layers."):
                param.copy_(weights[name])
    return model, make


def parts(model, ids, swap=None):
    """The model run as Unsloth's fast decode runs one: each block's parts called, not the block (no block hook
    runs), between `swap.enter(i)` and `swap.leave(i)`."""
    x = model.embed(ids)
    for i, layer in enumerate(model.layers):
        if swap is not None:
            swap.enter(i)
        x = x + torch.tanh(layer.norm(layer.base(x) + layer.lora_b(layer.lora_a(x))))
        if swap is not None:
            swap.leave(i)
    return model.head(x)


def train(model, batches):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    losses = []
    for ids in batches:
        loss = nn.functional.cross_entropy(model(ids[:, :-1]).reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1)
batches = [torch.randint(0, VOCAB, (BATCH, 6)) for _ in range(STEPS)]
reference = build()
whole = sum(p.numel() for p in reference.parameters() if not p.requires_grad)
left = []
if VARIANT == "meta":
    model, make = made_on_meta(reference.state_dict())
    shards = nbddp_shard_model(model, build=make, timing=True)
else:
    model = build()
    shards = nbddp_shard_model(model, prefetch=VARIANT != "sync", timing=True,
                               transport="host" if VARIANT == "host" else "collective")
    if VARIANT == "host":  # every rank's files unlinked once mapped
        dist.barrier()
        left = [f for f in os.listdir(os.path.dirname(shards.host_prefix))
                if f.startswith(os.path.basename(shards.host_prefix))]
ignored = shards.ignored
kept = sum(p.numel() for p in model.parameters() if not p.requires_grad)
whole_at_once = []
for layer in model.layers:  # after the shard's own hook: the block about to run is whole, and at most one other
    layer.register_forward_pre_hook(lambda block, _: whole_at_once.append(
        (block.base.weight.numel() > 0, len(shards.whole_blocks()))))
nbddp_ddp_ignore(model, ignored)
ddp = nn.parallel.DistributedDataParallel(model)
share = BATCH // world
losses = train(ddp, [b[rank * share:(rank + 1) * share] for b in batches])
timing = shards.take_timing()
gathered = [None] * world
dist.all_gather_object(gathered, losses)
if rank == 0:
    ref_model = reference
    ref_losses = train(ref_model, batches)
    by_parts = None
    if VARIANT == "host":  # rank 0 alone, after training (generation), through the layer list's enter/leave
        with torch.no_grad():
            swap = model.layers._unsloth_block_swap
            by_parts = (parts(model, batches[0], swap) - ref_model(batches[0])).abs().max().item()
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    expected = {n: p.detach() for n, p in ref_model.named_parameters() if p.requires_grad}
    print("RESULT " + json.dumps({
        "max_weight_diff": max((trained[n] - expected[n]).abs().max().item() for n in expected),
        "rank_losses": gathered, "one_process_losses": ref_losses,
        "frozen_sharded": len(ignored), "frozen_elements_kept_between_blocks": kept, "frozen_elements": whole,
        "mean_loss_diff": max(abs(sum(ls) / world - r) for ls, r in zip(zip(*gathered), ref_losses)),
        "running_block_whole": all(w for w, _ in whole_at_once), "most_blocks_whole": max(n for _, n in whole_at_once),
        "gathers": timing["gathers"], "reused": timing["reused"], "variant": VARIANT, "files_left": len(left),
        "by_parts_diff": by_parts,
    }), flush=True)
finish()  # every rank waits, the group closes, then the process leaves at once (_layer.finish says why)
