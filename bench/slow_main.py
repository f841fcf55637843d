#!/usr/bin/env python3
"""Rank-0 work longer than the process group's timeout, on real GPUs (NCCL): the runtime's wait must outlast it.

    NBDDP_GROUP_TIMEOUT=30 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        bench/slow_main.py --block 90 --out $OUT/slow-main.json

Imports only torch, the standard library and the runtime modules of this checkout (nbddp/runtime/, which import
nothing else), used as a generated script uses them: nbddp_start() starts the group (NCCL on GPUs, gloo otherwise)
with NBDDP_GROUP_TIMEOUT; a few DDP steps; rank 0 then works `--block` seconds alone (a GGUF export's stand-in)
while the others wait at nbddp_barrier(what); an all-reduce after the wait shows the group still works; the script
ends in nbddp_teardown() (the agreement check, the last barrier). Rank 0 writes `--out` (JSON): the group's timeout,
how long each rank waited, the exit path. Exit status 0 is the check passing. `--barrier plain` waits in the group's
own barrier instead (torch.distributed.barrier): with the block longer than the timeout, that run is expected to
fail, which shows the timeout is real.
"""
import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from nbddp.runtime import agree, group, one_writer  # noqa: E402,F401  (agree, one_writer: as a script carries them)


def group_timeout():
    try:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return dist.group.WORLD._get_backend(device).options._timeout.total_seconds()
    except Exception as exc:  # a private attribute: say why it is missing
        return f"unknown ({type(exc).__name__})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", type=float, default=90.0, help="seconds of rank-0-only work")
    parser.add_argument("--out", required=True)
    parser.add_argument("--barrier", choices=("nbddp", "plain"), default="nbddp")
    args = parser.parse_args()
    group.nbddp_start()
    rank, device = dist.get_rank(), group.NBDDP_DEVICE
    record = {"torch": torch.__version__, "backend": dist.get_backend(), "world_size": dist.get_world_size(),
              "group_timeout_s": group_timeout(), "block_s": args.block, "barrier": args.barrier,
              "host": platform.node(), "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")}
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(256, 256).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[group.NBDDP_LOCAL_RANK]
                                                        if torch.cuda.is_available() else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for step in range(3):
            ddp(torch.randn(8, 256, device=device, generator=None)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        start = time.monotonic()
        if group.NBDDP_IS_MAIN:
            time.sleep(args.block)  # rank-0-only work: saving, converting, pushing
        if args.barrier == "plain":
            group.nbddp_collective_barrier()
        else:
            group.nbddp_barrier(f"a {args.block:.0f} s rank-0 block")
        waited = time.monotonic() - start
        check = torch.ones(1, device=device)
        dist.all_reduce(check)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, {"rank": rank, "waited_s": round(waited, 2)})
        record.update(waits=every, all_reduce_after_wait=check.item())
    except BaseException as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        if rank == 0:
            with open(args.out, "w") as fh:
                json.dump(record, fh, indent=1)
        group.nbddp_teardown()
    if rank == 0:
        print(f"slow_main: ok, {json.dumps(record)}", flush=True)


if __name__ == "__main__":
    main()
