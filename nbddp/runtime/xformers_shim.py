"""xformers attention with a tensor bias on another device than the query (seen with one GPU per rank): the
bias follows the query."""
import functools

import torch

from .hooks import NBDDP_IMPORTS


def _nbddp_patch_xformers(module):
    attention = getattr(module, "memory_efficient_attention", None)
    if attention is None or getattr(attention, "_nbddp", False):
        return

    @functools.wraps(attention)
    def memory_efficient_attention(query, key, value, attn_bias=None, *a, **kw):
        if isinstance(attn_bias, torch.Tensor) and attn_bias.device != query.device:
            attn_bias = attn_bias.to(query.device)
        return attention(query, key, value, attn_bias, *a, **kw)

    memory_efficient_attention._nbddp = True
    module.memory_efficient_attention = memory_efficient_attention


NBDDP_IMPORTS.watch("xformers.ops", _nbddp_patch_xformers)
