"""What DDP's gradient all-reduce costs per optimizer step, measured alone: the trainable gradients (default: the
41,943,040 LoRA parameters Unsloth reports for Llama-3.1-8B at r=16) cut into buckets of DDP's bucket_cap_mb (25 MB;
DDP's own first bucket is smaller), each all-reduced asynchronously as DDP's reducer does, then waited for. Run it under torchrun on the GPUs (NCCL) or on
CPU (gloo):

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 bench/allreduce.py --out allreduce-4.json

Rank 0 writes the median time per step and the bus bandwidth (NCCL's convention: 2(n-1)/n of the data per rank)
for each dtype. The figure is an upper bound on what the all-reduce adds to a step: in training it overlaps the
backward pass."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def buckets(numel, dtype, bucket_mb, device):
    per = max(1, int(bucket_mb * 2**20) // torch.empty((), dtype=dtype).element_size())
    sizes = [per] * (numel // per) + ([numel % per] if numel % per else [])
    return [torch.zeros(n, dtype=dtype, device=device) for n in sizes]


def step_seconds(tensors, sync):
    sync()
    start = time.perf_counter()
    for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
        work.wait()
    sync()
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=41_943_040, help="gradient elements all-reduced per step")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    n = dist.get_world_size()
    results = {}
    for name in args.dtypes.split(","):
        tensors = buckets(args.numel, getattr(torch, name), args.bucket_mb, device)
        for _ in range(args.warmup):
            step_seconds(tensors, sync)
        times = [step_seconds(tensors, sync) for _ in range(args.steps)]
        median = statistics.median(times)
        size = args.numel * tensors[0].element_size()
        results[name] = {"bytes": size, "buckets": len(tensors), "median_ms": round(median * 1e3, 3),
                         "min_ms": round(min(times) * 1e3, 3),
                         "bus_gb_s": round(size * 2 * (n - 1) / n / median / 1e9, 1)}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": n, "backend": dist.get_backend(), "numel": args.numel,
                       "bucket_mb": args.bucket_mb, "steps": args.steps,
                       "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                       "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                       "dtypes": results}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
