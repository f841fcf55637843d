"""TiledMLP with unsloth_zoo's interface and its DDP-unsafe backward: one torch.autograd.backward per chunk, so a
parameter's gradient hooks (DDP's) fire once per chunk. Written for the tests; behaviour reproduced, not copied."""
import torch


class TiledMLP(torch.autograd.Function):
    @staticmethod
    def handle_output(output, extra_lists):
        return output[0] if isinstance(output, tuple) else output

    @staticmethod
    def forward(ctx, mlp_forward, mlp_module, x, preserve_rng_state, num_shards, max_flat_qlen):
        batch, seq, hidden = x.shape
        size, rest = divmod(batch * seq, num_shards)
        ctx.split_sizes = [size] * num_shards + ([rest] if rest else [])
        ctx.mlp_forward, ctx.mlp_module, ctx.preserve_rng_state = mlp_forward, mlp_module, False
        ctx.device_type = x.device.type
        ctx.save_for_backward(x)
        with torch.no_grad():
            parts = [TiledMLP.handle_output(mlp_forward(c.unsqueeze(0)), [])
                     for c in torch.split(x.reshape(-1, hidden), ctx.split_sizes)]
        return torch.cat([p.reshape(-1, hidden) for p in parts]).view(batch, seq, hidden)

    @staticmethod
    def backward(ctx, grad_output, *args):
        x = ctx.saved_tensors[0]
        hidden = x.shape[-1]
        x_grad = torch.zeros_like(x)
        start = 0
        for c in torch.split(x.reshape(-1, hidden), ctx.split_sizes):
            n = c.numel()
            piece = c.detach().unsqueeze(0).requires_grad_(True)
            with torch.enable_grad():
                out = TiledMLP.handle_output(ctx.mlp_forward(piece), [])
            torch.autograd.backward(out, grad_output.reshape(-1).narrow(0, start, n).view_as(piece))
            x_grad.view(-1).narrow(0, start, n).copy_(piece.grad.reshape(-1))
            start += n
        return None, None, x_grad, None, None, None
