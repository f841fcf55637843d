"""Stand-in for Unsloth's offloaded gradient checkpointing: a reentrant autograd.Function that keeps the block's
input on the CPU and re-runs the block inside backward (so DDP's hooks fire inside a nested backward)."""
import torch


class OffloadedCheckpointer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, hidden_states):
        ctx.function, ctx.device = function, hidden_states.device
        ctx.save_for_backward(hidden_states.to("cpu"))
        with torch.no_grad():
            return function(hidden_states)

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        hidden = saved.to(ctx.device).detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.function(hidden)
        torch.autograd.backward(out, grad)
        return None, hidden.grad


def unsloth_offloaded_checkpoint(function, *args, **kwargs):
    return OffloadedCheckpointer.apply(function, *args)
