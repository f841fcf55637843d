#!/usr/bin/env python3
"""The sharded mode's first question (docs/sharded.md, "Next" 1): does all-gathering a decoder layer's 4-bit
weights fit inside that layer's compute on a T4-class share without peer-to-peer?

    python3 bench/shard_link.py run --out RESULT.json [--sms 8] [--tokens 4096]

Two ranks (torchrun by nbddp's recipe, NCCL, NCCL_P2P_DISABLE=1 as on Kaggle's T4 pair), each held to `--sms` SMs
by MPS (bench/t4_class.py). For the layer shapes of Llama-3.1-8B and Qwen2.5-32B, each rank times, as medians:
- gather: all-gather of the layer's 4-bit bytes (nf4 with double quantization: 0.516 bytes a parameter), each rank
  holding half;
- compute: the layer's forward and its backward's input gradient in fp16 (the projections' matmuls and attention,
  for `--tokens` tokens: batch 2 x 2048); bitsandbytes' dequantization is left out, which only adds compute;
- both: the gather on a stream of its own while the compute runs, as the mode prefetches the next layer.
Rank 0 writes the figures and, per layer, the exposed gather (both - compute) and the projected speed against
split mode: 2 x compute / (compute + exposed), split mode counted as one GPU's speed."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from t4_class import _median_ms  # noqa: E402  (bench/ is on sys.path)

SHAPES = {  # hidden, intermediate, heads, kv heads, head dim
    "llama31_8b": (4096, 14336, 32, 8, 128),
    "qwen25_32b": (5120, 27648, 40, 8, 128),
}
BYTES_PER_PARAM = 0.5 + 1 / 64  # nf4 and its double-quantized block scales


def layer_params(hidden, inter, heads, kv, head_dim):
    return hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter


def worker(args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    side = torch.cuda.Stream()
    results = {}

    def median_ms(fn):
        return _median_ms(torch, fn, 10, before=dist.barrier)

    for name, (hidden, inter, heads, kv, head_dim) in SHAPES.items():
        size = int(layer_params(hidden, inter, heads, kv, head_dim) * BYTES_PER_PARAM) // world * world
        shard = torch.randint(0, 255, (size // world,), dtype=torch.uint8, device=device)
        whole = torch.empty(size, dtype=torch.uint8, device=device)
        shapes = [(heads * head_dim, hidden), (kv * head_dim, hidden), (kv * head_dim, hidden),
                  (hidden, heads * head_dim), (inter, hidden), (inter, hidden), (hidden, inter)]
        weights = [torch.randn(s, dtype=torch.float16, device=device) * 0.02 for s in shapes]
        x = torch.randn(args.tokens, hidden, dtype=torch.float16, device=device)
        batch, seq = 2, args.tokens // 2

        def compute():
            q, k, v = (x @ w.t() for w in weights[:3])
            q = q.view(batch, seq, heads, head_dim).transpose(1, 2).requires_grad_()
            k = k.view(batch, seq, kv, head_dim).transpose(1, 2).repeat_interleave(heads // kv, 1).requires_grad_()
            v = v.view(batch, seq, kv, head_dim).transpose(1, 2).repeat_interleave(heads // kv, 1).requires_grad_()
            attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            attn.backward(torch.ones_like(attn))
            flat = attn.detach().transpose(1, 2).reshape(args.tokens, heads * head_dim)
            out = flat @ weights[3].t()
            mlp = torch.nn.functional.silu(out @ weights[4].t()) * (out @ weights[5].t())
            down = mlp @ weights[6].t()
            grad = torch.ones_like(down)  # backward's input gradients through the frozen projections
            g_mlp = grad @ weights[6]
            g_out = (g_mlp @ weights[4]) + (g_mlp @ weights[5])
            g_attn = g_out @ weights[3]
            return sum(g @ w for g, w in zip((g_attn[:, :heads * head_dim], g_attn[:, :kv * head_dim],
                                               g_attn[:, :kv * head_dim]), weights[:3]))

        def fetch():
            gather(whole, shard)

        def both():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fetch()
            compute()
            torch.cuda.current_stream().wait_stream(side)

        figures = {"layer_bytes": size, "gather_ms": median_ms(fetch), "compute_ms": median_ms(compute),
                   "both_ms": median_ms(both)}
        figures["received_gbps"] = size * (world - 1) / world / figures["gather_ms"] / 1e6
        figures["exposed_ms"] = max(0.0, figures["both_ms"] - figures["compute_ms"])
        figures["projected_over_split"] = 2 * figures["compute_ms"] / (figures["compute_ms"] + figures["exposed_ms"])
        results[name] = figures
        torch.cuda.empty_cache()
    if rank == 0:
        results["device"] = torch.cuda.get_device_name(device)
        results["mps_percent"] = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        results["tokens"] = args.tokens
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
        print(json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run(args):
    import t4_class
    from run_notebooks import recipe

    env = dict(os.environ, NCCL_P2P_DISABLE="1", NCCL_NVLS_ENABLE="0")
    if args.sms:
        env.update(t4_class.mps_start())
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = t4_class.mps_percent(args.sms, t4_class.total_sms())
    try:
        job = recipe.build(os.path.abspath(__file__), 2, python=sys.executable, cpus=recipe.cpu_count(), env=env,
                           routed=False, script_args=["worker", "--out", args.out, "--tokens", str(args.tokens)])
        done = subprocess.run(job.argv, env={**env, **job.env}, timeout=540)
    finally:
        if args.sms:
            t4_class.mps_stop()
    return done.returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "worker"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--sms", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    return worker(args) if args.what == "worker" else run(args)


if __name__ == "__main__":
    sys.exit(main())
