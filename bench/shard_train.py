#!/usr/bin/env python3
"""A model too big for one GPU, trained on two: split mode against the sharded mode (docs/sharded.md), same global
batch, same weights, on the T4-class share.

    python3 bench/shard_train.py run --out $OUT/shard-train.json [--sms 8] [--cap-gib 15] [--batch 2] [--seq 1024] \
        [--modes shard,split,shard-sync]                # bench/results/shard-train-*-2026-11-28.json
    python3 bench/shard_train.py run --out /tmp/check.json --device cpu --shape tiny --dtype float32 --sms 0 \\
        --cores ""                                      # the same comparison on CPU (gloo), a tiny Llama
    # 4-bit (bitsandbytes, carried as a wheel to the GPU machine): the sharded layers against the whole ones, bit for
    # bit, then a Qwen2.5-32B stand-in             # bench/results/shard-4bit-{check,qwen25-32b-t4-class}-2026-11-28.*
    python3 bench/shard_train.py run --out $OUT/check.json --shape tiny_qwen --quant nf4 --modes check --sms 0 \\
        --batch 2 --seq 128
    python3 bench/shard_train.py run --out $OUT/q32.json --shape qwen25_32b --quant nf4 --optim adamw8bit \\
        --bucket-view --batch 1 --seq 512 --fallback-batch 0 --steps 6 --warmup 2 --modes shard-host,split,shard
    # a second family at 6 GiB per GPU          # bench/results/shard-4bit-mistral7b-gib6-2026-11-28.*
    python3 bench/shard_train.py run --out $OUT/m7.json --shape mistral_7b --quant nf4 --optim adamw8bit \\
        --bucket-view --cap-gib 6 --batch 1 --seq 1024 --fallback-batch 0 --fallback-seq 512 --steps 8 --warmup 2 \\
        --modes shard-host,split,shard
    # a 7B model that one process cannot hold at 6 GiB (Qwen2.5-7B: a vocabulary of 152064), and that one process
    # tried                                     # bench/results/shard-4bit-qwen25-7b-gib6-2026-11-28.*
    python3 bench/shard_train.py run --out $OUT/q7.json --shape qwen25_7b --quant nf4 --optim adamw8bit \\
        --bucket-view --cap-gib 6 --batch 1 --seq 1024 --fallback-batch 0 --fallback-seq 512 --steps 8 --warmup 2 \\
        --modes shard-host,split,shard,one
    # a second family that one process cannot hold at 6 GiB (Gemma-7B: a tied vocabulary of 256000), the allocator's
    # expandable segments in every mode         # bench/results/shard-4bit-gemma7b-gib6-2026-11-28.*
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/shard_train.py run --out $OUT/g7.json \\
        --shape gemma_7b --quant nf4 --optim adamw8bit --bucket-view --cap-gib 6 --batch 1 --seq 1024 \\
        --fallback-batch 0 --fallback-seq 512 --steps 8 --warmup 2 --modes shard-host,split,shard,one

The stand-in (`--shape`): a model of a real one's shape (llama31_8b, the default: Llama-3.1-8B, hidden 4096, 32
layers, intermediate 14336, 32 heads / 8 kv heads, vocabulary 128256, untied head; mistral_7b: Mistral-7B-v0.3;
qwen25_7b: Qwen2.5-7B, 28 layers, hidden 3584, intermediate 18944, 28 / 4 heads, vocabulary 152064, q/k/v biases;
qwen25_32b: Qwen2.5-32B, 64 layers, hidden 5120, intermediate 27648, 40 / 8 heads, vocabulary 152064, q/k/v biases;
gemma_7b: Gemma-7B, 28 layers, hidden 3072, intermediate 24576, 16 / 16 heads of 256, vocabulary 256000, the head
tied to the embeddings (one tensor, made once), embeddings scaled by sqrt(hidden), GELU (tanh), norms 1 + weight;
tiny, tiny_qwen, tiny_gemma: for CPU and the check; `--layers` fewer layers) in `--dtype` (float16) with random
weights (a norm's scale 1: a Gemma norm's weight 0), made on the meta device and filled on the GPU from one fixed
random pool (every weight the same in both modes, whatever GPU holds it); with `--quant nf4` every linear layer
inside the decoder layers a bitsandbytes Linear4bit (NF4, double quantization, float16 compute, uint8 storage, as
load_in_4bit makes them), each weight made in float16 and quantized on its GPU one linear layer at a time (never the
whole model on one GPU); LoRA (peft, r=16, alpha 16, no dropout) on q/k/v/o/gate/up/down, A from the pool, B zero;
gradient checkpointing (non-reentrant); AdamW on the adapters (fp32; `--optim adamw8bit`: bitsandbytes' 8-bit
AdamW, as Unsloth's notebooks choose) with a fixed loss scale (GradScaler, no growth); one fixed batch of random
token ids, `--batch` x `--seq` per GPU, every step.

Modes, each a child process started here (the driver starts and stops MPS: every process on `--sms` SMs of its GPU;
NCCL_P2P_DISABLE=1; the whole job on `--cores`; each process's allocator capped at `--cap-gib` per GPU):
  split    one process, the model over both GPUs as accelerate places it (get_balanced_memory, then
           infer_auto_device_map and dispatch_model, decoder layers whole): the global batch in 2 micro-batches of
           `--batch` (the same samples per optimizer step as the sharded mode, the losses averaged);
  split-even  the same process, the model placed by nbddp's split mode (nbddp/runtime/split_place.py: the layers
           cut by their bytes and the activations of this batch, the head and loss on the last GPU); 2 GPUs only;
  one      split mode's process with the whole model on GPU 0 alone: whether one GPU at `--cap-gib` holds it (its
           running out of memory is a result: it neither fails the driver nor sets the batch);
  shard    2 processes under torchrun (NCCL): every module outside the decoder layers whole on each, each decoder
           layer's frozen weights made on the GPU one layer at a time and sharded at once (nbddp/runtime/shard.py:
           half of its bytes kept, the layer gathered before it runs, the next one gathered ahead on a side stream,
           two layer buffers), the adapters trained by DDP (the frozen weights ignored by it); each rank its half
           of the global batch;
  shard-sync  the same with no gather ahead (each layer's gather waited for in full): what the prefetch hides;
  shard-1ch, shard-2ch  NCCL held to 1 or 2 channels (NCCL_MAX_NCHANNELS): fewer SMs for the gather's kernel;
  shard-1ch-ce  1 channel, its shared-memory copies by cudaMemcpy (NCCL_SHM_USE_CUDA_MEMCPY=1; on the T4-class
           share it made no step in 296 s);
  shard-host  no collective: each rank's slices written once to shared host memory, the gathers copy the other
           rank's slices in from there (pinned, on the side stream: the copy engines, no SMs);
  check    (no training) 2 processes: on each, the stand-in whole and sharded; every sharded layer, once gathered,
           byte for byte the whole one's (4-bit packed weights included) with the same quantization state, and two
           forward and backward passes (layers checkpointed and not) giving the same losses, logits and adapter
           gradients bit for bit; "ok" in its result (the driver's exit status fails otherwise).
The first mode out of memory at `--batch` runs again, and every mode after it, at `--fallback-batch` (or, with no
smaller batch, at `--fallback-seq`). `--bucket-view`: DDP's gradient_as_bucket_view in the sharded modes (the
gradients are views of DDP's buckets, not a second copy).
Per mode: the losses of each step, samples/s (the median of the timed steps), the peak memory of each GPU
(max_memory_allocated, and reserved), the adapters at the end (compared between modes); sharded, per step: forward,
backward and optimizer time (CUDA events on the compute stream), the gathers' time (their stream), the exposed wait
(the compute stream stalled on a gather) and the number of gathers. The driver writes one JSON: every mode and the
comparison (ratio shard/split, losses and adapters, memory)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

SHAPES = {  # each a real model's shape ("family": its transformers class), or a tiny one for CPU and checks
    "llama31_8b": dict(family="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                       tie_word_embeddings=False),
    "mistral_7b": dict(family="mistral", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32768, max_position_embeddings=32768,
                       sliding_window=None, tie_word_embeddings=False),  # Mistral-7B-v0.3
    "qwen25_7b": dict(family="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),  # Qwen2.5-7B (q/k/v with biases)
    "qwen25_32b": dict(family="qwen2", hidden_size=5120, num_hidden_layers=64, intermediate_size=27648,
                       num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),  # Qwen2.5-32B (q/k/v with biases)
    "gemma_7b": dict(family="gemma", hidden_size=3072, num_hidden_layers=28, intermediate_size=24576,
                     num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
                     max_position_embeddings=8192, hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                     rope_theta=10000.0, tie_word_embeddings=True),  # Gemma-7B (GemmaConfig's defaults)
    "tiny": dict(family="llama", hidden_size=64, num_hidden_layers=4, intermediate_size=160, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=False),
    "tiny_qwen": dict(family="qwen2", hidden_size=128, num_hidden_layers=4, intermediate_size=384,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                      tie_word_embeddings=False),
    "tiny_gemma": dict(family="gemma", hidden_size=128, num_hidden_layers=4, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=48, vocab_size=512,
                       max_position_embeddings=256, hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                       tie_word_embeddings=True),  # head_dim x heads != hidden, as in Gemma-7B (256 x 16, 3072)
}
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "gemma": ("GemmaConfig", "GemmaForCausalLM")}
NORM_ONE_PLUS = {"gemma"}  # families whose RMSNorm scales by 1 + weight (a scale of 1 is a weight of 0)
MODE_ENV = {  # a sharded mode's variants: its NCCL settings, its gather's transport
    "shard": {}, "shard-sync": {}, "check": {},
    "shard-1ch": {"NCCL_MAX_NCHANNELS": "1"},
    "shard-2ch": {"NCCL_MAX_NCHANNELS": "2"},
    "shard-1ch-ce": {"NCCL_MAX_NCHANNELS": "1", "NCCL_SHM_USE_CUDA_MEMCPY": "1"},
    "shard-host": {},
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 2 ** 30
POOL = 1 << 24  # random values every weight is cut from (a 1B-element model repeats them: timing does not care)
NORM_FILL = [1.0]  # a norm's weight: 1, or 0 in a family of NORM_ONE_PLUS (meta_model sets it)
MADE = {}  # id of a meta parameter -> (it, the parameter made for it): a tied parameter made once


# ---------------------------------------------------------------- the model, the same in every mode

def pool_on(device, cache={}):  # noqa: B006 (one pool per device)
    import torch
    if device not in cache:
        gen = torch.Generator().manual_seed(0)
        cache[device] = torch.randn(POOL, generator=gen).to(device)
    return cache[device]


def fill(name, param):
    """`param` (materialized, uninitialized) filled by its name: norms 1, LoRA B 0, LoRA A uniform-scaled
    (1/sqrt(3 x in)), every other weight 0.02 x the pool from an offset its name picks."""
    import torch
    with torch.no_grad():
        if name.endswith("norm.weight"):
            param.fill_(NORM_FILL[0])
            return
        if ".lora_B." in name:
            param.zero_()
            return
        pool_fill(name, param, (3 * param.shape[-1]) ** -0.5 if ".lora_A." in name else 0.02)


def pool_fill(name, param, std):
    """`param` = std x the pool, from an offset its name picks."""
    import torch
    with torch.no_grad():
        pool = pool_on(param.device)
        flat, n, off, pos = param.view(-1), param.numel(), zlib.crc32(name.encode()) % POOL, 0
        while pos < n:
            take = min(n - pos, POOL - off)
            flat[pos:pos + take].copy_(pool[off:off + take] * std)
            pos, off = pos + take, 0


def shape_of(args):
    shape = {k: v for k, v in SHAPES[args.shape].items() if k != "family"}
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    return shape


def meta_model(args):
    """The stand-in with its adapters and gradient checkpointing, every tensor on the meta device; with
    `--quant nf4` every linear layer inside the decoder layers a bitsandbytes Linear4bit (as Unsloth's and
    transformers' load_in_4bit make them: NF4, double quantization, float16 compute, uint8 storage), its weight a
    meta Params4bit of the packed shape, quantized when it is made (`materialize`)."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    family = SHAPES[args.shape]["family"]
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    NORM_FILL[0] = 0.0 if family in NORM_ONE_PLUS else 1.0
    config = config_cls(**shape_of(args), use_cache=False)
    with torch.device("meta"):
        base = model_cls(config)
    base.to(getattr(torch, args.dtype))
    if args.quant == "nf4":
        to_4bit(base, getattr(torch, args.dtype))
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    return config, model


def to_4bit(model, dtype):
    """Every nn.Linear inside the decoder layers replaced by a meta Linear4bit (the head stays in `dtype`)."""
    import bitsandbytes as bnb
    import torch
    prefix = layers_name(model)
    for name, module in list(model.named_modules()):
        if not name.startswith(prefix + "."):
            continue
        for child_name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=dtype, compress_statistics=True, quant_type="nf4",
                                  quant_storage=torch.uint8, device="meta")
            packed = torch.empty((child.in_features * child.out_features + 1) // 2, 1, dtype=torch.uint8,
                                 device="meta")
            q.weight = bnb.nn.Params4bit(packed, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                         quant_storage=torch.uint8, module=q, bnb_quantized=True)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(torch.empty(child.out_features, dtype=dtype, device="meta"),
                                            requires_grad=False)
            setattr(module, child_name, q)


def quantize_linear(module, prefix, device, dtype):
    """A meta Linear4bit's weight made in `dtype` on `device`, filled by its name and quantized there (the whole
    weight of one linear layer at a time in `dtype`); its bias made and filled."""
    import bitsandbytes as bnb
    import torch
    weight = torch.empty(module.out_features, module.in_features, dtype=dtype, device=device)
    fill(f"{prefix}weight", weight)
    param = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=True, quant_type="nf4",
                              quant_storage=torch.uint8, module=module)
    module.weight = param._quantize(device)
    del weight
    if module.bias is not None:
        bias = torch.nn.Parameter(torch.empty(module.out_features, dtype=dtype, device=device), requires_grad=False)
        fill(f"{prefix}bias", bias)
        module.bias = bias


def layers_name(model):
    import torch
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    return max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))[0]


def rotary_on(model, config, device):
    """The rotary embedding's buffers (computed in __init__, lost on meta) made again on `device`."""
    import torch
    for name, module in list(model.named_modules()):
        if name.endswith("rotary_emb"):
            with torch.device(device):
                fresh = type(module)(config=config)
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, name.rsplit(".", 1)[1], fresh.to(device))


def materialize(module, prefix, device, recurse=True):
    """`module`'s parameters (and buffers) from meta onto `device`, filled by their full names (a Linear4bit's
    weight quantized there). A parameter tied to one made before (Gemma's head: the embeddings' tensor) is that
    one, on its device, never a second copy; a scaled embedding's scale buffer (Gemma's sqrt(hidden)) set again."""
    import torch
    for name, sub in (module.named_modules() if recurse else [("", module)]):
        where = f"{prefix}{name}." if name else prefix
        if type(sub).__name__ == "Linear4bit" and type(sub).__module__.startswith("bitsandbytes"):
            if sub.weight.is_meta:
                quantize_linear(sub, where, device, sub.compute_dtype)
            continue
        for pname, param in list(sub._parameters.items()):
            if param is None or not param.is_meta:
                if param is not None:
                    fill(f"{where}{pname}", param)
                continue
            if id(param) in MADE:  # tied: the tensor already made
                made = MADE[id(param)][1]
                if made.device != torch.device(device):
                    raise SystemExit(f"{where}{pname} is tied to a parameter made on {made.device}, not {device}")
                sub._parameters[pname] = made
                continue
            made = torch.nn.Parameter(torch.empty_like(param, device=device), requires_grad=param.requires_grad)
            fill(f"{where}{pname}", made)
            MADE[id(param)] = (param, made)
            sub._parameters[pname] = made
        for bname, buf in list(sub._buffers.items()):
            if buf is not None and buf.is_meta:
                sub._buffers[bname] = torch.empty_like(buf, device=device)
        if type(sub).__name__.endswith("ScaledWordEmbedding") and isinstance(getattr(sub, "embed_scale", None),
                                                                           torch.Tensor):
            with torch.no_grad():  # as transformers' _init_weights sets it (Gemma: sqrt(hidden))
                sub.embed_scale.fill_(getattr(sub, "scalar_embed_scale", sub.embedding_dim ** 0.5))


def token_batch(args, config):
    import torch
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, config.vocab_size, (2 * args.batch, args.seq), generator=gen)


def cap_memory(args, devices):
    import torch
    if args.device != "cuda":
        return
    for d in devices:
        total = torch.cuda.get_device_properties(d).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GIB / total), d)


def memory(devices):
    import torch
    if not devices or devices[0] == "cpu":
        return {}
    return {str(d): {"peak_allocated_gib": round(torch.cuda.max_memory_allocated(d) / GIB, 3),
                     "peak_reserved_gib": round(torch.cuda.max_memory_reserved(d) / GIB, 3)} for d in devices}


def quant_tensors(param):
    from nbddp.runtime.shard import nbddp_quant_state_tensors
    return nbddp_quant_state_tensors(param)


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_adapters(model, path):
    import torch
    torch.save({n: p.detach().float().cpu() for n, p in model.named_parameters() if p.requires_grad}, path)


def optimizer(args, model, device):
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    if args.optim == "adamw8bit":  # bitsandbytes' 8-bit AdamW, as Unsloth's notebooks choose (optim="adamw_8bit")
        import bitsandbytes as bnb
        opt = bnb.optim.AdamW8bit(params, lr=args.lr, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    scaler = torch.amp.GradScaler(device.type, init_scale=args.loss_scale, growth_interval=10 ** 9,
                                  enabled=device.type == "cuda")
    return opt, scaler


def rate(args, step_s):
    timed = step_s[args.warmup:]
    median = statistics.median(timed)
    return {"median_step_s": round(median, 4), "samples_per_s": round(2 * args.batch / median, 4),
            "tokens_per_s": round(2 * args.batch * args.seq / median, 1), "timed_steps": len(timed)}


def transformers_version():
    import peft
    import transformers
    return f"transformers {transformers.__version__}, peft {peft.__version__}"


def versions(args):
    import torch
    out = {"torch": torch.__version__, "transformers": transformers_version()}
    if args.quant != "none" or args.optim == "adamw8bit":
        import bitsandbytes
        out["bitsandbytes"] = bitsandbytes.__version__
    return out


# ---------------------------------------------------------------- split mode: one process, both GPUs

def split(args):
    import torch
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    t0 = time.time()
    cuda, one, even = args.device == "cuda", args.mode == "one", args.mode == "split-even"
    devices = ([0] if one else [0, 1]) if cuda else ["cpu"]
    cap_memory(args, devices)
    config, model = meta_model(args)
    layer = type(model.get_submodule(layers_name(model))[0]).__name__
    dtype = getattr(torch, args.dtype)
    max_memory = {d: int(args.cap_gib * GIB) for d in range(len(devices))}
    if one:  # the whole model on GPU 0, whatever accelerate would say of it
        balanced, placed = max_memory, {"": 0}
    elif even:  # nbddp's own split placement (nbddp/runtime/split_place.py), the activations of this batch
        from nbddp.runtime.split_place import nbddp_split_map
        balanced = max_memory
        placed = nbddp_split_map(model, [max_memory[d] for d in range(len(devices))], tokens=args.batch * args.seq)[0]
        if placed is None:
            raise SystemExit("split-even places the model over 2 GPUs (--device cuda)")
    else:
        balanced = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=[layer], dtype=dtype)
        placed = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=[layer], dtype=dtype)
    device_map = {name: (f"cuda:{d}" if cuda else "cpu") if isinstance(d, int) else d for name, d in placed.items()}
    if any(d in ("cpu", "disk") for d in placed.values()):
        raise SystemExit(f"the model does not fit the two GPUs at {args.cap_gib} GiB each: {placed}")
    for name, device in device_map.items():
        materialize(model.get_submodule(name) if name else model, f"{name}." if name else "", device)
    rotary = next(n for n, _ in model.named_modules() if n.endswith("rotary_emb"))
    rotary_on(model, config, device_map[max((n for n in device_map if n == "" or rotary == n or
                                             rotary.startswith(n + ".")), key=len)])
    model = dispatch_model(model, device_map=device_map)
    built_s = time.time() - t0
    built = {str(d): round(torch.cuda.memory_allocated(d) / GIB, 3) for d in devices} if cuda else {}
    print(f"{args.mode} built in {built_s:.1f} s, allocated per GPU {built} GiB, "
          f"rope {getattr(config, 'rope_parameters', None)}", flush=True)
    first = torch.device(device_map[next(iter(device_map))])
    opt, scaler = optimizer(args, model, first)
    ids = token_batch(args, config).to(first)
    micro = [ids[i * args.batch:(i + 1) * args.batch] for i in range(2)]
    model.train()
    losses, micro_losses, step_s, scales = [], [], [], []
    for step in range(args.steps):
        started = time.perf_counter()
        parts = []
        for batch in micro:
            loss = model(input_ids=batch, labels=batch).loss
            scaler.scale(loss / len(micro)).backward()
            parts.append(loss.detach().float())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        values = [p.item() for p in parts]
        step_s.append(time.perf_counter() - started)
        scales.append(scaler.get_scale() if cuda else None)
        losses.append(sum(values) / len(values))
        micro_losses.append(values)
        print(f"{args.mode} step {step}: loss {losses[-1]:.6f} ({step_s[-1]:.3f} s)", flush=True)
    save_adapters(model, args.adapters)
    per_device = {}
    for name, d in device_map.items():
        per_device.setdefault(str(d), []).append(name)
    layers = {d: sum(1 for n in names if n.startswith(layers_name(model) + ".")) for d, names in per_device.items()}
    return {"mode": args.mode, "losses": losses, "micro_batch_losses": micro_losses, "step_s": step_s,
            "rate": rate(args, step_s), "memory": memory(devices), "build_s": round(built_s, 1),
            "layers_per_device": layers, "balanced_max_memory_gib": {str(k): round(v / GIB, 2) for k, v in
                                                                       balanced.items()},
            "device_map_outside_layers": {n: d for n, d in device_map.items()
                                          if not n.startswith(layers_name(model) + ".")},
            "model_gib": round(model_bytes(model) / GIB, 3), "scales": scales, "quant": args.quant,
            "optim": args.optim, "versions": versions(args),
            "quant_state_gib": round(sum(t.numel() * t.element_size() for p in model.parameters()
                                         for t in quant_tensors(p)) / GIB, 3),
            "attn_implementation": getattr(config, "_attn_implementation", None),
            "rope_parameters": getattr(config, "rope_parameters", None), "built_allocated_gib": built,
            "gpus": [torch.cuda.get_device_name(d) for d in devices] if cuda else None}


# ---------------------------------------------------------------- sharded mode: one process per GPU

def init_ranks(args):
    import torch
    import torch.distributed as dist
    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return cuda, local, device


def sharded_model(args, device, prefetch=True, transport="collective"):
    """The stand-in on this rank: every module outside the decoder layers whole, each layer made (and quantized,
    with --quant nf4) one at a time and sharded at once. Returns (config, model, shards, layers' prefix, the
    GiB allocated outside the layers)."""
    import torch

    from nbddp.runtime.shard import nbddp_shard_model
    config, model = meta_model(args)
    prefix = layers_name(model)
    rotary_on(model, config, device)
    for name, module in model.named_modules():  # every module outside the layers: whole on this rank
        if name == prefix or name.startswith(prefix + "."):
            continue
        own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        if any(t.is_meta for t in own):
            materialize(module, f"{name}." if name else "", device, recurse=False)
    outside_gib = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None

    def make(index, block):
        materialize(block, f"{prefix}.{index}.", device)

    shards = nbddp_shard_model(model, build=make, prefetch=prefetch, timing=True, transport=transport)
    if any(p.is_meta for p in model.parameters()):
        raise SystemExit("a parameter is still on the meta device")
    return config, model, shards, prefix, outside_gib


def shard(args):
    import torch
    import torch.distributed as dist

    from nbddp.runtime.shard import nbddp_ddp_ignore

    t0 = time.time()
    cuda, local, device = init_ranks(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    cap_memory(args, [local])
    config, model, shards, prefix, outside_gib = sharded_model(args, device, args.prefetch, args.transport)
    built_peak = torch.cuda.max_memory_allocated(device) / GIB if cuda else None
    whole_model_gib = (sum(b.size for b in shards.blocks) + shards.state_bytes() + sum(
        p.numel() * p.element_size() for n, p in model.named_parameters()
        if not (n.startswith(prefix + ".")))) / GIB
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    nbddp_ddp_ignore(model, frozen)  # the shards differ by rank; the rest is equal by construction
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None,
                                                    broadcast_buffers=False,
                                                    gradient_as_bucket_view=args.bucket_view)
    built_s = time.time() - t0
    opt, scaler = optimizer(args, model, device)
    ids = token_batch(args, config)[rank * args.batch:(rank + 1) * args.batch].to(device)
    ddp.train()
    losses, rank_losses, step_s, breakdown, scales = [], [], [], [], []
    shards.take_timing()
    for step in range(args.steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        started = time.perf_counter()
        if cuda:
            marks[0].record()
        loss = ddp(input_ids=ids, labels=ids).loss
        if cuda:
            marks[1].record()
        scaler.scale(loss).backward()
        if cuda:
            marks[2].record()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if cuda:
            marks[3].record()
        mine = loss.detach().float()
        both = mine.clone()
        dist.all_reduce(both)
        mean = both.item() / world
        step_s.append(time.perf_counter() - started)
        scales.append(scaler.get_scale() if cuda else None)
        losses.append(mean)
        rank_losses.append(mine.item())
        timing = shards.take_timing()
        if cuda:
            timing.update(forward_ms=marks[0].elapsed_time(marks[1]), backward_ms=marks[1].elapsed_time(marks[2]),
                          optimizer_ms=marks[2].elapsed_time(marks[3]), step_ms=marks[0].elapsed_time(marks[3]))
        breakdown.append({k: round(v, 2) if isinstance(v, float) else v for k, v in timing.items()})
        if rank == 0:
            print(f"shard step {step}: loss {mean:.6f} ({step_s[-1]:.3f} s) {json.dumps(breakdown[-1])}", flush=True)
    mine = {"rank": rank, "losses": rank_losses, "step_s": step_s, "breakdown": breakdown,
            "memory": memory([local] if cuda else ["cpu"]), "outside_layers_gib": outside_gib,
            "peak_after_build_gib": built_peak, "shard_gib": sum(b.shard.numel() for b in shards.blocks) / GIB,
            "quant_state_gib": shards.state_bytes() / GIB,
            "quantized_params": sum(b.quantized for b in shards.blocks)}
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        save_adapters(model, args.adapters)
        timed = [b for b in breakdown[args.warmup:]]
        mean_of = {k: round(statistics.mean(b[k] for b in timed), 2) for k in timed[0]} if timed else {}
        result = {"mode": args.mode, "prefetch": args.prefetch, "transport": args.transport,
                  "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                  "host_pinned": len(shards.pinned), "host_prefix": getattr(shards, "host_prefix", None),
                  "losses": losses, "step_s": step_s, "rate": rate(args, step_s), "build_s": round(built_s, 1),
                  "ranks": every, "breakdown_mean_timed": mean_of, "whole_model_gib": round(whole_model_gib, 3),
                  "layer_buffer_gib": round(2 * max(b.size for b in shards.blocks) / GIB, 3),
                  "scales": scales, "attn_implementation": getattr(config, "_attn_implementation", None),
                  "quant": args.quant, "optim": args.optim, "gradient_as_bucket_view": args.bucket_view,
                  "gpu": torch.cuda.get_device_name(device) if cuda else None,
                  "versions": versions(args)}
        with open(args.result, "w") as fh:
            json.dump(result, fh, indent=1)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no teardown of DDP's reducer and the group (tests/runtime_cases/_layer.finish says why)


# ---------------------------------------------------------------- the sharded layers compute as the whole ones

def check(args):
    """(torchrun) On each rank the stand-in twice: whole (every layer made on this rank) and sharded (as `shard`
    makes it). Each sharded layer, once gathered, must hold the whole layer's bytes (4-bit packed weights, biases,
    norms) and the same quantization state; then two forward and backward passes of each model on one batch, with
    the layers checkpointed and without (where bitsandbytes keeps a view of the packed weight from the forward
    pass for the backward), must give the same losses, logits and adapter gradients, bit for bit (LoRA's B filled,
    so that every adapter has a gradient)."""
    import torch
    import torch.distributed as dist

    from nbddp.runtime.shard import nbddp_quant_state_tensors
    cuda, local, device = init_ranks(args)
    rank = dist.get_rank()
    config, whole = meta_model(args)
    materialize(whole, "", device)
    rotary_on(whole, config, device)
    _, model, shards, prefix, _ = sharded_model(args, device)
    for m in (whole, model):
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                pool_fill(n, p, 0.02)
    names, ref = {id(p): n for n, p in model.named_parameters()}, dict(whole.named_parameters())
    mismatched, states_differ, compared, quantized = [], [], 0, 0
    for block in shards.blocks:
        shards.use(block, False)
        if cuda:
            torch.cuda.synchronize(device)
        for param, *_ in block.layout:
            name = names[id(param)]
            compared += 1
            if not torch.equal(param.data.reshape(-1).view(torch.uint8), ref[name].data.reshape(-1).view(torch.uint8)):
                mismatched.append(name)
            mine, theirs = nbddp_quant_state_tensors(param), nbddp_quant_state_tensors(ref[name])
            quantized += bool(mine)
            if len(mine) != len(theirs) or not all(torch.equal(a, b) for a, b in zip(mine, theirs)):
                states_differ.append(name)
    shards.free()
    ids = token_batch(args, config)[rank * args.batch:(rank + 1) * args.batch].to(device)
    passes = {}
    for variant in ("checkpointed", "not_checkpointed"):
        if variant == "not_checkpointed":
            for m in (whole, model):
                m.base_model.model.gradient_checkpointing_disable()
        got = []
        for m in (whole, model):
            m.train()
            m.zero_grad(set_to_none=True)
            losses = []
            for _ in range(2):
                out = m(input_ids=ids, labels=ids)
                out.loss.backward()
                losses.append(out.loss.item())
                logits = out.logits.detach().float()
            got.append((losses, logits, {n: p.grad.detach().float().clone() for n, p in m.named_parameters()
                                         if p.requires_grad and p.grad is not None}))
        (lw, xw, gw), (ls, xs, gs) = got
        passes[variant] = {"losses_whole": lw, "losses_sharded": ls, "losses_equal": lw == ls,
                           "max_abs_logit_diff": (xw - xs).abs().max().item(),
                           "grads": [len(gw), len(gs)], "grads_nonzero": sum(1 for g in gw.values() if g.any()),
                           "max_abs_grad_diff": max((gw[n] - gs[n]).abs().max().item() for n in gw)
                           if sorted(gw) == sorted(gs) else None}
    timing = shards.take_timing()
    mine = {"rank": rank, "compared_params": compared, "quantized_params": quantized, "mismatched": mismatched,
            "states_differ": states_differ, "passes": passes, "gathers": timing["gathers"],
            "reused": timing["reused"], "quant_state_gib": shards.state_bytes() / GIB,
            "shard_gib": sum(b.shard.numel() for b in shards.blocks) / GIB}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if rank == 0:
        ok = all(not r["mismatched"] and not r["states_differ"] and r["compared_params"] and
                 all(p["losses_equal"] and p["max_abs_logit_diff"] == 0 and p["max_abs_grad_diff"] == 0 and
                     p["grads_nonzero"] == p["grads"][0] > 0 for p in r["passes"].values()) for r in every)
        with open(args.result, "w") as fh:
            json.dump({"mode": "check", "ok": ok, "ranks": every, "quant": args.quant,
                       "gpu": torch.cuda.get_device_name(device) if cuda else None,
                       "versions": versions(args)}, fh, indent=1)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------- the driver

def child(args, mode, extra_env, log, limit):
    """One mode in its child process(es); its result dict (or the error it left)."""
    result = os.path.join(args.work, f"{mode}.json")
    adapters = os.path.join(args.work, f"{mode}-adapters.pt")
    for path in (result, adapters):
        if os.path.exists(path):
            os.remove(path)
    common = ["--shape", args.shape, "--dtype", args.dtype, "--device", args.device, "--batch", str(args.batch),
              "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr),
              "--loss-scale", str(args.loss_scale), "--cap-gib", str(args.cap_gib), "--result", result,
              "--adapters", adapters, "--out", args.out, "--quant", args.quant, "--optim", args.optim,
              "--layers", str(args.layers)] + (["--bucket-view"] if args.bucket_view else [])
    me = os.path.abspath(__file__)
    if mode in ("split", "split-even", "one"):
        argv = [sys.executable, me, "split"] + common + ["--mode", mode]
    elif mode == "check":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", me, "check"] + \
            common
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", me, "shard"] + \
            common + ["--mode", mode] + (["--no-prefetch"] if mode == "shard-sync" else []) + \
            (["--transport", "host"] if mode == "shard-host" else [])
        extra_env = dict(extra_env, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV", **MODE_ENV[mode])
    if args.cores:
        argv = ["taskset", "-c", args.cores] + argv
    env = dict(os.environ, **extra_env)
    started = time.time()
    with open(log, "w") as fh:
        fh.write(" ".join(argv) + "\n")
        fh.flush()
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:  # the launcher and its workers, all of them (MPS stops only without clients)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    text = open(log, errors="replace").read()
    out = {"mode": mode, "returncode": rc, "wall_s": round(time.time() - started, 1),
           "out_of_memory": "OutOfMemoryError" in text or "CUDA out of memory" in text}
    if rc == 0 and os.path.exists(result):
        out.update(json.load(open(result)))
        out["adapters_file"] = adapters
    else:
        out["log_tail"] = text.strip().splitlines()[-25:]
    return out


def compare(results):
    import torch
    split, row = results.get("split"), {}
    if not split or "losses" not in split:
        return row
    ref = torch.load(split["adapters_file"]) if split.get("adapters_file") else None
    even = results.get("split-even")
    if even and "losses" in even and even.get("memory"):  # nbddp's split placement against accelerate's
        peaks = [v["peak_allocated_gib"] for v in even["memory"].values()]
        row["split-even_vs_split"] = {
            "samples_per_s_ratio": round(even["rate"]["samples_per_s"] / split["rate"]["samples_per_s"], 3),
            "max_rel_loss_diff": max(abs(a - b) / abs(b) for a, b in zip(even["losses"], split["losses"])),
            "layers_per_device": even["layers_per_device"], "peak_allocated_gib_per_gpu": peaks,
            "peak_spread": round(max(peaks) / min(peaks) - 1, 4)}
    for mode in [m for m in results if m.startswith("shard")]:
        other = results.get(mode)
        if not other or "losses" not in other:
            continue
        diffs = [abs(a - b) / abs(b) for a, b in zip(other["losses"], split["losses"])]
        entry = {"samples_per_s_ratio": round(other["rate"]["samples_per_s"] / split["rate"]["samples_per_s"], 3),
                 "max_rel_loss_diff": max(diffs), "loss_rel_diffs": diffs,
                 "losses": {"split": split["losses"], mode: other["losses"]}}
        if ref is not None and other.get("adapters_file"):
            got = torch.load(other["adapters_file"])
            worst = max((got[n] - ref[n]).abs().max().item() for n in ref)
            scale = max(ref[n].abs().max().item() for n in ref)
            moved = max(ref[n].abs().max().item() for n in ref if ".lora_B." in n)
            b_names = [n for n in ref if ".lora_B." in n]  # B starts at 0: all of it is what training moved
            diff_b = sum(((got[n] - ref[n]) ** 2).sum().item() for n in b_names) ** 0.5
            norm_b = sum((ref[n] ** 2).sum().item() for n in b_names) ** 0.5
            entry["adapters"] = {"max_abs_diff": worst, "max_abs_weight": scale, "max_abs_lora_B": moved,
                                 "lora_B_rel_norm_diff": diff_b / norm_b if norm_b else None,
                                 "same_names": sorted(got) == sorted(ref)}
        peaks = [r["memory"][str(r["rank"])]["peak_allocated_gib"] for r in other["ranks"]] \
            if other["ranks"][0]["memory"] else []
        if peaks:
            entry["peak_allocated_gib_per_gpu"] = peaks
            entry["peak_spread"] = round(max(peaks) / min(peaks) - 1, 4)
        row[f"{mode}_vs_split"] = entry
    if split.get("memory"):
        peaks = [v["peak_allocated_gib"] for v in split["memory"].values()]
        row["split_peak_allocated_gib_per_gpu"] = peaks
        row["split_peak_spread"] = round(max(peaks) / min(peaks) - 1, 4)
    one = results.get("one")
    if one and "skipped" not in one:  # the whole model on one GPU at the cap
        row["one_gpu"] = {k: one.get(k) for k in ("returncode", "out_of_memory", "memory", "losses",
                                                  "built_allocated_gib")}
    return row


def run(args):
    t0 = time.time()
    os.makedirs(args.work, exist_ok=True)
    logs = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(logs, exist_ok=True)
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": os.environ.get("BENCH_MACHINE"),
              "argv": sys.argv, "shape": dict(SHAPES[args.shape], **shape_of(args), name=args.shape),
              "dtype": args.dtype, "quant": args.quant, "optim": args.optim,
              "gradient_as_bucket_view": args.bucket_view,
              "batch_per_gpu": args.batch, "seq": args.seq, "global_batch": 2 * args.batch, "steps": args.steps,
              "warmup": args.warmup, "cap_gib": args.cap_gib, "cores": args.cores, "sms": args.sms, "modes": {}}
    mps = args.device == "cuda" and args.sms
    if mps:
        import t4_class
        total = t4_class.total_sms()
        t4_class.mps_stop()  # a daemon an earlier, interrupted batch left behind
        env.update(t4_class.mps_start())
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = t4_class.mps_percent(args.sms, total)
        report.update(total_sms=total, mps_percent=env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
    try:
        for mode in args.modes.split(","):
            left = args.deadline - (time.time() - t0)
            if left < 60:
                report["modes"][mode] = {"mode": mode, "skipped": f"deadline: {left:.0f} s left"}
                continue
            log = os.path.join(logs, f"{os.path.basename(args.out).rsplit('.', 1)[0]}-{mode}.log")
            print(f"== {mode} ({left:.0f} s left)", flush=True)
            report["modes"][mode] = child(args, mode, env, log, left - 20)
            first = [m for m in report["modes"] if m not in ("check", "one")] == [mode]
            if first and report["modes"][mode]["out_of_memory"] and (
                    0 < args.fallback_batch < args.batch or 0 < args.fallback_seq < args.seq):
                report["out_of_memory_at"] = {"batch": args.batch, "seq": args.seq, mode: report["modes"][mode]}
                if 0 < args.fallback_batch < args.batch:
                    args.batch = args.fallback_batch
                else:
                    args.seq = args.fallback_seq
                report.update(batch_per_gpu=args.batch, global_batch=2 * args.batch, seq=args.seq)
                print(f"== {mode} out of memory: every mode at batch {args.batch} x {args.seq}", flush=True)
                os.replace(log, log[:-len(".log")] + "-oom.log")  # the first try's log kept beside the second's
                report["modes"][mode] = child(args, mode, env, log, args.deadline - (time.time() - t0) - 20)
            print(json.dumps({k: v for k, v in report["modes"][mode].items()
                              if k in ("returncode", "ok", "losses", "rate", "memory", "breakdown_mean_timed",
                                       "out_of_memory", "log_tail")})[:3000], flush=True)
            report["comparison"] = compare(report["modes"])
            with open(args.out, "w") as fh:
                json.dump(report, fh, indent=1)
    finally:
        if mps:
            t4_class.mps_stop()
    report["comparison"] = compare(report["modes"])
    report["wall_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps(report["comparison"])[:4000], flush=True)
    ok = all(m.get("returncode") == 0 and m.get("ok", True)
             for name, m in report["modes"].items() if "skipped" not in m and name != "one")
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "split", "shard", "check"))
    parser.add_argument("--out", required=True, help="the driver's JSON (its logs beside it)")
    parser.add_argument("--modes", default="shard,split,shard-sync", help="the first one decides the batch")
    parser.add_argument("--shape", default="llama31_8b", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="float16", help="the weights' dtype (with --quant: the compute dtype)")
    parser.add_argument("--quant", default="none", choices=("none", "nf4"),
                        help="nf4: the decoder layers' linear layers in bitsandbytes 4-bit (NF4, double quantization)")
    parser.add_argument("--optim", default="adamw", choices=("adamw", "adamw8bit"))
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: the shape's own)")
    parser.add_argument("--bucket-view", action="store_true", help="DDP's gradient_as_bucket_view (sharded modes)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--sms", type=int, default=8, help="MPS: each process on this many SMs (0: whole GPUs)")
    parser.add_argument("--cap-gib", type=float, default=15.0, help="each process's allocator capped per GPU")
    parser.add_argument("--cores", default="0-3", help="taskset -c for the whole job ('' for none)")
    parser.add_argument("--batch", type=int, default=2, help="samples per GPU (split: micro-batch)")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--loss-scale", type=float, default=2.0 ** 13)
    parser.add_argument("--fallback-batch", type=int, default=1,
                        help="the first mode out of memory: every mode at this batch instead (0: none)")
    parser.add_argument("--fallback-seq", type=int, default=0,
                        help="the first mode out of memory (and no --fallback-batch below --batch): every mode at "
                             "this sequence length instead (0: none)")
    parser.add_argument("--deadline", type=float, default=540, help="seconds: no mode starts with less than 60 left")
    parser.add_argument("--work", default="/tmp/shard-train")
    parser.add_argument("--result")
    parser.add_argument("--adapters")
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false")
    parser.add_argument("--transport", default="collective", choices=("collective", "host"))
    parser.add_argument("--mode", default="shard", help="(the child) the mode's name in the driver")
    args = parser.parse_args(argv)
    if args.what == "run":
        return run(args)
    result = {"split": split, "shard": shard, "check": check}[args.what](args)
    with open(args.result, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
