"""Plain-torch DDP cases (no transformers): a tiny LoRA-style model trained for a few steps under torchrun.

    torchrun --nproc_per_node=2 ddp_cases.py matrix   # every raw combination, without the nbddp layer
    torchrun --nproc_per_node=2 ddp_cases.py layer    # the layer picks the DDP settings (and patches TiledMLP)
    torchrun --nproc_per_node=2 ddp_cases.py one CKPT STATIC FIND_UNUSED TILED UNUSED   # one raw combination

Each combination runs on its own process group, so an error in one leaves the next intact. After k steps the
trainable weights are compared with a one-process run on the same global batch (the DDP-free reference).
Rank 0 prints one `RESULT {json}` line per combination and, with NBDDP_OUTCOME_DIR set, writes them to a file.
"""
import copy
import datetime
import functools
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_zoo"))
sys.path.insert(0, HERE)
from _layer import finish, load_layer  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

WHAT = sys.argv[1]
LAYER = None
if WHAT == "layer":
    LAYER = load_layer()
import unsloth_zoo.gradient_checkpointing as zoo_ckpt  # noqa: E402  (after the layer: its import hook patches)
import unsloth_zoo.tiled_mlp as zoo_tiled  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

torch.set_default_dtype(torch.float64)  # so that a wrong gradient stands out from rounding
D, R, SEQ, BATCH, STEPS, LR = 8, 2, 4, 4, 3, 0.1
TOL = dict(rtol=1e-9, atol=1e-10)
CKPT = {
    "none": None,
    "reentrant": functools.partial(checkpoint, use_reentrant=True),
    "non-reentrant": functools.partial(checkpoint, use_reentrant=False),
    "unsloth": zoo_ckpt.unsloth_offloaded_checkpoint,
}


class LoraLinear(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d ** 0.5, requires_grad=False)
        self.lora_A = nn.Parameter(torch.randn(R, d) * 0.3)
        self.lora_B = nn.Parameter(torch.randn(d, R) * 0.3)

    def forward(self, x):
        return x @ self.weight.T + (x @ self.lora_A.T) @ self.lora_B.T


class LastChunkFires(torch.autograd.Function):
    """The other DDP-safe design: chunks but the last by torch.autograd.grad (summed into .grad), only the last
    chunk's backward fires the weights' hooks. The weights are not inputs of the node."""

    @staticmethod
    def forward(ctx, mlp, x):
        ctx.mlp = mlp
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([mlp.plain(c) for c in x.chunk(2, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        params = [p for p in ctx.mlp.parameters() if p.requires_grad]
        chunks, grads, out_grads = x.chunk(2, dim=-2), grad.chunk(2, dim=-2), []
        for i, (c, g) in enumerate(zip(chunks, grads)):
            c = c.detach().requires_grad_(True)
            with torch.enable_grad():
                out = ctx.mlp.plain(c)
            if i < len(chunks) - 1:
                got = torch.autograd.grad(out, [c] + params, g)
                for p, pg in zip(params, got[1:]):
                    p.grad = pg if p.grad is None else p.grad + pg
                out_grads.append(got[0])
            else:
                torch.autograd.backward(out, g, inputs=[c] + params)
                out_grads.append(c.grad)
        return None, torch.cat(out_grads, dim=-2)


class Mlp(nn.Module):
    def __init__(self, tiled):
        super().__init__()
        self.up, self.down, self.tiled = LoraLinear(D), LoraLinear(D), tiled

    def plain(self, x):
        return self.down(torch.tanh(self.up(x)))

    def forward(self, x):
        if self.tiled == "zoo":
            return zoo_tiled.TiledMLP.apply(self.plain, self, x, False, 2, None)
        if self.tiled == "last-chunk":
            return LastChunkFires.apply(self, x)
        return self.plain(x)


class Block(nn.Module):
    def __init__(self, tiled):
        super().__init__()
        self.attn, self.mlp = LoraLinear(D), Mlp(tiled)
        self.gradient_checkpointing, self._gradient_checkpointing_func = False, None

    def inner(self, x):
        h = x + torch.tanh(self.attn(x))
        return h + self.mlp(h)

    def forward(self, x):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(self.inner, x)
        return self.inner(x)


class Model(nn.Module):
    def __init__(self, ckpt, tiled, unused):
        super().__init__()
        self.blocks = nn.ModuleList([Block(tiled) for _ in range(2)])
        self.late = nn.Parameter(torch.randn(D) * 0.1)  # with `unused`: no gradient in step 0, used from step 1
        self.head = nn.Parameter(torch.randn(D), requires_grad=False)
        self.unused, self.step = unused, 0
        for block in self.blocks:
            block.gradient_checkpointing, block._gradient_checkpointing_func = ckpt is not None, ckpt

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        if not self.unused or self.step > 0:
            x = x + self.late
        return x @ self.head


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, generator=g)) for _ in range(STEPS)]


def train(model, data, world, rank):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    inner = model.module if hasattr(model, "module") else model
    for step, (x, y) in enumerate(data):
        inner.step = step
        share = BATCH // world
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        x = x.clone().requires_grad_(True)  # reentrant checkpointing needs an input that requires grad
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def classify(exc):
    text = str(exc)
    if "marked as ready twice" in text or "mark a variable ready only once" in text:
        return "error: marked ready twice"
    if "graph has changed" in text:
        return "error: graph has changed"
    if "finished reduction in the prior iteration" in text:
        return "error: unused parameter (reduction not finished)"
    return f"error: {type(exc).__name__}: {text.splitlines()[0][:80]}"


GROUP = None


def run(combo, rank, world):
    torch.manual_seed(0)
    model = Model(CKPT[combo["ckpt"]], combo["tiled"], combo["unused"])
    reference = copy.deepcopy(model)
    if LAYER is not None:
        hint = types.SimpleNamespace(ddp_find_unused_parameters=True if combo["unused"] else None)
        combo["static"], combo["find_unused"] = LAYER.nbddp_decide(model, hint)
        LAYER._NBDDP_SAID.discard("ddp-strategy")
    global GROUP
    if GROUP is None:  # a fresh group after an error: a failed step may leave work queued on the old one
        GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    group = GROUP
    lazy = LAYER is not None and combo["ckpt"] == "unsloth" and not combo["unused"] and combo["tiled"] == "none"
    if lazy:  # as with NBDDP_STATIC_GRAPH=1 (the layer's own choice here is no static graph): tests the fallback
        combo["static"] = True
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, static_graph=combo["static"] and not lazy,
                                              find_unused_parameters=combo["find_unused"])
    if lazy:  # the layer's fallback path: static graph set on a DDP found inside a wrapper, before the first forward
        wrapper = nn.Module()
        wrapper.module = ddp
        combo["applied"] = "lazily" if LAYER.nbddp_apply_to_ddp(wrapper, combo["static"]) and ddp.static_graph \
            else "not found"
    data = batches()
    try:
        train(ddp, data, world, rank)
        train(reference, data, 1, 0)
        diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
        same = all(torch.allclose(a, b, **TOL) for a, b in zip(model.parameters(), reference.parameters()))
        combo.update(outcome="trains, same weights as one process" if same else "trains, WRONG weights",
                     max_abs_diff=diff)
    except Exception as exc:  # noqa: BLE001 - the outcome is the point
        GROUP = None
        combo.update(outcome=classify(exc), max_abs_diff=None)
    dist.barrier()
    return combo


def combos():
    if WHAT == "one":
        ckpt, static, find_unused, tiled, unused = sys.argv[2:7]
        return [dict(ckpt=ckpt, static=static == "1", find_unused=find_unused == "1", tiled=tiled, unused=unused == "1")]
    out = []
    for ckpt in CKPT:
        for tiled in ("none", "zoo") if WHAT == "layer" else ("none", "zoo", "last-chunk"):
            for unused in (False, True):
                if WHAT == "layer":
                    out.append(dict(ckpt=ckpt, static=None, find_unused=None, tiled=tiled, unused=unused))
                    continue
                for static in (False, True):
                    for find_unused in (False, True):
                        out.append(dict(ckpt=ckpt, static=static, find_unused=find_unused, tiled=tiled, unused=unused))
    return out


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for combo in combos():
        result = run(combo, rank, world)
        result["layer"] = LAYER is not None
        results.append(result)
        if rank == 0:
            print("RESULT " + json.dumps(result), flush=True)
    if rank == 0 and os.environ.get("NBDDP_OUTCOME_DIR") and WHAT != "one":
        os.makedirs(os.environ["NBDDP_OUTCOME_DIR"], exist_ok=True)
        with open(os.path.join(os.environ["NBDDP_OUTCOME_DIR"], f"ddp_cases_{WHAT}.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    finish()


if __name__ == "__main__":
    main()
