"""Split mode's placement (fit.py chooses the mode: one process, the model over every GPU): the decoder layers cut
between the GPUs so that each GPU's memory is used alike, counted from the model's own parameters and from what
training adds where it lands, not from the number of layers:
- a parameter's bytes at the load's precision (4-bit layers: half a byte a weight and their constants; embeddings
  and the head in 16 bits), and for what trains, its gradient and Adam's two states too (16 bytes a value; before
  the load, LoRA r=16 on every matrix of the layers, as the fit check counts it);
- each layer's checkpointed input, and on the head's GPU its logits and the loss over them (10 bytes a logit:
  half-precision logits, their float32 copy, the log-softmax), for a micro-batch of NBDDP_SPLIT_TOKENS tokens.
The modules before the layers (embeddings) go to the first GPU, those after them (the final norm) and the head to
the last; a head tied to the embeddings stays with them. The cut makes the largest use, as a share of each GPU's
free memory, as small as it can be. accelerate's "balanced" budgets the weights alone and leaves the rest to the
last GPU, the head's logits included (docs/sharded.md: 8.9 / 12.4 GiB for a 32B model in 4-bit, and a 7B one out of
memory on its last GPU where the first held 2.2 GiB).

Where the mode is split, transformers' `PreTrainedModel.from_pretrained` is patched when the notebook first imports
it (the runtime's post-import hook, in split mode only): a load that asks for accelerate's balancing ("auto",
"balanced": nbddp's default) gets this placement as its device_map, said in one line; a notebook's "sequential" or
"balanced_low_0", a map or `max_memory` of its own, stays as written."""
import functools
import os
import traceback

import torch

from .hooks import NBDDP_IMPORTS, nbddp_say

NBDDP_SPLIT_TOKENS = 1024  # the micro-batch the activations are counted for
NBDDP_LORA_RANK = 16  # adapters counted before the load: LoRA r=16 on every matrix of the layers
_NBDDP_TRAINED_BYTES = 16  # bytes a trained value: float32 weight and gradient, Adam's two states
_NBDDP_LOGIT = 10  # bytes a logit: half-precision logits, their float32 copy, the log-softmax
_NBDDP_BALANCING = ("auto", "balanced")


def nbddp_layer_list(model):
    """The `nn.ModuleList` of the model's repeated blocks: the one holding the most parameters (a decoder's layers)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters())) if lists else None


def _nbddp_tied(model):
    """The model's head is its input embeddings' tensor."""
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def nbddp_split_cut(fixed, layers, free):
    """How many consecutive layers each GPU holds, in order: GPU i holds `fixed[i]` bytes besides its layers, layer j
    takes `layers[j]` bytes, GPU i has `free[i]` bytes. The largest use as a share of free memory is made as small as
    it can be (each GPU in turn filled up to a share, the share found by bisection); above 1 where nothing fits."""
    def fill(share):
        counts, j = [], 0
        for gpu, (held, room) in enumerate(zip(fixed, free)):
            left, n = share * room - held, 0
            while j < len(layers) and (gpu == len(free) - 1 or layers[j] <= left):
                left, j, n = left - layers[j], j + 1, n + 1
            if left < 0:
                return None
            counts.append(n)
        return counts

    high = 1.0
    while fill(high) is None:
        high *= 2
    low = 0.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if fill(mid) is not None else (mid, high)
    return fill(high)


def _nbddp_parts(model, blocks, head):
    """(name, module or tensor, where) covering every parameter and buffer once: the blocks (where: their index),
    the head ("head"), and the rest whole, "before" or "after" the blocks in the order their modules were made."""
    parts = []

    def visit(module, prefix):
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            parts.append((prefix + name, tensor, "before"))
        for name, child in module.named_children():
            if child is blocks:
                parts.extend((f"{prefix}{name}.{i}", block, i) for i, block in enumerate(child))
            elif child is head:
                parts.append((prefix + name, child, "head"))
            elif any(m is blocks or m is head for m in child.modules()):
                visit(child, f"{prefix}{name}.")
            else:
                after = any(isinstance(where, int) for _, _, where in parts)  # the blocks came first
                parts.append((prefix + name, child, "after" if after else "before"))

    visit(model, "")
    return parts


def _nbddp_part_bytes(part, bits, counted, in_block):
    """The bytes of a part's tensors not counted yet (a tied tensor counts once): as they are (`bits` None: a model
    as it trains), or, before the load (`bits`: its precision), a block's matrices at `bits` with their LoRA
    adapters and 4-bit constants, everything else in 16 bits or more."""
    total = 0
    tensors = [part] if isinstance(part, torch.Tensor) else [*part.parameters(), *part.buffers()]
    for t in tensors:
        if id(t) in counted:
            continue
        counted.add(id(t))
        if bits is None:
            total += t.numel() * (_NBDDP_TRAINED_BYTES if t.requires_grad else t.element_size())
        elif t.dim() == 2 and in_block:
            adapters = NBDDP_LORA_RANK * sum(t.shape) * _NBDDP_TRAINED_BYTES
            total += t.numel() * bits / 8 * (1 + 1 / 32 if bits <= 4 else 1) + adapters
        else:
            total += t.numel() * max(bits, 16) / 8
    return total


def nbddp_split_map(model, free, bits=None, tokens=NBDDP_SPLIT_TOKENS):
    """`(device_map, layers on each GPU, bytes each GPU is counted for)` for `model` (on the meta device, or
    anywhere) over GPUs with `free` bytes each: every parameter and buffer under one name, the blocks cut by
    nbddp_split_cut. `bits`: the precision of a load to come (the model made from its config, nothing trained yet);
    None: as the model is."""
    blocks, head = nbddp_layer_list(model), model.get_output_embeddings()
    if blocks is None or head is None or len(free) < 2:
        return None, None, None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    saved = tokens * config.hidden_size * 2  # each layer's input, kept for its recompute
    logits = tokens * head.weight.shape[0] * _NBDDP_LOGIT
    tied = _nbddp_tied(model)

    def side(where):  # the GPU of what is not a block: before them the first, after them the last, the head its own
        return 0 if where == "before" or (where == "head" and tied) else len(free) - 1

    parts, counted, fixed, layers = _nbddp_parts(model, blocks, head), set(), [0.0] * len(free), []
    for _, part, where in parts:
        size = _nbddp_part_bytes(part, bits, counted, isinstance(where, int))
        if isinstance(where, int):
            layers.append(size + saved)
        else:
            fixed[side(where)] += size + (logits if where == "head" else 0)
    counts = nbddp_split_cut(fixed, layers, free)
    gpu_of = [gpu for gpu, n in enumerate(counts) for _ in range(n)]
    placed = {name: gpu_of[where] if isinstance(where, int) else side(where) for name, _, where in parts}
    used = [held + sum(size for size, gpu in zip(layers, gpu_of) if gpu == g) for g, held in enumerate(fixed)]
    return placed, counts, used


def nbddp_quant_asked(kwargs):
    """The quantization a from_pretrained call asks for (a config object, a dict, or None); `load_in_4bit=True` and
    `load_in_8bit=True` as bitsandbytes' config dicts."""
    asked = kwargs.get("quantization_config")
    if asked is None and kwargs.get("load_in_8bit"):
        return {"quant_method": "bitsandbytes", "load_in_8bit": True}
    if asked is None and kwargs.get("load_in_4bit"):
        return {"quant_method": "bitsandbytes", "load_in_4bit": True}
    return asked


def _nbddp_load_bits(config, kwargs):
    """The precision a from_pretrained call loads the layers in: 4 or 8 (quantized: asked for, or the checkpoint's
    own), else 32 for float32, else 16."""
    asked = nbddp_quant_asked(kwargs) or getattr(config, "quantization_config", None)
    if asked is not None:
        asked = asked if isinstance(asked, dict) else asked.to_dict()
        return 4 if asked.get("load_in_4bit") or asked.get("bits") == 4 else \
            8 if asked.get("load_in_8bit") or asked.get("bits") == 8 else 16
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype")) or getattr(config, "dtype", None)
    return 32 if dtype in (torch.float32, "float32") else 16


def nbddp_split_placement(cls, name, kwargs):
    """The device_map for `cls.from_pretrained(name, **kwargs)` in split mode, said in one line; None (the load's own
    placement kept, said) where the model cannot be made from its config here."""
    import transformers
    try:
        config = kwargs.get("config")
        if not isinstance(config, transformers.PretrainedConfig):
            hub = {k: kwargs[k] for k in ("revision", "subfolder", "cache_dir", "trust_remote_code") if k in kwargs}
            config = transformers.AutoConfig.from_pretrained(config or name, **hub)
        with torch.device("meta"):
            model = cls(config)
        free = [torch.cuda.mem_get_info(gpu)[0] for gpu in range(torch.cuda.device_count())]
        placed, counts, used = nbddp_split_map(model, free, _nbddp_load_bits(config, kwargs))
    except Exception as exc:  # the notebook's load goes on with accelerate's placement
        where = traceback.extract_tb(exc.__traceback__)[-1]
        placed, used = None, f"{type(exc).__name__} in {os.path.basename(where.filename)} line {where.lineno}: {exc}"
    shown = f"{cls.__name__}.from_pretrained({str(name)!r})"
    if placed is None:
        nbddp_say(f"split-{shown}", f"{shown}: accelerate's placement ({used or 'no decoder layers found'})")
        return None
    head = "the first GPU, with the embeddings it shares" if _nbddp_tied(model) else "the last GPU"
    nbddp_say(f"split-{shown}", f"{shown}: layers per GPU {' / '.join(map(str, counts))}, by their bytes and the "
                                f"activations of {NBDDP_SPLIT_TOKENS} tokens (head and loss on {head}): ~"
                                + " / ".join(f"{u / 2 ** 30:.1f}" for u in used) + " GiB")
    return placed


def nbddp_wrap_from_pretrained(modeling, mark, load):
    """transformers' `PreTrainedModel.from_pretrained` made `load(whole, cls, name, *args, **kwargs)` (`whole`: the
    one it wraps), once per `mark`."""
    base = modeling.PreTrainedModel
    whole = base.from_pretrained.__func__
    if getattr(whole, mark, False):
        return

    @functools.wraps(whole)
    def from_pretrained(cls, name, *args, **kwargs):
        return load(whole, cls, name, *args, **kwargs)

    setattr(from_pretrained, mark, True)
    base.from_pretrained = classmethod(from_pretrained)


def _nbddp_split_load(whole, cls, name, *args, **kwargs):
    if kwargs.get("device_map") in _NBDDP_BALANCING and "max_memory" not in kwargs:
        kwargs["device_map"] = nbddp_split_placement(cls, name, kwargs) or kwargs["device_map"]
    return whole(cls, name, *args, **kwargs)


def _nbddp_patch_split(modeling):
    nbddp_wrap_from_pretrained(modeling, "_nbddp_split", _nbddp_split_load)


def nbddp_split_on():
    """Split mode: the notebook's balanced loads placed by nbddp_split_map."""
    NBDDP_IMPORTS.watch("transformers.modeling_utils", _nbddp_patch_split)
