#!/usr/bin/env python3
"""What Unsloth's fast generation costs in the sharded mode: one process on one GPU, a group of one, host copies.

The model (offline_hub's Llama-3.1 stand-in at --layers, random weights, loaded 4-bit by Unsloth's
`FastLanguageModel.from_pretrained`, LoRA added, `for_inference`) generates --tokens tokens greedily, whole; then its
layers' frozen weights are sharded (nbddp/runtime/shard.py, transport "host": each block released and copied in from
pinned host memory each time it runs, as rank 0 alone does after training) and it generates again. Written to --out
(JSON): both runs' seconds and tokens per second (after one warm-up generation each), whether the tokens are equal,
the gathers per token, the bytes of the layers' frozen weights and the copy rate they imply.

    python bench/offline_hub.py --home /dev/shm/hf --models llama31 --layers llama31=32 --datasets none
    HF_HOME=/dev/shm/hf HF_HUB_OFFLINE=1 python bench/shard_decode.py --tokens 64 --out decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="unsloth/Llama-3.1-8B")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    from unsloth import FastLanguageModel

    from nbddp.runtime.shard import nbddp_shard_model
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29534", rank=0, world_size=1)
    model, tokenizer = FastLanguageModel.from_pretrained(args.model, max_seq_length=1024, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, bias="none", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], random_state=3407)
    FastLanguageModel.for_inference(model)
    ids = tokenizer(["Below is an instruction that describes a task. Write a response."], return_tensors="pt")
    ids = ids.to("cuda")

    def generate(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(**ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True)
        torch.cuda.synchronize()
        return out[0, ids["input_ids"].shape[1]:].tolist(), time.perf_counter() - start

    result = {"model": args.model, "tokens": args.tokens, "gpu": torch.cuda.get_device_name(),
              "layers": model.config.num_hidden_layers}
    generate(4)  # warm-up: kernels compiled, graphs captured
    whole, result["whole_s"] = generate(args.tokens)
    result["whole_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    shards = nbddp_shard_model(model, transport="host")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    generate(4)
    shards.take_timing()
    sharded, result["sharded_s"] = generate(args.tokens)
    gathers = shards.take_timing()["gathers"]
    result["sharded_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    frozen = sum(b.size for b in shards.blocks)
    result.update(
        same_tokens=whole == sharded, gathers_per_token=gathers / args.tokens, frozen_layer_gib=frozen / 2**30,
        whole_tokens_per_s=args.tokens / result["whole_s"], sharded_tokens_per_s=args.tokens / result["sharded_s"],
        copy_gb_per_s=gathers * frozen / len(shards.blocks) / result["sharded_s"] / 1e9)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
