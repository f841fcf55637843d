#!/usr/bin/env python3
"""Peak GPU memory and step time: the runtime layer's non-reentrant checkpointing with CPU activation offload
(nbddp_offload_checkpoint) vs plain non-reentrant checkpointing, on a 1B-shaped Llama with random weights + LoRA.

On a CUDA machine (one GPU, no network, no hub: the model is built from a config):
    python bench/offload_memory.py --seq 4096 --steps 6 --out $OUT/offload_memory.json
Prints one JSON object (and writes it to --out if given): per mode, torch.cuda.max_memory_allocated /
max_memory_reserved over the timed steps and the median step time (CUDA synchronised), after --warmup steps.
The checkpoint function is the one a generated script carries (nbddp/runtime/checkpoint.py).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # nbddp.runtime from the checkout: the GPU machines need not install nbddp


def build(args):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(  # Llama-3.2-1B's shape
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=max(8192, args.seq), rope_theta=500000.0,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    return model


def set_mode(model, mode):
    from torch.utils.checkpoint import checkpoint

    from nbddp.runtime.checkpoint import nbddp_offload_checkpoint

    func = nbddp_offload_checkpoint if mode == "offload" else functools.partial(checkpoint, use_reentrant=False)
    for module in model.modules():
        if hasattr(module, "_gradient_checkpointing_func"):
            module._gradient_checkpointing_func = func


def measure(model, mode, args):
    import torch

    from nbddp.runtime.strategy import nbddp_checkpointing_mode

    set_mode(model, mode)
    assert nbddp_checkpointing_mode(model) == "non-reentrant"
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, 128256, (args.batch, args.seq), device="cuda")
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    result = {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "median_step_s": statistics.median(times),
        "step_s": times,
        "last_loss": float(loss),
    }
    del opt
    torch.cuda.empty_cache()
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--modes", default="non-reentrant,offload")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/offload_memory.py measures GPU memory: run it on a CUDA machine")
    model = build(args)
    report = {"model": "Llama-3.2-1B shape, random bf16 weights, LoRA r=16 on all linear layers",
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "seq": args.seq,
              "batch": args.batch, "warmup": args.warmup, "steps": args.steps, "modes": {}}
    for mode in args.modes.split(","):
        report["modes"][mode] = measure(model, mode, args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
