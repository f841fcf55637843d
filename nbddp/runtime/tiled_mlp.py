"""unsloth_zoo's TiledMLP runs one backward per sequence chunk, so DDP's hook on each MLP weight fires once per
chunk ("marked ready twice"). Under torch.distributed its apply() goes through NbddpTiledMLP, which sums the
chunks' gradients itself and hands DDP each weight's gradient once; one process: unchanged."""
import inspect

import torch

from .hooks import NBDDP_IMPORTS, nbddp_say


def nbddp_chunked_grads(forward, x_chunks, grad_chunks, params):
    """Gradients of `forward` over sequence chunks, all computed functionally (torch.autograd.grad: no
    parameter hooks run, so DDP's hooks do not fire once per chunk). Returns (input grad chunks, param grads)."""
    x_grads, totals = [], [None] * len(params)
    for x_chunk, g_chunk in zip(x_chunks, grad_chunks):
        x_chunk = x_chunk.detach().requires_grad_(True)
        with torch.enable_grad():
            out = forward(x_chunk)
        out = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(out, [x_chunk] + list(params), g_chunk, allow_unused=True)
        x_grads.append(grads[0] if grads[0] is not None else torch.zeros_like(x_chunk))
        for i, g in enumerate(grads[1:]):
            if g is not None:
                totals[i] = g if totals[i] is None else totals[i].add_(g)
    return x_grads, totals


class NbddpTiledMLP(torch.autograd.Function):
    """y = forward(x), token chunk by token chunk in forward and backward. The trainable parameters are inputs of
    the node, so their summed gradient leaves backward through it: each parameter's hooks (DDP's) fire once, and
    DDP's search for unused parameters sees them as used."""

    @staticmethod
    def forward(ctx, forward, x, chunks, *params):
        ctx.forward, ctx.chunks, ctx.params = forward, chunks, params
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            outs = [forward(c.unsqueeze(0)) for c in flat.tensor_split(chunks, dim=0)]
        outs = [o[0] if isinstance(o, tuple) else o for o in outs]
        return torch.cat([o.reshape(-1, o.shape[-1]) for o in outs]).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        hidden = x.shape[-1]
        x_chunks = [c.unsqueeze(0) for c in x.reshape(-1, hidden).tensor_split(ctx.chunks, dim=0)]
        g_chunks = [c.unsqueeze(0) for c in grad.reshape(-1, grad.shape[-1]).tensor_split(ctx.chunks, dim=0)]
        grads, param_grads = nbddp_chunked_grads(ctx.forward, x_chunks, g_chunks, ctx.params)
        x_grad = torch.cat([g.reshape(-1, hidden) for g in grads]).view_as(x)
        return (None, x_grad, None, *param_grads)


def nbddp_tiled_mlp(forward, x, chunks, params=None):
    """Run `forward` (an MLP) on `x` in `chunks` token chunks, forward and backward, DDP-safe."""
    if params is None:
        params = forward.parameters()
    return NbddpTiledMLP.apply(forward, x, chunks, *[p for p in params if p.requires_grad])


def _nbddp_patch_tiled_mlp(module):
    tiled = getattr(module, "TiledMLP", None)
    try:
        wanted = ["ctx", "mlp_forward", "mlp_module", "x", "preserve_rng_state", "num_shards"]
        api_ok = tiled is not None and list(inspect.signature(tiled.forward).parameters)[:6] == wanted
    except (TypeError, ValueError):
        api_ok = False
    if not api_ok:
        nbddp_say("tiled-mlp", "unsloth_zoo TiledMLP has an API nbddp does not know; it is left as is")
        return
    original = tiled.apply

    def apply(mlp_forward, mlp_module, x, preserve_rng_state, num_shards, *rest):
        if preserve_rng_state or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return original(mlp_forward, mlp_module, x, preserve_rng_state, num_shards, *rest)
        return nbddp_tiled_mlp(mlp_forward, x, max(1, int(num_shards)), mlp_module.parameters())

    tiled.apply = staticmethod(apply)
    nbddp_say("tiled-mlp", "unsloth_zoo TiledMLP made DDP-safe (gradient hooks fire once per step)")


NBDDP_IMPORTS.watch("unsloth_zoo.tiled_mlp", _nbddp_patch_tiled_mlp)
