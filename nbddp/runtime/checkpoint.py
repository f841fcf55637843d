"""Non-reentrant gradient checkpointing, optionally with the saved tensors offloaded to CPU memory: DDP follows it
like ordinary autograd, also with find_unused_parameters=True (reentrant checkpointing fails there)."""
import functools

import torch

_NBDDP_WRAPPED = ("module", "base_model", "model", "_orig_mod")  # where wrappers keep the wrapped model


def nbddp_find_module(model, test, depth=8):
    """The first object in the wrapping chain (DDP, accelerate, PEFT, torch.compile) that passes `test`; bounded."""
    layer, seen = [model], set()
    for _ in range(depth):
        found = next((obj for obj in layer if test(obj)), None)
        if found is not None:
            return found
        seen.update(map(id, layer))
        layer = [getattr(obj, attr, None) for obj in layer for attr in _NBDDP_WRAPPED]
        layer = [child for child in layer if isinstance(child, torch.nn.Module) and id(child) not in seen]
    return None


def _nbddp_is_wrapper(module):
    name = type(module).__name__
    return name in ("DistributedDataParallel", "OptimizedModule") or name.startswith("Peft")


def nbddp_base_model(model):
    """The model inside DDP, PEFT and torch.compile wrappers."""
    return nbddp_find_module(model, lambda m: not _nbddp_is_wrapper(m)) or model


def nbddp_offload_checkpoint(function, *args, **kwargs):
    """Non-reentrant checkpointing, with the tensors it keeps for the recompute held in CPU memory."""
    from torch.utils.checkpoint import checkpoint

    kwargs["use_reentrant"] = False
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda", device_type=device.type):
        return checkpoint(function, *args, **kwargs)


nbddp_offload_checkpoint._nbddp_offload = True


def nbddp_use_non_reentrant(model, offload=True):
    """Swap every layer's checkpointing function for non-reentrant checkpointing (offloaded to CPU if asked)."""
    from torch.utils.checkpoint import checkpoint

    func = nbddp_offload_checkpoint if offload else functools.partial(checkpoint, use_reentrant=False)
    swapped = 0
    for module in nbddp_base_model(model).modules():
        if hasattr(module, "_gradient_checkpointing_func") or getattr(module, "gradient_checkpointing", False):
            module._gradient_checkpointing_func = func
            swapped += 1
    return swapped
