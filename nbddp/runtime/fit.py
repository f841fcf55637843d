"""Does the notebook's model fit one GPU? Decided before anything loads, from the model's config (read as
transformers reads it: a local folder, else the hub cache or the hub) and each GPU's free memory:
- it fits one GPU: DDP, one process per GPU;
- it does not, but each process's share does: the sharded mode, one process per GPU, each holding 1/N of the
  frozen decoder layers and gathering each layer as it runs (docs/sharded.md; only where the script can load the
  model sharded: shard_mode.py, a transformers causal LM in 16 or 32 bits or bitsandbytes 4-bit, Unsloth's loaders
  included);
- it fits only across all GPUs: one process, the model split over them (the notebook's own placement, or
  nbddp's: split_place.py), at about one GPU's speed;
- it fits nowhere: an error before loading, with the numbers.
NBDDP_MODE=ddp|shard|split|auto overrides (auto by default)."""
import ctypes
import json
import os
import sys

import torch

from .group import NBDDP_IS_MAIN, NBDDP_LOCAL_RANK, NBDDP_WORLD_SIZE
from .hooks import nbddp_say
from .launcher import NBDDP_LAUNCHED, nbddp_nproc
from .split_place import NBDDP_LORA_RANK, nbddp_split_on

NBDDP_GIB = 2 ** 30
NBDDP_ALLOWANCE = (1.2, 1.5)  # need = weights x 1.2 (LoRA, optimizer state, quantization constants) + 1.5 GiB
NBDDP_SHARDABLE = {}  # where the script carries shard_mode.py: its "share" (GiB a process, sharded) and "start"


def nbddp_weight_gib(config, bits, parts=False):
    """The weights on one GPU: the layers' matrices at `bits`, embeddings and lm_head at 16 bits (quantized loading
    keeps them), from a decoder's config (a multimodal config's text part; a vision tower is not counted). `parts`:
    (the layers' GiB, the embeddings' and head's GiB, the shape: layers, hidden, the attention's q/o and k/v widths,
    the MLP's width x experts) instead of their sum."""
    c = config.get("text_config") or config
    hidden, heads = c["hidden_size"], c.get("num_attention_heads") or 1
    kv, head = c.get("num_key_value_heads") or heads, c.get("head_dim") or hidden // heads
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 1
    inner = (c.get("moe_intermediate_size") if experts > 1 else None) or c.get("intermediate_size") or 4 * hidden
    shape = c["num_hidden_layers"], hidden, heads * head, kv * head, inner * experts
    matrices = shape[0] * hidden * (2 * shape[2] + 2 * shape[3] + 3 * shape[4])
    tied = c.get("tie_word_embeddings", config.get("tie_word_embeddings", True))
    embeddings = c["vocab_size"] * hidden * (1 if tied else 2)
    gib = matrices * bits / 8 / NBDDP_GIB, embeddings * max(bits, 16) / 8 / NBDDP_GIB
    return (*gib, shape) if parts else sum(gib)


def nbddp_shard_gib(config, bits, n):
    """GiB on each of `n` processes in the sharded mode: 1/n of the decoder layers' frozen weights and two layers
    whole (the gather buffers: the layer that runs and the next one), and whole on every rank the embeddings and
    head, the 4-bit quantization constants (1/32 of the packed bytes), the adapters (LoRA r=16 on every projection:
    weights, gradients and Adam's two states, 16 bytes a value) and the same 1.5 GiB for activations as one GPU's
    need. The norms (a few vectors a layer) are left out."""
    layers, outside, (count, hidden, attention, kv, mlp) = nbddp_weight_gib(config, bits, parts=True)
    adapters = NBDDP_LORA_RANK * count * (2 * (hidden + attention) + 2 * (hidden + kv) + 3 * (hidden + mlp)) * 16
    constants = layers / 32 if bits <= 4 else 0
    return layers / n + 2 * layers / count + outside + constants + adapters / NBDDP_GIB + NBDDP_ALLOWANCE[1]


def nbddp_plan(need, free, shard=None):
    """'ddp', 'shard', 'split' or 'none': a model that needs `need` GiB on one GPU, GPUs with `free` GiB each,
    `shard` GiB on each process with its layers sharded over len(free) processes (None: not possible here). Split,
    each GPU holds an even share, and the last one also the output layer and the loss, counted as a quarter of the
    need (measured: an 8B model's 2-GPU split peaked at 2.8 and 5.5 GiB where one GPU took 7.0). The sharded mode
    comes before split: every GPU computes (split: one at a time)."""
    if not free or need <= min(free):
        return "ddp"
    return "shard" if shard and len(free) > 1 and shard <= min(free) else \
        "split" if len(free) > 1 and need / len(free) + need / 4 <= min(free) else "none"


def _nbddp_config(model):
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "config.json")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _nbddp_nvml_handles(nvml):
    """NVML's handles of the GPUs this process sees, or None where NVML's numbering may not be CUDA's (indices that
    name a subset, in CUDA's own order; MIG instances) or a GPU is not found."""
    count = ctypes.c_uint()
    if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)):
        return None
    everyone = [str(i) for i in range(count.value)]
    names = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(everyone)).split(",") if v.strip()]
    if all(n.isdigit() for n in names) and (sorted(names) == sorted(everyone) or
                                            os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"):
        get, keys = nvml.nvmlDeviceGetHandleByIndex_v2, [ctypes.c_uint(int(n)) for n in names]
    elif all(n.startswith("GPU-") for n in names):
        get, keys = nvml.nvmlDeviceGetHandleByUUID, [n.encode() for n in names]
    else:
        return None
    handles = [ctypes.c_void_p() for _ in keys]
    if any(get(key, ctypes.byref(h)) for key, h in zip(keys, handles)):
        return None
    return handles


def _nbddp_nvml_free_gib():
    """Free GiB of each GPU this process sees, from NVML (the driver's own library): no CUDA context, so no GPU
    memory held by the process that becomes the launcher. None where NVML cannot tell."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2():
        return None
    try:
        handles = _nbddp_nvml_handles(nvml)
        if not handles or len(handles) != torch.cuda.device_count():
            return None
        memory = [(ctypes.c_ulonglong * 3)() for _ in handles]  # nvmlMemory_t: total, free, used
        failed = [nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) for h, m in zip(handles, memory)]
        return None if any(failed) else [m[1] / NBDDP_GIB for m in memory]
    finally:
        nvml.nvmlShutdown()


def _nbddp_free_gib(launched):
    """Free GiB of each GPU the job uses: under a launcher this rank's alone (no CUDA context on the others' GPUs);
    as a plain process each GPU's from NVML, where it can tell (the process becomes the launcher and stays), else
    from CUDA."""
    if launched:
        return [torch.cuda.mem_get_info(NBDDP_LOCAL_RANK)[0] / NBDDP_GIB]
    return _nbddp_nvml_free_gib() or [torch.cuda.mem_get_info(gpu)[0] / NBDDP_GIB
                                      for gpu in range(torch.cuda.device_count())]


def _nbddp_stop(text):
    """One line from rank 0, and every rank stops at once (before anything loads)."""
    if NBDDP_IS_MAIN:
        print(f"nbddp: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def nbddp_fit(models):
    """This run's mode for the notebook's models ((id, bits) pairs; the largest counts), said in one line; the
    sharded mode where the script carries shard_mode.py (NBDDP_SHARDABLE: its share of the model on each process,
    and its start, which says the line)."""
    nbddp_nproc()  # NBDDP_NPROC and NBDDP_MODE are checked before anything else
    mode = os.environ.get("NBDDP_MODE", "auto").strip().lower() or "auto"
    numbers, shard, free = None, None, range(torch.cuda.device_count())
    if mode == "auto" and torch.cuda.is_available():
        try:
            weights = max(nbddp_weight_gib(_nbddp_config(model), bits) for model, bits in models)
        except Exception as exc:  # no config to read: the model is loaded as DDP would
            nbddp_say("fit", f"warning: cannot size the model ({type(exc).__name__}: {exc}); one process per GPU")
            return "ddp"
        launched = any(name in os.environ for name in NBDDP_LAUNCHED)
        need, free = weights * NBDDP_ALLOWANCE[0] + NBDDP_ALLOWANCE[1], _nbddp_free_gib(launched)
        shard = NBDDP_SHARDABLE and NBDDP_SHARDABLE["share"](models, NBDDP_WORLD_SIZE if launched else len(free))
        mode = ("ddp" if need <= free[0] else "shard" if shard and shard <= free[0] else "split") if launched else \
            nbddp_plan(need, free, shard)
        numbers = f"the model needs ~{need:.1f} GiB on one GPU, {'/'.join(f'{f:.1f}' for f in free)} GiB free"
    if mode == "shard":  # said and started by shard_mode.py, where the script carries it
        return NBDDP_SHARDABLE["start"](models, numbers, shard) if NBDDP_SHARDABLE else _nbddp_stop(
            "NBDDP_MODE=shard: this script does not load its model sharded (no peft, or Unsloth): NBDDP_MODE=split")
    said = numbers or "NBDDP_MODE=split"
    if mode == "none":
        _nbddp_stop(f"{said}: it fits on no GPU, nor split over all of them; load it in 4 bits, or use GPUs "
                    "with more memory")
    if mode == "split" and NBDDP_WORLD_SIZE > 1:
        _nbddp_stop(f"{said}: it fits only split over every GPU, in one process: start it with "
                    f"`python {sys.argv[0]}` instead of a launcher")
    if numbers or mode == "split":
        nbddp_say("fit", f"{said}: " + ("one process per GPU" if mode == "ddp" else f"one process, the model "
                  f"split over {len(free)} GPUs (no data parallelism: about one GPU's speed; NBDDP_MODE=ddp: DDP)"))
    if mode == "split":
        nbddp_split_on()
    return "ddp" if mode == "auto" else mode
